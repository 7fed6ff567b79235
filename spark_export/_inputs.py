"""Checks that turn a bad job input into one clear line instead of a JVM stack trace."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow.parquet as pq

from ._errors import JobError
from ._schema import SCHEMA_VERSION, VERSION_KEY

__all__ = ["JobError", "check_input", "check_java", "find_java", "java_version", "MIN_JAVA", "MARKER_FILE", "write_marker", "read_marker", "source_topics"]

#: Written at the root of a job's Parquet output (Spark does not keep our file
#: metadata): the schema version of the files below it.
MARKER_FILE = "_ttlbroker.json"


def parquet_files(root: str) -> list[str]:
    out: list[str] = []
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
    """Write ``_ttlbroker.json`` at the root of a job's output: the schema version,
    and what the job says of it (``kind``, ``cutoff``; ``topics``, the recorded
    configuration of each topic in it, a list of manifest topic entries)."""
    with open(os.path.join(root, MARKER_FILE), "w", encoding="utf-8") as f:
        json.dump({"schema_version": SCHEMA_VERSION, **fields}, f, indent=1, sort_keys=True)


def read_marker(root: str) -> dict[str, object] | None:
    """The marker of a job's output at ``root``, or None (an export has none)."""
    try:
        with open(os.path.join(root, MARKER_FILE), encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def source_topics(root: str) -> dict[tuple[str, str], dict[str, object]]:
    """``(stream, topic) -> configuration`` of the topics whose rows are under
    ``root``, as recorded when they were exported: from a snapshot's marker
    (``compact`` carries them over) or an export's manifest. Empty when neither
    records them (an export made before they were recorded, or a damaged manifest)."""
    from ._manifest import MANIFEST_NAME, Manifest, ManifestUnreadable, topics_by_name

    marker = read_marker(root)
    if marker is not None:
        return topics_by_name(marker.get("topics") or [])
    if not os.path.exists(os.path.join(root, MANIFEST_NAME)):
        return {}
    try:
        return Manifest.load(root, readonly=True).topics_by_name()
    except (ManifestUnreadable, ValueError, OSError):
        return {}


#: The oldest Java the installed Spark (4.x) runs on.
MIN_JAVA = 17


def java_version(java: str) -> int | None:
    """The major version ``java -version`` reports (8 for ``1.8.0_392``), or None
    when its output names no version.

    Raises:
        JobError: ``java`` cannot be run or exits with an error (a stub without a
            runtime behind it, for example).
    """
    import re
    import subprocess

    try:
        p = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise JobError(f"Spark needs Java {MIN_JAVA} or newer: {java} cannot be run ({exc})") from None
    out = (p.stderr or "") + (p.stdout or "")
    if p.returncode != 0:
        first = out.strip().splitlines()[0] if out.strip() else f"exit status {p.returncode}"
        raise JobError(f"Spark needs Java {MIN_JAVA} or newer: {java} -version fails: {first}")
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def find_java() -> str:
    """The ``java`` Spark will run, as Spark's own launcher picks it
    (``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else ``java`` on PATH),
    checked to run and to be Java 17 or newer.

    Raises:
        JobError: none found, JAVA_HOME names no usable Java, or the Java is too old.
    """
    home = os.environ.get("JAVA_HOME", "")
    if home:
        java = os.path.join(home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            raise JobError(
                f"Spark needs Java {MIN_JAVA} or newer: JAVA_HOME is {home}, which has no bin/java "
                "(point JAVA_HOME at a Java installation, or unset it to use `java` from PATH)"
            )
    else:
        found = shutil.which("java")
        if found is None:
            raise JobError(f"Spark needs Java {MIN_JAVA} or newer: no `java` on PATH and JAVA_HOME is not set")
        java = found
    version = java_version(java)
    if version is not None and version < MIN_JAVA:
        raise JobError(f"Spark needs Java {MIN_JAVA} or newer: {java} is Java {version}")
    return java


def check_java() -> None:
    """Raises JobError when Spark would find no usable Java (see :func:`find_java`)."""
    find_java()
