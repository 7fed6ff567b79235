"""Offline check and repair of a stopped broker's data directory.

``check`` verifies every file the broker writes and reports what it finds, changing
nothing: the catalog's two copies, every partition (its state file, each segment's
indexes and both copies of its deletions, and every live record's checksum), the
consumer offsets, KV leases and consumer journals of every topic, and whatever lies under ``streams/``
that the catalog does not name. ``repair`` runs the same recovery the broker runs at
start, which applies the documented fixes (indexes rebuilt, damaged copies rewritten
from the good one after keeping their bytes in ``quarantine/``, torn tails cut,
records that cannot be read or placed put aside), writes off the records that cannot
be read (deleted with the reason ``DAMAGED``, after their segment's files are copied
into ``quarantine/``, so reads skip them instead of failing), moves unknown paths into
``quarantine/`` and closes every partition cleanly. Each fix is reported with what it
cost, in the :class:`Damage`'s ``action``.

Both take the data directory's lock, so they refuse to run beside a broker.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field

from protocol import RemovalReason

from ._damage import Damage, Report
from ._datadir import DataDir
from ._durability import fsync_dir
from ._errors import StorageFailure
from ._files import makedirs
from ._partition_log import PartitionLog
from ._partition_recovery import LiveRecords

__all__ = ["CheckSummary", "check_data_dir"]


@dataclass
class CheckSummary:
    """What a check or repair looked at and found."""

    topics: int = 0
    partitions: int = 0
    segments: int = 0
    records: int = 0
    damage: list[Damage] = field(default_factory=list)
    moved: list[tuple[str, str]] = field(default_factory=list)  # repair: (unknown path, where it went)
    #: repair: ``(log file, first offset, last offset)`` of unreadable records written off.
    written_off: list[tuple[str, int, int]] = field(default_factory=list)
    #: Damaged records that are, or may be, their subject's newest record (a reader
    #: of the subject's last message then gets ``CORRUPTED_RECORD``, never an older
    #: one): ``(log file, offset, subject, previous)``, ``subject`` None when it
    #: cannot be known (then it may be any subject's whose newest readable record
    #: is older), ``previous`` the subject's newest readable record, older (0: none),
    #: which is what its reads answer once a repair has written the damaged one off.
    newest_damaged: list[tuple[str, int, bytes | None, int]] = field(default_factory=list)


def check_data_dir(root: str, report: Report, repair: bool = False) -> CheckSummary:
    """Check (or with ``repair``, recover and fix) the data directory ``root``.

    ``report`` gets every piece of damage as it is found. Blocking.

    Raises:
        StorageFailure: no data directory there, a broker holds it, or the catalog
            cannot be read (the message says what to do).
    """
    summary = CheckSummary()

    def found(d: Damage) -> None:
        summary.damage.append(d)
        report(d)

    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise StorageFailure(f"{root} is not a directory; give the data directory of a stopped broker with --data")
    lock_fd = _lock(root)
    try:
        datadir = DataDir(root, found)
        catalog = datadir.load_catalog(readonly=not repair) or {"streams": []}
        known: dict[int, set[int]] = {}
        # Topics whose create stopped before their files were all made: the broker's
        # next start makes what is missing (not damage).
        creating = {(int(s), int(t)) for s, t in catalog.get("creating", [])}
        for sd in catalog.get("streams", []):
            sid = int(sd["id"])
            known[sid] = set()
            for td in sd.get("topics", []):
                tid = int(td["id"])
                known[sid].add(tid)
                summary.topics += 1
                cfg = td.get("config", {})
                for n in range(int(cfg.get("partitions_count", 1))):
                    if (sid, tid) in creating and not os.path.isdir(datadir.partition_dir(sid, tid, n)):
                        continue
                    # A memory-storage partition has no segment files: its state file
                    # is checked, and never rewritten here (the broker's start does).
                    _check_partition(datadir, sid, tid, n, int(cfg.get("segment_size", 64 << 20)), found,
                                     repair and cfg.get("storage", "file") != "memory", summary)
                offsets = datadir.consumer_offsets(sid, tid, readonly=not repair)
                offsets.close()
                if datadir.has_consumer_journal(sid, tid):
                    # Both copies read and every entry checked; repair rewrites a
                    # copy the other covers (gaps stay for the broker to resolve).
                    datadir.consumer_journal(sid, tid, readonly=not repair).close()
        removing = [(int(s), None if t is None else int(t)) for s, t in catalog.get("removing", [])]
        for path in datadir.report_unknown(known, removing):
            if repair:
                summary.moved.append((path, _move_to_quarantine(datadir, path)))
        datadir.close_catalog()
    finally:
        os.close(lock_fd)
    return summary


def _lock(root: str) -> int:
    fd = os.open(os.path.join(root, "LOCK"), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageFailure(f"data directory {root} is in use by a running broker; stop it first") from None
    return fd


def _check_partition(
    datadir: DataDir, sid: int, tid: int, n: int, segment_size: int, found: Report, repair: bool, summary: CheckSummary
) -> None:
    path = datadir.partition_dir(sid, tid, n)
    corrupt: list[int] = []
    try:
        log, _ = PartitionLog.open(
            path, segment_size, lambda off, why: corrupt.append(off), report=found, readonly=not repair,
            expect_existing=True, quarantine_dir=os.path.join(datadir.quarantine_dir, os.path.relpath(path, datadir.root)),
        )
    except FileNotFoundError:
        return  # reported by the open
    try:
        summary.partitions += 1
        summary.segments += len(log.segments)
        scanned = []
        for live in log.scan():  # verifies every live record (one CRC-32 of a segment unchanged since sealed)
            summary.records += sum(n for _, n in live.runs)
            scanned.append(live)
        _newest_damaged(log, scanned, summary)
        for first, last in _runs(sorted(corrupt)):
            seg = next(s for s in reversed(log.segments) if s.base <= first)
            found(Damage(
                "segment", seg.log_path, seg.positions[first - seg.base] if first - seg.base < seg.count else None,
                f"{last - first + 1} record(s) fail their checksum",
                "reads of these offsets fail with CORRUPTED_RECORD; the records around them are served",
                (first, last),
            ))
        if repair:
            qdir = os.path.join(datadir.quarantine_dir, os.path.relpath(path, datadir.root))
            for seg, offsets in log.write_off_corrupt(RemovalReason.DAMAGED, qdir):
                for first, last in _runs(offsets):
                    summary.written_off.append((seg.log_path, first, last))
    finally:
        log.close(clean=repair)


def _newest_damaged(log: PartitionLog, scanned: list[LiveRecords], summary: CheckSummary) -> None:
    """Add to ``summary.newest_damaged`` the damaged records of one partition (as its
    scan gave them, oldest first) that are, or may be, their subject's newest
    record: for a known subject, the newest damaged record when no live record of
    the subject is newer; the newest of those whose subject is unknown. Runtime
    complexity: O(records of the segments searched), at C speed."""
    damaged = [d for live in scanned for d in live.damaged]
    if not damaged:
        return
    newest: dict[bytes, int] = {}
    unknown = 0
    for offset, subject in damaged:
        if subject is None:
            unknown = max(unknown, offset)
        else:
            newest[subject] = max(newest.get(subject, 0), offset)
    for subject, offset in sorted(newest.items(), key=lambda item: item[1]):
        if _newest_live(scanned, subject, None) < offset:
            summary.newest_damaged.append((_log_path(log, offset), offset, subject, _newest_live(scanned, subject, offset)))
    if unknown:
        summary.newest_damaged.append((_log_path(log, unknown), unknown, None, 0))


def _newest_live(scanned: list[LiveRecords], subject: bytes, before: int | None) -> int:
    """The newest live offset of ``subject`` (below ``before`` if given) in the
    scanned segments ``scanned``, 0 if none."""
    for live in reversed(scanned):
        if before is not None and live.base >= before or subject not in live.names:
            continue
        k = live.names.index(subject)
        for first, n in reversed(live.runs):
            end = first + n if before is None else min(first + n, before)
            if end <= first:
                continue
            ids = live.sids[first - live.base : end - live.base]
            ids.reverse()
            try:
                return end - 1 - ids.index(k)
            except ValueError:
                continue
    return 0


def _log_path(log: PartitionLog, offset: int) -> str:
    return log.segments[log.segment_index(offset)].log_path


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for o in offsets:
        if out and o == out[-1][1] + 1:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


def _move_to_quarantine(datadir: DataDir, path: str) -> str:
    rel = os.path.relpath(path, datadir.root)
    dest = os.path.join(datadir.quarantine_dir, rel)
    n = 1
    while os.path.lexists(dest):
        n += 1
        dest = os.path.join(datadir.quarantine_dir, f"{rel}.{n}")
    makedirs(os.path.dirname(dest))
    os.rename(path, dest)
    fsync_dir(os.path.dirname(dest))
    fsync_dir(os.path.dirname(path))
    return dest
