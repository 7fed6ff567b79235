"""Information: PING, GET_SERVER_INFO (also sent with the handshake), GET_STATS and
EXPORT (an export pass on demand)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import trio

import protocol as P
from protocol import PROTOCOL_VERSION

if TYPE_CHECKING:
    from ._broker import Broker, Reply

__all__ = ["VERSION", "export", "info", "ping", "server_info", "stats", "stats_values"]

VERSION = "0.1.0"


def ping(broker: Broker, session: Any, cmd: P.Ping) -> Reply:
    return b""


def info(broker: Broker) -> dict[str, Any]:
    li = broker.config.limits
    return {
        "name": broker.config.server.name,
        "version": VERSION,
        "protocol_version": PROTOCOL_VERSION,
        "max_frame_bytes": li.max_frame_bytes,
        "max_payload_bytes": li.max_payload_bytes,
        "max_fetch_bytes": li.max_fetch_bytes,
        "fsync": str(broker.config.system.partition.fsync),
        "auth_required": bool(broker.config.server.auth_token),
        "started_at": broker.started_at,
    }


def server_info(broker: Broker, session: Any, cmd: P.GetServerInfo) -> Reply:
    return P.InfoMap(info(broker)).encode()


async def export(broker: Broker, session: Any, cmd: P.Export) -> Reply:
    return P.InfoMap(await broker.exporter.export_now(broker.all_partitions(), cmd.seal)).encode()


async def stats(broker: Broker, session: Any, cmd: P.GetStats) -> Reply:
    disk = await trio.to_thread.run_sync(broker.datadir.size_on_disk)
    budget = getattr(session, "budget", None)  # the output budget all sessions share
    return P.InfoMap(stats_values(broker, disk, budget)).encode()


def stats_values(broker: Broker, bytes_on_disk: int, budget: Any = None) -> dict[str, Any]:
    """Every counter and gauge ``stats`` reports, read now. GET_STATS, ``/varz``
    and ``/metrics`` (``_metrics.py``) all show these.

    ``bytes_on_disk`` is the data directory's size (a walk of it, which the caller
    does in a worker thread); ``budget`` is the connections' shared output budget."""
    values: dict[str, Any] = dict(broker.counters.as_dict())
    topics = broker.catalog.topics()
    values.update(
        name=broker.config.server.name,
        version=VERSION,
        uptime_seconds=round(time.time() - broker.started_at, 3),
        connections=len(broker.sessions),
        nats_connections=sum(1 for s in broker.sessions if getattr(s, "protocol", "") == "nats"),
        subscriptions=len(broker.subs),
        streams=len(broker.catalog.streams),
        topics=len(topics),
        partitions=sum(len(t.partitions) for t in topics),
        segments=sum(len(p.log.segments) for t in topics for p in t.partitions),
        messages=sum(t.messages_count for t in topics),
        bytes_in_logs=sum(t.size_bytes for t in topics),
        bytes_on_disk=bytes_on_disk,
        fsync=str(broker.config.system.partition.fsync),
        last_fsync_seconds=round(broker.committer.last_sync_seconds, 6),
        pending_expiries=len(broker.retention.engine.queue),
        expiry_passes=broker.retention.engine.passes,
        expiry_lag_max_ms=round(broker.retention.engine.lag_ns_max / 1e6, 3),
        **broker.retention.engine.watch.values(),
        export_pass_segments=broker.exporter.pass_segments,
        export_pass_done=broker.exporter.pass_done,
    )
    consumers = [c for t in topics for c in t.consumer_set.values()]
    values.update(
        consumers=len(consumers),
        consumer_num_pending=sum(c.num_pending for c in consumers),
        consumer_num_ack_pending=sum(c.num_ack_pending for c in consumers),
        consumer_num_redelivered=sum(c.num_redelivered for c in consumers),
        consumer_num_waiting=sum(len(c.waiting) for c in consumers),
        consumer_timers=broker.retention.engine.timers,
    )
    if budget is not None:
        values.update(queued_bytes=budget.total, queued_bytes_max=budget.peak, queued_bytes_budget=budget.limit)
    return values
