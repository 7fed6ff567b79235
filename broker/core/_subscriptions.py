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

**The subscription budget.** What subscriptions hold is the clients' to choose (a
NATS subject may be as long as the control line, a connection may hold
``limits.max_subscriptions_per_connection`` of them), so the index counts it: each
subscription carries its :attr:`Subscriber.footprint`, an estimate of the bytes it
keeps alive (:func:`subscription_footprint`), added by :meth:`SubscriptionIndex.add`
and given back by :meth:`SubscriptionIndex.remove`. Counting in the index itself,
the one place both protocols file their subscriptions, keeps the total equal to what
the index holds whatever the path a subscription leaves by (an unsubscribe, an
``UNSUB`` maximum reached, a connection closed any way). An ``add`` past
``limits.max_subscription_bytes_total`` is refused and changes nothing. Nothing of
this is on the delivery path.

:meth:`SubscriptionIndex.deliver` pushes stored (and republished, marker or
unrouted) records to the matching subscriptions; :meth:`SubscriptionIndex.deliver_request`
those of a request (a publish with a reply subject), each carrying the reply subject,
and says how many subscriptions took them (none: no responders).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from protocol import ErrorCode, error_class, subject_matches

from ._stats import Counters

__all__ = [
    "CACHE_LIMIT", "Entry", "PushTarget", "Subscriber", "SubscriptionIndex", "subject_too_long",
    "subscription_footprint", "SUBSCRIPTION_OVERHEAD", "TOKEN_OVERHEAD",
]

CACHE_LIMIT = 100_000

#: The bytes one subscription holds besides its text, in the estimate of
#: :func:`subscription_footprint`: its object, its entries in its connection's table
#: and in the index, and the bucket of the index it may open alone (measured with
#: tracemalloc on CPython 3.11: 600 bytes for a short subject in a shared bucket,
#: 1,000 for a NATS inbox ``_INBOX.<id>.*`` in a bucket of its own).
SUBSCRIPTION_OVERHEAD = 1024
#: The bytes each token of a filter holds besides its characters: the token's own
#: string object (49 bytes of header for ASCII, 74 for other text, rounded up by
#: the allocator) and its place in the tokens tuple. A subject of many short tokens
#: (``ab.ab.ab...``) costs some 20 times its length, not twice.
TOKEN_OVERHEAD = 80
#: What :meth:`SubscriptionIndex.add` raises past the budget (``SubscriptionBudgetExceededError``).
_BUDGET_EXCEEDED = error_class(ErrorCode.SUBSCRIPTION_BUDGET_EXCEEDED)

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


def subscription_footprint(subject_filter: str, tokens: int, queue: str | None = None, sid: str = "") -> int:
    """The bytes a subscription keeps alive, estimated: :data:`SUBSCRIPTION_OVERHEAD`,
    the filter's text twice (the filter and its tokens, each a string of its own),
    :data:`TOKEN_OVERHEAD` per token, the queue group's text, and the subscription
    id's text twice (a NATS sid is kept as text and as bytes). Text is counted in
    UTF-8 bytes, which is at least what CPython stores for it. The estimate is above
    what tracemalloc sees a subscription hold for every shape in
    ``tests/broker/test_subscription_budget.py``, and close to the RSS it costs: a
    broker holding 153,600 NATS subscriptions grew by 9,000 to 9,300 bytes per
    subscription on 4,000-byte subjects, its connections' buffers included (this
    gives 9,270), and by about 3,200 on 1,000-byte subjects (3,270)."""
    text = len(subject_filter.encode()) * 2
    if queue:
        text += len(queue.encode())
    if sid:
        text += len(sid.encode()) * 2
    return SUBSCRIPTION_OVERHEAD + text + TOKEN_OVERHEAD * tokens


def subject_too_long(subject_filter: str, queue: str | None, limit: int) -> bool:
    """Whether a subscription's filter or queue group is longer than ``limit`` bytes
    of UTF-8 (``limits.max_subscription_subject_bytes``)."""
    return len(subject_filter.encode()) > limit or (queue is not None and len(queue.encode()) > limit)


