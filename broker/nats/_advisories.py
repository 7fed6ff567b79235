"""JetStream advisories: the events nats-server publishes on ``$JS.EVENT.ADVISORY.>``
(docs/semantics.md, "JetStream advisories"), published by :class:`Advisories`.

One per broker (``JetStream.advisories``). It hears of the consumers as the consumer
engine's :class:`broker.consumers.ConsumerEvents` (both protocols' consumers: they
are one engine's), of the NATS streams as a :class:`broker.core.TopicHooks`, and of
the API from ``JetStream.request``/``respond`` (:meth:`Advisories.audit`):

* ``CONSUMER.MAX_DELIVERIES.<stream>.<consumer>``: a delivery given up after
  ``max_deliver`` (its ack wait ran out, or it was NAKed, the last time);
* ``CONSUMER.MSG_TERMINATED.<stream>.<consumer>``: a ``+TERM`` (with its reason);
* ``CONSUMER.MSG_NAKED.<stream>.<consumer>``: a ``-NAK`` of an outstanding delivery;
* ``CONSUMER.CREATED|DELETED.<stream>.<consumer>`` (nats-server has no advisory
  for an update) and ``STREAM.CREATED|UPDATED|DELETED.<stream>``;
* ``API``: every JetStream API request answered with JSON (not pulls, direct gets,
  acks), with the request, the answer and the requester.

They are about NATS streams (the topics the NATS listener shows as streams, with
one partition: ``stream_seq`` is the offset). Each is a core message, at most once:
it goes through the router as a publish of a client would (a topic that captures
the subject stores it, as a nats-server stream whose subjects capture it does) and
to every matching subscription, whose user's permissions are checked as for any
message. Nothing is built while no subscription and no topic could take a
``$JS.EVENT`` subject (:meth:`Advisories.wanted`, O(1)). Each one published is
counted (``Counters.advisories_<kind>``).
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

import protocol as P
from protocol.nats import advisories as A

from broker.consumers import Consumer, ConsumerEngine, ConsumerEvents
from broker.core import NO_TOPIC, Broker, Partition, Topic, TopicConfig, TopicHooks, get_logger

from ._core import send_core

__all__ = ["Advisories", "Audit"]

log = get_logger(__name__)


class JetStreamApi(Protocol):
    """What the advisories ask of the JetStream object (``_jetstream.JetStream``,
    which imports this module)."""

    broker: Broker
    consumers: ConsumerEngine
    #: ``[nats] domain`` ("" = none) and the server's name.
    domain: str
    server_name: str

    def shows(self, topic: Topic) -> bool: ...

    def stream_name(self, topic: Topic) -> str: ...


class Audit:
    """An API request waiting for its answer, to be audited (``JSAPIAudit``)."""

    __slots__ = ("subject", "reply", "request", "origin")

    def __init__(self, subject: str, reply: str | None, request: bytes, origin: Any) -> None:
        self.subject = subject
        self.reply = reply
        self.request = request
        self.origin = origin


class Advisories(ConsumerEvents, TopicHooks):
    """Args:
    js: the broker's JetStream API; the advisories register as its consumer
        engine's events and in its broker's topic hooks.
    """

    def __init__(self, js: JetStreamApi) -> None:
        self.js = js
        self.broker = broker = js.broker
        self.ids = A.Nuid()
        js.consumers.events = self
        broker.topic_hooks.append(self)

    def wanted(self) -> bool:
        """Whether an advisory could reach anyone now: a subscription or a topic that
        may take a ``$JS.EVENT`` subject. Runtime complexity: O(1)."""
        broker = self.broker
        first, second = A.EVENT_TOKENS
        return broker.subs.may_match(first, second) or broker.router.may_capture(first)

    def _stream(self, topic: Topic) -> str | None:
        """The NATS stream name of ``topic`` if it is one the listener shows (with
        one partition), else None."""
        js = self.js
        return js.stream_name(topic) if len(topic.partitions) == 1 and js.shows(topic) else None

    def publish(self, kind: str, subject: str, payload: bytes) -> None:
        """One advisory, as a client's publish on ``subject`` would go: stored by the
        topic that captures it, else to the core subscriptions only. Never raises
        (it is sent from the middle of the consumers' and the catalog's work): a
        failure is logged, and the advisory is lost, as a dropped core message is."""
        try:
            self._publish(kind, subject, payload)
        except Exception as exc:
            log.error("advisory_failed", subject=subject, error=repr(exc))

    def _publish(self, kind: str, subject: str, payload: bytes) -> None:
        broker = self.broker
        raw = subject.encode()
        route = broker.router.cache.get(raw) if len(raw) <= 255 else NO_TOPIC
        if route is None:
            route = broker.router.resolve(raw)
        reached = False
        if isinstance(route, Partition):
            try:
                body = P.encode_body(raw, payload, b"")
            except P.BrokerError:
                body = b""
            if body:
                broker.publisher.publish_bodies([body])  # stored, and delivered to the subscriptions
                reached = True
        if not reached:
            reached = send_core(broker, subject, None, None, payload) > 0
        if reached:
            counters = broker.counters
            name = "advisories_" + kind
            setattr(counters, name, getattr(counters, name) + 1)

    def _now(self) -> int:
        return self.broker.clock.now_ns()

    # -- consumers (ConsumerEvents) ------------------------------------------------------

    def _consumer(self, c: Consumer) -> str | None:
        return self._stream(c.topic) if self.wanted() else None

    def created(self, c: Consumer) -> None:
        stream = self._consumer(c)
        if stream is not None:
            self.publish("consumer_action", *A.consumer_action("created", stream, c.name, self.ids.next(), self._now(), self.js.domain))

    def deleted(self, c: Consumer) -> None:
        stream = self._consumer(c)
        if stream is not None:
            self.publish("consumer_action", *A.consumer_action("deleted", stream, c.name, self.ids.next(), self._now(), self.js.domain))

    def naked(self, c: Consumer, partition: int, offset: int, dseq: int, deliveries: int) -> None:
        stream = self._consumer(c)
        if stream is not None:
            self.publish("nak", *A.delivery_nak(stream, c.name, dseq, offset, deliveries, self.ids.next(), self._now(), self.js.domain))

    def terminated(self, c: Consumer, partition: int, offset: int, dseq: int, deliveries: int, reason: str) -> None:
        stream = self._consumer(c)
        if stream is not None:
            self.publish("terminated", *A.delivery_terminated(
                stream, c.name, dseq, offset, deliveries, reason, self.ids.next(), self._now(), self.js.domain))

    def max_deliveries(self, c: Consumer, partition: int, offset: int, deliveries: int) -> None:
        stream = self._consumer(c)
        if stream is not None:
            self.publish("max_deliveries", *A.delivery_exceeded(
                stream, c.name, offset, deliveries, self.ids.next(), self._now(), self.js.domain))

    def stream_name(self, topic: Topic) -> str:
        return self.js.stream_name(topic)

    # -- streams (TopicHooks) ------------------------------------------------------------

    def _stream_action(self, topic: Topic, action: str) -> None:
        if not self.wanted():
            return
        stream = self._stream(topic)
        if stream is not None:
            self.publish("stream_action", *A.stream_action(action, stream, self.ids.next(), self._now(), self.js.domain))

    def topic_opened(self, topic: Topic, recovering: bool) -> None:
        if recovering:
            return
        try:
            trio.lowlevel.current_task()
        except RuntimeError:  # the worker thread of a topic's creation (``Broker.open_topic_storage``)
            # ``wanted`` only reads (atomic under the GIL): the hop to the loop, which
            # costs a creation about a fifth of its time, only when someone may listen.
            if self.wanted():
                trio.from_thread.run_sync(self._stream_action, topic, "created")
            return
        self._stream_action(topic, "created")

    def topic_updated(self, topic: Topic, old: TopicConfig) -> None:
        self._stream_action(topic, "updated")

    def topic_deleted(self, topic: Topic) -> None:
        self._stream_action(topic, "deleted")

    # -- the API -------------------------------------------------------------------------

    def audit(self, audit: Audit, response: bytes | memoryview) -> None:
        """The API request ``audit`` was answered ``response``."""
        if not self.wanted():
            return
        origin = audit.origin
        client = origin.client_info() if origin is not None else None
        self.publish("api_audit", *A.api_audit(
            self.js.server_name, client, audit.subject, audit.request, response, self.ids.next(), self._now(), self.js.domain))
