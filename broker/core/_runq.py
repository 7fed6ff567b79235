"""How many tasks trio has queued to run, without trio's whole statistics.

``trio.lowlevel.current_statistics()`` also counts, on every call, the tasks waiting
for each registered descriptor (its epoll statistics walk them all), and works out
the next deadline: microseconds with a few connections, and growing with each. The
group commit asks only for the length of the run queue (``Committer.sync_if_idle``,
once per awaited request), so it reads that alone; should a trio release move it,
the public call answers instead (tests/broker/test_runq.py holds the two equal).
"""

from __future__ import annotations

import trio

try:
    from trio._core._run import GLOBAL_RUN_CONTEXT as _CONTEXT
except ImportError:  # pragma: no cover (a trio without it: the public call)
    _CONTEXT = None

__all__ = ["tasks_runnable"]


def tasks_runnable() -> int:
    """``trio.lowlevel.current_statistics().tasks_runnable``: the tasks queued on the
    run queue. Raises RuntimeError outside a trio run, as that does."""
    try:
        return len(_CONTEXT.runner.runq)  # type: ignore[union-attr]
    except AttributeError:
        return trio.lowlevel.current_statistics().tasks_runnable
