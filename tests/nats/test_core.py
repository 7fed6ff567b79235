"""The NATS listener's core protocol, driven by nats-py (the real client) against a
real broker on loopback (``conftest.nats_server``), and by raw sockets where the
exact bytes matter (``helpers.RawNats``).

nats-py runs on an asyncio loop in a worker thread (``helpers.in_asyncio``) while
the broker runs on the test's trio loop; the two sides wait for each other with
threading events, never with sleeps."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest
import trio
import trustme
from conftest import make_config, start_server
from helpers import RawNats, in_asyncio, subscribed

import protocol as P

import protocol.nats as PN
from broker import Config, ServerHandle
from broker.core._info import VERSION
from broker.client import connect

PING, PONG, OK = PN.NatsPing, PN.NatsPong, PN.NatsOk


def err(text: str) -> PN.NatsErr:
    return PN.NatsErr(text)


async def wait_for(event: threading.Event) -> None:
    """Wait (on trio) for the asyncio side to reach a point."""
    assert await trio.to_thread.run_sync(event.wait, 20), "the nats-py side never got there"


async def asyncio_wait(event: threading.Event) -> None:
    """Wait (on asyncio) for the trio side to reach a point."""
    assert await asyncio.to_thread(event.wait, 20), "the trio side never got there"


async def beside(fn: Callable[[], Awaitable[Any]], trio_side: Callable[[], Awaitable[None]]) -> Any:
    """Run nats-py's ``fn`` and the trio side ``trio_side`` at the same time; the
    result of ``fn``."""
    result: list[Any] = []

    async def run() -> None:
        result.append(await in_asyncio(fn))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio_side()
    return result[0]


async def round_trip(url: str, payload: bytes, **options: Any) -> bytes:
    """nats-py (on asyncio): connect with ``options``, subscribe, publish
    ``payload``, return what the subscription got."""
    nc = await nats.connect(url, **options)
    sub = await nc.subscribe("round.trip")
    await nc.publish("round.trip", payload)
    data = (await sub.next_msg(5)).data
    await nc.close()
    return data


# -- core messaging --------------------------------------------------------------------


async def test_pub_sub_with_wildcards(nats_url: str) -> None:
    async def scenario() -> list[tuple[str, bytes]]:
        nc = await nats.connect(nats_url)
        star = await nc.subscribe("greet.*")
        tail = await nc.subscribe("greet.>")
        await nc.publish("greet.joe", b"hello")
        await nc.publish("greet.joe.smith", b"hi")
        got = [(m.subject, m.data) for m in (await star.next_msg(5), await tail.next_msg(5), await tail.next_msg(5))]
        await nc.close()
        return got

    assert await in_asyncio(scenario) == [("greet.joe", b"hello"), ("greet.joe", b"hello"), ("greet.joe.smith", b"hi")]


async def test_queue_groups_get_each_message_once(nats_url: str) -> None:
    async def scenario() -> tuple[int, int, int]:
        a, b, pub = await nats.connect(nats_url), await nats.connect(nats_url), await nats.connect(nats_url)
        qa = await a.subscribe("work", queue="workers")
        qb = await b.subscribe("work", queue="workers")
        everyone = await a.subscribe("work")
        await subscribed(a)
        await subscribed(b)
        for i in range(100):
            await pub.publish("work", str(i).encode())
        await pub.flush()
        seen = [int((await everyone.next_msg(5)).data) for _ in range(100)]
        await a.flush()
        await b.flush()
        got_a, got_b = qa.pending_msgs, qb.pending_msgs
        await asyncio.gather(a.close(), b.close(), pub.close())
        return len(seen), got_a, got_b

    total, got_a, got_b = await in_asyncio(scenario)
    assert total == 100 and got_a + got_b == 100
    assert got_a > 0 and got_b > 0  # random choice: both get some of 100 (1 in 2**99 to fail)


async def test_unsubscribe_with_a_maximum(nats_server: ServerHandle, nats_url: str) -> None:
    async def scenario() -> list[bytes]:
        nc = await nats.connect(nats_url)
        sub = await nc.subscribe("count")
        await sub.unsubscribe(limit=3)
        for i in range(5):
            await nc.publish("count", b"%d" % i)
        await nc.flush()
        got = [m.data async for m in sub.messages]  # ends after the third
        await nc.close()
        return got

    assert await in_asyncio(scenario) == [b"0", b"1", b"2"]
    assert len(nats_server.broker.subs) == 0


async def test_request_reply_through_inboxes(nats_url: str) -> None:
    async def scenario() -> bytes:
        nc = await nats.connect(nats_url)

        async def answer(msg: Any) -> None:
            await msg.respond(msg.data.upper())

        await nc.subscribe("svc.upper", cb=answer)
        reply = await nc.request("svc.upper", b"shout", timeout=5)
        await nc.close()
        return reply.data

    assert await in_asyncio(scenario) == b"SHOUT"


async def test_no_responders(nats_url: str) -> None:
    async def scenario() -> str:
        nc = await nats.connect(nats_url)
        try:
            with pytest.raises(nats.errors.NoRespondersError):
                await nc.request("nobody.home", b"?", timeout=5)
            return "no responders"
        finally:
            await nc.close()

    assert await in_asyncio(scenario) == "no responders"


def no_responders(reply: str, sid: str, subject: str) -> PN.NatsMsg:
    """The status message nats-server 2.15 sends for a request on ``subject``."""
    return PN.NatsMsg(reply, sid, None, b"NATS/1.0 503\r\nNats-Subject: " + subject.encode() + b"\r\n\r\n", b"")


async def test_no_responders_status_message_bytes(nats_url: str) -> None:
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=True, no_responders=True)
    await peer.send(b"SUB _INBOX.x.* 9\r\nPUB nobody _INBOX.x.1 2\r\nhi\r\nPING\r\n")
    # Byte for byte what nats-server 2.15.1 sends (client.go, processMsgResults).
    assert await peer.next_event() == no_responders("_INBOX.x.1", "9", "nobody")
    assert await peer.next_event() is PONG


async def test_no_responders_goes_to_one_own_subscription_in_the_servers_order(nats_url: str) -> None:
    """One status message, to the requester's first matching subscription as
    nats-server's sublist orders them (``>`` before ``*`` before a literal token);
    another client subscribed to the reply subject gets nothing."""
    other = await RawNats.open(nats_url)
    await other.connect(headers=True, no_responders=True)
    await other.send(b"SUB _INBOX.> 1\r\nPING\r\n")
    assert await other.next_event() is PONG
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=True, no_responders=True)
    await peer.send(b"SUB _INBOX.x.1 1\r\nSUB _INBOX.x.* 2\r\nSUB _INBOX.*.1 3\r\nSUB _INBOX.> 4\r\nSUB _INBOX.y.* 5\r\n"
                    b"PUB nobody.home _INBOX.x.1 0\r\n\r\nPING\r\n")
    assert await peer.next_event() == no_responders("_INBOX.x.1", "4", "nobody.home")
    assert await peer.next_event() is PONG
    await peer.send(b"UNSUB 4\r\nPUB nobody.home _INBOX.x.1 0\r\n\r\nPING\r\n")
    assert await peer.next_event() == no_responders("_INBOX.x.1", "3", "nobody.home")
    assert await peer.next_event() is PONG
    await other.send(b"PING\r\n")
    assert await other.next_event() is PONG  # nothing before it


async def test_no_status_without_no_responders_or_own_subscription(nats_url: str) -> None:
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=True)  # no_responders not asked for
    await peer.send(b"SUB _INBOX.x.* 1\r\nPUB nobody _INBOX.x.1 0\r\n\r\nPING\r\n")
    assert await peer.next_event() is PONG
    asker = await RawNats.open(nats_url)
    await asker.connect(headers=True, no_responders=True)
    await asker.send(b"SUB other.* 1\r\nPUB nobody _INBOX.x.1 0\r\n\r\nPING\r\n")  # no subscription of its own matches
    assert await asker.next_event() is PONG
    await peer.send(b"PING\r\n")
    assert await peer.next_event() is PONG


async def test_no_responders_needs_headers(nats_url: str) -> None:
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=False, no_responders=True)
    assert await peer.until_closed() == [err("no responders requires headers support")]


async def test_headers(nats_url: str) -> None:
    async def scenario() -> tuple[dict[str, str] | None, bytes]:
        nc = await nats.connect(nats_url)
        sub = await nc.subscribe("h")
        await nc.publish("h", b"body", headers={"Trace-Id": "abc", "X": "y z"})
        msg = await sub.next_msg(5)
        await nc.close()
        return msg.headers, msg.data

    assert await in_asyncio(scenario) == ({"Trace-Id": "abc", "X": "y z"}, b"body")


async def test_a_client_without_header_support_gets_the_payload(nats_url: str) -> None:
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=False)
    await peer.send(b"SUB h 1\r\nPING\r\n")
    assert await peer.next_event() is PONG
    publisher = await RawNats.open(nats_url)
    await publisher.connect(headers=True)
    await publisher.send(b"HPUB h 18 20\r\nNATS/1.0\r\nA: b\r\n\r\nhi\r\nPING\r\n")
    assert await publisher.next_event() is PONG
    assert await peer.next_event() == PN.NatsMsg("h", "1", None, None, b"hi")


async def test_hpub_needs_headers_in_connect(nats_url: str) -> None:
    """nats-server's parser takes HPUB only from a client whose CONNECT said headers."""
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=False)
    await peer.send(b"HPUB h 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPING\r\n")
    assert await peer.until_closed() == [err("Unknown Protocol Operation")]


