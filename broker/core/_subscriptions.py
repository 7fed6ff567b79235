"""Core subscriptions: who receives a published message, at most once.

A subscription is a subject filter held by one connection, of either protocol: a
ttlbroker SUBSCRIBE (``broker.server``) or a NATS ``SUB`` (``broker.nats``), each
class meeting the :class:`Subscriber` protocol, so that this index and the message
path never ask which protocol a subscriber speaks. One with a queue group (NATS)
gets each message only if it is the member of its group picked for that message,
at random, as nats-server does. Matching a published subject against every
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

:meth:`SubscriptionIndex.deliver` pushes stored (and republished, marker or
unrouted) records to the matching subscriptions.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from protocol import subject_matches

from ._stats import Counters

__all__ = ["CACHE_LIMIT", "Entry", "PushTarget", "Subscriber", "SubscriptionIndex"]

CACHE_LIMIT = 100_000

#: One record for the subscribers of its subject: (subject, the DELIVERY entry head
#: naming its place, the record's bytes).
Entry = tuple[bytes, bytes, memoryview | bytes]
#: What a subscription is filed under: its first two tokens, or its first.
_Key = str | tuple[str, str]


class PushTarget(Protocol):
    """The connection a subscription belongs to, as deliveries see it."""

    def accepts_pushes(self) -> bool:
        """False when a push would be dropped (the connection or the broker is full)."""
        ...


class Subscriber(Protocol):
    """A core subscription of either protocol."""

    #: Deliveries it took, and dropped (its connection was full).
    delivered: int
    dropped: int

    @property
    def tokens(self) -> tuple[str, ...]:
        """The subject filter's tokens."""
        ...

    @property
    def queue(self) -> str | None:
        """The NATS queue group (None: no group)."""
        ...

    @property
    def session(self) -> PushTarget: ...

    def deliver_records(self, parts: list[bytes | memoryview], counters: Counters) -> None:
        """Stored records for it, in publish order: ``parts`` alternates each
        record's DELIVERY entry head and its bytes. Counts what it delivers and
        what it drops in ``counters``."""
        ...

    def send_core(
        self, subject: bytes, reply: bytes | None, headers: bytes | None, payload: bytes | memoryview, epoch: int,
        record: Callable[[], bytes], skip: object,
    ) -> bool:
        """One core (unstored) message: ``headers`` a NATS header block or None,
        ``record`` makes the ttlbroker record of it (offset 0; b"" when ttlbroker
        cannot carry it), ``skip`` a session whose own subscriptions must not get it
        (a NATS client without echo). With ``epoch``, it goes once the group commit
        has made that epoch durable. True when it was queued."""
        ...


class SubscriptionIndex:
    """Args:
    counters: the broker's counters (deliveries and drops); a new set if None.
    """

    def __init__(self, counters: Counters | None = None) -> None:
        self.counters = counters if counters is not None else Counters()
        self._all: set[Subscriber] = set()
        #: The subscriptions by their first two tokens, by their first token alone
        #: (the second is a wildcard, or there is none), and those whose first token
        #: is a wildcard: each subscription is in one of the three.
        self._by_two: dict[_Key, set[Subscriber]] = {}  # keys: (first, second)
        self._by_one: dict[_Key, set[Subscriber]] = {}  # keys: first
        self._wild: set[Subscriber] = set()
        #: Members of NATS queue groups (also in ``_all``).
        self._queued = 0
        self._cache: dict[bytes, tuple[Subscriber, ...]] = {}
        #: (first token, second token, number of tokens) -> the answer for any subject
        #: of that shape, when no subscription that could match it looks further.
        self._shapes: dict[tuple[bytes, bytes, int], tuple[Subscriber, ...]] = {}
        #: subject -> its queue groups' matching members (only with queue groups).
        self._groups: dict[bytes, tuple[tuple[Subscriber, ...], ...]] = {}
        #: Called with each subscription added (a NATS push consumer starts delivering
        #: once its deliver subject has a subscriber, ``broker/nats/_push.py``).
        self.on_add: list[Callable[[Subscriber], None]] = []

    def __len__(self) -> int:
        return len(self._all)

    def _place(self, tokens: tuple[str, ...]) -> tuple[dict[_Key, set[Subscriber]] | None, _Key]:
        """Where a subscription with these filter tokens is filed: (table, key), or
        (None, "") for the wildcard-first ones."""
        first = tokens[0]
        if first == "*" or first == ">":
            return None, ""
        if len(tokens) > 1 and tokens[1] != "*" and tokens[1] != ">":
            return self._by_two, (first, tokens[1])
        return self._by_one, first

    def add(self, sub: Subscriber) -> None:
        self._all.add(sub)
        table, key = self._place(sub.tokens)
        (self._wild if table is None else table.setdefault(key, set())).add(sub)
        if sub.queue:
            self._queued += 1
        self._cache = {}
        self._shapes = {}
        self._groups = {}
        for fn in self.on_add:
            fn(sub)

    def remove(self, sub: Subscriber) -> None:
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
            if sub.queue:
                self._queued -= 1
        self._cache = {}
        self._shapes = {}
        self._groups = {}

    def may_match(self, first: str, second: str) -> bool:
        """Whether some subscription could match a subject whose first two tokens are
        ``first`` and ``second`` (its filter's are those, or wildcards).
        Runtime complexity: O(1)."""
        return bool(self._wild or self._by_one.get(first) or self._by_two.get((first, second)))

    def match(self, subject: bytes) -> tuple[Subscriber, ...]:
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

    def _miss(self, subject: bytes, shape: tuple[bytes, bytes, int] | None) -> tuple[Subscriber, ...]:
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
            groups: dict[str, list[Subscriber]] = {}
            for s in found:
                queue = s.queue
                if queue:
                    groups.setdefault(queue, []).append(s)
            if groups:
                found = [s for s in found if not s.queue]
                self._groups[subject] = groups_of = tuple(tuple(g) for g in groups.values())
                self._cache[subject] = hit = tuple(found)
                return hit + tuple(random.choice(g) for g in groups_of)
        self._cache[subject] = hit = tuple(found)
        return hit


    def deliver(self, entries: list[Entry]) -> None:
        """Deliver records to the matching subscriptions, in the order given (publish
        order), in one batch per subscription."""
        match = self.match
        batches: dict[Subscriber, list[bytes | memoryview]] = {}
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
        counters = self.counters
        for sub in [s for s in batches if not s.session.accepts_pushes()]:
            count = len(batches.pop(sub)) // 2  # not even encoded: it would be dropped
            sub.dropped += count
            counters.deliveries_dropped += count
        for sub, parts in batches.items():
            sub.deliver_records(parts, counters)


def _wild_after_two(tokens: tuple[str, ...]) -> bool:
    """Does a filter with these tokens match a subject whatever the subject's tokens
    after its second (given their number)?"""
    for t in tokens[2:]:
        if t != "*" and t != ">":
            return False
    return True
