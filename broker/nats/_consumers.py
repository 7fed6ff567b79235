"""JetStream consumers over the NATS listener, on the consumer engine
(``_consumers.py``, ``_pulls.py``): no second engine.

``_jetstream.py`` dispatches ``$JS.API.CONSUMER.<op>`` here (:func:`consumer_api`)
and the ``$JS.ACK.>`` / ``$JS.FC.>`` subjects (:func:`ack`). Everything is answered
with core messages (``send_core``) to the request's reply inbox.

* **Create, info, delete, names, list**: the server's JSON (``protocol/_js_consumers.py``
  maps the config); the consumer is an ordinary consumer of the stream's topic (a
  one-partition topic, so stream sequence = offset), created, updated and deleted
  through ``_consumer_handlers``; the answer waits for the group commit that makes
  the change durable, like our own acks.
* **Pull requests** (``CONSUMER.MSG.NEXT``): a :class:`NatsPull` is a
  ``PullRequest`` whose messages and end go to its reply inbox as HMSGs with the
  ``$JS.ACK`` reply subject, then the server's status (``404 No Messages``,
  ``408 Request Timeout``, ``409 ...`` with ``Nats-Pending-Messages/Bytes``). A
  request whose delivery reaches no subscriber is dropped, as the server drops
  requests without interest.
* **Acks**: ``+ACK``, ``-NAK`` (with ``{"delay": ns}``), ``+TERM``, ``+WPI``,
  ``+NXT`` go to ``ConsumerEngine.settle``; an ack sent as a request (``ack_sync``)
  is answered once the consumer state it changed is durable.
* **Push consumers** (a deliver subject; durable or ephemeral, any ack policy, with
  or without a ``deliver_group``: what ``js.subscribe`` creates): a :class:`Push`
  keeps one :class:`PushWindow` waiting on the consumer while the deliver subject
  has a subscriber; a window takes up to :data:`WINDOW_MSGS` messages or
  :data:`WINDOW_BYTES` and the next one starts at once, unless flow control is at
  its limit. Flow control is nats-server's sliding limit (``FC_START_PENDING``
  doubling to ``FC_MAX_PENDING``; ``100 FlowControl Request`` past half of it, the
  client answers on ``$JS.FC...``); idle heartbeats (``100 Idle Heartbeat`` with
  ``Nats-Last-Consumer/Stream``) go out when nothing was delivered for a heartbeat
  interval. With queue groups on the deliver subject, each message goes to one member
  (:meth:`State._spread`). Acks and redeliveries are the engine's, as for pulls.
* **Ephemeral consumers** are deleted ``inactive_threshold`` (default 5 s, the
  server's) after their last pull, or after their deliver subject lost its last
  subscriber.

Timers (pull heartbeats, push heartbeats, inactivity) are entries in the expiry
engine's deadline structure, owned by :class:`Ticks`: nothing polls.
"""

from __future__ import annotations

import dataclasses
import random
import re
import secrets
import weakref
from typing import TYPE_CHECKING, Any

import trio

from protocol import AckKind, BrokerError, PullEnd, format_go_duration_ns, normalize_name
from protocol import expand_runs, subject_matches
from protocol.nats import AckRun
from protocol.nats import (
    ACK_PREFIX, FC_PREFIX, INVALID_JSON, STREAM_MISMATCH, JSError, api_error, api_response, js_error, parse_request, rfc3339,
)
from protocol.nats import (
    ACK_NEXT,
    ack_metric,
    check_group_name,
    NextRequest,
    PushSettings,
    consumer_config_from_nats,
    consumer_config_to_nats,
    idle_heartbeat,
    js_delivery,
    js_delivery_frames,
    parse_ack_body,
    parse_ack_subject,
    parse_next_request,
    parse_pause_until,
    sample_percent,
    status_message,
    with_header,
)

from broker.consumers import (
    MS,
    ConsumerConfig,
    PullRequest,
    change_consumer,
    collect,
    end,
    new_consumer,
    remove_consumer,
    retire,
    work_queue_conflict,
)
from broker.core import get_logger

from ._core import NatsSubscription, send_core

if TYPE_CHECKING:
    from broker.consumers import Consumer
    from broker.core import Topic

    from ._jetstream import JetStream

__all__ = ["consumer_api", "ack", "run", "NatsPull", "PushWindow", "Push"]

log = get_logger(__name__)

