"""The monitoring port always answers its probes: slow clients, floods of
connections and queues of scrapes never keep ``/healthz`` from answering, and
``HEAD`` gets what ``GET`` gets, errors included.

Every test runs the real broker (or the real HTTP server) on loopback and talks to
it over real sockets. The clients that misbehave are the ones a fault campaign used:
64 that each send ``GET /metrics HTTP/1.1\\r\\n`` and never end the head, and a flood
of 100 that send nothing, each reconnecting as soon as the server closes it. Other
peers are other loopback addresses (127.0.0.2, ...), which Linux routes to the same
host.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from broker import ServerHandle
from broker.client import connect
from broker.config import Config, ConfigError, HttpConfig
from broker.monitoring import HttpStats, Monitor, serve_http
from broker.monitoring._http import Request, Response, waiting
from broker.monitoring._metrics import Metrics

from conftest import make_config, start_server

#: How long a probe may take (a Kubernetes probe's default timeoutSeconds is 1).
PROBE_SECONDS = 1.0
#: The pace of :func:`probes`.
PROBE_EVERY = 0.02
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
#: What each slow client sends: a request line and no end of the head.
SLOW_HEAD = b"GET /metrics HTTP/1.1\r\n"


def loopback_peers(n: int) -> list[str]:
    """``n`` loopback addresses other than 127.0.0.1 to connect from (skip if the
    machine does not route them)."""
    peers = [f"127.0.0.{i}" for i in range(2, 2 + n)]
    for peer in peers:
        with socket.socket() as s:
            try:
                s.bind((peer, 0))
            except OSError as exc:
                pytest.skip(f"cannot connect from {peer}: {exc}")
    return peers


async def exchange(port: int, data: bytes, *, local: str | None = None, seconds: float = 5) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    with trio.fail_after(seconds):
        stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=local)
        try:
            if data:
                await stream.send_all(data)
            got = b""
            while chunk := await stream.receive_some(65536):
                got += chunk
            return got
        finally:
            await stream.aclose()


async def probe(port: int, *, local: str | None = None) -> bool:
    """One readiness probe from a new connection: True if it got its 200 in time."""
    try:
        return (await exchange(port, HEALTHZ, local=local, seconds=PROBE_SECONDS)).startswith(b"HTTP/1.1 200 OK\r\n")
    except (trio.TooSlowError, trio.BrokenResourceError, OSError):
        return False


async def probes(port: int, count: int, *, local: str | None = None) -> int:
    """``count`` probes, one started every :data:`PROBE_EVERY` seconds (several
    monitors probing at once; one after another, a test would wait for each to
    cross the storm of reconnections in the accept queue); how many got their 200 in
    time."""
    answered: list[bool] = []

    async def one() -> None:
        answered.append(await probe(port, local=local))

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
            await trio.sleep(PROBE_EVERY)
    assert len(answered) == count
    return sum(answered)


async def misbehave(port: int, head: bytes, arrived: Callable[[], None], *, local: str | None = None) -> None:
    """A client that holds a connection sending ``head`` (maybe nothing) and never
    more, and opens a new one as soon as the server closes it."""
    while True:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=local)
        except OSError:
            await trio.sleep(0.01)
            continue
        try:
            if head:
                await stream.send_all(head)
            arrived()
            while await stream.receive_some(4096):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await stream.aclose()


async def start_clients(nursery: trio.Nursery, port: int, count: int, head: bytes, peers: list[str | None]) -> None:
    """Start ``count`` misbehaving clients (spread over ``peers``) and return once each
    has had a connection accepted and sent its ``head``."""
    seen: set[int] = set()
    all_in = trio.Event()

    def arrived(i: int) -> None:
        seen.add(i)
        if len(seen) == count:
            all_in.set()

    for i in range(count):
        nursery.start_soon(functools.partial(misbehave, port, head, functools.partial(arrived, i), local=peers[i % len(peers)]))
    with trio.fail_after(10):
        await all_in.wait()


@pytest.fixture
def monitors(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Monitor]]:
    """Every ``Monitor`` the test's servers make (the handle does not carry it)."""
    made: list[Monitor] = []
    real_init = Monitor.__init__

    def init(self: Monitor, *args: Any) -> None:
        real_init(self, *args)
        made.append(self)

    monkeypatch.setattr(Monitor, "__init__", init)
    yield made


