"""The files that describe a segment's log and can be rebuilt from it: the offset
index, the time index, the summary, the columns and the active segment's snapshot
(:class:`IndexFiles`). Each is checked when it is read; one that fails its checks is
never used, and is reported unless it is merely missing or out of date.

``.index``
    The offset index: one ``u32`` LE file position per record, record *i* of the
    segment having offset ``base + i``, then a 12-byte trailer ``"TBIX" | u32 count |
    u32 CRC-32`` of the positions. Written when the segment is sealed; for the active
    segment the index lives in memory and is rebuilt by recovery.
``.timeindex``
    The time index: ``(u32 relative offset, u64 timestamp ns)`` LE pairs, one per
    appended batch (every record of a batch carries the batch's timestamp), so it
    gives the exact timestamp of every record with one bisect; then the trailer
    ``"TBTX" | u32 count | u32 CRC-32``. Written at seal.
``.summary``
    Written at seal, after the indexes: ``"TBSS" | u16 version | u16 0 | u32 records
    | u32 time index entries | u64 log size | u32 CRC-32 of the whole log | u32 CRC-32
    of the 28 bytes before it``. Only for a segment whose every record was valid when
    it was sealed (none corrupt, no uncertain deletions). Recovery takes the log's
    checksum from it: a log that still has that size and that CRC-32 holds exactly
    the records that were sealed, so the startup scan reads its fields without
    checking each record's own checksum (one CRC-32 of the file at C speed instead
    of one per record). A missing summary (older segments), one that fails its
    checksum, or one that does not agree with the indexes or the file: the records
    are verified one by one as before (and the summary written again when they all
    pass); damage is reported (``kind=segment_summary``).
``.columns``
    Every record's subject, flags, TTL and whether it has headers, as arrays
    (``_columns.py``), read from the log of a segment sealed with a summary: by a
    clean close, for the segments sealed since the partition was opened, and by a
    start that finds one missing (not at seal: reading a segment's records costs
    about 0.35 µs each, which publishing at full rate must not pay). Trusted only when its checksum holds and its record
    count, log size and log CRC-32 are the summary's (whose CRC-32 the startup scan
    has just found the log to have): the startup rebuild then reads it instead of
    the records. Missing (a crash before it was written, older segments): the
    records are read and the file written; damaged or disagreeing: reported
    (``kind=segment_columns``), then the same.
``.snapshot``
    Written for the active segment when the partition is closed cleanly: ``"TBAS" |
    u16 version | u16 0 | u32 records | u32 time index entries | u64 log size | u32
    log CRC-32 | u32 columns bytes``, the record positions (``u32`` each), the time
    index (``u32`` relative offsets, then ``u64`` timestamps), the ``.columns``
    content, and a CRC-32 of everything before it. The next start uses it instead of
    reading the active segment record by record only if its checksum holds and the
    log has exactly its size and CRC-32, followed by nothing but zero bytes (space
    allocated ahead whose cut at close did not reach the disk; the positions, time
    index and columns are a function of the log's bytes); one that fails its
    checksum is reported (``kind=segment_snapshot``); one that no longer matches the
    log (appends since, a torn write) is simply not used. Removed when the segment
    is sealed.

Both indexes can be rebuilt from the ``.log``: an index that fails its checksum or its
shape is rebuilt (``_recovery.rebuild_records``) and the damage reported. None of
these files is ever needed to read a record, only to find it faster: each is written
without a directory fsync, and a crash that loses one costs a rebuild, not data, and
is not damage.
"""

from __future__ import annotations

import os
import struct
import zlib
from array import array
from typing import NamedTuple

from ._columns import (
    Columns, decode_columns, encode_columns, extract_columns, from_le, le_bytes, recorded_subjects, write_columns,
)
from ._damage import Damage
from ._files import atomic_write, read_if_exists
from ._log import NONZERO, SegmentLog
from ._recovery import Opening

__all__ = ["IndexFiles", "SealedIndexes"]

_TIME_ENTRY = struct.Struct("<IQ")
_U32 = struct.Struct("<I")
_TRAILER = struct.Struct("<4sII")  # magic, entry count, CRC-32 of the entries
_INDEX_MAGIC = b"TBIX"
_TIMES_MAGIC = b"TBTX"
_SUMMARY = struct.Struct("<4sHHIIQI")  # magic, version, 0, records, time entries, log size, log CRC-32
_SUMMARY_MAGIC = b"TBSS"
_SUMMARY_VERSION = 1
_SNAPSHOT = struct.Struct("<4sHHIIQII")  # magic, version, 0, records, time entries, log size, log CRC-32, columns bytes
_SNAPSHOT_MAGIC = b"TBAS"
_SNAPSHOT_VERSION = 1
_OLD_FORMAT = "no checksum trailer (written by an older version, or cut short)"


