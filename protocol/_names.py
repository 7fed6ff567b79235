"""Names and identifiers of streams, topics and consumers.

The name rule is Apache Iggy's: the name is trimmed, lowercased, every inner
whitespace character becomes ``.``, and the result must match ``^[\\w\\.\\-\\s]+$``
and be 1..255 bytes of UTF-8 (its length travels in one byte). So ``"  My Topic "``
becomes ``my.topic`` and ``"a/b"`` or ``""`` are refused. Names never become file
paths (storage uses numeric ids), so ``..`` is a harmless name.

An identifier (Iggy ``identifier.rs``) is either numeric or a name::

    u8 kind (1 = numeric, 2 = name) | u8 length | value
    numeric: length 4, value u32 LE (ids start at 1)
    name:    length 1..255, value UTF-8
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from ._errors import ErrorCode, error_class

__all__ = ["normalize_name", "Identifier", "MAX_NAME_BYTES"]

MAX_NAME_BYTES = 255
_NAME_RE = re.compile(r"^[\w\.\-\s]+$")
_WS_RE = re.compile(r"\s")
_KIND_NUMERIC = 1
_KIND_NAME = 2
_U32 = struct.Struct("<I")


#: Name identifiers already decoded, by their bytes: a request names its stream and
#: topic, the same few names again and again, and each would cost the name rule's
#: checks and a new (immutable) Identifier. Bounded: emptied when full.
_DECODED_NAMES: dict[bytes, Identifier] = {}
_DECODED_NAMES_MAX = 4096


def normalize_name(name: str, what: str = "name") -> str:
    """Apply the Iggy name rule and return the normalised name.

    Raises:
        InvalidNameError: the name is empty after trimming, has a character outside
            ``[\\w.\\-\\s]``, or is longer than 255 bytes.
    """
    if not isinstance(name, str):
        raise error_class(ErrorCode.INVALID_NAME)(f"{what} must be a string, not {type(name).__name__}")
    trimmed = name.strip()
    if not trimmed:
        raise error_class(ErrorCode.INVALID_NAME)(f"{what} must not be empty")
    if not _NAME_RE.match(trimmed):
        raise error_class(ErrorCode.INVALID_NAME)(
            f"{what} {name!r} may only contain letters, digits, '_', '.', '-' and spaces"
        )
    normal = _WS_RE.sub(".", trimmed.lower())
    if len(normal.encode()) > MAX_NAME_BYTES:
        raise error_class(ErrorCode.INVALID_NAME)(f"{what} is longer than {MAX_NAME_BYTES} bytes")
    return normal


@dataclass(frozen=True, slots=True)
class Identifier:
    """A stream or topic addressed by numeric id or by name.

    Build one with :meth:`of` (an ``int`` is an id, a ``str`` a name, which is
    normalised by the name rule).
    """

    value: int | str

    @classmethod
    def of(cls, value: int | str | Identifier) -> Identifier:
        if isinstance(value, Identifier):
            return value
        if isinstance(value, bool):
            raise error_class(ErrorCode.INVALID_IDENTIFIER)("an identifier is an id or a name, not a bool")
        if isinstance(value, int):
            if not 1 <= value <= 0xFFFFFFFF:
                raise error_class(ErrorCode.INVALID_IDENTIFIER)(f"numeric id {value} is outside 1..4294967295")
            return cls(value)
        return cls(normalize_name(value))

    @property
    def is_numeric(self) -> bool:
        return isinstance(self.value, int)

    def encode(self) -> bytes:
        if isinstance(self.value, int):
            return bytes((_KIND_NUMERIC, 4)) + _U32.pack(self.value)
        raw = self.value.encode()
        return bytes((_KIND_NAME, len(raw))) + raw

    @classmethod
    def decode_from(cls, buf: memoryview | bytes, pos: int) -> tuple[Identifier, int]:
        """Decode an identifier at ``pos``; return it and the position after it.

        Raises:
            InvalidIdentifierError: unknown kind or bad length.
            InvalidNameError: a name identifier breaks the name rule.
            IndexError / struct.error: the buffer is too short (callers turn these into
                MALFORMED_PAYLOAD).
        """
        kind = buf[pos]
        length = buf[pos + 1]
        end = pos + 2 + length
        if end > len(buf):
            raise IndexError("identifier runs past the end of the payload")
        if kind == _KIND_NUMERIC:
            if length != 4:
                raise error_class(ErrorCode.INVALID_IDENTIFIER)(f"numeric identifier must have length 4, not {length}")
            value = _U32.unpack_from(buf, pos + 2)[0]
            if value == 0:
                raise error_class(ErrorCode.INVALID_IDENTIFIER)("numeric ids start at 1")
            return cls(value), end
        if kind == _KIND_NAME:
            if length == 0:
                raise error_class(ErrorCode.INVALID_IDENTIFIER)("a name identifier must not be empty")
            raw = bytes(buf[pos + 2 : end])
            known = _DECODED_NAMES.get(raw)
            if known is not None:
                return known, end
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                raise error_class(ErrorCode.INVALID_IDENTIFIER)("a name identifier must be UTF-8") from None
            ident = cls(normalize_name(text))
            if len(_DECODED_NAMES) >= _DECODED_NAMES_MAX:
                _DECODED_NAMES.clear()
            _DECODED_NAMES[raw] = ident
            return ident, end
        raise error_class(ErrorCode.INVALID_IDENTIFIER)(f"identifier kind must be 1 (numeric) or 2 (name), not {kind}")

    def __str__(self) -> str:
        return str(self.value)
