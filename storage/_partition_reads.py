"""Reading a partition's log: :class:`PartitionReads`, between
``_partition_recovery.RecoveredPartition`` (the segment list it reads) and
``_partition_log.PartitionLog`` (the writes), owns every read of the records and of
their state: fetches (:meth:`PartitionReads.read`, at most :data:`SCAN_LIMIT` records
looked at per call with a subject filter), single records (:meth:`PartitionReads.get`,
:meth:`PartitionReads.read_live`), liveness, timestamps, the oldest live record and
the live counts and bytes.

Every record returned is verified by its segment (``_log.SegmentLog.read``); one
that fails is marked corrupt and counted (``RecoveredPartition.record_corrupt``),
never returned. Nothing here writes a file.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import NamedTuple

from protocol import ErrorCode, error_class

from ._errors import CorruptedRecord
from ._log import CORRUPT, LIVE, LIVE_BYTE
from ._partition_recovery import RecoveredPartition
from ._segment import Segment

__all__ = ["PartitionReads", "ReadResult", "SCAN_LIMIT"]

#: Fetches with a subject filter look at no more than this many records per call
#: (Kafka and NATS both bound the work of one fetch the same way); the response's
#: next offset says where to continue.
SCAN_LIMIT = 100_000


class ReadResult(NamedTuple):
    """Records read, as runs of consecutive records: ``records[k]`` holds
    ``runs[k][1]`` records starting at offset ``runs[k][0]``."""

    records: list[memoryview]
    runs: list[tuple[int, int]]
    # A field named like tuple.count shadows that method (mypy: [assignment]); the
    # broker reads the number of records as ``.count``, so the name stays.
    count: int  # type: ignore[assignment]
    next_offset: int

    @property
    def offsets(self) -> list[int]:
        return [o for first, n in self.runs for o in range(first, first + n)]


class PartitionReads(RecoveredPartition):
    """The reads of a partition's log (see the module docstring); the log is
    ``_partition_log.PartitionLog``."""

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def last_offset(self) -> int:
        """The newest offset ever assigned (0 if none)."""
        return self.segments[-1].next_offset - 1

    @property
    def first_offset(self) -> int:
        """The oldest live offset, or 0 when nothing is live."""
        if not self.live_count:
            return 0
        for seg in self.segments:
            if seg.live_count:
                rel = seg.first_live_rel()
                if rel >= 0:
                    return seg.base + rel
        return 0

    def live_count_from(self, start: int) -> int:
        """Live records at or after offset ``start``. Runtime complexity: O(records
        after ``start``), at C speed (a count over the segments' state bytes)."""
        n = 0
        for seg in self.segments[self.segment_index(start) :]:
            n += seg.state.count(LIVE_BYTE, max(start - seg.base, 0))
        return n

    def segment_index(self, offset: int) -> int:
        """Index of the segment holding ``offset`` (or the next one after a gap)."""
        return max(bisect_right(self.bases, offset) - 1, 0)

    _segment_index = segment_index  # its former name, which tests use

    def is_live(self, offset: int) -> bool:
        # segment_index and the segment's state looked up in line (once per KV get).
        i = bisect_right(self.bases, offset) - 1
        seg = self.segments[i if i > 0 else 0]
        rel = offset - seg.base
        state = seg.state
        return 0 <= rel < len(state) and state[rel] == LIVE

    def is_corrupt(self, offset: int) -> bool:
        """Whether the record at ``offset`` is one found damaged (or put aside) and
        still there: neither purged nor written off by a repair. O(log segments)."""
        if offset <= self.state_file.state.purged_through:
            return False
        i = bisect_right(self.bases, offset) - 1
        seg = self.segments[i if i > 0 else 0]
        rel = offset - seg.base
        state = seg.state
        return 0 <= rel < len(state) and state[rel] == CORRUPT

    def timestamp_of(self, offset: int) -> int:
        seg = self.segments[self.segment_index(offset)]
        return seg.timestamp_of(offset - seg.base)

    def live_offsets_until(self, cutoff_ns: int, skip: Callable[[int], bool]) -> list[int]:
        """Live offsets stamped at or before ``cutoff_ns``, oldest first, leaving out
        those ``skip`` names. Uses the time index: O(segments + results)."""
        out: list[int] = []
        for seg in self.segments:
            if not seg.time_ts or seg.time_ts[0] > cutoff_ns:
                break
            k = bisect_right(seg.time_ts, cutoff_ns)
            bound = seg.time_rel[k] if k < len(seg.time_rel) else seg.count
            if seg.live_count:
                rel = seg.first_live_rel()
                base = seg.base
                while 0 <= rel < bound:
                    if not skip(base + rel):
                        out.append(base + rel)
                    rel = seg.first_live_rel(rel + 1)
            if bound < seg.count:
                break
        return out

    def oldest_live(self, skip: Callable[[int], bool]) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the oldest live record ``skip`` does not name."""
        for seg in self.segments:
            if not seg.live_count:
                continue
            rel = seg.first_live_rel()
            while rel >= 0:
                if not skip(seg.base + rel):
                    return seg.base + rel, seg.timestamp_of(rel)
                rel = seg.first_live_rel(rel + 1)
        return None

    def record_size(self, offset: int) -> int:
        """The length of the record at ``offset`` (live or not), from the positions
        index: no read."""
        seg = self.segments[self.segment_index(offset)]
        return seg.record_length(offset - seg.base)

    def oldest_to_drop(self, count: int, nbytes: int) -> list[int]:
        """The oldest live offsets whose removal takes at least ``count`` records and
        at least ``nbytes`` bytes of records out (a limit's discard old), oldest
        first. Runtime complexity: O(segments passed + results)."""
        out: list[int] = []
        for seg in self.segments:
            if count <= 0 and nbytes <= 0:
                break
            if not seg.live_count:
                continue
            rel = seg.first_live_rel()
            while rel >= 0 and (count > 0 or nbytes > 0):
                out.append(seg.base + rel)
                count -= 1
                nbytes -= seg.record_length(rel)
                rel = seg.first_live_rel(rel + 1)
        return out

    def live_bytes(self) -> int:
        """The bytes of the live records (``size_bytes`` less what is deleted, purged
        or put aside but still on disk). Runtime complexity: O(segments) while only
        appends and deletions happened since the last call."""
        return sum(seg.live_bytes() for seg in self.segments)

    def read(
        self,
        offset: int,
        max_count: int,
        max_bytes: int,
        wanted: Callable[[int], bool] | None = None,
        until: int | None = None,
    ) -> ReadResult:
        """Live, verified records from ``offset`` on (below ``until`` if given).

        Raises:
            CorruptedRecord: the first record to return is corrupt.
        """
        runs: list[tuple[memoryview, int, int]] = []
        offset = max(offset, self.purged_through + 1, 1)
        end = self.next_offset if until is None else min(until, self.next_offset)
        scanned_to = offset + SCAN_LIMIT if wanted is not None else end
        i = self.segment_index(offset)
        used = got = 0
        while offset < end and got < max_count and offset < scanned_to:
            seg = self.segments[i]
            if offset < seg.base:
                offset = seg.base
            had = len(runs)
            rel, taken, stopped = seg.read(offset - seg.base, max_count - got, max_bytes - used, wanted, runs, self.record_corrupt)
            got += taken
            for k in range(had, len(runs)):
                used += len(runs[k][0])
            offset = seg.base + rel
            if stopped or used >= max_bytes:
                break
            if rel >= seg.count:
                i += 1
                if i >= len(self.segments):
                    break
        return ReadResult([r[0] for r in runs], [(r[1], r[2]) for r in runs], got, offset)

    def get(self, offset: int) -> memoryview:
        """One live record.

        Raises:
            MessageNotFoundError: no live record has that offset.
            CorruptedRecord: it is there but unreadable.
        """
        # A live record (the usual case): the checks below hold for it (a live slot
        # lies below next_offset and above the purge watermark); anything else
        # takes them, for their errors.
        record = self.read_live(offset)
        if record is not None:
            return record
        i = bisect_right(self.bases, offset) - 1
        seg = self.segments[i if i > 0 else 0]
        rel = offset - seg.base
        if offset < 1 or offset >= self.next_offset or offset <= self.purged_through:
            raise error_class(ErrorCode.MESSAGE_NOT_FOUND)(f"no message at offset {offset}")
        if rel < 0 or rel >= seg.count or seg.state[rel] != LIVE:
            if 0 <= rel < seg.count and seg.state[rel] == CORRUPT:
                raise CorruptedRecord(f"record at offset {offset} is corrupted", offset)
            raise error_class(ErrorCode.MESSAGE_NOT_FOUND)(f"no message at offset {offset}")
        return seg.read_one(rel, self.record_corrupt)

    def read_live(self, offset: int) -> memoryview | None:
        """The live record at ``offset``, verified as :meth:`get` verifies it, or None
        when there is none (never stored, deleted, removed, purged, or found corrupt
        before): one search for its segment where :meth:`is_live` then :meth:`get`
        take two (a KV get reads one record per request).

        Raises:
            CorruptedRecord: it is live but fails its checks now (it is then marked
                corrupt, as :meth:`get` does, and the next call returns None).
        """
        i = bisect_right(self.bases, offset) - 1
        seg = self.segments[i if i > 0 else 0]
        rel = offset - seg.base
        state = seg.state
        if 0 <= rel < len(state) and state[rel] == LIVE and offset > self.state_file.state.purged_through:
            return seg.read_one(rel, self.record_corrupt)
        return None
