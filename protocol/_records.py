"""The message and record byte layouts, shared by the wire and the disk.

A *message body* is what a publisher sends. It is stored as it arrived, except that
the broker writes the effective TTL into ``ttl`` and its own bits into ``flags``
(and rewrites ``Nats-TTL`` under the minimum-TTL rule)::

    offset  size  field
    0       4     ttl            u32 LE seconds; 0 = none, 0xFFFFFFFF = never
    4       1     flags          bits 0-1 marker reason (0 = not a marker); bit 2
                                 no-marker (``FLAG_NO_MARKER``); others 0. A
                                 publisher sends 0: the bits are the broker's
    5       1     subject_len    1..255
    6       4     headers_len    length of the header block
    10      4     payload_len
    14      ...   subject (UTF-8), header block, payload

A *record* is a body with the broker's stamp in front. It is the unit of the segment
files and also what a fetch, a get-last or a delivery sends, byte for byte::

    0       4     length         u32 LE, bytes after this field (20 + body length)
    4       4     crc32          zlib CRC-32 of bytes 8 .. 4+length
    8       8     offset         u64 LE, per partition, from 1, never reused
    16      8     timestamp      u64 LE nanoseconds since the Unix epoch (broker clock)
    24      ...   body

The header block is a run of ``u8 name_len | name | u16 value_len | value``. Names
are 1..255 bytes of visible ASCII without ``:`` (spaces allowed between characters); values at most 65535 bytes of UTF-8
without CR or LF, so every header set can also travel as NATS headers. A name may
repeat; readers take the first occurrence, as the NATS server does
(``docs/semantics.md`` §2.6).

Speed: the broker builds records for a whole batch in one pass
(:func:`build_records`) and the client decodes a fetched run of records in one pass
(:func:`decode_records`); neither builds an intermediate object per message.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from ._codes import MarkerReason
from ._errors import ErrorCode, RemoteProtocolError, error_class
from ._ttl import TTL_NEVER, TTL_NONE

__all__ = [
    "BODY",
    "RECORD_HEADER",
    "RECORD_FIXED",
    "TTL_NONE",
    "TTL_NEVER",
    "MARKER_MASK",
    "encode_headers",
    "decode_headers",
    "find_header",
    "header_values",
    "checked_header_values",
    "encode_body",
    "replace_header",
    "restamp_body",
    "resubject_body",
    "FLAG_NO_MARKER",
    "FLAG_TOMBSTONE",
    "BodyFields",
    "body_fields",
    "PublishScan",
    "scan_bodies",
    "build_records",
    "encode_record",
    "RecordInfo",
    "read_record_info",
    "record_spans",
    "check_record",
    "Message",
    "decode_records",
    "split_records",
]

BODY = struct.Struct("<IBBII")  # ttl, flags, subject_len, headers_len, payload_len
RECORD_HEADER = struct.Struct("<IIQQ")  # length, crc32, offset, timestamp_ns
RECORD_FIXED = struct.Struct("<IIQQIBBII")  # record header + body header, 38 bytes
_LEN_CRC = struct.Struct("<II")
_OFF_TS = struct.Struct("<QQ")
_U16 = struct.Struct("<H")
_TTL_FLAGS = struct.Struct("<IB")  # the first two fields of a body

BODY_SIZE = BODY.size  # 14
HEADER_SIZE = RECORD_HEADER.size  # 24
FIXED_SIZE = RECORD_FIXED.size  # 38

MARKER_MASK = 0x03
#: Set by the broker on a message whose removal by age must not leave a marker (a KV
#: purge tombstone, ``KV-Operation: PURGE``: ``docs/semantics.md`` §9.2).
FLAG_NO_MARKER = 0x04
#: Set by the broker on a KV tombstone (``KV-Operation: DEL`` or ``PURGE``).
FLAG_TOMBSTONE = 0x08


# -- headers -----------------------------------------------------------------------


def _bad_header(msg: str) -> Exception:
    return error_class(ErrorCode.INVALID_HEADERS)(msg)


_NAME_CHARS = bytes(b for b in range(33, 127) if b != 58)  # visible ASCII but ':'
_NAME_CHARS_AND_SPACE = _NAME_CHARS + b" "
_NAME_RULE = "may only contain visible ASCII characters other than ':', and spaces between them"


def _bad_name(raw: bytes | memoryview) -> bool:
    """Does a header name break the rule: visible ASCII but ':', with spaces allowed
    between two characters (nats-server stores ``my key: v`` as it is)."""
    raw = bytes(raw)
    return bool(raw.translate(None, _NAME_CHARS_AND_SPACE)) or raw[:1] == b" " or raw[-1:] == b" "


def _check_header_name(name: str) -> bytes:
    if not isinstance(name, str):
        raise _bad_header(f"header name must be a string, not {type(name).__name__}")
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:
        raise _bad_header(f"header name {name!r} {_NAME_RULE}") from None
    if not 1 <= len(raw) <= 255:
        raise _bad_header(f"header name {name!r} must be 1..255 bytes")
    if raw.translate(None, _NAME_CHARS) and _bad_name(raw):  # control, DEL, ':' or a space at an end
        raise _bad_header(f"header name {name!r} {_NAME_RULE}")
    return raw


def _check_header_value(name: str, value: str) -> bytes:
    if not isinstance(value, str):
        raise _bad_header(f"header {name!r} value must be a string, not {type(value).__name__}")
    raw = value.encode()
    if len(raw) > 0xFFFF:
        raise _bad_header(f"header {name!r} value is longer than 65535 bytes")
    if b"\r" in raw or b"\n" in raw:
        raise _bad_header(f"header {name!r} value must not contain CR or LF")
    return raw


#: Checked header names -> their encoded ``u8 name_len | name`` (a client sends the
#: same few names again and again); bounded: cleared when full.
_NAME_HEADS: dict[str, bytes] = {}
_NAME_HEADS_MAX = 256


def _name_head(name: str) -> bytes:
    """The checked name's ``u8 name_len | name``, kept in ``_NAME_HEADS``."""
    raw = _check_header_name(name)
    head = bytes((len(raw),)) + raw
    if name.__class__ is str:
        if len(_NAME_HEADS) >= _NAME_HEADS_MAX:
            _NAME_HEADS.clear()
        _NAME_HEADS[name] = head
    return head


