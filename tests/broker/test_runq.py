"""``broker.core._runq.tasks_runnable``: what ``current_statistics().tasks_runnable``
says, without the rest of trio's statistics."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from broker.core._runq import tasks_runnable


async def test_it_counts_what_trio_counts() -> None:
    def trio_says() -> int:
        return trio.lowlevel.current_statistics().tasks_runnable

    async with trio.open_nursery() as nursery:
        await trio.testing.wait_all_tasks_blocked()
        assert tasks_runnable() == trio_says() == 0
        for k in range(1, 4):
            nursery.start_soon(trio.sleep, 0)
            assert tasks_runnable() == trio_says() == k


def test_outside_a_trio_run_it_raises_as_trio_does() -> None:
    with pytest.raises(RuntimeError, match="must be called from async context"):
        tasks_runnable()
    with pytest.raises(RuntimeError, match="must be called from async context"):
        trio.lowlevel.current_statistics()
