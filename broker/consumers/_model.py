"""Durable consumers, as data: a :class:`Consumer` of one topic, its state per
partition (:class:`ConsumerPartition`), its outstanding deliveries
(:class:`Outstanding`), its waiting pulls (:class:`PullRequest`) and its group
members (:class:`Member`). These objects point at one another, so they live in one
module; what they ask of the engine that holds them is the :class:`Engine`
protocol (``ConsumerEngine``, in ``_engine.py``, is the class that fits: the model
does not import the engine, which imports the model).

Per partition a consumer keeps:

* ``cursor``: the next offset to look at for a first delivery (everything below
  it was delivered, or does not match, or is gone);
* ``out``: the outstanding deliveries, ``offset -> Outstanding`` (delivery count,
  delivery sequence, ack deadline), in offset order;
* ``redeliver``: outstanding offsets due again (nak, or the ack wait ran out),
  which go out before anything new (docs/semantics.md, "Consumers");
* ``npending``: live matching messages at or past the cursor, kept exact by every
  append, delivery and removal (exact at every moment, unlike nats-server's
  counters).

**Removals** reach a consumer through the partition (``Partition.watchers``): a
message removed before delivery leaves ``npending``; one removed while outstanding
is dropped as if terminated; a whole purge drops everything outstanding and moves
the cursor to the purge point. With ``dead_letter_expired``, what a TTL, the max age
or a limit removes while the consumer still owes it is dead-lettered first
(``removing``, while it is still readable).

**Timers**: each outstanding delivery has one entry in the expiry engine's deadline
structure (10 ms buckets), re-armed lazily (``in_progress`` only moves the deadline;
the entry re-arms itself when it fires). When one fires for real the message goes
to ``redeliver``, or, after ``max_deliver`` deliveries, is given up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol, cast

import trio

import protocol as P
from protocol import AckKind, ProtocolConnection, PullEnd, PullPart, encode_pull_batch, subject_matches

from broker.core import MARKER, Broker, Clock, Counters, Partition, Topic, get_logger

from ._config import ConsumerConfig

__all__ = [
    "MS", "ConsumerLog", "Consumer", "ConsumerEvents", "ConsumerPartition", "Engine", "Member", "Outstanding", "ConsumerClient", "PullClient", "PullOwner", "PullRequest",
    "entries",
]

log = get_logger(__name__)

MS = 1_000_000

#: The removals that a consumer with ``dead_letter_expired`` dead-letters, and the
#: ``Nats-DLQ-Reason`` its copies name.
_DEAD_ON = {
    int(P.RemovalReason.TTL): "Expired", int(P.RemovalReason.MAX_AGE): "Expired",
    int(P.RemovalReason.LIMITS): "Limit", int(P.RemovalReason.MAX_MSGS_PER_SUBJECT): "Limit",
}


class ConsumerLog(Protocol):
    """A topic's consumer journal, as the consumers write to it (``_journal.py``)."""

    def write(self, event: list[object], lazy: bool = False) -> int: ...

    def settled(self, c: Consumer, partition: int, kind: int, offsets: list[int]) -> int: ...


class ConsumerEvents:
    """What a package above hears of the consumers, as it happens
    (:attr:`ConsumerEngine.events`; each method does nothing unless overridden): the
    NATS listener's JetStream advisories. Called after the change, on the event loop;
    ``offset`` is in partition ``partition``, ``deliveries`` the delivery count."""

    def created(self, c: Consumer) -> None: ...

    def deleted(self, c: Consumer) -> None:
        """Deleted, or forgotten with its topic (before the topic's own hooks)."""

    def naked(self, c: Consumer, partition: int, offset: int, dseq: int, deliveries: int) -> None: ...

    def terminated(self, c: Consumer, partition: int, offset: int, dseq: int, deliveries: int, reason: str) -> None: ...

    def max_deliveries(self, c: Consumer, partition: int, offset: int, deliveries: int) -> None:
        """Given up after ``max_deliver`` deliveries."""

    def stream_name(self, topic: Topic) -> str:
        """What a dead letter's ``Nats-DLQ-Stream`` calls ``topic`` (the NATS
        listener: its stream name)."""
        return topic.full_name


