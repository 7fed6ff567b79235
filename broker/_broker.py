"""The broker's state and its command handlers.

One :class:`Broker` owns the catalog (streams, topics, partitions), the router, the
core subscriptions, the group committer and the counters. Handlers run on the event
loop; the ones that only touch memory and append to files are plain functions (the
publish path never awaits), the ones that rewrite the catalog are async and take the
admin lock so that concurrent creates and deletes cannot interleave.

A handler returns the response payload, or ``(payload, epoch)`` when the response
must wait until the group commit has made epoch ``epoch`` durable (publishes,
deletes, purges, consumer offsets under ``fsync = "always"``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import protocol as P
from protocol import RemovalReason as R
from protocol import (
    EXPIRY_NONE,
    PROTOCOL_VERSION,
    TTL_NEVER,
    BrokerError,
    ErrorCode,
    error_class,
    normalize_name,
    scan_bodies,
    validate_filter,
    validate_subject,
)
from storage import Damage, DataDir, PartitionLog, RecoveryReport

from ._admission import ROLLUP_SUB, Admission, admit
from ._catalog import Catalog, Stream, Topic
from ._export import Exporter
from ._kv import KvReads, load_leases
from ._clock import Clock
from ._commit import Committer
from ._log import get_logger
from ._partition import Partition, flags_for
from ._republish import Republisher
from ._retention import Retention
from ._routing import NO_TOPIC, Router
from ._stats import Counters
from ._subscriptions import Subscription, SubscriptionIndex
from ._topic_config import TopicConfig, apply_changes, check_option_types, resolve
from .config import Config

__all__ = ["Broker", "VERSION"]

VERSION = "0.1.0"
log = get_logger(__name__)

Reply = bytes | tuple[bytes, int]


def _record_views(res: Any) -> list[memoryview]:
    """The records of an append, one view each."""
    records = memoryview(res.records)
    positions = res.positions
    ends = positions[1:] + [len(records)]
    return [records[p:e] for p, e in zip(positions, ends)]


def _check_expected_last(part: Partition, subject: bytes, expected: int, written: set[bytes]) -> None:
    st = part.index.get(subject)
    last = st.last if st is not None and st.count else 0
    if subject in written or last != expected:
        raise error_class(ErrorCode.WRONG_LAST_SEQUENCE)(f"wrong last sequence: {last}")


class Broker:
    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or Clock()
        self.counters = Counters()
        self.datadir = DataDir(config.system.path, report=self._damage)
        self.catalog = Catalog()
        self.router = Router()
        self.subs = SubscriptionIndex()
        self.committer = Committer(config.system.partition.fsync, self.counters)
        self.retention = Retention(self.clock, self.counters, self.committer, self._deliver)
        self.republisher = Republisher(
            self.counters, self.committer, config.limits.max_republish_hops,
            lambda bodies: self.publish(None, P.Publish.from_bodies(bodies, P.PUBLISH_NO_ACK), trusted=True),
        )
        self.retention.on_markers = lambda part, res, epoch, removed: self.republisher.after_append(
            part, res, removed, epoch
        )
        self.exporter = Exporter(config.export.dir, config.export.interval, self.counters)
        self.kv = KvReads(self.committer)
        self.sessions: set[Any] = set()
        self.started_at = time.time()
        self.shutting_down = False
        self._admin_lock = trio.Lock()
        self._max_payload = config.limits.max_payload_bytes
        self.sync_handlers: dict[type, Callable[[Any, Any], Reply]] = {
            P.Ping: lambda s, c: b"",
            P.GetServerInfo: self.server_info,
            P.Publish: self.publish,
            P.Fetch: self.fetch,
            P.GetLast: self.get_last,
            P.DeleteMessage: self.delete_message,
            P.Purge: self.purge,
            P.Subscribe: self.subscribe,
            P.Unsubscribe: self.unsubscribe,
            P.StoreConsumerOffset: self.store_consumer_offset,
            P.GetConsumerOffset: self.get_consumer_offset,
            P.DeleteConsumerOffset: self.delete_consumer_offset,
            P.GetStream: self.get_stream,
            P.ListStreams: self.list_streams,
            P.GetTopic: self.get_topic,
            P.ListTopics: self.list_topics,
            P.KvGet: self.kv_get,
            P.KvTouch: self.kv_touch,
            P.KvKeys: self.kv_keys,
        }
        self.async_handlers: dict[type, Callable[[Any, Any], Awaitable[Reply]]] = {
            P.GetStats: self.stats,
            P.Export: self.export,
            P.CreateStream: self.create_stream,
            P.UpdateStream: self.update_stream,
            P.DeleteStream: self.delete_stream,
            P.CreateTopic: self.create_topic,
            P.UpdateTopic: self.update_topic,
            P.DeleteTopic: self.delete_topic,
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
                self._open_topic_storage(topic, recovering=True)
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

    def _open_topic_storage(self, topic: Topic, recovering: bool) -> None:
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
                p.log.close()
            if topic.consumers is not None:
                topic.consumers.close()
        self.datadir.unlock()

    def background_tasks(self) -> list[Callable[[], Awaitable[None]]]:
        """Tasks the server runs beside the listeners for the broker's lifetime: the
        expiry engine, and the segment cleaner when enabled."""
        tasks: list[Callable[[], Awaitable[None]]] = [self.retention.engine.run]
        cleaner = self.config.message_cleaner
        if cleaner.enabled:
            keep = self.exporter.keeps if self.exporter.enabled else None
            tasks.append(lambda: self.retention.run_cleaner(cleaner.interval, self.all_partitions, keep))
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
        return out

    async def save_catalog(self) -> None:
        await trio.to_thread.run_sync(self.datadir.save_catalog, self.catalog.to_json())

    # -- publish (the hot path) ----------------------------------------------------

    def publish(self, session: Any, cmd: P.Publish, trusted: bool = False) -> Reply:
        """A batch of messages (``trusted``: bodies the broker built itself, such as
        republished copies, whose flags, sizes and headers need no checking)."""
        data: bytes = cmd.data
        n = cmd.count
        scan = scan_bodies(data, cmd.body_pos, n, self._max_payload)
        subjects = scan.subjects
        starts, ends = scan.starts, scan.ends
        special = scan.special
        fields: dict[int, P.BodyFields] = {}
        failed: dict[int, BrokerError] = self._check_basic(data, starts, special, fields) if special and not trusted else {}

        cache = self.router.cache
        resolve = self.router.resolve
        groups: dict[Partition, list[int]] = {}
        unrouted: list[int] = []
        for i in range(n):
            if failed and i in failed:
                continue
            subj = subjects[i]
            route = cache.get(subj)
            if route is None:
                route = resolve(subj)
            if route.__class__ is Partition:
                g = groups.get(route)  # type: ignore[arg-type]
                if g is None:
                    groups[route] = g = []  # type: ignore[index]
                g.append(i)
            elif route is NO_TOPIC:
                unrouted.append(i)
            else:
                failed[i] = route  # type: ignore[assignment]
        admitted: dict[int, Admission] = {}
        if groups and (special or (self.router.any_kv and any(p.topic.config.kv is not None for p in groups))):
            data, starts, ends = self._admit(data, subjects, starts, ends, special, failed, groups, admitted, fields)

        now = self.clock.now_ns()
        counters = self.counters
        deliver = len(self.subs) > 0
        if len(groups) == 1 and not failed and not unrouted and not admitted and next(iter(groups)).topic.republisher is None:
            # Everything into one partition, in order: the common case.
            (part, _), = groups.items()
            res = part.append(data, starts, ends, subjects, now)
            epoch = self.committer.note_write(part.log)
            counters.messages_in += n
            counters.bytes_in += len(res.records)
            self.retention.after_append(part, res)
            self._enforce_max_msgs(part, subjects)
            if deliver:
                head = P.delivery_entry(part.topic.stream.id, part.topic.id, part.number)
                self._deliver([(s, head, rec) for s, rec in zip(subjects, _record_views(res))])
            if cmd.no_ack:
                return b""
            topic = part.topic
            return P.encode_uniform_acks(topic.stream.id, topic.id, part.number, res.first_offset, n), epoch

        epoch = 0
        stream_ids = [0] * n
        topic_ids = [0] * n
        partitions = [0] * n
        offsets = [0] * n
        statuses = [0] * n
        errors: dict[int, str] = {}
        entries: list[tuple[bytes, bytes, memoryview | bytes] | None] | None = [None] * n if deliver else None
        rollups: list[tuple[int, Partition, int, int]] = []
        republish: list[tuple[Partition, Any, list[int], int]] = []
        for part, idx in groups.items():
            gsubjects = [subjects[i] for i in idx]
            lasts = part.last_offsets(gsubjects) if part.topic.republisher is not None else None
            flags = None
            if admitted:
                flags = bytes(flags_for(a.ttl, a.flags) if (a := admitted.get(i)) else 0 for i in idx)
            res = part.append(data, [starts[i] for i in idx], [ends[i] for i in idx], gsubjects, now, flags)
            epoch = self.committer.note_write(part.log)
            counters.messages_in += len(idx)
            counters.bytes_in += len(res.records)
            topic = part.topic
            off = res.first_offset
            ttls: list[tuple[int, int]] = []
            for i in idx:
                stream_ids[i] = topic.stream.id
                topic_ids[i] = topic.id
                partitions[i] = part.number
                offsets[i] = off
                a = admitted.get(i) if admitted else None
                if a is not None:
                    if 0 < a.ttl < TTL_NEVER:
                        ttls.append((off, a.ttl))
                    if a.rollup:
                        rollups.append((i, part, off, a.rollup))
                off += 1
            self.retention.after_append(part, res, ttls)
            self._enforce_max_msgs(part, gsubjects)
            if lasts is not None:
                republish.append((part, res, lasts, epoch))
            if entries is not None:
                head = P.delivery_entry(topic.stream.id, topic.id, part.number)
                for i, rec in zip(idx, _record_views(res)):
                    entries[i] = (subjects[i], head, rec)
        if rollups:
            self._apply_rollups(rollups, subjects, groups, offsets)
        for part, res, lasts, at in republish:
            self.republisher.after_append(part, res, lasts, at)
        if unrouted:
            counters.messages_unrouted += len(unrouted)
            head = P.delivery_entry(0, 0, 0)
            for i in unrouted:
                if not cmd.no_ack:
                    statuses[i] = ErrorCode.NO_TOPIC_FOR_SUBJECT
                    errors[i] = f"no topic captures subject {subjects[i].decode(errors='replace')!r}"
                if entries is not None:
                    entries[i] = (subjects[i], head, P.encode_record(0, now, data[starts[i] : ends[i]]))
        if entries is not None:
            self._deliver([e for e in entries if e is not None])
        for i, err in failed.items():
            statuses[i] = int(err.code)
            errors[i] = err.message
        counters.publish_errors += len(failed)
        if cmd.no_ack:
            return b""
        payload = P.Acks(stream_ids, topic_ids, partitions, offsets, statuses, errors).encode()
        return (payload, epoch) if epoch else payload

    def _check_basic(
        self, data: bytes, starts: list[int], special: list[int], fields: dict[int, P.BodyFields]
    ) -> dict[int, BrokerError]:
        """Checks that need no topic, for bodies with flags, headers, a TTL or a big
        payload (their fields land in ``fields``, for admission to reuse)."""
        failed: dict[int, BrokerError] = {}
        for i in special:
            f = fields[i] = P.body_fields(data, starts[i])
            if f.flags:
                failed[i] = error_class(ErrorCode.INVALID_MESSAGE_FLAGS)(
                    f"message flags {f.flags:#x} are reserved for the broker; publish with flags 0"
                )
            elif f.payload_len > self._max_payload:
                failed[i] = error_class(ErrorCode.PAYLOAD_TOO_LARGE)(
                    f"payload of {f.payload_len} bytes exceeds the maximum of {self._max_payload} bytes"
                )
            elif f.headers:
                try:
                    P.validate_header_block(f.headers)
                except BrokerError as err:
                    failed[i] = err
        return failed

    @staticmethod
    def _admit(
        data: bytes,
        subjects: list[bytes],
        starts: list[int],
        ends: list[int],
        special: list[int],
        failed: dict[int, BrokerError],
        groups: dict[Partition, list[int]],
        admitted: dict[int, Admission],
        fields: dict[int, P.BodyFields],
    ) -> tuple[bytes, list[int], list[int]]:
        """Admit the special messages, and every message of a KV bucket, into their
        topics (``_admission.py``): refused ones move to ``failed`` and leave their
        group; the others land in ``admitted``. Rewritten bodies are appended to the
        batch's bytes and their bounds moved there; returns the batch's ``(data,
        starts, ends)``.

        ``Nats-Expected-Last-Subject-Sequence`` is checked here against the subject's
        last offset when the batch arrived; a message whose subject an earlier message
        of the same batch wrote fails it (compare-and-set is one message at a time)."""
        todo = set(special).difference(failed)
        rewritten: list[bytes] = []
        new_starts: list[int] = starts
        new_ends: list[int] = ends
        pos = len(data)
        view = memoryview(data)
        for part, idx in list(groups.items()):
            cfg = part.topic.config
            kv = cfg.kv is not None
            if not kv and todo.isdisjoint(idx):
                continue
            keep = []
            written: set[bytes] = set()
            for i in idx:
                if kv or i in todo:
                    try:
                        f = fields.get(i) or P.body_fields(data, starts[i])
                        a = admit(view[starts[i] : ends[i]], f, cfg)
                        if a.expected_last is not None:
                            _check_expected_last(part, subjects[i], a.expected_last, written)
                    except BrokerError as err:
                        failed[i] = err
                        continue
                    admitted[i] = a
                    written.add(subjects[i])
                    if a.body is not None:
                        if new_starts is starts:
                            new_starts, new_ends = list(starts), list(ends)
                        new_starts[i] = pos
                        pos += len(a.body)
                        new_ends[i] = pos
                        rewritten.append(a.body)
                keep.append(i)
            if keep:
                groups[part] = keep
            else:
                del groups[part]
        view.release()
        if rewritten:
            data = b"".join((data, *rewritten))
        return data, new_starts, new_ends

    def _apply_rollups(
        self, rollups: list[tuple[int, Partition, int, int]], subjects: list[bytes], groups: dict[Partition, list[int]],
        offsets: list[int],
    ) -> None:
        """``Nats-Rollup`` (decision 10.7), in publish order: ``sub`` removes the earlier
        messages of the subject, ``all`` every earlier message of the topic (in other
        partitions, everything stored before it, so not the batch's later messages)."""
        for i, part, off, kind in sorted(rollups, key=lambda r: r[0]):
            if not part.log.is_live(off):
                continue  # a later rollup of this batch took it already
            if kind == ROLLUP_SUB:
                self.retention.remove(part, part.subject_offsets(subjects[i], before=off), R.ROLLUP)
                continue
            for q in part.topic.partitions:
                later = [offsets[j] for j in groups.get(q, ()) if j > i]
                limit = later[0] if later else q.log.next_offset
                doomed = [o for o in q.live_offsets(except_offset=off) if o < limit]
                if doomed:
                    self.retention.remove(q, doomed, R.ROLLUP)

    def _enforce_max_msgs(self, part: Partition, subjects: list[bytes]) -> None:
        limit = part.topic.config.max_msgs_per_subject
        if limit:
            doomed = part.over_limit(subjects, limit)
            if doomed:
                self.retention.remove(part, doomed, R.MAX_MSGS_PER_SUBJECT)

    # -- core deliveries -------------------------------------------------------------

    def _deliver(self, entries: list[tuple[bytes, bytes, memoryview | bytes]]) -> None:
        """Deliver ``(subject, entry head, record)`` to matching subscriptions, in the
        order given (publish order), one DELIVERY push per subscription."""
        match = self.subs.match
        batches: dict[Subscription, list[bytes | memoryview]] = {}
        for subj, head, rec in entries:
            subs = match(subj)
            if not subs:
                continue
            for sub in subs:
                parts = batches.get(sub)
                if parts is None:
                    batches[sub] = parts = []
                parts.append(head)
                parts.append(rec)
        for sub in [s for s in batches if not s.session.accepts_pushes()]:
            count = len(batches.pop(sub)) // 2  # not even encoded: it would be dropped
            sub.dropped += count
            self.counters.deliveries_dropped += count
        self._flush_deliveries(batches)

    def _flush_deliveries(self, batches: dict[Subscription, list[bytes | memoryview]]) -> None:
        for sub, parts in batches.items():
            count = len(parts) // 2
            payload = P.encode_delivery(sub.sid, count, parts)
            if sub.session.push(P.PushKind.DELIVERY, payload):
                sub.delivered += count
                self.counters.messages_out += count
                self.counters.bytes_out += len(payload)
            else:
                sub.dropped += count
                self.counters.deliveries_dropped += count

    # -- reading -------------------------------------------------------------------

    def fetch(self, session: Any, cmd: P.Fetch) -> Reply:
        topic = self.catalog.topic(cmd.stream, cmd.topic)
        part = topic.partition(cmd.partition)
        limit = self.config.limits.max_fetch_bytes
        max_bytes = min(cmd.max_bytes or limit, limit)
        wanted = None
        if cmd.subject_filter:
            validate_filter(cmd.subject_filter)
            ftokens = tuple(cmd.subject_filter.split("."))
            wanted = part.wanted_for(
                cmd.subject_filter, lambda s: P.subject_matches(ftokens, s.decode(errors="replace").split("."))
            )
        res = part.read(cmd.offset, min(cmd.count, 1_000_000), max_bytes, wanted) if cmd.count else None
        records = res.records if res else []
        count = res.count if res else 0
        next_offset = res.next_offset if res else max(cmd.offset, 1)
        self.counters.messages_out += count
        self.counters.bytes_out += sum(len(r) for r in records)
        return P.FetchResult.encode_parts(
            topic.stream.id, topic.id, part.number, next_offset, part.log.first_offset, part.log.last_offset,
            count, records,
        )

    def get_last(self, session: Any, cmd: P.GetLast) -> Reply:
        topic = self.catalog.topic(cmd.stream, cmd.topic)
        validate_subject(cmd.subject)
        raw = cmd.subject.encode()
        part = topic.partition_for(raw)
        rec = part.last(raw)
        if rec is None:
            raise error_class(ErrorCode.MESSAGE_NOT_FOUND)(f"topic {topic.full_name} has no message on subject {cmd.subject!r}")
        st = part.index.get(raw)
        assert st is not None
        self.counters.messages_out += 1
        self.counters.bytes_out += len(rec)
        return P.FetchResult.encode_parts(
            topic.stream.id, topic.id, part.number, st.last + 1, part.log.first_offset, part.log.last_offset, 1, [rec]
        )

    # -- removing ------------------------------------------------------------------

    def _check_purge_allowed(self, topic: Topic, what: str) -> None:
        if topic.config.deny_purge:
            raise error_class(ErrorCode.PURGE_DENIED)(f"topic {topic.full_name} denies {what} (deny_purge is set)")

    def delete_message(self, session: Any, cmd: P.DeleteMessage) -> Reply:
        topic = self.catalog.topic(cmd.stream, cmd.topic)
        part = topic.partition(cmd.partition)
        self._check_purge_allowed(topic, "deletes")
        if not self.retention.remove(part, [cmd.offset], R.DELETE):
            raise error_class(ErrorCode.MESSAGE_NOT_FOUND)(
                f"topic {topic.full_name} partition {part.number} has no live message at offset {cmd.offset}"
            )
        return b"", self.committer.note_write(part.log)

    def purge(self, session: Any, cmd: P.Purge) -> Reply:
        topic = self.catalog.topic(cmd.stream, cmd.topic)
        self._check_purge_allowed(topic, "purges")
        total = 0
        epoch = 0
        if not cmd.subject:
            for part in topic.partitions:
                total += self.retention.purge_all(part)
        else:
            validate_filter(cmd.subject)
            if P.is_literal(cmd.subject):
                raw = cmd.subject.encode()
                targets = [(topic.partition_for(raw), [raw])]
            else:
                ftokens = tuple(cmd.subject.split("."))
                targets = [
                    (p, [s for s, st in p.index.subjects.items() if st.count and P.subject_matches(ftokens, s.decode().split("."))])
                    for p in topic.partitions
                ]
            for part, subjects in targets:
                offsets = [o for s in subjects for o in part.subject_offsets(s)]
                if offsets:
                    total += len(self.retention.remove(part, offsets, R.PURGE))
                    epoch = self.committer.note_write(part.log)
        payload = P.PurgeResult(total).encode()
        return (payload, epoch) if epoch else payload

    # -- subscriptions -------------------------------------------------------------

    def subscribe(self, session: Any, cmd: P.Subscribe) -> Reply:
        validate_filter(cmd.subject_filter)
        if cmd.subscription_id in session.subs:
            raise error_class(ErrorCode.SUBSCRIPTION_EXISTS)(f"subscription id {cmd.subscription_id} is already in use")
        limit = self.config.limits.max_subscriptions_per_connection
        if len(session.subs) >= limit:
            raise error_class(ErrorCode.TOO_MANY_SUBSCRIPTIONS)(f"a connection may hold at most {limit} subscriptions")
        sub = Subscription(session, cmd.subscription_id, cmd.subject_filter)
        session.subs[cmd.subscription_id] = sub
        self.subs.add(sub)
        return b""

    def unsubscribe(self, session: Any, cmd: P.Unsubscribe) -> Reply:
        sub = session.subs.pop(cmd.subscription_id, None)
        if sub is None:
            raise error_class(ErrorCode.SUBSCRIPTION_NOT_FOUND)(f"no subscription with id {cmd.subscription_id}")
        self.subs.remove(sub)
        return b""

    def drop_session(self, session: Any) -> None:
        for sub in session.subs.values():
            self.subs.remove(sub)
        session.subs.clear()
        self.sessions.discard(session)

    # -- consumer offsets ----------------------------------------------------------

    def _consumer(self, cmd: Any) -> tuple[Topic, str]:
        topic = self.catalog.topic(cmd.stream, cmd.topic)
        topic.partition(cmd.partition)
        return topic, normalize_name(cmd.consumer, "consumer name")

    def store_consumer_offset(self, session: Any, cmd: P.StoreConsumerOffset) -> Reply:
        topic, name = self._consumer(cmd)
        assert topic.consumers is not None
        topic.consumers.store(name, cmd.partition, cmd.offset)
        return b"", self.committer.note_write(topic.consumers)

    def get_consumer_offset(self, session: Any, cmd: P.GetConsumerOffset) -> Reply:
        topic, name = self._consumer(cmd)
        assert topic.consumers is not None
        offset = topic.consumers.get(name, cmd.partition)
        if offset is None:
            raise error_class(ErrorCode.CONSUMER_OFFSET_NOT_FOUND)(
                f"consumer {name!r} has no offset for {topic.full_name} partition {cmd.partition}"
            )
        return P.ConsumerOffset(offset).encode()

    def delete_consumer_offset(self, session: Any, cmd: P.DeleteConsumerOffset) -> Reply:
        topic, name = self._consumer(cmd)
        assert topic.consumers is not None
        if not topic.consumers.forget(name, cmd.partition):
            raise error_class(ErrorCode.CONSUMER_OFFSET_NOT_FOUND)(
                f"consumer {name!r} has no offset for {topic.full_name} partition {cmd.partition}"
            )
        return b"", self.committer.note_write(topic.consumers)

    # -- streams -------------------------------------------------------------------

    def _stream_details(self, stream: Stream, with_topics: bool) -> P.StreamDetails:
        topics = tuple(t.details() for t in sorted(stream.topics.values(), key=lambda t: t.id)) if with_topics else ()
        return P.StreamDetails(stream.id, len(stream.topics), stream.size_bytes, stream.messages_count, stream.name, topics)

    def get_stream(self, session: Any, cmd: P.GetStream) -> Reply:
        return self._stream_details(self.catalog.stream(cmd.stream), True).encode()

    def list_streams(self, session: Any, cmd: P.ListStreams) -> Reply:
        streams = sorted(self.catalog.streams.values(), key=lambda s: s.id)
        return P.StreamList(tuple(self._stream_details(s, False) for s in streams)).encode()

    async def _new_id(self, wanted: int, kind: str, used: set[int], on_disk: Callable[[], set[int]], pending: set[int],
                      next_id: int, where: Callable[[int], str], parent: str) -> int:
        """The id of a new stream or topic: ``wanted``, or (0) the next id never given.
        Never an id whose directory is on disk (one the catalog does not name, or one
        still being removed), so a new stream or topic can never open old data."""
        disk = await trio.to_thread.run_sync(on_disk)
        code = ErrorCode.STREAM_ID_EXISTS if kind == "stream" else ErrorCode.TOPIC_ID_EXISTS
        if wanted:
            if wanted in used:
                raise error_class(code)(f"{parent}a {kind} with id {wanted} already exists")
            if wanted in disk or wanted in pending:
                raise error_class(code)(
                    f"{kind} id {wanted} is taken by {where(wanted)}, a directory the catalog does not name "
                    "(see the broker's unknown_path damage reports; `ttlbroker repair` moves it to quarantine/)"
                )
            return wanted
        new = next_id
        while new in used or new in disk or new in pending:
            new += 1
        if new > 0xFFFFFFFF:
            raise error_class(code)(f"{parent}no {kind} id is left (ids are u32 and never reused)")
        return new

    async def create_stream(self, session: Any, cmd: P.CreateStream) -> Reply:
        async with self._admin_lock:
            name = normalize_name(cmd.name, "stream name")
            if any(s.name == name for s in self.catalog.streams.values()):
                raise error_class(ErrorCode.STREAM_NAME_EXISTS)(f"a stream named {name!r} already exists")
            sid = await self._new_id(
                cmd.stream_id, "stream", set(self.catalog.streams), self.datadir.stream_ids_on_disk,
                {s for s, t in self.catalog.removing if t is None}, self.catalog.next_stream_id(),
                self.datadir.stream_dir, "",
            )
            stream = Stream(sid, name, self.clock.now_ns())
            self.catalog.streams[sid] = stream
            # Kept even if the save fails: a copy on disk may already name the id.
            self.catalog.stream_id_mark = max(self.catalog.stream_id_mark, sid)
            try:
                await self.save_catalog()
            except BaseException:
                del self.catalog.streams[sid]
                raise
            log.info("stream_created", stream=name, id=sid)
            return self._stream_details(stream, True).encode()

    async def update_stream(self, session: Any, cmd: P.UpdateStream) -> Reply:
        async with self._admin_lock:
            stream = self.catalog.stream(cmd.stream)
            name = normalize_name(cmd.name, "stream name")
            if any(s.name == name and s is not stream for s in self.catalog.streams.values()):
                raise error_class(ErrorCode.STREAM_NAME_EXISTS)(f"a stream named {name!r} already exists")
            old, stream.name = stream.name, name
            try:
                await self.save_catalog()
            except BaseException:
                stream.name = old
                raise
            return self._stream_details(stream, True).encode()

    async def delete_stream(self, session: Any, cmd: P.DeleteStream) -> Reply:
        async with self._admin_lock:
            stream = self.catalog.stream(cmd.stream)
            del self.catalog.streams[stream.id]
            # The catalog lists the directory as garbage before any file goes.
            entry: tuple[int, int | None] = (stream.id, None)
            self.catalog.removing.append(entry)
            self.router.rebuild(self.catalog.topics())
            try:
                await self.save_catalog()
            except BaseException:
                self.catalog.streams[stream.id] = stream
                self.catalog.removing.remove(entry)
                self.router.rebuild(self.catalog.topics())
                raise
            for topic in stream.topics.values():
                self._close_topic(topic)
            await self._finish_removal(entry)
            log.info("stream_deleted", stream=stream.name, id=stream.id)
            return b""

    # -- topics --------------------------------------------------------------------

    def get_topic(self, session: Any, cmd: P.GetTopic) -> Reply:
        return self.catalog.topic(cmd.stream, cmd.topic).details().encode()

    def list_topics(self, session: Any, cmd: P.ListTopics) -> Reply:
        stream = self.catalog.stream(cmd.stream)
        return P.TopicList(tuple(t.details() for t in sorted(stream.topics.values(), key=lambda t: t.id))).encode()

    def _expiry(self, wire_value: int) -> int:
        if wire_value == 0:
            return self.config.system.segment.message_expiry
        if wire_value == EXPIRY_NONE:
            return 0
        return wire_value

    async def create_topic(self, session: Any, cmd: P.CreateTopic) -> Reply:
        async with self._admin_lock:
            stream = self.catalog.stream(cmd.stream)
            name = normalize_name(cmd.name, "topic name")
            check_option_types(cmd.options, updating=False)
            if any(t.name == name for t in stream.topics.values()):
                raise error_class(ErrorCode.TOPIC_NAME_EXISTS)(f"stream {stream.name!r} already has a topic named {name!r}")
            tid = await self._new_id(
                cmd.topic_id, "topic", set(stream.topics), lambda: self.datadir.topic_ids_on_disk(stream.id),
                {t for s, t in self.catalog.removing if s == stream.id and t is not None}, stream.next_topic_id(),
                lambda t: self.datadir.topic_dir(stream.id, t), f"stream {stream.name!r}: ",
            )
            opts = dict(cmd.options)
            pedantic = bool(opts.pop("pedantic", False))
            subjects = tuple(opts.pop("subjects", None) or (f"{stream.name}.{name}.>",))
            cfg = TopicConfig(
                name=name,
                partitions_count=cmd.partitions_count,
                message_expiry=self._expiry(cmd.message_expiry),
                subjects=subjects,
                segment_size=opts.pop("segment_size", self.config.system.segment.size_bytes),
                **opts,
            )
            if "subjects" not in cmd.options:
                try:
                    validate_filter(subjects[0])
                except BrokerError:
                    raise error_class(ErrorCode.INVALID_SUBJECT_FILTER)(
                        f"the default subject filter {subjects[0]!r} is not valid for these names; "
                        "give the topic's subjects explicitly"
                    ) from None
            cfg = resolve(cfg, None, pedantic, self.config.limits.max_partitions)
            self.catalog.check_overlap(cfg.subjects)
            topic = Topic(stream, tid, cfg, self.clock.now_ns())
            self.catalog.check_republish_cycles(topic, cfg)
            # The new directory is listed as garbage until the catalog names the topic,
            # so a crash in between leaves nothing unaccounted for.
            entry: tuple[int, int | None] = (stream.id, tid)
            stream.topic_id_mark = max(stream.topic_id_mark, tid)
            self.catalog.removing.append(entry)
            try:
                await self.save_catalog()
            except BaseException:
                self.catalog.removing.remove(entry)
                raise
            try:
                await trio.to_thread.run_sync(self.datadir.make_topic_dirs, stream.id, tid, cfg.partitions_count)
                await trio.to_thread.run_sync(self._open_topic_storage, topic, False)
                stream.topics[tid] = topic
                self.catalog.removing.remove(entry)
                await self.save_catalog()
            except BaseException:
                stream.topics.pop(tid, None)
                if entry not in self.catalog.removing:
                    self.catalog.removing.append(entry)
                with trio.CancelScope(shield=True):
                    self._close_topic(topic)
                    await self._finish_removal(entry)
                raise
            self.router.rebuild(self.catalog.topics())
            log.info("topic_created", topic=topic.full_name, id=tid, partitions=cfg.partitions_count, subjects=",".join(cfg.subjects))
            return topic.details().encode()

    async def update_topic(self, session: Any, cmd: P.UpdateTopic) -> Reply:
        async with self._admin_lock:
            topic = self.catalog.topic(cmd.stream, cmd.topic)
            check_option_types(cmd.changes, updating=True)
            new = apply_changes(topic.config, cmd.changes)
            new = resolve(new, topic.config, bool(cmd.changes.get("pedantic")), self.config.limits.max_partitions)
            if new.subjects != topic.config.subjects:
                self.catalog.check_overlap(new.subjects, ignore=topic)
            self.catalog.check_republish_cycles(topic, new)
            old, topic.config = topic.config, new
            try:
                await self.save_catalog()
            except BaseException:
                topic.config = old
                raise
            for p in topic.partitions:
                p.log.segment_size = new.segment_size
            if new.max_msgs_per_subject and new.max_msgs_per_subject != old.max_msgs_per_subject:
                for p in topic.partitions:
                    self._enforce_max_msgs(p, [s for s, st in p.index.subjects.items() if st.count])
            if new.message_expiry != old.message_expiry:
                for p in topic.partitions:
                    self.retention.rearm_age(p)
            # Turning allow_msg_ttl on schedules nothing: a topic without it refuses
            # every TTL, so none of its stored messages carries one (docs/semantics.md).
            self.router.rebuild(self.catalog.topics())
            log.info("topic_updated", topic=topic.full_name, changes=",".join(sorted(cmd.changes)))
            return topic.details().encode()

    async def delete_topic(self, session: Any, cmd: P.DeleteTopic) -> Reply:
        async with self._admin_lock:
            topic = self.catalog.topic(cmd.stream, cmd.topic)
            del topic.stream.topics[topic.id]
            # The catalog lists the directory as garbage before any file goes.
            entry: tuple[int, int | None] = (topic.stream.id, topic.id)
            self.catalog.removing.append(entry)
            self.router.rebuild(self.catalog.topics())
            try:
                await self.save_catalog()
            except BaseException:
                topic.stream.topics[topic.id] = topic
                self.catalog.removing.remove(entry)
                self.router.rebuild(self.catalog.topics())
                raise
            self._close_topic(topic)
            await self._finish_removal(entry)
            log.info("topic_deleted", topic=topic.full_name)
            return b""

    async def _finish_removal(self, entry: tuple[int, int | None]) -> None:
        """Remove a directory the catalog lists in ``removing`` (fsyncing its parent),
        then drop the entry. A failure leaves the entry: the next start retries."""
        sid, tid = entry
        if tid is None:
            path, done = self.datadir.stream_dir(sid), await trio.to_thread.run_sync(self.datadir.remove_stream, sid)
        else:
            path, done = self.datadir.topic_dir(sid, tid), await trio.to_thread.run_sync(self.datadir.remove_topic, sid, tid)
        if not done:
            log.error("removal_failed", path=path, action="listed in the catalog; retried at the next start")
            return
        self.catalog.removing.remove(entry)
        try:
            await self.save_catalog()
        except Exception as exc:  # the files are gone; a stale entry only makes the next start look again
            log.error("catalog_save_failed", error=str(exc), action="retried with the next catalog change")

    def _close_topic(self, topic: Topic) -> None:
        for p in topic.partitions:
            self.retention.forget(p)
            p.log.close()
        if topic.consumers is not None:
            topic.consumers.close()

    # -- info ----------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        li = self.config.limits
        return {
            "name": self.config.server.name,
            "version": VERSION,
            "protocol_version": PROTOCOL_VERSION,
            "max_frame_bytes": li.max_frame_bytes,
            "max_payload_bytes": li.max_payload_bytes,
            "max_fetch_bytes": li.max_fetch_bytes,
            "fsync": str(self.config.system.partition.fsync),
            "auth_required": bool(self.config.server.auth_token),
            "started_at": self.started_at,
        }

    def server_info(self, session: Any, cmd: P.GetServerInfo) -> Reply:
        return P.InfoMap(self.info()).encode()

    # -- KV buckets --------------------------------------------------------------------

    def kv_get(self, session: Any, cmd: P.KvGet) -> Reply:
        topic = self.catalog.topic(cmd.stream, cmd.topic)
        validate_subject(cmd.subject)
        entry, epoch = self.kv.get(topic, cmd.subject, cmd.revision, self.clock.now_ns())
        self.counters.messages_out += 1
        payload = P.InfoMap(entry).encode()
        return (payload, epoch) if epoch else payload

    def kv_touch(self, session: Any, cmd: P.KvTouch) -> Reply:
        topic = self.catalog.topic(cmd.stream, cmd.topic)
        validate_subject(cmd.subject)
        entry, epoch = self.kv.touch(topic, cmd.subject, self.clock.now_ns())
        payload = P.InfoMap(entry).encode()
        return (payload, epoch) if epoch else payload

    def kv_keys(self, session: Any, cmd: P.KvKeys) -> Reply:
        topic = self.catalog.topic(cmd.stream, cmd.topic)
        validate_filter(cmd.subject_filter)
        return P.InfoMap({"keys": self.kv.keys(topic, cmd.subject_filter, self.clock.now_ns())}).encode()

    async def export(self, session: Any, cmd: P.Export) -> Reply:
        return P.InfoMap(await self.exporter.export_now(self.all_partitions(), cmd.seal)).encode()

    async def stats(self, session: Any, cmd: P.GetStats) -> Reply:
        values: dict[str, Any] = dict(self.counters.as_dict())
        topics = self.catalog.topics()
        values.update(
            name=self.config.server.name,
            version=VERSION,
            uptime_seconds=round(time.time() - self.started_at, 3),
            connections=len(self.sessions),
            subscriptions=len(self.subs),
            streams=len(self.catalog.streams),
            topics=len(topics),
            partitions=sum(len(t.partitions) for t in topics),
            segments=sum(len(p.log.segments) for t in topics for p in t.partitions),
            messages=sum(t.messages_count for t in topics),
            bytes_in_logs=sum(t.size_bytes for t in topics),
            bytes_on_disk=await trio.to_thread.run_sync(self.datadir.size_on_disk),
            fsync=str(self.config.system.partition.fsync),
            last_fsync_seconds=round(self.committer.last_sync_seconds, 6),
            pending_expiries=len(self.retention.engine.queue),
            expiry_passes=self.retention.engine.passes,
            expiry_lag_max_ms=round(self.retention.engine.lag_ns_max / 1e6, 3),
        )
        budget = getattr(session, "budget", None)  # the output budget all sessions share
        if budget is not None:
            values.update(queued_bytes=budget.total, queued_bytes_max=budget.peak, queued_bytes_budget=budget.limit)
        return P.InfoMap(values).encode()
