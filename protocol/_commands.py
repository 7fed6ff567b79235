"""Requests: one frozen dataclass per command, with its payload layout.

Every class has ``CODE`` (its :class:`Command`), ``encode()`` giving the payload
bytes and ``decode(payload)`` building the object back (raising a
:class:`BrokerError` subclass, usually MalformedPayloadError, for bad input). The
layouts are written next to each class and in ``docs/protocol.md``; a test
round-trips every class with hypothesis.

Layout conventions: integers little-endian; ``ident`` is an identifier (``_names.py``);
``str8`` is ``u8 length | UTF-8``; ``map`` is ``u32 length | msgpack map``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._codes import HANDSHAKE_MAGIC, Command
from ._base import _Request
from ._consumers import CONSUMER_COMMANDS
from ._errors import ErrorCode, error_class
from ._names import Identifier
from ._wire import Reader, malformed, pack_map, short_str, u8, u16, u32, u64

__all__ = [
    "Handshake",
    "Ping",
    "GetServerInfo",
    "GetStats",
    "Publish",
    "PublishWithReply",
    "PUBLISH_ONE",
    "PUBLISH_REPLY",
    "Fetch",
    "GetLast",
    "DeleteMessage",
    "Purge",
    "Subscribe",
    "SUBSCRIBE_REPLIES",
    "Unsubscribe",
    "StoreConsumerOffset",
    "GetConsumerOffset",
    "DeleteConsumerOffset",
    "GetStream",
    "ListStreams",
    "CreateStream",
    "DeleteStream",
    "UpdateStream",
    "GetTopic",
    "ListTopics",
    "CreateTopic",
    "DeleteTopic",
    "UpdateTopic",
    "Export",
    "EXPORT_SEAL",
    "KvGet",
    "KvTouch",
    "KvKeys",
    "COMMAND_TYPES",
    "PUBLISH_NO_ACK",
]

_U64 = struct.Struct("<Q")
#: ``u8`` length prefixes, made once (a client's KV get encodes one per request).
_LENGTH_BYTE = tuple(bytes((n,)) for n in range(256))
#: The (stream, topic) identifiers of KV_GET payloads by their encoded bytes: a
#: client asks for the keys of a few buckets, each naming it the same way. Only
#: identifiers that decoded are kept; at most ``_KV_TARGETS_MAX``, forgotten all at
#: once when full.
_KV_TARGETS: dict[bytes, tuple[Identifier, Identifier]] = {}
_KV_TARGETS_MAX = 1024


class _Empty(_Request):
    """A request with an empty payload."""

    def encode(self) -> bytes:
        return b""

    @classmethod
    def decode(cls, payload: bytes) -> _Empty:
        if payload:
            raise malformed(f"{cls.CODE.name}: expected an empty payload, got {len(payload)} bytes")
        return cls()


@dataclass(frozen=True, slots=True)
class Handshake(_Request):
    """``"TTLB" | u16 version | str8 auth_token | str8 client_name [| str8 user |
    str8 password]`` (the user and password, for ``[[auth.users]]``, may be left
    out: a handshake without them is a handshake with both empty)"""

    CODE: ClassVar[Command] = Command.HANDSHAKE
    version: int
    token: str = ""
    client_name: str = ""
    user: str = ""
    password: str = field(default="", repr=False)

    def encode(self) -> bytes:
        out = HANDSHAKE_MAGIC + u16(self.version) + short_str(self.token, "token") + short_str(self.client_name, "client name")
        if self.user or self.password:
            out += short_str(self.user, "user") + short_str(self.password, "password")
        return out

    @classmethod
    def decode(cls, payload: bytes) -> Handshake:
        r = Reader(payload, "HANDSHAKE")
        if r.raw(4) != HANDSHAKE_MAGIC:
            raise error_class(ErrorCode.UNSUPPORTED_VERSION)("not a ttlbroker client: the handshake magic is not 'TTLB'")
        version = r.u16()
        token = r.short_str("token")
        name = r.short_str("client name")
        user = password = ""
        if r.remaining():
            user = r.short_str("user")
            password = r.short_str("password")
        r.end()
        return cls(version, token, name, user, password)


@dataclass(frozen=True, slots=True)
class Ping(_Empty):
    """(empty)"""

    CODE: ClassVar[Command] = Command.PING


@dataclass(frozen=True, slots=True)
class GetServerInfo(_Empty):
    """(empty)"""

    CODE: ClassVar[Command] = Command.SERVER_INFO


@dataclass(frozen=True, slots=True)
class GetStats(_Empty):
    """(empty)"""

    CODE: ClassVar[Command] = Command.STATS


#: Publish flag: the broker sends no response at all (fire and forget).
PUBLISH_NO_ACK = 0x1
#: Publish flag: a reply subject (``str8``) follows the count, and every message of
#: the request carries it to the core subscribers (a NATS request): the payload
#: decodes to a :class:`PublishWithReply`.
PUBLISH_REPLY = 0x2
_PUBLISH_FLAGS = PUBLISH_NO_ACK | PUBLISH_REPLY
#: What precedes the body of a PUBLISH of one message with acks (flags 0, count 1):
#: ``PUBLISH_ONE + body`` is ``Publish.from_bodies([body]).encode()``, without the
#: object.
PUBLISH_ONE = u8(0) + u32(1)


@dataclass(frozen=True, slots=True)
class Publish(_Request):
    """``u8 flags | u32 count | [str8 reply |] count × message body`` (body layout:
    ``_records.py``; the reply subject only with ``PUBLISH_REPLY``, which decodes to
    :class:`PublishWithReply`)

    The bodies are kept as the raw payload: the broker scans them in one pass
    (:func:`protocol.scan_bodies`) and stores them as they are.
    """

    CODE: ClassVar[Command] = Command.PUBLISH
    count: int
    data: bytes = field(repr=False)
    body_pos: int = 5
    flags: int = 0

    @classmethod
    def from_bodies(cls, bodies: list[bytes], flags: int = 0) -> Publish:
        data = u8(flags) + u32(len(bodies)) + b"".join(bodies)
        return cls(len(bodies), data, 5, flags)

    def encode(self) -> bytes:
        if self.body_pos == 5:
            return self.data
        return u8(self.flags) + u32(self.count) + self.data[self.body_pos :]

    @classmethod
    def decode(cls, payload: bytes) -> Publish:
        r = Reader(payload, "PUBLISH")
        flags = r.u8()
        count = r.u32()
        if flags & ~_PUBLISH_FLAGS:
            raise malformed(f"PUBLISH: unknown flags {flags:#x}")
        reply = r.short_str("reply subject") if flags & PUBLISH_REPLY else None
        if count and r.remaining() < 14 * count:
            raise malformed(f"PUBLISH: {r.remaining()} bytes cannot hold {count} messages")
        if reply is None:
            return cls(count, payload, r.pos, flags)
        if not reply:
            raise malformed("PUBLISH: the REPLY flag is set but the reply subject is empty")
        return PublishWithReply(count, payload, r.pos, flags, reply)

    @property
    def no_ack(self) -> bool:
        return bool(self.flags & PUBLISH_NO_ACK)


@dataclass(frozen=True, slots=True)
class PublishWithReply(Publish):
    """A PUBLISH with ``PUBLISH_REPLY``: ``u8 flags | u32 count | str8 reply | count ×
    message body``. A class of its own so that the broker's table sends it to its own
    handler, and a plain PUBLISH pays nothing for the field it does not have."""

    reply: str = ""

    @classmethod
    def to(cls, reply: str, bodies: list[bytes], flags: int = 0) -> PublishWithReply:
        """The request of ``bodies`` carrying ``reply`` (``flags``: ``PUBLISH_NO_ACK`` or 0)."""
        flags |= PUBLISH_REPLY
        head = u8(flags) + u32(len(bodies)) + short_str(reply, "reply subject")
        return cls(len(bodies), head + b"".join(bodies), len(head), flags, reply)

    def encode(self) -> bytes:
        return u8(self.flags) + u32(self.count) + short_str(self.reply, "reply subject") + self.data[self.body_pos :]


@dataclass(frozen=True, slots=True)
class Fetch(_Request):
    """``ident stream | ident topic | u32 partition | u64 offset | u32 count | u32 max_bytes | str8 subject_filter``

    ``subject_filter`` empty = every subject. ``max_bytes`` 0 = the broker's maximum.
    """

    CODE: ClassVar[Command] = Command.FETCH
    stream: Identifier
    topic: Identifier
    partition: int
    offset: int
    count: int
    max_bytes: int = 0
    subject_filter: str = ""

    def encode(self) -> bytes:
        return b"".join(
            (
                self.stream.encode(),
                self.topic.encode(),
                u32(self.partition),
                u64(self.offset),
                u32(self.count),
                u32(self.max_bytes),
                short_str(self.subject_filter, "subject filter"),
            )
        )

    @classmethod
    def decode(cls, payload: bytes) -> Fetch:
        r = Reader(payload, "FETCH")
        out = cls(r.ident(), r.ident(), r.u32(), r.u64(), r.u32(), r.u32(), r.short_str("subject filter"))
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class GetLast(_Request):
    """``ident stream | ident topic | str8 subject``"""

    CODE: ClassVar[Command] = Command.GET_LAST
    stream: Identifier
    topic: Identifier
    subject: str

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + short_str(self.subject, "subject")

    @classmethod
    def decode(cls, payload: bytes) -> GetLast:
        r = Reader(payload, "GET_LAST")
        out = cls(r.ident(), r.ident(), r.short_str("subject"))
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class DeleteMessage(_Request):
    """``ident stream | ident topic | u32 partition | u64 offset``"""

    CODE: ClassVar[Command] = Command.DELETE_MESSAGE
    stream: Identifier
    topic: Identifier
    partition: int
    offset: int

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + u32(self.partition) + u64(self.offset)

    @classmethod
    def decode(cls, payload: bytes) -> DeleteMessage:
        r = Reader(payload, "DELETE_MESSAGE")
        out = cls(r.ident(), r.ident(), r.u32(), r.u64())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class Purge(_Request):
    """``ident stream | ident topic | str8 subject`` (empty subject = the whole topic)"""

    CODE: ClassVar[Command] = Command.PURGE
    stream: Identifier
    topic: Identifier
    subject: str = ""

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + short_str(self.subject, "subject")

    @classmethod
    def decode(cls, payload: bytes) -> Purge:
        r = Reader(payload, "PURGE")
        out = cls(r.ident(), r.ident(), r.short_str("subject"))
        r.end()
        return out


#: Subscribe flag: the subscription's DELIVERY pushes carry the reply subject of the
#: messages that have one (a request's), after the messages.
SUBSCRIBE_REPLIES = 0x1


@dataclass(frozen=True, slots=True)
class Subscribe(_Request):
    """``u32 subscription_id | str8 subject_filter [| u8 flags]`` (flags left out: 0;
    ``SUBSCRIBE_REPLIES`` is the one flag)"""

    CODE: ClassVar[Command] = Command.SUBSCRIBE
    subscription_id: int
    subject_filter: str
    flags: int = 0

    def encode(self) -> bytes:
        out = u32(self.subscription_id) + short_str(self.subject_filter, "subject filter")
        return out + u8(self.flags) if self.flags else out

    @classmethod
    def decode(cls, payload: bytes) -> Subscribe:
        r = Reader(payload, "SUBSCRIBE")
        sid, subject_filter = r.u32(), r.short_str("subject filter")
        flags = r.u8() if r.remaining() else 0
        r.end()
        if flags & ~SUBSCRIBE_REPLIES:
            raise malformed(f"SUBSCRIBE: unknown flags {flags:#x}")
        return cls(sid, subject_filter, flags)

    @property
    def replies(self) -> bool:
        return bool(self.flags & SUBSCRIBE_REPLIES)


@dataclass(frozen=True, slots=True)
class Unsubscribe(_Request):
    """``u32 subscription_id``"""

    CODE: ClassVar[Command] = Command.UNSUBSCRIBE
    subscription_id: int

    def encode(self) -> bytes:
        return u32(self.subscription_id)

    @classmethod
    def decode(cls, payload: bytes) -> Unsubscribe:
        r = Reader(payload, "UNSUBSCRIBE")
        out = cls(r.u32())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class StoreConsumerOffset(_Request):
    """``ident stream | ident topic | u32 partition | str8 consumer | u64 offset``"""

    CODE: ClassVar[Command] = Command.STORE_CONSUMER_OFFSET
    stream: Identifier
    topic: Identifier
    partition: int
    consumer: str
    offset: int

    def encode(self) -> bytes:
        return (
            self.stream.encode() + self.topic.encode() + u32(self.partition)
            + short_str(self.consumer, "consumer name") + u64(self.offset)
        )

    @classmethod
    def decode(cls, payload: bytes) -> StoreConsumerOffset:
        r = Reader(payload, "STORE_CONSUMER_OFFSET")
        out = cls(r.ident(), r.ident(), r.u32(), r.short_str("consumer name"), r.u64())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class GetConsumerOffset(_Request):
    """``ident stream | ident topic | u32 partition | str8 consumer``"""

    CODE: ClassVar[Command] = Command.GET_CONSUMER_OFFSET
    stream: Identifier
    topic: Identifier
    partition: int
    consumer: str

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + u32(self.partition) + short_str(self.consumer, "consumer name")

    @classmethod
    def decode(cls, payload: bytes) -> GetConsumerOffset:
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident(), r.ident(), r.u32(), r.short_str("consumer name"))
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class DeleteConsumerOffset(GetConsumerOffset):
    """``ident stream | ident topic | u32 partition | str8 consumer``"""

    CODE: ClassVar[Command] = Command.DELETE_CONSUMER_OFFSET


@dataclass(frozen=True, slots=True)
class GetStream(_Request):
    """``ident stream``"""

    CODE: ClassVar[Command] = Command.GET_STREAM
    stream: Identifier

    def encode(self) -> bytes:
        return self.stream.encode()

    @classmethod
    def decode(cls, payload: bytes) -> GetStream:
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class DeleteStream(GetStream):
    """``ident stream``"""

    CODE: ClassVar[Command] = Command.DELETE_STREAM


@dataclass(frozen=True, slots=True)
class ListStreams(_Empty):
    """(empty)"""

    CODE: ClassVar[Command] = Command.LIST_STREAMS


@dataclass(frozen=True, slots=True)
class CreateStream(_Request):
    """``u32 stream_id | u8 name_len | name`` (Apache Iggy's layout; id 0 = the next free id)"""

    CODE: ClassVar[Command] = Command.CREATE_STREAM
    stream_id: int
    name: str

    def encode(self) -> bytes:
        return u32(self.stream_id) + short_str(self.name, "stream name")

    @classmethod
    def decode(cls, payload: bytes) -> CreateStream:
        r = Reader(payload, "CREATE_STREAM")
        out = cls(r.u32(), r.short_str("stream name"))
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class UpdateStream(_Request):
    """``ident stream | u8 name_len | name``"""

    CODE: ClassVar[Command] = Command.UPDATE_STREAM
    stream: Identifier
    name: str

    def encode(self) -> bytes:
        return self.stream.encode() + short_str(self.name, "stream name")

    @classmethod
    def decode(cls, payload: bytes) -> UpdateStream:
        r = Reader(payload, "UPDATE_STREAM")
        out = cls(r.ident(), r.short_str("stream name"))
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class GetTopic(_Request):
    """``ident stream | ident topic``"""

    CODE: ClassVar[Command] = Command.GET_TOPIC
    stream: Identifier
    topic: Identifier

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode()

    @classmethod
    def decode(cls, payload: bytes) -> GetTopic:
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident(), r.ident())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class DeleteTopic(GetTopic):
    """``ident stream | ident topic``"""

    CODE: ClassVar[Command] = Command.DELETE_TOPIC


