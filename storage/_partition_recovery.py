"""Opening a partition and what it recovers: :class:`RecoveredPartition`, the base of
``_partition_log.PartitionLog``, owns the segment list as opening finds it, the
partition's ``partition.state`` and the startup scan.

Opening (:meth:`RecoveredPartition.open`) reports what is wrong with the directory
and ``partition.state`` (``_state``), upgrades a partition of the first format (its
old watermark file), finishes a purge that crashed before it removed its files,
opens every segment but the last sealed (``Segment.open_sealed``) and the last one
active (``Segment.open_active``), whose torn tail is cut unless acknowledged records
are missing (then the segment is sealed with them marked corrupt, its bytes kept);
unreadable bytes are kept in the quarantine directory before a file is rewritten
(``_recovery.Opening``). The next offset is the highest of what the segments, the
reservation and the trailing ``acked_next`` say: offsets skipped are
:attr:`RecoveredPartition.skipped`, never handed out again.

Every write of ``partition.state`` is here, in the order crash safety needs: the
unclean mark at open (before anything else is written), the reservation of offsets
ahead before any of them is handed out (:meth:`RecoveredPartition.extend_reservation`),
the purge watermark before a purge removes any file
(:meth:`RecoveredPartition.mark_purged`), the trailing ``acked_next`` after each group
commit (:meth:`RecoveredPartition.take_dirty_fds`, :meth:`RecoveredPartition.synced`)
and the clean stop at :meth:`RecoveredPartition.close`.

The startup scan (:meth:`RecoveredPartition.scan`) verifies every live record and
gives, per segment, what the broker's rebuild needs (:class:`LiveRecords`).
"""

from __future__ import annotations

import os
import re
import struct
import time
import zlib
from array import array
from collections.abc import Callable, Iterator
from typing import NamedTuple, Self

from protocol import RECORD_FIXED, check_record

from ._columns import FIELDS, FIELDS_AT, Columns
from ._damage import Damage, Report, ignore_damage
from ._durability import fsync_dir, sync_fds
from ._files import makedirs
from ._log import CORRUPT, LIVE, LIVE_BYTE
from ._recovery import Opening, RecoveryReport
from ._segment import Segment
from ._sources import SourceMarks
from ._state import STATE_NAME, StateFile

__all__ = ["RecoveredPartition", "LiveRecords"]

_PURGE = struct.Struct("<QI")
_OLD_PURGE = "purged"  # the watermark file of the first format, read once on upgrade
#: Offsets reserved ahead at a time (when acks do not wait for the disk).
RESERVE_MIN = 1 << 16
RESERVE_MAX = 1 << 22


class LiveRecords(NamedTuple):
    """The live records of one segment, as the startup scan reads them: ``runs`` of
    consecutive live offsets ``(first, count)``; for every record slot of the segment
    (from ``base``, live or not) its subject ``sids[k]`` (a number into ``names``)
    and record ``flags`` byte; ``stats``, when every slot is live, per subject
    ``(records, first offset, last offset)``; ``ttls`` groups the offsets of live
    records with a TTL field (``never`` included) by ``(timestamp, ttl)``;
    ``headers`` holds ``(offset, timestamp, header block)`` of the live records with
    headers, when asked; ``damaged`` the segment's damaged records (state
    ``CORRUPT``) as ``(offset, subject)``, the subject None when nothing intact
    says it (``Segment.damaged_subjects``): what the broker needs to know that a
    subject's newest message is one it cannot read, although the scan gives only
    the live ones."""

    base: int
    runs: list[tuple[int, int]]
    names: list[bytes]
    sids: array
    flags: bytes
    stats: list[tuple[int, int, int]] | None
    ttls: dict[tuple[int, int], list[int]]
    headers: list[tuple[int, int, bytes]]
    damaged: list[tuple[int, bytes | None]]

    @property
    def offsets(self) -> list[int]:
        return [o for first, n in self.runs for o in range(first, first + n)]

    @property
    def subjects(self) -> list[bytes]:
        """The live records' subjects, in order."""
        names = self.names
        return [names[self.sids[o - self.base]] for o in self.offsets]


