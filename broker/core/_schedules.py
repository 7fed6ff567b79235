"""Message schedules (NATS ADR-51): a message that, at its time, produces another.

A schedule is a stored message carrying ``Nats-Schedule`` (admission checks it and
gives it ``Nats-Rollup: sub``, ``_admission.py``). Its pending firing is held in the
same deadline structure as the TTLs (``_expiry.py``): one entry per schedule, owned
by the partition's :class:`_Timers`, which the expiry pass runs *before* the TTL and
max-age removals of the same tick (FLIP-25's rule: user timers before TTL timers),
so a schedule due at the instant its source expires still produces it. The pending
schedules themselves are ``Partition.schedules`` (offset -> subject, fire time): a
removal of the schedule message (delete, purge, rollup, TTL, max age) takes it out,
and an entry left in the structure is skipped when it fires (lazy deletion).

Firing builds the produced message (``protocol.nats.schedule.produced_body``) and
publishes it through the broker's own publish path (``Publisher.publish_bodies``:
admission, TTLs, rollups, markers, republish, consumers). It carries
``Nats-Scheduler`` (the schedule's subject) and ``Nats-Schedule-Next``: ``purge`` for
a one-off, whose stored produced message removes the schedule, or the next time of
a repeating one, which stays armed for it.

**Exactly once across a crash.** The schedule message of a one-off is removed only
once its produced message is durable (``Committer.after``, under ``fsync always``;
at once under an interval or ``never``, where no write waits for the disk); until
then it is only out of ``Partition.schedules``. After a restart (:meth:`Scheduler.rebuild`) a
schedule is matched with the newest produced message naming it stored after it: a
``purge`` one means it fired (the schedule is removed now, not fired again); a time
means the next firing is then; none means it has not fired, and it fires at its
time, at once if that passed while the broker was down.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from protocol import BrokerError, RemovalReason, header_values, record_spans
from protocol.nats import rfc3339
from protocol.nats import schedule as S

from ._admission import SCHEDULE, SCHEDULE_PURGE
from ._commit import Committer
from ._retention import Retention
from ._stats import Counters
from ._topics import Partition, Topic

__all__ = ["Scheduler", "ScheduledItem"]

#: A stored message admission marked (``Admission.schedule``): its partition,
#: offset, subject, kind and the epoch of its write.
ScheduledItem = tuple[Partition, int, bytes, int, int]


class _Timers:
    """One partition's schedule entries in the deadline structure (a timer owner
    the expiry pass runs before the TTL removals of the same tick)."""

    __slots__ = ("scheduler", "part")
    before_ttl = True

    def __init__(self, scheduler: Scheduler, part: Partition) -> None:
        self.scheduler = scheduler
        self.part = part

    def timers_due(self, ids: list[int], now_ns: int) -> None:
        self.scheduler.fire(self.part, ids, now_ns)


def _next(hv: dict[bytes, bytes], ts_ns: int, now_ns: int) -> tuple[int, bool] | None:
    """When a schedule with headers ``hv`` fires counting from ``ts_ns``, and whether
    it repeats; None if it is not (or no longer) a valid schedule."""
    try:
        zone = S.load_zone(hv.get(S.SCHEDULE_TIME_ZONE)) if S.SCHEDULE_TIME_ZONE in hv else None
        return S.next_fire(hv[S.SCHEDULE].decode(), zone, ts_ns, now_ns)
    except (S.ScheduleError, UnicodeDecodeError, KeyError):
        return None


class Scheduler:
    """Args:
    retention: the broker's retention (its engine holds the entries; removals).
    committer: the group committer (a one-off's schedule goes once its produced
        message is durable).
    counters: the broker's counters (``schedules_fired``).
    """

    def __init__(self, retention: Retention, committer: Committer, counters: Counters) -> None:
        self.retention = retention
        self.committer = committer
        self.counters = counters
        #: The broker's own publish (``Publisher.publish_bodies``), set by the broker.
        self.publish: Callable[[list[bytes]], None] | None = None
        self._owners: dict[Partition, _Timers] = {}
        self._gone: weakref.WeakSet[Partition] = weakref.WeakSet()

    @staticmethod
    def pending(partitions: list[Partition]) -> int:
        return sum(len(p.schedules) for p in partitions)

    def arm(self, part: Partition, offset: int, subject: bytes, fire_ns: int) -> None:
        """The schedule at ``offset`` on ``subject`` fires at ``fire_ns`` (it replaces
        any other schedule of the subject)."""
        old = part.schedule_of.get(subject)
        if old is not None and old != offset:
            part.drop_schedule(old)
        part.schedules[offset] = (subject, fire_ns)
        part.schedule_of[subject] = offset
        owner = self._owners.get(part)
        if owner is None:
            owner = self._owners[part] = _Timers(self, part)
        self.retention.engine.schedule_first(owner, offset, fire_ns)

    def forget(self, part: Partition) -> None:
        """The partition is going away."""
        self._gone.add(part)
        owner = self._owners.pop(part, None)
        if owner is not None:
            self.retention.engine.queue.drop_partition(owner)
        part.schedules.clear()
        part.schedule_of.clear()

    # -- after a publish -------------------------------------------------------------

    def after_append(self, items: list[ScheduledItem], now_ns: int) -> None:
        """Stored messages admission marked: a schedule is armed; a ``purge`` (a
        client's, or a one-off's produced message) removes the schedule it names."""
        for part, offset, subject, kind, epoch in items:
            rec = part.log.get(offset) if part.log.is_live(offset) else None
            if rec is None:
                continue
            ts, _, _, h_at, p_at, _ = record_spans(rec)
            hv = header_values(rec[h_at:p_at], S.SCHEDULE_HEADERS)
            if kind == SCHEDULE:
                got = _next(hv, ts, now_ns)
                if got is not None:
                    self.arm(part, offset, subject, got[0])
            elif kind == SCHEDULE_PURGE:
                scheduler = hv.get(S.SCHEDULER)
                if scheduler:
                    self._purge(part.topic, scheduler, epoch)

    def _purge(self, topic: Topic, subject: bytes, epoch: int) -> None:
        """The schedule on ``subject`` is done: pending no more at once, and its
        messages (stored before now) removed once ``epoch`` is durable."""
        part = topic.partition_for(subject)
        offset = part.schedule_of.get(subject)
        if offset is not None:
            part.drop_schedule(offset)
        before = part.log.next_offset

        def remove() -> None:
            if part not in self._gone:
                doomed = part.subject_offsets(subject, before=before)
                if doomed:
                    self.retention.remove(part, doomed, RemovalReason.ROLLUP)

        if self.committer.acks_wait:
            # Before the PubAck of the message that ends the schedule goes out: its
            # answer shows the schedule gone, as nats-server's does.
            self.committer.after(epoch, remove, before_answers=True)
        else:  # (fsync interval or never: nothing waits for the disk, and neither does this)
            remove()

    # -- firing ------------------------------------------------------------------------

    def fire(self, part: Partition, offsets: list[int], now_ns: int) -> None:
        """The entries of ``part`` that fell due: each schedule still pending and due
        produces its message (all of them in one publish, in offset order)."""
        bodies: list[bytes] = []
        topic = part.topic
        for offset in sorted(set(offsets)):
            got = part.schedules.get(offset)
            if got is None or got[1] > now_ns:
                continue  # removed, or re-armed for later (a stale entry)
            subject, due = got
            rec = part.log.get(offset) if part.log.is_live(offset) else None
            if rec is None:
                part.drop_schedule(offset)
                continue
            _, _, _, h_at, p_at, end = record_spans(rec)
            block, payload = rec[h_at:p_at], rec[p_at:end]
            hv = header_values(block, S.SCHEDULE_HEADERS)
            nxt = _next(hv, due, now_ns)
            target = hv.get(S.SCHEDULE_TARGET)
            if nxt is None or not target:
                part.drop_schedule(offset)
                continue
            source = hv.get(S.SCHEDULE_SOURCE)
            if source:
                last = topic.partition_for(source).last(source)
                if last is not None:  # else the schedule's own content
                    _, _, _, sh, sp, se = record_spans(last)
                    block, payload = last[sh:sp], last[sp:se]
            next_ns, repeat = nxt
            try:
                bodies.append(S.produced_body(
                    target, block, payload, subject, rfc3339(next_ns) if repeat else "purge",
                    hv.get(S.SCHEDULE_TTL) or None, hv.get(S.SCHEDULE_ROLLUP) or None,
                ))
            except (BrokerError, UnicodeDecodeError):  # (a schedule admission did not check: a republished copy)
                part.drop_schedule(offset)
                continue
            if repeat:
                self.arm(part, offset, subject, next_ns)
            else:
                part.drop_schedule(offset)
        if bodies:
            self.counters.schedules_fired += len(bodies)
            assert self.publish is not None
            self.publish(bodies)

    # -- after a restart -----------------------------------------------------------------

    def rebuild(self, part: Partition, headed: list[tuple[int, int, bytes]]) -> None:
        """Arm the partition's schedules from its log (startup): ``headed`` are
        ``(offset, timestamp, header block)`` of its live records with schedule
        headers, in offset order."""
        self._gone.discard(part)  # (a rebuild starts by forgetting the partition)
        schedules: dict[bytes, tuple[int, int, dict[bytes, bytes]]] = {}
        produced: dict[bytes, tuple[int, bytes]] = {}
        for offset, ts, block in headed:
            hv = header_values(block, S.SCHEDULE_HEADERS)
            if hv.get(S.SCHEDULE):
                schedules[part.index.subject_at(offset)] = (offset, ts, hv)
            elif hv.get(S.SCHEDULER) and hv.get(S.SCHEDULE_NEXT):
                produced[hv[S.SCHEDULER]] = (offset, hv[S.SCHEDULE_NEXT])
        done: list[int] = []
        for subject, (offset, ts, hv) in schedules.items():
            last = produced.get(subject)
            fire: int | None = None
            if last is not None and last[0] > offset:
                if last[1] == S.SCHEDULE_NEXT_PURGE:
                    done.append(offset)  # it fired: its removal was cut short
                    continue
                try:
                    fire = S.parse_rfc3339_strict(last[1].decode())
                except (S.ScheduleError, UnicodeDecodeError):
                    fire = None
            if fire is None:
                got = _next(hv, ts, ts)
                if got is None:
                    continue
                fire = got[0]
            self.arm(part, offset, subject, fire)
        if done:
            self.retention.remove(part, done, RemovalReason.ROLLUP)
