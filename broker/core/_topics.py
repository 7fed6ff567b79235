"""Streams, topics and partitions: the objects a message lives in.

They point at one another (a partition at its topic, a topic at its stream and its
partitions), so they live in one module. A :class:`Partition` is the storage log as
the broker sees it, plus the subject index with one flag byte per offset (pending
expiry, never, marker, no-marker); every removal goes through
:meth:`Partition.remove`, so the log, the subject index and the deadline
structure's count never disagree about what is live.

Ids are ``u32`` from 1 (Iggy's rule, never reused). Names follow the Iggy name rule
(``protocol.normalize_name``) and are unique within their parent.
"""


from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol, TypeVar

from protocol import (
    FLAG_NO_MARKER,
    FLAG_TOMBSTONE,
    HOPS_HEADER,
    MARKER_MASK,
    TTL_NEVER,
    ErrorCode,
    Identifier,
    SubjectTransform,
    TopicDetails,
    error_class,
    header_values,
    subject_matches,
)
from storage import AppendResult, ConsumerOffsets, CorruptedRecord, PartitionLog, ReadResult

from ._dedup import MSG_ID, DedupTable
from ._subject_index import MARKER, NEVER, NO_MARKER, PENDING, TOMBSTONE, SubjectIndex, SubjectState
from ._topic_config import TopicConfig, stored_subject_transform

__all__ = ["Partition", "PartitionWatcher", "Removed", "Stream", "Topic", "by_name", "flags_for"]

_HOPS = HOPS_HEADER.encode()
_DEDUP_HEADERS = frozenset((MSG_ID, _HOPS))


def flags_for(ttl: int, record_flags: int) -> int:
    """The per-offset flags of a stored record (PENDING is set when scheduled)."""
    f = 0
    if ttl == TTL_NEVER:
        f |= NEVER
    if record_flags & MARKER_MASK:
        f |= MARKER
    if record_flags & FLAG_NO_MARKER:
        f |= NO_MARKER
    if record_flags & FLAG_TOMBSTONE:
        f |= TOMBSTONE
    return f


#: Record flags byte -> subject index flags (NEVER comes from the TTL field).
_INDEX_FLAGS = bytes(flags_for(0, f) for f in range(256))
_IS_PENDING = bytes(1 if f & PENDING else 0 for f in range(256))
_SET_PENDING = bytes(f | PENDING for f in range(256))


class Removed(NamedTuple):
    """One message taken out: its offset, subject, flags before, and the subject's
    state afterwards (``state.count == 0``: it was the subject's last)."""

    offset: int
    subject: bytes
    flags: int
    state: SubjectState


class PartitionWatcher(Protocol):
    """What keeps state about a partition's messages and must hear of every removal
    (a durable consumer's state in it, ``broker/consumers/_model.py``)."""

    def removing(self, offsets: list[int], subjects: list[bytes], tag: int) -> None:
        """The live messages at ``offsets`` (on ``subjects``) are about to be removed
        for ``tag`` (a :class:`protocol.RemovalReason`): still readable."""

    def removed(self, offsets: list[int], subjects: list[bytes]) -> None:
        """The live messages at ``offsets`` (on ``subjects``) were removed."""

    @property
    def letters_removals(self) -> bool:
        """Whether :meth:`removing` may dead-letter (then a removal is never
        deferred: ``Retention.remove``)."""

    def purged(self, next_offset: int) -> None:
        """Every message below ``next_offset`` was removed (a whole purge)."""


