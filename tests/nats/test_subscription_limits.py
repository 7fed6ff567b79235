"""What NATS connections may make the broker hold for their subscriptions (issue 27):
a subject (and queue group) of at most ``limits.max_subscription_subject_bytes``, a
control line of at most ``[nats] max_control_line``, and, across every connection
of both protocols, the subscription budget ``limits.max_subscription_bytes_total``.
Each refusal is asserted by its exact ``-ERR`` line and counter; a refused ``SUB``
leaves the connection open and everything else as it was.

The attack of the issue (150 connections, each pipelining SUBs on long subjects)
runs here on raw sockets against an in-process broker, scaled down in subscriptions
per connection and in the budget so that it takes seconds."""

from __future__ import annotations

from pathlib import Path

import httpx
import nats
import pytest
import trio
from conftest import make_config, start_server
from helpers import RawNats, in_asyncio

import protocol as P
import protocol.nats as PN
from broker import ServerHandle
from broker.client import connect

PING, PONG, OK = PN.NatsPing, PN.NatsPong, PN.NatsOk
MAX_SUBS = PN.NatsErr("maximum subscriptions exceeded")
INVALID = PN.NatsErr("Invalid Subject")
MAX_LINE = PN.NatsErr("maximum control line exceeded")


def index_bytes(handle: ServerHandle) -> int:
    """The footprints of the subscriptions the index holds, summed one by one: what
    its running count must always be."""
    return sum(sub.footprint for sub in handle.broker.subs._all)


async def until_pong(peer: RawNats) -> list[object]:
    """Every event up to the PONG that answers the PING sent last (the PONG left out)."""
    seen = []
    while (ev := await peer.next_event()) is not PONG:
        assert ev is not None, f"closed after {seen}"
        seen.append(ev)
    return seen


async def no_subscriptions_left(handle: ServerHandle) -> None:
    """Wait until the broker has handled the close of every connection that held
    subscriptions (a peer's close reaches its session a moment later)."""
    with trio.fail_after(10):
        while len(handle.broker.subs) or handle.broker.subs.bytes:
            await trio.sleep(0.01)


# -- per connection: the subject limit and the control line --------------------------


async def test_a_subject_or_queue_group_over_the_limit_is_refused_and_the_connection_goes_on(data_dir: Path) -> None:
    config = make_config(data_dir, **{"nats.enabled": True, "limits.max_subscription_subject_bytes": 16})
    async with start_server(config) as handle:
        peer = await RawNats.open(handle.nats_url or "")
        await peer.connect(verbose=True)
        assert await peer.next_event() is OK  # the CONNECT's
        await peer.send(
            b"SUB " + b"a" * 16 + b" 1\r\n"  # at the limit
            b"SUB " + b"a" * 17 + b" 2\r\n"  # one byte over
            b"SUB q " + b"g" * 17 + b" 3\r\n"  # a queue group over it
            + b"SUB " + ("é" * 8).encode() + b" 4\r\n"  # 16 bytes of UTF-8 in 8 characters
            + b"SUB " + ("é" * 8 + "x").encode() + b" 5\r\n"  # 17 bytes in 9 characters
            + b"SUB b g 6\r\nPING\r\n"
        )
        # A refused SUB gets its -ERR and no +OK; the connection goes on.
        assert await until_pong(peer) == [OK, INVALID, INVALID, OK, INVALID, OK]
        counters = handle.broker.counters
        assert (counters.subscriptions_refused, counters.subscription_budget_refused) == (3, 0)
        assert len(handle.broker.subs) == 3 and handle.broker.subs.bytes == index_bytes(handle)
        await peer.send(b"PUB " + b"a" * 16 + b" 2\r\nhi\r\nPUB b 3\r\nyou\r\nPING\r\n")
        assert await until_pong(peer) == [
            OK, PN.NatsMsg("a" * 16, "1", None, None, b"hi"), OK, PN.NatsMsg("b", "6", None, None, b"you")]
        await peer.aclose()


async def test_the_subscriptions_per_connection_limit_is_counted(data_dir: Path) -> None:
    config = make_config(data_dir, **{"nats.enabled": True, "limits.max_subscriptions_per_connection": 2})
    async with start_server(config) as handle:
        peer = await RawNats.open(handle.nats_url or "")
        await peer.connect()
        await peer.send(b"SUB a 1\r\nSUB b 2\r\nSUB c 3\r\nSUB d 4\r\nPING\r\n")
        assert await until_pong(peer) == [MAX_SUBS, MAX_SUBS]
        assert handle.broker.counters.subscriptions_refused == 2
        assert handle.broker.counters.subscription_budget_refused == 0
        await peer.aclose()