NS = 1_000_000_000
#: An ephemeral consumer without ``inactive_threshold`` goes after this long unused
#: (the server's ``JsDeleteWaitTimeDefault``).
EPHEMERAL_INACTIVE_NS = 5 * NS
#: The most a push consumer hands to its deliver subject in one step (a window, a
#: pull of the engine's): the next step starts at once, unless flow control waits.
WINDOW_MSGS = 1024
WINDOW_BYTES = 1 << 20
#: Flow control, as nats-server's: bytes delivered and not yet covered by a
#: flow-control reply may reach the current limit, which starts at a sixteenth of
#: FC_MAX_PENDING and doubles with each reply up to it; the request goes out once
#: they pass half the limit, so delivery goes on while it is answered.
FC_MAX_PENDING = 32 * 1024 * 1024
FC_START_PENDING = FC_MAX_PENDING // 16
#: Entries of the ack-subject lookup cache before it is cleared.
ACK_CACHE_LIMIT = 10_000
#: Page sizes of CONSUMER.NAMES and CONSUMER.LIST (the server's).
NAMES_LIMIT = 1024
LIST_LIMIT = 256
#: What a durable or natively created consumer has of the NATS settings.
_DURABLE = PushSettings(durable=True)
_SETTINGS_FIELDS = frozenset(f.name for f in dataclasses.fields(PushSettings))
#: A v1 ack subject as ``parse_ack_subject`` reads it (nine tokens; delivered count,
#: stream and consumer sequences ASCII digits): its ``$JS.ACK.<stream>.<consumer>``
#: (the key of ``State.by_ack``) and its stream sequence.
_V1_ACK = re.compile(r"(\$JS\.ACK\.[^.]*\.[^.]*)\.[0-9]+\.([0-9]+)\.[0-9]+\.[^.]*\.[^.]*")
_ACK = int(AckKind.ACK)


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

    def __init__(self, js: JetStream) -> None:
        self.js = js
        self.broker = js.broker
        self.engine = js.consumers
        self.owner = _Owner()
        self.ticks = Ticks(self)
        self.pushes: weakref.WeakKeyDictionary[Consumer, Push] = weakref.WeakKeyDictionary()
        self.last_active: weakref.WeakKeyDictionary[Consumer, int] = weakref.WeakKeyDictionary()
        #: The inactivity clock of each ephemeral consumer (replaced when an update
        #: changes its ``inactive_threshold``).
        self.inactivity: weakref.WeakKeyDictionary[Consumer, Inactivity] = weakref.WeakKeyDictionary()
        #: Push consumers whose deliver subject has no subscriber (they wait for one).
        self.unbound: set[Push] = set()
        #: ADR-42: the pinned client of each ``pinned_client`` consumer.
        self.pins: weakref.WeakKeyDictionary[Consumer, Pin] = weakref.WeakKeyDictionary()
        #: Flow-control requests awaiting their answer, by reply subject.
        self.flow: dict[str, Push] = {}
        #: ``$JS.ACK.<stream>.<consumer>`` of ack subjects -> the consumer (checked:
        #: not deleted).
        self.by_ack: dict[str, Consumer] = {}
        #: Acks received and not yet settled, and the ack requests they answer: settled
        #: together in the next turn of the event loop (:func:`run`), so a batch of acks
        #: is one journal event, or before any request that reads consumer state.
        self.acks: dict[Consumer, list[Any]] = {}  # entries (kind, partition, offset, delay) and AckRuns
        self.ack_replies: list[str] = []
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
            push = self.pushes[c] = Push(self, c, settings)
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

    def queue_ack(self, c: Consumer, entry: tuple[int, int, int, int], reply: str | None) -> None:
        self.plain = False
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
                epoch = max(epoch, self.engine.settle(c, entries, wait))
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
        lookup (:data:`_V1_ACK`: the subjects ``parse_ack_subject`` reads as v1)."""
        m = _V1_ACK.fullmatch(subject)
        if m is not None:
            c = self.by_ack.get(m.group(1))
            if c is not None and not c.deleted:
                return c, int(m.group(2))
        a = parse_ack_subject(subject)
        if a is None:
            return None
        c = _lookup(self, [a.stream, a.consumer])
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
            return _DURABLE
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
        if pin or len(nats_subs) != len(subs):  # one by one (a ttlbroker subscriber too, or a header to add)
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


def _state(js: JetStream) -> State:
    st = js.consumer_state
    if st is None:
        st = js.consumer_state = State(js)
    return st


# -- pulls -----------------------------------------------------------------------------


class NatsPull(PullRequest):
    """A ``CONSUMER.MSG.NEXT`` request waiting on its consumer."""

    __slots__ = ("state", "reply", "reply_bytes", "no_wait", "heartbeat_ns", "max_bytes", "policy", "group", "min_pending",
                 "min_ack_pending", "pin_id")

    takes_runs = True  # :meth:`State.deliver` formats them

    def __init__(self, state: State, reply: str, c: Consumer, nr: NextRequest) -> None:
        super().__init__(state.owner, 0, c, max(nr.batch, 1), nr.max_bytes, None)
        self.state = state
        self.reply = reply
        self.reply_bytes = reply.encode()
        self.no_wait = nr.no_wait
        self.heartbeat_ns = nr.heartbeat_ns
        self.max_bytes = nr.max_bytes
        #: ADR-42: the consumer's priority policy ("" none), and the request's group,
        #: overflow thresholds and pin id.
        self.policy = ""
        self.group = nr.group
        self.min_pending = nr.min_pending
        self.min_ack_pending = nr.min_ack_pending
        self.pin_id = nr.pin_id

    def passes(self) -> bool:
        """ADR-42, as nats-server's ``nextWaiting``: an overflow request with thresholds
        waits until the consumer has at least ``min_pending`` messages pending or
        ``min_ack_pending`` outstanding; under ``pinned_client``, the first request
        of the group is pinned (its messages carry ``Nats-Pin-Id``), a request
        without the pin waits, and one with another (a stale pin) ends with ``423
        Nats-Wrong-Pin-Id``."""
        policy = self.policy
        if not policy:
            return False
        c = self.consumer
        if policy == "overflow":
            if not (self.min_pending or self.min_ack_pending):
                return False
            return not ((self.min_pending and self.min_pending <= c.num_pending)
                        or (self.min_ack_pending and self.min_ack_pending <= c.num_ack_pending))
        st = self.state
        pin = st.pins.get(c)
        if pin is None:
            if self.group:
                self.pin_id = st.pin(c, self.group).id
            return False
        if self.pin_id == pin.id:
            return False
        if not self.pin_id:
            return True
        self.state.send(self.reply, None, status_message(423, "Nats-Wrong-Pin-Id", max(self.remaining, 0), self.bytes_left))
        retire(self)
        return True

    def unheard(self) -> bool:
        """No subscription matches the reply subject (its client closed, unsubscribed
        or timed out): nobody hears it, and it is dropped without an answer, as
        nats-server drops a waiting request without interest (``nextWaiting``,
        ``processWaiting``)."""
        return not self.state.broker.subs.match(self.reply_bytes)

    def _deliver(self, parts: list[Any], count: int) -> bool:
        """Send the messages; False (and the pull dropped) when nobody got them."""
        if count and not self.state.deliver(self.consumer, self.reply, parts, count, pin=self.pin_id if self.policy == "pinned_client" else ""):
            retire(self)
            return False
        return True

    def respond(self, status: PullEnd, parts: list[Any], count: int) -> None:
        if not self._deliver(parts, count):
            return
        if status == PullEnd.BATCH_COMPLETE:
            if self.max_bytes and self.bytes_left > 0:
                self._status(409, "Batch Completed")
        elif status == PullEnd.MAX_BYTES:
            self._status(409, "Message Size Exceeds MaxBytes")
        elif status == PullEnd.NO_MESSAGES:
            self.state.send(self.reply, None, status_message(404, "No Messages"))
        elif status == PullEnd.EXPIRED:
            self._status(408, "Request Timeout")

    def _status(self, code: int, text: str) -> None:
        self.state.send(self.reply, None, status_message(code, text, max(self.remaining, 0), self.bytes_left if self.max_bytes else 0))

    def more(self, parts: list[Any], count: int) -> None:
        if self._deliver(parts, count) and self.no_wait:
            end(self, PullEnd.NO_MESSAGES)  # no_wait with expires: returns once it has any

    def refuse(self, err: BrokerError) -> None:
        self.state.send(self.reply, None, status_message(409, "Consumer Deleted"))

    def tick(self, now_ns: int) -> None:
        """The pull's idle heartbeat."""
        if self.ended or self.consumer.deleted:
            return
        c = self.consumer
        if not self.state.send(self.reply, None, idle_heartbeat(c.dseq, _last_stream_seq(c))):
            retire(self)
            return
        self.state.ticks.arm(self, now_ns + self.heartbeat_ns)


