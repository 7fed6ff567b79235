"""A strict-POSIX file-system model, for simulating a power loss in the tests.

While a :class:`FsModel` is active (``with FsModel(root) as fs:``) it wraps the
``os`` functions that create, write, rename, remove and sync files (and the builtin
``open`` for writing), lets every call happen on the real disk exactly as before,
and keeps beside it, for everything under ``root``:

* the *volatile* state: each directory's entries (name -> inode) and each file's
  content, as the running process sees them;
* the *durable* state: each directory's entries as of its last ``fsync``, and each
  file's content as of its last ``fsync`` / ``fdatasync``.

The rules are the strictest POSIX allows, with no help from a journal:

* a file's data and size are durable only once that file is fsynced (``fdatasync``
  counts: it covers data and size);
* a created, renamed, linked or unlinked entry is durable only once its parent
  directory is fsynced (``os.open(dir, O_RDONLY | O_DIRECTORY)`` then ``os.fsync``);
  a rename between two directories needs both (each side is independent);
* a new directory's own entries need a fsync of that directory, and the directory is
  reachable only once its parent's entry for it is durable too;
* files are inodes: a renamed file keeps its data state, and an unlinked or replaced
  file whose removal is not durable comes back, with its durable content;
* everything that exists when the model starts counts as durable.

:meth:`FsModel.snapshot` captures, at that instant, what a power loss would leave;
:meth:`CrashState.materialize` writes it to a directory (``torn=True`` also keeps a
seeded random prefix of the unsynced bytes appended to some files: a real disk may
have written some of them). :meth:`FsModel.crash_image` does both. A snapshot can
also be taken from inside the broker's own file operations with
:meth:`FsModel.trigger_after` (after the n-th operation), which is how the tests
crash at arbitrary points, mid group commit or mid rename.

Robustness: a wrapped function calls the original with the same arguments and
returns or raises exactly what it does; the model's bookkeeping never raises into
the caller (a failure is recorded in :attr:`FsModel.errors`). Every fsync compares
the model with the real file or directory; what the model missed (something written
by code that does not go through ``os``, such as pyarrow) is adopted and reported in
:attr:`FsModel.untracked`, and the durable state is taken from the real content, so
the model never claims durability it cannot see. The originals are restored on exit,
even on error. Linux only (descriptors are read back through ``/proc/self/fd``).

Limits: data written through ``mmap``, ``os.sendfile`` or ``copy_file_range`` to a
file that is not reopened and fsynced is not seen; symlinks are not modelled (they
are reported in ``untracked``); file metadata other than size (modes, times) is not
modelled; a ``torn`` image keeps partial *appends* only, or a prefix of what was
written over durable zero bytes up to the end of a file (space allocated with
``posix_fallocate``) (never unsynced renames or new entries, never a hole in the
middle of a file); timing is the process's own
(writes that race an fsync in another thread count as not covered, which is what a
real kernel may do).
"""

from __future__ import annotations

import builtins
import io
import itertools
import os
import random
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FsModel", "CrashState", "ModelError", "Op"]

_SEP = os.sep


def _over_zeros(durable: bytes, data: bytes | bytearray) -> tuple[bytes, int]:
    """The unsynced bytes written over the durable zero bytes of allocated space, as
    ``(tail, position)``: from the first byte that differs to the end of ``data``,
    if every durable byte from there on is zero; else ``(b"", -1)`` (a torn image
    then keeps the durable content)."""
    n = min(len(durable), len(data))
    at = 0
    while at < n and durable[at : at + 4096] == data[at : at + 4096]:
        at += 4096
    while at < n and durable[at] == data[at]:
        at += 1
    if at >= len(data) or durable.count(0, at) != len(durable) - at:
        return b"", -1
    return bytes(data[at:]), at


class ModelError(RuntimeError):
    """The model was used wrongly (two active at once, a missing root)."""


class _Inode:
    __slots__ = (
        "ident", "is_dir", "data", "durable", "version", "durable_version",
        "entries", "durable_entries", "opaque", "last_sync_event",
    )

    def __init__(self, ident: int, is_dir: bool) -> None:
        self.ident = ident
        self.is_dir = is_dir
        self.data = bytearray()  # files: the volatile content
        self.durable = b""  # files: the content as of the last fsync (immutable bytes)
        self.version = 0  # bumped by every change to the volatile state
        self.durable_version = 0
        self.entries: dict[str, _Inode] = {}  # directories: volatile entries
        self.durable_entries: dict[str, _Inode] = {}  # replaced, never mutated
        self.opaque = False  # written by code the model cannot see: content read back
        self.last_sync_event = -1  # the event of the last fsync that made it durable

    def __repr__(self) -> str:
        return f"<{'dir' if self.is_dir else 'file'} #{self.ident}>"