def encode_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> bytes:
    """Encode headers (a mapping, or pairs to allow repeated names) as a header block.

    Raises:
        InvalidHeadersError: a name or value breaks the header rules.
    """
    if not headers:
        return b""
    items = headers.items() if headers.__class__ is dict or isinstance(headers, Mapping) else headers
    parts: list[bytes] = []
    u16 = _U16.pack
    for name, value in items:
        head = _NAME_HEADS.get(name) if name.__class__ is str else None
        if head is None:
            head = _name_head(name)
        if value.__class__ is str:
            rv = value.encode()
            if len(rv) > 0xFFFF or b"\r" in rv or b"\n" in rv:
                rv = _check_header_value(name, value)  # raises
        else:
            rv = _check_header_value(name, value)  # raises
        parts += (head, u16(len(rv)), rv)
    return b"".join(parts)


def _iter_header_block(block: bytes | memoryview) -> Iterable[tuple[bytes, bytes]]:
    pos, end = 0, len(block)
    while pos < end:
        nlen = block[pos]
        npos = pos + 1
        vpos = npos + nlen + 2
        if nlen == 0 or vpos > end:
            raise _bad_header("header block is truncated or has an empty name")
        vlen = _U16.unpack_from(block, npos + nlen)[0]
        vend = vpos + vlen
        if vend > end:
            raise _bad_header("header block is truncated")
        yield bytes(block[npos : npos + nlen]), bytes(block[vpos:vend])
        pos = vend


def decode_headers(block: bytes | memoryview) -> dict[str, str]:
    """Decode a header block; the first occurrence of a repeated name wins.

    Raises:
        InvalidHeadersError: the block is malformed.
    """
    out: dict[str, str] = {}
    for name, value in _iter_header_block(block):
        try:
            key = name.decode("ascii")
            text = value.decode()
        except UnicodeDecodeError:
            raise _bad_header("header name or value is not valid text") from None
        out.setdefault(key, text)
    return out


def validate_header_block(block: bytes | memoryview) -> None:
    """Check a header block received from a peer against the header rules.

    Raises:
        InvalidHeadersError: the block is malformed or breaks a rule.
    """
    checked_header_values(bytes(block), frozenset())