async def test_connect_defaults_are_the_servers(nats_url: str) -> None:
    """What CONNECT leaves out takes nats-server's defaults: verbose and pedantic on
    (a +OK for each operation, wildcards refused in a PUB subject); a later CONNECT
    changes only the fields it has."""
    peer = await RawNats.open(nats_url)
    assert isinstance(await peer.next_event(), PN.NatsInfo)
    await peer.send(b"CONNECT {}\r\nSUB a 1\r\nPUB a.* 1\r\nx\r\nUNSUB 99\r\nPING\r\n")
    assert [await peer.next_event() for _ in range(6)] == [OK, OK, err("Invalid Publish Subject"), OK, OK, PONG]
    await peer.send(b'CONNECT {"verbose": false}\r\nPUB a.* 1\r\nx\r\nPING\r\n')
    assert [await peer.next_event() for _ in range(2)] == [err("Invalid Publish Subject"), PONG]  # still pedantic


@pytest.mark.parametrize("proto", [2, -1, "1"])
async def test_connect_with_an_unknown_protocol_is_refused(nats_url: str, proto: object) -> None:
    peer = await RawNats.open(nats_url)
    await peer.connect(protocol=proto)
    assert await peer.until_closed() == [err("invalid client protocol")]


async def test_echo_false_skips_own_subscriptions(nats_url: str) -> None:
    peer = await RawNats.open(nats_url)
    await peer.connect(echo=False)
    await peer.send(b"SUB e 1\r\nPUB e 1\r\nx\r\nPING\r\n")
    assert await peer.next_event() is PONG


