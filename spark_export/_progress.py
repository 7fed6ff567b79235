"""Progress on stderr for ``load`` and the Spark jobs.

When stderr is a terminal, a live display (rich) shows what is being done, how much
of it, the rate and the time left; it disappears when the work ends. Lines said
along the way (:meth:`Display.say`) and the final count line go to stderr always, so
logs and pipes get them too. Nothing here runs unless stderr is a terminal, apart
from those lines.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import TracebackType
from typing import Any

__all__ = ["Display", "SparkStages", "SparkInterrupt", "is_terminal", "say"]


def is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def say(line: str) -> None:
    """One line on stderr, now."""
    print(line, file=sys.stderr, flush=True)


class Display:
    """A live display with one bar per task when stderr is a terminal (``live``),
    plain lines otherwise.

    Use as a context manager; :meth:`add` a task (``total`` None: unknown),
    :meth:`update` it, :meth:`say` a line above the display.
    """

    def __init__(self, live: bool | None = None) -> None:
        self.live = is_terminal() if live is None else live
        self._progress: Any = None
        if self.live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.text import Text

            class Rate(ProgressColumn):
                def render(self, task: Any) -> Text:
                    speed = task.finished_speed or task.speed
                    unit = task.fields.get("unit", "")
                    return Text(f"{speed:,.0f} {unit}/s" if speed and unit else "", style="progress.data.speed")

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=Console(stderr=True), transient=True, refresh_per_second=4,
            )

    def __enter__(self) -> Display:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def add(self, description: str, total: float | None, unit: str = "") -> int:
        if self._progress is None:
            return 0
        return int(self._progress.add_task(description, total=total, unit=unit))

    def update(self, task: int, **changes: Any) -> None:
        """``completed=``, ``advance=``, ``total=``, ``description=`` (rich's)."""
        if self._progress is not None:
            self._progress.update(task, **changes)

    def say(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            say(line)


class SparkStages:
    """While running, shows the tasks of the Spark stages in progress as one bar of a
    :class:`Display` (polled from the status tracker every quarter second). Does
    nothing unless the display is live."""

    def __init__(self, spark: Any, display: Display) -> None:
        self._tracker = spark.sparkContext.statusTracker() if display.live else None
        self._display = display
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._task = display.add("spark tasks", None, "tasks") if display.live else 0

    def __enter__(self) -> SparkStages:
        if self._tracker is not None:
            self._thread = threading.Thread(target=self._poll, name="ttlbroker-spark-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)

    def _poll(self) -> None:
        assert self._tracker is not None
        while not self._stop.wait(0.25):
            try:
                infos = [self._tracker.getStageInfo(s) for s in self._tracker.getActiveStageIds()]
            except Exception:  # the JVM going away at shutdown, for example
                return
            infos = [i for i in infos if i is not None]
            if infos:
                done = sum(i.numCompletedTasks for i in infos)
                total = sum(i.numTasks for i in infos)
                names = ", ".join(f"stage {i.stageId}" for i in infos)
                self._display.update(self._task, description=f"spark {names}", completed=done, total=total)
            else:
                self._display.update(self._task, description="spark", completed=0, total=None)


class SparkInterrupt:
    """Ctrl-C during a Spark job: cancel its Spark jobs cleanly instead of pyspark's
    own handler (which calls the JVM from inside the signal handler, while the main
    thread waits on the same connection, and logs tracebacks).

    The first SIGINT sets :attr:`hit`, silences Spark's log and cancels every Spark
    job from another thread; the job's call then fails and the caller reports the
    interruption. A second SIGINT raises KeyboardInterrupt at once. Outside the main
    thread this does nothing (signals are the main thread's)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.hit = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> SparkInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)

    def _handler(self, signum: int, frame: Any) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True
        threading.Thread(target=self._cancel, name="ttlbroker-spark-cancel", daemon=True).start()

    def _cancel(self) -> None:
        try:
            self.spark.sparkContext.setLogLevel("OFF")
            self.spark.sparkContext.cancelAllJobs()
        except Exception:
            pass


def wait_for_spark_idle(spark: Any, timeout: float = 30) -> None:
    """Wait until no Spark job or stage is active (cancelled tasks may still be
    writing for a moment after their job failed)."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not tracker.getActiveJobsIds() and not tracker.getActiveStageIds():
                return
        except Exception:
            return
        time.sleep(0.1)