def log_events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [dict(getattr(r, "fields", {}), level=r.levelname) for r in caplog.records if r.getMessage() == event]


# -- the fault campaign's clients -------------------------------------------------------


async def test_healthz_answers_every_probe_under_64_slow_clients(data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """64 clients that never end their request head, reconnecting whenever closed,
    used to hold all 64 slots for 10 s at a time: 0 of 50 probes answered. Now each
    new connection takes the place of the peer's oldest unfinished one."""
    caplog.set_level(logging.INFO, logger="broker")
    async with start_server(make_config(data_dir)) as handle:
        assert handle.http_port is not None
        port = handle.http_port
        async with trio.open_nursery() as clients:
            await start_clients(clients, port, 64, SLOW_HEAD, [None])
            answered = await probes(port, 50)
            clients.cancel_scope.cancel()
        assert answered == 50
        counters = handle.broker.counters
        assert counters.http_connections_evicted >= 50 and counters.http_connections_refused == 0
        assert counters.http_connections_total > 64 + 50
        # Logged, but at most one line per peer host and event every 10 s.
        assert 1 <= len(log_events(caplog, "http_connection_evicted")) <= 2
        assert await probe(port)


async def test_healthz_answers_every_probe_under_a_flood_of_100_connections(data_dir: Path) -> None:
    """100 connections that send nothing (and come back when closed) used to leave
    every probe closed at once (0 of 32 answered)."""
    async with start_server(make_config(data_dir)) as handle:
        assert handle.http_port is not None
        port = handle.http_port
        async with trio.open_nursery() as clients:
            await start_clients(clients, port, 100, b"", [None])
            answered = await probes(port, 32)
            clients.cancel_scope.cancel()
        assert answered == 32
        assert handle.broker.counters.http_connections_evicted >= 36 + 32


async def test_a_flood_from_many_peers_fills_the_port_and_still_lets_probes_in(data_dir: Path, monitors: list[Monitor]) -> None:
    """Five peers with 20 connections each: the per-peer limit (16) holds each to its
    share and the total (64) fills; a probe from a sixth peer takes the place of a
    connection of the peer holding the most."""
    peers: list[str | None] = list(loopback_peers(5))
    async with start_server(make_config(data_dir)) as handle:
        assert handle.http_port is not None
        port = handle.http_port
        async with trio.open_nursery() as clients:
            await start_clients(clients, port, 100, SLOW_HEAD, peers)
            with trio.fail_after(5):
                while monitors[0].http.connections < 64:
                    await trio.sleep(0.01)
            answered = await probes(port, 20)
            answered += await probes(port, 20, local=peers[0])  # and from a peer at its limit
            assert monitors[0].http.connections == 64
            clients.cancel_scope.cancel()
        assert answered == 40


async def test_healthz_answers_while_every_connection_waits_for_a_scrape(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, monitors: list[Monitor],
) -> None:
    """64 connections (16 from each of 4 peers: the total limit) ask for /metrics
    while a scrape is stuck: one holds the turn, 63 wait for it. A probe takes the
    place of a waiting one; the scrape that has its turn is never cut."""
    peers = loopback_peers(4)
    release = trio.Event()
    real_scrape = Metrics.scrape

    async def stuck_scrape(self: Metrics, accept: str = "") -> tuple[bytes, str]:
        await release.wait()
        return await real_scrape(self, accept)

    monkeypatch.setattr(Metrics, "scrape", stuck_scrape)
    async with start_server(make_config(data_dir)) as handle:
        assert handle.http_port is not None
        port = handle.http_port
        scrapes: list[bytes] = []

        async def scrape(peer: str) -> None:
            request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            try:
                scrapes.append(await exchange(port, request, local=peer, seconds=20))
            except (trio.BrokenResourceError, OSError):
                scrapes.append(b"")

        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(scrape, peers[i % 4])
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert monitors[0].http.connections == 64
            answered = [await probe(port) for _ in range(10)]
            release.set()
        assert sum(answered) == 10
        # The first probe took a waiting scrape's place; the others found the slot
        # each probe before them left.
        assert sum(s.startswith(b"HTTP/1.1 200 OK\r\n") for s in scrapes) == 63
        assert handle.broker.counters.http_connections_evicted == 1


# -- the limits, one at a time ---------------------------------------------------------------


async def test_a_peer_at_its_limit_replaces_its_own_oldest_connection(data_dir: Path, monitors: list[Monitor]) -> None:
    mine, other = loopback_peers(2)
    async with start_server(make_config(data_dir, **{"http.max_connections_per_peer": 3})) as handle:
        assert handle.http_port is not None
        port = handle.http_port
        theirs = await trio.open_tcp_stream("127.0.0.1", port, local_address=other)  # the oldest of all
        held = [await trio.open_tcp_stream("127.0.0.1", port, local_address=mine) for _ in range(3)]
        await trio.testing.wait_all_tasks_blocked(0.01)
        assert monitors[0].http.connections == 4
        assert await probe(port, local=mine)
        assert await held[0].receive_some(10) == b""  # mine's oldest was closed for it
        for s in (theirs, held[1]):  # the others still serve
            await s.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await s.receive_some(4096)).startswith(b"HTTP/1.1 200 OK\r\n")
        for s in (theirs, *held):
            await s.aclose()
        assert handle.broker.counters.http_connections_evicted == 1


