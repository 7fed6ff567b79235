"""The consumer engine: every durable consumer, what it delivered, and what is settled.

One :class:`ConsumerEngine` per broker holds every :class:`~._model.Consumer`, by
topic (a :class:`~._journal.TopicJournal` each: the topic's consumers and their
journal). It registers as the core's ``TopicHooks``: it loads a topic's consumers
when the topic opens, and forgets them when it is deleted.

**Visibility**: a message is delivered only once its group commit is done
(``Partition.visible_next``): under ``fsync = "always"`` when the sync that made
its publish durable completes, otherwise at once. Work (a publish made something
visible, an ack freed room, a redelivery fell due) marks the consumer dirty and
wakes the engine's task, which fills waiting pulls (``_pulls.py``) in the next
pass of the event loop: nothing polls.

**Durability**: every change is an event in the topic's consumer journal
(``_journal.py``), written through the group commit like messages. The events
nobody waits for (deliveries, acks sent without sync) are *lazy*: they start no
sync of their own and go with the next one (``Committer.note_write``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import trio

from protocol import AckKind, ErrorCode, error_class

from broker.core import TIMER_NS, Broker, Partition, SyncSource, Topic, TopicConfig, TopicHooks, fire_time, get_logger

from ._dead_letters import DeadLetters, Prepared
from ._groups import GroupTimers
from ._journal import TopicJournal
from ._model import MS, Consumer, ConsumerEvents, ConsumerPartition, Member, PullRequest
from ._retention import appended as retention_appended
from ._retention import release, sweep
from ._pulls import PullTimers, fail, fill

__all__ = ["ConsumerEngine"]

log = get_logger(__name__)

_ACK = int(AckKind.ACK)
_TERM = int(AckKind.TERM)


def _watchers(part: Partition) -> list[ConsumerPartition]:
    """``part.watchers`` as the engine put them there: it is the only one that adds
    watchers, and it adds only consumers' partitions (:meth:`ConsumerEngine.attach`)."""
    return cast("list[ConsumerPartition]", part.watchers)


