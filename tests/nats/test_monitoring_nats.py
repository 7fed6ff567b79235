"""The monitoring port's nats-server endpoints (``/varz``, ``/connz``, ``/subsz``,
``/jsz``, ``/healthz``) beside a real nats-server (the binary, ``-js -m``): the same
state made on both through nats-py (a connection with subscriptions, a closed one, a
stream with a consumer and messages, a core message), then every document compared
key by key and JSON type by JSON type, ttlbroker's extra keys only those
docs/operations.md names; bad query parameters answered as nats-server answers
them; and the numbers checked against what the broker did.

nats-server runs once for the module (``reference``): its answers are collected up
front. Each ttlbroker is in process (``nats_server``), nats-py on an asyncio loop in
a worker thread (``helpers.in_asyncio``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from conftest import ROOT, make_config, start_server
from helpers import in_asyncio, subscribed
from test_remote_origin import _nats_server_bin

import broker.monitoring._connz as connz_module
from broker.client import connect
from broker.server import ServerHandle
from protocol.nats import pub_ack

#: The documents compared, as their paths.
DOCUMENTS = [
    "/varz", "/connz", "/connz?subs=1", "/connz?subs=detail", "/connz?state=closed", "/connz?auth=true&sort=msgs_from",
    "/subsz", "/subsz?subs=1", "/jsz", "/jsz?streams=true&consumers=true", "/jsz?accounts=true",
    "/jsz?accounts=true&streams=true&consumers=true&config=true", "/healthz", "/healthz?js-enabled-only=true",
    "/healthz?account=$G&stream=S&consumer=C", "/routez", "/routez?subs=detail", "/gatewayz", "/gatewayz?accs=true&subs=1",
    "/leafz", "/leafz?subs=true",
]
#: Requests nats-server refuses (or answers with an error document).
REFUSED = [
    "/connz?sort=bogus", "/connz?limit=x", "/connz?offset=abc", "/connz?cid=-1", "/connz?state=bogus", "/connz?subs=bogus",
    "/connz?auth=maybe", "/connz?sort=stop", "/connz?state=all&sort=reason", "/connz?limit=99999999999999999999",
    "/connz?limit=-9223372036854775809", "/connz?cid=18446744073709551616", "/connz?limit=%ff", "/connz?auth=%09",
    "/connz?sort=%ff", "/subsz?subs=1&test=a..b", "/subsz?subs=bogus", "/subsz?subs=1&test=core.*", "/subsz?limit=1.5",
    "/jsz?streams=bogus", "/jsz?consumers=yes", "/jsz?offset=x", "/healthz?js-enabled-only=x", "/healthz?details=2", "/healthz?stream=S", "/healthz?consumer=C",
    "/healthz?account=nope", "/healthz?account=$G&stream=nope", "/healthz?account=$G&stream=S&consumer=zz",
    "/healthz?account=$G&stream=nope&details=true", "/routez?subs=bogus", "/gatewayz?accs=x", "/gatewayz?subs=x&accs=y",
    "/leafz?subs=bogus",
]
#: Maps whose keys are data, not fields: only their values' types are compared.
FREE_MAPS = {"http_req_stats", "feature_flags", "metadata"}
#: ttlbroker's keys beyond nats-server's (in the reference's setup) below the top
#: level, each named in docs/operations.md (nats-server sends them too, when set).
NESTED_EXTRAS = {"/varz": {"jetstream.config.sync_always"}, "/jsz": {"config.sync_always"}}


# -- the state, on either server --------------------------------------------------------


async def _scenario(nats_url: str, http_url: str) -> dict[str, tuple[int, str, str]]:
    """Make the state, then fetch every path: path -> (status, content type, body)."""
    nc = await nats.connect(nats_url, name="tester")
    js = nc.jetstream()
    await js.add_stream(name="S", subjects=["s.>"])
    await js.add_consumer("S", durable_name="C", ack_policy="explicit")
    await nc.subscribe("core.>")
    gone = await nats.connect(nats_url, name="shortlived")
    await gone.subscribe("x.y", queue="q")
    await subscribed(gone)
    await gone.close()
    for _ in range(3):
        await js.publish("s.x", b"hello")
    await nc.publish("core.a", b"xyz")
    await subscribed(nc)
    out: dict[str, tuple[int, str, str]] = {}
    async with httpx.AsyncClient(base_url=http_url, timeout=10) as http:
        for _ in range(500):  # until the server has seen the close
            if (await http.get("/connz?state=closed")).json()["num_connections"]:
                break
        for path in DOCUMENTS + REFUSED:
            r = await http.get(path)
            out[path] = (r.status_code, r.headers.get("content-type", "").split(";")[0], r.text)
    await nc.close()
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    """nats-server's answers (a nats-server with JetStream and monitoring on free
    loopback ports, for the module)."""
    tmp = tmp_path_factory.mktemp("nats-server")
    with _nats_server(tmp) as (port, http_port):
        return asyncio.run(_scenario(f"nats://127.0.0.1:{port}", f"http://127.0.0.1:{http_port}"))


@pytest.fixture
def nats_config(data_dir: Path):  # type: ignore[no-untyped-def]
    return make_config(data_dir, **{"nats.enabled": True})


@contextlib.contextmanager
def _nats_server(tmp: Path) -> Iterator[tuple[int, int]]:
    """A nats-server with JetStream (``-js``) and monitoring (``-m``) on free loopback
    ports: (client port, monitoring port), from its log (no polling)."""
    proc = subprocess.Popen(
        [_nats_server_bin(), "-js", "-sd", str(tmp / "js"), "-a", "127.0.0.1", "-p", "-1", "-m", "-1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    ready = threading.Event()
    ports: dict[str, int] = {}
    lines: list[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            for key, pattern in (("http", rb"Starting http monitor on \S+:(\d+)"), ("nats", rb"client connections on \S+:(\d+)")):
                m = re.search(pattern, line)
                if m:
                    ports[key] = int(m.group(1))
            if b"Server is ready" in line:
                ready.set()
        ready.set()  # (it ended)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not ready.wait(20) or proc.poll() is not None or len(ports) != 2:
            raise RuntimeError("nats-server did not start:\n" + b"".join(lines).decode(errors="replace"))
        yield ports["nats"], ports["http"]
    finally:
        proc.terminate()
        proc.wait(10)
        reader.join(10)


# -- the shapes ---------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string", type(None): "null"}[type(value)]


def shape_differences(ours: Any, theirs: Any, at: str = "") -> tuple[list[str], set[str]]:
    """Where ``ours`` lacks a key of ``theirs`` or has another JSON type (problems),
    and the keys ``ours`` has beyond ``theirs`` (dotted paths). A list's items are
    each compared with nats-server's first."""
    problems: list[str] = []
    extras: set[str] = set()
    if _kind(ours) != _kind(theirs):
        return [f"{at or '.'}: {_kind(ours)}, nats-server has {_kind(theirs)}"], extras
    if isinstance(theirs, dict):
        free = at.rstrip(".").rsplit(".", 1)[-1] in FREE_MAPS
        for key, value in theirs.items():
            if free:
                continue
            if key not in ours:
                problems.append(f"{at}{key}: missing")
                continue
            p, e = shape_differences(ours[key], value, f"{at}{key}.")
            problems += p
            extras |= e
        if free:
            problems += [f"{at}{k}: {_kind(v)} values" for k, v in ours.items() if theirs and _kind(v) != _kind(next(iter(theirs.values())))]
        else:
            extras |= {f"{at}{key}" for key in ours if key not in theirs}
    elif isinstance(theirs, list) and theirs:
        assert ours, f"{at}: empty, nats-server's is not (make the same state on both)"
        for item in ours:
            p, e = shape_differences(item, theirs[0], at)
            problems += p
            extras |= e
    return problems, extras


