"""Streams and topics: names, ids, lookups and the persisted catalog.

Ids are ``u32`` from 1 (Iggy). Names follow the Iggy rule (``protocol.normalize_name``)
and are unique within their parent. A subject filter belongs to at most one topic in
the whole broker: a create or update whose filters overlap another topic's is refused
with SUBJECTS_OVERLAP naming both topics.
"""

from __future__ import annotations

import zlib
from typing import Any, TypeVar

from protocol import ErrorCode, Identifier, SubjectTransform, TopicDetails, error_class, filters_overlap
from storage import ConsumerOffsets

from ._dedup import DedupTable
from ._partition import Partition
from ._topic_config import TopicConfig

__all__ = ["Stream", "Topic", "Catalog", "partition_of"]


def partition_of(subject: bytes, partitions_count: int) -> int:
    """The partition a subject maps to: CRC-32 (IEEE, zlib) of its UTF-8 bytes modulo
    the partitions count. Stable across processes, machines and versions (Python's
    ``hash()`` is salted per process and would scatter subjects on every restart)."""
    return zlib.crc32(subject) % partitions_count


class Topic:
    def __init__(self, stream: Stream, topic_id: int, config: TopicConfig, created_at: int) -> None:
        self.stream = stream
        self.id = topic_id
        self.config = config  # also compiles the republish transform
        self.created_at = created_at
        self.partitions: list[Partition] = []
        self.consumers: ConsumerOffsets | None = None
        #: Durable consumers by name, and their journal (``_consumer_journal.py``).
        self.consumer_set: dict[str, Any] = {}
        self.consumer_journal: Any = None
        #: Messages removed since start, by reason (``ttl``, ``max_age``, ``delete``,
        #: ``purge``, ``rollup``, ``max_msgs_per_subject``).
        self.removed: dict[str, int] = {}
        #: Subject delete markers written since start, by reason (``MaxAge``, ...).
        self.markers: dict[str, int] = {}
        #: ``Nats-Msg-Id`` de-duplication (``_dedup.py``), and the duplicates refused
        #: since start.
        self.dedup = DedupTable()
        self.duplicates = 0

    @property
    def config(self) -> TopicConfig:
        return self._config

    @config.setter
    def config(self, value: TopicConfig) -> None:
        self._config = value
        rp = value.republish
        #: The compiled republish transform, or None.
        self.republisher = SubjectTransform(rp["src"], rp["dest"]) if rp else None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def full_name(self) -> str:
        return f"{self.stream.name}/{self.name}"

    def partition_for(self, subject: bytes) -> Partition:
        n = len(self.partitions)
        return self.partitions[zlib.crc32(subject) % n if n > 1 else 0]

    def partition(self, number: int) -> Partition:
        if not 0 <= number < len(self.partitions):
            raise error_class(ErrorCode.PARTITION_NOT_FOUND)(
                f"topic {self.full_name} has partitions 0..{len(self.partitions) - 1}, not {number}"
            )
        return self.partitions[number]

    @property
    def messages_count(self) -> int:
        return sum(p.log.live_count for p in self.partitions)

    @property
    def size_bytes(self) -> int:
        return sum(p.log.size_bytes for p in self.partitions)

    @property
    def live_bytes(self) -> int:
        """The bytes of the live messages' records (what ``size_bytes`` holds less
        what was removed and not yet cleaned away)."""
        return sum(p.log.live_bytes() for p in self.partitions)

    def details(self, extra: dict[str, Any] | None = None) -> TopicDetails:
        info: dict[str, Any] = {
            "stream_id": self.stream.id,
            "stream": self.stream.name,
            "created_at": self.created_at,
            "options": self.config.options(),
            "pending_expiries": sum(p.pending for p in self.partitions),
            "removed": dict(self.removed),
            "markers": dict(self.markers),
            "duplicates": self.duplicates,
            "dedup_ids": len(self.dedup),
            "partitions": [
                {
                    "partition": p.number,
                    "first_offset": p.log.first_offset,
                    "last_offset": p.log.last_offset,
                    "messages": p.log.live_count,
                    "size_bytes": p.log.size_bytes,
                    "segments": len(p.log.segments),
                    "subjects": sum(1 for st in p.index.subjects.values() if st.count),
                }
                for p in self.partitions
            ],
        }
        if self.consumer_set:
            info["consumers"] = [c.summary() for _, c in sorted(self.consumer_set.items())]
        if extra:
            info.update(extra)
        return TopicDetails(
            self.id, self.config.partitions_count, self.config.message_expiry, self.size_bytes, self.messages_count,
            self.name, info,
        )

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "created_at": self.created_at, "config": self.config.to_json()}


_Named = TypeVar("_Named", "Topic", "Stream")


def by_name(by_id: dict[int, _Named], names: dict[str, _Named], name: str) -> _Named | None:
    """The stream or topic of ``by_id`` called ``name``, through ``names``, an index
    that is checked on every hit (the entry must still be in ``by_id`` under that
    name) and made again from ``by_id`` on a miss or a stale entry: creations and
    deletions need not keep it up to date."""
    found = names.get(name)
    if found is not None and by_id.get(found.id) is found and found.name == name:
        return found
    names.clear()
    names.update((x.name, x) for x in by_id.values())
    return names.get(name)


