"""What the broker writes to the export worker's stdin (``worker.py``): msgpack
objects, a header ``{"root": export dir, "priority": the worker's CPU priority}``
then the fields of one :class:`SegmentJob` per segment."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from ._convert import SegmentJob

__all__ = ["job_messages", "read_header"]


def job_messages(root: str, jobs: Iterable[SegmentJob], priority: str = "low") -> Iterator[bytes]:
    """The header, then one object per job."""
    yield msgpack.packb({"root": root, "priority": priority})
    for job in jobs:
        yield msgpack.packb(dataclasses.asdict(job))


def read_header(stream: Any) -> tuple[str, str, Iterator[SegmentJob]]:
    """The export directory, the priority, and the jobs (read from ``stream`` to its
    end as they are iterated)."""
    objects = msgpack.Unpacker(stream, raw=False, max_buffer_size=1 << 31)
    header = next(objects)
    return header["root"], header.get("priority", "low"), (SegmentJob(**fields) for fields in objects)
