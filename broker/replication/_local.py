"""An origin in this broker: a topic's one partition log, read directly.

The origin is found by its NATS stream name (a topic of the NATS listener's
namespace stream, by its NATS name, or a KV bucket ``KV_<b>``) or by a topic's full
name ``stream/topic``, looked up again at every batch: a deleted origin is seen at
once. Only durable messages are handed out (those the group commit made durable:
what a consumer may deliver), so a copy never holds a message its origin can lose
in a crash. New appends are heard through ``Partition.append_listeners``; with
nothing new, an empty batch is a heartbeat every :data:`HEARTBEAT_SECONDS`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import trio

import protocol as P
from protocol import ErrorCode, error_class, normalize_name, subject_matches
from protocol.nats import nats_hash, nats_message_of_record, rfc3339

from broker.core import Broker, Partition, Topic

from ._origin import OriginGone, OriginMessage

__all__ = ["LocalOrigin", "find_local_topic", "HEARTBEAT_SECONDS"]

#: An empty batch (the origin is there, nothing new) at least this often.
HEARTBEAT_SECONDS = 1.0
#: At most this many messages, or bytes, in one batch.
BATCH_MESSAGES = 256
BATCH_BYTES = 1 << 20

_KV_STREAM = "kv"
_KV_PREFIX = "KV_"


def find_local_topic(broker: Broker, name: str) -> Topic | None:
    """The topic a copy's origin ``name`` names in this broker, or None."""
    catalog = broker.catalog
    if "/" in name:
        stream_name, _, topic_name = name.partition("/")
        for s in catalog.streams.values():
            if s.name == stream_name:
                return s.topic_named(topic_name.lower())
        return None
    namespace = normalize_name(broker.config.nats.stream, "[nats] stream")
    for s in catalog.streams.values():
        if s.name == namespace:
            for t in s.topics.values():
                nats = t.config.nats
                if (nats["name"] if nats and "name" in nats else t.name) == name:
                    return t
        elif s.name == _KV_STREAM and name.startswith(_KV_PREFIX):
            for t in s.topics.values():
                nats = t.config.nats
                if t.config.kv is not None and (nats["name"] if nats and "name" in nats else _KV_PREFIX + t.name) == name:
                    return t
    return None


def origin_partition(broker: Broker, name: str) -> Partition:
    """The one partition of the origin ``name``.

    Raises:
        OriginGone: no such topic.
        OriginNotCopyableError: it has more than one partition.
    """
    topic = find_local_topic(broker, name)
    if topic is None or not topic.partitions:
        raise OriginGone(name)
    if len(topic.partitions) != 1:
        raise error_class(ErrorCode.ORIGIN_NOT_COPYABLE)(
            f"origin {name!r} has {len(topic.partitions)} partitions: a mirror or source copies a topic of one"
        )
    return topic.partitions[0]


class LocalOrigin:
    """The :class:`~._origin.Origin` of a topic of this broker (see the module docstring)."""

    def __init__(self, broker: Broker, name: str) -> None:
        self.broker = broker
        self.label = name
        #: nats-server's stream identity (a hash of its creation time), which the
        #: ``Nats-Stream-Source`` header ends with; set once the origin is found.
        self.identity = ""

    def _partition(self) -> Partition:
        part = origin_partition(self.broker, self.label)
        self.identity = nats_hash(rfc3339(part.topic.created_at))
        return part

    async def batches(
        self, start_seq: int, start_time_ns: int | None, filters: tuple[str, ...],
    ) -> AsyncGenerator[list[OriginMessage], None]:
        committer = self.broker.committer
        ftokens = [tuple(f.split(".")) for f in filters if f and f != ">"]
        if len(ftokens) != len([f for f in filters if f]):
            ftokens = []  # a '>' among them: everything
        seq = start_seq
        part = self._partition()
        if not seq:
            seq = _first_at(part, start_time_ns) if start_time_ns else 1
        news = trio.Event()

        def heard() -> None:
            news.set()

        listening: Partition | None = None
        try:
            while True:
                part = self._partition()
                if listening is not part:
                    if listening is not None and heard in listening.append_listeners:
                        listening.append_listeners.remove(heard)
                    part.append_listeners.append(heard)
                    listening = part
                news = trio.Event()
                end = part.log.next_offset
                epoch = committer.durable_at() if committer.acks_wait and not part.log.volatile else 0
                if epoch and not committer.is_durable(epoch):
                    durable = trio.Event()
                    committer.after(epoch, durable.set)
                    await durable.wait()
                    part = self._partition()
                batch = _read(part, seq, end, ftokens) if seq < end else []
                if batch:
                    seq = batch[-1].seq + 1
                    yield batch
                    continue
                seq = max(seq, min(end, part.log.next_offset))  # all below ``end`` was read (none matched)
                with trio.move_on_after(HEARTBEAT_SECONDS):
                    await news.wait()
                if not news.is_set():
                    yield []
        finally:
            if listening is not None and heard in listening.append_listeners:
                listening.append_listeners.remove(heard)


def _first_at(part: Partition, t_ns: int) -> int:
    """The first live offset stored at or after ``t_ns`` (the next offset if none)."""
    log = part.log
    off = max(log.first_offset, 1)
    while off < log.next_offset:
        res = log.read(off, 64, BATCH_BYTES)
        if not res.count:
            break
        for rec in _records(res):
            o, ts = P.RECORD_FIXED.unpack_from(rec, 0)[2:4]
            if ts >= t_ns:
                return int(o)
        off = res.next_offset
    return log.next_offset


def _records(res: object) -> list[memoryview]:
    out: list[memoryview] = []
    for run in res.records:  # type: ignore[attr-defined]
        out.extend(P.split_records(run))
    return out


def _read(part: Partition, seq: int, end: int, ftokens: list[tuple[str, ...]]) -> list[OriginMessage]:
    """The live messages from ``seq`` below ``end`` matching ``ftokens`` (none: all)."""
    log = part.log
    out: list[OriginMessage] = []
    off = seq
    while off < end and not out:
        res = log.read(off, BATCH_MESSAGES, BATCH_BYTES, until=end)
        if not res.count:
            break
        for rec in _records(res):
            o, ts = P.RECORD_FIXED.unpack_from(rec, 0)[2:4]
            subject, headers, payload = nats_message_of_record(rec)
            text = subject.decode(errors="replace")
            if ftokens and not any(subject_matches(f, text.split(".")) for f in ftokens):
                continue
            out.append(OriginMessage(int(o), text, headers or b"", bytes(payload), int(ts), 0))
        off = res.next_offset
    if out:
        pending = log.live_count_from(out[-1].seq + 1) if not ftokens else 0
        last = out[-1]
        out[-1] = OriginMessage(last.seq, last.subject, last.headers, last.payload, last.timestamp_ns, pending)
    return out
