"""Expiry: the deadline structure and the one task that removes what falls due.

**The deadline structure** (:class:`DeadlineQueue`) holds every pending per-message
TTL. An entry fires on the first 10 ms tick at or after its deadline (:data:`TICK_NS`:
never early, and well within the 100 ms the broker promises, ``docs/semantics.md``,
"Per-message TTL"; the NATS server ticks at 250 ms). Entries
are kept in a ``sortedcontainers.SortedDict`` of 100 ms *buckets*; a bucket maps each
partition to an ``array('Q')`` of ``offset << 4 | tick`` (which of the bucket's ten
ticks), so a pending TTL costs 8 bytes plus its share of the bucket, however many
there are and however the deadlines spread, and the structure holds no object per
entry. When a bucket's first tick comes it is *opened*: split by tick into
``_near`` (one pass over its entries), which thus holds about one bucket.

Taking an entry out (delete, purge, rollup, max age removing the message first) is
O(1). The partition's per-offset PENDING flag is cleared and the count drops; the
offset itself stays in its bucket and is skipped when the bucket fires. That is
trio's own lazy deletion (commit ``a47fbc7b``), and it keeps removal cheaper than
finding an entry in a sorted structure.

**Max age** needs no per-message entry. Timestamps never decrease within a
partition, so its oldest live message (ignoring ``never`` ones) always has the
earliest max-age deadline. Each partition keeps at most one armed check, in
``_age`` (a ``SortedDict`` of ticks), and a pass re-arms it for the next
oldest.

**Consumer timers** (redelivery after an ack wait or a nak delay) live in the same
structure, one entry per outstanding message on the same 10 ms ticks
(:data:`TIMER_NS`), owned by a consumer's partition state, which the pass calls back
(:class:`TimerOwner`; waiting pulls and group members have timer owners of their
own). An owner re-arms lazily, as FLIP-25 does: ``in_progress`` only records the new
deadline, and the entry, when it fires, re-arms itself once if the deadline moved.

**The task** (:class:`ExpiryEngine.run`) sleeps until the earliest tick of either
structure. It is woken and re-armed when something earlier arrives, so a flood of
long TTLs never delays a short one. When it wakes it expires everything due, in
slices: chunks of :data:`CHUNK` offsets of one partition (in offset order, markers
included, one append of markers per chunk), and after :data:`SLICE_NS` of work it
lets the event loop run before it goes on (a million entries due at once never hold
up connections). It also measures the loop's stalls and the garbage collector's
pauses (``_stalls.py``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns
from typing import TYPE_CHECKING, Protocol

import trio
from sortedcontainers import SortedDict

from ._stalls import LoopWatch
from ._topics import Partition

if TYPE_CHECKING:
    from ._clock import Clock

__all__ = [
    "DeadlineQueue", "ExpiryEngine", "Owner", "TimerOwner", "BUCKET_NS", "TIMER_NS", "TICK_NS", "SLICE_NS", "LAG_BUCKETS_NS",
    "fire_time",
]

#: Firing granularity: an entry fires at its deadline rounded up to a tick, so at most
#: this long after it (never early; the broker promises within 100 ms, the NATS
#: server ticks at 250 ms). Per-message TTLs and consumer timers share it.
TICK_NS = 10_000_000
#: Consumer timers (redelivery after an ack wait or a nak delay: an application waits
#: on them, never early, p99 within 50 ms) fire on the same ticks.
TIMER_NS = TICK_NS
#: Storage bucket width: entries are kept in buckets of this many ticks, and a bucket
#: is split by tick (*opened*) only when its first tick comes.
BUCKET_NS = 100_000_000
_TICKS = BUCKET_NS // TICK_NS  # ticks per bucket (a tick index fits in 4 bits)
_TICK_BITS = 4
_TICK_MASK = (1 << _TICK_BITS) - 1
#: Work per slice of an expiry pass: the task yields to the event loop after a chunk
#: once a slice has run this long, so a pass never blocks the loop for much more.
SLICE_NS = 2_000_000
#: Entries handed to one removal call (one append of markers per call).
CHUNK = 64
#: A pass takes due entries into its work this many at a time (whole ticks).
COLLECT = 16 * CHUNK
#: Upper bounds (ns, inclusive) of the expiry lag histogram's buckets: how long after
#: its bucket's time a pass ran. Lag comes from a busy event loop (a long handler,
#: a garbage collection), so the buckets span 1 ms to 10 s.
LAG_BUCKETS_NS = tuple(ms * 1_000_000 for ms in (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000))


class TimerOwner(Protocol):
    """What holds timer entries (a consumer's partition state, the waiting pulls, a
    consumer group's members): told of the ids that fell due."""

    def timers_due(self, ids: list[int], now_ns: int) -> None: ...


#: Whose entries the deadline structure holds: a partition's (pending TTLs) or a
#: timer owner's.
Owner = Partition | TimerOwner


class _Due:
    """A partition's share of the expiry pass under way: its TTL offsets not handled
    yet (newest first: chunks are taken from the end) and whether its max-age check
    fell due."""

    __slots__ = ("offsets", "age_due")

    def __init__(self, offsets: list[int], age_due: bool) -> None:
        self.offsets = offsets
        self.age_due = age_due


def fire_time(deadline_ns: int, width: int = TICK_NS) -> int:
    """When an entry for ``deadline_ns`` fires: never before it, less than ``width``
    after."""
    return -(-deadline_ns // width) * width


class DeadlineQueue:
    """Pending per-message expiries (and consumer timers), ordered by when they fire.

    Two levels, so that a pending entry costs 8 bytes however the deadlines spread
    and whatever the tick: ``_buckets`` (a ``SortedDict``) maps a bucket's end (its
    last tick, a multiple of :data:`BUCKET_NS`) to ``{owner: array('Q')}``, each
    entry ``offset << 4 | ticks before the bucket's end``; ``_near`` maps the fire time
    of each tick of the buckets opened so far to ``{owner: [offsets]}``. A bucket is
    opened (its entries moved to ``_near`` by tick: one pass over them) when its
    first tick is due, so ``_near`` holds about one bucket's entries. An owner is a
    partition for TTLs, a consumer's partition state for timers. Offsets must be
    below 2**60.
    """

    def __init__(self) -> None:
        self._buckets: SortedDict = SortedDict()  # bucket end (ns) -> {owner: array('Q')}
        self._near: SortedDict = SortedDict()  # fire time (ns) -> {owner: list[int]}
        self._opened = 0  # every bucket ending at or before this was opened into _near
        #: Live pending entries (entries of removed messages are not counted).
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, deadline_ns: int, partition: Partition, offset: int) -> int:
        """Schedule ``offset`` of ``partition``; returns when it fires.

        Runtime complexity: O(log buckets).
        """
        b = fire_time(deadline_ns)
        self.add_many(b, partition, [offset])
        return b

    def add_many(self, fire_ns: int, partition: Partition, offsets: list[int]) -> None:
        """Schedule several offsets of one partition firing at ``fire_ns`` (a multiple
        of :data:`TICK_NS`: ``fire_time(deadline)``): one bulk insertion."""
        self.add_timers(fire_ns, partition, offsets)
        self.count += len(offsets)

    def add_timers(self, fire_ns: int, owner: Owner, offsets: Iterable[int]) -> None:
        """Schedule entries firing at ``fire_ns`` (a multiple of :data:`TICK_NS`) that
        are not counted as pending TTLs (consumer timers; and the bulk insertion)."""
        end = -(-fire_ns // BUCKET_NS) * BUCKET_NS
        if end <= self._opened:  # its bucket is open (or due already): straight to its tick
            slot = self._near.get(fire_ns)
            if slot is None:
                slot = self._near[fire_ns] = {}
            listed = slot.get(owner)
            if listed is None:
                slot[owner] = list(offsets)
            else:
                listed.extend(offsets)
            return
        tick = (end - fire_ns) // TICK_NS  # 0 for the bucket's last tick; never rounds later
        slot = self._buckets.get(end)
        if slot is None:
            slot = self._buckets[end] = {}
        arr = slot.get(owner)
        if arr is None:
            arr = slot[owner] = array("Q")
        arr.extend([o << _TICK_BITS | tick for o in offsets])

    def discarded(self, n: int = 1) -> None:
        """``n`` pending entries were taken out (their messages removed first)."""
        self.count -= n

    def first_bucket(self) -> int | None:
        """When the first entry may fire (a bucket not opened yet: its first tick).
        Runtime complexity: O(1)."""
        a = self._near.peekitem(0)[0] if self._near else None
        if not self._buckets:
            return a
        b = self._buckets.peekitem(0)[0] - BUCKET_NS + TICK_NS
        return b if a is None or b < a else a

    def open_due(self, now_ns: int) -> None:
        """Open buckets, earliest first, until ``_near`` holds the earliest tick due
        at ``now_ns`` (or no bucket's first tick is due): its ticks come before every
        tick of the buckets not opened yet."""
        buckets, near = self._buckets, self._near
        while (not near or near.peekitem(0)[0] > now_ns) and buckets \
                and buckets.peekitem(0)[0] - BUCKET_NS + TICK_NS <= now_ns:
            end, slot = buckets.popitem(0)
            self._opened = max(self._opened, end)
            for owner, arr in slot.items():
                by_tick: list[list[int]] = [[] for _ in range(_TICKS)]
                for e in arr:
                    by_tick[e & _TICK_MASK].append(e >> _TICK_BITS)
                for tick, offsets in enumerate(by_tick):
                    if offsets:
                        fire = end - tick * TICK_NS
                        ticked = near.get(fire)
                        if ticked is None:
                            ticked = near[fire] = {}
                        listed = ticked.get(owner)
                        if listed is None:
                            ticked[owner] = offsets
                        else:
                            listed.extend(offsets)

    def pop_due(self, now_ns: int, limit: int | None = None) -> Iterator[tuple[Owner, list[int]]]:
        """Remove and yield the ``(owner, offsets)`` due at ``now_ns``, tick by tick,
        earliest first: all of them, or whole ticks until at least ``limit`` entries
        (buckets are opened as the ticks are reached, so a backlog of many buckets
        is split a bucket at a time)."""
        near = self._near
        n = 0
        while limit is None or n < limit:
            self.open_due(now_ns)
            if not near or near.peekitem(0)[0] > now_ns:
                return
            _, slot = near.popitem(0)
            for owner, offsets in slot.items():
                n += len(offsets)
                yield owner, offsets

    def drop_partition(self, partition: Owner) -> None:
        """Forget every entry of an owner (a partition whose topic is gone, or a
        deleted consumer's partition state)."""
        for level in (self._buckets, self._near):
            for b in list(level):
                slot = level[b]
                slot.pop(partition, None)
                if not slot:
                    del level[b]

    def entries(self) -> int:
        """Entries physically held (live or lazily deleted); for tests and stats."""
        return sum(len(a) for level in (self._buckets, self._near) for slot in level.values() for a in slot.values())


class ExpiryEngine:
    """Owns the deadline structures and the expiry task.

    Args:
        clock: the broker clock (deadlines are wall-clock ns; sleeping is on trio's
            clock, so a MockClock drives everything).
        expire: called with ``(partition, ttl_offsets, age_due, now_ns)`` for every
            partition with something due (``age_due``: its max-age check fell due); it
            removes what is due and returns the partition's next max-age deadline (or
            None).
    """

    def __init__(self, clock: Clock, expire: Callable[[Partition, list[int], bool, int], int | None]) -> None:
        self.clock = clock
        self.queue = DeadlineQueue()
        self._age: SortedDict = SortedDict()  # tick -> set of partitions
        self._age_armed: dict[Partition, int] = {}
        self._expire = expire
        self._wake = trio.Event()
        self._armed: int | None = None  # the tick the task sleeps until
        self.passes = 0
        #: How late the task woke for a tick (ns): the worst, and a histogram
        #: (``lag_counts[i]``: wakes with a lag of at most ``LAG_BUCKETS_NS[i]`` and
        #: more than the bound before it; the last slot is over every bound).
        self.lag_ns_max = 0
        self.lag_counts = [0] * (len(LAG_BUCKETS_NS) + 1)
        self.lag_ns_sum = 0
        #: Timer entries physically held (consumer redeliveries).
        self.timers = 0
        #: The event loop's longest stall and the garbage collector's pauses, measured
        #: while the task runs (a stall is what delays a bucket's pass).
        self.watch = LoopWatch()
        #: The pass under way: TTL offsets (and whether its max-age check fell due) by
        #: partition, and timer ids by owner, not yet handled.
        self._work: dict[Partition, _Due] = {}
        self._timer_work: dict[TimerOwner, list[int]] = {}
        #: Entries of the owners that run first (message schedules), not yet handled.
        self._first_work: dict[TimerOwner, list[int]] = {}
        self._queued = 0  # entries in _work and _timer_work
        #: A slice's budget (:data:`SLICE_NS`; None: a pass in one go), and slices run.
        self.slice_ns: int | None = SLICE_NS
        self.slices = 0

    # -- scheduling ------------------------------------------------------------------

    def _maybe_wake(self, bucket: int) -> None:
        if self._armed is None or bucket < self._armed:
            self._wake.set()

    def schedule_ttl(self, partition: Partition, offset: int, deadline_ns: int) -> None:
        self._maybe_wake(self.queue.add(deadline_ns, partition, offset))

    def schedule_timers(self, owner: TimerOwner, ids: Iterable[int], deadline_ns: int) -> int:
        """Timers for ``owner.timers_due(ids, now_ns)``: one entry per id, on
        :data:`TIMER_NS` ticks. Returns when they fire (an owner re-arms lazily:
        when an entry fires it checks the deadline it holds now)."""
        b = fire_time(deadline_ns, TIMER_NS)
        ids = list(ids)
        self.queue.add_timers(b, owner, ids)
        self.timers += len(ids)
        self._maybe_wake(b)
        return b

    def schedule_first(self, owner: TimerOwner, entry: int, deadline_ns: int) -> None:
        """An entry of an owner that runs before the TTL and max-age removals of its
        tick (a message schedule, ``_schedules.py``: its ``before_ttl`` is true); not
        counted as a consumer timer."""
        b = fire_time(deadline_ns)
        self.queue.add_timers(b, owner, (entry,))
        self._maybe_wake(b)

    def schedule_ttl_many(self, partition: Partition, offsets: list[int], deadline_ns: int) -> None:
        b = fire_time(deadline_ns)
        self.queue.add_many(b, partition, offsets)
        self._maybe_wake(b)

    def schedule_age(self, partition: Partition, deadline_ns: int | None) -> None:
        """Arm (or re-arm, or with None disarm) the partition's max-age check."""
        old = self._age_armed.pop(partition, None)
        if old is not None:
            parts = self._age.get(old)
            if parts is not None:
                parts.discard(partition)
                if not parts:
                    del self._age[old]
        if deadline_ns is None:
            return
        b = fire_time(deadline_ns)
        self._age_armed[partition] = b
        self._age.setdefault(b, set()).add(partition)
        self._maybe_wake(b)

    def age_armed(self, partition: Partition) -> int | None:
        return self._age_armed.get(partition)

    def forget(self, partition: Partition) -> None:
        entry = self._work.pop(partition, None)
        if entry is not None:
            self._queued -= len(entry.offsets)
        self.queue.drop_partition(partition)
        self.schedule_age(partition, None)

    def next_bucket(self) -> int | None:
        a = self.queue.first_bucket()
        b = self._age.peekitem(0)[0] if self._age else None
        if a is None:
            return b
        return a if b is None else min(a, b)

    # -- expiring --------------------------------------------------------------------

    def expire_due(self, now_ns: int, budget_ns: int | None = None) -> bool:
        """Take what is due at ``now_ns`` into the pass under way and work on it: all
        of it at once, or with ``budget_ns`` whole ticks, earliest first, about
        :data:`COLLECT` entries at a time, in chunks (:data:`CHUNK` entries of one
        partition) until a slice has run that long. Returns whether work is left
        (the task then lets the event loop run and calls again).

        A partition's TTL entries taken together are removed in offset order and its
        max-age check goes with its first chunk, so a subject emptied in several
        chunks gets its marker from the last one, for its newest message, as in one
        call. A backlog of many ticks (after a restart) goes tick by tick, as the
        ticks would have gone on time."""
        work, timers, first = self._work, self._timer_work, self._first_work
        grown: set[Partition] = set()
        # Take what is due a few chunks at a time (whole ticks, earliest first), so a
        # backlog (a restart after a long stop) is never opened and sorted at once.
        limit = None if budget_ns is None else COLLECT - self._queued
        if limit is None or limit > 0:
            for owner, offsets in self.queue.pop_due(now_ns, limit):
                self._queued += len(offsets)
                if not isinstance(owner, Partition):  # a timer owner's
                    (first if getattr(owner, "before_ttl", False) else timers).setdefault(owner, []).extend(offsets)
                    continue
                entry = work.get(owner)
                if entry is None:
                    work[owner] = _Due(offsets, False)
                else:
                    entry.offsets.extend(offsets)
                grown.add(owner)
        while self._age:
            b, parts = self._age.peekitem(0)
            if b > now_ns:
                break
            self._age.popitem(0)
            for p in parts:
                if self._age_armed.get(p) == b:
                    del self._age_armed[p]
                    grown.add(p)
                    entry = work.get(p)
                    if entry is None:
                        work[p] = _Due([], True)
                    else:
                        entry.age_due = True
        if grown:
            self.passes += 1
            for p in grown:
                work[p].offsets.sort(reverse=True)  # taken from the end: oldest first
        elif not (work or timers or first):
            return False
        start = perf_counter_ns()
        # Message schedules first: one due at the same tick as a TTL or max-age
        # removal fires before it (FLIP-25: user timers before TTL timers).
        while first:
            owner, ids = next(iter(first.items()))
            del first[owner]
            self._queued -= len(ids)
            owner.timers_due(ids, now_ns)
            if budget_ns is not None and perf_counter_ns() - start >= budget_ns:
                return True
        while work:
            part, entry = next(iter(work.items()))
            offsets, age_due = entry.offsets, entry.age_due
            chunk = offsets[-CHUNK:][::-1]
            del offsets[-CHUNK:]
            if not offsets:
                del work[part]
            entry.age_due = False
            self._queued -= len(chunk)
            next_age = self._expire(part, chunk, age_due, now_ns)
            if age_due or next_age is not None:
                self.schedule_age(part, next_age)
            if budget_ns is not None and perf_counter_ns() - start >= budget_ns:
                return True
        while timers:
            owner, ids = next(iter(timers.items()))
            chunk = ids[-CHUNK:]
            del ids[-CHUNK:]
            if not ids:
                del timers[owner]
            self._queued -= len(chunk)
            self.timers -= len(chunk)
            owner.timers_due(chunk, now_ns)
            if budget_ns is not None and perf_counter_ns() - start >= budget_ns:
                return True
        return False

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.watch.watching():
            task_status.started()
            await self._run()

    async def _run(self) -> None:
        while True:
            if self._work or self._timer_work or self._first_work:  # a pass under way: the loop ran, go on
                await trio.lowlevel.checkpoint()
                self.slices += 1
                self.expire_due(self.clock.now_ns(), self.slice_ns)
                continue
            b = self.next_bucket()
            self._armed = b
            self._wake = trio.Event()
            if b is None:
                await self._wake.wait()
                continue
            fire_ns = b
            # +1 us so that rounding between the two clocks never wakes us early.
            with trio.move_on_at(self.clock.to_trio(fire_ns) + 1e-6):
                await self._wake.wait()
                continue  # something earlier arrived: re-arm
            # The bucket is due by trio's clock; never let float rounding make it look
            # a few nanoseconds early (it would be skipped and the loop would spin).
            now = max(self.clock.now_ns(), fire_ns)
            # A bucket not opened yet wakes the task at its first tick: open it, and
            # measure the lag against what really fell due (perhaps nothing yet).
            self.queue.open_due(now)
            due = self.next_bucket()
            if due is None or due > now:
                continue
            self._lagged(now - due)
            self.slices += 1
            self.expire_due(now, self.slice_ns)

    def _lagged(self, lag_ns: int) -> None:
        if lag_ns > self.lag_ns_max:
            self.lag_ns_max = lag_ns
        self.lag_counts[bisect_left(LAG_BUCKETS_NS, lag_ns)] += 1
        self.lag_ns_sum += lag_ns
