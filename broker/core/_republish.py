"""Republish (NATS ADR-28): stored messages published again on a transformed subject.

A topic's ``republish`` option (``src`` filter, ``dest`` template, ``headers_only``)
makes the broker, once a message matching ``src`` is durably appended (under
``fsync = "always"``, after the group commit that covers it; never for a refused
publish), publish it again, at most once, on ``dest`` applied to its subject. The
copy is an ordinary core publish: subscribers get it, and the topic that captures its
subject stores it like any publish (which may republish it in turn).

The copy's headers are the stored ones followed by the server's (``Nats-Stream`` as
``stream/topic``, ``Nats-Subject``, ``Nats-Sequence``, ``Nats-Time-Stamp``,
``Nats-Last-Sequence``, and ``Nats-Msg-Size`` with ``headers_only``), then the hop
count ``TTLB-Hops``. Loops: a configuration that closes one is refused at create and
update (``_catalog.py``); a message that would cross more than
``[limits] max_republish_hops`` hops is dropped and counted (``dropped_loops``). A
transform that yields an invalid subject drops the copy, counted
(``dropped_invalid_subject``) and logged at most once a minute; the publisher is
not told (its message was stored), as on the NATS server.

Speed: a copy costs about what a message of a publish batch costs. What the copies of
one subject share (destination, the headers before ``Nats-Sequence``, the hop count)
is worked out once per batch, the destination of a subject once per topic (unless the
transform draws ``random``), and each copy is then one pass in
``protocol.republish_bodies``. A copy that would reach nobody when it is sent (no
topic captures its subject, no subscription matches it) is only counted, as a
publish would count it (``messages_unrouted``): it is never built.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Final

from protocol import BrokerError, SubjectTransform, copy_plan, hops_of, record_keys, republish_bodies, validate_subject
from storage import AppendResult

from ._commit import Committer
from ._log import get_logger
from ._routing import NO_TOPIC, Router
from ._stats import Counters
from ._subscriptions import SubscriptionIndex
from ._topics import Partition, Topic

__all__ = ["Republisher"]

log = get_logger(__name__)

_LOG_EVERY_SECONDS = 60.0
#: Destinations kept, for all topics (then forgotten at once, as the router's cache).
_DEST_CACHE_LIMIT = 100_000

Plan = tuple[bytes, bytes, bytes]  # protocol.copy_plan: destination, head, hops header


class _Missing(enum.Enum):
    """Not worked out yet for this batch (a key's plan may be None: no copy)."""

    MISSING = 0


_MISSING: Final = _Missing.MISSING


class _Drop:
    """A copy that is not sent, and what to count and log for each one."""

    __slots__ = ("kind", "fields")

    def __init__(self, kind: str, **fields: object) -> None:
        self.kind = kind
        self.fields = fields


class Republisher:
    """Args:
    counters: the broker's counters.
    committer: the group committer (copies wait for the append to be durable).
    max_hops: ``[limits] max_republish_hops``.
    publish: the broker's internal publish of message bodies (no acks).
    router, subs: the broker's routing and subscriptions (does a copy reach anyone?).
    """

    def __init__(
        self, counters: Counters, committer: Committer, max_hops: int, publish: Callable[[list[bytes]], None],
        router: Router, subs: SubscriptionIndex,
    ) -> None:
        self.counters = counters
        self.committer = committer
        self.max_hops = max_hops
        self.publish = publish
        self.router = router
        self.subs = subs
        self._last_warning = {"invalid": -_LOG_EVERY_SECONDS, "hops": -_LOG_EVERY_SECONDS}
        #: (topic, subject) -> (the topic's transform, the destination, None (no
        #: match) or why it is invalid)
        self._dests: dict[tuple[Topic, bytes], tuple[SubjectTransform, str | BrokerError | None]] = {}

    def after_append(self, part: Partition, res: AppendResult, last_offsets: list[int], epoch: int) -> None:
        """Republish what an append stored, once it is durable. ``last_offsets`` come
        from :meth:`Partition.last_offsets`, taken before the append."""
        topic = part.topic
        transform = topic.republisher
        rp = topic.config.republish
        if transform is None or rp is None:
            return
        plans, distinct = self._plans(topic, transform, res)
        if not distinct:
            return
        headers_only: bool = rp["headers_only"]
        if self.committer.acks_wait:
            self.committer.after(epoch, lambda: self._send(res, plans, distinct, last_offsets, headers_only))
        else:
            self._send(res, plans, distinct, last_offsets, headers_only)

    def _plans(self, topic: Topic, transform: SubjectTransform, res: AppendResult) -> tuple[list[Plan | None], list[Plan]]:
        """The plan of each record's copy (None: none), and the distinct plans."""
        batch: dict[tuple[bytes, bytes], Plan | _Drop | None] = {}
        plans: list[Plan | None] = []
        append = plans.append
        for key in record_keys(res.records, res.positions):
            plan = batch.get(key, _MISSING)
            if plan is _MISSING:
                plan = batch[key] = self._plan(topic, transform, *key)
            if isinstance(plan, _Drop):
                self._drop(plan)
                plan = None
            append(plan)
        return plans, [p for p in batch.values() if p.__class__ is tuple]

    def _plan(self, topic: Topic, transform: SubjectTransform, subject: bytes, block: bytes) -> Plan | _Drop | None:
        dest = self._dest(topic, transform, subject)
        if dest is None:
            return None
        text = subject.decode()
        if isinstance(dest, BrokerError):
            return _Drop("invalid", topic=topic.full_name, subject=text, reason=dest.message)
        hops = hops_of(block) + 1 if block else 1
        if hops > self.max_hops:
            return _Drop("hops", topic=topic.full_name, subject=text, hops=hops, limit=self.max_hops)
        return copy_plan(dest, block, topic.full_name, text, hops)

    def _dest(self, topic: Topic, transform: SubjectTransform, subject: bytes) -> str | BrokerError | None:
        """Where a message on ``subject`` is republished: the destination, None (no
        match), or why the transformed subject is invalid."""
        known = self._dests.get((topic, subject))
        if known is not None and known[0] is transform:  # a changed rule is a new transform
            return known[1]
        applied = transform.apply(subject.decode())
        dest: str | BrokerError | None = applied
        if applied is not None:
            try:
                validate_subject(applied)
            except BrokerError as err:
                dest = err
        if transform.deterministic:
            if len(self._dests) >= _DEST_CACHE_LIMIT:
                self._dests = {}
            self._dests[topic, subject] = (transform, dest)
        return dest

    def _drop(self, drop: _Drop) -> None:
        if drop.kind == "hops":
            self.counters.dropped_loops += 1
            self._warn("hops", "republish_loop_dropped", **drop.fields)
        else:
            self.counters.dropped_invalid_subject += 1
            self._warn("invalid", "republish_dropped", **drop.fields)

    def _send(
        self, res: AppendResult, plans: list[Plan | None], distinct: list[Plan], last_offsets: list[int], headers_only: bool
    ) -> None:
        total = len(plans) - plans.count(None)
        self.counters.republished += total
        idle = {p for p in distinct if not self._reaches_anyone(p[0])}
        if idle:
            # Sent now, these copies would reach nobody: a publish of them would only
            # count them, so they are counted and not built.
            if len(idle) == len(distinct):
                self.counters.messages_unrouted += total
                return
            plans = [None if p in idle else p for p in plans]
            self.counters.messages_unrouted += total - (len(plans) - plans.count(None))
        self.publish(republish_bodies(res.records, res.positions, plans, last_offsets, headers_only))

    def _reaches_anyone(self, dest: bytes) -> bool:
        """Would a publish on ``dest`` now reach a topic or a subscription?"""
        router = self.router
        route = router.cache.get(dest)
        if route is None:
            route = router.resolve(dest)
        return route is not NO_TOPIC or (len(self.subs) > 0 and len(self.subs.match(dest)) > 0)

    def _warn(self, kind: str, event: str, **fields: object) -> None:
        now = time.monotonic()
        if now - self._last_warning[kind] >= _LOG_EVERY_SECONDS:
            self._last_warning[kind] = now
            log.warning(event, **fields)
