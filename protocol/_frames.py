"""Frames: the length-prefixed envelope of every request, response and push.

Every frame, in both directions, starts with the same 16-byte header::

    offset size field
    0      4    length          u32 LE, bytes after this field (12 + payload length)
    4      2    code            u16 LE, the Command (requests and responses) or the
                                PushKind (pushes)
    6      2    flags           u16 LE, RESPONSE = 0x1, PUSH = 0x2, 0 for requests
    8      4    correlation_id  u32 LE, chosen by the client, echoed in the response;
                                0 in pushes
    12     4    status          u32 LE, 0 = OK, else an ErrorCode; 0 in requests
    16     ...  payload

The decoder checks ``length`` against the maximum as soon as the header is in, before
buffering any of the payload (h2's frame buffer, for one, checks a frame's length only
once the whole frame is in), so a peer can never make us hold more than
``max_frame_size`` bytes of one frame.
"""

from __future__ import annotations

import struct
from collections.abc import Container
from typing import NamedTuple

from ._codes import Command
from ._errors import ErrorCode, RemoteProtocolError

__all__ = ["FRAME_HEADER", "FLAG_RESPONSE", "FLAG_PUSH", "Frame", "FrameDecoder", "encode_frame"]

FRAME_HEADER = struct.Struct("<IHHII")
HEADER_SIZE = FRAME_HEADER.size  # 16
MIN_LENGTH = HEADER_SIZE - 4  # a frame with an empty payload
FLAG_RESPONSE = 0x1
FLAG_PUSH = 0x2
_KNOWN_FLAGS = FLAG_RESPONSE | FLAG_PUSH
_PUBLISH = int(Command.PUBLISH)
#: The head of a PUBLISH payload: u8 flags, u32 count (``_commands.Publish``).
_PUBLISH_HEAD = struct.Struct("<BI")
#: The fixed part of a message body, the least each message of a PUBLISH takes.
_MIN_BODY = 14

#: Default cap on a whole frame (header included): 16 MiB, room for a batch of a
#: thousand 16 KiB messages. NATS caps one message at 1 MiB (max_payload) and Kafka a
#: request at 100 MiB (socket.request.max.bytes); batches sit between the two.
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
_NO_LIMIT = 1 << 62


class Frame(NamedTuple):
    code: int
    flags: int
    correlation_id: int
    status: int
    payload: bytes


def encode_frame(code: int, flags: int, correlation_id: int, status: int, payload: bytes | bytearray = b"") -> bytes:
    """One frame as bytes.

    Raises:
        OverflowError / struct.error: a field does not fit its width (a caller bug).
    """
    return FRAME_HEADER.pack(MIN_LENGTH + len(payload), code, flags, correlation_id, status) + payload


class FrameDecoder:
    """Incremental frame decoder: ``feed`` bytes as they arrive, take frames out.

    Partial frames stay buffered across ``feed`` calls. After a
    :class:`RemoteProtocolError` the decoder is unusable (the stream cannot be
    re-synchronised) and every further call raises the same error.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None if more bytes are needed.

        Raises:
            RemoteProtocolError: MALFORMED_FRAME for a length below the header size or
                unknown flags; FRAME_TOO_LARGE for a length over the maximum. Its
                ``correlation_id`` attribute carries the frame's id.
        """
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < HEADER_SIZE:
            return None
        length, code, flags, corr, status = FRAME_HEADER.unpack_from(buf, pos)
        if length < MIN_LENGTH or flags & ~_KNOWN_FLAGS:
            self._fail(f"frame header is invalid (length {length}, flags {flags:#x})", ErrorCode.MALFORMED_FRAME, corr, code)
        if length + 4 > self.max_frame_size:
            self._fail(
                f"frame of {length + 4} bytes exceeds the maximum of {self.max_frame_size} bytes",
                ErrorCode.FRAME_TOO_LARGE,
                corr,
                code,
            )
        end = pos + 4 + length
        if len(buf) < end:
            return None
        payload = bytes(buf[pos + HEADER_SIZE : end])
        self._pos = end
        return Frame(code, flags, corr, status, payload)

    def take_ok_responses(self, codes: Container[int]) -> list[tuple[int, bytes]]:
        """Take out the frames at the head of the buffer that are complete and
        successful responses (status 0) to one of the commands ``codes``: their
        correlation ids and payloads, in order. The first frame that is anything
        else, an invalid header included, and what follows it are left for
        :meth:`next_frame`.

        A client's one pass over what a read delivered: the answers it expects by
        the thousand (acks) without a :class:`Frame`, an event or a call each."""
        return self._take_run(codes, FLAG_RESPONSE, True, _NO_LIMIT)

    def take_requests(self, code: int, limit: int) -> list[tuple[int, bytes]]:
        """Server side: take out up to ``limit`` frames at the head of the buffer
        that are complete requests (flags 0) of command ``code``: their correlation
        ids and payloads, in order, the frames :meth:`next_frame` would give (a
        request's status field is not looked at, as there). The first frame that is
        anything else, an invalid header included, and what follows it are left
        for :meth:`next_frame`.

        The server's one pass over a pipelining client's read of requests of one
        kind (KV gets): no :class:`Frame` or event each."""
        return self._take_run((code,), 0, False, limit)

    def _take_run(self, codes: Container[int], want_flags: int, ok_only: bool, limit: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        if self._error is not None:
            return out
        buf = self._buf
        pos = self._pos
        size = len(buf)
        max_size = self.max_frame_size
        unpack = FRAME_HEADER.unpack_from
        while size - pos >= HEADER_SIZE:
            length, fcode, flags, corr, status = unpack(buf, pos)
            end = pos + 4 + length
            if (
                fcode not in codes
                or flags != want_flags
                or (status and ok_only)
                or size < end
                or length < MIN_LENGTH
                or length + 4 > max_size
            ):
                break
            out.append((corr, bytes(buf[pos + HEADER_SIZE : end])))
            pos = end
            if len(out) >= limit:
                break
        self._pos = pos
        return out

    def take_publish(self) -> tuple[int, bytes, int] | None:
        """Server side: take the next frame out if it is complete and a PUBLISH
        request that wants acks for one message or more (payload flags 0, a count,
        room for that many bodies: what ``Publish.decode`` accepts with flags 0):
        its correlation id, payload and message count. Anything else, an invalid
        header included, is left for :meth:`next_frame` (None).

        The server's one pass over what a pipelining client's read delivered: no
        Frame, event or command object per request."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < HEADER_SIZE + _PUBLISH_HEAD.size or self._error is not None:
            return None
        length, code, flags, corr, _ = FRAME_HEADER.unpack_from(buf, pos)
        end = pos + 4 + length
        if code != _PUBLISH or flags or len(buf) < end or length + 4 > self.max_frame_size:
            return None
        pflags, count = _PUBLISH_HEAD.unpack_from(buf, pos + HEADER_SIZE)
        if pflags or not count or length - MIN_LENGTH - _PUBLISH_HEAD.size < _MIN_BODY * count:
            return None
        self._pos = end
        return corr, bytes(buf[pos + HEADER_SIZE : end]), count

    def _fail(self, message: str, code: ErrorCode, corr: int, frame_code: int) -> None:
        err = RemoteProtocolError(message, code)
        err.correlation_id = corr
        err.frame_code = frame_code
        self._error = err
        self._buf = bytearray()
        self._pos = 0
        raise err
