"""How storage creates, writes and replaces files: the one place that knows the
permission bits, the write-everything-or-nothing rule and the atomic replace.

Every file and directory of the data directory is created through these functions,
with the modes set by :func:`set_modes` (the broker calls it once at start from its
config; the default is owner-only, ``0o600`` files and ``0o700`` directories, so a
broker's messages are not readable by other users of the machine).
"""

from __future__ import annotations

import os
import sys

from ._durability import PREALLOCATE_MIN, allocate_ahead, fsync_dir
from ._errors import StorageFailure

__all__ = [
    "set_modes", "file_mode", "dir_mode", "open_file", "makedirs", "write_all", "atomic_write", "keep_aside", "AppendFile",
    "read_if_exists", "file_names", "remove_file",
]

_modes = {"file": 0o600, "dir": 0o700}


def set_modes(file_mode: int = 0o600, dir_mode: int = 0o700) -> None:
    """Set the permission bits of files and directories created from now on (the
    process umask still applies on top, as for any ``open``)."""
    if not 0 <= file_mode <= 0o777 or not 0 <= dir_mode <= 0o777:
        raise ValueError("file and directory modes are permission bits, 0o000 to 0o777")
    _modes["file"] = file_mode
    _modes["dir"] = dir_mode


def file_mode() -> int:
    return _modes["file"]


def dir_mode() -> int:
    return _modes["dir"]


def open_file(path: str, flags: int) -> int:
    """``os.open`` with ``O_CLOEXEC`` and the configured file mode."""
    return os.open(path, flags | os.O_CLOEXEC, _modes["file"])


def makedirs(path: str, mode: int | None = None) -> bool:
    """Create ``path`` and any missing parents with the configured directory mode
    (or ``mode``), fsyncing each parent whose entries changed (so a new partition
    directory survives a power loss on any POSIX file system). Returns True if
    anything was created."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return False
    parent = os.path.dirname(path)
    if parent != path:
        makedirs(parent, mode)
    try:
        os.mkdir(path, _modes["dir"] if mode is None else mode)
    except FileExistsError:
        return False
    fsync_dir(parent)
    return True


def write_all(fd: int, data: bytes | bytearray | memoryview, size_before: int, at: int | None = None) -> None:
    """Write everything or nothing: on failure, cut the file back to its old size.
    ``at``: write at that position (``pwrite``) instead of the descriptor's own.

    Raises:
        StorageFailure: the write failed (disk full, I/O error).
    """
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view) if at is None else os.pwrite(fd, view, at)
            view = view[n:]
            if at is not None:
                at += n
    except OSError as exc:
        try:
            os.ftruncate(fd, size_before)
        except OSError:
            pass
        raise StorageFailure(f"write failed: {os.strerror(exc.errno or 0)}") from exc
    finally:
        view.release()


class AppendFile:
    """A file only ever written at its end: ``size`` bytes of content, its length on
    disk allocated ahead of them (:func:`._durability.allocate_ahead`, from
    ``minimum``, never beyond ``limit`` bytes) so that a sync of what is appended
    writes data, not a new file size. :meth:`cut` gives the allocated space back (a
    seal, a close; zero bytes left by a stop without one are for the file's reader
    to recognise)."""

    __slots__ = ("fd", "size", "length", "minimum", "limit", "_allocate")

    def __init__(self, fd: int, size: int, minimum: int = PREALLOCATE_MIN, limit: int = sys.maxsize) -> None:
        self.fd = fd
        self.size = size
        self.length = size
        self.minimum = minimum
        self.limit = limit
        self._allocate = True

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at the end, everything or nothing (:func:`write_all`).

        Raises:
            StorageFailure: the write failed (the file is cut back to ``size``).
        """
        size = self.size
        end = size + len(data)
        if end > self.length and self._allocate:
            self.length, self._allocate = allocate_ahead(self.fd, end, self.length, self.limit, self.minimum)
        try:
            write_all(self.fd, data, size, at=size)
        except StorageFailure:
            self.length = size
            raise
        self.size = end
        if end > self.length:
            self.length = end

    def cut(self) -> bool:
        """Cut the file to its content; True if there was space to cut.

        Raises:
            OSError: the cut failed (the zero bytes stay).
        """
        if self.length <= self.size:
            return False
        os.ftruncate(self.fd, self.size)
        self.length = self.size
        return True


def atomic_write(path: str, data: bytes, sync_dir: bool = True, mode: int | None = None) -> None:
    """Replace ``path`` with ``data``: write a temporary file, fsync it, rename it over
    ``path`` and (unless told not to) fsync the directory, so a crash leaves either
    the old or the new content and the new one survives a power loss once this
    returns. ``mode``: exactly these permission bits (whatever the umask, or a
    temporary file left behind), instead of the configured file mode."""
    tmp = path + ".tmp"
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        write_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(os.path.dirname(path) or ".")


def read_if_exists(path: str) -> bytes | None:
    """The whole content of ``path``, or None when there is no such file."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def file_names(directory: str, suffix: str) -> list[str]:
    """The names, less ``suffix``, of the regular files in ``directory`` whose name
    ends with it (and is more than it), sorted; none when there is no such
    directory."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(
        e.name[: -len(suffix)] for e in entries if e.name.endswith(suffix) and len(e.name) > len(suffix) and e.is_file()
    )


def remove_file(path: str) -> bool:
    """Remove ``path``; False when there was no such file."""
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


def keep_aside(path: str, quarantine_dir: str, suffix: str = "", data: bytes | None = None) -> str:
    """Copy ``path`` (or only ``data``, bytes of it) into ``quarantine_dir`` (created
    if needed) under its own name, a UTC time stamp and ``suffix``, durably, before
    the caller rewrites or cuts it: bytes the broker could not read are never
    discarded. Returns the copy's path."""
    import shutil
    import time

    makedirs(quarantine_dir)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = os.path.join(quarantine_dir, f"{os.path.basename(path)}.{stamp}{suffix}")
    n = 1
    while os.path.exists(dest):
        n += 1
        dest = os.path.join(quarantine_dir, f"{os.path.basename(path)}.{stamp}-{n}{suffix}")
    if data is None:
        shutil.copyfile(path, dest)
        os.chmod(dest, _modes["file"])
    else:
        fd = open_file(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            write_all(fd, data, 0)
        finally:
            os.close(fd)
    fd = os.open(dest, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(quarantine_dir)
    return dest
