"""One segment of a partition log: a ``.log`` file and its companions, opened,
sealed, closed and removed together (:class:`Segment`).

Files, named by the segment's first offset zero-padded to 20 digits (the naming
Apache Iggy uses: the names sort in offset order), each owned by a module:

``.log``
    The records (``_log``).
``.index``, ``.timeindex``, ``.summary``, ``.columns``, ``.snapshot``
    What describes the log and can be rebuilt from it: the offset index, the time
    index, the sealed log's size and CRC-32, every record's subject and fields, and
    the active segment's state at a clean close (``_indexes``).
``.del`` and ``.del2``
    The deletions, in two copies (``_deletions``); they cannot be rebuilt.

Opening a segment runs the recovery steps of each (``_recovery`` for the log):
:meth:`Segment.open_active` verifies every record of the active segment (unless its
``.snapshot`` describes the log byte for byte), :meth:`Segment.open_sealed` checks a
sealed segment structurally (index checksum, length, file length) and rebuilds a bad
index from the log; both then apply the deletions. A sealed segment's records are
verified on every read.

Sealing writes the index files after the log is synced, so that an index never names
records that are not durable; it runs in three steps a caller may run apart
(:meth:`Segment.begin_seal`, :meth:`Segment.write_seal_files` in a worker thread,
:meth:`Segment.end_seal`).
"""

from __future__ import annotations

import os
import struct
import threading

from protocol import RECORD_FIXED, check_record

from ._columns import Columns
from ._damage import ignore_damage
from ._deletions import Deletions
from ._durability import fsync_dir
from ._files import open_file
from ._indexes import IndexFiles
from ._log import CORRUPT, DELETED, LIVE, OFFSET_AT, SegmentLog
from ._recovery import (
    Opening, RecoveryReport, cut_tail, keep_missing, load_records, measure_tail, rebuild_records, report_corrupt,
)

__all__ = ["Segment", "segment_name"]

_OFFSET = struct.Struct("<Q")


def segment_name(base: int) -> str:
    return f"{base:020d}"