def checked_header_values(block: bytes, names: frozenset[bytes]) -> dict[bytes, bytes]:
    """Check a header block received from a peer against the header rules and, in
    the same pass, return the first value of each header in ``names`` (leading
    spaces skipped, as :func:`header_values` does).

    Raises:
        InvalidHeadersError: the block is malformed or breaks a rule.
    """
    return _walk_headers(block, names, True)


def _walk_headers(block: bytes, names: frozenset[bytes], check: bool) -> dict[bytes, bytes]:
    """One pass over a header block: the first value of each header in ``names``,
    leading spaces skipped; with ``check``, every name and value against the rules."""
    out: dict[bytes, bytes] = {}
    pos, end = 0, len(block)
    while pos < end:
        nlen = block[pos]
        npos = pos + 1
        vpos = npos + nlen + 2
        if nlen == 0 or vpos > end:
            raise _bad_header("header block is truncated or has an empty name")
        vend = vpos + (block[vpos - 2] | block[vpos - 1] << 8)
        if vend > end:
            raise _bad_header("header block is truncated")
        name = block[npos : npos + nlen]
        if check:
            value = block[vpos:vend]
            if name.translate(None, _NAME_CHARS) and _bad_name(name):
                raise _bad_header(f"header name {name!r} {_NAME_RULE}")
            if b"\r" in value or b"\n" in value:
                raise _bad_header(f"header {name.decode('ascii')!r} value must not contain CR or LF")
            if not value.isascii():
                try:
                    value.decode()
                except UnicodeDecodeError:
                    raise _bad_header(f"header {name.decode('ascii')!r} value is not UTF-8") from None
        if name in names and name not in out:
            out[name] = block[vpos:vend].lstrip(b" ")
        pos = vend
    return out


def find_header(block: bytes | memoryview, name: bytes) -> bytes | None:
    """The value of the first header called ``name`` (exact, case-sensitive), or None.

    Leading spaces of the value are skipped, as the NATS server's header reader does
    (``docs/semantics.md`` §2.6); trailing ones are kept.
    """
    for key, value in _iter_header_block(block):
        if key == name:
            return value.lstrip(b" ")
    return None


def header_values(block: bytes | memoryview, names: frozenset[bytes]) -> dict[bytes, bytes]:
    """The first value of each header in ``names`` that the block has, in one pass
    (leading spaces skipped, as :func:`find_header`); the block is not checked
    against the header rules (it was, on its way in)."""
    return _walk_headers(block if block.__class__ is bytes else bytes(block), names, False)


# -- message bodies ----------------------------------------------------------------


def _malformed(msg: str) -> Exception:
    return error_class(ErrorCode.MALFORMED_PAYLOAD)(msg)


def encode_body(
    subject: str | bytes,
    payload: bytes | bytearray | memoryview = b"",
    headers: bytes = b"",
    ttl: int = TTL_NONE,
    flags: int = 0,
    prefix: bytes = b"",
) -> bytes:
    """Encode one message body. ``headers`` is an encoded header block. ``prefix``
    goes in front, in the same join (``PUBLISH_ONE``: a one-message PUBLISH payload).

    Callers validate subjects; this only checks lengths.

    Raises:
        InvalidSubjectError: the subject is empty or longer than 255 bytes.
    """
    subj = subject.encode() if isinstance(subject, str) else subject
    if not 1 <= len(subj) <= 255:
        raise error_class(ErrorCode.INVALID_SUBJECT)("subject must be 1..255 bytes")
    if not 0 <= ttl <= TTL_NEVER:
        raise error_class(ErrorCode.INVALID_MSG_TTL)(f"TTL {ttl} does not fit the u32 TTL field")
    return b"".join((prefix, BODY.pack(ttl, flags, len(subj), len(headers), len(payload)), subj, headers, payload))


def body_head(subject: bytes, size: int) -> bytes:
    """What :func:`encode_body` puts before the payload of a message on ``subject``
    (1..255 bytes, the caller checked) with ``size`` bytes of payload and no
    headers, TTL or flags: a flood of such messages is ``head + payload`` each."""
    return BODY.pack(TTL_NONE, 0, len(subject), 0, size) + subject


