"""The fsync policy, and the one function that calls fsync.

``always`` (the default): an ack leaves only after the fdatasync that covers its
message. The broker groups commits: every write waiting when a sync starts shares it
(see ``broker/_commit.py``). ``interval`` (a duration such as ``"100ms"``): files are
synced every interval and acks do not wait, so a machine crash (not a process crash)
can lose up to one interval of acknowledged messages. ``never``: the operating
system decides when data reaches the disk; a process crash loses nothing (the data
is in the page cache), a machine crash can lose anything not yet written back.

The files a group commit syncs again and again (the active segment's log, the
segments' deletions, the consumer journals) are allocated ahead of what they hold (:func:`allocate_ahead`):
an fdatasync of bytes written into allocated space flushes the data only, while one
after an append to a growing file also flushes the file's new size (about 97
against 150 µs per 200-byte write + fdatasync on ext4, on the 2-core test machine).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = [
    "FsyncPolicy", "sync_fds", "fsync_dir", "deferred_dir_syncs", "parse_duration_ms", "allocate_ahead", "PREALLOCATE_MIN", "PREALLOCATE_MAX",
]

#: A file is allocated ahead of a write by as much as it holds, at least
#: :data:`PREALLOCATE_MIN` and at most :data:`PREALLOCATE_MAX` at a time.
PREALLOCATE_MIN = 64 << 10
PREALLOCATE_MAX = 4 << 20

_UNITS_MS = {
    "ns": 1e-6, "us": 1e-3, "\u00b5s": 1e-3, "\u03bcs": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0,
    "m": 60_000.0, "min": 60_000.0, "h": 3_600_000.0,
}
# One ``<number><unit>`` term; the longer units first so that ``5ms`` is not ``5m`` + ``s``.
_TERM = r"(\d+(?:\.\d*)?|\.\d+)(" + "|".join(sorted(_UNITS_MS, key=len, reverse=True)) + ")"
_COMPOUND_RE = re.compile(f"(?:{_TERM})+")
_TERM_RE = re.compile(_TERM)


def parse_duration_ms(value: str | int | float, what: str = "duration", *, bare_unit_ms: float = 1.0) -> float:
    """A duration in milliseconds, from ``"100ms"``, ``"2 s"``, ``"1 m"``, ``"1h"``, a
    compound like ``"1h30m"`` or ``"1m0.5s"`` (Go's ``time.ParseDuration`` form; the
    units are ``ns``, ``us``, ``ms``, ``s``/``sec``, ``m``/``min`` and ``h``), or a bare
    number, counted in ``bare_unit_ms`` (milliseconds unless told; the command line
    passes 1000 so that ``30`` is 30 seconds). Case and spaces do not matter.

    Raises:
        ValueError: unparsable, negative or not finite.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration, not a bool")
    if isinstance(value, (int, float)):
        ms = float(value) * bare_unit_ms
    else:
        text = value.strip().lower().replace(" ", "")
        if text.startswith("-") and (_COMPOUND_RE.fullmatch(text[1:]) or _is_number(text[1:])):
            raise ValueError(f"{what} must not be negative")
        if _COMPOUND_RE.fullmatch(text):
            ms = sum(float(number) * _UNITS_MS[unit] for number, unit in _TERM_RE.findall(text))
        elif _is_number(text):
            ms = float(text) * bare_unit_ms
        else:
            raise ValueError(f"{what} {value!r} is not a duration such as '500ms', '90s' or '1h30m'")
    if not math.isfinite(ms):
        raise ValueError(f"{what} {value!r} is not a finite duration")
    if ms < 0:
        raise ValueError(f"{what} must not be negative")
    return ms


def _is_number(text: str) -> bool:
    # float() also takes "inf", "nan", "1e3" and "1_000": only plain decimals here.
    return re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", text) is not None


