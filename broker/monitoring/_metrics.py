"""``GET /metrics``: the broker's state in the Prometheus exposition format.

Nothing is counted twice: :class:`BrokerCollector` reads, at scrape time, what the
broker keeps anyway (``Counters``, the gauges of ``stats``, the catalog, the
consumers, the expiry engine's lag histogram) and turns it into metric families
(``prometheus_client``'s ``*MetricFamily``); no prometheus object is touched on a
hot path. Names follow Prometheus's conventions:

- every field of ``Counters`` is ``ttlbroker_<name>_total`` (but :data:`RENAMED`),
  its ``#:`` comment the HELP text; the gauges of ``stats`` are ``ttlbroker_<name>``
  (:data:`GAUGES`);
- per topic and partition: labels ``stream``, ``topic`` and ``partition``;
- per durable consumer, when there are any: labels ``stream``, ``topic``,
  ``consumer`` (and ``partition``);
- expiry lag is a histogram, ``ttlbroker_expiry_lag_seconds``;
- the process (CPU, memory, file descriptors, garbage collections) under
  ``process_`` and ``python_``, from ``prometheus_client``'s own collectors.

A scrape reads the numbers on the event loop (the broker's state is consistent
only there) into a :class:`Snapshot` of plain data, and leaves the rest, building
the families and encoding the text (most of the work), to a worker thread, with a
registry of its own (never ``prometheus_client``'s global one).
While the broker recovers its data (in a worker thread, which is still building the
catalog) only the counters, ``ttlbroker_ready`` and the process are shown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from protocol import PROTOCOL_VERSION

from broker.core import LAG_BUCKETS_NS, counter_help

__all__ = ["BrokerCollector", "Metrics", "Snapshot", "Source", "families", "GAUGES", "COUNTERS", "RENAMED", "PREFIX"]

PREFIX = "ttlbroker_"

#: The gauges of ``stats`` (besides ``Counters``): stats key -> (metric name, HELP,
#: scale to the metric's unit). A test checks that every number ``stats`` returns
#: is here, in ``Counters`` or in :data:`COUNTERS`.
GAUGES: dict[str, tuple[str, str, float]] = {
    "uptime_seconds": ("uptime_seconds", "Seconds since the broker started.", 1),
    "connections": ("connections", "Client connections open now (both protocols).", 1),
    "nats_connections": ("nats_connections", "NATS client connections open now (counted in connections too).", 1),
    "subscriptions": ("subscriptions", "Core subscriptions open now.", 1),
    "subscription_bytes": ("subscription_bytes", "Bytes core subscriptions of both protocols hold now, estimated (the subscription budget's use).", 1),
    "subscription_bytes_budget": ("subscription_bytes_budget", "The subscription budget: limits.max_subscription_bytes_total.", 1),
    "streams": ("streams", "Streams.", 1),
    "topics": ("topics", "Topics.", 1),
    "partitions": ("partitions", "Partitions of all topics.", 1),
    "segments": ("segments", "Segment files of all partitions.", 1),
    "messages": ("messages", "Live messages stored in all partitions.", 1),
    "bytes_in_logs": ("bytes_in_logs", "Bytes of the segment logs of all partitions.", 1),
    "bytes_on_disk": ("bytes_on_disk", "Bytes of every file in the data directory.", 1),
    "memory_storage_bytes": ("memory_storage_bytes", "Bytes of records held by memory-storage topics.", 1),
    "memory_storage_limit_bytes": ("memory_storage_limit_bytes", "The memory storage budget ([limits] memory_storage_bytes).", 1),
    "last_fsync_seconds": ("last_fsync_seconds", "Duration of the last group commit's fsync round.", 1),
    "pending_expiries": ("pending_expiries", "Messages waiting in the deadline structure for their per-message TTL.", 1),
    "pending_schedules": ("pending_schedules", "Message schedules (NATS ADR-51) waiting to fire.", 1),
    "expiry_lag_max_ms": ("expiry_lag_max_seconds", "The longest an expiry pass ran after its bucket's time since start.", 1e-3),
    "loop_stall_max_ms": ("loop_stall_max_seconds", "The longest the event loop ran tasks without looking at I/O and timers, since start.", 1e-3),
    "gc_pause_max_ms": ("gc_pause_max_seconds", "The longest garbage collection since start.", 1e-3),
    "export_pass_segments": ("export_pass_segments", "Segments the export pass under way has to write (0 between passes).", 1),
    "export_pass_done": ("export_pass_done", "Segments the export pass under way has written (0 between passes).", 1),
    "consumers": ("consumers", "Durable consumers of all topics.", 1),
    "consumer_num_pending": ("consumers_num_pending", "Messages no durable consumer has delivered yet, summed over consumers.", 1),
    "consumer_num_ack_pending": ("consumers_num_ack_pending", "Deliveries waiting for an ack, summed over consumers.", 1),
    "consumer_num_redelivered": ("consumers_num_redelivered", "Outstanding deliveries delivered more than once, summed over consumers.", 1),
    "consumer_num_waiting": ("consumers_num_waiting", "Pull requests waiting for messages, summed over consumers.", 1),
    "consumer_timers": ("consumer_timers", "Redelivery timer entries held by the expiry engine.", 1),
    "queued_bytes": ("queued_bytes", "Bytes queued for sending to clients now (all connections).", 1),
    "queued_bytes_max": ("queued_bytes_max", "The most bytes queued for sending to clients at once since start.", 1),
    "queued_bytes_budget": ("queued_bytes_budget", "The output budget: limits.max_pending_bytes_total.", 1),
}
#: Counters whose metric is not ``ttlbroker_<field>_total``: a name ending in
#: ``_total`` would end in it twice (and ``connections`` is the gauge of open ones).
RENAMED = {"connections_total": "connections_accepted", "http_connections_total": "http_connections"}
#: Numbers of ``stats`` that only grow but are not in ``Counters``.
COUNTERS: dict[str, tuple[str, str, float]] = {
    "expiry_passes": ("expiry_passes", "Expiry passes that removed or re-armed something.", 1),
    "gc_collections": ("gc_collections", "Garbage collections (every generation) since start.", 1),
    "gc_pause_total_ms": ("gc_pause_seconds", "Time the garbage collector stopped the broker.", 1e-3),
}
#: Text of ``stats``, shown as labels of ``ttlbroker_info``.
INFO_KEYS = ("name", "version", "fsync")

_PARTITION = ["stream", "topic", "partition"]
_TOPIC = ["stream", "topic"]
_CONSUMER = ["stream", "topic", "consumer"]
_CONSUMER_PARTITION = ["stream", "topic", "consumer", "partition"]


@dataclass
class Snapshot:
    """The broker's numbers at one moment, as plain data: read on the event loop
    (``Source.snapshot``), turned into metric families anywhere (:func:`families`)."""

    counters: dict[str, int]
    ready: bool
    started_at: float
    #: Monitoring connections open now.
    http_open: int
    http_responses: dict[int, int]
    #: ``stats_values`` (None while the broker recovers: the catalog is not complete).
    stats: dict[str, Any] | None = None
    lag_counts: list[int] = field(default_factory=list)
    lag_ns_sum: int = 0
    #: ``(stream, topic, partition, messages, bytes, first, last, segments, pending)``
    partitions: list[tuple[str, str, int, int, int, int, int, int, int]] = field(default_factory=list)
    #: ``(stream, topic, removed by reason, markers by reason, duplicates, dedup ids)``
    topics: list[tuple[str, str, dict[str, int], dict[str, int], int, int]] = field(default_factory=list)
    #: ``Consumer.info()`` of every durable consumer.
    consumers: list[dict[str, Any]] = field(default_factory=list)


class Source(Protocol):
    """Where ``/metrics`` reads the broker's numbers (the :class:`~._monitor.Monitor`)."""

    #: Whether the catalog is complete (recovery finished): only then may it be read.
    recovered: bool

    def snapshot(self, bytes_on_disk: int) -> Snapshot:
        """Read everything ``/metrics`` shows (on the event loop)."""
        ...

    def size_on_disk(self) -> int:
        """The data directory's size (a walk of it: in a worker thread)."""
        ...