def replace_header(block: bytes, name: str, value: str) -> bytes:
    """The header block with every ``name`` header removed and ``name: value``
    appended at the end (the NATS server's rewrite of ``Nats-TTL``, ``docs/semantics.md``
    §6.7)."""
    raw_name = name.encode()
    kept = [(k.decode("ascii"), v.decode()) for k, v in _iter_header_block(block) if k != raw_name]
    return encode_headers(kept + [(name, value)])


def restamp_body(body: bytes | memoryview, ttl: int, flags: int, headers: bytes | None = None) -> bytes:
    """The same message body with a new TTL field and flags, and optionally a new
    header block (the broker records the effective TTL in the field)."""
    _, _, sl, hl, pl = BODY.unpack_from(body, 0)
    s = BODY_SIZE
    subject = bytes(body[s : s + sl])
    old_headers = bytes(body[s + sl : s + sl + hl])
    payload = bytes(body[s + sl + hl : s + sl + hl + pl])
    new_headers = old_headers if headers is None else headers
    return b"".join((BODY.pack(ttl, flags, sl, len(new_headers), pl), subject, new_headers, payload))


def resubject_body(body: bytes | memoryview, subject: bytes) -> bytes:
    """The same message body under another subject (a topic's subject transform:
    the message is stored under the subject it gives)."""
    ttl, flags, sl, hl, pl = BODY.unpack_from(body, 0)
    if not 1 <= len(subject) <= 255:
        raise error_class(ErrorCode.INVALID_SUBJECT)("subject must be 1..255 bytes")
    return b"".join((BODY.pack(ttl, flags, len(subject), hl, pl), subject, body[BODY_SIZE + sl :]))


class BodyFields(NamedTuple):
    """The fields of one message body (used off the hot path)."""

    ttl: int
    flags: int
    subject: bytes
    headers: bytes
    payload_len: int
    payload_pos: int


def body_fields(data: bytes | memoryview, pos: int) -> BodyFields:
    ttl, flags, sl, hl, pl = BODY.unpack_from(data, pos)
    s = pos + BODY_SIZE
    return BodyFields(ttl, flags, bytes(data[s : s + sl]), bytes(data[s + sl : s + sl + hl]), pl, s + sl + hl)


class PublishScan(NamedTuple):
    """One pass over a batch of bodies.

    Attributes:
        starts, ends: where each body begins and ends in the payload.
        subjects: each body's subject bytes (hashable: the broker's routing cache key).
        special: indices of bodies that need a closer look (a TTL, flags, headers, or
            a payload over the limit); all others are plain and go straight to storage.
    """

    starts: list[int]
    ends: list[int]
    subjects: list[bytes]
    special: list[int]
    #: The bodies of ``special`` whose only mark is a TTL field (no flags, no headers,
    #: a payload within the limit): index -> the field. They need no closer look
    #: than the topic's TTL rules, so the broker admits them without decoding them.
    ttl_only: dict[int, int] | None = None
    #: The bodies of ``special`` with a header block, no flags and a payload within
    #: the limit: index -> ``(ttl field, header block)``, so that the broker need not
    #: decode them again to check their headers and admit them.
    headed: dict[int, tuple[int, bytes]] | None = None


def scan_bodies(data: bytes, pos: int, count: int, max_payload: int) -> PublishScan:
    """Delimit ``count`` message bodies that start at ``pos`` and fill ``data``.

    Runtime complexity: O(count), one ``struct`` call and three list appends per body;
    one C-level comparison per body when all are plain and alike (:func:`_scan_alike`).

    Raises:
        MalformedPayloadError: a body runs past the end, a subject is empty, or bytes
            are left over.
    """
    if count > 1 and (alike := _scan_alike(data, pos, count, max_payload)) is not None:
        return alike
    return _scan_each(data, pos, count, max_payload)


