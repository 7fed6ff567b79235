"""KV buckets: reads and touches that refresh a key's TTL (Flink FLIP-25).

A bucket is a topic with the ``kv`` option (``ttl``, ``refresh``, ``visibility``),
one partition, per-message TTLs, rollups and subject delete markers; its keys are
the subjects ``$KV.<bucket>.<key>``. Puts, creates, updates, deletes and purges are
ordinary publishes (the client sets the headers); this module answers what a
publish cannot: get with the bucket's rules, touch, and the list of keys
(:class:`KvReads`; the KV_GET, KV_TOUCH and KV_KEYS handlers are ``_handlers.py``).

**One pending entry per key, re-armed lazily.** A key's message has one entry in the
deadline structure, armed at its timestamp + TTL when it was stored. A read (with
``refresh = on_read_and_write``) or a touch only records the pushed-back deadline in
``Partition.refreshed`` (a dict write, O(1)); when the entry falls due, the expiry
pass finds the later deadline there and re-arms the entry once
(``Retention._rearm_refreshed``). A key read a million times holds one entry.

**Refreshes are durable, cheaply.** A refresh that pushes the deadline past the one on
disk writes a *lease*: the new deadline plus a headroom of a tenth of the TTL (at
least one second), in the topic's small append-only offsets file (name
``$refresh.<offset>``, which no consumer name can be). The reply waits for the group
commit that covers it, like an ack. Reads within the headroom write nothing, so a hot
key costs one 30-byte write per TTL/10, not one per read. After a restart a key lives
until at least its lease: never less than its TTL after its last read or touch, at
most the headroom more.

**Visibility** (FLIP-25): ``never_return_expired`` answers "absent" for a key at or
after its deadline even if the expiry pass has not removed it yet;
``return_expired_if_not_cleaned_up`` returns it until it is removed.

**Damage**: a key whose newest revision is a damaged record, or may be one (a damaged
record whose subject is unknown is newer than the key's newest readable revision),
answers ``CORRUPTED_RECORD`` to get and touch, never an older revision as current
(``Partition.refuse_damaged_last``, ``docs/semantics.md`` §3.4, §14.9); ``keys``
lists a key whose newest revision is known to be damaged.
"""

from __future__ import annotations

from typing import Any

from protocol import TTL_NEVER, ErrorCode, decode_headers, error_class, read_record_info, record_spans, subject_matches

from storage import CorruptedRecord

from broker.core import MARKER, TOMBSTONE, Broker, Partition, Topic, TopicHooks

__all__ = ["KvReads", "LEASE_PREFIX", "load_leases"]

NS = 1_000_000_000
LEASE_PREFIX = "$refresh."
_NotFound = error_class(ErrorCode.MESSAGE_NOT_FOUND)


def load_leases(topic: Topic) -> None:
    """Put the durable refresh leases of a bucket back into ``Partition.refreshed``
    (startup), and forget those of messages that are gone."""
    consumers = topic.consumers
    if consumers is None:
        return
    for (name, number), deadline in list(consumers.offsets.items()):
        if not name.startswith(LEASE_PREFIX) or number >= len(topic.partitions):
            continue
        part = topic.partitions[number]
        offset = int(name[len(LEASE_PREFIX) :])
        if part.log.is_live(offset):
            part.refreshed[offset] = max(part.refreshed.get(offset, 0), deadline)
        else:
            consumers.forget(name, number)


def _operation(flags: int, headers: dict[str, str]) -> str:
    if flags & MARKER:
        return "EXPIRED" if headers.get("Nats-Marker-Reason") == "MaxAge" else headers.get("Nats-Marker-Reason", "").upper()
    if flags & TOMBSTONE:
        return headers.get("KV-Operation", "DEL")
    return "PUT"


