"""Stream limits and discard policies on the NATS listener (``broker/core/_limits.py``),
driven by nats-py: ``max_msgs``, ``max_bytes``, ``max_msg_size``, ``max_consumers``,
``discard`` old and new, ``discard_new_per_subject``, with nats-server's errors
(``server/store.go`` ErrMaxMsgs & co. answered as 503 10077, 10054, 10026) and its
config rules (``checkStreamCfg``)."""

from __future__ import annotations

from typing import Any

import nats.js.errors as jse
from nats.js.api import ConsumerConfig, DiscardPolicy, RetentionPolicy, StreamConfig

from broker import ServerHandle
from tests.nats.test_js_streams import _error, _js


async def _seqs(js: Any, stream: str) -> list[int]:
    si = await js.stream_info(stream)
    out = []
    for seq in range(si.state.first_seq, si.state.last_seq + 1):
        try:
            await js.get_msg(stream, seq)
        except jse.NotFoundError:
            pass
        else:
            out.append(seq)
    return out


async def test_discard_old_max_msgs_removes_oldest(nats_url: str, nats_server: ServerHandle) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        si = await js.add_stream(StreamConfig(name="OLD", subjects=["old.>"], max_msgs=3))
        acks = [(await js.publish(f"old.{i}", b"x")).seq for i in range(5)]
        info = await js.stream_info("OLD")
        return {"cfg": si.config, "acks": acks, "state": info.state, "seqs": await _seqs(js, "OLD")}

    out = await _js(nats_url, fn)
    assert (out["cfg"].max_msgs, out["cfg"].discard) == (3, DiscardPolicy.OLD)
    assert out["acks"] == [1, 2, 3, 4, 5]
    assert (out["state"].messages, out["state"].first_seq, out["state"].last_seq) == (3, 3, 5)
    assert out["seqs"] == [3, 4, 5]
    c = nats_server.broker.counters
    assert c.removed_limits == 2


async def test_discard_new_refuses_with_server_errors(nats_url: str, nats_server: ServerHandle) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        await js.add_stream(StreamConfig(name="NEW", subjects=["new.>"], max_msgs=2, discard=DiscardPolicy.NEW))
        out["ok"] = [(await js.publish("new.a", b"1")).seq, (await js.publish("new.b", b"2")).seq]
        out["msgs"] = await _error(js.publish("new.c", b"3"))
        out["state"] = (await js.stream_info("NEW")).state
        await js.add_stream(StreamConfig(name="BYTES", subjects=["bytes.>"], max_bytes=300, discard=DiscardPolicy.NEW))
        out["b1"] = (await js.publish("bytes.a", b"x" * 100)).seq
        out["bytes"] = await _error(js.publish("bytes.a", b"x" * 200))
        await js.add_stream(StreamConfig(name="SIZE", subjects=["size.>"], max_msg_size=10))
        out["s1"] = (await js.publish("size.a", b"x" * 10)).seq
        out["size"] = await _error(js.publish("size.a", b"x" * 11))
        out["size_hdr"] = await _error(js.publish("size.a", b"x" * 5, headers={"Hdr": "yyyyyyyyyy"}))
        await js.add_stream(StreamConfig(
            name="PER", subjects=["per.>"], max_msgs_per_subject=1, discard=DiscardPolicy.NEW,
            discard_new_per_subject=True, allow_rollup_hdrs=True,
        ))
        out["p1"] = (await js.publish("per.a", b"1")).seq
        out["per"] = await _error(js.publish("per.a", b"2"))
        out["p_other"] = (await js.publish("per.b", b"1")).seq
        out["p_rollup"] = (await js.publish("per.a", b"3", headers={"Nats-Rollup": "sub"})).seq
        out["per_state"] = (await js.stream_info("PER")).state
        return out

    out = await _js(nats_url, fn)
    assert out["ok"] == [1, 2]
    assert out["msgs"] == (503, 10077, "maximum messages exceeded")
    assert out["state"].messages == 2 and out["state"].last_seq == 2
    assert out["b1"] == 1
    assert out["bytes"] == (503, 10077, "maximum bytes exceeded")
    assert out["size"] == (400, 10054, "message size exceeds maximum allowed")
    assert out["size_hdr"] == (400, 10054, "message size exceeds maximum allowed")
    assert out["per"] == (503, 10077, "maximum messages per subject exceeded")
    assert (out["p1"], out["p_other"], out["p_rollup"]) == (1, 2, 3)
    assert out["per_state"].messages == 2
    assert nats_server.broker.counters.refused_limits == 5


async def test_discard_new_at_subject_limit_replaces(nats_url: str, nats_server: ServerHandle) -> None:
    """Discard new with max_msgs_per_subject (no per-subject refusal): a message on a
    subject at its limit replaces its oldest, so it passes max_msgs (the server's asl)."""

    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        await js.add_stream(StreamConfig(
            name="REP", subjects=["rep.>"], max_msgs=2, max_msgs_per_subject=1, discard=DiscardPolicy.NEW,
        ))
        await js.publish("rep.a", b"1")
        await js.publish("rep.b", b"1")
        replaced = (await js.publish("rep.a", b"2")).seq
        refused = await _error(js.publish("rep.c", b"1"))
        return {"replaced": replaced, "refused": refused, "state": (await js.stream_info("REP")).state}

    out = await _js(nats_url, fn)
    assert out["replaced"] == 3
    assert out["refused"] == (503, 10077, "maximum messages exceeded")
    assert out["state"].messages == 2


