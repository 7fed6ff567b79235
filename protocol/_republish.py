"""The headers of a republished message (ADR-28, ``docs/semantics.md`` §13.4), as bytes.

A republished message carries the stored message's headers, then, in the NATS
server's order, ``Nats-Stream``, ``Nats-Subject``, ``Nats-Sequence``,
``Nats-Time-Stamp``, ``Nats-Last-Sequence`` and, for ``headers_only``,
``Nats-Msg-Size``; then ttlbroker's hop count ``TTLB-Hops`` (replacing any the stored
message had), which the broker uses to stop loops that configuration cannot see.

Speed: a batch's copies are built in one pass (:func:`republish_bodies`), each with
one join and no object of its own. What the copies of one subject (and stored header
block) share is packed once per batch (:func:`copy_plan`), the timestamp once per
append, and the rest of each copy is two numbers. The values are the broker's own (a
validated subject and name, digits, a timestamp), so they are packed without the
checks a publisher's headers get.
"""

from __future__ import annotations

import datetime as _dt
import struct

from ._records import BODY, FIXED_SIZE, RECORD_FIXED, _iter_header_block, encode_headers

__all__ = ["HOPS_HEADER", "copy_plan", "hops_of", "record_keys", "republish_bodies", "rfc3339_ns"]

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


# A name and the length of a value of n digits (an offset, a size), for n < 21.
_SEQUENCE_N, _LAST_N, _SIZE_N = ([name + _U16.pack(n) for n in range(21)] for name in (_SEQUENCE, _LAST, _SIZE))
_SEQUENCE_LAST_LEN = len(_SEQUENCE_N[0]) + len(_LAST_N[0])
_SIZE_LEN = len(_SIZE_N[0])


def record_keys(records: bytes | bytearray, positions: list[int]) -> list[tuple[bytes, bytes]]:
    """The subject and header block (``b""`` for none) of each record: what decides
    whether and where it is republished, and with which hop count."""
    unpack = RECORD_FIXED.unpack_from
    out: list[tuple[bytes, bytes]] = []
    append = out.append
    for pos in positions:
        sl, hl = unpack(records, pos)[6:8]
        s = pos + FIXED_SIZE
        append((bytes(records[s : s + sl]), bytes(records[s + sl : s + sl + hl]) if hl else b""))
    return out


def copy_plan(dest: str, stored: bytes, stream_topic: str, subject: str, hops: int) -> tuple[bytes, bytes, bytes]:
    """What every copy of the messages on ``subject`` with the header block ``stored``
    shares: ``(destination subject, headers before Nats-Sequence, the TTLB-Hops
    header)``. The stored headers are kept but for a ``TTLB-Hops``, which the copy's
    own replaces. ``stream_topic`` and ``subject`` must be a valid topic name and
    subject (they are not checked again)."""
    kept = stored
    if kept and _HOPS in kept:
        kept = encode_headers([(k.decode("ascii"), v.decode()) for k, v in _iter_header_block(kept) if k != _HOPS])
    head = kept + _pair(_STREAM, stream_topic) + _pair(_SUBJECT, subject)
    return dest.encode(), head, _pair(_HOPS_NAME, str(hops))


def republish_bodies(
    records: bytes | bytearray,
    positions: list[int],
    plans: list[tuple[bytes, bytes, bytes] | None],
    last_offsets: list[int],
    headers_only: bool,
) -> list[bytes]:
    """The message bodies of the copies of ``records`` (one per record whose plan,
    from :func:`copy_plan`, is not None), headers in the server's order: the plan's
    head, ``Nats-Sequence``, ``Nats-Time-Stamp``, ``Nats-Last-Sequence`` (from
    ``last_offsets``), ``Nats-Msg-Size`` with ``headers_only`` (then the payload is
    empty), and the plan's ``TTLB-Hops``. The TTL field and flags are 0.

    Runtime complexity: O(copies); per copy one unpack, two numbers formatted and one
    join (the timestamp is formatted once per distinct value)."""
    unpack = RECORD_FIXED.unpack_from
    pack = BODY.pack
    join = b"".join
    out: list[bytes] = []
    append = out.append
    stamped = -1
    time_pair = b""
    for k, plan in enumerate(plans):
        if plan is None:
            continue
        dest, head, tail = plan
        pos = positions[k]
        _, _, offset, ts, _, _, sl, hl, pl = unpack(records, pos)
        if ts != stamped:
            stamped = ts
            time_pair = _pair(_TIME, rfc3339_ns(ts))
        seq = b"%d" % offset
        last = b"%d" % last_offsets[k]
        if headers_only:
            size = b"%d" % pl
            hlen = len(head) + len(tail) + len(time_pair) + len(seq) + len(last) + len(size) + _SEQUENCE_LAST_LEN + _SIZE_LEN
            append(join((
                pack(0, 0, len(dest), hlen, 0), dest, head, _SEQUENCE_N[len(seq)], seq, time_pair,
                _LAST_N[len(last)], last, _SIZE_N[len(size)], size, tail,
            )))
        else:
            start = pos + FIXED_SIZE + sl + hl
            hlen = len(head) + len(tail) + len(time_pair) + len(seq) + len(last) + _SEQUENCE_LAST_LEN
            append(join((
                pack(0, 0, len(dest), hlen, pl), dest, head, _SEQUENCE_N[len(seq)], seq, time_pair,
                _LAST_N[len(last)], last, tail, records[start : start + pl],
            )))
    return out