def _varz_section() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("### `GET /varz`")
    return text[start : text.index("\n### ", start + 1)]


async def test_every_document_has_nats_servers_keys_and_types(
    reference: dict[str, tuple[int, str, str]], nats_server: ServerHandle,
) -> None:
    assert nats_server.nats_url is not None and nats_server.monitoring_url is not None
    ours = await in_asyncio(_scenario, nats_server.nats_url, nats_server.monitoring_url)
    async with connect(nats_server.address) as c:
        stats = await c.stats()
    varz_doc = _varz_section()
    docs = (ROOT / "docs" / "operations.md").read_text()
    for path in DOCUMENTS:
        (status, ctype, body), (their_status, their_ctype, their_body) = ours[path], reference[path]
        assert (status, ctype) == (their_status, their_ctype) == (200, "application/json"), (path, body, their_body)
        problems, extras = shape_differences(json.loads(body), json.loads(their_body))
        assert not problems, (path, problems)
        if path == "/varz":  # ttlbroker's own: every number of stats, and what the docs' /varz section names
            top = {e for e in extras if "." not in e}
            assert {e for e in top if e not in stats and f"`{e}`" not in varz_doc} == set()
            extras -= top
        allowed = NESTED_EXTRAS.get(path.split("?")[0], set())
        assert extras <= allowed, (path, extras - allowed)
        assert all(f"`{e.rsplit('.', 1)[-1]}`" in docs for e in extras)


