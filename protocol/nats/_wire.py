"""The NATS client protocol, sans-IO: the text protocol nats-server speaks to its
clients (``INFO``, ``CONNECT``, ``PUB``, ``HPUB``, ``SUB``, ``UNSUB``, ``MSG``,
``HMSG``, ``PING``, ``PONG``, ``+OK``, ``-ERR``) and its header blocks.

:class:`NatsParser` turns the bytes of one side into events, as nats-server's
``parser.go`` reads them: operation names in any case, arguments separated by
spaces or tabs, a control line ended by LF (a CR before it is dropped), a payload of
the announced size followed by CRLF. The server side (``server=True``) reads what a
client sends; the client side what a server sends (tests and tools use it). A
violation raises :class:`NatsProtocolError`, whose ``text`` is what nats-server
puts in its ``-ERR`` line; after one, the parser is unusable (the server closes the
connection). Memory is bounded: a control line may be at most
``max_control_line`` bytes and a payload at most ``max_payload``, checked before
either is buffered.

The ``encode_*`` functions write each operation. A NATS header block is
``NATS/1.0[ status[ description]]\\r\\n`` then ``Name: value\\r\\n`` lines and an empty
line; :func:`nats_to_record_headers` and :func:`record_to_nats_headers` convert it
to and from ttlbroker's header block (``_records.py``), and
:func:`nats_message_of_record` gives a stored record's parts as a NATS message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from collections.abc import Container
from typing import Any

from .._errors import ErrorCode, RemoteProtocolError, error_class
from .._records import FIXED_SIZE, RECORD_FIXED, _check_header_name, _check_header_value, _iter_header_block, encode_headers
from ._json import loads as json_loads

__all__ = [
    "NatsProtocolError", "NatsParser", "AckRun", "NATS_NEED_DATA", "NatsConnect", "NatsPub", "NatsSub", "NatsUnsub",
    "NatsPing", "NatsPong", "NatsInfo", "NatsMsg", "NatsOk", "NatsErr", "PING", "PONG", "OK", "encode_info",
    "encode_connect", "encode_pub", "encode_sub", "encode_unsub", "encode_msg", "encode_err", "encode_nats_headers",
    "decode_nats_headers", "no_responders_status", "nats_to_record_headers", "record_to_nats_headers",
    "nats_message_of_record", "MAX_CONTROL_LINE", "valid_nats_subject", "pub_payload", "ACK_RUN_LIMIT",
]

#: nats-server's default ``max_control_line``.
MAX_CONTROL_LINE = 4096

PING = b"PING\r\n"
PONG = b"PONG\r\n"
OK = b"+OK\r\n"

#: The texts nats-server sends in ``-ERR`` for what the parser finds.
UNKNOWN_OP = "Unknown Protocol Operation"
MAX_LINE = "maximum control line exceeded"
MAX_PAYLOAD = "Maximum Payload Violation"

_HEADER_LINE = b"NATS/1.0"


class NatsProtocolError(RemoteProtocolError):
    """The peer broke the NATS protocol; ``text`` is the ``-ERR`` text."""

    def __init__(self, text: str, detail: str = "") -> None:
        super().__init__(f"{text}: {detail}" if detail else text, ErrorCode.MALFORMED_FRAME)
        self.text = text


# -- events ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NatsConnect:
    options: dict[str, Any]


@dataclass(slots=True)
class NatsPub:
    """PUB (``headers`` None) or HPUB (``headers`` the whole NATS header block).
    Not frozen: made for every message, and a frozen one costs three times as much
    to make."""

    subject: str
    reply: str | None
    headers: bytes | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class NatsSub:
    subject: str
    queue: str | None
    sid: str


@dataclass(frozen=True, slots=True)
class NatsUnsub:
    sid: str
    max_msgs: int | None


@dataclass(frozen=True, slots=True)
class NatsInfo:
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NatsMsg:
    """MSG (``headers`` None) or HMSG."""

    subject: str
    sid: str
    reply: str | None
    headers: bytes | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class NatsErr:
    text: str


class _Singleton:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NatsPing = _Singleton("NatsPing")
NatsPong = _Singleton("NatsPong")
NatsOk = _Singleton("NatsOk")
#: What :meth:`NatsParser.next_event` returns when it needs more bytes.
NATS_NEED_DATA = _Singleton("NATS_NEED_DATA")

Event = NatsConnect | NatsPub | NatsSub | NatsUnsub | NatsInfo | NatsMsg | NatsErr | _Singleton

_WS = b" \t"
#: A PUB line as clients write it, spaces between the arguments (nats-py leaves two
#: where a reply subject is not given; ``\s`` is what ``bytes.split()`` splits on).
_PLAIN_PUB = re.compile(rb"PUB +(\S+) +(?:(\S+) +)?(\d{1,12})\r\n")
#: A plain PUB (as :data:`_PLAIN_PUB` reads it) on a v1 ack subject whose numbers are
#: ASCII digits: its subject, ``$JS.ACK.<stream>.<consumer>``, stream sequence, reply
#: and size (:meth:`NatsParser.ack_pubs`).
_ACK_PUB = re.compile(
    rb"PUB ((\$JS\.ACK\.[^.\s]*\.[^.\s]*)\.[0-9]+\.([0-9]+)\.[0-9]+\.[0-9]+\.[0-9]+) +(?:(\S+) +)?(\d{1,12})\r\n")
#: Most plain acks a run (:meth:`NatsParser.ack_run`) takes.
ACK_RUN_LIMIT = 256
#: The tail of one plain ack after its ``$JS.ACK.<stream>.<consumer>``, no reply: the
#: five numbers (ASCII digits, stream sequence second), then an empty payload (nats-py's
#: ``msg.ack()``) or ``+ACK`` (the C, Go, Java, .NET and Rust clients'). The bounds give
#: a longest line (:data:`_ACK_TAIL_MAX`).
_ACK_TAIL = (rb"\.[0-9]{1,20}\.([0-9]{1,20})\.[0-9]{1,20}\.[0-9]{1,20}\.[0-9]{1,20} {1,16}"
             rb"(?:0\r\n\r\n|4\r\n\+ACK\r\n)")
_ACK_TAIL_MAX = 5 * 21 + 16 + 1
#: A run of such acks of one consumer, up to :data:`ACK_RUN_LIMIT`.
_ACK_RUN = re.compile(
    rb"PUB (\$JS\.ACK\.[^.\s]{0,255}\.[^.\s]{0,255})" + _ACK_TAIL.replace(b"([0-9]{1,20})", b"[0-9]{1,20}")
    + rb"(?:PUB \1" + _ACK_TAIL.replace(b"([0-9]{1,20})", b"[0-9]{1,20}") + rb"){0,%d}" % (ACK_RUN_LIMIT - 1))
#: The stream sequence of each ack of a run that :data:`_ACK_RUN` matched (its
#: stream and consumer names hold no dot: the sequence is the second number).
_ACK_SEQ = re.compile(rb"PUB \$JS\.ACK\.[^.]*\.[^.]*\.[0-9]+\.([0-9]+)\.")
#: Each control line of a run, for its length.
_ACK_LINE = re.compile(rb"PUB [^\r]*")
_SPACE = re.compile("[ \t\n\r\f]")
_ENDS = b" \t\r\n"


def _args(line: bytes) -> list[bytes]:
    return line.replace(b"\t", b" ").split()


def _size(raw: bytes) -> int:
    if not raw.isdigit() or len(raw) > 12:
        raise NatsProtocolError(UNKNOWN_OP, f"bad size {raw[:20]!r}")
    return int(raw)


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise NatsProtocolError(UNKNOWN_OP, "an argument is not UTF-8") from None


def pub_payload(tail: bytes | bytearray, size: int) -> bytes:
    """The payload of a PUB :meth:`NatsParser.next_pub` gave as ``tail``."""
    return bytes(tail[len(tail) - 2 - size : len(tail) - 2]) if size else b""


def _replied_pattern(head: bytes, size: bytes, rest: int, max_control_line: int) -> re.Pattern[bytes] | None:
    """A PUB of :meth:`NatsParser.replied_pubs`'s flood: ``head`` (``PUB <subject> ``),
    a reply of one token of ASCII (no whitespace, as ``bytes.split`` sees it), the
    ``size`` spelled as the flood's first PUB spells it, and ``rest`` bytes of payload;
    the line at most ``max_control_line`` bytes. Groups: the reply, the payload. None:
    the line leaves a reply no room."""
    room = max_control_line - len(head) - len(size)
    if room < 1:
        return None
    return re.compile(b"%s([^\\s\x80-\xff]{1,%d})%s\r\n(.{%d})\r\n" % (re.escape(head), room, re.escape(size), rest), re.S)


def valid_nats_subject(subject: str, wildcards: bool = False, literal: bool = False) -> bool:
    """nats-server's ``IsValidLiteralSubject`` (``wildcards`` False) or
    ``IsValidSubject``: non-empty tokens, no whitespace, and wildcards only as
    whole tokens, ``>`` last (only when ``wildcards``). ``literal``: ``*`` and ``>``
    are tokens like any other (what a non-pedantic publish may carry)."""
    if not subject or _SPACE.search(subject):
        return False
    if literal or ("*" not in subject and ">" not in subject):  # only empty tokens to find
        return ".." not in subject and subject[0] != "." and subject[-1] != "."
    tokens = subject.split(".")
    last = len(tokens) - 1
    for i, token in enumerate(tokens):
        if not token:
            return False
        if (token == "*" or token == ">") and (not wildcards or (token == ">" and i != last)):
            return False
    return True


class AckRun:
    """The bytes of a run of plain acks :meth:`NatsParser.ack_run` took, kept as they
    are until their stream sequences are wanted (:meth:`seqs`): whoever takes the
    run may settle it after other work."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def seqs(self) -> list[int]:
        """The acks' stream sequences, in order."""
        return list(map(int, _ACK_SEQ.findall(self.raw)))


