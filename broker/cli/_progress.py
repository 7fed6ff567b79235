"""Progress for long client commands (``pub --count``, ``export``): a line on
stderr with the count, rate and ETA (the total may come later), or a spinner and the
time so far; drawn only when stderr is a terminal. The command's final line (what was
done, how fast) goes to stdout whatever they are.

Imported only by the commands that show progress: rich's progress machinery costs
tens of milliseconds to import.
"""

from __future__ import annotations

import sys

from rich import progress as rp
from rich.console import Console
from rich.text import Text

__all__ = ["Progress"]


class _RateColumn(rp.ProgressColumn):
    """``406,000 msgs/s``, from rich's own speed estimate."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: rp.Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-" if speed is None else f"{speed:,.0f} {self.unit}/s")


class _CountColumn(rp.ProgressColumn):
    """``1,234/5,000`` (``1,234/?`` until the total is known)."""

    def render(self, task: rp.Task) -> Text:
        total = "?" if task.total is None else f"{task.total:,.0f}"
        return Text(f"{task.completed:,.0f}/{total}")


class Progress:
    """Use as a context manager; :meth:`update` with the count done so far.

    Args:
        what: the description shown first (``publishing``).
        total: the count at the end, or None for a spinner.
        unit: for the rate (``msgs`` -> ``msgs/s``).
    """

    def __init__(self, what: str, total: int | None, unit: str, bar: bool | None = None) -> None:
        self.what = what
        self.total = total
        self.unit = unit
        #: A bar, rate and ETA (a total known now or later, given to update), or a spinner.
        self.bar = total is not None if bar is None else bar
        self._progress: rp.Progress | None = None
        self._task: rp.TaskID | None = None

    def __enter__(self) -> Progress:
        if not sys.stderr.isatty():
            return self
        console = Console(file=sys.stderr, highlight=False, markup=False, emoji=False)
        if not self.bar:
            columns: list[str | rp.ProgressColumn] = [
                rp.SpinnerColumn(), rp.TextColumn("{task.description}"), rp.TimeElapsedColumn(),
            ]
        else:
            columns = [
                rp.TextColumn("{task.description}"), rp.BarColumn(), _CountColumn(),
                _RateColumn(self.unit), rp.TextColumn("eta"), rp.TimeRemainingColumn(),
            ]
        self._progress = rp.Progress(*columns, console=console, transient=True)
        self._progress.start()
        self._task = self._progress.add_task(self.what, total=self.total)
        return self

    @property
    def shown(self) -> bool:
        """Whether progress is drawn (stderr is a terminal)."""
        return self._progress is not None

    def update(self, completed: int, total: int | None = None) -> None:
        if self._progress is not None and self._task is not None:
            if total is None:
                self._progress.update(self._task, completed=completed)
            else:
                self._progress.update(self._task, completed=completed, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
