"""The headers of a republished message (ADR-28, SEMANTICS 6.3), as bytes.

A republished message carries the stored message's headers, then, in the NATS
server's order, ``Nats-Stream``, ``Nats-Subject``, ``Nats-Sequence``,
``Nats-Time-Stamp``, ``Nats-Last-Sequence`` and, for ``headers_only``,
``Nats-Msg-Size``; then ttlbroker's hop count ``TTLB-Hops`` (replacing any the stored
message had), which the broker uses to stop loops that configuration cannot see.
"""

from __future__ import annotations

import datetime as _dt

from ._records import _iter_header_block, encode_headers

__all__ = ["HOPS_HEADER", "rfc3339_ns", "republish_headers", "hops_of"]

HOPS_HEADER = "TTLB-Hops"
_HOPS = HOPS_HEADER.encode()
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def rfc3339_ns(ns: int) -> str:
    """UTC RFC 3339 with nanoseconds, trailing zeros trimmed (Go's RFC3339Nano):
    ``2024-05-01T10:00:00.123456789Z``, ``2024-05-01T10:00:00Z``."""
    secs, frac = divmod(ns, 1_000_000_000)
    base = (_EPOCH + _dt.timedelta(seconds=secs)).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{frac:09d}".rstrip("0").rstrip(".") + "Z"


def hops_of(block: bytes | memoryview) -> int:
    """The hop count a header block carries (0 without one, or with a bad one)."""
    for key, value in _iter_header_block(block):
        if key == _HOPS:
            v = value.strip(b" ")
            return int(v) if v.isdigit() and len(v) < 6 else 0
    return 0


def republish_headers(
    stored: bytes | memoryview,
    stream_topic: str,
    subject: str,
    offset: int,
    timestamp_ns: int,
    last_offset: int,
    msg_size: int | None,
    hops: int,
) -> bytes:
    """The header block of a republished message (``msg_size`` given for
    ``headers_only``)."""
    kept = bytes(stored)
    if hops_of(kept):
        kept = encode_headers([(k.decode("ascii"), v.decode()) for k, v in _iter_header_block(kept) if k != _HOPS])
    ours = [
        ("Nats-Stream", stream_topic),
        ("Nats-Subject", subject),
        ("Nats-Sequence", str(offset)),
        ("Nats-Time-Stamp", rfc3339_ns(timestamp_ns)),
        ("Nats-Last-Sequence", str(last_offset)),
    ]
    if msg_size is not None:
        ours.append(("Nats-Msg-Size", str(msg_size)))
    ours.append((HOPS_HEADER, str(hops)))
    return kept + encode_headers(ours)
