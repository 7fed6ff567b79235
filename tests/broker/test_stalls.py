"""The event-loop stall and GC pause measurements."""

from __future__ import annotations

import gc
import time

import trio

from broker.core._stalls import LoopWatch


def test_the_watch_measures_the_longest_stall_and_every_collection() -> None:
    watch = LoopWatch()

    async def main() -> None:
        with watch.watching():
            await trio.sleep(0.01)
            end = time.perf_counter() + 0.03
            while time.perf_counter() < end:  # a task that computes for 30 ms without a checkpoint
                pass
            await trio.sleep(0)
            gc.collect()
            await trio.sleep(0.01)

    t0 = time.perf_counter()
    trio.run(main)
    elapsed_ms = (time.perf_counter() - t0) * 1000
    v = watch.values()
    # At least the 30 ms computed; at most the whole run (the collection itself is a
    # stall too, and takes long in a test process with a big heap on a busy machine).
    assert 30 <= v["loop_stall_max_ms"] <= elapsed_ms
    assert watch.gc_collections[2] >= 1 and v["gc_collections"] >= 1
    assert 0 < v["gc_pause_max_ms"] <= v["gc_pause_total_ms"]
    assert watch._gc not in gc.callbacks  # removed with the block
