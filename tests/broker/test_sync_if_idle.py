"""``Committer.sync_if_idle``: after a short read whose answers wait for a sync, a
session syncs at once, on the event loop, when that is all the committer task would
do at its next turn; otherwise it leaves the sync to the committer (whose group the
other writers join)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from test_lazy_commit import Source, _committer, _recording
from ttl_helpers import broker_and_client

from broker.core import _commit


class Watcher:
    def __init__(self) -> None:
        self.synced = 0

    def on_sync(self) -> None:
        self.synced += 1


async def test_a_lone_write_is_synced_at_once_and_its_watchers_told(monkeypatch: Any) -> None:
    synced = _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        src, watcher = Source(5), Watcher()
        src.dirty = True
        epoch = committer.note_write(src)
        committer.watch(watcher)
        assert committer.sync_if_idle() is True
        assert synced == [[5]] and committer.is_durable(epoch) and watcher.synced == 1
        assert committer.counters.fsyncs == 1
        assert committer.sync_if_idle() is False  # nothing waits
        await trio.testing.wait_all_tasks_blocked()
        assert synced == [[5]]  # the committer's own turn found nothing to sync
        nursery.cancel_scope.cancel()


async def test_left_to_the_committer_when_others_would_join_or_the_disk_is_slow(monkeypatch: Any) -> None:
    synced = _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        src = Source(5)

        def write() -> int:
            src.dirty = True
            return committer.note_write(src)

        # Another task queued to run besides the committer: its writes would join.
        write()
        nursery.start_soon(trio.sleep, 0)
        assert committer.sync_if_idle() is False
        await trio.testing.wait_all_tasks_blocked()
        assert synced == [[5]]  # the committer synced it, one turn later
        # The last sync was slow: the sync thread's, not the loop's.
        committer.last_sync_seconds = _commit.INLINE_SYNC_SECONDS
        write()
        assert committer.sync_if_idle() is False
        await trio.testing.wait_all_tasks_blocked()
        committer.last_sync_seconds = 0.0
        # An after-action is due: the committer runs it after a checkpoint.
        epoch = write()
        committer.after(epoch, lambda: None)
        assert committer.sync_if_idle() is False
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    for mode in ("interval", "never"):
        async with trio.open_nursery() as nursery:
            committer = await _committer(nursery, mode)
            src.dirty = True
            committer.note_write(src)
            assert committer.sync_if_idle() is False
            nursery.cancel_scope.cancel()


async def test_a_failed_sync_is_raised_by_the_committer_task(monkeypatch: Any) -> None:
    def failing(fds: list[int]) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_commit, "sync_fds", failing)
    with pytest.raises(BaseException) as raised:
        async with trio.open_nursery() as nursery:
            committer = await _committer(nursery)
            src = Source(5)
            src.dirty = True
            epoch = committer.note_write(src)
            assert committer.sync_if_idle() is False
            assert not committer.is_durable(epoch)  # nothing released
            await trio.sleep_forever()
    group = raised.value
    assert isinstance(group, BaseExceptionGroup) and isinstance(group.exceptions[0], OSError)


async def test_an_awaited_publish_is_answered_after_one_sync_made_by_its_reader(data_dir: Any, monkeypatch: Any) -> None:
    """Over a real socket, fsync ``always``: each publish awaited one by one is
    answered after exactly one sync, made by its session's reader."""
    calls: list[bool] = []
    real = _commit.Committer.sync_if_idle

    def spy(self: _commit.Committer) -> bool:
        calls.append(real(self))
        return calls[-1]

    monkeypatch.setattr(_commit.Committer, "sync_if_idle", spy)
    # Who syncs is tested here, not how fast the disk is: a sync slowed past 2 ms by
    # other work on the machine would hand the next ones to the sync thread (that
    # rule is tested above).
    monkeypatch.setattr(_commit, "INLINE_SYNC_SECONDS", 60.0)
    async with broker_and_client(data_dir, **{"system.partition.fsync": "always"}) as (h, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        fsyncs = h.broker.counters.fsyncs
        calls.clear()
        offsets = [(await c.publish("t.x", b"%d" % i)).offset for i in range(5)]
        assert offsets == [1, 2, 3, 4, 5]
        assert h.broker.counters.fsyncs - fsyncs == 5
        assert len(calls) == 5 and sum(calls) >= 4  # (the committer may have been queued beside the first)


async def test_a_nats_awaited_publish_and_kv_put_are_synced_by_their_reader(nats_server: Any, monkeypatch: Any) -> None:
    """The NATS listener does the same: nats-py's ``js.publish`` and ``kv.put``,
    awaited one by one, each answered after one sync made by its session's reader."""
    from helpers import in_asyncio

    calls: list[bool] = []
    real = _commit.Committer.sync_if_idle

    def spy(self: _commit.Committer) -> bool:
        calls.append(real(self))
        return calls[-1]

    async def scenario(url: str) -> tuple[list[int], list[int]]:
        import nats

        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"])
        kv = await js.create_key_value(bucket="b")
        calls.clear()
        seqs = [(await js.publish("s.x", b"%d" % i)).seq for i in range(3)]
        revs = [await kv.put(f"k{i}", b"v") for i in range(3)]
        await nc.close()
        return seqs, revs

    monkeypatch.setattr(_commit.Committer, "sync_if_idle", spy)
    monkeypatch.setattr(_commit, "INLINE_SYNC_SECONDS", 60.0)  # (as above: not the disk's speed)
    fsyncs = nats_server.broker.counters.fsyncs
    seqs, revs = await in_asyncio(scenario, nats_server.nats_url)
    assert seqs == [1, 2, 3] and revs == [1, 2, 3]
    assert sum(calls) >= 5 and nats_server.broker.counters.fsyncs - fsyncs >= 6


class Told(Source):
    """A source told when a sync of its descriptors completed (``synced()``)."""

    def __init__(self, fd: int, events: list[str]) -> None:
        super().__init__(fd)
        self.events = events

    def synced(self) -> None:
        self.events.append("synced")


class Answering(Watcher):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def on_sync(self) -> None:
        self.events.append("answered")


async def test_sources_are_told_after_the_answers_of_their_sync_and_the_committer_skips_its_empty_turn(
    monkeypatch: Any,
) -> None:
    synced = _recording(monkeypatch)
    events: list[str] = []
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        hooks: list[int] = []
        committer.on_synced.append(hooks.append)
        src = Told(5, events)
        # The reader's inline sync.
        src.dirty = True
        epoch = committer.note_write(src)
        committer.watch(Answering(events))
        assert committer.sync_if_idle() is True
        assert events == ["answered", "synced"] and hooks == [epoch]
        # The committer, woken by the write, finds nothing: no sync, no new epoch, no hook.
        await trio.testing.wait_all_tasks_blocked()
        assert synced == [[5]] and hooks == [epoch] and committer.epoch == epoch + 1 and events == ["answered", "synced"]
        # The committer's own sync tells them in the same order.
        src.dirty = True
        epoch = committer.note_write(src)
        committer.watch(Answering(events))
        await trio.testing.wait_all_tasks_blocked()
        assert synced == [[5], [5]] and hooks == [epoch - 1, epoch] and events == ["answered", "synced"] * 2
        nursery.cancel_scope.cancel()


async def test_a_failed_sync_tells_no_source(monkeypatch: Any) -> None:
    def failing(fds: list[int]) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_commit, "sync_fds", failing)
    events: list[str] = []
    with pytest.raises(BaseException) as raised:
        async with trio.open_nursery() as nursery:
            committer = await _committer(nursery)
            src = Told(5, events)
            src.dirty = True
            committer.note_write(src)
            assert committer.sync_if_idle() is False
            await trio.sleep_forever()
    assert isinstance(raised.value, BaseExceptionGroup) and isinstance(raised.value.exceptions[0], OSError)
    assert str(raised.value.exceptions[0]) == "[Errno 5] Input/output error"
    assert events == []