async def test_max_control_line_is_a_config_key(data_dir: Path) -> None:
    """nats-server's ``max_control_line``: at most that many bytes before the line's
    end (CR LF not counted), else ``-ERR 'maximum control line exceeded'`` and the
    close, as nats-server; whether the line is whole or still arriving, a SUB or a PUB
    (which the parser reads on a path of its own)."""
    config = make_config(data_dir, **{"nats.enabled": True, "nats.max_control_line": "600"})
    async with start_server(config) as handle:
        url = handle.nats_url or ""
        assert handle.broker.config.nats.max_control_line == 600
        fits = b"SUB " + b"s" * (600 - 6) + b" 1"  # 600 bytes
        assert len(fits) == 600
        peer = await RawNats.open(url)
        await peer.connect()
        await peer.send(fits + b"\r\nPING\r\n")
        assert await until_pong(peer) == []
        for line in (b"SUB " + b"s" * (600 - 5) + b" 2\r\n",  # 601 bytes
                     b"PUB " + b"p" * (600 - 5) + b" 0\r\n\r\n",
                     b"SUB " + b"s" * 700):  # no end of line yet
            over = await RawNats.open(url)
            await over.connect()
            await over.send(line)
            assert await over.until_closed() == [MAX_LINE], line[:20]
        assert len(handle.broker.subs) == 1
        await peer.send(b"PING\r\n")
        assert await until_pong(peer) == []  # the others cost only their connections
        await peer.aclose()


# -- across the broker: the subscription budget ----------------------------------------


async def test_many_connections_with_long_subjects_stay_within_the_budget(data_dir: Path) -> None:
    """The issue's attack: 150 NATS connections, each pipelining SUBs on long
    subjects. Without the budget it took the broker to 1.4 GB; here every SUB past
    the budget gets ``-ERR 'maximum subscriptions exceeded'`` and its connection
    goes on, a 4,000-byte subject gets ``-ERR 'Invalid Subject'`` (over
    ``max_subscription_subject_bytes``), the counted bytes never pass the budget,
    and once the attackers close, an ordinary client subscribes and receives."""
    budget = 1024 * 1024
    config = make_config(data_dir, **{"nats.enabled": True, "limits.max_subscription_bytes_total": budget})
    connections, long_subs, huge_subs = 150, 20, 2
    async with start_server(config) as handle:
        url = handle.nats_url or ""
        subs = handle.broker.subs
        attackers: list[RawNats] = []
        refusals = {"budget": 0, "subject": 0}
        peak = 0
        accepted = 0

        async def attack(c: int) -> None:
            nonlocal peak, accepted
            peer = await RawNats.open(url)
            attackers.append(peer)
            await peer.connect()
            lines = []
            for i in range(long_subs):
                head = f"atk.{c}.{i}.".encode()
                lines.append(b"SUB " + head + b"x" * (1000 - len(head)) + f" {i}\r\n".encode())
            for i in range(huge_subs):
                lines.append(b"SUB big.x." + b"y" * 3990 + f" h{i}\r\n".encode())
            await peer.send(b"".join(lines) + b"PING\r\n")
            events = await until_pong(peer)  # the PONG: the connection is still open
            assert set(events) <= {MAX_SUBS, INVALID}, events
            refusals["budget"] += events.count(MAX_SUBS)
            refusals["subject"] += events.count(INVALID)
            accepted += long_subs + huge_subs - len(events)
            peak = max(peak, subs.bytes)
            assert subs.bytes <= budget

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for c in range(connections):
                    nursery.start_soon(attack, c)
        counters = handle.broker.counters
        assert refusals["subject"] == connections * huge_subs == counters.subscriptions_refused
        assert refusals["budget"] == counters.subscription_budget_refused
        assert accepted == len(subs) and refusals["budget"] == connections * long_subs - accepted
        # The budget is full to within one subscription, and no further.
        footprint = max(sub.footprint for sub in subs._all)
        assert budget - footprint < subs.bytes == index_bytes(handle) <= budget and peak <= budget
        assert accepted < 320  # of 3,000: each holds some 3,300 bytes

        # Nothing else changed for a refused connection: it reads, it may retry.
        bystander = await RawNats.open(url)
        await bystander.connect()
        await bystander.send(b"SUB ordinary 1\r\nPING\r\n")
        assert await until_pong(bystander) == [MAX_SUBS]
        async with httpx.AsyncClient(base_url=handle.monitoring_url or "", timeout=10) as http:
            metrics = dict(line.rsplit(" ", 1) for line in (await http.get("/metrics")).text.splitlines() if line[:1] != "#")
        assert float(metrics["ttlbroker_subscription_bytes"]) == subs.bytes
        assert float(metrics["ttlbroker_subscription_bytes_budget"]) == budget
        assert float(metrics["ttlbroker_subscription_budget_refused_total"]) == refusals["budget"] + 1
        assert float(metrics["ttlbroker_subscriptions_refused_total"]) == connections * huge_subs

        for peer in attackers:
            await peer.aclose()
        await no_subscriptions_left(handle)
        await bystander.send(b"SUB ordinary 1\r\nPUB ordinary 5\r\nhello\r\nPING\r\n")
        assert await until_pong(bystander) == [PN.NatsMsg("ordinary", "1", None, None, b"hello")]
        await bystander.aclose()

        async def ordinary() -> bytes:
            nc = await nats.connect(url)
            sub = await nc.subscribe("ordinary.too")
            await nc.flush()
            await nc.publish("ordinary.too", b"works")
            data = (await sub.next_msg(5)).data
            await nc.close()
            return data

        assert await in_asyncio(ordinary) == b"works"