def _priority_refusal(st: State, c: Consumer, s: PushSettings, nr: NextRequest) -> tuple[int, str] | None:
    """ADR-42's checks of a pull request, as nats-server's ``processNextMsgRequest``
    (a JSON request always has a priority group there, empty or not); a request with
    the current pin id keeps the pin alive."""
    if not nr.json:
        return None
    if (nr.min_pending or nr.min_ack_pending) and s.priority_policy != "overflow":
        return 400, "Bad Request - Not a Overflow Priority consumer"
    if nr.pin_id and s.priority_policy != "pinned_client":
        return 400, "Bad Request - Not a Pinned Client Priority consumer"
    if s.priority_policy:
        if not nr.group:
            return 400, "Bad Request - Priority Group missing"
        if nr.group not in s.priority_groups.split(","):
            return 400, "Bad Request - Invalid Priority Group"
        pin = st.pins.get(c)
        if pin is not None:
            if nr.pin_id == pin.id:
                pin.touch()
            elif nr.pin_id:
                return 423, "Nats-Pin-Id mismatch"
    return None


def _over_limits(s: PushSettings, nr: NextRequest) -> str:
    """The server's refusal of a pull over the consumer's request limits ("": none)."""
    if s.max_batch and nr.batch > s.max_batch:
        return f"Exceeded MaxRequestBatch of {s.max_batch}"
    if nr.expires_ns and s.max_expires_ns and nr.expires_ns > s.max_expires_ns:
        return f"Exceeded MaxRequestExpires of {format_go_duration_ns(s.max_expires_ns)}"
    if nr.max_bytes and s.max_request_bytes and nr.max_bytes > s.max_request_bytes:
        return f"Exceeded MaxRequestMaxBytes of {s.max_request_bytes}"
    return ""


def _last_stream_seq(c: Consumer) -> int:
    cp = c.parts[0]
    return cp.last_delivered or max(cp.cursor - 1, 0)