class Subscriber(Protocol):
    """A core subscription of either protocol."""

    #: Deliveries it took, and dropped (its connection was full).
    delivered: int
    dropped: int
    #: The bytes it holds, estimated once when it is made (:func:`subscription_footprint`):
    #: what it counts against the subscription budget while it is in the index.
    footprint: int

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

    def deliver_request(self, parts: list[bytes | memoryview], counters: Counters, reply: bytes) -> bool:
        """:meth:`deliver_records` for the messages of a request, each carrying the
        reply subject ``reply``; True when they were queued (not dropped)."""
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
    budget: the most bytes (by :attr:`Subscriber.footprint`) the subscriptions in it
        may hold together (``limits.max_subscription_bytes_total``); None: no limit.
    """

    def __init__(self, counters: Counters | None = None, budget: int | None = None) -> None:
        self.counters = counters if counters is not None else Counters()
        self.budget = budget
        #: The footprints of the subscriptions in it, summed (the ``subscription_bytes`` gauge).
        self.bytes = 0
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
        """File ``sub``, its footprint counted against the budget (adding one that is in
        already changes nothing).

        Raises:
            SubscriptionBudgetExceededError: it would take the footprints of all
                subscriptions past the budget; nothing changed (counted in
                ``subscription_budget_refused``).
        """
        if sub in self._all:
            return
        budget = self.budget
        if budget is not None and self.bytes + sub.footprint > budget:
            self.counters.subscription_budget_refused += 1
            raise _BUDGET_EXCEEDED(
                f"the broker's subscriptions hold {self.bytes} of the {budget} bytes of "
                f"limits.max_subscription_bytes_total; this one needs {sub.footprint}"
            )
        self.bytes += sub.footprint
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
        """Unfile ``sub`` and give its footprint back (one not in the index: nothing)."""
        if sub in self._all:
            self._all.discard(sub)
            self.bytes -= sub.footprint
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

    def match_fixed(self, subject: bytes) -> tuple[Subscriber, ...] | None:
        """:meth:`match`, when its answer is the same for every message on ``subject``
        until the index changes; None when it is not (a queue group there picks a
        member for each message)."""
        found = self.match(subject)
        if self._queued and self._groups.get(subject):
            return None
        return found

    def match_run(self, subjects: list[bytes]) -> list[tuple[Subscriber, ...] | None]:
        """:meth:`match_fixed` of each subject (the reply subjects of a group
        commit's PubAcks, one inbox each). A subject with the first two tokens and
        the number of tokens of the one before it takes that one's answer when it
        came from the shape cache (no second lookup, no split). Runtime complexity:
        O(1) per subject after the first of its shape."""
        if self._queued:
            return [self.match_fixed(s) for s in subjects]
        out: list[tuple[Subscriber, ...] | None] = []
        append = out.append
        cache = self._cache
        shapes = self._shapes
        head: bytes | None = None  # ("<first>.<second>." of the last subject answered by its shape)
        hl = dots = 0
        last: tuple[Subscriber, ...] = ()
        for s in subjects:
            if head is not None and s.startswith(head) and s.count(b".", hl) == dots:
                append(last)
                continue
            hit = cache.get(s)
            if hit is None:
                parts = s.split(b".", 2)
                if len(parts) == 3:
                    dots = parts[2].count(b".")
                    hit = shapes.get((parts[0], parts[1], dots + 3))
                    if hit is not None:
                        head = s[: len(s) - len(parts[2])]
                        hl = len(head)
                        last = hit
                        append(hit)
                        continue
                head = None
                hit = self._miss(s, (parts[0], parts[1], dots + 3) if len(parts) == 3 else None)
            append(hit)
        return out

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

    def deliver_request(self, entries: list[Entry], reply: bytes) -> int:
        """:meth:`deliver` for the messages of a request, each carrying the reply
        subject ``reply`` (its own method, so that :meth:`deliver`, on every
        publish's path, is as it was); returns how many subscriptions took them
        (queued, not dropped for a full connection): what nats-server's
        ``didDeliver`` tells."""
        batches: dict[Subscriber, list[bytes | memoryview]] = {}
        for subj, head, rec in entries:
            for sub in self.match(subj):
                batches.setdefault(sub, []).extend((head, rec))
        counters = self.counters
        taken = 0
        for sub, parts in batches.items():
            if sub.session.accepts_pushes():
                taken += sub.deliver_request(parts, counters, reply)
            else:
                count = len(parts) // 2
                sub.dropped += count
                counters.deliveries_dropped += count
        return taken


def _wild_after_two(tokens: tuple[str, ...]) -> bool:
    """Does a filter with these tokens match a subject whatever the subject's tokens
    after its second (given their number)?"""
    for t in tokens[2:]:
        if t != "*" and t != ">":
            return False
    return True