async def test_held_writes_leave_the_committer_asleep_when_the_reader_syncs_them(monkeypatch: Any) -> None:
    synced = _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        turns: list[int] = []
        real = committer.sync_now

        async def counted() -> None:
            turns.append(committer.epoch)
            await real()

        monkeypatch.setattr(committer, "sync_now", counted)
        src = Source(5)
        committer.hold()
        src.dirty = True
        epoch = committer.note_write(src)
        assert not committer._work.is_set()  # not woken
        assert committer.sync_if_idle() is True and committer.is_durable(epoch)
        committer.unhold()
        await trio.testing.wait_all_tasks_blocked()
        assert synced == [[5]] and turns == [] and not committer._work.is_set()
        nursery.cancel_scope.cancel()


async def test_held_writes_nobody_synced_wake_the_committer_at_the_unhold(monkeypatch: Any) -> None:
    synced = _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        src = Source(5)
        committer.hold()
        src.dirty = True
        epoch = committer.note_write(src)
        await trio.testing.wait_all_tasks_blocked()
        assert synced == [] and not committer.is_durable(epoch)  # held: (no await is allowed here in a session)
        committer.unhold()
        await trio.testing.wait_all_tasks_blocked()
        assert synced == [[5]] and committer.is_durable(epoch)
        nursery.cancel_scope.cancel()


async def test_a_hold_covers_only_its_own_task_and_counts_others_queued(monkeypatch: Any) -> None:
    synced = _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        mine, theirs = Source(5), Source(6)
        committer.hold()

        async def other_writer() -> None:
            theirs.dirty = True
            committer.note_write(theirs)  # another task's write wakes the committer at once

        nursery.start_soon(other_writer)
        mine.dirty = True
        committer.note_write(mine)
        # The other writer is queued (its write would join the group): left to the committer.
        assert committer.sync_if_idle() is False
        committer.unhold()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(fd for fds in synced for fd in fds) == [5, 6]  # (one sync or two: trio picks the order)
        assert committer.is_durable(committer.epoch - 1)
        nursery.cancel_scope.cancel()


async def test_a_hold_never_missed_leaves_writes_unsynced(monkeypatch: Any) -> None:
    """A second hold without the unhold of the first (a bug) wakes the committer for
    the first one's writes."""
    synced = _recording(monkeypatch)
    async with trio.open_nursery() as nursery:
        committer = await _committer(nursery)
        src = Source(5)
        committer.hold()
        src.dirty = True
        committer.note_write(src)
        committer.hold()
        assert committer._work.is_set()
        committer.unhold()
        await trio.testing.wait_all_tasks_blocked()
        assert synced == [[5]]
        nursery.cancel_scope.cancel()
