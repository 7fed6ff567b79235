"""What the broker writes to the export worker's stdin (``worker.py``): msgpack
objects, a header ``{"root": export dir}`` then the fields of one
:class:`SegmentJob` per segment."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from ._convert import SegmentJob

__all__ = ["job_messages", "read_jobs"]


def job_messages(root: str, jobs: Iterable[SegmentJob]) -> Iterator[bytes]:
    """The header, then one object per job."""
    yield msgpack.packb({"root": root})
    for job in jobs:
        yield msgpack.packb(dataclasses.asdict(job))


def read_jobs(stream: Any) -> tuple[str, list[SegmentJob]]:
    """The export directory and the jobs, read from ``stream`` to its end."""
    objects = msgpack.Unpacker(stream, raw=False, max_buffer_size=1 << 31)
    header = next(objects)
    return header["root"], [SegmentJob(**fields) for fields in objects]
