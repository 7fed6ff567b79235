"""How many tasks trio has queued to run, without trio's whole statistics.

``trio.lowlevel.current_statistics()`` also counts, on every call, the tasks waiting
for each registered descriptor (its epoll statistics walk them all), and works out
the next deadline: microseconds with a few connections, and growing with each. The
group commit asks only for the length of the run queue (``Committer.sync_if_idle``,
once per awaited request), so it reads that alone; should a trio release move it,
the public call answers instead (tests/broker/test_runq.py holds the two equal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from trio._core._run_context import RunContext

__all__ = ["tasks_runnable"]


def _run_context() -> RunContext | None:
    """trio's per-thread run state (its ``runner`` is set inside ``trio.run``), or
    None in a trio that keeps it elsewhere."""
    try:
        from trio._core._run import GLOBAL_RUN_CONTEXT
    except ImportError:  # pragma: no cover (a trio without it: the public call)
        return None
    return GLOBAL_RUN_CONTEXT


_CONTEXT = _run_context()


def tasks_runnable() -> int:
    """``trio.lowlevel.current_statistics().tasks_runnable``: the tasks queued on the
    run queue. Raises RuntimeError outside a trio run, as that does."""
    context = _CONTEXT
    if context is not None:
        try:
            return len(context.runner.runq)
        except AttributeError:  # outside a run (no runner), or a trio that moved it
            pass
    return trio.lowlevel.current_statistics().tasks_runnable
