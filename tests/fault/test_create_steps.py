"""A power loss at any file operation of a topic's creation (``fsmodel``: only what
was synced survives, strict POSIX): the next start reports no damage, and the topic
is either not there or whole (it takes a message and serves it back). Once the
creation was answered, it is there. The creation makes its whole tree before the
first of its syncs (``storage.deferred_dir_syncs``), so this is what holds it to
"a file's data before its directory entry, every entry before the answer"."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import make_config, start_server
from test_kill9_features import read_topic

from broker.client import connect

try:  # tests/fault as a package or as a rootdir-relative folder
    from .fsmodel import CrashState, FsModel
except ImportError:
    from fsmodel import CrashState, FsModel

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the model reads descriptors back through /proc/self/fd")


def _config(data: Path) -> Any:
    return make_config(data, **{"system.partition.fsync": "always"})


async def _start_on(state: CrashState, dest: Path) -> tuple[bool, int]:
    """Whether the image has the topic (then it took a message and served it back),
    and the damage its start reported."""
    image = state.materialize(dest)
    async with start_server(_config(image / "data")) as handle:
        async with connect(handle.address, timeout=None) as c:
            names = [t.name for t in handle.broker.catalog.topics()]
            if "t" in names:
                await c.publish("t.x", b"after")
                assert [m.payload for m in (await read_topic(c, "t", 2)).values()] == [b"after"]
            return "t" in names, handle.broker.counters.damage_detected


async def test_a_power_loss_at_any_step_of_a_creation(mock_clock: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    states: list[tuple[str, CrashState]] = []
    with FsModel(root) as fs:
        async with start_server(_config(root / "data")) as handle:
            async with connect(handle.address, timeout=None) as c:
                await c.create_stream("s")
                first = fs.events
                for n in range(first + 1, first + 120):
                    fs.trigger_after(n, lambda m, n=n: states.append((f"after operation {n - first}", m.snapshot())))
                await c.create_topic("s", "t", subjects=["t.>"], partitions=2)
                answered = fs.events - first
                states.append(("answered", fs.snapshot()))
    assert 10 < answered < 119  # (every operation of the creation was a crash point)
    seen = set()
    for i, (label, state) in enumerate(states):
        there, damage = await _start_on(state, tmp_path / f"image{i}")
        assert damage == 0, label
        seen.add(there)
        if label == "answered":
            assert there
    assert seen == {False, True}
