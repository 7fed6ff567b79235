"""A partition's small durable state: the purge watermark and the high-water marks.

File ``partition.state``: two copies of one 44-byte slot, at byte 0 and at byte 4096
(so that one damaged page or one torn write cannot take both)::

    magic "TBPS" | u16 version | u16 flags | u64 generation | u64 purged_through
    | u64 reserved_next | u64 acked_next | u32 CRC-32 of the 40 bytes before it

``purged_through``
    every offset at or below it is gone (a purge writes it, durably, before any file
    is removed). Only ever grows.
``reserved_next``
    no offset at or above it has ever been handed out. Where acks do not wait for
    the disk (fsync interval or never) the log reserves offsets ahead, durably,
    before handing them out, so a machine crash that loses acknowledged records
    cannot make the broker give their offsets out again. At a clean close it is the
    exact next offset.
``acked_next``
    every offset below it was durable in the log when it was written (it trails the
    group commit by one sync and is written without an fsync of its own). Recovery
    compares the log with it: records missing below it were acknowledged and are
    reported as damage, never silently cut as a torn tail.
``flags``
    bit 0: the partition was closed cleanly (everything synced, nothing torn).

Durable writes put the new slot at byte 0, fsync, then at byte 4096, fsync: a crash
between the two leaves one slot of each generation, both valid. Lazy writes (the
trailing ``acked_next``) only ever touch the second slot, so the first one always
holds the last durable state. Reading takes the valid slot with the highest
generation; the monotonic fields take the highest value of any valid slot.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

from ._durability import fdatasync_new
from ._files import open_file

__all__ = ["PartitionState", "StateFile", "STATE_NAME"]

STATE_NAME = "partition.state"
_SLOT = struct.Struct("<4sHHQQQQ")
_CRC = struct.Struct("<I")
SLOT_SIZE = _SLOT.size + _CRC.size
_SECOND = 4096
_MAGIC = b"TBPS"
_VERSION = 1
CLEAN = 1


@dataclass
class PartitionState:
    purged_through: int = 0
    reserved_next: int = 0
    acked_next: int = 0
    clean: bool = False
    generation: int = 0


def _pack(st: PartitionState) -> bytes:
    body = _SLOT.pack(
        _MAGIC, _VERSION, CLEAN if st.clean else 0, st.generation, st.purged_through, st.reserved_next, st.acked_next
    )
    return body + _CRC.pack(zlib.crc32(body))


def _unpack(raw: bytes) -> PartitionState | None:
    if len(raw) < SLOT_SIZE:
        return None
    body = raw[: _SLOT.size]
    (crc,) = _CRC.unpack_from(raw, _SLOT.size)
    if zlib.crc32(body) != crc:
        return None
    magic, version, flags, gen, purged, reserved, acked = _SLOT.unpack(body)
    if magic != _MAGIC or version != _VERSION:
        return None
    return PartitionState(purged, reserved, acked, bool(flags & CLEAN), gen)


class StateFile:
    """The open ``partition.state`` of one partition.

    Attributes:
        state: the current state (in memory; :meth:`write` makes it durable).
        found: what :meth:`open` read: ``"new"`` (no file), ``"ok"``, ``"one_bad"``
            (one slot damaged, the other used), ``"both_bad"``.
        bad_positions: byte positions of damaged slots.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.state = PartitionState()
        self.found = "new"
        self.bad_positions: list[int] = []
        self._fd = -1

    @classmethod
    def open(cls, path: str, readonly: bool = False) -> StateFile:
        sf = cls(path)
        try:
            fd = open_file(path, os.O_RDONLY if readonly else os.O_RDWR)
        except FileNotFoundError:
            return sf
        sf._fd = fd
        slots = []
        for pos in (0, _SECOND):
            st = _unpack(os.pread(fd, SLOT_SIZE, pos))
            if st is None:
                sf.bad_positions.append(pos)
            else:
                slots.append(st)
        if not slots:
            sf.found = "both_bad"
            return sf
        sf.found = "ok" if not sf.bad_positions else "one_bad"
        newest = max(slots, key=lambda s: s.generation)
        newest.purged_through = max(s.purged_through for s in slots)
        newest.acked_next = max(s.acked_next for s in slots)
        sf.state = newest
        return sf

    def _ensure_open(self) -> bool:
        """Open (creating) the file; True if it was created (its directory entry
        then needs an fsync of the directory)."""
        if self._fd >= 0:
            return False
        existed = os.path.exists(self.path)
        self._fd = open_file(self.path, os.O_RDWR | os.O_CREAT)
        return not existed

    def write(self) -> bool:
        """Write the state durably (both slots, each fsynced). Returns True if the
        file was created (the caller fsyncs the directory)."""
        created = self._ensure_open()
        self.state.generation += 1
        raw = _pack(self.state)
        if created:
            # A new file has no earlier state for a torn write to spoil: both slots in
            # one write and one sync. Its directory entry is synced after this (the
            # caller), so a crash leaves either no file or this content.
            block = raw + bytes(_SECOND - len(raw)) + raw
            if os.pwrite(self._fd, block, 0) != len(block):
                raise OSError("short write to partition state")
            fdatasync_new(self._fd)
            return created
        for pos in (0, _SECOND):
            if os.pwrite(self._fd, raw, pos) != len(raw):
                raise OSError("short write to partition state")
            os.fdatasync(self._fd)
        return created

    def write_lazy(self) -> None:
        """Write the state to the second slot only, without an fsync (the trailing
        ``acked_next``: losing it costs precision of damage reports, nothing else)."""
        if self._fd < 0:
            return
        self.state.generation += 1
        os.pwrite(self._fd, _pack(self.state), _SECOND)

    @property
    def fd(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