class SealedIndexes(NamedTuple):
    """A sealed segment's offset index and time index as read from their files.

    ``indexed`` is how many records the offset index lists (-1: it could not be
    read at all, and ``positions`` is empty). Each ``*_problem`` is what is wrong
    with that file (None: it passed every check); the entries are given only when
    both files passed."""

    positions: array
    time_rel: list[int]
    time_ts: list[int]
    indexed: int
    index_problem: str | None
    times_problem: str | None

    @property
    def intact(self) -> bool:
        return self.index_problem is None and self.times_problem is None


class IndexFiles:
    """The ``.index``, ``.timeindex``, ``.summary``, ``.columns`` and ``.snapshot``
    files of one segment (path stem ``stem``), and what was learnt from them."""

    def __init__(self, stem: str) -> None:
        self.index_path = stem + ".index"
        self.time_path = stem + ".timeindex"
        self.summary_path = stem + ".summary"
        self.columns_path = stem + ".columns"
        self.snapshot_path = stem + ".snapshot"
        #: Sealed: the log's CRC-32 as its summary recorded it at seal (None: no valid
        #: summary; the startup scan verifies every record).
        self.sealed_crc: int | None = None
        #: Sealed with a summary since opened: its ``.columns`` file is written by a
        #: clean close (:meth:`write_owed_columns`) or the next start.
        self.columns_owed = False
        #: Per subject ``(records, first, last)`` over all records, from a trusted
        #: ``.columns`` file (:meth:`read_columns`) or ``.snapshot``, else None.
        self.column_stats: list[tuple[int, int, int]] | None = None
        #: The active segment's columns, from its ``.snapshot`` (taken by the scan).
        self.snapshot_columns: Columns | None = None

    @property
    def paths(self) -> tuple[str, str, str, str, str]:
        return self.index_path, self.time_path, self.summary_path, self.columns_path, self.snapshot_path

    # -- offset index and time index --------------------------------------------------

    def read_indexes(self, max_count: int, file_size: int) -> SealedIndexes:
        """Read and check the offset index and the time index of a sealed segment of
        at most ``max_count`` records whose log is ``file_size`` bytes long."""
        index, index_problem = _read_index(self.index_path, _INDEX_MAGIC, 4)
        times, times_problem = _read_index(self.time_path, _TIMES_MAGIC, _TIME_ENTRY.size)
        positions = from_le(index) if index is not None else None
        indexed = len(positions) if positions is not None else -1
        if positions is not None and not (indexed <= max_count and (not positions or positions[-1] <= file_size)):
            index_problem = "its positions do not fit the log file"
        rels: list[int] = []
        tss: list[int] = []
        if index_problem is None and times_problem is None and times is not None:
            for r, t in _TIME_ENTRY.iter_unpack(times):
                rels.append(r)
                tss.append(t)
        return SealedIndexes(
            positions if positions is not None else array("I"), rels, tss, indexed, index_problem, times_problem
        )

    def report_rebuilt(self, found: SealedIndexes, opening: Opening) -> None:
        """Report the damage of indexes that are rebuilt from the log (a missing file,
        or an older one without a trailer in a partition of an older version, is
        not damage)."""
        for path, kind, problem in (
            (self.index_path, "offset_index", found.index_problem), (self.time_path, "time_index", found.times_problem)
        ):
            if problem is not None and problem != "missing" and (opening.strict or problem != _OLD_FORMAT):
                opening.report(Damage(kind, path, None, problem, opening.act("rebuilt from the segment's records")))

    def write_indexes(self, log: SegmentLog) -> None:
        # The indexes can be rebuilt from the log, so a lost directory entry after a
        # power loss costs a rebuild, not data: no directory fsync on this path.
        positions = le_bytes(log.positions)
        atomic_write(self.index_path, positions + _trailer(_INDEX_MAGIC, len(log.positions), positions), sync_dir=False)
        times = _time_entries(log.time_rel, log.time_ts)
        atomic_write(self.time_path, times + _trailer(_TIMES_MAGIC, len(log.time_rel), times), sync_dir=False)

    # -- summary -------------------------------------------------------------------

    def read_summary(self, log: SegmentLog, opening: Opening) -> int | None:
        """The log's CRC-32 as recorded at seal, if the summary is intact and agrees
        with the indexes and the file; otherwise None (damage reported)."""
        raw = read_if_exists(self.summary_path)
        if raw is None:
            return None
        problem = None
        if len(raw) != _SUMMARY.size + 4 or zlib.crc32(raw[:-4]) != _U32.unpack_from(raw, _SUMMARY.size)[0]:
            problem = "checksum mismatch or wrong length"
        else:
            magic, version, _, count, times, size, crc = _SUMMARY.unpack_from(raw)
            if magic != _SUMMARY_MAGIC or version != _SUMMARY_VERSION:
                problem = "not a segment summary of this version"
            elif (count, times, size) != (len(log.positions), len(log.time_rel), log.file_size):
                problem = (f"it records {count} records, {times} time index entries and {size} bytes; the segment "
                           f"has {len(log.positions)}, {len(log.time_rel)} and {log.file_size}")
            else:
                return crc
        opening.report(Damage("segment_summary", self.summary_path, None, problem,
                              opening.act("the segment's records are verified one by one; the summary is written again")))
        return None

    def write_summary_file(self, log: SegmentLog, crc: int) -> None:
        """Record the sealed log's size and CRC-32 ``crc`` (rebuildable: no directory
        fsync). :attr:`sealed_crc` is the caller's to set."""
        body = _SUMMARY.pack(_SUMMARY_MAGIC, _SUMMARY_VERSION, 0, len(log.positions), len(log.time_rel), log.size, crc)
        atomic_write(self.summary_path, body + _U32.pack(zlib.crc32(body)), sync_dir=False)

    # -- snapshot ------------------------------------------------------------------

    def load_snapshot(self, log: SegmentLog, buf: bytes, opening: Opening) -> bool:
        """Take the positions, time index and columns from the ``.snapshot`` file if
        it describes exactly the log image ``buf``, or ``buf`` without a tail of zero
        bytes (a clean close's cut of the allocated space lost in a power loss; see
        the module docstring)."""
        raw = read_if_exists(self.snapshot_path)
        if raw is None:
            return False
        problem = None
        if len(raw) < _SNAPSHOT.size + 4 or zlib.crc32(memoryview(raw)[:-4]) != _U32.unpack_from(raw, len(raw) - 4)[0]:
            problem = "checksum mismatch or cut short"
        else:
            magic, version, _, count, times, size, crc, cols_len = _SNAPSHOT.unpack_from(raw)
            if magic != _SNAPSHOT_MAGIC or version != _SNAPSHOT_VERSION:
                problem = "not a segment snapshot of this version"
            elif size > len(buf) or NONZERO.search(buf, size) or crc != zlib.crc32(memoryview(buf)[:size]):
                return False  # the log changed since (appends, a torn write): stale, not damage
            elif len(raw) != _SNAPSHOT.size + 4 * count + 12 * times + cols_len + 4:
                problem = "its length does not match its header"
            else:
                p = _SNAPSHOT.size
                positions = from_le(raw[p : p + 4 * count])
                p += 4 * count
                time_rel = from_le(raw[p : p + 4 * times])
                p += 4 * times
                time_ts = from_le(raw[p : p + 8 * times], "Q")
                p += 8 * times
                got = decode_columns(raw[p : p + cols_len], count, size, crc)
                if isinstance(got, str):
                    problem = f"its columns: {got}"
                elif positions and (positions[0] != 0 or positions[-1] >= size) or (
                    time_rel and (time_rel[0] != 0 or time_rel[-1] >= count)
                ):
                    problem = "its positions or time index do not fit the log"
                else:
                    log.load(positions, time_rel, time_ts, size)
                    log.crc = crc
                    self.snapshot_columns, self.column_stats = got
                    return True
        opening.report(Damage("segment_snapshot", self.snapshot_path, None, problem,
                              opening.act("the active segment's records are verified one by one")))
        return False

    def write_snapshot(self, log: SegmentLog, crc: int) -> None:
        """Write the ``.snapshot`` file of the active segment ``log``, whose records
        are all known good and whose file ends at its last record, ``crc`` its
        CRC-32 (a clean close; rebuildable, no directory fsync)."""
        buf = log.read_all()
        cols = encode_columns(extract_columns(buf, log.positions), log.size, crc)
        times = len(log.time_rel)
        body = b"".join((
            _SNAPSHOT.pack(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, 0, len(log.positions), times, log.size, crc, len(cols)),
            le_bytes(log.positions), le_bytes(log.time_rel), le_bytes(log.time_ts), cols,
        ))
        atomic_write(self.snapshot_path, body + _U32.pack(zlib.crc32(body)), sync_dir=False)

    def drop_snapshot(self) -> None:
        """Forget and remove the snapshot (at seal: it described the segment while
        active)."""
        self.snapshot_columns = None
        if os.path.exists(self.snapshot_path):
            os.unlink(self.snapshot_path)

    # -- columns -------------------------------------------------------------------

    def read_columns(self, log: SegmentLog, opening: Opening) -> Columns | None:
        """The ``.columns`` file, if it is intact and describes this segment as its
        summary does (:attr:`sealed_crc`, which the caller has found the log to have);
        else None (damage reported; a missing file is not damage)."""
        raw = read_if_exists(self.columns_path)
        if raw is None or self.sealed_crc is None:
            return None
        got = decode_columns(raw, len(log.positions), log.size, self.sealed_crc)
        if isinstance(got, str):
            opening.report(Damage("segment_columns", self.columns_path, None, got,
                                  opening.act("the startup rebuild read the segment's records; the file is written again")))
            return None
        cols, self.column_stats = got
        return cols

    def columns_from_log(self, log: SegmentLog, buf: bytes, write: bool) -> Columns:
        """The columns of the verified log image ``buf``; ``write``: keep them in the
        ``.columns`` file (the log having its summary's CRC-32)."""
        cols = extract_columns(buf, log.positions)
        self.column_stats = None
        if write and self.sealed_crc is not None:
            write_columns(self.columns_path, cols, log.size, self.sealed_crc)
            self.columns_owed = False
        return cols

    def recorded_subjects(self) -> tuple[list[bytes], array] | None:
        """Every record slot's subject (``names[sids[k]]`` for slot ``k``, as far as
        the file goes) as the ``.columns`` file, or else the ``.snapshot``, recorded
        it, whatever the log holds now; None when neither is there with its own
        checksum and shape intact.

        Both were made from a log whose every record had just been verified, and a
        record is never rewritten in place: the subject a slot had then is its
        record's for good, so this names the subject of a record damaged since,
        which the record itself can no longer be trusted to say
        (``_columns.recorded_subjects``). Read only for segments with damaged
        records."""
        raw = read_if_exists(self.columns_path)
        got = recorded_subjects(raw) if raw is not None else None
        if got is not None:
            return got
        raw = read_if_exists(self.snapshot_path)
        if raw is None or len(raw) < _SNAPSHOT.size + 4:
            return None
        if zlib.crc32(memoryview(raw)[:-4]) != _U32.unpack_from(raw, len(raw) - 4)[0]:
            return None
        magic, version, _, count, times, _, _, cols_len = _SNAPSHOT.unpack_from(raw)
        if magic != _SNAPSHOT_MAGIC or version != _SNAPSHOT_VERSION:
            return None
        at = _SNAPSHOT.size + 4 * count + 12 * times
        if len(raw) != at + cols_len + 4:
            return None
        return recorded_subjects(raw[at : at + cols_len])

    def write_owed_columns(self, log: SegmentLog) -> None:
        """Write the ``.columns`` file of a segment sealed since it was opened, from its
        log, if the log still has the CRC-32 its summary recorded (a clean close)."""
        if not self.columns_owed or self.sealed_crc is None or log.fd < 0:
            return
        buf = log.read_all()
        if zlib.crc32(buf) == self.sealed_crc:
            self.columns_from_log(log, buf, write=True)


