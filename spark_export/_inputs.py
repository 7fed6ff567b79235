"""Checks that turn a bad job input into one clear line instead of a JVM stack trace."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow.parquet as pq

from ._schema import SCHEMA_VERSION, VERSION_KEY

__all__ = ["JobError", "check_input", "check_java", "MARKER_FILE", "write_marker"]

#: Written at the root of a job's Parquet output (Spark does not keep our file
#: metadata): the schema version of the files below it.
MARKER_FILE = "_ttlbroker.json"


class JobError(Exception):
    """A job cannot run; the message is the one line the user sees."""


def parquet_files(root: str) -> list[str]:
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        out.extend(os.path.join(folder, f) for f in files if f.endswith(".parquet") and not f.startswith(("_", ".")))
    return sorted(out)


def check_input(root: str) -> list[str]:
    """The Parquet files of an export (or a job's output) at ``root``.

    Raises:
        JobError: no such folder, no Parquet file in it, or a schema version this
            version of ttlbroker does not know.
    """
    if not os.path.isdir(root):
        raise JobError(f"no such input: {root} is not a folder")
    files = parquet_files(root)
    if not files:
        raise JobError(f"no Parquet files under {root}: is it a ttlbroker export?")
    marker = os.path.join(root, MARKER_FILE)
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            version = json.load(f).get("schema_version")
        _check_version(version, marker)
        return files
    for path in files:
        meta = pq.read_schema(path).metadata or {}
        raw = meta.get(VERSION_KEY)
        if raw is None:
            raise JobError(f"{path} is not a ttlbroker export file (no {VERSION_KEY.decode()} in its metadata)")
        _check_version(int(raw), path)
    return files


def _check_version(version: object, where: str) -> None:
    if version != SCHEMA_VERSION:
        raise JobError(
            f"{where} has export schema version {version}; this ttlbroker reads version {SCHEMA_VERSION} only"
        )


def write_marker(root: str, **fields: object) -> None:
    with open(os.path.join(root, MARKER_FILE), "w", encoding="utf-8") as f:
        json.dump({"schema_version": SCHEMA_VERSION, **fields}, f, indent=1)


def check_java() -> None:
    """Raises JobError when no Java runtime can be found (Spark needs 17 or newer)."""
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return
    if shutil.which("java") is None:
        raise JobError("Spark needs Java 17 or newer: no `java` on PATH and JAVA_HOME is not set")