def _next(st: State, c: Consumer, reply: str | None, payload: bytes, last: bool = False) -> None:
    """A pull request. It sees every ack sent before it: they are settled first, or,
    when ``last`` and :meth:`State.may_pass` says that cannot change what it takes,
    held for its connection to settle once the messages are on their way."""
    if not reply:
        st.flush_acks()
        return
    settings = st.settings_of(c)
    if settings.deliver_subject:
        st.flush_acks()
        st.send(reply, None, status_message(409, "Consumer is push based"))
        return
    try:
        nr = parse_next_request(payload)
    except ValueError as exc:
        st.flush_acks()
        st.send(reply, None, status_message(400, f"Bad Request - {exc}"))
        return
    refused = _over_limits(settings, nr)
    if refused:
        st.flush_acks()
        st.send(reply, None, status_message(409, refused))
        return
    priority = _priority_refusal(st, c, settings, nr)
    if priority is not None:
        st.flush_acks()
        st.send(reply, None, status_message(*priority))
        return
    if st.acks:
        if last and st.may_pass(c, max(nr.batch, 1)):
            st.hold(c)
        else:
            st.flush_acks()
    st.touch(c)
    if nr.no_wait:
        available = c.num_pending + sum(len(cp.redeliver) for cp in c.parts)
        if not available and not nr.expires_ns:
            st.send(reply, None, status_message(404, "No Messages"))
            return
        if available and available < sum(w.remaining for w in c.waiting):
            # What there is goes to the requests already waiting (the server's rule).
            st.send(reply, None, status_message(408, "Requests Pending"))
            return
    if len(c.waiting) >= c.config.max_waiting:
        if not nr.heartbeat_ns:
            st.send(reply, None, status_message(409, "Exceeded MaxWaiting"))
        return
    engine = st.engine
    req = NatsPull(st, reply, c, nr)
    req.policy = settings.priority_policy
    parts, count, hit = ([], 0, False) if req.passes() else collect(engine, c, req)
    req.remaining -= count
    if req.bytes_left:
        req.bytes_left = max(req.bytes_left - sum(len(p) for p in parts[1::2]), 1)
    if req.remaining <= 0:
        end(req, PullEnd.BATCH_COMPLETE, parts, count)
    elif hit:
        end(req, PullEnd.MAX_BYTES, parts, count)
    elif nr.no_wait and (count or not nr.expires_ns):
        end(req, PullEnd.NO_MESSAGES, parts, count)
    else:
        st.settle_held()  # before it waits: what they free goes to it as it would have
        if count and not req._deliver(parts, count):
            return
        if nr.expires_ns:
            req.expires = st.broker.clock.now_ns() + nr.expires_ns
            engine.pull_timers.add(req)
        c.waiting.append(req)
        st.owner.pulls.add(req)
        if nr.heartbeat_ns:
            st.ticks.arm(req, st.broker.clock.now_ns() + nr.heartbeat_ns)


# -- push consumers ----------------------------------------------------------------------


class PushWindow(NatsPull):
    """One flow-control window of a push consumer: it waits on the consumer like a
    pull and sends to the deliver subject."""

    __slots__ = ("push",)

    def __init__(self, push: Push, max_bytes: int, max_msgs: int = WINDOW_MSGS) -> None:
        nr = NextRequest(max_msgs, max_bytes, 0, False, 0)
        super().__init__(push.state, push.subject, push.consumer, nr)
        self.push = push

    def unheard(self) -> bool:
        """The deliver subject lost its last subscriber: the window goes, and the push
        waits for one (nothing is delivered meanwhile, nothing is lost)."""
        if self.state.broker.subs.match(self.reply_bytes):
            return False
        self.push.unbind()
        return True

    def _deliver(self, parts: list[Any], count: int) -> bool:
        if count:
            reached = self.state.deliver(self.consumer, self.reply, parts, count)
            self.push.delivered(reached, sum(len(p) for p in parts[1::2]))
            if not reached:  # the subscriber went away: wait for another
                self.push.unbind()
                return False
        return True

    def respond(self, status: PullEnd, parts: list[Any], count: int) -> None:
        if self._deliver(parts, count) and status in (PullEnd.BATCH_COMPLETE, PullEnd.MAX_BYTES):
            self.push.window_done()

    def refuse(self, err: BrokerError) -> None:
        pass


