"""Every counter and gauge the broker reports, in one place: GET_STATS (the binary
protocol), ``/varz`` and ``/metrics`` all show these, under the same names (but
``version``, ``/varz``'s ``ttlbroker_version``: its ``version`` is nats-server's)."""

from __future__ import annotations

from typing import Any

import broker.core as core
from broker.consumers import ConsumerEngine
from broker.net import ConnectionGuard

__all__ = ["stats_values"]


def stats_values(
    broker: core.Broker, consumers: ConsumerEngine, guard: ConnectionGuard, bytes_on_disk: int,
) -> dict[str, Any]:
    """The core's numbers (``broker.core.stats_values``), the consumers', and the
    connections' output budget, read now. ``bytes_on_disk`` is the data directory's
    size (a walk of it, which the caller does in a worker thread)."""
    sessions = guard.sessions
    values = core.stats_values(
        broker, bytes_on_disk, len(sessions), sum(1 for s in sessions if s.protocol == "nats"),
    )
    values.update(consumers.stats_values())
    budget = guard.budget
    values.update(queued_bytes=budget.total, queued_bytes_max=budget.peak, queued_bytes_budget=budget.limit)
    return values
