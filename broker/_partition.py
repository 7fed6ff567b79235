"""A partition as the broker sees it: the storage log plus the subject index.

Every removal goes through :meth:`Partition.remove`, so the log, the subject index
and (in later layers) the expiry queue never disagree about what is live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from storage import AppendResult, PartitionLog, ReadResult

from ._subject_index import SubjectIndex, SubjectState

if TYPE_CHECKING:
    from ._catalog import Topic

__all__ = ["Partition"]


class Partition:
    """Args:
    topic: the topic it belongs to.
    number: its number in the topic, from 0.
    log: its opened storage log.
    """

    def __init__(self, topic: Topic, number: int, log: PartitionLog) -> None:
        self.topic = topic
        self.number = number
        self.log = log
        self.index = SubjectIndex(log.segments[0].base, log.is_live)
        self._filter_cache: dict[str, tuple[int, set[int]]] = {}

    def rebuild_index(self) -> int:
        """Rebuild the subject index from the log (startup). Returns live records seen."""
        self.index = SubjectIndex(self.log.segments[0].base, self.log.is_live)
        run_first = 0
        run: list[bytes] = []
        seen = 0
        for rec in self.log.scan():
            if run and rec.offset != run_first + len(run):
                self.index.extend(run_first, run)
                run = []
            if not run:
                run_first = rec.offset
            run.append(rec.subject)
            seen += 1
        if run:
            self.index.extend(run_first, run)
        return seen

    # -- writing -------------------------------------------------------------------

    def append(self, data: bytes, starts: list[int], ends: list[int], subjects: list[bytes], timestamp: int) -> AppendResult:
        res = self.log.append(data, starts, ends, timestamp)
        self.index.extend(res.first_offset, subjects)
        return res

    def remove(self, offsets: Iterable[int]) -> list[tuple[int, SubjectState]]:
        """Delete live messages; returns ``(offset, subject state after)`` for each one
        actually removed (in the order given)."""
        live = [o for o in offsets if self.log.is_live(o)]
        if not live:
            return []
        self.log.delete_many(live)
        out = []
        for o in live:
            st = self.index.removed(o)
            if st is not None:
                out.append((o, st))
        return out

    def over_limit(self, subjects: Iterable[bytes], limit: int) -> list[int]:
        """Oldest offsets to remove so each subject keeps at most ``limit`` messages."""
        doomed: list[int] = []
        for s in set(subjects):
            st = self.index.get(s)
            if st is None or st.count <= limit:
                continue
            excess = st.count - limit
            off = st.first
            while excess and off:
                doomed.append(off)
                excess -= 1
                off = self.index.next_live(st.sid, off + 1)
        return doomed

    def purge_all(self) -> int:
        removed = self.log.purge()
        self.index = SubjectIndex(self.log.next_offset, self.log.is_live)
        self._filter_cache.clear()
        return removed

    def subject_offsets(self, subject: bytes) -> list[int]:
        """Every live offset of one subject, oldest first."""
        st = self.index.get(subject)
        out: list[int] = []
        if st is None or not st.count:
            return out
        off = st.first
        while off and len(out) < st.count:
            out.append(off)
            off = self.index.next_live(st.sid, off + 1)
        return out

    # -- reading -------------------------------------------------------------------

    def wanted_for(self, subject_filter: str, matches: Callable[[bytes], bool]) -> Callable[[int], bool]:
        """A predicate on offsets: does the message there match the filter?"""
        cached = self._filter_cache.get(subject_filter)
        if cached is None or cached[0] != self.index.version:
            if len(self._filter_cache) > 256:
                self._filter_cache.clear()
            cached = (self.index.version, self.index.matching_ids(matches))
            self._filter_cache[subject_filter] = cached
        ids = cached[1]
        sid_at = self.index.sid_at
        base = self.index.base
        limit = base + len(self.index.seq) // 4

        def wanted(offset: int) -> bool:
            return base <= offset < limit and sid_at(offset) in ids

        return wanted

    def read(self, offset: int, count: int, max_bytes: int, wanted: Callable[[int], bool] | None) -> ReadResult:
        return self.log.read(offset, count, max_bytes, wanted)

    def last(self, subject: bytes) -> memoryview | None:
        st = self.index.get(subject)
        if st is None or not st.count:
            return None
        return self.log.get(st.last)