# -- across protocols --------------------------------------------------------------------


@pytest.fixture
async def orders(nats_server: ServerHandle) -> None:
    """A topic ``shop/orders`` (one partition) capturing ``orders.>``."""
    async with connect(nats_server.address) as client:
        await client.create_stream("shop")
        await client.create_topic("shop", "orders", partitions=1, subjects=["orders.>"])


async def test_core_messages_cross_from_nats_to_ttlbroker(nats_server: ServerHandle, nats_url: str) -> None:
    async with connect(nats_server.address) as client:
        sub = await client.subscribe("chat.>")

        async def scenario() -> None:
            nc = await nats.connect(nats_url)
            await nc.publish("chat.room1", b"hello", headers={"From": "nats"})
            await nc.publish("chat.room2", b"plain")
            await nc.close()

        await in_asyncio(scenario)
        first, second = await sub.next(timeout=5), await sub.next(timeout=5)
    assert (first.subject, first.payload, first.headers, first.offset) == ("chat.room1", b"hello", {"From": "nats"}, 0)
    assert (second.subject, second.payload, second.headers) == ("chat.room2", b"plain", {})


async def test_ttlbroker_publishes_reach_nats_subscribers(nats_server: ServerHandle, nats_url: str, orders: None) -> None:
    subscribed, published = threading.Event(), threading.Event()

    async def scenario() -> list[tuple[str, bytes, dict[str, str] | None, str]]:
        nc = await nats.connect(nats_url)
        sub = await nc.subscribe(">")
        await nc.flush()
        subscribed.set()
        await asyncio_wait(published)
        got = [(m.subject, m.data, m.headers, m.reply) for m in [await sub.next_msg(5) for _ in range(2)]]
        await nc.close()
        return got

    async def ttlbroker_side() -> None:
        async with connect(nats_server.address) as client:
            await wait_for(subscribed)
            await client.publish("orders.1", b"stored", headers={"K": "v"})
            with pytest.raises(P.NoTopicForSubjectError):  # type: ignore[attr-defined]
                await client.publish("chat.1", b"unstored")
            published.set()

    got = await beside(scenario, ttlbroker_side)
    assert got == [("orders.1", b"stored", {"K": "v"}, ""), ("chat.1", b"unstored", None, "")]