async def test_bad_parameters_get_nats_servers_answers(
    reference: dict[str, tuple[int, str, str]], nats_server: ServerHandle,
) -> None:
    """The same status, content type and words (the same JSON for /healthz's
    error documents)."""
    assert nats_server.nats_url is not None and nats_server.monitoring_url is not None
    ours = await in_asyncio(_scenario, nats_server.nats_url, nats_server.monitoring_url)
    for path in REFUSED:
        (status, ctype, body), (their_status, their_ctype, their_body) = ours[path], reference[path]
        assert (status, ctype) == (their_status, their_ctype) and status >= 400, (path, status, body, their_body)
        if ctype == "application/json":
            assert json.loads(body) == json.loads(their_body), path
        else:
            assert body == their_body, path


# -- the numbers ----------------------------------------------------------------------------


async def _get(http: httpx.AsyncClient, path: str) -> Any:
    r = await http.get(path)
    assert r.status_code == 200, (path, r.text)
    return r.json()


def _ns(text: str) -> int:
    """An RFC 3339 time of Go's (UTC, up to nanoseconds) as Unix nanoseconds."""
    whole, _, frac = text.rstrip("Z").partition(".")
    seconds = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.timezone.utc).timestamp()
    return int(seconds) * 1_000_000_000 + int(frac.ljust(9, "0"))


def _by_name(connz: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("name", ""): c for c in connz["connections"]}


