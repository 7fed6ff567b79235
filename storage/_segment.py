"""One segment of a partition log: a ``.log`` file and its companions.

Files, named by the segment's first offset zero-padded to 20 digits (Iggy's naming):

``.log``
    Records back to back, exactly as ``protocol._records`` lays them out. Only the
    active (last) segment is appended to; a sealed segment never changes. The active
    segment's file is allocated ahead of its last record (``_files.AppendFile``,
    never beyond the segment size limit), so that
    the fdatasync of a group commit writes the new records only, not a new file
    size; the records are written at their positions (``pwrite``), never appended
    to the file's end. A seal and a clean close cut the file to its last record, so
    only the active segment of a broker that stopped without closing can end in
    allocated space, which reads as zero bytes.
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
``.del`` and ``.del2``
    Deletions, the same entries in both files: ``(u32 word, u32 CRC-32 of the word)``
    where the word holds the relative offset (low 28 bits) and a tag (top 4 bits).
    Appended on each delete and fsynced like the log, before the delete is
    acknowledged. Two copies, so that one damaged write, page or truncation loses
    no acknowledged deletion: recovery takes the union of the valid entries of both.
    Allocated ahead like the active log (from one page, ``_files.AppendFile``) and
    cut at close; whole entries of zero bytes at a file's end are that space (an
    entry of zeros never passes its checksum), dropped and cut by recovery.

Both indexes can be rebuilt from the ``.log``: an index that fails its checksum or its
shape is rebuilt (and the damage reported). Deletions cannot be rebuilt: a damaged
entry is reported, and if neither copy holds it the segment's live records are put
aside (reads of them fail) rather than risk serving a deleted message.

In memory a segment holds the index (4 bytes per record), one state byte per record
(live, deleted, corrupt) and the time index (12 bytes per batch).

Recovery (``open_active``) reads the active segment and verifies every record (unless
its ``.snapshot`` describes the log byte for byte, see above). A bad
record followed by valid records is corruption: it is marked corrupt and reported,
and recovery resynchronises on the next record that passes its checksum, however far
on, so nothing intact after damage is dropped. What follows the last valid record is
a torn tail; whether it may be cut is the partition log's decision (it knows the
high-water mark). A tail of zero bytes only is allocated space (no record starts
with a zero length: the shortest valid record holds 38 bytes and a subject): it is
cut without a report, unless acknowledged records are missing. Sealed segments are
checked structurally on open (index checksum, length, file length); their records
are verified on every read.
"""

from __future__ import annotations

import os
import re
import struct
import threading
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol import RECORD_FIXED, check_record

from ._columns import Columns, decode_columns, encode_columns, extract_columns, from_le, le_bytes, write_columns
from ._damage import Damage, Report, ignore_damage
from ._durability import fsync_dir
from ._errors import CorruptedRecord, StorageFailure
from ._files import AppendFile, atomic_write, keep_aside, open_file

__all__ = ["Segment", "RecoveryReport", "Opening", "LIVE", "DELETED", "CORRUPT", "segment_name", "read_deletion_tags"]

LIVE = 1
#: ``bytes.translate`` table: LIVE stays 1, every other state becomes 0.
_LIVE_ONLY = bytes(1 if i == LIVE else 0 for i in range(256))
DELETED = 0
CORRUPT = 2

_DEL_ENTRY = struct.Struct("<II")
#: A ``.del`` entry's first word: the record's index in the segment in the low 28 bits
#: (a segment of at most 1 GiB holds fewer than 2**25 records), and in the top 4 bits
#: a tag the caller gives (why it was deleted; 0 = not said).
_REL_MASK = 0x0FFFFFFF
_TAG_SHIFT = 28
_HEAD = struct.Struct("<IIQ")  # length, crc32, offset: the start of every record
FIXED = 38  # record header (24) + body header (14)
_TIME_ENTRY = struct.Struct("<IQ")
_U32 = struct.Struct("<I")
_Q = struct.Struct("<Q")
_OFFSET_AT = 8  # the offset field's position inside a record
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
#: A ``.del`` word no real entry has (relative offset beyond any segment, tag 15): the
#: segment's deletions could not all be read, so its remaining records are put aside.
_UNCERTAIN_WORD = 0xFFFFFFFF
_ONES = b"\x01" * 4096
#: The deletion files are allocated ahead from one page (512 entries), as much as
#: they hold after that (a segment with few deletions keeps little unused space).
_DEL_ALLOCATE_MIN = 4096


def segment_name(base: int) -> str:
    return f"{base:020d}"


@dataclass(frozen=True)
class Opening:
    """How a partition is being opened, handed to each of its segments.

    Attributes:
        report: where damage goes.
        clean: the partition was closed cleanly (a torn write is then damage).
        strict: the partition was written by this format version (a missing
            checksum or deletion copy is then damage, not an upgrade).
        quarantine_dir: where bytes that could not be read are kept.
        readonly: look, report, change nothing (``ttlbroker check``).
    """

    report: Report
    clean: bool = False
    strict: bool = True
    quarantine_dir: str = "quarantine"
    readonly: bool = False

    def act(self, action: str) -> str:
        """``action`` as the report of a read-only check words it (nothing was done)."""
        return f"not changed; the next start or `ttlbroker repair`: {action}" if self.readonly else action

    @property
    def write_flags(self) -> int:
        return os.O_RDONLY if self.readonly else os.O_RDWR | os.O_CREAT


@dataclass
class RecoveryReport:
    """What opening a segment found."""

    truncated_bytes: int = 0
    truncated_at_offset: int | None = None
    #: Bytes after the last valid record of an active segment (before any cut).
    tail_bytes: int = 0
    #: The tail is zero bytes only: space allocated ahead, cut without a report
    #: (unless acknowledged records are missing). 0 when the tail holds anything else.
    preallocated_bytes: int = 0
    corrupt_offsets: list[int] = field(default_factory=list)
    index_rebuilt: bool = False