class Open:
    """One descriptor the model follows."""

    __slots__ = ("inode", "rel", "append", "dev", "ino")

    def __init__(self, inode: _Inode, rel: str, append: bool, dev: int, ino: int) -> None:
        self.inode = inode
        self.rel = rel
        self.append = append
        self.dev = dev
        self.ino = ino


@dataclass(frozen=True)
class _ImgFile:
    ident: int
    durable: bytes
    tail: bytes  # unsynced bytes appended after the durable content ('' if none / unknown)
    volatile_size: int
    last_sync_event: int
    #: Where ``tail`` goes: after the durable content (-1), or at this position, over
    #: durable zero bytes (writes into space allocated with ``posix_fallocate``).
    tail_at: int = -1


@dataclass(frozen=True)
class _ImgDir:
    ident: int
    entries: dict[str, _ImgFile | _ImgDir]
    last_sync_event: int


@dataclass(frozen=True)
class Op:
    """One logged operation: its event number, what it was (``create``, ``write``,
    ``pwrite``, ``ftruncate``, ``truncate``, ``fallocate``, ``fsync``, ``fdatasync``, ``mkdir``,
    ``rmdir``, ``unlink``, ``rename``, ``link``), the path relative to the root as
    opened or named, the model's inode number, and a detail (``bytes@position``,
    ``from A to B``)."""

    event: int
    op: str
    rel: str
    ident: int
    detail: str = ""


@dataclass
class CrashState:
    """What a power loss at one instant leaves, plus what explains it.

    Attributes:
        event: the model's event counter at the crash.
        durable: the durable tree (what :meth:`materialize` writes).
        volatile: the names the process saw at that instant: path -> (ident, size),
            size -1 for a directory, -2 for a file written where the model cannot
            see (its content is read back from the disk when it is synced).
        ops: the model's operation log up to the crash.
        extra: whatever the caller captured together with the snapshot (under the
            model's lock, so nothing became durable meanwhile).
    """

    event: int
    durable: _ImgDir
    volatile: dict[str, tuple[int, int]]
    ops: list[Op]
    extra: Any = None
    torn_files: list[tuple[str, int, int]] = field(default_factory=list)

    # -- writing the image -------------------------------------------------------------

    def materialize(self, dest: str | os.PathLike[str], *, torn: bool = False, seed: int = 0, torn_share: float = 0.5) -> Path:
        """Write the durable tree to ``dest`` (created; must not exist or be empty).

        ``torn``: for each file with unsynced appended bytes, with probability
        ``torn_share``, keep a random prefix of them (1 byte to all of them), chosen
        from ``seed``. :attr:`torn_files` lists ``(path, durable size, kept bytes)``.
        """
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        if any(dest.iterdir()):
            raise ModelError(f"{dest} is not empty")
        rng = random.Random(seed)
        self.torn_files = []
        written: dict[int, Path] = {}

        def write(node: _ImgDir, here: Path, rel: str, depth: int) -> None:
            if depth > 256:
                raise ModelError(f"directory cycle at {rel}")
            for name in sorted(node.entries):
                child = node.entries[name]
                crel = f"{rel}{_SEP}{name}" if rel else name
                target = here / name
                if isinstance(child, _ImgDir):
                    target.mkdir(mode=0o700)
                    write(child, target, crel, depth + 1)
                    continue
                if child.ident in written:
                    os.link(written[child.ident], target)
                    continue
                data = child.durable
                if torn and child.tail and rng.random() < torn_share:
                    keep = rng.randint(1, len(child.tail))
                    at = len(data) if child.tail_at < 0 else child.tail_at
                    data = data[:at] + child.tail[:keep] + data[at + keep :]
                    self.torn_files.append((crel, at, keep))
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
                written[child.ident] = target

        write(self.durable, dest, "", 0)
        return dest

    # -- explaining -------------------------------------------------------------------

    def _durable_lookup(self, rel: str) -> tuple[_ImgFile | _ImgDir | None, str]:
        """The durable node at ``rel``, or None and the first missing prefix."""
        node: _ImgFile | _ImgDir = self.durable
        done = ""
        for part in [p for p in rel.split(_SEP) if p]:
            done = f"{done}{_SEP}{part}" if done else part
            if not isinstance(node, _ImgDir) or part not in node.entries:
                return None, done
            node = node.entries[part]
        return node, done

    def _history(self, rel: str, limit: int = 6) -> str:
        hits = [o for o in self.ops if o.rel == rel or o.detail.startswith(f"from {rel} to ")]
        if not hits:
            return "no operation on it since the model started"
        def fmt(o: Op) -> str:
            return f"#{o.event} {o.op}{(' ' + o.detail) if o.detail else ''}"

        if len(hits) <= limit:
            return ", ".join(map(fmt, hits))
        shown = hits[-(limit - 1) :]
        return f"{fmt(hits[0])}, {len(hits) - len(shown) - 1} more, then " + ", ".join(map(fmt, shown))

    def _sync_note(self, rel: str) -> str:
        ident = self.volatile.get(rel, (None, 0))[0]
        if ident is None:
            return f"'{rel or '.'}' is gone from the volatile tree too"
        syncs = [o.event for o in self.ops if o.ident == ident and o.op in ("fsync", "fdatasync")]
        return f"'{rel or '.'}' last fsynced at #{syncs[-1]}" if syncs else f"'{rel or '.'}' never fsynced since the model started"

    def explain(self, rel: str) -> str:
        """Why ``rel`` is (not) in the image as the process saw it: for the first
        missing path component, when it was created and when its directory was last
        synced; for a file, its durable against volatile size."""
        rel = rel.strip(_SEP)
        node, at = self._durable_lookup(rel)
        if node is None:
            parent = os.path.dirname(at)
            seen = at in self.volatile
            return (
                f"'{at}' is not a durable entry of '{parent or '.'}' "
                f"({'it existed for the process' if seen else 'the process did not see it either'}; "
                f"{self._sync_note(parent)}; ops on '{at}': {self._history(at)})"
            )
        ident = self.volatile.get(rel, (None, 0))[0]
        if ident is not None and ident != node.ident:
            return (
                f"'{rel}' reverts to an older file (#{node.ident}; the process had #{ident} there): the rename or "
                f"re-creation is not durable, {self._sync_note(os.path.dirname(rel))}; ops: {self._history(rel)}"
            )
        if isinstance(node, _ImgFile):
            vol = self.volatile.get(rel, (None, -2))[1]
            return f"'{rel}': durable {len(node.durable)} bytes, volatile {vol} bytes ({self._sync_note(rel)})"
        return f"'{rel}' is a durable directory"

    def diff(self, prefix: str = "", limit: int = 40) -> list[str]:
        """What differs under ``prefix`` between what the process saw and what the
        image holds (entries not durable, entries that come back, short files)."""
        prefix = prefix.strip(_SEP)
        out: list[str] = []
        durable_paths: dict[str, _ImgFile | _ImgDir] = {}

        def walk(node: _ImgDir, rel: str) -> None:
            for name, child in node.entries.items():
                crel = f"{rel}{_SEP}{name}" if rel else name
                durable_paths[crel] = child
                if isinstance(child, _ImgDir):
                    walk(child, crel)

        walk(self.durable, "")

        def under(p: str) -> bool:
            return not prefix or p == prefix or p.startswith(prefix + _SEP)

        reported: set[str] = set()
        for p in sorted(self.volatile):
            if not p or not under(p):
                continue
            ident, size = self.volatile[p]
            d = durable_paths.get(p)
            if d is None:
                _, at = self._durable_lookup(p)
                if at not in reported:  # once per missing directory, not per file in it
                    reported.add(at)
                    out.append(f"lost entry: {self.explain(at)}")
            elif d.ident != ident:
                out.append(f"'{p}' reverts to an older file (#{d.ident} instead of #{ident}): {self._sync_note(os.path.dirname(p))}")
            elif isinstance(d, _ImgFile) and size >= 0 and size != len(d.durable):
                out.append(f"'{p}': durable {len(d.durable)} of {size} bytes ({self._sync_note(p)})")
        for p in sorted(durable_paths):
            if under(p) and p not in self.volatile:
                out.append(f"comes back: '{p}' was removed, {self._sync_note(os.path.dirname(p))}; ops: {self._history(p)}")
        if len(out) > limit:
            out = out[:limit] + [f"... {len(out) - limit} more"]
        return out


