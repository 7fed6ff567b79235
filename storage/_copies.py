"""A small JSON document kept as two checksummed copies: the catalog and the export
manifest.

Neither can be rebuilt from anything else, so one damaged write must not lose
them. Each save writes the whole document twice, one copy after the other, each
with :func:`storage.atomic_write` (temporary file, fsync, rename, fsync the
directory), both carrying the same *generation* (a counter that grows by one per
save). A copy is a JSON object, sorted keys, one space of indent, ASCII only, and a
final newline, so operators can read it::

    {
     "crc32": 2775730611,
     "format": "ttlbroker.catalog",
     "generation": 12,
     "streams": [...],
     "version": 1
    }

``crc32`` is the CRC-32 (zlib) of the same object *without* the ``crc32`` key,
serialised compactly (``json.dumps(obj, sort_keys=True, separators=(",", ":"))``,
ASCII): it covers the generation and the format too. A copy is valid when it
parses, names the expected format, its checksum matches, and its bytes are exactly
the rendering of its content (so even a change that leaves the JSON meaning intact,
such as a hex digit's case in a ``\\u`` escape, is seen).

On load the valid copy with the highest generation wins. An invalid copy is
reported (one :class:`Damage` each, with the first byte where it differs from the
good copy when they share a generation), its bytes are kept aside in the
quarantine folder, and it is rewritten from the good copy. A valid copy one
generation behind is what a crash between the two writes leaves: it is brought up
to date without a report.

When neither copy is valid but both hold the same write damaged in different places
(a flipped bit in one, a zeroed page or a cut in the other), the document is rebuilt
from their intact parts: each run of bytes where they differ is taken from one copy
or the other, and a combination is accepted only if it passes the checksum and the
canonical form (at most 256 are tried); both copies are reported, kept aside and
rewritten. Otherwise :class:`CopiesUnreadable` says why for each file, and the
caller decides (the broker refuses to start, the export pauses).

A document from before this format (the same JSON without ``crc32``,
``generation`` and ``format``) loads as generation 0, unverified, and is rewritten
in the new format.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._damage import Damage, Report
from ._errors import StorageFailure
from ._files import atomic_write

__all__ = ["Copies", "CopiesUnreadable", "render"]

_ENVELOPE = ("crc32", "format", "generation")
#: When both copies are damaged: the most runs of differing bytes tried both ways,
#: and the shortest run of equal bytes that separates two runs.
_MAX_RUNS = 8
_GAP = 8


class CopiesUnreadable(StorageFailure):
    """No copy of a document is valid.

    Attributes:
        reasons: ``(path, what is wrong with it)`` for each copy.
    """

    def __init__(self, message: str, reasons: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.reasons = reasons

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message, self.reasons))


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def render(fmt: str, generation: int, body: dict[str, Any]) -> bytes:
    """The bytes of one copy of ``body`` at ``generation``."""
    doc = {k: v for k, v in body.items() if k not in _ENVELOPE}
    doc["format"] = fmt
    doc["generation"] = generation
    doc["crc32"] = zlib.crc32(_canonical({k: v for k, v in doc.items() if k != "crc32"}))
    return (json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()


@dataclass
class _Copy:
    path: str
    status: str  # "ok", "legacy", "invalid", "missing"
    raw: bytes = b""
    generation: int = -1
    body: dict[str, Any] | None = None
    detail: str = ""
    position: int | None = None


class Copies:
    """One document in two copies (``path`` and ``path + ".1"``).

    Args:
        path: the first copy; the second is ``path + ".1"``.
        fmt: the document's format name (``ttlbroker.catalog``); a copy naming
            another format is invalid.
        kind: the :class:`Damage` kind reported (``catalog``, ``export_manifest``).
        report: where damage goes.
        keep_aside: ``path -> where`` copies a damaged copy into the quarantine
            folder before it is rewritten; returns where it went.
        legacy: tells whether a parsed object without envelope is a document of
            the old format (then it loads as generation 0).
    """

    def __init__(
        self,
        path: str,
        fmt: str,
        kind: str,
        report: Report,
        keep_aside: Callable[[str], str],
        legacy: Callable[[dict[str, Any]], bool] = lambda obj: False,
    ) -> None:
        self.paths = (path, path + ".1")
        self.fmt = fmt
        self.kind = kind
        self.report = report
        self.keep_aside = keep_aside
        self.legacy = legacy
        self.generation = 0
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------

    def _read(self, path: str) -> _Copy:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return _Copy(path, "missing")
        except OSError as exc:
            return _Copy(path, "invalid", detail=f"cannot be read ({os.strerror(exc.errno or 0)})")
        return self._check(path, raw)

    def _check(self, path: str, raw: bytes) -> _Copy:
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError as exc:
            return _Copy(path, "invalid", raw, detail="holds a byte that is not ASCII", position=exc.start)
        try:
            obj = json.loads(text)
        except ValueError as exc:
            pos = getattr(exc, "pos", None)
            what = "is empty" if not raw else f"is not valid JSON ({exc})"
            return _Copy(path, "invalid", raw, detail=what, position=pos)
        if not isinstance(obj, dict):
            return _Copy(path, "invalid", raw, detail="is not a JSON object", position=0)
        if not any(k in obj for k in _ENVELOPE):
            if self.legacy(obj):
                return _Copy(path, "legacy", raw, 0, obj)
            return _Copy(path, "invalid", raw, detail="has no checksum and is not a document of the previous format")
        crc = obj.get("crc32")
        gen = obj.get("generation")
        if obj.get("format") != self.fmt or type(crc) is not int or type(gen) is not int or gen < 0:
            return _Copy(path, "invalid", raw, detail="has a damaged envelope (format, generation or crc32)")
        if zlib.crc32(_canonical({k: v for k, v in obj.items() if k != "crc32"})) != crc:
            return _Copy(path, "invalid", raw, detail="fails its checksum (its content changed after it was written)")
        body = {k: v for k, v in obj.items() if k not in _ENVELOPE}
        if render(self.fmt, gen, body) != raw:
            return _Copy(path, "invalid", raw, gen, body, detail="differs from the canonical form of its checksummed content")
        return _Copy(path, "ok", raw, gen, body)

    def load(self, readonly: bool = False) -> dict[str, Any] | None:
        """The newest valid content (None: no copy exists), after reporting and
        rewriting any copy that is damaged, missing or behind.

        Blocking (file I/O). ``readonly`` (``ttlbroker check``): report the same
        damage, keep nothing aside and write nothing.

        Raises:
            CopiesUnreadable: copies exist but none is valid.
            StorageFailure: a rewrite failed.
        """
        copies = [self._read(p) for p in self.paths]
        valid = [c for c in copies if c.status in ("ok", "legacy")]
        if not valid:
            if all(c.status == "missing" for c in copies):
                return None
            merged = self._merge(copies[0].raw, copies[1].raw) if all(c.raw for c in copies) else None
            if merged is not None:
                return self._use_merged(copies, merged, readonly)
            reasons = [(c.path, "missing" if c.status == "missing" else c.detail) for c in copies]
            text = "; ".join(f"{os.path.basename(p)} {why}" for p, why in reasons)
            raise CopiesUnreadable(f"no valid copy: {text}", reasons)
        # Highest generation; a verified copy before a legacy one; the first path on a tie.
        best = max(valid, key=lambda c: (c.generation, c.status == "ok", -copies.index(c)))
        assert best.body is not None
        self.generation = best.generation
        good = render(self.fmt, max(1, best.generation), best.body)
        source = f"{os.path.basename(best.path)} (generation {best.generation})"
        rewritten = f"left as is (check); the next start rewrites it from {source}" if readonly else f"rewritten from {source}"

        def kept(c: _Copy) -> str:
            return "" if readonly or not c.raw else f"kept aside as {self.keep_aside(c.path)}; "

        rewrite = []
        for c in copies:
            if c is best:
                continue
            if c.status == "invalid":
                pos = c.position
                if pos is None and len(c.raw) == len(good):
                    pos = next((i for i, (a, b) in enumerate(zip(c.raw, good)) if a != b), None)
                self.report(Damage(self.kind, c.path, pos, f"copy {c.detail}", kept(c) + rewritten))
            elif c.status == "missing" and best.status == "ok":
                self.report(Damage(self.kind, c.path, None, "copy is missing", rewritten))
            elif c.status == "ok" and c.generation == best.generation and c.body != best.body:
                self.report(Damage(
                    self.kind, c.path, None, f"copy differs from {os.path.basename(best.path)} at the same generation",
                    kept(c) + rewritten,
                ))
            elif c.raw == good:
                continue
            # Damaged, missing, or a valid copy behind (what a crash between the two
            # writes leaves, not damage).
            rewrite.append(c.path)
        if best.status == "legacy":
            # Upgrade: the other copy first, so a crash in between leaves the legacy
            # file and a verified copy of the same content.
            rewrite.append(best.path)
        if readonly:
            return best.body
        for path in rewrite:
            self._write(path, good)
        self.generation = max(1, best.generation) if best.status == "legacy" else best.generation
        return best.body

    def _merge(self, a: bytes, b: bytes) -> _Copy | None:
        """Two damaged copies of the same write, damaged in different places: the
        copy made of each run of bytes where they differ taken from one or the
        other, if exactly such a combination passes the checksum and the canonical
        form (a zeroed page in one and a flipped bit in the other, say). Nothing is
        guessed: a combination is accepted only when it verifies, and at most
        ``2 ** _MAX_RUNS`` are tried."""
        n = max(len(a), len(b))
        short = min(len(a), len(b))
        runs: list[list[int]] = []
        for i in range(n):
            if i < short and a[i] == b[i]:
                continue
            if runs and i - runs[-1][1] < _GAP:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
        options = []
        for start, end in runs:
            opts = [x for x in (a, b) if end <= len(x)]
            if not opts:
                return None
            options.append(opts)
        if sum(len(o) > 1 for o in options) > _MAX_RUNS:
            return None
        longer = a if len(a) >= len(b) else b
        for choice in itertools.product(*options):
            out = bytearray(longer)
            for (start, end), src in zip(runs, choice):
                out[start:end] = src[start:end]
            c = self._check(self.paths[0], bytes(out))
            if c.status == "ok":
                return c
        return None

    def _use_merged(self, copies: list[_Copy], merged: _Copy, readonly: bool) -> dict[str, Any]:
        assert merged.body is not None
        if readonly:
            action = "left as is (check); the next start rebuilds both copies from their intact parts"
        else:
            action = "rebuilt from the intact parts of both copies (the result passes the checksum); rewritten"
        for c in copies:
            kept = "" if readonly else f"kept aside as {self.keep_aside(c.path)}; "
            self.report(Damage(self.kind, c.path, c.position, f"copy {c.detail}", kept + action))
        self.generation = merged.generation
        if not readonly:
            for path in self.paths:
                self._write(path, merged.raw)
        return merged.body

    # -- writing ---------------------------------------------------------------------

    def save(self, body: dict[str, Any]) -> int:
        """Write ``body`` as the next generation, both copies, one after the other
        (blocking). Returns the generation written.

        Raises:
            StorageFailure: a write failed; the copy not yet replaced still holds
                the previous generation.
        """
        with self._lock:
            gen = self.generation + 1
            data = render(self.fmt, gen, body)
            try:
                self._write(self.paths[0], data)
                self._write(self.paths[1], data)
            finally:
                # Never reuse a generation for other content, even after a failure.
                self.generation = gen
            return gen

    @staticmethod
    def _write(path: str, data: bytes) -> None:
        try:
            atomic_write(path, data)
        except OSError as exc:
            raise StorageFailure(f"cannot write {path}: {os.strerror(exc.errno or 0)}") from exc