class Push:
    """A push consumer's delivery: windows, flow control, the rate limit, replay at the
    original pace, idle heartbeats."""

    def __init__(self, state: State, c: Consumer, settings: PushSettings) -> None:
        self.state = state
        self.consumer = c
        self.subject = settings.deliver_subject
        self.flow_control = settings.flow_control
        self.heartbeat_ns = settings.idle_heartbeat_ns
        self.fc_reply = ""
        self.fc_count = 0
        #: Flow control (nats-server's ``pbytes``, ``maxpb``, ``fcsz``): bytes
        #: delivered and not yet covered by a reply, the current limit, and the bytes
        #: the outstanding request covers.
        self.pending_bytes = 0
        self.max_pending = FC_START_PENDING
        self.fc_size = 0
        #: ``rate_limit_bps``, as the server's token bucket (``setRateLimit``): bytes
        #: a second, a burst of the broker's max payload, the bytes in the bucket
        #: (below zero: owed) as of ``tokens_at``, and a window waiting for them.
        self.rate = settings.rate_limit_bps / 8
        self.burst = state.broker.max_payload
        self.tokens = float(self.burst)
        self.tokens_at = 0
        self.window_held = False
        #: ``replay_policy`` ``original`` (the server's ``o.replay``): until the
        #: consumer is past what the stream held when delivery started, one message
        #: a window, each after the gap between its timestamp and the last one's.
        self.replay_until = 0
        if settings.replay_original:
            self.replay_until = c.parts[0].part.log.next_offset - 1
        self.busy = False  # something was delivered since the last heartbeat tick
        self.window: PushWindow | None = None

    def start(self) -> None:
        self.bind()
        if self.heartbeat_ns:
            self.state.ticks.arm(self, self.state.broker.clock.now_ns() + self.heartbeat_ns)

    def bind(self) -> None:
        """Deliver if the deliver subject has a subscriber (as on the server, a push
        consumer without interest delivers nothing), else wait for one."""
        if self.state.broker.subs.match(self.subject.encode()):
            self.state.unbound.discard(self)
            if self.window is None and self._has_room():
                self.open_window()
        elif not self.consumer.deleted:
            self.state.unbound.add(self)

    def unbind(self) -> None:
        self.stop()
        self.state.unbound.add(self)

    def _has_room(self) -> bool:
        """Flow control lets more go (always, without it), and the rate limit is not
        waiting for its bucket to fill."""
        if self.window_held:
            return False
        return not self.flow_control or self.pending_bytes < self.max_pending

    def _refill(self) -> float:
        """The rate limit's bucket now (tokens are bytes)."""
        now = self.state.broker.clock.now_ns()
        if self.tokens_at:
            self.tokens = min(self.burst, self.tokens + (now - self.tokens_at) * self.rate / 1e9)
        self.tokens_at = now
        return self.tokens

    def open_window(self) -> None:
        c = self.consumer
        if c.deleted:
            return
        room = WINDOW_BYTES
        if self.flow_control:
            room = min(room, max(self.max_pending - self.pending_bytes, 1))
        if self.rate:
            room = min(room, max(int(self._refill()), 1))
        self.window = w = PushWindow(self, room, 1 if self._replaying() else WINDOW_MSGS)
        c.waiting.append(w)
        self.state.owner.pulls.add(w)
        self.state.engine.kick(c)

    def delivered(self, reached: int, size: int) -> None:
        """``reached`` of the messages of ``size`` bytes went out: with flow control,
        they count as pending, and the request goes out once they pass half the
        limit (nats-server's ``needFlowControl``)."""
        self.busy = True
        if reached:
            self.state.touch(self.consumer)
        if self.rate:
            self._refill()
            self.tokens -= size
        if not self.flow_control:
            return
        self.pending_bytes += size
        if not self.fc_reply:
            if self.pending_bytes > self.max_pending // 2:
                self._request_flow()
        elif self.pending_bytes - self.fc_size >= self.max_pending:
            self.fc_size += size

    def _request_flow(self) -> None:
        self.fc_count += 1
        c = self.consumer
        self.fc_reply = f"{FC_PREFIX}{self.state.js.stream_name(c.topic)}.{c.name}.{self.fc_count}"
        self.fc_size = self.pending_bytes
        self.state.flow[self.fc_reply] = self
        if self.state.send(self.subject, self.fc_reply, status_message(100, "FlowControl Request")):
            self.state.touch(c)

    def window_done(self) -> None:
        """The window is used up: the next starts at once, or, with flow control at
        its limit, when the outstanding request is answered."""
        self.window = None
        if self._replaying():
            delay_ns = self._replay_gap()
            if delay_ns > 1_000_000:  # as the server: a gap of a millisecond or less is none
                self.window_held = True
                self.state.ticks.arm(WindowTimer(self), self.state.broker.clock.now_ns() + delay_ns)
                return
        if self.rate and self._refill() < 0:
            # What was sent is owed: the next window waits until the bucket is back
            # at zero (the server's ReserveN delay).
            self.window_held = True
            wait_ns = int(-self.tokens / self.rate * 1e9) + 1
            self.state.ticks.arm(WindowTimer(self), self.tokens_at + wait_ns)
            return
        if self._has_room():
            self.open_window()

    def _replaying(self) -> bool:
        if not self.replay_until:
            return False
        if self.consumer.parts[0].cursor > self.replay_until:
            self.replay_until = 0  # caught up: from here on, as instant
            return False
        return True

    def _replay_gap(self) -> int:
        """Nanoseconds between the last message delivered and the next one the
        consumer will deliver (0 when unknown)."""
        cp = self.consumer.parts[0]
        log_ = cp.part.log
        last = cp.last_delivered
        if not last or not log_.is_live(last):
            return 0
        wanted = cp.wanted()
        for o in range(cp.cursor, self.replay_until + 1):
            if log_.is_live(o) and (wanted is None or wanted(o)):
                return max(log_.timestamp_of(o) - log_.timestamp_of(last), 0)
        return 0

    def tokens_back(self) -> None:
        """A held window's wait is over (the rate limit's, or a replay gap)."""
        self.window_held = False
        if self.window is None and not self.consumer.deleted and self._has_room() and self.state.pushes.get(self.consumer) is self:
            self.open_window()

    def flow_reply(self, subject: str) -> None:
        """The answer to the latest flow-control request (an older one is ignored, as
        on the server): the bytes it covers are no longer pending, the limit doubles
        (up to FC_MAX_PENDING), and delivery goes on."""
        if subject != self.fc_reply:
            return
        self.max_pending = min(self.max_pending * 2, FC_MAX_PENDING)
        self.pending_bytes = max(self.pending_bytes - self.fc_size, 0)
        self._clear_flow()
        if self.window is None and self._has_room():
            self.open_window()

    def _clear_flow(self) -> None:
        self.state.flow.pop(self.fc_reply, None)
        self.fc_reply = ""
        self.fc_size = 0

    def tick(self, now_ns: int) -> None:
        c = self.consumer
        if c.deleted or self.state.pushes.get(c) is not self:  # deleted (by our own API too), or moved
            self.stop()
            return
        if not self.busy:
            if self.state.send(self.subject, None, idle_heartbeat(c.dseq, _last_stream_seq(c), self.fc_reply)):
                self.state.touch(c)
        self.busy = False
        self.state.ticks.arm(self, now_ns + self.heartbeat_ns)

    def stop(self) -> None:
        self.state.unbound.discard(self)
        self._clear_flow()
        self.pending_bytes = 0  # nats-server resets its flow accounting too
        if self.window is not None:
            retire(self.window)
            self.window = None


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