@dataclass(frozen=True, slots=True)
class FsyncPolicy:
    """``mode`` is ``always``, ``interval`` or ``never``; ``interval_ms`` for interval."""

    mode: str = "always"
    interval_ms: float = 0.0

    @classmethod
    def parse(cls, value: str | int) -> FsyncPolicy:
        """``"always"``, ``"never"``, or an interval such as ``"200ms"`` / ``"1s"``.

        Raises:
            ValueError: anything else.
        """
        if isinstance(value, str) and value.strip().lower() in ("always", "never"):
            return cls(value.strip().lower())
        ms = parse_duration_ms(value, "fsync interval")
        if ms <= 0:
            raise ValueError("an fsync interval must be positive; use 'always' to sync before every ack")
        return cls("interval", ms)

    @property
    def acks_wait_for_sync(self) -> bool:
        return self.mode == "always"

    def __str__(self) -> str:
        return f"interval {self.interval_ms:g}ms" if self.mode == "interval" else self.mode


def sync_fds(fds: Iterable[int]) -> None:
    """fdatasync each descriptor (run in a worker thread).

    A descriptor closed meanwhile (its segment was deleted; a closed file reports
    -1) is skipped: there is nothing left to make durable.
    """
    for fd in fds:
        if fd < 0:
            continue
        try:
            os.fdatasync(fd)
        except OSError as exc:
            if exc.errno not in (errno.EBADF, errno.EINVAL):
                raise


def allocate_ahead(fd: int, end: int, length: int, limit: int, minimum: int = PREALLOCATE_MIN) -> tuple[int, bool]:
    """Allocate the file ``fd``, now ``length`` bytes long, past ``end`` (where the
    write about to be made ends) by as much as ``end``, at least ``minimum`` and at
    most :data:`PREALLOCATE_MAX`, never beyond ``limit`` bytes (``posix_fallocate``: the file's size grows, the new
    space reads as zero bytes). Returns the file's new length and False when the
    file system cannot allocate or the disk is full: the write goes ahead all the
    same, and the caller stops allocating (a failed allocation may have done part of
    it: the length is then the file's own)."""
    target = min(end + min(max(end, minimum), PREALLOCATE_MAX), limit)
    if target <= max(end, length):
        return length, True
    try:
        os.posix_fallocate(fd, length, target - length)
    except OSError:
        return max(length, os.fstat(fd).st_size), False
    return target, True


_deferred = threading.local()


@contextlib.contextmanager
def deferred_dir_syncs() -> Iterator[None]:
    """Inside the block, :func:`fsync_dir` and :func:`fdatasync_new` (in this
    thread) only record the directory or the file; when the block ends without an
    error each file recorded is synced, then each directory once, the deepest
    first. For making a new tree (a topic's directories and first files), where
    nothing depends on an entry being durable before the whole tree is: six
    directory syncs become four, and every entry and file of the tree is made
    before the first sync (one journal commit takes them all, not one each). A
    file's data is still durable before its directory entry is. After an error
    nothing is synced: the caller removes the tree."""
    pending: dict[str, None] = {}
    files: list[int] = []
    outer = getattr(_deferred, "dirs", None)
    outer_files = getattr(_deferred, "files", None)
    if outer is None:
        _deferred.dirs, _deferred.files = pending, files
    try:
        yield
    finally:
        _deferred.dirs, _deferred.files = outer, outer_files
    if outer is None:
        for fd in files:
            os.fdatasync(fd)
        for path in sorted(pending, key=lambda p: -p.count(os.sep)):
            _fsync_dir_now(path)


def fdatasync_new(fd: int) -> None:
    """fdatasync a file just created, whose directory entry the caller syncs next
    (at the end of a :func:`deferred_dir_syncs` block, inside one, before the
    directories). The descriptor must stay open until then."""
    files = getattr(_deferred, "files", None)
    if files is not None:
        files.append(fd)
        return
    os.fdatasync(fd)


def fsync_dir(path: str) -> None:
    """Make a directory's entries (created, renamed, removed files) durable (at the
    end of a :func:`deferred_dir_syncs` block, inside one)."""
    pending = getattr(_deferred, "dirs", None)
    if pending is not None:
        pending[os.path.abspath(path)] = None
        return
    _fsync_dir_now(path)


def _fsync_dir_now(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
