"""The NATS side of the consumers of one broker (:class:`State`): each consumer's
NATS settings (``PushSettings``, kept in its journaled config), acks queued and
settled together, the push consumers' deliveries, ephemeral consumers'
inactivity, pauses and ADR-42 pins. ``_pull.py`` (pull requests), ``_push.py``
(push delivery) and ``_consumers.py`` (the API, acks) work on it.

* **Acks**: ``+ACK``, ``-NAK`` (with ``{"delay": ns}``), ``+TERM``, ``+WPI``,
  ``+NXT`` are queued (:meth:`State.queue_ack`, :meth:`State.take_acks`) and go to
  ``ConsumerEngine.settle`` together in the next turn of the event loop, or before
  any request that reads consumer state; an ack sent as a request (``ack_sync``) is
  answered once the consumer state it changed is durable.
* **Deliveries** (:meth:`State.deliver`): a pull batch's messages to a subject, one
  formatting pass and one write per NATS subscriber; with queue groups, each message
  to one member (:meth:`State._spread`).
* **Ephemeral consumers** are deleted ``inactive_threshold`` (default 5 s, the
  server's) after their last pull, or after their deliver subject lost its last
  subscriber (:class:`Inactivity`).

Timers (pull heartbeats, push heartbeats, inactivity, pauses, pins) are entries in
the expiry engine's deadline structure, owned by :class:`Ticks`: nothing polls.
"""

from __future__ import annotations

import dataclasses
import random
import re
import secrets
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from protocol import AckKind, BrokerError, expand_runs, normalize_name
from protocol.nats import (
    ACK_PREFIX,
    AckRun,
    JSError,
    PushSettings,
    ack_metric,
    js_delivery,
    js_delivery_frames,
    parse_ack_subject,
    sample_percent,
    with_header,
)

from broker.consumers import PullRequest, remove_consumer
from broker.core import get_logger

from ._core import NatsSubscription, send_core

if TYPE_CHECKING:
    from broker.consumers import Consumer

    from ._jetstream import JetStream

__all__ = [
    "DURABLE_SETTINGS", "EPHEMERAL_INACTIVE_NS", "NS", "V1_ACK", "Delivery", "DeliveryFactory", "Pin", "State", "Ticks",
    "delete_consumer", "lookup",
]

log = get_logger(__name__)

NS = 1_000_000_000
#: An ephemeral consumer without ``inactive_threshold`` goes after this long unused
#: (the server's ``JsDeleteWaitTimeDefault``).
EPHEMERAL_INACTIVE_NS = 5 * NS
#: Entries of the ack-subject lookup cache before it is cleared.
ACK_CACHE_LIMIT = 10_000
#: What a durable or natively created consumer has of the NATS settings.
DURABLE_SETTINGS = PushSettings(durable=True)
_SETTINGS_FIELDS = frozenset(f.name for f in dataclasses.fields(PushSettings))
#: A v1 ack subject as ``parse_ack_subject`` reads it (nine tokens; delivered count,
#: stream and consumer sequences ASCII digits): its ``$JS.ACK.<stream>.<consumer>``
#: (the key of ``State.by_ack``) and its stream sequence.
V1_ACK = re.compile(r"(\$JS\.ACK\.[^.]*\.[^.]*)\.[0-9]+\.([0-9]+)\.[0-9]+\.[^.]*\.[^.]*")
_ACK = int(AckKind.ACK)


class Delivery(Protocol):
    """A push consumer's delivery as :class:`State` drives it (``_push.Push``)."""

    consumer: Consumer
    subject: str
    rate: float

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def bind(self) -> None: ...
    def flow_reply(self, subject: str) -> None: ...


#: Makes the delivery of a push consumer (``_push.Push``, given by ``_consumers.py``).
DeliveryFactory = Callable[["State", "Consumer", PushSettings], Delivery]


class _Owner:
    """The ``session`` of NATS pulls: they answer to a reply subject, not to a
    connection (``_pulls.retire`` takes them out of ``pulls``)."""

    closing = False

    def __init__(self) -> None:
        self.pulls: set[PullRequest] = set()