def families(snap: Snapshot, helps: dict[str, str]) -> list[Metric]:
    """The metric families of ``snap`` (plain data: any thread). ``helps``: the
    counters' HELP texts (``counter_help()``)."""
    out: list[Metric] = [
        CounterMetricFamily(PREFIX + RENAMED.get(name, name), helps.get(name, name), value=value)
        for name, value in snap.counters.items()
    ]
    out.append(GaugeMetricFamily(PREFIX + "ready", "1 when /healthz answers 200: recovered, accepting connections, not shutting down.",
                                 value=1 if snap.ready else 0))
    out.append(GaugeMetricFamily(PREFIX + "start_time_seconds", "When the broker started (Unix time).", value=snap.started_at))
    out.append(GaugeMetricFamily(PREFIX + "http_connections_open", "Monitoring connections open now.", value=snap.http_open))
    responses = CounterMetricFamily(PREFIX + "http_responses", "Monitoring responses sent, by status code.", labels=["code"])
    for code, n in sorted(snap.http_responses.items()):
        responses.add_metric([str(code)], n)
    out.append(responses)
    stats = snap.stats
    if stats is None:
        return out
    out.append(InfoMetricFamily(PREFIX[:-1], "Which broker this is.", value={
        **{k: str(stats[k]) for k in INFO_KEYS}, "protocol_version": str(PROTOCOL_VERSION)}))
    for key, value in stats.items():
        if key in GAUGES:
            name, text, scale = GAUGES[key]
            out.append(GaugeMetricFamily(PREFIX + name, text, value=value * scale))
        elif key in COUNTERS:
            name, text, scale = COUNTERS[key]
            out.append(CounterMetricFamily(PREFIX + name, text, value=value * scale))
    out.append(_lag(snap))
    out.extend(_topics(snap))
    out.extend(_consumers(snap))
    return out