async def test_the_numbers_are_the_brokers(nats_server: ServerHandle) -> None:
    """Connections of both listeners, what a NATS connection sent and was sent (acks
    included), the subscriptions, the stream and its consumer: as the broker has
    them."""
    assert nats_server.nats_url is not None and nats_server.monitoring_url is not None
    nats_url, http_url = nats_server.nats_url, nats_server.monitoring_url

    async def scenario() -> dict[str, Any]:
        admin = await nats.connect(nats_url, name="admin")
        ajs = admin.jetstream()
        await ajs.add_stream(name="S", subjects=["s.>"])
        await ajs.add_consumer("S", durable_name="C", ack_policy="explicit")
        counted = await nats.connect(nats_url, name="counted")
        await counted.subscribe("core.>")
        await counted.subscribe("work.*", queue="q")
        cjs = counted.jetstream()
        for _ in range(5):
            await cjs.publish("s.x", b"0123456789")
        for _ in range(2):
            await counted.publish("core.x", b"abc")
        await subscribed(counted)
        out: dict[str, Any] = {}
        async with httpx.AsyncClient(base_url=http_url, timeout=10) as http:
            out["varz"] = await _get(http, "/varz")
            out["connz"] = await _get(http, "/connz?subs=detail")
            out["subsz"] = await _get(http, "/subsz?subs=1")
            out["jsz"] = await _get(http, "/jsz?streams=true&consumers=true")
            pull = await ajs.pull_subscribe("s.x", durable="C", stream="S")
            got = await pull.fetch(2, timeout=5)
            before = _by_name(await _get(http, "/connz"))["admin"]["in_msgs"]
            for m in got:
                await m.ack()
            await subscribed(admin)
            out["acked"] = _by_name(await _get(http, "/connz"))["admin"]["in_msgs"] - before
            out["after"] = await _get(http, "/jsz?consumers=true")
            out["varz2"] = await _get(http, "/varz")
        await counted.close()
        await admin.close()
        return out

    async with connect(nats_server.address) as binary:
        await binary.subscribe("bin.>")
        out = await in_asyncio(scenario)
        stats = await binary.stats()
    broker = nats_server.broker
    varz, connz, subsz, jsz = out["varz"], out["connz"], out["subsz"], out["jsz"]

    assert varz["connections"] == connz["total"] == connz["num_connections"] == 3  # admin, counted, the binary client
    conns = _by_name(connz)
    assert {n: c["type"] for n, c in conns.items()} == {"admin": "nats", "counted": "nats", "ttlbroker-python": "ttlbroker"}
    assert conns["admin"]["cid"] < conns["counted"]["cid"] and conns["ttlbroker-python"]["cid"] < conns["admin"]["cid"]
    assert varz["in_msgs"] == 5 + 2 == stats["messages_in"] + stats["messages_unrouted"]  # stored, and core to no topic
    assert varz["out_msgs"] >= 7 and varz["total_connections"] == 3 and varz["port"] == nats_server.nats_port
    assert varz["ttlbroker_port"] == nats_server.port and varz["http_req_stats"] == {"/varz": 1}
    assert out["varz2"]["http_req_stats"] == {"/varz": 2, "/connz": 3, "/subsz": 1, "/jsz": 2}

    c = conns["counted"]
    assert (c["in_msgs"], c["in_bytes"]) == (7, 5 * 10 + 2 * 3)  # its PUBs and their payloads
    pub_acks = sum(len(pub_ack("S", seq)) for seq in range(1, 6))
    assert (c["out_msgs"], c["out_bytes"]) == (5 + 2, pub_acks + 2 * 3)  # its PubAcks, its own core messages back
    assert (c["lang"], c["subscriptions"], c["pending_bytes"]) == ("python3", 3, 0)
    detail = {s["subject"]: s for s in c["subscriptions_list_detail"]}
    assert detail["core.>"]["msgs"] == 2 and detail["work.*"]["qgroup"] == "q" and "qgroup" not in detail["core.>"]
    assert all(s["cid"] == c["cid"] for s in detail.values())
    assert conns["admin"]["in_msgs"] == 2  # STREAM.CREATE, CONSUMER.CREATE
    assert out["acked"] == 2  # the acks, counted as nats-server counts them (PUBs)
    b = conns["ttlbroker-python"]
    assert (b["subscriptions"], b["in_msgs"], b["last_activity"]) == (1, 0, b["start"])
    assert _ns(c["last_activity"]) > _ns(c["start"])

    assert subsz["num_subscriptions"] == subsz["total"] == 1 + 3 + 1  # admin's inbox, counted's, the binary client's
    assert len(broker.subs) == 1  # (the NATS connections are gone now)
    assert {s["subject"] for s in subsz["subscriptions_list"]} >= {"core.>", "work.*", "bin.>"}
    assert {s["account"] for s in subsz["subscriptions_list"]} == {"$G"}

    assert (jsz["streams"], jsz["consumers"], jsz["messages"]) == (1, 1, 5)
    (stream,) = jsz["account_details"][0]["stream_detail"]
    assert stream["name"] == "S" and stream["state"]["messages"] == 5 and jsz["bytes"] == stream["state"]["bytes"] > 0
    (consumer,) = stream["consumer_detail"]
    assert (consumer["name"], consumer["num_pending"], "config" not in consumer) == ("c", 5, True)
    (after,) = out["after"]["account_details"][0]["stream_detail"][0]["consumer_detail"]
    assert (after["num_pending"], after["num_ack_pending"], after["ack_floor"]["stream_seq"]) == (3, 0, 2)


async def _sorts_and_pages(nats_url: str, http_url: str) -> dict[str, Any]:
    """Three open NATS connections (1, 3 and 2 subscriptions; 0, 2 and 1 messages
    published) and three closed ones, and the documents of each query."""
    conns = {}
    for name, subs, pubs in (("one", 1, 0), ("two", 3, 2), ("three", 2, 1)):
        nc = conns[name] = await nats.connect(nats_url, name=name)
        for i in range(subs):
            await nc.subscribe(f"{name}.{i}")
        for _ in range(pubs):
            await nc.publish("nowhere", b"x")
        await subscribed(nc)
    for name in ("four", "five", "six"):
        gone = await nats.connect(nats_url, name=name)
        await gone.flush()
        await gone.close()
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=http_url, timeout=10) as http:
        for _ in range(500):  # until the server has seen the last close
            if "six" in _by_name(await _get(http, "/connz?state=closed")):
                break
        for path in ("/connz", "/connz?sort=subs&limit=10", "/connz?sort=msgs_from&limit=2&offset=1", "/connz?sort=uptime&limit=0",
                     "/connz?state=closed&sort=stop", "/connz?state=all&limit=10&sort=cid", "/subsz?subs=1&limit=2&offset=1",
                     "/subsz?subs=1&test=two.1", "/connz?offset=7"):
            out[path] = await _get(http, path)
        out["cid"] = await _get(http, f"/connz?cid={_by_name(out['/connz'])['two']['cid']}")
        r = await http.get("/healthz?account=$G")  # no stream yet: nats-server finds no such account either
        out["account"] = (r.status_code, r.json())
    for nc in conns.values():
        await nc.close()
    return out


