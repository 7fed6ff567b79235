"""Responses and pushes: what the broker sends, with their payload layouts.

A successful response has status 0 and the payload of the class that
:data:`RESPONSE_TYPES` names for the command. An error response has a non-zero
status (an :class:`ErrorCode`) and a UTF-8 message as its whole payload. A push has
the PUSH flag, a :class:`PushKind` as its code, and correlation id 0.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import msgpack

from ._codes import Command, PushKind
from ._base import _Response
from ._consumers import PullBatch
from ._errors import BrokerError, ErrorCode
from ._frames import FLAG_RESPONSE, encode_frame
from ._records import Message, decode_records, encode_body, encode_record
from ._wire import Reader, malformed, pack_map, short_str, u16, u32, u64

__all__ = [
    "Empty",
    "HandshakeOk",
    "InfoMap",
    "Ack",
    "Acks",
    "FetchResult",
    "PurgeResult",
    "ConsumerOffset",
    "TopicDetails",
    "StreamDetails",
    "StreamList",
    "TopicList",
    "Delivery",
    "Goodbye",
    "delivery_entry",
    "encode_uniform_acks",
    "uniform_ack_frames",
    "info_map_frame",
    "encode_delivery",
    "delivery_reply",
    "RESPONSE_TYPES",
    "PUSH_TYPES",
]

_U32 = struct.Struct("<I")
_EMPTY_MAP = _U32.pack(0)
#: One packer for :meth:`InfoMap.pack` (``pack_map``'s options; it resets itself
#: after each map, and after a failed one).
_PACKER = msgpack.Packer(use_bin_type=True)


@dataclass(frozen=True, slots=True)
class Empty(_Response):
    """(empty)"""

    def encode(self) -> bytes:
        return b""

    @classmethod
    def decode(cls, payload: bytes) -> Empty:
        if payload:
            raise malformed(f"expected an empty response, got {len(payload)} bytes")
        return cls()


@dataclass(frozen=True, slots=True)
class HandshakeOk(_Response):
    """``u16 version | map server_info``"""

    version: int
    info: dict[str, object] = field(default_factory=dict)

    def encode(self) -> bytes:
        return u16(self.version) + pack_map(self.info)

    @classmethod
    def decode(cls, payload: bytes) -> HandshakeOk:
        r = Reader(payload, "HANDSHAKE response")
        out = cls(r.u16(), r.map())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class InfoMap(_Response):
    """``map values`` (server info, stats)"""

    values: dict[str, object] = field(default_factory=dict)

    def encode(self) -> bytes:
        return pack_map(self.values)

    @staticmethod
    def pack(values: dict[str, object]) -> bytes:
        """The payload of ``InfoMap(values)``, byte for byte, without the object and
        with one packer kept for every call (a KV get's answer, once per get). For
        maps of plain values (str, bytes, int, bool, None, plain lists and dicts):
        packing them runs no Python code, so no other caller can interleave."""
        if not values:
            return _EMPTY_MAP
        raw = _PACKER.pack(values)
        return _U32.pack(len(raw)) + raw

    @classmethod
    def decode(cls, payload: bytes) -> InfoMap:
        return cls(cls.values_of(payload))

    @staticmethod
    def values_of(payload: bytes) -> dict[str, Any]:
        """The map of an ``InfoMap`` payload without the object: one unpack when
        the length prefix spans the rest of the payload and holds a map; anything
        else goes through the Reader, which refuses it with the error naming what
        is wrong (the same map or the same refusal either way)."""
        if len(payload) > 4 and _U32.unpack_from(payload)[0] == len(payload) - 4:
            try:
                value = msgpack.unpackb(payload[4:], raw=False, strict_map_key=True)
            except Exception:  # msgpack raises several unrelated types; the Reader names it
                value = None
            if value.__class__ is dict:
                return value
        r = Reader(payload, "info response")
        out = r.map(limit=len(payload))  # a KV value or a key list can be large
        r.end()
        return out


class Ack(NamedTuple):
    """Where one published message went, or why it did not.

    ``status`` is 0 on success; ``DUPLICATE_MESSAGE`` (6014) is a success too: the
    message's ``Nats-Msg-Id`` was already stored within the topic's duplicate window,
    nothing was stored again, and the ack names the original (``duplicate`` is True,
    ``error`` None). Any other status is a refusal and ``error`` the matching
    BrokerError.
    """

    stream_id: int
    topic_id: int
    partition: int
    offset: int
    status: int
    error: BrokerError | None = None

    @property
    def ok(self) -> bool:
        """The message is stored (now, or earlier: a duplicate)."""
        return self.status == 0 or self.status == _DUPLICATE

    @property
    def duplicate(self) -> bool:
        """Not stored again: ``partition`` and ``offset`` are the original's."""
        return self.status == _DUPLICATE


@dataclass(frozen=True, slots=True)
class Acks(_Response):
    """One ack per message of a PUBLISH, in the order sent, as columns::

        u32 count
        u32 stream_id[count] | u32 topic_id[count] | u32 partition[count]
        u64 offset[count]    | u16 status[count]
        u32 error_count | error_count × (u32 index | u16 len | UTF-8 message)

    A message not stored has stream, topic, partition and offset 0 and a non-zero
    status; the error list gives the readable message for each such index. A
    duplicate (status ``DUPLICATE_MESSAGE``) is the exception: it counts as stored and
    carries the original's stream, topic, partition and offset.
    Columns are built and read with one ``struct`` call each, so acks cost nothing
    per message on either side.
    """

    stream_ids: Sequence[int]
    topic_ids: Sequence[int]
    partitions: Sequence[int]
    offsets: Sequence[int]
    statuses: Sequence[int]
    errors: dict[int, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        n = len(self.offsets)
        parts = [
            u32(n),
            struct.pack(f"<{n}I", *self.stream_ids),
            struct.pack(f"<{n}I", *self.topic_ids),
            struct.pack(f"<{n}I", *self.partitions),
            struct.pack(f"<{n}Q", *self.offsets),
            struct.pack(f"<{n}H", *self.statuses),
            u32(len(self.errors)),
        ]
        for index, message in sorted(self.errors.items()):  # in index order: the same acks, the same bytes
            raw = message.encode()[:0xFFFF]
            parts.append(u32(index) + u16(len(raw)) + raw)
        return b"".join(parts)

    @staticmethod
    def first(payload: bytes) -> Ack:
        """The first ack of an Acks payload (a publish of one message): one unpack
        when it holds one ack without an error text, the common case.

        Raises:
            BrokerError: MALFORMED_PAYLOAD (as ``decode``).
        """
        if len(payload) == _ONE_ACK.size:
            n, stream_id, topic_id, partition, offset, status, errors = _ONE_ACK.unpack(payload)
            if n == 1 and not errors and (not status or status == _DUPLICATE):
                return Ack(stream_id, topic_id, partition, offset, status)
        return Acks.decode(payload)[0]

    @classmethod
    def decode(cls, payload: bytes) -> Acks:
        r = Reader(payload, "PUBLISH acks")
        n = r.u32()
        try:
            pos = r.pos
            stream_ids = struct.unpack_from(f"<{n}I", payload, pos)
            topic_ids = struct.unpack_from(f"<{n}I", payload, pos + 4 * n)
            partitions = struct.unpack_from(f"<{n}I", payload, pos + 8 * n)
            offsets = struct.unpack_from(f"<{n}Q", payload, pos + 12 * n)
            statuses = struct.unpack_from(f"<{n}H", payload, pos + 20 * n)
        except struct.error:
            raise malformed(f"PUBLISH acks: payload too short for {n} acks") from None
        r.pos = pos + 22 * n
        errors = {}
        for _ in range(r.u32()):
            index = r.u32()
            errors[index] = r.raw(r.u16()).decode(errors="replace")
        r.end()
        return cls(stream_ids, topic_ids, partitions, offsets, statuses, errors)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> Ack:
        status = self.statuses[i]
        error = BrokerError.from_code(status, self.errors.get(i % len(self), "")) if status and status != _DUPLICATE else None
        return Ack(self.stream_ids[i], self.topic_ids[i], self.partitions[i], self.offsets[i], status, error)

    def __iter__(self) -> Iterator[Ack]:
        return (self[i] for i in range(len(self)))

    @property
    def ok(self) -> bool:
        """True when every message was stored (duplicates included)."""
        return not any(s and s != _DUPLICATE for s in self.statuses)

    @property
    def failed(self) -> list[Ack]:
        return [self[i] for i, s in enumerate(self.statuses) if s and s != _DUPLICATE]

    @property
    def duplicates(self) -> list[Ack]:
        """The acks of messages not stored again (their ``Nats-Msg-Id`` was)."""
        return [self[i] for i, s in enumerate(self.statuses) if s == _DUPLICATE]

    def raise_for_errors(self) -> Acks:
        """Raise the first message's error, if any message failed; else return self."""
        for i, s in enumerate(self.statuses):
            if s and s != _DUPLICATE:
                err = self[i].error
                assert err is not None  # a refusal's status always has its error
                raise err
        return self


_DUPLICATE = int(ErrorCode.DUPLICATE_MESSAGE)
#: The Acks payload of one message without an error text (count, the five columns,
#: error_count).
_ONE_ACK = struct.Struct("<IIIIQHI")


#: A response frame holding the acks of one message (frame header, then ``_ONE_ACK``).
_ONE_ACK_FRAME = struct.Struct("<IHHII" + _ONE_ACK.format[1:])


#: A response frame's header followed by an ``InfoMap`` payload's length prefix.
_MAP_FRAME_HEAD = struct.Struct("<IHHIII")


def info_map_frame(code: int, correlation_id: int, values: dict[str, object]) -> bytes:
    """The successful response frame to request ``code`` whose payload is
    ``InfoMap(values)``: ``encode_frame(code, FLAG_RESPONSE, correlation_id, 0,
    InfoMap.pack(values))``, byte for byte, with one struct pack for the frame's
    header and the map's length (a KV get's answer in a run of gets). For the maps
    :meth:`InfoMap.pack` takes."""
    if not values:
        return encode_frame(code, FLAG_RESPONSE, correlation_id, 0, _EMPTY_MAP)
    raw = _PACKER.pack(values)
    n = len(raw)
    return _MAP_FRAME_HEAD.pack(n + 16, code, FLAG_RESPONSE, correlation_id, 0, n) + raw


def uniform_ack_frames(
    requests: Iterable[tuple[int, int]], stream_id: int, topic_id: int, partition: int, first_offset: int
) -> bytes:
    """The PUBLISH response frames of consecutive requests, ``(correlation id,
    message count)`` each, whose messages were all stored, in order, in one
    partition from ``first_offset`` on: what ``encode_uniform_acks`` in a response
    frame gives for each, joined. One struct pack per frame for the usual request
    of one message."""
    pack = _ONE_ACK_FRAME.pack
    length = _ONE_ACK_FRAME.size - 4
    code = int(Command.PUBLISH)
    out = []
    offset = first_offset
    for corr, count in requests:
        if count == 1:
            out.append(pack(length, code, FLAG_RESPONSE, corr, 0, 1, stream_id, topic_id, partition, offset, 0, 0))
        else:
            payload = encode_uniform_acks(stream_id, topic_id, partition, offset, count)
            out.append(encode_frame(code, FLAG_RESPONSE, corr, 0, payload))
        offset += count
    return b"".join(out)


def encode_uniform_acks(stream_id: int, topic_id: int, partition: int, first_offset: int, count: int) -> bytes:
    """The Acks payload for ``count`` messages all stored, in order, in one partition
    from ``first_offset`` on (the common case), built without a per-message loop."""
    return b"".join(
        (
            _U32.pack(count),
            _U32.pack(stream_id) * count,
            _U32.pack(topic_id) * count,
            _U32.pack(partition) * count,
            struct.pack(f"<{count}Q", *range(first_offset, first_offset + count)),
            bytes(2 * count),
            _U32.pack(0),
        )
    )


@dataclass(frozen=True, slots=True)
class FetchResult(_Response):
    """``u32 stream_id | u32 topic_id | u32 partition | u64 next_offset | u64 first_offset | u64 last_offset | u32 count | records``

    ``records`` are ``count`` records back to back, byte for byte as stored.
    ``next_offset`` is where to continue; ``first_offset`` and ``last_offset`` are
    the partition's oldest live and newest offsets (0 when empty).
    """

    stream_id: int
    topic_id: int
    partition: int
    next_offset: int
    first_offset: int
    last_offset: int
    count: int
    records: bytes = field(repr=False)

    _HEAD: ClassVar[struct.Struct] = struct.Struct("<IIIQQQI")

    def encode(self) -> bytes:
        return self._HEAD.pack(
            self.stream_id, self.topic_id, self.partition, self.next_offset, self.first_offset, self.last_offset, self.count
        ) + self.records

    @staticmethod
    def encode_parts(
        stream_id: int, topic_id: int, partition: int, next_offset: int, first: int, last: int, count: int,
        records: Sequence[bytes | memoryview],
    ) -> bytes:
        """Encode without first joining the records (the broker's fetch path)."""
        return b"".join((FetchResult._HEAD.pack(stream_id, topic_id, partition, next_offset, first, last, count), *records))

    @classmethod
    def decode(cls, payload: bytes) -> FetchResult:
        try:
            stream_id, topic_id, partition, next_offset, first, last, count = cls._HEAD.unpack_from(payload, 0)
        except struct.error:
            raise malformed("FETCH result: payload shorter than its header") from None
        return cls(stream_id, topic_id, partition, next_offset, first, last, count, payload[cls._HEAD.size :])

    def messages(self) -> list[Message]:
        """Decode the records (one pass, no copies of the whole buffer)."""
        return decode_records(self.records, 0, len(self.records), self.count, self.partition, self.stream_id, self.topic_id)


@dataclass(frozen=True, slots=True)
class PurgeResult(_Response):
    """``u64 purged`` (messages removed)"""

    purged: int

    def encode(self) -> bytes:
        return u64(self.purged)

    @classmethod
    def decode(cls, payload: bytes) -> PurgeResult:
        r = Reader(payload, "PURGE result")
        out = cls(r.u64())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class ConsumerOffset(_Response):
    """``u64 offset``"""

    offset: int

    def encode(self) -> bytes:
        return u64(self.offset)

    @classmethod
    def decode(cls, payload: bytes) -> ConsumerOffset:
        r = Reader(payload, "consumer offset")
        out = cls(r.u64())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class TopicDetails(_Response):
    """``u32 id | u32 partitions_count | u32 message_expiry | u64 size | u64 messages_count | u8 name_len | name | map extra``

    The fixed part is Apache Iggy's topic layout; ``extra`` carries the stream id,
    the options (subjects and policies) and per-partition state.
    """

    id: int
    partitions_count: int
    message_expiry: int
    size: int
    messages_count: int
    name: str
    extra: dict[str, object] = field(default_factory=dict)

    _HEAD: ClassVar[struct.Struct] = struct.Struct("<IIIQQ")

    def encode(self) -> bytes:
        return (
            self._HEAD.pack(self.id, self.partitions_count, self.message_expiry, self.size, self.messages_count)
            + short_str(self.name, "topic name")
            + pack_map(self.extra)
        )

    @classmethod
    def read(cls, r: Reader) -> TopicDetails:
        return cls(r.u32(), r.u32(), r.u32(), r.u64(), r.u64(), r.short_str("topic name"), r.map())

    @classmethod
    def decode(cls, payload: bytes) -> TopicDetails:
        r = Reader(payload, "topic details")
        out = cls.read(r)
        r.end()
        return out

    @property
    def options(self) -> dict[str, Any]:
        return self.extra.get("options", {})  # type: ignore[return-value]  # the broker writes a map there

    @property
    def stream_id(self) -> int:
        return self.extra.get("stream_id", 0)  # type: ignore[return-value]  # the broker writes an integer there


@dataclass(frozen=True, slots=True)
class StreamDetails(_Response):
    """``u32 id | u32 topics_count | u64 size | u64 messages_count | u8 name_len | name | topics``

    The fixed part is Apache Iggy's stream layout. ``topics`` is ``topics_count``
    topic details back to back when the response answers GET_STREAM or
    CREATE_STREAM, and absent inside a LIST_STREAMS response.
    """

    id: int
    topics_count: int
    size: int
    messages_count: int
    name: str
    topics: tuple[TopicDetails, ...] = ()

    _HEAD: ClassVar[struct.Struct] = struct.Struct("<IIQQ")

    def encode(self) -> bytes:
        return self.encode_summary() + b"".join(t.encode() for t in self.topics)

    def encode_summary(self) -> bytes:
        return self._HEAD.pack(self.id, self.topics_count, self.size, self.messages_count) + short_str(self.name, "stream name")

    @classmethod
    def read(cls, r: Reader, with_topics: bool) -> StreamDetails:
        sid, count, size, msgs = r.u32(), r.u32(), r.u64(), r.u64()
        name = r.short_str("stream name")
        topics = tuple(TopicDetails.read(r) for _ in range(count)) if with_topics else ()
        return cls(sid, count, size, msgs, name, topics)

    @classmethod
    def decode(cls, payload: bytes) -> StreamDetails:
        r = Reader(payload, "stream details")
        out = cls.read(r, with_topics=True)
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class StreamList(_Response):
    """stream summaries back to back (no topics), until the end of the payload"""

    streams: tuple[StreamDetails, ...]

    def encode(self) -> bytes:
        return b"".join(s.encode_summary() for s in self.streams)

    @classmethod
    def decode(cls, payload: bytes) -> StreamList:
        r = Reader(payload, "stream list")
        out = []
        while r.remaining():
            out.append(StreamDetails.read(r, with_topics=False))
        return cls(tuple(out))


@dataclass(frozen=True, slots=True)
class TopicList(_Response):
    """topic details back to back, until the end of the payload"""

    topics: tuple[TopicDetails, ...]

    def encode(self) -> bytes:
        return b"".join(t.encode() for t in self.topics)

    @classmethod
    def decode(cls, payload: bytes) -> TopicList:
        r = Reader(payload, "topic list")
        out = []
        while r.remaining():
            out.append(TopicDetails.read(r))
        return cls(tuple(out))


# -- pushes ------------------------------------------------------------------------

_ENTRY = struct.Struct("<III")
_DELIVERY_HEAD = struct.Struct("<II")
_U16 = struct.Struct("<H")


def delivery_entry(stream_id: int, topic_id: int, partition: int) -> bytes:
    """The 12 bytes that precede each record of a delivery."""
    return _ENTRY.pack(stream_id, topic_id, partition)


def encode_delivery(subscription_id: int, count: int, parts: Sequence[bytes | memoryview]) -> bytes:
    """A DELIVERY payload from already encoded entries (entry head + record each)."""
    return b"".join((_DELIVERY_HEAD.pack(subscription_id, count), *parts))


def delivery_reply(reply: bytes) -> bytes:
    """What follows the messages of a DELIVERY whose messages carry the reply subject
    ``reply`` (a request's): ``u16 reply_len | reply``. Only for a subscription made
    with ``SUBSCRIBE_REPLIES``.

    Raises:
        struct.error: a reply subject over 65,535 bytes (a caller bug: a NATS control
            line is shorter).
    """
    return _U16.pack(len(reply)) + reply


@dataclass(frozen=True, slots=True)
class Delivery(_Response):
    """``u32 subscription_id | u32 count | count × (u32 stream_id | u32 topic_id | u32 partition | record) [| u16 reply_len | reply]``

    Messages on subjects no topic captures have stream, topic, partition and offset 0.
    The reply subject (only to a subscription made with ``SUBSCRIBE_REPLIES``, when
    the messages have one) is every message's :attr:`Message.reply`.
    """

    PUSH: ClassVar[PushKind] = PushKind.DELIVERY
    subscription_id: int
    messages: tuple[Message, ...]
    reply: str | None = None

    def encode(self) -> bytes:
        parts = [
            delivery_entry(m.stream_id, m.topic_id, m.partition)
            + encode_record(m.offset, m.timestamp, encode_body(m.subject, m.payload, m.headers_raw, m.ttl, m.flags))
            for m in self.messages
        ]
        if self.reply is not None:
            parts.append(delivery_reply(self.reply.encode()))
        return encode_delivery(self.subscription_id, len(self.messages), parts)

    @classmethod
    def decode(cls, payload: bytes) -> Delivery:
        try:
            sid, count = _DELIVERY_HEAD.unpack_from(payload, 0)
            pos = 8
            out = []
            for _ in range(count):
                stream_id, topic_id, partition = _ENTRY.unpack_from(payload, pos)
                (length,) = struct.unpack_from("<I", payload, pos + 12)
                end = pos + 12 + 4 + length
                out.extend(decode_records(payload, pos + 12, end, 1, partition, stream_id, topic_id))
                pos = end
        except struct.error:
            raise malformed("DELIVERY: payload truncated") from None
        if pos == len(payload):
            return cls(sid, tuple(out))
        return cls(sid, tuple(out), _reply_of(payload, pos, out))


def _reply_of(payload: bytes, pos: int, messages: list[Message]) -> str:
    """The reply subject after the messages of a DELIVERY, given to each of them."""
    try:
        (n,) = _U16.unpack_from(payload, pos)
    except struct.error:
        raise malformed("DELIVERY: bytes after the last message") from None
    if pos + 2 + n != len(payload) or not n:
        raise malformed("DELIVERY: bytes after the last message are not one reply subject")
    try:
        reply = payload[pos + 2 :].decode()
    except UnicodeDecodeError:
        raise malformed("DELIVERY: the reply subject is not UTF-8") from None
    for m in messages:
        m._reply = reply
    return reply


@dataclass(frozen=True, slots=True)
class Goodbye(_Response):
    """UTF-8 reason (the frame's status carries the ErrorCode)"""

    PUSH: ClassVar[PushKind] = PushKind.GOODBYE
    reason: str

    def encode(self) -> bytes:
        return self.reason.encode()

    @classmethod
    def decode(cls, payload: bytes) -> Goodbye:
        return cls(payload.decode(errors="replace"))


RESPONSE_TYPES: dict[int, type[_Response]] = {
    Command.HANDSHAKE: HandshakeOk,
    Command.PING: Empty,
    Command.SERVER_INFO: InfoMap,
    Command.STATS: InfoMap,
    Command.PUBLISH: Acks,
    Command.FETCH: FetchResult,
    Command.GET_LAST: FetchResult,
    Command.DELETE_MESSAGE: Empty,
    Command.PURGE: PurgeResult,
    Command.SUBSCRIBE: Empty,
    Command.UNSUBSCRIBE: Empty,
    Command.STORE_CONSUMER_OFFSET: Empty,
    Command.GET_CONSUMER_OFFSET: ConsumerOffset,
    Command.DELETE_CONSUMER_OFFSET: Empty,
    Command.GET_STREAM: StreamDetails,
    Command.LIST_STREAMS: StreamList,
    Command.CREATE_STREAM: StreamDetails,
    Command.DELETE_STREAM: Empty,
    Command.UPDATE_STREAM: StreamDetails,
    Command.GET_TOPIC: TopicDetails,
    Command.LIST_TOPICS: TopicList,
    Command.CREATE_TOPIC: TopicDetails,
    Command.DELETE_TOPIC: Empty,
    Command.UPDATE_TOPIC: TopicDetails,
    Command.EXPORT: InfoMap,
    Command.KV_GET: InfoMap,
    Command.KV_TOUCH: InfoMap,
    Command.KV_KEYS: InfoMap,
    Command.CREATE_CONSUMER: InfoMap,
    Command.UPDATE_CONSUMER: InfoMap,
    Command.CONSUMER_INFO: InfoMap,
    Command.LIST_CONSUMERS: InfoMap,
    Command.DELETE_CONSUMER: Empty,
    Command.PULL: PullBatch,
    Command.ACK: Empty,
    Command.JOIN_GROUP: InfoMap,
    Command.LEAVE_GROUP: Empty,
    Command.END_PULLS: Empty,
    Command.REDRIVE: InfoMap,
}

PUSH_TYPES: dict[int, type[_Response]] = {
    PushKind.DELIVERY: Delivery, PushKind.GOODBYE: Goodbye, PushKind.PULL_MESSAGES: PullBatch,
}