async def test_nats_publishes_on_a_topic_subject_are_stored_with_a_puback(
    nats_server: ServerHandle, nats_url: str, orders: None,
) -> None:
    async with connect(nats_server.address) as client:

        async def scenario() -> tuple[str, int, bool, bytes]:
            nc = await nats.connect(nats_url)
            sub = await nc.subscribe("orders.*")
            js = nc.jetstream()
            ack = await js.publish("orders.a", b"one", headers={"H": "1"})
            await nc.publish("orders.b", b"two")  # no reply: stored, no ack
            core = await sub.next_msg(5)  # a core subscriber sees the stored message
            await nc.flush()
            await nc.close()
            return ack.stream, ack.seq, ack.duplicate, core.data

        stream, seq, duplicate, core = await in_asyncio(scenario)
        assert (stream, seq, core) == ("shop/orders", 1, b"one") and not duplicate  # omitted when false, as nats-server does
        result = await client.fetch("shop", "orders", partition=0, offset=1, count=10)
        assert [(m.subject, m.payload, m.headers) for m in result.messages] == [
            ("orders.a", b"one", {"H": "1"}), ("orders.b", b"two", {})]


# -- CONNECT, auth, verbose ---------------------------------------------------------------


async def test_info_describes_the_listener(nats_server: ServerHandle, nats_url: str) -> None:
    peer = await RawNats.open(nats_url)
    info = await peer.next_event()
    assert isinstance(info, PN.NatsInfo)
    i = info.info
    assert (i["proto"], i["headers"], i["max_payload"], i["port"]) == (1, True, 1024 * 1024, nats_server.nats_port)
    assert "auth_required" not in i and "tls_required" not in i and i["server_id"] and i["version"] == "2.12.0"
    assert i["ttlbroker_version"] == VERSION
    assert i["client_ip"] == "127.0.0.1"  # as nats-server

    async def client_ip() -> str | None:
        nc = await nats.connect(nats_url)
        ip = nc.client_ip
        await nc.close()
        return ip

    assert await in_asyncio(client_ip) == "127.0.0.1"


async def test_verbose_answers_ok(nats_url: str) -> None:
    peer = await RawNats.open(nats_url)
    await peer.connect(verbose=True)
    await peer.send(b"SUB a 1\r\nPUB a 1\r\nx\r\nUNSUB 1\r\nPING\r\n")
    # As nats-server: a PUB's +OK goes before the message it delivers.
    assert [await peer.next_event() for _ in range(6)] == [
        OK, OK, OK, PN.NatsMsg("a", "1", None, None, b"x"), OK, PONG]

    async def with_nats_py() -> bool:
        nc = await nats.connect(nats_url, verbose=True)
        await nc.publish("v", b"x")
        await nc.flush()
        ok = nc.is_connected
        await nc.close()
        return ok

    assert await in_asyncio(with_nats_py)