async def test_connz_sorts_pages_bounds_and_remembers_closed_ones(nats_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """nats-server's sorts and paging; the default limit applied (made 2 here), and
    only the last closed connections kept (2 here)."""
    monkeypatch.setattr(connz_module, "DEFAULT_LIMIT", 2)
    monkeypatch.setattr(connz_module, "CLOSED_KEPT", 2)
    async with start_server(nats_config) as handle:
        assert handle.nats_url is not None and handle.monitoring_url is not None
        out = await in_asyncio(_sorts_and_pages, handle.nats_url, handle.monitoring_url)

    def names(path: str) -> list[str]:
        return [c["name"] for c in out[path]["connections"]]

    first = out["/connz"]
    assert (first["limit"], first["num_connections"], first["total"], names("/connz")) == (2, 2, 3, ["one", "two"])
    assert names("/connz?sort=subs&limit=10") == ["two", "three", "one"]
    paged = out["/connz?sort=msgs_from&limit=2&offset=1"]
    assert (paged["offset"], paged["limit"], paged["total"], names("/connz?sort=msgs_from&limit=2&offset=1")) == (1, 2, 3, ["three", "one"])
    assert names("/connz?sort=uptime&limit=0") == ["three", "two"]  # youngest first; limit 0 is the default
    closed = out["/connz?state=closed&sort=stop"]
    assert names("/connz?state=closed&sort=stop") == ["six", "five"] and closed["total"] == 2  # "four" is forgotten
    assert all(c["reason"] == "Client Closed" and _ns(c["stop"]) >= _ns(c["start"]) for c in closed["connections"])
    assert out["/connz?state=all&limit=10&sort=cid"]["total"] == 5
    assert names("/connz?state=all&limit=10&sort=cid") == ["one", "two", "three", "five", "six"]
    assert (out["cid"]["limit"], [c["name"] for c in out["cid"]["connections"]]) == (1, ["two"])
    assert out["/connz?offset=7"]["connections"] == [] and out["/connz?offset=7"]["total"] == 3
    subs = out["/subsz?subs=1&limit=2&offset=1"]
    assert (subs["total"], subs["offset"], len(subs["subscriptions_list"])) == (6, 1, 2)
    assert out["account"] == (404, {"status": "unavailable", "error": 'JetStream account "$G" not found'})
    tested = out["/subsz?subs=1&test=two.1"]
    assert (tested["total"], [s["subject"] for s in tested["subscriptions_list"]]) == (1, ["two.1"])


async def test_without_the_nats_listener(server: ServerHandle) -> None:
    """No NATS listener: no JetStream (as a nats-server without it), ``host`` and
    ``port`` empty, the binary protocol's connections still listed."""
    url = server.monitoring_url
    assert url is not None
    async with connect(server.address, name="solo"), httpx.AsyncClient(base_url=url, timeout=10) as http:
        jsz = await _get(http, "/jsz")
        varz = await _get(http, "/varz")
        connz = await _get(http, "/connz?subs=1")
        healthz = await http.get("/healthz?account=$G&stream=S")
    assert (jsz["disabled"], jsz["streams"], "account_details" in jsz) == (True, 0, False)
    assert (varz["host"], varz["port"], varz["jetstream"], varz["ttlbroker_port"]) == ("", 0, {}, server.port)
    (only,) = connz["connections"]
    assert (only["type"], only["name"], only["subscriptions"], "subscriptions_list" in only) == ("ttlbroker", "solo", 0, False)
    assert healthz.status_code == 200  # no JetStream to look in (nats-server without -js answers so too)