class WindowTimer:
    """When a held push window may open: the rate limit's bucket is back at zero, or a
    replay's gap has passed."""

    def __init__(self, push: Push) -> None:
        self.push = push

    def tick(self, now_ns: int) -> None:
        self.push.tokens_back()


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
            _delete(st, c)
            return
        st.ticks.arm(self, last + self.threshold_ns)


def _delete(st: State, c: Consumer) -> int:
    push = st.pushes.pop(c, None)
    if push is not None:
        push.stop()
    return remove_consumer(st.engine, c)


# -- the API -------------------------------------------------------------------------------


def consumer_api(
    js: JetStream, op: str, tokens: list[str], reply: str | None, headers: bytes | None, payload: bytes,
    last: bool = False,
) -> None:
    """``$JS.API.CONSUMER.<op>.<tokens...>`` (dispatched by ``JetStream.request``;
    ``last``: see there)."""
    st = _state(js)
    if op == "MSG.NEXT":
        c = _lookup(st, tokens)
        if c is None:
            st.flush_acks()
            js.no_responders(reply)  # no consumer: nobody listens there
            return
        _next(st, c, reply, payload, last)
        return
    st.flush_acks()  # a request sees every ack sent before it
    handler = _API.get(op)
    if handler is None:
        js.no_responders(reply)
        return
    kind, fn = handler
    try:
        body, epoch = fn(st, tokens, payload)
    except (JSError, BrokerError) as err:
        js.respond(reply, api_error(kind, err))
        return
    js.respond(reply, api_response(kind, body), epoch=epoch)


def _lookup(st: State, tokens: list[str]) -> Consumer | None:
    if len(tokens) != 2:
        return None
    try:
        topic = st.js.topic(tokens[0])
        return st.engine.consumers_of(topic).get(normalize_name(tokens[1], "consumer name"))
    except (JSError, BrokerError):
        return None


def _find(st: State, tokens: list[str]) -> Consumer:
    if len(tokens) != 2:
        raise JSError(400, 10003, "bad request")
    topic = st.js.topic(tokens[0])
    try:
        c = st.engine.consumers_of(topic).get(normalize_name(tokens[1], "consumer name"))
    except BrokerError:
        c = None
    if c is None:
        raise JSError(404, 10014, "consumer not found")
    return c


def _topic_for_consumers(st: State, stream: str) -> Topic:
    topic = st.js.topic(stream)
    if len(topic.partitions) != 1:
        raise JSError(400, 10094, f"consumers over NATS need a one-partition topic; {topic.full_name} has {len(topic.partitions)} partitions")
    return topic


