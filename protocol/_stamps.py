"""The payload of ``ttlbroker bench``: stamped with the publisher's clock, so that a
subscriber (of either protocol, in any process on the machine) can work out the
publish-to-receive latency of each message.

A stamped payload is at least :data:`STAMP_SIZE` bytes: ``"TBNC" | u64 ns``, the
publisher's wall clock (nanoseconds since the Unix epoch) when it sent the message,
then zeros to the size asked for. Anything else is a payload without a stamp.
"""

from __future__ import annotations

import struct

__all__ = ["STAMP_SIZE", "payload_stamp", "stamped_payload"]

_STAMP = struct.Struct("<4sQ")
_MARK = b"TBNC"
#: The fewest bytes a stamped payload has.
STAMP_SIZE = _STAMP.size


def stamped_payload(size: int, now_ns: int) -> bytes:
    """A payload of ``size`` bytes stamped with ``now_ns`` (zeros, unstamped, when
    ``size`` is below :data:`STAMP_SIZE`)."""
    if size < STAMP_SIZE:
        return bytes(size)
    return _STAMP.pack(_MARK, now_ns) + bytes(size - STAMP_SIZE)


def payload_stamp(payload: bytes | memoryview) -> int | None:
    """The publisher's clock (ns) a stamped payload carries, or None."""
    if len(payload) >= STAMP_SIZE and payload[:4] == _MARK:
        return int(_STAMP.unpack_from(payload)[1])
    return None
