"""A segment's ``.log`` file: its records, appended and read, and what memory holds of
them (each record's position and state, and the time index).

``.log``
    Records back to back, exactly as ``protocol._records`` lays them out. Only the
    active (last) segment is appended to; a sealed segment never changes. The active
    segment's file is allocated ahead of its last record (``_files.AppendFile``,
    never beyond the segment size limit), so that
    the fdatasync of a group commit writes the new records only, not a new file
    size; the records are written at their positions (``pwrite``), never appended
    to the file's end. A seal and a clean close cut the file to its last record, so
    only the active segment of a broker that stopped without closing can end in
    allocated space, which reads as zero bytes.

In memory a segment holds the offset index (4 bytes per record: the file position of
record *i*, whose offset is ``base + i``), one state byte per record
(:data:`RecordState`: live, deleted, corrupt) and the time index (12 bytes per
batch: the relative offset of the batch's first record and its timestamp; every
record of a batch carries the batch's timestamp).

Every read verifies each record it returns (its offset, its length, its CRC-32): a
record that fails is marked corrupt and reported, never returned; the valid records
around it still are.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Final, NewType

from ._errors import CorruptedRecord, StorageFailure
from ._files import AppendFile, open_file

__all__ = [
    "RecordState", "LIVE", "DELETED", "CORRUPT", "LIVE_BYTE", "FIXED", "OFFSET_AT", "NONZERO", "SegmentLog",
]


#: What a record slot of a segment holds: :data:`DELETED`, :data:`LIVE` or
#: :data:`CORRUPT`, kept one byte per slot in a ``bytearray`` (``SegmentLog.state``).
#: A distinct type for the type checker, a plain ``int`` at run time: the per-record
#: loops (reads, scans, deletions) compare the state bytes with these, and CPython's
#: fast path for comparing two ints does not apply to an ``IntEnum`` member (the
#: reads of a filtered fetch measured 5% more instructions with one).
RecordState = NewType("RecordState", int)

#: Deleted (by a delete, a purge or a repair's write-off): never served again.
DELETED: Final = RecordState(0)
#: Stored, not deleted, not found damaged.
LIVE: Final = RecordState(1)
#: Found damaged or missing, or put aside (its segment's deletions could not all be
#: read): reads of it fail with ``CORRUPTED_RECORD``. Never proof of garbage.
CORRUPT: Final = RecordState(2)
#: A live slot, as the state bytes hold it (for ``bytes`` searches and counts).
LIVE_BYTE = bytes((LIVE,))
#: ``bytes.translate`` table: LIVE stays 1, every other state becomes 0.
_LIVE_ONLY = bytes(1 if i == LIVE else 0 for i in range(256))
_ONES = LIVE_BYTE * 4096

_HEAD = struct.Struct("<IIQ")  # length, crc32, offset: the start of every record
FIXED = 38  # record header (24) + body header (14)
OFFSET_AT = 8  # the offset field's position inside a record
#: Finds a byte that is not zero. Space allocated ahead of the last record reads as
#: zero bytes, and no record starts with a zero length or holds offset 0.
NONZERO = re.compile(rb"[^\x00]")

#: What :meth:`SegmentLog.read` hands its caller's ``runs``: ``(view, first offset,
#: count)`` of records back to back.
Runs = list[tuple[memoryview, int, int]]
OnCorrupt = Callable[[int, str], None]


class SegmentLog:
    """The records of one segment: its ``.log`` file (:attr:`fd`) and, in memory, each
    record's position (:attr:`positions`) and state (:attr:`state`), and the time
    index (:attr:`time_rel`, :attr:`time_ts`). Not thread-safe: used from the
    broker's event loop only (the group-commit thread only ever calls fdatasync on
    descriptors it is handed)."""

    def __init__(self, log_path: str, base: int) -> None:
        self.base = base
        self.log_path = log_path
        self.positions = array("I")
        self.state = bytearray()
        self.time_rel = array("I")
        self.time_ts = array("Q")
        #: The bytes of the records (the end of the last one).
        self.size = 0
        self.live_count = 0
        #: The bytes of the live records (:meth:`live_bytes`) and what the state was
        #: when that was known: ``(live_count, records, size)``; another state means
        #: it is counted again.
        self._live_bytes = 0
        self._live_key: tuple[int, int, int] | None = None
        self.sealed = False
        #: The log's descriptor (-1: not open, or closed).
        self.fd = -1
        #: The log file's length as recovery found it: ``size`` plus a tail it has
        #: not resolved yet (``_recovery.cut_tail``, ``_recovery.keep_missing``).
        self.file_size = 0
        #: Allocate the log ahead of its last record up to this size (0: never).
        self.preallocate_limit = 0
        #: The log as appends write it (made by the first append).
        self._out: AppendFile | None = None
        #: Appended to since the group commit last took the descriptor.
        self.dirty = False
        #: CRC-32 of the log bytes ``[0, size)``, kept up to date by appends (None:
        #: not known, e.g. after damage; the segment is then sealed without a summary).
        self.crc: int | None = 0

    # -- opening -------------------------------------------------------------------

    def open_log(self, flags: int) -> int:
        """Open the existing log file (recovery); returns its length, kept in
        :attr:`file_size`."""
        self.fd = open_file(self.log_path, flags)
        self.file_size = os.fstat(self.fd).st_size
        return self.file_size

    def read_file(self) -> bytes:
        """The whole log file as recovery found it (:attr:`file_size` bytes)."""
        return os.pread(self.fd, self.file_size, 0) if self.file_size else b""

    def load(self, positions: array, time_rel: array | list[int], time_ts: array | list[int], size: int) -> None:
        """Take the records found (recovery): all of them live, ``size`` bytes."""
        self.positions = positions
        n = len(positions)
        self.state = bytearray(LIVE_BYTE * n)
        self.time_rel = array("I", time_rel)
        self.time_ts = array("Q", time_ts)
        self.size = size
        self.live_count = n
        self._live_key = None

    def mark_corrupt(self, rel: int) -> None:
        if self.state[rel] == LIVE:
            self.lose_live([rel])
        self.state[rel] = CORRUPT

    # -- live bytes ----------------------------------------------------------------

    def live_bytes(self) -> int:
        """The bytes of the live records (deleted and corrupt ones left out): kept up
        to date by appends and deletions, counted again (at C speed, a step a run of
        live records) after anything else changed the segment."""
        key = (self.live_count, len(self.state), self.size)
        if self._live_key != key:
            self._live_bytes = self._count_live_bytes()
            self._live_key = key
        return self._live_bytes

    def _count_live_bytes(self) -> int:
        state, pos = self.state, self.positions
        n = len(state)
        if not self.live_count or not n:
            return 0
        if self.live_count == n:
            return self.size - pos[0]
        live = state.translate(_LIVE_ONLY)
        total = 0
        i = live.find(1)
        while i >= 0:
            j = live.find(0, i)
            if j < 0:
                return total + self.size - pos[i]
            total += pos[j] - pos[i]
            i = live.find(1, j)
        return total

    def record_length(self, rel: int) -> int:
        """The length of record ``rel`` (live or not)."""
        return self._record_length(rel)

    def _record_length(self, rel: int) -> int:
        pos = self.positions
        return (pos[rel + 1] if rel + 1 < len(pos) else self.size) - pos[rel]

    def lose_live(self, rels: list[int]) -> None:
        """Live records ``rels`` stop being live (their state is changed by the
        caller): the count, and the live bytes when they are known."""
        known = self._live_key == (self.live_count, len(self.state), self.size)
        self.live_count -= len(rels)
        if known:
            self._live_bytes -= sum(self._record_length(rel) for rel in rels)
            self._live_key = (self.live_count, len(self.state), self.size)

    # -- properties ----------------------------------------------------------------

    @property
    def count(self) -> int:
        """Record slots in the segment (live, deleted and corrupt)."""
        return len(self.positions)

    @property
    def next_offset(self) -> int:
        return self.base + len(self.positions)

    def timestamp_of(self, rel: int) -> int:
        """The append time of record ``rel``. Runtime complexity: O(log batches)."""
        return self.time_ts[bisect_right(self.time_rel, rel) - 1]

    def first_live_rel(self, start: int = 0) -> int:
        """The first live record at or after ``start``, or -1."""
        return self.state.find(LIVE_BYTE, start)

    @property
    def corrupt_count(self) -> int:
        """Record slots found damaged (or put aside): never proof of garbage."""
        return self.state.count(CORRUPT)

    def fileno(self) -> int:
        """The log's descriptor (-1 once closed)."""
        return self.fd

    # -- writing -------------------------------------------------------------------

    def append(self, records: bytearray | bytes, positions: list[int], timestamp: int,
               timestamps: Sequence[int] | None = None) -> None:
        """Append already built records; ``positions`` are absolute file positions;
        ``timestamps``: each record's, when they are not all ``timestamp``
        (non-decreasing)."""
        if self.sealed:
            raise StorageFailure("cannot append to a sealed segment")
        out = self._out
        if out is None:
            out = self._out = AppendFile(self.fd, self.size, limit=self.preallocate_limit)
        out.append(records)
        if self.crc is not None:
            self.crc = zlib.crc32(records, self.crc)
        n = len(positions)
        if timestamps is None:
            if timestamp != (self.time_ts[-1] if self.time_ts else -1):
                self.time_rel.append(len(self.positions))
                self.time_ts.append(timestamp)
        else:
            last = self.time_ts[-1] if self.time_ts else -1
            rel = len(self.positions)
            for k, ts in enumerate(timestamps):
                if ts != last:
                    self.time_rel.append(rel + k)
                    self.time_ts.append(ts)
                    last = ts
        known = self._live_key == (self.live_count, len(self.state), self.size)
        self.positions.extend(positions)
        self.state += _ONES[:n] if n <= 4096 else LIVE_BYTE * n
        self.size += len(records)
        self.live_count += n
        if known:
            self._live_bytes += len(records)
            self._live_key = (self.live_count, len(self.state), self.size)
        self.dirty = True

    def release_preallocation(self) -> bool:
        """Cut the space allocated ahead of the last record; True if there was some."""
        return self._out is not None and self._out.cut()

    def sync_for_seal(self) -> None:
        """Cut the space allocated ahead and make the records (and the file's size)
        durable, before any file that describes them is written."""
        if self.release_preallocation():
            os.fsync(self.fd)  # the new size too (fdatasync need not write a smaller one)
        else:
            # Even when not dirty: the group commit may have taken the descriptor and
            # still be syncing it in its thread (this waits for that write-back).
            os.fdatasync(self.fd)

    def ends_at_last_record(self) -> bool:
        """The file holds nothing beyond the last record (after
        :meth:`release_preallocation`; bytes of a failed write would be there)."""
        return os.fstat(self.fd).st_size == self.size

    def drop_in_memory(self, upto_rel: int) -> int:
        """Mark records below ``upto_rel`` deleted in memory (purge watermark applied
        from the partition's own durable record). Returns how many were live."""
        upto = min(upto_rel, len(self.state))
        done = self.state.count(LIVE_BYTE, 0, upto)
        if done:
            self.state[0:upto] = bytes(upto)  # DELETED, every one
            self.live_count -= done
        return done

    # -- reading -------------------------------------------------------------------

    def read(
        self,
        rel: int,
        max_count: int,
        max_bytes: int,
        wanted: Callable[[int], bool] | None,
        runs: Runs,
        on_corrupt: OnCorrupt,
    ) -> tuple[int, int, bool]:
        """Append verified live records from ``rel`` on to ``runs``.

        Consecutive records are returned as one run: ``(view, first offset, count)``,
        so a fetch of a thousand records costs one view, not a thousand. Stops after
        ``max_count`` records or ``max_bytes`` bytes (but always takes at least one
        record if one is there), at the end of the segment, or before a corrupt
        record. Returns ``(next_rel, records_taken, stopped_on_corrupt)``.

        In steps: skip what is neither live nor wanted, find how far one read may go,
        read that with one ``pread``, then verify and take the records: in one pass
        (:meth:`_back_to_back`), else record by record (:func:`_take_runs`). The
        steps of every call stay in line: a function call costs ~0.2 µs, a few
        percent of a read of a few records.

        Raises:
            CorruptedRecord: the very first record it would return is corrupt (and
                ``runs`` is empty).
        """
        positions = self.positions
        state = self.state
        count = len(positions)
        if rel >= count or max_count <= 0:
            return rel, 0, False
        base = self.base
        # Skip what is not live and not wanted without touching the disk.
        while rel < count and (state[rel] == DELETED or (wanted is not None and state[rel] == LIVE and not wanted(base + rel))):
            rel += 1
        if rel >= count:
            return rel, 0, False
        start = positions[rel]
        limit = start + max(max_bytes, 1)
        unwanted: set[int] | None = None
        if wanted is None:
            end_rel = scanned = min(count, rel + max_count)
        else:
            # Read only up to the last record this call can return (the
            # ``max_count``-th wanted one, or the last before the bytes run out):
            # reading to the segment's end cost a pread of up to ``max_bytes`` per
            # call. What the scan passed after it is not wanted (``scanned``).
            scanned = end_rel = rel
            found = 0
            while scanned < count:
                st = state[scanned]
                scanned += 1
                if st != DELETED:
                    if st == LIVE and not wanted(base + scanned - 1):
                        if unwanted is None:
                            unwanted = set()
                        unwanted.add(scanned - 1)
                    else:
                        end_rel = scanned
                        found += 1
                        if found >= max_count:
                            break
                if scanned < count and positions[scanned] > limit:
                    break
        scan_end = end_rel
        # The records that end by ``limit`` (at least one).
        end_pos = positions[end_rel] if end_rel < count else self.size
        if end_pos > limit:
            j = bisect_right(positions, limit, rel + 1, end_rel) - 1
            end_rel = max(j, rel + 1)
            end_pos = positions[end_rel] if end_rel < count else self.size
        buf = self._pread(end_pos - start, start)
        view = memoryview(buf)
        if (
            unwanted is None and end_rel > rel and len(buf) == end_pos - start
            and state.count(LIVE, rel, end_rel) == end_rel - rel
            and self._back_to_back(buf, view, rel, end_rel, start)
        ):
            # What _take_runs gives for live records back to back that pass its
            # checks: one run of them all (every one is taken: none is unwanted, and
            # ``end_rel`` is within ``max_count``).
            runs.append((view, base + rel, end_rel - rel))
            i, got, stopped = end_rel, end_rel - rel, False
        else:
            i, got, stopped = _take_runs(self, buf, view, rel, end_rel, start, max_count, unwanted, runs, on_corrupt)
        if not stopped and i == scan_end and scan_end < scanned and got < max_count:
            i = scanned  # the rest of the scan held nothing wanted
        return i, got, stopped

    def _back_to_back(self, buf: bytes, view: memoryview, rel: int, end_rel: int, start: int) -> bool:
        """Whether records ``rel..end_rel-1``, read into ``buf`` (from file position
        ``start`` to ``end_rel``'s), each pass :meth:`read`'s checks (their offset,
        their length, their CRC-32) and fill it back to back: each ends where the
        next one's position says it starts. One pass with nothing else to look at
        per record; False leaves the record-by-record loop to say what is wrong."""
        head = _HEAD.unpack_from
        crc32 = zlib.crc32
        ends = self.positions[rel + 1 : end_rel]
        ends.append(start + len(buf))
        expect = self.base + rel
        p = 0
        for q in ends:
            q -= start
            if q - p < FIXED:
                return False
            length, crc, off = head(buf, p)
            if off != expect or length + 4 != q - p or crc32(view[p + 8 : q]) != crc:
                return False
            expect += 1
            p = q
        return True

    def read_one(self, rel: int, on_corrupt: OnCorrupt) -> memoryview:
        """Record ``rel``, verified, as :meth:`read` of one record returns it: one
        ``pread`` of exactly its bytes (from its position to the next record's, or the
        end of the log) and the same checks (its offset, its length, its CRC-32),
        without :meth:`read`'s loop and runs. A record that fails is marked corrupt and
        given to ``on_corrupt`` first, with the same reason and the same error as
        :meth:`read` (a key-value get reads one record per request).

        Raises:
            CorruptedRecord: it fails a check, or it is not live.
        """
        state = self.state
        if not 0 <= rel < len(state) or state[rel] != LIVE:
            return self._read_one_general(rel, on_corrupt)
        positions = self.positions
        start = positions[rel]
        buf = self._pread((positions[rel + 1] if rel + 1 < len(positions) else self.size) - start, start)
        offset = self.base + rel
        if len(buf) >= FIXED:
            length, crc, off = _HEAD.unpack_from(buf)
            total = length + 4
            if off == offset and length >= FIXED - 4 and total <= len(buf):
                view = memoryview(buf)
                if zlib.crc32(view[8:total]) == crc:
                    return view if total == len(buf) else view[:total]
        self.mark_corrupt(rel)
        on_corrupt(offset, "checksum mismatch or truncated record")
        raise CorruptedRecord(
            f"record at offset {offset} is corrupted (checksum mismatch or truncated); "
            f"fetch from offset {offset + 1} to read past it",
            offset,
        )

    def _read_one_general(self, rel: int, on_corrupt: OnCorrupt) -> memoryview:
        """:meth:`read_one` of a record that is not live, through :meth:`read`."""
        runs: Runs = []
        self.read(rel, 1, 1, None, runs, on_corrupt)
        if not runs or runs[0][1] != self.base + rel:
            raise CorruptedRecord(f"record at offset {self.base + rel} is not readable", self.base + rel)
        return runs[0][0]

    def read_all(self) -> bytes:
        """The whole log (its records: recovery scans, export)."""
        return self._pread(self.size, 0) if self.size else b""

    def _pread(self, n: int, pos: int) -> bytes:
        """``n`` bytes of the log from ``pos`` (the one way reads reach the records:
        a memory segment, ``_memory.MemorySegment``, holds them in a ``bytearray``)."""
        return os.pread(self.fd, n, pos)

    # -- closing -------------------------------------------------------------------

    def close_log(self) -> None:
        """Close the log, cut to its last record first (a failure to cut leaves zero
        bytes that the next start cuts)."""
        if self._out is not None:
            try:
                self._out.cut()
            except OSError:
                pass
        self._out = None
        fd = self.fd
        if fd >= 0:
            self.fd = -1
            try:
                os.close(fd)
            except OSError:
                pass