class FsModel:
    """Record file-system operations under ``root`` and keep their durable state.

    Use as a context manager; only one model can be active at a time.

    Attributes:
        root: the real path of the modelled directory.
        events: operations seen so far (changes and completed syncs).
        untracked: changes the model found on disk without having seen them
            (adopted conservatively: not durable until fsynced).
        errors: failures of the model's own bookkeeping (never raised to the caller).
    """

    _active: FsModel | None = None
    _active_lock = threading.Lock()

    def __init__(self, root: str | os.PathLike[str], *, verify: bool = True) -> None:
        self.root = os.path.realpath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise ModelError(f"{self.root} is not a directory")
        self.verify = verify
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._fds: dict[int, Open] = {}
        self._root = self._new(True)
        self.events = 0
        self.ops: list[Op] = []
        self.untracked: list[str] = []
        self.errors: list[str] = []
        self._triggers: list[tuple[int, Callable[[FsModel], None]]] = []
        self._matchers: list[tuple[Callable[[Op], bool], Callable[[FsModel], None]]] = []
        self._saved: list[tuple[Any, str, Any]] = []
        self._orig: dict[str, Any] = {}
        self.counts: dict[str, int] = {}

    # -- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> FsModel:
        with FsModel._active_lock:
            if FsModel._active is not None:
                raise ModelError("another FsModel is active")
            FsModel._active = self
        try:
            self._scan(self._root, self.root)
            self._install()
        except BaseException:
            self._uninstall()
            FsModel._active = None
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._uninstall()
        finally:
            with FsModel._active_lock:
                FsModel._active = None

    def _install(self) -> None:
        wrappers = {
            "open": self._w_open, "write": self._w_write, "pwrite": self._w_pwrite,
            "writev": self._w_writev, "ftruncate": self._w_ftruncate, "truncate": self._w_truncate,
            "fsync": self._w_fsync, "fdatasync": self._w_fdatasync, "close": self._w_close,
            "replace": self._w_replace, "rename": self._w_rename, "unlink": self._w_unlink,
            "remove": self._w_remove, "mkdir": self._w_mkdir, "rmdir": self._w_rmdir,
            "link": self._w_link, "symlink": self._w_symlink, "dup": self._w_dup,
            "posix_fallocate": self._w_posix_fallocate,
        }
        for name, wrapper in wrappers.items():
            if hasattr(os, name):
                self._orig[name] = getattr(os, name)
        self._orig["builtin_open"] = builtins.open
        for name, wrapper in wrappers.items():
            if name in self._orig:
                self._patch(os, name, wrapper)
        self._patch(builtins, "open", self._w_builtin_open)
        self._patch(io, "open", self._w_builtin_open)

    def _patch(self, module: Any, name: str, value: Any) -> None:
        self._saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    def _uninstall(self) -> None:
        while self._saved:
            module, name, value = self._saved.pop()
            setattr(module, name, value)

    def _scan(self, node: _Inode, path: str) -> None:
        """Take the tree as it is now as durable (hard links share an inode)."""
        seen: dict[tuple[int, int], _Inode] = {}

        def scan(dnode: _Inode, dpath: str) -> None:
            for entry in sorted(os.scandir(dpath), key=lambda e: e.name):
                st = entry.stat(follow_symlinks=False)
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    child = seen[key]
                elif stat.S_ISDIR(st.st_mode):
                    child = self._new(True)
                    scan(child, entry.path)
                elif stat.S_ISREG(st.st_mode):
                    child = self._new(False)
                    with self._orig.get("builtin_open", builtins.open)(entry.path, "rb") as f:
                        content = f.read()
                    child.data = bytearray(content)
                    child.durable = content
                else:
                    self.untracked.append(f"at start: '{entry.path}' is neither a file nor a directory; left out")
                    continue
                seen[key] = child
                dnode.entries[entry.name] = child
            dnode.durable_entries = dict(dnode.entries)

        scan(node, path)

    # -- the model's own operations ------------------------------------------------------

    def _new(self, is_dir: bool) -> _Inode:
        return _Inode(next(self._ids), is_dir)

    def _rel(self, path: Any, dir_fd: int | None = None) -> tuple[str, str] | None:
        """``(absolute path, path relative to root)`` of a path argument, or None
        when it is outside the root (or not a path)."""
        if isinstance(path, int):
            return None
        p = os.fsdecode(os.fspath(path))
        if not os.path.isabs(p):
            base = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else os.getcwd()
            p = os.path.join(base, p)
        p = os.path.normpath(p)
        head, tail = os.path.split(p)
        full = os.path.join(os.path.realpath(head), tail) if tail else os.path.realpath(head)
        if full == self.root:
            return full, ""
        if full.startswith(self.root + _SEP):
            return full, full[len(self.root) + 1 :]
        return None

    def _lookup(self, rel: str) -> _Inode | None:
        node = self._root
        for part in rel.split(_SEP) if rel else ():
            if not node.is_dir:
                return None
            nxt = node.entries.get(part)
            if nxt is None:
                return None
            node = nxt
        return node

    def _parent(self, rel: str) -> tuple[_Inode, str]:
        """The volatile parent directory of ``rel`` (adopting it if the model never
        saw it being made) and the entry's name."""
        head, name = os.path.split(rel)
        parent = self._lookup(head)
        if parent is None or not parent.is_dir:
            parent = self._adopt(head)
        return parent, name

    def _adopt(self, rel: str) -> _Inode:
        """Something exists on disk that the model did not see made: take it in as
        new (nothing of it durable)."""
        existing = self._lookup(rel)
        if existing is not None:
            return existing
        full = os.path.join(self.root, rel) if rel else self.root
        st = os.lstat(full)
        parent, name = self._parent(rel)
        node = self._new(stat.S_ISDIR(st.st_mode))
        if node.is_dir:
            for entry in os.scandir(full):
                self._adopt(os.path.join(rel, entry.name))
        else:
            node.opaque = True
        parent.entries[name] = node
        parent.version += 1
        self.untracked.append(f"adopted '{rel}' ({'directory' if node.is_dir else 'file'}) made without the model seeing it")
        return node

    def _log(self, op: str, rel: str, ident: int, detail: str = "") -> None:
        self.events += 1
        self.counts[op] = self.counts.get(op, 0) + 1
        self.ops.append(Op(self.events, op, rel, ident, detail))
        due = []
        while self._triggers and self.events >= self._triggers[0][0]:
            due.append(self._triggers.pop(0)[1])
        if self._matchers:
            op_ = self.ops[-1]
            for pair in list(self._matchers):
                try:
                    hit = pair[0](op_)
                except Exception as exc:
                    hit = False
                    self.errors.append(f"trigger_on matcher failed at #{self.events}: {exc!r}")
                if hit:
                    self._matchers.remove(pair)
                    due.append(pair[1])
        for action in due:
            try:
                action(self)
            except Exception as exc:  # never into the broker
                self.errors.append(f"trigger at #{self.events} failed: {exc!r}")

    def _fail(self, where: str, exc: BaseException) -> None:
        self.errors.append(f"{where}: {exc!r}")

    def _tracked(self, fd: int) -> Open | None:
        """The record of ``fd`` if it is still the file it was when opened."""
        o = self._fds.get(fd)
        if o is None:
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) != (o.dev, o.ino):
            del self._fds[fd]  # closed behind our back and reused
            return None
        return o

    def _read_real(self, fd: int) -> bytes:
        orig_open, orig_close = self._orig["open"], self._orig["close"]
        rfd = orig_open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            pos = 0
            while True:
                chunk = os.pread(rfd, 1 << 20, pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos += len(chunk)
            return b"".join(chunks)
        finally:
            orig_close(rfd)

    @staticmethod
    def _bytes(data: Any) -> memoryview:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            try:
                view = view.cast("B")
            except TypeError:
                view = memoryview(bytes(view))
        return view

    def _put(self, node: _Inode, pos: int, chunk: memoryview) -> None:
        data = node.data
        if pos > len(data):
            data.extend(bytes(pos - len(data)))
        data[pos : pos + len(chunk)] = chunk
        node.version += 1

    def _resize(self, node: _Inode, size: int) -> None:
        data = node.data
        if size < len(data):
            del data[size:]
        else:
            data.extend(bytes(size - len(data)))
        node.version += 1

    # -- wrapped: opening and closing -------------------------------------------------------

    def _w_open(self, *args: Any, **kwargs: Any) -> int:
        orig = self._orig["open"]
        try:
            path = args[0] if args else kwargs["path"]
            flags = args[1] if len(args) > 1 else kwargs["flags"]
            where = self._rel(path, kwargs.get("dir_fd"))
        except Exception:
            where = None
        if where is None:
            fd = orig(*args, **kwargs)
            self._fds.pop(fd, None)
            return fd
        full, rel = where
        with self._lock:
            existed = os.path.lexists(full)
            fd = orig(*args, **kwargs)
            try:
                self._opened(fd, full, rel, existed, flags & os.O_CREAT != 0, flags & os.O_TRUNC != 0 and flags & os.O_ACCMODE != os.O_RDONLY, flags & os.O_APPEND != 0, opaque=False)
            except Exception as exc:
                self._fds.pop(fd, None)
                self._fail(f"open {rel}", exc)
            return fd

    def _opened(self, fd: int, full: str, rel: str, existed: bool, create: bool, trunc: bool, append: bool, opaque: bool) -> None:
        st = os.fstat(fd)
        node = self._lookup(rel)
        if node is not None and not existed:
            self.untracked.append(f"'{rel}' was removed without the model seeing it")
            node = None
        if node is None:
            if existed:
                node = self._adopt(rel)
            else:
                parent, name = self._parent(rel)
                node = self._new(stat.S_ISDIR(st.st_mode))
                parent.entries[name] = node
                parent.version += 1
                self._log("create", rel, node.ident)
        if not node.is_dir:
            if trunc and (node.data or node.opaque):
                node.data.clear()
                node.version += 1
                self._log("truncate", rel, node.ident, "O_TRUNC")
            if opaque:
                node.opaque = True
        self._fds[fd] = Open(node, rel, append, st.st_dev, st.st_ino)

    def _w_builtin_open(self, *args: Any, **kwargs: Any) -> Any:
        orig = self._orig["builtin_open"]
        try:
            file = args[0] if args else kwargs["file"]
            mode = args[1] if len(args) > 1 else kwargs.get("mode", "r")
            writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            where = self._rel(file) if writing else None
        except Exception:
            where = None
        if where is None:
            return orig(*args, **kwargs)
        full, rel = where
        with self._lock:
            existed = os.path.lexists(full)
            f = orig(*args, **kwargs)
            try:
                self._opened(f.fileno(), full, rel, existed, True, "w" in mode, "a" in mode, opaque=True)
            except Exception as exc:
                self._fail(f"open() {rel}", exc)
            return f

    def _w_close(self, fd: int) -> None:
        if fd not in self._fds:
            return self._orig["close"](fd)
        with self._lock:
            self._fds.pop(fd, None)
            return self._orig["close"](fd)

    def _w_dup(self, fd: int) -> int:
        new = self._orig["dup"](fd)
        with self._lock:
            o = self._fds.get(fd)
            if o is not None:
                self._fds[new] = o
            else:
                self._fds.pop(new, None)
        return new

    # -- wrapped: writing ------------------------------------------------------------------

    def _write_at(self, fd: int, data: Any, call: Callable[[], int], offset: int | None, op: str) -> int:
        if fd not in self._fds:
            return call()
        with self._lock:
            o = self._tracked(fd)
            if o is None or o.inode.is_dir or o.inode.opaque:
                return call()
            try:
                if o.append:
                    pos = os.fstat(fd).st_size
                elif offset is None:
                    pos = os.lseek(fd, 0, os.SEEK_CUR)
                else:
                    pos = offset
                view = self._bytes(data)
            except Exception as exc:
                self._fail(f"{op} {o.rel}", exc)
                o.inode.opaque = True
                return call()
            n = call()
            try:
                self._put(o.inode, pos, view[:n])
                self._log(op, o.rel, o.inode.ident, f"{n}@{pos}")
            except Exception as exc:
                o.inode.opaque = True
                self._fail(f"{op} {o.rel}", exc)
            return n

    def _w_write(self, fd: int, data: Any) -> int:
        return self._write_at(fd, data, lambda: self._orig["write"](fd, data), None, "write")

    def _w_pwrite(self, fd: int, data: Any, offset: int) -> int:
        return self._write_at(fd, data, lambda: self._orig["pwrite"](fd, data, offset), offset, "pwrite")

    def _w_writev(self, fd: int, buffers: Any) -> int:
        if fd not in self._fds:
            return self._orig["writev"](fd, buffers)
        buffers = list(buffers)
        joined = b"".join(bytes(self._bytes(b)) for b in buffers)
        return self._write_at(fd, joined, lambda: self._orig["writev"](fd, buffers), None, "writev")

    def _w_ftruncate(self, fd: int, length: int) -> None:
        if fd not in self._fds:
            return self._orig["ftruncate"](fd, length)
        with self._lock:
            o = self._tracked(fd)
            result = self._orig["ftruncate"](fd, length)
            if o is not None and not o.inode.is_dir and not o.inode.opaque:
                try:
                    self._resize(o.inode, length)
                    self._log("ftruncate", o.rel, o.inode.ident, str(length))
                except Exception as exc:
                    self._fail(f"ftruncate {o.rel}", exc)
            return result

    def _w_posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        """Allocated space reads as zero bytes: a file that grows is zero-filled (its
        size, like written data, durable once the file is synced)."""
        if fd not in self._fds:
            return self._orig["posix_fallocate"](fd, offset, length)
        with self._lock:
            o = self._tracked(fd)
            result = self._orig["posix_fallocate"](fd, offset, length)
            if o is not None and not o.inode.is_dir and not o.inode.opaque and offset + length > len(o.inode.data):
                try:
                    self._resize(o.inode, offset + length)
                    self._log("fallocate", o.rel, o.inode.ident, f"{length}@{offset}")
                except Exception as exc:
                    self._fail(f"fallocate {o.rel}", exc)
            return result

    def _w_truncate(self, path: Any, length: int) -> None:
        if isinstance(path, int):
            return self._w_ftruncate(path, length)
        try:
            where = self._rel(path)
        except Exception:
            where = None
        if where is None:
            return self._orig["truncate"](path, length)
        with self._lock:
            result = self._orig["truncate"](path, length)
            try:
                node = self._lookup(where[1]) or self._adopt(where[1])
                if not node.opaque:
                    self._resize(node, length)
                self._log("truncate", where[1], node.ident, str(length))
            except Exception as exc:
                self._fail(f"truncate {where[1]}", exc)
            return result

    # -- wrapped: syncing --------------------------------------------------------------------

    def _w_fsync(self, fd: Any) -> None:
        return self._sync(fd, "fsync")

    def _w_fdatasync(self, fd: Any) -> None:
        return self._sync(fd, "fdatasync")

    def _sync(self, fd: Any, op: str) -> None:
        orig = self._orig[op]
        if not isinstance(fd, int):
            try:
                fd_num = fd.fileno()
            except Exception:
                return orig(fd)
        else:
            fd_num = fd
        if fd_num not in self._fds:
            return orig(fd)
        with self._lock:
            o = self._tracked(fd_num)
            if o is None:
                snap = None
            else:
                try:
                    snap = self._capture(fd_num, o)
                except Exception as exc:
                    self._fail(f"{op} {o.rel}", exc)
                    snap = None
        result = orig(fd)  # not under the lock: other threads go on meanwhile
        if o is None or snap is None:
            return result
        with self._lock:
            try:
                current = self._fds.get(fd_num)
                if current is o or current is None:
                    node = o.inode
                    version, content = snap
                    if version >= node.durable_version:
                        node.durable_version = version
                        if node.is_dir:
                            node.durable_entries = content
                        else:
                            node.durable = content
                    node.last_sync_event = self.events + 1
                self._log(op, o.rel, o.inode.ident)
            except Exception as exc:
                self._fail(f"{op} {o.rel}", exc)
        return result

    def _capture(self, fd: int, o: Open) -> tuple[int, Any]:
        """What a sync of ``fd`` starting now makes durable: ``(version, content)``,
        checked against the disk (a mismatch is recorded and the disk wins)."""
        node = o.inode
        if node.is_dir:
            real = set(os.listdir(fd)) if self.verify else None
            if real is not None:
                for name in sorted(real - set(node.entries)):
                    self._adopt(os.path.join(o.rel, name))
                for name in sorted(set(node.entries) - real):
                    self.untracked.append(f"'{os.path.join(o.rel, name)}' was removed without the model seeing it")
                    del node.entries[name]
                    node.version += 1
            return node.version, dict(node.entries)
        if node.opaque:
            node.version += 1
            return node.version, self._read_real(fd)
        if self.verify:
            real_bytes = self._read_real(fd)
            if real_bytes != node.data:
                self.untracked.append(
                    f"'{o.rel}' on disk ({len(real_bytes)} bytes) differs from the model ({len(node.data)} bytes): "
                    "written without the model seeing it; the disk's content is used"
                )
                node.data = bytearray(real_bytes)
                node.version += 1
            return node.version, real_bytes
        return node.version, bytes(node.data)

    # -- wrapped: names ----------------------------------------------------------------------

    def _names(self, op: str, call: Callable[[], Any], apply: Callable[[], None], *paths: tuple[Any, int | None]) -> Any:
        try:
            wheres = [self._rel(p, d) for p, d in paths]
        except Exception:
            wheres = [None]
        if all(w is None for w in wheres):
            return call()
        with self._lock:
            result = call()
            try:
                apply_with = apply(*wheres)  # type: ignore[func-returns-value]
                del apply_with
            except Exception as exc:
                self._fail(f"{op} {wheres}", exc)
            return result

    def _unlinked(self, op: str, where: tuple[str, str] | None) -> None:
        if where is None:
            return
        rel = where[1]
        parent, name = self._parent(rel)
        node = parent.entries.pop(name, None)
        if node is None:
            self.untracked.append(f"{op} '{rel}': the model did not know it")
        parent.version += 1
        self._log(op, rel, node.ident if node else 0)

    def _w_unlink(self, path: Any, *, dir_fd: int | None = None) -> None:
        return self._names(
            "unlink", lambda: self._orig["unlink"](path, dir_fd=dir_fd), lambda w: self._unlinked("unlink", w), (path, dir_fd)
        )

    def _w_remove(self, path: Any, *, dir_fd: int | None = None) -> None:
        return self._names(
            "unlink", lambda: self._orig["remove"](path, dir_fd=dir_fd), lambda w: self._unlinked("unlink", w), (path, dir_fd)
        )

    def _w_rmdir(self, path: Any, *, dir_fd: int | None = None) -> None:
        return self._names(
            "rmdir", lambda: self._orig["rmdir"](path, dir_fd=dir_fd), lambda w: self._unlinked("rmdir", w), (path, dir_fd)
        )

    def _w_mkdir(self, path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        def apply(w: tuple[str, str] | None) -> None:
            if w is None:
                return
            parent, name = self._parent(w[1])
            node = self._new(True)
            parent.entries[name] = node
            parent.version += 1
            self._log("mkdir", w[1], node.ident)

        return self._names("mkdir", lambda: self._orig["mkdir"](path, mode, dir_fd=dir_fd), apply, (path, dir_fd))

    def _moved(self, op: str, src: tuple[str, str] | None, dst: tuple[str, str] | None, keep_src: bool) -> None:
        node = None
        if src is not None:
            sparent, sname = self._parent(src[1])
            node = sparent.entries.get(sname)
            if not keep_src and node is not None:
                del sparent.entries[sname]
                sparent.version += 1
        if dst is not None:
            if node is None:
                node = self._adopt(dst[1])  # came from outside the root, or unknown
            else:
                dparent, dname = self._parent(dst[1])
                if dparent.entries.get(dname) is not node:
                    dparent.entries[dname] = node
                    dparent.version += 1
        self._log(op, dst[1] if dst is not None else src[1] if src is not None else "", node.ident if node else 0,
                  f"from {src[1] if src is not None else '(outside)'} to {dst[1] if dst is not None else '(outside)'}")

    def _w_replace(self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        return self._names(
            "rename", lambda: self._orig["replace"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd),
            lambda s, d: self._moved("rename", s, d, False), (src, src_dir_fd), (dst, dst_dir_fd),
        )

    def _w_rename(self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        return self._names(
            "rename", lambda: self._orig["rename"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd),
            lambda s, d: self._moved("rename", s, d, False), (src, src_dir_fd), (dst, dst_dir_fd),
        )

    def _w_link(self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None, follow_symlinks: bool = True) -> None:
        return self._names(
            "link",
            lambda: self._orig["link"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=follow_symlinks),
            lambda s, d: self._moved("link", s, d, True), (src, src_dir_fd), (dst, dst_dir_fd),
        )

    def _w_symlink(self, src: Any, dst: Any, target_is_directory: bool = False, *, dir_fd: int | None = None) -> None:
        def apply(w: tuple[str, str] | None) -> None:
            if w is not None:
                self.untracked.append(f"symlink '{w[1]}' is not modelled (left out of crash images)")

        return self._names(
            "symlink", lambda: self._orig["symlink"](src, dst, target_is_directory, dir_fd=dir_fd), apply, (dst, dir_fd)
        )

    # -- snapshots ---------------------------------------------------------------------

    def trigger_after(self, n: int, action: Callable[[FsModel], None]) -> None:
        """Call ``action(model)`` right after the operation that brings
        :attr:`events` to ``n`` (at once if it is there already), from whatever
        thread made it and under the model's lock: nothing becomes durable while it
        runs. It must not block, and must not call into trio."""
        with self._lock:
            if self.events >= n:
                action(self)
                return
            self._triggers.append((n, action))
            self._triggers.sort(key=lambda t: t[0])

    def trigger_on(self, match: Callable[[Op], bool], action: Callable[[FsModel], None]) -> None:
        """Call ``action(model)`` right after the first operation for which
        ``match(op)`` is true (same rules as :meth:`trigger_after`)."""
        with self._lock:
            self._matchers.append((match, action))

    def snapshot(self, extra: Callable[[], Any] | None = None) -> CrashState:
        """What a power loss now leaves (thread-safe). ``extra()`` runs under the
        lock and its result is kept in :attr:`CrashState.extra`."""
        with self._lock:
            visiting: set[int] = set()

            def img(node: _Inode, rel: str) -> _ImgDir:
                if node.ident in visiting:
                    raise ModelError(f"directory cycle at '{rel}'")
                visiting.add(node.ident)
                out: dict[str, _ImgFile | _ImgDir] = {}
                for name, child in node.durable_entries.items():
                    crel = f"{rel}{_SEP}{name}" if rel else name
                    if child.is_dir:
                        out[name] = img(child, crel)
                    else:
                        tail, at = b"", -1
                        if not child.opaque and len(child.data) > len(child.durable) and child.data.startswith(child.durable):
                            tail = bytes(child.data[len(child.durable) :])
                        elif not child.opaque and child.data != child.durable:
                            tail, at = _over_zeros(child.durable, child.data)
                        out[name] = _ImgFile(child.ident, child.durable, tail, len(child.data), child.last_sync_event, at)
                visiting.discard(node.ident)
                return _ImgDir(node.ident, out, node.last_sync_event)

            durable = img(self._root, "")
            volatile: dict[str, tuple[int, int]] = {"": (self._root.ident, -1)}

            def vol(node: _Inode, rel: str, depth: int) -> None:
                if depth > 256:
                    return
                for name, child in node.entries.items():
                    crel = f"{rel}{_SEP}{name}" if rel else name
                    volatile[crel] = (child.ident, -1 if child.is_dir else -2 if child.opaque else len(child.data))
                    if child.is_dir:
                        vol(child, crel, depth + 1)

            vol(self._root, "", 0)
            return CrashState(self.events, durable, volatile, list(self.ops), extra() if extra is not None else None)

    def crash_image(self, dest: str | os.PathLike[str], *, torn: bool = False, seed: int = 0) -> Path:
        """Write what a power loss now would leave to ``dest``."""
        return self.snapshot().materialize(dest, torn=torn, seed=seed)

    def differences(self) -> list[str]:
        """Where the model's volatile tree differs from the disk now (names, kinds,
        and the content of files the model follows): empty when it saw everything."""
        out: list[str] = []
        with self._lock:

            def walk(node: _Inode, full: str, rel: str) -> None:
                try:
                    real = {e.name: e for e in os.scandir(full)}
                except OSError as exc:
                    out.append(f"'{rel}': {exc}")
                    return
                for name in sorted(set(real) | set(node.entries)):
                    crel = os.path.join(rel, name)
                    child = node.entries.get(name)
                    entry = real.get(name)
                    if child is None:
                        out.append(f"'{crel}' is on disk, not in the model")
                    elif entry is None:
                        out.append(f"'{crel}' is in the model, not on disk")
                    elif child.is_dir != entry.is_dir(follow_symlinks=False):
                        out.append(f"'{crel}' differs in kind")
                    elif child.is_dir:
                        walk(child, entry.path, crel)
                    elif not child.opaque:
                        with self._orig["builtin_open"](entry.path, "rb") as f:
                            if f.read() != child.data:
                                out.append(f"'{crel}' differs in content")

            walk(self._root, self.root, "")
        return out

    def pending(self) -> list[str]:
        """What a power loss now would lose or bring back (for messages)."""
        return self.snapshot().diff()
