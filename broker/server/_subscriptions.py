"""The binary protocol's core subscriptions: SUBSCRIBE, UNSUBSCRIBE, and the
:class:`Subscription` a session holds for each (``broker.core``'s subscription index
files it beside the NATS ones and picks the subscribers of each message)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import protocol as P
from protocol import ErrorCode, ProtocolConnection, PushKind, error_class, validate_filter

from broker.core import Broker, Counters, Reply, subject_too_long, subscription_footprint

__all__ = ["Subscriber", "Subscription", "subscribe", "unsubscribe"]


class Subscriber(Protocol):
    """A binary-protocol session, as its subscriptions see it."""

    #: Its subscriptions, by subscription id.
    subs: dict[int, Subscription]
    broker: Broker
    #: What its user may do (None: everything): ``broker.auth.Permissions``.
    perms: Any

    @property
    def conn(self) -> ProtocolConnection: ...

    def accepts_pushes(self) -> bool: ...

    def has_room(self, n: int) -> bool: ...

    def push(self, kind: PushKind, payload: bytes) -> bool: ...

    def send_durable(self, epoch: int, frame: bytes) -> None: ...

#: The place a core message's record names in a DELIVERY: no stream, topic or
#: partition (offset 0), as an unrouted publish of ours.
_NO_PLACE = P.delivery_entry(0, 0, 0)


class Subscription:
    """One SUBSCRIBE of a binary-protocol session (``core.Subscriber``). ``replies``:
    it was made with ``SUBSCRIBE_REPLIES``, so the messages that carry a reply subject
    (requests, of either protocol) come with it; without, they come as any message
    (a client that does not know the field never sees it)."""

    __slots__ = ("session", "sid", "subject_filter", "tokens", "delivered", "dropped", "footprint", "replies")

    #: Binary-protocol subscriptions have no queue groups.
    queue = None

    def __init__(self, session: Subscriber, sid: int, subject_filter: str, replies: bool = False) -> None:
        self.session = session
        self.sid = sid
        self.subject_filter = subject_filter
        self.replies = replies
        self.tokens = tuple(subject_filter.split("."))
        self.delivered = 0
        self.dropped = 0
        #: What it counts against the subscription budget (``broker.core``).
        self.footprint = subscription_footprint(subject_filter, len(self.tokens))

    def deliver_records(self, parts: list[bytes | memoryview], counters: Counters) -> None:
        """One DELIVERY push of every record in ``parts`` (entry heads and records)."""
        self._push(parts, counters)

    def deliver_request(self, parts: list[bytes | memoryview], counters: Counters, reply: bytes) -> bool:
        """One DELIVERY push of a request's records, with its reply subject when the
        subscription asked for reply subjects."""
        return self._push([*parts, P.delivery_reply(reply)] if self.replies else parts, counters)

    def _push(self, parts: list[bytes | memoryview], counters: Counters) -> bool:
        """Push the DELIVERY of ``parts`` (entry heads and records, and after them
        the reply subject of a request) and count it; False: dropped."""
        count = len(parts) // 2
        payload = P.encode_delivery(self.sid, count, parts)
        if self.session.push(P.PushKind.DELIVERY, payload):
            self.delivered += count
            counters.messages_out += count
            counters.bytes_out += len(payload)
            return True
        self.dropped += count
        counters.deliveries_dropped += count
        return False

    def send_core(
        self, subject: bytes, reply: bytes | None, headers: bytes | None, payload: bytes | memoryview, epoch: int,
        record: Callable[[], bytes], skip: object,
    ) -> bool:
        """A core message as a DELIVERY of its record at offset 0, with its reply
        subject when it has one and the subscription asked for reply subjects; none
        when ttlbroker cannot carry its subject or headers."""
        rec = record()
        if not rec:
            return False  # a subject or headers ttlbroker cannot carry: NATS subscribers only
        if reply and self.replies:
            delivery = P.encode_delivery(self.sid, 1, (_NO_PLACE, rec, P.delivery_reply(reply)))
        else:
            delivery = P.encode_delivery(self.sid, 1, (_NO_PLACE, rec))
        session = self.session
        counters = session.broker.counters
        if not epoch:
            pushed = session.push(P.PushKind.DELIVERY, delivery)
        else:
            pushed = session.has_room(len(delivery) + 16)
            if pushed:
                session.send_durable(epoch, session.conn.send_push(P.PushKind.DELIVERY, delivery))
        if pushed:
            self.delivered += 1
            counters.messages_out += 1
            counters.bytes_out += len(payload)
        else:
            self.dropped += 1
            counters.deliveries_dropped += 1
        return pushed


class FilteredSubscription(Subscription):
    """A SUBSCRIBE wider than one of its user's deny entries (``orders.>`` with
    ``orders.secret`` denied): messages on a denied subject are not delivered, as
    on the NATS listener. Also the SUBSCRIBE of a user with ``allow_responses``:
    the reply subject of each request delivered to it may be published to (the
    user's ``Permissions.received_reply``)."""

    __slots__ = ("perms",)

    def __init__(self, session: Subscriber, sid: int, subject_filter: str, perms: Any, replies: bool = False) -> None:
        super().__init__(session, sid, subject_filter, replies)
        self.perms = perms

    def _denied(self, subject: bytes) -> bool:
        return bool(self.perms.delivery_denied(subject.decode(errors="replace"), None))

    def _kept(self, parts: list[bytes | memoryview]) -> list[bytes | memoryview]:
        """The entries of ``parts`` on subjects the user is not denied."""
        kept: list[bytes | memoryview] = []
        head = P.RECORD_FIXED.size
        for i in range(0, len(parts), 2):
            rec = parts[i + 1]
            sl = P.RECORD_FIXED.unpack_from(rec, 0)[6]
            if not self._denied(bytes(rec[head : head + sl])):
                kept += (parts[i], rec)
        return kept

    def deliver_records(self, parts: list[bytes | memoryview], counters: Counters) -> None:
        kept = self._kept(parts)
        if kept:
            super().deliver_records(kept, counters)

    def deliver_request(self, parts: list[bytes | memoryview], counters: Counters, reply: bytes) -> bool:
        kept = self._kept(parts)
        if not kept or not super().deliver_request(kept, counters, reply):
            return False
        self._may_answer(reply)
        return True

    def _may_answer(self, reply: bytes) -> None:
        if self.perms.responses is not None:
            self.perms.received_reply(reply.decode(errors="replace"))

    def send_core(
        self, subject: bytes, reply: bytes | None, headers: bytes | None, payload: bytes | memoryview, epoch: int,
        record: Callable[[], bytes], skip: object,
    ) -> bool:
        if self._denied(subject) or not super().send_core(subject, reply, headers, payload, epoch, record, skip):
            return False
        if reply:
            self._may_answer(reply)
        return True


def subscribe(broker: Broker, session: Subscriber, cmd: P.Subscribe) -> Reply:
    """SUBSCRIBE, within the connection's limits and the broker's subscription budget.

    Raises:
        InvalidSubjectFilterError: not a filter, or longer than
            ``limits.max_subscription_subject_bytes``.
        SubscriptionExistsError, TooManySubscriptionsError: the connection's id or limit.
        SubscriptionBudgetExceededError: the broker's subscriptions hold
            ``limits.max_subscription_bytes_total``.
    """
    validate_filter(cmd.subject_filter)
    if cmd.subscription_id in session.subs:
        raise error_class(ErrorCode.SUBSCRIPTION_EXISTS)(f"subscription id {cmd.subscription_id} is already in use")
    limits = broker.config.limits
    limit = limits.max_subscriptions_per_connection
    if len(session.subs) >= limit:
        broker.counters.subscriptions_refused += 1
        raise error_class(ErrorCode.TOO_MANY_SUBSCRIPTIONS)(f"a connection may hold at most {limit} subscriptions")
    longest = limits.max_subscription_subject_bytes
    if subject_too_long(cmd.subject_filter, None, longest):
        broker.counters.subscriptions_refused += 1
        raise error_class(ErrorCode.INVALID_SUBJECT_FILTER)(
            f"subject filter {cmd.subject_filter[:40]!r}... is longer than limits.max_subscription_subject_bytes ({longest} bytes)")
    perms = session.perms
    if perms is not None and (perms.responses is not None or perms.needs_delivery_check(cmd.subject_filter, None)):
        sub: Subscription = FilteredSubscription(session, cmd.subscription_id, cmd.subject_filter, perms, cmd.replies)
    else:
        sub = Subscription(session, cmd.subscription_id, cmd.subject_filter, cmd.replies)
    session.subs[cmd.subscription_id] = sub
    try:
        broker.subs.add(sub)
    except error_class(ErrorCode.SUBSCRIPTION_BUDGET_EXCEEDED):  # counted by the index
        del session.subs[cmd.subscription_id]
        raise
    return b""


def unsubscribe(broker: Broker, session: Subscriber, cmd: P.Unsubscribe) -> Reply:
    sub = session.subs.pop(cmd.subscription_id, None)
    if sub is None:
        raise error_class(ErrorCode.SUBSCRIPTION_NOT_FOUND)(f"no subscription with id {cmd.subscription_id}")
    broker.subs.remove(sub)
    return b""
