"""The data directory: where everything lives, and the small metadata files.

Layout (directories are named by numeric ids only, never by user-given names)::

    <data>/LOCK                                  flock'ed by the running broker
    <data>/catalog.json, catalog.json.1          streams, topics, options: two checksummed copies
    <data>/catalog.journal, catalog.journal.1    the catalog's changes since that snapshot
    <data>/quarantine/                           damaged files kept aside (never read back)
    <data>/streams/<stream id>/topics/<topic id>/consumers.log, consumers.log.1
    <data>/streams/<stream id>/topics/<topic id>/partitions/<n>/   (storage._partition_log)

**The catalog** is one JSON document: a snapshot written as two checksummed copies
with a generation (``storage._copies``), and a journal of the changes since it
(``storage._catalog_files``: a save appends only what changed). A damaged or
missing snapshot copy is reported and
rewritten from the other; when neither is valid the broker refuses to start rather
than start empty over existing data. Besides streams and topics it holds the id
high-water marks (``next_stream_id``, and ``next_topic_id`` per stream: ids are
never given out twice) and ``removing``, the directories that are garbage: a delete
writes the catalog without the topic and with its directory in ``removing``
*before* removing any file, and drops the entry once the files are gone; a create
lists the new directory there until the catalog that names the topic is written.

**Nothing else is ever deleted at start.** A directory or file under ``streams/``
that the catalog neither names nor lists in ``removing`` is reported (Damage kind
``unknown_path``) and left where it is; ``ttlbroker repair`` moves such paths to
``quarantine/``.

Every file and directory is created through ``storage._files`` (owner-only modes,
parents fsynced); removing a directory fsyncs its parent.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING
from dataclasses import dataclass

from ._catalog_files import JOURNAL_NAME, CatalogFiles, CatalogJournalConflict
from ._copies import Copies, CopiesUnreadable
from ._damage import Damage, Report, ignore_damage
from ._durability import fsync_dir
from ._errors import StorageFailure
from ._files import atomic_write, makedirs, open_file, write_all
from ._files import keep_aside as _keep_aside
from ._mirrored import MirroredFiles, scan_entries

if TYPE_CHECKING:
    from ._journal import Journal

__all__ = ["DataDir", "ConsumerOffsets", "CATALOG_NAME", "QUARANTINE_NAME"]

CATALOG_NAME = "catalog.json"
QUARANTINE_NAME = "quarantine"
_CATALOG_FORMAT = "ttlbroker.catalog"
_UNKNOWN_ACTION = "left in place; `ttlbroker repair` moves it to quarantine/"


def _is_legacy_catalog(obj: dict) -> bool:
    return isinstance(obj.get("streams"), list) and "version" in obj


class DataDir:
    """The broker's data directory. ``lock()`` before use; one broker per directory.

    Args:
        root: the directory.
        report: where damage found in the catalog, in consumer offsets and among the
            directories goes (the broker logs and counts it).
    """

    def __init__(self, root: str, report: Report = ignore_damage) -> None:
        self.root = os.path.abspath(root)
        self.report = report
        self._lock_fd = -1
        copies = Copies(
            os.path.join(self.root, CATALOG_NAME), _CATALOG_FORMAT, "catalog", self._report, self.keep_aside,
            legacy=_is_legacy_catalog,
        )
        self._catalog = CatalogFiles(copies, self.root, self._report, self.keep_aside)

    def _report(self, damage: Damage) -> None:
        self.report(damage)

    def lock(self) -> None:
        """Create the directory if needed and take its lock.

        Raises:
            StorageFailure: another broker holds the lock.
        """
        makedirs(os.path.join(self.root, "streams"))
        fd = open_file(os.path.join(self.root, "LOCK"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StorageFailure(
                f"data directory {self.root} is in use by another broker: stop that broker first, or give this one another directory"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- quarantine ------------------------------------------------------------------

    @property
    def quarantine_dir(self) -> str:
        return os.path.join(self.root, QUARANTINE_NAME)

    def keep_aside(self, path: str) -> str:
        """Copy a damaged file into ``quarantine/`` (durably) before it is rewritten,
        under the same relative folder as the original (as the partition logs do),
        with a UTC time stamp. Returns the copy's path."""
        rel = os.path.relpath(os.path.dirname(os.path.abspath(path)), self.root)
        return _keep_aside(path, self.quarantine_dir if rel == "." else os.path.join(self.quarantine_dir, rel))

    # -- catalog ---------------------------------------------------------------------

    @property
    def catalog_generation(self) -> int:
        """The generation of the catalog's snapshot (``catalog.json``)."""
        return self._catalog.copies.generation

    @property
    def catalog_changes(self) -> int:
        """Changes in the catalog's journal since its snapshot."""
        return self._catalog.changes

    def load_catalog(self, readonly: bool = False) -> dict | None:
        """The catalog (None: a new data directory), after reporting and rewriting a
        damaged, missing or outdated copy. Blocking. ``readonly`` (``ttlbroker
        check``): report, change nothing.

        Raises:
            StorageFailure: no copy is valid, or both are missing while ``streams/``
                holds data: the message names the files and what to do.
        """
        for name in (*self._catalog.paths, *self._catalog.journal_paths) if not readonly else ():
            try:
                os.unlink(name + ".tmp")  # a save cut short by a crash: never renamed, never used
            except FileNotFoundError:
                pass
        advice = f"restore {CATALOG_NAME} from a backup"
        try:
            body = self._catalog.load(readonly)
        except CopiesUnreadable as exc:
            what = "; ".join(f"{os.path.basename(p)} {why}" for p, why in exc.reasons)
            raise StorageFailure(
                f"the catalog of {self.root} is damaged ({what}) and the broker will not start without it: {advice} "
                "(both copies are left as they are; docs/operations.md, 'Files and what protects them', says how "
                "to mend one by hand)"
            ) from None
        except CatalogJournalConflict as exc:
            raise StorageFailure(
                f"the catalog of {self.root} cannot be read: {exc.message}; the broker will not start on a guess. "
                f"Restore {CATALOG_NAME} and {JOURNAL_NAME} from a backup, or remove "
                f"{JOURNAL_NAME} and its copy {JOURNAL_NAME}.1 to start from {CATALOG_NAME} alone "
                "(the changes since it are then lost; docs/operations.md, 'Files and what protects them')"
            ) from None
        if body is None and self._holds_data():
            raise StorageFailure(
                f"{self.root} has no catalog ({CATALOG_NAME} and {CATALOG_NAME}.1 are missing) but streams/ holds data; "
                f"the broker will not start over it: {advice}"
            )
        return body

    def save_catalog(self, catalog: dict) -> None:
        """Record the catalog: what changed since the last save, durably
        (``storage._catalog_files``; blocking: call off the loop).

        Raises:
            StorageFailure: a write failed.
        """
        self._catalog.save(catalog)

    def save_catalog_change(
        self, top: dict, streams: list[dict], topics: list[tuple[int, dict]], catalog: Callable[[], dict],
    ) -> None:
        """Record a change of the catalog that touched only ``streams`` (each without
        its topics) and ``topics`` (``(stream id, topic)``), with the document's
        top-level values ``top``: in a time that does not grow with the catalog
        (``CatalogFiles.save_change``); ``catalog`` makes the whole document when
        one is needed. Blocking: call off the loop.

        Raises:
            StorageFailure: a write failed.
        """
        self._catalog.save_change(top, streams, topics, catalog)

    def close_catalog(self, catalog: dict | None = None) -> None:
        """Fold the catalog's journal into its snapshot and close it (a clean stop);
        ``catalog``: the catalog as it is now, if it may differ from the last save."""
        self._catalog.close(catalog)

    def _holds_data(self) -> bool:
        try:
            return bool(os.listdir(os.path.join(self.root, "streams")))
        except FileNotFoundError:
            return False

    # -- directories -----------------------------------------------------------------

    def stream_dir(self, stream_id: int) -> str:
        return os.path.join(self.root, "streams", str(stream_id))

    def topic_dir(self, stream_id: int, topic_id: int) -> str:
        return os.path.join(self.stream_dir(stream_id), "topics", str(topic_id))

    def partition_dir(self, stream_id: int, topic_id: int, partition: int) -> str:
        return os.path.join(self.topic_dir(stream_id, topic_id), "partitions", str(partition))

    def make_topic_dirs(self, stream_id: int, topic_id: int, partitions: int) -> None:
        """Create a new topic's directories, fsyncing every parent whose entries changed."""
        makedirs(self.topic_dir(stream_id, topic_id))
        for n in range(partitions):
            makedirs(self.partition_dir(stream_id, topic_id, n))

    def consumer_offsets(self, stream_id: int, topic_id: int, readonly: bool = False) -> ConsumerOffsets:
        return ConsumerOffsets(
            os.path.join(self.topic_dir(stream_id, topic_id), "consumers.log"), self._report, self.keep_aside, readonly
        )

    def consumer_journal_path(self, stream_id: int, topic_id: int) -> str:
        return os.path.join(self.topic_dir(stream_id, topic_id), "consumers.journal")

    def has_consumer_journal(self, stream_id: int, topic_id: int) -> bool:
        path = self.consumer_journal_path(stream_id, topic_id)
        return os.path.exists(path) or os.path.exists(path + ".1")

    def consumer_journal(self, stream_id: int, topic_id: int, readonly: bool = False) -> Journal:
        """The topic's durable-consumer journal (created on first use)."""
        from ._journal import Journal

        return Journal(self.consumer_journal_path(stream_id, topic_id), self._report, self.keep_aside, readonly)

    def stream_on_disk(self, stream_id: int) -> bool:
        """Whether stream ``stream_id`` has a directory (or any entry) under ``streams/``."""
        return os.path.lexists(self.stream_dir(stream_id))

    def topic_on_disk(self, stream_id: int, topic_id: int) -> bool:
        return os.path.lexists(self.topic_dir(stream_id, topic_id))

    def remove_topic(self, stream_id: int, topic_id: int) -> bool:
        """Remove a deleted topic's directory (and fsync its parent). Returns False if
        some of it could not be removed (it stays listed in ``removing``)."""
        return _remove_tree(self.topic_dir(stream_id, topic_id))

    def remove_stream(self, stream_id: int) -> bool:
        return _remove_tree(self.stream_dir(stream_id))

    def remove_garbage(self, removing: list[tuple[int, int | None]], known: dict[int, set[int]]) -> tuple[list[str], list[tuple[int, int | None]]]:
        """Remove the directories the catalog lists in ``removing`` (proven garbage:
        deleted, or created and never named). An entry that the catalog also names is
        left alone. Returns the paths removed and the entries still pending (a removal
        failed)."""
        removed: list[str] = []
        pending: list[tuple[int, int | None]] = []
        for sid, tid in removing:
            if (tid is None and sid in known) or (tid is not None and tid in known.get(sid, ())):
                continue
            path = self.stream_dir(sid) if tid is None else self.topic_dir(sid, tid)
            existed = os.path.lexists(path)
            if not _remove_tree(path):
                pending.append((sid, tid))
            elif existed:
                removed.append(path)
        return removed, pending

    def report_unknown(self, known: dict[int, set[int]], removing: Iterable[tuple[int, int | None]] = ()) -> list[str]:
        """Report (Damage ``unknown_path``) every directory or file under ``streams/``
        that is neither a stream or topic of the catalog nor listed in ``removing``,
        down to the topic level. Nothing is removed. Returns the paths."""
        removing = list(removing)
        pending_streams = {s for s, t in removing if t is None}
        pending_topics = {(s, t) for s, t in removing if t is not None}
        found: list[str] = []

        def unknown(path: str) -> None:
            what = "directory" if os.path.isdir(path) and not os.path.islink(path) else "file"
            self._report(Damage("unknown_path", path, None, f"a {what} the catalog does not name", _UNKNOWN_ACTION))
            found.append(path)

        streams = os.path.join(self.root, "streams")
        for sname in _listdir(streams):
            spath = os.path.join(streams, sname)
            sid = int(sname) if sname.isdigit() and sname == str(int(sname)) else None
            if sid in pending_streams:
                continue
            if sid is None or sid not in known or not os.path.isdir(spath):
                unknown(spath)
                continue
            for name in _listdir(spath):
                if name != "topics":
                    unknown(os.path.join(spath, name))
            troot = os.path.join(spath, "topics")
            for tname in _listdir(troot):
                tpath = os.path.join(troot, tname)
                tid = int(tname) if tname.isdigit() and tname == str(int(tname)) else None
                if (sid, tid) in pending_topics:
                    continue
                if tid is None or tid not in known[sid] or not os.path.isdir(tpath):
                    unknown(tpath)
        return found

    def size_on_disk(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                try:
                    total += os.stat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    pass
        return total


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _remove_tree(path: str) -> bool:
    """Remove ``path`` and everything under it, then fsync its parent so the removal
    is durable. True when nothing is left."""
    if not os.path.lexists(path):
        return True
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        return False
    fsync_dir(os.path.dirname(path))
    return True


# -- consumer offsets and KV leases ------------------------------------------------------

#: Entry (current format): ``u8 0xC0 | u8 name_len | u64 seq | u32 partition |
#: u64 offset | name | u32 CRC-32`` of everything before the CRC. 26 bytes + the name.
_HEAD = struct.Struct("<BBQIQ")
_MAGIC = 0xC0
#: Entry of the first format (no magic, no sequence): ``u32 partition | u64 offset |
#: u8 name_len | name | u32 CRC-32``. Read only (upgraded on open).
_OLD_HEAD = struct.Struct("<IQB")
_CRC = struct.Struct("<I")
_FORGET = 0xFFFFFFFFFFFFFFFF
_SNAPSHOT_PARTITION = 0xFFFFFFFF
_MIRROR = ".1"


@dataclass
class _Entry:
    seq: int
    name: str
    partition: int
    offset: int
    pos: int  # where the entry starts
    end: int  # where the next one may start


@dataclass
class _Parsed:
    path: str
    exists: bool
    raw: bytes
    entries: list[_Entry]
    damaged: list[tuple[int, int]]  # [start, end) byte ranges no entry validates in
    snapshot: int = -1  # seq of the snapshot marker (-1: none)
    snapshot_keys: frozenset[tuple[str, int]] = frozenset()
    legacy: bool = False


def _entry_at(raw: bytes, pos: int) -> _Entry | None:
    n = len(raw)
    if pos + _HEAD.size + 4 > n or raw[pos] != _MAGIC:
        return None
    _, nlen, seq, partition, offset = _HEAD.unpack_from(raw, pos)
    end = pos + _HEAD.size + nlen + 4
    if end > n or zlib.crc32(raw[pos : end - 4]) != _CRC.unpack_from(raw, end - 4)[0]:
        return None
    try:
        name = raw[pos + _HEAD.size : end - 4].decode()
    except UnicodeDecodeError:
        return None
    return _Entry(seq, name, partition, offset, pos, end)


def _old_entry_at(raw: bytes, pos: int) -> _Entry | None:
    n = len(raw)
    if pos + _OLD_HEAD.size + 4 > n:
        return None
    partition, offset, nlen = _OLD_HEAD.unpack_from(raw, pos)
    end = pos + _OLD_HEAD.size + nlen + 4
    if nlen == 0 or end > n or zlib.crc32(raw[pos : end - 4]) != _CRC.unpack_from(raw, end - 4)[0]:
        return None
    try:
        name = raw[pos + _OLD_HEAD.size : end - 4].decode()
    except UnicodeDecodeError:
        return None
    return _Entry(0, name, partition, offset, pos, end)


def _parse(path: str) -> _Parsed:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return _Parsed(path, False, b"", [], [])
    entries, damaged = scan_entries(raw, _entry_at, bytes([_MAGIC]))
    if raw and not entries:
        old, old_damaged = scan_entries(raw, _old_entry_at, None)
        if old:
            for i, e in enumerate(old):
                e.seq = i + 1
            return _Parsed(path, True, raw, old, old_damaged, legacy=True)
    p = _Parsed(path, True, raw, [], damaged)
    keys: set[tuple[str, int]] = set()
    for e in entries:
        if not e.name and e.partition == _SNAPSHOT_PARTITION:
            # The snapshot marker ends a compacted copy: what precedes it was the whole
            # state at sequence e.seq. It only counts when nothing before it is damaged.
            if not any(s < e.pos for s, _ in damaged):
                p.snapshot, p.snapshot_keys = e.seq, frozenset(keys)
            continue
        if e.name:
            p.entries.append(e)
            keys.add((e.name, e.partition))
    return p


class ConsumerOffsets(MirroredFiles):
    """Named consumer offsets (and KV refresh leases, ``$refresh.<offset>``) of one
    topic, in two mirrored append-only files: ``consumers.log`` and
    ``consumers.log.1`` get the same bytes, and the group commit syncs both.

    Entry::

        u8 0xC0 | u8 name_len | u64 seq | u32 partition | u64 offset | name | u32 CRC-32

    The CRC-32 (zlib) covers everything before it. ``seq`` grows by one per entry
    and is never reused; offset ``2**64-1`` forgets the name's offset. A compacted
    copy ends with a snapshot marker (empty name, partition ``2**32-1``, ``seq`` the
    last sequence number at compaction): everything before it was the whole state
    at that point, so a name it lacks whose newest entry anywhere is older was
    forgotten (a stale copy left by a crash during compaction cannot bring it back).

    On open both files are read; past a damaged range the scan resynchronises on the
    next position where an entry validates. For each (name, partition) the valid
    entry with the highest sequence in either file wins. Each damaged range is
    reported once (kind ``consumer_offsets``, with its file and byte position), the
    damaged file is copied to ``quarantine/``, and both files are rewritten,
    compacted, from the merged state, one after the other (each with an atomic
    replace), so a crash in between leaves one complete copy. They are also rewritten
    when they differ without damage (a crash between the two appends) or hold many
    more entries than live names. Files of the first format (no sequence numbers, one
    file) are read in file order and rewritten in this format.
    """

    def __init__(
        self, path: str, report: Report = ignore_damage, keep_aside: Callable[[str], str] | None = None,
        readonly: bool = False,
    ) -> None:
        """Args:
        path: the first file (the mirror is ``path + ".1"``).
        report: where damage goes.
        keep_aside: copies a damaged file to quarantine before it is rewritten
            (default: a ``quarantine`` folder beside the file).
        readonly: ``ttlbroker check``: read and report, change nothing (then
            ``store`` and ``forget`` fail).
        """
        self.path = path
        self.paths = (path, path + _MIRROR)
        self.report = report
        self.offsets: dict[tuple[str, int], int] = {}
        self._seq = 0
        self.fds = [-1, -1]
        self.dirty = False
        self._made = readonly  # both copies open (read-only, or after a close: a store fails)
        folder = os.path.dirname(path)
        if not readonly:
            makedirs(folder)
        for p in self.paths if not readonly else ():
            try:
                os.unlink(p + ".tmp")  # a rewrite cut short by a crash: never renamed
            except FileNotFoundError:
                pass
        if keep_aside is None:
            quarantine = os.path.join(folder, QUARANTINE_NAME)
            keep_aside = lambda p: _keep_aside(p, quarantine)  # noqa: E731
        files = [_parse(p) for p in self.paths]
        self._merge(files)
        rewrite = False
        for f in files:
            if f.damaged:
                action = (
                    "left as is (check); the next start takes the newest valid entries of both copies and rewrites it"
                    if readonly else
                    f"offsets taken from the newest valid entries of both copies; file kept aside as {keep_aside(f.path)} and rewritten"
                )
                for start, end in f.damaged:
                    tail = end == len(f.raw)
                    what = f"{end - start} bytes at the end hold no complete valid entry (a torn write or damage)" if tail and start > 0 else f"{end - start} bytes hold no valid entry"
                    self.report(Damage("consumer_offsets", f.path, start, what, action))
                rewrite = True
        a, b = files
        if a.exists != b.exists:
            present = a if a.exists else b
            if present.raw and not present.legacy:
                missing = b if present is a else a
                self.report(Damage(
                    "consumer_offsets", missing.path, None, "copy is missing",
                    ("left as is (check); the next start rewrites it from " if readonly else "rewritten from ")
                    + os.path.basename(present.path),
                ))
            rewrite = True
        elif a.raw != b.raw:
            rewrite = True  # a crash between the two appends (or a boundary cut): no bytes lost
        if a.legacy or b.legacy:
            rewrite = True
        live = len(self.offsets)
        if max(len(a.entries), len(b.entries)) > 4 * max(live, 16):
            rewrite = True
        if readonly:
            return
        if rewrite:
            self._rewrite()
        if a.exists or b.exists:  # (both, after a rewrite)
            self._open()

    def _open(self) -> None:
        """Both copies, opened for appending; made (their folder synced) by the first
        entry of a topic that never had one: a topic is made without them, as most
        never store an offset."""
        created = False
        for i, p in enumerate(self.paths):
            created |= not os.path.exists(p)
            self.fds[i] = open_file(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._made = True
        if created:
            fsync_dir(os.path.dirname(self.path))  # the new entries, before an offset in them is acked

    def _merge(self, files: list[_Parsed]) -> None:
        best: dict[tuple[str, int], _Entry] = {}
        top = 0
        for f in files:
            top = max(top, f.snapshot)
            for e in f.entries:
                key = (e.name, e.partition)
                cur = best.get(key)
                if cur is None or e.seq > cur.seq:
                    best[key] = e
                top = max(top, e.seq)
        for f in files:
            if f.snapshot < 0:
                continue
            for key in [k for k, e in best.items() if e.seq <= f.snapshot and k not in f.snapshot_keys]:
                del best[key]  # forgotten before that snapshot
        self.offsets = {k: e.offset for k, e in best.items() if e.offset != _FORGET}
        self._seqs = {k: best[k].seq for k in self.offsets}
        self._seq = top

    @staticmethod
    def _entry(seq: int, name: str, partition: int, offset: int) -> bytes:
        raw = name.encode()
        head = _HEAD.pack(_MAGIC, len(raw), seq, partition, offset) + raw
        return head + _CRC.pack(zlib.crc32(head))

    def _rewrite(self) -> None:
        """Both copies, compacted, one after the other (each fsynced and renamed)."""
        items = sorted(self.offsets.items(), key=lambda kv: self._seqs[kv[0]])
        data = b"".join(self._entry(self._seqs[(n, p)], n, p, o) for (n, p), o in items)
        data += self._entry(self._seq, "", _SNAPSHOT_PARTITION, 0)
        for p in reversed(self.paths):  # the mirror first: an interrupted upgrade keeps the old file
            atomic_write(p, data)

    def get(self, name: str, partition: int) -> int | None:
        return self.offsets.get((name, partition))

    def store(self, name: str, partition: int, offset: int) -> None:
        seq = self._append(name, partition, offset)
        self.offsets[(name, partition)] = offset
        self._seqs[(name, partition)] = seq

    def forget(self, name: str, partition: int) -> bool:
        if (name, partition) not in self.offsets:
            return False
        self._append(name, partition, _FORGET)
        del self.offsets[(name, partition)]
        del self._seqs[(name, partition)]
        return True

    def _append(self, name: str, partition: int, offset: int) -> int:
        if not self._made:
            self._open()
        self._seq += 1  # never reused, even if the write fails
        entry = self._entry(self._seq, name, partition, offset)
        for fd in self.fds:
            try:
                size = os.fstat(fd).st_size
            except OSError as exc:
                raise StorageFailure(f"consumer offsets file: {exc}") from exc
            write_all(fd, entry, size)
        self.dirty = True
        return self._seq
