"""The consumer engine: durable consumers, what they delivered, and what is settled.

One :class:`ConsumerEngine` per broker holds every :class:`Consumer`. A consumer
reads one topic, across its partitions, and keeps per partition a
:class:`ConsumerPartition`:

* ``cursor``: the next offset to look at for a first delivery (everything below
  it was delivered, or does not match, or is gone);
* ``out``: the outstanding deliveries, ``offset -> Outstanding`` (delivery count,
  delivery sequence, ack deadline), in offset order;
* ``redeliver``: outstanding offsets due again (nak, or the ack wait ran out),
  which go out before anything new (SEMANTICS 11.2);
* ``npending``: live matching messages at or past the cursor, kept exact by every
  append, delivery and removal (the counters of 11.4 are exact at every moment,
  unlike the server's, 11.7).

**Removals** reach the engine through the partition (``Partition.watchers``): a
message removed before delivery leaves ``npending``; one removed while outstanding
is dropped as if terminated; a whole purge drops everything outstanding and moves
the cursor to the purge point (SEMANTICS 11.5).

**Timers**: each outstanding delivery has one entry in the expiry engine's
deadline structure (10 ms buckets), re-armed lazily (``in_progress`` only moves
the deadline; the entry re-arms itself when it fires). When one fires for real the
message goes to ``redeliver``, or, after ``max_deliver`` deliveries, is given up.

**Visibility**: a message is delivered only once its group commit is done
(``Partition.visible_next``): under ``fsync = "always"`` when the sync that made
its publish durable completes, otherwise at once. Work (a publish made something
visible, an ack freed room, a redelivery fell due) marks the consumer dirty and
wakes the engine's task, which fills waiting pulls (``_pulls.py``) in the next
pass of the event loop: nothing polls.

**Durability** (decision 12.5): every change is an event in the topic's consumer
journal (``_consumer_journal.py``), written through the group commit like messages.
The events nobody waits for (deliveries, acks sent without sync) are *lazy*: they start
no sync of their own and go with the next one (``Committer.note_write``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio

from protocol import AckKind, subject_matches

from ._config import ConsumerConfig
from broker.core._expiry import TIMER_NS, fire_time
from broker.core._log import get_logger

if TYPE_CHECKING:
    from broker.core._broker import Broker
    from broker.core._catalog import Topic
    from ._journal import TopicJournal
    from ._groups import Member
    from broker.core._partition import Partition
    from ._pulls import PullRequest

__all__ = ["ConsumerEngine", "Consumer", "ConsumerPartition", "Outstanding"]

log = get_logger(__name__)

MS = 1_000_000
_ACK = int(AckKind.ACK)
_TERM = int(AckKind.TERM)


class Outstanding:
    """One delivered, unsettled message."""

    __slots__ = ("count", "dseq", "deadline", "fire")

    def __init__(self, count: int, dseq: int, deadline: int, fire: int) -> None:
        self.count = count  # deliveries so far
        self.dseq = dseq  # the consumer's delivery sequence of the last delivery
        self.deadline = deadline  # when it is due again (ns, wall clock)
        self.fire = fire  # when its armed timer entry fires (0: none, it is in ``redeliver``)


class ConsumerPartition:
    """A consumer's state in one partition (the owner of its timer entries)."""

    def __init__(self, consumer: Consumer, part: Partition) -> None:
        self.consumer = consumer
        self.part = part
        self.cursor = 1
        self.out: dict[int, Outstanding] = {}
        self.redeliver: dict[int, None] = {}
        self.npending = 0
        self.num_redelivered = 0
        #: ``last_per_subject``: below ``only_until``, only these offsets are delivered.
        self.only: set[int] | None = None
        self.only_until = 0
        self.last_delivered = 0
        #: Partitioned mode: the member that owns it, and whether it is moving away
        #: (its owner gets nothing new until what it holds is settled).
        self.owner: Member | None = None
        self.draining = False
        self._ids: set[int] = set()
        self._ids_version = -1

    def __repr__(self) -> str:
        return f"ConsumerPartition({self.consumer.name}@{self.part!r})"

    # -- matching ------------------------------------------------------------------

    def wanted(self) -> Any:
        """A predicate on offsets for first deliveries (filter and ``only``)."""
        c = self.consumer
        only, until = self.only, self.only_until
        if c.match_all:
            if only is None:
                return None
            return lambda o: o >= until or o in only
        index = self.part.index
        if self._ids_version != index.version:
            self._ids = index.matching_ids(c.matches)
            self._ids_version = index.version
        ids = self._ids
        seq = index.seq  # ``index.sid_at`` written out: one call a record, not two
        base = index.base
        limit = index.end
        if only is None:
            return lambda o: base <= o < limit and seq[o - base] in ids
        return lambda o: base <= o < limit and seq[o - base] in ids and (o >= until or o in only)

    def counts(self, offset: int, subject: bytes) -> bool:
        """Does a live message at ``offset`` count in ``npending``?"""
        if offset < self.cursor or not self.consumer.match(subject):
            return False
        return self.only is None or offset >= self.only_until or offset in self.only

    def count_from(self, start: int) -> int:
        """Live messages from ``start`` on that would be delivered (a walk: used at
        creation and recovery only)."""
        log_ = self.part.log
        end = log_.next_offset
        first = log_.first_offset or end
        start = max(start, first)
        if start <= first and self.only is None:
            # Everything live counts: the subject index knows how many, no walk.
            if self.consumer.match_all:
                return log_.live_count
            match = self.consumer.match
            return sum(st.count for s, st in self.part.index.subjects.items() if st.count and match(s))
        wanted = self.wanted()
        if wanted is None:
            return log_.live_count_from(start)
        n = 0
        is_live = log_.is_live
        for o in range(start, end):
            if is_live(o) and (wanted is None or wanted(o)):
                n += 1
        return n

    @property
    def ack_floor(self) -> int:
        if self.out:
            return min(self.out) - 1
        return max(self.cursor - 1, 0)

    # -- removals (Partition.watchers) ---------------------------------------------

    def removed(self, offsets: list[int], subjects: list[bytes]) -> None:
        out = self.out
        for o, s in zip(offsets, subjects):
            if o in out:
                self._drop(o)
                self.consumer.engine.counters.consumer_dropped += 1
            elif self.counts(o, s):
                self.npending -= 1
                if self.only is not None:
                    self.only.discard(o)
        self.consumer.engine.kick(self.consumer)

    def purged(self, next_offset: int) -> None:
        n = len(self.out)
        for o in list(self.out):
            self._drop(o)
        self.consumer.engine.counters.consumer_dropped += n
        self.cursor = max(self.cursor, next_offset)
        self.npending = 0
        self.only = None
        self.consumer.engine.kick(self.consumer)

    def appended(self, first: int, subjects: list[bytes]) -> None:
        c = self.consumer
        if c.match_all:
            self.npending += len(subjects)
        else:
            match = c.match
            self.npending += sum(1 for s in subjects if match(s))

    def _drop(self, offset: int) -> None:
        e = self.out.pop(offset, None)
        if e is None:
            return
        self.redeliver.pop(offset, None)
        if e.count > 1:
            self.num_redelivered -= 1

    # -- timers (the expiry engine calls back) ---------------------------------------

    def timers_due(self, offsets: Iterable[int], now_ns: int) -> None:
        c = self.consumer
        if c.deleted:
            return
        engine = c.engine
        out = self.out
        max_deliver = c.config.max_deliver
        gave_up: list[int] = []
        due = False
        for o in offsets:
            e = out.get(o)
            if e is None or not e.fire or e.fire > now_ns:
                continue  # settled, or a stale entry (a later one is armed)
            if e.deadline > now_ns:  # in progress moved it: re-arm once
                e.fire = engine.arm(self, [o], e.deadline)
                continue
            e.fire = 0
            if max_deliver != -1 and e.count >= max_deliver:
                gave_up.append(o)
                continue
            self.redeliver[o] = None
            due = True
        if gave_up:
            for o in gave_up:
                self._drop(o)
            engine.counters.consumer_given_up += len(gave_up)
            engine.journal_of(c.topic).settled(c, self.part.number, AckKind.TERM, gave_up)
            log.debug("max_deliver_reached", consumer=c.name, partition=self.part.number, offsets=len(gave_up))
        if due or gave_up:
            engine.kick(c)


