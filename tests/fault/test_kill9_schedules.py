"""kill -9 with message schedules pending (``broker/core/_schedules.py``): after the
restart every one-off schedule has fired exactly once (those whose time passed while
the broker was down at once), whether the kill came before, during or after its
firing, none is left behind, and a repeating one never produced the same firing twice."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import trio
from conftest import BrokerProcess

from broker.client import connect
from protocol.nats import rfc3339

NS = 1_000_000_000


def _at(ns: int) -> str:
    return "@at " + rfc3339(ns // NS * NS)


async def _messages(c, n: int = 10_000) -> list:  # type: ignore[no-untyped-def]
    out, offset = [], 1
    while True:
        f = await c.fetch("s", "t", 0, offset, n)
        out += f.messages
        if not f.messages or f.next_offset > f.last_offset:
            return out
        offset = f.next_offset


async def test_kill_9_with_schedules_pending_each_fires_exactly_once(data_dir: Path) -> None:
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always"))
    try:
        async with connect(proc.address) as c:
            await c.create_stream("s")
            await c.create_topic("s", "t", subjects=["a.>"], allow_msg_schedules=True)
            now = time.time_ns()
            await c.publish("a.rep", b"r", headers={"Nats-Schedule": "@every 1s", "Nats-Schedule-Target": "a.rep.out"})
            for k in range(10):  # due while the broker is down
                await c.publish(f"a.later.{k}", b"%d" % k, headers={
                    "Nats-Schedule": _at(now + 2 * NS), "Nats-Schedule-Target": f"a.out.later.{k}"})
            for k in range(30):  # due at once: firing while the kill comes
                await c.publish(f"a.now.{k}", b"%d" % k, headers={
                    "Nats-Schedule": _at(now - NS), "Nats-Schedule-Target": f"a.out.now.{k}"})
        proc.kill9()
        await trio.sleep(2.5)  # (a real process: its time passes)
        proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always"))
        async with connect(proc.address) as c:
            for _ in range(100):
                stats = await c.stats()
                if stats["pending_schedules"] == 1:
                    break
                await trio.sleep(0.05)
            await trio.sleep(0.3)
            msgs = await _messages(c)
            subjects = Counter(m.subject for m in msgs)
            for k in range(10):
                assert subjects[f"a.out.later.{k}"] == 1, k
                assert subjects[f"a.later.{k}"] == 0, k
            for k in range(30):
                assert subjects[f"a.out.now.{k}"] == 1, k
                assert subjects[f"a.now.{k}"] == 0, k
            nexts = [m.headers["Nats-Schedule-Next"] for m in msgs if m.subject == "a.rep.out"]
            assert nexts and len(nexts) == len(set(nexts))
            assert stats["pending_schedules"] == 1  # the repeating one
            assert stats["damage_detected"] == 0
    finally:
        proc.stop()
