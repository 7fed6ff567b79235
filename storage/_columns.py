"""A sealed segment's columns: what the startup rebuild needs of every record, read
once from the verified log and kept in a checksummed ``.columns`` file beside it, so
that a restart reads arrays instead of records.

Layout, little-endian::

    "TBSC" | u16 version | u16 0 | u32 records | u32 subjects | u32 subject bytes
    | u32 TTL runs | u32 records with headers | u64 log size | u32 log CRC-32
    u8  subject length, per subject (in order of first appearance)
    the subjects' bytes, back to back
    u32 subject number, per record
    u8  record flags, per record
    (u32 first record, u32 count, u32 ttl), per TTL run
    u32 record, per record with headers
    (u32 count, u32 first record, u32 last record), per subject, over all records
    u32 CRC-32 of everything before it

A TTL run is consecutive records of one batch (one timestamp) with the same non-zero
TTL field. The file describes every record slot of the segment, live or not (which
are live is the deletions' business). It is trusted only when its checksum holds and
its record count, log size and log CRC-32 are those of the segment's summary, whose
CRC-32 the startup scan has just found the log to have.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from protocol import RECORD_FIXED

from ._files import atomic_write

__all__ = ["Columns", "extract_columns", "encode_columns", "decode_columns", "recorded_subjects", "write_columns", "le_bytes", "from_le", "FIELDS", "FIELDS_AT"]

_HEAD = struct.Struct("<4sHHIIIIIQI")
_MAGIC = b"TBSC"
_VERSION = 1
#: A record's fields from its timestamp on: timestamp, ttl, flags, subject length, headers length.
FIELDS = struct.Struct("<QIBBI")  # timestamp, ttl, flags, subject length, headers length
FIELDS_AT = 16
_U32 = struct.Struct("<I")
_LITTLE = sys.byteorder == "little"


class Columns(NamedTuple):
    """Every record slot's subject (``sids`` numbers into ``names``) and flags byte,
    the TTL runs ``(first record, count, ttl)``, and the records with headers."""

    names: list[bytes]
    sids: array
    flags: bytes
    ttl_runs: list[tuple[int, int, int]]
    header_rels: array

    def stats(self) -> list[tuple[int, int, int]]:
        """Per subject: ``(records, first record, last record)`` over all records."""
        sids = self.sids
        n = len(sids)
        counts = Counter(sids)
        last = dict(zip(sids, range(n)))
        first = dict(zip(reversed(sids), range(n - 1, -1, -1)))
        return [(counts[k], first[k], last[k]) for k in range(len(self.names))]


def extract_columns(buf: bytes, positions: Sequence[int]) -> Columns:
    """The columns of the records at ``positions`` of a verified log image ``buf``.

    A slot too short to hold a record (only ever a record that is not live: the live
    ones were verified) gets an empty subject and zero fields."""
    table: dict[bytes, int] = {}
    names: list[bytes] = []
    ids: list[int] = []
    flags = bytearray()
    ttl_runs: list[tuple[int, int, int]] = []
    header_rels = array("I")
    add_id = ids.append
    add_flags = flags.append
    unpack = FIELDS.unpack_from
    n = len(buf)
    at = RECORD_FIXED.size
    run_rel = run_end = -1
    run_key = (-1, 0)
    for rel, p in enumerate(positions):
        if p + at > n:
            ts = ttl = fl = sl = hl = 0
        else:
            ts, ttl, fl, sl, hl = unpack(buf, p + FIELDS_AT)
        s = p + at
        subject = buf[s : s + sl]
        sid = table.get(subject)
        if sid is None:
            sid = table[subject] = len(names)
            names.append(bytes(subject))
        add_id(sid)
        add_flags(fl)
        if ttl:
            if rel != run_end or (ts, ttl) != run_key:
                if run_end > run_rel >= 0:
                    ttl_runs.append((run_rel, run_end - run_rel, run_key[1]))
                run_rel = rel
                run_key = (ts, ttl)
            run_end = rel + 1
        if hl:
            header_rels.append(rel)
    if run_end > run_rel >= 0:
        ttl_runs.append((run_rel, run_end - run_rel, run_key[1]))
    return Columns(names, array("I", ids), bytes(flags), ttl_runs, header_rels)


def encode_columns(cols: Columns, log_size: int, log_crc: int) -> bytes:
    names = cols.names
    blob = b"".join(names)
    head = _HEAD.pack(_MAGIC, _VERSION, 0, len(cols.sids), len(names), len(blob), len(cols.ttl_runs),
                      len(cols.header_rels), log_size, log_crc)
    runs = array("I", [v for run in cols.ttl_runs for v in run])
    stats = array("I", [v for st in cols.stats() for v in st])
    body = b"".join((head, bytes(len(s) for s in names), blob, le_bytes(cols.sids), cols.flags, le_bytes(runs),
                     le_bytes(cols.header_rels), le_bytes(stats)))
    return body + _U32.pack(zlib.crc32(body))


def write_columns(path: str, cols: Columns, log_size: int, log_crc: int) -> None:
    """Write the ``.columns`` file (rebuildable from the log: no directory fsync)."""
    atomic_write(path, encode_columns(cols, log_size, log_crc), sync_dir=False)


def decode_columns(
    raw: bytes, records: int, log_size: int, log_crc: int
) -> tuple[Columns, list[tuple[int, int, int]]] | str:
    """The columns and per-subject stats of a ``.columns`` file, or what is wrong with
    it: a bad checksum or shape, or a record count, log size or log CRC-32 other than
    the ones given (the segment's, as its summary and the log itself say)."""
    return _decode(raw, (records, log_size, log_crc))


def recorded_subjects(raw: bytes) -> tuple[list[bytes], array] | None:
    """Every record slot's subject (``names[sids[k]]`` for slot ``k``) as a ``.columns``
    file recorded it, or None when it fails its checksum or shape.

    Unlike :func:`decode_columns`, whatever the log holds now: the file was made
    from a log whose every record had just been verified, and a record is never
    rewritten in place, so the subject it gives a slot is that record's even after
    the log was damaged since (the one use: naming the subject of a damaged record,
    which the record itself can no longer be trusted to say)."""
    got = _decode(raw, None)
    return None if isinstance(got, str) else (got[0].names, got[0].sids)


def _decode(
    raw: bytes, expect: tuple[int, int, int] | None
) -> tuple[Columns, list[tuple[int, int, int]]] | str:
    """:func:`decode_columns`; ``expect``: the record count, log size and log CRC-32
    the file must describe (None: any)."""
    if len(raw) < _HEAD.size + 4 or zlib.crc32(memoryview(raw)[:-4]) != _U32.unpack_from(raw, len(raw) - 4)[0]:
        return "checksum mismatch or cut short"
    magic, version, _, count, n_names, blob_len, n_runs, n_hdr, size, crc = _HEAD.unpack_from(raw)
    if magic != _MAGIC or version != _VERSION:
        return "not a segment columns file of this version"
    if expect is not None and (count, size, crc) != expect:
        records, log_size, log_crc = expect
        return (f"it describes {count} records, a {size}-byte log with CRC-32 {crc:#010x}; the segment has "
                f"{records} records, {log_size} bytes, CRC-32 {log_crc:#010x}")
    expected = _HEAD.size + n_names + blob_len + 4 * count + count + 12 * n_runs + 4 * n_hdr + 12 * n_names + 4
    if len(raw) != expected:
        return f"{len(raw)} bytes where its header calls for {expected}"
    p = _HEAD.size
    lengths = raw[p : p + n_names]
    p += n_names
    if sum(lengths) != blob_len:
        return "its subject lengths do not add up to its subject bytes"
    names = []
    for ln in lengths:
        names.append(raw[p : p + ln])
        p += ln
    sids = from_le(raw[p : p + 4 * count])
    p += 4 * count
    flags = raw[p : p + count]
    p += count
    runs = from_le(raw[p : p + 12 * n_runs])
    p += 12 * n_runs
    header_rels = from_le(raw[p : p + 4 * n_hdr])
    p += 4 * n_hdr
    stats = from_le(raw[p : p + 12 * n_names])
    ttl_runs = list(zip(runs[0::3], runs[1::3], runs[2::3]))
    if (sids and max(sids) >= n_names) or any(r + c > count or not c for r, c, _ in ttl_runs) or (
        header_rels and header_rels[-1] >= count
    ) or sum(stats[0::3]) != count or (stats and max(max(stats[1::3]), max(stats[2::3])) >= count):
        return "its subject numbers or record numbers are out of range"
    return Columns(names, sids, flags, ttl_runs, header_rels), list(zip(stats[0::3], stats[1::3], stats[2::3]))


def le_bytes(a: array) -> bytes:
    """An array's items as little-endian bytes."""
    if _LITTLE:
        return a.tobytes()
    b = array(a.typecode, a)
    b.byteswap()
    return b.tobytes()


def from_le(raw: bytes, typecode: str = "I") -> array:
    """An array of little-endian items."""
    a = array(typecode)
    a.frombytes(raw)
    if not _LITTLE:
        a.byteswap()
    return a
