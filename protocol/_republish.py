"""The headers of a republished message (ADR-28, SEMANTICS 6.3), as bytes.

A republished message carries the stored message's headers, then, in the NATS
server's order, ``Nats-Stream``, ``Nats-Subject``, ``Nats-Sequence``,
``Nats-Time-Stamp``, ``Nats-Last-Sequence`` and, for ``headers_only``,
``Nats-Msg-Size``; then ttlbroker's hop count ``TTLB-Hops`` (replacing any the stored
message had), which the broker uses to stop loops that configuration cannot see.

Speed: this runs once per republished message. The names are encoded once, the
values are the broker's own (a validated subject and name, digits, a timestamp), so
they are packed without the checks a publisher's headers get, and the date part of
the timestamp is formatted once per second.
"""

from __future__ import annotations

import datetime as _dt
import struct

from ._records import _iter_header_block, encode_headers

__all__ = ["HOPS_HEADER", "rfc3339_ns", "republish_headers", "hops_of"]

HOPS_HEADER = "TTLB-Hops"
_HOPS = HOPS_HEADER.encode()
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_U16 = struct.Struct("<H")


def _name(text: str) -> bytes:
    raw = text.encode("ascii")
    return bytes((len(raw),)) + raw


_STREAM, _SUBJECT, _SEQUENCE, _TIME, _LAST, _SIZE, _HOPS_NAME = map(
    _name, ("Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Last-Sequence", "Nats-Msg-Size", HOPS_HEADER)
)

_second_cache: tuple[int, str] = (-1, "")


def rfc3339_ns(ns: int) -> str:
    """UTC RFC 3339 with nanoseconds, trailing zeros trimmed (Go's RFC3339Nano):
    ``2024-05-01T10:00:00.123456789Z``, ``2024-05-01T10:00:00Z``."""
    global _second_cache
    secs, frac = divmod(ns, 1_000_000_000)
    cached_secs, base = _second_cache
    if secs != cached_secs:
        base = (_EPOCH + _dt.timedelta(seconds=secs)).strftime("%Y-%m-%dT%H:%M:%S")
        _second_cache = (secs, base)
    if not frac:
        return base + "Z"
    return f"{base}.{frac:09d}".rstrip("0") + "Z"


def hops_of(block: bytes | memoryview) -> int:
    """The hop count a header block carries (0 without one, or with a bad one)."""
    for key, value in _iter_header_block(block):
        if key == _HOPS:
            v = value.strip(b" ")
            return int(v) if v.isdigit() and len(v) < 6 else 0
    return 0


def _pair(name: bytes, value: str) -> bytes:
    raw = value.encode()
    return name + _U16.pack(len(raw)) + raw


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
    ``headers_only``). ``stream_topic`` and ``subject`` must be a valid topic name
    and subject (they are not checked again)."""
    kept = bytes(stored)
    if kept and _HOPS in kept:
        kept = encode_headers([(k.decode("ascii"), v.decode()) for k, v in _iter_header_block(kept) if k != _HOPS])
    parts = [
        kept,
        _pair(_STREAM, stream_topic),
        _pair(_SUBJECT, subject),
        _pair(_SEQUENCE, str(offset)),
        _pair(_TIME, rfc3339_ns(timestamp_ns)),
        _pair(_LAST, str(last_offset)),
    ]
    if msg_size is not None:
        parts.append(_pair(_SIZE, str(msg_size)))
    parts.append(_pair(_HOPS_NAME, str(hops)))
    return b"".join(parts)
