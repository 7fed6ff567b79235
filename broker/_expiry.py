"""Expiry: the deadline structure and the one task that removes what falls due.

**The deadline structure** (:class:`DeadlineQueue`) holds every pending per-message
TTL. It is a ``sortedcontainers.SortedDict`` of *buckets* keyed by the time they
fire: a deadline ``d`` (wall-clock ns) goes to the bucket firing at ``ceil(d / 100 ms)
* 100 ms``. That is never before any deadline in it and at most 100 ms after
(decision 10.15: never early, within 100 ms; the NATS server ticks at 250 ms). A
bucket maps each partition to an ``array('Q')`` of offsets, so a pending TTL costs
8 bytes plus its share of the bucket, however many there are.

Taking an entry out (delete, purge, rollup, max age removing the message first) is
O(1). The partition's per-offset PENDING flag is cleared and the count drops; the
offset itself stays in its bucket and is skipped when the bucket fires. That is
trio's own lazy deletion (commit ``a47fbc7b``), and it keeps removal cheaper than
finding an entry in a sorted structure.

**Max age** needs no per-message entry. Timestamps never decrease within a
partition, so its oldest live message (ignoring ``never`` ones) always has the
earliest max-age deadline. Each partition keeps at most one armed check, in
``_age`` (also a ``SortedDict`` of buckets), and a pass re-arms it for the next
oldest.

**Consumer timers** (redelivery after an ack wait or a nak delay, SEMANTICS 12.4)
live in the same structure, one entry per outstanding message in 10 ms buckets
(:data:`TIMER_NS`), owned by a consumer's partition state, which the pass calls back
(``timers_due``). An owner re-arms lazily: ``in_progress`` only records the new
deadline, and the entry, when it fires, re-arms itself once if the deadline moved.

**The task** (:class:`ExpiryEngine.run`) sleeps until the earliest bucket of either
structure. It is woken and re-armed when something earlier arrives, so a flood of
long TTLs never delays a short one. When it wakes it expires everything due, in one
pass per partition (markers included).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import trio
from sortedcontainers import SortedDict

if TYPE_CHECKING:
    from ._clock import Clock
    from ._partition import Partition

__all__ = ["DeadlineQueue", "ExpiryEngine", "BUCKET_NS", "TIMER_NS", "LAG_BUCKETS_NS", "fire_time"]

#: Bucket width: the most a removal can lag its deadline (decision 10.15).
BUCKET_NS = 100_000_000
#: Bucket width of timers (consumer redeliveries): finer, since an application
#: waits on them (redelivery never early, p99 within 50 ms).
TIMER_NS = 10_000_000
#: Upper bounds (ns, inclusive) of the expiry lag histogram's buckets: how long after
#: its bucket's time a pass ran. Lag comes from a busy event loop (a long handler,
#: a garbage collection), so the buckets span 1 ms to 10 s.
LAG_BUCKETS_NS = tuple(ms * 1_000_000 for ms in (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000))


def fire_time(deadline_ns: int, width: int = BUCKET_NS) -> int:
    """When the bucket holding ``deadline_ns`` fires: never before it, at most
    ``width`` after."""
    return -(-deadline_ns // width) * width


class DeadlineQueue:
    """Pending per-message expiries (and consumer timers), ordered by the time their
    bucket fires. A bucket maps an owner (a partition for TTLs, a consumer's
    partition state for timers) to an ``array('Q')`` of offsets."""

    def __init__(self) -> None:
        self._buckets: SortedDict = SortedDict()  # fire time (ns) -> {owner: array('Q')}
        #: Live pending entries (entries of removed messages are not counted).
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, deadline_ns: int, partition: Partition, offset: int) -> int:
        """Schedule ``offset`` of ``partition``; returns when its bucket fires.

        Runtime complexity: O(log buckets).
        """
        b = self.add_timer(fire_time(deadline_ns), partition, offset)
        self.count += 1
        return b

    def add_timer(self, fire_ns: int, owner: object, offset: int) -> int:
        """Schedule a timer entry (not counted as a pending TTL) firing at ``fire_ns``."""
        b = fire_ns
        slot = self._buckets.get(b)
        if slot is None:
            slot = self._buckets[b] = {}
        offsets = slot.get(owner)
        if offsets is None:
            offsets = slot[owner] = array("Q")
        offsets.append(offset)
        return b

    def add_many(self, bucket: int, partition: Partition, offsets: list[int]) -> None:
        """Schedule several offsets of one partition in one bucket (its fire time)."""
        slot = self._buckets.get(bucket)
        if slot is None:
            slot = self._buckets[bucket] = {}
        arr = slot.get(partition)
        if arr is None:
            slot[partition] = array("Q", offsets)
        else:
            arr.extend(offsets)
        self.count += len(offsets)

    def discarded(self, n: int = 1) -> None:
        """``n`` pending entries were taken out (their messages removed first)."""
        self.count -= n

    def first_bucket(self) -> int | None:
        """When the first bucket fires. Runtime complexity: O(1)."""
        return self._buckets.peekitem(0)[0] if self._buckets else None

    def pop_due(self, now_ns: int) -> Iterator[tuple[object, array]]:
        """Remove and yield every ``(owner, offsets)`` of buckets due at ``now_ns``."""
        buckets = self._buckets
        while buckets:
            b, slot = buckets.peekitem(0)
            if b > now_ns:
                return
            buckets.popitem(0)
            yield from slot.items()

    def drop_partition(self, partition: object) -> None:
        """Forget every entry of an owner (a partition whose topic is gone, or a
        deleted consumer's partition state)."""
        for b in list(self._buckets):
            slot = self._buckets[b]
            slot.pop(partition, None)
            if not slot:
                del self._buckets[b]

    def entries(self) -> int:
        """Entries physically held (live or lazily deleted); for tests and stats."""
        return sum(len(a) for slot in self._buckets.values() for a in slot.values())


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
        self._age: SortedDict = SortedDict()  # bucket -> set of partitions
        self._age_armed: dict[Partition, int] = {}
        self._expire = expire
        self._wake = trio.Event()
        self._armed: int | None = None  # the bucket the task sleeps until
        self.passes = 0
        #: How late the task woke for a bucket (ns): the worst, and a histogram
        #: (``lag_counts[i]``: wakes with a lag of at most ``LAG_BUCKETS_NS[i]`` and
        #: more than the bound before it; the last slot is over every bound).
        self.lag_ns_max = 0
        self.lag_counts = [0] * (len(LAG_BUCKETS_NS) + 1)
        self.lag_ns_sum = 0
        #: Timer entries physically held (consumer redeliveries).
        self.timers = 0

    # -- scheduling ------------------------------------------------------------------

    def _maybe_wake(self, bucket: int) -> None:
        if self._armed is None or bucket < self._armed:
            self._wake.set()

    def schedule_ttl(self, partition: Partition, offset: int, deadline_ns: int) -> None:
        self._maybe_wake(self.queue.add(deadline_ns, partition, offset))

    def schedule_timers(self, owner: object, ids: Iterable[int], deadline_ns: int) -> int:
        """Timers for ``owner.timers_due(ids, now_ns)``: one entry per id, in
        :data:`TIMER_NS` buckets. Returns when they fire (an owner re-arms lazily:
        when an entry fires it checks the deadline it holds now)."""
        b = fire_time(deadline_ns, TIMER_NS)
        q = self.queue
        for i in ids:
            q.add_timer(b, owner, i)
            self.timers += 1
        self._maybe_wake(b)
        return b

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
        self.queue.drop_partition(partition)
        self.schedule_age(partition, None)

    def next_bucket(self) -> int | None:
        a = self.queue.first_bucket()
        b = self._age.peekitem(0)[0] if self._age else None
        if a is None:
            return b
        return a if b is None else min(a, b)

    # -- expiring --------------------------------------------------------------------

    def expire_due(self, now_ns: int) -> int:
        """Expire everything due at ``now_ns`` (one pass). Returns partitions touched."""
        due: dict[Partition, list[int]] = {}
        timers: dict[object, list[int]] = {}
        for owner, offsets in self.queue.pop_due(now_ns):
            if hasattr(owner, "timers_due"):
                timers.setdefault(owner, []).extend(offsets)
            else:
                due.setdefault(owner, []).extend(offsets)  # type: ignore[arg-type]
        age_due: set[Partition] = set()
        while self._age:
            b, parts = self._age.peekitem(0)
            if b > now_ns:
                break
            self._age.popitem(0)
            for p in parts:
                if self._age_armed.get(p) == b:
                    del self._age_armed[p]
                    age_due.add(p)
        for part in due.keys() | age_due:
            next_age = self._expire(part, due.get(part, []), part in age_due, now_ns)
            if part in age_due or next_age is not None:
                self.schedule_age(part, next_age)
        for owner, offsets in timers.items():
            self.timers -= len(offsets)
            owner.timers_due(offsets, now_ns)  # type: ignore[attr-defined]
        if due or age_due:
            self.passes += 1
        return len(due.keys() | age_due)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
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
            self._lagged(now - fire_ns)
            self.expire_due(now)

    def _lagged(self, lag_ns: int) -> None:
        if lag_ns > self.lag_ns_max:
            self.lag_ns_max = lag_ns
        self.lag_counts[bisect_left(LAG_BUCKETS_NS, lag_ns)] += 1
        self.lag_ns_sum += lag_ns
