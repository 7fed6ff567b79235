"""Deletions by ``max_msgs_per_subject`` are deferred (``Retention.remove``): at
``always`` a KV put is acknowledged after one sync, of its own record, and the
deletion of the revision it replaces is synced within a second, at an update of the
topic, or at a clean stop. A power loss in between (``fsmodel``: only what was
synced survives) loses those deletions, and recovery makes them again from the log
and the catalog's configuration before anything is read, so every subject still
holds exactly its newest messages. A consumer that may dead-letter what a limit
removes keeps the removal in the sync of its copy (nothing deferred)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import make_config, start_server
from test_kill9_features import read_topic

from broker.client import Client, connect

try:  # tests/fault as a package or as a rootdir-relative folder
    from .fsmodel import CrashState, FsModel
except ImportError:
    from fsmodel import CrashState, FsModel

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the model reads descriptors back through /proc/self/fd")

PUTS, KEYS = 60, 5
NEWEST = [(f"k.{j}", f"v{PUTS - KEYS + j}".encode()) for j in range(KEYS)]


def _config(data: Path) -> Any:
    return make_config(data, **{"system.partition.fsync": "always"})


def _deferred(handle: Any) -> int:
    """Segments holding deferred deletions no sync has taken."""
    topic = next(t for t in handle.broker.catalog.topics() if t.name == "kv")
    return sum(len(p.log.deferred_segments) for p in topic.partitions)


async def all_messages(c: Client, stream: str, topic: str) -> list[Any]:
    assert stream == "s"
    return list((await read_topic(c, topic, 1)).values())


async def _put_all(c: Client) -> None:
    for i in range(PUTS):  # each acknowledged, so synced at ``always``
        await c.publish(f"k.{i % KEYS}", f"v{i}".encode())


async def _restart_on(state: CrashState, dest: Path, torn: bool = False) -> tuple[list[tuple[str, bytes]], int]:
    """The image's topic after a start on it, and how many removals recovery made
    (``torn``: the image keeps part of what was written and not synced)."""
    image = state.materialize(dest, torn=torn, seed=3)
    async with start_server(_config(image / "data")) as handle:
        async with connect(handle.address, timeout=None) as c:
            messages = await all_messages(c, "s", "kv")
            return [(m.subject, m.payload) for m in messages], handle.broker.counters.removed_max_msgs_per_subject


@contextlib.asynccontextmanager
async def _kv_topic(root: Path) -> AsyncIterator[tuple[Any, Client]]:
    """A broker on ``root/data`` at ``always`` with the topic ``kv`` (history 1), and a client."""
    async with start_server(_config(root / "data")) as handle:
        async with connect(handle.address, timeout=None) as c:
            await c.create_stream("s")
            await c.create_topic("s", "kv", subjects=["k.>"], max_msgs_per_subject=1)
            yield handle, c


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root" / "data").mkdir(parents=True)
    return tmp_path / "root"


@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn"])
async def test_a_power_loss_loses_the_deferred_deletions_and_recovery_makes_them_again(
    mock_clock: Any, root: Path, tmp_path: Path, torn: bool,
) -> None:
    with FsModel(root) as fs:
        async with _kv_topic(root) as (handle, c):
            await c.create_consumer("s", "kv", "plain")  # (a consumer that dead-letters nothing defers)
            await _put_all(c)
            assert _deferred(handle) == 1  # (virtual time stands still: none is due)
            assert len(await all_messages(c, "s", "kv")) == KEYS
            state = fs.snapshot()
    kept, replayed = await _restart_on(state, tmp_path / "image", torn)
    assert sorted(kept) == NEWEST
    if not torn:
        assert replayed == PUTS - KEYS  # every deletion was lost with the power, and made again


async def test_deferred_deletions_are_synced_within_a_second(mock_clock: Any, root: Path, tmp_path: Path) -> None:
    with FsModel(root) as fs:
        async with _kv_topic(root) as (handle, c):
            await _put_all(c)
            mock_clock.jump(0.9)
            await trio.testing.wait_all_tasks_blocked()
            assert _deferred(handle) == 1
            committer = handle.broker.committer
            committer.last_sync_seconds = 1.0  # (as on a slow disk: the sync runs in the sync thread)
            mock_clock.jump(0.2)
            await trio.testing.wait_all_tasks_blocked()
            assert _deferred(handle) == 0
            while committer.synced < committer.epoch - 1:  # (a slow sync runs in the sync thread)
                await trio.sleep(0)
            state = fs.snapshot()
    kept, replayed = await _restart_on(state, tmp_path / "image")
    assert (sorted(kept), replayed) == (NEWEST, 0)


async def test_a_raised_limit_does_not_bring_back_what_the_old_one_removed(mock_clock: Any, root: Path, tmp_path: Path) -> None:
    """The update syncs the deferred deletions before its catalog write: recovery
    under the new limit (5) would otherwise keep five messages a subject."""
    with FsModel(root) as fs:
        async with _kv_topic(root) as (handle, c):
            await _put_all(c)
            await c.update_topic("s", "kv", max_msgs_per_subject=5)
            assert _deferred(handle) == 0
            state = fs.snapshot()
    kept, replayed = await _restart_on(state, tmp_path / "image")
    assert (sorted(kept), replayed) == (NEWEST, 0)


async def test_a_clean_stop_syncs_the_deferred_deletions(mock_clock: Any, root: Path, tmp_path: Path) -> None:
    with FsModel(root) as fs:
        async with _kv_topic(root) as (handle, c):
            await _put_all(c)
            assert _deferred(handle) == 1
        state = fs.snapshot()
    kept, replayed = await _restart_on(state, tmp_path / "image")
    assert (sorted(kept), replayed) == (NEWEST, 0)


async def test_nothing_is_deferred_while_a_consumer_may_dead_letter_it(mock_clock: Any, root: Path, tmp_path: Path) -> None:
    with FsModel(root) as fs:
        async with _kv_topic(root) as (handle, c):
            await c.create_topic("s", "dlq", subjects=["dlq.>"])
            await c.create_consumer("s", "kv", "owes", dead_letter_subject="dlq.kv", dead_letter_expired=True)
            await _put_all(c)
            assert _deferred(handle) == 0
            copies = await all_messages(c, "s", "dlq")
            assert len(copies) == PUTS - KEYS  # (each replaced revision was owed: never delivered)
            state = fs.snapshot()
    kept, replayed = await _restart_on(state, tmp_path / "image")
    assert (sorted(kept), replayed) == (NEWEST, 0)
