"""One sealed segment to one Parquet file (pyarrow only, no Spark).

The broker takes a :class:`SegmentJob` snapshot on its event loop (the segment's
files are immutable once sealed; only its deletions may still grow) and converts it
in a worker thread. Reading goes through ``storage`` (record layout, checksums,
deletion tags), never around it: a record that fails its checksum is left out and
counted, never exported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from protocol import MARKER_MASK, RECORD_FIXED, TTL_NEVER, MarkerReason, RemovalReason, check_record, decode_headers
from storage import read_deletion_tags

from ._schema import SCHEMA

__all__ = ["SegmentJob", "segment_batches", "write_segment", "relative_path", "BATCH_ROWS"]

NS = 1_000_000_000
_LIVE = 1
_REASONS = {int(r): r.label for r in RemovalReason}
_MARKERS = {int(r): r.header_value for r in MarkerReason if r}


@dataclass(frozen=True)
class SegmentJob:
    """Everything the conversion needs, taken on the broker's loop.

    ``states`` is the segment's per-record state at snapshot time (1 = live);
    ``purged_through`` the partition's purge watermark; ``max_age`` the topic's
    max age in seconds (0 = none).
    """

    stream_id: int
    topic_id: int
    partition: int
    stream: str
    topic: str
    base: int
    count: int
    log_path: str
    del_path: str
    positions: bytes  # array('I') of record positions, as bytes
    states: bytes
    purged_through: int
    max_age: int
    generation: int = 0  # the topic's creation time (ids of deleted topics are reused)
    topic_config: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def key(self) -> str:
        """The manifest's key: numeric ids (stable across renames) and the topic's
        generation."""
        return f"{self.stream_id}/{self.topic_id}@{self.generation}/{self.partition}/{self.base}"

    @property
    def topic_key(self) -> str:
        """The manifest's key of the segment's topic."""
        return f"{self.stream_id}/{self.topic_id}@{self.generation}"

    @property
    def last_offset(self) -> int:
        return self.base + self.count - 1


def relative_path(job: SegmentJob) -> str:
    """``stream=<name>/topic=<name>/partition=<n>/<first>-<last>.parquet``."""
    return os.path.join(
        f"stream={job.stream}", f"topic={job.topic}", f"partition={job.partition}", f"{job.base}-{job.last_offset}.parquet"
    )


#: Rows per Arrow record batch: bounds the memory a conversion holds (a 64 MiB segment
#: of small messages is ~370,000 rows, ~1.6 KB each as Python objects) and how long
#: one Arrow call holds the GIL (the broker's event loop runs beside the thread).
BATCH_ROWS = 16_384


def segment_batches(job: SegmentJob, batch_rows: int = BATCH_ROWS) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The segment as record batches of at most ``batch_rows`` rows, each with how
    many corrupt records (left out) it skipped."""
    from array import array

    positions = array("I")
    positions.frombytes(job.positions)
    with open(job.log_path, "rb") as f:
        buf = f.read()
    tags = read_deletion_tags(job.del_path)
    unpack = RECORD_FIXED.unpack_from
    max_age_ns = job.max_age * NS
    n = len(buf)
    for start in range(0, job.count, batch_rows):
        cols: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
        offset_c, ts_c, subj_c, hdr_c, pay_c = cols["offset"], cols["timestamp_ns"], cols["subject"], cols["headers"], cols["payload"]
        ttl_c, never_c, exp_c = cols["ttl_seconds"], cols["ttl_never"], cols["expires_at"]
        mk_c, mkr_c, rm_c, rmr_c = cols["is_marker"], cols["marker_reason"], cols["removed"], cols["removed_reason"]
        corrupt = 0
        for rel in range(start, min(start + batch_rows, job.count)):
            pos = positions[rel]
            if check_record(buf, pos, n) < 0:
                corrupt += 1
                continue
            _, _, off, ts, ttl, flags, sl, hl, pl = unpack(buf, pos)
            s = pos + 38
            offset_c.append(off)
            ts_c.append(ts)
            subj_c.append(buf[s : s + sl].decode(errors="replace"))
            hdr_c.append(list(decode_headers(buf[s + sl : s + sl + hl]).items()) if hl else [])
            pay_c.append(buf[s + sl + hl : s + sl + hl + pl])
            never = ttl == TTL_NEVER
            never_c.append(never)
            ttl_c.append(ttl if ttl and not never else None)
            deadlines = []
            if ttl and not never:
                deadlines.append(ts + ttl * NS)
            if max_age_ns and not never:
                deadlines.append(ts + max_age_ns)
            exp_c.append(min(deadlines) // 1000 if deadlines else None)
            reason = flags & MARKER_MASK
            mk_c.append(bool(reason))
            mkr_c.append(_MARKERS.get(reason))
            live = job.states[rel] == _LIVE if rel < len(job.states) else True
            rm_c.append(not live)
            if live:
                rmr_c.append(None)
            elif rel in tags and tags[rel]:
                rmr_c.append(_REASONS.get(tags[rel], "unknown"))
            elif off <= job.purged_through:
                rmr_c.append("purge")
            else:
                rmr_c.append("unknown")
        cols["timestamp"] = [t // 1000 for t in ts_c]
        yield pa.RecordBatch.from_pydict(cols, schema=SCHEMA), corrupt


def write_segment(job: SegmentJob, path: str) -> tuple[int, int]:
    """Convert the segment into the Parquet file ``path``, batch by batch, and make it
    durable (file synced). Returns ``(rows, corrupt records left out)``."""
    rows = corrupt = 0
    with pq.ParquetWriter(path, SCHEMA, compression="zstd") as writer:
        for batch, skipped in segment_batches(job):
            writer.write_batch(batch)
            rows += batch.num_rows
            corrupt += skipped
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return rows, corrupt
