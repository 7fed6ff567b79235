"""``/jsz``, ``/varz``'s ``jetstream`` and ``/healthz``'s JetStream checks: the
broker's NATS streams (the topics the JetStream API shows, ``JetStream.topics``)
in nats-server's JSON (``JSInfo``, ``AccountDetail``, ``StreamDetail`` of
``server/monitor.go``), with its query parameters and their errors.

* One account, nats-server's global ``$G``: ``account_details`` holds it when
  ``accounts``, ``streams`` or ``consumers`` asks (``acc=$G`` too); ``offset`` and
  ``limit`` page the accounts, as nats-server pages them.
* A stream's detail is what ``STREAM.INFO`` answers (``broker.nats.stream_info``:
  its state, its config with ``config=true``, its mirror or sources); its consumers
  what ``CONSUMER.INFO`` answers (without their config unless ``config=true``).
  ``cluster.leader`` is this server's name: one server leads everything.
* With the NATS listener off there is no JetStream: ``"disabled": true``, as
  nats-server without ``-js``.
* Cost: one pass over the streams (and with ``streams``, each stream's subjects, as
  ``STREAM.INFO``), bounded by the catalog.
"""

from __future__ import annotations

import time
from typing import Any

from protocol import BrokerError, normalize_name
from protocol.nats import API_LEVEL, JSError, rfc3339

from broker.core import Broker, Topic
from broker.nats import JetStream, account_info, consumer_info, stream_info

from ._connz import GLOBAL_ACCOUNT
from ._go import Query, ns_duration

__all__ = ["jetstream_varz", "jsz", "stream_health"]

#: nats-server's default ``limit`` of ``/jsz`` (accounts).
JSZ_LIMIT = 1024
#: An account detail's reservations: none (Go's ``uint64(-1)``, as nats-server shows
#: an account without JetStream limits).
_NO_RESERVATION = 2**64 - 1


def _config(broker: Broker) -> dict[str, Any]:
    """nats-server's JetStreamConfig: the memory storage budget, no storage limit
    (-1), the data directory, how often it syncs."""
    cfg = broker.config
    fsync = cfg.system.partition.fsync
    out: dict[str, Any] = {
        "max_memory": broker.memory_budget.limit, "max_storage": -1, "store_dir": str(broker.datadir.root),
        "sync_interval": ns_duration(fsync.interval_ms / 1000) if fsync.mode == "interval" else 0,
    }
    if fsync.mode == "always":
        out["sync_always"] = True
    if cfg.nats.domain:
        out["domain"] = cfg.nats.domain
    out["strict"] = False  # unknown request fields are ignored
    return out


def _limits(broker: Broker) -> dict[str, Any]:
    return {"default_max_consumers": broker.config.limits.max_consumers_per_topic}


def _stats(js: JetStream, account: dict[str, Any]) -> dict[str, Any]:
    """nats-server's JetStreamStats, from ``$JS.API.INFO``'s account info."""
    return {
        "memory": account["memory"], "storage": account["storage"], "reserved_memory": 0, "reserved_storage": 0, "accounts": 1,
        "ha_assets": 0, "api": {"level": API_LEVEL, "total": js.api_total, "errors": js.api_errors},
    }


def jetstream_varz(js: JetStream, enabled: bool, recovered: bool) -> dict[str, Any]:
    """``/varz``'s ``jetstream`` (``{}`` without JetStream; no stats while the
    catalog is being recovered)."""
    if not enabled:
        return {}
    out: dict[str, Any] = {"config": _config(js.broker)}
    if recovered:
        out["stats"] = _stats(js, account_info(js))
    out["limits"] = _limits(js.broker)
    return out