def _scan_each(data: bytes, pos: int, count: int, max_payload: int) -> PublishScan:
    """:func:`scan_bodies`, body by body."""
    unpack = BODY.unpack_from
    starts: list[int] = []
    ends: list[int] = []
    subjects: list[bytes] = []
    special: list[int] = []
    ttl_only: dict[int, int] = {}
    headed: dict[int, tuple[int, bytes]] = {}
    end_all = len(data)
    try:
        for i in range(count):
            ttl, flags, sl, hl, pl = unpack(data, pos)
            s = pos + 14
            e = s + sl + hl + pl
            if e > end_all or not sl:
                raise _malformed(f"message {i} of the batch is truncated or has an empty subject")
            starts.append(pos)
            ends.append(e)
            subjects.append(data[s : s + sl])
            if ttl or flags or hl or pl > max_payload:
                special.append(i)
                if not (flags or pl > max_payload):
                    if hl:
                        headed[i] = (ttl, data[s + sl : s + sl + hl])
                    else:
                        ttl_only[i] = ttl
            pos = e
    except struct.error:
        raise _malformed(f"message {len(starts)} of the batch is truncated") from None
    if pos != end_all:
        raise _malformed(f"{end_all - pos} bytes follow the last of the {count} messages")
    return PublishScan(starts, ends, subjects, special, ttl_only, headed)


def _scan_alike(data: bytes, pos: int, count: int, max_payload: int) -> PublishScan | None:
    """:func:`scan_bodies` of a batch whose bodies all start with the first one's
    header and subject and are plain (no TTL, flags or headers, the payload within
    the limit): a client's flood on one subject with one payload size. The first
    header fixes every body's length, so each body is one comparison of those bytes
    (a C loop), and the subjects are one object. None: not such a batch (the general
    scan decides, errors and all)."""
    rest = len(data) - pos
    size, left = divmod(rest, count)
    if left or size < 14:
        return None
    ttl, flags, sl, hl, pl = BODY.unpack_from(data, pos)
    if ttl or flags or hl or not sl or pl > max_payload or 14 + sl + pl != size:
        return None
    head = data[pos : pos + 14 + sl]
    end = pos + rest
    if not all(map(data.startswith, itertools.repeat(head, count), range(pos, end, size))):
        return None
    subject = head[14:]
    return PublishScan(list(range(pos, end, size)), list(range(pos + size, end + 1, size)), [subject] * count, [], {}, {})


# -- records -----------------------------------------------------------------------


def build_records(
    data: bytes | bytearray | memoryview,
    starts: list[int],
    ends: list[int],
    first_offset: int,
    timestamp: int,
    stamps: Mapping[int, tuple[int, int]] | None = None,
    timestamps: Sequence[int] | None = None,
) -> tuple[bytearray, list[int]]:
    """Stamp bodies ``data[starts[i]:ends[i]]`` with consecutive offsets and a timestamp
    (``timestamps``: one for each body instead, as a mirror keeps its origin's).

    ``stamps`` (index -> ``(ttl, flags)``) sets the body's TTL field and flags on the
    way, for bodies whose admission changed only those (no second copy of the body).

    Returns the records, back to back, and the position of each record in them.

    Runtime complexity: O(total bytes); per body one slice copy, two ``pack_into``
    calls and one CRC-32.
    """
    n = len(starts)
    if n == 1:
        ts = timestamp if timestamps is None else timestamps[0]
        return _build_one(data, starts[0], ends[0], first_offset, ts, None if stamps is None else stamps.get(0)), [0]
    return _build_many(data, starts, ends, first_offset, timestamp, stamps, timestamps)


def _build_one(
    data: bytes | bytearray | memoryview, start: int, end: int, offset: int, timestamp: int, stamp: tuple[int, int] | None,
) -> bytearray:
    """:func:`build_records` of one body (a message published alone, the usual
    request): the same bytes as :func:`_build_many` makes of it (a hypothesis test
    holds them equal), in about half the steps."""
    out = bytearray(8)
    out += _OFF_TS.pack(offset, timestamp)
    out += data[start:end]
    if stamp is not None:
        _TTL_FLAGS.pack_into(out, HEADER_SIZE, stamp[0], stamp[1])
    with memoryview(out) as view:
        crc = zlib.crc32(view[8:])
    _LEN_CRC.pack_into(out, 0, end - start + 20, crc)
    return out


