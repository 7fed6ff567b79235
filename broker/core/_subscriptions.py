"""Core subscriptions: who receives a published message, at most once.

A subscription is a subject filter held by one connection, of either protocol
(a NATS ``SUB`` is a ``_nats_core.NatsSubscription``; one with a queue group gets
each message only if it is the member of its group picked for that message, at
random, as nats-server does). Matching a published subject against every
subscription would cost O(subscriptions) per message, so the answer is cached per
subject (cleared when subscriptions change or the cache grows past
``CACHE_LIMIT``), and a miss looks only at the subscriptions that can match: they
are filed by their first two tokens when both are literal (every NATS client's
reply inbox ``_INBOX.<id>.*`` has its own bucket, so the acks and replies of many
clients, each to a subject of its own, do not each scan them all), by their first
token when only it is, and apart when it is a wildcard. With no subscription at
all, publishing skips this entirely.

Replies go to subjects seen once (nats-py's ``_INBOX.<id>.<n>``, one ``n`` per
request), so the cache per subject would only miss. When every subscription that
could match a subject has nothing but wildcards after its first two tokens (the
inbox's ``_INBOX.<id>.*``), the answer depends on the subject's first two tokens and
its number of tokens alone: it is cached under that *shape* too, and a subject of the
same shape takes it from there (no queue groups; cleared with the other cache).

The SUBSCRIBE and UNSUBSCRIBE handlers are here too, and ``deliver``, which pushes
published (and republished or marker) records to the matching subscriptions.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import protocol as P
from protocol import ErrorCode, error_class, subject_matches, validate_filter

if TYPE_CHECKING:
    from ._broker import Broker, Reply
    from broker.server._session import Session

__all__ = ["Subscription", "SubscriptionIndex", "deliver", "subscribe", "unsubscribe"]

CACHE_LIMIT = 100_000


class Subscription:
    __slots__ = ("session", "sid", "subject_filter", "tokens", "delivered", "dropped")

    def __init__(self, session: Session, sid: int, subject_filter: str) -> None:
        self.session = session
        self.sid = sid
        self.subject_filter = subject_filter
        self.tokens = tuple(subject_filter.split("."))
        self.delivered = 0
        self.dropped = 0


class SubscriptionIndex:
    def __init__(self) -> None:
        self._all: set[Any] = set()
        #: The subscriptions by their first two tokens, by their first token alone
        #: (the second is a wildcard, or there is none), and those whose first token
        #: is a wildcard: each subscription is in one of the three.
        self._by_two: dict[tuple[str, str], set[Any]] = {}
        self._by_one: dict[str, set[Any]] = {}
        self._wild: set[Any] = set()
        #: Members of NATS queue groups (also in ``_all``).
        self._queued = 0
        self._cache: dict[bytes, tuple[Any, ...]] = {}
        #: (first token, second token, number of tokens) -> the answer for any subject
        #: of that shape, when no subscription that could match it looks further.
        self._shapes: dict[tuple[bytes, bytes, int], tuple[Any, ...]] = {}
        #: subject -> its queue groups' matching members (only with queue groups).
        self._groups: dict[bytes, tuple[tuple[Any, ...], ...]] = {}
        #: Called with each subscription added (a NATS push consumer starts delivering
        #: once its deliver subject has a subscriber, ``_js_consumers.py``).
        self.on_add: list[Any] = []

    def __len__(self) -> int:
        return len(self._all)

    def _place(self, tokens: tuple[str, ...]) -> tuple[dict[Any, set[Any]] | None, Any]:
        """Where a subscription with these filter tokens is filed: (table, key), or
        (None, None) for the wildcard-first ones."""
        first = tokens[0]
        if first == "*" or first == ">":
            return None, None
        if len(tokens) > 1 and tokens[1] != "*" and tokens[1] != ">":
            return self._by_two, (first, tokens[1])
        return self._by_one, first

    def add(self, sub: Any) -> None:
        self._all.add(sub)
        table, key = self._place(sub.tokens)
        (self._wild if table is None else table.setdefault(key, set())).add(sub)
        if getattr(sub, "queue", None):
            self._queued += 1
        self._cache = {}
        self._shapes = {}
        self._groups = {}
        for fn in self.on_add:
            fn(sub)

    def remove(self, sub: Any) -> None:
        if sub in self._all:
            self._all.discard(sub)
            table, key = self._place(sub.tokens)
            if table is None:
                self._wild.discard(sub)
            else:
                bucket = table[key]
                bucket.discard(sub)
                if not bucket:
                    del table[key]
            if getattr(sub, "queue", None):
                self._queued -= 1
        self._cache = {}
        self._shapes = {}
        self._groups = {}

    def match(self, subject: bytes) -> tuple[Any, ...]:
        """Subscriptions that get a message on ``subject``: those whose filter
        matches, with one member of each queue group. Runtime complexity: O(1) on a
        cache hit, of the subject or of its shape (plus O(groups) with queue
        groups), O(subscriptions) on a miss."""
        hit = self._cache.get(subject)
        if hit is None:
            shape = None
            if not self._queued:
                parts = subject.split(b".", 2)
                if len(parts) == 3:
                    shape = (parts[0], parts[1], parts[2].count(b".") + 3)
                    hit = self._shapes.get(shape)
                    if hit is not None:
                        return hit
            return self._miss(subject, shape)
        if self._queued:
            groups_of = self._groups.get(subject)
            if groups_of:
                return hit + tuple(random.choice(g) for g in groups_of)
        return hit

    def _miss(self, subject: bytes, shape: tuple[bytes, bytes, int] | None) -> tuple[Any, ...]:
        """:meth:`match` of a subject in neither cache: look at the subscriptions that
        can match, and cache the answer under the subject, or under its ``shape``
        when none of them has anything but wildcards after its second token."""
        if len(self._cache) >= CACHE_LIMIT or len(self._shapes) >= CACHE_LIMIT:
            self._cache = {}
            self._shapes = {}
            self._groups = {}
        tokens = subject.decode(errors="replace").split(".")
        candidates = list(self._wild)
        one = self._by_one.get(tokens[0])
        if one:
            candidates += one
        two = self._by_two.get((tokens[0], tokens[1])) if len(tokens) > 1 else None
        if two:
            candidates += two
        found = [s for s in candidates if subject_matches(s.tokens, tokens)]
        if shape is not None and all(_wild_after_two(s.tokens) for s in candidates):
            self._shapes[shape] = hit = tuple(found)
            return hit
        if self._queued:
            groups: dict[str, list[Any]] = {}
            for s in found:
                if getattr(s, "queue", None):
                    groups.setdefault(s.queue, []).append(s)
            if groups:
                found = [s for s in found if not getattr(s, "queue", None)]
                self._groups[subject] = groups_of = tuple(tuple(g) for g in groups.values())
                self._cache[subject] = hit = tuple(found)
                return hit + tuple(random.choice(g) for g in groups_of)
        self._cache[subject] = hit = tuple(found)
        return hit


def _wild_after_two(tokens: tuple[str, ...]) -> bool:
    """Does a filter with these tokens match a subject whatever the subject's tokens
    after its second (given their number)?"""
    for t in tokens[2:]:
        if t != "*" and t != ">":
            return False
    return True


# -- handlers ------------------------------------------------------------------


def subscribe(broker: Broker, session: Any, cmd: P.Subscribe) -> Reply:
    validate_filter(cmd.subject_filter)
    if cmd.subscription_id in session.subs:
        raise error_class(ErrorCode.SUBSCRIPTION_EXISTS)(f"subscription id {cmd.subscription_id} is already in use")
    limit = broker.config.limits.max_subscriptions_per_connection
    if len(session.subs) >= limit:
        raise error_class(ErrorCode.TOO_MANY_SUBSCRIPTIONS)(f"a connection may hold at most {limit} subscriptions")
    sub = Subscription(session, cmd.subscription_id, cmd.subject_filter)
    session.subs[cmd.subscription_id] = sub
    broker.subs.add(sub)
    return b""


def unsubscribe(broker: Broker, session: Any, cmd: P.Unsubscribe) -> Reply:
    sub = session.subs.pop(cmd.subscription_id, None)
    if sub is None:
        raise error_class(ErrorCode.SUBSCRIPTION_NOT_FOUND)(f"no subscription with id {cmd.subscription_id}")
    broker.subs.remove(sub)
    return b""


# -- core deliveries -------------------------------------------------------------


def deliver(broker: Broker, entries: list[tuple[bytes, bytes, memoryview | bytes]]) -> None:
    """Deliver ``(subject, entry head, record)`` to matching subscriptions, in the
    order given (publish order), one DELIVERY push per subscription."""
    match = broker.subs.match
    batches: dict[Subscription, list[bytes | memoryview]] = {}
    for subj, head, rec in entries:
        subs = match(subj)
        if not subs:
            continue
        for sub in subs:
            parts = batches.get(sub)
            if parts is None:
                batches[sub] = parts = []
            parts.append(head)
            parts.append(rec)
    for sub in [s for s in batches if not s.session.accepts_pushes()]:
        count = len(batches.pop(sub)) // 2  # not even encoded: it would be dropped
        sub.dropped += count
        broker.counters.deliveries_dropped += count
    _flush_deliveries(broker, batches)


def _flush_deliveries(broker: Broker, batches: dict[Subscription, list[bytes | memoryview]]) -> None:
    for sub, parts in batches.items():
        if sub.__class__ is not Subscription:  # a NATS SUB (_nats_core.py)
            sub.deliver_records(parts[1::2])  # type: ignore[attr-defined]
            continue
        count = len(parts) // 2
        payload = P.encode_delivery(sub.sid, count, parts)
        if sub.session.push(P.PushKind.DELIVERY, payload):
            sub.delivered += count
            broker.counters.messages_out += count
            broker.counters.bytes_out += len(payload)
        else:
            sub.dropped += count
            broker.counters.deliveries_dropped += count
