"""The JetStream stream API of the NATS listener (``broker/nats/_streams.py``), driven
by nats-py against a real broker on loopback (``conftest.nats_server``). Errors are
asserted with the NATS server's exact ``code``, ``err_code`` and description."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import nats.js.errors as jse
import pytest
import trio
import trio.testing
from conftest import make_config, start_server
from helpers import RawNats, api_request, in_asyncio, run_cli, subscribed
from nats.js.api import RePublish, StreamConfig


import protocol.nats as PN
from broker import ServerHandle
from broker.client import connect
from protocol import BrokerError


async def _js(url: str, fn: Callable[[Any, Any], Awaitable[Any]]) -> Any:
    """Run ``fn(nc, js)`` with a nats-py connection (closed afterwards)."""

    async def scenario() -> Any:
        nc = await nats.connect(url)
        try:
            return await fn(nc, nc.jetstream())
        finally:
            await nc.close()

    return await in_asyncio(scenario)


async def _error(coro: Awaitable[Any]) -> tuple[int | None, int | None, str | None]:
    try:
        await coro
    except jse.APIError as err:
        return err.code, err.err_code, err.description
    raise AssertionError("no error")


async def test_create_info_names_list_delete(nats_url: str, nats_server: ServerHandle) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        cfg = StreamConfig(
            name="ORDERS", description="all orders", subjects=["orders.>"], max_age=3600, max_msgs_per_subject=5,
            allow_msg_ttl=True, subject_delete_marker_ttl=10, duplicate_window=60, allow_direct=True,
            republish=RePublish(src="orders.>", dest="copy.orders.>"), metadata={"team": "shop"},
        )
        si = await js.add_stream(cfg)
        out["created"] = si
        out["again"] = await js.add_stream(cfg)  # the same config: the stream's info
        cfg.max_msgs_per_subject = 7
        out["different"] = await _error(js.add_stream(cfg))
        for i in range(3):
            await js.publish(f"orders.{i % 2}", b"x" * 10)
        out["info"] = await js.stream_info("ORDERS", subjects_filter="orders.>")
        await js.add_stream(name="EVENTS", subjects=["events.*"])
        out["names"] = await js.streams_info()
        raw = await nc.request("$JS.API.STREAM.NAMES", b"{}", timeout=5)
        out["names_raw"] = json.loads(raw.data)
        raw = await nc.request("$JS.API.STREAM.NAMES", json.dumps({"subject": "events.x"}).encode(), timeout=5)
        out["names_filtered"] = json.loads(raw.data)["streams"]
        out["deleted"] = await js.delete_stream("EVENTS")
        out["gone"] = await _error(js.stream_info("EVENTS"))
        out["account"] = await js.account_info()
        return out

    out = await _js(nats_url, fn)
    si = out["created"]
    c = si.config
    assert (c.name, c.description, c.subjects, c.max_age, c.max_msgs_per_subject) == (
        "ORDERS", "all orders", ["orders.>"], 3600.0, 5,
    )
    assert (c.allow_msg_ttl, c.subject_delete_marker_ttl, c.duplicate_window, c.allow_direct) == (True, 10.0, 60.0, True)
    # the server's automatic fix: markers need roll-ups
    assert c.allow_rollup_hdrs is True and c.deny_purge is False
    # ADR-44: TTLs need API level 1; the server's version and level, as nats-server adds them.
    versioning = {"_nats.req.level": "1", "_nats.ver": "2.12.0", "_nats.level": "2"}
    assert (c.republish.src, c.republish.dest, c.metadata) == ("orders.>", "copy.orders.>", {"team": "shop", **versioning})
    assert (c.retention, c.storage, c.num_replicas, c.max_msgs, c.max_bytes) == ("limits", "file", 1, -1, -1)
    assert si.did_create is True and out["again"].config.name == "ORDERS"
    assert out["different"] == (400, 10058, "stream name already in use with a different configuration")
    st = out["info"].state
    assert (st.messages, st.first_seq, st.last_seq, st.consumer_count) == (3, 1, 3, 0)
    assert st.subjects == {"orders.0": 2, "orders.1": 1}
    assert [s.config.name for s in out["names"]] == ["EVENTS", "ORDERS"]
    assert out["names_raw"]["type"] == "io.nats.jetstream.api.v1.stream_names_response"
    assert (out["names_raw"]["total"], out["names_raw"]["streams"]) == (2, ["EVENTS", "ORDERS"])
    assert out["names_filtered"] == ["EVENTS"]
    assert out["deleted"] is True
    assert out["gone"] == (404, 10059, "stream not found")
    assert out["account"].streams == 1 and out["account"].api.level == 2
    # The same stream through our own client: the topic nats/orders.
    async with connect(nats_server.address) as client:
        t = await client.get_topic("nats", "orders")
    assert t.options["nats"]["name"] == "ORDERS" and t.message_expiry == 3600 and t.messages_count == 3
    shown = await trio.to_thread.run_sync(lambda: run_cli(nats_server.address, "topic", "info", "nats", "orders").stdout)
    assert "  NATS stream           ORDERS (allow direct)\n" in shown


async def test_api_requests_reach_the_core_subscriptions_that_match_them(nats_url: str, nats_server: ServerHandle) -> None:
    """As on nats-server, where the JetStream API is one more subscription: a core
    subscriber of ``$JS.API.>`` (NATS or ttlbroker) sees each request, with its reply
    subject, and the requester still gets its answer."""
    async with connect(nats_server.address) as ours:
        watched = await ours.subscribe("$JS.API.STREAM.>")

        async def fn(nc: Any, js: Any) -> dict[str, Any]:
            watcher = await nats.connect(nats_url)
            try:
                sub = await watcher.subscribe("$JS.API.>")
                await subscribed(watcher)
                info = await js.add_stream(name="WATCHED", subjects=["watched.>"])
                await js.stream_info("WATCHED")
                seen = [await sub.next_msg(timeout=10) for _ in range(2)]
                return {"info": info, "seen": [(m.subject, m.reply.startswith("_INBOX."), json.loads(m.data or b"{}")) for m in seen]}
            finally:
                await watcher.close()

        r = await _js(nats_url, fn)
        with trio.fail_after(5):
            ours_seen = [await watched.next() for _ in range(2)]
    assert r["info"].config.name == "WATCHED"
    assert [(subject, is_inbox) for subject, is_inbox, _ in r["seen"]] == [
        ("$JS.API.STREAM.CREATE.WATCHED", True), ("$JS.API.STREAM.INFO.WATCHED", True),
    ]
    assert r["seen"][0][2]["subjects"] == ["watched.>"]
    assert [m.subject for m in ours_seen] == ["$JS.API.STREAM.CREATE.WATCHED", "$JS.API.STREAM.INFO.WATCHED"]


async def test_refusals(nats_url: str) -> None:
    """What ttlbroker does not have is refused with the server's error shape."""

    async def fn(nc: Any, js: Any) -> list[Any]:
        cases = [
            StreamConfig(name="R", subjects=["r.>"], num_replicas=3),
            StreamConfig(name="R", subjects=["r.>"], sealed=True),
            StreamConfig(name="R", subjects=["r.>"], no_ack=True),
            StreamConfig(name="R", subjects=["r.>"], compression="s2"),
            StreamConfig(name="R", subjects=["r.>"], max_msgs_per_subject=1, discard_new_per_subject=True),
            StreamConfig(name="R", subjects=["r.>"], discard="new", discard_new_per_subject=True),
            StreamConfig(name="R", subjects=["r.>"], max_age=0.05),
            StreamConfig(name="R", subjects=["r.>"], max_age=1.5),
            StreamConfig(name="R", subjects=["r.>"], subject_delete_marker_ttl=0.5),
            StreamConfig(name="R", subjects=["r.>"], deny_purge=True, allow_rollup_hdrs=True),
        ]
        out = [await _error(js.add_stream(c)) for c in cases]
        raw = await nc.request(
            "$JS.API.STREAM.CREATE.M", json.dumps({"name": "M", "mirror": {"name": "ORDERS"}}).encode(), timeout=5
        )
        out.append(json.loads(raw.data))
        raw = await nc.request("$JS.API.STREAM.CREATE.A", json.dumps({"name": "B"}).encode(), timeout=5)
        out.append(json.loads(raw.data)["error"])
        raw = await nc.request("$JS.API.STREAM.CREATE.A", b"{nope", timeout=5)
        out.append(json.loads(raw.data)["error"]["err_code"])
        await js.add_stream(name="ONE", subjects=["one.>"])
        out.append(await _error(js.add_stream(name="TWO", subjects=["one.x"])))
        out.append(await _error(js.update_stream(StreamConfig(name="ONE", subjects=["one.>"], num_replicas=3))))
        out.append(await _error(js.stream_info("NOPE")))
        out.append(await _error(js.stream_info("NOPE")))
        return out

    out = await _js(nats_url, fn)
    assert out[0] == (500, 10074, "replicas > 1 not supported in non-clustered mode")
    assert out[1] == (500, 10052, "stream configuration for create can not be sealed")  # nats-server 2.15.1
    assert out[2] == (500, 10052, "no_ack is not supported by ttlbroker")
    assert out[3] == (500, 10052, "compression 's2' is not supported by ttlbroker")
    assert out[4] == (500, 10052, "discard new per subject requires discard new policy to be set")
    assert out[5] == (500, 10052, "discard new per subject requires max msgs per subject > 0")
    assert out[6] == (500, 10052, "max age needs to be >= 100ms")
    assert out[7] == (500, 10052, "max_age must be a whole number of seconds in ttlbroker, not 1500000000 ns")
    assert out[8] == (500, 10052, "subject delete marker TTL must be at least 1 second")
    assert out[9] == (500, 10052, "roll-ups require the purge permission")
    assert "error" not in out[10] and out[10]["config"]["mirror"] == {"name": "ORDERS"}  # (tests/nats/test_js_mirrors_sources.py)
    assert out[11] == {"code": 400, "err_code": 10056, "description": "stream name in subject does not match request"}
    assert out[12] == 10025
    assert out[13] == (400, 10065, "subjects overlap with an existing stream")
    assert out[14] == (500, 10074, "replicas > 1 not supported in non-clustered mode")
    assert out[15] == (404, 10059, "stream not found")