def scan_records(buf: bytes, base: int) -> tuple[array, list[int], list[int], list[int], int]:
    """Verify the records of a log image one by one.

    Returns ``(positions, corrupt_rel, time_rel, time_ts, valid_end)``: the position of
    every record slot, the relative offsets found corrupt, the time index, and where
    the last good record ends (anything after it is a torn tail).
    """
    positions = array("I")
    corrupt: list[int] = []
    time_rel: list[int] = []
    time_ts: list[int] = []
    last_ts = -1
    pos = 0
    end = len(buf)
    expected = base
    unpack = RECORD_FIXED.unpack_from
    crc32 = zlib.crc32
    view = memoryview(buf)
    add = positions.append
    while pos < end:
        # protocol.check_record's rules, inlined (this loop runs once per stored
        # record at every start), plus the offset the slot must hold.
        if pos + FIXED <= end:
            length, crc, offset, ts, _, _, sl, hl, pl = unpack(buf, pos)
            total = length + 4
            if (
                offset == expected and FIXED + sl + hl + pl == total and sl and pos + total <= end
                and crc32(view[pos + 8 : pos + total]) == crc
            ):
                if ts != last_ts:
                    time_rel.append(expected - base)
                    time_ts.append(ts)
                    last_ts = ts
                add(pos)
                pos += total
                expected += 1
                continue
        found = _resync(buf, pos + 1, expected)
        if found is None:
            break  # nothing valid follows: a torn tail
        next_pos, next_offset = found
        for missing in range(expected, next_offset):
            positions.append(pos)
            corrupt.append(missing - base)
        pos = next_pos
        expected = next_offset
    return positions, corrupt, time_rel, time_ts, pos


_NONZERO = re.compile(rb"[^\x00]")


def _resync(buf: bytes, start: int, expected: int) -> tuple[int, int] | None:
    """Find the first valid record after the damaged slot that starts at ``start - 1``
    whose offset is above ``expected`` (the damaged slot's offset), however far on.

    Every position is a candidate: its offset field must lie in the range the rest of
    the file could hold, and the record must pass its checksum. Runs of zero bytes (a
    zeroed page, preallocated space) are skipped at C speed: a record's offset field
    is never zero.
    """
    end = len(buf)
    unpack_q = _Q.unpack_from
    p = start
    while p + FIXED <= end:
        (off,) = unpack_q(buf, p + _OFFSET_AT)
        if off == 0:
            m = _NONZERO.search(buf, p + _OFFSET_AT)
            if m is None:
                return None
            p = max(p + 1, m.start() - _OFFSET_AT - 7)
            continue
        # The slots in between held at least FIXED bytes each.
        if expected < off <= expected + (p - start) // FIXED + 1 and check_record(buf, p, end) > 0:
            return p, off
        p += 1
    return None


