"""KV buckets in the client: :class:`KeyValue`, and the methods of ``Client`` that
give one (:class:`KVMethods`: ``kv_create``, ``kv``), the same on trio and asyncio.

A bucket ``b`` is the topic ``kv/b`` capturing ``$KV.b.>``; a key ``k`` is the subject
``$KV.b.k``. Writes are publishes with the KV headers (``KV-Operation: DEL`` for a
delete, ``KV-Operation: PURGE`` with ``Nats-Rollup: sub`` for a purge,
``Nats-Expected-Last-Subject-Sequence`` for create and update); reads go through the
broker's KV commands, which apply the bucket's refresh and visibility rules.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import protocol as P
from protocol import Command, ErrorCode, Identifier, error_class

from ._connection import RECONNECTED
from ._requests import Requests

__all__ = ["KeyValue", "KVMethods", "Entry", "KV_STREAM", "validate_key", "validate_bucket"]

#: The stream that holds every bucket.
KV_STREAM = "kv"
_KEY_RE = re.compile(r"[-/_=.a-zA-Z0-9]+")
#: Every valid key, and nothing else: dot-separated non-empty runs of the key characters.
_VALID_KEY = re.compile(r"[-/_=a-zA-Z0-9]+(?:\.[-/_=a-zA-Z0-9]+)*").fullmatch
_BUCKET_RE = re.compile(r"[a-zA-Z0-9_-]+")
_InvalidKey = error_class(ErrorCode.INVALID_KEY)
_KV_GET = Command.KV_GET
_get_payload = P.KvGet.payload
_values_of = P.InfoMap.values_of
_NotFound = error_class(ErrorCode.MESSAGE_NOT_FOUND)
#: A bucket's settings as the topic options that hold them, and as ``kv_create``
#: names them (the words of its errors).
_BUCKET_SETTINGS = (
    ("max_msgs_per_subject", "history"), ("subject_delete_marker_ttl", "marker_ttl"), ("kv ttl", "ttl"),
    ("kv refresh", "refresh"), ("kv visibility", "visibility"),
)


def validate_key(key: str) -> str:
    """The NATS KV key rule: letters, digits and ``-/_=.``, no leading or trailing dot.

    Raises:
        InvalidKeyError: with what is wrong.
    """
    if key.__class__ is str and _VALID_KEY(key):
        return key  # one match for a valid key; the checks below say what is wrong
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise _InvalidKey(f"invalid key {key!r}: keys are letters, digits and -/_=. only")
    if key.startswith(".") or key.endswith(".") or ".." in key:
        raise _InvalidKey(f"invalid key {key!r}: no leading, trailing or double dot")
    return key


def validate_bucket(name: str) -> str:
    if not isinstance(name, str) or not _BUCKET_RE.fullmatch(name):
        raise _InvalidKey(f"invalid bucket name {name!r}: letters, digits, '_' and '-' only")
    return name.lower()


@dataclass(frozen=True)
class Entry:
    """One revision of a key.

    ``operation`` is ``PUT``, ``DEL``, ``PURGE`` or ``EXPIRED`` (the subject delete
    marker left when the key's TTL or the bucket's ran out). ``ttl_remaining`` is in
    seconds (None: no TTL).
    """

    bucket: str
    key: str
    value: bytes
    revision: int
    created: int  # ns since the epoch
    operation: str = "PUT"
    ttl_remaining: float | None = None
    headers: dict[str, str] = field(default_factory=dict)


_new = object.__new__
_set = object.__setattr__


def _make_entry(
    bucket: str, key: str, value: bytes, revision: int, created: int, operation: str, ttl_remaining: float | None,
    headers: dict[str, str],
) -> Entry:
    """``Entry(...)`` with every field given, without the frozen dataclass's
    ``__init__`` (one ``object.__setattr__`` per field; a get makes one entry)."""
    e = _new(Entry)
    _set(e, "__dict__", {
        "bucket": bucket, "key": key, "value": value, "revision": revision, "created": created,
        "operation": operation, "ttl_remaining": ttl_remaining, "headers": headers,
    })
    return e


def _operation(m: P.Message) -> str:
    if m.is_marker:
        return {"MaxAge": "EXPIRED", "Remove": "DEL", "Purge": "PURGE"}[m.marker_reason.header_value]
    return m.headers.get("KV-Operation", "PUT")


class KeyValue:
    """A bucket. Get one with ``await client.kv_create(...)`` or ``await client.kv(name)``."""

    def __init__(self, client: Requests, bucket: str, info: P.TopicDetails) -> None:
        self._client = client
        self.bucket = bucket
        self.info = info
        self._prefix = f"$KV.{bucket}."
        self._stream = Identifier.of(KV_STREAM)
        self._topic = Identifier.of(bucket)
        self._target = self._stream.encode() + self._topic.encode()

    def subject(self, key: str) -> str:
        return self._prefix + validate_key(key)

    def _from_message(self, m: P.Message) -> Entry:
        return Entry(self.bucket, m.subject[len(self._prefix) :], m.payload, m.offset, m.timestamp, _operation(m), None, m.headers)

    # -- writes ----------------------------------------------------------------------

    @staticmethod
    def _ttl(ttl: int | str | None, headers: dict[str, str]) -> int | str | None:
        """Whole seconds and ``never`` travel in the TTL field, durations as a header."""
        if isinstance(ttl, str) and ttl.lower() != "never":
            headers["Nats-TTL"] = ttl
            return None
        return ttl

    async def put(self, key: str, value: bytes | str, *, ttl: int | str | None = None) -> int:
        """Store a value; returns its revision. ``ttl``: seconds, ``never``, or a
        duration (``90s``); None: the bucket's default."""
        headers: dict[str, str] = {}
        ttl = self._ttl(ttl, headers)
        ack = await self._client.publish(self.subject(key), value, headers=headers or None, ttl=ttl)
        assert ack is not None
        return ack.offset

    async def update(self, key: str, value: bytes | str, last: int, *, ttl: int | str | None = None) -> int:
        """Compare-and-set: store only if the key's latest revision is ``last``.

        Raises:
            WrongLastSequenceError: another revision came first.
        """
        headers = {"Nats-Expected-Last-Subject-Sequence": str(last)}
        ttl = self._ttl(ttl, headers)
        ack = await self._client.publish(self.subject(key), value, headers=headers, ttl=ttl)
        assert ack is not None
        return ack.offset

    async def create(self, key: str, value: bytes | str, *, ttl: int | str | None = None) -> int:
        """Store only if the key holds no value (absent, deleted, purged or expired).

        Raises:
            WrongLastSequenceError: the key exists ("key exists").
        """
        try:
            return await self.update(key, value, 0, ttl=ttl)
        except P.BrokerError as err:
            if err.code != ErrorCode.WRONG_LAST_SEQUENCE:
                raise
        try:
            latest = await self._get_raw(key)
        except P.BrokerError as missing:
            if missing.code == ErrorCode.MESSAGE_NOT_FOUND:  # expired but not yet removed
                raise error_class(ErrorCode.WRONG_LAST_SEQUENCE)(f"key {key!r} exists (expiring)") from None
            raise
        if latest.operation == "PUT":
            raise error_class(ErrorCode.WRONG_LAST_SEQUENCE)(f"key {key!r} exists (revision {latest.revision})")
        return await self.update(key, value, latest.revision, ttl=ttl)

    async def delete(self, key: str) -> int:
        """Leave a ``KV-Operation: DEL`` tombstone (history is kept)."""
        ack = await self._client.publish(self.subject(key), b"", headers={"KV-Operation": "DEL"})
        assert ack is not None
        return ack.offset

    async def purge(self, key: str) -> int:
        """Leave a ``KV-Operation: PURGE`` tombstone that rolls up the key's history."""
        ack = await self._client.publish(self.subject(key), b"", headers={"KV-Operation": "PURGE", "Nats-Rollup": "sub"})
        assert ack is not None
        return ack.offset

    # -- reads -----------------------------------------------------------------------

    def _entry_of(self, raw: bytes) -> Entry:
        """The entry of a KV_GET answer, which comes as its raw payload
        (``RAW_RESPONSES`` in ``_connection.py``)."""
        d = _values_of(raw)
        remaining = d.get("ttl_remaining_ms")
        return _make_entry(
            self.bucket, d["subject"][len(self._prefix) :], d["value"], d["revision"], d["created"], d["operation"],
            None if remaining is None else remaining / 1000, d.get("headers") or {},
        )

    async def _get_raw(self, key: str, revision: int = 0) -> Entry:
        payload = _get_payload(self._target, self._prefix + validate_key(key), revision)
        return self._entry_of(await self._client._call(_KV_GET, payload))

    async def get(self, key: str, *, revision: int = 0) -> Entry:
        """The key's value (or one revision). With ``refresh = on_read_and_write`` a
        get of the latest revision restarts its TTL.

        Raises:
            MessageNotFoundError: absent, deleted, purged, or expired (and hidden).
        """
        # _get_raw written out: one coroutine per get, not two.
        payload = _get_payload(self._target, self._prefix + validate_key(key), revision)
        entry = self._entry_of(await self._client._call(_KV_GET, payload))
        if entry.operation != "PUT" and not revision:
            raise _NotFound(f"key {key!r} not found in bucket {self.bucket!r} ({entry.operation.lower()})")
        return entry

    async def touch(self, key: str) -> float | None:
        """Restart the key's TTL without writing a revision; returns the seconds left."""
        d = (await self._client._request(P.KvTouch(self._stream, self._topic, self.subject(key)))).values
        return None if d["ttl_remaining_ms"] is None else d["ttl_remaining_ms"] / 1000

    async def keys(self, pattern: str = ">") -> list[str]:
        """Keys that hold a value (matching ``pattern``, a filter over keys)."""
        d = (await self._client._request(P.KvKeys(self._stream, self._topic, self._prefix + pattern))).values
        return [k[len(self._prefix) :] for k in d["keys"]]

    async def history(self, key: str) -> list[Entry]:
        """Every stored revision of the key, oldest first (tombstones and markers too)."""
        subject = self.subject(key)
        out: list[Entry] = []
        offset = 1
        while True:
            page = await self._client.fetch(KV_STREAM, self.bucket, 0, offset, 1000, subject=subject)
            out.extend(self._from_message(m) for m in page.messages)
            if page.next_offset > page.last_offset or page.next_offset <= offset:
                return out
            offset = page.next_offset

    async def watch(self, keys: str = ">", *, include_current: bool = False) -> AsyncIterator[Entry]:
        """Puts, deletes, purges and expirations of matching keys as they happen;
        with ``include_current``, first the latest revision of every matching key.

        Across a reconnection of the client nothing is missed: what was written
        meanwhile is fetched from the bucket and given first (each revision once)."""
        subject = self._prefix + keys
        seen = 0  # the revisions up to this one have been given (or predate the watch)
        if not include_current:
            seen = (await self._client.fetch(KV_STREAM, self.bucket, 0, 1, 1)).last_offset
        sub = await self._client.subscribe(subject)
        sub._marks = True
        gaps = sub._gaps
        try:
            if include_current:
                latest: dict[str, Entry] = {}
                offset = 1
                while True:
                    page = await self._client.fetch(KV_STREAM, self.bucket, 0, offset, 1000, subject=subject)
                    for m in page.messages:
                        latest[m.subject] = self._from_message(m)
                    seen = max(seen, page.last_offset if page.next_offset > page.last_offset else page.next_offset - 1)
                    if page.next_offset > page.last_offset or page.next_offset <= offset:
                        break
                    offset = page.next_offset
                for entry in sorted(latest.values(), key=lambda e: e.revision):
                    if entry.operation == "PUT":
                        yield entry
            while True:
                try:
                    item = await sub._next_item()
                except StopAsyncIteration:
                    return
                if sub._gaps != gaps:  # reconnected: fetch what the gap held
                    gaps = sub._gaps
                    offset = seen + 1
                    while True:
                        page = await self._client.fetch(KV_STREAM, self.bucket, 0, offset, 1000, subject=subject)
                        for m in page.messages:
                            if m.offset > seen:
                                seen = m.offset
                                yield self._from_message(m)
                        if page.next_offset > page.last_offset or page.next_offset <= offset:
                            break
                        offset = page.next_offset
                if item is RECONNECTED or (item.offset and item.offset <= seen):
                    continue  # already given
                seen = max(seen, item.offset)
                yield self._from_message(item)
        finally:
            await sub.unsubscribe()

    async def status(self) -> dict[str, Any]:
        """The bucket's settings and state."""
        t = await self._client.get_topic(KV_STREAM, self.bucket)
        self.info = t
        opts = t.options
        return {
            "bucket": self.bucket,
            "history": opts.get("max_msgs_per_subject"),
            "marker_ttl": opts.get("subject_delete_marker_ttl"),
            **(opts.get("kv") or {}),
            "values": len(await self.keys()),
            "messages": t.messages_count,
            "bytes": t.size,
            "pending_expiries": t.extra.get("pending_expiries", 0),
        }


