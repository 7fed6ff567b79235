"""Writes nobody waits for (``Committer.note_write(..., lazy=True)``: a consumer's
deliveries, acks sent without asking for an answer) go with the next sync, and under
``fsync = "always"`` one runs at the latest ``LAZY_SYNC_SECONDS`` after them; anything
that waits for "everything written so far" (``durable_at``) includes them."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from broker.core import _commit
from broker.core._commit import LAZY_SYNC_SECONDS, Committer
from broker.core._stats import Counters
from storage import FsyncPolicy


class Source:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.dirty = False

    def take_dirty_fds(self) -> list[int]:
        if not self.dirty:
            return []
        self.dirty = False
        return [self.fd]


def _recording(monkeypatch: Any) -> list[list[int]]:
    synced: list[list[int]] = []
    monkeypatch.setattr(_commit, "sync_fds", lambda fds: synced.append(sorted(fds)))
    return synced


async def _committer(nursery: trio.Nursery, mode: str = "always") -> Committer:
    policy = FsyncPolicy(mode) if mode != "interval" else FsyncPolicy("interval", 1000)
    committer = Committer(policy, Counters())
    await nursery.start(committer.run)
    return committer


async def test_a_lazy_write_is_synced_when_due_and_has_no_epoch(autojump_clock: Any, monkeypatch: Any) -> None:
    synced = _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        lazy = Source(7)
        lazy.dirty = True
        start = trio.current_time()
        assert committer.note_write(lazy, lazy=True) == 0
        await trio.sleep(LAZY_SYNC_SECONDS * 0.9)
        assert synced == [] and lazy.dirty
        await trio.sleep(LAZY_SYNC_SECONDS * 0.2)
        assert synced == [[7]] and not lazy.dirty
        assert trio.current_time() - start <= LAZY_SYNC_SECONDS * 1.1
        # Nothing more is due: no further sync.
        await trio.sleep(LAZY_SYNC_SECONDS * 10)
        assert synced == [[7]]
        nursery.cancel_scope.cancel()


async def test_a_write_someone_waits_for_takes_the_lazy_ones_along(autojump_clock: Any, monkeypatch: Any) -> None:
    synced = _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        lazy, eager = Source(3), Source(4)
        lazy.dirty = eager.dirty = True
        committer.note_write(lazy, lazy=True)
        start = trio.current_time()
        epoch = committer.note_write(eager)
        assert epoch > 0
        while not committer.is_durable(epoch):
            await committer.wait_progress()
        assert trio.current_time() == start  # at once, not when the lazy write was due
        assert synced == [[3, 4]]
        await trio.sleep(LAZY_SYNC_SECONDS * 3)
        assert synced == [[3, 4]]  # the lazy write went with it: nothing left to sync
        nursery.cancel_scope.cancel()


async def test_durable_at_includes_lazy_writes_and_syncs_them_at_once(autojump_clock: Any, monkeypatch: Any) -> None:
    synced = _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        lazy = Source(5)
        lazy.dirty = True
        committer.note_write(lazy, lazy=True)
        start = trio.current_time()
        epoch = committer.durable_at()
        assert epoch > 0 and not committer.is_durable(epoch)
        while not committer.is_durable(epoch):
            await committer.wait_progress()
        assert trio.current_time() == start and synced == [[5]]
        assert committer.durable_at() == 0
        nursery.cancel_scope.cancel()


async def test_lazy_is_ordinary_when_acks_do_not_wait(autojump_clock: Any, monkeypatch: Any) -> None:
    """Under an interval (or ``never``) every write already goes with the next sync:
    a lazy one is an ordinary write, with its epoch."""
    _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery, "interval")
        src = Source(1)
        src.dirty = True
        assert committer.note_write(src, lazy=True) == committer.epoch
        nursery.cancel_scope.cancel()
