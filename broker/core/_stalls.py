"""How long the event loop went without looking at I/O and timers, and how long the
garbage collector stopped it.

trio's scheduler alternates between waiting for I/O (with a timeout: the next
deadline) and running a batch of the tasks that became ready. While a batch runs, no
socket is read and no timer fires, so the longest batch is the longest any request
or deadline (an expiry bucket) can have waited on the loop: its *stall*. One
instrument with the two I/O-wait hooks measures it; trio calls it twice per loop
iteration and never per task step, so it costs a few hundred nanoseconds an
iteration.

Garbage collections run inside those batches, in whichever task allocated the
object that crossed a threshold; ``gc.callbacks`` times each one.

:class:`LoopWatch` is installed for the broker's lifetime by the expiry task (the
task whose deadlines a stall delays) and read by ``stats``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter_ns

import trio

__all__ = ["LoopWatch"]


class LoopWatch(trio.abc.Instrument):
    def __init__(self) -> None:
        #: The longest batch of task steps between two I/O waits (ns).
        self.stall_ns_max = 0
        #: Garbage collections per generation, their total and longest pause (ns).
        self.gc_collections = [0, 0, 0]
        self.gc_pause_ns_total = 0
        self.gc_pause_ns_max = 0
        self._ran_at = 0
        self._gc_at = 0

    # -- the loop ----------------------------------------------------------------

    def after_io_wait(self, timeout: float) -> None:
        self._ran_at = perf_counter_ns()

    def before_io_wait(self, timeout: float) -> None:
        if self._ran_at:
            ran = perf_counter_ns() - self._ran_at
            if ran > self.stall_ns_max:
                self.stall_ns_max = ran

    # -- the garbage collector ---------------------------------------------------

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_at = perf_counter_ns()
            return
        if not self._gc_at:
            return
        pause = perf_counter_ns() - self._gc_at
        self._gc_at = 0
        self.gc_collections[info["generation"]] += 1
        self.gc_pause_ns_total += pause
        if pause > self.gc_pause_ns_max:
            self.gc_pause_ns_max = pause

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Measure while the block runs (inside ``trio.run``)."""
        trio.lowlevel.add_instrument(self)
        gc.callbacks.append(self._gc)
        try:
            yield
        finally:
            gc.callbacks.remove(self._gc)
            trio.lowlevel.remove_instrument(self)

    def values(self) -> dict[str, float]:
        """What ``stats`` shows (milliseconds)."""
        return {
            "loop_stall_max_ms": round(self.stall_ns_max / 1e6, 3),
            "gc_collections": sum(self.gc_collections),
            "gc_pause_total_ms": round(self.gc_pause_ns_total / 1e6, 3),
            "gc_pause_max_ms": round(self.gc_pause_ns_max / 1e6, 3),
        }
