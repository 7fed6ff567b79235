"""``ttlbroker check`` and ``ttlbroker repair`` on a stopped broker's data directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trio
from conftest import BrokerProcess, env_with_project, make_config, start_server

from broker.client import connect


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True, env=env_with_project(), timeout=60
    )


async def fill(data_dir: Path) -> None:
    async with start_server(make_config(data_dir)) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", partitions=2, subjects=["t.>"], segment_size=4096)
        for b in range(20):
            acks = await c.publish_batch([(f"t.{i}", f"m{b}.{i}".encode()) for i in range(30)])
            assert acks is not None and acks.ok
        await c.delete_message("s", "t", 0, 3)
        await c.store_offset("s", "t", "c1", 0, 5)


def flip(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        b = f.read(1)[0]
        f.seek(position)
        f.write(bytes([b ^ 0x10]))


async def test_check_a_clean_directory_exits_0(data_dir: Path) -> None:
    await fill(data_dir)
    p = tool("check", "--data", str(data_dir))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1].endswith("live record(s) verified; no damage found")
    assert "2 partition(s)" in p.stdout and "599 live record(s)" in p.stdout


async def test_check_reports_damage_repair_fixes_it_and_the_broker_serves_the_rest(data_dir: Path) -> None:
    await fill(data_dir)
    part = data_dir / "streams/1/topics/1/partitions/0"
    segments = sorted(part.glob("*.log"))
    flip(segments[1], 300)  # a record in a sealed segment
    flip(sorted(part.glob("*.del"))[0], 0)  # one copy of the deletions
    flip(sorted(part.glob("*.timeindex"))[2], 3)  # an index
    (data_dir / "streams/9").mkdir()  # something nobody accounts for
    before = {p.name: p.read_bytes() for p in part.iterdir() if p.is_file()}

    p = tool("check", "--data", str(data_dir))
    assert p.returncode == 1, p.stdout + p.stderr
    kinds = sorted(line.split(":")[0] for line in p.stdout.splitlines() if line.startswith("damage "))
    assert kinds == ["damage deletions", "damage segment", "damage time_index", "damage unknown_path"]
    assert "4 piece(s) of damage found (`ttlbroker repair` applies the fixes)" in p.stdout
    # A check changes nothing.
    assert {p.name: p.read_bytes() for p in part.iterdir() if p.is_file()} == before
    assert (data_dir / "streams/9").is_dir() and not (data_dir / "quarantine").exists()

    p = tool("repair", "--data", str(data_dir))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"moved {data_dir / 'streams/9'} to {data_dir / 'quarantine/streams/9'}" in p.stdout
    (written_off,) = [line for line in p.stdout.splitlines() if line.startswith("written off ")]
    lost = int(written_off.split("offset ")[1].split()[0])
    assert (data_dir / "quarantine/streams/9").is_dir()

    p = tool("check", "--data", str(data_dir))
    assert p.returncode == 0, p.stdout + p.stderr

    async with start_server(make_config(data_dir)) as h, connect(h.address) as c:
        got = []
        offset = 1
        while True:
            f = await c.fetch("s", "t", 0, offset, 1000)
            got.extend(m.offset for m in f.messages)
            if f.next_offset > f.last_offset:
                break
            offset = f.next_offset
        assert 3 not in got and lost not in got
        assert len(got) == f.last_offset - 2  # everything but the deleted and the written off
        assert await c.get_offset("s", "t", "c1", 0) == 5
        assert (await c.stats())["damage_detected"] == 0


async def test_check_refuses_a_running_broker_and_a_missing_directory(data_dir: Path, tmp_path: Path) -> None:
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir))
    try:
        p = tool("check", "--data", str(data_dir))
        assert p.returncode == 2
        assert p.stderr.strip() == f"error: STORAGE_FAILURE (4002): data directory {data_dir} is in use by a running broker; stop it first"
    finally:
        await trio.to_thread.run_sync(proc.stop)
    p = tool("repair", "--data", str(tmp_path / "nowhere"))
    assert p.returncode == 2
    assert "is not a directory; give the data directory of a stopped broker with --data" in p.stderr
