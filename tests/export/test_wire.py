"""The jobs the broker writes to the export worker's stdin (``spark_export._wire``)."""

from __future__ import annotations

from conftest import require_extra

require_extra("spark", "the export and Spark tests")  # before the imports it guards

import dataclasses
import io
from array import array

import msgpack
import pytest

from spark_export import SegmentJob
from spark_export._wire import job_messages, read_jobs


@pytest.mark.parametrize("records", [0, 3, 100, 20_000, 250_000])
def test_a_job_with_a_view_of_the_positions_is_written_as_one_plain_msgpack_map(records: int) -> None:
    """The positions go out as the view the broker's snapshot takes of the sealed
    segment's array (never copied by the broker: its own piece of the output), and
    the bytes are exactly those of ``msgpack.packb`` of the job with them as bytes
    (every length: bin 8, 16 and 32 headers)."""
    positions = array("I", range(0, 16 * records, 16))
    jobs = [
        SegmentJob(1, 2, 0, "s", "t", 1, records, "/d/1.log", "/d/1.del", memoryview(positions), b"\x01" * records,
                   0, 0, 7, {"partitions": 1}, 123),
        SegmentJob(1, 2, 1, "s", "t", 5, 3, "/d/5.log", "/d/5.del", b"\x00" * 12, b"\x01\x00\x01", 4, 60, 7, None, None),
    ]
    pieces = list(job_messages("/export", jobs))
    assert any(isinstance(p, memoryview) and p.obj is positions for p in pieces)  # not a copy
    expected = msgpack.packb({"root": "/export"}) + b"".join(
        msgpack.packb(dataclasses.asdict(dataclasses.replace(j, positions=bytes(j.positions)))) for j in jobs
    )
    assert b"".join(bytes(p) for p in pieces) == expected
    root, got = read_jobs(io.BytesIO(expected))
    assert root == "/export"
    assert got == [dataclasses.replace(jobs[0], positions=positions.tobytes()), jobs[1]]
