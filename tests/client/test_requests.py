"""Request/reply on the binary protocol (docs/protocol.md, 5.7a): ``Client.request``,
``Client.respond`` and ``publish(reply=)`` against a real broker, the broker's
no-responders answer, the reply subject of stored requests, and the frames a client
that predates reply subjects sends and gets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import protocol as P
from broker.client import Client, NoRespondersError, aio, connect
from broker.server import ServerHandle
from helpers import RawPeer, in_asyncio
from tests.conftest import make_config, start_server


async def _responder(c: Client, subject: str, answer: bytes = b"", *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Answer every request on ``subject``: ``answer`` + the request's payload, with its
    headers and the subject it came on."""
    async with await c.subscribe(subject) as sub:
        task_status.started()
        async for m in sub:
            await c.respond(m, answer + m.payload, headers={**m.headers, "X-On": m.subject})


@pytest.fixture
async def responder(server: ServerHandle) -> AsyncIterator[Client]:
    async with connect(server.address) as c, trio.open_nursery() as nursery:
        await nursery.start(_responder, c, "svc.>", b"re:")
        yield c
        nursery.cancel_scope.cancel()


async def test_a_request_gets_the_first_reply_and_every_request_shares_one_inbox(
    client: Client, responder: Client, server: ServerHandle,
) -> None:
    m = await client.request("svc.echo", b"hi", headers={"X-Q": "1"})
    assert (m.payload, m.headers) == (b"re:hi", {"X-Q": "1", "X-On": "svc.echo"})
    assert m.subject.startswith("_INBOX.") and m.subject.endswith(".1") and len(m.subject.split(".")[1]) == 22
    results: dict[int, bytes] = {}

    async def ask(i: int) -> None:
        results[i] = (await client.request("svc.echo", str(i).encode())).payload

    async with trio.open_nursery() as nursery:  # concurrent requests: each gets its own answer
        for i in range(20):
            nursery.start_soon(ask, i)
    assert results == {i: f"re:{i}".encode() for i in range(20)}
    inboxes = [s for s in server.broker.subs._all if s.tokens[0] == "_INBOX"]  # one subscription for them all
    assert [s.subject_filter for s in inboxes] == [m.subject.rsplit(".", 1)[0] + ".*"]


async def test_a_request_nobody_takes_fails_at_once_with_no_responders(client: Client) -> None:
    started = trio.current_time()
    with pytest.raises(NoRespondersError) as info:
        await client.request("nobody.home", b"x", timeout=30)
    assert str(info.value) == "no responders are available for a request on 'nobody.home'"
    assert info.value.subject == "nobody.home"
    assert trio.current_time() - started < 5  # not the timeout
    assert (await client.stats())["no_responders"] == 1
    # What the client's inbox got: the no-responders status message, nothing stored.
    inbox = client.new_inbox()
    async with await client.subscribe(inbox + ".*") as sub:
        with pytest.raises(P.NoTopicForSubjectError):
            await client.publish("nobody.home", b"y", reply=inbox + ".7")
        m = await sub.next(timeout=5)
    assert (m.subject, m.payload, m.offset, m.stream_id) == (inbox + ".7", b"", 0, 0)
    assert m.headers == {"Status": "503", "Nats-Subject": "nobody.home"}


async def test_a_request_unanswered_times_out(server: ServerHandle, autojump_clock: trio.testing.MockClock) -> None:
    # (timeout=None: the clock jumps whenever every task waits, a worker thread's work too)
    async with connect(server.address, timeout=None) as c, await c.subscribe("slow.svc"):  # takes requests, never answers
        started = trio.current_time()
        with pytest.raises(TimeoutError) as info:
            await c.request("slow.svc", b"x", timeout=2.5)
        assert str(info.value) == "no reply to the request on 'slow.svc' within 2.5 s"
        assert 2.5 <= trio.current_time() - started < 2.6
        assert c._inbox is not None and c._inbox.waiting == {}  # nothing left waiting
    assert server.broker.counters.no_responders == 0  # it had a responder: no 503


async def test_a_stored_request_is_stored_without_its_reply_subject(client: Client, responder: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "svc", subjects=["svc.stored.>"])
    m = await client.request("svc.stored.a", b"keep me")
    assert m.payload == b"re:keep me"
    (stored,) = (await client.fetch("s", "svc")).messages
    assert (stored.subject, stored.payload, stored.reply) == ("svc.stored.a", b"keep me", None)
    # Stored, but nobody subscribes: nobody can ever answer it, so no responders at once.
    await client.create_topic("s", "lonely", subjects=["lonely.>"])
    with pytest.raises(NoRespondersError):
        await client.request("lonely.x", b"1")
    assert len((await client.fetch("s", "lonely")).messages) == 1


