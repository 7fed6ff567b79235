"""Durable consumers on the wire: their commands, the pulled-message batches and the
acknowledgements (codes 130..139, ``docs/protocol.md`` §5.8a).

A consumer's configuration and its info travel as one msgpack map (the JetStream field
names of ``docs/semantics.md`` §16.1); the hot path, the messages a pull delivers and the acks
that settle them, is fixed binary layout:

* a **pull** is a request whose response ends it. Messages that are ready at once
  travel in that response; a pull that waits (``expires_ms``) gets messages as they
  are stored in ``PULL_MESSAGES`` pushes that carry the pull's correlation id, and
  its response, when the batch is full or the time is up, carries the rest (maybe
  none) and why it ended (:class:`PullEnd`);
* an **ack** frame carries any number of ``(kind, partition, offset, delay)``
  entries. Without the SYNC flag it gets no response at all (like a PUBLISH with
  ``PUBLISH_NO_ACK``); with it, an empty response once the consumer state is durable.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import starmap
from typing import Any, ClassVar, NamedTuple, Protocol

from ._base import _Request, _Response
from ._codes import Command, PushKind
from ._names import Identifier
from ._records import RECORD_FIXED, Message
from ._wire import Reader, malformed, pack_map, short_str, u8, u32

__all__ = [
    "AckKind",
    "PullEnd",
    "PULL_NO_WAIT",
    "ACK_SYNC",
    "CreateConsumer",
    "UpdateConsumer",
    "ConsumerInfoRequest",
    "ListConsumers",
    "DeleteConsumer",
    "Pull",
    "AckMessages",
    "JoinGroup",
    "LeaveGroup",
    "EndPulls",
    "PulledMessage",
    "PullBatch",
    "encode_pull_entry",
    "encode_pull_batch",
    "pull_entries",
    "PulledRun",
    "PullPart",
    "expand_runs",
    "CONSUMER_COMMANDS",
    "REDRIVE_DRY_RUN",
    "Redrive",
]

#: PULL flag: answer at once with what is ready (maybe nothing), never wait.
PULL_NO_WAIT = 0x1
#: ACK flag: answer the frame once the consumer state it changed is durable.
ACK_SYNC = 0x1


class AckKind(IntEnum):
    """How an ack entry settles a delivery (``docs/semantics.md`` §16.5)."""

    #: Processed: settled, never delivered again.
    ACK = 0
    #: Not processed: deliver again now, or after ``delay_ms``.
    NAK = 1
    #: Never deliver again, unprocessed (settled, counted apart).
    TERM = 2
    #: Still working on it: restart its ack-wait clock.
    IN_PROGRESS = 3


class PullEnd(IntEnum):
    """Why a pull ended (the status byte of its response; 0 in a push: more follows)."""

    #: Not the end: a ``PULL_MESSAGES`` push, more may follow.
    MORE = 0
    #: ``batch`` messages were delivered.
    BATCH_COMPLETE = 1
    #: The next message would have gone over ``max_bytes``.
    MAX_BYTES = 2
    #: ``expires_ms`` passed (the server's 408 Request Timeout).
    EXPIRED = 3
    #: ``no_wait`` and nothing more is ready (the server's 404 No Messages).
    NO_MESSAGES = 4
    #: The connection's membership of a partitioned consumer ended (left, or its
    #: partitions moved away) while the pull waited.
    NOT_A_MEMBER = 5
    #: The connection ended its pulls (END_PULLS).
    ENDED = 6


@dataclass(frozen=True, slots=True)
class _ConsumerRef(_Request):
    """``ident stream | ident topic | str8 consumer``"""

    stream: Identifier
    topic: Identifier
    name: str

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + short_str(self.name, "consumer name")

    @classmethod
    def decode(cls, payload: bytes) -> _ConsumerRef:
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident(), r.ident(), r.short_str("consumer name"))
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class CreateConsumer(_Request):
    """``ident stream | ident topic | str8 consumer | map config``

    Idempotent: the same name with the same configuration returns the consumer; with
    another it is refused (CONSUMER_EXISTS). The response is the consumer's info map.
    """

    CODE: ClassVar[Command] = Command.CREATE_CONSUMER
    stream: Identifier
    topic: Identifier
    name: str
    config: dict[str, object] = field(default_factory=dict)

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + short_str(self.name, "consumer name") + pack_map(self.config)

    @classmethod
    def decode(cls, payload: bytes) -> CreateConsumer:
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident(), r.ident(), r.short_str("consumer name"), r.map())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class UpdateConsumer(CreateConsumer):
    """``ident stream | ident topic | str8 consumer | map config`` (the whole new
    configuration; only the fields the server lets you change may differ)."""

    CODE: ClassVar[Command] = Command.UPDATE_CONSUMER


@dataclass(frozen=True, slots=True)
class ConsumerInfoRequest(_ConsumerRef):
    """``ident stream | ident topic | str8 consumer``; the response is the info map."""

    CODE: ClassVar[Command] = Command.CONSUMER_INFO


@dataclass(frozen=True, slots=True)
class DeleteConsumer(_ConsumerRef):
    """``ident stream | ident topic | str8 consumer``; the response is empty."""

    CODE: ClassVar[Command] = Command.DELETE_CONSUMER


@dataclass(frozen=True, slots=True)
class ListConsumers(_Request):
    """``ident stream | ident topic``; the response is ``{"consumers": [info, ...]}``."""

    CODE: ClassVar[Command] = Command.LIST_CONSUMERS
    stream: Identifier
    topic: Identifier

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode()

    @classmethod
    def decode(cls, payload: bytes) -> ListConsumers:
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident(), r.ident())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class JoinGroup(_Request):
    """``ident stream | ident topic | str8 consumer | str8 member``

    Joins this connection to a ``partitioned`` consumer under ``member``; the
    response is ``{"member": ..., "partitions": [...]}`` (the partitions it owns now).
    """

    CODE: ClassVar[Command] = Command.JOIN_GROUP
    stream: Identifier
    topic: Identifier
    name: str
    member: str

    def encode(self) -> bytes:
        return (
            self.stream.encode() + self.topic.encode() + short_str(self.name, "consumer name")
            + short_str(self.member, "member name")
        )

    @classmethod
    def decode(cls, payload: bytes) -> JoinGroup:
        r = Reader(payload, cls.CODE.name)
        out = cls(r.ident(), r.ident(), r.short_str("consumer name"), r.short_str("member name"))
        r.end()
        return out


#: REDRIVE flag: count what would go, publish nothing, mark nothing.
REDRIVE_DRY_RUN = 0x1


@dataclass(frozen=True, slots=True)
class Redrive(_Request):
    """``ident stream | ident topic | u8 flags``: publish the dead letters stored in
    that topic since the last redrive again on their original subjects; the response
    is ``{"redriven": n, "skipped": n, "dry_run": bool}``."""

    CODE: ClassVar[Command] = Command.REDRIVE
    stream: Identifier
    topic: Identifier
    flags: int = 0

    def encode(self) -> bytes:
        return self.stream.encode() + self.topic.encode() + u8(self.flags)

    @classmethod
    def decode(cls, payload: bytes) -> Redrive:
        r = Reader(payload, "REDRIVE")
        out = cls(r.ident(), r.ident(), r.u8())
        r.end()
        return out


@dataclass(frozen=True, slots=True)
class EndPulls(_ConsumerRef):
    """``ident stream | ident topic | str8 consumer``; ends every pull this connection
    has waiting on the consumer (each answered with status ENDED); the response is
    empty."""

    CODE: ClassVar[Command] = Command.END_PULLS


@dataclass(frozen=True, slots=True)
class LeaveGroup(_ConsumerRef):
    """``ident stream | ident topic | str8 consumer``; the response is empty."""

    CODE: ClassVar[Command] = Command.LEAVE_GROUP


_PULL = struct.Struct("<IIIB")


@dataclass(frozen=True, slots=True)
class Pull(_Request):
    """``ident stream | ident topic | str8 consumer | u32 batch | u32 max_bytes | u32 expires_ms | u8 flags``

    ``max_bytes`` 0 = no limit but the frame size; ``expires_ms`` 0 with no
    ``PULL_NO_WAIT`` = wait until the batch is full. The response is a
    :class:`PullBatch` whose status says why the pull ended.
    """

    CODE: ClassVar[Command] = Command.PULL
    stream: Identifier
    topic: Identifier
    name: str
    batch: int = 1
    max_bytes: int = 0
    expires_ms: int = 0
    flags: int = 0

    def encode(self) -> bytes:
        return (
            self.stream.encode() + self.topic.encode() + short_str(self.name, "consumer name")
            + _PULL.pack(self.batch, self.max_bytes, self.expires_ms, self.flags)
        )

    @classmethod
    def decode(cls, payload: bytes) -> Pull:
        r = Reader(payload, cls.CODE.name)
        stream, topic, name = r.ident(), r.ident(), r.short_str("consumer name")
        batch, max_bytes, expires, flags = r.u32(), r.u32(), r.u32(), r.u8()
        r.end()
        if flags & ~PULL_NO_WAIT:
            raise malformed(f"PULL: unknown flags {flags:#x}")
        return cls(stream, topic, name, batch, max_bytes, expires, flags)

    @property
    def no_wait(self) -> bool:
        return bool(self.flags & PULL_NO_WAIT)


_ACK_ENTRY = struct.Struct("<BIQI")  # kind, partition, offset, delay_ms


@dataclass(frozen=True, slots=True)
class AckMessages(_Request):
    """``ident stream | ident topic | str8 consumer | u8 flags | u32 count | count × (u8 kind | u32 partition | u64 offset | u32 delay_ms)``

    ``kind`` is an :class:`AckKind`; ``delay_ms`` only means something for NAK (0 =
    redeliver now). Without ``ACK_SYNC`` the frame gets no response.
    """

    CODE: ClassVar[Command] = Command.ACK
    stream: Identifier
    topic: Identifier
    name: str
    entries: tuple[tuple[int, int, int, int], ...]
    flags: int = 0

    def encode(self) -> bytes:
        return b"".join((
            self.stream.encode(), self.topic.encode(), short_str(self.name, "consumer name"),
            u8(self.flags), u32(len(self.entries)), *starmap(_ACK_ENTRY.pack, self.entries),
        ))

    @classmethod
    def decode(cls, payload: bytes) -> AckMessages:
        r = Reader(payload, cls.CODE.name)
        stream, topic, name = r.ident(), r.ident(), r.short_str("consumer name")
        flags, count = r.u8(), r.u32()
        if flags & ~ACK_SYNC:
            raise malformed(f"ACK: unknown flags {flags:#x}")
        if r.remaining() != count * _ACK_ENTRY.size:
            raise malformed(f"ACK: {r.remaining()} bytes do not hold {count} entries of {_ACK_ENTRY.size} bytes")
        body = r.rest()
        kinds = body[:: _ACK_ENTRY.size]  # the first byte of every entry
        if kinds and max(kinds) > AckKind.IN_PROGRESS:
            raise malformed(f"ACK: unknown ack kind {next(k for k in kinds if k > AckKind.IN_PROGRESS)}")
        return cls(stream, topic, name, tuple(_ACK_ENTRY.iter_unpack(body)), flags)

    @property
    def sync(self) -> bool:
        return bool(self.flags & ACK_SYNC)


# -- pulled messages ----------------------------------------------------------------

_BATCH_HEAD = struct.Struct("<BIII")  # status, stream_id, topic_id, count
_PULL_ENTRY = struct.Struct("<IQIQ")  # partition, consumer_seq, num_delivered, pending
_PULLED_FIXED = struct.Struct("<IQIQ" + RECORD_FIXED.format[1:])  # an entry head and its record's fixed fields


def encode_pull_entry(partition: int, consumer_seq: int, num_delivered: int, pending: int) -> bytes:
    """The 24 bytes that precede each record of a pulled batch."""
    return _PULL_ENTRY.pack(partition, consumer_seq, num_delivered, pending)


_LENGTH = struct.Struct("<I")


class _Parts(Protocol):
    """Where :func:`pull_entries` appends: a pull's parts, whatever else they hold
    (a list of :data:`PullPart`, or of entry heads and records only)."""

    def append(self, part: bytes | memoryview, /) -> None: ...


def pull_entries(
    parts: _Parts, run: memoryview, partition: int, dseq: int, pending: int, budget: int, free: bool
) -> tuple[int, int, bool]:
    """Append to ``parts`` the entry head and a view of each record of ``run`` (records
    back to back, first deliveries: ``num_delivered`` 1), the delivery sequences from
    ``dseq`` on and ``pending`` counting down from ``pending - 1`` (never below 0), while
    the records fit in ``budget`` bytes; the first always fits when ``free``.

    Returns ``(records taken, their bytes, whether the budget stopped it)``.

    Runtime complexity: O(records), one ``unpack_from``, one ``pack`` and one slice each.
    """
    unpack = _LENGTH.unpack_from
    pack = _PULL_ENTRY.pack
    append = parts.append
    pos, n, k = 0, len(run), 0
    while pos < n:
        end = pos + 4 + unpack(run, pos)[0]
        if end - pos > budget and (k or not free):
            return k, pos, True
        budget -= end - pos
        pending -= 1
        append(pack(partition, dseq + k, 1, pending if pending > 0 else 0))
        append(run[pos:end])
        pos = end
        k += 1
    return k, pos, False


class PulledRun(NamedTuple):
    """A run of first deliveries whose entry heads are not encoded: in a pull's
    ``parts`` (entry head, record, ...) it stands, followed by the run (records back
    to back), where :func:`pull_entries` would put the run's heads and records
    (taking all of them): ``messages`` records, delivery sequences from ``dseq`` on,
    ``pending`` counting down from ``pending - 1`` (never below 0). A listener that
    formats the messages itself (``protocol.nats.js_delivery_frames``) reads the run
    once, without heads to pack and unpack; :func:`expand_runs` gives the heads."""

    partition: int
    dseq: int
    messages: int
    pending: int


#: One of a pull's parts: an entry head or a record (``bytes`` or a view), or a
#: :class:`PulledRun` (the part after it is its run).
PullPart = bytes | memoryview | PulledRun


def expand_runs(parts: list[Any]) -> list[Any]:
    """``parts`` with each :class:`PulledRun` and its run replaced by the entry heads
    and records :func:`pull_entries` gives for them."""
    out: list[Any] = []
    for i in range(0, len(parts), 2):
        head, record = parts[i], parts[i + 1]
        if head.__class__ is PulledRun:
            pull_entries(out, memoryview(record), head.partition, head.dseq, head.pending, len(record), True)
        else:
            out += (head, record)
    return out


def encode_pull_batch(status: int, stream_id: int, topic_id: int, count: int, parts: list[bytes | memoryview]) -> bytes:
    """A PULL response or PULL_MESSAGES push from encoded entries (entry head + record each)."""
    return b"".join((_BATCH_HEAD.pack(status, stream_id, topic_id, count), *parts))


class PulledMessage(Message):
    """A message a pull delivered: a :class:`Message` with the delivery's facts.

    Attributes (beyond Message's):
        consumer_seq: the consumer's delivery sequence of this delivery.
        num_delivered: how many times it has been delivered, this time included.
        pending: messages matching the consumer still to be delivered after it.
    """

    __slots__ = ("consumer_seq", "num_delivered", "pending")

    consumer_seq: int
    num_delivered: int
    pending: int


@dataclass(frozen=True, slots=True)
class PullBatch(_Response):
    """``u8 status | u32 stream_id | u32 topic_id | u32 count | count × (u32 partition | u64 consumer_seq | u32 num_delivered | u64 pending | record)``

    The response to PULL (status: a :class:`PullEnd`, why it ended) and the
    ``PULL_MESSAGES`` push (status ``MORE``; the frame's correlation id is the pull's).
    """

    PUSH: ClassVar[PushKind] = PushKind.PULL_MESSAGES
    status: int
    stream_id: int
    topic_id: int
    messages: tuple[PulledMessage, ...] = ()

    def encode(self) -> bytes:
        from ._records import encode_body, encode_record

        parts: list[bytes | memoryview] = []
        for m in self.messages:
            parts.append(encode_pull_entry(m.partition, m.consumer_seq, m.num_delivered, m.pending))
            parts.append(encode_record(m.offset, m.timestamp, encode_body(m.subject, m.payload, m.headers_raw, m.ttl, m.flags)))
        return encode_pull_batch(self.status, self.stream_id, self.topic_id, len(self.messages), parts)

    @classmethod
    def decode(cls, payload: bytes, message_class: type[PulledMessage] | None = None) -> PullBatch:
        """``message_class``: a :class:`PulledMessage` subclass to build (a client's,
        with methods to settle the message).

        Runtime complexity: O(count), one ``unpack_from`` and three slices per message
        (no call of ``__init__``: the slots are filled in place)."""
        make = message_class or PulledMessage
        new = make.__new__
        try:
            status, stream_id, topic_id, count = _BATCH_HEAD.unpack_from(payload, 0)
            pos = _BATCH_HEAD.size
            out: list[PulledMessage] = []
            append = out.append
            unpack = _PULLED_FIXED.unpack_from
            size = len(payload)
            for _ in range(count):
                partition, cseq, ndel, pending, length, _crc, offset, ts, ttl, flags, sl, hl, pl = unpack(payload, pos)
                s = pos + _PULLED_FIXED.size
                h = s + sl
                p = h + hl
                end = p + pl
                if end != pos + _PULL_ENTRY.size + length + 4 or end > size:
                    raise malformed("PULL batch: a record's lengths do not add up")
                pm = new(make)
                pm.subject = payload[s:h].decode(errors="replace")
                pm.payload = payload[p:end]
                pm._headers_raw = payload[h:p]
                pm._headers = None
                pm.offset = offset
                pm.timestamp = ts
                pm.ttl = ttl
                pm.flags = flags
                pm.partition = partition
                pm.stream_id = stream_id
                pm.topic_id = topic_id
                pm.consumer_seq = cseq
                pm.num_delivered = ndel
                pm.pending = pending
                append(pm)
                pos = end
        except struct.error:
            raise malformed("PULL batch: payload truncated") from None
        if status > max(PullEnd):
            raise malformed(f"PULL batch: unknown status {status}")
        if pos != len(payload):
            raise malformed("PULL batch: bytes after the last message")
        return cls(status, stream_id, topic_id, tuple(out))


CONSUMER_COMMANDS: tuple[type[_Request], ...] = (
    CreateConsumer, UpdateConsumer, ConsumerInfoRequest, ListConsumers, DeleteConsumer, Pull, AckMessages, JoinGroup, LeaveGroup, EndPulls, Redrive,
)
