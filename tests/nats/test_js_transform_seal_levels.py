"""Stream ``subject_transform`` (ADR-30), ``first_seq``, ``sealed``, the API level
(ADR-44) and the refusals of ADR-49 counters and ADR-50 atomic batches, driven by
nats-py; every expected answer is what nats-server 2.15.1 gives for the same
requests (codes, err_codes and descriptions as it sends them)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import nats.js.errors as jse
from conftest import make_config, start_server
from helpers import in_asyncio, subscribed

import protocol.nats as PN

NS = 1_000_000_000


async def _js(url: str, fn: Callable[[Any, Any], Awaitable[Any]]) -> Any:
    async def scenario() -> Any:
        nc = await nats.connect(url)
        try:
            return await fn(nc, nc.jetstream())
        finally:
            await nc.close()

    return await in_asyncio(scenario)


async def _req(nc: Any, subject: str, body: Any = b"", headers: dict[str, str] | None = None) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    m = await nc.request(subject, raw, timeout=5, headers=headers)
    return json.loads(m.data) if m.data else m.headers


async def test_subject_transform_config_errors_as_the_server(nats_url: str) -> None:
    cases = [
        ({"src": "a.*", "dest": "b.$2"}, {"code": 400, "err_code": 10156, "description": "stream transform: invalid mapping destination: wildcard index out of range in $2: [2]"}),
        ({"src": "a.*", "dest": "b.*"}, {"code": 400, "err_code": 10156, "description": "stream transform: invalid subject"}),
        ({"src": "a.*", "dest": "b.{{foo(1)}}"}, {"code": 400, "err_code": 10156, "description": "stream transform: invalid mapping destination: unknown function in {{foo(1)}}"}),
        ({"src": "a..b", "dest": "x"}, {"code": 400, "err_code": 10155, "description": "stream transform source: invalid subject a..b"}),
        ({"src": "a.>.b", "dest": "x"}, {"code": 400, "err_code": 10155, "description": "stream transform source: invalid subject a.>.b"}),
    ]

    async def fn(nc: Any, js: Any) -> list[Any]:
        out = []
        for st, _ in cases:
            r = await _req(nc, "$JS.API.STREAM.CREATE.T", {"name": "T", "subjects": ["a.>"], "subject_transform": st})
            out.append(r["error"])
        # An empty dest is no transform, kept as given; an empty src is '>'.
        for st in ({"src": "a.*", "dest": ""}, {"src": "", "dest": "x.>"}):
            r = await _req(nc, "$JS.API.STREAM.CREATE.T", {"name": "T", "subjects": ["a.>"], "subject_transform": st})
            out.append(r["config"]["subject_transform"])
            await _req(nc, "$JS.API.STREAM.DELETE.T")
        return out

    out = await _js(nats_url, fn)
    assert out[: len(cases)] == [e for _, e in cases]
    assert out[len(cases) :] == [{"src": "a.*", "dest": ""}, {"src": "", "dest": "x.>"}]


async def test_a_transformed_stream_stores_the_new_subject(nats_url: str) -> None:
    """What nats-server shows: the message is acked, stored, got, counted and
    republished under the transformed subject; core subscribers get it on the
    subject it was published on; a subject src does not match is stored as is."""

    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        r = await _req(nc, "$JS.API.STREAM.CREATE.T2", {
            "name": "T2", "subjects": ["in.>"], "subject_transform": {"src": "in.*.*", "dest": "out.$2.$1"},
            "republish": {"src": ">", "dest": "rp.>"}, "max_msgs_per_subject": 1, "allow_msg_ttl": True,
        })
        out["config"] = r["config"]["subject_transform"]
        rp = await nc.subscribe("rp.>")
        core_in = await nc.subscribe("in.>")
        core_out = await nc.subscribe("out.>")
        await subscribed(nc)
        out["acks"] = [(await js.publish("in.x.y", b"1")).seq, (await js.publish("in.x", b"2")).seq]
        m = await rp.next_msg(5)
        out["rp"] = (m.subject, m.headers["Nats-Subject"])
        out["core_in"] = (await core_in.next_msg(5)).subject
        try:
            await core_out.next_msg(0.3)
            out["core_out"] = True
        except nats.errors.TimeoutError:
            out["core_out"] = False
        out["get"] = (await js.get_msg("T2", 1)).subject
        out["last"] = (await js.get_msg("T2", subject="out.y.x")).seq
        # A second message on another published subject with the same stored one:
        # max_msgs_per_subject counts the stored subject.
        await js.publish("in.x.y", b"3", headers={"Nats-TTL": "60s"})
        info = await _req(nc, "$JS.API.STREAM.INFO.T2", {"subjects_filter": ">"})
        out["state"] = {k: info["state"][k] for k in ("messages", "first_seq", "last_seq", "subjects")}
        # An update that leaves the transform out removes it, as nats-server.
        r = await _req(nc, "$JS.API.STREAM.UPDATE.T2", {"name": "T2", "subjects": ["in.>"], "allow_msg_ttl": True})
        out["removed"] = "subject_transform" in r["config"]
        out["after"] = (await js.get_msg("T2", (await js.publish("in.a.b", b"4")).seq)).subject
        return out

    out = await _js(nats_url, fn)
    assert out["config"] == {"src": "in.*.*", "dest": "out.$2.$1"}
    assert out["acks"] == [1, 2]
    assert out["rp"] == ("rp.out.y.x", "out.y.x")
    assert out["core_in"] == "in.x.y" and out["core_out"] is False
    assert out["get"] == "out.y.x" and out["last"] == 1
    assert out["state"] == {"messages": 2, "first_seq": 2, "last_seq": 3, "subjects": {"in.x": 1, "out.y.x": 1}}
    assert out["removed"] is False and out["after"] == "in.a.b"


async def test_implicit_republish_and_transformed_subjects_another_stream_captures(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        r = await _req(nc, "$JS.API.STREAM.CREATE.T3", {
            "name": "T3", "subjects": ["c.>"], "subject_transform": {"src": "c.>", "dest": "d.>"},
            "republish": {"src": ">", "dest": ">"},
        })
        out = [r["config"]["republish"]]
        # Another stream may capture what T3 stores: a stored subject is never routed again.
        r = await _req(nc, "$JS.API.STREAM.CREATE.T4", {"name": "T4", "subjects": ["d.>"]})
        out.append("error" in r)
        r = await _req(nc, "$JS.API.STREAM.CREATE.T5", {
            "name": "T5", "subjects": ["e.>"], "subject_transform": {"src": "e.>", "dest": "f.>"},
            "republish": {"src": ">", "dest": ">"}, "pedantic": True,
        })
        out.append(r["error"])
        return out

    out = await _js(nats_url, fn)
    assert out[0] == {"src": "d.>", "dest": "d.>"}
    assert out[1] is False
    assert out[2] == {"code": 400, "err_code": 10157, "description": "pedantic mode: implicit republish based on subject transform"}


async def test_first_seq(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        r = await _req(nc, "$JS.API.STREAM.CREATE.F", {"name": "F", "subjects": ["f.>"], "first_seq": 100})
        out["config"] = r["config"]["first_seq"]
        out["empty"] = (r["state"]["first_seq"], r["state"]["last_seq"])
        out["ack"] = (await js.publish("f.1", b"x")).seq
        info = await _req(nc, "$JS.API.STREAM.INFO.F")
        out["one"] = (info["state"]["first_seq"], info["state"]["last_seq"], info["state"]["messages"])
        # The server takes another first_seq in an update and reports it; the
        # sequence numbers do not move.
        r = await _req(nc, "$JS.API.STREAM.UPDATE.F", {"name": "F", "subjects": ["f.>"], "first_seq": 5})
        out["updated"] = r["config"]["first_seq"]
        out["next"] = (await js.publish("f.2", b"y")).seq
        r = await _req(nc, "$JS.API.STREAM.UPDATE.F", {"name": "F", "subjects": ["f.>"]})
        out["omitted"] = "first_seq" in r["config"]
        await _req(nc, "$JS.API.STREAM.PURGE.F")
        info = await _req(nc, "$JS.API.STREAM.INFO.F")
        out["purged"] = (info["state"]["first_seq"], info["state"]["last_seq"])
        r = await _req(nc, "$JS.API.STREAM.CREATE.G", {"name": "G", "subjects": ["g.>"], "first_seq": -1})
        out["negative"] = r["error"]["err_code"]
        return out

    out = await _js(nats_url, fn)
    assert out["config"] == 100 and out["empty"] == (100, 99)
    assert out["ack"] == 100 and out["one"] == (100, 100, 1)
    assert out["updated"] == 5 and out["next"] == 101
    assert out["omitted"] is False
    assert out["purged"] == (102, 101)
    assert out["negative"] == 10025


async def test_first_seq_survives_a_restart(data_dir: Path) -> None:
    config = make_config(data_dir, **{"nats.enabled": True})

    async def make(nc: Any, js: Any) -> None:
        await _req(nc, "$JS.API.STREAM.CREATE.R", {"name": "R", "subjects": ["r.>"], "first_seq": 7})

    async def after(nc: Any, js: Any) -> tuple[int, Any]:
        info = await _req(nc, "$JS.API.STREAM.INFO.R")
        return (await js.publish("r.1", b"x")).seq, (info["state"]["first_seq"], info["state"]["last_seq"])

    async with start_server(config) as first:
        await _js(first.nats_url or "", make)
    async with start_server(config) as second:
        assert await _js(second.nats_url or "", after) == (7, (7, 6))


async def test_sealed(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        r = await _req(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "sealed": True})
        out["create"] = r["error"]
        base = {"name": "S", "subjects": ["s.>"], "max_age": 3600 * NS, "allow_rollup_hdrs": True, "allow_msg_ttl": True}
        await _req(nc, "$JS.API.STREAM.CREATE.S", base)
        await js.publish("s.1", b"x")
        await js.publish("s.2", b"y")
        r = await _req(nc, "$JS.API.STREAM.UPDATE.S", {**base, "sealed": True})
        cfg = r["config"]
        out["sealed"] = {k: cfg[k] for k in ("sealed", "max_age", "discard", "deny_delete", "deny_purge", "allow_rollup_hdrs")}
        m = await nc.request("s.1", b"z", timeout=5)
        out["publish"] = json.loads(m.data)
        try:
            await js.publish("s.3", b"z")
        except jse.APIError as err:
            out["js_publish"] = (err.code, err.err_code, err.description)
        out["purge"] = (await _req(nc, "$JS.API.STREAM.PURGE.S"))["error"]
        out["delete"] = (await _req(nc, "$JS.API.STREAM.MSG.DELETE.S", {"seq": 1}))["error"]
        out["unseal"] = (await _req(nc, "$JS.API.STREAM.UPDATE.S", {"name": "S", "subjects": ["s.>"], "allow_msg_ttl": True}))["error"]
        info = await _req(nc, "$JS.API.STREAM.INFO.S")
        out["messages"] = info["state"]["messages"]
        out["recreate"] = (await _req(nc, "$JS.API.STREAM.CREATE.S", info["config"]))["error"]
        out["get"] = (await js.get_msg("S", 2)).data
        return out

    out = await _js(nats_url, fn)
    assert out["create"] == {"code": 500, "err_code": 10052, "description": "stream configuration for create can not be sealed"}
    assert out["sealed"] == {
        "sealed": True, "max_age": 0, "discard": "new", "deny_delete": True, "deny_purge": True, "allow_rollup_hdrs": False,
    }
    sealed = {"code": 400, "err_code": 10109, "description": "invalid operation on sealed stream"}
    assert out["publish"] == {"error": sealed, "stream": "S", "seq": 0}
    assert out["js_publish"] == (400, 10109, "invalid operation on sealed stream")
    assert out["purge"] == sealed and out["delete"] == sealed
    assert out["unseal"] == {"code": 500, "err_code": 10052, "description": "stream configuration update can not unseal a sealed stream"}
    assert out["messages"] == 2 and out["get"] == b"y"
    assert out["recreate"] == out["create"]  # a create of the sealed stream's own config


async def test_api_level_and_version(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"version": nc._server_info["version"]}
        await js.add_stream(name="L", subjects=["l.>"], allow_msg_ttl=True)
        out["account"] = (await _req(nc, "$JS.API.INFO"))["api"]["level"]
        out["meta"] = (await _req(nc, "$JS.API.STREAM.INFO.L"))["config"]["metadata"]
        for label, subject, level in [
            ("info99", "$JS.API.INFO", "99"), ("infoabc", "$JS.API.INFO", "abc"), ("stream3", "$JS.API.STREAM.INFO.L", "3"),
            ("missing3", "$JS.API.STREAM.INFO.NOPE", "3"), ("names9", "$JS.API.STREAM.NAMES", "9"),
            ("consumer9", "$JS.API.CONSUMER.INFO.L.C", "9"), ("stream2", "$JS.API.STREAM.INFO.L", "2"),
        ]:
            out[label] = await _req(nc, subject, b"", headers={"Nats-Required-Api-Level": level})
        m = await nc.request("$JS.API.DIRECT.GET.L", b'{"seq":1}', timeout=5, headers={"Nats-Required-Api-Level": "3"})
        out["direct"] = (m.headers or {}).get("Status"), (m.headers or {}).get("Description")
        await js.add_consumer("L", durable_name="C")
        m = await nc.request("$JS.API.CONSUMER.MSG.NEXT.L.C", b'{"batch":1}', timeout=5, headers={"Nats-Required-Api-Level": "3"})
        out["next"] = (m.headers or {}).get("Status"), (m.headers or {}).get("Description")
        out["totals"] = (await _req(nc, "$JS.API.INFO"))["api"]
        return out

    out = await _js(nats_url, fn)
    assert out["version"] == PN.NATS_VERSION == "2.12.0"
    assert out["account"] == PN.API_LEVEL == 2
    assert out["meta"] == {"_nats.req.level": "1", "_nats.ver": "2.12.0", "_nats.level": "2"}
    err = {"code": 412, "err_code": 10185, "description": "JetStream minimum api level required"}
    assert out["info99"] == {"type": "io.nats.jetstream.api.v1.account_info_response", "error": err}
    assert out["infoabc"] == out["info99"]
    paged = {"error": err, "total": 0, "offset": 0, "limit": 0}
    assert out["stream3"] == {"type": "io.nats.jetstream.api.v1.stream_info_response", **paged}
    assert out["missing3"] == out["stream3"]
    assert out["names9"] == {"type": "io.nats.jetstream.api.v1.stream_names_response", **paged, "streams": None}
    assert out["consumer9"] == {"type": "io.nats.jetstream.api.v1.consumer_info_response", "error": err}
    assert out["stream2"]["config"]["name"] == "L"
    assert out["direct"] == out["next"] == ("412", "Required Api Level")
    assert out["totals"]["errors"] >= 6


def test_one_line_per_stream_feature_level() -> None:
    """ADR-44's levels come from one table: what a config turns on sets the level."""
    assert PN.required_level({"allow_msg_ttl": False}) == 0
    assert PN.required_level({"subject_delete_marker_ttl": NS}) == 1
    levels = dict(PN.STREAM_FEATURE_LEVELS)
    assert levels["allow_msg_ttl"] == levels["subject_delete_marker_ttl"] == 1
    assert max(levels.values()) <= PN.API_LEVEL