class Ticks:
    """Owner of the timer entries of this module (``timers_due``): each id is one
    object with a ``tick(now_ns)`` method that re-arms itself if it must."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.by_id: dict[int, Any] = {}
        self.next_id = 0

    def arm(self, obj: Any, deadline_ns: int) -> None:
        self.next_id += 1
        self.by_id[self.next_id] = obj
        self.state.engine.expiry.schedule_timers(self, (self.next_id,), deadline_ns)

    def timers_due(self, ids: list[int], now_ns: int) -> None:
        for i in ids:
            obj = self.by_id.pop(i, None)
            if obj is not None:
                try:
                    obj.tick(now_ns)
                except Exception:
                    log.error("js_consumer_tick_failed", exc_info=True)


class State:
    """The NATS side of the consumers of one broker: their NATS settings, the push
    consumers, and when ephemeral ones were last used."""

    def __init__(self, js: JetStream, delivery: DeliveryFactory) -> None:
        self.js = js
        self.delivery = delivery
        self.broker = js.broker
        self.engine = js.consumers
        self.owner = _Owner()
        self.ticks = Ticks(self)
        self.pushes: weakref.WeakKeyDictionary[Consumer, Delivery] = weakref.WeakKeyDictionary()
        self.last_active: weakref.WeakKeyDictionary[Consumer, int] = weakref.WeakKeyDictionary()
        #: The inactivity clock of each ephemeral consumer (replaced when an update
        #: changes its ``inactive_threshold``).
        self.inactivity: weakref.WeakKeyDictionary[Consumer, Inactivity] = weakref.WeakKeyDictionary()
        #: Push consumers whose deliver subject has no subscriber (they wait for one).
        self.unbound: set[Delivery] = set()
        #: ADR-42: the pinned client of each ``pinned_client`` consumer.
        self.pins: weakref.WeakKeyDictionary[Consumer, Pin] = weakref.WeakKeyDictionary()
        #: Flow-control requests awaiting their answer, by reply subject.
        self.flow: dict[str, Delivery] = {}
        #: ``$JS.ACK.<stream>.<consumer>`` of ack subjects -> the consumer (checked:
        #: not deleted).
        self.by_ack: dict[str, Consumer] = {}
        #: Acks received and not yet settled, and the ack requests they answer: settled
        #: together in the next turn of the event loop (:func:`run`), so a batch of acks
        #: is one journal event, or before any request that reads consumer state.
        self.acks: dict[Consumer, list[Any]] = {}  # entries (kind, partition, offset, delay) and AckRuns
        self.ack_replies: list[str] = []
        #: The reasons given with queued terms (``+TERM <reason>``), by consumer and
        #: (partition, offset): for the terminated advisory.
        self.term_reasons: dict[Consumer, dict[tuple[int, int], str]] = {}
        self.ack_wake = trio.Event()
        #: Every queued ack is a plain ``+ACK`` without a reply (taken by
        #: :meth:`take_acks` / :meth:`take_ack_run`): what :meth:`may_pass` needs.
        self.plain = True
        #: Some queued acks are an ``AckRun`` (read when settled).
        self.runs = False
        #: A pull went ahead of the queued acks (:meth:`may_pass`): its connection
        #: settles them (:meth:`settle_held`) before it handles anything else or
        #: yields; ``fences``: the cursor of each such pull's consumer before it,
        #: where the acks stop counting.
        self.held = False
        self.fences: dict[Consumer, int] = {}
        self.broker.subs.on_add.append(self._subscribed)
        self.resume()

    def resume(self) -> None:
        """At start-up: the NATS settings are in the consumers' configs (journaled), so
        ephemeral consumers restart their inactivity clock and push consumers wait
        for a subscriber again."""
        for topic in self.broker.catalog.topics():
            for c in list(self.engine.consumers_of(topic).values()):
                if c.config.nats is not None:
                    self.start(c, self.settings_of(c))

    def start(self, c: Consumer, settings: PushSettings) -> None:
        """Start what a NATS consumer's settings ask for: an ephemeral one's
        inactivity clock, a push consumer's delivery."""
        if not settings.durable or settings.inactive_threshold_ns:
            self.touch(c)
            self._clock(c, settings)
        self._pause(c, settings)
        if settings.deliver_subject and c not in self.pushes:
            push = self.pushes[c] = self.delivery(self, c, settings)
            push.start()

    def _pause(self, c: Consumer, settings: PushSettings) -> None:
        """``pause_until``: the engine delivers nothing to ``c`` before then; a tick at
        the end wakes it."""
        c.paused_until = settings.pause_until_ns
        if settings.pause_until_ns > self.broker.clock.now_ns():
            self.ticks.arm(Unpause(self, c, settings.pause_until_ns), settings.pause_until_ns)
        else:
            self.engine.kick(c)

    def _clock(self, c: Consumer, settings: PushSettings) -> None:
        threshold = settings.inactive_threshold_ns or EPHEMERAL_INACTIVE_NS
        clock = self.inactivity[c] = Inactivity(self, c, threshold)
        self.ticks.arm(clock, self.last_active.get(c, 0) + threshold)

    def updated(self, c: Consumer, old: PushSettings, new: PushSettings) -> None:
        """After an update of ``c`` (checked by :func:`_check_update`): a push consumer
        whose deliver subject moved delivers to the new one; a new inactivity
        threshold counts from the last activity, as on the server."""
        if old.pause_until_ns != new.pause_until_ns:
            self._pause(c, new)
        push = self.pushes.get(c)
        if push is not None and old.rate_limit_bps != new.rate_limit_bps:
            push.rate = new.rate_limit_bps / 8
        if old.deliver_subject != new.deliver_subject:
            push = self.pushes.pop(c, None)
            if push is not None:
                push.stop()
            self.start(c, new)
        elif old.inactive_threshold_ns != new.inactive_threshold_ns and (not new.durable or new.inactive_threshold_ns):
            self._clock(c, new)

    def _subscribed(self, sub: Any) -> None:
        if self.unbound:
            for push in list(self.unbound):
                if push.consumer.deleted:
                    self.unbound.discard(push)
                else:
                    push.bind()

    def queue_ack(self, c: Consumer, entry: tuple[int, int, int, int], reply: str | None, reason: str = "") -> None:
        self.plain = False
        if reason:
            self.term_reasons.setdefault(c, {})[(entry[1], entry[2])] = reason
        queued = self.acks.get(c)
        if queued is None:
            self.acks[c] = [entry]
        else:
            queued.append(entry)
        if reply:
            self.ack_replies.append(reply)
        if not self.ack_wake.is_set():
            self.ack_wake.set()

    def flush_acks(self) -> None:
        """Settle the queued acks (one journal event per consumer); the ack requests
        are answered once that is durable."""
        self.held = False
        if not self.acks:
            return
        acks, self.acks = self.acks, {}
        replies, self.ack_replies = self.ack_replies, []
        reasons, self.term_reasons = self.term_reasons, {}
        runs, fences = self.runs, self.fences
        self.plain, self.runs, self.fences = True, False, {}
        epoch = 0
        wait = bool(replies)  # acks without a reply: nobody waits, the events go with the next sync
        for c, entries in acks.items():
            if not c.deleted:
                if runs or fences:
                    entries = _ack_entries(entries, fences.get(c))
                if c.config.nats is not None:
                    freq = sample_percent(self.settings_of(c).sample_freq)
                    if freq:
                        self._sample(c, entries, freq)
                epoch = max(epoch, self.engine.settle(c, entries, wait, reasons.get(c)))
        if wait and not epoch:
            # Nothing changed: the acks were settled by earlier ones sent without a
            # reply, perhaps not durable yet. The answers wait until everything
            # written so far is (as our ACK with SYNC does).
            epoch = self.engine.committer.durable_at()
        for reply in replies:
            self.js.respond(reply, b"", epoch=epoch)

    def _sample(self, c: Consumer, entries: list[Any], percent: int) -> None:
        """``sample_freq``: an ack metric advisory (nats-server's ``sampleAck``) for
        that share of the plain acks about to be settled, on
        ``$JS.EVENT.METRIC.CONSUMER.ACK.<stream>.<consumer>``; ``ack_time`` counts from
        the delivery (its ack deadline less its ack wait)."""
        now = self.broker.clock.now_ns()
        stream = self.js.stream_name(c.topic)
        subject = f"$JS.EVENT.METRIC.CONSUMER.ACK.{stream}.{c.name}"
        parts = c.parts
        for kind, pn, o, _ in entries:
            if kind != _ACK or pn >= len(parts):
                continue
            e = parts[pn].out.get(o)
            if e is None or (percent < 100 and random.randrange(100) > percent):
                continue
            delivered_at = e.deadline - c.config.wait_ns(e.count)
            self.send(subject, None, None, ack_metric(
                stream, c.name, e.dseq, o, max(now - delivered_at, 0), e.count, now, secrets.token_hex(11).upper(),
            ))

    def take_acks(self, items: list[tuple[str, str | None, bytes, str, int]], i: int) -> int:
        """Queue the plain acks at ``items[i:]`` (``NatsParser.ack_pubs``: v1 ack
        subjects, their ``$JS.ACK.<stream>.<consumer>`` and stream sequence read): a
        ``+ACK`` (or empty) body for a consumer already seen, as :func:`ack` would;
        returns how many were taken, stopping before the first item that is anything
        else (:func:`ack` then takes it, errors and all). The caller calls
        :meth:`wake_acks` once it has handled what it read (or before it waits)."""
        start = i
        n = len(items)
        by_ack = self.by_ack
        acks = self.acks
        replies = self.ack_replies
        last: Consumer | None = None
        queued: list[Any] = []
        while i < n:
            _, reply, payload, key, stream_seq = items[i]
            if payload and payload != b"+ACK":
                break
            c = by_ack.get(key)
            if c is None or c.deleted:
                break
            if c is not last:
                got = acks.get(c)
                if got is None:
                    got = acks[c] = []
                queued = got
                last = c
            queued.append((_ACK, 0, stream_seq, 0))
            if reply:
                replies.append(reply)
                self.plain = False
            i += 1
        return i - start

    def take_ack_run(self, key: str, run: AckRun) -> bool:
        """Queue a run of plain acks of one consumer (``NatsParser.ack_run``: its
        ``$JS.ACK.<stream>.<consumer>`` and the run), to be settled as :meth:`take_acks`
        would queue them (:func:`_ack_entries` reads the run then); False, and
        nothing queued, when ``key`` is not a consumer seen before (the general path
        then reads them). The caller calls :meth:`wake_acks` as after :meth:`take_acks`."""
        c = self.by_ack.get(key)
        if c is None or c.deleted:
            return False
        queued = self.acks.get(c)
        if queued is None:
            queued = self.acks[c] = []
        queued.append(run)
        self.runs = True
        return True

    def may_pass(self, c: Consumer, want: int) -> bool:
        """Whether a pull of at most ``want`` messages of ``c`` collects exactly what
        it would collect after the queued acks were settled, so that they may be
        settled after it (and after its messages are sent: they are off the path
        from the client's acks and next pull to its messages). True when every
        queued ack is a plain ``+ACK`` without a reply (no answer to order, no nak or
        term that makes a redelivery or frees room), ``c`` has one partition with
        nothing due for redelivery (acks only take messages out of it), and
        ``max_ack_pending`` leaves room for ``want`` without them (the room they free
        could not change what the pull takes). The pull only adds deliveries at and
        past the cursor, where nothing is outstanding: acks there, ignored when
        settled first, are left out (:meth:`hold` keeps the cursor), and the others
        find what they would have. The counters, ack floor and journal events come
        out the same once they are settled."""
        if not self.plain or len(c.parts) != 1:
            return False
        return not c.parts[0].redeliver and c.room() >= want

    def hold(self, c: Consumer) -> None:
        """A pull of ``c`` goes ahead of the queued acks (:meth:`may_pass`)."""
        self.held = True
        self.fences.setdefault(c, c.parts[0].cursor)

    def settle_held(self) -> None:
        """Settle the acks a pull went ahead of (:meth:`may_pass`), now: called by
        the pull's connection before it handles anything else or yields, so nothing
        else sees the consumers before they are settled."""
        if self.held:
            try:
                self.flush_acks()
            except Exception:
                log.error("js_ack_flush_failed", exc_info=True)

    def wake_acks(self) -> None:
        """Settle the acks :meth:`take_acks` queued in the next turn of the event loop
        (its caller's read is handled: a pull request that came with them has
        settled them already, and then nothing wakes)."""
        if self.acks and not self.ack_wake.is_set():
            self.ack_wake.set()

    def consumer_of_ack(self, subject: str) -> tuple[Consumer, int] | None:
        """The consumer a ``$JS.ACK`` subject names and the stream sequence it acks;
        None when the subject is not an ack subject (``parse_ack_subject``) or names
        no consumer. A v1 subject of a consumer seen before costs one match and one
        lookup (:data:`V1_ACK`: the subjects ``parse_ack_subject`` reads as v1)."""
        m = V1_ACK.fullmatch(subject)
        if m is not None:
            c = self.by_ack.get(m.group(1))
            if c is not None and not c.deleted:
                return c, int(m.group(2))
        a = parse_ack_subject(subject)
        if a is None:
            return None
        c = lookup(self, [a.stream, a.consumer])
        if c is None:
            return None
        if len(self.by_ack) >= ACK_CACHE_LIMIT:
            self.by_ack = {}
        self.by_ack[f"{ACK_PREFIX}{a.stream}.{a.consumer}"] = c
        return c, a.stream_seq

    @staticmethod
    def settings_of(c: Consumer) -> PushSettings:
        nats = c.config.nats
        if not nats:
            return DURABLE_SETTINGS
        return PushSettings(**{k: v for k, v in nats if k in _SETTINGS_FIELDS})

    def send(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes | memoryview = b"") -> int:
        return send_core(self.broker, subject, reply, headers, payload)

    def touch(self, c: Consumer) -> None:
        self.last_active[c] = self.broker.clock.now_ns()

    def pin(self, c: Consumer, group: str) -> Pin:
        """Pin a new client of ``c`` (ADR-42's ``pinned_client``): its id, and a timer
        that unpins it after the consumer's ``priority_timeout`` without a request."""
        pin = self.pins[c] = Pin(self, c, group, secrets.token_hex(11).upper(), self.settings_of(c).pinned_ttl_ns)
        pin.touch()
        return pin

    def unpin(self, c: Consumer) -> None:
        if self.pins.pop(c, None) is not None:
            self.engine.kick(c)

    def deliver(self, c: Consumer, subject: str, parts: list[Any], count: int, pin: str = "") -> int:
        """Send the ``count`` messages of a pull batch (``_pulls.collect``'s parts) to
        ``subject``; returns how many reached a subscriber. ``pin``: each carries a
        ``Nats-Pin-Id`` header with it (ADR-42's pinned client)."""
        stream = self.js.stream_name(c.topic)
        headers_only = self.settings_of(c).headers_only
        name = c.name
        raw = subject.encode()
        subs = self.broker.subs.match(raw)
        nats_subs = [sub for sub in subs if isinstance(sub, NatsSubscription)]
        if pin or len(nats_subs) != len(subs) or any(sub.checked for sub in nats_subs):
            # One by one: a ttlbroker subscriber too, a header to add, or a subscriber
            # whose permissions look at each message.
            parts = expand_runs(parts)
            messages = [js_delivery(parts[i], parts[i + 1], stream, name, headers_only) for i in range(0, len(parts), 2)]
            if pin:
                messages = [(s, r, with_header(h, "Nats-Pin-Id", pin), p) for s, r, h, p in messages]
            return sum([send_core(self.broker, subject, r.decode(), h, p, shown=s) > 0 for s, r, h, p in messages])
        if any(sub.queue for sub in nats_subs):
            return self._spread(raw, expand_runs(parts), stream, name, headers_only)
        reached = 0
        for sub in nats_subs:  # one formatting pass and one write per NATS subscriber
            n = sub.room(count)
            if n:
                some = parts if n == count else expand_runs(parts)[: 2 * n]
                frames, size = js_delivery_frames(some, sub.sid_bytes, stream, name, headers_only, sub.session.headers)
                reached = max(reached, sub.send_frames(frames, n, size))
        return reached


    def _spread(self, subject: bytes, parts: list[Any], stream: str, name: str, headers_only: bool) -> int:
        """:meth:`deliver` to a subject with queue groups (a push consumer's
        ``deliver_group``): each message goes to the subscriptions matching picks for
        it, one member of each group, as nats-server picks per message; then one
        write per subscriber. Returns how many messages reached someone."""
        match = self.broker.subs.match
        per: dict[NatsSubscription, list[Any]] = {}
        reached = 0
        for i in range(0, len(parts), 2):
            subs = match(subject)
            if subs:
                reached += 1
            for sub in subs:
                if isinstance(sub, NatsSubscription):
                    per.setdefault(sub, []).extend((parts[i], parts[i + 1]))
        for sub, some in per.items():
            n = sub.room(len(some) // 2)
            if n:
                frames, size = js_delivery_frames(some[: 2 * n], sub.sid_bytes, stream, name, headers_only, sub.session.headers)
                sub.send_frames(frames, n, size)
        return reached


def _ack_entries(queued: list[Any], fence: int | None) -> list[tuple[int, int, int, int]]:
    """The ack entries of a consumer's queue: each ``AckRun`` read into the plain acks
    ``State.take_acks`` queues for it; with a ``fence`` (a pull went ahead of them,
    ``State.hold``: they are all plain acks), only those below it."""
    out: list[tuple[int, int, int, int]] = []
    for e in queued:
        if e.__class__ is AckRun:
            out += [(_ACK, 0, s, 0) for s in e.seqs() if fence is None or s < fence]
        elif fence is None or e[2] < fence:
            out.append(e)
    return out


class Pin:
    """A consumer's pinned client (ADR-42): unpinned once ``ttl_ns`` passed without a
    request carrying its id."""

    def __init__(self, state: State, c: Consumer, group: str, pin_id: str, ttl_ns: int) -> None:
        self.state = state
        self.consumer = c
        self.group = group
        self.id = pin_id
        self.ttl_ns = ttl_ns
        self.since_ns = state.broker.clock.now_ns()
        self.last_ns = 0

    def touch(self) -> None:
        self.last_ns = self.state.broker.clock.now_ns()
        self.state.ticks.arm(self, self.last_ns + self.ttl_ns)

    def tick(self, now_ns: int) -> None:
        if self.state.pins.get(self.consumer) is self and now_ns - self.last_ns >= self.ttl_ns:
            self.state.unpin(self.consumer)


class Unpause:
    """The end of a consumer's pause: the engine delivers again (unless the pause
    moved meanwhile)."""

    def __init__(self, state: State, c: Consumer, until_ns: int) -> None:
        self.state = state
        self.consumer = c
        self.until_ns = until_ns

    def tick(self, now_ns: int) -> None:
        c = self.consumer
        if not c.deleted and c.paused_until == self.until_ns:
            self.state.engine.kick(c)


class Inactivity:
    """Deletes a consumer unused for its ``inactive_threshold`` (an ephemeral one
    always, 5 s by default; a durable one when it has one, as on the server)."""

    def __init__(self, state: State, c: Consumer, threshold_ns: int) -> None:
        self.state = state
        self.consumer = c
        self.threshold_ns = threshold_ns

    def tick(self, now_ns: int) -> None:
        c = self.consumer
        st = self.state
        if c.deleted or st.inactivity.get(c) is not self:  # deleted, or replaced by an update
            return
        push = st.pushes.get(c)
        if push is not None:
            if st.broker.subs.match(push.subject.encode()):
                st.touch(c)
        elif c.waiting:
            st.touch(c)
        last = st.last_active.get(c, 0)
        if now_ns - last >= self.threshold_ns:
            log.info("ephemeral_consumer_inactive", topic=c.topic.full_name, consumer=c.name)
            delete_consumer(st, c)
            return
        st.ticks.arm(self, last + self.threshold_ns)


def delete_consumer(st: State, c: Consumer) -> int:
    push = st.pushes.pop(c, None)
    if push is not None:
        push.stop()
    return remove_consumer(st.engine, c)


def lookup(st: State, tokens: list[str]) -> Consumer | None:
    if len(tokens) != 2:
        return None
    try:
        topic = st.js.topic(tokens[0])
        return st.engine.consumers_of(topic).get(normalize_name(tokens[1], "consumer name"))
    except (JSError, BrokerError):
        return None