@dataclass(frozen=True, slots=True)
class ListTopics(GetStream):
    """``ident stream``"""

    CODE: ClassVar[Command] = Command.LIST_TOPICS


#: ``message_expiry`` in CreateTopic: 0 asks for the broker's default
#: (``[system.segment] message_expiry``); this value asks for no expiry whatever the
#: default. A topic's details report the effective value, where 0 means none.
EXPIRY_NONE = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class CreateTopic(_Request):
    """``ident stream | u32 topic_id | u32 partitions_count | u32 message_expiry | u8 name_len | name | map options``

    The fixed part is Apache Iggy's layout; the options (subjects and the
    JetStream-style policies) follow as one msgpack map. ``topic_id`` 0 = the next
    free id; ``message_expiry`` 0 = the broker default, ``EXPIRY_NONE`` = none.
    """

    CODE: ClassVar[Command] = Command.CREATE_TOPIC
    stream: Identifier
    topic_id: int
    partitions_count: int
    message_expiry: int
    name: str
    options: dict[str, object] = field(default_factory=dict)

    def encode(self) -> bytes:
        return b"".join(
            (
                self.stream.encode(),
                u32(self.topic_id),
                u32(self.partitions_count),
                u32(self.message_expiry),
                short_str(self.name, "topic name"),
                pack_map(self.options),
            )
        )

    @classmethod
    def decode(cls, payload: bytes) -> CreateTopic:
        r = Reader(payload, "CREATE_TOPIC")
        out = cls(r.ident(), r.u32(), r.u32(), r.u32(), r.short_str("topic name"), r.map())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class UpdateTopic(_Request):
    """``ident stream | ident topic | map changes`` (only the keys present change)"""

    CODE: ClassVar[Command] = Command.UPDATE_TOPIC
    stream: Identifier
    topic: Identifier
    changes: dict[str, object] = field(default_factory=dict)

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + pack_map(self.changes)

    @classmethod
    def decode(cls, payload: bytes) -> UpdateTopic:
        r = Reader(payload, "UPDATE_TOPIC")
        out = cls(r.ident(), r.ident(), r.map())
        r.end()
        return out


