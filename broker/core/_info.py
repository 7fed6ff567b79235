"""Information: PING, GET_SERVER_INFO (also sent with the handshake) and EXPORT (an
export pass on demand); what the core counts, for GET_STATS and the monitoring port."""

from __future__ import annotations

import time
from typing import Any

import protocol as P
from protocol import PROTOCOL_VERSION

from ._broker import Broker, Reply

__all__ = ["VERSION", "export", "info", "ping", "server_info", "stats_values"]

VERSION = "0.1.0"


def ping(broker: Broker, session: object, cmd: P.Ping) -> Reply:
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
        "tls_required": bool(broker.config.server.tls_cert),
        "started_at": broker.started_at,
        "listeners": dict(broker.listeners),
        # A client may subscribe with SUBSCRIBE_REPLIES and publish with PUBLISH_REPLY.
        "reply_subjects": True,
    }


def server_info(broker: Broker, session: object, cmd: P.GetServerInfo) -> Reply:
    return P.InfoMap(info(broker)).encode()


async def export(broker: Broker, session: object, cmd: P.Export) -> Reply:
    return P.InfoMap(await broker.exporter.export_now(broker.all_partitions(), cmd.seal)).encode()


def stats_values(broker: Broker, bytes_on_disk: int, connections: int = 0, nats_connections: int = 0) -> dict[str, Any]:
    """The core's counters and gauges, read now (``broker.monitoring`` adds those of
    the connections and the consumers: GET_STATS, ``/varz`` and ``/metrics`` all show
    them).

    ``bytes_on_disk`` is the data directory's size (a walk of it, which the caller
    does in a worker thread); ``connections`` and ``nats_connections`` are counted by
    the caller, who holds the connections."""
    values: dict[str, Any] = dict(broker.counters.as_dict())
    topics = broker.catalog.topics()
    engine = broker.retention.engine
    values.update(
        name=broker.config.server.name,
        version=VERSION,
        uptime_seconds=round(time.time() - broker.started_at, 3),
        connections=connections,
        nats_connections=nats_connections,
        subscriptions=len(broker.subs),
        subscription_bytes=broker.subs.bytes,
        subscription_bytes_budget=broker.subs.budget,
        streams=len(broker.catalog.streams),
        topics=len(topics),
        partitions=sum(len(t.partitions) for t in topics),
        segments=sum(len(p.log.segments) for t in topics for p in t.partitions),
        messages=sum(t.messages_count for t in topics),
        bytes_in_logs=sum(t.size_bytes for t in topics),
        bytes_on_disk=bytes_on_disk,
        memory_storage_bytes=broker.memory_budget.used,
        memory_storage_limit_bytes=broker.memory_budget.limit,
        fsync=str(broker.config.system.partition.fsync),
        last_fsync_seconds=round(broker.committer.last_sync_seconds, 6),
        pending_expiries=len(engine.queue),
        pending_schedules=sum(len(p.schedules) for t in topics for p in t.partitions),
        expiry_passes=engine.passes,
        expiry_lag_max_ms=round(engine.lag_ns_max / 1e6, 3),
        **engine.watch.values(),
        export_pass_segments=broker.exporter.pass_segments,
        export_pass_done=broker.exporter.pass_done,
    )
    return values