def jsz(js: JetStream, enabled: bool, server_id: str, q: Query) -> dict[str, Any]:
    """The ``/jsz`` document for the query (see the module docstring).

    Raises:
        BadParameter: a parameter nats-server refuses, in its words.
    """
    accounts = q.flag("accounts")
    streams = q.flag("streams")
    consumers = q.flag("consumers")
    q.flag("direct-consumers")  # (none here)
    config = q.flag("config")
    offset = q.integer("offset")
    limit = q.integer("limit")
    for name in ("leader-only", "raft", "stream-leader-only"):
        q.flag(name)  # one server: it leads everything, and there are no raft groups
    acc = q.get("acc")
    offset = max(offset, 0)
    if limit == 0:
        limit = JSZ_LIMIT
    streams = streams or consumers
    accounts = accounts or (streams and not acc)
    now = rfc3339(time.time_ns())
    if not enabled:
        return {
            "memory": 0, "storage": 0, "reserved_memory": 0, "reserved_storage": 0, "accounts": 0, "ha_assets": 0,
            "api": {"level": 0, "total": 0, "errors": 0}, "server_id": server_id, "now": now, "disabled": True,
            "config": {"max_memory": 0, "max_storage": 0}, "streams": 0, "consumers": 0, "messages": 0, "bytes": 0, "total": 0,
        }
    broker = js.broker
    topics = js.topics()
    account = account_info(js)
    out: dict[str, Any] = _stats(js, account)
    out.update(
        server_id=server_id, now=now, config=_config(broker), limits=_limits(broker), streams=len(topics),
        consumers=account["consumers"], messages=sum(t.messages_count for t in topics), bytes=sum(t.live_bytes for t in topics),
    )
    if acc == GLOBAL_ACCOUNT:
        shown = [GLOBAL_ACCOUNT]
    elif accounts:
        shown = [GLOBAL_ACCOUNT][min(offset, 1) :]
        if limit > 0:
            shown = shown[:limit]
    else:
        shown = []
    if shown:
        out["account_details"] = [_account_detail(js, account, topics, streams, consumers, config)]
    out["total"] = 1
    return out


def _account_detail(
    js: JetStream, account: dict[str, Any], topics: list[Topic], streams: bool, consumers: bool, config: bool,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": GLOBAL_ACCOUNT, "id": GLOBAL_ACCOUNT, "memory": account["memory"], "storage": account["storage"],
        "reserved_memory": _NO_RESERVATION, "reserved_storage": _NO_RESERVATION, "accounts": 0, "ha_assets": 0,
        "api": {"level": 0, "total": js.api_total, "errors": js.api_errors},
    }
    if streams and topics:
        out["stream_detail"] = [_stream_detail(js, t, consumers, config) for t in topics]
    return out


def _stream_detail(js: JetStream, topic: Topic, consumers: bool, config: bool) -> dict[str, Any]:
    info = stream_info(js, topic)
    out: dict[str, Any] = {
        "name": js.stream_name(topic), "created": info["created"], "cluster": {"leader": js.broker.config.server.name},
    }
    if config:
        out["config"] = info["config"]
    out["state"] = info["state"]
    if consumers:
        listed = []
        for _, c in sorted(js.consumers.consumers_of(topic).items()):
            ci = consumer_info(js, c)
            if not config:
                ci.pop("config", None)
            listed.append(ci)
        if listed:
            out["consumer_detail"] = listed
    for key in ("mirror", "sources"):
        if key in info:
            out[key] = info[key]
    return out


def stream_health(js: JetStream, account: str, stream: str, consumer: str) -> tuple[int, str, str] | None:
    """``/healthz?account=..&stream=..&consumer=..``: None when what is named exists,
    else (status, error type, error) in nats-server's words. Only the global account
    exists, and only once it has a stream (nats-server finds accounts by their
    streams' directories)."""
    if account and (account != GLOBAL_ACCOUNT or not js.topics()):
        return 404, "ACCOUNT", f'JetStream account "{account}" not found'
    if not stream:
        return None
    try:
        topic = js.topic(stream)
    except JSError:
        return 404, "STREAM", f'JetStream stream "{stream}" not found on account "{account}"'
    if not consumer:
        return None
    try:
        found = js.consumers.consumers_of(topic).get(normalize_name(consumer, "consumer name"))
    except BrokerError:
        found = None
    if found is None:
        return 404, "CONSUMER", f'JetStream consumer "{consumer}" not found for stream "{stream}" on account "{account}"'
    return None

