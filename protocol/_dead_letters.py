"""Dead letters (a ttlbroker extension): the copy of a message a consumer gave up, as
bytes (``docs/semantics.md``, "Dead letters").

A copy is published on the consumer's ``dead_letter_subject`` with the stored
message's payload and headers (less the ones below, which a copy of a copy would
otherwise repeat, and less ``Nats-TTL``, ``Nats-Rollup`` and ``TTLB-Hops``, which
would act on the dead-letter stream), followed by the headers naming its origin, in
the style of nats-server's ``Nats-Stream-Source`` / ``Nats-Sequence`` family::

    Nats-DLQ-Stream       the NATS stream name (else the topic, as stream/topic)
    Nats-DLQ-Subject      the subject it was stored under
    Nats-DLQ-Partition    its partition
    Nats-DLQ-Sequence     its offset in that partition (the NATS stream sequence)
    Nats-DLQ-Consumer     the consumer that gave it up
    Nats-DLQ-Reason       MaxDeliveries, Terminated, Expired (TTL, max age), Limit
    Nats-DLQ-Deliveries   how many times it was delivered
    Nats-DLQ-Time-Stamp   when it was dead-lettered (RFC 3339, UTC)
"""

from __future__ import annotations

from typing import NamedTuple

from ._records import TTL_NONE, _iter_header_block, encode_body, encode_headers, read_record_info, record_spans
from ._republish import HOPS_HEADER, rfc3339_ns

__all__ = ["DLQ_HEADERS", "DLQ_REASONS", "DeadLetterOrigin", "dead_letter_body", "dead_letter_origin", "redriven_body"]

#: The reasons a message is dead-lettered, as ``Nats-DLQ-Reason`` says them.
#: Their index is the reason's code in the consumer journal: append only.
DLQ_REASONS = ("MaxDeliveries", "Terminated", "Expired", "Limit")

DLQ_HEADERS = (
    "Nats-DLQ-Stream", "Nats-DLQ-Subject", "Nats-DLQ-Partition", "Nats-DLQ-Sequence", "Nats-DLQ-Consumer",
    "Nats-DLQ-Reason", "Nats-DLQ-Deliveries", "Nats-DLQ-Time-Stamp",
)
_PREFIX = b"Nats-DLQ-"
_DROPPED = {b"Nats-TTL", b"Nats-Rollup", HOPS_HEADER.encode()}


class DeadLetterOrigin(NamedTuple):
    """Where a dead letter comes from (what tells one copy from another)."""

    stream: str
    partition: int
    sequence: int
    consumer: str


def dead_letter_body(
    record: bytes | memoryview, dest: str, stream: str, partition: int, consumer: str, reason: str, deliveries: int,
    now_ns: int,
) -> bytes:
    """The body of the dead-letter copy of the stored ``record``, on ``dest``."""
    info = read_record_info(record, 0)
    _, _, _, _, payload_at, end = record_spans(record)
    kept = [
        (k.decode("ascii"), v.decode())
        for k, v in _iter_header_block(info.headers)
        if not k.startswith(_PREFIX) and k not in _DROPPED
    ]
    origin = (
        stream, info.subject.decode(), str(partition), str(info.offset), consumer, reason, str(deliveries),
        rfc3339_ns(now_ns),
    )
    headers = encode_headers(kept + list(zip(DLQ_HEADERS, origin)))
    return encode_body(dest, bytes(record[payload_at:end]), headers, TTL_NONE)


def dead_letter_origin(headers: bytes | memoryview) -> DeadLetterOrigin | None:
    """The origin a dead letter's header block names (None: it is not one)."""
    found: dict[bytes, bytes] = {}
    for k, v in _iter_header_block(headers):
        if k.startswith(_PREFIX) and k not in found:
            found[k] = v
    try:
        return DeadLetterOrigin(
            found[b"Nats-DLQ-Stream"].decode(), int(found[b"Nats-DLQ-Partition"]),
            int(found[b"Nats-DLQ-Sequence"]), found[b"Nats-DLQ-Consumer"].decode(),
        )
    except (KeyError, ValueError):
        return None


def redriven_body(record: bytes | memoryview) -> bytes | None:
    """A stored dead letter as it is published again (redrive): on its
    ``Nats-DLQ-Subject``, with its headers less the ``Nats-DLQ-*`` ones. None: the
    record is no dead letter."""
    info = read_record_info(record, 0)
    _, _, _, _, payload_at, end = record_spans(record)
    subject = b""
    kept = []
    for k, v in _iter_header_block(info.headers):
        if k.startswith(_PREFIX):
            if k == b"Nats-DLQ-Subject" and not subject:
                subject = v
        else:
            kept.append((k.decode("ascii"), v.decode()))
    if not subject:
        return None
    return encode_body(subject, bytes(record[payload_at:end]), encode_headers(kept), TTL_NONE)
