"""The part of ``/varz`` that nats-server's ``/varz`` has (its ``Varz`` of
``server/monitor.go``): the same names, types and order, from the broker's state.

What the broker has is real: the NATS listener's ``host`` and ``port`` (the INFO a
NATS client gets, ``server_id`` and ``version`` included), the limits that play
nats-server's (``max_connections``, ``max_payload``, ``max_control_line``,
``max_pending``: ``[limits] max_pending_bytes_per_connection``; ``auth_timeout``
and ``tls_timeout``: ``[limits] handshake_timeout``; ``write_deadline``: ``[limits]
slow_consumer_seconds``; ``ping_interval`` and ``ping_max``: ``[nats]``), the
process (``mem``: its resident memory; ``cpu``: its CPU use in percent since the
previous ``/varz``, or since the monitoring started; ``cores``; ``gomaxprocs`` is 1:
one event loop), the connections of both listeners, the messages (``in_msgs``:
``messages_in`` + ``messages_unrouted``, the messages publishes stored and the core
messages published on subjects no topic captures; ``in_bytes``: ``bytes_in``, the
stored records' bytes; ``out_msgs``/``out_bytes``: ``messages_out``/``bytes_out``;
the ``*_client_*`` twins are the same, every connection being a client's),
``slow_consumers``, ``stale_connections`` (NATS connections closed after
unanswered pings, since the monitoring started), ``subscriptions`` (both
protocols'), ``http_req_stats`` (requests per endpoint of this port),
``config_load_time`` (the start: the configuration is read once) and
``jetstream``. What it does not have is there with zero values: no cluster, gateway,
leaf node, MQTT or websocket (``{}``), no routes, remotes or leaf nodes, no system
account, no stalls, no disk I/O waits, no git commit, digest or feature flags.
"""

from __future__ import annotations

import platform
import resource
import time
from multiprocessing import cpu_count
from typing import Any

from prometheus_client.process_collector import ProcessCollector

from protocol.nats import NATS_VERSION, rfc3339

from broker.core import Broker
from broker.nats import JetStream

from ._go import ns_duration, uptime
from ._jsz import jetstream_varz

__all__ = ["ProcessUsage", "nats_varz"]

#: ``go``: what runs the server (nats-server: its Go version).
RUNTIME = "python" + platform.python_version()


class ProcessUsage:
    """The process's memory and CPU use, for ``mem`` and ``cpu``."""

    def __init__(self) -> None:
        self._process = ProcessCollector(registry=None)
        self._last = (time.monotonic(), self.cpu_seconds())
        #: Set by :meth:`sample`: resident bytes now, the most ever, CPU percent
        #: since the previous sample.
        self.rss = 0
        self.max_rss = 0
        self.cpu_percent = 0.0

    @staticmethod
    def cpu_seconds() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def sample(self) -> None:
        """Read them now (``/proc``, through prometheus_client: in a worker thread)."""
        self.max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        self.rss = self.max_rss
        for family in self._process.collect():
            if family.name == "process_resident_memory_bytes" and family.samples:
                self.rss = int(family.samples[0].value)
        now, cpu = time.monotonic(), self.cpu_seconds()
        last_time, last_cpu = self._last
        if now > last_time:
            self.cpu_percent = round(100 * (cpu - last_cpu) / (now - last_time), 1)
            self._last = (now, cpu)


def nats_varz(
    broker: Broker, js: JetStream, *, server_id: str, nats_address: tuple[str, int] | None, http_address: tuple[str, int] | None,
    connections: int, stale: int, requests: dict[str, int], usage: ProcessUsage, recovered: bool,
) -> dict[str, Any]:
    """nats-server's ``/varz`` fields (see the module docstring)."""
    cfg = broker.config
    li, nats = cfg.limits, cfg.nats
    counters = broker.counters
    now = time.time()
    host, port = nats_address if nats_address is not None else ("", 0)
    http_host, http_port = http_address if http_address is not None else ("", 0)
    out: dict[str, Any] = {
        "server_id": server_id, "server_name": cfg.server.name, "version": NATS_VERSION, "proto": 1, "git_commit": "",
        "go": RUNTIME, "host": host, "port": port,
    }
    if broker.auth.required:
        out["auth_required"] = True
    if cfg.server.tls_cert:
        out["tls_required"] = True
        if cfg.server.tls_ca:
            out["tls_verify"] = True
    in_msgs = counters.messages_in + counters.messages_unrouted
    slow = counters.slow_consumers
    out.update({
        "max_connections": li.max_connections, "ping_interval": ns_duration(nats.ping_interval), "ping_max": nats.max_pings_out,
        "http_host": http_host, "http_port": http_port, "http_base_path": "", "https_port": 0,
        "auth_timeout": li.handshake_timeout, "max_control_line": nats.max_control_line, "max_payload": broker.max_payload,
        "max_pending": li.max_pending_bytes_per_connection,
        "cluster": {}, "gateway": {}, "leaf": {}, "mqtt": {}, "websocket": {},
        "jetstream": jetstream_varz(js, nats.enabled, recovered),
        "tls_timeout": li.handshake_timeout, "write_deadline": ns_duration(li.slow_consumer_seconds),
        "start": rfc3339(int(broker.started_at * 1e9)), "now": rfc3339(int(now * 1e9)), "uptime": uptime(now - broker.started_at),
        "mem": usage.rss, "cores": cpu_count(), "gomaxprocs": 1, "cpu": usage.cpu_percent,
        "connections": connections, "total_connections": counters.connections_total, "routes": 0, "remotes": 0, "leafnodes": 0,
        "in_msgs": in_msgs, "in_bytes": counters.bytes_in, "in_client_msgs": in_msgs, "in_client_bytes": counters.bytes_in,
        "out_msgs": counters.messages_out, "out_bytes": counters.bytes_out, "out_client_msgs": counters.messages_out,
        "out_client_bytes": counters.bytes_out, "slow_consumers": slow, "stale_connections": stale, "stalled_clients": 0,
        "subscriptions": len(broker.subs), "http_req_stats": dict(requests),
        "config_load_time": rfc3339(int(broker.started_at * 1e9)), "config_digest": "", "feature_flags": {}, "system_account": "",
        "slow_consumer_stats": {"clients": slow, "routes": 0, "gateways": 0, "leafs": 0},
        "stale_connection_stats": {"clients": stale, "routes": 0, "gateways": 0, "leafs": 0},
        "disk_io_wait_stats": {"waiters": 0, "waits": 0, "wait_time": 0, "max_wait_time": 0},
    })
    return out