class Partition:
    """Args:
    topic: the topic it belongs to.
    number: its number in the topic, from 0.
    log: its opened storage log.
    """

    def __init__(self, topic: Topic, number: int, log: PartitionLog) -> None:
        self.topic = topic
        self.number = number
        self.log = log
        self.index = SubjectIndex(log.segments[0].base, log.is_live, log.is_corrupt)
        #: Messages of this partition with a live entry in the deadline structure.
        self.pending = 0
        #: KV buckets: offset -> deadline pushed back by a read or touch (FLIP-25's
        #: lazy re-arm: the deadline structure keeps the first entry, and when it falls
        #: due the expiry pass re-arms it here once instead of removing the message).
        self.refreshed: dict[int, int] = {}
        #: Pending message schedules (``_schedules.py``): the schedule's offset ->
        #: (its subject, when it fires, ns), and subject -> offset. A removal of the
        #: schedule message takes it out.
        self.schedules: dict[int, tuple[bytes, int]] = {}
        self.schedule_of: dict[bytes, int] = {}
        self._filter_cache: dict[str, tuple[int, set[int]]] = {}
        #: Durable consumers' states in this partition (``broker/consumers/_model.py``):
        #: told of every removal, and (through ``on_append``, which the consumer
        #: engine sets with the first of them) of every append.
        self.watchers: list[PartitionWatcher] = []
        self.on_append: Callable[[Partition, int, list[bytes]], None] | None = None
        #: ``on_append`` hears every append, watchers or not (a topic with interest
        #: retention removes at once what no consumer wants).
        self.hear_all_appends = False
        #: Called after every append, with nothing (a local copy's origin waiting for
        #: news: ``broker/replication/_local.py``).
        self.append_listeners: list[Callable[[], None]] = []
        #: Offsets below this are durable (or acks do not wait for the disk): what
        #: consumers may deliver.
        self.visible_next = log.next_offset

    def __repr__(self) -> str:
        return f"Partition({self.topic.full_name}[{self.number}])"

    def rebuild_index(
        self, msg_ids: list[tuple[int, bytes, int, int]] | None = None, headed: list[tuple[int, int, bytes]] | None = None,
    ) -> dict[tuple[int, int], list[int]]:
        """Rebuild the subject index from the log (startup). Returns the offsets of the
        live records that carry a TTL (seconds, not never) grouped by ``(timestamp,
        ttl)``, for the caller to schedule.

        With ``msg_ids`` (a list), the same scan adds ``(timestamp, Nats-Msg-Id,
        partition, offset)`` for the records that carry the header and are no older
        than the topic's duplicate window before the newest of them (markers and
        republished copies, which carry ``TTLB-Hops``, never count)."""
        self.index = index = SubjectIndex(self.log.segments[0].base, self.log.is_live, self.log.is_corrupt)
        self.pending = 0
        with_ttl: dict[tuple[int, int], list[int]] = {}
        window_ns = self.topic.config.duplicate_window * 1_000_000_000 if msg_ids is not None else 0
        ids: deque[tuple[int, bytes, int, int]] = deque()
        for live in self.log.scan(headers=bool(window_ns) or headed is not None):
            for offset, subject in live.damaged:
                index.note_damaged(offset, subject)
            flags = live.flags.translate(_INDEX_FLAGS)
            if live.stats is not None:  # every record of the segment is live
                index.extend_ids(live.base, live.names, live.sids, flags, live.stats)
            else:
                for first, n in live.runs:
                    a = first - live.base
                    index.extend_ids(first, live.names, live.sids[a : a + n], flags[a : a + n])
            for (ts, ttl), offsets in live.ttls.items():
                if ttl != TTL_NEVER:
                    group = with_ttl.get((ts, ttl))
                    if group is None:
                        with_ttl[ts, ttl] = offsets
                    else:
                        group.extend(offsets)  # a batch split across two segments
                else:
                    for o in offsets:
                        index.set_flags(o, index.flags_at(o) | NEVER)
            for offset, ts, block in live.headers:
                if index.flags_at(offset) & MARKER:
                    continue
                if headed is not None and b"Nats-Schedul" in block:  # (message schedules: ``_schedules.py``)
                    headed.append((offset, ts, block))
                if not window_ns:
                    continue
                found = header_values(block, _DEDUP_HEADERS)
                msg_id = found.get(MSG_ID)
                if msg_id and _HOPS not in found:
                    ids.append((ts, msg_id, self.number, offset))
                    while ids[0][0] < ts - window_ns:
                        ids.popleft()
        if msg_ids is not None:
            msg_ids.extend(ids)
        return with_ttl

    # -- flags ---------------------------------------------------------------------

    def is_never(self, offset: int) -> bool:
        return bool(self.index.flags_at(offset) & NEVER)

    def is_pending(self, offset: int) -> bool:
        return bool(self.index.flags_at(offset) & PENDING) and self.log.is_live(offset)

    def mark_pending(self, offsets: Iterable[int]) -> int:
        flags = self.index.flags
        base = self.index.base
        if isinstance(offsets, list) and len(offsets) > 1 and offsets[-1] - offsets[0] == len(offsets) - 1:
            # Consecutive offsets (a batch with one TTL): two C passes over the flags.
            a, b = offsets[0] - base, offsets[-1] - base + 1
            run = flags[a:b]
            n = len(run) - run.translate(_IS_PENDING).count(1)
            flags[a:b] = run.translate(_SET_PENDING)
            self.pending += n
            return n
        n = 0
        for o in offsets:
            i = o - base
            if not flags[i] & PENDING:
                flags[i] |= PENDING
                n += 1
        self.pending += n
        return n

    # -- writing -------------------------------------------------------------------

    def append(
        self, data: bytes, starts: list[int], ends: list[int], subjects: list[bytes], timestamp: int,
        flags: bytes | bytearray | None = None, stamps: Mapping[int, tuple[int, int]] | None = None,
        timestamps: list[int] | None = None,
    ) -> AppendResult:
        res = self.log.append(data, starts, ends, timestamp, stamps, timestamps)
        self.index.extend(res.first_offset, subjects, flags)
        if self.watchers or self.hear_all_appends:
            on_append = self.on_append
            if on_append is not None:
                on_append(self, res.first_offset, subjects)
        if self.append_listeners:
            for listener in self.append_listeners:
                listener()
        return res

    def remove(self, offsets: Iterable[int], tag: int = 0, deferred: bool = False) -> tuple[list[Removed], int]:
        """Delete live messages (``tag``: the :class:`protocol.RemovalReason` kept on
        disk). Returns what was removed (in the order given) and how many of them had
        a pending expiry (the caller tells the queue). ``deferred``: the deletions
        are written deferred (``PartitionLog.delete_many``; ``Retention.remove``
        says when)."""
        live = [o for o in dict.fromkeys(offsets) if self.log.is_live(o)]
        if not live:
            return [], 0
        index = self.index
        before = [(index.subject_at(o), index.flags_at(o)) for o in live]
        watchers = list(self.watchers)
        subjects = [s for s, _ in before] if watchers else []
        for w in watchers:  # (a consumer dead-letters what it still owes: before the bytes go)
            w.removing(live, subjects, tag)
        self.log.delete_many(live, tag, deferred)
        out = []
        cleared = 0
        for o, (subject, f) in zip(live, before):
            st = index.removed(o)
            if f & PENDING:
                index.set_flags(o, f & ~PENDING)
                cleared += 1
            if self.refreshed and self.refreshed.pop(o, None) is not None:
                self._forget_lease(o)
            if self.schedules:
                self.drop_schedule(o)
            if st is not None:
                out.append(Removed(o, subject, f, st))
        self.pending -= cleared
        for w in watchers:
            w.removed(live, subjects)
        return out, cleared

    def last_offsets(self, subjects: list[bytes]) -> list[int]:
        """For messages about to be appended on ``subjects``: the newest live offset of
        each one's subject before it (0 if none), counting the batch's own earlier
        messages (republish's ``Nats-Last-Sequence``). O(1) per message."""
        out: list[int] = []
        newest: dict[bytes, int] = {}
        offset = self.log.next_offset
        for s in subjects:
            prev = newest.get(s)
            if prev is None:
                st = self.index.get(s)
                prev = st.last if st is not None and st.count else 0
            out.append(prev)
            newest[s] = offset
            offset += 1
        return out

    def _forget_lease(self, offset: int) -> None:
        """Drop a KV refresh lease with its message (``broker/kv/_reads.py``)."""
        consumers = self.topic.consumers
        if consumers is not None:
            consumers.forget(f"$refresh.{offset}", self.number)

    def over_limit(self, subjects: Iterable[bytes], limit: int) -> list[int]:
        """Oldest offsets to remove so each subject keeps at most ``limit`` messages."""
        doomed: list[int] = []
        for s in set(subjects):
            st = self.index.get(s)
            if st is None or st.count <= limit:
                continue
            excess = st.count - limit
            off = st.first
            while off:
                doomed.append(off)
                excess -= 1
                if not excess:
                    break
                off = self.index.next_live(st.sid, off + 1)
        return doomed

    def purge_all(self) -> tuple[int, int]:
        """Remove everything (watermark purge). Returns ``(removed, pending cleared)``."""
        removed = self.log.purge()
        cleared = self.pending
        self.pending = 0
        self.refreshed.clear()
        self.schedules.clear()
        self.schedule_of.clear()
        self.index = SubjectIndex(self.log.next_offset, self.log.is_live, self.log.is_corrupt)
        self._filter_cache.clear()
        for w in list(self.watchers):
            w.purged(self.log.next_offset)
        return removed, cleared

    def subjects_matching(self, subject_filter: str) -> list[bytes]:
        """The subjects with live messages that a filter matches (token by token: a
        stored ``a.*`` is matched by ``a.*`` and ``a.>``). Runtime complexity:
        O(subjects)."""
        ftokens = tuple(subject_filter.split("."))
        return [
            s for s, st in self.index.subjects.items()
            if st.count and subject_matches(ftokens, s.decode(errors="replace").split("."))
        ]

    def subject_offsets(self, subject: bytes, before: int | None = None) -> list[int]:
        """Every live offset of one subject (below ``before`` if given), oldest first."""
        st = self.index.get(subject)
        out: list[int] = []
        if st is None or not st.count:
            return out
        off = st.first
        while off and len(out) < st.count and (before is None or off < before):
            out.append(off)
            off = self.index.next_live(st.sid, off + 1)
        return out

    def live_offsets(self, except_offset: int = 0) -> list[int]:
        """Every live offset (for a rollup of the whole topic)."""
        out: list[int] = []
        for seg in self.log.segments:
            rel = seg.first_live_rel()
            while rel >= 0:
                if seg.base + rel != except_offset:
                    out.append(seg.base + rel)
                rel = seg.first_live_rel(rel + 1)
        return out

    def trim_index(self) -> None:
        """Drop index entries below the log's first segment (after the cleaner or a
        purge removed them) and forget subjects left with nothing."""
        self.index.trim(self.log.segments[0].base)
        self.index.forget_empty()

    # -- reading -------------------------------------------------------------------

    def wanted_for(self, subject_filter: str, matches: Callable[[bytes], bool]) -> Callable[[int], bool]:
        """A predicate on offsets: does the message there match the filter?"""
        cached = self._filter_cache.get(subject_filter)
        if cached is None or cached[0] != self.index.version:
            if len(self._filter_cache) > 256:
                self._filter_cache.clear()
            cached = (self.index.version, self.index.matching_ids(matches))
            self._filter_cache[subject_filter] = cached
        ids = cached[1]
        sid_at = self.index.sid_at
        base = self.index.base
        limit = self.index.end

        def wanted(offset: int) -> bool:
            return base <= offset < limit and sid_at(offset) in ids

        return wanted

    def read(self, offset: int, count: int, max_bytes: int, wanted: Callable[[int], bool] | None) -> ReadResult:
        return self.log.read(offset, count, max_bytes, wanted)

    def drop_schedule(self, offset: int) -> None:
        """The schedule stored at ``offset`` (if any) is pending no more."""
        got = self.schedules.pop(offset, None)
        if got is not None and self.schedule_of.get(got[0]) == offset:
            del self.schedule_of[got[0]]

    def last(self, subject: bytes) -> memoryview | None:
        st = self.index.get(subject)
        if st is None or not st.count:
            return None
        return self.log.get(st.last)

    def refuse_damaged_last(self, subject: bytes, last: int, what: str, noun: str = "message", unit: str = "offset") -> None:
        """Refuse to answer ``subject``'s newest message with its newest readable one
        (at ``last``, 0: none) when a damaged record is, or may be, newer
        (``SubjectIndex.damage_since``; ``docs/semantics.md`` §3.4): a reader must
        never take an older message for the current one.

        Args:
            what: the subject as the reader asked for it (``the last message on
                subject 'a.b' in topic s/t``), to start the message with.
            noun: what one message of it is called (``message``, ``revision``).
            unit: what its position is called (``offset``, ``revision``).

        Raises:
            CorruptedRecord: ``CORRUPTED_RECORD``, naming the damaged record and
                whether it is known to be the subject's.
        """
        found = self.index.damage_since(subject, last)
        if found is not None:
            raise _damaged_last_error(found[0], found[1], last, what, noun, unit)

    def refuse_damaged_matching(
        self, matches: Callable[[bytes], bool], last: int, what: str, noun: str = "message", unit: str = "offset",
    ) -> None:
        """:meth:`refuse_damaged_last` for the newest message a wildcard filter
        matches (``last``, 0: none)."""
        found = self.index.damage_matching(matches, last)
        if found is not None:
            offset, known, subject = found
            if known and subject is not None:
                what = f"{what} (on subject {subject.decode(errors='replace')!r})"
            raise _damaged_last_error(offset, known, last, what, noun, unit)