def _create(st: State, tokens: list[str], payload: bytes, legacy: bool) -> tuple[dict[str, Any], int]:
    req = parse_request(payload)
    if not tokens or not tokens[0]:
        raise JSError(400, 10003, "bad request")
    stream = tokens[0]
    name = ""
    subject_filter = ""
    if legacy:
        if len(tokens) != 2:
            raise JSError(400, 10016, "consumer expected to be durable but no durable name set in subject")
        name = tokens[1]
    elif len(tokens) > 1:
        name = tokens[1]
        subject_filter = ".".join(tokens[2:])
    if req.get("stream_name") != stream:
        raise js_error(STREAM_MISMATCH)
    cfg = req.get("config")
    if not isinstance(cfg, dict):
        raise JSError(400, 10078, "consumer config required")
    if name and any(ch in name for ch in "/\\"):
        raise JSError(400, 10127, "Consumer name can not contain path separators")
    durable = cfg.get("durable_name") or ""
    given = cfg.get("name") or ""
    named = bool(name or given or durable)  # else a made-up name the config leaves out, as the server
    if legacy:
        if not durable:
            raise JSError(400, 10018, "consumer expected to be durable but a durable name was not set")
        if durable != name:
            raise JSError(400, 10017, "consumer name in subject does not match durable name in request")
    elif name:
        if durable and durable != name:
            raise JSError(400, 10017, "consumer name in subject does not match durable name in request")
    else:
        if durable:
            raise JSError(400, 10020, "consumer expected to be ephemeral but a durable name was set in request")
        name = given or secrets.token_hex(4)
    if given and durable and given != durable:
        raise JSError(400, 10132, "Consumer Durable and Name have to be equal if both are provided")
    if subject_filter:
        if cfg.get("filter_subjects"):
            raise JSError(400, 10137, "consumer with multiple subject filters cannot use subject based API")
        if cfg.get("filter_subject") != subject_filter:
            raise JSError(400, 10131, "Consumer create request did not match filtered subject from create subject")
    topic = _topic_for_consumers(st, stream)
    ours, settings = consumer_config_from_nats(cfg, durable=bool(durable))
    if not named:
        settings = dataclasses.replace(settings, named=False)
    if settings != _DURABLE:
        ours["nats"] = dataclasses.asdict(settings)
    try:
        cname = normalize_name(name, "consumer name")
    except BrokerError as err:  # the name rule is ours (stricter than the server's): say so
        raise JSError(400, 10094, err.message) from None
    deliver = settings.deliver_subject.split(".") if settings.deliver_subject else None
    if deliver and any(subject_matches(tuple(s.split(".")), deliver) for s in topic.config.subjects):
        raise JSError(400, 10081, "consumer deliver subject forms a cycle")  # its messages would be stored again
    config = ConsumerConfig.from_map(ours)
    conflict = work_queue_conflict(st.engine, topic, cname, config, push=bool(settings.deliver_subject))
    if conflict is not None:
        raise JSError(400, *conflict)
    action = req.get("action") or ""
    existing = st.engine.consumers_of(topic).get(cname)
    epoch = 0
    if existing is not None:
        if existing.config != config:
            if action == "create":
                raise JSError(400, 10148, "consumer already exists")
            old = st.settings_of(existing)
            if old.durable != settings.durable:
                raise JSError(400, 10148, "consumer already exists")
            existing.config.check_update(config)
            _check_update(st, old, settings, existing.config, config)
            epoch = change_consumer(st.engine, existing, config)
            st.updated(existing, old, settings)
        c = existing
    else:
        if action == "update":
            raise JSError(400, 10149, "consumer does not exist")
        c, epoch = new_consumer(st.engine, topic, cname, config)
        st.start(c, settings)
    return _info(st, c), epoch


def _check_update(st: State, old: PushSettings, new: PushSettings, was: ConsumerConfig, cfg: ConsumerConfig) -> None:
    """Refuse what the server refuses to update (``checkNewConsumerConfig``), after the
    engine's own fixed fields, with its words and its error (500 10012); a push
    consumer's deliver subject may move only while nobody listens on it (10013)."""
    denied = ""
    if old.mem_storage != new.mem_storage:
        denied = "storage type can not be updated"
    elif old.idle_heartbeat_ns != new.idle_heartbeat_ns:
        denied = "heart beats can not be updated"
    elif old.flow_control != new.flow_control:
        denied = "flow control can not be updated"
    elif old.deliver_subject != new.deliver_subject:
        if not old.deliver_subject:
            denied = "can not update pull consumer to push based"
        elif not new.deliver_subject:
            denied = "can not update push consumer to pull based"
        elif st.broker.subs.match(old.deliver_subject.encode()):
            raise JSError(400, 10013, "consumer name already in use")
    if not denied and was.max_waiting != cfg.max_waiting:
        denied = "max waiting can not be updated"
    if denied:
        raise JSError(500, 10012, denied)


def _sequence_info(consumer_seq: int, stream_seq: int, at_ns: int) -> dict[str, Any]:
    """The server's ``SequenceInfo``: ``last_active`` (omitempty) is when the last
    delivery (or ack) happened."""
    out: dict[str, Any] = {"consumer_seq": consumer_seq, "stream_seq": stream_seq}
    if at_ns:
        out["last_active"] = rfc3339(at_ns)
    return out


def _num_waiting(c: Consumer) -> int:
    """The pull requests waiting on ``c`` that someone hears; those nobody hears go
    first (nats-server's ``processWaiting``, which its consumer info runs)."""
    n = 0
    for r in list(c.waiting):
        if isinstance(r, PushWindow) or r.ended:
            continue
        if r.unheard():
            retire(r)
        else:
            n += 1
    return n


def _info(st: State, c: Consumer) -> dict[str, Any]:
    cp = c.parts[0]
    settings = st.settings_of(c)
    info = {
        "stream_name": st.js.stream_name(c.topic),
        "name": c.name,
        "created": rfc3339(c.created_ns),
        "config": consumer_config_to_nats(c.name, c.config.to_map(), settings, EPHEMERAL_INACTIVE_NS),
        "delivered": _sequence_info(c.dseq, _last_stream_seq(c), c.delivered_at),
        "ack_floor": _sequence_info(c._ack_floor_dseq(), cp.ack_floor, c.acked_at),
        "num_ack_pending": c.num_ack_pending,
        "num_redelivered": c.num_redelivered,
        "num_waiting": _num_waiting(c),
        "num_pending": c.num_pending,
    }
    if settings.deliver_subject and st.broker.subs.match(settings.deliver_subject.encode()):
        info["push_bound"] = True  # the server's omitempty: absent unless bound
    remaining = c.paused_until - st.broker.clock.now_ns()
    if remaining > 0:
        info["paused"] = True
        info["pause_remaining"] = remaining
    pin = st.pins.get(c)
    if settings.priority_policy == "pinned_client":
        info["priority_groups"] = [
            {"group": g, **({"pinned_client_id": pin.id, "pinned_ts": rfc3339(pin.since_ns)} if pin is not None and pin.group == g else {})}
            for g in settings.priority_groups.split(",")
        ]
    info["ts"] = rfc3339(st.broker.clock.now_ns())
    return info


