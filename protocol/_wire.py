"""Small helpers to read and write the fixed layouts of command payloads.

:class:`Reader` reads fields in order from a payload and turns any shortfall into
MALFORMED_PAYLOAD, so each command's ``decode`` reads like its layout in
``docs/protocol.md``.
"""

from __future__ import annotations

import struct

import msgpack

from ._errors import ErrorCode, error_class
from ._names import Identifier

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

#: Limits on the msgpack options map decoded from a peer (msgpack-python's defaults
#: allow 100 MiB; an options map is a handful of keys).
MAX_MAP_BYTES = 64 * 1024


def malformed(message: str) -> Exception:
    return error_class(ErrorCode.MALFORMED_PAYLOAD)(message)


def u8(v: int) -> bytes:
    return _U8.pack(v)


def u16(v: int) -> bytes:
    return _U16.pack(v)


def u32(v: int) -> bytes:
    return _U32.pack(v)


def u64(v: int) -> bytes:
    return _U64.pack(v)


def short_str(text: str, what: str = "string") -> bytes:
    """``u8 length | UTF-8`` (names, subjects, filters)."""
    raw = text.encode()
    if len(raw) > 255:
        raise error_class(ErrorCode.INVALID_NAME)(f"{what} is longer than 255 bytes")
    return _U8.pack(len(raw)) + raw


def pack_map(value: dict[str, object] | None) -> bytes:
    """``u32 length | msgpack map`` (length 0 = empty map)."""
    if not value:
        return _U32.pack(0)
    raw = msgpack.packb(value, use_bin_type=True)
    return _U32.pack(len(raw)) + raw


class Reader:
    """Sequential reader over one payload; every shortfall is MALFORMED_PAYLOAD."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str, pos: int = 0) -> None:
        self.data = data
        self.pos = pos
        self.what = what

    def _take(self, st: struct.Struct) -> int:
        try:
            (v,) = st.unpack_from(self.data, self.pos)
        except struct.error:
            raise malformed(f"{self.what}: payload ends at byte {len(self.data)}, expected more fields") from None
        self.pos += st.size
        return v

    def u8(self) -> int:
        return self._take(_U8)

    def u16(self) -> int:
        return self._take(_U16)

    def u32(self) -> int:
        return self._take(_U32)

    def u64(self) -> int:
        return self._take(_U64)

    def raw(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise malformed(f"{self.what}: a field of {n} bytes runs past the end of the payload")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def short_str(self, what: str) -> str:
        raw = self.raw(self.u8())
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise malformed(f"{self.what}: {what} is not UTF-8") from None

    def ident(self) -> Identifier:
        try:
            ident, self.pos = Identifier.decode_from(self.data, self.pos)
        except (IndexError, struct.error):
            raise malformed(f"{self.what}: identifier runs past the end of the payload") from None
        return ident

    def map(self, limit: int = MAX_MAP_BYTES) -> dict[str, object]:
        """A ``u32 length | msgpack map``; ``limit`` bounds the length (the options a
        peer sends are small; a response's map is bounded by its frame instead)."""
        n = self.u32()
        if n == 0:
            return {}
        if n > limit:
            raise error_class(ErrorCode.INVALID_OPTIONS)(f"{self.what}: options map of {n} bytes exceeds {limit}")
        raw = self.raw(n)
        try:
            value = msgpack.unpackb(raw, raw=False, strict_map_key=True)  # size bounded above
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise error_class(ErrorCode.INVALID_OPTIONS)(f"{self.what}: options map is not valid msgpack ({exc})") from None
        if not isinstance(value, dict):
            raise error_class(ErrorCode.INVALID_OPTIONS)(f"{self.what}: options must be a msgpack map")
        return value

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def end(self) -> None:
        if self.pos != len(self.data):
            raise malformed(f"{self.what}: {len(self.data) - self.pos} unexpected bytes after the last field")