#: Export flag: seal every active segment that holds records first.
EXPORT_SEAL = 0x1


@dataclass(frozen=True, slots=True)
class Export(_Request):
    """``u8 flags`` (``EXPORT_SEAL``: seal active segments first)"""

    CODE: ClassVar[Command] = Command.EXPORT
    flags: int = 0

    def encode(self) -> bytes:
        return u8(self.flags)

    @classmethod
    def decode(cls, payload: bytes) -> Export:
        r = Reader(payload, "EXPORT")
        out = cls(r.u8())
        r.end()
        if out.flags & ~EXPORT_SEAL:
            raise malformed(f"EXPORT: unknown flags {out.flags:#x}")
        return out

    @property
    def seal(self) -> bool:
        return bool(self.flags & EXPORT_SEAL)


@dataclass(frozen=True, slots=True)
class KvGet(_Request):
    """``ident stream | ident topic | str8 subject | u64 revision`` (revision 0 = the latest)"""

    CODE: ClassVar[Command] = Command.KV_GET
    stream: Identifier
    topic: Identifier
    subject: str
    revision: int = 0

    def encode(self) -> bytes:
        return self.payload(self.stream.encode() + self.topic.encode(), self.subject, self.revision)

    @staticmethod
    def payload(target: bytes, subject: str, revision: int = 0) -> bytes:
        """The payload without the object; ``target``: the stream's and the topic's
        identifiers, encoded (a client's bucket keeps them)."""
        raw = subject.encode()
        if len(raw) > 255:
            short_str(subject, "subject")  # raises, with the usual words
        return b"".join((target, _LENGTH_BYTE[len(raw)], raw, _U64.pack(revision)))

    @staticmethod
    def split(payload: bytes) -> tuple[bytes, bytes, int] | None:
        """A payload's parts read in place, with no object: the stream's and the
        topic's identifiers as sent (a bucket's are the same bytes every time), the
        subject's bytes and the revision; None when its lengths do not add up
        (:meth:`decode` then says what is wrong). The identifiers and the subject are
        not checked here (:meth:`decode` and ``validate_subject`` do)."""
        try:
            pos = 4 + payload[1]
            pos += payload[pos - 1]  # after the two identifiers, if they are what they say
            end = pos + 1 + payload[pos]
        except IndexError:
            return None
        if end + 8 != len(payload):
            return None
        return payload[:pos], payload[pos + 1 : end], int.from_bytes(payload[end:], "little")

    @classmethod
    def decode(cls, payload: bytes) -> KvGet:
        """One pass with no Reader when the subject's length leaves exactly the
        revision after it (every well-formed payload), the bucket's identifiers
        looked up by their bytes (:data:`_KV_TARGETS`); anything else goes through
        the Reader, which refuses it with the error naming what is wrong. A wrong
        identifier is refused by ``Identifier.decode_from`` on either path."""
        try:
            pos = 4 + payload[1]
            pos += payload[pos - 1]  # after the two identifiers, if they are what they say
            target = _KV_TARGETS.get(payload[:pos])
            if target is None:
                stream, pos = Identifier.decode_from(payload, 0)
                topic, pos = Identifier.decode_from(payload, pos)
                if len(_KV_TARGETS) >= _KV_TARGETS_MAX:
                    _KV_TARGETS.clear()
                _KV_TARGETS[payload[:pos]] = stream, topic
            else:
                stream, topic = target
            end = pos + 1 + payload[pos]
            if end + 8 == len(payload):
                return _kv_get(stream, topic, payload[pos + 1 : end].decode(), _U64.unpack_from(payload, end)[0])
        except (IndexError, struct.error, UnicodeDecodeError):
            pass
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident(), r.ident(), r.short_str("subject"), r.u64())
        r.end()
        return out


