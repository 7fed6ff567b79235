"""A journal: two mirrored append-only files of checksummed entries, with snapshots.

The broker keeps each topic's durable-consumer state in one (``consumers.journal``
and its mirror ``consumers.journal.1``): what it delivered, what was settled, the
consumers' configurations. Storage knows nothing of what the payloads mean; it
keeps them in order, proves each one whole, and never returns a damaged one.

Entry::

    u8 0xC7 | u8 kind | u32 payload_len | u64 seq | payload | u32 CRC-32

The CRC-32 (zlib) covers everything before it. ``seq`` grows by one per entry,
across compactions, and is never reused. ``kind`` 1 marks a *snapshot*: the
payload is the whole state at that point, so reading starts from the newest
snapshot. A compaction writes a file that starts with a snapshot, to both copies
one after the other (each with an atomic replace; the mirror first), so a crash in
between leaves one complete copy and the newer snapshot wins on the next open.

On open both copies are read, resynchronising past damage; the entries are the
union of both (by ``seq``). A damaged range in one copy that the other covers is
reported and repaired by a rewrite. Entries missing from both copies between the
newest snapshot and the last entry (a *gap*) are reported, the damaged copies are
kept in ``quarantine/``, and :attr:`Journal.gaps` says where they were: the reader
decides what the missing entries could have said (the consumer engine treats every
message whose fate they held as still outstanding). A torn last entry (a write the
group commit had not yet made durable) is cut, reported as such.

Both copies are allocated ahead of their last entry (``_durability.allocate_ahead``)
and written at their positions, so the group commit's fdatasync writes the entries,
not a new file size; a close cuts them back. After a stop without one, a copy may end
in allocated space, zero bytes only (no entry starts with a zero byte): the open cuts
it without a report. A tail holding anything else is a torn entry or damage as above.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import NamedTuple

from ._damage import Damage, Report, ignore_damage
from ._durability import fsync_dir
from ._errors import StorageFailure
from ._files import AppendFile, atomic_write, makedirs, open_file, read_if_exists
from ._files import keep_aside as _keep_aside
from ._mirrored import MirroredFiles, scan_entries

__all__ = ["Journal", "JOURNAL_MAGIC"]

JOURNAL_MAGIC = 0xC7
_HEAD = struct.Struct("<BBIQ")  # magic, kind, payload_len, seq
_CRC = struct.Struct("<I")
_SNAPSHOT = 1
_MIRROR = ".1"
#: A single entry may not claim more than this (a damaged length must not make the
#: scan believe in a huge entry).
MAX_ENTRY = 256 * 1024 * 1024


class _Entry(NamedTuple):
    seq: int
    kind: int
    payload: bytes
    pos: int
    end: int


def _entry_at(raw: bytes, pos: int) -> _Entry | None:
    n = len(raw)
    if pos + _HEAD.size + 4 > n or raw[pos] != JOURNAL_MAGIC:
        return None
    _, kind, length, seq = _HEAD.unpack_from(raw, pos)
    end = pos + _HEAD.size + length + 4
    if kind > _SNAPSHOT or length > MAX_ENTRY or end > n:
        return None
    if zlib.crc32(raw[pos : end - 4]) != _CRC.unpack_from(raw, end - 4)[0]:
        return None
    return _Entry(seq, kind, raw[pos + _HEAD.size : end - 4], pos, end)


def encode_entry(seq: int, payload: bytes, snapshot: bool = False) -> bytes:
    head = _HEAD.pack(JOURNAL_MAGIC, _SNAPSHOT if snapshot else 0, len(payload), seq) + payload
    return head + _CRC.pack(zlib.crc32(head))


class Journal(MirroredFiles):
    """Args:
    path: the first copy (the mirror is ``path + ".1"``).
    report: where damage goes.
    keep_aside: copies a damaged file to quarantine before it is rewritten (default:
        a ``quarantine`` folder beside the file).
    readonly: read and report only (``ttlbroker check``).
    kind: the :class:`Damage` kind reported (``consumer_journal``, ``catalog_journal``).
    gap_action: what a report of entries missing from both copies says happens next.

    After opening, :attr:`payloads` holds the payloads from the newest snapshot on,
    in order, and :attr:`gaps` the positions in that list before which entries are
    missing from both copies (empty when nothing was lost).
    """

    def __init__(
        self, path: str, report: Report = ignore_damage, keep_aside: Callable[[str], str] | None = None,
        readonly: bool = False, kind: str = "consumer_journal",
        gap_action: str = "the file is kept in quarantine and what those entries held is treated as outstanding",
    ) -> None:
        self.path = path
        self.kind = kind
        self.gap_action = gap_action
        self.paths = (path, path + _MIRROR)
        self.report = report
        self.fds = [-1, -1]
        self._out: list[AppendFile] = []
        self.dirty = False
        self.payloads: list[bytes] = []
        self.snapshot_first = False
        self.gaps: list[int] = []
        folder = os.path.dirname(path)
        if keep_aside is None:
            quarantine = os.path.join(folder, "quarantine")
            keep_aside = lambda p: _keep_aside(p, quarantine)  # noqa: E731
        if not readonly:
            makedirs(folder)
            for p in self.paths:
                try:
                    os.unlink(p + ".tmp")  # a compaction cut short by a crash: never renamed
                except FileNotFoundError:
                    pass
        raws = [read_if_exists(p) for p in self.paths]
        merged, damaged_files, any_damage, allocated = self._merge_copies(raws, readonly)
        live = self._take_live(merged, readonly)
        if readonly:
            return
        self._open_copies(raws, merged, live, damaged_files, any_damage, allocated, keep_aside)

    def _merge_copies(
        self, raws: list[bytes | None], readonly: bool
    ) -> tuple[dict[int, _Entry], list[str], bool, list[bool]]:
        """The valid entries of both copies ``raws`` by ``seq``, each damaged range
        reported. A copy that ends in zero bytes only (allocated space) loses them in
        ``raws``. Returns ``(entries, files to keep in quarantine, any damage, which
        copies ended in allocated space)``; a copy whose only damage is a torn last
        entry is not kept in quarantine."""
        merged: dict[int, _Entry] = {}
        damaged_files: list[str] = []
        any_damage = False
        allocated = [False, False]
        for k, (p, raw) in enumerate(zip(self.paths, raws)):
            if raw is None:
                continue
            entries, damaged = scan_entries(raw, _entry_at, bytes([JOURNAL_MAGIC]))
            if damaged and damaged[-1][1] == len(raw) and raw.count(0, damaged[-1][0]) == len(raw) - damaged[-1][0]:
                # Zero bytes only after the last entry: space allocated ahead, not damage.
                raws[k] = raw = raw[: damaged.pop()[0]]
                allocated[k] = True
            for e in entries:
                merged.setdefault(e.seq, e)
            for start, end in damaged:
                tail = end == len(raw) and start > 0
                what = (
                    f"{end - start} bytes at the end hold no complete entry (a write cut short)" if tail
                    else f"{end - start} bytes hold no valid entry"
                )
                self.report(Damage(
                    self.kind, p, start, what,
                    "left as is (check)" if readonly else "entries taken from both copies; the file is rewritten",
                ))
            any_damage |= bool(damaged)
            if damaged and not all(end == len(raw) and start > 0 for start, end in damaged):
                damaged_files.append(p)
        return merged, damaged_files, any_damage, allocated

    def _take_live(self, merged: dict[int, _Entry], readonly: bool) -> list[int]:
        """The sequence numbers from the newest snapshot on (their payloads in
        :attr:`payloads`), with every gap in them reported and kept in :attr:`gaps`,
        and the last sequence number given out."""
        seqs = sorted(merged)
        start = 0
        for i in range(len(seqs) - 1, -1, -1):
            if merged[seqs[i]].kind == _SNAPSHOT:
                start = i
                break
        live = seqs[start:]
        self.snapshot_first = bool(live) and merged[live[0]].kind == _SNAPSHOT
        self.payloads = [merged[s].payload for s in live]
        first_expected = live[0] if self.snapshot_first else 1
        for i, s in enumerate(live):
            expected = first_expected if i == 0 else live[i - 1] + 1
            if s != expected:
                self.gaps.append(i)
                self.report(Damage(
                    self.kind, self.path, None,
                    f"entries {expected}..{s - 1} are missing from both copies",
                    f"reported; {self.gap_action}" if not readonly else "left as is (check)",
                ))
        self._seq = seqs[-1] if seqs else 0
        return live

    def _open_copies(
        self, raws: list[bytes | None], merged: dict[int, _Entry], live: list[int], damaged_files: list[str],
        any_damage: bool, allocated: list[bool], keep_aside: Callable[[str], str],
    ) -> None:
        """Open both copies for appending: damaged ones kept in quarantine first, both
        rewritten from the ``live`` entries when they were damaged or differ, and a
        copy that ended in allocated space cut to its entries."""
        path = self.path
        for p in set(damaged_files) | ({path} if self.gaps else set()):
            if os.path.exists(p):
                keep_aside(p)
        present = [r for r in raws if r is not None]
        rewrite = any_damage or len(present) == 1 or (len(present) == 2 and raws[0] != raws[1])
        if rewrite:
            data = b"".join(encode_entry(s, merged[s].payload, merged[s].kind == _SNAPSHOT) for s in live)
            for p in reversed(self.paths):
                atomic_write(p, data)
        created = False
        for i, p in enumerate(self.paths):
            created |= not os.path.exists(p)
            self.fds[i] = open_file(p, os.O_WRONLY | os.O_CREAT)
            if allocated[i] and not rewrite:
                # Not synced: until it is, a crash leaves the same zeros to cut again.
                os.ftruncate(self.fds[i], len(raws[i] or b""))
            self._out.append(AppendFile(self.fds[i], os.fstat(self.fds[i]).st_size))
        if created:
            fsync_dir(os.path.dirname(path))

    @property
    def size(self) -> int:
        """Bytes in the first copy."""
        return self._out[0].size if self._out else 0

    def append(self, payload: bytes) -> int:
        """Append one entry to both copies (durable at the next group commit)."""
        self._seq += 1
        entry = encode_entry(self._seq, payload)
        for i, fd in enumerate(self.fds):
            if fd < 0:
                raise StorageFailure(f"journal {self.paths[i]} is closed")
            self._out[i].append(entry)
        self.dirty = True
        return self._seq

    def compact(self, snapshot: bytes, after: Iterable[bytes] = ()) -> None:
        """Replace both copies with ``snapshot`` (and ``after``): durable on return."""
        self._seq += 1
        parts = [encode_entry(self._seq, snapshot, snapshot=True)]
        for payload in after:
            self._seq += 1
            parts.append(encode_entry(self._seq, payload))
        data = b"".join(parts)
        for i in (1, 0):  # the mirror first: a crash in between leaves the old first copy whole
            if self.fds[i] >= 0:
                os.close(self.fds[i])
                self.fds[i] = -1
            atomic_write(self.paths[i], data)
            self.fds[i] = open_file(self.paths[i], os.O_WRONLY)
            self._out[i] = AppendFile(self.fds[i], len(data))
        self.dirty = False

    def close(self) -> None:
        """Close both copies, each cut to its last entry first (a failure to cut
        leaves zero bytes that the next open cuts)."""
        for i, out in enumerate(self._out):
            if self.fds[i] >= 0:
                try:
                    out.cut()
                except OSError:
                    pass
        super().close()

