"""Request/reply across the protocols (docs/protocol.md, 5.7a and 16): nats-py's
``nc.request`` answered by a ttlbroker client, a ttlbroker request answered by
nats-py's ``msg.respond``, and the no-responders answer on both sides.

nats-py runs on an asyncio loop in a worker thread (``helpers.in_asyncio``) while the
broker and the ttlbroker client run on the test's trio loop; the sides wait for each
other with threading events, never with sleeps."""

from __future__ import annotations

import asyncio
import json
import threading

import nats
import nats.errors
import pytest
import trio
from helpers import in_asyncio, subscribed

from broker import ServerHandle
from broker.client import NoRespondersError, connect


async def test_a_nats_request_is_answered_by_a_ttlbroker_subscriber(nats_server: ServerHandle, nats_url: str) -> None:
    async def nats_side() -> tuple[bytes, dict[str, str] | None, str]:
        nc = await nats.connect(nats_url)
        try:
            reply = await nc.request("bin.svc", b"q", timeout=5, headers={"X-Q": "1"})
            with pytest.raises(nats.errors.NoRespondersError):
                await nc.request("other.nobody", b"q", timeout=5)
            return reply.data, reply.headers, reply.subject
        finally:
            await nc.close()

    async with connect(nats_server.address) as c, await c.subscribe("bin.>") as sub:
        async def answer() -> None:
            m = await sub.next(timeout=10)
            assert m.reply is not None and m.reply.startswith("_INBOX.")  # nats-py's inbox
            assert (m.subject, m.payload, m.headers) == ("bin.svc", b"q", {"X-Q": "1"})
            await c.respond(m, b"from ttlbroker", headers={"X-R": "2"})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer)
            data, headers, subject = await in_asyncio(nats_side)
        assert (data, headers) == (b"from ttlbroker", {"X-R": "2"})
        assert subject.startswith("_INBOX.")
        assert (await c.stats())["no_responders"] == 1  # nats-py's second request (the first had a responder)


async def test_a_ttlbroker_request_is_answered_by_a_nats_responder(nats_server: ServerHandle, nats_url: str) -> None:
    ready, done = threading.Event(), threading.Event()

    async def nats_responder() -> None:
        nc = await nats.connect(nats_url)

        async def respond(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(b"from nats:" + msg.data)

        await nc.subscribe("n.svc", cb=respond)
        await subscribed(nc)
        ready.set()
        await asyncio.to_thread(done.wait, 20)
        await nc.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_asyncio, nats_responder)
        assert await trio.to_thread.run_sync(ready.wait, 20)
        try:
            async with connect(nats_server.address) as c:
                m = await c.request("n.svc", b"q", timeout=5)
                assert (m.payload, m.reply) == (b"from nats:q", None)
                assert m.subject.startswith("_INBOX.") and m.subject.endswith(".1")
                with pytest.raises(NoRespondersError):  # the NATS subscription does not match it
                    await c.request("n.other", b"q", timeout=5)
        finally:
            done.set()


async def test_a_stored_message_reaches_core_subscribers_with_its_reply(nats_url: str) -> None:
    """As on nats-server, where a stream's capture is one more subscription: a core
    subscriber on a stream's subject sees the PUB's reply subject, and the stream's
    PubAck goes to that reply subject, whether nats-py's ``js.publish`` (an inbox) or
    a plain ``publish`` with a reply of the application's."""

    async def nats_side() -> None:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="ORD", subjects=["ord.>"])
            watcher = await nc.subscribe("ord.>")
            acks = await nc.subscribe("my.acks")
            ack = await js.publish("ord.1", b"one")
            m = await watcher.next_msg(timeout=5)
            assert (m.subject, m.data) == ("ord.1", b"one")
            assert m.reply.startswith("_INBOX.")  # js.publish's own request
            await nc.publish("ord.2", b"two", reply="my.acks")
            m = await watcher.next_msg(timeout=5)
            assert (m.subject, m.reply, m.data) == ("ord.2", "my.acks", b"two")
            answer = await acks.next_msg(timeout=5)
            assert json.loads(answer.data) == {"stream": "ORD", "seq": ack.seq + 1}
            # with no core subscriber left, the same publish is batched as before
            await watcher.unsubscribe()
            await nc.publish("ord.3", b"three", reply="my.acks")
            assert json.loads((await acks.next_msg(timeout=5)).data) == {"stream": "ORD", "seq": ack.seq + 2}
        finally:
            await nc.close()

    await in_asyncio(nats_side)