def _lag(snap: Snapshot) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip((*LAG_BUCKETS_NS, None), snap.lag_counts):
        total += n
        buckets.append(("+Inf" if bound is None else repr(bound / 1e9), total))
    return HistogramMetricFamily(
        PREFIX + "expiry_lag_seconds",
        "How long after its bucket's time the expiry task woke (expiries are due within 0.1 s of their deadline).",
        buckets=buckets, sum_value=snap.lag_ns_sum / 1e9,
    )


def _topics(snap: Snapshot) -> list[Metric]:
    per_partition = [
        GaugeMetricFamily(PREFIX + name, text, labels=_PARTITION) for name, text in (
            ("partition_messages", "Live messages in the partition."),
            ("partition_bytes", "Bytes of the partition's segment log."),
            ("partition_first_offset", "Offset of the partition's oldest live message (0: none)."),
            ("partition_last_offset", "Offset of the partition's newest message (0: none yet)."),
            ("partition_segments", "Segment files of the partition."),
            ("partition_pending_expiries", "Messages of the partition waiting for their per-message TTL."),
        )
    ]
    for sname, tname, number, *values in snap.partitions:
        labels = [sname, tname, str(number)]
        for family, value in zip(per_partition, values):
            family.add_metric(labels, value)
    removed = CounterMetricFamily(PREFIX + "topic_removed", "Messages removed since start, by reason.", labels=[*_TOPIC, "reason"])
    markers = CounterMetricFamily(PREFIX + "topic_markers", "Subject delete markers written since start, by reason.",
                                  labels=[*_TOPIC, "reason"])
    duplicates = CounterMetricFamily(PREFIX + "topic_duplicates",
                                     "Publishes not stored again since start: their Nats-Msg-Id was in the duplicate window.",
                                     labels=_TOPIC)
    dedup = GaugeMetricFamily(PREFIX + "topic_dedup_ids", "Nats-Msg-Id values the duplicate window holds.", labels=_TOPIC)
    for sname, tname, by_reason, markers_by_reason, dups, ids in snap.topics:
        t = [sname, tname]
        for reason, n in sorted(by_reason.items()):
            removed.add_metric([*t, reason], n)
        for reason, n in sorted(markers_by_reason.items()):
            markers.add_metric([*t, reason], n)
        duplicates.add_metric(t, dups)
        dedup.add_metric(t, ids)
    return [*per_partition, removed, markers, duplicates, dedup]