class Segment:
    """One segment. Not thread-safe: used from the broker's event loop only (the
    group-commit thread only ever calls fdatasync on descriptors it is handed)."""

    def __init__(self, directory: str, base: int) -> None:
        self.directory = directory
        self.base = base
        stem = os.path.join(directory, segment_name(base))
        self.log_path = stem + ".log"
        self.index_path = stem + ".index"
        self.time_path = stem + ".timeindex"
        self.del_path = stem + ".del"
        self.mirror_path = stem + ".del2"
        self.summary_path = stem + ".summary"
        self.columns_path = stem + ".columns"
        self.snapshot_path = stem + ".snapshot"
        self.positions = array("I")
        self.state = bytearray()
        self.time_rel = array("I")
        self.time_ts = array("Q")
        self.size = 0
        self.live_count = 0
        #: The bytes of the live records (:meth:`live_bytes`) and what the state was
        #: when that was known: ``(live_count, records, size)``; another state means
        #: it is counted again.
        self._live_bytes = 0
        self._live_key: tuple[int, int, int] | None = None
        self.sealed = False
        self._fd = -1
        self._del_fd = -1
        self._mirror_fd = -1
        #: Both copies of the deletions, once opened for writing.
        self._deletions: list[AppendFile] = []
        #: The log file's length as recovery found it: ``size`` plus a tail it has
        #: not resolved yet (:meth:`cut_tail`, :meth:`seal_damaged`).
        self._file_size = 0
        #: Allocate the log ahead of its last record up to this size (0: never).
        self.preallocate_limit = 0
        #: The log as appends write it (made by the first append).
        self._out: AppendFile | None = None
        #: Some deletion of this segment could not be read: its records are put aside,
        #: and nothing more may be appended to it (new records are not in doubt).
        self.uncertain = False
        self.dirty = False
        self.del_dirty = False
        #: CRC-32 of the log bytes ``[0, size)``, kept up to date by appends (None:
        #: not known, e.g. after damage; the segment is then sealed without a summary).
        self.crc: int | None = 0
        #: Sealed: the log's CRC-32 as its summary recorded it at seal (None: no valid
        #: summary; the startup scan verifies every record).
        self.sealed_crc: int | None = None
        #: Sealed with a summary since opened: its ``.columns`` file is written by a
        #: clean close (:meth:`write_owed_columns`) or the next start.
        self.columns_owed = False
        #: Per subject ``(records, first, last)`` over all records, from a trusted
        #: ``.columns`` file (:meth:`read_columns`), else None.
        self.column_stats: list[tuple[int, int, int]] | None = None
        #: The active segment's columns, from its ``.snapshot`` (taken by the scan).
        self.snapshot_columns: Columns | None = None
        #: Held by :meth:`write_seal_files` (a worker thread) and by :meth:`close`, so
        #: that a segment closed or removed meanwhile gets no index file written.
        self._files_lock = threading.Lock()

    # -- opening -------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base: int, preallocate_limit: int = 0) -> Segment:
        """A new, empty active segment (the caller fsyncs the directory), its file
        allocated ahead up to ``preallocate_limit`` bytes (0: never)."""
        seg = cls(directory, base)
        seg._fd = open_file(seg.log_path, os.O_RDWR | os.O_CREAT)
        seg.preallocate_limit = preallocate_limit
        return seg

    @classmethod
    def open_active(cls, directory: str, base: int, opening: Opening | None = None) -> tuple[Segment, RecoveryReport]:
        """Open the last segment for appending, verifying every record (recovery).

        Corrupt records are marked and reported; what follows the last valid record
        is left in place and measured in ``RecoveryReport.tail_bytes``: the partition
        log decides whether it is a torn write to cut (:meth:`cut_tail`) or damage to
        keep (:meth:`seal_damaged`). A tail of zero bytes only (space allocated ahead
        of the records) is measured in ``RecoveryReport.preallocated_bytes`` too."""
        opening = opening or Opening(ignore_damage)
        seg = cls(directory, base)
        report = RecoveryReport()
        seg._fd = open_file(seg.log_path, opening.write_flags)
        size = os.fstat(seg._fd).st_size
        buf = os.pread(seg._fd, size, 0) if size else b""
        seg._file_size = size
        if seg._load_snapshot(buf, opening):
            seg._measure_tail(buf, report)
            seg._apply_deletions(opening)
            return seg, report
        positions, corrupt, time_rel, time_ts, valid_end = scan_records(buf, base)
        seg._load(positions, time_rel, time_ts, valid_end)
        seg.crc = zlib.crc32(memoryview(buf)[:valid_end]) if not corrupt else None
        seg._measure_tail(buf, report)
        for rel in corrupt:
            seg._mark_corrupt(rel)
        seg._apply_deletions(opening)
        seg._report_corrupt(corrupt, buf, opening, report)
        return seg, report

    def _measure_tail(self, buf: bytes, report: RecoveryReport) -> None:
        """Measure what follows the last record (``size``) in the log image ``buf``:
        all of it zero bytes is allocated space (the exact test: not one byte of it
        is anything else)."""
        report.tail_bytes = len(buf) - self.size
        if report.tail_bytes and _NONZERO.search(buf, self.size) is None:
            report.preallocated_bytes = report.tail_bytes

    def _load_snapshot(self, buf: bytes, opening: Opening) -> bool:
        """Take the positions, time index and columns from the ``.snapshot`` file if
        it describes exactly the log image ``buf``, or ``buf`` without a tail of zero
        bytes (a clean close's cut of the allocated space lost in a power loss; see
        the module docstring)."""
        raw = _read_bytes(self.snapshot_path)
        if raw is None:
            return False
        problem = None
        if len(raw) < _SNAPSHOT.size + 4 or zlib.crc32(memoryview(raw)[:-4]) != _U32.unpack_from(raw, len(raw) - 4)[0]:
            problem = "checksum mismatch or cut short"
        else:
            magic, version, _, count, times, size, crc, cols_len = _SNAPSHOT.unpack_from(raw)
            if magic != _SNAPSHOT_MAGIC or version != _SNAPSHOT_VERSION:
                problem = "not a segment snapshot of this version"
            elif size > len(buf) or _NONZERO.search(buf, size) or crc != zlib.crc32(memoryview(buf)[:size]):
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
                    self._load(positions, time_rel, time_ts, size)
                    self.crc = crc
                    self.snapshot_columns, self.column_stats = got
                    return True
        opening.report(Damage("segment_snapshot", self.snapshot_path, None, problem,
                              opening.act("the active segment's records are verified one by one")))
        return False

    def write_snapshot(self) -> None:
        """Write the ``.snapshot`` file of this (active) segment, if every record of it
        is known good (a clean close; rebuildable, no directory fsync)."""
        if self.sealed or self.crc is None or self.uncertain or CORRUPT in self.state or self._fd < 0:
            return
        self._release_preallocation()
        if os.fstat(self._fd).st_size != self.size:
            return  # bytes beyond the last record (a failed write): the next start looks at them
        buf = self.read_all()
        cols = encode_columns(extract_columns(buf, self.positions), self.size, self.crc)
        times = len(self.time_rel)
        body = b"".join((
            _SNAPSHOT.pack(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, 0, len(self.positions), times, self.size, self.crc, len(cols)),
            le_bytes(self.positions), le_bytes(self.time_rel), le_bytes(self.time_ts), cols,
        ))
        atomic_write(self.snapshot_path, body + _U32.pack(zlib.crc32(body)), sync_dir=False)

    def cut_tail(self, report: RecoveryReport, opening: Opening) -> None:
        """Cut the tail found by :meth:`open_active`, beyond every acknowledged
        record: after a crash, a write that never completed; after a clean stop,
        bytes nobody accounts for, reported and kept aside first. A tail of zero
        bytes only is space allocated ahead (:meth:`open_active`): cut, not reported,
        after a clean stop too (its cut at close may not have reached the disk)."""
        if report.preallocated_bytes:
            if not opening.readonly:
                # Not synced: until it is, a crash leaves the same zeros to cut again.
                os.ftruncate(self._fd, self.size)
                self._file_size = self.size
        elif self._file_size > self.size:
            if opening.readonly:
                if opening.clean:
                    opening.report(Damage(
                        "segment", self.log_path, self.size,
                        f"{self._file_size - self.size} bytes after the last record of a segment that was closed cleanly",
                        opening.act("keep them in quarantine and cut them"),
                    ))
                return
            if opening.clean:
                tail = os.pread(self._fd, self._file_size - self.size, self.size)
                kept = keep_aside(self.log_path, opening.quarantine_dir, ".tail", tail)
                opening.report(Damage(
                    "segment", self.log_path, self.size,
                    f"{len(tail)} bytes after the last record of a segment that was closed cleanly",
                    f"no acknowledged record is missing; the bytes were kept in {kept} and cut from the segment",
                ))
            report.truncated_bytes = self._file_size - self.size
            report.truncated_at_offset = self.next_offset
            os.ftruncate(self._fd, self.size)
            os.fsync(self._fd)
            self._file_size = self.size

    def seal_damaged(self, count: int, opening: Opening) -> None:
        """Seal the active segment with ``count`` record slots, the ones beyond what
        recovery found being acknowledged records that are missing or unreadable:
        they stay in the file (nothing is cut) and are marked corrupt."""
        missing = count - len(self.positions)
        if missing > 0:
            first = self.next_offset
            pos = self.size
            for _ in range(missing):
                self.positions.append(pos)
                self.state.append(CORRUPT)
            opening.report(Damage(
                "segment", self.log_path, pos,
                f"{missing} acknowledged record(s) missing or unreadable at the end of the active segment "
                f"({self._file_size - self.size} bytes there do not form valid records)",
                opening.act("kept the bytes; reads of these offsets fail with CORRUPTED_RECORD; new records go to a new segment"),
                (first, first + missing - 1),
            ))
        self.size = self._file_size
        self.crc = None
        if not opening.readonly:
            self.seal()

    @classmethod
    def open_sealed(
        cls, directory: str, base: int, max_count: int, opening: Opening | None = None
    ) -> tuple[Segment, RecoveryReport]:
        """Open a sealed segment: check its index files (checksum and shape), rebuild
        a bad one from the log.

        How many records the segment holds comes from its index, written when it was
        sealed; ``max_count`` (the distance to the next segment's base) bounds it and
        stands in for it when the index is lost. The next base alone cannot say: the
        cleaner may have removed the segments in between.
        """
        opening = opening or Opening(ignore_damage)
        seg = cls(directory, base)
        seg.sealed = True
        report = RecoveryReport()
        seg._fd = open_file(seg.log_path, os.O_RDONLY)
        size = os.fstat(seg._fd).st_size
        seg._file_size = size
        index, index_problem = _read_index(seg.index_path, _INDEX_MAGIC, 4)
        times, times_problem = _read_index(seg.time_path, _TIMES_MAGIC, _TIME_ENTRY.size)
        positions = from_le(index) if index is not None else None
        indexed = len(positions) if positions is not None else -1
        if positions is not None and not (indexed <= max_count and (not positions or positions[-1] <= size)):
            index_problem = "its positions do not fit the log file"
        if index_problem is None and times_problem is None:
            rels, tss = [], []
            for r, t in _TIME_ENTRY.iter_unpack(times):  # type: ignore[arg-type]
                rels.append(r)
                tss.append(t)
            seg._load(positions, array("I", rels), array("Q", tss), size)  # type: ignore[arg-type]
            seg.sealed_crc = seg._read_summary(opening)
        else:
            buf = os.pread(seg._fd, size, 0) if size else b""
            positions, corrupt, time_rel, time_ts, valid_end = scan_records(buf, base)
            report.index_rebuilt = True
            # With the index lost, only the next base can say how many records there
            # were; with a damaged one, the larger of what it lists and what is found.
            expected_count = max_count if indexed < 0 else min(max(indexed, len(positions)), max_count)
            seg._load(positions, time_rel, time_ts, size)
            for rel in corrupt:
                seg._mark_corrupt(rel)
            # Records the file should hold but does not (a truncated file): keep their
            # slots, mark them corrupt, never pretend they were not there.
            while len(seg.positions) < expected_count:
                corrupt.append(len(seg.positions))
                seg.positions.append(valid_end)
                seg.state.append(CORRUPT)
            if len(seg.positions) > expected_count >= 0:
                # More records than the next segment's base allows: keep the rest out.
                del seg.positions[expected_count:]
                del seg.state[expected_count:]
                corrupt = [r for r in corrupt if r < expected_count]
            seg.live_count = seg.state.count(LIVE)
            for path, kind, problem in ((seg.index_path, "offset_index", index_problem), (seg.time_path, "time_index", times_problem)):
                if problem is not None and problem != "missing" and (opening.strict or problem != _OLD_FORMAT):
                    opening.report(Damage(kind, path, None, problem, opening.act("rebuilt from the segment's records")))
            if not opening.readonly:
                seg._write_indexes()
            seg._apply_deletions(opening)
            seg._report_corrupt(corrupt, buf, opening, report)
            return seg, report
        seg._apply_deletions(opening)
        return seg, report

    def _read_summary(self, opening: Opening) -> int | None:
        """The log's CRC-32 as recorded at seal, if the summary is intact and agrees
        with the indexes and the file; otherwise None (damage reported)."""
        raw = _read_bytes(self.summary_path)
        if raw is None:
            return None
        problem = None
        if len(raw) != _SUMMARY.size + 4 or zlib.crc32(raw[:-4]) != _U32.unpack_from(raw, _SUMMARY.size)[0]:
            problem = "checksum mismatch or wrong length"
        else:
            magic, version, _, count, times, size, crc = _SUMMARY.unpack_from(raw)
            if magic != _SUMMARY_MAGIC or version != _SUMMARY_VERSION:
                problem = "not a segment summary of this version"
            elif (count, times, size) != (len(self.positions), len(self.time_rel), self._file_size):
                problem = (f"it records {count} records, {times} time index entries and {size} bytes; the segment "
                           f"has {len(self.positions)}, {len(self.time_rel)} and {self._file_size}")
            else:
                return crc
        opening.report(Damage("segment_summary", self.summary_path, None, problem,
                              opening.act("the segment's records are verified one by one; the summary is written again")))
        return None

    def write_summary(self, crc: int) -> None:
        """Record the sealed log's size and CRC-32 (rebuildable: no directory fsync)."""
        self._write_summary_file(crc)
        self.sealed_crc = crc

    def _write_summary_file(self, crc: int) -> None:
        body = _SUMMARY.pack(_SUMMARY_MAGIC, _SUMMARY_VERSION, 0, len(self.positions), len(self.time_rel), self.size, crc)
        atomic_write(self.summary_path, body + _U32.pack(zlib.crc32(body)), sync_dir=False)

    def _report_corrupt(self, corrupt: list[int], buf: bytes, opening: Opening, report: RecoveryReport) -> None:
        """One Damage per run of consecutive corrupt slots found by a scan (slots a
        repair wrote off are deleted, not reported again)."""
        corrupt = [r for r in corrupt if self.state[r] == CORRUPT]
        report.corrupt_offsets.extend(self.base + r for r in corrupt)
        i = 0
        while i < len(corrupt):
            j = i
            while j + 1 < len(corrupt) and corrupt[j + 1] == corrupt[j] + 1:
                j += 1
            first, last = corrupt[i], corrupt[j]
            pos = self.positions[first]
            end = self.positions[last + 1] if last + 1 < len(self.positions) else len(buf)
            opening.report(Damage(
                "segment", self.log_path, pos,
                f"{last - first + 1} record(s) fail their checksum or are missing ({end - pos} bytes)",
                "reads of these offsets fail with CORRUPTED_RECORD; the valid records after them are served",
                (self.base + first, self.base + last),
            ))
            i = j + 1

    def _load(self, positions: array, time_rel: array | list[int], time_ts: array | list[int], size: int) -> None:
        self.positions = positions
        n = len(positions)
        self.state = bytearray(b"\x01" * n)
        self.time_rel = array("I", time_rel)
        self.time_ts = array("Q", time_ts)
        self.size = size
        self.live_count = n
        self._live_key = None

    def _mark_corrupt(self, rel: int) -> None:
        if self.state[rel] == LIVE:
            self._lose_live([rel])
        self.state[rel] = CORRUPT

    # -- live bytes ----------------------------------------------------------------

    def live_bytes(self) -> int:
        """The bytes of the live records (deleted and corrupt ones left out): kept up
        to date by appends and deletions, counted again (at C speed, a step a run of
        live records) after anything else changed the segment."""
        key = (self.live_count, len(self.state), self.size)
        if self._live_key != key:
            self._live_bytes = self._count_live_bytes()
            self._live_key = key
        return self._live_bytes

    def _count_live_bytes(self) -> int:
        state, pos = self.state, self.positions
        n = len(state)
        if not self.live_count or not n:
            return 0
        if self.live_count == n:
            return self.size - pos[0]
        live = state.translate(_LIVE_ONLY)
        total = 0
        i = live.find(1)
        while i >= 0:
            j = live.find(0, i)
            if j < 0:
                return total + self.size - pos[i]
            total += pos[j] - pos[i]
            i = live.find(1, j)
        return total

    def _record_length(self, rel: int) -> int:
        pos = self.positions
        return (pos[rel + 1] if rel + 1 < len(pos) else self.size) - pos[rel]

    def _lose_live(self, rels: list[int]) -> None:
        """Live records ``rels`` stop being live (their state is changed by the
        caller): the count, and the live bytes when they are known."""
        known = self._live_key == (self.live_count, len(self.state), self.size)
        self.live_count -= len(rels)
        if known:
            self._live_bytes -= sum(self._record_length(rel) for rel in rels)
            self._live_key = (self.live_count, len(self.state), self.size)

    def _apply_deletions(self, opening: Opening) -> None:
        """Apply the recorded deletions: the union of both copies' valid entries.

        Copies that differ are made equal again (after a crash between the two
        writes, or damage to one); damaged bytes are kept aside first. An entry that
        neither copy can give is an acknowledged deletion the broker cannot place:
        the segment's live records are put aside (marked corrupt, durably, with an
        ``UNCERTAIN`` entry) rather than risk serving a deleted message.
        """
        found = [_read_bytes(self.del_path), _read_bytes(self.mirror_path)]
        if found[0] is None and found[1] is None:
            return
        copies = [_without_allocated(raw) for raw in found]
        words, unknown, damaged = _merge_deletions(copies, opening.clean)
        for k, path in enumerate((self.del_path, self.mirror_path)):
            raw = copies[k]
            if raw is None:
                if opening.strict:
                    opening.report(Damage("deletions", path, None, "missing", opening.act("recreated from the other copy")))
            elif damaged[k] is not None:
                opening.report(Damage(
                    "deletions", path, damaged[k], "entries fail their checksum or are missing",
                    opening.act("the other copy holds them; rewritten from it (old bytes kept in quarantine)"
                                if not unknown else "kept in quarantine"),
                ))
        if unknown:
            words[_UNCERTAIN_WORD] = None
        n = len(self.state)
        uncertain = _UNCERTAIN_WORD in words
        for word in words:
            rel = word & _REL_MASK
            if rel < n and self.state[rel] != DELETED:
                if self.state[rel] == LIVE:
                    self._lose_live([rel])
                self.state[rel] = DELETED
        if uncertain:
            self.uncertain = True
            held = [rel for rel in range(n) if self.state[rel] == LIVE]
            for rel in held:
                self._mark_corrupt(rel)
            if unknown or held:
                opening.report(Damage(
                    "deletions", self.del_path, None,
                    f"{unknown} deletion entr{'y' if unknown == 1 else 'ies'} unreadable in both copies"
                    if unknown else "the segment's deletions were found unreadable before",
                    opening.act(f"{len(held)} live record(s) of the segment put aside: reads of them fail with "
                                "CORRUPTED_RECORD (ttlbroker check lists them)"),
                    (self.base, self.base + n - 1) if n else None,
                ))
        if opening.readonly:
            return
        merged = b"".join(_del_entry(w) for w in words)
        for k, path in enumerate((self.del_path, self.mirror_path)):
            if copies[k] != merged:
                if copies[k] and damaged[k] is not None:
                    keep_aside(path, opening.quarantine_dir, ".damaged")
                atomic_write(path, merged)
            elif found[k] is not copies[k]:
                # Only allocated space after the entries. Not synced: until it is, a
                # crash leaves the same zeros to cut again.
                os.truncate(path, len(merged))

    # -- properties ----------------------------------------------------------------

    @property
    def count(self) -> int:
        """Record slots in the segment (live, deleted and corrupt)."""
        return len(self.positions)

    @property
    def next_offset(self) -> int:
        return self.base + len(self.positions)

    def timestamp_of(self, rel: int) -> int:
        """The append time of record ``rel``. Runtime complexity: O(log batches)."""
        return self.time_ts[bisect_right(self.time_rel, rel) - 1]

    def first_live_rel(self, start: int = 0) -> int:
        """The first live record at or after ``start``, or -1."""
        return self.state.find(b"\x01", start)

    # -- writing -------------------------------------------------------------------

    def append(self, records: bytearray | bytes, positions: list[int], timestamp: int) -> None:
        """Append already built records; ``positions`` are absolute file positions."""
        if self.sealed:
            raise StorageFailure("cannot append to a sealed segment")
        out = self._out
        if out is None:
            out = self._out = AppendFile(self._fd, self.size, limit=self.preallocate_limit)
        out.append(records)
        if self.crc is not None:
            self.crc = zlib.crc32(records, self.crc)
        n = len(positions)
        if timestamp != (self.time_ts[-1] if self.time_ts else -1):
            self.time_rel.append(len(self.positions))
            self.time_ts.append(timestamp)
        known = self._live_key == (self.live_count, len(self.state), self.size)
        self.positions.extend(positions)
        self.state += _ONES[:n] if n <= 4096 else b"\x01" * n
        self.size += len(records)
        self.live_count += n
        if known:
            self._live_bytes += len(records)
            self._live_key = (self.live_count, len(self.state), self.size)
        self.dirty = True

    def _release_preallocation(self) -> bool:
        """Cut the space allocated ahead of the last record; True if there was some."""
        return self._out is not None and self._out.cut()

    def delete_many(self, rels: list[int], tag: int = 0, corrupt: bool = False) -> int:
        """Mark several records deleted with one write to each copy of the deletions;
        returns how many were live. ``tag`` (0..15) is kept with each deletion
        (:func:`read_deletion_tags`). Durable once :meth:`take_dirty_fds`' descriptors
        are synced. ``corrupt``: delete the corrupt ones among ``rels`` instead (a
        repair writing off what cannot be read)."""
        state = self.state
        want = CORRUPT if corrupt else LIVE
        doomed = [rel for rel in dict.fromkeys(rels) if 0 <= rel < len(state) and state[rel] == want]
        done = len(doomed)
        if not done:
            return 0
        high = (tag & 0xF) << _TAG_SHIFT
        entries = b"".join([_del_entry(rel | high) for rel in doomed])
        if self._del_fd < 0:
            self._del_fd, self._mirror_fd = self._open_deletions()
            self._deletions = [
                AppendFile(fd, os.fstat(fd).st_size, _DEL_ALLOCATE_MIN) for fd in (self._del_fd, self._mirror_fd)
            ]
        for out in self._deletions:
            out.append(entries)
        if not corrupt:
            self._lose_live(doomed)
        for rel in doomed:
            state[rel] = DELETED
        self.del_dirty = True
        return done

    def _open_deletions(self) -> tuple[int, int]:
        flags = os.O_WRONLY | os.O_CREAT
        created = not os.path.exists(self.del_path) or not os.path.exists(self.mirror_path)
        fds = open_file(self.del_path, flags), open_file(self.mirror_path, flags)
        if created:
            fsync_dir(self.directory)  # the new files' entries, before any delete is acked
        return fds

    def drop_in_memory(self, upto_rel: int) -> int:
        """Mark records below ``upto_rel`` deleted in memory (purge watermark applied
        from the partition's own durable record). Returns how many were live."""
        upto = min(upto_rel, len(self.state))
        done = self.state.count(b"\x01", 0, upto)
        if done:
            self.state[0:upto] = bytes(upto)
            self.live_count -= done
        return done

    def take_dirty_fds(self) -> list[int]:
        fds = []
        if self.dirty:
            fds.append(self._fd)
            self.dirty = False
        if self.del_dirty:
            fds.append(self._del_fd)
            fds.append(self._mirror_fd)
            self.del_dirty = False
        return fds

    def fileno(self) -> int:
        """The log's descriptor (-1 once closed)."""
        return self._fd

    @property
    def corrupt_count(self) -> int:
        """Record slots found damaged (or put aside): never proof of garbage."""
        return self.state.count(CORRUPT)

    def seal(self) -> None:
        """Freeze the segment: cut the space allocated ahead, write its index files.
        The log's last records (and the cut) are synced first (the group commit syncs
        them too, later): an index that reached the disk before the records it lists
        would, after a power loss, make records that were never acknowledged look
        like damage, and a summary before the cut would not match the file's size.

        In three steps, which a caller may run apart (``PartitionLog.roll_active``):
        :meth:`begin_seal`, :meth:`write_seal_files` (in a worker thread), :meth:`end_seal`."""
        if self.sealed:
            return
        crc = self.begin_seal()
        self.end_seal(crc if self.write_seal_files(crc, sync_dir=False) else None)

    def begin_seal(self) -> int | None:
        """The seal's first step, once the segment takes no more appends: cut the space
        allocated ahead and sync the log (records and size), drop the active segment's
        snapshot. Returns the CRC-32 its summary is to record (None: no summary, a
        record of it is not known good)."""
        if self._release_preallocation():
            os.fsync(self._fd)  # the new size too (fdatasync need not write a smaller one)
        else:
            # Even when not dirty: the group commit may have taken the descriptor and
            # still be syncing it in its thread (this waits for that write-back).
            os.fdatasync(self._fd)
        self.snapshot_columns = None
        if os.path.exists(self.snapshot_path):
            os.unlink(self.snapshot_path)  # it described the segment while active
        return self.crc if self.crc is not None and not self.uncertain and CORRUPT not in self.state else None

    def write_seal_files(self, crc: int | None, sync_dir: bool = True) -> bool:
        """The seal's file writes, after :meth:`begin_seal` (its log synced): the index
        files, then the summary recording ``crc`` (none if None), then (``sync_dir``)
        the directory. Safe in a worker thread while the event loop goes on (it reads
        only what no append changes any more); nothing if the segment is closed or
        removed first, and a close or removal waits for it. Returns True once the
        summary is written. The files are rebuildable: a crash before they are durable
        costs a rebuild at the next start, never data, and is not damage."""
        with self._files_lock:
            if self._fd < 0:
                return False
            self._write_indexes()
            if crc is not None:
                self._write_summary_file(crc)
            if sync_dir:
                fsync_dir(self.directory)
            return crc is not None

    def end_seal(self, crc: int | None) -> None:
        """The seal's last step (on the thread that owns the segment): sealed, with
        the summary's CRC-32 ``crc`` if :meth:`write_seal_files` wrote it."""
        if crc is not None:
            self.sealed_crc = crc
            self.columns_owed = True
        self.sealed = True

    def write_owed_columns(self) -> None:
        """Write the ``.columns`` file of a segment sealed since it was opened, from its
        log, if the log still has the CRC-32 its summary recorded (a clean close)."""
        if not self.columns_owed or self.sealed_crc is None or self._fd < 0:
            return
        buf = self.read_all()
        if zlib.crc32(buf) == self.sealed_crc:
            self.columns_from_log(buf, write=True)

    def read_columns(self, opening: Opening) -> Columns | None:
        """The ``.columns`` file, if it is intact and describes this segment as its
        summary does (:attr:`sealed_crc`, which the caller has found the log to have);
        else None (damage reported; a missing file is not damage)."""
        raw = _read_bytes(self.columns_path)
        if raw is None or self.sealed_crc is None:
            return None
        got = decode_columns(raw, len(self.positions), self.size, self.sealed_crc)
        if isinstance(got, str):
            opening.report(Damage("segment_columns", self.columns_path, None, got,
                                  opening.act("the startup rebuild read the segment's records; the file is written again")))
            return None
        cols, self.column_stats = got
        return cols

    def columns_from_log(self, buf: bytes, write: bool) -> Columns:
        """The columns of the verified log image ``buf``; ``write``: keep them in the
        ``.columns`` file (the log having its summary's CRC-32)."""
        cols = extract_columns(buf, self.positions)
        self.column_stats = None
        if write and self.sealed_crc is not None:
            write_columns(self.columns_path, cols, self.size, self.sealed_crc)
            self.columns_owed = False
        return cols

    def _write_indexes(self) -> None:
        # The indexes can be rebuilt from the log, so a lost directory entry after a
        # power loss costs a rebuild, not data: no directory fsync on this path.
        positions = le_bytes(self.positions)
        atomic_write(self.index_path, positions + _trailer(_INDEX_MAGIC, len(self.positions), positions), sync_dir=False)
        times = _time_entries(self.time_rel, self.time_ts)
        atomic_write(self.time_path, times + _trailer(_TIMES_MAGIC, len(self.time_rel), times), sync_dir=False)

    # -- reading -------------------------------------------------------------------

    def read(
        self,
        rel: int,
        max_count: int,
        max_bytes: int,
        wanted: Callable[[int], bool] | None,
        runs: list[tuple[memoryview, int, int]],
        on_corrupt: Callable[[int, str], None],
    ) -> tuple[int, int, bool]:
        """Append verified live records from ``rel`` on to ``runs``.

        Consecutive records are returned as one run: ``(view, first offset, count)``,
        so a fetch of a thousand records costs one view, not a thousand. Stops after
        ``max_count`` records or ``max_bytes`` bytes (but always takes at least one
        record if one is there), at the end of the segment, or before a corrupt
        record. Returns ``(next_rel, records_taken, stopped_on_corrupt)``.

        Raises:
            CorruptedRecord: the very first record it would return is corrupt (and
                ``runs`` is empty).
        """
        positions = self.positions
        state = self.state
        count = len(positions)
        if rel >= count or max_count <= 0:
            return rel, 0, False
        base = self.base
        # Skip what is not live and not wanted without touching the disk.
        while rel < count and (state[rel] == DELETED or (wanted is not None and state[rel] == LIVE and not wanted(base + rel))):
            rel += 1
        if rel >= count:
            return rel, 0, False
        start = positions[rel]
        limit = start + max(max_bytes, 1)
        unwanted: set[int] | None = None
        if wanted is None:
            end_rel = scanned = min(count, rel + max_count)
        else:
            # Read only up to the last record this call can return (the
            # ``max_count``-th wanted one, or the last before the bytes run out):
            # reading to the segment's end cost a pread of up to ``max_bytes`` per
            # call. What the scan passed after it is not wanted (``scanned``).
            scanned = end_rel = rel
            found = 0
            while scanned < count:
                st = state[scanned]
                scanned += 1
                if st != DELETED:
                    if st == LIVE and not wanted(base + scanned - 1):
                        if unwanted is None:
                            unwanted = set()
                        unwanted.add(scanned - 1)
                    else:
                        end_rel = scanned
                        found += 1
                        if found >= max_count:
                            break
                if scanned < count and positions[scanned] > limit:
                    break
        scan_end = end_rel
        end_pos = positions[end_rel] if end_rel < count else self.size
        if end_pos > limit:
            j = bisect_right(positions, limit, rel + 1, end_rel) - 1
            end_rel = max(j, rel + 1)
            end_pos = positions[end_rel] if end_rel < count else self.size
        buf = os.pread(self._fd, end_pos - start, start)
        n = len(buf)
        view = memoryview(buf)
        if (
            unwanted is None and end_rel > rel and n == end_pos - start and state.count(LIVE, rel, end_rel) == end_rel - rel
            and self._back_to_back(buf, view, rel, end_rel, start)
        ):
            # What the loop below gives for live records back to back that pass its
            # checks: one run of them all (every one is taken: none is unwanted, and
            # ``end_rel`` is within ``max_count``).
            runs.append((view, base + rel, end_rel - rel))
            i = end_rel
            if i == scan_end and scan_end < scanned and end_rel - rel < max_count:
                i = scanned  # the rest of the scan held nothing wanted
            return i, end_rel - rel, False
        head = _HEAD.unpack_from
        crc32 = zlib.crc32
        got = 0
        run_at = run_end = -1  # the run being built: bytes [run_at, run_end) of buf
        run_first = run_n = 0
        i = rel
        while i < end_rel:
            st = state[i]
            if st == DELETED or (unwanted is not None and i in unwanted):
                i += 1
                continue
            p = positions[i] - start
            ok = False
            if st == LIVE and p + FIXED <= n:
                length, crc, off = head(buf, p)
                total = length + 4
                ok = off == base + i and length >= FIXED - 4 and p + total <= n and crc32(view[p + 8 : p + total]) == crc
            if not ok:
                if st == LIVE:
                    self._mark_corrupt(i)
                    on_corrupt(base + i, "checksum mismatch or truncated record")
                if run_n:
                    runs.append((view[run_at:run_end], run_first, run_n))
                if not runs:
                    raise CorruptedRecord(
                        f"record at offset {base + i} is corrupted (checksum mismatch or truncated); "
                        f"fetch from offset {base + i + 1} to read past it",
                        base + i,
                    )
                return i, got, True
            if p != run_end:
                if run_n:
                    runs.append((view[run_at:run_end], run_first, run_n))
                run_at = p
                run_first = base + i
                run_n = 0
            run_end = p + total
            run_n += 1
            got += 1
            i += 1
            if got >= max_count:
                break
        if run_n:
            runs.append((view[run_at:run_end], run_first, run_n))
        if i == scan_end and scan_end < scanned and got < max_count:
            i = scanned  # the rest of the scan held nothing wanted
        return i, got, False

    def _back_to_back(self, buf: bytes, view: memoryview, rel: int, end_rel: int, start: int) -> bool:
        """Whether records ``rel..end_rel-1``, read into ``buf`` (from file position
        ``start`` to ``end_rel``'s), each pass :meth:`read`'s checks (their offset,
        their length, their CRC-32) and fill it back to back: each ends where the
        next one's position says it starts. One pass with nothing else to look at
        per record; False leaves the record-by-record loop to say what is wrong."""
        head = _HEAD.unpack_from
        crc32 = zlib.crc32
        ends = self.positions[rel + 1 : end_rel]
        ends.append(start + len(buf))
        expect = self.base + rel
        p = 0
        for q in ends:
            q -= start
            if q - p < FIXED:
                return False
            length, crc, off = head(buf, p)
            if off != expect or length + 4 != q - p or crc32(view[p + 8 : q]) != crc:
                return False
            expect += 1
            p = q
        return True

    def read_one(self, rel: int, on_corrupt: Callable[[int, str], None]) -> memoryview:
        """Record ``rel``, verified, as :meth:`read` of one record returns it: one
        ``pread`` of exactly its bytes (from its position to the next record's, or the
        end of the log) and the same checks (its offset, its length, its CRC-32),
        without :meth:`read`'s loop and runs. A record that fails is marked corrupt and
        given to ``on_corrupt`` first, with the same reason and the same error as
        :meth:`read` (a key-value get reads one record per request).

        Raises:
            CorruptedRecord: it fails a check, or it is not live.
        """
        state = self.state
        if not 0 <= rel < len(state) or state[rel] != LIVE:
            return self._read_one_general(rel, on_corrupt)
        positions = self.positions
        start = positions[rel]
        buf = os.pread(self._fd, (positions[rel + 1] if rel + 1 < len(positions) else self.size) - start, start)
        offset = self.base + rel
        if len(buf) >= FIXED:
            length, crc, off = _HEAD.unpack_from(buf)
            total = length + 4
            if off == offset and length >= FIXED - 4 and total <= len(buf):
                view = memoryview(buf)
                if zlib.crc32(view[8:total]) == crc:
                    return view if total == len(buf) else view[:total]
        self._mark_corrupt(rel)
        on_corrupt(offset, "checksum mismatch or truncated record")
        raise CorruptedRecord(
            f"record at offset {offset} is corrupted (checksum mismatch or truncated); "
            f"fetch from offset {offset + 1} to read past it",
            offset,
        )

    def _read_one_general(self, rel: int, on_corrupt: Callable[[int, str], None]) -> memoryview:
        """:meth:`read_one` of a record that is not live, through :meth:`read`."""
        runs: list[tuple[memoryview, int, int]] = []
        self.read(rel, 1, 1, None, runs, on_corrupt)
        if not runs or runs[0][1] != self.base + rel:
            raise CorruptedRecord(f"record at offset {self.base + rel} is not readable", self.base + rel)
        return runs[0][0]

    def read_all(self) -> bytes:
        """The whole log file (recovery scans, export)."""
        return os.pread(self._fd, self.size, 0) if self.size else b""

    # -- closing -------------------------------------------------------------------

    def close(self) -> None:
        """Close the files, the log and the deletions cut to their content first (a
        failure to cut leaves zero bytes that the next start cuts). Waits for
        :meth:`write_seal_files` if a worker thread runs it."""
        with self._files_lock:
            self._close()

    def _close(self) -> None:
        for out in ([self._out] if self._out is not None else []) + self._deletions:
            try:
                out.cut()
            except OSError:
                pass
        self._out = None
        self._deletions = []
        for attr in ("_fd", "_del_fd", "_mirror_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                setattr(self, attr, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def remove_files(self) -> int:
        """Close and unlink every file of the segment; returns the bytes freed."""
        self.close()
        freed = 0
        for path in (
            self.log_path, self.index_path, self.time_path, self.summary_path, self.columns_path, self.snapshot_path,
            self.del_path, self.mirror_path,
        ):
            try:
                freed += os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                pass
        return freed


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


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _trailer(magic: bytes, count: int, content: bytes) -> bytes:
    return _TRAILER.pack(magic, count, zlib.crc32(content))


def _read_index(path: str, magic: bytes, entry_size: int) -> tuple[bytes | None, str | None]:
    """An index file's entries, or ``(None, what is wrong)``."""
    raw = _read_bytes(path)
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


def _del_entry(word: int) -> bytes:
    raw = _U32.pack(word)
    return raw + _U32.pack(zlib.crc32(raw))


def _without_allocated(raw: bytes | None) -> bytes | None:
    """A deletion file's bytes without the zero bytes that end it, from the end of
    the last entry holding anything else (space allocated ahead: an entry of zero
    bytes never passes its checksum, the CRC-32 of a zero word not being 0)."""
    if raw is None:
        return None
    keep = -(-len(raw.rstrip(b"\0")) // _DEL_ENTRY.size) * _DEL_ENTRY.size
    return raw[:keep] if keep < len(raw) else raw


def _parse_deletions(raw: bytes) -> list[int | None]:
    """Each entry's word, or None where the entry fails its checksum."""
    out: list[int | None] = []
    crc32 = zlib.crc32
    for i in range(0, len(raw) - len(raw) % 8, 8):
        word, crc = _DEL_ENTRY.unpack_from(raw, i)
        out.append(word if crc32(raw[i : i + 4]) == crc else None)
    return out


def _merge_deletions(copies: list[bytes | None], clean: bool) -> tuple[dict[int, None], int, list[int | None]]:
    """Merge the two copies of a segment's deletions, entry by entry (both get the
    same entries in the same order).

    Returns ``(words, unknown, damaged)``: the valid words in order (as dict keys),
    how many entries neither copy can give, and for each copy the byte position of
    its first damage (None: undamaged). After an unclean stop, a bad or partial
    last entry is a torn write (that delete was never acknowledged) and a copy that
    lacks the other's last entries was cut between the two writes: neither is damage.
    """
    parsed = [_parse_deletions(raw) if raw is not None else None for raw in copies]
    longest = max(len(p) for p in parsed if p is not None)
    words: dict[int, None] = {}
    unknown = 0
    damaged: list[int | None] = [None, None]
    for k, raw in enumerate(copies):
        if raw is not None and len(raw) % 8 and clean:
            damaged[k] = len(raw) - len(raw) % 8
    for i in range(longest):
        good = False
        for k, p in enumerate(parsed):
            if p is None:
                continue
            if i < len(p):
                w = p[i]
                if w is not None:
                    words[w] = None
                    good = True
                elif (clean or i < len(p) - 1) and damaged[k] is None:
                    damaged[k] = i * 8
            elif clean and damaged[k] is None:
                damaged[k] = len(copies[k] or b"")  # cut short
        if not good and (clean or i < longest - 1):
            unknown += 1
    return words, unknown, damaged


def read_deletion_tags(del_path: str) -> dict[int, int]:
    """``{record index: tag}`` of a segment's recorded deletions, from both copies
    (the first entry for a record wins; damaged entries are skipped). Safe to call
    while the files are appended to."""
    out: dict[int, int] = {}
    for path in (del_path, del_path + "2"):
        raw = _read_bytes(path)
        if raw is None:
            continue
        for word in _parse_deletions(raw):
            if word is not None and word != _UNCERTAIN_WORD:
                out.setdefault(word & _REL_MASK, word >> _TAG_SHIFT)
    return out
