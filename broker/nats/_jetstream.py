"""The JetStream API of the NATS listener: the ``JetStream`` object, the state and
helpers the API modules share, and the dispatch of ``$JS.API.>`` to them.

One :class:`JetStream` per broker (``broker.jetstream``). The NATS session
(``_session.py``) hands it every PUB/HPUB whose subject :meth:`JetStream.handles`
(``$JS.API.``, ``$JS.ACK.``, ``$JS.FC.``), synchronously and in arrival order, and
asks it for the JSON of publish acknowledgements (:meth:`JetStream.pub_ack`,
:meth:`JetStream.pub_error`). Answers go to the request's reply inbox as core
messages (``send_core``).

Dispatch, through the :class:`ApiHandlers` the JetStream object is made with (the
API modules import this one, never the other way: ``_api.py`` puts them together):

* ``$JS.API.INFO`` and ``$JS.API.STREAM.*``, ``$JS.API.DIRECT.GET.*``: ``_streams.py``;
* ``$JS.API.CONSUMER.<op>...``: ``_consumers.consumer_api(js, op, tokens, reply,
  headers, payload)``, where ``op`` is ``CREATE``, ``DURABLE.CREATE``, ``INFO``,
  ``DELETE``, ``NAMES``, ``LIST``, ``MSG.NEXT`` (or any other token that follows
  ``CONSUMER.``) and ``tokens`` the subject's tokens after it (``[stream, ...]``);
* ``$JS.ACK.>`` and ``$JS.FC.>``: ``_consumers.ack(js, subject, reply, payload)``.

Work that must wait (catalog changes, the group commit) runs in the nursery of
:meth:`JetStream.run`, which the server starts beside its listeners; ``run`` also
runs the consumers' background work (``_consumers.run``: settling acks).

Naming (docs/protocol.md, "NATS listener"): a NATS stream ``S`` is the one-partition
topic ``S`` (lower-cased by the name rule; the name as given is kept in the topic's
``nats`` option and reported) of the ttlbroker stream ``[nats] stream``; the NATS
stream ``KV_<b>`` is ttlbroker's KV bucket ``kv/<b>``. A topic of any other
ttlbroker stream is named ``<stream>/<topic>`` in PubAcks (as in ``Nats-Stream``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import trio

from protocol import BrokerError, normalize_name
from protocol.nats import (
    ACK_PREFIX, API_PREFIX, FC_PREFIX, REQUIRED_API_LEVEL, STREAM_NOT_FOUND, JSError, api_error, api_level_refused, js_error,
)
from protocol.nats import encode_nats_headers
from protocol.nats import pub_ack as _pub_ack
from protocol.nats import pub_error as _pub_error

from broker.consumers import ConsumerEngine
from broker.core import Broker, Stream, Topic, get_logger
from broker.kv import KvReads
from broker.net import Transport

from ._advisories import Advisories, Audit
from ._core import send_core, send_pub_acks

__all__ = ["JetStream", "KV_STREAM", "KV_PREFIX"]

log = get_logger(__name__)

#: The ttlbroker stream that holds every KV bucket (as the client's ``KV_STREAM``).
KV_STREAM = "kv"
#: A KV bucket's NATS stream name is ``KV_<bucket>``.
KV_PREFIX = "KV_"
_PREFIXES = (API_PREFIX, ACK_PREFIX, FC_PREFIX)
#: ``STREAM.MSG.GET.<stream>``: the request a KV get of a bucket without direct gets is.
_KV_GET_PREFIX = API_PREFIX + "STREAM.MSG.GET.KV_"
#: API requests that wait (catalog changes) at most in progress at once, all
#: connections together; more are refused with the server's 429 "too many requests".
MAX_WAITING_REQUESTS = 256
#: API requests with no audit advisory: nats-server answers them outside its API
#: (a pull request is its consumer's, a direct get its stream's).
_UNAUDITED = (API_PREFIX + "CONSUMER.MSG.NEXT.", API_PREFIX + "DIRECT.GET.")
#: NATS stream names whose topic :meth:`JetStream.topic` keeps.
TOPIC_CACHE_LIMIT = 1024


class ApiHandlers(NamedTuple):
    """The API modules' entry points (``_api.HANDLERS``)."""

    #: ``(js, bucket, reply, payload)``: a ``STREAM.MSG.GET.KV_<bucket>`` answered
    #: without a dispatch; False when it is not one it answers so.
    kv_get: Callable[[JetStream, str, str | None, bytes], bool]
    #: ``(js, tokens after $JS.API., reply, headers, payload)``: INFO, STREAM.*, DIRECT.GET.*.
    streams: Callable[[JetStream, list[str], str | None, bytes | None, bytes], None]
    #: ``(js, op, tokens after it, reply, headers, payload, last)``: CONSUMER.<op>.
    consumers: Callable[[JetStream, str, list[str], str | None, bytes | None, bytes, bool], None]
    #: ``(js, subject, reply, payload)``: $JS.ACK.> and $JS.FC.>.
    ack: Callable[[JetStream, str, str | None, bytes], None]
    #: ``(js)``: the consumers' background work, for the broker's lifetime.
    background: Callable[[JetStream], Awaitable[None]]


