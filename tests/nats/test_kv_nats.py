"""NATS KeyValue (nats-py's ``js.create_key_value``, ``js.key_value``) against
ttlbroker's KV buckets: the NATS stream ``KV_<b>`` is the bucket ``kv/<b>`` that our
own client's KV API sees (``broker/nats/_streams.py``)."""

from __future__ import annotations

from typing import Any

import asyncio
import nats.js.errors as jse
from test_js_streams import _js

from broker import ServerHandle
from broker.client import connect
from protocol import Identifier


async def test_put_get_create_update_delete_purge(nats_url: str, nats_server: ServerHandle) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        kv = await js.create_key_value(bucket="profiles", history=5, ttl=3600)
        out: list[Any] = []
        out.append(await kv.put("alice", b"v1"))
        e = await kv.get("alice")
        out.append((e.key, e.value, e.revision))
        out.append(await kv.update("alice", b"v2", last=1))
        try:
            await kv.update("alice", b"v3", last=1)
        except jse.KeyWrongLastSequenceError as err:
            out.append(("wrong", err.description))
        out.append(await kv.create("bob", b"b1"))
        try:
            await kv.create("bob", b"b2")
        except jse.KeyWrongLastSequenceError as err:
            out.append(("exists", err.description))
        await kv.delete("bob")
        try:
            await kv.get("bob")
        except jse.KeyNotFoundError:
            out.append("bob deleted")
        out.append(await kv.create("bob", b"b3"))  # after a delete, create works
        await kv.purge("alice")
        try:
            await kv.get("alice")
        except jse.KeyNotFoundError:
            out.append("alice purged")
        kv2 = await js.key_value("profiles")
        out.append((await kv2.get("bob")).value)
        si = await js.stream_info("KV_profiles")
        out.append((si.config.name, si.config.subjects, si.config.max_age, si.config.max_msgs_per_subject))
        return out

    out = await _js(nats_url, fn)
    assert out[0] == 1
    assert out[1] == ("alice", b"v1", 1)
    assert out[2] == 2
    assert out[3] == ("wrong", "wrong last sequence: 2")
    assert out[4] == 3
    assert out[5] == ("exists", "wrong last sequence: 3")
    assert out[6] == "bob deleted"
    assert out[7] == 5
    assert out[8] == "alice purged"
    assert out[9] == b"b3"
    assert out[10] == ("KV_profiles", ["$KV.profiles.>"], 3600.0, 5)
    # Our own client sees the same bucket, with the NATS max age as the key TTL.
    async with connect(nats_server.address) as client:
        kv = await client.kv("profiles")
        entry = await kv.get("bob")
        status = await kv.status()
    assert entry.value == b"b3" and entry.revision == 5
    assert (status["ttl"], status["refresh"], status["history"]) == (3600, "on_write", 5)


async def test_refresh_policy_set_from_our_side(nats_url: str, nats_server: ServerHandle) -> None:
    """FLIP-25's refresh policy is our bucket option: with ``on_read_and_write`` a
    nats-py get restarts the key's TTL (a refresh lease is taken), with ``on_write``
    it does not."""

    async def put_and_get(nc: Any, js: Any) -> int:
        kv = await js.key_value("cache")
        rev = await kv.put("k", b"v")
        assert (await kv.get("k")).value == b"v"
        return rev

    async def create(nc: Any, js: Any) -> None:
        await js.create_key_value(bucket="cache", ttl=60)

    await _js(nats_url, create)
    part = nats_server.broker.catalog.topic(Identifier.of("kv"), Identifier.of("cache")).partitions[0]
    rev = await _js(nats_url, put_and_get)
    assert rev not in part.refreshed  # on_write: a read refreshes nothing
    async with connect(nats_server.address) as client:
        await client.update_topic("kv", "cache", kv={"ttl": 60, "refresh": "on_read_and_write"})
    rev = await _js(nats_url, put_and_get)
    assert part.refreshed[rev] > part.log.timestamp_of(rev) + 59 * 10**9