class Engine(Protocol):
    """What consumers, their partitions, pulls and members ask of the engine that
    holds them."""

    @property
    def broker(self) -> Broker: ...

    @property
    def counters(self) -> Counters: ...

    #: Who hears of what happens to the consumers.
    events: ConsumerEvents

    @property
    def clock(self) -> Clock: ...

    def kick(self, c: Consumer) -> None:
        """Something changed: fill ``c``'s waiting pulls in the engine's next pass."""

    def arm(self, cp: ConsumerPartition, offsets: list[int], deadline: int) -> int:
        """One timer entry per offset, all at ``deadline``; returns when it fires."""
        ...

    def journal_of(self, topic: Topic) -> ConsumerLog: ...

    def consumers_of(self, topic: Topic) -> dict[str, Consumer]: ...

    def released(self, c: Consumer, partition: int, offsets: list[int]) -> None:
        """``c`` settled ``offsets`` other than by an ack (work-queue and interest
        retention remove what nobody else needs)."""

    def watch_member(self, m: Member) -> None:
        """Check ``m`` once its member timeout could have run out."""

    def new_member_serial(self) -> int: ...

    def pull_retired(self, req: PullRequest) -> None:
        """``req`` ended: forget its timer."""

    def broker_offsets_store(self, c: Consumer, cp: ConsumerPartition) -> None:
        """Store ``c``'s offset in ``cp`` as its topic's stored consumer offset."""

    def dead_letter(self, c: Consumer, partition: int, items: list[tuple[int, int]], reason: str) -> set[int]:
        """Copy ``items`` (``(offset, deliveries)``, just settled) to ``c``'s
        dead-letter subject, if it has one; returns the offsets whose release waits
        for the copy (``_dead_letters.py``)."""
        ...

    def dead_letter_removing(self, c: Consumer, partition: int, items: list[tuple[int, int]], reason: str) -> object:
        """``items`` (``(offset, deliveries)``, 0 deliveries: not delivered yet) of
        ``c`` are about to be removed (``reason`` ``Expired`` or ``Limit``): build
        their copies while they are readable. Returns what
        :meth:`dead_letter_removed` makes once they are gone (None: nothing)."""
        ...

    def dead_letter_removed(self, prepared: object) -> None:
        """Make the copies :meth:`dead_letter_removing` built."""


class PullOwner(Protocol):
    """What a waiting pull belongs to: a connection, or (the NATS listener's pulls,
    answered to reply subjects) the listener itself."""

    #: Its waiting pulls.
    pulls: set[PullRequest]

    @property
    def closing(self) -> bool: ...


class ConsumerClient(PullOwner, Protocol):
    """A connection of either protocol, as the consumers see it when it closes
    (``session_closed``)."""

    #: Its consumer-group memberships.
    members: dict[Consumer, Member]


class PullClient(ConsumerClient, Protocol):
    """A binary-protocol connection a pull or a group member belongs to (whose
    pulls this module answers)."""

    #: The correlation id of the request being handled.
    corr: int

    @property
    def conn(self) -> ProtocolConnection: ...

    def send_now(self, frame: bytes) -> None: ...

    def push_pull(self, corr: int, payload: bytes) -> None: ...


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
        #: Copies built by ``removing`` for ``removed`` to make (dead letters of owed
        #: messages that a TTL, the max age or a limit removes).
        self._dying: object = None
        #: Offsets dead-lettered ``Expired`` or ``Limit`` before a restart (replayed
        #: from the journal), whose removal the crash may have undone: removed again,
        #: they are not copied twice. Only those still live are kept (``recover``).
        self.lettered: set[int] = set()

    def __repr__(self) -> str:
        return f"ConsumerPartition({self.consumer.name}@{self.part!r})"

    # -- matching ------------------------------------------------------------------

    def wanted(self) -> Callable[[int], bool] | None:
        """A predicate on offsets for first deliveries (filter and ``only``); None:
        every offset is wanted."""
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

    @property
    def letters_removals(self) -> bool:
        """Whether :meth:`removing` may dead-letter (``dead_letter_expired``)."""
        return bool(self.consumer.config.dead_letter_expired) and not self.consumer.deleted

    def removing(self, offsets: list[int], subjects: list[bytes], tag: int) -> None:
        """With ``dead_letter_expired``, what the consumer still owes among messages a
        TTL, the max age or a limit is removing (outstanding, or not delivered yet and
        wanted) is dead-lettered: the copies are built now, made in :meth:`removed`."""
        c = self.consumer
        reason = _DEAD_ON.get(tag)
        if reason is None or not c.config.dead_letter_expired or c.deleted:
            return
        out, lettered = self.out, self.lettered
        flags_at = self.part.index.flags_at
        items: list[tuple[int, int]] = []
        for o, s in zip(offsets, subjects):
            if lettered and o in lettered:
                lettered.discard(o)  # copied before a crash that undid its removal
                continue
            if flags_at(o) & MARKER:
                continue  # a subject delete marker expiring is what it is for
            e = out.get(o)
            if e is not None:
                items.append((o, e.count))
            elif self.counts(o, s):
                items.append((o, 0))
        if items:
            self._dying = c.engine.dead_letter_removing(c, self.part.number, items, reason)

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
        dying, self._dying = self._dying, None
        if dying is not None:
            self.consumer.engine.dead_letter_removed(dying)

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
            self.give_up(gave_up)
        if due or gave_up:
            engine.kick(c)

    def give_up(self, offsets: list[int]) -> int:
        """Settle outstanding ``offsets`` delivered ``max_deliver`` times: never
        delivered again (journaled as a term; work-queue and interest retention
        release them). Returns the journal epoch."""
        c = self.consumer
        engine = c.engine
        counts = [self.out[o].count for o in offsets]
        for o in offsets:
            self._drop(o)
        engine.counters.consumer_given_up += len(offsets)
        held = engine.dead_letter(c, self.part.number, list(zip(offsets, counts)), "MaxDeliveries")
        epoch = engine.journal_of(c.topic).settled(c, self.part.number, AckKind.TERM, offsets)
        if c.topic.config.retention != "limits":
            engine.released(c, self.part.number, [o for o in offsets if o not in held] if held else offsets)
        log.debug("max_deliver_reached", consumer=c.name, partition=self.part.number, offsets=len(offsets))
        events = engine.events
        for o, count in zip(offsets, counts):
            events.max_deliveries(c, self.part.number, o, count)
        return epoch


