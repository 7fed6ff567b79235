"""The one table of numeric error codes, and the exceptions that carry them.

Two axes, kept apart (the first split as h11 splits it, into ``LocalProtocolError`` and
``RemoteProtocolError``):

* *Who broke the protocol*: :class:`LocalProtocolError` (our own caller asked for
  something the protocol cannot express) and :class:`RemoteProtocolError` (the peer
  sent bytes we cannot accept). Both derive from the abstract :class:`ProtocolError`.
  Any input to :meth:`protocol.FrameDecoder.feed` either decodes or raises
  ``RemoteProtocolError``; anything else is a bug.
* *What went wrong in the broker's terms*: :class:`BrokerError` and one subclass per
  :class:`ErrorCode`. Each class holds its code as a class attribute (h2's
  ``exceptions.py``); the client turns a wire status back into the same class with
  :meth:`BrokerError.from_code`.

Codes are grouped in ranges by domain, after Iggy's ``iggy_error.rs``: below 1000
general and connection errors, 1000s streams, 2000s topics, 3000s partitions, 4000s
storage, 6000s messages, 7000s subscriptions and consumers. Status 0 means success.
A code, once published, keeps its number and meaning forever; ``docs/protocol.md``
lists them all and a test checks the two agree.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar

__all__ = [
    "ErrorCode",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "BrokerError",
]


class ErrorCode(IntEnum):
    """Every status a response or a per-message ack can carry.

    Each member's :attr:`description` is its one-line meaning, the text of the
    error table in ``docs/protocol.md``.
    """

    description: str

    def __new__(cls, value: int, description: str) -> ErrorCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    OK = 0, "success"

    # -- general and connection (1..999) -------------------------------------------
    INTERNAL_ERROR = 1, "an unexpected failure inside the broker; the message says what"
    UNKNOWN_COMMAND = 2, "the frame's command code is not one the broker knows"
    MALFORMED_FRAME = 3, "the frame header cannot be read; the connection is closed"
    FRAME_TOO_LARGE = 4, "the frame's declared length exceeds the maximum; the connection is closed"
    MALFORMED_PAYLOAD = 5, "the payload does not follow the command's layout"
    HANDSHAKE_REQUIRED = 6, "a command other than the handshake arrived before the handshake"
    UNSUPPORTED_VERSION = 7, "the client speaks a protocol version the broker does not"
    UNAUTHORIZED = 8, "the handshake's credentials (the auth token, or a user and password) are missing or wrong"
    TOO_MANY_CONNECTIONS = 9, "the broker is at its connection limit"
    SHUTTING_DOWN = 10, "the broker is shutting down and accepts no new work"
    INVALID_NAME = 11, "a stream, topic or consumer name breaks the naming rule"
    INVALID_IDENTIFIER = 12, "an identifier is neither a valid numeric id nor a valid name"
    INVALID_OPTIONS = 13, "the options map is malformed, has an unknown key or a value of the wrong type"
    HANDSHAKE_TIMEOUT = 14, "the connection did not complete its handshake in time; it is closed"
    SLOW_CONSUMER = 15, "the connection did not read what the broker sent it fast enough; it is closed"
    PERMISSION_DENIED = 20, "the user's permissions do not allow the subject the command acts on; the message names it"

    # -- streams (1000s) ---------------------------------------------------------
    STREAM_NOT_FOUND = 1001, "no stream has that id or name"
    STREAM_NAME_EXISTS = 1002, "a stream with that name already exists"
    STREAM_ID_EXISTS = 1003, "a stream with that id already exists"

    # -- topics (2000s) ----------------------------------------------------------
    TOPIC_NOT_FOUND = 2001, "the stream has no topic with that id or name"
    TOPIC_NAME_EXISTS = 2002, "a topic with that name already exists in the stream"
    TOPIC_ID_EXISTS = 2003, "a topic with that id already exists in the stream"
    INVALID_PARTITIONS_COUNT = 2004, "the partitions count is out of range"
    INVALID_SUBJECT_FILTER = 2005, "a subject filter is not a valid filter"
    SUBJECTS_OVERLAP = 2006, "a subject filter overlaps a filter of another topic"
    INVALID_TOPIC_CONFIG = 2007, "the topic configuration is invalid; the message gives the exact reason"
    PEDANTIC = 2008, "pedantic mode refused an automatic fix of the configuration"
    REPUBLISH_CYCLE = 2009, "a republish destination would close a loop through topics"
    INVALID_TRANSFORM = 2010, "a subject transform is invalid"
    NOT_A_BUCKET = 2011, "the topic is not a KV bucket"

    # -- partitions (3000s) ------------------------------------------------------
    PARTITION_NOT_FOUND = 3001, "the topic has no partition with that number"

    # -- storage (4000s) ---------------------------------------------------------
    CORRUPTED_RECORD = 4001, "the record failed its checksum or is truncated; it is never served"
    STORAGE_FAILURE = 4002, "the disk refused an operation (full, read-only, I/O error)"
    MEMORY_STORAGE_FULL = 4003, "the memory storage budget ([limits] memory_storage_bytes) is used up"

    # -- export (5000s) ----------------------------------------------------------
    EXPORT_NOT_CONFIGURED = 5001, "the broker has no export directory ([export] dir)"
    EXPORT_FAILED = 5002, "the export failed; the message says why and nothing was half-written"

    # -- messages (6000s) --------------------------------------------------------
    NO_TOPIC_FOR_SUBJECT = 6001, "no topic captures the subject; only core subscribers received it"
    INVALID_SUBJECT = 6002, "the subject is not a valid publish subject"
    PAYLOAD_TOO_LARGE = 6003, "the payload exceeds the maximum payload size"
    MESSAGE_NOT_FOUND = 6004, "no live message has that offset or subject"
    INVALID_MSG_TTL = 6005, "invalid per-message TTL"
    MSG_TTL_DISABLED = 6006, "per-message TTL is disabled"
    PURGE_DENIED = 6007, "the topic denies purges and deletes"
    ROLLUP_DENIED = 6008, "the message asks for a rollup the topic does not allow"
    INVALID_HEADERS = 6009, "a header name or value breaks the header rules"
    INVALID_MESSAGE_FLAGS = 6010, "message flags are reserved for the broker"
    INVALID_ROLLUP = 6011, "the Nats-Rollup header is neither 'sub' nor 'all'"
    WRONG_LAST_SEQUENCE = 6012, "the subject's last offset is not the one Nats-Expected-Last-Subject-Sequence names"
    INVALID_KEY = 6013, "a KV key or bucket name breaks the naming rule"
    DUPLICATE_MESSAGE = 6014, (
        "not an error: the Nats-Msg-Id was stored within the topic's duplicate window; "
        "the ack names the original's partition and offset"
    )
    WRONG_EXPECTED_STREAM = 6015, "the message's Nats-Expected-Stream does not name the topic that captures it"
    WRONG_LAST_MSG_ID = 6016, "the topic's last Nats-Msg-Id is not the one Nats-Expected-Last-Msg-Id names"
    SCHEDULES_DISABLED = 6030, "a message schedule header on a topic without allow_msg_schedules (the server's 10188)"
    INVALID_SCHEDULE_PATTERN = 6031, "the Nats-Schedule pattern is invalid (the server's 10189)"
    INVALID_SCHEDULE_TARGET = 6032, "the Nats-Schedule-Target is missing, invalid, the schedule's own subject or not the topic's (10190)"
    INVALID_SCHEDULE_TTL = 6033, "the Nats-Schedule-TTL is not a valid TTL (the server's 10191)"
    INVALID_SCHEDULE_ROLLUP = 6034, "the Nats-Schedule-Rollup (or the schedule's Nats-Rollup) is not 'sub' (10192)"
    INVALID_SCHEDULE_SOURCE = 6035, "the Nats-Schedule-Source is invalid, the target, the schedule's own subject or not the topic's (10203)"
    INVALID_SCHEDULER = 6036, "Nats-Scheduler / Nats-Schedule-Next used other than to purge a schedule (the server's 10212)"
    INVALID_SCHEDULE_TIME_ZONE = 6037, "the Nats-Schedule-Time-Zone is empty or not a zone (the server's 10223)"
    TOPIC_SEALED = 6040, "the topic is sealed: no message goes in or out (the server's 10109)"
    MSG_COUNTER_DISABLED = 6041, "a Nats-Incr message counter (ADR-49): ttlbroker has no counters (the server's 10168)"
    ATOMIC_PUBLISH_DISABLED = 6042, "a Nats-Batch-Id atomic batch (ADR-50): ttlbroker has no batches (the server's 10174)"
    MAX_MSGS_EXCEEDED = 6050, "discard new: the partition holds max_msgs messages (the server's 10077)"
    MAX_BYTES_EXCEEDED = 6051, "discard new: the message would take the partition past max_bytes (the server's 10077)"
    MAX_MSGS_PER_SUBJECT_EXCEEDED = 6052, (
        "discard new per subject: the subject holds max_msgs_per_subject messages (the server's 10077)"
    )
    MESSAGE_TOO_LARGE = 6053, "the message's headers and payload exceed the topic's max_msg_size (the server's 10054)"
    MIRROR_WITH_SUBJECTS = 6060, "a mirror captures no subjects: it holds only what it copies (the server's 10034)"
    MIRROR_WITH_SOURCES = 6061, "a mirror can not also have sources (the server's 10031)"
    MIRROR_NOT_UPDATABLE = 6062, (
        "a mirror's configuration can not change by update (removing it promotes the mirror; the server's 10055)"
    )
    MIRROR_WITH_FIRST_SEQ = 6063, "a mirror keeps its origin's sequences: it can not set first_seq (the server's 10143)"
    INVALID_MIRROR = 6064, (
        "the mirror's configuration is not valid: its name, start, filter or transforms (the server's 10142, 10032, "
        "10150, 10151, 10152, 10154)"
    )
    INVALID_SOURCE = 6065, (
        "a source's configuration is not valid: its name, a duplicate, its filter or transforms (the server's 10141, "
        "10140, 10144, 10145, 10146, 10147)"
    )
    ORIGIN_NOT_COPYABLE = 6067, "the origin topic has more than one partition: a copy reads one log (10052)"
    UNKNOWN_DOMAIN = 6070, "a mirror or source names a JetStream domain that is not this server's and no [[nats.remotes]] entry has"
    INVALID_EXTERNAL_API = 6071, "a mirror's or source's external.api is not $JS.<domain>.API, or it and its domain disagree"

    # -- subscriptions and consumers (7000s) -------------------------------------
    SUBSCRIPTION_EXISTS = 7001, "the connection already has a subscription with that id"
    SUBSCRIPTION_NOT_FOUND = 7002, "the connection has no subscription with that id"
    TOO_MANY_SUBSCRIPTIONS = 7003, "the connection is at its subscription limit"
    CONSUMER_OFFSET_NOT_FOUND = 7004, "the consumer has stored no offset for that partition"
    TOO_MANY_PENDING = 7005, "the connection has too much unacknowledged data in flight"
    CONSUMER_NOT_FOUND = 7006, "the topic has no consumer with that name (the server's 10014)"
    CONSUMER_EXISTS = 7007, "a consumer with that name exists with another configuration (the server's 10148)"
    CONSUMER_FILTERS_OVERLAP = 7008, "the consumer's subject filters overlap (the server's 10138)"
    INVALID_CONSUMER_CONFIG = 7009, "the consumer configuration is invalid; the message gives the exact reason"
    MAX_WAITING_EXCEEDED = 7010, "the consumer already holds max_waiting pull requests"
    NOT_A_MEMBER = 7011, "the connection is not a member of the partitioned consumer, or owns no partition"
    CONSUMER_UPDATE_DENIED = 7012, "the update changes a field of the consumer that cannot change"
    SUBSCRIPTION_BUDGET_EXCEEDED = 7013, (
        "the broker's subscriptions hold limits.max_subscription_bytes_total; nothing changed"
    )
    MAX_CONSUMERS_REACHED = 7020, "the topic has max_consumers consumers (the server's 10026)"


class ProtocolError(Exception):
    """The protocol was broken. Abstract: raise one of the two subclasses.

    Attributes:
        code: the :class:`ErrorCode` to report to the peer.
    """

    def __init__(self, message: str, code: ErrorCode = ErrorCode.MALFORMED_FRAME) -> None:
        if type(self) is ProtocolError:
            raise TypeError("ProtocolError is abstract; use LocalProtocolError or RemoteProtocolError")
        super().__init__(message)
        self.code = code


class LocalProtocolError(ProtocolError):
    """Our own side asked for something the protocol cannot express."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol.

    Attributes:
        correlation_id: the id of the frame that broke it (0: none could be read).
        frame_code: that frame's command code (0: none could be read).
    """

    correlation_id: int = 0
    frame_code: int = 0


class BrokerError(Exception):
    """An error with a stable numeric code, sent on the wire as a status.

    Each subclass fixes :attr:`code`; :meth:`from_code` picks the subclass for a code
    received from the wire, so ``except StreamNotFound`` works on the client exactly
    as in the broker.

    Attributes:
        code: the :class:`ErrorCode`.
        message: a readable sentence that says what went wrong.
    """

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL_ERROR
    _by_code: ClassVar[dict[int, type[BrokerError]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            BrokerError._by_code[int(cls.code)] = cls

    def __init__(self, message: str | None = None) -> None:
        self.message = message if message is not None else self.code.description
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.message} ({self.code.name} {int(self.code)})"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message,))

    @staticmethod
    def from_code(code: int, message: str) -> BrokerError:
        """Build the exception for a wire status (an unknown code gives a BrokerError).

        Runtime complexity: O(1).
        """
        cls = BrokerError._by_code.get(code)
        if cls is None:
            return UnknownBrokerError(code, message)
        return cls(message)


class UnknownBrokerError(BrokerError):
    """A status code this library does not know (sent by a newer broker)."""

    def __init__(self, raw_code: int, message: str) -> None:
        super().__init__(message)
        self.raw_code = raw_code

    def __str__(self) -> str:
        return f"{self.message} (code {self.raw_code})"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.raw_code, self.message))


# One class per code, named for the condition. Generated from the table above so the
# two cannot drift; each is exported from protocol (and broker.client) by name.
def _class_name(code: ErrorCode) -> str:
    return "".join(part.capitalize() for part in code.name.split("_")) + "Error"


ERROR_CLASSES: dict[ErrorCode, type[BrokerError]] = {}
for _code in ErrorCode:
    if _code is ErrorCode.OK:
        continue
    _cls = type(_class_name(_code), (BrokerError,), {"code": _code, "__doc__": _code.description, "__module__": "protocol"})
    ERROR_CLASSES[_code] = _cls
    globals()[_cls.__name__] = _cls
    __all__.append(_cls.__name__)
del _code, _cls


def error_class(code: ErrorCode) -> type[BrokerError]:
    """The exception class for ``code``."""
    return ERROR_CLASSES[code]