def _time_entries(rel: array, ts: array) -> bytes:
    """The time index entries (``_TIME_ENTRY``: u32 rel, u64 timestamp, little-endian),
    interleaved with twelve strided copies instead of a pack per entry (a worker
    thread writing them holds the GIL for microseconds, not milliseconds)."""
    n = len(rel)
    out = bytearray(n * _TIME_ENTRY.size)
    a, b = le_bytes(rel), le_bytes(ts)
    for k in range(4):
        out[k::12] = a[k::4]
    for k in range(8):
        out[4 + k :: 12] = b[k::8]
    return bytes(out)


def _trailer(magic: bytes, count: int, content: bytes) -> bytes:
    return _TRAILER.pack(magic, count, zlib.crc32(content))


def _read_index(path: str, magic: bytes, entry_size: int) -> tuple[bytes | None, str | None]:
    """An index file's entries, or ``(None, what is wrong)``."""
    raw = read_if_exists(path)
    if raw is None:
        return None, "missing"
    if len(raw) < _TRAILER.size or raw[-_TRAILER.size : -_TRAILER.size + 4] != magic:
        return None, _OLD_FORMAT
    got_magic, count, crc = _TRAILER.unpack_from(raw, len(raw) - _TRAILER.size)
    content = raw[: -_TRAILER.size]
    if count * entry_size != len(content):
        return None, f"its trailer counts {count} entries but it holds {len(content)} bytes of them"
    if zlib.crc32(content) != crc:
        return None, "checksum mismatch"
    return content, None