async def test_counters_and_atomic_batches_are_refused_as_the_server(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        await js.add_stream(name="C", subjects=["cnt.>"])
        out = []
        for headers in (
            {"Nats-Incr": "1"},
            {"Nats-Batch-Id": "b1", "Nats-Batch-Sequence": "1", "Nats-Batch-Commit": "1"},
            {"Nats-Batch-Id": "b1"},
            {"Nats-Batch-Id": "b1", "Nats-Incr": "1"},
        ):
            m = await nc.request("cnt.1", b"", headers=headers, timeout=5)
            out.append(json.loads(m.data))
        for field in ("allow_msg_counter", "allow_atomic"):
            r = await _req(nc, "$JS.API.STREAM.CREATE.D", {"name": "D", "subjects": ["d.>"], field: True})
            out.append(r["error"])
        out.append((await _req(nc, "$JS.API.STREAM.INFO.C"))["state"]["messages"])
        return out

    out = await _js(nats_url, fn)
    incr = {"error": {"code": 400, "err_code": 10168, "description": "message counters is disabled"}, "stream": "C", "seq": 0}
    atomic = {"error": {"code": 400, "err_code": 10174, "description": "atomic publish is disabled"}, "stream": "C", "seq": 0}
    assert out[:4] == [incr, atomic, atomic, atomic]
    assert out[4] == {"code": 500, "err_code": 10052, "description": "allow_msg_counter (ADR-49 message counters) is not supported by ttlbroker"}
    assert out[5] == {"code": 500, "err_code": 10052, "description": "allow_atomic (ADR-50 atomic batch publishing) is not supported by ttlbroker"}
    assert out[6] == 0