def _build_many(
    data: bytes | bytearray | memoryview, starts: list[int], ends: list[int], first_offset: int, timestamp: int,
    stamps: Mapping[int, tuple[int, int]] | None, timestamps: Sequence[int] | None = None,
) -> tuple[bytearray, list[int]]:
    n = len(starts)
    out = bytearray(sum(ends) - sum(starts) + HEADER_SIZE * n)
    omv = memoryview(out)
    src = memoryview(data)
    pack_ot = _OFF_TS.pack_into
    pack_lc = _LEN_CRC.pack_into
    pack_tf = _TTL_FLAGS.pack_into
    crc32 = zlib.crc32
    positions: list[int] = []
    append = positions.append
    q = 0
    off = first_offset
    for i in range(n):
        s = starts[i]
        blen = ends[i] - s
        body_at = q + 24
        end = body_at + blen
        omv[body_at:end] = src[s : s + blen]
        if stamps is not None and (st := stamps.get(i)) is not None:
            pack_tf(out, body_at, st[0], st[1])
        pack_ot(out, q + 8, off, timestamp if timestamps is None else timestamps[i])
        pack_lc(out, q, blen + 20, crc32(omv[q + 8 : end]))
        append(q)
        q = end
        off += 1
    omv.release()
    src.release()
    return out, positions


def encode_record(offset: int, timestamp: int, body: bytes) -> bytes:
    """One record from one body (off the hot path: markers, tests, deliveries of
    unstored messages)."""
    tail = _OFF_TS.pack(offset, timestamp) + body
    return _LEN_CRC.pack(len(tail) + 4, zlib.crc32(tail)) + tail


class RecordInfo(NamedTuple):
    """The fixed fields of a record and where its parts are."""

    length: int  # total bytes of the record, length field included
    offset: int
    timestamp: int
    ttl: int
    flags: int
    subject: bytes
    headers: bytes
    payload_len: int


def check_record(buf: bytes | bytearray | memoryview, pos: int, end: int) -> int:
    """Verify the record at ``pos`` (which must end by ``end``); return its total size.

    Returns -1 when the record is truncated or its checksum or inner lengths are wrong.

    Runtime complexity: O(record size) (one CRC-32).
    """
    if pos + FIXED_SIZE > end:
        return -1
    length, crc = _LEN_CRC.unpack_from(buf, pos)
    total = length + 4
    if length < 34 or pos + total > end:
        return -1
    if zlib.crc32(memoryview(buf)[pos + 8 : pos + total]) != crc:
        return -1
    _, _, sl, hl, pl = BODY.unpack_from(buf, pos + 24)
    if FIXED_SIZE + sl + hl + pl != total or not sl:
        return -1
    return total


def record_spans(buf: bytes | bytearray | memoryview) -> tuple[int, int, int, int, int, int]:
    """An already verified record's timestamp and TTL, and where its subject,
    headers and payload lie in ``buf``: ``(timestamp, ttl, subject_at, headers_at,
    payload_at, end)``, read in place (no :class:`RecordInfo`, nothing copied)."""
    _, _, _, ts, ttl, _, sl, hl, pl = RECORD_FIXED.unpack_from(buf)
    headers_at = FIXED_SIZE + sl
    payload_at = headers_at + hl
    return ts, ttl, FIXED_SIZE, headers_at, payload_at, payload_at + pl


def read_record_info(buf: bytes | bytearray | memoryview, pos: int) -> RecordInfo:
    """Read the fixed fields of an already verified record."""
    length, _, offset, ts, ttl, flags, sl, hl, pl = RECORD_FIXED.unpack_from(buf, pos)
    s = pos + FIXED_SIZE
    return RecordInfo(length + 4, offset, ts, ttl, flags, bytes(buf[s : s + sl]), bytes(buf[s + sl : s + sl + hl]), pl)


