"""Recovery of a segment's log: how a partition is being opened (:class:`Opening`),
what opening a segment found (:class:`RecoveryReport`), and the record-by-record
scan that verifies a log image and resynchronises past damage.

Recovery reads the active segment and verifies every record (unless its
``.snapshot`` describes the log byte for byte: ``_indexes``). A bad record followed
by valid records is corruption: it is marked corrupt and reported, and recovery
resynchronises on the next record that passes its checksum, however far on, so
nothing intact after damage is dropped. What follows the last valid record is a
torn tail; whether it may be cut is the partition log's decision (it knows the
high-water mark): :func:`cut_tail` when every acknowledged record is there,
:func:`keep_missing` when acknowledged records are missing (then the bytes stay and
the missing records' slots are marked corrupt). A tail of zero bytes only is
allocated space (no record starts with a zero length: the shortest valid record
holds 38 bytes and a subject): it is cut without a report, unless acknowledged
records are missing.

A sealed segment whose offset index or time index fails its checks is scanned the
same way (:func:`rebuild_records`) and its indexes rebuilt from what is found.

The index files (``_indexes``) and the deletions (``_deletions``) are checked by
their own modules under the same :class:`Opening`; ``_segment.Segment`` opens a
segment by running these steps in order.
"""

from __future__ import annotations

import os
import struct
import zlib
from array import array
from dataclasses import dataclass, field

from protocol import RECORD_FIXED, check_record

from ._damage import Damage, Report
from ._files import keep_aside
from ._log import CORRUPT, FIXED, LIVE, NONZERO, OFFSET_AT, SegmentLog

__all__ = [
    "Opening", "RecoveryReport", "scan_records", "load_records", "rebuild_records", "measure_tail", "cut_tail",
    "keep_missing", "report_corrupt",
]

_Q = struct.Struct("<Q")


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
        (off,) = unpack_q(buf, p + OFFSET_AT)
        if off == 0:
            m = NONZERO.search(buf, p + OFFSET_AT)
            if m is None:
                return None
            p = max(p + 1, m.start() - OFFSET_AT - 7)
            continue
        # The slots in between held at least FIXED bytes each.
        if expected < off <= expected + (p - start) // FIXED + 1 and check_record(buf, p, end) > 0:
            return p, off
        p += 1
    return None


def load_records(log: SegmentLog, buf: bytes) -> list[int]:
    """Take the records of the active segment's log image ``buf`` record by record
    (:func:`scan_records`): the valid ones live, the damaged ones marked corrupt, the
    log's CRC-32 known only if none is. Returns the corrupt slots."""
    positions, corrupt, time_rel, time_ts, valid_end = scan_records(buf, log.base)
    log.load(positions, time_rel, time_ts, valid_end)
    log.crc = zlib.crc32(memoryview(buf)[:valid_end]) if not corrupt else None
    for rel in corrupt:
        log.mark_corrupt(rel)
    return corrupt


def rebuild_records(log: SegmentLog, max_count: int, indexed: int) -> tuple[bytes, list[int]]:
    """Take the records of a sealed segment whose indexes failed their checks from
    its log, record by record. ``indexed``: how many records its damaged offset index
    lists (-1: none readable); ``max_count``: the distance to the next segment's
    base. Returns the log image and the corrupt slots.

    With the index lost, only the next base can say how many records there were;
    with a damaged one, the larger of what it lists and what is found. Records the
    file should hold but does not (a truncated file) keep their slots, marked
    corrupt: never pretend they were not there."""
    buf = log.read_file()
    positions, corrupt, time_rel, time_ts, valid_end = scan_records(buf, log.base)
    expected_count = max_count if indexed < 0 else min(max(indexed, len(positions)), max_count)
    log.load(positions, time_rel, time_ts, log.file_size)
    for rel in corrupt:
        log.mark_corrupt(rel)
    while len(log.positions) < expected_count:
        corrupt.append(len(log.positions))
        log.positions.append(valid_end)
        log.state.append(CORRUPT)
    if len(log.positions) > expected_count >= 0:
        # More records than the next segment's base allows: keep the rest out.
        del log.positions[expected_count:]
        del log.state[expected_count:]
        corrupt = [r for r in corrupt if r < expected_count]
    log.live_count = log.state.count(LIVE)
    return buf, corrupt


