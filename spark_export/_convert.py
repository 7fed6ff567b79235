"""One sealed segment to one Parquet file (pyarrow only, no Spark).

The broker takes a :class:`SegmentJob` snapshot on its event loop (the segment's
files are immutable once sealed; only its deletions may still grow) and converts it
in a worker thread. Reading goes through ``storage`` (record layout, checksums,
deletion tags), never around it: a record that fails its checksum is left out and
counted, never exported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from protocol import MARKER_MASK, RECORD_FIXED, TTL_NEVER, MarkerReason, RemovalReason, check_record, decode_headers
from storage import read_deletion_tags

from ._schema import SCHEMA

__all__ = ["SegmentJob", "segment_table", "write_table", "relative_path"]

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

    @property
    def key(self) -> str:
        """The manifest's key: numeric ids (stable across renames) and the topic's
        generation."""
        return f"{self.stream_id}/{self.topic_id}@{self.generation}/{self.partition}/{self.base}"

    @property
    def last_offset(self) -> int:
        return self.base + self.count - 1


def relative_path(job: SegmentJob) -> str:
    """``stream=<name>/topic=<name>/partition=<n>/<first>-<last>.parquet``."""
    return os.path.join(
        f"stream={job.stream}", f"topic={job.topic}", f"partition={job.partition}", f"{job.base}-{job.last_offset}.parquet"
    )


def segment_table(job: SegmentJob) -> tuple[pa.Table, int]:
    """The segment as a table; returns it and how many corrupt records were left out."""
    from array import array

    positions = array("I")
    positions.frombytes(job.positions)
    with open(job.log_path, "rb") as f:
        buf = f.read()
    tags = read_deletion_tags(job.del_path)
    unpack = RECORD_FIXED.unpack_from
    cols: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    offset_c, ts_c, subj_c, hdr_c, pay_c = cols["offset"], cols["timestamp_ns"], cols["subject"], cols["headers"], cols["payload"]
    ttl_c, never_c, exp_c = cols["ttl_seconds"], cols["ttl_never"], cols["expires_at"]
    mk_c, mkr_c, rm_c, rmr_c = cols["is_marker"], cols["marker_reason"], cols["removed"], cols["removed_reason"]
    max_age_ns = job.max_age * NS
    corrupt = 0
    n = len(buf)
    for rel in range(job.count):
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
    table = pa.Table.from_pydict(cols, schema=SCHEMA)
    return table, corrupt


def write_table(table: pa.Table, path: str) -> None:
    """Write ``table`` to ``path`` and make it durable (file synced)."""
    pq.write_table(table, path, compression="zstd")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
