"""The log of one partition: an ordered list of segments, the last one active.

Offsets start at 1 and never repeat: the active segment's file name always carries
the next offset to assign, even when every message before it was purged (an empty
active segment is kept for exactly that reason), and a purge is recorded as a
watermark (``purged``: every offset at or below it is gone) before any file is
removed. Deletions of single records live in the segments' ``.del`` files. So after
a restart nothing deleted comes back and no offset is handed out twice.

:class:`PartitionLog` is the class the broker and the exporter use. It is built in
three layers, one module each, every one extending the one before:

``_partition_recovery.RecoveredPartition``
    Opening (recovery of the segment list, the torn tail, the high-water mark),
    ``partition.state`` and every write of it (the reservation ahead, the trailing
    ``acked_next`` of the group commit, the purge watermark, the clean stop at
    close), and the startup scan.
``_partition_reads.PartitionReads``
    Every read: fetches, single records, liveness, timestamps, live counts.
this module
    The writes: appends, deletions, purges, rolls of the active segment and the
    hand-off of their seals to the owner's worker thread, the cleaner's removal
    of segments, and a sourcing topic's marks (``_sources``: written before a
    removal they must survive).

Layers of one class rather than parts it holds, as ``_segment.Segment`` extends
``_log.SegmentLog``: appends, fetches and gets read the segment list, the bases and
``partition.state`` on every call, as attributes of the log itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import NamedTuple

from protocol import build_records

from ._durability import fsync_dir, sync_fds
from ._files import keep_aside
from ._log import CORRUPT
from ._partition_reads import PartitionReads
from ._segment import Segment
from ._sources import SourceMark, SourceMarks, SourceOf

__all__ = ["PartitionLog", "AppendResult"]


class AppendResult(NamedTuple):
    first_offset: int
    timestamp: int
    records: bytearray  # the records just written, back to back
    positions: list[int]  # each record's position inside ``records``
    #: each record's timestamp, when they differ (None: all ``timestamp``)
    timestamps: list[int] | None = None


class PartitionLog(PartitionReads):
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
        super().__init__(path, segment_size, on_corrupt, reserve)
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

    #: Its records are in memory only (``_memory.MemoryPartitionLog``): nothing of
    #: them to sync, and an ack never waits for a sync.
    volatile = False

    def _new_segment(self, base: int) -> Segment:
        """A new, empty active segment at ``base`` (a roll)."""
        return Segment.create(self.path, base, self.segment_size)

    def _sync_dir(self) -> None:
        """Make the directory's entries durable (a roll, a purge, a removal)."""
        fsync_dir(self.path)

    # -- appending -----------------------------------------------------------------

    def append(
        self, data: bytes | bytearray | memoryview, starts: list[int], ends: list[int], timestamp: int,
        stamps: Mapping[int, tuple[int, int]] | None = None, timestamps: Sequence[int] | None = None,
    ) -> AppendResult:
        """Append message bodies ``data[starts[i]:ends[i]]`` as consecutive records
        (``stamps``: index -> ``(ttl, flags)`` to write into those bodies, see
        :func:`protocol.build_records`), all with ``timestamp``, or each with its own
        (``timestamps``: a mirror's copies keep their origin's).

        A timestamp is raised to the one before it if the clock went back, so
        timestamps never decrease within a partition.

        Raises:
            StorageFailure: the write failed; nothing was appended.
        """
        seg = self.segments[-1]
        if seg.size >= self.segment_size and seg.count:
            seg = self._roll()
        last_ts = seg.time_ts[-1] if seg.time_ts else 0
        each: list[int] | None = None
        if timestamps is not None:
            each, t = [], last_ts
            for x in timestamps:
                t = x if x > t else t
                each.append(t)
            timestamp = each[0]
        elif timestamp < last_ts:
            timestamp = last_ts
        first = seg.next_offset
        if self.reserve_ahead and first + len(starts) > self.state_file.state.reserved_next:
            self.extend_reservation(first + len(starts))
        records, rel = build_records(data, starts, ends, first, timestamp, stamps, each)
        base_pos = seg.size
        seg.append(records, [base_pos + p for p in rel] if base_pos else rel, timestamp, each)
        self.live_count += len(starts)
        self.size_bytes += len(records)
        if seg.size >= self._flush_at:
            self._want_flush(seg.size)
        return AppendResult(first, timestamp, records, rel, each)

    def _want_flush(self, size: int) -> None:
        step = max(self.segment_size >> 3, 1)
        self._flush_at = (size // step + 1) * step
        if not self.flush_wanted:
            self.flush_wanted = True
            if self.on_seal_owed is not None:
                self.on_seal_owed(self)

    # -- rolls and their seals -----------------------------------------------------

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
        new = self._new_segment(old.next_offset)
        crc = old.begin_seal()
        self._sync_dir()
        self.segments.append(new)
        self.bases.append(new.base)
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
        if self.reserve_ahead:
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
        new = self._new_segment(old.next_offset)
        old.seal()
        self._sync_dir()
        self.segments.append(new)
        self.bases.append(new.base)
        return new

    # -- deletions and purges ------------------------------------------------------

    def delete(self, offset: int) -> bool:
        """Delete one record; False if it was not live."""
        return self.delete_many([offset]) == 1

    def delete_many(self, offsets: list[int], tag: int = 0, deferred: bool = False) -> int:
        """Delete records (one ``.del`` write per segment); returns how many were live.
        ``tag`` (0..15) is recorded with each deletion (why; the caller's vocabulary).
        ``deferred``: deletions the caller makes again after a crash (a limit's, from
        the log itself): written now, synced only by :meth:`take_deferred_fds`'
        descriptors (or with a later deletion of the same segment), and before a
        clean close."""
        if self.sources is not None and offsets:
            self.sources.protect(max(offsets), self.next_offset)
        by_segment: dict[int, list[int]] = {}
        for off in offsets:
            i = self.segment_index(off)
            by_segment.setdefault(i, []).append(off - self.segments[i].base)
        done = 0
        for i, rels in by_segment.items():
            seg = self.segments[i]
            done += seg.delete_many(rels, tag, deferred=deferred)
            if deferred and seg.deletions.deferred:
                self.deferred_segments[seg] = None
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
        if self.sources is not None:
            self.sources.protect(through, self.next_offset, durable=True)
        self.mark_purged(through)
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
        self.bases = [s.base for s in keep]
        self._drop_owed_seals()
        self._sync_dir()
        self.live_count -= removed
        return removed

    def start_at(self, first: int) -> None:
        """Make a log that never held a record hand out ``first`` as its first offset
        (a topic's ``first_seq``): every offset below it is recorded as purged, then
        the empty active segment is replaced by one named ``first``. A crash in
        between reopens at ``first`` all the same (recovery starts the active segment
        past the watermark).

        Raises:
            ValueError: the log has handed out an offset already.
        """
        if first <= 1:
            return
        if self.next_offset != 1 or len(self.segments) != 1:
            raise ValueError("only a log that never held a record can start at another offset")
        self.mark_purged(first - 1)
        old = self.segments[0]
        new = Segment.create(self.path, first, self.segment_size)
        old.remove_files()
        self.segments = [new]
        self.bases = [first]
        self._drop_owed_seals()
        fsync_dir(self.path)

    def skip_to(self, offset: int) -> None:
        """Make ``offset`` the next offset handed out, leaving the offsets from
        :attr:`next_offset` up to it unused for ever (a mirror keeps its origin's
        sequences, and the origin's gaps). The active segment, if it holds records,
        is sealed whole on this thread (its index durable, so that a rebuild never
        expects records in the gap); an empty one is replaced. A crash after it
        reopens at ``offset`` all the same (the new segment's file is there).
        Nothing for an offset at or below :attr:`next_offset`."""
        if offset <= self.next_offset:
            return
        old = self.segments[-1]
        if old.count:
            old.seal()
        else:
            old.remove_files()
            self.segments.pop()
            self.bases.pop()
        new = self._new_segment(offset)
        self.segments.append(new)
        self.bases.append(offset)
        self._sync_dir()

    # -- where a sourcing topic is in its sources -----------------------------------

    def configure_sources(self, inames: Collection[str], source_of: SourceOf) -> None:
        """The topic sources ``inames`` (none: it sources nothing any more, and its
        marks go): keep their marks (``_sources``), finding with ``source_of`` the
        copies the marks do not account for."""
        if not inames:
            if self.sources is not None:
                self.sources.remove()
                self.sources = None
            return
        if self.sources is None:
            self.sources = SourceMarks(None if self.volatile else self.path)
        self.sources.configure(inames, self._newest_first(), source_of)

    def _newest_first(self) -> Iterator[tuple[int, memoryview]]:
        off = self.next_offset - 1
        first = max(self.first_offset, 1)
        while off >= first:
            rec = self.read_live(off)
            if rec is not None:
                yield off, rec
            off -= 1

    def source_mark(self, iname: str) -> SourceMark | None:
        """The last message copied from source ``iname`` (None: nothing yet)."""
        return self.sources.mark(iname) if self.sources is not None else None

    def note_source(self, iname: str, seq: int, ident: str, offset: int) -> None:
        """The last copy of a batch from ``iname`` was appended at ``offset`` (in the
        same step as the append: before any removal can take it)."""
        if self.sources is None:
            self.sources = SourceMarks(None if self.volatile else self.path)
        self.sources.note(iname, seq, ident, offset)

    # -- the cleaner ---------------------------------------------------------------

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
        self.bases = [s.base for s in self.segments]
        self._drop_owed_seals()
        self._sync_dir()
        return freed
