"""One segment of a partition log: a ``.log`` file and its companions.

Files, named by the segment's first offset zero-padded to 20 digits (Iggy's naming):

``.log``
    Records back to back, exactly as ``protocol._records`` lays them out. Only the
    active (last) segment is appended to; a sealed segment never changes.
``.index``
    The offset index: one ``u32`` LE file position per record, record *i* of the
    segment having offset ``base + i``. Written when the segment is sealed; for the
    active segment the index lives in memory and is rebuilt by recovery.
``.timeindex``
    The time index: ``(u32 relative offset, u64 timestamp ns)`` LE pairs, one per
    appended batch (every record of a batch carries the batch's timestamp), so it
    gives the exact timestamp of every record with one bisect. Written at seal.
``.del``
    Deletions: ``(u32 relative offset, u32 CRC-32 of those 4 bytes)`` pairs,
    appended on each delete and fsynced like the log. A torn last entry fails its CRC
    and is ignored (that delete was never acknowledged).

In memory a segment holds the index (4 bytes per record), one state byte per record
(live, deleted, corrupt) and the time index (12 bytes per batch).

Recovery (``open_active``) reads the active segment, verifies every record, and
truncates a torn tail: a record that fails its check and is *not* followed by a
valid record with a later offset. A bad record that *is* followed by valid records
is corruption, not a torn write: it is marked corrupt and reported, and everything
after it stays. Sealed segments are checked structurally on open (index length,
file length); their records are verified on every read.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol import check_record

from ._errors import CorruptedRecord, StorageFailure

__all__ = ["Segment", "RecoveryReport", "LIVE", "DELETED", "CORRUPT", "segment_name"]

LIVE = 1
DELETED = 0
CORRUPT = 2

_DEL_ENTRY = struct.Struct("<II")
#: A ``.del`` entry's first word: the record's index in the segment in the low 28 bits
#: (a segment of at most 1 GiB holds fewer than 2**25 records), and in the top 4 bits
#: a tag the caller gives (why it was deleted; 0 = not said).
_REL_MASK = 0x0FFFFFFF
_TAG_SHIFT = 28
_HEAD = struct.Struct("<IIQ")  # length, crc32, offset: the start of every record
FIXED = 38  # record header (24) + body header (14)
_TIME_ENTRY = struct.Struct("<IQ")
_U32 = struct.Struct("<I")
_Q = struct.Struct("<Q")
_OFFSET_AT = 8  # the offset field's position inside a record
_LITTLE = sys.byteorder == "little"
_ONES = b"\x01" * 4096
_RESYNC_WINDOW = 64  # how many later offsets recovery looks for after a bad record


def segment_name(base: int) -> str:
    return f"{base:020d}"


@dataclass
class RecoveryReport:
    """What opening a segment found."""

    truncated_bytes: int = 0
    truncated_at_offset: int | None = None
    corrupt_offsets: list[int] = field(default_factory=list)
    index_rebuilt: bool = False


def _u32_array(raw: bytes) -> array:
    a = array("I")
    a.frombytes(raw)
    if not _LITTLE:
        a.byteswap()
    return a


def _u32_bytes(a: array) -> bytes:
    if _LITTLE:
        return a.tobytes()
    b = array("I", a)
    b.byteswap()
    return b.tobytes()


def _write_all(fd: int, data: bytes | bytearray | memoryview, size_before: int) -> None:
    """Write everything or nothing: on failure, cut the file back to its old size."""
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as exc:
        try:
            os.ftruncate(fd, size_before)
        except OSError:
            pass
        raise StorageFailure(f"write failed: {os.strerror(exc.errno or 0)}") from exc
    finally:
        view.release()


def scan_records(buf: bytes, base: int) -> tuple[array, list[int], list[int], list[int], int]:
    """Verify the records of a log image one by one.

    Returns ``(positions, corrupt_rel, time_rel, time_ts, valid_end)``: the position of
    every record slot, the relative offsets found corrupt, the time index, and where
    the last good record ends (anything after it is a torn tail).
    """
    positions = array("I")
    corrupt: list[int] = []
    time_rel: list[int] = []
    time_ts: list[int] = []
    last_ts = -1
    pos = 0
    end = len(buf)
    expected = base
    unpack_ot = struct.Struct("<QQ").unpack_from
    while pos < end:
        total = check_record(buf, pos, end)
        if total > 0:
            offset, ts = unpack_ot(buf, pos + _OFFSET_AT)
            if offset == expected:
                if ts != last_ts:
                    time_rel.append(expected - base)
                    time_ts.append(ts)
                    last_ts = ts
                positions.append(pos)
                pos += total
                expected += 1
                continue
        found = _resync(buf, pos + 1, expected)
        if found is None:
            break  # nothing valid follows: a torn tail
        next_pos, next_offset = found
        for missing in range(expected, next_offset):
            positions.append(pos)
            corrupt.append(missing - base)
        pos = next_pos
        expected = next_offset
    return positions, corrupt, time_rel, time_ts, pos


def _resync(buf: bytes, start: int, expected: int) -> tuple[int, int] | None:
    """Find the first valid record after ``start`` whose offset follows ``expected``."""
    best: tuple[int, int] | None = None
    end = len(buf)
    for k in range(1, _RESYNC_WINDOW + 1):
        needle = _Q.pack(expected + k)
        i = buf.find(needle, start + _OFFSET_AT)
        while i != -1:
            cand = i - _OFFSET_AT
            if best is not None and cand >= best[0]:
                break
            if check_record(buf, cand, end) > 0:
                best = (cand, expected + k)
                break
            i = buf.find(needle, i + 1)
    return best


class Segment:
    """One segment. Not thread-safe: used from the broker's event loop only (the
    group-commit thread only ever calls fdatasync on descriptors it is handed)."""

    def __init__(self, directory: str, base: int) -> None:
        self.directory = directory
        self.base = base
        stem = os.path.join(directory, segment_name(base))
        self.log_path = stem + ".log"
        self.index_path = stem + ".index"
        self.time_path = stem + ".timeindex"
        self.del_path = stem + ".del"
        self.positions = array("I")
        self.state = bytearray()
        self.time_rel = array("I")
        self.time_ts = array("Q")
        self.size = 0
        self.live_count = 0
        self.sealed = False
        self._fd = -1
        self._del_fd = -1
        self.dirty = False
        self.del_dirty = False

    # -- opening -------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base: int) -> Segment:
        seg = cls(directory, base)
        seg._fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        return seg

    @classmethod
    def open_active(cls, directory: str, base: int) -> tuple[Segment, RecoveryReport]:
        """Open the last segment for appending, verifying every record (recovery)."""
        seg = cls(directory, base)
        report = RecoveryReport()
        seg._fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        size = os.fstat(seg._fd).st_size
        buf = os.pread(seg._fd, size, 0) if size else b""
        positions, corrupt, time_rel, time_ts, valid_end = scan_records(buf, base)
        if valid_end < size:
            report.truncated_bytes = size - valid_end
            report.truncated_at_offset = base + len(positions)
            os.ftruncate(seg._fd, valid_end)
            os.fsync(seg._fd)
            size = valid_end
        seg._load(positions, time_rel, time_ts, size)
        for rel in corrupt:
            seg.state[rel] = CORRUPT
            seg.live_count -= 1
            report.corrupt_offsets.append(base + rel)
        seg._apply_deletions()
        return seg, report

    @classmethod
    def open_sealed(cls, directory: str, base: int, max_count: int) -> tuple[Segment, RecoveryReport]:
        """Open a sealed segment: check its files' shape, rebuild a bad index.

        How many records the segment holds comes from its index, written when it was
        sealed; ``max_count`` (the distance to the next segment's base) bounds it and
        stands in for it when the index is lost. The next base alone cannot say: the
        cleaner may have removed the segments in between.
        """
        seg = cls(directory, base)
        seg.sealed = True
        report = RecoveryReport()
        seg._fd = os.open(seg.log_path, os.O_RDONLY | os.O_CLOEXEC)
        size = os.fstat(seg._fd).st_size
        positions = _read_u32_file(seg.index_path)
        times = _read_time_index(seg.time_path)
        indexed = len(positions) if positions is not None else -1
        if positions is None or times is None or indexed > max_count or not seg._index_fits(positions, size, indexed):
            buf = os.pread(seg._fd, size, 0) if size else b""
            positions, corrupt, time_rel, time_ts, valid_end = scan_records(buf, base)
            report.index_rebuilt = True
            # With the index lost, only the next base can say how many records there
            # were; with a damaged one, the larger of what it lists and what is found.
            expected_count = max_count if indexed < 0 else min(max(indexed, len(positions)), max_count)
            seg._load(positions, time_rel, time_ts, size)
            for rel in corrupt:
                seg._mark_corrupt(rel)
                report.corrupt_offsets.append(base + rel)
            # Records the file should hold but does not (a truncated file): keep their
            # slots, mark them corrupt, never pretend they were not there.
            while len(seg.positions) < expected_count:
                rel = len(seg.positions)
                seg.positions.append(valid_end)
                seg.state.append(CORRUPT)
                report.corrupt_offsets.append(base + rel)
            if len(seg.positions) > expected_count >= 0:
                # More records than the next segment's base allows: keep the rest out.
                del seg.positions[expected_count:]
                del seg.state[expected_count:]
            seg.live_count = seg.state.count(LIVE)
            seg._write_indexes()
        else:
            seg._load(positions, array("I", times[0]), array("Q", times[1]), size)
        seg._apply_deletions()
        return seg, report

    def _index_fits(self, positions: array, size: int, expected_count: int) -> bool:
        if len(positions) != expected_count:
            return False
        if not positions:
            return size == 0
        last = positions[-1]
        if last >= size or positions[0] != 0:
            return False
        try:
            (length,) = _U32.unpack(os.pread(self._fd, 4, last))
        except struct.error:
            return False
        return last + 4 + length == size

    def _load(self, positions: array, time_rel: array | list[int], time_ts: array | list[int], size: int) -> None:
        self.positions = positions
        n = len(positions)
        self.state = bytearray(b"\x01" * n)
        self.time_rel = array("I", time_rel)
        self.time_ts = array("Q", time_ts)
        self.size = size
        self.live_count = n

    def _mark_corrupt(self, rel: int) -> None:
        if self.state[rel] == LIVE:
            self.live_count -= 1
        self.state[rel] = CORRUPT

    def _apply_deletions(self) -> None:
        try:
            with open(self.del_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        n = len(self.state)
        for i in range(0, len(raw) - len(raw) % 8, 8):
            word, crc = _DEL_ENTRY.unpack_from(raw, i)
            if zlib.crc32(raw[i : i + 4]) != crc:
                continue  # torn or damaged entry: that delete was never acknowledged
            rel = word & _REL_MASK
            if rel < n and self.state[rel] == LIVE:
                self.state[rel] = DELETED
                self.live_count -= 1

    # -- properties ----------------------------------------------------------------

    @property
    def count(self) -> int:
        """Record slots in the segment (live, deleted and corrupt)."""
        return len(self.positions)

    @property
    def next_offset(self) -> int:
        return self.base + len(self.positions)

    @property
    def last_timestamp(self) -> int:
        return self.time_ts[-1] if self.time_ts else 0

    @property
    def first_timestamp(self) -> int:
        return self.time_ts[0] if self.time_ts else 0

    def timestamp_of(self, rel: int) -> int:
        """The append time of record ``rel``. Runtime complexity: O(log batches)."""
        return self.time_ts[bisect_right(self.time_rel, rel) - 1]

    def first_live_rel(self, start: int = 0) -> int:
        """The first live record at or after ``start``, or -1."""
        return self.state.find(b"\x01", start)

    def is_live(self, rel: int) -> bool:
        return 0 <= rel < len(self.state) and self.state[rel] == LIVE

    # -- writing -------------------------------------------------------------------

    def append(self, records: bytearray | bytes, positions: list[int], timestamp: int) -> None:
        """Append already built records; ``positions`` are absolute file positions."""
        if self.sealed:
            raise StorageFailure("cannot append to a sealed segment")
        _write_all(self._fd, records, self.size)
        n = len(positions)
        if timestamp != (self.time_ts[-1] if self.time_ts else -1):
            self.time_rel.append(len(self.positions))
            self.time_ts.append(timestamp)
        self.positions.extend(positions)
        self.state += _ONES[:n] if n <= 4096 else b"\x01" * n
        self.size += len(records)
        self.live_count += n
        self.dirty = True

    def delete(self, rel: int) -> bool:
        """Mark record ``rel`` deleted, durably once the ``.del`` file is synced.

        Returns False when it was not live.
        """
        if not self.is_live(rel):
            return False
        return self.delete_many([rel]) == 1

    def delete_many(self, rels: list[int], tag: int = 0) -> int:
        """Mark several records deleted with one write; returns how many were live.
        ``tag`` (0..15) is kept with each deletion (:func:`read_deletion_tags`)."""
        entries = bytearray()
        state = self.state
        doomed = [rel for rel in dict.fromkeys(rels) if 0 <= rel < len(state) and state[rel] == LIVE]
        high = (tag & 0xF) << _TAG_SHIFT
        for rel in doomed:
            raw = _U32.pack(rel | high)
            entries += raw + _U32.pack(zlib.crc32(raw))
        done = len(doomed)
        if not done:
            return 0
        if self._del_fd < 0:
            self._del_fd = os.open(self.del_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        size_before = os.fstat(self._del_fd).st_size
        _write_all(self._del_fd, entries, size_before)
        for rel in doomed:
            state[rel] = DELETED
        self.live_count -= done
        self.del_dirty = True
        return done

    def drop_in_memory(self, upto_rel: int) -> int:
        """Mark records below ``upto_rel`` deleted in memory (purge watermark applied
        from the partition's own durable record). Returns how many were live."""
        upto = min(upto_rel, len(self.state))
        done = self.state.count(b"\x01", 0, upto)
        if done:
            self.state[0:upto] = bytes(upto)
            self.live_count -= done
        return done

    def take_dirty_fds(self) -> list[int]:
        fds = []
        if self.dirty:
            fds.append(self._fd)
            self.dirty = False
        if self.del_dirty:
            fds.append(self._del_fd)
            self.del_dirty = False
        return fds

    def seal(self) -> None:
        """Freeze the segment: write its index files. The log itself is synced by the
        commit path like every write."""
        if self.sealed:
            return
        self._write_indexes()
        self.sealed = True

    def _write_indexes(self) -> None:
        _atomic_write(self.index_path, _u32_bytes(self.positions))
        times = b"".join(_TIME_ENTRY.pack(r, t) for r, t in zip(self.time_rel, self.time_ts))
        _atomic_write(self.time_path, times)

    # -- reading -------------------------------------------------------------------

    def read(
        self,
        rel: int,
        max_count: int,
        max_bytes: int,
        wanted: Callable[[int], bool] | None,
        runs: list[tuple[memoryview, int, int]],
        on_corrupt: Callable[[int, str], None],
    ) -> tuple[int, int, bool]:
        """Append verified live records from ``rel`` on to ``runs``.

        Consecutive records are returned as one run: ``(view, first offset, count)``,
        so a fetch of a thousand records costs one view, not a thousand. Stops after
        ``max_count`` records or ``max_bytes`` bytes (but always takes at least one
        record if one is there), at the end of the segment, or before a corrupt
        record. Returns ``(next_rel, records_taken, stopped_on_corrupt)``.

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
        end_rel = min(count, rel + max_count) if wanted is None else count
        start = positions[rel]
        limit = start + max(max_bytes, 1)
        end_pos = positions[end_rel] if end_rel < count else self.size
        if end_pos > limit:
            j = bisect_right(positions, limit, rel + 1, end_rel) - 1
            end_rel = max(j, rel + 1)
            end_pos = positions[end_rel] if end_rel < count else self.size
        buf = os.pread(self._fd, end_pos - start, start)
        n = len(buf)
        view = memoryview(buf)
        head = _HEAD.unpack_from
        crc32 = zlib.crc32
        got = 0
        run_at = run_end = -1  # the run being built: bytes [run_at, run_end) of buf
        run_first = run_n = 0
        i = rel
        while i < end_rel:
            st = state[i]
            if st == DELETED or (wanted is not None and st == LIVE and not wanted(base + i)):
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
                    self._mark_corrupt(i)
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

    def read_one(self, rel: int, on_corrupt: Callable[[int, str], None]) -> memoryview:
        runs: list[tuple[memoryview, int, int]] = []
        self.read(rel, 1, 1, None, runs, on_corrupt)
        if not runs or runs[0][1] != self.base + rel:
            raise CorruptedRecord(f"record at offset {self.base + rel} is not readable", self.base + rel)
        return runs[0][0]

    def read_all(self) -> bytes:
        """The whole log file (recovery scans, export)."""
        return os.pread(self._fd, self.size, 0) if self.size else b""

    # -- closing -------------------------------------------------------------------

    def close(self) -> None:
        for attr in ("_fd", "_del_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                setattr(self, attr, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def remove_files(self) -> int:
        """Close and unlink every file of the segment; returns the bytes freed."""
        self.close()
        freed = 0
        for path in (self.log_path, self.index_path, self.time_path, self.del_path):
            try:
                freed += os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                pass
        return freed


def _read_u32_file(path: str) -> array | None:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if len(raw) % 4:
        return None
    return _u32_array(raw)


def _read_time_index(path: str) -> tuple[list[int], list[int]] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if len(raw) % _TIME_ENTRY.size:
        return None
    rels, tss = [], []
    for r, t in _TIME_ENTRY.iter_unpack(raw):
        rels.append(r)
        tss.append(t)
    return rels, tss


def _atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)



def read_deletion_tags(del_path: str) -> dict[int, int]:
    """``{record index: tag}`` of a segment's recorded deletions (the first one wins;
    damaged entries are skipped). Safe to call while the file is appended to."""
    try:
        with open(del_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    out: dict[int, int] = {}
    for i in range(0, len(raw) - len(raw) % 8, 8):
        word, crc = _DEL_ENTRY.unpack_from(raw, i)
        if zlib.crc32(raw[i : i + 4]) == crc:
            out.setdefault(word & _REL_MASK, word >> _TAG_SHIFT)
    return out