class NatsParser:
    """Incremental parser of one side of a NATS connection (see the module
    docstring). Feed bytes with :meth:`receive_data`, take events with
    :meth:`next_event` until it returns :data:`NATS_NEED_DATA`."""

    def __init__(self, *, server: bool = True, max_control_line: int = MAX_CONTROL_LINE, max_payload: int = 1024 * 1024) -> None:
        self.server = server
        self.max_control_line = max_control_line
        self.max_payload = max_payload
        self._buf = bytearray()
        self._pos = 0
        #: The operation waiting for its payload: (kind, args, header size, total size).
        self._pending: tuple[bytes, list[bytes], int, int] | None = None
        #: Where the last PUB :meth:`next_pub` gave starts and ends in the buffer, and
        #: where its tail starts (-1: it has none there, or the buffer moved):
        #: :meth:`same_pubs`.
        self._last_pub = self._last_end = 0
        self._last_cut = -1
        #: :meth:`replied_pubs`'s pattern for the flood it reads: (line head, size, rest) -> it.
        self._replied: tuple[tuple[bytes, bytes, int], re.Pattern[bytes] | None] = ((b"", b"", 0), None)

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
            self._last_cut = -1
        self._buf += data

    def next_event(self) -> Event:
        buf = self._buf
        if self._pending is not None:
            return self._payload(buf)
        if self._pos == len(buf):
            return NATS_NEED_DATA
        if self.server and buf.startswith(b"PUB ", self._pos):
            pub = self.next_pub()  # the common case in one step
            if pub is not None:
                subj, rep, tail, size = pub
                return NatsPub(subj.decode(), rep.decode() if rep is not None else None, None, pub_payload(tail, size))
        self._check_op()
        nl = buf.find(b"\n", self._pos, self._pos + self.max_control_line + 2)
        if nl < 0:
            if len(buf) - self._pos > self.max_control_line + 1:
                raise NatsProtocolError(MAX_LINE)
            return NATS_NEED_DATA
        end = nl - 1 if nl > self._pos and buf[nl - 1] == 13 else nl
        if end - self._pos > self.max_control_line:
            raise NatsProtocolError(MAX_LINE)
        line = bytes(buf[self._pos : end])
        self._pos = nl + 1
        return self._control(line)

    def at_pub(self) -> bool:
        """Does a ``PUB`` come next (so :meth:`next_pub` may take it)?"""
        return self._pending is None and self.server and self._buf.startswith(b"PUB ", self._pos)

    def next_pub(self, known: Container[bytes] = ()) -> tuple[bytes, bytes | None, bytes | bytearray, int] | None:
        """The next operation when it is a whole plain PUB, as ``(subject, reply,
        tail, size)``: what :meth:`next_event` would give as a :class:`NatsPub`,
        without the event object or a decoded subject. ``tail`` is what a ``MSG`` of
        it carries after ``MSG <subject> <sid> ``: ``[reply ]size CR LF payload CR
        LF``; the payload is its ``size`` bytes before the last two
        (:func:`pub_payload`). Its subject and reply are UTF-8 (a subject in
        ``known`` is not checked again). None, taking nothing, for anything else
        (another operation, an unusual or incomplete PUB, one whose line or payload
        is too long or that is not UTF-8), which :meth:`next_event` then reads,
        errors and all."""
        buf = self._buf
        pos = self._pos
        if self._pending is not None or not buf.startswith(b"PUB ", pos) or not self.server:
            return None
        m = _PLAIN_PUB.match(buf, pos)
        if m is None:
            return None
        subj, rep, size = m.groups()
        start = m.end()
        total = int(size)
        end = start + total + 2
        if start - pos - 2 > self.max_control_line or total > self.max_payload or not buf.startswith(b"\r\n", end - 2):
            return None
        if subj not in known or (rep is not None and not rep.isascii()):
            try:
                subj.decode()
                if rep is not None:
                    rep.decode()
            except UnicodeDecodeError:
                return None
        self._pos = self._last_end = end
        self._last_pub = pos
        digits = m.start(3)  # (the size as the PUB says it, leading zeros and all, as nats-server copies it)
        tail: bytes | bytearray
        if rep is None:
            self._last_cut = digits
            tail = buf[digits:end]
        elif digits - m.end(2) == 1:
            self._last_cut = cut = m.start(2)
            tail = buf[cut:end]
        else:
            self._last_cut = -1
            tail = rep + b" " + buf[digits:end]
        return subj, rep, tail, total

    def same_pubs(self) -> list[bytes | bytearray]:
        """The PUBs that come next and whose control line is byte for byte the one
        of the PUB :meth:`next_pub` gave last (the same subject, reply and size: a
        client's flood), taken, as their tails (what :meth:`next_pub` gives as
        ``tail``; the subject, reply and size are that PUB's). One comparison and
        one slice each: their line was checked once. Stops before anything else,
        and before a PUB whose payload is not all here; empty when the next
        operation is not such a PUB."""
        cut = self._last_cut
        if cut < 0 or self._pending is not None:
            return []
        buf = self._buf
        prev = self._last_pub
        pos = self._pos
        line = bytes(buf[prev : buf.find(b"\r\n", cut) + 2])
        if not buf.startswith(line, pos):
            return []
        n = self._last_end - prev  # (the whole PUB, payload and all)
        cut -= prev
        out: list[bytes | bytearray] = []
        while buf.startswith(line, pos) and buf.startswith(b"\r\n", pos + n - 2):
            out.append(buf[pos + cut : pos + n])
            pos += n
        self._pos = pos
        return out

    def replied_pubs(self, limit: int) -> list[tuple[bytes, bytes | bytearray]]:
        """The PUBs that come next with the subject and the size, spelled the same,
        of the PUB :meth:`next_pub` gave last, each with a reply subject of its own
        (a client's flood of JetStream publishes: an inbox each), taken, as
        ``(reply, payload)``. The last PUB must have had a reply followed by one
        space. Stops before anything else: another line, a reply that is not one
        token of ASCII, a line too long, a payload not all here, or after ``limit``
        of them; empty when the next operation is not such a PUB."""
        cut = self._last_cut
        if cut < 0 or self._pending is not None:
            return []
        buf = self._buf
        prev = self._last_pub
        eol = buf.find(b"\r\n", cut)
        space = buf.rfind(b" ", cut, eol)
        if space < 0:  # (no reply: same_pubs's case)
            return []
        head = bytes(buf[prev:cut])  # (``PUB <subject> ``)
        pos = self._pos
        if not buf.startswith(head, pos):
            return []
        size = bytes(buf[space:eol])  # (`` <size>``)
        rest = self._last_end - eol - 4  # (the payload)
        key = (head, size, rest)
        known, pattern = self._replied
        if known != key:
            pattern = _replied_pattern(head, size, rest, self.max_control_line)
            self._replied = (key, pattern)
        if pattern is None:
            return []
        match = pattern.match
        out: list[tuple[bytes, bytes | bytearray]] = []
        append = out.append
        while len(out) < limit and (m := match(buf, pos)) is not None:
            append(m.groups())  # type: ignore[arg-type]  # (both groups always take part)
            pos = m.end()
        self._pos = pos
        return out

    def ack_pubs(self, limit: int = 256) -> list[tuple[str, str | None, bytes, str, int]]:
        """The run of whole plain PUBs on v1 JetStream ack subjects
        (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>``,
        the numbers ASCII digits), at most ``limit``, as ``(subject, reply, payload,
        "$JS.ACK.<stream>.<consumer>", stream seq)``: what :meth:`next_event` would
        give as :class:`NatsPub` events (no headers), read in one match each and
        without an event object. Stops before the first operation that is anything
        else (another PUB, an ack subject of another form, a PUB not whole yet),
        which :meth:`next_event` then reads; empty when the next one is not one."""
        out: list[tuple[str, str | None, bytes, str, int]] = []
        if self._pending is not None or not self.server:
            return out
        buf = self._buf
        pos = self._pos
        match = _ACK_PUB.match
        max_line = self.max_control_line
        max_payload = self.max_payload
        append = out.append
        while buf.startswith(b"PUB $JS.ACK.", pos) and len(out) < limit:
            m = match(buf, pos)
            if m is None:
                break
            subj, key, seq, rep, size = m.groups()
            start = m.end()
            total = int(size)
            end = start + total
            if start - pos - 2 > max_line or total > max_payload or not buf.startswith(b"\r\n", end):
                break
            try:
                subject = subj.decode()
                reply = rep.decode() if rep is not None else None
            except UnicodeDecodeError:
                break
            append((subject, reply, bytes(buf[start:end]) if total else b"", key.decode(), int(seq)))
            pos = end + 2
        self._pos = pos
        return out

    def at_ack(self) -> bool:
        """Does a PUB on a v1 ack subject come next (so :meth:`ack_run` or
        :meth:`ack_pubs` may take something)? One look for the other operations,
        which both would only refuse."""
        return self._pending is None and self.server and self._buf.startswith(b"PUB $JS.ACK.", self._pos)

    def ack_run(self) -> tuple[str, AckRun, int] | None:
        """The run of whole plain acks of one consumer at the read position, as the
        clients write ``ack()`` (``PUB <v1 ack subject>  0`` with an empty payload,
        nats-py's, or ``PUB <v1 ack subject> 4`` with ``+ACK``, the other clients'; no
        reply), at most :data:`ACK_RUN_LIMIT`: ``("$JS.ACK.<stream>.<consumer>", run,
        end)``, or None when the next operation is not one; ``run.seqs()`` are their
        stream sequences. Reads nothing: :meth:`skip_to` ``(end)`` takes the run. What
        it gives is what :meth:`ack_pubs` gives for those PUBs (their replies None,
        their payloads empty or ``+ACK``), in one regular-expression call for the
        whole run (and one more for the sequences, when they are wanted) instead of
        one match and one tuple per PUB."""
        if self._pending is not None or not self.server:
            return None
        buf = self._buf
        pos = self._pos
        m = _ACK_RUN.match(buf, pos)
        if m is None:
            return None
        end = m.end()
        key = m.group(1)
        if self.max_payload < 4 and buf.find(b"+ACK\r\n", pos, end) >= 0:
            return None  # the general path refuses the payload
        if 4 + len(key) + _ACK_TAIL_MAX > self.max_control_line and max(map(len, _ACK_LINE.findall(buf, pos, end))) > self.max_control_line:
            return None  # the general path refuses the long line (after the ones before it)
        try:
            name = key.decode()
        except UnicodeDecodeError:
            return None
        return name, AckRun(bytes(buf[pos:end])), end

    def skip_to(self, end: int) -> None:
        """Take what :meth:`ack_run` gave, up to ``end``."""
        self._pos = end

    def _check_op(self) -> None:
        """Garbage is refused as soon as its first bytes cannot start an operation
        (so the answer does not depend on how the bytes were split)."""
        head = bytes(self._buf[self._pos : self._pos + 8]).upper()
        ops = _SERVER_OPS if self.server else _CLIENT_OPS
        for i, b in enumerate(head):
            if b in _ENDS:
                word = head[:i]
                if word not in ops:
                    raise NatsProtocolError(UNKNOWN_OP, f"unknown operation {word!r}")
                return
        if not any(op.startswith(head) for op in ops):
            raise NatsProtocolError(UNKNOWN_OP, f"unknown operation starting {head!r}")

    def _control(self, line: bytes) -> Event:
        cut = len(line)
        for i, b in enumerate(line):
            if b in (32, 9):
                cut = i
                break
        op = line[:cut].upper()
        rest = line[cut:]
        if self.server:
            if op == b"PUB" or op == b"HPUB":
                return self._pub_line(op, _args(rest))
            if op == b"PING" and not rest.strip(_WS):
                return NatsPing
            if op == b"PONG" and not rest.strip(_WS):
                return NatsPong
            if op == b"SUB":
                a = _args(rest)
                if len(a) == 2:
                    return NatsSub(_text(a[0]), None, _text(a[1]))
                if len(a) == 3:
                    return NatsSub(_text(a[0]), _text(a[1]), _text(a[2]))
                raise NatsProtocolError(UNKNOWN_OP, "SUB takes a subject, an optional queue group and a sid")
            if op == b"UNSUB":
                a = _args(rest)
                if len(a) == 1:
                    return NatsUnsub(_text(a[0]), None)
                if len(a) == 2:
                    return NatsUnsub(_text(a[0]), _size(a[1]))
                raise NatsProtocolError(UNKNOWN_OP, "UNSUB takes a sid and an optional maximum")
            if op == b"CONNECT":
                return NatsConnect(self._json(rest))
        else:
            if op == b"MSG" or op == b"HMSG":
                return self._pub_line(op, _args(rest))
            if op == b"PING" and not rest.strip(_WS):
                return NatsPing
            if op == b"PONG" and not rest.strip(_WS):
                return NatsPong
            if op == b"+OK" and not rest.strip(_WS):
                return NatsOk
            if op == b"-ERR":
                text = rest.strip(_WS)
                if len(text) >= 2 and text[:1] == b"'" and text[-1:] == b"'":
                    text = text[1:-1]
                return NatsErr(_text(text))
            if op == b"INFO":
                return NatsInfo(self._json(rest))
        raise NatsProtocolError(UNKNOWN_OP, f"unknown operation {op[:20]!r}")

    @staticmethod
    def _json(rest: bytes) -> dict[str, Any]:
        try:
            value = json_loads(rest)
        except ValueError:  # a nesting too deep too
            raise NatsProtocolError(UNKNOWN_OP, "the argument is not JSON") from None
        if not isinstance(value, dict):
            raise NatsProtocolError(UNKNOWN_OP, "the argument is not a JSON object")
        return value

    def _pub_line(self, op: bytes, args: list[bytes]) -> Event:
        headed = op[0] == 72  # H
        # PUB subj [reply] size; HPUB subj [reply] hsize size; MSG subj sid [reply] size;
        # HMSG subj sid [reply] hsize size.
        fixed = (1 if op in (b"PUB", b"HPUB") else 2) + (2 if headed else 1)
        if len(args) not in (fixed, fixed + 1):
            raise NatsProtocolError(UNKNOWN_OP, f"{op.decode()} has {len(args)} arguments")
        if headed:
            hsize, total = _size(args[-2]), _size(args[-1])
            # 0: no header block (nats.js sends HPUB with 0 for a message without
            # headers; nats-server accepts it), else at least "NATS/1.0\r\n\r\n".
            if hsize > total or 0 < hsize < len(_HEADER_LINE) + 4:
                raise NatsProtocolError(UNKNOWN_OP, f"{op.decode()}: header size {hsize} of total {total}")
        else:
            hsize, total = 0, _size(args[-1])
        if total > self.max_payload:
            raise NatsProtocolError(MAX_PAYLOAD, f"{total} bytes, the maximum is {self.max_payload}")
        self._pending = (op, args, hsize, total)
        return self._payload(self._buf)

    def _payload(self, buf: bytearray) -> Event:
        assert self._pending is not None
        op, args, hsize, total = self._pending
        start = self._pos
        if len(buf) - start < total + 2:
            return NATS_NEED_DATA
        if buf[start + total : start + total + 2] != b"\r\n":
            raise NatsProtocolError(UNKNOWN_OP, f"the payload of {op.decode()} is not followed by CRLF")
        self._pending = None
        self._pos = start + total + 2
        headers = bytes(buf[start : start + hsize]) if op[0] == 72 else None
        payload = bytes(buf[start + hsize : start + total])
        if op in (b"PUB", b"HPUB"):
            reply = _text(args[1]) if len(args) == (4 if op == b"HPUB" else 3) else None
            return NatsPub(_text(args[0]), reply, headers, payload)
        reply = _text(args[2]) if len(args) == (5 if op == b"HMSG" else 4) else None
        return NatsMsg(_text(args[0]), _text(args[1]), reply, headers, payload)


