"""The broker's shared state and lifecycle, and its tables of command handlers.

One :class:`Broker` owns the catalog (streams, topics, partitions), the router, the
core subscriptions, the group committer and the counters; it opens and closes them,
lists the background tasks and the sync sources. The command handlers live in one
module per family, as plain functions ``(broker, session, cmd)`` bound once to the
broker in ``sync_handlers`` and ``async_handlers``:

- ``_publishing.py``: PUBLISH (the hot path), admission, rollups, max msgs per subject
- ``_reading.py``: FETCH, GET_LAST
- ``_removing.py``: DELETE_MESSAGE, PURGE
- ``_subscriptions.py``: SUBSCRIBE, UNSUBSCRIBE, and the deliveries to subscribers
- ``_offsets.py``: stored consumer offsets
- ``_admin.py``: streams and topics
- ``_kv.py``: KV_GET, KV_TOUCH, KV_KEYS
- ``_info.py``: PING, GET_SERVER_INFO, GET_STATS, EXPORT
- ``_consumers.py`` (not written yet): the consumer engine, a family of its own that
  adds its commands to ``SYNC_HANDLERS`` / ``ASYNC_HANDLERS`` like the others

Handlers run on the event loop; the ones that only touch memory and append to files
are plain functions (the publish path never awaits), the ones that rewrite the
catalog are async and take ``admin_lock`` so that concurrent creates and deletes
cannot interleave.

A handler returns the response payload, or ``(payload, epoch)`` when the response
must wait until the group commit has made epoch ``epoch`` durable (publishes,
deletes, purges, consumer offsets under ``fsync = "always"``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from types import MethodType
from typing import Any

import trio

import protocol as P
from protocol import BrokerError
from storage import Damage, DataDir, PartitionLog, RecoveryReport

from broker.core import _admin, _info, _publishing, _reading, _removing, _subscriptions
from broker.consumers import _handlers as _consumer_handlers, _offsets
from broker.kv import _reads as _kv
from ._catalog import Catalog, Stream, Topic
from ._clock import Clock
from ._commit import Committer
from broker.consumers._journal import TopicJournal
from broker.consumers._engine import ConsumerEngine
from ._export import Exporter
from ._info import VERSION
from broker.nats._jetstream import JetStream
from broker.kv._reads import KvReads, load_leases
from ._log import get_logger
from ._partition import Partition
from ._republish import Republisher
from ._retention import Retention
from ._sealing import Sealer
from broker.server._session import RECEIVE_SIZE
from ._routing import Router
from ._stats import Counters
from ._subscriptions import SubscriptionIndex
from ._topic_config import TopicConfig
from broker.config import Config

__all__ = ["Broker", "Reply", "VERSION"]

log = get_logger(__name__)

Reply = bytes | tuple[bytes, int]

Handler = Callable[["Broker", Any, Any], Reply]
AsyncHandler = Callable[["Broker", Any, Any], Awaitable[Reply]]

# Each command's handler, by family. The consumer engine (server-side consumers) is
# the next family: its module, ``_consumers.py``, adds its commands to these tables.
SYNC_HANDLERS: dict[type, Handler] = {
    # _info.py
    P.Ping: _info.ping,
    P.GetServerInfo: _info.server_info,
    # _publishing.py
    P.Publish: _publishing.publish,
    # _reading.py
    P.Fetch: _reading.fetch,
    P.GetLast: _reading.get_last,
    # _removing.py
    P.DeleteMessage: _removing.delete_message,
    P.Purge: _removing.purge,
    # _subscriptions.py
    P.Subscribe: _subscriptions.subscribe,
    P.Unsubscribe: _subscriptions.unsubscribe,
    # _offsets.py
    P.StoreConsumerOffset: _offsets.store_consumer_offset,
    P.GetConsumerOffset: _offsets.get_consumer_offset,
    P.DeleteConsumerOffset: _offsets.delete_consumer_offset,
    # _admin.py
    P.GetStream: _admin.get_stream,
    P.ListStreams: _admin.list_streams,
    P.GetTopic: _admin.get_topic,
    P.ListTopics: _admin.list_topics,
    # _kv.py
    P.KvGet: _kv.kv_get,
    P.KvTouch: _kv.kv_touch,
    P.KvKeys: _kv.kv_keys,
    # _consumer_handlers.py
    P.CreateConsumer: _consumer_handlers.create_consumer,
    P.UpdateConsumer: _consumer_handlers.update_consumer,
    P.ConsumerInfoRequest: _consumer_handlers.consumer_info,
    P.ListConsumers: _consumer_handlers.list_consumers,
    P.DeleteConsumer: _consumer_handlers.delete_consumer,
    P.Pull: _consumer_handlers.pull,
    P.AckMessages: _consumer_handlers.ack,
    P.JoinGroup: _consumer_handlers.join_group,
    P.LeaveGroup: _consumer_handlers.leave_group,
    P.EndPulls: _consumer_handlers.end_pulls,
}
ASYNC_HANDLERS: dict[type, AsyncHandler] = {
    # _info.py
    P.GetStats: _info.stats,
    P.Export: _info.export,
    # _admin.py
    P.CreateStream: _admin.create_stream,
    P.UpdateStream: _admin.update_stream,
    P.DeleteStream: _admin.delete_stream,
    P.CreateTopic: _admin.create_topic,
    P.UpdateTopic: _admin.update_topic,
    P.DeleteTopic: _admin.delete_topic,
}


class Broker:
    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or Clock()
        self.counters = Counters()
        self.datadir = DataDir(config.system.path, report=self._damage)
        self.catalog = Catalog()
        self.router = Router()
        self.subs = SubscriptionIndex()
        #: Where the sessions read their sockets (``Session._receive``: one read at a
        #: time on the event loop, copied out before the next).
        self.receive_buffer = memoryview(bytearray(RECEIVE_SIZE))
        self.committer = Committer(config.system.partition.fsync, self.counters)
        self.retention = Retention(self.clock, self.counters, self.committer, partial(_subscriptions.deliver, self))
        self.republisher = Republisher(
            self.counters, self.committer, config.limits.max_republish_hops,
            lambda bodies: _publishing.publish(self, None, P.Publish.from_bodies(bodies, P.PUBLISH_NO_ACK), trusted=True),
            self.router, self.subs,
        )
        self.retention.on_markers = lambda part, res, epoch, removed: self.republisher.after_append(
            part, res, removed, epoch
        )
        #: Finishes the seals of segment rolls off the event loop (``_sealing.py``).
        self.sealer = Sealer()
        self.exporter = Exporter(
            config.export.dir, config.export.interval, self.counters, self.sealer, config.export.worker_priority
        )
        self.kv = KvReads(self.committer)
        self.consumers = ConsumerEngine(self)
        #: The NATS listener's JetStream API (``_jetstream.py``).
        self.jetstream = JetStream(self)
        self.sessions: set[Any] = set()
        self.started_at = time.time()
        self.shutting_down = False
        self.admin_lock = trio.Lock()
        self.max_payload = config.limits.max_payload_bytes
        # Bound once: calling a handler costs what calling a method did.
        self.sync_handlers: dict[type, Callable[[Any, Any], Reply]] = {
            cmd: MethodType(fn, self) for cmd, fn in SYNC_HANDLERS.items()
        }
        self.async_handlers: dict[type, Callable[[Any, Any], Awaitable[Reply]]] = {
            cmd: MethodType(fn, self) for cmd, fn in ASYNC_HANDLERS.items()
        }

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
        for sd in data["streams"]:
            stream = Stream(sd["id"], sd["name"], sd["created_at"])
            stream.topic_id_mark = int(sd.get("next_topic_id", 1)) - 1
            self.catalog.streams[stream.id] = stream
            for td in sd["topics"]:
                topic = Topic(stream, td["id"], TopicConfig.from_json(td["config"]), td["created_at"])
                self.open_topic_storage(topic, recovering=True)
                stream.topics[topic.id] = topic
        known = {s.id: set(s.topics) for s in self.catalog.streams.values()}
        self.datadir.report_unknown(known, self.catalog.removing)
        if self.catalog.removing != listed:
            self.datadir.save_catalog(self.catalog.to_json())
        self.router.rebuild(self.catalog.topics())
        log.info(
            "recovered",
            streams=len(self.catalog.streams),
            topics=len(self.catalog.topics()),
            messages=sum(t.messages_count for t in self.catalog.topics()),
        )

    def open_topic_storage(self, topic: Topic, recovering: bool) -> None:
        topic.partitions = []
        reserve = not self.committer.acks_wait
        for n in range(topic.config.partitions_count):
            path = self.datadir.partition_dir(topic.stream.id, topic.id, n)

            def on_corrupt(offset: int, reason: str, _t: Topic = topic, _n: int = n) -> None:
                self.counters.corrupt_records += 1
                log.error("corrupt_record", topic=_t.full_name, partition=_n, offset=offset, reason=reason)

            plog, reports = PartitionLog.open(
                path, topic.config.segment_size, on_corrupt, report=self._damage, reserve=reserve,
                quarantine_dir=os.path.join(self.datadir.quarantine_dir, os.path.relpath(path, self.datadir.root)),
                expect_existing=recovering,
            )
            if recovering:
                self._report_recovery(topic, n, plog, reports)
            self.sealer.attach(plog)
            part = Partition(topic, n, plog)
            if recovering:
                # Runs in the worker thread of open(), before the engine task starts:
                # scheduling only fills the deadline structure. What fell due while
                # the broker was down expires on the engine's first pass.
                self.retention.rebuild(part)
            topic.partitions.append(part)
        topic.consumers = self.datadir.consumer_offsets(topic.stream.id, topic.id)
        if recovering and topic.config.kv is not None:
            load_leases(topic)
        topic.consumer_journal = TopicJournal(self.consumers, topic)
        if recovering:
            for c in topic.consumer_journal.load():
                self.consumers.attach(c)

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
                reason="reserved before an unclean stop or beyond missing records; never handed out",
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
            if topic.consumer_journal is not None:
                topic.consumer_journal.close()
        self.datadir.unlock()

    def background_tasks(self) -> list[Callable[[], Awaitable[None]]]:
        """Tasks the server runs beside the listeners for the broker's lifetime: the
        expiry engine, and the segment cleaner when enabled."""
        tasks: list[Callable[[], Awaitable[None]]] = [self.retention.engine.run, self.consumers.run, self.sealer.run]
        cleaner = self.config.message_cleaner
        if cleaner.enabled:
            keep = self.exporter.keeps if self.exporter.enabled else None
            tasks.append(lambda: self.retention.run_cleaner(cleaner.interval, self.all_partitions, keep, self.sealer.finish))
        if self.exporter.enabled:
            tasks.append(lambda: self.exporter.run(self.all_partitions))
        return tasks

    def all_partitions(self) -> list[Partition]:
        return [p for t in self.catalog.topics() for p in t.partitions]

    def all_sync_sources(self) -> list[Any]:
        out: list[Any] = []
        for topic in self.catalog.topics():
            out.extend(p.log for p in topic.partitions)
            if topic.consumers is not None:
                out.append(topic.consumers)
            journal = topic.consumer_journal
            if journal is not None and journal.file is not None:
                out.append(journal.file)
        return out

    async def save_catalog(self) -> None:
        await trio.to_thread.run_sync(self.datadir.save_catalog, self.catalog.to_json())

    # -- sessions ------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """What the handshake and GET_SERVER_INFO tell a client about this server."""
        return _info.info(self)

    def drop_session(self, session: Any) -> None:
        for sub in session.subs.values():
            self.subs.remove(sub)
        session.subs.clear()
        if session.pulls or session.members:
            _consumer_handlers.session_closed(self, session)
        self.sessions.discard(session)
