"""Memory storage: a partition log whose records live in memory only
(:class:`MemoryPartitionLog`), for topics with ``storage: memory``.

It is the file log (``_partition_log.PartitionLog``) with its segments' bytes in a
``bytearray`` instead of a ``.log`` file (:class:`MemorySegment`): the same record
layout (``protocol._records``), the same offset and time indexes, the same state
bytes and deletions, the same reads (each record verified), rolls, purges and the
cleaner's removal of segments. No index, summary, snapshot or deletion file is
written, nothing is synced, and the log's descriptors for the group commit are
none (:attr:`MemoryPartitionLog.volatile`: an ack never waits for a sync).

What is on disk: the partition's directory and its ``partition.state`` (``_state``),
for offsets only. Offsets are reserved ahead durably in blocks, exactly as a file
log does when acks do not wait for the disk (``RecoveredPartition.extend_reservation``),
and a clean close records the exact next offset. So after a restart, clean or not,
the log starts empty at an offset beyond every one handed out before: none is ever
handed out twice. Except for a log whose offsets are not its own (``reserve``
False: a mirror's are its origin's): it starts empty at offset 1 each time and
reserves nothing, so that it can hold its origin's messages again under their
sequences.

The bytes all memory logs hold are counted in one :class:`MemoryBudget` (the
broker's ``[limits] memory_storage_bytes``): appends add, removed segments and
closed logs give back. The broker refuses a publish that would exceed it; storage
only counts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Self

from ._damage import Report, ignore_damage
from ._files import makedirs
from ._partition_log import PartitionLog
from ._partition_recovery import RESERVE_MAX, _check_state_file
from ._recovery import RecoveryReport
from ._segment import Segment
from ._state import STATE_NAME, PartitionState, StateFile

__all__ = ["MemoryBudget", "MemoryPartitionLog", "MemorySegment"]


class MemoryBudget:
    """The bytes of records the memory logs hold (:attr:`used`) and how many they
    may hold (:attr:`limit`)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more bytes stay within the limit."""
        return self.used + nbytes <= self.limit


class _MemoryOut:
    """What ``_log.SegmentLog.append`` writes through (``_files.AppendFile``'s
    interface): appends extend the segment's ``bytearray`` and are counted in the
    budget."""

    __slots__ = ("budget", "data")

    def __init__(self, data: bytearray, budget: MemoryBudget) -> None:
        self.data = data
        self.budget = budget

    def append(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data
        self.budget.used += len(data)

    def cut(self) -> bool:
        return False  # nothing allocated ahead


class _MemoryDeletions:
    """A memory segment's deletions: its state bytes are all there is (``_log``
    marks them); nothing is written (``_deletions.Deletions``' interface)."""

    dirty = False
    uncertain = False
    path = ""
    mirror_path = ""
    paths: tuple[str, ...] = ()

    deferred = False

    def append(self, rels: list[int], tag: int, deferred: bool = False) -> None:
        pass

    def take_dirty_fds(self) -> list[int]:
        return []

    def take_deferred_fds(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


class MemorySegment(Segment):
    """A segment whose log is a ``bytearray`` (:attr:`data`): every read, append,
    deletion and seal of :class:`Segment`, without a file."""

    def __init__(self, directory: str, base: int, budget: MemoryBudget) -> None:
        super().__init__(directory, base)
        self.deletions = _MemoryDeletions()  # type: ignore[assignment]
        self.data = bytearray()
        self.budget = budget
        self._out = _MemoryOut(self.data, budget)  # type: ignore[assignment]

    def _pread(self, n: int, pos: int) -> bytes:
        # A copy: a view of ``data`` would keep it from growing.
        with memoryview(self.data) as m:
            return m[pos : pos + n].tobytes()

    def take_dirty_fds(self) -> list[int]:
        self.dirty = False
        return []

    # The seal of a memory segment only stops its appends: there is no file to sync,
    # cut or describe.
    def sync_for_seal(self) -> None:
        pass

    def begin_seal(self) -> int | None:
        return None

    def write_seal_files(self, crc: int | None, sync_dir: bool = True) -> bool:
        return False

    def write_summary(self, crc: int) -> None:
        pass

    def write_snapshot(self) -> None:
        pass

    def write_owed_columns(self) -> None:
        pass

    def ends_at_last_record(self) -> bool:
        return True

    def close(self) -> None:
        """Give the records' memory back (once)."""
        self.budget.used -= len(self.data)
        self.data = bytearray()
        self._out = _MemoryOut(self.data, self.budget)  # type: ignore[assignment]

    def remove_files(self) -> int:
        """Drop the records; returns the bytes freed."""
        freed = len(self.data)
        self.close()
        return freed


class MemoryPartitionLog(PartitionLog):
    """A partition log in memory (see the module docstring). Use :meth:`open`."""

    volatile = True

    def __init__(
        self, path: str, segment_size: int, on_corrupt: Callable[[int, str], None] | None, budget: MemoryBudget,
        reserve: bool = True,
    ) -> None:
        super().__init__(path, segment_size, on_corrupt, reserve=reserve)
        self.budget = budget

    @classmethod
    def open(  # type: ignore[override]
        cls,
        path: str,
        segment_size: int,
        on_corrupt: Callable[[int, str], None] | None = None,
        *,
        budget: MemoryBudget,
        report: Report = ignore_damage,
        expect_existing: bool = False,
        reserve: bool = True,
    ) -> tuple[Self, list[RecoveryReport]]:
        """Open (or create) the memory partition at ``path``: empty, at the next
        offset its ``partition.state`` allows (beyond every offset handed out before).
        After an unclean stop :attr:`skipped` is ``(first, last)``: the offsets from
        the last recorded next offset up to the reservation, some of which may have
        been handed out before the stop; none is handed out again. ``reserve`` False (a
        mirror's log): at offset 1, whatever was handed out before."""
        existed = os.path.isdir(path)
        makedirs(path)
        log = cls(path, segment_size, on_corrupt, budget, reserve)
        log._report = report
        sf = log.state_file = StateFile.open(os.path.join(path, STATE_NAME))
        _check_state_file(sf, path, [], report, existed, expect_existing, False)
        if not reserve:
            sf.state = PartitionState(generation=sf.state.generation)
        st = sf.state
        found = max(st.acked_next, st.purged_through + 1, 1)
        next_offset = max(found, st.reserved_next)
        if sf.found == "both_bad" and reserve:
            next_offset = RESERVE_MAX  # the high-water mark is lost: leap (see docs/semantics.md)
        if next_offset > found and not st.clean:
            log.skipped = (found, next_offset - 1)
        st.purged_through = max(st.purged_through, next_offset - 1)  # nothing before it is kept
        log.segments = [MemorySegment(path, next_offset, budget)]
        log.bases = [next_offset]
        log._record_open()
        return log, []

    def _new_segment(self, base: int) -> Segment:
        return MemorySegment(self.path, base, self.budget)

    def _sync_dir(self) -> None:
        pass  # no segment file

    def defer(self, on_seal_owed: Callable[[PartitionLog], None]) -> None:
        pass  # a seal is whole at once: nothing owed, nothing to sync ahead

    def mark_purged(self, through: int) -> None:
        # In memory: after a restart nothing below the next offset is kept anyway.
        self.state_file.state.purged_through = through

    def take_dirty_fds(self) -> list[int]:
        return []

    def synced(self) -> None:
        pass
