"""One sealed segment to one Parquet file (pyarrow and numpy only, no Spark).

The broker takes a :class:`SegmentJob` snapshot on its event loop (the segment's
files are immutable once sealed; only its deletions may still grow) and the export
worker process (``worker.py``) converts it. Reading follows the record layout of
``protocol._records`` and the deletion tags of ``storage``: a record that fails its
checksum or whose lengths do not add up is left out and counted, never exported.

The conversion is columnar, a batch of records at a time: one numpy gather reads the
fixed fields of every record; the subjects, header names and values and payloads are
cut out of the segment's bytes by one Arrow ``take`` each (:func:`_slices`); header
blocks are parsed one header position at a time across all records. Checksums: a
segment sealed with a summary (``storage._segment``) is checked with one CRC-32 of
its whole file against the one recorded at seal; any other, or one whose file no
longer matches, has each record's CRC-32 checked (one zlib call per record, over a
view of the bytes).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from protocol import MARKER_MASK, TTL_NEVER, ErrorCode, MarkerReason, RemovalReason, error_class
from storage import CORRUPT, Damage, read_deletion_tags

from ._schema import SCHEMA

__all__ = ["SegmentJob", "segment_batches", "write_segment", "new_damage", "relative_path", "BATCH_ROWS"]

_LIVE = 1
#: A record's fixed part, ``protocol.RECORD_FIXED``: record header, then body header.
_FIXED = np.dtype(
    [("length", "<u4"), ("crc", "<u4"), ("offset", "<u8"), ("ts", "<u8"),
     ("ttl", "<u4"), ("flags", "u1"), ("sl", "u1"), ("hl", "<u4"), ("pl", "<u4")]
)
_FIXED_SIZE = _FIXED.itemsize  # 38
_FIXED_BYTES = np.arange(_FIXED_SIZE, dtype=np.int64)
_US = 1_000_000  # microseconds per second
_NO_DEADLINE = np.iinfo(np.int64).max


def _arrow(values: np.ndarray, type_: pa.DataType, nulls: np.ndarray | None = None) -> pa.Array:
    """A numpy array (bool, or integers of ``type_``'s width) as an Arrow array over
    the same memory. ``pa.array`` would do, but its first call imports pandas to ask
    whether ``values`` is a pandas object: a quarter of a second of each worker's
    start."""
    assert values.dtype == bool or values.dtype.itemsize * 8 == type_.bit_width, (values.dtype, type_)
    data = np.packbits(values, bitorder="little") if values.dtype == bool else np.ascontiguousarray(values)
    validity = None if nulls is None else pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    return pa.Array.from_buffers(type_, len(values), [validity, pa.py_buffer(data)])


def _numpy(values: pa.Array) -> np.ndarray:
    """A null-free Arrow array of bools or uint64 as numpy (``to_numpy`` imports
    pandas too, see :func:`_arrow`)."""
    data = values.buffers()[1]
    if values.type == pa.bool_():
        bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little", count=values.offset + len(values))
        return bits[values.offset :].astype(bool)
    assert values.type == pa.uint64()
    return np.frombuffer(data, np.uint64, len(values), values.offset * 8).astype(np.int64)


def _strings(texts: list[str | None]) -> pa.Array:
    """A few strings (None: null) as an Arrow array (see :func:`_arrow`)."""
    raw = [t.encode() if t is not None else b"" for t in texts]
    offsets = np.zeros(len(raw) + 1, np.int32)
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    validity = np.packbits(np.array([t is not None for t in texts], bool), bitorder="little")
    return pa.Array.from_buffers(pa.string(), len(raw), [pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))])


_MARKER_TEXT = {int(r): r.header_value for r in MarkerReason if r}
#: ``marker_reason`` by the flags' marker bits.
_MARKERS = _strings([_MARKER_TEXT.get(bits) for bits in range(MARKER_MASK + 1)])
_TAG_TEXT = {int(r): r.label for r in RemovalReason}
_TAGS = 16  # a deletion tag is 4 bits
#: ``removed_reason`` by code: 0 live (null), 1 ``purge``, 2 ``unknown``, 3 + t tag t.
_REASONS = _strings([None, "purge", "unknown"] + [_TAG_TEXT.get(t, "unknown") for t in range(_TAGS)])
_PURGE, _UNKNOWN, _TAGGED = 1, 2, 3


@dataclass(frozen=True)
class SegmentJob:
    """Everything the conversion needs, taken on the broker's loop.

    ``states`` is the segment's per-record state at snapshot time (1 = live);
    ``purged_through`` the partition's purge watermark; ``max_age`` the topic's
    max age in seconds (0 = none); ``log_crc`` the CRC-32 of the whole ``.log`` file
    that its summary recorded at seal, when every record was valid (None: no valid
    summary).
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
    #: The records' positions (u32, little-endian): bytes, or (the broker's snapshot)
    #: a view of a sealed segment's own array, which never changes.
    positions: bytes | memoryview
    states: bytes
    purged_through: int
    max_age: int
    generation: int = 0  # the topic's creation time (ids of deleted topics are reused)
    topic_config: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    log_crc: int | None = None

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


#: Rows per Arrow record batch and Parquet row group: bounds what a conversion holds
#: besides the segment's bytes (a few hundred bytes per row) while numpy's and Arrow's
#: per-call costs stay small against the rows.
BATCH_ROWS = 65_536


class _Segment:
    """A segment's bytes, as Python bytes (for CRCs and odd cuts), a numpy array (for
    gathers) and an Arrow buffer (for zero-copy binary arrays)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.view = memoryview(raw)
        self.u8 = np.frombuffer(raw, np.uint8)
        self.arrow = pa.py_buffer(raw)
        # Binary offsets are int32; a segment is at most 1 GiB, but stay right beyond.
        self.bound: type[np.signedinteger[Any]] = np.int32 if len(raw) < 2**31 else np.int64
        self.tiles_type = pa.binary() if len(raw) < 2**31 else pa.large_binary()

    def u16(self, at: np.ndarray) -> np.ndarray:
        """The little-endian u16 at each position."""
        return self.u8[at].astype(np.int64) | self.u8[at + 1].astype(np.int64) << 8

    def slices(self, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
        """``raw[starts[i]:ends[i]]`` for each i, as one binary array.

        Ranges in file order that do not overlap (records and their parts) tile the
        bytes together with the gaps between them: a binary array with those
        boundaries as offsets costs nothing to make, and filtering every other value
        out of it copies exactly the bytes wanted, in C++. Other ranges are cut one by
        one.
        """
        n = len(starts)
        if n and np.all(starts[1:] >= ends[:-1]):
            bounds = np.empty(2 * n, self.bound)
            bounds[0::2] = starts
            bounds[1::2] = ends
            tiles = pa.Array.from_buffers(self.tiles_type, 2 * n - 1, [None, pa.py_buffer(bounds), self.arrow])
            wanted = np.zeros(2 * n - 1, bool)
            wanted[0::2] = True
            return tiles.filter(_arrow(wanted, pa.bool_())).cast(pa.binary())
        return pa.array([self.raw[s:e] for s, e in zip(starts.tolist(), ends.tolist())], pa.binary())

    def checked(self, pos: np.ndarray, intact: bool) -> tuple[np.ndarray, np.ndarray]:
        """The records at ``pos`` that pass ``protocol.check_record`` (in bounds,
        lengths that add up, a subject, the CRC-32): their fixed fields, and a mask of
        which ``pos`` they are. ``intact``: the whole file has the CRC-32 it had when
        it was sealed with every record valid, so each record's own holds too."""
        n = len(self.raw)
        if n < _FIXED_SIZE:
            return np.zeros(0, _FIXED), np.zeros(len(pos), bool)
        fixed = self.u8[np.minimum(pos, n - _FIXED_SIZE)[:, None] + _FIXED_BYTES].view(_FIXED).ravel()
        length = fixed["length"].astype(np.int64)
        total = length + 4
        ok = (pos + _FIXED_SIZE <= n) & (length >= 34) & (pos + total <= n) & (fixed["sl"] != 0)
        ok &= _FIXED_SIZE + fixed["sl"].astype(np.int64) + fixed["hl"] + fixed["pl"] == total
        if intact:
            return fixed[ok], ok
        at = np.flatnonzero(ok)
        crc_from, crc_to = (pos[at] + 8).tolist(), (pos[at] + total[at]).tolist()
        crcs = np.fromiter(map(zlib.crc32, map(self.view.__getitem__, map(slice, crc_from, crc_to))), np.uint32, len(at))
        ok[at] = crcs == fixed["crc"][at]
        return fixed[ok], ok


def _bad_headers(msg: str) -> Exception:
    return error_class(ErrorCode.INVALID_HEADERS)(msg)


def _text(values: pa.Array, strict: bool) -> pa.Array:
    """Binary to UTF-8 strings. ``strict`` (header names and values): invalid UTF-8
    is an error, as in ``protocol.decode_headers``; otherwise (subjects) invalid bytes
    become U+FFFD, as with ``bytes.decode(errors="replace")``."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        if strict:
            raise _bad_headers("header name or value is not valid text") from None
        return pa.array([v.decode(errors="replace") for v in values.to_pylist()], pa.string())


def _first_of_each_name(recs: np.ndarray, names: pa.Array) -> np.ndarray:
    """Which headers to keep: the first of each name in each record (``recs``: the
    record of each header, in file order)."""
    i = np.arange(len(recs))
    order = pc.sort_indices(
        pa.table({"r": _arrow(recs, pa.int64()), "n": names, "i": _arrow(i, pa.int64())}),
        [("r", "ascending"), ("n", "ascending"), ("i", "ascending")],
    )
    order = _numpy(order)
    by_name = names.take(_arrow(order, pa.int64()))
    again = (recs[order][1:] == recs[order][:-1]) & _numpy(pc.equal(by_name[1:], by_name[:-1]))
    keep = np.ones(len(recs), bool)
    keep[order[1:][again]] = False
    return keep


def _headers(seg: _Segment, starts: np.ndarray, lens: np.ndarray) -> pa.Array:
    """The header blocks ``[starts[i], starts[i] + lens[i])`` as the ``headers`` map
    column, as ``protocol.decode_headers`` reads them (the first of a repeated name
    wins): step k reads header k of every block that has one.

    Raises:
        InvalidHeadersError: a block is malformed.
    """
    u8 = seg.u8
    rec = np.flatnonzero(lens)
    at, end = starts[rec], starts[rec] + lens[rec]
    recs, names_at, values_at, values_end = [], [], [], []
    while len(rec):
        nlen = u8[at].astype(np.int64)
        value_at = at + 1 + nlen + 2
        if not np.all(nlen) or np.any(value_at > end):
            raise _bad_headers("header block is truncated or has an empty name")
        value_end = value_at + seg.u16(value_at - 2)
        if np.any(value_end > end):
            raise _bad_headers("header block is truncated")
        recs.append(rec)
        names_at.append(at + 1)
        values_at.append(value_at)
        values_end.append(value_end)
        more = value_end < end
        rec, at, end = rec[more], value_end[more], end[more]
    offsets = np.zeros(len(starts) + 1, np.int32)
    if not recs:
        empty = _strings([])
        return pa.MapArray.from_arrays(_arrow(offsets, pa.int32()), empty, empty)
    name_at = np.concatenate(names_at)
    order = np.argsort(name_at, kind="stable")  # file order: by record, then within its block
    rec_all, name_at = np.concatenate(recs)[order], name_at[order]
    value_at, value_end = np.concatenate(values_at)[order], np.concatenate(values_end)[order]
    names = _text(seg.slices(name_at, value_at - 2), strict=True)
    if not pc.all(pc.string_is_ascii(names)).as_py():
        raise _bad_headers("header name or value is not valid text")
    values = _text(seg.slices(value_at, value_end), strict=True)
    if np.any(rec_all[1:] == rec_all[:-1]):  # a block with several headers: drop repeated names
        keep = _first_of_each_name(rec_all, names)
        rec_all, names, values = rec_all[keep], names.filter(_arrow(keep, pa.bool_())), values.filter(_arrow(keep, pa.bool_()))
    np.cumsum(np.bincount(rec_all, minlength=len(starts)), out=offsets[1:])
    return pa.MapArray.from_arrays(_arrow(offsets, pa.int32()), names, values)


def _deletion_tags(job: SegmentJob) -> np.ndarray:
    """The recorded deletion tag of each record of the segment (0: none or not said)."""
    tags = np.zeros(job.count, np.int64)
    for rel, tag in read_deletion_tags(job.del_path).items():
        if rel < job.count:
            tags[rel] = tag
    return tags


def segment_batches(job: SegmentJob, batch_rows: int = BATCH_ROWS) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """The segment as record batches of at most ``batch_rows`` rows, each with the
    indexes in the segment of the corrupt records it left out."""
    with open(job.log_path, "rb") as f:
        seg = _Segment(f.read())
    # One CRC-32 of the file at C speed instead of one call per record, when it can vouch for them.
    intact = job.log_crc is not None and zlib.crc32(seg.raw) == job.log_crc
    positions = np.frombuffer(job.positions, "<u4").astype(np.int64)
    states = np.frombuffer(job.states, np.uint8)
    tags = _deletion_tags(job)
    for start in range(0, job.count, batch_rows):
        stop = min(start + batch_rows, job.count)
        fixed, good = seg.checked(positions[start:stop], intact)
        rels = np.arange(start, stop)[good]
        pos = positions[start:stop][good]
        subject_at = pos + _FIXED_SIZE
        headers_at = subject_at + fixed["sl"]
        payload_at = headers_at + fixed["hl"]
        offset = fixed["offset"].astype(np.int64)
        ts_ns = fixed["ts"].astype(np.int64)
        ts_us = ts_ns // 1000
        ttl = fixed["ttl"].astype(np.int64)
        never = ttl == TTL_NEVER
        own_ttl = (ttl != 0) & ~never
        # The earlier of the TTL's and the max age's deadlines, in µs: (ts + s * 1e9) // 1000 == ts // 1000 + s * 1e6.
        expires = np.where(own_ttl, ts_us + ttl * _US, _NO_DEADLINE)
        if job.max_age:
            expires = np.minimum(expires, np.where(never, _NO_DEADLINE, ts_us + job.max_age * _US))
        marker = fixed["flags"] & MARKER_MASK
        live = np.ones(len(rels), bool)
        known = rels < len(states)
        live[known] = states[rels[known]] == _LIVE
        tag = tags[rels]
        reason = np.where(live, 0, np.where(tag != 0, _TAGGED + tag, np.where(offset <= job.purged_through, _PURGE, _UNKNOWN)))
        columns = {
            "offset": _arrow(offset, pa.int64()),
            "timestamp": _arrow(ts_us, SCHEMA.field("timestamp").type),
            "timestamp_ns": _arrow(ts_ns, pa.int64()),
            "subject": _text(seg.slices(subject_at, headers_at), strict=False),
            "headers": _headers(seg, headers_at, fixed["hl"].astype(np.int64)),
            "payload": seg.slices(payload_at, payload_at + fixed["pl"]),
            "ttl_seconds": _arrow(ttl, pa.int64(), nulls=~own_ttl),
            "ttl_never": _arrow(never, pa.bool_()),
            "expires_at": _arrow(expires, SCHEMA.field("expires_at").type, nulls=expires == _NO_DEADLINE),
            "is_marker": _arrow(marker != 0, pa.bool_()),
            "marker_reason": _MARKERS.take(_arrow(marker.astype(np.int64), pa.int64())),
            "removed": _arrow(~live, pa.bool_()),
            "removed_reason": _REASONS.take(_arrow(reason.astype(np.int64), pa.int64())),
        }
        yield pa.RecordBatch.from_arrays([columns[name] for name in SCHEMA.names], schema=SCHEMA), start + np.flatnonzero(~good)


def write_segment(job: SegmentJob, path: str) -> tuple[int, list[int]]:
    """Convert the segment into the Parquet file ``path``, batch by batch, and make it
    durable (file synced). Returns the rows written and the indexes in the segment
    of the corrupt records left out."""
    rows = 0
    corrupt: list[int] = []
    with pq.ParquetWriter(path, SCHEMA, compression="zstd") as writer:
        for batch, skipped in segment_batches(job):
            writer.write_batch(batch)
            rows += batch.num_rows
            corrupt += skipped.tolist()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return rows, corrupt


def new_damage(job: SegmentJob, corrupt: list[int]) -> Damage | None:
    """The damage to report for the corrupt records ``corrupt`` the export left out
    of ``job``'s segment: the ones the broker did not know were corrupt (its state
    for them at the snapshot was not ``CORRUPT``: it reported those already)."""
    new = [rel for rel in corrupt if rel >= len(job.states) or job.states[rel] != CORRUPT]
    if not new:
        return None
    positions = np.frombuffer(job.positions, "<u4")
    return Damage(
        "segment", job.log_path, int(positions[new[0]]),
        f"{len(new)} record(s) fail their checksum or their lengths do not add up",
        "left out of the export (corrupt_records in the manifest)", (job.base + new[0], job.base + new[-1]),
    )