async def test_bucket_of_our_client_through_nats(nats_url: str, nats_server: ServerHandle) -> None:
    """A bucket made by our own client is the NATS KV ``KV_<b>`` (direct gets on)."""
    async with connect(nats_server.address) as client:
        kv = await client.kv_create("shared", history=3, ttl=120)
        await kv.put("a", b"ours")

    async def fn(nc: Any, js: Any) -> list[Any]:
        kv = await js.key_value("shared")
        out = [(await kv.get("a")).value, kv._direct]
        await kv.put("b", b"theirs")
        si = await js.stream_info("KV_shared")
        out.append((si.config.max_age, si.config.max_msgs_per_subject, si.config.subject_delete_marker_ttl))
        try:
            await js.key_value("missing")
        except jse.BucketNotFoundError:
            out.append("no bucket")
        return out

    out = await _js(nats_url, fn)
    assert out == [b"ours", True, (120.0, 3, 60.0), "no bucket"]
    async with connect(nats_server.address) as client:
        assert (await (await client.kv("shared")).get("b")).value == b"theirs"


async def test_key_ttl_and_bucket_refusals(nats_url: str) -> None:
    async def fn(nc: Any, js: Any) -> list[Any]:
        kv = await js.create_key_value(bucket="ttl", history=1)
        out: list[Any] = [await kv.create("k", b"v", msg_ttl=30)]
        m = await js.get_msg("KV_ttl", 1)
        out.append(m.headers)
        try:
            await js.create_key_value(bucket="r3", replicas=3)
        except jse.APIError as err:
            out.append((err.code, err.err_code, err.description))
        return out

    out = await _js(nats_url, fn)
    assert out[0] == 1
    assert out[1]["Nats-TTL"] == "30"
    assert out[2] == (500, 10074, "replicas > 1 not supported in non-clustered mode")


async def test_after_an_answered_get_the_reader_waits_for_the_next_request(
    nats_url: str, nats_server: ServerHandle, monkeypatch: Any,
) -> None:
    """nats-py's ``kv.get`` one at a time: each short read's answer goes out at once,
    so the reader next waits for the socket to be readable instead of reading
    (``NatsSession._answers_wait``: the client sends nothing before its answer); a
    core publish that nothing answers on its connection reads at once as before."""
    import nats

    from broker.net import Transport
    from helpers import in_asyncio, subscribed

    waits: list[bool] = []  # per read of the getter's connection, as it begins: it waits for the socket first
    waited = [False]
    real_read, real_wait = Transport.read, Transport.wait_readable

    async def wait_spy(self: Transport) -> None:
        if self.speaker.client_name == "getter":
            waits.append(True)
            waited[0] = True
        await real_wait(self)

    async def spy(self: Transport, partial: Any) -> Any:
        if self.speaker.client_name == "getter":
            if not waited[0] and not partial():  # (after a request cut in two, reading at once is right)
                waits.append(False)
            waited[0] = False
        return await real_read(self, partial)

    async def scenario() -> list[Any]:
        nc = await nats.connect(nats_url, name="getter")
        other = await nats.connect(nats_url)
        try:
            kv = await nc.jetstream().create_key_value(bucket="waits", history=1)
            await kv.put("k", b"v")
            sub = await other.subscribe("seen")
            await subscribed(other)
            waits.clear()
            values = [(await kv.get("k")).value for _ in range(5)]
            await nc.flush()  # a PING read after the last get's answer: that read's wait is in
            for _ in range(5000):  # the PONG can reach us before the session is back at its wait
                if waited[0]:
                    break
                await asyncio.sleep(0.001)
            gets = waits[:]
            waits.clear()
            await nc.publish("seen", b"x")  # delivered to the other connection only
            await sub.next_msg(timeout=5)
            for _ in range(5000):  # the message can reach us before the session is back at its next read
                if waits:
                    break
                await asyncio.sleep(0.001)
            return [values, gets, waits[:]]
        finally:
            await nc.close()
            await other.close()

    monkeypatch.setattr(Transport, "read", spy)
    monkeypatch.setattr(Transport, "wait_readable", wait_spy)
    values, gets, publish = await in_asyncio(scenario)
    assert values == [b"v"] * 5
    assert len(gets) >= 5 and all(gets)  # after each get's answer (and the PING's)
    assert publish == [False]  # after the PUB: nothing went to its client