# -- the client's methods ---------------------------------------------------------------


class KVMethods(Requests):
    """The KV-bucket methods of :class:`~broker.client.Client`."""

    async def kv_create(
        self,
        bucket: str,
        *,
        history: int = 1,
        ttl: int = 0,
        refresh: str = "on_write",
        visibility: str = "never_return_expired",
        marker_ttl: int = 60,
        storage: str = "file",
    ) -> KeyValue:
        """Create a KV bucket (Flink FLIP-25's state TTL; ``docs/semantics.md``, "KV
        buckets").

        Args:
            history: revisions kept per key.
            ttl: default TTL of a key in seconds (0: keys live until deleted).
            refresh: ``on_write`` (a put restarts the TTL) or ``on_read_and_write``
                (a get does too).
            visibility: ``never_return_expired`` or ``return_expired_if_not_cleaned_up``.
            marker_ttl: how long the marker an expired key leaves stays, in seconds.
            storage: ``file`` or ``memory`` (the keys are gone after a restart).

        Raises:
            InvalidKeyError: a bad bucket name. TopicNameExistsError: it exists.
            InvalidTopicConfigError: a setting out of range (the message names it
                by these arguments' names).
        """
        name = validate_bucket(bucket)
        try:
            await self.create_stream(KV_STREAM)
        except P.BrokerError as err:
            if err.code != P.ErrorCode.STREAM_NAME_EXISTS:
                raise
        try:
            info = await self.create_topic(
                KV_STREAM, name, partitions=1, message_expiry=0, subjects=[f"$KV.{name}.>"],
                max_msgs_per_subject=history, allow_msg_ttl=True, allow_rollup=True,
                subject_delete_marker_ttl=marker_ttl, kv={"ttl": ttl, "refresh": refresh, "visibility": visibility},
                storage=storage,
            )
        except P.BrokerError as err:
            # The bucket is a topic of the stream kv: say it in the bucket's words.
            if err.code == ErrorCode.TOPIC_NAME_EXISTS:
                raise error_class(ErrorCode.TOPIC_NAME_EXISTS)(f"bucket {name!r} exists already") from None
            if err.code == ErrorCode.INVALID_TOPIC_CONFIG:
                text = err.message
                for option, argument in _BUCKET_SETTINGS:
                    text = text.replace(option, argument)
                raise error_class(ErrorCode.INVALID_TOPIC_CONFIG)(f"bucket {name!r}: {text}") from None
            raise
        return KeyValue(self, name, info)

    async def kv(self, bucket: str) -> KeyValue:
        """An existing bucket.

        Raises:
            TopicNotFoundError: no such bucket ("no bucket 'b'"). NotABucketError: the
                stream kv has a topic of that name that is not a bucket.
        """
        name = validate_bucket(bucket)
        try:
            info = await self.get_topic(KV_STREAM, name)
        except P.BrokerError as err:  # no stream kv (no bucket was ever made), or no such topic in it
            if err.code in (ErrorCode.STREAM_NOT_FOUND, ErrorCode.TOPIC_NOT_FOUND):
                raise error_class(ErrorCode.TOPIC_NOT_FOUND)(f"no bucket {name!r}") from None
            raise
        if not info.options.get("kv"):
            raise P.error_class(P.ErrorCode.NOT_A_BUCKET)(
                f"no bucket {name!r}: {KV_STREAM}/{name} is a topic that was not created as a KV bucket"
            )
        return KeyValue(self, name, info)
