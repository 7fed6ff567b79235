"""Export sealed segments to Parquet, exactly once (runs in the export worker process).

:func:`export_segments` is what the export worker (``worker.py``) runs with the jobs
the broker snapshotted; see ``_manifest.py`` for the order of writes that makes a
crash at any point harmless. ``TTLBROKER_EXPORT_CRASH_AT`` (``before_write``,
``after_write``, ``after_rename``) makes the process exit on the spot at that step:
a fault-injection point for the crash tests, never set in operation.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from storage import Report, fsync_dir, ignore_damage

from ._convert import SegmentJob, new_damage, relative_path, write_segment
from ._manifest import Manifest, makedirs_durably

__all__ = ["export_segments", "CRASH_ENV"]

CRASH_ENV = "TTLBROKER_EXPORT_CRASH_AT"


def _crash_point(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        os._exit(86)


def export_segments(
    root: str,
    jobs: Iterable[SegmentJob],
    report: Report = ignore_damage,
    started: Callable[[list[str], int], None] | None = None,
    progress: Callable[[dict[str, Any], int, int], None] | None = None,
    gone: Callable[[str, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Export every job not already in ``root``'s manifest; returns one entry per
    segment exported now (``key``, ``path``, ``rows``, ``bytes``, ``corrupt_records``,
    ``seconds``...). Damage found in the manifest, and corrupt records the broker did
    not know of, go to ``report``; ``started``
    gets the keys of the jobs the manifest already lists and how many segments are
    left to export; ``progress`` each entry as its segment is in the manifest, with
    how many are done of how many. A segment whose log file is no longer there (its
    topic deleted since the jobs were made) is left out and given to ``gone`` (key,
    path) when there is one, else the pass fails with ``FileNotFoundError``.

    Raises:
        ManifestUnreadable: no copy of the manifest is valid; nothing is exported.
    """
    manifest = Manifest.load(root, report)
    jobs = list(jobs)
    todo = [j for j in jobs if j.key not in manifest]
    if started is not None:
        started([j.key for j in jobs if j.key in manifest], len(todo))
    done: list[dict[str, Any]] = []
    for i, job in enumerate(todo):
        started_at = time.perf_counter()
        rel = relative_path(job)
        final = os.path.join(root, rel)
        folder = os.path.dirname(final)
        makedirs_durably(folder)
        tmp = final + ".tmp"
        _crash_point("before_write")
        try:
            rows, corrupt = write_segment(job, tmp)
        except FileNotFoundError as exc:
            if gone is None or exc.filename != job.log_path:
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            gone(job.key, job.log_path)
            continue
        damage = new_damage(job, corrupt)
        if damage is not None:
            report(damage)
        _crash_point("after_write")
        os.replace(tmp, final)
        fsync_dir(folder)
        _crash_point("after_rename")
        entry = {
            "path": rel,
            "stream": job.stream,
            "topic": job.topic,
            "partition": job.partition,
            "first_offset": job.base,
            "last_offset": job.last_offset,
            "rows": rows,
            "bytes": os.path.getsize(final),
            "corrupt_records": len(corrupt),
            "exported_at": time.time(),
        }
        topic = None
        if job.topic_config is not None:
            topic = (job.topic_key, {
                "stream": job.stream, "topic": job.topic, "generation": job.generation,
                **job.topic_config, "recorded_at": time.time(),
            })
        manifest.record(job.key, entry, topic)
        done.append({"key": job.key, **entry, "seconds": round(time.perf_counter() - started_at, 3)})
        if progress is not None:
            progress(done[-1], i + 1, len(todo))
    return done