_new = object.__new__
_set_stream, _set_topic, _set_subject, _set_revision = (
    KvGet.stream.__set__, KvGet.topic.__set__, KvGet.subject.__set__, KvGet.revision.__set__,  # type: ignore[misc, attr-defined]  # slot descriptors, which mypy types as the fields
)


def _kv_get(stream: Identifier, topic: Identifier, subject: str, revision: int) -> KvGet:
    """``KvGet(stream, topic, subject, revision)`` through its slots, without the
    frozen dataclass's ``__init__`` (``object.__setattr__`` looked up per field):
    the same object, in about half the time (once per KV get)."""
    out = _new(KvGet)
    _set_stream(out, stream)
    _set_topic(out, topic)
    _set_subject(out, subject)
    _set_revision(out, revision)
    return out


@dataclass(frozen=True, slots=True)
class KvTouch(_Request):
    """``ident stream | ident topic | str8 subject``"""

    CODE: ClassVar[Command] = Command.KV_TOUCH
    stream: Identifier
    topic: Identifier
    subject: str

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + short_str(self.subject, "subject")

    @classmethod
    def decode(cls, payload: bytes) -> KvTouch:
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident(), r.ident(), r.short_str("subject"))
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class KvKeys(_Request):
    """``ident stream | ident topic | str8 subject_filter``"""

    CODE: ClassVar[Command] = Command.KV_KEYS
    stream: Identifier
    topic: Identifier
    subject_filter: str

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + short_str(self.subject_filter, "subject filter")

    @classmethod
    def decode(cls, payload: bytes) -> KvKeys:
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident(), r.ident(), r.short_str("subject filter"))
        r.end()
        return out


_ALL_COMMANDS: tuple[type[_Request], ...] = (
    Handshake, Ping, GetServerInfo, GetStats, Publish, Fetch, GetLast, DeleteMessage, Purge,
    Subscribe, Unsubscribe, StoreConsumerOffset, GetConsumerOffset, DeleteConsumerOffset,
    GetStream, ListStreams, CreateStream, DeleteStream, UpdateStream,
    GetTopic, ListTopics, CreateTopic, DeleteTopic, UpdateTopic, Export, KvGet, KvTouch, KvKeys,
    *CONSUMER_COMMANDS,
)
COMMAND_TYPES: dict[int, type[_Request]] = {cls.CODE: cls for cls in _ALL_COMMANDS}
