"""The catalog on disk: a checksummed snapshot in two copies and a journal of the
changes made since.

A change to one stream or topic must not cost a rewrite of every other one, or
creating the thousandth topic costs a hundred times the tenth. So a save appends
only what changed, as one entry of ``catalog.journal`` (and its mirror
``catalog.journal.1``, ``storage._journal``: checksummed entries, both copies
fdatasynced before the save returns); the whole document goes to ``catalog.json``
and ``catalog.json.1`` (``storage._copies``) only now and then:

* when the journal has grown past twice the snapshot (and at least
  :data:`COMPACT_MIN` bytes), so rewriting costs O(1) per change on average;
* when the data directory is closed (a clean stop leaves everything in
  ``catalog.json``, the file an operator reads and may mend by hand);
* at the first save of a new data directory.

A compaction writes the snapshot at the next generation (both copies, one after the
other), then replaces the journal with one snapshot entry that names that
generation: ``{"base": G}``. Every other entry is a change of the document as of
generation G::

    {"del": ["t/1/4"], "set": {"removing": [[1, 4]], "s/1": {...}, "t/1/3": {...}}}

The document is cut into *parts*: the top-level values (``next_stream_id``,
``removing``, ``version``), each stream without its topics (``s/<stream id>``) and each
topic (``t/<stream id>/<topic id>``). A save compares the new document with the
last one part by part (by identity first: an unchanged topic is the same object)
and records the parts set and deleted.

Loading reads the snapshot, then applies the journal's entries when the journal's
base is the snapshot's generation. A base older than the snapshot is what a crash
between a compaction's two steps leaves (the entries are already in the snapshot);
a newer base with changes after it means ``catalog.json`` was replaced (restored or
edited by hand) after changes it does not hold: the broker will not start on a
guess. Entries missing from both journal copies leave the same refusal: a lost
entry may have deleted a topic, and a deleted topic's messages must never be served
again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ._copies import Copies
from ._damage import Report
from ._durability import sync_fds
from ._errors import StorageFailure
from ._journal import Journal

__all__ = ["CatalogFiles", "CatalogJournalConflict", "COMPACT_MIN", "JOURNAL_NAME"]

JOURNAL_NAME = "catalog.journal"
#: The journal is folded into the snapshot once it is larger than twice the
#: snapshot and at least this many bytes.
COMPACT_MIN = 256 * 1024
_MISSING = object()


class CatalogJournalConflict(StorageFailure):
    """The journal cannot be applied to the snapshot (entries lost from both copies, or
    a snapshot older than the changes)."""


def _parts(doc: dict[str, Any]) -> dict[str, Any]:
    """The document cut into parts (values are the document's own objects)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key != "streams":
            out[key] = value
    for sd in doc.get("streams", ()):
        sid = sd["id"]
        out[f"s/{sid}"] = {k: v for k, v in sd.items() if k != "topics"}
        for td in sd.get("topics", ()):
            out[f"t/{sid}/{td['id']}"] = td
    return out


def _document(parts: dict[str, Any]) -> dict[str, Any]:
    """The document the parts make: streams by id, each stream's topics by id."""
    doc: dict[str, Any] = {}
    streams: dict[int, dict[str, Any]] = {}
    topics: dict[int, list[dict[str, Any]]] = {}
    for key, value in parts.items():
        if key.startswith("s/"):
            streams[int(key[2:])] = value
        elif key.startswith("t/"):
            sid = int(key[2:].split("/", 1)[0])
            topics.setdefault(sid, []).append(value)
        else:
            doc[key] = value
    doc["streams"] = [
        dict(streams[sid], topics=sorted(topics.get(sid, []), key=lambda t: t["id"])) for sid in sorted(streams)
    ]
    orphans = set(topics) - set(streams)
    if orphans:
        raise CatalogJournalConflict(f"the catalog journal names topics of streams it does not hold ({sorted(orphans)})")
    return doc


class CatalogFiles:
    """``catalog.json`` (+ ``.1``) and ``catalog.journal`` (+ ``.1``) in ``root``.

    Args:
        copies: the snapshot's two copies.
        root: the data directory.
        report: where damage goes.
        keep_aside: copies a damaged file into the quarantine folder.
    """

    def __init__(self, copies: Copies, root: str, report: Report, keep_aside: Callable[[str], str]) -> None:
        self.copies = copies
        self.journal_path = os.path.join(root, JOURNAL_NAME)
        self.report = report
        self.keep_aside = keep_aside
        self._journal: Journal | None = None
        #: The parts of the document as last loaded or saved (None: no snapshot yet).
        self._parts: dict[str, Any] | None = None
        #: The keys of the top-level values among them.
        self._top_keys: list[str] = []
        self._snapshot_bytes = 0
        #: Entries appended since the last compaction.
        self.changes = 0

    def _set_parts(self, parts: dict[str, Any]) -> None:
        self._parts = parts
        self._top_keys = [k for k in parts if "/" not in k]

    @property
    def paths(self) -> tuple[str, ...]:
        return self.copies.paths

    @property
    def journal_paths(self) -> tuple[str, str]:
        return (self.journal_path, self.journal_path + ".1")

    def load(self, readonly: bool = False) -> dict[str, Any] | None:
        """The catalog (None: none was ever saved). Blocking.

        Raises:
            CopiesUnreadable: no snapshot copy is valid.
            CatalogJournalConflict: the journal cannot be applied (see the module).
        """
        body = self.copies.load(readonly)
        gen = self.copies.generation
        journal = Journal(
            self.journal_path, self.report, self.keep_aside, readonly, kind="catalog_journal",
            gap_action="the broker will not start: a lost entry may have deleted a stream or topic",
        )
        try:
            doc = self._apply(body, gen, journal)
        except BaseException:
            journal.close()
            raise
        if readonly:
            journal.close()
            return doc
        self._journal = journal
        if doc is None:
            return None
        self._set_parts(_parts(doc))
        self._snapshot_bytes = os.path.getsize(self.copies.paths[0]) if os.path.exists(self.copies.paths[0]) else 0
        if self.changes:
            # Fold now: the running broker starts from one snapshot and an empty journal.
            self.compact(doc)
        elif self._base(journal) != self.copies.generation:
            # No journal yet (a new data directory's first save, or one written before
            # the journal existed), or one a compaction left behind: start it afresh.
            journal.compact(json.dumps({"base": self.copies.generation}).encode())
        return doc

    @staticmethod
    def _base(journal: Journal) -> int | None:
        if not journal.snapshot_first:
            return None
        base = json.loads(journal.payloads[0]).get("base")
        return base if isinstance(base, int) else None

    def _apply(self, body: dict[str, Any] | None, gen: int, journal: Journal) -> dict[str, Any] | None:
        names = " and ".join(os.path.basename(p) for p in self.journal_paths)
        if journal.gaps:
            raise CatalogJournalConflict(
                f"entries of {names} are missing from both copies (a lost entry may have deleted a stream or topic)"
            )
        if not journal.payloads:
            self.changes = 0
            return body
        if not journal.snapshot_first:
            raise CatalogJournalConflict(f"{names} does not start with the generation it follows")
        try:
            base = self._base(journal)
            entries = [json.loads(p) for p in journal.payloads[1:]]
        except ValueError as exc:
            raise CatalogJournalConflict(f"an entry of {names} is not valid JSON ({exc})") from None
        if base is None:
            raise CatalogJournalConflict(f"{names} does not name the generation it follows")
        if base < gen or not entries:
            self.changes = 0
            return body  # folded into the snapshot already (or nothing to apply)
        if base > gen or body is None:
            have = "no catalog.json" if body is None else f"catalog.json at generation {gen}"
            raise CatalogJournalConflict(
                f"{names} holds {len(entries)} change(s) made after generation {base} of the catalog, but there is "
                f"{have} (restored or edited after those changes)"
            )
        parts = _parts(body)
        for entry in entries:
            for key in entry.get("del", ()):
                parts.pop(key, None)
            parts.update(entry.get("set", {}))
        self.changes = len(entries)
        return _document(parts)

    def save(self, doc: dict[str, Any]) -> None:
        """Record ``doc`` as the catalog: the parts that changed as one journal entry,
        durable on return; now and then the whole document (see the module).
        Blocking.

        Raises:
            StorageFailure: a write failed.
        """
        if self._journal is None:
            raise StorageFailure("the catalog was not loaded before a save")
        old = self._parts
        if old is None:
            self.compact(doc)
            return
        new = _parts(doc)
        changed = {k: v for k, v in new.items() if (o := old.get(k, _MISSING)) is not v and o != v}
        gone = [k for k in old if k not in new]
        if not changed and not gone:
            return
        self._append({"del": gone, "set": changed})
        self._set_parts(new)
        self._after_append(lambda: doc)

    def save_change(
        self, top: dict[str, Any], streams: list[dict[str, Any]], topics: list[tuple[int, dict[str, Any]]],
        doc: Callable[[], dict[str, Any]],
    ) -> None:
        """Record a change that touched only ``streams`` (each without its topics) and
        ``topics`` (``(stream id, topic)``), given with every top-level value of the
        document (``top``: they are small, and compared whole): what :meth:`save`
        records for such a change, in a time that does not grow with the catalog (a
        compaction, when due, writes the document the saved parts make). ``doc``
        makes the whole document for a first save (no snapshot yet). Blocking.

        Raises:
            StorageFailure: a write failed.
        """
        old = self._parts
        if old is None or self._journal is None:
            self.save(doc())
            return
        touched: dict[str, Any] = {**top}
        for sd in streams:
            assert "topics" not in sd, sd
            touched[f"s/{sd['id']}"] = sd
        for sid, td in topics:
            touched[f"t/{sid}/{td['id']}"] = td
        changed = {k: v for k, v in touched.items() if (o := old.get(k, _MISSING)) is not v and o != v}
        gone = [k for k in self._top_keys if k not in top]  # (a top-level value left out: removed)
        if not changed and not gone:
            return
        self._append({"del": gone, "set": changed})
        old.update(changed)  # (only once the entry is durable: a failed save leaves the parts as saved)
        for k in gone:
            del old[k]
        self._top_keys = list(top)
        self._after_append(lambda: _document(old))

    def _append(self, entry: dict[str, Any]) -> None:
        """Append one change entry to the journal, durably."""
        assert self._journal is not None
        payload = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        self._journal.append(payload.encode())
        try:
            sync_fds(self._journal.take_dirty_fds())
        except OSError as exc:
            raise StorageFailure(f"cannot sync {self.journal_path}: {os.strerror(exc.errno or 0)}") from exc

    def _after_append(self, doc: Callable[[], dict[str, Any]]) -> None:
        assert self._journal is not None
        self.changes += 1
        if self._journal.size > max(COMPACT_MIN, 2 * self._snapshot_bytes):
            self.compact(doc())

    def compact(self, doc: dict[str, Any]) -> None:
        """Write ``doc`` as the next snapshot and start the journal after it."""
        assert self._journal is not None
        gen = self.copies.save(doc)
        self._journal.compact(json.dumps({"base": gen}).encode())
        self._set_parts(_parts(doc))
        self._snapshot_bytes = os.path.getsize(self.copies.paths[0])
        self.changes = 0

    def close(self, doc: dict[str, Any] | None = None) -> None:
        """Fold the journal into the snapshot (a clean stop) and close it. ``doc``:
        the catalog as it is now, when it may differ from the last save (a create's
        ``creating`` entry is dropped by the next save, and a stop is one)."""
        if self._journal is None:
            return
        try:
            if doc is not None and self._parts is not None and _parts(doc) != self._parts:
                self.compact(doc)
            elif self.changes and self._parts is not None:
                self.compact(_document(self._parts))
        finally:
            self._journal.close()
            self._journal = None
