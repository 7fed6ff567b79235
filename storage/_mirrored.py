"""Two copies of one file written alike, entry by entry: what the consumer offsets
(``_datadir.ConsumerOffsets``) and the consumer journal (``_journal.Journal``) have in
common. Their entries differ; both are checksummed, so that a reader can tell each
one whole, and both copies are read back past damage by :func:`scan_entries`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol, TypeVar

__all__ = ["MirroredFiles", "scan_entries"]


class Entry(Protocol):
    """An entry that validated: where the next one may start."""

    @property
    def end(self) -> int: ...


E = TypeVar("E", bound=Entry)


class MirroredFiles:
    """Two copies written alike (:attr:`fds`), synced together by the group commit."""

    fds: list[int]
    dirty: bool

    def take_dirty_fds(self) -> list[int]:
        if self.dirty:
            self.dirty = False
            return [fd for fd in self.fds if fd >= 0]
        return []

    def close(self) -> None:
        for i, fd in enumerate(self.fds):
            if fd >= 0:
                os.close(fd)
                self.fds[i] = -1


def scan_entries(
    raw: bytes, at: Callable[[bytes, int], E | None], magic: bytes | None
) -> tuple[list[E], list[tuple[int, int]]]:
    """Every entry that validates (``at``: the entry at a position, or None),
    resynchronising past damage: after a position where no entry validates, the next
    candidate is the next position where one does (``magic``: the byte every entry
    starts with, to jump between candidates; None: try every position). Returns the
    entries and the ``[start, end)`` byte ranges no entry validates in."""
    entries: list[E] = []
    damaged: list[tuple[int, int]] = []
    pos, n = 0, len(raw)
    while pos < n:
        e = at(raw, pos)
        if e is not None:
            entries.append(e)
            pos = e.end
            continue
        start = pos
        pos += 1
        while pos < n:
            if magic:
                pos = raw.find(magic, pos)
                if pos < 0:
                    pos = n
                    break
            if at(raw, pos) is not None:
                break
            pos += 1
        damaged.append((start, pos))
    return entries, damaged
