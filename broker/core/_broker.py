"""The broker's shared state and its lifecycle.

One :class:`Broker` owns the catalog (streams, topics, partitions), the router, the
core subscriptions, the group committer, retention (expiry, markers, the cleaner),
republish, the publish path, the sealer and the exporter, and the counters. It
opens and closes them (:meth:`Broker.open` recovers every topic at start), and
lists the background tasks and the sync sources.

It does not know who calls it. The command handlers are functions of their own
modules (``_admin.py``, ``_reading.py``, ``_removing.py``, ``_info.py``, and the
families of ``broker.consumers`` and ``broker.kv``), which take the broker as their
first argument; each session dispatches through its own table
(``broker.server``'s for the binary protocol, ``broker.nats`` for the JetStream
API). What lives above the core and keeps state per topic (the consumer engine,
the KV leases) registers a :class:`TopicHooks` in :attr:`Broker.topic_hooks`, which
the broker calls as it opens, closes and deletes topics.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio

from protocol import BrokerError, RemovalReason as R, TopicDetails
from storage import Damage, DataDir, MemoryBudget, MemoryPartitionLog, PartitionLog, RecoveryReport, StorageFailure

from broker.auth import Authenticator
from broker.config import Config

from ._catalog import Catalog
from ._clock import Clock
from ._commit import Committer, Reply, SyncSource
from ._export import Exporter
from ._log import get_logger
from ._limits import trim
from ._publishing import Publisher
from ._republish import Republisher
from ._retention import Retention
from ._routing import Router
from ._schedules import Scheduler
from ._sealing import Sealer
from ._stats import Counters
from ._subscriptions import SubscriptionIndex
from ._topic_config import TopicConfig
from ._topics import Partition, Stream, Topic

__all__ = ["Broker", "Reply", "TopicHooks"]

log = get_logger(__name__)


class TopicHooks:
    """What a package above the core does as topics come and go (each method does
    nothing unless overridden). Called in the order the hooks were registered."""

    def topic_opened(self, topic: Topic, recovering: bool) -> None:
        """``topic``'s partitions and offsets file are open: at start (``recovering``,
        in the worker thread of :meth:`Broker.open`) or for a new topic."""

    def topic_deleted(self, topic: Topic) -> None:
        """``topic`` is being deleted (its own, or its stream's, deletion), before
        its partitions close."""

    def topic_closed(self, topic: Topic) -> None:
        """The broker is closing (:meth:`Broker.close`), after ``topic``'s
        partitions and offsets file."""

    def topic_updated(self, topic: Topic, old: TopicConfig) -> None:
        """``topic``'s configuration changed from ``old`` (saved in the catalog)."""

    def sync_sources(self, topic: Topic) -> Iterable[SyncSource]:
        """Files of ``topic`` that the final sync of a shutdown must cover."""
        return ()

    def topic_info(self, topic: Topic) -> dict[str, Any]:
        """What a topic's details show beyond the core's own (its consumers)."""
        return {}


class Broker:
    """Args:
    config: the broker's configuration.
    clock: where time comes from (tests give a clock under trio's ``MockClock``).
    """

    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or Clock()
        self.counters = Counters()
        #: Who a connection is, on both listeners (``[server] auth_token``, ``[[auth.users]]``).
        self.auth = Authenticator(config.auth, config.server.auth_token)
        self.datadir = DataDir(config.system.path, report=self._damage)
        self.catalog = Catalog()
        self.router = Router()
        #: Core subscriptions of both protocols, their estimated bytes against
        #: ``[limits] max_subscription_bytes_total``.
        self.subs = SubscriptionIndex(self.counters, config.limits.max_subscription_bytes_total)
        self.committer = Committer(config.system.partition.fsync, self.counters)
        #: What the memory-storage topics hold, against ``[limits] memory_storage_bytes``.
        self.memory_budget = MemoryBudget(config.limits.memory_storage_bytes)
        self.retention = Retention(self.clock, self.counters, self.committer, self.subs.deliver)
        self.republisher = Republisher(
            self.counters, self.committer, config.limits.max_republish_hops, self._republish, self.router, self.subs,
        )
        self.retention.on_markers = lambda part, res, epoch, removed: self.republisher.after_append(
            part, res, removed, epoch
        )
        self.max_payload = config.limits.max_payload_bytes
        self.publisher = Publisher(
            self.max_payload, self.router, self.clock, self.counters, self.subs, self.committer, self.retention,
            self.republisher, self.memory_budget,
            lambda: self.retention.clean([p for p in self.all_partitions() if p.log.volatile]),
        )
        self.scheduler = Scheduler(self.retention, self.committer, self.counters)
        self.scheduler.publish = lambda bodies: self.publisher.publish_bodies(bodies, deliver=False)
        self.publisher.scheduler = self.scheduler
        self.retention.on_rebuild, self.retention.on_forget = self.scheduler.rebuild, self.scheduler.forget
        #: Finishes the seals of segment rolls off the event loop (``_sealing.py``).
        self.sealer = Sealer()
        self.exporter = Exporter(
            config.export.dir, config.export.interval, self.counters, self.sealer, config.export.worker_priority
        )
        #: What the packages above keep per topic (:class:`TopicHooks`).
        self.topic_hooks: list[TopicHooks] = []
        self.started_at = time.time()
        #: The listeners the server bound, ``{"ttlbroker": "host:port", "nats": ...,
        #: "http": ...}`` (set by ``broker.server``; shown in the server info).
        self.listeners: dict[str, str] = {}
        self.shutting_down = False
        self.admin_lock = trio.Lock()
        #: Checks a mirror's or sources' configuration against the catalog (its
        #: origins: cycles, partitions, remote origins) before a create or update is
        #: saved: ``(config, topic being updated or None)``, raising BrokerError. Set
        #: by ``broker.replication``; None: no check.
        self.copy_check: Callable[[TopicConfig, Topic | None], None] | None = None

    def _republish(self, bodies: list[bytes]) -> None:
        self.publisher.publish_bodies(bodies)

    # -- lifecycle -----------------------------------------------------------------

    def open(self) -> None:
        """Lock the data directory, load the catalog and recover every partition.

        Blocking (file I/O); the server runs it in a worker thread before it listens.
        """
        self.datadir.lock()
        self.exporter.open(self._damage)
        # A damaged catalog copy is reported and rewritten from the other; with no
        # valid copy this raises (the broker never starts empty over existing data).
        try:
            data = self.datadir.load_catalog() or {"version": Catalog.VERSION, "streams": []}
        except BaseException:
            self.datadir.unlock()
            raise
        if data.get("version") != Catalog.VERSION:
            raise BrokerError(f"catalog version {data.get('version')} is not supported by this broker")
        self.catalog.stream_id_mark = int(data.get("next_stream_id", 1)) - 1
        # Finish the removals a stop interrupted: only what the catalog lists is
        # proven garbage. Anything else it does not name is reported, never removed.
        listed = [(int(s), None if t is None else int(t)) for s, t in data.get("removing", [])]
        named = {sd["id"]: {td["id"] for td in sd["topics"]} for sd in data["streams"]}
        removed, self.catalog.removing = self.datadir.remove_garbage(listed, named)
        for path in removed:
            log.info("removal_finished", path=path)
        # Topics whose create stopped before all their files were made: made now.
        creating = {(int(s), int(t)) for s, t in data.get("creating", [])}
        for sd in data["streams"]:
            stream = Stream(sd["id"], sd["name"], sd["created_at"])
            stream.topic_id_mark = int(sd.get("next_topic_id", 1)) - 1
            self.catalog.streams[stream.id] = stream
            for td in sd["topics"]:
                topic = Topic(stream, td["id"], TopicConfig.from_json(td["config"]), td["created_at"])
                new = (stream.id, topic.id) in creating
                if new:
                    self.datadir.make_topic_dirs(stream.id, topic.id, topic.config.partitions_count)
                self.open_topic_storage(topic, recovering=True, expect_existing=not new)
                stream.add_topic(topic)
        # A crash can keep an append whose removals by discard old were not yet
        # written: the limits hold again before anything is served.
        for topic in self.catalog.topics():
            if topic.trimming:
                for part in topic.partitions:
                    trim(part, self.retention.remove)
        known = {s.id: set(s.topics) for s in self.catalog.streams.values()}
        self.datadir.report_unknown(known, self.catalog.removing)
        if self.catalog.removing != listed or creating:
            self.datadir.save_catalog(self.catalog.to_json())
        self.router.rebuild(self.catalog.topics())
        log.info(
            "recovered",
            streams=len(self.catalog.streams),
            topics=len(self.catalog.topics()),
            messages=sum(t.messages_count for t in self.catalog.topics()),
        )

    def _hold_per_subject_limit(self, part: Partition) -> None:
        """``max_msgs_per_subject`` holds again, before any consumer attaches or
        anything is read. Its deletions are written deferred (``Retention.remove``):
        a crash can keep a message's append and lose the deletion of the oldest on
        its subject that the append made, and this makes that deletion again. The
        configuration it was made under is the catalog's (an update syncs the
        deferred deletions before its catalog write: ``core.update_topic``); no
        consumer dead-letters it (none is attached yet, and none could when it was
        deferred). Not with discard old trimming too: those deletions are not
        deferred. Runtime complexity: O(subjects)."""
        cfg = part.topic.config
        limit = cfg.max_msgs_per_subject
        if not limit or part.topic.trimming:
            return
        over = [s for s, st in part.index.subjects.items() if st.count > limit]
        if over:
            self.retention.remove(part, part.over_limit(over, limit), R.MAX_MSGS_PER_SUBJECT)

    def reserves_offsets(self, cfg: TopicConfig) -> bool:
        """Whether a topic's logs reserve offsets ahead (``PartitionLog.open``): when
        acks do not wait for the disk, so that a machine crash never gives an
        acknowledged offset out again. Not a mirror's: its offsets are its origin's,
        and after an unclean stop it takes up from the last record it holds (a skip
        ahead would leave a gap of the origin's messages)."""
        return not self.committer.acks_wait and not cfg.mirror

    def open_topic_storage(self, topic: Topic, recovering: bool, expect_existing: bool | None = None) -> None:
        """Open (``recovering``) or create the partitions of ``topic``. ``expect_existing``
        (default: ``recovering``): a missing partition directory is damage."""
        if expect_existing is None:
            expect_existing = recovering
        topic.partitions = []
        reserve = self.reserves_offsets(topic.config)
        for n in range(topic.config.partitions_count):
            path = self.datadir.partition_dir(topic.stream.id, topic.id, n)

            def on_corrupt(offset: int, reason: str, _t: Topic = topic, _n: int = n) -> None:
                self.counters.corrupt_records += 1
                log.error("corrupt_record", topic=_t.full_name, partition=_n, offset=offset, reason=reason)
                if _n < len(_t.partitions):
                    # A read of the running partition found a live record damaged: its
                    # subject's index remembers it (the startup scan hands over the
                    # damage it finds itself, before the partition is listed).
                    _t.partitions[_n].index.note_damaged_at(offset)

            plog: PartitionLog
            if topic.config.storage == "memory":
                plog, reports = MemoryPartitionLog.open(
                    path, topic.config.segment_size, on_corrupt, budget=self.memory_budget, report=self._damage,
                    expect_existing=expect_existing, reserve=not topic.config.mirror,
                )
            else:
                plog, reports = PartitionLog.open(
                    path, topic.config.segment_size, on_corrupt, report=self._damage, reserve=reserve,
                    quarantine_dir=os.path.join(self.datadir.quarantine_dir, os.path.relpath(path, self.datadir.root)),
                    expect_existing=expect_existing,
                )
            if recovering:
                self._report_recovery(topic, n, plog, reports)
            elif topic.config.first_seq > 1:
                plog.start_at(topic.config.first_seq)
            self.sealer.attach(plog)
            part = Partition(topic, n, plog)
            if recovering:
                # Runs in the worker thread of open(), before the engine task starts:
                # scheduling only fills the deadline structure. What fell due while
                # the broker was down expires on the engine's first pass.
                self.retention.rebuild(part)
                self._hold_per_subject_limit(part)
            topic.partitions.append(part)
        topic.consumers = self.datadir.consumer_offsets(topic.stream.id, topic.id)
        for hooks in self.topic_hooks:
            hooks.topic_opened(topic, recovering)

    def _damage(self, damage: Damage) -> None:
        """Damage storage found: logged once with its file and position, counted."""
        self.counters.damage_detected += 1
        if damage.kind == "segment" and damage.offsets is not None:
            self.counters.corrupt_records += damage.offsets[1] - damage.offsets[0] + 1
        log.error(
            "damage", kind=damage.kind, path=damage.path, position=damage.position, detail=damage.detail,
            action=damage.action, offsets=f"{damage.offsets[0]}..{damage.offsets[1]}" if damage.offsets else None,
        )

    def _report_recovery(self, topic: Topic, n: int, plog: PartitionLog, reports: list[RecoveryReport]) -> None:
        for r in reports:
            if r.truncated_bytes:
                self.counters.torn_records_truncated += 1
                log.warning(
                    "torn_tail_truncated", topic=topic.full_name, partition=n,
                    offset=r.truncated_at_offset, bytes=r.truncated_bytes,
                )
            if r.preallocated_bytes:
                # Space allocated ahead of the records, left by a stop that was not a
                # clean close: zero bytes, nothing lost.
                log.debug("preallocated_tail_cut", topic=topic.full_name, partition=n, bytes=r.preallocated_bytes)
            if r.index_rebuilt:
                log.info("index_rebuilt", topic=topic.full_name, partition=n)
        if plog.skipped is not None:
            first, last = plog.skipped
            log.info(
                "offsets_skipped", topic=topic.full_name, partition=n, first=first, last=last,
                reason=(
                    "memory storage after an unclean stop: the offsets up to the reservation are not handed out again"
                    if plog.volatile else "reserved before an unclean stop or beyond missing records; never handed out"
                ),
            )

    def close(self) -> None:
        """Close every file and release the data directory (after a final sync)."""
        for topic in self.catalog.topics():
            for p in topic.partitions:
                try:
                    p.log.finish_seals()  # the sealer task's leftovers (a stop: the loop is done serving)
                except OSError as exc:  # the next start rebuilds the index: not damage
                    log.error("seal_files_failed", path=p.log.path, error=repr(exc))
                p.log.close()
            if topic.consumers is not None:
                topic.consumers.close()
            for hooks in self.topic_hooks:
                hooks.topic_closed(topic)
        try:
            self.datadir.close_catalog(self.catalog.to_json())
        except (OSError, StorageFailure) as exc:  # the journal still holds every change: the next start folds it
            log.error("catalog_fold_failed", error=str(exc))
        self.datadir.unlock()

    def background_tasks(self) -> list[Callable[[], Awaitable[None]]]:
        """Tasks the server runs beside the listeners for the broker's lifetime: the
        expiry engine, and the segment cleaner when enabled."""
        tasks: list[Callable[[], Awaitable[None]]] = [self.retention.engine.run, self.sealer.run]
        cleaner = self.config.message_cleaner
        if cleaner.enabled:
            keep = self.exporter.keeps if self.exporter.enabled else None
            tasks.append(lambda: self.retention.run_cleaner(cleaner.interval, self.all_partitions, keep, self.sealer.finish))
        if self.exporter.enabled:
            tasks.append(lambda: self.exporter.run(self.all_partitions))
        return tasks

    def topic_details(self, topic: Topic) -> TopicDetails:
        """``topic``'s details, with what each hook adds (``TopicHooks.topic_info``)."""
        extra: dict[str, Any] = {}
        for hooks in self.topic_hooks:
            extra.update(hooks.topic_info(topic))
        return topic.details(extra or None)

    def all_partitions(self) -> list[Partition]:
        return [p for t in self.catalog.topics() for p in t.partitions]

    def all_sync_sources(self) -> list[SyncSource]:
        """Every file a write of the broker may have left unsynced."""
        out: list[SyncSource] = []
        for topic in self.catalog.topics():
            out.extend(p.log for p in topic.partitions)
            if topic.consumers is not None:
                out.append(topic.consumers)
            for hooks in self.topic_hooks:
                out.extend(hooks.sync_sources(topic))
        return out

    async def save_catalog(self) -> None:
        await trio.to_thread.run_sync(self.datadir.save_catalog, self.catalog.to_json())
