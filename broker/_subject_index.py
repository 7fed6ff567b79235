"""Per-partition subject state: how many live messages each subject has, its first
and last live offset, and which subject every offset belongs to.

The last of these is one ``u32`` subject id per offset, in a ``bytearray``: 4 bytes a
message, and finding the previous or next message of a subject is a C-speed
``rfind``/``find`` of the id's bytes (the NATS file store keeps the same per-subject
``first/last/total`` and recomputes "first" lazily by scanning; we scan memory
instead of blocks). Nothing here is persisted: it is rebuilt from the log when the
broker starts.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

__all__ = ["SubjectIndex", "SubjectState", "PENDING", "NEVER", "NO_MARKER", "MARKER", "TOMBSTONE"]

_U32 = struct.Struct("<I")

# Per-offset flags (one byte per message, beside its subject id):
#: the message has a live entry in the deadline structure
PENDING = 0x01
#: its TTL is ``never``: max age does not remove it
NEVER = 0x02
#: its removal by age leaves no marker (a KV purge tombstone)
NO_MARKER = 0x04
#: it is a subject delete marker (its removal never leaves another one)
MARKER = 0x08
#: it is a KV tombstone (``KV-Operation: DEL`` or ``PURGE``)
TOMBSTONE = 0x10


class SubjectState:
    """One subject in one partition."""

    __slots__ = ("sid", "count", "first", "last")

    def __init__(self, sid: int, offset: int) -> None:
        self.sid = sid
        self.count = 1
        self.first = offset
        self.last = offset

    def __repr__(self) -> str:
        return f"SubjectState(sid={self.sid}, count={self.count}, first={self.first}, last={self.last})"


class SubjectIndex:
    """Args:
    base: the first offset the id array describes (1 for a new partition).
    is_live: tells whether an offset is still live (the partition log knows).
    """

    def __init__(self, base: int, is_live: Callable[[int], bool]) -> None:
        self.base = base
        self.seq = bytearray()  # u32 subject id per offset from ``base``
        self.flags = bytearray()  # one flag byte per offset from ``base``
        self.subjects: dict[bytes, SubjectState] = {}
        self.names: list[bytes] = []
        self._is_live = is_live
        #: Bumped whenever a subject is added or forgotten (filter caches key on it).
        self.version = 0

    def __len__(self) -> int:
        return len(self.subjects)

    def get(self, subject: bytes) -> SubjectState | None:
        return self.subjects.get(subject)

    def subject_at(self, offset: int) -> bytes:
        return self.names[_U32.unpack_from(self.seq, (offset - self.base) * 4)[0]]

    def sid_at(self, offset: int) -> int:
        return _U32.unpack_from(self.seq, (offset - self.base) * 4)[0]

    # -- adding --------------------------------------------------------------------

    def flags_at(self, offset: int) -> int:
        i = offset - self.base
        return self.flags[i] if 0 <= i < len(self.flags) else 0

    def set_flags(self, offset: int, value: int) -> None:
        self.flags[offset - self.base] = value

    def extend(self, first_offset: int, subjects: list[bytes], flags: bytes | None = None) -> None:
        """Record that ``subjects[k]`` was stored at ``first_offset + k`` (with
        ``flags[k]``, zero when not given).

        Runtime complexity: O(len(subjects)), one dict lookup per message.
        """
        expected = self.base + len(self.seq) // 4
        if first_offset != expected:
            # Offsets with no subject (recovery gaps): fill with an id that matches nothing.
            self._pad(first_offset)
        table = self.subjects
        ids = []
        append = ids.append
        off = first_offset
        for s in subjects:
            st = table.get(s)
            if st is None:
                st = SubjectState(len(self.names), off)
                self.names.append(s)
                table[s] = st
                self.version += 1
            else:
                if not st.count:
                    st.first = off
                st.count += 1
                st.last = off
            append(st.sid)
            off += 1
        self.seq += struct.pack(f"<{len(ids)}I", *ids)
        self.flags += flags if flags is not None else bytes(len(ids))

    def _pad(self, offset: int) -> None:
        missing = offset - (self.base + len(self.seq) // 4)
        if missing > 0:
            self.seq += b"\xff\xff\xff\xff" * missing
            self.flags += bytes(missing)
        elif missing < 0:
            raise ValueError(f"offset {offset} was already indexed")

    # -- removing ------------------------------------------------------------------

    def removed(self, offset: int) -> SubjectState | None:
        """Account for the removal of the live message at ``offset`` (call after the
        log no longer reports it live). Returns its subject's state (count may be 0).
        """
        i = offset - self.base
        if i < 0 or i * 4 >= len(self.seq):
            return None
        sid = _U32.unpack_from(self.seq, i * 4)[0]
        if sid == 0xFFFFFFFF:
            return None
        st = self.subjects[self.names[sid]]
        st.count -= 1
        if st.count <= 0:
            st.count = 0
            st.first = st.last = 0
        elif st.count == 1:
            # One left: it is whichever of first and last is not going away.
            st.first = st.last = st.last if offset == st.first else st.first
        else:
            if offset == st.first:
                st.first = self.next_live(sid, offset + 1)
            if offset == st.last:
                st.last = self.prev_live(sid, offset)
        return st

    def next_live(self, sid: int, start: int) -> int:
        """The first live offset >= ``start`` with subject ``sid`` (0 if none)."""
        needle = _U32.pack(sid)
        seq = self.seq
        pos = max(start - self.base, 0) * 4
        while True:
            i = seq.find(needle, pos)
            if i < 0:
                return 0
            if i % 4:
                pos = i + (4 - i % 4)
                continue
            off = self.base + i // 4
            if self._is_live(off):
                return off
            pos = i + 4

    def prev_live(self, sid: int, before: int) -> int:
        """The last live offset < ``before`` with subject ``sid`` (0 if none)."""
        needle = _U32.pack(sid)
        seq = self.seq
        end = min(before - self.base, len(seq) // 4) * 4
        while end > 0:
            i = seq.rfind(needle, 0, end)
            if i < 0:
                return 0
            if i % 4:
                end = i + 3
                continue
            off = self.base + i // 4
            if self._is_live(off):
                return off
            end = i
        return 0

    def trim(self, first_kept: int) -> None:
        """Forget ids below ``first_kept`` (after a purge removed them all)."""
        drop = min(first_kept - self.base, len(self.flags))
        if drop > 0:
            del self.seq[: drop * 4]
            del self.flags[:drop]
            self.base += drop

    def forget_empty(self) -> None:
        """Drop subjects with no live message (after purges), so memory follows data.

        Their ids stay reserved in ``names`` (offsets in ``seq`` may still name them)
        but their state goes.
        """
        empty = [s for s, st in self.subjects.items() if not st.count]
        for s in empty:
            del self.subjects[s]
        if empty:
            self.version += 1

    def matching_ids(self, matches: Callable[[bytes], bool]) -> set[int]:
        """Ids of the known subjects for which ``matches(subject)`` is true."""
        # Empty subjects too: one may get a message again without a version bump.
        return {st.sid for s, st in self.subjects.items() if matches(s)}
