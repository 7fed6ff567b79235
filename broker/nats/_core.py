"""Core (unstored) messages across both protocols, and NATS subscriptions.

A NATS ``SUB`` is a :class:`NatsSubscription` in the broker's one subscription
index (``_subscriptions.py``), next to the ttlbroker SUBSCRIBEs, so a message
reaches every matching subscription of both protocols whichever protocol sent it:

* stored messages (and unrouted ones a ttlbroker client publishes) go through
  ``_subscriptions.deliver``, which hands a NATS subscription its records
  (:meth:`NatsSubscription.deliver_records`: ``MSG``/``HMSG`` without a reply), and
  a ttlbroker request's (a PUBLISH with a reply subject) through
  ``deliver_request``, with its reply subject;
* core messages a NATS client publishes (a subject no topic captures), replies of
  the JetStream API and consumer deliveries go through :func:`send_core`, which
  keeps the reply subject for NATS subscribers and for the ttlbroker subscriptions
  that asked for reply subjects (``SUBSCRIBE_REPLIES``), and gives ttlbroker
  subscribers a record with offset 0, as an unrouted publish does.

Queue groups (``SUB subject queue sid``): the index gives each message to one member
of each group, chosen at random, as nats-server does. ``UNSUB sid max`` removes the
subscription once it has delivered ``max`` messages in all.

Deliveries are at most once: a connection over its output limit, or a broker over
its output budget, drops them and counts them (``broker.net``, rule 2 of its limits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeGuard

import protocol as P

import protocol.nats as PN
from protocol.nats import encode_msg, nats_message_of_record

from broker.core import Broker, Counters, subscription_footprint

__all__ = [
    "CheckedSubscription", "NatsClient", "NatsSubscription", "Queued", "plain_subscriptions", "send_core", "send_pub_acks",
    "send_queued", "send_run",
]

class NatsClient(Protocol):
    """A NATS connection, as its subscriptions see it (``_session.NatsSession``)."""

    broker: Broker
    #: Whether its CONNECT said it reads headers (HMSG).
    headers: bool
    #: What its user may do (None: everything): ``broker.auth.Permissions``.
    perms: Any
    #: Messages (MSG/HMSG) queued to it, and their payload bytes (headers included).
    out_msgs: int
    out_bytes: int

    def accepts_pushes(self) -> bool: ...

    def has_room(self, n: int) -> bool:
        """Whether ``n`` more bytes of deliveries may be queued to it."""
        ...

    def push_nats(self, data: bytes, epoch: int = 0, direct: bool = False) -> bool: ...

    def remove_subscription(self, sub: NatsSubscription) -> None: ...


class NatsSubscription:
    """One NATS ``SUB`` of a :class:`NatsClient`."""

    #: Each message is looked at before it goes (:class:`CheckedSubscription`): a
    #: batch to it is sent one message at a time.
    checked = False

    __slots__ = (
        "session", "sid", "sid_bytes", "subject_filter", "tokens", "queue", "remaining", "delivered", "dropped", "footprint",
    )

    def __init__(self, session: NatsClient, sid: str, subject_filter: str, queue: str | None) -> None:
        self.session = session
        self.sid = sid
        self.sid_bytes = sid.encode()
        self.subject_filter = subject_filter
        self.tokens = tuple(subject_filter.split("."))
        self.queue = queue
        #: What it counts against the subscription budget (``broker.core``).
        self.footprint = subscription_footprint(subject_filter, len(self.tokens), queue, sid)
        #: Messages left before an ``UNSUB sid max`` removes it (None: no limit).
        self.remaining: int | None = None
        self.delivered = 0
        self.dropped = 0

    def send(
        self, subject: bytes, reply: bytes | None, headers: bytes | None, payload: bytes | memoryview, epoch: int = 0,
    ) -> bool:
        """Queue one MSG/HMSG (with ``epoch``: to go once it is durable); False when
        it was dropped (the connection is full)."""
        session = self.session
        if headers is not None and not session.headers:
            headers = None  # a client without header support gets the payload alone
        if not session.push_nats(encode_msg(subject, self.sid_bytes, reply, headers, payload), epoch):
            self.dropped += 1
            session.broker.counters.deliveries_dropped += 1
            return False
        self.delivered += 1
        counters = session.broker.counters
        counters.messages_out += 1
        counters.bytes_out += len(payload)
        session.out_msgs += 1
        session.out_bytes += len(payload) + (len(headers) if headers is not None else 0)
        if self.remaining is not None:
            self.remaining -= 1
            if self.remaining <= 0:
                session.remove_subscription(self)
        return True

    def room(self, n: int) -> int:
        """How many of ``n`` messages it takes before an ``UNSUB sid max`` removes it."""
        return n if self.remaining is None else max(min(n, self.remaining), 0)

    def send_frames(self, frames: bytes, n: int, payload_bytes: int, epoch: int = 0) -> int:
        """Queue ``n`` messages already encoded for it (a pull batch, at most
        :meth:`room`) as one write (with ``epoch``: once it is durable); returns how
        many were queued (0: dropped, the connection is full)."""
        session = self.session
        counters = session.broker.counters
        if not session.push_nats(frames, epoch):
            self.dropped += n
            counters.deliveries_dropped += n
            return 0
        self.delivered += n
        counters.messages_out += n
        counters.bytes_out += payload_bytes
        session.out_msgs += n
        session.out_bytes += payload_bytes
        if self.remaining is not None:
            self.remaining -= n
            if self.remaining <= 0:
                session.remove_subscription(self)
        return n

    def deliver_records(self, parts: list[bytes | memoryview], counters: Counters) -> None:
        """Stored (or unrouted) records from ``SubscriptionIndex.deliver`` (entry heads
        and records, alternating), in order, as ``MSG``/``HMSG`` without a reply."""
        self._send_records(parts, None)

    def deliver_request(self, parts: list[bytes | memoryview], counters: Counters, reply: bytes) -> bool:
        """The records of a ttlbroker request (a PUBLISH with a reply subject), as
        ``MSG``/``HMSG`` with ``reply``; True when one went at least."""
        return self._send_records(parts, reply)

    def _send_records(self, parts: list[bytes | memoryview], reply: bytes | None) -> bool:
        sent = False
        for rec in parts[1::2]:
            if self.remaining is not None and self.remaining <= 0:
                break
            subject, headers, payload = nats_message_of_record(rec)
            sent = self.send(subject, reply, headers, payload) or sent
        return sent

    def send_core(
        self, subject: bytes, reply: bytes | None, headers: bytes | None, payload: bytes | memoryview, epoch: int,
        record: Callable[[], bytes], skip: object,
    ) -> bool:
        """A core message, with its reply subject (nothing for the subscriptions of
        ``skip``, a publisher whose CONNECT said ``echo: false``)."""
        return self.session is not skip and self.send(subject, reply, headers, payload, epoch)


class CheckedSubscription(NatsSubscription):
    """A subscription of a user with permissions that look at each message it is
    given: a subject the user is denied (a wildcard or queue subscription wider
    than a deny entry) is not delivered, as nats-server drops it
    (``checkDenySub``); a reply subject is remembered for ``allow_responses``."""

    checked = True
    __slots__ = ()

    def send(
        self, subject: bytes, reply: bytes | None, headers: bytes | None, payload: bytes | memoryview, epoch: int = 0,
    ) -> bool:
        perms = self.session.perms
        if perms.delivery_denied(subject.decode(errors="replace"), self.queue):
            return False
        if reply and perms.responses is not None:
            perms.received_reply(reply.decode(errors="replace"))
        return super().send(subject, reply, headers, payload, epoch)


#: Core messages queued for one connection (``send_run``): the pieces of their MSG
#: frames (two each, the second may be empty; or one each, the frames whole), their
#: payloads' sizes, and the subscription of each.
Queued = tuple[list[bytes | bytearray], list[int], list["NatsSubscription"]]


def send_run(
    session: NatsClient, pieces: list[bytes | bytearray], sizes: list[int], subs: list[NatsSubscription],
    direct: bool = False, epoch: int = 0, whole: bool = False,
) -> None:
    """Queue core messages for ``session``, in order: ``MSG`` frames without headers,
    two pieces each (``whole``: one each), the ``i``-th to ``subs[i]`` with a
    payload of ``sizes[i]`` bytes. One write when the connection has room for all
    of them, else one by one while it has room (the rest are dropped, as
    :meth:`NatsSubscription.send` drops them). ``direct``: the write is made at once
    when it can be (``Transport.send_direct``: a request, whose requester waits,
    rather than a flood, whose writes the subscriber's writer task takes together).
    ``epoch``: it goes once that group-commit epoch is durable (PubAcks)."""
    data = b"".join(pieces)
    if len(subs) > 1 and not session.has_room(len(data)):
        for i, sub in enumerate(subs):
            frame = pieces[i] if whole else pieces[2 * i] + pieces[2 * i + 1]
            sub.send_frames(bytes(frame), 1, sizes[i], epoch)
        return
    counters = session.broker.counters
    n = len(subs)
    if not session.push_nats(data, epoch, direct):
        for sub in subs:
            sub.dropped += 1
        counters.deliveries_dropped += n
        return
    for sub in subs:
        sub.delivered += 1
    size = sum(sizes)
    counters.messages_out += n
    counters.bytes_out += size
    session.out_msgs += n
    session.out_bytes += size


def send_queued(frames: dict[NatsClient, Queued], direct: bool = False, epoch: int = 0, whole: bool = False) -> None:
    """Send what is queued in ``frames`` (``send_run``), and empty the queues."""
    for session, (pieces, sizes, subs) in frames.items():
        if subs:
            send_run(session, pieces, sizes, subs, direct, epoch, whole)
            pieces.clear()
            sizes.clear()
            subs.clear()


def plain_subscriptions(subs: tuple[Any, ...] | None) -> TypeGuard[tuple[NatsSubscription, ...]]:
    """Whether a message to ``subs`` (``SubscriptionIndex.match_fixed``) may be
    queued for ``send_run``: they are all plain NATS subscriptions (no permission
    to check, no ``UNSUB max``) and are the same for every message on the subject."""
    if subs is None:
        return False
    for sub in subs:
        if sub.__class__ is not NatsSubscription or sub.remaining is not None:
            return False
    return True


def send_pub_acks(broker: Broker, replies: list[bytes], seqs: list[int], form: bytes, epoch: int = 0) -> None:
    """:func:`send_core` of each PubAck ``form % seqs[i]`` to ``replies[i]`` (no
    headers, no reply), in order: the PubAcks of one stream in one group commit,
    ``form`` its ``pub_ack_format``. The replies are matched as a run
    (``SubscriptionIndex.match_run``); those that reach only plain NATS
    subscriptions go to each connection as one write, each ``MSG`` frame one format
    of a template of the subscription and the stream (the PubAck's length follows
    the number of digits of its sequence)."""
    frames: dict[NatsClient, Queued] = {}
    found = broker.subs.match_run(replies)
    plain: tuple[NatsSubscription, ...] | None = None
    each: list[tuple[NatsSubscription, bytes, Queued]] = []
    size = low = high = 0
    for reply, seq, subs in zip(replies, seqs, found):
        if plain is None or subs is not plain:  # (the answer of the reply before: checked)
            if not plain_subscriptions(subs):
                plain = None
                send_queued(frames, epoch=epoch, whole=True)
                send_core(broker, reply.decode(), None, None, form % seq, epoch=epoch)
                continue
            plain = subs
            each = []
            for sub in plain:
                queued = frames.get(sub.session)
                if queued is None:
                    queued = frames[sub.session] = ([], [], [])
                each.append((sub, b"MSG %s " + sub.sid_bytes.replace(b"%", b"%%") + b" %d\r\n" + form + b"\r\n", queued))
        if not low <= seq < high:  # (the same number of digits: the same length)
            size = len(form % seq)
            digits = len(str(seq))
            low, high = (10 ** (digits - 1) if digits > 1 else 0), 10 ** digits
        for sub, template, queued in each:
            queued[0].append(template % (reply, size, seq))
            queued[1].append(size)
            queued[2].append(sub)
    send_queued(frames, epoch=epoch, whole=True)


def send_core(
    broker: Broker, subject: str, reply: str | None, headers: bytes | None, payload: bytes | memoryview,
    origin: Any = None, shown: bytes | None = None, epoch: int = 0,
) -> int:
    """Deliver one core (not stored) message to every matching core subscription of
    both protocols (one member of each queue group); returns how many took it.
    ``headers`` is a whole NATS header block or None. ``origin``: the publishing
    NATS session, whose own subscriptions are skipped when its CONNECT said
    ``echo: false``. ``shown``: the subject the message carries when it is not the
    one it is sent to (a JetStream delivery to an inbox shows the stored subject).
    ``epoch``: a group-commit epoch not yet durable; each subscriber's connection
    holds the message until the sync that makes it durable, which writes it
    (``Transport.send_durable``: no task switch between the fsync and the answer)."""
    raw = subject.encode()
    subs = broker.subs.match(raw)
    if not subs:
        return 0
    subj = shown or raw
    rep = reply.encode() if reply else None
    made: list[bytes] = []

    def record() -> bytes:  # made once, for the ttlbroker subscribers only
        if not made:
            made.append(_record(broker, subj, headers, payload))
        return made[0]

    skip = origin if origin is not None and not origin.echo else None
    reached = 0
    for sub in subs:
        if sub.send_core(subj, rep, headers, payload, epoch, record, skip):
            reached += 1
    return reached


def _record(broker: Broker, subject: bytes, headers: bytes | None, payload: bytes | memoryview) -> bytes:
    """The record a ttlbroker subscriber gets for a core message (offset 0), or b""
    when the subject (over 255 bytes) or the headers break ttlbroker's rules."""
    try:
        block = PN.nats_to_record_headers(headers) if headers else b""
        body = P.encode_body(subject, payload, block)
    except P.BrokerError:
        return b""
    return P.encode_record(0, broker.clock.now_ns(), body)
