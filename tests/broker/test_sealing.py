"""Segment rolls while publishing: the event loop does the switch only, the sealed
segment's index and summary files are written in a worker thread by the broker's
sealer task (``_sealing.py``), and a clean stop writes what is still owed."""

from __future__ import annotations

import threading
from pathlib import Path

import trio
from conftest import make_config, start_server

from broker.client import connect
from storage import Segment

SEALED_FILES = (".index", ".timeindex", ".summary")


async def _fill(c, segments: int) -> None:  # type: ignore[no-untyped-def]
    await c.create_stream("s")
    await c.create_topic("s", "t", subjects=["a.>"], segment_size=4096)
    for k in range(segments):  # ~4.4 KiB a batch: each batch after the first rolls
        await c.publish_batch([(f"a.{k}", b"x" * 400)] * 10)


async def test_rolls_write_the_seal_files_in_a_worker_thread(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    on_loop: list[bool] = []
    write = Segment.write_seal_files

    def spy(self: Segment, crc: int | None, sync_dir: bool = True) -> bool:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return write(self, crc, sync_dir)

    monkeypatch.setattr(Segment, "write_seal_files", spy)
    (tmp_path / "data").mkdir()
    async with start_server(make_config(tmp_path / "data")) as server, connect(server.address) as c:
        await _fill(c, 5)
        plog = server.broker.catalog.topics()[0].partitions[0].log
        await server.broker.sealer.finish(plog)
        assert plog.owed_seals == [] and len(plog.segments) == 5
        assert all(s.sealed and s.sealed_crc == s.crc for s in plog.segments[:-1])
        assert on_loop == [False] * 4
        for s in plog.segments[:-1]:
            for ext in SEALED_FILES:
                assert Path(s.log_path[:-4] + ext).exists(), ext
        assert len((await c.fetch("s", "t", 0, 1, count=100)).messages) == 50


async def test_a_clean_stop_writes_the_seals_still_owed(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from broker.core._sealing import Sealer

    async def idle(self: Sealer) -> None:  # the sealer task never gets to them
        await trio.sleep_forever()

    monkeypatch.setattr(Sealer, "run", idle)
    (tmp_path / "data").mkdir()
    cfg = make_config(tmp_path / "data")
    async with start_server(cfg) as server, connect(server.address) as c:
        await _fill(c, 4)
        plog = server.broker.catalog.topics()[0].partitions[0].log
        owed = [seg for seg, _ in plog.owed_seals]
        assert len(owed) == 3 and not any(s.sealed for s in owed)
        assert len((await c.fetch("s", "t", 0, 1, count=100)).messages) == 40  # readable meanwhile
    for s in owed:
        for ext in SEALED_FILES:
            assert Path(s.log_path[:-4] + ext).exists(), ext
    async with start_server(cfg) as server, connect(server.address) as c:
        assert (await c.stats())["damage_detected"] == 0
        assert len((await c.fetch("s", "t", 0, 1, count=100)).messages) == 40
