"""The broker's one clock.

Two kinds of time: *deadlines* live on trio's clock (``trio.current_time()``), so a
test's ``MockClock`` / ``autojump_clock`` drives every timer; *timestamps* stamped on
messages are wall-clock nanoseconds. This object derives the second from the first
(wall time at start plus trio time elapsed since), so under a mock clock message
timestamps advance with virtual time, and it is the only place that turns a stored
wall-clock deadline back into a trio deadline (when expiry state is rebuilt after a
restart). A test that restarts the broker inside one ``trio.run`` passes the same
``Clock`` to both servers.
"""

from __future__ import annotations

import time

import trio

__all__ = ["Clock"]


class Clock:
    def __init__(self, wall_start_ns: int | None = None) -> None:
        # Both anchors are taken together, on first use inside trio.run.
        self._given_wall0 = wall_start_ns
        self._wall0 = 0
        self._trio0: float | None = None

    def _start(self) -> float:
        if self._trio0 is None:
            self._trio0 = trio.current_time()
            self._wall0 = time.time_ns() if self._given_wall0 is None else self._given_wall0
        return self._trio0

    def now_ns(self) -> int:
        """Wall-clock nanoseconds, advancing with trio's clock."""
        trio0 = self._trio0
        if trio0 is None:
            trio0 = self._start()
        return self._wall0 + int((trio.current_time() - trio0) * 1e9)

    def trio_time(self) -> float:
        return trio.current_time()

    def to_trio(self, wall_ns: int) -> float:
        """The trio time at which the wall clock reads ``wall_ns``."""
        trio0 = self._start()
        return trio0 + (wall_ns - self._wall0) / 1e9

    def to_wall_ns(self, trio_time: float) -> int:
        trio0 = self._start()
        return self._wall0 + int((trio_time - trio0) * 1e9)
