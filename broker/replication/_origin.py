"""What a copy (a mirror, or one source of a sourcing topic) reads from: an origin.

An origin is a stream that may live in this broker (``LocalOrigin``: its partition
log, read directly) or on another server, a ttlbroker or a nats-server, reached as a
JetStream client (``RemoteOrigin``: a flow-controlled push consumer, as nats-server's
own mirrors and sources use). The copier (``broker.replication._copier``) does not
know which: it asks for batches from a sequence on, stores each batch through the
broker's one publish path, and asks for the next; the origin only moves on once the
copier asks again, which is the flow control.

Progress is never kept beside the copy: the copy's own stored messages say where it
is (a mirror's last offset is the origin's last copied sequence; a source's last
``Nats-Stream-Source`` header names its origin sequence), so after any crash the copy
resumes from what it durably holds, with no gap and no duplicate.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol

__all__ = ["OriginMessage", "Origin", "OriginGone", "OriginUnavailable"]


@dataclass(frozen=True, slots=True)
class OriginMessage:
    #: The message's sequence in the origin stream.
    seq: int
    subject: str
    #: The NATS header block as on the wire (``NATS/1.0\r\n...\r\n\r\n``), b"" for none.
    headers: bytes
    payload: bytes
    #: When the origin stored it (ns since the epoch).
    timestamp_ns: int
    #: How many messages the origin holds after this one for this copy (its lag).
    pending: int


class OriginGone(Exception):
    """The origin stream does not exist (deleted, or never created): reported, and
    retried only slowly (``docs/operations.md``)."""


class OriginUnavailable(Exception):
    """The origin cannot be reached now (a connection lost or refused, a timeout): the
    copier retries with a backoff from the last sequence it stored."""


class Origin(Protocol):
    #: How logs and stream info name it (the stream name, with the remote's domain).
    label: str

    def batches(
        self, start_seq: int, start_time_ns: int | None, filters: tuple[str, ...],
    ) -> AsyncGenerator[list[OriginMessage], None]:
        """The origin's messages from ``start_seq`` on (or, with ``start_time_ns`` and
        ``start_seq`` 0, from the first stored at or after that time), in sequence
        order, only those whose subject matches one of ``filters`` (none: all), in
        batches. An empty batch: nothing new, but the origin is there (a heartbeat;
        the copy is *active*). The next batch is fetched only when the caller asks,
        after it stored the last one.

        Raises (from the iteration):
            OriginGone: the origin stream does not exist.
            OriginUnavailable: it cannot be reached; iterate again later.
        """
        ...