@pytest.fixture
def token_config(data_dir: Path) -> Config:
    return make_config(data_dir, **{"nats.enabled": True, "server.auth_token": "s3cret", "limits.auth_failure_delay": 0})


async def test_auth_token(token_config: Config) -> None:
    async with start_server(token_config) as handle:
        url = handle.nats_url
        assert url is not None

        async def bad() -> str:
            with pytest.raises(Exception) as info:
                await nats.connect(url, token="wrong", allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5)
            return str(info.value)

        assert await in_asyncio(round_trip, url, b"in", token="s3cret") == b"in"
        assert "authorization violation" in (await in_asyncio(bad)).lower()

        peer = await RawNats.open(url)
        info = await peer.connect(auth_token="wrong")
        assert info["auth_required"] is True
        assert await peer.until_closed() == [err("Authorization Violation")]

        peer = await RawNats.open(url)
        await peer.next_event()
        await peer.send(b"PING\r\n")  # anything but CONNECT first
        assert await peer.until_closed() == [err("Authorization Violation")]
        assert handle.broker.counters.auth_failures == 3


async def test_no_connect_in_time_is_an_authentication_timeout(data_dir: Path) -> None:
    config = make_config(data_dir, **{"nats.enabled": True, "server.auth_token": "t", "limits.handshake_timeout": 0.2})
    async with start_server(config) as handle:
        peer = await RawNats.open(handle.nats_url or "")
        assert isinstance(await peer.next_event(), PN.NatsInfo)
        assert await peer.until_closed() == [err("Authentication Timeout")]


# -- bad input and limits ------------------------------------------------------------------


async def test_garbage_costs_only_its_connection(nats_url: str) -> None:
    ready, done = threading.Event(), threading.Event()

    async def bystander() -> bytes:
        nc = await nats.connect(nats_url)
        sub = await nc.subscribe("still")
        await nc.flush()
        ready.set()
        await asyncio_wait(done)
        await nc.publish("still", b"here")
        data = (await sub.next_msg(5)).data
        await nc.close()
        return data

    async def vandals() -> None:
        await wait_for(ready)
        for junk, text in (
            (b"GET / HTTP/1.1\r\n\r\n", "Unknown Protocol Operation"),
            (b"\x16\x03\x01\x00\xff", "Unknown Protocol Operation"),
            (b"PUB a " + b"9" * 5000, "maximum control line exceeded"),
            (b"PUB a 1\r\nxyz", "Unknown Protocol Operation"),
        ):
            peer = await RawNats.open(nats_url)
            await peer.connect()
            await peer.send(junk)
            assert await peer.until_closed() == [err(text)], junk
        done.set()

    assert await beside(bystander, vandals) == b"here"


async def test_invalid_subjects(nats_url: str) -> None:
    peer = await RawNats.open(nats_url)
    await peer.connect(pedantic=True)
    await peer.send(b"SUB a..b 1\r\nSUB a.>.b 2\r\nPUB a.* 1\r\nx\r\nPING\r\n")
    assert [await peer.next_event() for _ in range(4)] == [
        err("Invalid Subject"), err("Invalid Subject"), err("Invalid Publish Subject"), PONG]
    peer = await RawNats.open(nats_url)
    await peer.connect(pedantic=False)
    # Not pedantic, as nats-server 2.15.1: wildcard tokens of a published subject are
    # literal ones (a.* and a.>.b reach ">"); an empty token is dropped without a word.
    await peer.send(b"SUB > 1\r\nPUB a.* 1\r\nx\r\nPUB a..b 1\r\ny\r\nPUB a.>.b 1\r\nz\r\nPING\r\n")
    assert [await peer.next_event() for _ in range(3)] == [
        PN.NatsMsg("a.*", "1", None, None, b"x"), PN.NatsMsg("a.>.b", "1", None, None, b"z"), PONG]


