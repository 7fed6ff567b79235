"""Retention: every way a message leaves a topic, and the markers it leaves behind.

One :class:`Retention` per broker. It owns the expiry engine (``_expiry.py``) and is
the only code that removes messages, so the log, the subject index, the deadline
structure and the counters always agree:

* **per-message TTL** and **max age** (whichever comes first; a ``never`` TTL exempts
  a message from max age): the engine calls :meth:`Retention._expire` for every
  partition with something due;
* **delete**, **purge**, **rollup** and **max_msgs_per_subject**: the broker's
  handlers call :meth:`Retention.remove` with the reason;
* **subject delete markers** (NATS ADR-43; ``docs/semantics.md``, "Subject delete
  markers"): when a removal by age (TTL or max age: reason ``MaxAge``, as on the
  NATS server), by the delete API (``Remove``) or by a subject purge (``Purge``; the
  NATS server does not write these two yet) takes away the last live message of its
  subject, and that message was not itself a marker (nor a KV purge tombstone, nor
  anything else carrying ``Nats-Marker-Reason``), a marker is appended on the
  subject: empty payload, headers ``Nats-Marker-Reason``, ``Nats-TTL`` (the marker
  TTL as a Go duration) and ``Nats-Rollup: sub``, the next offset, and a TTL of its
  own so that it expires too, leaving nothing behind. A removal that finds the
  message already gone removes nothing, so an expiry pass that runs twice never
  writes a second marker; a whole-topic purge writes none (one per subject could be
  millions);
* **the segment cleaner** (Iggy's message cleaner): :meth:`Retention.clean` seals an
  active segment whose messages are all gone, so that expired data in a quiet
  partition goes too, and deletes every sealed segment file with no live message
  left (messages expire one by one, files go whole).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import trio

from protocol import (
    MarkerReason,
    RemovalReason,
    delivery_entry,
    encode_body,
    encode_headers,
    format_go_duration,
)
from storage import AppendResult, PartitionLog, Segment

from ._clock import Clock
from ._commit import Committer
from ._expiry import ExpiryEngine
from ._limits import trim
from ._log import get_logger
from ._topics import Partition, Removed
from ._stats import Counters
from ._subject_index import MARKER, NO_MARKER
from ._subscriptions import Entry

__all__ = ["Retention"]

log = get_logger(__name__)

NS = 1_000_000_000

R = RemovalReason

_COUNTER_OF = {
    R.TTL: "expired_ttl",
    R.MAX_AGE: "expired_max_age",
    R.DELETE: "deleted",
    R.PURGE: "purged",
    R.ROLLUP: "removed_rollup",
    R.MAX_MSGS_PER_SUBJECT: "removed_max_msgs_per_subject",
    R.ACKED: "removed_acked",
    R.LIMITS: "removed_limits",
}

#: Which removals leave a marker, and which reason it carries.
_MARKER_FOR = {R.TTL: MarkerReason.MAX_AGE, R.MAX_AGE: MarkerReason.MAX_AGE, R.DELETE: MarkerReason.REMOVE, R.PURGE: MarkerReason.PURGE}

#: The broker's core delivery (``SubscriptionIndex.deliver``).
Deliver = Callable[[list[Entry]], None]


class Retention:
    """Args:
    clock: the broker clock.
    counters: the broker's counters.
    committer: the group committer (removals and markers are writes like any other).
    deliver: the broker's core delivery function, for markers.
    """

    def __init__(self, clock: Clock, counters: Counters, committer: Committer, deliver: Deliver) -> None:
        self.clock = clock
        self.counters = counters
        self.committer = committer
        self.deliver = deliver
        self.engine = ExpiryEngine(clock, self._expire)
        #: Called with ``(partition, append result, epoch)`` after markers are
        #: appended (the broker republishes them like any stored message).
        #: Called after markers are appended: ``(partition, append result, epoch,
        #: offsets)``, ``offsets[k]`` being the message whose removal marker ``k``
        #: marks (republish's ``Nats-Last-Sequence``).
        self.on_markers: Callable[[Partition, AppendResult, int, list[int]], None] | None = None
        #: The message schedules (``_schedules.py``, set by the broker): told of a
        #: rebuilt partition of a topic with ``allow_msg_schedules`` (with its
        #: records that carry schedule headers) and of a partition going away.
        self.on_rebuild: Callable[[Partition, list[tuple[int, int, bytes]]], None] | None = None
        self.on_forget: Callable[[Partition], None] | None = None

    # -- scheduling --------------------------------------------------------------------

    def after_append(
        self, part: Partition, res: AppendResult, ttls: list[tuple[int, int]] | None = None,
        by_ttl: dict[int, list[int]] | None = None,
    ) -> None:
        """Schedule what an append made pending: ``ttls`` are ``(offset, seconds)`` of
        the appended messages that have a TTL (not never), or ``by_ttl`` the same
        grouped (seconds -> offsets, in offset order), and the partition's max-age
        check is armed if the topic has a max age and none is armed.

        Runtime complexity: O(1) without TTLs, O(log buckets) per distinct TTL plus
        O(1) per message (one bulk insertion per bucket).
        """
        engine = self.engine
        expiry = part.topic.config.message_expiry
        if expiry and engine.age_armed(part) is None:
            engine.schedule_age(part, res.timestamp + expiry * NS)
        if ttls:
            by_ttl = {}
            for offset, seconds in ttls:
                g = by_ttl.get(seconds)
                if g is None:
                    by_ttl[seconds] = [offset]
                else:
                    g.append(offset)
        if not by_ttl:
            return
        each = res.timestamps
        if each is None:
            ts = res.timestamp
            for seconds, offsets in by_ttl.items():
                part.mark_pending(offsets)
                engine.schedule_ttl_many(part, offsets, ts + seconds * NS)
            return
        first = res.first_offset  # each record its own timestamp (a mirror's copies)
        deadlines: dict[int, list[int]] = {}
        for seconds, offsets in by_ttl.items():
            part.mark_pending(offsets)
            for o in offsets:
                deadlines.setdefault(each[o - first] + seconds * NS, []).append(o)
        for deadline, offsets in deadlines.items():
            engine.schedule_ttl_many(part, offsets, deadline)

    def rebuild(self, part: Partition) -> None:
        """Rebuild a partition's expiry state from its log (startup). Whatever fell
        due meanwhile expires on the engine's first pass, markers included. The same
        scan gives back the topic's ``Nats-Msg-Id`` table (``_dedup.py``) for the
        partition's recent records."""
        self.forget(part)
        window = part.topic.config.duplicate_window
        msg_ids: list[tuple[int, bytes, int, int]] | None = [] if window else None
        headed: list[tuple[int, int, bytes]] | None = [] if part.topic.config.allow_msg_schedules else None
        with_ttl = part.rebuild_index(msg_ids, headed)
        if msg_ids:
            part.topic.dedup.load(msg_ids, window)
        if part.topic.config.allow_msg_ttl:
            by_deadline: dict[int, list[int]] = {}
            merged: set[int] = set()
            for (ts, ttl), group in with_ttl.items():
                deadline = ts + ttl * NS
                offsets = by_deadline.get(deadline)
                if offsets is None:
                    by_deadline[deadline] = group
                else:
                    offsets.extend(group)
                    merged.add(deadline)
            for deadline in merged:
                by_deadline[deadline].sort()
            for deadline, offsets in by_deadline.items():
                part.mark_pending(offsets)
                self.engine.schedule_ttl_many(part, offsets, deadline)
        self.rearm_age(part)
        if headed is not None and self.on_rebuild is not None:
            self.on_rebuild(part, headed)

    def rearm_age(self, part: Partition) -> None:
        """Arm the partition's max-age check at its oldest message's deadline (after a
        change of the topic's max age, or a rebuild)."""
        self.engine.schedule_age(part, self._next_age_deadline(part))

    def forget(self, part: Partition) -> None:
        """The partition is going away (its topic was deleted)."""
        self.engine.forget(part)
        if self.on_forget is not None:
            self.on_forget(part)
        self.engine.queue.discarded(part.pending)
        part.pending = 0

    @staticmethod
    def _next_age_deadline(part: Partition) -> int | None:
        expiry = part.topic.config.message_expiry
        if not expiry:
            return None
        oldest = part.log.oldest_live(part.is_never)
        return None if oldest is None else oldest[1] + expiry * NS

    # -- removing ----------------------------------------------------------------------

    def remove(self, part: Partition, offsets: Iterable[int], reason: RemovalReason, deferred: bool = False) -> list[Removed]:
        """Remove live messages for ``reason`` (kept on disk with each deletion), write
        the markers the removal calls for, and return what was removed.

        ``deferred``: recovery makes these removals again after a crash, from the
        log and the configuration alone (``max_msgs_per_subject``, at the start:
        ``Broker.open_topic_storage``). Their deletions are then not synced with the
        append that caused them (at ``always``, a KV put costs one sync instead of
        three) but within a second (``Committer.note_deferred``).
        Never while a consumer of the partition may dead-letter what is removed:
        its copy and the removal stay in one sync."""
        if deferred and any(w.letters_removals for w in part.watchers):
            deferred = False
        removed, cleared = part.remove(offsets, reason, deferred)
        if cleared:
            self.engine.queue.discarded(cleared)
        if removed:
            if deferred:
                self.committer.note_deferred(part.log)
            else:
                self.committer.note_write(part.log)
            self._count(part, reason, len(removed))
            marker = _MARKER_FOR.get(reason)
            if marker is not None:
                self._write_markers(part, removed, marker)
        return removed

    def purge_all(self, part: Partition) -> int:
        """Remove every message of a partition (a whole-topic purge leaves no markers:
        one per subject could be millions)."""
        removed, cleared = part.purge_all()
        if cleared:
            self.engine.queue.discarded(cleared)
        self.engine.schedule_age(part, None)
        if removed:
            self._count(part, R.PURGE, removed)
        return removed

    def _count(self, part: Partition, reason: RemovalReason, n: int) -> None:
        setattr(self.counters, _COUNTER_OF[reason], getattr(self.counters, _COUNTER_OF[reason]) + n)
        stats = part.topic.removed
        stats[reason.label] = stats.get(reason.label, 0) + n

    def _expire(self, part: Partition, ttl_offsets: list[int], age_due: bool, now_ns: int) -> int | None:
        """Remove what is due in one partition; returns its next max-age deadline."""
        ttl_due = [o for o in ttl_offsets if part.is_pending(o)]
        if part.refreshed and ttl_due:
            ttl_due = self._rearm_refreshed(part, ttl_due, now_ns)
        expiry = part.topic.config.message_expiry
        aged: list[int] = []
        if age_due and expiry:
            aged = part.log.live_offsets_until(now_ns - expiry * NS, part.is_never)
        if aged and ttl_due:
            aged_set = set(aged)
            ttl_due = [o for o in ttl_due if o not in aged_set]
        # Both reasons in one pass, so that one subject emptied by both gets one marker.
        removed, cleared = part.remove(aged, R.MAX_AGE)
        removed_ttl, cleared_ttl = part.remove(ttl_due, R.TTL)
        if cleared or cleared_ttl:
            self.engine.queue.discarded(cleared + cleared_ttl)
        if removed or removed_ttl:
            self.committer.note_write(part.log)
            if removed:
                self._count(part, R.MAX_AGE, len(removed))
            if removed_ttl:
                self._count(part, R.TTL, len(removed_ttl))
            self._write_markers(part, removed + removed_ttl, MarkerReason.MAX_AGE)
            log.debug("expired", topic=part.topic.full_name, partition=part.number, ttl=len(ttl_due), max_age=len(aged))
        return self._next_age_deadline(part) if expiry else None

    def _rearm_refreshed(self, part: Partition, due: list[int], now_ns: int) -> list[int]:
        """FLIP-25's lazy re-arm: a due entry whose key was read or touched since it
        was armed gets one new entry at the pushed-back deadline instead of expiring.
        Returns the offsets that really expire now."""
        refreshed = part.refreshed
        expiring = []
        for o in due:
            deadline = refreshed.get(o)
            if deadline is not None and deadline > now_ns:
                self.engine.queue.discarded()  # the entry that fell due is gone ...
                self.engine.schedule_ttl(part, o, deadline)  # ... and one takes its place
            else:
                expiring.append(o)
        return expiring

    # -- markers -----------------------------------------------------------------------

    def _write_markers(self, part: Partition, removed: list[Removed], reason: MarkerReason) -> None:
        sdm = part.topic.config.subject_delete_marker_ttl
        if not sdm or part.topic.config.sealed:  # a sealed topic takes no new message, a marker neither
            return
        # The message that emptied a subject is its newest removed one; a marker (or a
        # KV purge tombstone) emptying its subject leaves nothing behind.
        last: dict[bytes, Removed] = {}
        for r in removed:
            if r.state.count == 0:
                prev = last.get(r.subject)
                if prev is None or r.offset > prev.offset:
                    last[r.subject] = r
        marked = [(s, r.offset) for s, r in last.items() if not r.flags & (MARKER | NO_MARKER) and not r.state.count]
        if marked:
            self.append_markers(part, [s for s, _ in marked], reason, [o for _, o in marked])

    def append_markers(
        self, part: Partition, subjects: list[bytes], reason: MarkerReason, removed: list[int] | None = None
    ) -> AppendResult:
        """Append one marker per subject (in one write) and schedule their expiry.
        ``removed[k]``: the offset of the message whose removal marker ``k`` marks."""
        sdm = part.topic.config.subject_delete_marker_ttl
        headers = encode_headers(
            [("Nats-Marker-Reason", reason.header_value), ("Nats-TTL", format_go_duration(sdm)), ("Nats-Rollup", "sub")]
        )
        bodies = [encode_body(s, b"", headers, sdm, int(reason)) for s in subjects]
        starts, ends, pos = [], [], 0
        for b in bodies:
            starts.append(pos)
            pos += len(b)
            ends.append(pos)
        res = part.append(b"".join(bodies), starts, ends, subjects, self.clock.now_ns(), bytes([MARKER]) * len(bodies))
        epoch = self.committer.note_write(part.log)
        n = len(bodies)
        self.counters.messages_in += n
        self.counters.bytes_in += len(res.records)
        self.counters.markers += n
        markers = part.topic.markers
        markers[reason.header_value] = markers.get(reason.header_value, 0) + n
        self.after_append(part, res, [(res.first_offset + k, sdm) for k in range(n)])
        if part.topic.trimming:  # a marker counts toward the limits (discard new: docs/semantics.md)
            trim(part, self.remove)
        head = delivery_entry(part.topic.stream.id, part.topic.id, part.number)
        records = memoryview(res.records)
        bounds = res.positions + [len(records)]
        self.deliver([(subjects[k], head, records[bounds[k] : bounds[k + 1]]) for k in range(n)])
        if self.on_markers is not None:
            self.on_markers(part, res, epoch, removed if removed is not None else [0] * n)
        return res

    # -- the segment cleaner -------------------------------------------------------------

    def clean(self, partitions: Iterable[Partition], keep: Callable[[Partition, Segment], bool] | None = None) -> tuple[int, int]:
        """One cleaner pass: seal active segments whose messages are all gone, delete
        sealed segments with nothing live (except those ``keep`` names: not yet
        exported). Returns ``(segments, bytes)`` reclaimed.

        Only a partition that lost segments has its subject index trimmed: forgetting
        the subjects left with nothing walks them all (80 ms with a million subjects,
        the event loop held up), so a pass that reclaims nothing costs nothing."""
        segments = freed = 0
        for part in partitions:
            plog = part.log
            active = plog.active
            if active.count and not active.live_count:
                plog.seal_active()
            gone = [seg for seg in plog.reclaimable() if keep is None or not keep(part, seg)]
            if gone:
                freed += plog.remove_segments(gone)  # one directory fsync for them all
                segments += len(gone)
                part.trim_index()
        if segments:
            self.counters.segments_reclaimed += segments
            self.counters.bytes_reclaimed += freed
            log.info("segments_reclaimed", segments=segments, bytes=freed)
        return segments, freed

    async def run_cleaner(
        self, interval: float, partitions: Callable[[], list[Partition]], keep: Callable[[Partition, Segment], bool] | None = None,
        settle: Callable[[PartitionLog], Awaitable[None]] | None = None,
    ) -> None:
        """The cleaner task: a pass every ``interval`` seconds. ``settle(log)``
        (``Sealer.finish``) first finishes, off the event loop, the seals a partition's
        log owes: a segment after one whose seal is owed is not removable
        (``PartitionLog.reclaimable``)."""
        while True:
            await trio.sleep(interval)
            if settle is not None:
                for part in partitions():
                    if part.log.owed_seals:
                        await settle(part.log)
            self.clean(partitions(), keep)  # (a topic may have gone meanwhile)

