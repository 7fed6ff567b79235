"""The log of one partition: an ordered list of segments, the last one active.

Offsets start at 1 and never repeat: the active segment's file name always carries
the next offset to assign, even when every message before it was purged (an empty
active segment is kept for exactly that reason), and a purge is recorded as a
watermark (``purged``: every offset at or below it is gone) before any file is
removed. Deletions of single records live in the segments' ``.del`` files. So after
a restart nothing deleted comes back and no offset is handed out twice.
"""

from __future__ import annotations

import os
import re
import struct
import time
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from protocol import RECORD_FIXED, ErrorCode, build_records, check_record, error_class

from ._damage import Damage, Report, ignore_damage
from ._durability import fsync_dir, sync_fds
from ._errors import CorruptedRecord
from ._files import keep_aside, makedirs
from ._columns import FIELDS, FIELDS_AT, Columns
from ._log import CORRUPT, LIVE, LIVE_BYTE
from ._recovery import Opening, RecoveryReport
from ._segment import Segment
from ._state import STATE_NAME, StateFile

__all__ = ["PartitionLog", "ReadResult", "AppendResult", "LiveRecords"]

_PURGE = struct.Struct("<QI")
_OLD_PURGE = "purged"  # the watermark file of the first format, read once on upgrade
#: Offsets reserved ahead at a time (when acks do not wait for the disk).
RESERVE_MIN = 1 << 16
RESERVE_MAX = 1 << 22

#: Fetches with a subject filter look at no more than this many records per call
#: (Kafka and NATS both bound the work of one fetch the same way); the response's
#: next offset says where to continue.
SCAN_LIMIT = 100_000


class AppendResult(NamedTuple):
    first_offset: int
    timestamp: int
    records: bytearray  # the records just written, back to back
    positions: list[int]  # each record's position inside ``records``


class ReadResult(NamedTuple):
    """Records read, as runs of consecutive records: ``records[k]`` holds
    ``runs[k][1]`` records starting at offset ``runs[k][0]``."""

    records: list[memoryview]
    runs: list[tuple[int, int]]
    # A field named like tuple.count shadows that method (mypy: [assignment]); the
    # broker reads the number of records as ``.count``, so the name stays.
    count: int  # type: ignore[assignment]
    next_offset: int

    @property
    def offsets(self) -> list[int]:
        return [o for first, n in self.runs for o in range(first, first + n)]


class LiveRecords(NamedTuple):
    """The live records of one segment, as the startup scan reads them: ``runs`` of
    consecutive live offsets ``(first, count)``; for every record slot of the segment
    (from ``base``, live or not) its subject ``sids[k]`` (a number into ``names``)
    and record ``flags`` byte; ``stats``, when every slot is live, per subject
    ``(records, first offset, last offset)``; ``ttls`` groups the offsets of live
    records with a TTL field (``never`` included) by ``(timestamp, ttl)``;
    ``headers`` holds ``(offset, timestamp, header block)`` of the live records with
    headers, when asked."""

    base: int
    runs: list[tuple[int, int]]
    names: list[bytes]
    sids: array
    flags: bytes
    stats: list[tuple[int, int, int]] | None
    ttls: dict[tuple[int, int], list[int]]
    headers: list[tuple[int, int, bytes]]

    @property
    def offsets(self) -> list[int]:
        return [o for first, n in self.runs for o in range(first, first + n)]

    @property
    def subjects(self) -> list[bytes]:
        """The live records' subjects, in order."""
        names = self.names
        return [names[self.sids[o - self.base]] for o in self.offsets]


