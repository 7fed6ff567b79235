"""Messages as the client sends and reads them: :class:`Msg` and :func:`encode_msg`
for publishing, :class:`Fetched` for what a fetch returns."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

import protocol as P
from protocol import TTL_NEVER, Message

__all__ = ["MSG_ID_HEADER", "Msg", "MsgTuple", "encode_msg", "has_msg_id", "Fetched"]

#: The header that identifies a message for the broker's de-duplication (JetStream's).
MSG_ID_HEADER = "Nats-Msg-Id"
_MSG_ID = MSG_ID_HEADER.encode()


class Msg(NamedTuple):
    """A message to publish.

    ``ttl``: seconds (int) or ``"never"`` for the binary TTL field; a ``Nats-TTL``
    header is the other way to give one.
    """

    subject: str
    payload: bytes | str = b""
    headers: Mapping[str, str] | None = None
    ttl: int | str | None = None


#: A message to publish as a plain tuple, ``(subject, payload[, headers[, ttl]])``.
MsgTuple: TypeAlias = (
    tuple[str, bytes | str]
    | tuple[str, bytes | str, Mapping[str, str] | None]
    | tuple[str, bytes | str, Mapping[str, str] | None, int | str | None]
)


def _ttl_field(ttl: int | str | None) -> int:
    if ttl is None:
        return 0
    if isinstance(ttl, str):
        if ttl.lower() == "never":
            return TTL_NEVER
        raise ValueError(f"ttl must be seconds or 'never', not {ttl!r} (send other forms as a Nats-TTL header)")
    if not 0 <= ttl < TTL_NEVER:
        raise ValueError(f"ttl {ttl} does not fit the u32 TTL field")
    return ttl


def encode_msg(
    subject: str, payload: bytes | str = b"", headers: Mapping[str, str] | None = None, ttl: int | str | None = None,
    *, prefix: bytes = b"",
) -> bytes:
    """A message body (``prefix`` in front of it, in the same join)."""
    raw = payload.encode() if isinstance(payload, str) else payload
    return P.encode_body(subject, raw, P.encode_headers(headers) if headers else b"", _ttl_field(ttl), prefix=prefix)


def has_msg_id(body: bytes) -> bool:
    """Whether an encoded message body carries a ``Nats-Msg-Id`` header."""
    headers = P.body_fields(body, 0).headers
    return bool(headers) and P.find_header(headers, _MSG_ID) is not None


@dataclass(frozen=True)
class Fetched:
    """The answer to a fetch: messages and where to continue."""

    messages: list[Message]
    next_offset: int
    first_offset: int
    last_offset: int
    partition: int

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)
