"""JetStream push consumers with acknowledgements over the NATS listener, as NATS
applications create them: nats-py's ``js.subscribe`` (durable or ephemeral, manual
acks or acks after the callback, queue groups), and a push consumer made with
``add_consumer`` whose deliver subject nobody hears for a while.

Virtual time (``mock_clock``, moved from nats-py's side with :func:`jump`): an ack
wait passes without real time; nats-py's own timeouts are real time and only bound
how long a test waits for what the broker already decided.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import trio
import trio.testing
from helpers import in_asyncio, subscribed
from nats.js import api

STREAM = "ORDERS"


async def _advance(seconds: float) -> None:
    trio.lowlevel.current_clock().jump(seconds)  # type: ignore[attr-defined]
    await trio.testing.wait_all_tasks_blocked()


def jump(seconds: float) -> None:
    trio.from_thread.run(_advance, seconds)


async def _stream(js: Any, n: int = 0, start: int = 0) -> None:
    try:
        await js.add_stream(name=STREAM, subjects=["orders.>"])
    except nats.js.errors.APIError:
        pass
    for i in range(start, start + n):
        await js.publish(f"orders.{i}", b"m%d" % i)


async def _take(sub: Any, n: int, timeout: float = 2) -> list[Any]:
    out = []
    for _ in range(n):
        try:
            out.append(await sub.next_msg(timeout=timeout))
        except nats.errors.TimeoutError:
            break
    return out


async def test_a_durable_push_consumer_with_manual_acks_redelivers_what_is_not_acked(mock_clock: Any, nats_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        await _stream(js, 5)
        sub = await js.subscribe("orders.>", durable="work", manual_ack=True)
        out: dict[str, Any] = {}
        first = await _take(sub, 5)
        out["first"] = [(m.data, m.metadata.num_delivered, m.metadata.sequence.stream) for m in first]
        for m in first[:3]:
            await m.ack()
        info = await js.consumer_info(STREAM, "work")
        out["info"] = (info.config.deliver_subject is not None, info.num_ack_pending, info.num_pending, info.push_bound)
        jump(31)  # past the 30 s ack wait
        again = await _take(sub, 2)
        out["again"] = [(m.data, m.metadata.num_delivered) for m in again]
        for m in again:
            await m.ack_sync()
        out["none_left"] = await _take(sub, 1, timeout=0.3)
        info = await js.consumer_info(STREAM, "work")
        out["after"] = (info.num_ack_pending, info.num_redelivered, info.ack_floor.stream_seq, info.delivered.stream_seq)
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["first"] == [(b"m%d" % i, 1, i + 1) for i in range(5)]
    assert r["info"] == (True, 2, 0, True)
    assert r["again"] == [(b"m3", 2), (b"m4", 2)]
    assert r["none_left"] == []
    assert r["after"] == (0, 0, 5, 5)


async def test_an_ephemeral_push_consumer_acks_after_each_callback(mock_clock: Any, nats_url: str) -> None:
    """nats-py's first JetStream example: ``js.subscribe(subject, cb=...)`` (an
    ephemeral consumer, explicit acks sent by nats-py after the callback)."""

    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        await _stream(js, 3)
        seen: list[bytes] = []
        done = asyncio.Event()

        async def cb(msg: Any) -> None:
            seen.append(msg.data)
            if len(seen) == 6:
                done.set()

        sub = await js.subscribe("orders.>", cb=cb)
        await _stream(js, 3, start=3)
        await asyncio.wait_for(done.wait(), 5)
        await nc.flush()
        info = await sub.consumer_info()
        await nc.close()
        return {"seen": seen, "info": (info.config.ack_policy, info.config.durable_name, info.num_ack_pending, info.delivered.stream_seq)}

    r = await in_asyncio(scenario)
    assert r["seen"] == [b"m%d" % i for i in range(6)]
    assert r["info"] == (api.AckPolicy.EXPLICIT, None, 0, 6)


async def test_a_queue_group_gets_each_message_at_one_member(mock_clock: Any, nats_url: str) -> None:
    """``js.subscribe(subject, queue="workers")`` on two connections: one durable
    push consumer with that deliver group; each message reaches one worker."""

    async def scenario() -> dict[str, Any]:
        a, b = await nats.connect(nats_url), await nats.connect(nats_url)
        ja, jb = a.jetstream(), b.jetstream()
        await _stream(ja)
        got: dict[str, list[bytes]] = {"a": [], "b": []}
        done = asyncio.Event()

        def handler(name: str) -> Any:
            async def cb(msg: Any) -> None:
                got[name].append(msg.data)
                await msg.ack()
                if len(got["a"]) + len(got["b"]) == 60:
                    done.set()
            return cb

        await ja.subscribe("orders.>", queue="workers", cb=handler("a"), manual_ack=True)
        await jb.subscribe("orders.>", queue="workers", cb=handler("b"), manual_ack=True)
        for i in range(60):
            await ja.publish(f"orders.{i}", b"m%d" % i)
        await asyncio.wait_for(done.wait(), 5)
        await a.flush()
        await b.flush()
        info = await ja.consumer_info(STREAM, "workers")
        await a.close()
        await b.close()
        return {"got": got, "info": (info.config.deliver_group, info.num_ack_pending, info.delivered.stream_seq)}

    r = await in_asyncio(scenario)
    a, b = r["got"]["a"], r["got"]["b"]
    assert sorted(a + b, key=lambda d: int(d[1:])) == [b"m%d" % i for i in range(60)]
    assert not set(a) & set(b) and a and b  # each once, and both worked (p of failing: 2^-59)
    assert r["info"] == ("workers", 0, 60)


async def test_nothing_is_delivered_while_nobody_listens_and_nothing_is_lost(mock_clock: Any, nats_url: str) -> None:
    """A durable push consumer on ``dlv``: what is published while nobody subscribes
    to ``dlv`` waits; a subscriber that comes (back) gets it, in order."""

    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        await _stream(js)
        await js.add_consumer(STREAM, durable_name="later", deliver_subject="dlv", ack_policy="explicit")
        await _stream(js, 3)
        info = await js.consumer_info(STREAM, "later")
        out: dict[str, Any] = {"unbound": (info.num_pending, info.num_ack_pending, bool(info.push_bound))}
        sub = await nc.subscribe("dlv")
        first = await _take(sub, 3)
        for m in first:
            await nc.publish(m.reply, b"+ACK")
        await nc.flush()
        await sub.unsubscribe()
        await nc.flush()
        await _stream(js, 2, start=3)
        info = await js.consumer_info(STREAM, "later")
        out["away"] = (info.num_pending, info.num_ack_pending)
        sub = await nc.subscribe("dlv")
        second = await _take(sub, 2)
        out["data"] = [m.data for m in first + second]
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["unbound"] == (3, 0, False)
    assert r["away"] == (2, 0)
    assert r["data"] == [b"m%d" % i for i in range(5)]


async def test_a_deliver_subject_the_stream_captures_is_refused_as_a_cycle(mock_clock: Any, nats_url: str) -> None:
    """Each delivery would be stored again: nats-server refuses it (``10081``)."""

    async def scenario() -> tuple[Any, ...]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        await _stream(js)
        try:
            await js.add_consumer(STREAM, durable_name="loop", deliver_subject="orders.deliver")
        except nats.js.errors.APIError as err:
            return err.code, err.err_code, err.description
        finally:
            await nc.close()
        return ()

    assert await in_asyncio(scenario) == (400, 10081, "consumer deliver subject forms a cycle")


async def test_acks_reach_the_core_subscriptions_that_match_them(mock_clock: Any, nats_url: str) -> None:
    """As on nats-server, where a consumer's acks are one more subscription: a core
    subscriber of ``$JS.ACK.>`` sees each ack, plain or not, with its body, and the
    acks still settle. Without such a subscriber the read loop's fast ack path takes
    them (the first consumer); with one, every ack goes through it too."""

    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        watcher = await nats.connect(nats_url)
        js = nc.jetstream()
        await _stream(js, 4)
        sub = await js.subscribe("orders.>", durable="seen", manual_ack=True)
        before = await _take(sub, 2)
        for m in before:
            await m.ack()
        # The server has those acks before the watcher subscribes (one flush does not
        # prove it: its PING overtakes what is still in nats-py's buffer; see
        # helpers.subscribed, which does the same for SUBs).
        await subscribed(nc)
        acks = await watcher.subscribe("$JS.ACK.ORDERS.>")
        await subscribed(watcher)
        after = await _take(sub, 2)
        await after[0].ack()
        await after[1].nak()
        seen = [await acks.next_msg(timeout=5) for _ in range(2)]
        await nc.flush()
        info = await js.consumer_info(STREAM, "seen")
        await watcher.close()
        await nc.close()
        return {
            "seen": [(m.subject == a.reply, m.data) for m, a in zip(seen, after)],
            "info": (info.ack_floor.stream_seq, info.num_ack_pending, info.num_redelivered),
        }

    r = await in_asyncio(scenario)
    assert r["seen"] == [(True, b""), (True, b"-NAK")]  # nats-py acks with an empty body
    assert r["info"] == (3, 1, 1)  # the nak'd fourth is redelivered at once (nats-server: the same)


async def test_ack_all_settles_everything_up_to_the_acked_message(mock_clock: Any, nats_url: str) -> None:
    async def scenario() -> tuple[int, int]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        await _stream(js, 4)
        sub = await js.subscribe("orders.>", durable="all", manual_ack=True, config=api.ConsumerConfig(ack_policy=api.AckPolicy.ALL))
        msgs = await _take(sub, 4)
        await msgs[2].ack_sync()
        info = await js.consumer_info(STREAM, "all")
        await nc.close()
        return info.num_ack_pending, info.ack_floor.stream_seq

    assert await in_asyncio(scenario) == (1, 3)


async def test_flow_control_lets_delivery_run_ahead_of_its_request(mock_clock: Any, nats_url: str) -> None:
    """As nats-server: the flow-control request goes out once the bytes delivered and
    not yet answered pass half the limit (which starts at 2 MiB), and delivery goes on
    meanwhile up to the limit. 1,024 messages of 1 KiB (a little over 1 MiB) all reach
    a subscriber that never answers; 3,072 stop near 2 MiB until it does."""

    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        await _stream(js)
        await js.add_consumer(STREAM, api.ConsumerConfig(
            name="fc", deliver_subject="fc.in", ack_policy=api.AckPolicy.NONE, flow_control=True, idle_heartbeat=5.0,
        ))
        sub = await nc.subscribe("fc.in")
        body = b"x" * 1024
        for i in range(3072):
            await js.publish(f"orders.{i}", body)
        data: list[Any] = []
        requests: list[str] = []
        while True:
            try:
                m = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                break
            if m.headers and m.header.get("Status") == "100":  # not a message: a flow-control request
                requests.append(m.reply)
            elif not m.data and m.reply and m.reply.startswith("$JS.FC."):
                requests.append(m.reply)
            else:
                data.append(m)
        out: dict[str, Any] = {"before_reply": len(data), "requests": len(requests)}
        await nc.publish(requests[-1], b"")  # the answer: the rest comes
        while len(data) < 3072:
            try:
                m = await sub.next_msg(timeout=2)
            except nats.errors.TimeoutError:
                break
            if m.data:
                data.append(m)
            elif m.reply:
                await nc.publish(m.reply, b"")
        out["all"] = len(data)
        out["order"] = [int(m.subject.split(".")[1]) for m in data] == list(range(len(data)))
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["requests"] == 1
    assert 1024 < r["before_reply"] < 3072 and r["before_reply"] * 1024 <= 2 * 1024 * 1024 + 2048
    assert r["all"] == 3072 and r["order"]


async def test_rate_limit_bps_paces_a_push_consumer_after_its_burst(mock_clock: Any, tmp_path: Any) -> None:
    """``rate_limit_bps``, as the server's token bucket: a burst of the broker's max
    payload (here 4 KiB), then the configured rate (8,192 bits, 1 KiB, a second),
    on virtual time; a pull consumer may not have one (10086)."""
    from conftest import make_config, start_server

    config = make_config(tmp_path / "d", **{"nats.enabled": True, "limits.max_payload_bytes": 4096})
    async with start_server(config) as server:
        url = f"nats://{server.nats_host}:{server.nats_port}"

        async def scenario() -> dict[str, Any]:
            nc = await nats.connect(url)
            js = nc.jetstream()
            await _stream(js)
            body = b"x" * 1000
            for i in range(12):
                await js.publish(f"orders.{i}", body)
            await js.add_consumer(STREAM, api.ConsumerConfig(
                durable_name="slow", deliver_subject="slow.in", ack_policy=api.AckPolicy.NONE, rate_limit_bps=8192,
            ))
            sub = await nc.subscribe("slow.in")
            counts = [len(await _take(sub, 12, timeout=0.3))]
            for _ in range(3):
                jump(2.0)
                counts.append(len(await _take(sub, 12, timeout=0.3)))
            try:
                await js.add_consumer(STREAM, api.ConsumerConfig(durable_name="pull", rate_limit_bps=8192))
                refused: Any = None
            except nats.js.errors.APIError as err:
                refused = (err.code, err.err_code, err.description)
            await nc.close()
            return {"counts": counts, "refused": refused}

        r = await in_asyncio(scenario)
    counts = r["counts"]
    assert 3 <= counts[0] <= 5  # the burst: 4 KiB of ~1 KiB records
    assert all(1 <= n <= 3 for n in counts[1:])  # then ~2 records per 2 s
    assert sum(counts) <= 12
    assert r["refused"] == (400, 10086, "consumer in pull mode can not have rate limit set")


async def test_replay_original_keeps_the_gaps_between_the_stored_messages(mock_clock: Any, nats_url: str) -> None:
    """``replay_policy: original``: what the stream held when delivery started goes
    out with the gaps between the messages' timestamps (virtual time: published 0 s,
    5 s and 15 s apart), then live messages come at once."""

    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        await _stream(js)
        for i, gap in enumerate((0, 5, 10)):
            jump(gap)
            await js.publish(f"orders.{i}", b"m%d" % i)
        await js.add_consumer(STREAM, api.ConsumerConfig(
            durable_name="replay", deliver_subject="replay.in", ack_policy=api.AckPolicy.NONE,
            replay_policy=api.ReplayPolicy.ORIGINAL,
        ))
        sub = await nc.subscribe("replay.in")
        seen = [len(await _take(sub, 3, timeout=0.3))]
        for step in (4, 1.1, 8.8, 1.3):  # (timer entries fire within 10 ms after their deadline)
            jump(step)
            seen.append(len(await _take(sub, 3, timeout=0.3)))
        await js.publish("orders.live", b"live")
        seen.append(len(await _take(sub, 1, timeout=2)))
        info = await js.consumer_info(STREAM, "replay")
        await nc.close()
        return {"seen": seen, "policy": info.config.replay_policy}

    r = await in_asyncio(scenario)
    assert r["seen"] == [1, 0, 1, 0, 1, 1]  # m0 at once, m1 5 s later, m2 10 s after it, the live one at once
    assert r["policy"] == api.ReplayPolicy.ORIGINAL
