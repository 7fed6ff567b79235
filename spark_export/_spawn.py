"""An export pass in the worker process (``worker.py``), followed from the broker's
trio event loop.

:func:`export_in_worker` starts ``python -m spark_export.worker``, writes it the jobs
and turns what it prints into the same calls :func:`export_segments` makes
(``report``, ``started``, ``progress``), on the loop. The loop only copies the jobs
into a pipe and reads one short line per segment: the conversion runs on another core
with its own GIL. Cancelling the call (the broker shutting down) terminates the
worker and waits for it; what it leaves half-written is never under a final name
(``_manifest.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any

import trio

from storage import Damage, Report, ignore_damage

from ._convert import SegmentJob
from ._manifest import ManifestUnreadable
from ._wire import job_messages

__all__ = ["export_in_worker", "lower_priority", "WORKER_COMMAND", "WorkerCrashed", "WorkerFailed"]

WORKER_COMMAND = (sys.executable, "-m", "spark_export.worker")
_LINE_MAX = 1 << 20  # an event is one short line; more is not the worker talking
_TAIL = 4096  # bytes of the worker's stderr kept to say why it failed


#: Added to the worker's niceness at ``low`` (and where SCHED_IDLE is missing).
NICE = 10


def lower_priority(pid: int, priority: str) -> str:
    """Lower process ``pid``'s CPU priority: ``idle`` is Linux's SCHED_IDLE (it runs
    only on CPU time no other process wants, and its disk requests get the idle I/O
    class), falling back to ``low`` where the system has none; ``low`` is niceness
    +10 (a small share when the cores are busy); ``normal`` changes nothing. Returns
    what it got. A process that is gone already is left alone."""
    try:
        if priority == "idle":
            try:
                os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
                return "idle"
            except ProcessLookupError:
                raise
            except (AttributeError, OSError):
                priority = "low"
        if priority == "low":
            os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + NICE))
    except ProcessLookupError:
        pass
    return priority


class WorkerFailed(Exception):
    """The pass failed in the worker (a write or a conversion raised); ``message``
    is the error. Nothing half-written is under a final name."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.message = message
        #: The end of what the worker wrote to stderr (a traceback, usually).
        self.stderr = stderr


class WorkerCrashed(WorkerFailed):
    """The worker stopped without finishing the pass or saying why (killed, crashed,
    or output that is not its protocol): the pass may be run again at once."""


async def _send(stream: trio.abc.SendStream, root: str, jobs: list[SegmentJob]) -> None:
    """The jobs, packed one at a time as the pipe takes them: the loop never packs a
    whole backlog's positions at once."""
    try:
        async with stream:
            for message in job_messages(root, jobs):
                await stream.send_all(message)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the worker is gone: its exit status says why


async def _keep_tail(stream: trio.abc.ReceiveStream, tail: bytearray) -> None:
    async for chunk in stream:
        tail += chunk
        del tail[:-_TAIL]


async def _lines(stream: trio.abc.ReceiveStream) -> AsyncGenerator[bytes | None, None]:
    """The lines of ``stream``; None for a line longer than ``_LINE_MAX``."""
    buf = bytearray()
    async for chunk in stream:
        buf += chunk
        while (end := buf.find(b"\n")) >= 0:
            yield bytes(buf[:end])
            del buf[: end + 1]
        if len(buf) > _LINE_MAX:
            yield None
            return
    if buf:
        yield bytes(buf)


def _why(returncode: int | None, stderr: str) -> str:
    if returncode is not None and returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"was killed by signal {-returncode}"
    else:
        how = f"exited with code {returncode}"
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    return f"the export worker {how} before the end of the pass" + (f" ({last})" if last else "")


async def export_in_worker(
    root: str,
    jobs: list[SegmentJob],
    report: Report = ignore_damage,
    started: Callable[[list[str], int], None] | None = None,
    progress: Callable[[dict[str, Any], int, int], None] | None = None,
    command: Sequence[str] = WORKER_COMMAND,
    priority: str = "low",
    gone: Callable[[str, str], None] | None = None,
) -> list[dict[str, Any]]:
    """:func:`export_segments` in the worker process; the callbacks run on the loop.
    ``priority``: the worker's CPU priority (:func:`lower_priority`), set as it
    starts, before its imports (numpy, pyarrow: a quarter of a second of CPU).
    ``gone``: (key, path) of each segment left out because its log file was gone.

    Raises:
        ManifestUnreadable: no copy of the manifest is valid; nothing is exported.
        WorkerCrashed: the worker stopped before the end of the pass (segments it
            reported through ``progress`` are exported).
        WorkerFailed: the pass failed in the worker (the same).
    """
    done: list[dict[str, Any]] = []
    tail = bytearray()
    ending: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        run = partial(trio.run_process, list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, check=False)
        proc = await nursery.start(run)
        lower_priority(proc.pid, priority)
        nursery.start_soon(_send, proc.stdin, root, jobs)
        nursery.start_soon(_keep_tail, proc.stderr, tail)
        async with aclosing(_lines(proc.stdout)) as lines:
            async for line in lines:
                try:
                    event = json.loads(line) if line is not None else None
                except ValueError:
                    event = None
                if not isinstance(event, dict) or ending:
                    ending = {"garbled": line[:200] if line is not None else "a line too long"}
                    nursery.cancel_scope.cancel()  # terminates the worker
                    break
                if "damage" in event:
                    fields = event["damage"]
                    offsets = fields.pop("offsets", None)
                    report(Damage(**fields, offsets=tuple(offsets) if offsets else None))
                elif "started" in event:
                    if started is not None:
                        started(event["started"]["exported"], event["started"]["todo"])
                elif "done" in event:
                    done.append(event["done"])
                    if progress is not None:
                        progress(event["done"], event["n"], event["of"])
                elif "gone" in event:
                    if gone is not None:
                        gone(event["gone"]["key"], event["gone"]["path"])
                else:
                    ending = event
    stderr = tail.decode(errors="replace")
    if "unreadable" in ending:
        raise ManifestUnreadable(ending["unreadable"])
    if "error" in ending:
        raise WorkerFailed(ending["error"], stderr)
    if "garbled" in ending:
        raise WorkerCrashed(f"the export worker wrote what is not an event: {ending['garbled']!r}", stderr)
    if "end" not in ending or proc.returncode != 0:
        raise WorkerCrashed(_why(proc.returncode, stderr), stderr)
    return done