class Segment(SegmentLog):
    """One segment: its log (this class extends :class:`SegmentLog`), its index files
    (:attr:`indexes`) and its deletions (:attr:`deletions`).

    The log is the base class rather than a part because the partition log and the
    broker read its ``state``, ``positions``, ``size`` and ``base`` on every fetch
    and every get: as attributes of the segment itself, without a property call.

    Not thread-safe: used from the broker's event loop only (the group-commit thread
    only ever calls fdatasync on descriptors it is handed; :meth:`write_seal_files`
    may run in a worker thread)."""

    def __init__(self, directory: str, base: int) -> None:
        stem = os.path.join(directory, segment_name(base))
        super().__init__(stem + ".log", base)
        self.directory = directory
        self.indexes = IndexFiles(stem)
        self.deletions = Deletions(directory, stem)
        #: Held by :meth:`write_seal_files` (a worker thread) and by :meth:`close`, so
        #: that a segment closed or removed meanwhile gets no index file written.
        self._files_lock = threading.Lock()

    # -- the parts' files and state ---------------------------------------------------

    @property
    def index_path(self) -> str:
        return self.indexes.index_path

    @property
    def time_path(self) -> str:
        return self.indexes.time_path

    @property
    def summary_path(self) -> str:
        return self.indexes.summary_path

    @property
    def columns_path(self) -> str:
        return self.indexes.columns_path

    @property
    def snapshot_path(self) -> str:
        return self.indexes.snapshot_path

    @property
    def del_path(self) -> str:
        return self.deletions.path

    @property
    def mirror_path(self) -> str:
        return self.deletions.mirror_path

    @property
    def uncertain(self) -> bool:
        """Some deletion of this segment could not be read: its records are put
        aside, and nothing more may be appended to it."""
        return self.deletions.uncertain

    @property
    def sealed_crc(self) -> int | None:
        """Sealed: the log's CRC-32 as its summary recorded it at seal (None: no valid
        summary; the startup scan verifies every record)."""
        return self.indexes.sealed_crc

    @property
    def columns_owed(self) -> bool:
        """Sealed with a summary since opened: its ``.columns`` file is written by a
        clean close (:meth:`write_owed_columns`) or the next start."""
        return self.indexes.columns_owed

    @property
    def column_stats(self) -> list[tuple[int, int, int]] | None:
        """Per subject ``(records, first, last)`` over all records, from a trusted
        ``.columns`` file (:meth:`read_columns`), else None."""
        return self.indexes.column_stats

    @property
    def snapshot_columns(self) -> Columns | None:
        """The active segment's columns, from its ``.snapshot`` (taken by the scan)."""
        return self.indexes.snapshot_columns

    @snapshot_columns.setter
    def snapshot_columns(self, cols: Columns | None) -> None:
        self.indexes.snapshot_columns = cols

    # -- opening -------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base: int, preallocate_limit: int = 0) -> Segment:
        """A new, empty active segment (the caller fsyncs the directory), its file
        allocated ahead up to ``preallocate_limit`` bytes (0: never)."""
        seg = cls(directory, base)
        seg.fd = open_file(seg.log_path, os.O_RDWR | os.O_CREAT)
        seg.preallocate_limit = preallocate_limit
        return seg

    @classmethod
    def open_active(cls, directory: str, base: int, opening: Opening | None = None) -> tuple[Segment, RecoveryReport]:
        """Open the last segment for appending, verifying every record (recovery).

        Corrupt records are marked and reported; what follows the last valid record
        is left in place and measured in ``RecoveryReport.tail_bytes``: the partition
        log decides whether it is a torn write to cut (:meth:`cut_tail`) or damage to
        keep (:meth:`seal_damaged`). A tail of zero bytes only (space allocated ahead
        of the records) is measured in ``RecoveryReport.preallocated_bytes`` too."""
        opening = opening or Opening(ignore_damage)
        seg = cls(directory, base)
        report = RecoveryReport()
        seg.open_log(opening.write_flags)
        buf = seg.read_file()
        corrupt = [] if seg.indexes.load_snapshot(seg, buf, opening) else load_records(seg, buf)
        measure_tail(seg, buf, report)
        seg.deletions.apply(seg, opening)
        report_corrupt(seg, corrupt, buf, opening, report)
        return seg, report

    @classmethod
    def open_sealed(
        cls, directory: str, base: int, max_count: int, opening: Opening | None = None
    ) -> tuple[Segment, RecoveryReport]:
        """Open a sealed segment: check its index files (checksum and shape), rebuild
        a bad one from the log.

        How many records the segment holds comes from its index, written when it was
        sealed; ``max_count`` (the distance to the next segment's base) bounds it and
        stands in for it when the index is lost. The next base alone cannot say: the
        cleaner may have removed the segments in between.
        """
        opening = opening or Opening(ignore_damage)
        seg = cls(directory, base)
        seg.sealed = True
        report = RecoveryReport()
        size = seg.open_log(os.O_RDONLY)
        found = seg.indexes.read_indexes(max_count, size)
        if found.intact:
            seg.load(found.positions, found.time_rel, found.time_ts, size)
            seg.indexes.sealed_crc = seg.indexes.read_summary(seg, opening)
            seg.deletions.apply(seg, opening)
            return seg, report
        buf, corrupt = rebuild_records(seg, max_count, found.indexed)
        report.index_rebuilt = True
        seg.indexes.report_rebuilt(found, opening)
        if not opening.readonly:
            seg.indexes.write_indexes(seg)
        seg.deletions.apply(seg, opening)
        report_corrupt(seg, corrupt, buf, opening, report)
        return seg, report

    def cut_tail(self, report: RecoveryReport, opening: Opening) -> None:
        """Cut the tail found by :meth:`open_active`, beyond every acknowledged
        record (``_recovery.cut_tail``)."""
        cut_tail(self, report, opening)

    def seal_damaged(self, count: int, opening: Opening) -> None:
        """Seal the active segment with ``count`` record slots, the ones beyond what
        recovery found being acknowledged records that are missing or unreadable:
        they stay in the file (nothing is cut) and are marked corrupt."""
        keep_missing(self, count, opening)
        if not opening.readonly:
            self.seal()

    # -- deleting ------------------------------------------------------------------

    def delete_many(self, rels: list[int], tag: int = 0, corrupt: bool = False, deferred: bool = False) -> int:
        """Mark several records deleted with one write to each copy of the deletions;
        returns how many were live. ``tag`` (0..15) is kept with each deletion
        (:func:`read_deletion_tags`). Durable once :meth:`take_dirty_fds`' descriptors
        are synced (``deferred``: :meth:`take_deferred_fds`', see
        ``Deletions.append``). ``corrupt``: delete the corrupt ones among ``rels``
        instead (a repair writing off what cannot be read)."""
        state = self.state
        want = CORRUPT if corrupt else LIVE
        doomed = [rel for rel in dict.fromkeys(rels) if 0 <= rel < len(state) and state[rel] == want]
        if not doomed:
            return 0
        self.deletions.append(doomed, tag, deferred)
        if not corrupt:
            self.lose_live(doomed)
        for rel in doomed:
            state[rel] = DELETED
        return len(doomed)

    def take_dirty_fds(self) -> list[int]:
        fds = []
        if self.dirty:
            fds.append(self.fd)
            self.dirty = False
        if self.deletions.dirty:
            fds.extend(self.deletions.take_dirty_fds())
        return fds

    # -- sealing -------------------------------------------------------------------

    def seal(self) -> None:
        """Freeze the segment: cut the space allocated ahead, write its index files.
        The log's last records (and the cut) are synced first (the group commit syncs
        them too, later): an index that reached the disk before the records it lists
        would, after a power loss, make records that were never acknowledged look
        like damage, and a summary before the cut would not match the file's size.

        In three steps, which a caller may run apart (``PartitionLog.roll_active``):
        :meth:`begin_seal`, :meth:`write_seal_files` (in a worker thread), :meth:`end_seal`."""
        if self.sealed:
            return
        crc = self.begin_seal()
        self.end_seal(crc if self.write_seal_files(crc, sync_dir=False) else None)

    def begin_seal(self) -> int | None:
        """The seal's first step, once the segment takes no more appends: cut the space
        allocated ahead and sync the log (records and size), drop the active segment's
        snapshot. Returns the CRC-32 its summary is to record (None: no summary, a
        record of it is not known good).

        A segment with damaged records keeps its snapshot file (no longer used as a
        snapshot): it still says the subjects of the records it was made from, the
        damaged ones among them (:meth:`damaged_subjects`), and a sealed segment with
        damage gets no ``.columns`` file to say them instead."""
        self.sync_for_seal()
        if CORRUPT in self.state:
            self.indexes.snapshot_columns = None
        else:
            self.indexes.drop_snapshot()
        return self.crc if self._known_good() else None

    def _known_good(self) -> bool:
        """Every record of the segment is known good: its CRC-32 is known, none is
        corrupt and no deletion is in doubt (then it may have a summary or snapshot)."""
        return self.crc is not None and not self.uncertain and CORRUPT not in self.state

    def write_seal_files(self, crc: int | None, sync_dir: bool = True) -> bool:
        """The seal's file writes, after :meth:`begin_seal` (its log synced): the index
        files, then the summary recording ``crc`` (none if None), then (``sync_dir``)
        the directory. Safe in a worker thread while the event loop goes on (it reads
        only what no append changes any more); nothing if the segment is closed or
        removed first, and a close or removal waits for it. Returns True once the
        summary is written. The files are rebuildable: a crash before they are durable
        costs a rebuild at the next start, never data, and is not damage."""
        with self._files_lock:
            if self.fd < 0:
                return False
            self._write_indexes()
            if crc is not None:
                self.indexes.write_summary_file(self, crc)
            if sync_dir:
                fsync_dir(self.directory)
            return crc is not None

    def _write_indexes(self) -> None:
        self.indexes.write_indexes(self)

    def end_seal(self, crc: int | None) -> None:
        """The seal's last step (on the thread that owns the segment): sealed, with
        the summary's CRC-32 ``crc`` if :meth:`write_seal_files` wrote it."""
        if crc is not None:
            self.indexes.sealed_crc = crc
            self.indexes.columns_owed = True
        self.sealed = True

    # -- the index files after opening ------------------------------------------------

    def write_summary(self, crc: int) -> None:
        """Record the sealed log's size and CRC-32 (rebuildable: no directory fsync)."""
        self.indexes.write_summary_file(self, crc)
        self.indexes.sealed_crc = crc

    def write_snapshot(self) -> None:
        """Write the ``.snapshot`` file of this (active) segment, if every record of it
        is known good (a clean close; rebuildable, no directory fsync)."""
        crc = self.crc
        if self.sealed or crc is None or self.uncertain or CORRUPT in self.state or self.fd < 0:
            return
        self.release_preallocation()
        if not self.ends_at_last_record():
            return  # bytes beyond the last record (a failed write): the next start looks at them
        self.indexes.write_snapshot(self, crc)

    def write_owed_columns(self) -> None:
        """Write the ``.columns`` file of a segment sealed since it was opened, from its
        log, if the log still has the CRC-32 its summary recorded (a clean close)."""
        self.indexes.write_owed_columns(self)

    def read_columns(self, opening: Opening) -> Columns | None:
        """The ``.columns`` file, if it is intact and describes this segment as its
        summary does (:attr:`sealed_crc`, which the caller has found the log to have);
        else None (damage reported; a missing file is not damage)."""
        return self.indexes.read_columns(self, opening)

    def columns_from_log(self, buf: bytes, write: bool) -> Columns:
        """The columns of the verified log image ``buf``; ``write``: keep them in the
        ``.columns`` file (the log having its summary's CRC-32)."""
        return self.indexes.columns_from_log(self, buf, write)

    def damaged_subjects(self, buf: bytes) -> list[tuple[int, bytes | None]]:
        """The damaged (corrupt) record slots of this segment, whose log image is
        ``buf``, each as ``(offset, subject)``: the subject the record itself gives
        when it passes its checksum (a record put aside because a deletion of its
        segment could not be read), else the one the ``.columns`` file or the
        ``.snapshot`` recorded for its slot when the log was intact
        (:meth:`IndexFiles.recorded_subjects`), else None: not known. Runtime
        complexity: O(slots) at C speed, plus one read of those files when a slot
        is corrupt."""
        state = self.state
        if CORRUPT not in state:
            return []
        rels = [rel for rel in range(len(state)) if state[rel] == CORRUPT]
        recorded = self.indexes.recorded_subjects()
        out: list[tuple[int, bytes | None]] = []
        n = len(buf)
        for rel in rels:
            p = self.positions[rel]
            subject: bytes | None = None
            if check_record(buf, p, n) > 0 and _OFFSET.unpack_from(buf, p + OFFSET_AT)[0] == self.base + rel:
                _, _, _, _, _, _, sl, _, _ = RECORD_FIXED.unpack_from(buf, p)
                subject = bytes(buf[p + RECORD_FIXED.size : p + RECORD_FIXED.size + sl])
            elif recorded is not None and rel < len(recorded[1]):
                subject = recorded[0][recorded[1][rel]]
            out.append((self.base + rel, subject))
        return out

    # -- closing -------------------------------------------------------------------

    def close(self) -> None:
        """Close the files, the log and the deletions cut to their content first (a
        failure to cut leaves zero bytes that the next start cuts). Waits for
        :meth:`write_seal_files` if a worker thread runs it."""
        with self._files_lock:
            self._close()

    def _close(self) -> None:
        self.close_log()
        self.deletions.close()

    def remove_files(self) -> int:
        """Close and unlink every file of the segment; returns the bytes freed."""
        self.close()
        freed = 0
        for path in (self.log_path, *self.indexes.paths, *self.deletions.paths):
            try:
                freed += os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                pass
        return freed