#: How to be rid of a damaged record, in the errors that name one.
_REPAIR = "`ttlbroker repair` writes the damaged record off"


def _damaged_last_error(offset: int, known: bool, last: int, what: str, noun: str, unit: str) -> CorruptedRecord:
    """The ``CORRUPTED_RECORD`` error for a subject whose newest message is (``known``)
    or may be the damaged record at ``offset``, its newest readable one being at
    ``last`` (0: none); ``what``, ``noun`` and ``unit`` as
    :meth:`Partition.refuse_damaged_last` takes them."""
    if known:
        return CorruptedRecord(
            f"{what} is damaged: {unit} {offset} cannot be read, and no older {noun} is served in its place ({_REPAIR})",
            offset,
        )
    older = f"it is newer than the newest readable {noun} ({unit} {last})" if last else f"no other {noun} of it is readable"
    return CorruptedRecord(
        f"{what} may be damaged: {unit} {offset} cannot be read, nor can its subject, and {older}; no older {noun} "
        f"is served in its place ({_REPAIR})",
        offset,
    )


class Topic:
    def __init__(self, stream: Stream, topic_id: int, config: TopicConfig, created_at: int) -> None:
        self.stream = stream
        self.id = topic_id
        self.config = config  # also compiles the republish transform
        self.created_at = created_at
        self.partitions: list[Partition] = []
        self.consumers: ConsumerOffsets | None = None
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
        self._json: dict[str, Any] | None = None
        rp = value.republish
        #: The compiled republish transform, or None.
        self.republisher = SubjectTransform(rp["src"], rp["dest"]) if rp else None
        #: The compiled ``subject_transform`` (the subject a capture is stored under), or None.
        self.transform = stored_subject_transform(value)
        #: A publish into it may be refused by its limits (``_limits.refuse``):
        #: max_msg_size, or discard new with a limit to refuse at.
        self.refusing = bool(value.max_msg_size) or (
            value.discard == "new" and bool(value.max_msgs or value.max_bytes or value.discard_new_per_subject)
        )
        #: An append may take a partition past max_msgs or max_bytes, whose oldest
        #: messages then go (discard old: ``_limits.trim``).
        self.trimming = value.discard == "old" and bool(value.max_msgs or value.max_bytes)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def full_name(self) -> str:
        return f"{self.stream.name}/{self.name}"

    def partition_for(self, subject: bytes) -> Partition:
        """The partition a subject maps to: CRC-32 (IEEE, zlib) of its UTF-8 bytes
        modulo the partitions count. Stable across processes, machines and versions
        (Python's ``hash()`` is salted per process and would scatter subjects on
        every restart)."""
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
            "pending_schedules": sum(len(p.schedules) for p in self.partitions),
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
        if extra:
            info.update(extra)
        return TopicDetails(
            self.id, self.config.partitions_count, self.config.message_expiry, self.size_bytes, self.messages_count,
            self.name, info,
        )

    def to_json(self) -> dict[str, Any]:
        """The catalog's entry for this topic: made once per configuration (a topic's
        id and creation time never change), so a catalog save can tell the topics
        that did not change by identity. Treat it as read-only."""
        if self._json is None:
            self._json = {"id": self.id, "created_at": self.created_at, "config": self.config.to_json()}
        return self._json


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
        value = ident.value
        t = self.topics.get(value) if isinstance(value, int) else self.topic_named(value)
        if t is None:
            raise error_class(ErrorCode.TOPIC_NOT_FOUND)(f"stream {self.name!r} has no topic {ident.value!r}")
        return t

    def topic_named(self, name: str) -> Topic | None:
        """The topic called ``name``, in one lookup whatever the number of topics
        (the index is kept by :meth:`add_topic` and :meth:`remove_topic`; one that no
        longer matches ``topics`` is made again)."""
        found = self._by_name.get(name)
        if found is not None and self.topics.get(found.id) is found and found.name == name:
            return found
        if found is None and len(self._by_name) == len(self.topics):
            return None
        return by_name(self.topics, self._by_name, name)

    def add_topic(self, topic: Topic) -> None:
        self.topics[topic.id] = topic
        self._by_name[topic.name] = topic
        self.topic_id_mark = max(self.topic_id_mark, topic.id)

    def remove_topic(self, topic: Topic) -> None:
        del self.topics[topic.id]
        if self._by_name.get(topic.name) is topic:
            del self._by_name[topic.name]

    def next_topic_id(self) -> int:
        """One more than the highest id this stream ever gave a topic (the broker
        also skips ids that have a directory on disk): the mark ``add_topic`` keeps,
        so the cost does not grow with the topics."""
        return self.topic_id_mark + 1

    @property
    def size_bytes(self) -> int:
        return sum(t.size_bytes for t in self.topics.values())

    @property
    def messages_count(self) -> int:
        return sum(t.messages_count for t in self.topics.values())

    def header_json(self) -> dict[str, Any]:
        """The stream's catalog entry without its topics."""
        return {"id": self.id, "name": self.name, "created_at": self.created_at, "next_topic_id": self.next_topic_id()}

    def to_json(self) -> dict[str, Any]:
        return {**self.header_json(), "topics": [t.to_json() for t in sorted(self.topics.values(), key=lambda t: t.id)]}
