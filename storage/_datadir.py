"""The data directory: where everything lives, and the small metadata files.

Layout (directories are named by numeric ids only, never by user-given names)::

    <data>/LOCK                                  flock'ed by the running broker
    <data>/catalog.json                          streams, topics and their options
    <data>/streams/<stream id>/topics/<topic id>/consumers.log
    <data>/streams/<stream id>/topics/<topic id>/partitions/<n>/
        00000000000000000001.log / .index / .timeindex / .del
        purged                                   the purge watermark

``catalog.json`` is replaced atomically (write, fsync, rename, fsync the directory),
so a crash leaves either the old or the new catalog, never a mix. Topic directories
not named by the catalog (a crash between the catalog write and the removal of a
deleted topic's files) are removed when the broker starts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import struct
import zlib

from ._durability import fsync_dir
from ._errors import StorageFailure
from ._segment import _atomic_write, _write_all

__all__ = ["DataDir", "ConsumerOffsets"]


class DataDir:
    """The broker's data directory. ``lock()`` before use; one broker per directory."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self._lock_fd = -1

    def lock(self) -> None:
        """Create the directory if needed and take its lock.

        Raises:
            StorageFailure: another broker holds the lock.
        """
        os.makedirs(os.path.join(self.root, "streams"), exist_ok=True)
        fd = os.open(os.path.join(self.root, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StorageFailure(f"data directory {self.root} is in use by another broker") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- catalog -------------------------------------------------------------------

    @property
    def catalog_path(self) -> str:
        return os.path.join(self.root, "catalog.json")

    def load_catalog(self) -> dict | None:
        try:
            with open(self.catalog_path, "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise StorageFailure(f"{self.catalog_path} is not valid JSON ({exc}); restore it from a backup") from None

    def save_catalog(self, catalog: dict) -> None:
        """Replace the catalog atomically and durably (blocking: call off the loop)."""
        _atomic_write(self.catalog_path, json.dumps(catalog, indent=1, sort_keys=True).encode())
        fsync_dir(self.root)

    # -- directories ---------------------------------------------------------------

    def stream_dir(self, stream_id: int) -> str:
        return os.path.join(self.root, "streams", str(stream_id))

    def topic_dir(self, stream_id: int, topic_id: int) -> str:
        return os.path.join(self.stream_dir(stream_id), "topics", str(topic_id))

    def partition_dir(self, stream_id: int, topic_id: int, partition: int) -> str:
        return os.path.join(self.topic_dir(stream_id, topic_id), "partitions", str(partition))

    def consumer_offsets(self, stream_id: int, topic_id: int) -> ConsumerOffsets:
        return ConsumerOffsets(os.path.join(self.topic_dir(stream_id, topic_id), "consumers.log"))

    def remove_topic(self, stream_id: int, topic_id: int) -> None:
        shutil.rmtree(self.topic_dir(stream_id, topic_id), ignore_errors=True)

    def remove_stream(self, stream_id: int) -> None:
        shutil.rmtree(self.stream_dir(stream_id), ignore_errors=True)

    def remove_unknown(self, known: dict[int, set[int]]) -> list[str]:
        """Remove stream and topic directories the catalog does not name."""
        removed = []
        streams = os.path.join(self.root, "streams")
        for sname in os.listdir(streams):
            sdir = os.path.join(streams, sname)
            if not sname.isdigit() or int(sname) not in known:
                shutil.rmtree(sdir, ignore_errors=True)
                removed.append(sdir)
                continue
            tdir_root = os.path.join(sdir, "topics")
            if not os.path.isdir(tdir_root):
                continue
            for tname in os.listdir(tdir_root):
                if not tname.isdigit() or int(tname) not in known[int(sname)]:
                    shutil.rmtree(os.path.join(tdir_root, tname), ignore_errors=True)
                    removed.append(os.path.join(tdir_root, tname))
        return removed

    def size_on_disk(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                try:
                    total += os.stat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    pass
        return total


_ENTRY_HEAD = struct.Struct("<IQB")  # partition, offset, name length
_CRC = struct.Struct("<I")
_FORGET = 0xFFFFFFFFFFFFFFFF


class ConsumerOffsets:
    """Named consumer offsets of one topic, in an append-only file.

    Entry: ``u32 partition | u64 offset | u8 name_len | name | u32 CRC-32`` of what
    precedes it; offset ``2**64-1`` forgets the consumer's offset. On open the file
    is replayed (a torn last entry fails its CRC and is dropped: it was never
    acknowledged) and rewritten compactly when it holds far more entries than live
    offsets.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.offsets: dict[tuple[str, int], int] = {}
        entries = 0
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raw = b""
        pos = 0
        good_end = 0
        while pos + _ENTRY_HEAD.size <= len(raw):
            partition, offset, nlen = _ENTRY_HEAD.unpack_from(raw, pos)
            end = pos + _ENTRY_HEAD.size + nlen + 4
            if end > len(raw):
                break
            (crc,) = _CRC.unpack_from(raw, end - 4)
            if zlib.crc32(raw[pos : end - 4]) != crc:
                break
            name = raw[pos + _ENTRY_HEAD.size : end - 4].decode(errors="replace")
            if offset == _FORGET:
                self.offsets.pop((name, partition), None)
            else:
                self.offsets[(name, partition)] = offset
            entries += 1
            pos = good_end = end
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if good_end < len(raw) or entries > 4 * max(len(self.offsets), 16):
            self._rewrite()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.dirty = False

    @staticmethod
    def _entry(name: str, partition: int, offset: int) -> bytes:
        raw = name.encode()
        head = _ENTRY_HEAD.pack(partition, offset, len(raw)) + raw
        return head + _CRC.pack(zlib.crc32(head))

    def _rewrite(self) -> None:
        data = b"".join(self._entry(n, p, o) for (n, p), o in self.offsets.items())
        _atomic_write(self.path, data)

    def get(self, name: str, partition: int) -> int | None:
        return self.offsets.get((name, partition))

    def store(self, name: str, partition: int, offset: int) -> None:
        self._append(self._entry(name, partition, offset))
        self.offsets[(name, partition)] = offset

    def forget(self, name: str, partition: int) -> bool:
        if (name, partition) not in self.offsets:
            return False
        self._append(self._entry(name, partition, _FORGET))
        del self.offsets[(name, partition)]
        return True

    def _append(self, entry: bytes) -> None:
        try:
            size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise StorageFailure(f"consumer offsets file: {exc}") from exc
        _write_all(self._fd, entry, size)
        self.dirty = True

    def take_dirty_fds(self) -> list[int]:
        if self.dirty:
            self.dirty = False
            return [self._fd]
        return []

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
