"""Shared pieces of the TTL, marker and cleaner tests: virtual time and a broker.

Time is trio's ``MockClock`` at rate 0 (pytest-trio's ``mock_clock`` fixture): it
moves only when a test calls :func:`advance`, so nothing can expire while a request
is in flight and every check is exact. The broker's ``Clock`` derives message
timestamps from the same virtual time.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import trio
import trio.testing

from broker import Clock
from broker.client import Client, Message, connect

from conftest import make_config, start_server

NS = 1_000_000_000


async def advance(seconds: float) -> None:
    """Move virtual time on and let every task that fell due run to completion."""
    trio.lowlevel.current_clock().jump(seconds)  # type: ignore[attr-defined]
    await trio.testing.wait_all_tasks_blocked()


@contextlib.asynccontextmanager
async def broker_and_client(data_dir: Path, clock: Clock | None = None, **config: object) -> AsyncIterator[tuple[object, Client]]:
    """A broker on ``data_dir`` (fsync never: virtual-time tests measure nothing of
    the disk) and a client without request timeouts (virtual time jumps)."""
    cfg = make_config(data_dir, **{"system.partition.fsync": "never", **config})
    async with start_server(cfg, clock or Clock()) as handle:
        async with connect(handle.address, timeout=None) as client:
            yield handle, client


async def all_messages(client: Client, stream: str, topic: str, partitions: int = 1) -> list[Message]:
    out: list[Message] = []
    for p in range(partitions):
        offset = 1
        while True:
            page = await client.fetch(stream, topic, p, offset, 10_000)
            out.extend(page.messages)
            if not page.messages or page.next_offset > page.last_offset:
                break
            offset = page.next_offset
    return out
