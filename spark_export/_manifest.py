"""The export manifest: which segments are in the export directory, exactly once.

``DIR/_manifest.json`` maps each exported segment (by numeric ids: stream, topic,
partition, first offset) to its file. Files and the manifest change in an order that
makes every crash harmless:

1. the Parquet file is written under a temporary name (``*.parquet.tmp``) and synced;
2. it is renamed into place and the directory synced;
3. the manifest is rewritten (temporary file, sync, rename, directory sync).

A crash before 2 leaves a temporary file, removed on the next start. A crash between
2 and 3 leaves a file the manifest does not list; the next run exports the segment
again to the same name, replacing it with the same rows. So each segment ends up
exactly once, and no partial file is ever visible under a ``.parquet`` name. The
leading ``_`` keeps Spark, pyarrow and pandas from reading the manifest as data.

**Damage.** The manifest cannot be rebuilt from the broker's data (the cleaner
removes segments once they are exported), and losing an entry could make a segment
be exported twice, or its removal wait forever. So it is kept like the catalog
(``storage._copies``): two checksummed copies, ``_manifest.json`` and
``_manifest.json.1``, written one after the other with the same generation::

    {"crc32": ..., "format": "ttlbroker.export_manifest", "generation": N,
     "segments": {"<stream id>/<topic id>@<created>/<partition>/<first offset>": {...}},
     "topics": {"<stream id>/<topic id>@<created>": {"stream": name, "topic": name,
                "generation": <created>, "partitions": n, "message_expiry": seconds,
                "options": {...}, "recorded_at": unix time}},
     "version": 2}

``topics`` (version 2) keeps each exported topic's configuration as it was when its
latest segment was exported (the options map of topic details, its partition count
and max age), so that ``python -m spark_export load --create-topic`` can create the
topic again in an empty broker. A manifest of version 1 (no ``topics``) loads with
none recorded and is written as version 2 at the next export.

A damaged or missing copy is reported (kind ``export_manifest``), kept aside in
``DIR/_quarantine/`` and rewritten from the other: the list is exactly what it was.
A copy one generation behind (a crash between the two writes) lacks at most the last
segment, whose file the next pass rewrites under the same name. When neither copy is
valid nobody can tell which segments are exported: :class:`ManifestUnreadable` is
raised and the broker pauses the export (and keeps every segment from the cleaner)
until an operator restores the manifest. A manifest of the first format (the same
JSON without ``crc32``, ``generation`` and ``format``) loads and is rewritten in two
copies.
"""

from __future__ import annotations

import os
from typing import Any

from storage import Copies, CopiesUnreadable, Damage, Report, fsync_dir, ignore_damage, keep_aside

__all__ = ["Manifest", "MANIFEST_NAME", "ManifestUnreadable", "QUARANTINE_NAME", "makedirs_durably", "topics_by_name"]

MANIFEST_NAME = "_manifest.json"
QUARANTINE_NAME = "_quarantine"
_FORMAT = "ttlbroker.export_manifest"
_VERSION = 2
#: Versions this code reads: 1 (no ``topics``) and 2.
_READS = (1, 2)


class ManifestUnreadable(Exception):
    """No copy of the manifest is valid: which segments are exported is unknown.

    Attributes:
        message: one line naming the files and what to do.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def makedirs_durably(path: str) -> None:
    """Create ``path`` and its missing parents, fsyncing each parent whose entries
    changed, so an export acknowledged after this survives a power loss on any POSIX
    file system. The mode is the process's default (the export is for other readers
    too, unlike the data directory)."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        makedirs_durably(parent)
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    fsync_dir(parent)


def _is_legacy(obj: dict[str, Any]) -> bool:
    return obj.get("version") == 1 and isinstance(obj.get("segments"), dict)


class Manifest:
    def __init__(self, root: str, report: Report = ignore_damage) -> None:
        self.root = root
        self.path = os.path.join(root, MANIFEST_NAME)
        self.segments: dict[str, dict[str, Any]] = {}
        #: topic key (``<stream id>/<topic id>@<created>``) -> its recorded configuration
        self.topics: dict[str, dict[str, Any]] = {}
        quarantine = os.path.join(root, QUARANTINE_NAME)
        self._copies = Copies(
            self.path, _FORMAT, "export_manifest", report, lambda p: keep_aside(p, quarantine), legacy=_is_legacy
        )
        self._report = report

    @property
    def paths(self) -> tuple[str, str]:
        return self._copies.paths

    @classmethod
    def load(cls, root: str, report: Report = ignore_damage, readonly: bool = False) -> Manifest:
        """Open (or start) the manifest of ``root`` and remove leftover temporary files
        (``readonly``: report damage, change nothing).

        Raises:
            ManifestUnreadable: both copies are damaged (each one reported).
            ValueError: a manifest version this ttlbroker does not know.
        """
        if not readonly:
            makedirs_durably(root)
        m = cls(root, report)
        try:
            data = m._copies.load(readonly)
        except CopiesUnreadable as exc:
            for path, why in exc.reasons:
                report(Damage("export_manifest", path, None, f"copy {why}", "export paused; nothing rewritten" if not readonly else "left as is (check); the broker pauses the export"))
            what = "; ".join(f"{os.path.basename(p)} {why}" for p, why in exc.reasons)
            raise ManifestUnreadable(
                f"the export manifest of {root} is damaged ({what}), so which segments are already exported is "
                f"unknown and the export is paused: restore {MANIFEST_NAME} from a backup and restart the broker, "
                f"or move {root} aside to export every segment again into a new directory "
                "(segments the cleaner removed after exporting them are only in the old one)"
            ) from None
        if data is None:
            data = {"version": _VERSION, "segments": {}}
        if data.get("version") not in _READS or not isinstance(data.get("segments"), dict):
            raise ValueError(
                f"{m.path}: manifest version {data.get('version')!r} is not one this ttlbroker reads "
                f"({', '.join(map(str, _READS))})"
            )
        m.segments = data["segments"]
        topics = data.get("topics", {})
        m.topics = topics if isinstance(topics, dict) else {}
        if not readonly:
            m.remove_temporaries()
        return m

    def remove_temporaries(self) -> list[str]:
        removed = []
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if d != QUARANTINE_NAME]
            for name in files:
                if name.endswith(".tmp"):
                    path = os.path.join(folder, name)
                    os.unlink(path)
                    removed.append(path)
        return removed

    def __contains__(self, key: str) -> bool:
        return key in self.segments

    def record(self, key: str, entry: dict[str, Any], topic: tuple[str, dict[str, Any]] | None = None) -> None:
        """Add a segment (and, with ``topic``, ``(topic key, configuration)``, its
        topic's configuration) and write the manifest's next generation (both copies,
        each atomically and durably)."""
        self.segments[key] = entry
        if topic is not None:
            self.topics[topic[0]] = topic[1]
        self._copies.save({"version": _VERSION, "segments": self.segments, "topics": self.topics})

    def topics_by_name(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The recorded configurations by ``(stream name, topic name)``; of a name
        used by several topics in turn (deleted and created again), the newest."""
        return topics_by_name(self.topics.values())


def topics_by_name(entries: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """``(stream, topic) -> entry`` for entries with ``stream``, ``topic`` and
    ``generation``, keeping the newest generation of each name."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("stream"), str) or not isinstance(e.get("topic"), str):
            continue
        name = (e["stream"], e["topic"])
        if name not in out or int(e.get("generation", 0)) >= int(out[name].get("generation", 0)):
            out[name] = e
    return out