class PartitionLog:
    """A partition's segmented log. Use :meth:`open`.

    Attributes:
        next_offset: the offset the next appended record gets.
        live_count: live records (stored, not deleted, not corrupt).
        size_bytes: bytes of all records in the ``.log`` files (the active one's
            file is longer by the space allocated ahead of its last record).
    """

    def __init__(
        self, path: str, segment_size: int, on_corrupt: Callable[[int, str], None] | None, reserve: bool = False
    ) -> None:
        self.path = path
        self.segment_size = segment_size
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self.live_count = 0
        self.size_bytes = 0
        self._on_corrupt = on_corrupt or (lambda offset, reason: None)
        self.corrupt_detected = 0
        self._state = StateFile(os.path.join(path, STATE_NAME))
        #: Reserve offsets ahead durably (acks that do not wait for the disk).
        self._reserve = reserve
        self._reserve_step = RESERVE_MIN
        self._reserved_at = 0.0
        #: The next offset when the last group commit took our descriptors (durable
        #: once the next one does: the trailing ``acked_next``).
        self._syncing_next = 0
        #: Offsets recovery skipped, ``(first, last)``: reserved before an unclean
        #: stop, or beyond records found missing (never handed out again).
        self.skipped: tuple[int, int] | None = None
        self._readonly = False
        #: ``partition.state`` holds a write the next group commit must sync.
        self._state_unsynced = False
        #: Where damage found after opening (the startup scan) goes.
        self._report: Report = ignore_damage
        #: A roll (a full active segment, :meth:`seal_active`, a purge) leaves the old
        #: segment's seal owed instead of finishing it on the caller's thread: its
        #: index and summary writes (``Segment.write_seal_files``, 2-19 ms of
        #: fsyncs) are for the owner to run in a worker thread, then
        #: ``Segment.end_seal``, then :meth:`seal_done`. Off: the seal is whole.
        self.defer_seals = False
        #: Seals begun (``roll_active``) whose files are not durable yet, oldest first
        #: (a segment's entry stays until :meth:`seal_done`).
        self.owed_seals: list[tuple[Segment, int | None]] = []
        #: Called (on the caller's thread) when a roll leaves a seal owed, or when
        #: :attr:`flush_wanted` is set.
        self.on_seal_owed: Callable[[PartitionLog], None] | None = None
        #: With seals owed and acks not waiting for the disk (fsync interval, never):
        #: the active log should be synced ahead in a worker thread
        #: (:meth:`flush_active`), so that the roll's sync on the caller's thread has
        #: at most the last eighth of a segment to write, not a whole one. Set by
        #: :meth:`append` each time the active segment passes an eighth.
        self.flush_wanted = False
        self._flush_at = 1 << 62

    @property
    def purged_through(self) -> int:
        return self._state.state.purged_through

    # -- opening -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str,
        segment_size: int,
        on_corrupt: Callable[[int, str], None] | None = None,
        *,
        report: Report = ignore_damage,
        reserve: bool = False,
        quarantine_dir: str | None = None,
        expect_existing: bool = False,
        readonly: bool = False,
    ) -> tuple[PartitionLog, list[RecoveryReport]]:
        """Open (or create) the partition at ``path`` and recover it.

        Args:
            report: where damage found on the way goes (each piece once).
            reserve: acks do not wait for the disk (fsync interval or never): reserve
                offsets ahead durably so a machine crash never makes an offset that
                was acknowledged be handed out again.
            quarantine_dir: where unreadable bytes are kept before a file is
                rewritten (default ``<path>/quarantine``).
            expect_existing: the partition is known to exist (a missing directory or
                state file is then damage, not a new partition).
            readonly: verify and report, write nothing (``ttlbroker check``); the
                log can then be read, not written.
        """
        existed = os.path.isdir(path)
        if not readonly:
            makedirs(path)
        elif not existed:
            report(Damage("segment", path, None, "the partition directory is missing", "none possible"))
            raise FileNotFoundError(path)
        log = cls(path, segment_size, on_corrupt, reserve)
        log._readonly = readonly
        log._report = report
        sf = log._state = StateFile.open(os.path.join(path, STATE_NAME), readonly)
        bases = sorted(
            int(name[:-4]) for name in os.listdir(path) if name.endswith(".log") and name[:-4].isdigit()
        )
        _check_state_file(sf, path, bases, report, existed, expect_existing, readonly)
        st = sf.state
        opening = Opening(report, st.clean, sf.found != "new", quarantine_dir or os.path.join(path, "quarantine"), readonly)
        if sf.found == "both_bad":
            # The watermark is lost: every purge removed whole segments below the
            # active one, so the first segment left bounds it.
            st.purged_through = bases[0] - 1 if bases else 0
        # A purge that crashed before it removed its files: finish it.
        while len(bases) > 1 and bases[1] <= st.purged_through + 1:
            doomed = Segment(path, bases.pop(0))
            if not readonly:
                doomed.remove_files()
        reports = log._open_segments(bases, opening)
        found_next = log.segments[-1].next_offset if log.segments else max(1, st.purged_through + 1)
        next_offset = max(found_next, st.reserved_next, st.acked_next, st.purged_through + 1, 1)
        if sf.found == "both_bad":
            next_offset = found_next + RESERVE_MAX
        if readonly:
            log._drop_purged()
            return log, reports
        last = log.segments[-1] if log.segments else None
        if last is None or next_offset != last.next_offset or last.sealed or last.uncertain:
            log._start_segment_at(next_offset, found_next)
        log._drop_purged()
        log.size_bytes = sum(s.size for s in log.segments)
        for rep in reports:
            log.corrupt_detected += len(rep.corrupt_offsets)
        log._record_open()
        return log, reports

    def _open_segments(self, bases: list[int], opening: Opening) -> list[RecoveryReport]:
        """Open the segments ``bases`` (recovery): every one sealed but the last, the
        active one, whose tail beyond its last valid record is cut, unless
        acknowledged records are missing (then it is sealed with them marked
        corrupt)."""
        path = self.path
        reports = []
        for i, base in enumerate(bases[:-1]):
            seg, rep = Segment.open_sealed(path, base, bases[i + 1] - base, opening)
            self.segments.append(seg)
            reports.append(rep)
        if bases:
            seg, rep = Segment.open_active(path, bases[-1], opening)
            if not opening.readonly:
                seg.preallocate_limit = self.segment_size
            self.segments.append(seg)
            reports.append(rep)
            acked_next = self._state.state.acked_next
            if acked_next > seg.next_offset:
                # Acknowledged records are missing: damage, never a torn tail to cut.
                seg.seal_damaged(acked_next - seg.base, opening)
            else:
                seg.cut_tail(rep, opening)
        return reports

    def _drop_purged(self) -> None:
        """After opening: the records at or below the purge watermark deleted in
        memory, the segment bases and the live count taken."""
        purged = self._state.state.purged_through
        for seg in self.segments:
            if seg.base <= purged:
                seg.drop_in_memory(purged - seg.base + 1)
        self._bases = [s.base for s in self.segments]
        self.live_count = sum(s.live_count for s in self.segments)

    def _record_open(self) -> None:
        """Record in ``partition.state`` that the partition is open: from here on a
        crash is an unclean stop (and, with offsets reserved ahead, reserve the first
        step)."""
        sf = self._state
        st = sf.state
        was_clean = st.clean
        before = (st.purged_through, st.reserved_next, st.acked_next)
        st.clean = False
        st.reserved_next = max(st.reserved_next, self.next_offset)
        if self._reserve:
            st.reserved_next = self.next_offset + self._reserve_step
            self._reserved_at = time.monotonic()
        if sf.found != "ok" or (st.purged_through, st.reserved_next, st.acked_next) != before:
            if sf.write():
                fsync_dir(self.path)
        elif was_clean:
            # Only the clean flag changes. It must be on disk before anything written
            # from now on is, and the first group commit syncs it with those writes
            # (a restart of many partitions does not pay two fsyncs each).
            sf.write_lazy()
            self._state_unsynced = True

    def _start_segment_at(self, next_offset: int, found_next: int) -> None:
        """Start a new active segment at ``next_offset`` (recovery): seal the old
        active one, or drop it if it is empty (an empty file holds nothing)."""
        if self.segments:
            old = self.segments[-1]
            if old.count == 0 and old.file_size == 0:
                old.remove_files()
                self.segments.pop()
            else:
                old.seal()
        if next_offset > found_next:
            self.skipped = (found_next, next_offset - 1)
        self.segments.append(Segment.create(self.path, next_offset, self.segment_size))
        fsync_dir(self.path)

    # -- state ---------------------------------------------------------------------

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def next_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def last_offset(self) -> int:
        """The newest offset ever assigned (0 if none)."""
        return self.segments[-1].next_offset - 1

    @property
    def first_offset(self) -> int:
        """The oldest live offset, or 0 when nothing is live."""
        if not self.live_count:
            return 0
        for seg in self.segments:
            if seg.live_count:
                rel = seg.first_live_rel()
                if rel >= 0:
                    return seg.base + rel
        return 0

    def live_count_from(self, start: int) -> int:
        """Live records at or after offset ``start``. Runtime complexity: O(records
        after ``start``), at C speed (a count over the segments' state bytes)."""
        n = 0
        for seg in self.segments[self._segment_index(start) :]:
            n += seg.state.count(LIVE_BYTE, max(start - seg.base, 0))
        return n

    def _segment_index(self, offset: int) -> int:
        """Index of the segment holding ``offset`` (or the next one after a gap)."""
        return max(bisect_right(self._bases, offset) - 1, 0)

    def is_live(self, offset: int) -> bool:
        # _segment_index and the segment's state looked up in line (once per KV get).
        i = bisect_right(self._bases, offset) - 1
        seg = self.segments[i if i > 0 else 0]
        rel = offset - seg.base
        state = seg.state
        return 0 <= rel < len(state) and state[rel] == LIVE

    def timestamp_of(self, offset: int) -> int:
        seg = self.segments[self._segment_index(offset)]
        return seg.timestamp_of(offset - seg.base)

    def live_offsets_until(self, cutoff_ns: int, skip: Callable[[int], bool]) -> list[int]:
        """Live offsets stamped at or before ``cutoff_ns``, oldest first, leaving out
        those ``skip`` names. Uses the time index: O(segments + results)."""
        out: list[int] = []
        for seg in self.segments:
            if not seg.time_ts or seg.time_ts[0] > cutoff_ns:
                break
            k = bisect_right(seg.time_ts, cutoff_ns)
            bound = seg.time_rel[k] if k < len(seg.time_rel) else seg.count
            if seg.live_count:
                rel = seg.first_live_rel()
                base = seg.base
                while 0 <= rel < bound:
                    if not skip(base + rel):
                        out.append(base + rel)
                    rel = seg.first_live_rel(rel + 1)
            if bound < seg.count:
                break
        return out

    def oldest_live(self, skip: Callable[[int], bool]) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the oldest live record ``skip`` does not name."""
        for seg in self.segments:
            if not seg.live_count:
                continue
            rel = seg.first_live_rel()
            while rel >= 0:
                if not skip(seg.base + rel):
                    return seg.base + rel, seg.timestamp_of(rel)
                rel = seg.first_live_rel(rel + 1)
        return None

    def reclaimable(self) -> list[Segment]:
        """Sealed segments in which no record is live and none is damaged (the
        cleaner removes them; damaged records are never proof of garbage)."""
        segs = self.segments
        owed = {id(o[0]) for o in self.owed_seals}
        # Not the one after a segment whose seal is owed: the gap its removal leaves
        # would, after a crash before that index is durable, make the rebuilt index
        # expect records up to the next base, and report them missing.
        return [
            s for i, s in enumerate(segs[:-1])
            if not s.live_count and not s.corrupt_count and (not i or id(segs[i - 1]) not in owed)
        ]

    # -- writing -------------------------------------------------------------------

    def append(
        self, data: bytes | bytearray | memoryview, starts: list[int], ends: list[int], timestamp: int,
        stamps: Mapping[int, tuple[int, int]] | None = None,
    ) -> AppendResult:
        """Append message bodies ``data[starts[i]:ends[i]]`` as consecutive records
        (``stamps``: index -> ``(ttl, flags)`` to write into those bodies, see
        :func:`protocol.build_records`).

        The timestamp is raised to the partition's last one if the clock went back,
        so timestamps never decrease within a partition.

        Raises:
            StorageFailure: the write failed; nothing was appended.
        """
        seg = self.segments[-1]
        if seg.size >= self.segment_size and seg.count:
            seg = self._roll()
        last_ts = seg.time_ts[-1] if seg.time_ts else 0
        if timestamp < last_ts:
            timestamp = last_ts
        first = seg.next_offset
        if self._reserve and first + len(starts) > self._state.state.reserved_next:
            self._extend_reservation(first + len(starts))
        records, rel = build_records(data, starts, ends, first, timestamp, stamps)
        base_pos = seg.size
        seg.append(records, [base_pos + p for p in rel] if base_pos else rel, timestamp)
        self.live_count += len(starts)
        self.size_bytes += len(records)
        if seg.size >= self._flush_at:
            self._want_flush(seg.size)
        return AppendResult(first, timestamp, records, rel)

    def _want_flush(self, size: int) -> None:
        step = max(self.segment_size >> 3, 1)
        self._flush_at = (size // step + 1) * step
        if not self.flush_wanted:
            self.flush_wanted = True
            if self.on_seal_owed is not None:
                self.on_seal_owed(self)

    def seal_active(self) -> bool:
        """Seal the active segment now and start a new one (if it holds records)."""
        if not self.segments[-1].count:
            return False
        self._roll()
        return True

    def roll_active(self) -> tuple[Segment, int | None] | None:
        """Start a new active segment now, if the active one holds records, and return
        the old one with its seal begun (``Segment.begin_seal``: its log cut and
        synced) and the CRC-32 for its summary. The caller finishes the seal:
        ``Segment.write_seal_files`` (the index and summary writes, in a worker thread:
        1.5-20 ms of fsyncs a segment, off the event loop) then ``Segment.end_seal``.
        Until then the segment takes no appends, reads and deletes go on, and a crash
        leaves it with no index (rebuilt at the next start, not damage): the directory
        is synced here, after the log and before any index, so an index never names
        records that are not durable, and the new segment's entry is durable before
        any of its records can be acknowledged."""
        old = self.segments[-1]
        if not old.count:
            return None
        new = Segment.create(self.path, old.next_offset, self.segment_size)
        crc = old.begin_seal()
        fsync_dir(self.path)
        self.segments.append(new)
        self._bases.append(new.base)
        if self._flush_at < 1 << 62:
            self._flush_at = max(self.segment_size >> 3, 1)
        return old, crc

    def flush_active(self) -> None:
        """fdatasync the active segment's log, without sealing it: from a worker
        thread just before :meth:`seal_active`, whose own sync (on the caller's
        thread) then has only what was appended since to write. Changes no state:
        the group commit still syncs what it owes. Nothing once closed."""
        fd = self.segments[-1].fileno()
        if fd >= 0:
            sync_fds([fd])

    def defer(self, on_seal_owed: Callable[[PartitionLog], None]) -> None:
        """Leave seals owed (:attr:`defer_seals`), calling ``on_seal_owed`` for each,
        and, when acks do not wait for the disk, ask for the active log to be synced
        ahead (:attr:`flush_wanted`)."""
        self.defer_seals = True
        self.on_seal_owed = on_seal_owed
        if self._reserve:
            step = max(self.segment_size >> 3, 1)
            self._flush_at = (self.segments[-1].size // step + 1) * step

    def begin_roll(self) -> bool:
        """:meth:`roll_active` with the old segment's seal left owed (in
        :attr:`owed_seals` until :meth:`seal_done`), for the owner to finish off its
        thread. False if the active segment holds no record."""
        rolled = self.roll_active()
        if rolled is None:
            return False
        self.owed_seals.append(rolled)
        if self.on_seal_owed is not None:
            self.on_seal_owed(self)
        return True

    def seal_done(self, seg: Segment) -> None:
        """``seg``'s owed seal is finished (``Segment.end_seal`` called)."""
        self.owed_seals = [o for o in self.owed_seals if o[0] is not seg]

    def finish_seals(self) -> None:
        """Finish every owed seal on this thread (the broker's clean stop, before
        :meth:`close`, which leaves what is still owed: a deleted topic's files are
        not worth writing, and a start rebuilds a missing index without damage)."""
        while self.owed_seals:
            seg, crc = self.owed_seals[0]
            seg.end_seal(crc if seg.write_seal_files(crc) else None)
            self.seal_done(seg)

    def _drop_owed_seals(self) -> None:
        """Forget the owed seals of segments removed (their files are gone)."""
        if self.owed_seals:
            self.owed_seals = [o for o in self.owed_seals if o[0] in self.segments]

    def _roll(self) -> Segment:
        if self.defer_seals:
            # The seal in steps: on this thread only the switch and the syncs the new
            # segment's records must follow; the index and summary writes are owed.
            self.begin_roll()
            return self.segments[-1]
        old = self.segments[-1]
        new = Segment.create(self.path, old.next_offset, self.segment_size)
        old.seal()
        fsync_dir(self.path)
        self.segments.append(new)
        self._bases.append(new.base)
        return new

    def delete(self, offset: int) -> bool:
        """Delete one record; False if it was not live."""
        return self.delete_many([offset]) == 1

    def delete_many(self, offsets: list[int], tag: int = 0) -> int:
        """Delete records (one ``.del`` write per segment); returns how many were live.
        ``tag`` (0..15) is recorded with each deletion (why; the caller's vocabulary)."""
        by_segment: dict[int, list[int]] = {}
        for off in offsets:
            i = self._segment_index(off)
            by_segment.setdefault(i, []).append(off - self.segments[i].base)
        done = 0
        for i, rels in by_segment.items():
            done += self.segments[i].delete_many(rels, tag)
        self.live_count -= done
        return done

    def write_off_corrupt(self, tag: int, quarantine_dir: str) -> list[tuple[Segment, list[int]]]:
        """Delete (with ``tag``) every record found corrupt, after keeping each
        affected segment's files in ``quarantine_dir`` (``ttlbroker repair``); durable
        when it returns. Returns the offsets written off, by segment."""
        out = []
        for seg in self.segments:
            rels = [rel for rel in range(seg.count) if seg.state[rel] == CORRUPT]
            if not rels:
                continue
            for path in (seg.log_path, seg.del_path, seg.mirror_path):
                if os.path.exists(path):
                    keep_aside(path, quarantine_dir, ".written-off")
            seg.delete_many(rels, tag, corrupt=True)
            out.append((seg, [seg.base + r for r in rels]))
        sync_fds(self.take_dirty_fds())
        return out

    def purge(self, through: int | None = None) -> int:
        """Remove every record at or below ``through`` (default: all); returns how
        many live records went. Durable before it returns: the watermark is written
        and synced first, then whole segments are removed."""
        last = self.last_offset
        through = last if through is None else min(through, last)
        if through <= self.purged_through:
            return 0
        self._state.state.purged_through = through
        self._state.write()
        if through >= last and self.segments[-1].count:
            self._roll()
        removed = 0
        keep = []
        for seg in self.segments:
            if seg is not self.segments[-1] and seg.next_offset - 1 <= through:
                removed += seg.live_count
                self.size_bytes -= seg.size
                seg.remove_files()
            else:
                if seg.base <= through:
                    removed += seg.drop_in_memory(through - seg.base + 1)
                keep.append(seg)
        self.segments = keep
        self._bases = [s.base for s in keep]
        self._drop_owed_seals()
        fsync_dir(self.path)
        self.live_count -= removed
        return removed

    def _extend_reservation(self, needed: int) -> None:
        """Reserve offsets ahead, durably, before any of them is handed out. The step
        grows fourfold while reservations last less than a second and halves when
        they last over a minute, so a busy partition syncs its state about once a
        second at most and a quiet one skips few offsets after a crash."""
        now = time.monotonic()
        if self._reserved_at:
            lasted = now - self._reserved_at
            if lasted < 1.0:
                self._reserve_step = min(self._reserve_step * 4, RESERVE_MAX)
            elif lasted > 60.0:
                self._reserve_step = max(self._reserve_step // 2, RESERVE_MIN)
        self._reserved_at = now
        st = self._state.state
        st.reserved_next = max(st.reserved_next, needed + self._reserve_step)
        self._state.write()

    def remove_segment(self, seg: Segment) -> int:
        """Remove a sealed segment with no live record (the cleaner); returns bytes freed."""
        return self.remove_segments([seg])

    def remove_segments(self, segs: list[Segment]) -> int:
        """Remove sealed segments with no live record (the cleaner), with one
        directory fsync for them all; returns bytes freed."""
        for seg in segs:
            if seg is self.segments[-1] or seg.live_count or seg.corrupt_count:
                raise ValueError("only a sealed segment without live records can be removed")
        freed = 0
        for seg in segs:
            freed += seg.remove_files()
            self.segments.remove(seg)
            self.size_bytes -= seg.size
        self._bases = [s.base for s in self.segments]
        self._drop_owed_seals()
        fsync_dir(self.path)
        return freed

    def live_bytes(self) -> int:
        """The bytes of the live records (``size_bytes`` less what is deleted, purged
        or put aside but still on disk). Runtime complexity: O(segments) while only
        appends and deletions happened since the last call."""
        return sum(seg.live_bytes() for seg in self.segments)

    def take_dirty_fds(self) -> list[int]:
        """Descriptors with writes to sync (the group commit calls this as it starts a
        sync, and :meth:`synced` once it is done)."""
        fds: list[int] = []
        for seg in self.segments:
            if seg.dirty or seg.deletions.dirty:
                fds.extend(seg.take_dirty_fds())
        if fds:
            self._syncing_next = self.next_offset
            if self._state_unsynced:
                self._state_unsynced = False
                fds.append(self._state.fd)
        return fds

    def synced(self) -> None:
        """The sync of the descriptors :meth:`take_dirty_fds` last gave completed:
        every record below the next offset of that moment is durable, and the
        trailing ``acked_next`` is written for it, without an fsync of its own (the
        next sync takes it along). The group commit calls this after the answers
        the sync released are sent: a system call off their path."""
        st = self._state.state
        if self._syncing_next > st.acked_next:
            st.acked_next = self._syncing_next
            self._state.write_lazy()

    def close(self, clean: bool = True) -> None:
        """Close every file. ``clean`` (everything written has been synced): record
        a clean stop, with the exact next offset, so the next start skips nothing and
        treats any torn byte as damage."""
        if clean and self._state.fd >= 0 and not self._readonly:
            try:
                # Before the clean flag: the next start reads these instead of the
                # records (if the logs are still what they describe).
                for seg in self.segments[:-1]:
                    seg.write_owed_columns()
                if self.segments:
                    self.segments[-1].write_snapshot()
            except OSError:
                pass  # the next start reads the records
            st = self._state.state
            st.clean = True
            st.acked_next = st.reserved_next = self.next_offset
            try:
                self._state.write()
            except OSError:
                pass  # the next start treats the stop as unclean
        self._state.close()
        for seg in self.segments:
            seg.close()

    # -- reading -------------------------------------------------------------------

    def _corrupt(self, offset: int, reason: str) -> None:
        self.live_count -= 1
        self.corrupt_detected += 1
        self._on_corrupt(offset, reason)

    def read(
        self,
        offset: int,
        max_count: int,
        max_bytes: int,
        wanted: Callable[[int], bool] | None = None,
        until: int | None = None,
    ) -> ReadResult:
        """Live, verified records from ``offset`` on (below ``until`` if given).

        Raises:
            CorruptedRecord: the first record to return is corrupt.
        """
        runs: list[tuple[memoryview, int, int]] = []
        offset = max(offset, self.purged_through + 1, 1)
        end = self.next_offset if until is None else min(until, self.next_offset)
        scanned_to = offset + SCAN_LIMIT if wanted is not None else end
        i = self._segment_index(offset)
        used = got = 0
        while offset < end and got < max_count and offset < scanned_to:
            seg = self.segments[i]
            if offset < seg.base:
                offset = seg.base
            had = len(runs)
            rel, taken, stopped = seg.read(offset - seg.base, max_count - got, max_bytes - used, wanted, runs, self._corrupt)
            got += taken
            for k in range(had, len(runs)):
                used += len(runs[k][0])
            offset = seg.base + rel
            if stopped or used >= max_bytes:
                break
            if rel >= seg.count:
                i += 1
                if i >= len(self.segments):
                    break
        return ReadResult([r[0] for r in runs], [(r[1], r[2]) for r in runs], got, offset)

    def get(self, offset: int) -> memoryview:
        """One live record.

        Raises:
            MessageNotFoundError: no live record has that offset.
            CorruptedRecord: it is there but unreadable.
        """
        # A live record (the usual case): the checks below hold for it (a live slot
        # lies below next_offset and above the purge watermark); anything else
        # takes them, for their errors.
        record = self.read_live(offset)
        if record is not None:
            return record
        i = bisect_right(self._bases, offset) - 1
        seg = self.segments[i if i > 0 else 0]
        rel = offset - seg.base
        if offset < 1 or offset >= self.next_offset or offset <= self.purged_through:
            raise error_class(ErrorCode.MESSAGE_NOT_FOUND)(f"no message at offset {offset}")
        if rel < 0 or rel >= seg.count or seg.state[rel] != LIVE:
            if 0 <= rel < seg.count and seg.state[rel] == CORRUPT:
                raise CorruptedRecord(f"record at offset {offset} is corrupted", offset)
            raise error_class(ErrorCode.MESSAGE_NOT_FOUND)(f"no message at offset {offset}")
        return seg.read_one(rel, self._corrupt)

    def read_live(self, offset: int) -> memoryview | None:
        """The live record at ``offset``, verified as :meth:`get` verifies it, or None
        when there is none (never stored, deleted, removed, purged, or found corrupt
        before): one search for its segment where :meth:`is_live` then :meth:`get`
        take two (a KV get reads one record per request).

        Raises:
            CorruptedRecord: it is live but fails its checks now (it is then marked
                corrupt, as :meth:`get` does, and the next call returns None).
        """
        i = bisect_right(self._bases, offset) - 1
        seg = self.segments[i if i > 0 else 0]
        rel = offset - seg.base
        state = seg.state
        if 0 <= rel < len(state) and state[rel] == LIVE and offset > self._state.state.purged_through:
            return seg.read_one(rel, self._corrupt)
        return None

    def scan(self, headers: bool = False) -> Iterator[LiveRecords]:
        """The live records of every segment, oldest first, for the startup rebuild;
        every live record is verified on the way.

        A segment whose log still has the CRC-32 it had when it was sealed (its
        summary), or that :meth:`Segment.open_active` verified record by record just
        before, is verified with one CRC-32 of the whole file; any other is verified
        record by record (and, all live records passing, given a summary so the next
        start does not have to). A record that fails is marked corrupt and reported,
        not returned. ``headers``: also return the header blocks.

        The fields come from a sealed segment's ``.columns`` file when it is intact
        and describes the log just verified (its summary's size and CRC-32); else
        from the records (and such a segment then gets the file).
        """
        for seg in list(self.segments):
            if not seg.live_count:
                continue
            buf = seg.read_all()
            expected = seg.sealed_crc if seg.sealed else seg.crc
            whole = expected is not None and zlib.crc32(buf) == expected
            summarized = False
            if not whole:
                # Changed since it was sealed: the records that fail are reported one
                # by one (bytes of deleted records do not matter).
                failed = self._verify_records(seg, buf)
                if seg.sealed and not failed and not self._readonly and not seg.uncertain and CORRUPT not in seg.state:
                    seg.write_summary(zlib.crc32(buf))
                    summarized = True
            if seg.sealed:
                cols = seg.read_columns(Opening(self._report, readonly=self._readonly)) if whole else None
            else:
                cols, seg.snapshot_columns = (seg.snapshot_columns if whole else None), None
            if cols is None:
                cols = seg.columns_from_log(buf, write=seg.sealed and (whole or summarized) and not self._readonly)
            yield _live_records(seg, buf, cols, headers)

    def _verify_records(self, seg: Segment, buf: bytes) -> int:
        """Check every live record of ``seg`` (in ``buf``, its log); mark and report
        the ones that fail. Returns how many failed."""
        n = len(buf)
        state = seg.state
        positions = seg.positions
        base = seg.base
        failed = 0
        for rel in range(len(positions)):
            if state[rel] != LIVE:
                continue
            p = positions[rel]
            if check_record(buf, p, n) < 0:
                reason = "checksum mismatch or truncated record"
            elif (off := _OFFSET.unpack_from(buf, p + 8)[0]) != base + rel:
                reason = f"record holds offset {off}, expected {base + rel}"
            else:
                continue
            seg.mark_corrupt(rel)
            self._corrupt(base + rel, reason)
            failed += 1
        return failed


_LIVE_RUN = re.compile(LIVE_BYTE + b"+")  # a run of live slots in a segment's state bytes
_OFFSET = struct.Struct("<Q")


def _live_records(seg: Segment, buf: bytes, cols: Columns, want_headers: bool) -> LiveRecords:
    """The live records of ``seg`` (log ``buf``, verified) from its columns."""
    state = seg.state
    base = seg.base
    runs = [(base + m.start(), m.end() - m.start()) for m in _LIVE_RUN.finditer(state)]
    stats = None
    if seg.column_stats is not None and seg.live_count == len(state):
        stats = [(n, base + f, base + last) for n, f, last in seg.column_stats]
    ttls: dict[tuple[int, int], list[int]] = {}
    timestamp_of = seg.timestamp_of
    for rel, n, ttl in cols.ttl_runs:
        end = rel + n
        if state.count(LIVE_BYTE, rel, end) == n:
            offsets = list(range(base + rel, base + end))
        else:
            offsets = [base + r for r in range(rel, end) if state[r] == LIVE]
            if not offsets:
                continue
        key = (timestamp_of(rel), ttl)
        group = ttls.get(key)
        if group is None:
            ttls[key] = offsets
        else:
            group.extend(offsets)  # a batch whose TTLs alternate
    headers: list[tuple[int, int, bytes]] = []
    if want_headers:
        unpack = FIELDS.unpack_from
        positions = seg.positions
        for rel in cols.header_rels:
            if state[rel] == LIVE:
                p = positions[rel]
                ts, _, _, sl, hl = unpack(buf, p + FIELDS_AT)
                s = p + RECORD_FIXED.size + sl
                headers.append((base + rel, ts, buf[s : s + hl]))
    return LiveRecords(base, runs, cols.names, cols.sids, cols.flags, stats, ttls, headers)


def _check_state_file(
    sf: StateFile, path: str, bases: list[int], report: Report, existed: bool, expect_existing: bool, readonly: bool
) -> None:
    """Report what is wrong with the partition's directory and state file as
    :meth:`PartitionLog.open` found them; a partition of the first format (segments,
    no state file) takes its purge watermark from its old watermark file."""
    if expect_existing and not existed:
        report(Damage("segment", path, None, "the partition directory is missing",
                      "started the partition empty; its messages are lost unless restored from a backup"))
    if sf.found == "new" and (bases or os.path.exists(os.path.join(path, _OLD_PURGE))):
        sf.state.purged_through = _read_old_purge(os.path.join(path, _OLD_PURGE), report)
    elif sf.found == "new" and expect_existing and existed:
        report(Damage("partition_state", sf.path, None, "missing", "recreated from the segment files"))
    for pos in sf.bad_positions:
        both = sf.found == "both_bad"
        action = (
            "purge watermark and high-water mark taken from the segment files; offsets skip ahead by the "
            "largest reservation" if both else "used the other copy; rewritten"
        )
        report(Damage(
            "partition_state", sf.path, pos, "slot fails its checksum",
            f"not changed; the next start or `ttlbroker repair`: {action}" if readonly else action,
        ))


def _read_old_purge(path: str, report: Report) -> int:
    """The purge watermark of the first format (upgrade). A damaged one is reported
    and the segment files bound the watermark instead."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return 0
    if len(raw) == _PURGE.size:
        through, crc = _PURGE.unpack(raw)
        if zlib.crc32(struct.pack("<Q", through)) == crc:
            return through
    bases = sorted(int(n[:-4]) for n in os.listdir(os.path.dirname(path)) if n.endswith(".log") and n[:-4].isdigit())
    bound = bases[0] - 1 if bases else 0
    report(Damage("partition_state", path, 0, "the purge watermark fails its checksum",
                  f"took {bound} from the segment files (every purge removes whole segments below the active one)"))
    return bound