class Consumer:
    def __init__(self, engine: ConsumerEngine, topic: Topic, cid: int, name: str, config: ConsumerConfig, created_ns: int) -> None:
        self.engine = engine
        self.topic = topic
        self.id = cid
        self.name = name
        self.created_ns = created_ns
        self.parts = [ConsumerPartition(self, p) for p in topic.partitions]
        self.dseq = 0
        self.waiting: deque[PullRequest] = deque()
        self.members: dict[str, Member] = {}
        self.deleted = False
        self.rotate = 0
        self._match_cache: dict[bytes, bool] = {}
        #: When a message was last delivered and last acknowledged (or terminated),
        #: 0: not since the broker started (nats-server's ``ldt`` and ``lat``, which it
        #: does not keep across a restart either).
        self.delivered_at = 0
        self.acked_at = 0
        self.config = config

    @property
    def config(self) -> ConsumerConfig:
        return self._config

    @config.setter
    def config(self, value: ConsumerConfig) -> None:
        self._config = value
        self.filters = [tuple(f.split(".")) for f in value.filter_subjects]
        self.match_all = not self.filters or any(f == (">",) for f in self.filters)
        self._match_cache = {}
        for cp in self.parts:
            cp._ids_version = -1

    def matches(self, subject: bytes) -> bool:
        tokens = subject.decode(errors="replace").split(".")
        return any(subject_matches(f, tokens) for f in self.filters)

    def match(self, subject: bytes) -> bool:
        if self.match_all:
            return True
        hit = self._match_cache.get(subject)
        if hit is None:
            if len(self._match_cache) > 100_000:
                self._match_cache = {}
            hit = self._match_cache[subject] = self.matches(subject)
        return hit

    @property
    def num_pending(self) -> int:
        return sum(cp.npending for cp in self.parts)

    @property
    def num_ack_pending(self) -> int:
        return sum(len(cp.out) for cp in self.parts)

    @property
    def num_redelivered(self) -> int:
        return sum(cp.num_redelivered for cp in self.parts)

    def room(self) -> int:
        """How many more may be outstanding (max_ack_pending)."""
        if self.config.ack_policy == "none":
            return 1 << 62
        m = self.config.max_ack_pending
        if m == -1:
            return 1 << 62
        return m - self.num_ack_pending

    def info(self) -> dict[str, Any]:
        parts = []
        for cp in self.parts:
            d: dict[str, Any] = {
                "partition": cp.part.number,
                "delivered": cp.last_delivered,
                "cursor": cp.cursor,
                "ack_floor": cp.ack_floor,
                "num_pending": cp.npending,
                "num_ack_pending": len(cp.out),
                "num_redelivered": cp.num_redelivered,
            }
            if self.config.mode == "partitioned":
                d["owner"] = cp.owner.name if cp.owner is not None else None
                d["draining"] = cp.draining
            parts.append(d)
        out: dict[str, Any] = {
            "name": self.name,
            "stream": self.topic.stream.name,
            "topic": self.topic.name,
            "created": self.created_ns,
            "config": self.config.to_map(),
            "num_pending": self.num_pending,
            "num_ack_pending": self.num_ack_pending,
            "num_redelivered": self.num_redelivered,
            "num_waiting": len(self.waiting),
            "delivered": {"consumer_seq": self.dseq, "stream_seq": max((cp.last_delivered for cp in self.parts), default=0)},
            "ack_floor": {
                "consumer_seq": self._ack_floor_dseq(),
                "stream_seq": min((cp.ack_floor for cp in self.parts), default=0),
            },
            "partitions": parts,
        }
        if self.config.mode == "partitioned":
            out["members"] = [
                {"name": m.name, "partitions": sorted(cp.part.number for cp in self.parts if cp.owner is m),
                 "pulls": m.pulls, "connected": m.session is not None}
                for m in sorted(self.members.values(), key=lambda m: m.name)
            ]
        return out

    def summary(self) -> dict[str, Any]:
        """What ``topic info`` and ``stats`` show of it."""
        return {
            "name": self.name,
            "num_pending": self.num_pending,
            "num_ack_pending": self.num_ack_pending,
            "num_redelivered": self.num_redelivered,
            "num_waiting": len(self.waiting),
            "delivered": self.dseq,
            "ack_floor": [cp.ack_floor for cp in self.parts],
        }

    def _ack_floor_dseq(self) -> int:
        lowest = [e.dseq for cp in self.parts for e in cp.out.values()]
        return (min(lowest) - 1) if lowest else self.dseq


