"""``python -m spark_export.worker``: the broker's export pass, in a process of its own.

The broker (``broker/core/_export.py``, through :func:`spark_export.export_in_worker`)
starts one worker per pass, so that the conversion never shares the broker's GIL and
a crash of pyarrow or of the worker costs the pass, never the broker. The broker
lowers the worker's priority as it starts it (``_spawn.lower_priority``, the
broker's ``[export] worker_priority``): publishing and fetching come first when the
cores are busy.

stdin: the jobs (``_wire.py``); the worker reads them all before it starts.

stdout: one JSON object per line, in this order::

    {"damage": {Damage fields}}                 # any number, while the manifest loads
    {"started": {"exported": [keys], "todo": n}}  # jobs the manifest lists already
    {"done": entry, "n": i, "of": n}            # each segment, once in the manifest
    {"end": true}

or, instead of the rest, ``{"unreadable": message}`` (no valid manifest copy: nothing
exported) or ``{"error": "Type: message"}`` (the pass failed; the traceback goes to
stderr). Exit code 0 after ``end`` and ``unreadable``, 1 after ``error``; anything
else is a crash.

A worker whose broker died stops at its next event (its stdout has no reader any
more: the write fails), so after at most the segment under way, which it finishes
and records like any other. (Not ``PR_SET_PDEATHSIG``: trio starts processes from a
worker thread, and that signal comes when the thread ends, not the broker.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from typing import Any, TextIO

from ._convert import SegmentJob
from ._exporter import export_segments
from ._manifest import ManifestUnreadable
from ._wire import read_jobs

__all__ = ["main"]


def run(root: str, jobs: list[SegmentJob], out: TextIO) -> int:
    def emit(**event: Any) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    try:
        export_segments(
            root,
            jobs,
            report=lambda damage: emit(damage=dataclasses.asdict(damage)),
            started=lambda exported, todo: emit(started={"exported": exported, "todo": todo}),
            progress=lambda entry, n, of: emit(done=entry, n=n, of=of),
            gone=lambda key, path: emit(gone={"key": key, "path": path}),
        )
    except ManifestUnreadable as exc:
        emit(unreadable=exc.message)
        return 0
    except Exception as exc:
        traceback.print_exc()
        emit(error=f"{type(exc).__name__}: {exc}")
        return 1
    emit(end=True)
    return 0


def main() -> int:
    # Events go to the original stdout; anything else that prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    root, jobs = read_jobs(sys.stdin.buffer)
    return run(root, jobs, out)


if __name__ == "__main__":
    sys.exit(main())
