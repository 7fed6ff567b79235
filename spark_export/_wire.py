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



def _bin_header(n: int) -> bytes:
    """msgpack's header of ``n`` bytes of binary (bin 8, 16 or 32: a type byte, then
    the length big-endian), as ``msgpack.packb`` writes it."""
    if n < 1 << 8:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def job_messages(root: str, jobs: Iterable[SegmentJob]) -> Iterator[bytes | memoryview]:
    """The header, then one object per job, each in pieces: the job's fields, then
    the positions' bytes as they are (``SegmentJob.positions`` may be a view of the
    sealed segment's own array: the broker's loop copies nothing, a megabyte per
    64 MiB segment). What the worker reads is one plain msgpack map per job."""
    packer = msgpack.Packer()
    yield packer.pack({"root": root})
    names = [f.name for f in dataclasses.fields(SegmentJob)]
    for job in jobs:
        parts = [packer.pack_map_header(len(names))]
        for name in names:
            parts.append(packer.pack(name))
            if name == "positions":
                positions = memoryview(job.positions).cast("B")
                parts.append(_bin_header(len(positions)))
                yield b"".join(parts)
                yield positions
                parts = []
            else:
                parts.append(packer.pack(getattr(job, name)))
        yield b"".join(parts)


def read_jobs(stream: Any) -> tuple[str, list[SegmentJob]]:
    """The export directory and the jobs, read from ``stream`` to its end."""
    objects = msgpack.Unpacker(stream, raw=False, max_buffer_size=1 << 31)
    header = next(objects)
    return header["root"], [SegmentJob(**fields) for fields in objects]
