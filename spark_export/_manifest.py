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
"""

from __future__ import annotations

import json
import os
from typing import Any

from storage import fsync_dir

__all__ = ["Manifest", "MANIFEST_NAME"]

MANIFEST_NAME = "_manifest.json"
_VERSION = 1



class Manifest:
    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(root, MANIFEST_NAME)
        self.segments: dict[str, dict[str, Any]] = {}

    @classmethod
    def load(cls, root: str) -> Manifest:
        """Open (or start) the manifest of ``root`` and remove leftover temporary files."""
        os.makedirs(root, exist_ok=True)
        m = cls(root)
        try:
            with open(m.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            data = {"version": _VERSION, "segments": {}}
        if data.get("version") != _VERSION:
            raise ValueError(f"{m.path}: manifest version {data.get('version')!r} is not {_VERSION}")
        m.segments = data["segments"]
        m.remove_temporaries()
        return m

    def remove_temporaries(self) -> list[str]:
        removed = []
        for folder, _, files in os.walk(self.root):
            for name in files:
                if name.endswith(".tmp"):
                    path = os.path.join(folder, name)
                    os.unlink(path)
                    removed.append(path)
        return removed

    def __contains__(self, key: str) -> bool:
        return key in self.segments

    def record(self, key: str, entry: dict[str, Any]) -> None:
        """Add a segment and rewrite the manifest atomically."""
        self.segments[key] = entry
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"version": _VERSION, "segments": self.segments}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.root)