async def test_the_budget_refuses_a_queue_group_sub_and_unsub_gives_room_back(data_dir: Path) -> None:
    """The budget counts the queue group and the sid as well as the subject; an UNSUB,
    and an ``UNSUB sid max`` reached by deliveries, give the bytes back at once."""
    budget = 64 * 1024
    config = make_config(data_dir, **{"nats.enabled": True, "limits.max_subscription_bytes_total": budget})
    async with start_server(config) as handle:
        subs = handle.broker.subs
        peer = await RawNats.open(handle.nats_url or "")
        await peer.connect()
        fill = b"".join(b"SUB fill.%d %d\r\n" % (i, i) for i in range(200))
        await peer.send(fill + b"PING\r\n")
        refused = len(await until_pong(peer))
        held = len(subs)
        assert refused == 200 - held and 0 < budget - subs.bytes < 1300
        await peer.send(b"UNSUB 0\r\nSUB work q 900\r\nPING\r\n")
        assert await until_pong(peer) == []  # the room UNSUB gave back
        # UNSUB 1 gives back some 1,200 bytes: not enough for a queue group and a sid
        # of 1,000 bytes each (1,000 + 2 x 1,000 more than a short one).
        await peer.send(b"UNSUB 1\r\nSUB work " + b"q" * 1000 + b" " + b"9" * 1000 + b"\r\nPING\r\n")
        assert await until_pong(peer) == [MAX_SUBS]
        assert handle.broker.counters.subscription_budget_refused == refused + 1
        # UNSUB with a maximum: the subscription goes after its second message.
        await peer.send(b"UNSUB 2 2\r\nPUB fill.2 1\r\na\r\nPUB fill.2 1\r\nb\r\nPING\r\n")
        assert len(await until_pong(peer)) == 2
        assert len(subs) == held - 2 and subs.bytes == index_bytes(handle)
        await peer.aclose()
        await no_subscriptions_left(handle)


async def test_nats_and_binary_subscriptions_share_the_budget(data_dir: Path) -> None:
    """One budget for both protocols: NATS SUBs that fill it leave none for a
    SUBSCRIBE, which gets SUBSCRIPTION_BUDGET_EXCEEDED; a binary client's
    subscriptions that fill it leave none for a SUB."""
    budget = 64 * 1024
    config = make_config(data_dir, **{"nats.enabled": True, "limits.max_subscription_bytes_total": budget})
    async with start_server(config) as handle:
        subs = handle.broker.subs
        peer = await RawNats.open(handle.nats_url or "")
        await peer.connect()
        await peer.send(b"".join(b"SUB n.%d %d\r\n" % (i, i) for i in range(100)) + b"PING\r\n")
        assert set(await until_pong(peer)) == {MAX_SUBS}
        async with connect(handle.address) as client:
            with pytest.raises(P.SubscriptionBudgetExceededError) as info:  # type: ignore[attr-defined]
                await client.subscribe("b.1")
            assert info.value.code == 7013
            await peer.aclose()
            await no_subscriptions_left(handle)
            held = []
            with pytest.raises(P.SubscriptionBudgetExceededError):  # type: ignore[attr-defined]
                for i in range(100):
                    held.append(await client.subscribe(f"b.{i}"))
            assert len(subs) == len(held) and subs.bytes == index_bytes(handle)
            nats_peer = await RawNats.open(handle.nats_url or "")
            await nats_peer.connect()
            await nats_peer.send(b"SUB n.1 1\r\nPING\r\n")
            assert await until_pong(nats_peer) == [MAX_SUBS]
            await nats_peer.aclose()
