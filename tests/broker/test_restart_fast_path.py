"""A restart that reads sealed segments through their summaries (one CRC-32 of the
file, no per-record check) rebuilds exactly the state a full record-by-record scan
rebuilds: the subject index (what max_msgs_per_subject, last-by-subject and markers
use), every TTL deadline, the pending flags and the Nats-Msg-Id table."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from ttl_helpers import advance, broker_and_client

import protocol as P
from broker import Clock
from broker.core import Broker
from broker.server import Services
from broker.core._topics import Partition
from conftest import make_config

ID = "Nats-Msg-Id"
_REBUILD = Partition.rebuild_index


async def load(data_dir: Path, seed: int) -> None:
    """Random publishes (TTLs, never, message ids, markers by max_msgs_per_subject and
    expiry), deletes and purges on small segments, in virtual time."""
    rng = random.Random(seed)
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        await c.create_topic(
            "s", "t", partitions=2, subjects=["a.>"], allow_msg_ttl=True, max_msgs_per_subject=4,
            subject_delete_marker_ttl=30, segment_size=4096,
        )
        for step in range(rng.randrange(10, 30)):
            action = rng.random() if step > 1 else 0.0
            if action < 0.7:
                batch = []
                for _ in range(rng.randrange(1, 40) if step > 1 else 60):
                    ttl = rng.choice([None, None, 5, 50, 3600, "never"])
                    headers = {ID: f"id-{rng.randrange(60)}"} if rng.random() < 0.3 else None
                    batch.append((f"a.{rng.randrange(12)}", b"x" * rng.randrange(100), headers, ttl))
                await c.publish_batch(batch)
            elif action < 0.85:
                p = rng.randrange(2)
                last = (await c.fetch("s", "t", p, 1, 1)).last_offset
                if last:
                    try:
                        await c.delete_message("s", "t", p, rng.randrange(1, last + 1))
                    except P.MessageNotFoundError:  # type: ignore[attr-defined]
                        pass  # already removed (deleted, expired, over the subject limit)
            elif action < 0.9:
                await c.purge("s", "t", subject=f"a.{rng.randrange(12)}")
            else:
                await advance(rng.choice([1, 6, 60]))  # some TTLs fall due, markers are written


def snapshot(broker: Broker) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for topic in broker.catalog.topics():
        for part in topic.partitions:
            index = part.index
            out[f"{topic.full_name}/{part.number}"] = (
                index.base, index.names, index.seq.tolist(), bytes(index.flags),
                {s: (t.sid, t.count, t.first, t.last) for s, t in index.subjects.items()},
                part.pending, part.log.live_count, part.log.next_offset,
            )
        out[f"{topic.full_name}/dedup"] = sorted((k, tuple(v)) for k, v in topic.dedup.ids.items())
    out["queue"] = broker.retention.engine.queue.entries()
    return out


def open_broker(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Broker, list[Any]]:
    """Open (recover) a broker on ``data_dir``; returns it and what each partition's
    rebuild gave (deadline groups and message ids)."""
    rebuilt: list[Any] = []

    def spy(self: Partition, msg_ids: Any = None, headed: Any = None) -> Any:
        groups = _REBUILD(self, msg_ids, headed)
        rebuilt.append((self.number, {k: list(v) for k, v in groups.items()}, None if msg_ids is None else list(msg_ids)))
        return groups

    monkeypatch.setattr(Partition, "rebuild_index", spy)
    broker = Services(Broker(make_config(data_dir), Clock())).broker  # with the consumers' and KV's hooks
    broker.open()
    return broker, rebuilt


@pytest.mark.parametrize("seed", range(6))
async def test_a_fast_restart_rebuilds_what_a_full_scan_rebuilds(
    autojump_clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int  # type: ignore[no-untyped-def]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    await load(data, seed)
    full = tmp_path / "full"
    shutil.copytree(data, full)
    summaries = list(full.rglob("*.summary"))
    assert summaries  # sealed segments were written with one
    for p in summaries:
        p.unlink()

    fast_broker, fast = open_broker(data, monkeypatch)
    full_broker, slow = open_broker(full, monkeypatch)
    try:
        assert fast == slow
        assert snapshot(fast_broker) == snapshot(full_broker)
        assert any(groups for _, groups, _ in fast)  # TTL deadlines were rebuilt
        # The full scan wrote the summaries again (of the segments it had to read).
        scanned = {
            Path(seg.summary_path).name for t in full_broker.catalog.topics() for p in t.partitions
            for seg in p.log.segments if seg.sealed and seg.live_count
        }
        assert scanned and {p.name for p in full.rglob("*.summary")} >= scanned
    finally:
        fast_broker.close()
        full_broker.close()