async def test_a_request_head_has_head_timeout_to_arrive(data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A new connection's head from the accept; a kept-alive connection may be idle
    longer, and its head has the time from its first byte."""
    caplog.set_level(logging.INFO, logger="broker")
    async with start_server(make_config(data_dir, **{"http.head_timeout": "200ms"})) as handle:
        assert handle.http_port is not None
        port = handle.http_port
        start = trio.current_time()
        got = await exchange(port, SLOW_HEAD)
        assert got.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"connection: close\r\n" in got
        assert 0.2 <= trio.current_time() - start < 1.5
        assert await exchange(port, b"") == b""  # sent nothing: closed without a word
        counters = handle.broker.counters
        assert counters.http_request_timeouts == 2
        (logged,) = log_events(caplog, "http_request_timeout")  # the second within 10 s: left out
        assert logged["peer"] == "127.0.0.1" and logged["timeout"] == 0.2 and logged["level"] == "INFO"

        # Kept alive: idle for longer than the head timeout, then a whole request.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await stream.receive_some(4096)).startswith(b"HTTP/1.1 200 OK\r\n")
        await trio.sleep(0.4)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await stream.receive_some(4096)).startswith(b"HTTP/1.1 200 OK\r\n")
        # ... and then part of one: 408 once its time from the first byte is up.
        await stream.send_all(b"GET /healthz HTTP/1.1\r\n")
        with trio.fail_after(2):
            assert (await stream.receive_some(4096)).startswith(b"HTTP/1.1 408 ")
        await stream.aclose()
        assert counters.http_request_timeouts == 3 and len(log_events(caplog, "http_request_timeout")) == 1


async def test_connections_are_refused_only_when_every_one_is_being_served(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    """The HTTP server alone, with a handler that holds its requests: the third
    connection over a limit of two has nothing to replace and is closed at once,
    counted and logged (one line per peer and 10 s, then the number left out)."""
    caplog.set_level(logging.INFO, logger="broker")
    release = trio.Event()

    async def handler(request: Request) -> Response:
        await release.wait()
        return Response(200, b"done\n")

    stats = HttpStats()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_http, listeners, handler, stats, HttpConfig(max_connections=2, max_connections_per_peer=2))
        held = []
        for _ in range(2):
            s = await trio.open_tcp_stream("127.0.0.1", port)
            await s.send_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(s)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(3):
            assert await exchange(port, HEALTHZ) == b""
        assert stats.counters.http_connections_refused == 3 and stats.counters.http_connections_evicted == 0
        (line,) = log_events(caplog, "http_connection_refused")
        assert line["peer"] == "127.0.0.1" and line["limit"] == "max_connections_per_peer" and line["suppressed"] == 0
        assert line["level"] == "WARNING"
        mock_clock.jump(10)
        assert await exchange(port, HEALTHZ) == b""
        assert [e["suppressed"] for e in log_events(caplog, "http_connection_refused")] == [0, 2]
        release.set()  # the two held requests are answered: nothing was cut
        for s in held:
            assert (await s.receive_some(4096)).startswith(b"HTTP/1.1 200 OK\r\n")
            await s.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert stats.connections == 0
        nursery.cancel_scope.cancel()


async def test_a_handler_waiting_for_its_turn_gives_its_place(mock_clock: trio.testing.MockClock) -> None:
    release = trio.Event()

    async def handler(request: Request) -> Response:
        if request.path == "/queue":
            with waiting():
                await release.wait()
        return Response(200, b"done\n")

    stats = HttpStats()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_http, listeners, handler, stats, HttpConfig(max_connections=1, max_connections_per_peer=1))
        queued = await trio.open_tcp_stream("127.0.0.1", port)
        await queued.send_all(b"GET /queue HTTP/1.1\r\nHost: x\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()
        assert (await exchange(port, HEALTHZ)).startswith(b"HTTP/1.1 200 OK\r\n")
        assert await queued.receive_some(10) == b""
        assert stats.counters.http_connections_evicted == 1 and stats.connections == 0
        await queued.aclose()
        nursery.cancel_scope.cancel()


# -- HEAD -------------------------------------------------------------------------------------


def head_of(response: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """The status line, the headers and what follows them."""
    head, sep, rest = response.partition(b"\r\n\r\n")
    assert sep, response
    status, *lines = head.split(b"\r\n")
    return status, dict(line.split(b": ", 1) for line in lines), rest


#: (request, with GET or HEAD in place of {}): every answer of the port.
REQUESTS = [
    b"{} / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"{} /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"{} /healthz?verbose=1 HTTP/1.0\r\n\r\n",
    b"{} /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"{} /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text; version=1.0.0\r\nConnection: close\r\n\r\n",
    b"{} /varz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"{} /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",  # 404
    b"{} /boom HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",  # 500: a bug in the endpoint
    b"{} /healthz HTTP/9.9\r\nHost: x\r\n\r\n",  # 505
    b"{} /healthz HTTP/2.0\r\nHost: x\r\n\r\n",  # 505
    b"{} /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100_000,  # 413
    b"{} /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",  # 431
    b"{} /healthz HTTP/1.1\r\nno colon here\r\n\r\n",  # 400
    b"{} /healthz HTTP/1.1\r\nHost: x\r\n",  # 408: the head never ends
]
#: Endpoints whose body changes from one request to the next (counters, clocks).
CHANGING = (b"/metrics", b"/varz")


async def test_head_gets_what_get_gets_for_every_path_and_every_error(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def boom(self: Monitor, request: Request) -> Response:
        raise RuntimeError("a bug")

    real_init = Monitor.__init__

    def with_boom(self: Monitor, *args: Any) -> None:
        real_init(self, *args)
        self._routes["/boom"] = lambda request: boom(self, request)

    monkeypatch.setattr(Monitor, "__init__", with_boom)
    async with start_server(make_config(data_dir, **{"http.head_timeout": "200ms"})) as handle:
        assert handle.http_port is not None
        port = handle.http_port
        statuses = []
        for request in REQUESTS:
            get_status, get_headers, get_body = head_of(await exchange(port, request.replace(b"{}", b"GET", 1)))
            head_status, head_headers, head_body = head_of(await exchange(port, request.replace(b"{}", b"HEAD", 1)))
            what = request[:60]
            assert head_status == get_status, what
            assert head_body == b"" and len(get_body) == int(get_headers[b"content-length"]), what
            if any(request.startswith(b"{} " + path) for path in CHANGING):
                get_headers.pop(b"content-length"), head_headers.pop(b"content-length")
            assert head_headers == get_headers, what
            statuses.append(int(get_status.split()[1]))
        assert statuses == [200, 200, 200, 200, 200, 200, 404, 500, 505, 505, 413, 431, 400, 408]

        # HEAD on a kept-alive connection: no body, and the next answer follows.
        got = await exchange(port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        first, headers, rest = head_of(got)
        assert first == b"HTTP/1.1 200 OK" and headers[b"content-length"] == b"17"
        assert rest.startswith(b"HTTP/1.1 200 OK\r\n") and rest.endswith(b'{"status": "ok"}\n')
        # Only GET and HEAD: the same 405 for every other method.
        got = await exchange(port, b"DELETE /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and b"allow: GET, HEAD\r\n" in got


# -- the numbers ---------------------------------------------------------------------------------


async def test_refusals_evictions_and_timeouts_are_in_stats_and_metrics(data_dir: Path) -> None:
    async with start_server(make_config(data_dir, **{"http.head_timeout": "200ms", "http.max_connections_per_peer": 1})) as handle:
        assert handle.http_port is not None
        port = handle.http_port
        assert await exchange(port, SLOW_HEAD) != b""  # a 408
        idle = await trio.open_tcp_stream("127.0.0.1", port)
        await trio.testing.wait_all_tasks_blocked(0.01)
        assert await probe(port)  # takes the idle one's place
        await idle.aclose()
        metrics = (await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).decode()
        for line in ("ttlbroker_http_request_timeouts_total 1.0", "ttlbroker_http_connections_evicted_total 1.0",
                     "ttlbroker_http_connections_refused_total 0.0", "ttlbroker_http_response_timeouts_total 0.0",
                     "ttlbroker_http_connections_total 4.0", "ttlbroker_http_connections_open 1.0"):
            assert f"\n{line}\n" in metrics, line
        async with connect(handle.address) as c:
            stats = await c.stats()
        assert (stats["http_request_timeouts"], stats["http_connections_evicted"], stats["http_connections_total"]) == (1, 1, 4)


# -- configuration -------------------------------------------------------------------------------


def test_the_limits_are_configured_and_checked() -> None:
    c = Config().http
    assert (c.max_connections, c.max_connections_per_peer, c.head_timeout) == (64, 16, 2.0)
    c = Config().replace(**{"http.head_timeout": "500ms", "http.max_connections": 8, "http.max_connections_per_peer": 8}).http
    assert (c.max_connections, c.max_connections_per_peer, c.head_timeout) == (8, 8, 0.5)
    for key, value, message in [
        ("http.max_connections", 0, "http.max_connections: must be at least 1, got 0"),
        ("http.max_connections_per_peer", 0, r"http.max_connections_per_peer: must be between 1 and http.max_connections \(64\), got 0"),
        ("http.max_connections_per_peer", 65, r"http.max_connections_per_peer: must be between 1 and http.max_connections \(64\), got 65"),
        ("http.max_connections", "many", "http.max_connections: expected an integer, got 'many'"),
        ("http.head_timeout", 0, r"http.head_timeout: must be positive"),
        ("http.head_timeout", "soon", "http.head_timeout: .*'soon' is not a duration"),
        ("http.head_timeout", [2], r"http.head_timeout: expected a duration such as \"2s\" or a number of seconds, got \[2\]"),
    ]:
        with pytest.raises(ConfigError, match=message):
            Config().replace(**{key: value})
