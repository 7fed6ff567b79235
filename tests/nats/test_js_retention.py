"""Work-queue and interest retention over the NATS listener, driven by nats-py, as
nats-server has them: a work queue removes a message once it is acked and keeps its
consumers' filters apart; an interest stream removes a message once every consumer
that wants it has acked it, and keeps nothing nobody wants. Counters stay exact.

Virtual time (``mock_clock``): nothing waits on an ack wait here unless moved.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import nats.js.errors as jse
from helpers import in_asyncio
from nats.js import api


async def _error(aw: Any) -> tuple[int, int, str]:
    try:
        await aw
    except jse.APIError as err:
        return err.code, err.err_code, err.description
    raise AssertionError("no error")


async def _fetch(psub: Any, n: int, timeout: float = 2) -> list[Any]:
    try:
        return list(await psub.fetch(n, timeout=timeout))
    except nats.errors.TimeoutError:
        return []


async def test_a_work_queue_removes_what_is_acked_and_four_workers_share_it(mock_clock: Any, nats_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        out: dict[str, Any] = {}
        info = await js.add_stream(name="JOBS", subjects=["jobs.>"], retention="workqueue")
        out["config"] = info.config.retention
        for i in range(40):
            await js.publish(f"jobs.{i % 4}", b"job%d" % i)
        workers = [await js.pull_subscribe("jobs.>", durable="workers") for _ in range(4)]
        seen: list[bytes] = []

        async def work(psub: Any) -> None:
            while True:
                msgs = await _fetch(psub, 3, timeout=0.5)
                if not msgs:
                    return
                for m in msgs:
                    seen.append(m.data)
                    await m.ack_sync()

        await asyncio.gather(*(work(w) for w in workers))
        out["seen"] = sorted(seen, key=lambda d: int(d[3:]))
        si = await js.stream_info("JOBS")
        out["state"] = (si.state.messages, si.state.first_seq, si.state.last_seq)
        ci = await js.consumer_info("JOBS", "workers")
        out["consumer"] = (ci.num_pending, ci.num_ack_pending, ci.delivered.stream_seq)
        for w in workers:  # their last requests wait on (virtual time stands still): nobody hears them now
            await w.unsubscribe()
        # Unacked work stays, and comes back.
        await js.publish("jobs.x", b"late")
        worker = await js.pull_subscribe("jobs.>", durable="workers")
        (m,) = await _fetch(worker, 1)
        si = await js.stream_info("JOBS")
        out["unacked"] = (m.data, si.state.messages)
        await m.ack_sync()
        si = await js.stream_info("JOBS")
        out["acked"] = si.state.messages
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["config"] == api.RetentionPolicy.WORK_QUEUE
    assert r["seen"] == [b"job%d" % i for i in range(40)]
    assert r["state"] == (0, 41, 40)
    assert r["consumer"] == (0, 0, 40)
    assert r["unacked"] == (b"late", 1)
    assert r["acked"] == 0


async def test_work_queue_consumer_rules_in_the_servers_words(nats_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        await js.add_stream(name="WQ", subjects=["wq.>"], retention="workqueue")
        out: dict[str, Any] = {}
        out["ack_none_pull"] = await _error(js.add_consumer("WQ", durable_name="a", ack_policy="none"))
        out["ack_all"] = await _error(js.add_consumer("WQ", durable_name="a", ack_policy="all"))
        out["deliver_new"] = await _error(js.add_consumer("WQ", durable_name="a", deliver_policy="new", ack_policy="explicit"))
        await js.add_consumer("WQ", durable_name="eu", filter_subject="wq.eu.>", ack_policy="explicit")
        out["unfiltered"] = await _error(js.add_consumer("WQ", durable_name="all", ack_policy="explicit"))
        out["overlap"] = await _error(js.add_consumer("WQ", durable_name="star", filter_subject="wq.*.x", ack_policy="explicit"))
        await js.add_consumer("WQ", durable_name="us", filter_subject="wq.us.>", ack_policy="explicit")
        out["update_overlap"] = await _error(js.add_consumer("WQ", durable_name="us", filter_subject="wq.>", ack_policy="explicit"))
        out["to_limits"] = await _error(js.update_stream(api.StreamConfig(name="WQ", subjects=["wq.>"], retention="limits")))
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["ack_none_pull"] == (400, 10084, "consumer in pull mode requires explicit ack policy on workqueue stream")
    assert r["ack_all"] == (400, 10098, "workqueue stream requires explicit ack")
    assert r["deliver_new"] == (400, 10101, "consumer must be deliver all on workqueue stream")
    assert r["unfiltered"] == (400, 10099, "multiple non-filtered consumers not allowed on workqueue stream")
    assert r["overlap"] == (400, 10100, "filtered consumer not unique on workqueue stream")
    assert r["update_overlap"] == (400, 10100, "filtered consumer not unique on workqueue stream")
    assert r["to_limits"] == (500, 10052, "stream configuration update can not change retention policy to/from workqueue")


async def test_interest_keeps_a_message_until_every_consumer_that_wants_it_acks(mock_clock: Any, nats_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        out: dict[str, Any] = {}
        await js.add_stream(name="EVENTS", subjects=["ev.>"], retention="interest")
        await js.publish("ev.a", b"nobody")  # no consumer yet: not kept
        si = await js.stream_info("EVENTS")
        out["nobody"] = (si.state.messages, si.state.last_seq)
        a = await js.pull_subscribe("ev.>", durable="a")
        b = await js.pull_subscribe("ev.b.>", durable="b")
        await js.publish("ev.a", b"for a")
        await js.publish("ev.b.1", b"for both")
        (m,) = await _fetch(a, 1)
        await m.ack_sync()
        out["a_acked_its_own"] = (await js.stream_info("EVENTS")).state.messages
        (m,) = await _fetch(a, 1)
        await m.ack_sync()
        out["a_acked_shared"] = (await js.stream_info("EVENTS")).state.messages
        (m,) = await _fetch(b, 1)
        await m.ack_sync()
        out["b_acked"] = (await js.stream_info("EVENTS")).state.messages
        await js.publish("ev.b.2", b"again")
        (m,) = await _fetch(a, 1)
        await m.ack_sync()
        await js.delete_consumer("EVENTS", "b")  # the last that wanted it
        out["after_delete"] = (await js.stream_info("EVENTS")).state.messages
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["nobody"] == (0, 1)
    assert r["a_acked_its_own"] == 1
    assert r["a_acked_shared"] == 1  # b still wants it
    assert r["b_acked"] == 0
    assert r["after_delete"] == 0