def _consumers(snap: Snapshot) -> list[Metric]:
    if not snap.consumers:
        return []
    per_consumer: list[tuple[GaugeMetricFamily, Callable[[dict[str, Any]], int]]] = [
        (GaugeMetricFamily(PREFIX + "consumer_num_pending", "Messages the consumer has not delivered yet.", labels=_CONSUMER),
         lambda i: i["num_pending"]),
        (GaugeMetricFamily(PREFIX + "consumer_num_ack_pending", "Deliveries waiting for an ack.", labels=_CONSUMER),
         lambda i: i["num_ack_pending"]),
        (GaugeMetricFamily(PREFIX + "consumer_num_redelivered", "Outstanding deliveries delivered more than once.", labels=_CONSUMER),
         lambda i: i["num_redelivered"]),
        (GaugeMetricFamily(PREFIX + "consumer_num_waiting", "Pull requests waiting for messages.", labels=_CONSUMER),
         lambda i: i["num_waiting"]),
        (GaugeMetricFamily(PREFIX + "consumer_delivered_consumer_seq", "The consumer's last delivery sequence.", labels=_CONSUMER),
         lambda i: i["delivered"]["consumer_seq"]),
        (GaugeMetricFamily(PREFIX + "consumer_ack_floor_consumer_seq", "Delivery sequence below which every delivery is settled.",
                           labels=_CONSUMER), lambda i: i["ack_floor"]["consumer_seq"]),
    ]
    per_partition = [
        (GaugeMetricFamily(PREFIX + name, text, labels=_CONSUMER_PARTITION), key) for name, text, key in (
            ("consumer_partition_num_pending", "Messages of the partition the consumer has not delivered yet.", "num_pending"),
            ("consumer_partition_num_ack_pending", "Deliveries from the partition waiting for an ack.", "num_ack_pending"),
            ("consumer_partition_delivered_offset", "Offset of the consumer's last delivery from the partition.", "delivered"),
            ("consumer_partition_ack_floor_offset", "Offset of the partition below which every delivery is settled (ack floor).",
             "ack_floor"),
        )
    ]
    for info in snap.consumers:
        labels = [info["stream"], info["topic"], info["name"]]
        for family, value in per_consumer:
            family.add_metric(labels, value(info))
        for part in info["partitions"]:
            plabels = [*labels, str(part["partition"])]
            for pfamily, key in per_partition:
                pfamily.add_metric(plabels, part[key])
    out: list[Metric] = [f for f, _ in per_consumer]
    out.extend(f for f, _ in per_partition)
    return out


class BrokerCollector(Collector):
    """A ``prometheus_client`` collector of the broker's families, read from its
    live state when collected: collect only on the event loop. (A scrape splits the
    same work: ``Source.snapshot`` on the loop, :func:`families` in a thread.)"""

    def __init__(self, source: Source) -> None:
        self.source = source
        #: The data directory's size, as last measured (a scrape sets it first).
        self.bytes_on_disk = 0
        self.helps = counter_help()

    def collect(self) -> list[Metric]:
        return families(self.source.snapshot(self.bytes_on_disk), self.helps)


class _Collected(Collector):
    """Families already built, for the encoder in the worker thread."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class Metrics:
    """What ``GET /metrics`` answers (see the module docstring)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.collector = BrokerCollector(source)
        # Each scrape registers them in a registry of its own (the one they register
        # themselves in when made is never read).
        made = CollectorRegistry(auto_describe=False)
        self._process: list[Collector] = [ProcessCollector(registry=made), GCCollector(registry=made), PlatformCollector(registry=made)]

    async def scrape(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition (text format, or OpenMetrics if ``accept`` asks for it)
        and its content type."""
        source = self.source
        if source.recovered:
            self.collector.bytes_on_disk = await trio.to_thread.run_sync(source.size_on_disk)
        snap = source.snapshot(self.collector.bytes_on_disk)  # on the loop: nothing moves under it
        encoder, content_type = choose_encoder(accept)
        return await trio.to_thread.run_sync(self._encode, snap, encoder), content_type

    def _encode(self, snap: Snapshot, encoder: Callable[[CollectorRegistry], bytes]) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collected(families(snap, self.collector.helps)))
        for collector in self._process:
            registry.register(collector)
        return encoder(registry)