class KvReads(TopicHooks):
    """Args:
    broker: the broker whose buckets it reads; it registers in its
        ``topic_hooks`` (a bucket's leases come back when the broker recovers it).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.committer = broker.committer
        broker.topic_hooks.append(self)

    def topic_opened(self, topic: Topic, recovering: bool) -> None:
        if recovering and topic.config.kv is not None:
            load_leases(topic)

    @staticmethod
    def bucket(topic: Topic) -> dict[str, Any]:
        kv = topic.config.kv
        if kv is None:
            raise error_class(ErrorCode.NOT_A_BUCKET)(f"topic {topic.full_name} is not a KV bucket")
        return kv

    @staticmethod
    def deadline(part: Partition, offset: int, timestamp: int, ttl: int) -> int:
        """The key's effective deadline (0 = none)."""
        if not ttl or ttl == TTL_NEVER:
            return 0
        return max(timestamp + ttl * NS, part.refreshed.get(offset, 0))

    def get(self, topic: Topic, subject: str, revision: int, now_ns: int) -> tuple[dict[str, Any], int]:
        """The entry of ``subject`` (its latest revision, or ``revision``), with the
        bucket's visibility and refresh rules (:meth:`read`); returns it and the
        epoch the reply must wait for (0: none).

        Raises:
            NotABucketError, MessageNotFoundError (absent, or expired and hidden),
            CorruptedRecord (the record is damaged: found so before or on this read;
            or, for the latest revision, the key's newest revision is, or may be, a
            damaged record).
        """
        offset, latest, rec, created, ttl, payload_at, end, headers, op, deadline, epoch = self.read(
            topic, subject, revision, now_ns
        )
        entry = {
            "subject": subject,
            "revision": offset,
            "latest": latest,
            "operation": op,
            "value": bytes(rec[payload_at:end]),
            "headers": headers,
            "created": created,
            "ttl": ttl,
            "deadline": deadline,
            "ttl_remaining_ms": max(0, (deadline - now_ns) // 1_000_000) if deadline else None,
        }
        return entry, epoch

    def read(
        self, topic: Topic, subject: str, revision: int, now_ns: int
    ) -> tuple[int, bool, memoryview, int, int, int, int, dict[str, str], str, int, int]:
        """What :meth:`get` answers, before it is put in a dictionary: ``(revision,
        latest, record, created, ttl, payload start, payload end, headers, operation,
        deadline, epoch)``, the value being ``record[payload start:payload end]``
        (a JetStream get builds its answer from these without the entry).
        (:meth:`bucket`, :meth:`deadline`, :func:`_operation` and
        ``read_record_info`` are written out here: this runs once per get.)

        The record comes from one storage call (``PartitionLog.read_live``: the live,
        verified record or None), and it must carry ``subject`` itself: a revision
        of another key, or an offset no live record holds, is "not found". A
        damaged record is never "not found": without a revision, a key whose newest
        revision is (or may be) damaged is refused before anything is read, as is
        a revision that is damaged.

        Raises:
            as :meth:`get`.
        """
        kv = topic.config.kv
        if kv is None:
            kv = self.bucket(topic)  # raises
        raw = subject.encode()
        part = topic.partition_for(raw)
        index = part.index
        st = index.get(raw)
        latest = st.last if st is not None and st.count else 0
        if index.damaged or index.damaged_unknown:  # (the only cost to a get of a bucket without damage)
            if not revision:
                part.refuse_damaged_last(raw, latest, self._newest(topic, subject), "revision", "revision")
            elif revision == latest and index.damage_since(raw, latest) is not None:
                latest = 0  # an older revision than a damaged one: not the latest
        offset = revision or latest
        try:
            rec = part.log.read_live(offset) if offset > 0 else None
        except CorruptedRecord:
            self._refuse_damaged(topic, part, subject, revision, offset)  # found damaged by this read
            raise
        if rec is not None:
            created, ttl, subject_at, headers_at, payload_at, end = record_spans(rec)
            if rec[subject_at:headers_at] != raw:
                rec = None  # another key's revision
        if rec is None:
            if offset > 0 and part.log.is_corrupt(offset):
                self._refuse_damaged(topic, part, subject, revision, offset)
            what = f"revision {revision} of" if revision else "key"
            raise _NotFound(f"{what} {subject!r} not found in bucket {topic.name!r}")
        deadline = 0 if not ttl or ttl == TTL_NEVER else max(created + ttl * NS, part.refreshed.get(offset, 0))
        if deadline and now_ns >= deadline and kv["visibility"] == "never_return_expired":
            raise _NotFound(f"key {subject!r} expired in bucket {topic.name!r}")
        headers = decode_headers(rec[headers_at:payload_at]) if payload_at > headers_at else {}
        flags = index.flags_at(offset)
        op = _operation(flags, headers) if flags & (MARKER | TOMBSTONE) else "PUT"
        epoch = 0
        if op == "PUT" and offset == latest and kv["refresh"] == "on_read_and_write" and deadline and now_ns < deadline:
            deadline, epoch = self.refresh(topic, part, offset, ttl, now_ns)
        return offset, offset == latest, rec, created, ttl, payload_at, end, headers, op, deadline, epoch

    @staticmethod
    def _newest(topic: Topic, subject: str) -> str:
        """How the errors about a key's newest revision name it."""
        return f"the newest revision of key {subject!r} in bucket {topic.name!r}"

    def _refuse_damaged(self, topic: Topic, part: Partition, subject: str, revision: int, offset: int) -> None:
        """The record at ``offset`` that a read of ``subject`` at ``revision`` (0: its
        newest) reached is damaged: raise the error that names it.

        Raises:
            CorruptedRecord: always.
        """
        if not revision:  # (the read noted it: ``Broker.open_topic_storage``'s on_corrupt)
            part.refuse_damaged_last(subject.encode(), offset, self._newest(topic, subject), "revision", "revision")
        raise CorruptedRecord(
            f"revision {offset} of key {subject!r} in bucket {topic.name!r} cannot be read: the record is damaged "
            "(`ttlbroker repair` writes it off)",
            offset,
        )

    def refresh(self, topic: Topic, part: Partition, offset: int, ttl: int, now_ns: int) -> tuple[int, int]:
        """Push the key's deadline to ``now + ttl`` (O(1); no new deadline entry).
        Returns the new deadline and the epoch of a lease write (0: none needed)."""
        new = now_ns + ttl * NS
        if new > part.refreshed.get(offset, 0):
            part.refreshed[offset] = new
        consumers = topic.consumers
        if consumers is None:
            return new, 0
        name = f"{LEASE_PREFIX}{offset}"
        if (consumers.get(name, part.number) or 0) >= new:
            return new, 0
        headroom = max(NS, ttl * NS // 10)
        consumers.store(name, part.number, new + headroom)
        return new, self.committer.note_write(consumers)

    def touch(self, topic: Topic, subject: str, now_ns: int) -> tuple[dict[str, Any], int]:
        """Extend the key's TTL from now, whatever the refresh policy (no new revision).

        Raises:
            NotABucketError, MessageNotFoundError (absent, deleted or expired).
        """
        kv = self.bucket(topic)
        raw = subject.encode()
        part = topic.partition_for(raw)
        st = part.index.get(raw)
        offset = st.last if st is not None and st.count else 0
        part.refuse_damaged_last(raw, offset, self._newest(topic, subject), "revision", "revision")
        if not offset or part.index.flags_at(offset) & (MARKER | TOMBSTONE):
            raise _NotFound(f"key {subject!r} not found in bucket {topic.name!r}")
        try:
            info = read_record_info(part.log.get(offset), 0)
        except CorruptedRecord:
            self._refuse_damaged(topic, part, subject, 0, offset)  # found damaged by this read
            raise
        deadline = self.deadline(part, offset, info.timestamp, info.ttl)
        if deadline and now_ns >= deadline and kv["visibility"] == "never_return_expired":
            raise _NotFound(f"key {subject!r} expired in bucket {topic.name!r}")
        epoch = 0
        if deadline:
            deadline, epoch = self.refresh(topic, part, offset, info.ttl, now_ns)
        remaining = max(0, (deadline - now_ns) // 1_000_000) if deadline else None
        return {"subject": subject, "revision": offset, "deadline": deadline, "ttl_remaining_ms": remaining}, epoch

    def keys(self, topic: Topic, subject_filter: str, now_ns: int) -> list[str]:
        """Subjects (under the filter) whose latest message is a value, not a
        tombstone or a marker (and, with ``never_return_expired``, not expired),
        and those whose latest message is known to be a damaged record (what it
        was cannot be told; a get of it says it is damaged)."""
        kv = self.bucket(topic)
        ftokens = tuple(subject_filter.split("."))
        hide_expired = kv["visibility"] == "never_return_expired"
        out = []
        for part in topic.partitions:
            damaged = set()
            for raw, offset in part.index.damaged.items():
                st = part.index.get(raw)
                if (st is None or not st.count or offset >= st.last) and part.log.is_corrupt(offset):
                    damaged.add(raw)
                    text = raw.decode(errors="replace")
                    if subject_matches(ftokens, text.split(".")):
                        out.append(text)
            for raw, st in part.index.subjects.items():
                if not st.count or part.index.flags_at(st.last) & (MARKER | TOMBSTONE):
                    continue
                if damaged and raw in damaged:
                    continue  # listed above
                text = raw.decode()
                if not subject_matches(ftokens, text.split(".")):
                    continue
                if hide_expired:
                    try:
                        info = read_record_info(part.log.get(st.last), 0)
                    except CorruptedRecord:
                        out.append(text)  # found damaged by this read: listed as above
                        continue
                    deadline = self.deadline(part, st.last, info.timestamp, info.ttl)
                    if deadline and now_ns >= deadline:
                        continue
                out.append(text)
        return sorted(out)