class Consumer:
    def __init__(self, engine: Engine, topic: Topic, cid: int, name: str, config: ConsumerConfig, created_ns: int) -> None:
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
        #: Delivers nothing before this time (ns, the broker's clock; 0: not paused):
        #: waiting pulls wait on (a NATS consumer's ``pause_until``).
        self.paused_until = 0
        #: Messages copied to the dead-letter subject, by reason (``Nats-DLQ-Reason``).
        self.dead_lettered: dict[str, int] = dict.fromkeys(P.DLQ_REASONS, 0)
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
            "dead_lettered": dict(self.dead_lettered),
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


class PullRequest:
    """A waiting pull of a binary-protocol session (the NATS listener's pulls
    subclass it and answer in their own protocol)."""

    __slots__ = ("session", "corr", "consumer", "remaining", "bytes_left", "expires", "member", "id", "ended")

    #: Its messages may come as a ``PulledRun`` and the run, where a whole run of
    #: first deliveries is taken (its ``respond``/``more`` handle them).
    takes_runs = False

    def __init__(self, session: PullOwner, corr: int, consumer: Consumer, batch: int, max_bytes: int, member: Member | None) -> None:
        self.session = session
        self.corr = corr
        self.consumer = consumer
        self.remaining = batch
        self.bytes_left = max_bytes
        self.expires = 0
        self.member = member
        self.id = 0
        self.ended = False

    # How a pull's messages and end reach its client: here, a binary-protocol
    # connection (a PullClient); the NATS listener's pulls override all three and
    # answer in their own protocol (``broker/nats/_consumers.py``).

    def _client(self) -> PullClient:
        return cast(PullClient, self.session)

    def respond(self, status: PullEnd, parts: list[PullPart], count: int) -> None:
        """The response that ends the pull, with its last messages."""
        t = self.consumer.topic
        payload = encode_pull_batch(int(status), t.stream.id, t.id, count, entries(parts))
        client = self._client()
        client.send_now(client.conn.send_raw_response(self.corr, P.Command.PULL, payload))

    def more(self, parts: list[PullPart], count: int) -> None:
        """Messages for the pull, which goes on waiting."""
        t = self.consumer.topic
        self._client().push_pull(self.corr, encode_pull_batch(int(PullEnd.MORE), t.stream.id, t.id, count, entries(parts)))

    def refuse(self, err: P.BrokerError) -> None:
        """End the pull with an error (its consumer is gone)."""
        client = self._client()
        client.send_now(client.conn.send_error(self.corr, P.Command.PULL, err))

    def unheard(self) -> bool:
        """Whether nobody would receive this pull's messages: its connection is
        closing. A pull that nobody hears is passed over and dropped before any
        message is handed to it (``_pulls.fill``)."""
        return self.session.closing

    def passes(self) -> bool:
        """Whether this pull waits instead of taking messages now (the NATS
        listener's priority groups: an overflow request below its thresholds, a
        request that is not the pinned one)."""
        return False


def entries(parts: list[PullPart]) -> list[bytes | memoryview]:
    """The parts of a pull that does not take runs (``PullRequest.takes_runs`` false:
    ``_pulls.collect`` put no ``PulledRun`` in them): entry heads and records only,
    as ``encode_pull_batch`` takes them."""
    return cast("list[bytes | memoryview]", parts)


class Member:
    """A connection in a partitioned consumer's group, under its member name."""

    def __init__(self, consumer: Consumer, name: str, session: PullClient | None, serial: int) -> None:
        self.consumer = consumer
        self.name = name
        self.session = session
        self.serial = serial
        self.pulls = 0
        self.last_active = trio.current_time()

    def pull_started(self) -> None:
        self.pulls += 1
        self.last_active = trio.current_time()

    def pull_ended(self, req: PullRequest) -> None:
        self.pulls -= 1
        self.last_active = trio.current_time()
        if self.pulls <= 0 and self.consumer.members.get(self.name) is self:
            self.consumer.engine.watch_member(self)