def measure_tail(log: SegmentLog, buf: bytes, report: RecoveryReport) -> None:
    """Measure what follows the last record (``log.size``) in the log image ``buf``:
    all of it zero bytes is allocated space (the exact test: not one byte of it is
    anything else)."""
    report.tail_bytes = len(buf) - log.size
    if report.tail_bytes and NONZERO.search(buf, log.size) is None:
        report.preallocated_bytes = report.tail_bytes


def cut_tail(log: SegmentLog, report: RecoveryReport, opening: Opening) -> None:
    """Cut the tail the open found (:func:`measure_tail`), beyond every acknowledged
    record: after a crash, a write that never completed; after a clean stop, bytes
    nobody accounts for, reported and kept aside first. A tail of zero bytes only is
    space allocated ahead: cut, not reported, after a clean stop too (its cut at
    close may not have reached the disk)."""
    if report.preallocated_bytes:
        if not opening.readonly:
            # Not synced: until it is, a crash leaves the same zeros to cut again.
            os.ftruncate(log.fd, log.size)
            log.file_size = log.size
    elif log.file_size > log.size:
        if opening.readonly:
            if opening.clean:
                opening.report(Damage(
                    "segment", log.log_path, log.size,
                    f"{log.file_size - log.size} bytes after the last record of a segment that was closed cleanly",
                    opening.act("keep them in quarantine and cut them"),
                ))
            return
        if opening.clean:
            tail = os.pread(log.fd, log.file_size - log.size, log.size)
            kept = keep_aside(log.log_path, opening.quarantine_dir, ".tail", tail)
            opening.report(Damage(
                "segment", log.log_path, log.size,
                f"{len(tail)} bytes after the last record of a segment that was closed cleanly",
                f"no acknowledged record is missing; the bytes were kept in {kept} and cut from the segment",
            ))
        report.truncated_bytes = log.file_size - log.size
        report.truncated_at_offset = log.next_offset
        os.ftruncate(log.fd, log.size)
        os.fsync(log.fd)
        log.file_size = log.size


def keep_missing(log: SegmentLog, count: int, opening: Opening) -> None:
    """Give the active segment ``count`` record slots, the ones beyond what recovery
    found being acknowledged records that are missing or unreadable: they stay in the
    file (nothing is cut) and are marked corrupt, and the log's CRC-32 is no longer
    known (the segment is then sealed, by the caller, without a summary)."""
    missing = count - len(log.positions)
    if missing > 0:
        first = log.next_offset
        pos = log.size
        for _ in range(missing):
            log.positions.append(pos)
            log.state.append(CORRUPT)
        opening.report(Damage(
            "segment", log.log_path, pos,
            f"{missing} acknowledged record(s) missing or unreadable at the end of the active segment "
            f"({log.file_size - log.size} bytes there do not form valid records)",
            opening.act("kept the bytes; reads of these offsets fail with CORRUPTED_RECORD; new records go to a new segment"),
            (first, first + missing - 1),
        ))
    log.size = log.file_size
    log.crc = None


def report_corrupt(log: SegmentLog, corrupt: list[int], buf: bytes, opening: Opening, report: RecoveryReport) -> None:
    """One Damage per run of consecutive corrupt slots found by a scan (slots a
    repair wrote off are deleted, not reported again)."""
    corrupt = [r for r in corrupt if log.state[r] == CORRUPT]
    report.corrupt_offsets.extend(log.base + r for r in corrupt)
    i = 0
    while i < len(corrupt):
        j = i
        while j + 1 < len(corrupt) and corrupt[j + 1] == corrupt[j] + 1:
            j += 1
        first, last = corrupt[i], corrupt[j]
        pos = log.positions[first]
        end = log.positions[last + 1] if last + 1 < len(log.positions) else len(buf)
        opening.report(Damage(
            "segment", log.log_path, pos,
            f"{last - first + 1} record(s) fail their checksum or are missing ({end - pos} bytes)",
            "reads of these offsets fail with CORRUPTED_RECORD; the valid records after them are served",
            (log.base + first, log.base + last),
        ))
        i = j + 1