async def test_publish_acks_dedup_and_ttl_errors(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(name="S", subjects=["s.>"], duplicate_window=60)
        await js.add_stream(name="T", subjects=["t.>"], allow_msg_ttl=True)
        out: list[Any] = []
        out.append(await js.publish("s.a", b"1", headers={"Nats-Msg-Id": "m1"}))
        out.append(await js.publish("s.a", b"1", headers={"Nats-Msg-Id": "m1"}))
        out.append(await js.publish("s.a", b"2", headers={"Nats-Msg-Id": "m2"}))
        out.append(await _error(js.publish("s.a", b"x", msg_ttl=5)))
        out.append(await _error(js.publish("t.a", b"x", headers={"Nats-TTL": "abc"})))
        out.append(await _error(js.publish("t.a", b"x", headers={"Nats-TTL": "500ms"})))
        out.append(await js.publish("t.a", b"x", msg_ttl=30))
        out.append(await _error(js.publish("s.a", b"x", headers={"Nats-Expected-Last-Subject-Sequence": "1"})))
        out.append(await js.publish("s.a", b"y", headers={"Nats-Expected-Last-Subject-Sequence": "2"}))
        out.append(await _error(js.publish("s.a", b"x", headers={"Nats-Rollup": "sub"})))
        msg = await nc.request("s.b", b"raw", timeout=5)
        out.append(json.loads(msg.data))
        out.append((await js.get_msg("T", 1)).headers)
        return out

    out = await _js(nats_url, fn)
    assert (out[0].stream, out[0].seq, out[0].duplicate) == ("S", 1, None)
    assert (out[1].stream, out[1].seq, out[1].duplicate) == ("S", 1, True)
    assert (out[2].seq, out[2].duplicate) == (2, None)
    assert out[3] == (400, 10166, "per-message TTL is disabled")
    assert out[4] == (400, 10165, "invalid per-message TTL")
    assert out[5] == (400, 10165, "invalid per-message TTL")
    assert (out[6].stream, out[6].seq) == ("T", 1)
    assert out[7] == (400, 10071, "wrong last sequence: 2")
    assert out[8].seq == 3
    assert out[9] == (500, 10111, "rollup not permitted")
    assert out[10] == {"stream": "S", "seq": 4}
    assert out[11] == {"Nats-TTL": "30"}


async def test_get_delete_purge(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(name="G", subjects=["g.>"])
        for i in range(6):
            await js.publish(f"g.{i % 3}", f"v{i}".encode(), headers={"K": str(i)})
        out: list[Any] = []
        m = await js.get_msg("G", 2)
        out.append((m.subject, m.seq, m.data, m.headers))
        m = await js.get_msg("G", subject="g.0")
        out.append((m.subject, m.seq, m.data))
        raw = await nc.request("$JS.API.STREAM.MSG.GET.G", json.dumps({"seq": 1, "next_by_subj": "g.2"}).encode(), timeout=5)
        out.append(json.loads(raw.data)["message"]["seq"])
        out.append(await _error(js.get_msg("G", 99)))
        out.append(await _error(js.get_msg("G", subject="g.none")))
        out.append(await js.delete_msg("G", 2))
        out.append(await _error(js.get_msg("G", 2)))
        out.append(await _error(js.delete_msg("G", 2)))
        raw = await nc.request("$JS.API.STREAM.PURGE.G", json.dumps({"filter": "g.0"}).encode(), timeout=5)
        out.append(json.loads(raw.data))
        out.append((await js.stream_info("G")).state.messages)
        raw = await nc.request("$JS.API.STREAM.PURGE.G", json.dumps({"filter": "g.2", "keep": 1}).encode(), timeout=5)
        out.append(json.loads(raw.data)["purged"])
        raw = await nc.request("$JS.API.STREAM.PURGE.G", json.dumps({"seq": 6}).encode(), timeout=5)
        out.append((json.loads(raw.data)["purged"], (await js.stream_info("G")).state.first_seq))
        out.append(await js.purge_stream("G"))
        st = (await js.stream_info("G")).state
        out.append((st.messages, st.first_seq, st.last_seq))
        await js.add_stream(name="D", subjects=["d.>"], deny_delete=True, deny_purge=True)
        await js.publish("d.1", b"x")
        out.append(await _error(js.delete_msg("D", 1)))
        out.append(await _error(js.purge_stream("D")))
        return out

    out = await _js(nats_url, fn)
    assert out[0] == ("g.1", 2, b"v1", {"K": "1"})
    assert out[1] == ("g.0", 4, b"v3")
    assert out[2] == 3
    assert out[3] == (404, 10037, "no message found")
    assert out[4] == (404, 10037, "no message found")
    assert out[5] is True
    assert out[6] == (404, 10037, "no message found")
    assert out[7] == (400, 10043, "sequence 2 not found")  # between the first and the last: nats-server 2.15
    assert out[8] == {"type": "io.nats.jetstream.api.v1.stream_purge_response", "success": True, "purged": 2}
    assert out[9] == 3
    assert out[10] == 1  # of g.2's seq 3 and 6, the newest is kept
    assert out[11] == (1, 6)  # below seq 6: seq 5 (g.1)
    assert out[12] is True
    assert out[13] == (0, 7, 6)
    assert out[14] == (500, 10057, "message delete not permitted")
    assert out[15] == (500, 10110, "stream purge not permitted")


async def test_direct_get(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(name="DG", subjects=["dg.>"], allow_direct=True)
        await js.add_stream(name="ND", subjects=["nd.>"])
        await js.publish("dg.a", b"first", headers={"H": "1"})
        await js.publish("dg.b", b"second")
        out: list[Any] = []
        m = await js.get_msg("DG", 1, direct=True)
        out.append((m.subject, m.seq, m.data, m.headers))
        m = await js.get_msg("DG", subject="dg.b", direct=True)
        out.append((m.subject, m.seq, m.data))
        raw = await nc.request("$JS.API.DIRECT.GET.DG.dg.a", b"", timeout=5)
        out.append(dict(raw.headers or {}))
        raw = await nc.request("$JS.API.DIRECT.GET.DG", json.dumps({"seq": 9}).encode(), timeout=5)
        out.append((raw.headers or {}).get("Status"))
        try:
            await js.get_msg("DG", subject="dg.none", direct=True)
        except jse.NotFoundError:
            out.append("not found")
        try:
            await nc.request("$JS.API.DIRECT.GET.ND.nd.a", b"", timeout=5)
        except nats.errors.NoRespondersError:
            out.append("no responders")
        return out

    out = await _js(nats_url, fn)
    assert out[0][:3] == ("dg.a", 1, b"first")
    assert out[0][3]["H"] == "1" and out[0][3]["Nats-Stream"] == "DG" and out[0][3]["Nats-Sequence"] == "1"
    assert out[1] == ("dg.b", 2, b"second")
    h = out[2]
    assert (h["Nats-Stream"], h["Nats-Subject"], h["Nats-Sequence"], h["H"]) == ("DG", "dg.a", "1", "1")
    assert h["Nats-Time-Stamp"].endswith("Z") and h["Nats-Time-Stamp"][:2] == "20"
    assert out[3] == "404"
    assert out[4:] == ["not found", "no responders"]


async def test_update_stream(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(name="U", subjects=["u.>"])
        for i in range(4):
            await js.publish("u.k", str(i).encode())
        si = await js.update_stream(StreamConfig(name="U", subjects=["u.>", "v.>"], max_msgs_per_subject=2, allow_msg_ttl=True))
        ttl_off = await _error(js.update_stream(StreamConfig(name="U", subjects=["u.>"], allow_msg_ttl=False)))
        return [si.config.subjects, si.config.max_msgs_per_subject, si.state.messages, ttl_off]

    out = await _js(nats_url, fn)
    assert out[:3] == [["u.>", "v.>"], 2, 2]
    assert out[3] == (500, 10052, "message TTL status can not be disabled")



async def test_expected_headers(nats_url: str, nats_server: ServerHandle) -> None:
    """Nats-Expected-Stream, -Last-Sequence, -Last-Msg-Id and -Last-Subject-Sequence
    through nats-py (the server's numbers) and through our own client (ours)."""

    async def fn(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(name="E", subjects=["e.>"])
        out: list[Any] = [await js.publish("e.a", b"1", headers={"Nats-Msg-Id": "first"})]
        out.append(await js.publish("e.a", b"2", stream="E"))
        out.append(await _error(js.publish("e.a", b"x", stream="OTHER")))
        out.append(await js.publish("e.b", b"3", headers={"Nats-Expected-Last-Sequence": "2"}))
        out.append(await _error(js.publish("e.b", b"x", headers={"Nats-Expected-Last-Sequence": "2"})))
        out.append(await _error(js.publish("e.b", b"x", headers={"Nats-Expected-Last-Sequence": "two"})))
        out.append(await js.publish("e.c", b"4", headers={"Nats-Expected-Last-Msg-Id": "first", "Nats-Msg-Id": "second"}))
        out.append(await _error(js.publish("e.c", b"x", headers={"Nats-Expected-Last-Msg-Id": "first"})))
        return out

    out = await _js(nats_url, fn)
    assert [a.seq for a in (out[0], out[1], out[3], out[6])] == [1, 2, 3, 4]
    assert out[2] == (400, 10060, "expected stream does not match")
    assert out[4] == (400, 10071, "wrong last sequence: 3")
    assert out[5] == (400, 10071, "invalid Nats-Expected-Last-Sequence 'two'")
    assert out[7] == (400, 10070, "wrong last msg ID: second")
    async with connect(nats_server.address) as client:
        for headers, code, message in (
            ({"Nats-Expected-Stream": "nope"}, 6015, "expected stream does not match"),
            ({"Nats-Expected-Last-Msg-Id": "zzz"}, 6016, "wrong last msg ID: second"),
            ({"Nats-Expected-Last-Sequence": "1"}, 6012, "wrong last sequence: 4"),
        ):
            try:
                await client.publish("e.d", b"x", headers=headers)
            except BrokerError as err:
                assert (int(err.code), err.message) == (code, message)
            else:
                raise AssertionError(headers)
        ack = await client.publish("e.d", b"ok", headers={"Nats-Expected-Stream": "nats/e", "Nats-Expected-Last-Sequence": "4"})
        assert ack is not None and ack.offset == 5


def test_error_table_documented() -> None:
    """docs/protocol.md's NATS error table is protocol._jetstream.NATS_ERRORS."""
    import re
    from pathlib import Path

    from protocol.nats import NATS_ERRORS

    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    m = re.search(r"<!-- table: nats_errors -->\n(.*?)<!-- /table -->", text, re.S)
    assert m
    cells = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")] for line in m.group(1).splitlines()[2:]]
    rows = {r[0]: (int(r[1]), int(r[2]), None if r[3] == "(our message)" else r[3]) for r in cells}
    assert rows == {code.name: entry for code, entry in NATS_ERRORS.items()}


async def test_waiting_requests_are_bounded(nats_server: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catalog changes wait in the API's nursery; past MAX_WAITING_REQUESTS at once
    the rest are refused (429 10167), so a flood cannot grow memory without bound."""
    import broker.nats._jetstream

    monkeypatch.setattr(broker.nats._jetstream, "MAX_WAITING_REQUESTS", 4)
    js = nats_server.services.jetstream
    for i in range(6):
        js.request(f"$JS.API.STREAM.CREATE.F{i}", None, None, json.dumps({"name": f"F{i}", "subjects": [f"f{i}"]}).encode())
    assert (js.waiting, js.api_errors) == (4, 2)
    while js.waiting:
        await trio.sleep(0.01)
    assert [js.stream_name(t) for t in js.topics()] == ["F0", "F1", "F2", "F3"]


async def test_namespace_is_configurable(data_dir: Path) -> None:
    """``[nats] stream`` names the ttlbroker stream of the NATS streams (by the name rule)."""
    async with start_server(make_config(data_dir, **{"nats.enabled": True, "nats.stream": "JS Streams"})) as handle:
        assert handle.nats_url is not None
        await _js(handle.nats_url, lambda nc, js: js.add_stream(name="X", subjects=["x.>"]))
        async with connect(handle.address) as client:
            t = await client.get_topic("js.streams", "x")
    assert t.options["nats"]["name"] == "X"


async def test_pub_acks_wait_for_the_fsync_that_covers_them(
    nats_url: str, nats_server: ServerHandle, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under fsync ``always`` every PubAck (an awaited publish, each of a window of
    ``publish_async``, a KV put) reaches the client only after the sync that covers
    its message has completed, also when the sync runs in the sync thread."""
    from broker.core import _commit

    monkeypatch.setattr(_commit, "INLINE_SYNC_SECONDS", 0.0)
    counters = nats_server.broker.counters

    async def fn(nc: Any, js: Any) -> list[bool]:
        await js.add_stream(name="D", subjects=["d.>"])
        kv = await js.create_key_value(bucket="dk", history=1)
        after_sync: list[bool] = []
        for i in range(5):
            before = counters.fsyncs
            await js.publish("d.a", b"%d" % i)
            after_sync.append(counters.fsyncs > before)
            before = counters.fsyncs
            await kv.put(f"k{i}", b"v")
            after_sync.append(counters.fsyncs > before)
        before = counters.fsyncs
        futures = [await js.publish_async("d.b", b"%d" % i) for i in range(200)]
        for f in futures:
            f.add_done_callback(lambda _: after_sync.append(counters.fsyncs > before))
        await js.publish_async_completed()
        return after_sync

    assert await _js(nats_url, fn) == [True] * 210


async def test_answers_do_not_wait_for_an_interval_fsync(data_dir: Path) -> None:
    """Under an fsync interval, a delete's and a purge's answers go at once (as our
    acks do); only ``always`` makes them wait for the group commit."""
    config = make_config(data_dir, **{"nats.enabled": True, "system.partition.fsync": "2m"})
    async with start_server(config) as handle:
        assert handle.nats_url is not None

        async def fn(nc: Any, js: Any) -> list[Any]:
            await js.add_stream(name="I", subjects=["i.>"])
            for _ in range(3):
                await js.publish("i.a", b"x")
            return [await js.delete_msg("I", 1), (await js.purge_stream("I"))]

        assert await _js(handle.nats_url, fn) == [True, True]


async def test_bad_nested_values(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        out = []
        for body in ({"name": "B", "republish": {"src": 5, "dest": "x.>"}}, {"name": "B", "subjects": ["a..b"]}):
            raw = await nc.request("$JS.API.STREAM.CREATE.B", json.dumps(body).encode(), timeout=5)
            out.append(json.loads(raw.data)["error"])
        return out

    out = await _js(nats_url, fn)
    assert out[0] == {"code": 500, "err_code": 10052, "description": "option 'republish': 'src' must be str, not int"}
    assert out[1] == {"code": 500, "err_code": 10052, "description": "subject filter 'a..b' has an empty token"}


async def test_garbage_requests_are_answered_never_crash(nats_server: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random bodies on every stream API subject: each gets an answer, none of them
    an internal error (a bug), and the broker carries on."""
    import random

    import broker.nats._jetstream

    answers: list[bytes] = []
    monkeypatch.setattr(broker.nats._jetstream, "send_core", lambda b, subject, reply, headers, body, **kw: answers.append(body) or 1)
    js = nats_server.services.jetstream
    js.request("$JS.API.STREAM.CREATE.G", "r", None, json.dumps({"name": "G", "subjects": ["g.>"], "allow_direct": True}).encode())
    while js.waiting:
        await trio.sleep(0.01)
    rnd = random.Random(14)
    values: list[Any] = [None, True, -1, 0, 1, 2**70, 1.5, "", "x", "g.>", "*", [], ["g.a"], {}, {"a": 1}, [1, "x"]]
    keys = ["name", "seq", "last_by_subj", "next_by_subj", "filter", "keep", "subject", "offset", "subjects_filter",
            "subjects", "max_age", "republish", "num_replicas", "storage", "metadata", "deny_delete"]
    subjects = [f"$JS.API.STREAM.{op}.G" for op in ("INFO", "PURGE", "MSG.GET", "MSG.DELETE", "UPDATE")]
    subjects += ["$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", "$JS.API.DIRECT.GET.G", "$JS.API.DIRECT.GET.G.g.a"]
    for _ in range(400):
        body: Any = {k: rnd.choice(values) for k in rnd.sample(keys, rnd.randrange(4))}
        raw = rnd.choice([json.dumps(body).encode(), json.dumps(rnd.choice(values)).encode(), bytes(rnd.randbytes(5))])
        js.request(rnd.choice(subjects), "r", None, raw)
    with trio.fail_after(30):  # the catalog changes, and the answers that wait for the group commit
        while len(answers) < 401:
            await trio.sleep(0.01)
    assert len(answers) == 401
    assert not [a for a in answers if b"internal error" in a]


async def test_nats_ttl_expires_in_virtual_time(nats_url: str, mock_clock: trio.testing.MockClock) -> None:
    """A Nats-TTL publish expires on the broker's (virtual) clock and leaves the
    MaxAge marker nats-server would, read back through nats-py."""

    async def publish(nc: Any, js: Any) -> Any:
        await js.add_stream(name="T", subjects=["t.>"], allow_msg_ttl=True, subject_delete_marker_ttl=5)
        return await js.publish("t.a", b"short-lived", msg_ttl=30)

    async def read(nc: Any, js: Any) -> list[Any]:
        out: list[Any] = [await _error(js.get_msg("T", 1))]
        marker = await js.get_msg("T", subject="t.a")
        out.append((marker.seq, marker.data, marker.headers))
        out.append((await js.stream_info("T")).state.messages)
        return out

    ack = await _js(nats_url, publish)
    assert (ack.stream, ack.seq) == ("T", 1)
    mock_clock.jump(29)
    await trio.testing.wait_all_tasks_blocked()
    assert (await _js(nats_url, lambda nc, js: js.get_msg("T", 1))).data == b"short-lived"
    mock_clock.jump(2)
    await trio.testing.wait_all_tasks_blocked()
    out = await _js(nats_url, read)
    assert out[0] == (404, 10037, "no message found")
    assert out[1] == (2, None, {"Nats-Marker-Reason": "MaxAge", "Nats-TTL": "5s", "Nats-Rollup": "sub"})
    assert out[2] == 1


async def test_api_no_responders_bytes_go_to_the_requester_only(nats_url: str) -> None:
    """What JetStream does not serve (a direct get of a stream without
    ``allow_direct``, an unknown consumer's MSG.NEXT, an unknown API) answers as
    nats-server's core does for a subject nobody serves: one ``NATS/1.0 503`` with
    ``Nats-Subject``, to the requester's own subscription, and only when its CONNECT
    asked for no_responders. Another client subscribed to the inbox gets nothing."""
    await _js(nats_url, lambda nc, js: js.add_stream(name="ND", subjects=["nd.>"]))
    other = await RawNats.open(nats_url)
    await other.connect(headers=True, no_responders=True)
    await other.send(b"SUB _INBOX.> 1\r\nPING\r\n")
    assert await other.next_event() is PN.NatsPong
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=True, no_responders=True)
    await peer.send(b"SUB _INBOX.r.* 7\r\nPING\r\n")
    assert await peer.next_event() is PN.NatsPong
    for subject in ("$JS.API.DIRECT.GET.ND.nd.a", "$JS.API.DIRECT.GET.NOPE", "$JS.API.CONSUMER.MSG.NEXT.ND.nope",
                    "$JS.API.CONSUMER.FOO.ND", "$JS.API.STREAM.BOGUS"):
        await peer.send(b"PUB %s _INBOX.r.1 0\r\n\r\n" % subject.encode())
        status = b"NATS/1.0 503\r\nNats-Subject: " + subject.encode() + b"\r\n\r\n"
        assert await peer.next_event() == PN.NatsMsg("_INBOX.r.1", "7", None, status, b""), subject
    quiet = await RawNats.open(nats_url)
    await quiet.connect(headers=True)  # no_responders not asked for: no status
    await quiet.send(b"SUB _INBOX.q.* 1\r\nPUB $JS.API.DIRECT.GET.ND.nd.a _INBOX.q.1 0\r\n\r\nPING\r\n")
    assert await quiet.next_event() is PN.NatsPong
    await other.send(b"PING\r\n")
    assert await other.next_event() is PN.NatsPong  # nothing reached it before


async def test_msg_delete_refusals_as_the_servers_file_store(nats_url: str) -> None:
    """A sequence nothing is at: before the first (or 0) "no message found", past the
    last "stream store EOF" (both 500 10057), removed from between the first and the
    last 400 10043 "sequence N not found": nats-server 2.15.1's answers."""

    async def fn(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(name="MD", subjects=["md.>"])
        for i in range(5):
            await js.publish(f"md.{i}", b"x")
        await api_request(nc, "$JS.API.STREAM.PURGE.MD", {"seq": 2})  # seq 1 gone: first is 2
        await js.delete_msg("MD", 3)
        out = []
        for seq in (0, 1, 3, 6, 99):
            out.append((await api_request(nc, "$JS.API.STREAM.MSG.DELETE.MD", {"seq": seq}))["error"])
        out.append((await api_request(nc, "$JS.API.STREAM.MSG.DELETE.MD", {}))["error"])
        out.append(await api_request(nc, "$JS.API.STREAM.MSG.DELETE.MD", {"seq": 5}))
        return out

    out = await _js(nats_url, fn)
    e = lambda code, err_code, text: {"code": code, "err_code": err_code, "description": text}  # noqa: E731
    assert out == [
        e(500, 10057, "no message found"),
        e(500, 10057, "no message found"),
        e(400, 10043, "sequence 3 not found"),
        e(500, 10057, "stream store EOF"),
        e(500, 10057, "stream store EOF"),
        e(400, 10003, "bad request"),
        {"type": "io.nats.jetstream.api.v1.stream_msg_delete_response", "success": True},
    ]


async def test_stream_info_paging_and_first_seq_as_the_server(nats_url: str) -> None:
    """STREAM.INFO carries ``total``, ``offset`` and ``limit`` (0 without matching
    subjects; the subject count, the request's offset and 100,000 with them), the
    subjects sorted and paged; an empty stream that never held a message has
    ``first_seq`` 0 (after a purge: the one after the last)."""

    async def fn(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(name="PG", subjects=["pg.>"])
        out: list[Any] = []
        d = await api_request(nc, "$JS.API.STREAM.INFO.PG", b"")
        out.append((list(d)[:4], d["total"], d["offset"], d["limit"], d["state"]["first_seq"], d["state"]["last_seq"]))
        for s in ("pg.c", "pg.a", "pg.b", "pg.a"):
            await js.publish(s, b"x")
        for body in ({"subjects_filter": ">"}, {"subjects_filter": ">", "offset": 1}, {"subjects_filter": ">", "offset": 5},
                     {"subjects_filter": "none"}):
            d = await api_request(nc, "$JS.API.STREAM.INFO.PG", body)
            out.append((d["total"], d["offset"], d["limit"], d["state"].get("subjects")))
        await js.purge_stream("PG")
        d = await api_request(nc, "$JS.API.STREAM.INFO.PG", b"")
        out.append((d["state"]["first_seq"], d["state"]["last_seq"]))
        return out

    out = await _js(nats_url, fn)
    assert out[0] == (["type", "total", "offset", "limit"], 0, 0, 0, 0, 0)
    assert out[1] == (3, 0, 100_000, {"pg.a": 2, "pg.b": 1, "pg.c": 1})
    assert list(out[1][3]) == ["pg.a", "pg.b", "pg.c"]  # sorted, as Go writes a map
    assert out[2] == (3, 1, 100_000, {"pg.b": 1, "pg.c": 1})
    assert out[3] == (3, 5, 100_000, None)
    assert out[4] == (0, 0, 0, None)
    assert out[5] == (5, 4)


@pytest.mark.parametrize(
    ("subject", "body", "tail"),
    [
        ("$JS.API.STREAM.INFO.NOPE", b"", {}),
        ("$JS.API.STREAM.NAMES", b"{bad", {"streams": None}),
        ("$JS.API.STREAM.LIST", b"{bad", {"streams": []}),
        ("$JS.API.CONSUMER.NAMES.NOPE", b"", {"consumers": []}),
        ("$JS.API.CONSUMER.LIST.NOPE", b"", {"consumers": []}),
    ],
)
async def test_paged_error_responses_keep_their_page_fields(nats_url: str, subject: str, body: bytes, tail: dict[str, Any]) -> None:
    """A paged response's error carries ``total``, ``offset``, ``limit`` at 0 and its
    empty list after the error, as nats-server writes them."""
    d = await _js(nats_url, lambda nc, js: api_request(nc, subject, body))
    assert list(d) == ["type", "error", "total", "offset", "limit", *tail]
    assert (d["total"], d["offset"], d["limit"]) == (0, 0, 0)
    assert {k: d[k] for k in tail} == tail
    assert d["error"]["code"] in (400, 404)


async def test_stream_bytes_follow_the_live_messages(nats_url: str) -> None:
    """``state.bytes`` counts the live messages (ttlbroker's record sizes): a deletion
    and a filtered purge take theirs away at once, and no messages is no bytes."""

    async def fn(nc: Any, js: Any) -> list[tuple[int, int]]:
        await js.add_stream(name="BY", subjects=["by.>"])
        out = []
        for s in ("by.a", "by.b", "by.a"):
            await js.publish(s, b"payload")
            st = (await js.stream_info("BY")).state
            out.append((st.messages, st.bytes))
        await js.delete_msg("BY", 2)
        st = (await js.stream_info("BY")).state
        out.append((st.messages, st.bytes))
        await api_request(nc, "$JS.API.STREAM.PURGE.BY", {"filter": "by.a"})
        st = (await js.stream_info("BY")).state
        out.append((st.messages, st.bytes))
        return out

    out = await _js(nats_url, fn)
    one = out[0][1]
    assert one > 0
    assert out[:3] == [(1, one), (2, 2 * one), (3, 3 * one)]  # same-sized records
    assert out[3] == (2, 2 * one)
    assert out[4] == (0, 0)


async def test_invalid_rollup_is_worded_as_the_server(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        await js.add_stream(name="RU", subjects=["ru.>"], allow_rollup_hdrs=True)
        msg = await nc.request("ru.a", b"x", headers={"Nats-Rollup": 'bo"gus'}, timeout=5)
        return json.loads(msg.data)  # type: ignore[no-any-return]

    assert await _js(nats_url, fn) == {
        "error": {"code": 500, "err_code": 10111, "description": 'rollup value invalid: "bo\\"gus"'},
        "stream": "RU", "seq": 0,
    }


async def test_republish_config_omits_what_the_server_omits(nats_url: str) -> None:
    """The server's RePublish JSON: ``src`` and ``headers_only`` are ``omitempty``."""

    async def fn(nc: Any, js: Any) -> list[Any]:
        out = []
        for name, rp in (("RA", {"src": "ra.>", "dest": "x.ra.>"}), ("RB", {"src": "rb.>", "dest": "x.rb.>", "headers_only": True}),
                         ("RC", {"src": "rc.>", "dest": "x.rc.>", "headers_only": False})):
            d = await api_request(nc, f"$JS.API.STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name.lower()}.>"], "republish": rp})
            out.append(d["config"]["republish"])
        return out

    assert await _js(nats_url, fn) == [
        {"src": "ra.>", "dest": "x.ra.>"},
        {"src": "rb.>", "dest": "x.rb.>", "headers_only": True},
        {"src": "rc.>", "dest": "x.rc.>"},
    ]


async def test_update_is_a_whole_config(nats_url: str) -> None:
    """STREAM.UPDATE takes the request as the whole new config, as the server: a
    duplicate window it leaves out is the default again (2 minutes, or the max age
    when shorter), not the old value; a storage other than file is "can not change
    storage type"."""

    async def fn(nc: Any, js: Any) -> list[Any]:
        base = {"name": "UP", "subjects": ["up.>"]}
        await api_request(nc, "$JS.API.STREAM.CREATE.UP", base)
        out = []
        for change in ({"max_age": 30_000_000_000}, {"allow_msg_ttl": True}, {"allow_msg_ttl": True, "duplicate_window": 5_000_000_000},
                       {"storage": "memory"}):
            d = await api_request(nc, "$JS.API.STREAM.UPDATE.UP", {**base, **change})
            out.append(d.get("error") or d["config"]["duplicate_window"])
        return out

    assert await _js(nats_url, fn) == [
        30_000_000_000, 120_000_000_000, 5_000_000_000,
        {"code": 500, "err_code": 10052, "description": "stream configuration update can not change storage type"},
    ]


async def test_an_update_without_republish_removes_it(nats_url: str) -> None:
    """An update that leaves ``republish`` out, or sets it to null, has none, as on
    the server (the whole config): the copies stop."""

    async def fn(nc: Any, js: Any) -> list[Any]:
        base = {"name": "RPU", "subjects": ["rpu.>"]}
        rp = {"src": "rpu.>", "dest": "copy.rpu.>"}
        copies = await nc.subscribe("copy.rpu.>")
        out = []
        for update in ({**base, "republish": rp}, base, {**base, "republish": rp}, {**base, "republish": None}):
            d = await api_request(nc, "$JS.API.STREAM.UPDATE.RPU" if out else "$JS.API.STREAM.CREATE.RPU", update)
            await js.publish("rpu.a", b"x")
            try:
                m = await copies.next_msg(timeout=0.3)
                copied = m.subject
            except nats.errors.TimeoutError:
                copied = None
            out.append((d["config"].get("republish"), copied))
        return out

    rp = {"src": "rpu.>", "dest": "copy.rpu.>"}
    assert await _js(nats_url, fn) == [(rp, "copy.rpu.a"), (None, None), (rp, "copy.rpu.a"), (None, None)]


async def test_a_plain_stream_may_be_named_kv_something(nats_url: str) -> None:
    """nats-server creates a stream ``KV_<x>`` that is not a bucket (no roll-ups), and
    ``js.key_value`` then says it is a bad bucket; the stream is an ordinary one."""

    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        si = await js.add_stream(name="KV_plain", subjects=["plain.>"])
        await js.publish("plain.a", b"x")
        out: dict[str, Any] = {"created": (si.config.name, si.config.allow_rollup_hdrs)}
        try:
            await js.key_value("plain")
            out["bucket"] = "opened"
        except nats.js.errors.BadBucketError:
            out["bucket"] = "bad bucket"
        out["info"] = (await js.stream_info("KV_plain")).state.messages
        out["names"] = [s.config.name for s in await js.streams_info()]
        kv = await js.create_key_value(bucket="real")
        await kv.put("k", b"v")
        out["real"] = (await (await js.key_value("real")).get("k")).value
        out["again"] = await _error(js.create_key_value(bucket="plain"))
        out["deleted"] = await js.delete_stream("KV_plain")
        return out

    out = await _js(nats_url, fn)
    assert out["created"] == ("KV_plain", False)
    assert out["bucket"] == "bad bucket"
    assert out["info"] == 1
    assert out["names"] == ["KV_plain"]
    assert out["real"] == b"v"
    assert out["again"] == (400, 10058, "stream name already in use with a different configuration")
    assert out["deleted"] is True


async def test_a_header_name_with_a_space_is_stored(nats_url: str) -> None:
    """nats-server stores ``my key: v`` and gives it back; so do we (a name may have
    spaces between its characters). nats-py refuses to send such a name, so the
    publish is a raw HPUB, and its header parser drops it on the way back, so the
    stored block is read as the server's JSON gives it."""

    async def create(nc: Any, js: Any) -> None:
        await js.add_stream(name="HS", subjects=["hs.>"])

    await _js(nats_url, create)
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=True)
    hdr = b"NATS/1.0\r\nmy key: v\r\n\r\n"
    await peer.send(b"SUB _INBOX.h 1\r\nHPUB hs.a _INBOX.h %d %d\r\n%sx\r\n" % (len(hdr), len(hdr) + 1, hdr))
    ack = await peer.next_event()
    assert isinstance(ack, PN.NatsMsg) and json.loads(ack.payload) == {"stream": "HS", "seq": 1}

    async def read(nc: Any, js: Any) -> Any:
        return await api_request(nc, "$JS.API.STREAM.MSG.GET.HS", {"seq": 1})

    got = await _js(nats_url, read)
    assert base64.b64decode(got["message"]["hdrs"]) == hdr


async def test_a_publish_to_wildcard_tokens_is_stored_as_nats_server_stores_it(nats_url: str) -> None:
    """Outside ``pedantic``, nats-server stores a publish to ``hello.*`` (the tokens
    are literal): it is acked, a core ``hello.*`` subscription gets it and a
    ``hello.b`` one does not, and a last-by-subject get with a wildcard is the newest
    message the filter matches (the expected values are nats-server 2.15.1's)."""

    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        await js.add_stream(name="WILD", subjects=["hello.>"])
        star = await nc.subscribe("hello.*")
        literal = await nc.subscribe("hello.b")
        acks = [await js.publish(s, b"x") for s in ("hello.*", "hello.>")]
        got = (await star.next_msg(timeout=2)).subject
        try:
            other = (await literal.next_msg(timeout=0.3)).subject
        except nats.errors.TimeoutError:
            other = None
        last = await js.get_last_msg("WILD", "hello.*")
        subjects = (await js.stream_info("WILD", subjects_filter=">")).state.subjects
        return {"acks": [a.seq for a in acks], "got": got, "other": other, "last": (last.subject, last.seq), "subjects": subjects}

    assert await _js(nats_url, fn) == {
        "acks": [1, 2], "got": "hello.*", "other": None, "last": ("hello.>", 2), "subjects": {"hello.*": 1, "hello.>": 1},
    }


async def test_kv_purge_of_a_wildcard_key_and_object_store_list(nats_url: str) -> None:
    """nats-py's ``kv.purge("a.*")`` publishes a roll-up on ``$KV.b.a.*``, which
    nats-server stores and applies as a purge by that filter; ``ObjectStore.list()``
    asks for the last message of ``$O.b.M.>``. Both as on nats-server."""

    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        kv = await js.create_key_value(bucket="kvp", history=5)
        for k in ("a.x", "a.y", "b.x"):
            await kv.put(k, b"1")
        await kv.purge("a.*")
        si = await js.stream_info("KV_kvp", subjects_filter=">")
        obj = await js.create_object_store("files")
        await obj.put("one", b"1")
        await obj.put("two", b"22")
        listed = sorted(o.name for o in await obj.list())
        return {"keys": sorted(await kv.keys()), "state": (si.state.messages, si.state.subjects), "objects": listed}

    assert await _js(nats_url, fn) == {
        "keys": ["b.x"], "state": (2, {"$KV.kvp.a.*": 1, "$KV.kvp.b.x": 1}), "objects": ["one", "two"],
    }


async def test_a_message_on_wildcard_tokens_is_not_republished(nats_url: str, nats_server: ServerHandle) -> None:
    """nats-server stores ``rw.*`` but publishes no copy of it (checked against
    2.15.1); here the copy's subject is refused and counted as a dropped copy."""

    async def fn(nc: Any, js: Any) -> tuple[int, str | None]:
        await js.add_stream(name="RW", subjects=["rw.>"], republish=RePublish(src="rw.>", dest="copy.rw.>"))
        sub = await nc.subscribe("copy.rw.>")
        ack = await js.publish("rw.*", b"x")
        await js.publish("rw.a", b"y")
        return ack.seq, (await sub.next_msg(timeout=2)).subject

    assert await _js(nats_url, fn) == (1, "copy.rw.a")
    assert nats_server.broker.counters.dropped_invalid_subject == 1


async def test_adr44_versioning_metadata(nats_url: str) -> None:
    """Every stream and consumer info carries nats-server's ADR-44 keys: the API level
    its features require (TTLs, pausing: 1), and the server's version and level. A
    config read back from an info and created again is the same config (the keys
    are the server's, not the client's)."""

    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        plain = await js.add_stream(name="V0", subjects=["v0.>"])
        ttl = await js.add_stream(name="V1", subjects=["v1.>"], allow_msg_ttl=True)
        again = await api_request(nc, "$JS.API.STREAM.CREATE.V1", {**ttl.config.as_dict()})
        paused = await api_request(nc, "$JS.API.CONSUMER.CREATE.V0.p", {
            "stream_name": "V0", "config": {"durable_name": "p", "pause_until": "2099-01-01T00:00:00Z", "ack_policy": "explicit"},
        })
        return {
            "plain": plain.config.metadata, "ttl": ttl.config.metadata, "again": again.get("error"),
            "consumer": paused["config"]["metadata"],
        }

    out = await _js(nats_url, fn)
    server = {"_nats.ver": "2.12.0", "_nats.level": "2"}
    assert out["plain"] == {"_nats.req.level": "0", **server}
    assert out["ttl"] == {"_nats.req.level": "1", **server}
    assert out["again"] is None
    assert out["consumer"] == {"_nats.req.level": "1", **server}