class Stream:
    def __init__(self, stream_id: int, name: str, created_at: int) -> None:
        self.id = stream_id
        self.name = name
        self.created_at = created_at
        self.topics: dict[int, Topic] = {}
        #: The highest topic id ever given in this stream (ids are never reused).
        self.topic_id_mark = 0
        self._by_name: dict[str, Topic] = {}

    def topic(self, ident: Identifier) -> Topic:
        if ident.is_numeric:
            t = self.topics.get(ident.value)  # type: ignore[arg-type]
        else:
            t = by_name(self.topics, self._by_name, ident.value)  # type: ignore[arg-type]
        if t is None:
            raise error_class(ErrorCode.TOPIC_NOT_FOUND)(f"stream {self.name!r} has no topic {ident.value!r}")
        return t

    def next_topic_id(self) -> int:
        """One more than the highest id this stream ever gave a topic (the broker
        also skips ids that have a directory on disk)."""
        return max(max(self.topics, default=0), self.topic_id_mark) + 1

    @property
    def size_bytes(self) -> int:
        return sum(t.size_bytes for t in self.topics.values())

    @property
    def messages_count(self) -> int:
        return sum(t.messages_count for t in self.topics.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "created_at": self.created_at,
            "next_topic_id": self.next_topic_id(),
            "topics": [t.to_json() for t in sorted(self.topics.values(), key=lambda t: t.id)],
        }


class Catalog:
    VERSION = 1

    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}
        #: The highest stream id ever given (ids are never reused).
        self.stream_id_mark = 0
        #: Directories that are garbage unless the catalog names them: ``(stream id,
        #: topic id)`` or ``(stream id, None)`` for a whole stream. Written before a
        #: deleted topic's files are removed (and before a new topic's are created),
        #: dropped once done; at start the broker removes what is still listed.
        self.removing: list[tuple[int, int | None]] = []
        self._by_name: dict[str, Stream] = {}

    def stream(self, ident: Identifier) -> Stream:
        if ident.is_numeric:
            s = self.streams.get(ident.value)  # type: ignore[arg-type]
        else:
            s = by_name(self.streams, self._by_name, ident.value)  # type: ignore[arg-type]
        if s is None:
            raise error_class(ErrorCode.STREAM_NOT_FOUND)(f"no stream {ident.value!r}")
        return s

    def topic(self, stream: Identifier, topic: Identifier) -> Topic:
        return self.stream(stream).topic(topic)

    def topics(self) -> list[Topic]:
        return [t for s in self.streams.values() for t in s.topics.values()]

    def next_stream_id(self) -> int:
        """One more than the highest stream id ever given (the broker also skips ids
        that have a directory on disk)."""
        return max(max(self.streams, default=0), self.stream_id_mark) + 1

    def check_overlap(self, subjects: tuple[str, ...], ignore: Topic | None = None) -> None:
        for other in self.topics():
            if other is ignore:
                continue
            for mine in subjects:
                for theirs in other.config.subjects:
                    if filters_overlap(mine, theirs):
                        raise error_class(ErrorCode.SUBJECTS_OVERLAP)(
                            f"subject filter {mine!r} overlaps {theirs!r} of topic {other.full_name}"
                        )

    def check_republish_cycles(self, topic: Topic, config: TopicConfig) -> None:
        """Refuse a configuration of ``topic`` that closes a republish loop through
        other topics (A republishes into what B captures, B into what A captures, or
        longer chains). ADR-28 only guards a topic against itself; this sees the
        whole graph. Before the change there was no cycle, so any new one runs
        through ``topic``: a depth-first search from it finds it.

        Raises:
            RepublishCycleError: naming every topic of the cycle.
        """
        topics = [t for t in self.topics() if t is not topic] + [topic]
        configs = {id(t): (config if t is topic else t.config) for t in topics}

        def targets(t: Topic) -> list[Topic]:
            rp = configs[id(t)].republish
            if not rp:
                return []
            out_filter = SubjectTransform(rp["src"], rp["dest"]).as_filter()
            return [u for u in topics if u is not t and any(filters_overlap(out_filter, f) for f in configs[id(u)].subjects)]

        path: list[Topic] = [topic]
        seen: set[int] = set()

        def visit(t: Topic) -> list[Topic] | None:
            for u in targets(t):
                if u is topic:
                    return path + [topic]
                if id(u) in seen:
                    continue
                seen.add(id(u))
                path.append(u)
                found = visit(u)
                if found:
                    return found
                path.pop()
            return None

        cycle = visit(topic)
        if cycle:
            names = " -> ".join(t.full_name for t in cycle)
            raise error_class(ErrorCode.REPUBLISH_CYCLE)(f"republish destination forms a cycle through topics: {names}")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.VERSION,
            "next_stream_id": self.next_stream_id(),
            "removing": [[s, t] for s, t in self.removing],
            "streams": [s.to_json() for s in sorted(self.streams.values(), key=lambda s: s.id)],
        }
