"""Monitoring over HTTP: /metrics, /healthz, /varz on a real broker, through a real
HTTP client (httpx), the metrics read back with prometheus_client's parsers.

Expiry and consumers run in virtual time (``mock_clock``, moved by ``advance``), so
the values checked are exact. Bad requests go over raw sockets.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from ttl_helpers import NS, advance, broker_and_client

import broker.server._server as server_module
from broker import Clock, ServerHandle, serve
from broker.core._broker import Broker
from broker.core._info import VERSION
from broker.monitoring._metrics import COUNTERS, GAUGES, INFO_KEYS, RENAMED
from broker.server._startup import StartupError
from broker.core._stats import Counters
from broker.client import Client, connect
from broker.config import ConfigError

from conftest import BrokerProcess, make_config, start_server

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def get(url: str, path: str, method: str = "GET", **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        return await http.request(method, path, **kw)


async def scrape(url: str) -> Samples:
    """Every sample of /metrics, by (name, sorted labels)."""
    r = await get(url, "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(r.text)


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"{key} twice"
            out[key] = s.value
    return out


def one(m: Samples, name: str, **labels: str) -> float:
    return m[(name, tuple(sorted(labels.items())))]


def url_of(handle: ServerHandle) -> str:
    assert handle.monitoring_url is not None
    return handle.monitoring_url


async def raw(handle: ServerHandle, data: bytes, *, read_timeout: float = 10) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    assert handle.http_port is not None
    stream = await trio.open_tcp_stream("127.0.0.1", handle.http_port)
    try:
        if data:
            await stream.send_all(data)
        got = b""
        with trio.fail_after(read_timeout):
            while chunk := await stream.receive_some(65536):
                got += chunk
        return got
    finally:
        await stream.aclose()


# -- /metrics -------------------------------------------------------------------------


async def test_metrics_show_every_number_of_stats_and_each_partition(server: ServerHandle, client: Client) -> None:
    await client.create_stream("shop")
    await client.create_topic("shop", "orders", partitions=3, subjects=["orders.>"])
    subjects = ["orders.eu.1", "orders.us.2", "orders.eu.3", "orders.ap.4"]
    for i in range(20):
        await client.publish(subjects[i % 4], b"x" * i)
    await client.fetch("shop", "orders", 0, 1, 100)
    url = url_of(server)
    m = await scrape(url)
    stats = await client.stats()

    assert one(m, "ttlbroker_messages_in_total") == 20
    volatile = {"uptime_seconds", "bytes_on_disk", "last_fsync_seconds", "queued_bytes", "queued_bytes_max",
                "loop_stall_max_ms", "gc_collections", "gc_pause_total_ms", "gc_pause_max_ms"}
    counters = {f for f in Counters.__dataclass_fields__}
    for key, value in stats.items():
        if key in counters:
            name = f"ttlbroker_{RENAMED.get(key, key)}_total"
            expected, scale = value, 1.0
        elif key in GAUGES:
            name, _, scale = GAUGES[key]
            name, expected = "ttlbroker_" + name, value
        elif key in COUNTERS:
            name, _, scale = COUNTERS[key]
            name, expected = f"ttlbroker_{name}_total", value
        else:
            assert key in INFO_KEYS, f"stats has {key!r}, which /metrics does not show"
            continue
        assert (name, ()) in m, name
        if key not in volatile:
            assert one(m, name) == pytest.approx(expected * scale), key
    (info,) = [labels for (name, labels) in m if name == "ttlbroker_info"]
    assert dict(info) == {"name": "ttlbroker", "version": VERSION, "fsync": "always", "protocol_version": "1"}
    assert one(m, "ttlbroker_ready") == 1
    assert one(m, "ttlbroker_topics") == 1 and one(m, "ttlbroker_partitions") == 3

    parts: list[dict[str, Any]] = (await client.get_topic("shop", "orders")).extra["partitions"]  # type: ignore[assignment]
    assert sum(p["messages"] for p in parts) == 20
    for p in parts:
        labels = {"stream": "shop", "topic": "orders", "partition": str(p["partition"])}
        assert one(m, "ttlbroker_partition_messages", **labels) == p["messages"]
        assert one(m, "ttlbroker_partition_bytes", **labels) == p["size_bytes"]
        assert one(m, "ttlbroker_partition_first_offset", **labels) == p["first_offset"]
        assert one(m, "ttlbroker_partition_last_offset", **labels) == p["last_offset"]
        assert one(m, "ttlbroker_partition_segments", **labels) == p["segments"]
        assert one(m, "ttlbroker_partition_pending_expiries", **labels) == 0
    assert one(m, "ttlbroker_topic_duplicates_total", stream="shop", topic="orders") == 0
    # No consumers: no consumer series at all.
    assert not [name for name, _ in m if name.startswith("ttlbroker_consumer_num")]
    # The process, from prometheus_client's own collectors.
    assert one(m, "process_open_fds") > 0 and any(name == "python_info" for name, _ in m)


async def test_metrics_follow_publishes_and_deletes(server: ServerHandle, client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "t", subjects=["a.>"])
    url = url_of(server)
    acks = await client.publish_batch([("a.1", b"12345"), ("a.2", b"")] * 5)
    assert acks is not None
    m = await scrape(url)
    assert one(m, "ttlbroker_messages_in_total") == 10
    assert one(m, "ttlbroker_partition_messages", stream="s", topic="t", partition="0") == 10
    assert one(m, "ttlbroker_partition_last_offset", stream="s", topic="t", partition="0") == 10
    await client.delete_message("s", "t", 0, 1)
    await client.delete_message("s", "t", 0, 2)
    m = await scrape(url)
    assert one(m, "ttlbroker_deleted_total") == 2
    assert one(m, "ttlbroker_topic_removed_total", stream="s", topic="t", reason="delete") == 2
    assert one(m, "ttlbroker_partition_messages", stream="s", topic="t", partition="0") == 8
    assert one(m, "ttlbroker_partition_first_offset", stream="s", topic="t", partition="0") == 3
    assert one(m, "ttlbroker_messages") == 8


async def test_openmetrics_on_request_and_no_name_twice(server: ServerHandle, client: Client) -> None:
    """A strict parser: OpenMetrics refuses two families of one name (a counter
    ``x_total`` and a gauge ``x`` would be one), so this also guards the names."""
    await client.create_stream("s")
    await client.create_topic("s", "t", subjects=["a.>"])
    await client.publish("a.1", b"x")
    r = await get(url_of(server), "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/openmetrics-text")
    names = [f.name for f in parse_openmetrics(r.text)]
    assert len(names) == len(set(names))
    assert "ttlbroker_connections_accepted" in names and "ttlbroker_connections" in names


async def test_expiry_counts_and_lag_histogram_in_virtual_time(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (handle, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], allow_msg_ttl=True)
        for i in range(3):
            await c.publish(f"a.{i}", b"x", ttl=5)
        await c.publish("a.keep", b"x")
        url = url_of(handle)  # type: ignore[arg-type]
        m = await scrape(url)
        labels = {"stream": "s", "topic": "t", "partition": "0"}
        assert one(m, "ttlbroker_pending_expiries") == 3
        assert one(m, "ttlbroker_partition_pending_expiries", **labels) == 3
        assert one(m, "ttlbroker_expiry_lag_seconds_count") == 0

        # The bucket fires within 100 ms after the deadline; waking 1 s after the
        # publish-plus-5 s lands 0.9 to 1 s after the bucket's time.
        await advance(6)
        m = await scrape(url)
        assert one(m, "ttlbroker_expired_ttl_total") == 3
        assert one(m, "ttlbroker_topic_removed_total", stream="s", topic="t", reason="ttl") == 3
        assert one(m, "ttlbroker_pending_expiries") == 0
        assert one(m, "ttlbroker_partition_pending_expiries", **labels) == 0
        assert one(m, "ttlbroker_partition_messages", **labels) == 1
        assert one(m, "ttlbroker_expiry_passes_total") == 1
        engine = handle.broker.retention.engine  # type: ignore[attr-defined]
        assert one(m, "ttlbroker_expiry_lag_seconds_count") == 1
        assert one(m, "ttlbroker_expiry_lag_seconds_sum") == pytest.approx(engine.lag_ns_sum / NS)
        assert 0.9 <= engine.lag_ns_sum / NS <= 1.0
        assert one(m, "ttlbroker_expiry_lag_seconds_bucket", le="0.5") == 0
        assert one(m, "ttlbroker_expiry_lag_seconds_bucket", le="1.0") == 1
        assert one(m, "ttlbroker_expiry_lag_seconds_bucket", le="+Inf") == 1
        assert one(m, "ttlbroker_expiry_lag_max_seconds") == pytest.approx(engine.lag_ns_max / NS, abs=1e-3)


async def test_consumer_series_per_consumer_and_partition(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir, Clock()) as (handle, c):
        await c.create_stream("shop")
        await c.create_topic("shop", "orders", partitions=2, subjects=["orders.>"])
        await c.create_consumer("shop", "orders", "work", ack_wait=30)
        for i in range(6):
            await c.publish(f"orders.{i}", b"m")
        msgs = await c.pull("shop", "orders", "work", 4, no_wait=True)
        assert len(msgs) == 4
        await msgs[0].ack(sync=True)
        info = await c.consumer_info("shop", "orders", "work")
        url = url_of(handle)  # type: ignore[arg-type]
        m = await scrape(url)
        who = {"stream": "shop", "topic": "orders", "consumer": "work"}
        assert one(m, "ttlbroker_consumer_num_pending", **who) == info.num_pending == 2
        assert one(m, "ttlbroker_consumer_num_ack_pending", **who) == info.num_ack_pending == 3
        assert one(m, "ttlbroker_consumer_num_redelivered", **who) == 0
        assert one(m, "ttlbroker_consumer_num_waiting", **who) == 0
        assert one(m, "ttlbroker_consumer_delivered_consumer_seq", **who) == 4
        assert one(m, "ttlbroker_consumers") == 1 and one(m, "ttlbroker_consumers_num_ack_pending") == 3
        assert one(m, "ttlbroker_consumer_acked_total") == 1 and one(m, "ttlbroker_consumer_delivered_total") == 4
        for p in info.partitions:
            at = {**who, "partition": str(p["partition"])}
            assert one(m, "ttlbroker_consumer_partition_num_pending", **at) == p["num_pending"]
            assert one(m, "ttlbroker_consumer_partition_num_ack_pending", **at) == p["num_ack_pending"]
            assert one(m, "ttlbroker_consumer_partition_delivered_offset", **at) == p["delivered"]
            assert one(m, "ttlbroker_consumer_partition_ack_floor_offset", **at) == p["ack_floor"]

        await advance(31)  # the ack wait runs out: the three come back
        again = await c.pull("shop", "orders", "work", 10, no_wait=True)
        assert len(again) == 5
        m = await scrape(url)
        assert one(m, "ttlbroker_consumer_num_redelivered", **who) == 3
        assert one(m, "ttlbroker_consumer_redelivered_total") == 3


# -- /healthz ---------------------------------------------------------------------------


async def test_healthz_is_503_while_recovering_and_200_once_serving(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    async with start_server(make_config(data_dir)) as first:  # something to recover
        async with connect(first.address) as c:
            await c.create_stream("s")
            await c.create_topic("s", "t", subjects=["a.>"])
            await c.publish("a.1", b"x")

    entered, release = threading.Event(), threading.Event()
    real_open = Broker.open

    def held_open(self: Broker) -> None:
        entered.set()
        release.wait(30)
        real_open(self)

    monkeypatch.setattr(Broker, "open", held_open)
    caplog.clear()
    async with trio.open_nursery() as nursery:
        ready = trio.Event()
        handles: list[ServerHandle] = []

        async def run() -> None:
            handles.append(await nursery.start(functools.partial(serve, make_config(data_dir))))
            ready.set()

        nursery.start_soon(run)
        await trio.to_thread.run_sync(entered.wait, 30)
        (port,) = [r.fields["port"] for r in caplog.records if r.getMessage() == "monitoring"]  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{port}"
        r = await get(url, "/healthz")
        assert (r.status_code, r.json()) == (
            503, {"status": "unavailable", "reason": "recovering", "error": "the broker is recovering its data directory"},
        )
        m = await scrape(url)
        assert one(m, "ttlbroker_ready") == 0
        assert ("ttlbroker_topics", ()) not in m and ("ttlbroker_messages_in_total", ()) in m
        varz = (await get(url, "/varz")).json()
        assert varz["state"] == "recovering" and varz["http_port"] == port and "topics" not in varz
        assert (await get(url, "/connz")).json()["connections"] == []
        r = await get(url, "/healthz?details=true")  # nats-server's form of the answer
        assert (r.status_code, r.json()) == (503, {
            "status": "error", "reason": "recovering",
            "errors": [{"type": "CONNECTION", "error": "the broker is recovering its data directory"}],
        })
        r = await get(url, "/jsz")  # the catalog is not there yet
        assert (r.status_code, r.text) == (503, "the broker is recovering its data directory\n")
        release.set()
        await ready.wait()
        assert handles[0].http_port == port
        r = await get(url, "/healthz")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
        assert one(await scrape(url), "ttlbroker_messages") == 1
        nursery.cancel_scope.cancel()


async def test_healthz_is_503_from_the_first_moment_of_a_shutdown(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutting_down, release = trio.Event(), trio.Event()
    real_shutdown = server_module._shutdown

    async def held_shutdown(*args: Any) -> None:
        shutting_down.set()
        await release.wait()
        await real_shutdown(*args)

    monkeypatch.setattr(server_module, "_shutdown", held_shutdown)
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[ServerHandle]) -> None:
            with scope:
                await serve(make_config(data_dir), task_status=task_status)

        handle: ServerHandle = await nursery.start(run)
        url = url_of(handle)
        assert (await get(url, "/healthz")).status_code == 200
        scope.cancel()
        await shutting_down.wait()
        r = await get(url, "/healthz")
        assert (r.status_code, r.json()) == (
            503, {"status": "unavailable", "reason": "shutting down", "error": "the broker is shutting down"},
        )
        assert one(await scrape(url), "ttlbroker_ready") == 0
        assert (await get(url, "/varz")).json()["state"] == "shutting_down"
        release.set()
    with pytest.raises(httpx.ConnectError):  # and the port closes last
        await get(url, "/healthz")


# -- /varz ------------------------------------------------------------------------------


async def test_varz(server: ServerHandle, client: Client, data_dir: Path) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "t", subjects=["a.>"])
    await client.publish_batch([("a.1", b"abc")] * 4)
    await client.fetch("s", "t", 0, 1, 10)
    r = await get(url_of(server), "/varz")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    v = r.json()
    stats = await client.stats()
    assert (v["name"], v["ttlbroker_version"], v["state"]) == ("ttlbroker", VERSION, "ready")
    assert (v["ttlbroker_host"], v["ttlbroker_port"]) == (server.host, server.port)  # (host and port: NATS's, off here)
    assert (v["host"], v["port"], v["http_host"], v["http_port"]) == ("", 0, server.http_host, server.http_port)
    assert v["connections"] == 1 and v["connections_total"] >= 1
    for key in ("messages_in", "bytes_in", "messages_out", "bytes_out", "topics", "messages"):
        assert v[key] == stats[key], key
    assert (v["messages_in"], v["messages_out"]) == (4, 4)
    assert v["start"].endswith("Z") and v["uptime"].endswith("s") and v["started_at"] == server.broker.started_at
    assert v["config"]["data_dir"] == str(data_dir) and v["config"]["fsync"] == "always"
    assert v["config"]["max_connections"] == 1024 and v["config"]["export_dir"] is None
    assert (v["config"]["http_max_connections"], v["config"]["http_max_connections_per_peer"], v["config"]["http_head_timeout"]) == (64, 16, 2.0)
    assert v["cpu_seconds"] > 0 and v["max_rss_bytes"] > 0


# -- bad requests -----------------------------------------------------------------------


async def test_unknown_paths_wrong_methods_head_and_keep_alive(server: ServerHandle, client: Client) -> None:
    url = url_of(server)
    r = await get(url, "/nope")
    assert r.status_code == 404 and "/metrics" in r.text
    r = await get(url, "/metrics", method="POST", content=b"x")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    r = await get(url, "/healthz", method="HEAD")
    assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "17"
    assert (await get(url, "/healthz?verbose=1")).status_code == 200
    # Two requests on one connection, the second closing it.
    got = await raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /varz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert got.count(b"HTTP/1.1 200 OK\r\n") == 2 and b'"status": "ok"' in got and b'"state": "ready"' in got


async def test_bad_requests_cost_only_their_connection(data_dir: Path) -> None:
    # (The head timeout is short for the two cases that wait for it, and long enough
    # that a loaded machine's pause between a connection and its bytes does not end
    # the others' connections first: at 200 ms one CI run saw the first one closed.)
    async with start_server(make_config(data_dir, **{"http.head_timeout": "1s"})) as server, connect(server.address) as client:
        await _bad_requests_cost_only_their_connection(server, client)


async def _bad_requests_cost_only_their_connection(server: ServerHandle, client: Client) -> None:
    url = url_of(server)
    got = await raw(server, b"\x00\x01\x02 garbage \xff\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    got = await raw(server, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 431 ")
    got = await raw(server, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100_000)
    assert got.startswith(b"HTTP/1.1 413 ")
    got = await raw(server, b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 505 ")
    # Connects and sends nothing: closed without a word after the head timeout.
    assert await raw(server, b"", read_timeout=5) == b""
    # Half a request: 408.
    got = await raw(server, b"GET /healthz HTTP/1.1\r\nHost:", read_timeout=5)
    assert got.startswith(b"HTTP/1.1 408 ")
    # A client that goes away mid-request.
    assert server.http_port is not None
    stream = await trio.open_tcp_stream("127.0.0.1", server.http_port)
    await stream.send_all(b"GET /metr")
    await stream.aclose()

    # The monitoring port and the broker both still serve.
    assert (await get(url, "/healthz")).status_code == 200
    await client.create_stream("after")
    m = await scrape(url)
    for code in ("400", "408", "413", "431", "505"):
        assert one(m, "ttlbroker_http_responses_total", code=code) >= 1, code
    assert one(m, "ttlbroker_streams") == 1


async def test_a_new_connection_over_the_limit_takes_the_place_of_an_idle_one(data_dir: Path) -> None:
    """At ``http.max_connections`` the connection idle longest is closed for the new
    one (tests/broker/test_monitoring_probes.py has the rest of the rules)."""
    async with start_server(make_config(data_dir, **{"http.max_connections": 3, "http.max_connections_per_peer": 3})) as server:
        assert server.http_port is not None
        idle = [await trio.open_tcp_stream("127.0.0.1", server.http_port) for _ in range(3)]
        try:
            await trio.testing.wait_all_tasks_blocked()
            assert (await raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
            assert await idle[0].receive_some(10) == b""  # the oldest
        finally:
            for s in idle:
                await s.aclose()
        m = await scrape(url_of(server))
        assert one(m, "ttlbroker_http_connections_evicted_total") == 1
        assert one(m, "ttlbroker_http_connections_refused_total") == 0


# -- configuration and start-up ----------------------------------------------------------


async def test_a_monitoring_port_in_use_stops_the_start_with_one_line(data_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = make_config(data_dir, **{"http.port": port})
        with pytest.raises(StartupError) as failed:
            await serve(cfg)
    assert failed.value.message == (
        f"monitoring port 127.0.0.1:{port} is in use (another broker? set [http] port or --http-port; 0 turns monitoring off)"
    )
    assert not (data_dir / "LOCK").exists()  # failed before the recovery


async def test_an_unusable_monitoring_host_stops_the_start(data_dir: Path) -> None:
    with pytest.raises(StartupError, match=r"^cannot listen for monitoring on 192\.0\.2\.1 \(any free port\): .*\(set \[http\] host\)$"):
        await serve(make_config(data_dir, **{"http.host": "192.0.2.1"}))


async def test_monitoring_can_be_off(data_dir: Path) -> None:
    async with start_server(make_config(data_dir, **{"http.port": 0})) as handle:
        assert handle.monitoring_url is None and handle.http_port is None


def test_http_config_is_checked() -> None:
    from broker import Config

    assert Config().http.port == 8091 and Config().http.enabled and Config().http.host == "127.0.0.1"
    assert not Config().replace(**{"http.port": 0}).http.enabled  # 0 = off; -1 = any free port
    for bad in (70000, -2):
        with pytest.raises(ConfigError, match=rf"http.port: {bad} is not a TCP port \(1..65535\), 0 \(off\) or -1 \(any free port\)"):
            Config().replace(**{"http.port": bad})
    with pytest.raises(ConfigError, match="http.port: 8090 is also server.port"):
        Config().replace(**{"http.port": 8090})
    with pytest.raises(ConfigError, match="unknown key http.enabled"):
        Config().replace(**{"http.enabled": False})
    with pytest.raises(ConfigError, match=r"http.max_connections_per_peer: must be between 1 and http.max_connections \(8\), got 9"):
        Config().replace(**{"http.max_connections": 8, "http.max_connections_per_peer": 9})


def test_serve_prints_the_monitoring_line(data_dir: Path) -> None:
    p = BrokerProcess(data_dir)
    try:
        assert p.proc.stdout is not None
        line = p.proc.stdout.readline()
        assert line.startswith("monitoring on http://127.0.0.1:")
        url = line.split()[-1]
        assert httpx.get(url + "/healthz", timeout=10).json() == {"status": "ok"}
        assert httpx.get(url + "/varz", timeout=10).json()["ttlbroker_port"] == int(p.address.rsplit(":", 1)[1])
    finally:
        assert p.stop() == 0


def test_serve_http_port_off_and_any(tmp_path: Path) -> None:
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = BrokerProcess(tmp_path / "a", "--http-port", str(port))
    try:
        assert p.proc.stdout is not None
        assert p.proc.stdout.readline() == f"monitoring on http://127.0.0.1:{port}\n"
    finally:
        p.stop()
    p = BrokerProcess(tmp_path / "b", "--http-port", "0")  # off
    p.proc.send_signal(2)
    out, _ = p.proc.communicate(timeout=20)
    assert "monitoring" not in out
    p = BrokerProcess(tmp_path / "c", "--http-port", "-1")  # any free port
    try:
        assert p.proc.stdout is not None
        url = p.proc.stdout.readline().split()[-1]
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":8091")
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200
    finally:
        p.stop()