class RecoveredPartition:
    """A partition's segment list, counts and ``partition.state``, as :meth:`open`
    recovers them, and the writes of ``partition.state`` while the log runs. The
    reads and the writes of the log itself are the subclasses'
    (``_partition_reads.PartitionReads``, ``_partition_log.PartitionLog``).

    Attributes:
        segments: the segments, oldest first; the last one is active.
        bases: each segment's base offset (for bisecting offsets to segments).
        state_file: ``partition.state``.
    """

    def __init__(
        self, path: str, segment_size: int, on_corrupt: Callable[[int, str], None] | None, reserve: bool = False
    ) -> None:
        self.path = path
        self.segment_size = segment_size
        self.segments: list[Segment] = []
        self.bases: list[int] = []
        self.live_count = 0
        self.size_bytes = 0
        self._on_corrupt = on_corrupt or (lambda offset, reason: None)
        self.corrupt_detected = 0
        self.state_file = StateFile(os.path.join(path, STATE_NAME))
        #: Reserve offsets ahead durably (acks that do not wait for the disk).
        self.reserve_ahead = reserve
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
        #: Segments with deletions written ``deferred`` and not synced yet.
        self.deferred_segments: dict[Segment, None] = {}
        #: Where damage found after opening (the startup scan) goes.
        self._report: Report = ignore_damage
        #: The offset after the last record recovery found (before any reservation).
        self.recovered_next = 1
        #: Where a sourcing topic is in its sources (``_sources``), once the broker
        #: configured them or a file of them was found.
        self.sources: SourceMarks | None = None

    @property
    def purged_through(self) -> int:
        return self.state_file.state.purged_through

    @property
    def next_offset(self) -> int:
        return self.segments[-1].next_offset

    def record_corrupt(self, offset: int, reason: str) -> None:
        """A live record found corrupt (by a read or the startup scan): counted and
        reported to ``on_corrupt``."""
        self.live_count -= 1
        self.corrupt_detected += 1
        self._on_corrupt(offset, reason)

    _corrupt = record_corrupt  # its former name, which tests pass to Segment.read

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
    ) -> tuple[Self, list[RecoveryReport]]:
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
        sf = log.state_file = StateFile.open(os.path.join(path, STATE_NAME), readonly)
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
        log.recovered_next = found_next
        if any(os.path.exists(p) for p in SourceMarks(path).paths):
            log.sources = SourceMarks.load(path, report, found_next, st.purged_through)
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
            acked_next = self.state_file.state.acked_next
            if acked_next > seg.next_offset:
                # Acknowledged records are missing: damage, never a torn tail to cut.
                seg.seal_damaged(acked_next - seg.base, opening)
            else:
                seg.cut_tail(rep, opening)
        return reports

    def _drop_purged(self) -> None:
        """After opening: the records at or below the purge watermark deleted in
        memory, the segment bases and the live count taken."""
        purged = self.state_file.state.purged_through
        for seg in self.segments:
            if seg.base <= purged:
                seg.drop_in_memory(purged - seg.base + 1)
        self.bases = [s.base for s in self.segments]
        self.live_count = sum(s.live_count for s in self.segments)

    def _record_open(self) -> None:
        """Record in ``partition.state`` that the partition is open: from here on a
        crash is an unclean stop (and, with offsets reserved ahead, reserve the first
        step)."""
        sf = self.state_file
        st = sf.state
        was_clean = st.clean
        before = (st.purged_through, st.reserved_next, st.acked_next)
        st.clean = False
        st.reserved_next = max(st.reserved_next, self.next_offset)
        if self.reserve_ahead:
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

    # -- partition.state while the log runs ----------------------------------------

    def extend_reservation(self, needed: int) -> None:
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
        st = self.state_file.state
        st.reserved_next = max(st.reserved_next, needed + self._reserve_step)
        self.state_file.write()

    def mark_purged(self, through: int) -> None:
        """Record durably that every offset at or below ``through`` is gone (a purge
        calls this before it removes any file)."""
        self.state_file.state.purged_through = through
        self.state_file.write()

    def take_dirty_fds(self) -> list[int]:
        """Descriptors with writes to sync (the group commit calls this as it starts a
        sync, and :meth:`synced` once it is done)."""
        fds: list[int] = []
        for seg in self.segments:
            if seg.dirty or seg.deletions.dirty:
                fds.extend(seg.take_dirty_fds())
        if self.sources is not None:
            fds.extend(self.sources.take_dirty_fds())
        if fds:
            self._syncing_next = self.next_offset
            if self._state_unsynced:
                self._state_unsynced = False
                fds.append(self.state_file.fd)
        return fds

    def take_deferred_fds(self) -> list[int]:
        """Descriptors of the deletions written ``deferred`` and not synced since
        (``PartitionLog.delete_many``); the caller syncs them."""
        fds: list[int] = []
        for seg in self.deferred_segments:
            fds.extend(seg.deletions.take_deferred_fds())
        self.deferred_segments.clear()
        return fds

    def synced(self) -> None:
        """The sync of the descriptors :meth:`take_dirty_fds` last gave completed:
        every record below the next offset of that moment is durable, and the
        trailing ``acked_next`` is written for it, without an fsync of its own (the
        next sync takes it along). The group commit calls this after the answers
        the sync released are sent: a system call off their path."""
        st = self.state_file.state
        if self._syncing_next > st.acked_next:
            st.acked_next = self._syncing_next
            self.state_file.write_lazy()

    def close(self, clean: bool = True) -> None:
        """Close every file. ``clean`` (everything written has been synced): record
        a clean stop, with the exact next offset, so the next start skips nothing and
        treats any torn byte as damage."""
        if clean and self.state_file.fd >= 0 and not self._readonly:
            try:
                sync_fds(self.take_deferred_fds())  # every deletion, before a clean stop
            except OSError:
                clean = False
        if clean and self.state_file.fd >= 0 and not self._readonly:
            try:
                # Before the clean flag: the next start reads these instead of the
                # records (if the logs are still what they describe).
                for seg in self.segments[:-1]:
                    seg.write_owed_columns()
                if self.segments:
                    self.segments[-1].write_snapshot()
            except OSError:
                pass  # the next start reads the records
            if self.sources is not None:
                self.sources.close(self.next_offset)
            st = self.state_file.state
            st.clean = True
            st.acked_next = st.reserved_next = self.next_offset
            try:
                self.state_file.write()
            except OSError:
                pass  # the next start treats the stop as unclean
        if self.sources is not None:
            self.sources.close(None)
        self.state_file.close()
        for seg in self.segments:
            seg.close()

    # -- the startup scan ----------------------------------------------------------

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

        A segment with damaged records gives them too (``LiveRecords.damaged``),
        even when none of its records is live.
        """
        for seg in list(self.segments):
            if not seg.live_count:
                if CORRUPT in seg.state:
                    yield LiveRecords(seg.base, [], [], array("I"), b"", None, {}, [], seg.damaged_subjects(seg.read_all()))
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
            self.record_corrupt(base + rel, reason)
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
    return LiveRecords(base, runs, cols.names, cols.sids, cols.flags, stats, ttls, headers, seg.damaged_subjects(buf))


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
