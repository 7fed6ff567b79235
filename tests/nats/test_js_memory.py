"""Memory storage (``storage: memory``, ``storage.MemoryPartitionLog``) through
nats-py: everything a file stream does, acks that never wait for a sync, the budget
(``[limits] memory_storage_bytes``) and restarts (clean and ``kill -9``): the
configuration and the consumers stay, the messages go, no offset is given out twice.
The bundled client's ``storage`` topic option is at the end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import nats.js.errors as jse
import pytest
import trio
import trio.testing
from conftest import BrokerProcess, make_config, start_server
from helpers import RawNats, api_request, in_asyncio
from nats.js.api import ConsumerConfig, StreamConfig
from test_js_nodejs import _node, node_nats  # noqa: F401 (the fixture that installs nats.js)
from test_js_streams import _error, _js

from broker import ServerHandle
import protocol.nats as PN
from broker.client import connect
from protocol import BrokerError, ErrorCode


async def test_memory_stream_as_a_file_stream_without_waiting_for_syncs(nats_url: str, nats_server: ServerHandle) -> None:
    """Publish, get (by sequence, by subject, direct), pull and push consumers with
    acks and redelivery, delete and purge on a memory stream, at ``fsync always``:
    the stream's info says memory, nothing is on disk but its state file, and no
    publish costs an fsync."""
    counters = nats_server.broker.counters

    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        si = await js.add_stream(name="M", subjects=["m.>"], storage="memory", allow_direct=True)
        out["storage"] = si.config.storage
        before = counters.fsyncs
        acks = [await js.publish(f"m.{i % 3}", b"v%d" % i) for i in range(30)]
        futures = [await js.publish_async("m.x", b"async%d" % i) for i in range(200)]
        await js.publish_async_completed()
        out["fsyncs"] = counters.fsyncs - before
        out["seqs"] = [a.seq for a in acks] + [f.result().seq for f in futures]
        out["get"] = (await js.get_msg("M", 4)).data
        out["last"] = (await js.get_msg("M", subject="m.1")).data
        out["direct"] = (await js.get_msg("M", subject="m.2", direct=True)).data
        sub = await js.pull_subscribe("m.0", "pull", config=ConsumerConfig(ack_wait=1))
        msgs = await sub.fetch(10)
        out["pulled"] = [m.data for m in msgs]
        for m in msgs[1:]:
            await m.ack()
        again = await sub.fetch(1, timeout=5)  # the unacked one, after its ack wait
        out["redelivered"] = (again[0].data, again[0].metadata.num_delivered)
        await again[0].ack()
        got: list[bytes] = []
        done = asyncio.Event()

        async def cb(msg: Any) -> None:
            got.append(msg.data)
            await msg.ack()
            if len(got) == 10:
                done.set()

        await js.subscribe("m.1", durable="push", cb=cb, manual_ack=True)
        await asyncio.wait_for(done.wait(), 5)
        out["pushed"] = got
        await js.delete_msg("M", 1)
        out["deleted"] = await _error(js.get_msg("M", 1))
        await js.purge_stream("M", subject="m.x")
        out["after_purge"] = (await js.stream_info("M")).state.messages
        return out

    out = await _js(nats_url, fn)
    assert out["storage"] == "memory"
    assert out["fsyncs"] == 0
    assert out["seqs"] == list(range(1, 231))
    assert out["get"] == b"v3"
    assert out["last"] == b"v28"
    assert out["direct"] == b"v29"
    assert out["pulled"] == [b"v%d" % i for i in range(0, 30, 3)]
    assert out["redelivered"] == (b"v0", 2)
    assert out["pushed"] == [b"v%d" % i for i in range(1, 30, 3)]
    assert out["deleted"] == (404, 10037, "no message found")
    assert out["after_purge"] == 29
    part = nats_server.broker.catalog.topics()[0].partitions[0]
    assert part.log.volatile
    assert sorted(p.name for p in Path(part.log.path).iterdir()) == ["partition.state"]
    assert nats_server.broker.memory_budget.used == part.log.size_bytes > 0


async def test_work_queue_and_interest_retention_on_memory(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> tuple[int, int]:
        await js.add_stream(name="WQ", subjects=["wq.>"], storage="memory", retention="workqueue")
        await js.add_stream(name="IN", subjects=["in.>"], storage="memory", retention="interest")
        wq = await js.pull_subscribe("wq.>", "w")
        await js.pull_subscribe("in.>", "i")
        for i in range(5):
            await js.publish("wq.a", b"%d" % i)
            await js.publish("in.a", b"%d" % i)
        for m in await wq.fetch(5):
            await m.ack_sync()
        return (await js.stream_info("WQ")).state.messages, (await js.stream_info("IN")).state.messages

    assert await _js(nats_url, fn) == (0, 5)


async def test_ttl_markers_and_republish_in_virtual_time(nats_url: str, mock_clock: trio.testing.MockClock) -> None:
    """Per-message TTL, max age, subject delete markers and republish on a memory
    stream, on the broker's virtual clock."""

    async def publish(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(StreamConfig(
            name="T", subjects=["t.>"], storage="memory", allow_msg_ttl=True, subject_delete_marker_ttl=5, max_age=60,
            republish={"src": "t.>", "dest": "copy.>"},
        ))
        sub = await nc.subscribe("copy.>")
        await js.publish("t.a", b"short", msg_ttl=30)
        await js.publish("t.b", b"aged")
        copy = await sub.next_msg(2)
        return [copy.subject, copy.data]

    assert await _js(nats_url, publish) == ["copy.a", b"short"]
    mock_clock.jump(31)
    await trio.testing.wait_all_tasks_blocked()

    async def read(nc: Any, js: Any) -> list[Any]:
        marker = await js.get_msg("T", subject="t.a")
        return [await _error(js.get_msg("T", 1)), marker.headers, (await js.get_msg("T", 2)).data]

    gone, marker, aged = await _js(nats_url, read)
    assert gone == (404, 10037, "no message found")
    assert marker == {"Nats-Marker-Reason": "MaxAge", "Nats-TTL": "5s", "Nats-Rollup": "sub"}
    assert aged == b"aged"
    mock_clock.jump(30)
    await trio.testing.wait_all_tasks_blocked()
    assert await _js(nats_url, lambda nc, js: _error(js.get_msg("T", 2))) == (404, 10037, "no message found")


async def test_kv_bucket_on_memory(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        kv = await js.create_key_value(bucket="cache", storage="memory", history=3)
        await kv.put("k", b"1")
        await kv.put("k", b"2")
        await kv.delete("k")
        await kv.put("j", b"x")
        hist = [e.operation for e in await kv.history("k")]
        status = await kv.status()
        return [(await kv.get("j")).value, hist, status.values, (await js.stream_info("KV_cache")).config.storage]

    j, hist, values, storage = await _js(nats_url, fn)
    assert j == b"x"
    assert hist == [None, None, "DEL"]
    assert values == 4
    assert storage == "memory"


async def test_storage_cannot_change_and_bad_values(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(name="F", subjects=["f.>"])
        await js.add_stream(name="M", subjects=["m.>"], storage="memory")
        return [
            await _error(js.update_stream(name="F", subjects=["f.>"], storage="memory")),
            await _error(js.update_stream(name="M", subjects=["m.>"], storage="file")),
            (await js.update_stream(name="M", subjects=["m.>", "n.>"], storage="memory")).config.storage,
            (await api_request(nc, "$JS.API.STREAM.CREATE.X", {"name": "X", "storage": "disk"}))["error"],
        ]

    out = await _js(nats_url, fn)
    refused = (500, 10052, "stream configuration update can not change storage type")
    assert out[0] == out[1] == refused
    assert out[2] == "memory"
    assert out[3] == {"code": 400, "err_code": 10025, "description": "invalid JSON: can not unmarshal 'disk' into StorageType"}


async def test_budget_refuses_publishes_past_it(data_dir: Path) -> None:
    """Past ``[limits] memory_storage_bytes`` a publish gets nats-server's 503 10023
    "insufficient resources" (our own protocol: MEMORY_STORAGE_FULL naming the
    budget), counted; what removed messages held is given back first; file streams
    are not affected."""
    config = make_config(data_dir, **{"nats.enabled": True, "limits.memory_storage_bytes": 4096})
    async with start_server(config) as srv:
        budget = srv.broker.memory_budget

        async def fn(nc: Any, js: Any) -> list[Any]:
            await js.add_stream(name="M", subjects=["m.>"], storage="memory")
            await js.add_stream(name="F", subjects=["f.>"])
            seqs = []
            while True:
                try:
                    seqs.append((await js.publish("m.a", b"x" * 100)).seq)
                except jse.APIError as err:
                    refused = (err.code, err.err_code, err.description)
                    break
            file_ack = (await js.publish("f.a", b"x" * 1000)).seq
            await js.purge_stream("M")
            after_purge = (await js.publish("m.a", b"x" * 100)).seq
            return [seqs, refused, file_ack, after_purge]

        seqs, refused, file_ack, after_purge = await _js(srv.nats_url, fn)
        assert refused == (503, 10023, "insufficient resources")
        assert len(seqs) == 4096 // (100 + 24 + 14 + len("m.a"))
        assert budget.used <= budget.limit
        assert file_ack == 1
        assert after_purge == len(seqs) + 1
        assert srv.broker.counters.memory_storage_refused == 1

        async with connect(srv.address) as c:
            while True:
                try:
                    await c.publish("m.a", b"y" * 100)
                except BrokerError as err:
                    assert err.code == ErrorCode.MEMORY_STORAGE_FULL
                    assert err.message == (
                        "insufficient resources: the memory storage budget ([limits] memory_storage_bytes = 4096 bytes) "
                        f"is used up ({budget.used} bytes held by memory-storage topics)"
                    )
                    break
            acks = await c.publish_batch([("m.a", b"z" * 100)] * 3)
            assert acks is not None and not acks.ok
            assert [a.status for a in acks] == [int(ErrorCode.MEMORY_STORAGE_FULL)] * 3
            stats = await c.stats()
            assert stats["memory_storage_bytes"] == budget.used
            assert stats["memory_storage_limit_bytes"] == 4096
            assert stats["memory_storage_refused"] == 5


async def test_no_memory_streams_with_a_budget_of_zero(data_dir: Path) -> None:
    """``memory_storage_bytes = 0``: a memory stream is refused as nats-server refuses
    one past its ``max_memory_store`` (500 10028); file streams are not."""
    config = make_config(data_dir, **{"nats.enabled": True, "limits.memory_storage_bytes": 0})

    async def fn(nc: Any, js: Any) -> list[Any]:
        body = {"name": "MEM", "subjects": ["mem.>"], "storage": "memory"}
        err = (await api_request(nc, "$JS.API.STREAM.CREATE.MEM", body))["error"]
        return [err, (await js.add_stream(name="F", subjects=["f.>"])).config.storage]

    async with start_server(config) as srv:
        err, storage = await _js(srv.nats_url, fn)
    assert err == {"code": 500, "err_code": 10028, "description": "insufficient memory resources available"}
    assert storage == "file"


async def test_restart_keeps_config_and_consumers_not_messages(data_dir: Path) -> None:
    """A clean restart: the memory stream and its durable consumer are there, its
    messages are not; the next sequence follows the last one given out; the
    consumer's delivered and ack floor are at the new first sequence - 1."""
    config = make_config(data_dir, **{"nats.enabled": True})

    async def before(nc: Any, js: Any) -> None:
        await js.add_stream(name="M", subjects=["m.>"], storage="memory")
        for i in range(5):
            await js.publish("m.a", b"%d" % i)
        sub = await js.pull_subscribe("m.>", "dur")
        msgs = await sub.fetch(3)
        await msgs[0].ack_sync()

    async def after(nc: Any, js: Any) -> list[Any]:
        si = await js.stream_info("M")
        ci = await js.consumer_info("M", "dur")
        seq = (await js.publish("m.a", b"new")).seq
        sub = await js.pull_subscribe("m.>", "dur")
        msgs = await sub.fetch(5, timeout=2)
        return [si.config.storage, si.state.messages, si.state.first_seq, si.state.last_seq, ci.delivered.stream_seq,
                ci.ack_floor.stream_seq, ci.num_ack_pending, ci.num_pending, seq,
                [(m.metadata.sequence.stream, m.data) for m in msgs]]

    async with start_server(config) as srv:
        await _js(srv.nats_url, before)
    async with start_server(config) as srv:
        out = await _js(srv.nats_url, after)
        assert srv.broker.memory_budget.used == srv.broker.catalog.topics()[0].size_bytes
    assert out == ["memory", 0, 6, 5, 5, 5, 0, 0, 6, [(6, b"new")]]


@pytest.mark.slow
async def test_kill_9_keeps_config_loses_messages_never_reuses_offsets(data_dir: Path) -> None:
    """kill -9 of a broker with a memory stream: after the restart the stream and its
    consumer are there, the messages are not, and the next sequence is beyond every
    one acknowledged before the kill (offsets are reserved ahead durably)."""
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always"))

    async def before() -> int:
        nc = await nats.connect(proc.nats_url)
        js = nc.jetstream()
        await js.add_stream(name="M", subjects=["m.>"], storage="memory")
        await js.add_stream(name="F", subjects=["f.>"])
        futures = [await js.publish_async("m.a", b"%d" % i) for i in range(3000)]
        await js.publish_async_completed()
        await js.publish("f.a", b"kept")
        await js.pull_subscribe("m.>", "dur")
        last = max(f.result().seq for f in futures)
        await nc.close()
        return last

    try:
        last = await in_asyncio(before)
        await trio.to_thread.run_sync(proc.kill9)
        proc2 = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always"))
        try:
            url = proc2.nats_url

            async def after() -> list[Any]:
                nc = await nats.connect(url)
                js = nc.jetstream()
                si = await js.stream_info("M")
                names = await js.consumers_info("M")
                seq = (await js.publish("m.a", b"after")).seq
                fmsg = (await js.get_msg("F", 1)).data
                await nc.close()
                return [si.config.storage, si.state.messages, [c.name for c in names], seq, fmsg]

            storage, messages, consumers, seq, fmsg = await in_asyncio(after)
        finally:
            await trio.to_thread.run_sync(proc2.stop)
    finally:
        if proc.proc.poll() is None:
            proc.kill9()
    assert (storage, messages, consumers, fmsg) == ("memory", 0, ["dur"], b"kept")
    assert last == 3000
    assert seq > last


async def test_nodejs_memory_stream_and_bucket(node_nats: Path, nats_url: str) -> None:  # noqa: F811
    out = await _node(node_nats / "memory.mjs", nats_url)
    assert out["storage"] == "memory"
    assert out["seqs"] == [1, 2, 3, 4, 5]
    assert out["last"] == [5, "m4"]
    assert out["fetched"] == [[i, f"m{i - 1}"] for i in range(1, 6)]
    assert out["state"] == [5, 1, 5]
    assert out["kv"] == ["v", "memory"]
    assert out["update"] == {"code": 500, "err_code": 10052, "description": "stream configuration update can not change storage type"}


async def test_acks_that_need_no_sync_go_out_while_the_rest_of_a_long_read_is_handled(
    nats_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A window of publishes in one write (what nats-py's ``publish_async`` sends): on
    a memory stream the first batch's PubAcks are sent while the read's later PUBs
    still wait to be handled, so the client can send more meanwhile; a file stream's
    acks wait for the sync that covers them (``fsync always``) and are never sent
    early. Every ack comes, in order."""
    from broker.net._transport import Reading, Transport

    early: list[bool] = []
    send_nowait = Transport.send_nowait

    def spy(self: Transport) -> bool:
        early.append(self.reading is Reading.HANDLING)
        return send_nowait(self)

    monkeypatch.setattr(Transport, "send_nowait", spy)
    raw = await RawNats.open(nats_url)
    try:
        await raw.connect()
        await raw.send(b"SUB _INBOX.a 1\r\n")
        for name, storage in (("MEMW", "memory"), ("FILEW", "file")):
            body = json.dumps({"name": name, "subjects": [f"{name.lower()}.>"], "storage": storage}).encode()
            await raw.send(b"PUB $JS.API.STREAM.CREATE.%s _INBOX.a %d\r\n%s\r\n" % (name.encode(), len(body), body))
            ev = await raw.next_event()
            assert isinstance(ev, PN.NatsMsg) and "error" not in json.loads(ev.payload), ev
            early.clear()
            n, payload = 600, b"x" * 100  # about 80 KB: several batches of one read
            window = b"".join(b"PUB %s.x _INBOX.a %d\r\n%s\r\n" % (name.lower().encode(), len(payload), payload) for _ in range(n))
            await raw.send(window)
            seqs = []
            for _ in range(n):
                ev = await raw.next_event()
                assert isinstance(ev, PN.NatsMsg), ev
                ack = json.loads(ev.payload)
                assert ack["stream"] == name, ack
                seqs.append(ack["seq"])
            assert seqs == list(range(1, n + 1))
            if storage == "memory":
                assert any(early), "no PubAck of the memory stream went out before the read was handled"
            else:
                assert not any(early), "a file stream's PubAck went out before its sync"
    finally:
        await raw.aclose()