class ConsumerEngine(TopicHooks):
    """Args:
    broker: the broker (clock, committer, expiry engine, counters); the engine
        registers in its ``topic_hooks`` (before ``Broker.open`` recovers topics).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.clock = broker.clock
        self.counters = broker.counters
        self.committer = broker.committer
        self.expiry = broker.retention.engine
        #: Each topic's consumers and their journal.
        self.topics: dict[Topic, TopicJournal] = {}
        self._dirty: dict[Consumer, None] = {}
        self._wake = trio.Event()
        #: Partitions whose appends wait for a sync: ``partition -> (epoch, next)``.
        self._unsynced: dict[Partition, tuple[int, int]] = {}
        #: Topics with work-queue or interest retention to sweep once the engine runs.
        self._sweep: list[Topic] = []
        self.committer.on_synced.append(self._synced)
        self.pull_timers = PullTimers(self.expiry)
        self.group_timers = GroupTimers(self.clock, self.expiry)
        #: Who hears of creations, deletions, naks, terms and give-ups.
        self.events = ConsumerEvents()
        self.dead_letters = DeadLetters(self, self.journal_of, self.all_consumers)
        broker.topic_hooks.append(self)

    # -- topics (TopicHooks) ---------------------------------------------------------------

    def topic_opened(self, topic: Topic, recovering: bool) -> None:
        journal = self.topics[topic] = TopicJournal(self, topic)
        if recovering:
            for c in journal.load():
                self.attach(c)
                if topic.config.storage == "memory":
                    # Its messages did not survive the stop: the consumer's state is
                    # at the partition's new first offset - 1 (delivered and acked
                    # through it, nothing outstanding; see docs/semantics.md).
                    for cp in c.parts:
                        start = cp.part.log.next_offset
                        cp.purged(start)
                        cp.last_delivered = max(cp.last_delivered, start - 1)
            if topic.config.retention != "limits":
                self._sweep.append(topic)  # on the event loop, when the engine starts (run)
        self._watch_appends(topic)

    def topic_updated(self, topic: Topic, old: TopicConfig) -> None:
        if topic.config.retention != old.retention:
            self._watch_appends(topic)
            sweep(self, topic)

    def _watch_appends(self, topic: Topic) -> None:
        """An interest topic hears of every append, consumers or not (what nobody
        wants goes at once); other topics once a consumer attaches."""
        interest = topic.config.retention == "interest"
        for part in topic.partitions:
            part.hear_all_appends = interest
            if interest:
                part.on_append = self.appended

    def topic_deleted(self, topic: Topic) -> None:
        journal = self.topics.pop(topic, None)
        if journal is None:
            return
        for c in list(journal.consumers.values()):
            self.forget(c, f"topic {topic.full_name} was deleted")
        journal.close()

    def topic_closed(self, topic: Topic) -> None:
        journal = self.topics.get(topic)
        if journal is not None:
            journal.close()

    def sync_sources(self, topic: Topic) -> Iterable[SyncSource]:
        journal = self.topics.get(topic)
        return () if journal is None or journal.file is None else (journal.file,)

    def topic_info(self, topic: Topic) -> dict[str, Any]:
        journal = self.topics.get(topic)
        if journal is None or not journal.consumers:
            return {}
        return {"consumers": [c.summary() for _, c in sorted(journal.consumers.items())]}

    # -- bookkeeping -----------------------------------------------------------------

    def journal_of(self, topic: Topic) -> TopicJournal:
        return self.topics[topic]

    def consumers_of(self, topic: Topic) -> dict[str, Consumer]:
        """The topic's consumers by name."""
        return self.topics[topic].consumers

    def all_consumers(self) -> list[Consumer]:
        return [c for journal in self.topics.values() for c in journal.consumers.values()]

    def stats_values(self) -> dict[str, Any]:
        """What GET_STATS, ``/varz`` and ``/metrics`` show of the consumers."""
        consumers = self.all_consumers()
        return {
            "consumers": len(consumers),
            "consumer_num_pending": sum(c.num_pending for c in consumers),
            "consumer_num_ack_pending": sum(c.num_ack_pending for c in consumers),
            "consumer_num_redelivered": sum(c.num_redelivered for c in consumers),
            "consumer_num_waiting": sum(len(c.waiting) for c in consumers),
            "consumer_timers": self.expiry.timers,
        }

    def forget(self, c: Consumer, why: str) -> None:
        """Take a consumer out (deleted, or its topic is): its waiting pulls end with
        CONSUMER_NOT_FOUND, its members and timers go."""
        journal = self.topics.get(c.topic)
        if journal is not None:
            journal.consumers.pop(c.name, None)
            journal.forget(c)
        self.detach(c)
        self.events.deleted(c)
        for req in list(c.waiting):
            fail(req, error_class(ErrorCode.CONSUMER_NOT_FOUND)(why))
        for m in list(c.members.values()):
            if m.session is not None:
                m.session.members.pop(c, None)
        c.members.clear()

    def watch_member(self, m: Member) -> None:
        self.group_timers.watch(m)

    def new_member_serial(self) -> int:
        return self.group_timers.new_serial()

    def pull_retired(self, req: PullRequest) -> None:
        self.pull_timers.by_id.pop(req.id, None)

    def attach(self, c: Consumer) -> None:
        """Make the partitions tell the consumer about appends and removals."""
        for cp in c.parts:
            part = cp.part
            if not part.watchers:
                # Nobody tracked what is durable here: find out now.
                epoch = self.committer.durable_at() if self.committer.acks_wait and not part.log.volatile else 0
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
        (Iggy's auto-commit)."""
        offsets = c.topic.consumers
        if offsets is not None:
            offsets.store(c.name, cp.part.number, cp.last_delivered)
            self.committer.note_write(offsets)

    # -- appends and visibility ----------------------------------------------------------

    def appended(self, part: Partition, first: int, subjects: list[bytes]) -> None:
        """``Partition.on_append``: count what matches, and make it visible once durable
        (with interest retention, what no consumer wants goes at once)."""
        watchers = _watchers(part)
        for cp in watchers:
            cp.appended(first, subjects)
        if part.topic.config.retention == "interest":
            retention_appended(self, part, first, subjects)
        nxt = part.log.next_offset
        if self.committer.acks_wait and not part.log.volatile:  # (memory storage: nothing to wait for)
            self._unsynced[part] = (self.committer.epoch, nxt)
        else:
            part.visible_next = nxt
            for cp in watchers:
                self.kick(cp.consumer)

    def _synced(self, epoch: int) -> None:
        if not self._unsynced:
            return
        done = [p for p, (e, _) in self._unsynced.items() if e <= epoch]
        for part in done:
            _, nxt = self._unsynced.pop(part)
            part.visible_next = max(part.visible_next, nxt)
            for cp in _watchers(part):
                self.kick(cp.consumer)

    # -- the task ------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        recovered, self._sweep = self._sweep, []
        try:
            self.dead_letters.recover()  # (before the sweep: an original goes once its copy is stored)
        except Exception:
            log.error("dead_letter_recovery_failed", exc_info=True)
        for topic in recovered:  # what a crash left between a settle and its removal
            if topic in self.topics:
                sweep(self, topic)
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

    def settle(
        self, c: Consumer, entries: Iterable[tuple[int, int, int, int]], wait: bool = True,
        reasons: dict[tuple[int, int], str] | None = None,
    ) -> int:
        """Apply ack entries ``(kind, partition, offset, delay_ms)``; returns the
        journal epoch (0 when nothing changed, or when ``wait`` is False: nobody
        waits for the answer, and the event goes with the next sync). Unknown or
        settled offsets are ignored (settling twice is harmless). A NAK without a
        delay of a message delivered ``max_deliver`` times gives it up (as its ack
        wait running out would). ``reasons``: the text a client gave with a term,
        by ``(partition, offset)`` (for :attr:`events`)."""
        now = self.clock.now_ns()
        parts = c.parts
        n = len(parts)
        changes: list[int] = []
        ack_all = c.config.ack_policy == "all"
        counters = self.counters
        acked = 0
        freed = False  # beyond ``acked``: room or work for a pull (a term, a NAK due now)
        termed = False
        events = self.events
        heard: list[tuple[int, int, int, int, int]] = []  # (kind, partition, offset, dseq, deliveries)
        gave_up: dict[int, list[int]] = {}
        max_deliver = c.config.max_deliver
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
                e = out.get(o)
                if e is None:
                    continue
                cp._drop(o)
                changes += (pn, kind, o, 0)
                counters.consumer_terminated += 1
                heard.append((kind, pn, o, e.dseq, e.count))
                freed = termed = True
                continue
            e = out.get(o)
            if e is None:
                continue
            if kind == AckKind.NAK:
                counters.consumer_naked += 1
                heard.append((kind, pn, o, e.dseq, e.count))
                if not delay and max_deliver != -1 and e.count >= max_deliver:
                    gave_up.setdefault(pn, []).append(o)  # (no redelivery: given up below)
                    continue
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
        epoch = 0
        held: set[tuple[int, int]] = set()
        if termed and c.config.dead_letter_subject:
            terms: dict[int, list[tuple[int, int]]] = {}
            for kind, pn, o, _, count in heard:
                if kind == _TERM:
                    terms.setdefault(pn, []).append((o, count))
            for pn, items in terms.items():
                held.update((pn, o) for o in self.dead_letter(c, pn, items, "Terminated"))
        if changes:
            epoch = self.journal_of(c.topic).write(["a", c.id, changes], lazy=not wait and not held)
            if c.topic.config.retention != "limits":
                self._release(c, changes, held)
        for kind, pn, o, dseq, count in heard:
            if kind == _TERM:
                events.terminated(c, pn, o, dseq, count, reasons.get((pn, o), "") if reasons else "")
            else:
                events.naked(c, pn, o, dseq, count)
        for pn, offsets in gave_up.items():
            epoch = max(epoch, parts[pn].give_up(offsets))
        return epoch

    def _release(self, c: Consumer, changes: list[int], held: set[tuple[int, int]]) -> None:
        """The acks and terms among ``changes`` (quads: partition, kind, offset, _)
        settled their messages (work-queue and interest retention), but for ``held``
        (dead letters: released once their copy is stored)."""
        by_part: dict[int, list[int]] = {}
        for i in range(0, len(changes), 4):
            if changes[i + 1] in (_ACK, _TERM) and (not held or (changes[i], changes[i + 2]) not in held):
                by_part.setdefault(changes[i], []).append(changes[i + 2])
        for pn, offsets in by_part.items():
            release(self, c, pn, offsets)

    def dead_letter(self, c: Consumer, partition: int, items: list[tuple[int, int]], reason: str) -> set[int]:
        return self.dead_letters.copy(c, partition, items, reason)

    def dead_letter_removing(self, c: Consumer, partition: int, items: list[tuple[int, int]], reason: str) -> object:
        return self.dead_letters.removing(c, partition, items, reason)

    def dead_letter_removed(self, prepared: object) -> None:
        self.dead_letters.removed(cast(Prepared, prepared))

    def released(self, c: Consumer, partition: int, offsets: list[int]) -> None:
        """``c`` settled ``offsets`` of a partition other than by an ack (deliveries
        given up after max_deliver)."""
        release(self, c, partition, offsets)