def _take_runs(
    log: SegmentLog,
    buf: bytes,
    view: memoryview,
    rel: int,
    end_rel: int,
    start: int,
    max_count: int,
    unwanted: set[int] | None,
    runs: Runs,
    on_corrupt: OnCorrupt,
) -> tuple[int, int, bool]:
    """Verify the live, wanted records of ``log`` among ``rel..end_rel-1`` (read into
    ``buf`` from file position ``start``) one by one, and append them to ``runs``
    as runs of records back to back. Stops after ``max_count`` records, or before
    the first that fails (marked corrupt and given to ``on_corrupt``) or is
    corrupt already. Returns ``(next_rel, records_taken, stopped_on_corrupt)``.

    Raises:
        CorruptedRecord: the first record it would return fails (and ``runs`` is
            empty).
    """
    positions = log.positions
    state = log.state
    base = log.base
    n = len(buf)
    head = _HEAD.unpack_from
    crc32 = zlib.crc32
    got = 0
    run_at = run_end = -1  # the run being built: bytes [run_at, run_end) of buf
    run_first = run_n = 0
    i = rel
    while i < end_rel:
        st = state[i]
        if st == DELETED or (unwanted is not None and i in unwanted):
            i += 1
            continue
        p = positions[i] - start
        ok = False
        if st == LIVE and p + FIXED <= n:
            length, crc, off = head(buf, p)
            total = length + 4
            ok = off == base + i and length >= FIXED - 4 and p + total <= n and crc32(view[p + 8 : p + total]) == crc
        if not ok:
            if st == LIVE:
                log.mark_corrupt(i)
                on_corrupt(base + i, "checksum mismatch or truncated record")
            if run_n:
                runs.append((view[run_at:run_end], run_first, run_n))
            if not runs:
                raise CorruptedRecord(
                    f"record at offset {base + i} is corrupted (checksum mismatch or truncated); "
                    f"fetch from offset {base + i + 1} to read past it",
                    base + i,
                )
            return i, got, True
        if p != run_end:
            if run_n:
                runs.append((view[run_at:run_end], run_first, run_n))
            run_at = p
            run_first = base + i
            run_n = 0
        run_end = p + total
        run_n += 1
        got += 1
        i += 1
        if got >= max_count:
            break
    if run_n:
        runs.append((view[run_at:run_end], run_first, run_n))
    return i, got, False