async def test_respond_and_publish_with_reply_errors(client: Client, server: ServerHandle) -> None:
    with pytest.raises(ValueError) as info:
        await client.respond(P.Message("a.b", b"", b"", 0, 0), b"x")
    assert str(info.value) == "the message on 'a.b' carries no reply subject: there is nobody to answer"
    for reply, why in [
        ("a.*", "reply subject: subject 'a.*' contains the wildcard '*'; wildcards are for filters"),
        ("a..b", "reply subject: subject 'a..b' has an empty token"),
    ]:
        with pytest.raises(P.InvalidSubjectError) as err:
            await client.publish("x.y", b"", reply=reply)
        assert (err.value.code, err.value.message) == (P.ErrorCode.INVALID_SUBJECT, why)
    # A REPLY flag with an empty reply subject breaks the layout.
    body = P.encode_body("x.y", b"")
    with pytest.raises(P.MalformedPayloadError) as bad:
        await client._call(P.Command.PUBLISH, b"\x02\x01\x00\x00\x00\x00" + body)
    assert bad.value.message == "PUBLISH: the REPLY flag is set but the reply subject is empty"
    assert (await client.stats())["messages_unrouted"] == 0  # nothing of them went anywhere


async def test_a_subscriber_that_predates_reply_subjects_gets_plain_deliveries(client: Client, server: ServerHandle) -> None:
    """A SUBSCRIBE without flags (what a client that predates reply subjects sends,
    and the bundled one when the broker's handshake does not say ``reply_subjects``)
    gets a request as any message: nothing after the records, so no reply subject."""
    peer = await RawPeer.open(server.address)
    await peer.handshake()
    await peer.send(P.encode_frame(P.Command.SUBSCRIBE, 0, 2, 0, P.Subscribe(1, "svc.old").encode()))
    assert isinstance(await peer.next_event(), P.Response)
    async with connect(server.address) as old:
        old.server_info.pop("reply_subjects")
        sub = await old.subscribe("svc.old")
        with pytest.raises(P.NoTopicForSubjectError):
            await client.publish("svc.old", b"q", reply="_INBOX.x.1")
        m = await sub.next(timeout=5)
    assert (m.payload, m.reply) == (b"q", None)
    push = await peer.next_event()
    assert isinstance(push, P.Push) and push.kind == P.PushKind.DELIVERY
    assert [(d.payload, d.reply) for d in push.value.messages] == [(b"q", None)] and push.value.reply is None  # type: ignore[attr-defined]
    await peer.aclose()


USERS: list[dict[str, Any]] = [
    {"user": "asker", "password": "a", "permissions": {}},
    {"user": "worker", "password": "w", "permissions": {
        "subscribe": {"allow": ["svc.>"], "deny": ["svc.secret"]}, "publish": {"allow": ["_INBOX.>"]},
    }},
    {"user": "service", "password": "s", "permissions": {"subscribe": ["svc.>"], "allow_responses": True}},
]


async def test_a_subscription_wider_than_a_deny_entry_is_no_responder_for_the_denied_subject(data_dir: Path) -> None:
    cfg = make_config(data_dir, **{"auth.users": USERS, "limits.auth_failure_delay": 0})
    async with start_server(cfg) as h, connect(h.address, user="asker", password="a") as asker:
        async with connect(h.address, user="worker", password="w") as worker, trio.open_nursery() as nursery:
            await nursery.start(_responder, worker, "svc.>")
            assert (await asker.request("svc.open", b"1")).payload == b"1"
            with pytest.raises(NoRespondersError):
                await asker.request("svc.secret", b"2")
            nursery.cancel_scope.cancel()


async def test_allow_responses_lets_a_binary_service_answer_its_requests_only(data_dir: Path) -> None:
    cfg = make_config(data_dir, **{"auth.users": USERS, "limits.auth_failure_delay": 0})
    async with start_server(cfg) as h, connect(h.address, user="asker", password="a") as asker:
        async with connect(h.address, user="service", password="s") as service, trio.open_nursery() as nursery:
            await nursery.start(_responder, service, "svc.>", b"ok:")
            assert (await asker.request("svc.a", b"1", timeout=5)).payload == b"ok:1"
            with pytest.raises(P.PermissionDeniedError) as info:  # nothing else
                await service.publish("_INBOX.other.1", b"x")
            assert info.value.message == "permissions violation: this user may not publish to '_INBOX.other.1'"
            nursery.cancel_scope.cancel()


async def test_the_asyncio_client_requests_and_responds(server: ServerHandle) -> None:
    async def scenario(address: str) -> tuple[bytes, str]:
        async with aio.connect(address) as a, aio.connect(address) as b:
            import asyncio

            sub = await b.subscribe("aio.svc")

            async def serve() -> None:
                m = await sub.next()
                await b.respond(m, b"aio:" + m.payload)

            task = asyncio.ensure_future(serve())
            m = await a.request("aio.svc", b"x", timeout=5)
            await task
            try:
                await a.request("aio.none", timeout=5)
            except NoRespondersError as exc:
                return m.payload, str(exc)
            return m.payload, ""

    assert await in_asyncio(scenario, server.address) == (b"aio:x", "no responders are available for a request on 'aio.none'")