class ConsumerEngine:
    """Args:
    broker: the broker (clock, committer, expiry engine, counters).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.clock = broker.clock
        self.counters = broker.counters
        self.committer = broker.committer
        self.expiry = broker.retention.engine
        self._dirty: dict[Consumer, None] = {}
        self._wake = trio.Event()
        #: Partitions whose appends wait for a sync: ``partition -> (epoch, next)``.
        self._unsynced: dict[Partition, tuple[int, int]] = {}
        self.committer.on_synced.append(self._synced)
        from ._groups import GroupTimers
        from ._pulls import PullTimers

        self.pull_timers = PullTimers()
        self.group_timers = GroupTimers(self)

    # -- bookkeeping -----------------------------------------------------------------

    def journal_of(self, topic: Topic) -> TopicJournal:
        return topic.consumer_journal  # type: ignore[no-any-return]

    def attach(self, c: Consumer) -> None:
        """Make the partitions tell the consumer about appends and removals."""
        for cp in c.parts:
            part = cp.part
            if not part.watchers:
                # Nobody tracked what is durable here: find out now.
                epoch = self.committer.durable_at() if self.committer.acks_wait else 0
                if epoch:
                    self._unsynced[part] = (epoch, part.log.next_offset)
                else:
                    part.visible_next = part.log.next_offset
            part.watchers.append(cp)
            part.on_append = self.appended

    def detach(self, c: Consumer) -> None:
        c.deleted = True
        for cp in c.parts:
            if cp in cp.part.watchers:
                cp.part.watchers.remove(cp)
            self.expiry.queue.drop_partition(cp)
        self._dirty.pop(c, None)

    @property
    def filling(self) -> bool:
        """Some consumer has waiting pulls to fill in the engine's next pass."""
        return bool(self._dirty)

    def kick(self, c: Consumer) -> None:
        """Something changed: fill the consumer's waiting pulls in the next pass."""
        if c.waiting and c not in self._dirty:
            self._dirty[c] = None
            if not self._wake.is_set():
                self._wake.set()

    def arm(self, cp: ConsumerPartition, offsets: list[int], deadline: int) -> int:
        """One timer entry per offset, all at ``deadline``; returns when it fires."""
        return self.expiry.schedule_timers(cp, offsets, deadline)

    def broker_offsets_store(self, c: Consumer, cp: ConsumerPartition) -> None:
        """``ack_policy: none`` advances the consumer's stored offset as it delivers
        (Iggy's auto-commit, decision 12.6)."""
        offsets = c.topic.consumers
        if offsets is not None:
            offsets.store(c.name, cp.part.number, cp.last_delivered)
            self.committer.note_write(offsets)

    # -- appends and visibility ----------------------------------------------------------

    def appended(self, part: Partition, first: int, subjects: list[bytes]) -> None:
        """``Partition.on_append``: count what matches, and make it visible once durable."""
        for cp in part.watchers:
            cp.appended(first, subjects)
        nxt = part.log.next_offset
        if self.committer.acks_wait:
            self._unsynced[part] = (self.committer.epoch, nxt)
        else:
            part.visible_next = nxt
            for cp in part.watchers:
                self.kick(cp.consumer)

    def _synced(self, epoch: int) -> None:
        if not self._unsynced:
            return
        done = [p for p, (e, _) in self._unsynced.items() if e <= epoch]
        for part in done:
            _, nxt = self._unsynced.pop(part)
            part.visible_next = max(part.visible_next, nxt)
            for cp in part.watchers:
                self.kick(cp.consumer)

    # -- the task ------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from ._pulls import fill

        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            dirty, self._dirty = self._dirty, {}
            for c in dirty:
                if not c.deleted:
                    try:
                        fill(self, c)
                    except Exception:
                        log.error("consumer_fill_failed", consumer=c.name, exc_info=True)

    # -- settling ------------------------------------------------------------------------

    def settle(self, c: Consumer, entries: Iterable[tuple[int, int, int, int]], wait: bool = True) -> int:
        """Apply ack entries ``(kind, partition, offset, delay_ms)``; returns the
        journal epoch (0 when nothing changed, or when ``wait`` is False: nobody
        waits for the answer, and the event goes with the next sync). Unknown or
        settled offsets are ignored (settling twice is harmless, SEMANTICS 11.3)."""
        now = self.clock.now_ns()
        parts = c.parts
        n = len(parts)
        changes: list[int] = []
        ack_all = c.config.ack_policy == "all"
        counters = self.counters
        acked = 0
        freed = False  # beyond ``acked``: room or work for a pull (a term, a NAK due now)
        termed = False
        for kind, pn, o, delay in entries:
            if pn >= n:
                continue
            cp = parts[pn]
            out = cp.out
            if kind == _ACK and not ack_all:  # the common case: _drop, inline
                e = out.pop(o, None)
                if e is None:
                    continue
                if cp.redeliver:
                    cp.redeliver.pop(o, None)
                if e.count > 1:
                    cp.num_redelivered -= 1
                changes += (pn, _ACK, o, 0)
                acked += 1
                continue
            if kind == _ACK or kind == _TERM:
                if ack_all and kind == _ACK:
                    doomed = [k for k in out if k <= o]
                    for k in doomed:
                        cp._drop(k)
                        changes += (pn, kind, k, 0)
                    acked += len(doomed)
                    continue
                if o not in out:
                    continue
                cp._drop(o)
                changes += (pn, kind, o, 0)
                counters.consumer_terminated += 1
                freed = termed = True
                continue
            e = out.get(o)
            if e is None:
                continue
            if kind == AckKind.NAK:
                counters.consumer_naked += 1
                if delay:
                    e.deadline = now + delay * MS
                    cp.redeliver.pop(o, None)
                    if not e.fire or fire_time(e.deadline, TIMER_NS) < e.fire:
                        e.fire = self.arm(cp, [o], e.deadline)
                else:
                    e.deadline = now
                    e.fire = 0
                    cp.redeliver[o] = None
                    freed = True
                changes += (pn, kind, o, e.deadline // MS)
            else:  # IN_PROGRESS: a new deadline in O(1); the entry re-arms when it fires
                e.deadline = now + c.config.wait_ns(e.count)
                if o in cp.redeliver:
                    del cp.redeliver[o]
                    e.fire = self.arm(cp, [o], e.deadline)
                changes += (pn, kind, o, e.deadline // MS)
        counters.consumer_acked += acked
        if acked or termed:
            c.acked_at = now
        if acked or freed:
            self.kick(c)
        if not changes:
            return 0
        return self.journal_of(c.topic).write(["a", c.id, changes], lazy=not wait)