class JetStream:
    """Args:
    broker: the broker whose topics the API shows as NATS streams.
    consumers: its consumer engine.
    kv: its KV reads.
    handlers: the API modules' entry points.
    """

    def __init__(self, broker: Broker, consumers: ConsumerEngine, kv: KvReads, handlers: ApiHandlers) -> None:
        self.broker = broker
        self.handlers = handlers
        self.consumers = consumers
        self.kv = kv
        #: The copiers of mirrors and sources (``broker.replication.Replication``),
        #: set by the server: what stream info reports of them.
        self.replication: Any = None
        self.nursery: trio.Nursery | None = None
        #: API requests served and refused since start (``$JS.API.INFO``'s ``api``).
        self.api_total = 0
        self.api_errors = 0
        self.waiting = 0
        #: The ttlbroker stream that holds the NATS streams (``[nats] stream``, by the
        #: name rule).
        self.namespace = normalize_name(broker.config.nats.stream, "[nats] stream")
        #: The NATS side of the consumers (``_consumer_state.State``, made at first use).
        self.consumer_state: Any = None
        #: NATS connections with answers a sync made durable, released by :meth:`_synced`.
        self._released: list[Transport] = []
        #: NATS stream name -> its topic (:meth:`topic`).
        self._topics: dict[str, Topic] = {}
        #: The NATS session whose request is being handled, and its subject.
        self._origin: Any = None
        self._subject = ""
        broker.committer.on_synced.append(self._synced)  # after the consumer engine's hook
        #: ``[nats] domain``: the API answers ``$JS.<domain>.API.>`` too (as
        #: nats-server with ``jetstream { domain }``); "" = none.
        self.domain = broker.config.nats.domain
        self._domain_prefix = f"$JS.{self.domain}.API." if self.domain else ""
        self._prefixes = _PREFIXES + ((self._domain_prefix,) if self.domain else ())
        #: The server's name in advisories (nats-server's ``server_name``, INFO's too).
        self.server_name = broker.config.server.name
        #: The JetStream advisories (``_advisories.py``).
        self.advisories = Advisories(self)
        #: The API request being handled, while someone may hear its audit advisory;
        #: those whose answer a spawned task sends, by reply subject (:meth:`spawn`).
        self._audit: Audit | None = None
        self._audits_later: dict[str, Audit] = {}

    # -- the session's entry points ----------------------------------------------------

    def handles(self, subject: str) -> bool:
        return subject.startswith(self._prefixes)

    def request(
        self, subject: str, reply: str | None, headers: bytes | None, payload: bytes, origin: Any = None,
        last: bool = False,
    ) -> None:
        """One PUB/HPUB on a subject :meth:`handles`, from the NATS session ``origin``.
        Never raises: a failure is answered (or logged when there is no reply
        subject). ``last``: ``origin`` handles nothing else it read before it calls
        ``consumer_state.settle_held()``, which it does once it has sent what this
        queued, before it yields (a pull may then go ahead of the acks before it,
        ``_consumer_state.State.may_pass``)."""
        self._origin, self._subject = origin, subject
        if self._domain_prefix and subject.startswith(self._domain_prefix):
            # $JS.<domain>.API.X is $JS.API.X (what a client that names this server's
            # domain sends: nats.go's and nats-py's ``domain=``, a remote mirror).
            subject = API_PREFIX + subject[len(self._domain_prefix) :]
        handlers = self.handlers
        if subject.startswith(API_PREFIX) and self.advisories.wanted() and not subject.startswith(_UNAUDITED):
            self._audit = Audit(subject, reply, payload, origin)
        try:
            if subject.startswith(_KV_GET_PREFIX) and handlers.kv_get(self, subject[len(_KV_GET_PREFIX) :], reply, payload):
                return  # nats-py's kv.get, answered as api() answers it (no dispatch, no request dict)
            if subject.startswith(API_PREFIX):
                tokens = subject[len(API_PREFIX) :].split(".")
                if headers and api_level_refused(headers):
                    self._refuse_level(tokens, reply)
                    return
                if tokens[0] == "CONSUMER":
                    op_len = 2 if tokens[1:2] in (["DURABLE"], ["MSG"]) else 1
                    op = ".".join(tokens[1 : 1 + op_len])
                    handlers.consumers(self, op, tokens[1 + op_len :], reply, headers, payload, last)
                else:
                    handlers.streams(self, tokens, reply, headers, payload)
            else:
                handlers.ack(self, subject, reply, payload)
        except Exception as exc:  # a bug must not end the connection, nor pass silently
            log.error("jetstream_request_failed", subject=subject, error=repr(exc))
            self.respond(reply, api_error("error", JSError(500, 10077, f"internal error: {exc}")))
        finally:
            self._origin = None
            self._audit = None

    def _refuse_level(self, tokens: list[str], reply: str | None) -> None:
        """A request whose ``Nats-Required-Api-Level`` this server does not reach
        (ADR-44), refused before anything else is looked at, as nats-server: 412
        10185 in the API's JSON, or, for a direct get and a pull request (answered
        with status messages), a ``412 Required Api Level`` status."""
        head, op = tokens[0], tokens[1] if len(tokens) > 1 else ""
        if (head, op) in (("DIRECT", "GET"), ("CONSUMER", "MSG")):
            if reply:
                self.respond(reply, b"", headers=encode_nats_headers([], 412, "Required Api Level"))
            return
        self.api_total += 1
        self.api_errors += 1
        if head == "INFO":
            kind = "account_info"
        elif op in ("MSG", "DURABLE") and len(tokens) > 2:
            kind = f"{head}_{op}_{tokens[2]}".lower() if op == "MSG" else "consumer_create"
        else:
            kind = f"{head}_{op}".lower()
        self.respond(reply, api_error(kind, js_error(REQUIRED_API_LEVEL)))

    def no_responders(self, reply: str | None) -> None:
        """The request being handled is on a subject nothing serves (no such API, a
        consumer or a direct get that is not there): its client gets the core
        no-responders status, as from nats-server, where no subscription takes it."""
        origin = self._origin
        if reply and origin is not None:
            origin.no_responders(reply, self._subject)

    def pub_ack(self, topic: Topic, offset: int, duplicate: bool) -> bytes:
        """The PubAck JSON for a message the publish path stored at ``offset`` (for a
        duplicate: the original's offset)."""
        return _pub_ack(self.stream_name(topic), offset, duplicate)

    def pub_error(self, err: BrokerError | JSError, topic: Topic | None = None) -> bytes:
        """The PubAck JSON for a refused publish, with the server's error numbers."""
        return _pub_error(err, None if topic is None else self.stream_name(topic))

    async def run(self) -> None:
        """Runs for the broker's lifetime: the nursery of the API's waiting work, and
        the consumers' background work."""
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self.handlers.background, self)
            await trio.sleep_forever()

    # -- helpers for the API modules ---------------------------------------------------

    def respond(self, reply: str | None, body: bytes, headers: bytes | None = None, epoch: int = 0) -> None:
        """Send ``body`` to ``reply`` as a core message; with ``epoch``, once the group
        commit has made it durable when the fsync policy makes acks wait (as our own
        acks do; under an interval or ``never`` it goes at once). The sync that makes
        it durable writes it to the subscriber's socket itself (``send_core``)."""
        audit = self._audit
        if audit is not None and audit.reply == reply:
            self._audit = None
            self.advisories.audit(audit, body)
        elif self._audits_later and reply in self._audits_later:
            self.advisories.audit(self._audits_later.pop(reply), body)
        if not reply:
            return
        committer = self.broker.committer
        if epoch and not (committer.acks_wait and epoch > committer.synced):
            epoch = 0
        send_core(self.broker, reply, None, headers, body, epoch=epoch)

    def respond_acks(self, replies: list[bytes], seqs: list[int], form: bytes, epoch: int = 0) -> None:
        """:meth:`respond` of each PubAck ``form % seqs[i]`` (``pub_ack_format`` of
        one stream) to ``replies[i]`` (bytes), in order, as one write per connection
        where they can go together (the PubAcks of one group commit,
        ``send_pub_acks``)."""
        if self._audit is not None or self._audits_later:
            for reply, seq in zip(replies, seqs):
                self.respond(reply.decode(), form % seq, epoch=epoch)
            return
        committer = self.broker.committer
        if epoch and not (committer.acks_wait and epoch > committer.synced):
            epoch = 0
        send_pub_acks(self.broker, replies, seqs, form, epoch)

    def unaudited(self) -> None:
        """The request being handled is answered without an audit advisory (as
        nats-server answers a message get that found its message: straight to the
        reply, outside its API's responses, which are audited)."""
        self._audit = None

    def release(self, transport: Transport) -> None:
        """A NATS connection's answers waiting for the group commit (PubAcks) became
        durable: they go once the deliveries the same sync released are queued."""
        self._released.append(transport)

    def _synced(self, epoch: int) -> None:
        """After each sync, once the consumer engine has been told what it made
        visible: the released connections write their answers at once, or, when
        consumers have deliveries to make, after the engine's task has queued them
        (as nats-server, which delivers a message before its PubAck reaches the
        publisher: a KV watcher sees a put before the next one is made)."""
        transports, self._released = self._released, []
        if not transports:
            return
        if self.consumers.filling and self.nursery is not None:
            self.nursery.start_soon(self._release_later, transports)
            return
        for transport in transports:
            transport.on_sync()

    @staticmethod
    async def _release_later(transports: list[Transport]) -> None:
        await trio.lowlevel.checkpoint()  # the consumer engine's task, woken by this sync, runs first
        for transport in transports:
            transport.on_sync()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the API's nursery (it must handle its own errors).

        Raises:
            JSError: 429 10167 "too many requests" with ``MAX_WAITING_REQUESTS`` in
                progress (memory stays bounded whatever clients send).
        """
        if self.nursery is None:
            raise RuntimeError("JetStream.run() is not running")
        if self.waiting >= MAX_WAITING_REQUESTS:
            raise JSError(429, 10167, "too many requests")
        self.waiting += 1
        audit, self._audit = self._audit, None
        if audit is not None and audit.reply:
            self._audits_later[audit.reply] = audit  # answered by the task (at most MAX_WAITING_REQUESTS)

        async def counted() -> None:
            try:
                await fn(*args)
            finally:
                self.waiting -= 1
                if audit is not None and audit.reply:
                    self._audits_later.pop(audit.reply, None)

        self.nursery.start_soon(counted)

    def stream_name(self, topic: Topic) -> str:
        """The NATS stream name of a topic."""
        stream = topic.stream.name
        if stream == self.namespace:
            nats = topic.config.nats
            return nats["name"] if nats and "name" in nats else topic.name
        if stream == KV_STREAM and topic.config.kv is not None:
            nats = topic.config.nats
            return nats["name"] if nats and "name" in nats else KV_PREFIX + topic.name
        return topic.full_name

    def namespace_stream(self) -> Stream | None:
        return next((s for s in self.broker.catalog.streams.values() if s.name == self.namespace), None)

    def topic(self, name: str) -> Topic:
        """The topic of a NATS stream name (``KV_<b>``: the bucket ``kv/<b>``).

        Every request names its stream: the answer is kept (at most
        :data:`TOPIC_CACHE_LIMIT` names) while the topic is still in the catalog.

        Raises:
            JSError: 404 10059 "stream not found".
        """
        t = self._topics.get(name)
        if t is not None:
            owner = t.stream
            if (
                owner.topics.get(t.id) is t and self.broker.catalog.streams.get(owner.id) is owner
                and (t.config.kv is not None or owner.name != KV_STREAM)
            ):
                return t
            del self._topics[name]
        where, topic_name = self.place(name)
        places = [(where, topic_name)]
        if where == KV_STREAM:
            places.append((self.namespace, name))  # a plain stream named KV_<x>
        for where, topic_name in places:
            stream = next((s for s in self.broker.catalog.streams.values() if s.name == where), None)
            if stream is None:
                continue
            found = stream.topic_named(topic_name.lower())
            if found is not None and (where != KV_STREAM or found.config.kv is not None):
                if len(self._topics) >= TOPIC_CACHE_LIMIT:
                    self._topics.clear()
                self._topics[name] = found
                return found
        raise js_error(STREAM_NOT_FOUND)

    def place(self, name: str, config: dict[str, Any] | None = None) -> tuple[str, str]:
        """(ttlbroker stream, topic name as given) of a NATS stream name: ``KV_<b>`` is
        the bucket ``kv/<b>``, unless the stream ``config`` being created is not a
        bucket's (no ``allow_rollup_hdrs``, which every KV client sets): then, as
        any other stream, a topic of the namespace, and ``js.key_value`` finds no
        bucket there, as on nats-server."""
        if name.startswith(KV_PREFIX) and len(name) > len(KV_PREFIX):
            if config is None or config.get("allow_rollup_hdrs"):
                return KV_STREAM, name[len(KV_PREFIX) :]
        return self.namespace, name

    def shows(self, topic: Topic) -> bool:
        """Whether the API shows ``topic`` as a NATS stream (:meth:`topics`)."""
        owner = topic.stream.name
        return owner == self.namespace or (owner == KV_STREAM and topic.config.kv is not None)

    def topics(self) -> list[Topic]:
        """Every topic the API shows as a NATS stream: the namespace's topics and the
        KV buckets, by NATS name."""
        out: list[Topic] = []
        for s in self.broker.catalog.streams.values():
            if s.name == self.namespace:
                out.extend(s.topics.values())
            elif s.name == KV_STREAM:
                out.extend(t for t in s.topics.values() if t.config.kv is not None)
        return sorted(out, key=self.stream_name)

