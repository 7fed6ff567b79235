"""A FastStream application against the NATS listener, unchanged: its default
JetStream subscriber (an ephemeral push consumer with acks), a queue group of two
subscribers, and a pull subscriber on a work-queue stream; FastStream declares the
streams and consumers itself at start."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
from helpers import in_asyncio


async def test_a_faststream_app_with_its_default_subscriber_a_queue_group_and_a_work_queue(nats_url: str) -> None:
    from faststream.nats import JStream, NatsBroker, PullSub
    from nats.js.api import RetentionPolicy

    async def scenario() -> dict[str, Any]:
        broker = NatsBroker(nats_url, logger=None)
        orders = JStream(name="FS", subjects=["fs.>"])
        jobs = JStream(name="WQ", subjects=["wq.>"], retention=RetentionPolicy.WORK_QUEUE)
        got: dict[str, list[str]] = {"default": [], "a": [], "b": [], "wq": []}
        enough = asyncio.Event()

        def note(key: str, msg: str) -> None:
            got[key].append(msg)
            if len(got["default"]) == 5 and len(got["a"]) + len(got["b"]) == 20 and len(got["wq"]) == 10:
                enough.set()

        @broker.subscriber("fs.orders", stream=orders)
        async def default(msg: str) -> None:
            note("default", msg)

        @broker.subscriber("fs.jobs", queue="workers", stream=orders)
        async def worker_a(msg: str) -> None:
            note("a", msg)

        @broker.subscriber("fs.jobs", queue="workers", stream=orders)
        async def worker_b(msg: str) -> None:
            note("b", msg)

        @broker.subscriber("wq.tasks", stream=jobs, durable="tasks", pull_sub=PullSub(batch_size=10))
        async def task(msg: str) -> None:
            note("wq", msg)

        out: dict[str, Any] = {}
        async with broker:
            await broker.start()
            for i in range(5):
                await broker.publish(f"o{i}", "fs.orders", stream="FS")
            for i in range(20):
                await broker.publish(f"j{i}", "fs.jobs", stream="FS")
            for i in range(10):
                await broker.publish(f"t{i}", "wq.tasks", stream="WQ")
            await asyncio.wait_for(enough.wait(), 10)
            nc = await nats.connect(nats_url)
            js = nc.jetstream()
            for _ in range(100):  # FastStream acks after each handler returns
                wq = await js.stream_info("WQ")
                consumers = await js.consumers_info("FS")
                if wq.state.messages == 0 and not any(ci.num_ack_pending for ci in consumers):
                    break
                await asyncio.sleep(0.02)
            out["wq_left"] = wq.state.messages
            out["fs_consumers"] = sorted(
                (ci.config.filter_subject, ci.config.deliver_group, str(getattr(ci.config.ack_policy, "value", ci.config.ack_policy)), ci.num_ack_pending)
                for ci in consumers
            )
            await nc.close()
        out["got"] = got
        return out

    r = await in_asyncio(scenario)
    got = r["got"]
    assert got["default"] == [f"o{i}" for i in range(5)]
    jobs = got["a"] + got["b"]
    assert sorted(jobs, key=lambda j: int(j[1:])) == [f"j{i}" for i in range(20)] and not set(got["a"]) & set(got["b"])
    assert sorted(got["wq"], key=lambda t: int(t[1:])) == [f"t{i}" for i in range(10)]
    assert r["wq_left"] == 0  # each task removed by its ack
    assert r["fs_consumers"] == [("fs.jobs", "workers", "explicit", 0), ("fs.orders", None, "explicit", 0)]
