"""The monitoring endpoints, served over HTTP (``_http.py``) on ``[http] port``.

- ``GET /healthz``: 200 ``{"status": "ok"}`` while the broker accepts connections;
  503 ``{"status": "unavailable", "reason": ..., "error": ...}`` while it recovers its
  data directory (the monitoring port opens first, so a long recovery can be
  watched) and from the moment it starts shutting down. nats-server's parameters
  are read as it reads them (``js-enabled-only``, ``js-server-only``, ``details``;
  ``account``, ``stream`` and ``consumer`` check that those exist, ``_jsz.py``).
- ``GET /metrics``: the Prometheus exposition (``_metrics.py``).
- ``GET /varz``: server information as JSON: nats-server's ``/varz`` fields first
  (``_varz.py``), then ttlbroker's own: what the handshake tells a client
  (``broker.core.info``), every number of ``stats`` (``_stats.stats_values``, the same
  names), the lifecycle state, the CPU time and peak memory, and the configuration
  that matters when reading the numbers. Where a name is nats-server's with another
  meaning, ttlbroker's value is ``ttlbroker_<name>`` (:data:`RENAMED`: ``version``,
  ``host``, ``port``, the binary protocol's listener); where it is the same number
  (``connections``, ``subscriptions``, ``slow_consumers``, ``start``, ...) it is
  there once.
- ``GET /connz``, ``/subsz`` (also ``/subscriptionsz``): the connections and the
  subscriptions, nats-server's (``_connz.py``); ``GET /jsz``: the NATS streams and
  consumers, nats-server's (``_jsz.py``). ``GET /routez``, ``/gatewayz``,
  ``/leafz``: what a nats-server that is not in a cluster, a super-cluster or a leaf
  node topology answers (no routes, no gateways, no leaf nodes), for the monitoring
  tools that ask for them. A query parameter nats-server refuses gets its 400 and
  words (``_go.py``).

``HEAD`` works wherever ``GET`` does; other methods get 405, other paths 404.
:class:`Monitor` also carries the broker's lifecycle as the server reports it
(:attr:`Monitor.state`).

``/healthz`` (and ``/``) answer at once, from what is in memory. The others read
the broker's state on the event loop (nothing moves under them there) and encode
their text in worker threads (``/metrics`` and ``/varz`` also walk the data
directory there): they take turns (:data:`SCRAPES_AT_ONCE`), so that however many
scrapes arrive they hold at most that many of trio's worker threads (which the
broker's own blocking work shares) and compete with the event loop for the GIL no
more than that. A scrape waiting for its turn waits inside ``_http.waiting``: its
connection may be replaced by a new one (a probe) at the port's connection limits.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from broker.consumers import ConsumerEngine
from broker.core import Broker, info
from broker.nats import SERVER_ID, JetStream
from broker.net import ConnectionGuard
from protocol.nats import rfc3339

from ._connz import Connections
from ._go import BadParameter, Query
from ._http import HttpStats, Request, Response, waiting
from ._jsz import jsz, stream_health
from ._metrics import Metrics, Snapshot
from ._stats import stats_values
from ._varz import ProcessUsage, nats_varz

__all__ = ["Monitor", "RENAMED", "State"]

_JSON = "application/json"
#: Scrapes (every endpoint but ``/healthz`` and ``/``) worked on at once; the others
#: wait their turn.
SCRAPES_AT_ONCE = 1
#: ttlbroker's ``/varz`` fields whose names nats-server's ``/varz`` uses for something
#: else, and the names they take.
RENAMED = {"version": "ttlbroker_version", "host": "ttlbroker_host", "port": "ttlbroker_port"}
_ENDPOINTS = "/metrics, /healthz, /varz, /connz, /subsz, /jsz, /routez, /gatewayz, /leafz"


def _subs_parameter(q: Query) -> None:
    """nats-server's ``subs`` of ``/routez`` and ``/gatewayz``: ``detail``, or a
    boolean (anything else is refused in its words)."""
    if q.get("subs").lower() != "detail":
        q.flag("subs")


class State(enum.Enum):
    #: The data directory is being recovered (the broker's port is bound, not served).
    RECOVERING = "recovering"
    #: Accepting connections.
    READY = "ready"
    #: Shutting down (new requests are refused, connections drained).
    SHUTTING_DOWN = "shutting_down"


class Monitor:
    """Args:
    broker: the broker (not yet opened: the endpoints answer during recovery).
    consumers: its consumer engine.
    guard: the connections' limits and registry (their numbers are in stats).
    jetstream: its JetStream API (what ``/jsz`` shows).
    """

    def __init__(self, broker: Broker, consumers: ConsumerEngine, guard: ConnectionGuard, jetstream: JetStream) -> None:
        self.broker = broker
        self.consumers = consumers
        self.guard = guard
        self.jetstream = jetstream
        self.state = State.RECOVERING
        #: Whether the catalog is complete (recovery finished): only then may the
        #: endpoints walk it (recovery builds it in a worker thread).
        self.recovered = False
        #: ``(host, port)`` of the broker's, the NATS and the monitoring listeners,
        #: once bound (None: not bound, or off).
        self.address: tuple[str, int] | None = None
        self.nats_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self.http = HttpStats(broker.counters)
        self.metrics = Metrics(self)
        self.connections = Connections(broker, guard, SERVER_ID)
        self.usage = ProcessUsage()
        #: Requests per endpoint (``/varz``'s ``http_req_stats``).
        self.requests: dict[str, int] = {}
        self._scrapes = trio.Semaphore(SCRAPES_AT_ONCE)
        self._routes: dict[str, Callable[[Request], Awaitable[Response]]] = {
            "/": self._index, "/healthz": self._healthz, "/metrics": self._metrics, "/varz": self._varz,
            "/connz": self._connz, "/subsz": self._subsz, "/subscriptionsz": self._subsz, "/jsz": self._jsz,
            "/routez": self._routez, "/gatewayz": self._gatewayz, "/leafz": self._leafz,
        }

    @property
    def healthy(self) -> bool:
        return self.state is State.READY and not self.broker.shutting_down

    def size_on_disk(self) -> int:
        return self.broker.datadir.size_on_disk()

    def snapshot(self, bytes_on_disk: int) -> Snapshot:
        """Read everything ``/metrics`` shows. Only on the event loop: nothing moves
        under it there. ``bytes_on_disk`` is the data directory's size (a worker
        thread's walk)."""
        broker = self.broker
        http = self.http
        snap = Snapshot(broker.counters.as_dict(), self.healthy, broker.started_at, http.connections, dict(http.responses))
        if not self.recovered:
            return snap  # the catalog is being built in a worker thread
        snap.stats = stats_values(broker, self.consumers, self.guard, bytes_on_disk)
        engine = broker.retention.engine
        snap.lag_counts = list(engine.lag_counts)
        snap.lag_ns_sum = engine.lag_ns_sum
        parts = snap.partitions
        for topic in broker.catalog.topics():
            sname, tname = topic.stream.name, topic.name
            for p in topic.partitions:
                log_ = p.log
                parts.append((sname, tname, p.number, log_.live_count, log_.size_bytes, log_.first_offset, log_.last_offset,
                              len(log_.segments), p.pending))
            snap.topics.append((sname, tname, dict(topic.removed), dict(topic.markers), topic.duplicates, len(topic.dedup)))
            snap.consumers.extend(c.info() for _, c in sorted(self.consumers.consumers_of(topic).items()))
        return snap

    async def handle(self, request: Request) -> Response:
        """The ``_http.serve_http`` handler."""
        route = self._routes.get(request.path)
        if route is None:
            return Response(404, f"no such endpoint: {request.path} (try {_ENDPOINTS})\n".encode())
        if request.method not in ("GET", "HEAD"):
            return Response(405, f"{request.method} is not allowed here: use GET\n".encode(), headers=(("allow", "GET, HEAD"),))
        self.requests[request.path] = self.requests.get(request.path, 0) + 1
        return await route(request)

    # -- endpoints ---------------------------------------------------------------------

    async def _index(self, request: Request) -> Response:
        return Response(200, f"ttlbroker monitoring: {_ENDPOINTS.replace(',', '')}\n".encode())

    async def _healthz(self, request: Request) -> Response:
        """nats-server's ``/healthz`` parameters (see the module docstring), on the
        broker's readiness."""
        q = Query(request.target)
        try:  # (in nats-server's order: the first bad one is the one reported)
            enabled, enabled_only, server_only, _meta_only, details = (
                q.flag(name) for name in ("js-enabled", "js-enabled-only", "js-server-only", "js-meta-only", "details")
            )
        except BadParameter as exc:
            return Response(400, exc.body)
        account, stream, consumer = q.get("account"), q.get("stream"), q.get("consumer")
        if stream and not account:
            return _health(400, details, "BAD_REQUEST", '"account" must not be empty when checking stream health')
        if consumer and not stream:
            return _health(400, details, "BAD_REQUEST", '"stream" must not be empty when checking consumer health')
        if not self.healthy:
            shutting = self.state is State.SHUTTING_DOWN or self.broker.shutting_down
            reason = "shutting down" if shutting else "recovering"
            text = "the broker is shutting down" if shutting else "the broker is recovering its data directory"
            return _health(503, details, "CONNECTION", text, reason=reason)
        if enabled or enabled_only or server_only or not self.broker.config.nats.enabled or not (account or stream):
            return Response(200, b'{"status": "ok"}\n', _JSON)  # (one server: no meta layer, no assets elsewhere)
        failed = stream_health(self.jetstream, account, stream, consumer)
        if failed is None:
            return Response(200, b'{"status": "ok"}\n', _JSON)
        status, kind, text = failed
        named = {"account": account, "stream": stream, "consumer": consumer}
        return _health(status, details, kind, text, named={k: v for k, v in named.items() if v})

    async def _metrics(self, request: Request) -> Response:
        accept = (request.header(b"accept") or b"").decode("latin-1")
        async with self._turn():
            body, content_type = await self.metrics.scrape(accept)
        return Response(200, body, content_type)

    async def _varz(self, request: Request) -> Response:
        async with self._turn():
            return await _json(await self.varz())

    async def _connz(self, request: Request) -> Response:
        return await self._nats_document(request, self.connections.connz)

    async def _subsz(self, request: Request) -> Response:
        return await self._nats_document(request, self.connections.subsz)

    async def _jsz(self, request: Request) -> Response:
        if not self.recovered:  # the catalog is being built in a worker thread
            return Response(503, b"the broker is recovering its data directory\n")

        def document(q: Query) -> dict[str, Any]:
            return jsz(self.jetstream, self.broker.config.nats.enabled, SERVER_ID, q)

        return await self._nats_document(request, document)

    async def _routez(self, request: Request) -> Response:
        def document(q: Query) -> dict[str, Any]:
            _subs_parameter(q)
            return {"server_id": SERVER_ID, "server_name": self.broker.config.server.name, "now": rfc3339(time.time_ns()),
                    "num_routes": 0, "routes": []}

        return await self._nats_document(request, document)

    async def _gatewayz(self, request: Request) -> Response:
        def document(q: Query) -> dict[str, Any]:
            _subs_parameter(q)
            q.flag("accs")
            return {"server_id": SERVER_ID, "now": rfc3339(time.time_ns()), "outbound_gateways": {}, "inbound_gateways": {}}

        return await self._nats_document(request, document)

    async def _leafz(self, request: Request) -> Response:
        def document(q: Query) -> dict[str, Any]:
            q.flag("subs")
            return {"server_id": SERVER_ID, "now": rfc3339(time.time_ns()), "leafnodes": 0, "leafs": []}

        return await self._nats_document(request, document)

    async def _nats_document(self, request: Request, make: Callable[[Query], dict[str, Any]]) -> Response:
        """One of nats-server's JSON documents, made on the event loop for the
        request's query (400 with nats-server's words for a bad parameter),
        encoded in a worker thread."""
        async with self._turn():
            try:
                document = make(Query(request.target))
            except BadParameter as exc:
                return Response(400, exc.body)
            return await _json(document)

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """A scrape's turn (see the module docstring)."""
        with waiting():
            await self._scrapes.acquire()
        try:
            yield
        finally:
            self._scrapes.release()

    def _measure(self) -> int:
        """In a worker thread: the process's memory and CPU, and the data
        directory's size (0 while it is being recovered)."""
        self.usage.sample()
        return self.broker.datadir.size_on_disk() if self.recovered else 0

    async def varz(self) -> dict[str, Any]:
        """The ``/varz`` document (see the module docstring)."""
        broker = self.broker
        cfg = broker.config
        disk = await trio.to_thread.run_sync(self._measure)
        out = nats_varz(
            broker, self.jetstream, server_id=SERVER_ID, nats_address=self.nats_address, http_address=self.http_address,
            connections=len(self.guard.sessions), stale=self.connections.stale, requests=self.requests, usage=self.usage,
            recovered=self.recovered,
        )
        own: dict[str, Any] = dict(info(broker))
        own.update(
            state=self.state.value,
            host=self.address[0] if self.address else cfg.server.host,
            port=self.address[1] if self.address else cfg.server.port,
            cpu_seconds=round(self.usage.cpu_seconds(), 3),
            max_rss_bytes=self.usage.max_rss,
        )
        if self.recovered:
            own.update(stats_values(broker, self.consumers, self.guard, disk))
        else:
            own.update(broker.counters.as_dict())
        li = cfg.limits
        own["config"] = {
            "data_dir": broker.datadir.root,
            "fsync": str(cfg.system.partition.fsync),
            "segment_size_bytes": cfg.system.segment.size_bytes,
            "default_message_expiry": cfg.system.segment.message_expiry,
            "export_dir": cfg.export.dir or None,
            "export_interval": cfg.export.interval,
            "export_worker_priority": cfg.export.worker_priority,
            "message_cleaner": cfg.message_cleaner.enabled,
            "message_cleaner_interval": cfg.message_cleaner.interval,
            "auth_required": bool(cfg.server.auth_token),
            "max_connections": li.max_connections,
            "max_frame_bytes": li.max_frame_bytes,
            "max_payload_bytes": li.max_payload_bytes,
            "max_fetch_bytes": li.max_fetch_bytes,
            "max_pending_bytes_per_connection": li.max_pending_bytes_per_connection,
            "max_pending_bytes_total": li.max_pending_bytes_total,
            "max_subscriptions_per_connection": li.max_subscriptions_per_connection,
            "max_subscription_subject_bytes": li.max_subscription_subject_bytes,
            "max_subscription_bytes_total": li.max_subscription_bytes_total,
            "max_control_line": cfg.nats.max_control_line,
            "max_partitions": li.max_partitions,
            "max_consumers_per_topic": li.max_consumers_per_topic,
            "handshake_timeout": li.handshake_timeout,
            "slow_consumer_seconds": li.slow_consumer_seconds,
            "http_max_connections": cfg.http.max_connections,
            "http_max_connections_per_peer": cfg.http.max_connections_per_peer,
            "http_head_timeout": cfg.http.head_timeout,
        }
        for key, value in own.items():
            out.setdefault(RENAMED.get(key, key), value)  # the same number under the same name: once
        return out


async def _json(document: dict[str, Any]) -> Response:
    """A JSON document as nats-server indents it, encoded in a worker thread (the
    document is the request's own: nothing changes it meanwhile)."""
    body = await trio.to_thread.run_sync(functools.partial(json.dumps, document, indent=2))
    return Response(200, body.encode() + b"\n", _JSON)


def _health(
    status: int, details: bool, kind: str, text: str, reason: str = "", named: dict[str, str] | None = None,
) -> Response:
    """An unhealthy ``/healthz`` answer, as nats-server words it: ``error`` (or, with
    ``details``, ``errors`` of ``type`` and ``error``); ``reason`` is ttlbroker's own
    short word for the broker's state."""
    status_text = "error" if details or status == 400 else "unavailable"
    body: dict[str, Any] = {"status": status_text}
    if reason:
        body["reason"] = reason
    if details:
        body["errors"] = [{"type": kind, **(named or {}), "error": text}]
    else:
        body["error"] = text
    return Response(status, json.dumps(body).encode() + b"\n", _JSON)