class Message:
    """One message as a client sees it.

    Attributes:
        subject: the subject it was published on.
        payload: the payload bytes.
        headers: the headers, decoded on first access (first occurrence of a repeated
            name wins).
        offset: its offset in ``partition`` (0 when it was not stored).
        timestamp: broker time of append, nanoseconds since the Unix epoch.
        ttl: seconds of per-message TTL; 0 = none; ``TTL_NEVER`` = never expires.
        flags: raw flags byte.
        partition, stream_id, topic_id: where it is stored (0 when not stored).
        is_marker: True for a subject delete marker written by the broker.
        marker_reason: the :class:`MarkerReason`, ``MarkerReason.NONE`` if not a marker.
        reply: the reply subject of a core delivery that carries one (a request's: the
            subject to answer on), else None. Never stored.
    """

    __slots__ = (
        "subject",
        "payload",
        "_headers_raw",
        "_headers",
        "offset",
        "timestamp",
        "ttl",
        "flags",
        "partition",
        "stream_id",
        "topic_id",
        "_reply",
    )

    #: Set only on the messages of a delivery that carries a reply subject (so no
    #: decode of a record pays for it): :attr:`reply` reads it.
    _reply: str

    def __init__(
        self,
        subject: str,
        payload: bytes,
        headers_raw: bytes,
        offset: int,
        timestamp: int,
        ttl: int = 0,
        flags: int = 0,
        partition: int = 0,
        stream_id: int = 0,
        topic_id: int = 0,
    ) -> None:
        self.subject = subject
        self.payload = payload
        self._headers_raw = headers_raw
        self._headers: dict[str, str] | None = None
        self.offset = offset
        self.timestamp = timestamp
        self.ttl = ttl
        self.flags = flags
        self.partition = partition
        self.stream_id = stream_id
        self.topic_id = topic_id

    @property
    def headers(self) -> dict[str, str]:
        if self._headers is None:
            self._headers = decode_headers(self._headers_raw) if self._headers_raw else {}
        return self._headers

    @property
    def headers_raw(self) -> bytes:
        return self._headers_raw

    @property
    def reply(self) -> str | None:
        try:
            return self._reply
        except AttributeError:
            return None

    @property
    def marker_reason(self) -> MarkerReason:
        return MarkerReason(self.flags & MARKER_MASK)

    @property
    def is_marker(self) -> bool:
        return bool(self.flags & MARKER_MASK)

    @property
    def never_expires(self) -> bool:
        return self.ttl == TTL_NEVER

    def __repr__(self) -> str:
        extra = f", marker={self.marker_reason.header_value}" if self.is_marker else ""
        return (
            f"Message(subject={self.subject!r}, offset={self.offset}, partition={self.partition}, "
            f"payload={self.payload[:32]!r}{'...' if len(self.payload) > 32 else ''}{extra})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (
            self.subject == other.subject
            and self.payload == other.payload
            and self._headers_raw == other._headers_raw
            and self.offset == other.offset
            and self.timestamp == other.timestamp
            and self.ttl == other.ttl
            and self.flags == other.flags
            and self.partition == other.partition
            and self.stream_id == other.stream_id
            and self.topic_id == other.topic_id
        )

    __hash__ = None  # type: ignore[assignment]  # equal records are mutable views: unhashable, as a dataclass with eq would be


def split_records(run: bytes | memoryview) -> list[memoryview]:
    """Views of each record of a run of back-to-back records (no copies)."""
    view = memoryview(run)
    out = []
    pos, n = 0, len(view)
    unpack = _LEN_CRC.unpack_from
    while pos < n:
        end = pos + 4 + unpack(view, pos)[0]
        out.append(view[pos:end])
        pos = end
    return out


def decode_records(
    buf: bytes,
    pos: int,
    end: int,
    count: int,
    partition: int = 0,
    stream_id: int = 0,
    topic_id: int = 0,
) -> list[Message]:
    """Decode ``count`` back-to-back records of ``buf[pos:end]`` into messages.

    Runtime complexity: O(count), one ``struct`` call and three slices per record.

    Raises:
        RemoteProtocolError (MALFORMED_PAYLOAD): the records do not fill the range.
    """
    unpack = RECORD_FIXED.unpack_from
    out: list[Message] = []
    append = out.append
    try:
        for _ in range(count):
            length, _crc, offset, ts, ttl, flags, sl, hl, pl = unpack(buf, pos)
            s = pos + 38
            h = s + sl
            p = h + hl
            e = p + pl
            if e != pos + length + 4 or e > end:
                raise RemoteProtocolError("a record's lengths do not add up", ErrorCode.MALFORMED_PAYLOAD)
            append(
                Message(
                    buf[s:h].decode(errors="replace"),
                    buf[p:e],
                    buf[h:p],
                    offset,
                    ts,
                    ttl,
                    flags,
                    partition,
                    stream_id,
                    topic_id,
                )
            )
            pos = e
    except struct.error:
        raise RemoteProtocolError("a record is truncated", ErrorCode.MALFORMED_PAYLOAD) from None
    if pos != end:
        raise RemoteProtocolError(f"{end - pos} bytes follow the last record", ErrorCode.MALFORMED_PAYLOAD)
    return out
