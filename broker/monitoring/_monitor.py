"""The monitoring endpoints, served over HTTP (``_http.py``) on ``[http] port``.

- ``GET /healthz``: 200 ``{"status": "ok"}`` while the broker accepts connections;
  503 ``{"status": "unavailable", "reason": ...}`` while it recovers its data
  directory (the monitoring port opens first, so a long recovery can be watched)
  and from the moment it starts shutting down.
- ``GET /metrics``: the Prometheus exposition (``_metrics.py``).
- ``GET /varz``: server information as JSON, after nats-server's ``/varz``: what the
  handshake tells a client (``broker.core.info``), every number of ``stats``
  (``_stats.stats_values``, the same names), the addresses, the start time and
  uptime, and the configuration that matters when reading the numbers.

``HEAD`` works wherever ``GET`` does; other methods get 405, other paths 404.
:class:`Monitor` also carries the broker's lifecycle as the server reports it
(:attr:`Monitor.state`).

``/healthz`` (and ``/``) answer at once, from what is in memory. ``/metrics`` and
``/varz`` walk the data directory and build their text in worker threads: they take
turns (:data:`SCRAPES_AT_ONCE`), so that however many scrapes arrive they hold at
most that many of trio's worker threads (which the broker's own blocking work
shares) and compete with the event loop for the GIL no more than that. A scrape
waiting for its turn waits inside ``_http.waiting``: its connection may be replaced
by a new one (a probe) at the port's connection limits.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import json
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from broker.consumers import ConsumerEngine
from broker.core import Broker, info
from broker.net import ConnectionGuard

from ._http import HttpStats, Request, Response, waiting
from ._metrics import Metrics, Snapshot
from ._stats import stats_values

__all__ = ["Monitor", "State"]

_JSON = "application/json"
#: Scrapes (``/metrics``, ``/varz``) worked on at once; the others wait their turn.
SCRAPES_AT_ONCE = 1


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
    """

    def __init__(self, broker: Broker, consumers: ConsumerEngine, guard: ConnectionGuard) -> None:
        self.broker = broker
        self.consumers = consumers
        self.guard = guard
        self.state = State.RECOVERING
        #: Whether the catalog is complete (recovery finished): only then may the
        #: endpoints walk it (recovery builds it in a worker thread).
        self.recovered = False
        #: ``(host, port)`` of the broker's and the monitoring listeners, once bound.
        self.address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self.http = HttpStats(broker.counters)
        self.metrics = Metrics(self)
        self._scrapes = trio.Semaphore(SCRAPES_AT_ONCE)
        self._routes: dict[str, Callable[[Request], Awaitable[Response]]] = {
            "/": self._index, "/healthz": self._healthz, "/metrics": self._metrics, "/varz": self._varz,
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
            return Response(404, f"no such endpoint: {request.path} (try /metrics, /healthz, /varz)\n".encode())
        if request.method not in ("GET", "HEAD"):
            return Response(405, f"{request.method} is not allowed here: use GET\n".encode(), headers=(("allow", "GET, HEAD"),))
        return await route(request)

    # -- endpoints ---------------------------------------------------------------------

    async def _index(self, request: Request) -> Response:
        return Response(200, b"ttlbroker monitoring: /metrics /healthz /varz\n")

    async def _healthz(self, request: Request) -> Response:
        if self.healthy:
            return Response(200, b'{"status": "ok"}\n', _JSON)
        reason = "shutting down" if self.state is State.SHUTTING_DOWN or self.broker.shutting_down else "recovering"
        return Response(503, json.dumps({"status": "unavailable", "reason": reason}).encode() + b"\n", _JSON)

    async def _metrics(self, request: Request) -> Response:
        accept = (request.header(b"accept") or b"").decode("latin-1")
        async with self._turn():
            body, content_type = await self.metrics.scrape(accept)
        return Response(200, body, content_type)

    async def _varz(self, request: Request) -> Response:
        async with self._turn():
            document = await self.varz()
        return Response(200, json.dumps(document, indent=2).encode() + b"\n", _JSON)

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """A scrape's turn (see the module docstring)."""
        with waiting():
            await self._scrapes.acquire()
        try:
            yield
        finally:
            self._scrapes.release()

    async def varz(self) -> dict[str, Any]:
        """The ``/varz`` document (see the module docstring)."""
        broker = self.broker
        cfg = broker.config
        now = time.time()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out: dict[str, Any] = dict(info(broker))
        out.update(
            state=self.state.value,
            host=self.address[0] if self.address else cfg.server.host,
            port=self.address[1] if self.address else cfg.server.port,
            http_host=self.http_address[0] if self.http_address else None,
            http_port=self.http_address[1] if self.http_address else None,
            start=_rfc3339(broker.started_at),
            now=_rfc3339(now),
            uptime=_duration(now - broker.started_at),
            cpu_seconds=round(usage.ru_utime + usage.ru_stime, 3),
            max_rss_bytes=usage.ru_maxrss * 1024,  # Linux reports KiB
        )
        if self.recovered:
            disk = await trio.to_thread.run_sync(broker.datadir.size_on_disk)
            out.update(stats_values(broker, self.consumers, self.guard, disk))
        else:
            out.update(broker.counters.as_dict())
        li = cfg.limits
        out["config"] = {
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
        return out


def _rfc3339(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _duration(seconds: float) -> str:
    """``1d2h3m4s`` (nats-server's uptime format)."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    out = f"{days}d" if days else ""
    if days or hours:
        out += f"{hours}h"
    if days or hours or minutes:
        out += f"{minutes}m"
    return out + f"{s}s"