_SERVER_OPS = (b"PUB", b"HPUB", b"SUB", b"UNSUB", b"PING", b"PONG", b"CONNECT")
_CLIENT_OPS = (b"MSG", b"HMSG", b"PING", b"PONG", b"+OK", b"-ERR", b"INFO")


# -- writing -------------------------------------------------------------------------


def _json_line(op: bytes, value: dict[str, Any]) -> bytes:
    return op + b" " + json.dumps(value, separators=(",", ":")).encode() + b"\r\n"


def encode_info(info: dict[str, Any]) -> bytes:
    return _json_line(b"INFO", info)


def encode_connect(options: dict[str, Any]) -> bytes:
    return _json_line(b"CONNECT", options)


def encode_err(text: str) -> bytes:
    return b"-ERR '" + text.encode() + b"'\r\n"


def encode_pub(subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> bytes:
    """PUB, or HPUB when ``headers`` is not None (a whole NATS header block)."""
    r = b" " + reply.encode() if reply else b""
    if headers is None:
        return b"PUB %s%s %d\r\n%s\r\n" % (subject.encode(), r, len(payload), payload)
    return b"HPUB %s%s %d %d\r\n%s%s\r\n" % (subject.encode(), r, len(headers), len(headers) + len(payload), headers, payload)


def encode_sub(subject: str, queue: str | None, sid: str) -> bytes:
    return b"SUB %s%s %s\r\n" % (subject.encode(), b" " + queue.encode() if queue else b"", sid.encode())


def encode_unsub(sid: str, max_msgs: int | None = None) -> bytes:
    return b"UNSUB %s%s\r\n" % (sid.encode(), b"" if max_msgs is None else b" %d" % max_msgs)


def encode_msg(subject: bytes, sid: bytes, reply: bytes | None, headers: bytes | None, payload: bytes | memoryview) -> bytes:
    """MSG, or HMSG when ``headers`` is not None (a whole NATS header block)."""
    r = b" " + reply if reply else b""
    if headers is None:
        return b"MSG %s %s%s %d\r\n%s\r\n" % (subject, sid, r, len(payload), payload)
    return b"HMSG %s %s%s %d %d\r\n%s%s\r\n" % (subject, sid, r, len(headers), len(headers) + len(payload), headers, payload)


# -- header blocks --------------------------------------------------------------------


def _bad_headers(msg: str) -> Exception:
    return error_class(ErrorCode.INVALID_HEADERS)(msg)


def encode_nats_headers(pairs: list[tuple[str, str]], status: int | None = None, description: str = "") -> bytes:
    """A NATS header block: ``NATS/1.0[ status[ description]]`` and the pairs.

    Raises:
        InvalidHeadersError: a name or value breaks the header rules.
    """
    first = _HEADER_LINE
    if status is not None:
        first += b" %03d" % status
        if description:
            first += b" " + description.encode()
    out = [first]
    for name, value in pairs:
        out.append(_check_header_name(name) + b": " + _check_header_value(name, value))
    return b"\r\n".join(out) + b"\r\n\r\n"


def no_responders_status(subject: str) -> bytes:
    """The header block of nats-server's no-responders status message for a request
    on ``subject``: ``NATS/1.0 503``, then ``Nats-Subject: <subject>`` (the subject as
    the client sent it: it holds no space, CR or LF, so the block stays well formed)."""
    return b"NATS/1.0 503\r\nNats-Subject: " + subject.encode() + b"\r\n\r\n"


def decode_nats_headers(block: bytes) -> tuple[int | None, str, list[tuple[str, str]]]:
    """``(status, description, pairs)`` of a NATS header block; values lose their
    surrounding spaces (as nats.go and nats-py read them).

    Raises:
        InvalidHeadersError: the block is malformed.
    """
    if not block.startswith(_HEADER_LINE) or not block.endswith(b"\r\n\r\n"):
        raise _bad_headers("a NATS header block starts with NATS/1.0 and ends with an empty line")
    try:
        text = block[:-4].decode()
    except UnicodeDecodeError:
        raise _bad_headers("the NATS header block is not UTF-8") from None
    lines = text.split("\r\n")
    first = lines[0][len(_HEADER_LINE):]
    status: int | None = None
    description = ""
    if first:
        if first[0] != " ":
            raise _bad_headers(f"bad NATS header line {lines[0][:40]!r}")
        code, _, description = first.strip().partition(" ")
        if len(code) != 3 or not code.isdigit():
            raise _bad_headers(f"bad status {code[:10]!r} in the NATS header line")
        status = int(code)
        description = description.strip()
    pairs: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or "\n" in line or "\r" in line:
            raise _bad_headers(f"bad NATS header line {line[:40]!r}")
        pairs.append((name, value.strip()))
    return status, description, pairs


def nats_to_record_headers(block: bytes) -> bytes:
    """ttlbroker's header block of a NATS one (its status line is not kept).

    Raises:
        InvalidHeadersError: the block is malformed or breaks the header rules.
    """
    return encode_headers(decode_nats_headers(block)[2])


def record_to_nats_headers(record_block: bytes | memoryview) -> bytes:
    """The NATS header block of ttlbroker's (names and values already obey the
    rules, so no check is repeated); ``b""`` for an empty block."""
    if not record_block:
        return b""
    out = [_HEADER_LINE]
    for name, value in _iter_header_block(record_block):
        out.append(name + b": " + value)
    return b"\r\n".join(out) + b"\r\n\r\n"


def nats_message_of_record(record: bytes | memoryview) -> tuple[bytes, bytes | None, memoryview]:
    """``(subject, NATS header block or None, payload)`` of one stored record."""
    view = memoryview(record)
    sl, hl, pl = RECORD_FIXED.unpack_from(view, 0)[6:9]
    s = FIXED_SIZE
    subject = bytes(view[s : s + sl])
    headers = record_to_nats_headers(view[s + sl : s + sl + hl]) if hl else None
    return subject, headers, view[s + sl + hl : s + sl + hl + pl]
