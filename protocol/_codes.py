"""Command codes, push kinds and the other small enumerations of the wire format.

Command codes are grouped by hundreds like Iggy's ``codes.rs`` (ping 1, messages in
the 100s, consumer offsets 120s, streams 200s, topics 300s). A response echoes the
code of the command it answers; a push carries a :class:`PushKind` in the same field
with the PUSH flag set (see ``_frames.py``).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Command", "PushKind", "MarkerReason", "RemovalReason", "PROTOCOL_VERSION", "HANDSHAKE_MAGIC"]

#: The version a client names in its handshake. The broker answers with the highest
#: version it shares with the client or refuses with UNSUPPORTED_VERSION.
PROTOCOL_VERSION = 1

#: The first four bytes of every handshake payload, so that a client of some other
#: protocol (or a stray HTTP request) is refused on its first frame.
HANDSHAKE_MAGIC = b"TTLB"


class Command(IntEnum):
    """Request command codes."""

    #: Open the session: magic, protocol version, auth token, client name.
    HANDSHAKE = 1
    #: Liveness check; the response is empty.
    PING = 2
    #: Server identity, version and limits (msgpack map).
    SERVER_INFO = 10
    #: Counters of the whole broker (msgpack map).
    STATS = 11

    #: Publish a batch of messages; one ack per message.
    PUBLISH = 100
    #: Read a range of records of one partition.
    FETCH = 101
    #: The newest live message on one subject of a topic.
    GET_LAST = 102
    #: Delete one message by partition and offset.
    DELETE_MESSAGE = 103
    #: Purge a whole topic, or one subject of it.
    PURGE = 104
    #: Start a core subscription on a subject filter.
    SUBSCRIBE = 110
    #: End a core subscription.
    UNSUBSCRIBE = 111

    #: Store a named consumer's offset for one partition.
    STORE_CONSUMER_OFFSET = 120
    #: Read a named consumer's offset for one partition.
    GET_CONSUMER_OFFSET = 121
    #: Forget a named consumer's offset for one partition.
    DELETE_CONSUMER_OFFSET = 122

    #: Create a durable consumer (idempotent with the same configuration).
    CREATE_CONSUMER = 130
    #: Change what may change of a consumer's configuration.
    UPDATE_CONSUMER = 131
    #: A consumer's configuration, counters and state per partition.
    CONSUMER_INFO = 132
    #: The info of every consumer of a topic.
    LIST_CONSUMERS = 133
    #: Delete a consumer and all its state.
    DELETE_CONSUMER = 134
    #: Ask a consumer for messages (waits up to ``expires_ms`` unless no_wait).
    PULL = 135
    #: Settle deliveries: ack, nak, term, in progress.
    ACK = 136
    #: Join a partitioned consumer as a named member.
    JOIN_GROUP = 137
    #: Leave a partitioned consumer.
    LEAVE_GROUP = 138
    #: End this connection's waiting pulls on a consumer (a consume loop stops).
    END_PULLS = 139
    #: Publish a dead-letter topic's copies again on their original subjects.
    REDRIVE = 140

    #: Details of one stream, with its topics.
    GET_STREAM = 200
    #: Summaries of every stream.
    LIST_STREAMS = 201
    #: Create a stream (Apache Iggy's layout).
    CREATE_STREAM = 202
    #: Delete a stream and everything in it.
    DELETE_STREAM = 203
    #: Rename a stream.
    UPDATE_STREAM = 204

    #: Details of one topic.
    GET_TOPIC = 300
    #: Details of every topic of a stream.
    LIST_TOPICS = 301
    #: Create a topic (Apache Iggy's layout, then the options map).
    CREATE_TOPIC = 302
    #: Delete a topic and all its messages.
    DELETE_TOPIC = 303
    #: Change a topic's options.
    UPDATE_TOPIC = 304

    #: Export sealed segments to Parquet now (optionally sealing active ones first).
    EXPORT = 500

    #: A key of a KV bucket, with the bucket's refresh and visibility rules applied.
    KV_GET = 700
    #: Extend a key's TTL without writing a new revision.
    KV_TOUCH = 701
    #: The keys of a KV bucket that hold a value.
    KV_KEYS = 702


class PushKind(IntEnum):
    """Kinds of frames the broker sends without being asked."""

    #: Messages for one core subscription.
    DELIVERY = 1
    #: The broker is closing the connection; the payload says why.
    GOODBYE = 2
    #: Messages for a waiting PULL (the frame's correlation id is the pull's).
    PULL_MESSAGES = 3


class MarkerReason(IntEnum):
    """Why the broker wrote a subject delete marker (ADR-43), in the record's flags.

    The same reason is also in the marker's ``Nats-Marker-Reason`` header.
    """

    #: Not a marker.
    NONE = 0
    #: The subject's last message was removed by max age or by its TTL.
    MAX_AGE = 1
    #: The subject's last message was removed by the delete-message API.
    REMOVE = 2
    #: The subject was purged.
    PURGE = 3

    @property
    def header_value(self) -> str:
        """The ``Nats-Marker-Reason`` header value (``MaxAge``, ``Remove``, ``Purge``)."""
        return _REASON_TEXT[self]

    @classmethod
    def from_header_value(cls, text: str) -> MarkerReason | None:
        return _REASON_BY_TEXT.get(text)


_REASON_TEXT = {
    MarkerReason.NONE: "",
    MarkerReason.MAX_AGE: "MaxAge",
    MarkerReason.REMOVE: "Remove",
    MarkerReason.PURGE: "Purge",
}
_REASON_BY_TEXT = {v: k for k, v in _REASON_TEXT.items() if v}


class RemovalReason(IntEnum):
    """Why a message was removed: the tag kept with each deletion on disk (4 bits),
    the keys of the removal counters, and the export's ``removed_reason`` column."""

    #: Not recorded (a deletion written before reasons were kept).
    UNKNOWN = 0
    #: Its per-message TTL ran out.
    TTL = 1
    #: The topic's max age removed it.
    MAX_AGE = 2
    #: The delete-message API.
    DELETE = 3
    #: A purge (of the topic or of its subject).
    PURGE = 4
    #: A later message's ``Nats-Rollup`` header.
    ROLLUP = 5
    #: The topic's ``max_msgs_per_subject``.
    MAX_MSGS_PER_SUBJECT = 6
    #: Work-queue or interest retention: every consumer that wanted it settled it
    #: (or, with interest retention, no consumer wanted it when it was published).
    ACKED = 7
    #: The topic's ``max_msgs`` or ``max_bytes`` with discard ``old``: the oldest
    #: messages made room.
    LIMITS = 8
    #: Unreadable (damaged on disk) and written off by ``ttlbroker repair``; its bytes
    #: are kept in the data directory's ``quarantine/``.
    DAMAGED = 15

    @property
    def label(self) -> str:
        """``ttl``, ``max_age``, ``delete``, ``purge``, ``rollup``, ``max_msgs_per_subject``, ``acked``, ``limits``."""
        return self.name.lower()
