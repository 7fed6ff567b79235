"""Where a sourcing topic is in each of its sources: ``sources.state`` and its
mirror ``sources.state2`` (:class:`SourceMarks`).

A topic that sources other streams must not take a message of a source twice,
even after it lost every copy of it (a purge, a delete, an expiry, the limits, the
acks of a work queue), and even across a restart. Its log alone cannot tell: the
newest copy that names a source may be gone. So the partition keeps, for each
source (its ``iname``, the name the broker gives it), a *mark*: the origin
sequence of the last message copied from it, the origin's identity, and the
offset that copy got here. The broker notes a mark with every batch it copies
(:meth:`SourceMarks.note`, in the same synchronous step as the append); storage
writes the marks down when they are needed:

- before it removes a record at or above the offset the file last covered
  (:meth:`SourceMarks.protect`: the file then covers every record below the next
  offset); the write goes to the page cache and the group commit syncs it with the
  deletion (a purge, which is durable when it returns, syncs it first);
- at a clean close.

A file is valid *up to* its ``valid_to``: its marks account for every copy at a
lower offset. At open the broker gives the topic's sources and a way to read the
source of a record (:meth:`SourceMarks.configure`); copies at or above
``valid_to`` (made after the last write) are then found by scanning the log back
from its end, and a source the file does not know is searched for down to the
log's first offset (the behaviour without a file, as nats-server's
``startingSequenceForSources``).

Format, each copy (little-endian)::

    magic "TBSS" | u16 version (1) | u16 0 | u64 generation | u64 valid_to
    | u32 count | u32 length of the entries
    | entries: u16 n, iname (UTF-8, n bytes), u64 origin seq, u64 offset,
               u16 m, origin identity (m bytes)
    | u32 CRC-32 of every byte before it

Writes alternate between the two files (the next one after the group commit
took the last write; until then the same one again), so that a torn write, which
only a machine crash makes, leaves the other copy whole. Reading takes the valid
copy with the highest generation. A mark is trusted only if the record it names
was recovered, or purged: a machine crash that lost the log's tail may have kept a
mark of copies it lost, and those are copied again (never skipped). With neither
copy valid the marks come from the scan alone, which may take a message whose
copies were all removed once more after a machine crash (at least once, never a
gap); after a process crash (``kill -9``) or a clean stop, never.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from ._damage import Damage, Report
from ._durability import fsync_dir
from ._files import open_file, read_if_exists, write_all

__all__ = ["SourceMark", "SourceMarks", "SOURCES_NAME"]

SOURCES_NAME = "sources.state"
_HEAD = struct.Struct("<4sHHQQII")
_CRC = struct.Struct("<I")
_U16 = struct.Struct("<H")
_U64X2 = struct.Struct("<QQ")
_MAGIC = b"TBSS"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class SourceMark:
    """The last message copied from one source: its origin sequence, the origin's
    identity (``""``: not known) and the offset its copy got here."""

    seq: int
    ident: str
    offset: int


#: Reads the source of one live record: ``(iname, origin seq, identity)``, or None
#: when the record names no source (the broker's: storage knows no headers).
SourceOf = Callable[[memoryview], "tuple[str, int, str] | None"]


def _pack(generation: int, valid_to: int, marks: dict[str, SourceMark]) -> bytes:
    parts = []
    for iname, m in sorted(marks.items()):
        name, ident = iname.encode(), m.ident.encode()
        parts += [_U16.pack(len(name)), name, _U64X2.pack(m.seq, m.offset), _U16.pack(len(ident)), ident]
    entries = b"".join(parts)
    body = _HEAD.pack(_MAGIC, _VERSION, 0, generation, valid_to, len(marks), len(entries)) + entries
    return body + _CRC.pack(zlib.crc32(body))


def _unpack(raw: bytes) -> tuple[int, int, dict[str, SourceMark]] | str:
    """``(generation, valid_to, marks)``, or what is wrong with ``raw``."""
    if len(raw) < _HEAD.size + _CRC.size:
        return "shorter than its header"
    magic, version, _, generation, valid_to, count, length = _HEAD.unpack_from(raw, 0)
    if magic != _MAGIC:
        return "not a sources state file"
    end = _HEAD.size + length
    if end + _CRC.size > len(raw):
        return "cut short"
    (crc,) = _CRC.unpack_from(raw, end)
    if zlib.crc32(raw[:end]) != crc:
        return "checksum mismatch"
    if version != _VERSION:
        return f"version {version} is not known"
    marks: dict[str, SourceMark] = {}
    pos = _HEAD.size
    try:
        for _ in range(count):
            (n,) = _U16.unpack_from(raw, pos)
            iname = raw[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            seq, offset = _U64X2.unpack_from(raw, pos)
            (m,) = _U16.unpack_from(raw, pos + 16)
            ident = raw[pos + 18 : pos + 18 + m].decode()
            pos += 18 + m
            marks[iname] = SourceMark(seq, ident, offset)
    except (struct.error, UnicodeDecodeError):
        return "entries do not parse"
    if pos != end:
        return "entries do not parse"
    return generation, valid_to, marks


class SourceMarks:
    """The marks of one partition's sources (``directory`` None: a memory log, which
    keeps them in memory only).

    Attributes:
        marks: iname -> :class:`SourceMark`, for the configured sources that copied
            anything.
        valid_to: the offset below which the file accounts for every copy.
    """

    def __init__(self, directory: str | None) -> None:
        self.paths = (
            (os.path.join(directory, SOURCES_NAME), os.path.join(directory, SOURCES_NAME + "2")) if directory else ()
        )
        self.marks: dict[str, SourceMark] = {}
        self.valid_to = 1
        self._generation = 0
        self._fds = [-1, -1]
        #: The copy the next write goes to, and whether it holds a write no group
        #: commit has taken yet (then the next write goes to it again).
        self._slot = 0
        self._untaken = False
        self._configured = False

    # -- reading ---------------------------------------------------------------------

    @classmethod
    def load(cls, directory: str | None, report: Report, recovered_next: int, purged_through: int) -> SourceMarks:
        """The marks a partition's files hold (none: no file). ``recovered_next``:
        the offset after the last record recovery found; a mark of a record beyond it
        (lost by a machine crash) and not purged is not trusted."""
        sm = cls(directory)
        found: list[tuple[int, int, dict[str, SourceMark], int]] = []
        bad: list[tuple[str, str]] = []
        for i, path in enumerate(sm.paths):
            raw = read_if_exists(path)
            if raw is None:
                continue
            got = _unpack(raw)
            if isinstance(got, str):
                bad.append((path, got))
            else:
                found.append((*got, i))
        if not found:
            for path, why in bad:
                report(Damage("sources_state", path, None, why,
                              "where each source is found by scanning the copy back (rewritten at the next write)"))
            return sm
        generation, valid_to, marks, slot = max(found)
        for path, why in bad:
            report(Damage("sources_state", path, None, why, "used the other copy (rewritten at the next write)"))
        sm._generation = generation
        sm._slot = 1 - slot
        sm.valid_to = min(valid_to, recovered_next)
        sm.marks = {k: m for k, m in marks.items() if m.offset < recovered_next or m.offset <= purged_through}
        return sm

    def configure(self, inames: Collection[str], records: Iterable[tuple[int, memoryview]], source_of: SourceOf) -> None:
        """Keep the marks of the sources ``inames`` only (nats-server forgets a
        source that is no longer configured) and find, in ``records`` (the log's live
        records, newest first), the copies the marks do not account for: those at or
        above :attr:`valid_to` for every source, and any copy of a source without a
        mark (the scan stops when nothing more can be learnt)."""
        wanted = set(inames)
        self.marks = {k: m for k, m in self.marks.items() if k in wanted}
        # Above valid_to every source may have newer copies than its mark; below it
        # only a source without a mark is looked for. After the first configure every
        # copy is accounted for, and only new sources are.
        floor: int | None = self.valid_to if not self._configured else None
        todo = set(wanted) if floor is not None else wanted - self.marks.keys()
        newer: dict[str, SourceMark] = {}
        for offset, rec in records:
            if floor is not None and offset < floor:
                todo -= self.marks.keys()
                floor = None
            if not todo:
                break
            got = source_of(rec)
            if got is not None and got[0] in todo:
                newer[got[0]] = SourceMark(got[1], got[2], offset)
                todo.discard(got[0])
        self.marks.update(newer)
        self._configured = True

    def mark(self, iname: str) -> SourceMark | None:
        return self.marks.get(iname)

    # -- writing ---------------------------------------------------------------------

    def note(self, iname: str, seq: int, ident: str, offset: int) -> None:
        """The last copy of a batch from source ``iname`` is stored at ``offset``."""
        self.marks[iname] = SourceMark(seq, ident, offset)

    def protect(self, highest: int, next_offset: int, durable: bool = False) -> None:
        """Before records up to ``highest`` are removed: write the marks if the file
        does not cover that offset yet (to the page cache for the next group commit;
        ``durable``: synced now)."""
        if highest >= self.valid_to and self.marks and self.paths:
            self.write(next_offset, durable)

    def write(self, valid_to: int, durable: bool) -> None:
        self._generation += 1
        self.valid_to = valid_to
        raw = _pack(self._generation, valid_to, self.marks)
        slot = self._slot
        fd = self._fds[slot]
        created = False
        if fd < 0:
            created = not os.path.exists(self.paths[slot])
            fd = self._fds[slot] = open_file(self.paths[slot], os.O_RDWR | os.O_CREAT)
        write_all(fd, raw, os.fstat(fd).st_size, at=0)
        self._untaken = True
        if durable:
            os.fdatasync(fd)
            self.take_dirty_fds()
        if created:
            fsync_dir(os.path.dirname(self.paths[slot]))

    def take_dirty_fds(self) -> list[int]:
        """The copy written since the group commit last asked (for it to sync); the
        next write goes to the other copy."""
        if not self._untaken:
            return []
        self._untaken = False
        fd = self._fds[self._slot]
        self._slot = 1 - self._slot
        return [fd]

    def remove(self) -> None:
        """The topic has no sources any more: the files go."""
        self.close(None)
        self.marks.clear()
        for path in self.paths:
            if os.path.exists(path):
                os.unlink(path)

    def close(self, next_offset: int | None) -> None:
        """Close the files; ``next_offset`` (a clean close): the marks written
        durably first, covering every record."""
        if next_offset is not None and self.marks and self.paths:
            try:
                self.write(next_offset, durable=True)
            except OSError:
                pass  # the next start scans from the last write
        for i, fd in enumerate(self._fds):
            if fd >= 0:
                os.close(fd)
                self._fds[i] = -1