def _api_create(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    return _create(st, tokens, payload, legacy=False)


def _api_durable_create(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    return _create(st, tokens, payload, legacy=True)


def _api_info(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    return _info(st, _find(st, tokens)), 0


def _api_delete(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    return {"success": True}, _delete(st, _find(st, tokens))


def _page(st: State, tokens: list[str], payload: bytes, limit: int) -> tuple[list[Consumer], int, int]:
    if len(tokens) != 1:
        raise JSError(400, 10003, "bad request")
    req = parse_request(payload)
    offset = req.get("offset") or 0
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise js_error(INVALID_JSON, "invalid JSON: offset must be a non-negative integer")
    topic = st.js.topic(tokens[0])
    consumers = sorted(st.engine.consumers_of(topic).values(), key=lambda c: c.name)
    return consumers[offset : offset + limit], len(consumers), offset


def _api_names(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    page, total, offset = _page(st, tokens, payload, NAMES_LIMIT)
    return {"total": total, "offset": offset, "limit": NAMES_LIMIT, "consumers": [c.name for c in page]}, 0


def _api_list(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    page, total, offset = _page(st, tokens, payload, LIST_LIMIT)
    return {"total": total, "offset": offset, "limit": LIST_LIMIT, "consumers": [_info(st, c) for c in page]}, 0


def _optional_body(payload: bytes) -> dict[str, Any]:
    """A request body that may be empty (then ``{}``)."""
    return parse_request(payload) if bytes(payload).strip() else {}


def _api_pause(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    """``CONSUMER.PAUSE.<stream>.<consumer>`` with ``{"pause_until": time}`` (none, or
    Go's zero time: resume), as the server answers it; the change is in the
    consumer's configuration (journaled), so it survives a restart."""
    c = _find(st, tokens)
    req = _optional_body(payload)
    until = parse_pause_until(req.get("pause_until"))
    old = st.settings_of(c)
    new = dataclasses.replace(old, pause_until_ns=until)
    epoch = change_consumer(st.engine, c, ConsumerConfig.from_map({**c.config.to_map(), "nats": dataclasses.asdict(new)}))
    st.updated(c, old, new)
    body: dict[str, Any] = {"paused": False, "pause_until": rfc3339(until)}
    remaining = until - st.broker.clock.now_ns()
    if remaining > 0:
        body["paused"] = True
        body["pause_remaining"] = remaining
    return body, epoch


def _api_unpin(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    """``CONSUMER.UNPIN.<stream>.<consumer>`` with ``{"group": name}`` (ADR-42): the
    pinned client of that group is unpinned; the next request gets a new pin."""
    c = _find(st, tokens)
    group = _optional_body(payload).get("group") or ""
    if not group:
        raise JSError(400, 10025, "invalid JSON: consumer group not specified")
    check_group_name(group)
    if group not in st.settings_of(c).priority_groups.split(","):
        raise JSError(400, 10160, "Provided priority group does not exist for this consumer")
    st.unpin(c)
    return {}, 0


_API = {
    "CREATE": ("consumer_create", _api_create),
    "UNPIN": ("consumer_unpin", _api_unpin),
    "PAUSE": ("consumer_pause", _api_pause),
    "DURABLE.CREATE": ("consumer_create", _api_durable_create),
    "INFO": ("consumer_info", _api_info),
    "DELETE": ("consumer_delete", _api_delete),
    "NAMES": ("consumer_names", _api_names),
    "LIST": ("consumer_list", _api_list),
}


# -- acks --------------------------------------------------------------------------------------


def ack(js: JetStream, subject: str, reply: str | None, payload: bytes) -> None:
    """A ``$JS.ACK...`` acknowledgement or a ``$JS.FC...`` flow-control answer."""
    st = _state(js)
    if subject.startswith(FC_PREFIX):
        push = st.flow.get(subject)
        if push is not None:
            push.flow_reply(subject)
        return
    found = st.consumer_of_ack(subject)
    if found is None:
        return
    c, stream_seq = found
    try:
        kind, value = parse_ack_body(payload)
    except ValueError:
        return
    if kind == ACK_NEXT:
        st.queue_ack(c, (AckKind.ACK, 0, stream_seq, 0), None)
        st.flush_acks()
        if reply:
            _next(st, c, reply, str(value).encode())
        return
    st.queue_ack(c, (kind, 0, stream_seq, -(-value // MS) if value else 0), reply)


async def run(js: JetStream) -> None:
    """Settles the acks a turn of the event loop brought (``JetStream.run`` runs it)."""
    st = _state(js)
    while True:
        await st.ack_wake.wait()
        st.ack_wake = trio.Event()
        try:
            st.flush_acks()
        except Exception:
            log.error("js_ack_flush_failed", exc_info=True)