async def test_update_lowering_max_msgs_trims_at_once(nats_url: str, nats_server: ServerHandle) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        cfg = StreamConfig(name="LOW", subjects=["low.>"])
        await js.add_stream(cfg)
        for i in range(10):
            await js.publish(f"low.{i}", b"x")
        cfg.max_msgs = 4
        si = await js.update_stream(cfg)
        return {"state": si.state, "cfg": si.config, "seqs": await _seqs(js, "LOW")}

    out = await _js(nats_url, fn)
    assert out["cfg"].max_msgs == 4
    assert out["state"].messages == 4 and out["state"].first_seq == 7
    assert out["seqs"] == [7, 8, 9, 10]


async def test_max_bytes_discard_old(nats_url: str, nats_server: ServerHandle) -> None:
    async def fn(nc: Any, js: Any) -> Any:
        await js.add_stream(StreamConfig(name="MB", subjects=["mb.>"], max_bytes=1000))
        for i in range(20):
            await js.publish("mb.x", b"y" * 100)
        return (await js.stream_info("MB")).state

    st = await _js(nats_url, fn)
    assert st.bytes <= 1000 and st.messages >= 1 and st.last_seq == 20
    assert st.first_seq == 20 - st.messages + 1


async def test_max_consumers(nats_url: str, nats_server: ServerHandle) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        await js.add_stream(StreamConfig(name="MC", subjects=["mc.>"], max_consumers=2))
        await js.add_consumer("MC", ConsumerConfig(durable_name="d1"))
        await js.add_consumer("MC", ConsumerConfig())  # ephemeral: counts too
        again = await js.add_consumer("MC", ConsumerConfig(durable_name="d1"))  # the same: no new one
        third = await _error(js.add_consumer("MC", ConsumerConfig(durable_name="d3")))
        await js.delete_consumer("MC", "d1")
        after = await js.add_consumer("MC", ConsumerConfig(durable_name="d3"))
        return {"again": again.name, "third": third, "after": after.name, "cfg": (await js.stream_info("MC")).config}

    out = await _js(nats_url, fn)
    assert out["again"] == "d1"
    assert out["third"] == (400, 10026, "maximum consumers limit reached")
    assert out["after"] == "d3"
    assert out["cfg"].max_consumers == 2


async def test_config_rules(nats_url: str, nats_server: ServerHandle) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["per_needs_new"] = await _error(js.add_stream(StreamConfig(
            name="R1", subjects=["r1"], max_msgs_per_subject=1, discard_new_per_subject=True,
        )))
        out["per_needs_limit"] = await _error(js.add_stream(StreamConfig(
            name="R2", subjects=["r2"], discard=DiscardPolicy.NEW, discard_new_per_subject=True,
        )))
        si = await js.add_stream(StreamConfig(name="R3", subjects=["r3"], max_msgs=-5, max_bytes=0, max_consumers=-1))
        out["fixed"] = si.config
        raw = await nc.request(
            "$JS.API.STREAM.CREATE.R4", b'{"name":"R4","subjects":["r4"],"max_msgs":-5,"pedantic":true}', timeout=5,
        )
        out["pedantic"] = raw.data
        raw = await nc.request(
            "$JS.API.STREAM.CREATE.R5", b'{"name":"R5","subjects":["r5"],"max_msg_size":2147483648}', timeout=5,
        )
        out["int32"] = raw.data
        return out

    out = await _js(nats_url, fn)
    assert out["per_needs_new"] == (500, 10052, "discard new per subject requires discard new policy to be set")
    assert out["per_needs_limit"] == (500, 10052, "discard new per subject requires max msgs per subject > 0")
    c = out["fixed"]
    assert (c.max_msgs, c.max_bytes, c.max_consumers, c.max_msg_size) == (-1, -1, -1, -1)
    assert b'"code":400,"err_code":10157,"description":"pedantic mode: max_msgs must be set to -1"' in out["pedantic"]
    assert b'"err_code":10025' in out["int32"] and b"of type int32" in out["int32"]


async def test_workqueue_discard_old_ignores_acks(nats_url: str, nats_server: ServerHandle) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        await js.add_stream(StreamConfig(
            name="WQ", subjects=["wq.>"], retention=RetentionPolicy.WORK_QUEUE, max_msgs=2,
        ))
        sub = await js.pull_subscribe("wq.>", "w")
        for i in range(4):
            await js.publish(f"wq.{i}", b"x")
        msgs = await sub.fetch(5, timeout=2)
        return {"got": [m.metadata.sequence.stream for m in msgs], "state": (await js.stream_info("WQ")).state}

    out = await _js(nats_url, fn)
    assert out["got"] == [3, 4]
    assert out["state"].messages == 2