async def test_max_payload(data_dir: Path) -> None:
    config = make_config(data_dir, **{"nats.enabled": True, "limits.max_payload_bytes": 1000})
    async with start_server(config) as handle:
        url = handle.nats_url or ""

        async def scenario() -> int:
            nc = await nats.connect(url)
            try:
                with pytest.raises(nats.errors.MaxPayloadError):
                    await nc.publish("big", b"x" * 1001)
                return nc.max_payload
            finally:
                await nc.close()

        assert await in_asyncio(scenario) == 1000
        peer = await RawNats.open(url)
        await peer.connect()
        await peer.send(b"PUB big 1001\r\n")
        assert await peer.until_closed() == [err("Maximum Payload Violation")]


async def test_server_pings_and_stale_connections(data_dir: Path) -> None:
    config = make_config(data_dir, **{"nats.enabled": True, "nats.ping_interval": 0.2, "nats.max_pings_out": 2})
    async with start_server(config) as handle:
        url = handle.nats_url or ""
        answering = await RawNats.open(url)
        await answering.connect()
        for _ in range(5):  # more PINGs than max_pings_out: answered, so never stale
            assert await answering.next_event() is PING
            await answering.send(b"PONG\r\n")
        silent = await RawNats.open(url)
        await silent.connect()
        assert await silent.until_closed() == [PING, PING, err("Stale Connection")]


async def test_subscriptions_per_connection_limit(data_dir: Path) -> None:
    config = make_config(data_dir, **{"nats.enabled": True, "limits.max_subscriptions_per_connection": 2})
    async with start_server(config) as handle:
        peer = await RawNats.open(handle.nats_url or "")
        await peer.connect()
        await peer.send(b"SUB a 1\r\nSUB b 2\r\nSUB c 3\r\nPING\r\n")
        assert [await peer.next_event() for _ in range(2)] == [err("maximum subscriptions exceeded"), PONG]


async def test_connections_are_counted_with_the_main_port(data_dir: Path) -> None:
    config = make_config(data_dir, **{"nats.enabled": True, "limits.max_connections": 2})
    async with start_server(config) as handle:
        url = handle.nats_url or ""
        async with connect(handle.address) as client:
            first = await RawNats.open(url)
            await first.connect()
            await first.send(b"PING\r\n")
            assert await first.next_event() is PONG
            refused = await RawNats.open(url)
            assert await refused.until_closed() == [err("maximum connections exceeded")]
            stats = await client.stats()
            assert (stats["connections"], stats["nats_connections"], stats["connections_refused"]) == (2, 1, 1)
            async with httpx.AsyncClient(base_url=handle.monitoring_url or "", timeout=10) as http:
                metrics = (await http.get("/metrics")).text
            assert "\nttlbroker_nats_connections 1.0\n" in metrics and "\nttlbroker_connections 2.0\n" in metrics


async def test_slow_consumer_is_cut_off(data_dir: Path) -> None:
    limit = 64 * 1024
    config = make_config(data_dir, **{
        "nats.enabled": True, "limits.max_frame_bytes": limit, "limits.max_payload_bytes": 1024,
        "limits.max_pending_bytes_per_connection": limit, "limits.slow_consumer_seconds": 0.3,
    })
    async with start_server(config) as handle:
        url = handle.nats_url or ""
        sleeper = await RawNats.open(url)
        await sleeper.connect()
        await sleeper.send(b"SUB flood 1\r\nPING\r\n")
        assert await sleeper.next_event() is PONG
        counters = handle.broker.counters

        async def flood() -> None:
            nc = await nats.connect(url)
            while counters.slow_consumers == 0:  # the sleeper reads nothing meanwhile
                for _ in range(1000):
                    await nc.publish("flood", b"x" * 1000)
                await nc.flush()
            await nc.close()

        await in_asyncio(flood)
        events = await sleeper.until_closed(timeout=20)
        assert events[-1] == err("Slow Consumer") and counters.deliveries_dropped > 0
        assert all(isinstance(e, PN.NatsMsg) for e in events[:-1])


# -- TLS -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("nats-certs")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    leaf.private_key_pem.write_to_path(str(d / "key.pem"))
    return d / "ca.pem", d / "cert.pem", d / "key.pem"


async def test_tls_with_the_main_listeners_certificates(data_dir: Path, tls_files: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls_files
    config = make_config(data_dir, **{"nats.enabled": True, "server.tls_cert": str(cert), "server.tls_key": str(key)})
    async with start_server(config) as handle:
        url = handle.nats_url or ""

        context = ssl.create_default_context(cafile=str(ca))
        assert await in_asyncio(round_trip, url, b"sealed", tls=context) == b"sealed"
        plain = await RawNats.open(url)
        info = await plain.connect()  # and goes on in plain text
        assert info["tls_required"] is True and info["tls_available"] is True
        assert await plain.until_closed() == [err("Secure Connection - TLS Required")]
        assert handle.broker.counters.tls_handshake_failures == 1


async def test_tls_handshake_first(data_dir: Path, tls_files: tuple[Path, Path, Path]) -> None:
    """``[nats] tls_handshake_first = true``: the client starts TLS at once (nats-py's
    ``tls_handshake_first``) and INFO comes over TLS; a client that speaks plain
    text first is told TLS is required, without an INFO."""
    ca, cert, key = tls_files
    config = make_config(data_dir, **{"nats.enabled": True, "server.tls_cert": str(cert), "server.tls_key": str(key),
                                      "nats.tls_handshake_first": True})
    async with start_server(config) as handle:
        url = handle.nats_url or ""
        context = ssl.create_default_context(cafile=str(ca))
        assert await in_asyncio(round_trip, url, b"first", tls=context, tls_handshake_first=True) == b"first"
        plain = await RawNats.open(url)
        await plain.send(b"CONNECT {}\r\n")
        assert await plain.until_closed() == [err("Secure Connection - TLS Required")]


async def test_tls_handshake_first_within_a_wait_lets_both_kinds_of_client_in(
    data_dir: Path, tls_files: tuple[Path, Path, Path]
) -> None:
    """``tls_handshake_first = "50ms"``: a client that starts TLS within the wait
    gets INFO over TLS; one that waits for INFO gets it after the wait, then starts
    TLS as usual."""
    ca, cert, key = tls_files
    config = make_config(data_dir, **{"nats.enabled": True, "server.tls_cert": str(cert), "server.tls_key": str(key),
                                      "nats.tls_handshake_first": "50ms"})
    assert config.nats.tls_handshake_first == 0.05
    async with start_server(config) as handle:
        url = handle.nats_url or ""
        context = ssl.create_default_context(cafile=str(ca))
        assert await in_asyncio(round_trip, url, b"first", tls=context, tls_handshake_first=True) == b"first"
        assert await in_asyncio(round_trip, url, b"after", tls=context) == b"after"
        plain = await RawNats.open(url)
        info = await plain.connect()
        assert info["tls_required"] is True
        assert await plain.until_closed() == [err("Secure Connection - TLS Required")]


async def test_a_shutdown_closes_nats_connections_without_a_word(data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As nats-server, a broker that shuts down closes its NATS connections without
    an -ERR line; nothing is queued for them (an empty write racing the half-close
    failed the connection's tasks, logged as an error)."""
    caplog.set_level(logging.INFO, logger="broker")
    async with start_server(make_config(data_dir, **{"nats.enabled": True})) as handle:
        peer = RawNats(await trio.open_tcp_stream("127.0.0.1", handle.nats_port or 0))
        await peer.connect(headers=True)
        await peer.send(b"PING\r\n")
        assert await peer.next_event() == PONG
    assert await peer.until_closed() == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# -- reconnect ----------------------------------------------------------------------------------


async def test_nats_py_reconnects_after_a_broker_restart(data_dir: Path) -> None:
    config = make_config(data_dir, **{"nats.enabled": True})
    subscribed, reconnected, restarted, done = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    url: list[str] = []

    async def scenario() -> bytes:
        async def on_reconnect() -> None:
            reconnected.set()

        nc = await nats.connect(url[0], reconnect_time_wait=0.05, max_reconnect_attempts=-1, reconnected_cb=on_reconnect)
        sub = await nc.subscribe("again")
        await nc.flush()
        subscribed.set()
        await asyncio_wait(restarted)
        await asyncio_wait(reconnected)
        await nc.publish("again", b"back")  # the subscription was sent again on reconnect
        data = (await sub.next_msg(5)).data
        await nc.close()
        done.set()
        return data

    started = threading.Event()

    async def scenario_when_up() -> bytes:
        await asyncio_wait(started)
        return await scenario()

    async def broker_side() -> None:
        async with start_server(config) as first:
            url.append(first.nats_url or "")
            port = first.nats_port
            started.set()
            await wait_for(subscribed)
        async with start_server(config.replace(**{"nats.port": port})):
            restarted.set()
            await wait_for(done)

    assert await beside(scenario_when_up, broker_side) == b"back"


async def test_pipelined_publishes_keep_their_order_and_each_get_their_ack(
    nats_server: ServerHandle, nats_url: str, orders: None,
) -> None:
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=True)
    bad = b"NATS/1.0\r\nNats-TTL: 1s\r\n\r\n"  # the topic does not allow per-message TTLs
    await peer.send(
        b"SUB orders.> 1\r\nSUB chat 2\r\nSUB r.* 3\r\n"
        b"PUB orders.a r.1 1\r\na\r\nPUB chat 1\r\nc\r\n"
        + b"HPUB orders.b r.2 %d %d\r\n%sb\r\n" % (len(bad), len(bad) + 1, bad)
        + b"PUB orders.c r.3 1\r\nc\r\nPUB orders.d 1\r\nd\r\nPING\r\n"
    )
    deliveries, acks = [], {}
    while len(acks) < 3:
        ev = await peer.next_event()
        assert isinstance(ev, PN.NatsMsg) or ev is PONG, ev
        if isinstance(ev, PN.NatsMsg) and ev.sid == "3":
            acks[ev.subject] = json.loads(ev.payload)
        elif isinstance(ev, PN.NatsMsg):
            deliveries.append(ev.subject)
    assert deliveries == ["orders.a", "chat", "orders.c", "orders.d"]
    assert (acks["r.1"]["seq"], acks["r.3"]["seq"]) == (1, 2)
    assert acks["r.2"]["error"]["err_code"] == 10166 and acks["r.2"]["seq"] == 0  # per-message TTL is disabled
    async with connect(nats_server.address) as client:
        stored = await client.fetch("shop", "orders", partition=0, offset=1, count=10)
    assert [m.subject for m in stored.messages] == ["orders.a", "orders.c", "orders.d"]


async def test_random_bytes_from_many_connections_cost_only_those(nats_url: str) -> None:
    import random

    rng = random.Random(14)
    pieces = [b"PUB a 3\r\nabc\r\n", b"SUB a 1\r\n", b"PING\r\n", b"HPUB a 12 12\r\nNATS/1.0\r\n\r\n\r\n", b"CONNECT {}\r\n",
              b"UNSUB 1 2\r\n", b"\r\n", b"\x00\xff", b"PUB", b" 99999999999999\r\n", b"-ERR\r\n", b"MSG a 1 1\r\nx\r\n"]

    inputs = [b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) + bytes(rng.randrange(256) for _ in range(8))
              for _ in range(40)]

    async def vandal(data: bytes) -> None:
        peer = await RawNats.open(nats_url)
        await peer.next_event()  # INFO
        try:
            await peer.send(data)
            events = await peer.until_closed(timeout=10)
        except trio.BrokenResourceError:  # reset: the server closed while we wrote
            return
        assert events and events[-1] in [err("Unknown Protocol Operation"), err("maximum control line exceeded"),
                                          err("Maximum Payload Violation")], (data, events)

    async with trio.open_nursery() as nursery:
        for data in inputs:
            nursery.start_soon(vandal, data)

    assert await in_asyncio(round_trip, nats_url, b"fine") == b"fine"  # the others carry on
