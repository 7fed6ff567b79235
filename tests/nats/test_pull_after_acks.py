"""A pull request that comes in one read with the acks before it (nats-py's
``fetch`` after a batch of ``msg.ack()``): it may go ahead of them and they settle
right after its messages are sent (``State.may_pass``), only where that cannot
change anything a client sees. Each case sends its acks and the pull in one write
(raw bytes, ``helpers.RawNats``) and checks the pull gets what it would get after
the acks, and the consumer's state after, as a client reads them; and whether the
pull went ahead.

Virtual time (``mock_clock``): it moves only where a case moves it (an ack wait
running out)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from helpers import RawNats


import protocol.nats as PN
from broker.nats._consumer_state import State
from broker.server import ServerHandle

STREAM = "ORDERS"
NEXT = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.d".encode()


def pub(subject: bytes | str, payload: bytes = b"", reply: str | None = None) -> bytes:
    if isinstance(subject, str):
        subject = subject.encode()
    return b"PUB %s %s%d\r\n%s\r\n" % (subject, (reply + " ").encode() if reply else b"", len(payload), payload)


def ack(msg: PN.NatsMsg) -> bytes:
    """``msg.ack()`` as nats-py writes it."""
    assert msg.reply is not None
    return b"PUB %s  0\r\n\r\n" % msg.reply.encode()


def pull(batch: int, **options: Any) -> bytes:
    return pub(NEXT, json.dumps({"batch": batch, **options}).encode(), "_INBOX.t")


class Peer:
    """One raw NATS connection: API requests answered on ``_INBOX.api``, pulls on
    ``_INBOX.t``."""

    def __init__(self, raw: RawNats) -> None:
        self.raw = raw

    @classmethod
    async def open(cls, url: str) -> Peer:
        raw = await RawNats.open(url)
        await raw.connect(headers=True)
        await raw.send(b"SUB _INBOX.api 1\r\nSUB _INBOX.t 2\r\n")
        return cls(raw)

    async def api(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.raw.send(pub(subject, json.dumps(body).encode() if body is not None else b"", "_INBOX.api"))
        ev = await self.raw.next_event()
        assert isinstance(ev, PN.NatsMsg) and ev.subject == "_INBOX.api", ev
        return json.loads(ev.payload)  # type: ignore[no-any-return]

    async def msgs(self, n: int) -> list[PN.NatsMsg]:
        out = []
        for _ in range(n):
            ev = await self.raw.next_event()
            assert isinstance(ev, PN.NatsMsg) and ev.subject.startswith("orders."), ev
            out.append(ev)
        return out

    async def info(self) -> tuple[int, ...]:
        i = await self.api(f"$JS.API.CONSUMER.INFO.{STREAM}.d")
        return (i["delivered"]["stream_seq"], i["ack_floor"]["stream_seq"], i["num_ack_pending"], i["num_pending"],
                i["num_redelivered"], i["num_waiting"])


def seen(msgs: list[PN.NatsMsg]) -> list[tuple[int, int, int, int]]:
    """(stream sequence, consumer sequence, times delivered, pending) of each, from
    its ``$JS.ACK`` reply."""
    out = []
    for m in msgs:
        assert m.reply is not None
        t = m.reply.split(".")
        out.append((int(t[5]), int(t[6]), int(t[4]), int(t[8])))
    return out


@pytest.fixture
async def peer(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A connection, a stream of nine messages, and a record of each pull's
    ``may_pass`` answer (``peer.passed``)."""
    p = await Peer.open(nats_url)
    assert "error" not in await p.api(f"$JS.API.STREAM.CREATE.{STREAM}", {"name": STREAM, "subjects": ["orders.>"]})
    for i in range(9):
        await p.raw.send(pub(f"orders.{i}", b"m%d" % i, "_INBOX.api"))
        ev = await p.raw.next_event()
        assert isinstance(ev, PN.NatsMsg) and json.loads(ev.payload)["seq"] == i + 1
    passed: list[bool] = []
    may_pass = State.may_pass

    def spy(self: State, c: Any, want: int) -> bool:
        ok = may_pass(self, c, want)
        passed.append(ok)
        return ok

    monkeypatch.setattr(State, "may_pass", spy)
    p.passed = passed  # type: ignore[attr-defined]
    yield p
    await p.raw.aclose()


async def consumer(p: Peer, **config: Any) -> None:
    """The consumer ``d``, its first message delivered and acked with an answer: its
    ack subjects are known from here on (the first ack of a consumer takes the
    general path, which settles it before anything else)."""
    body = {"stream_name": STREAM, "config": {"durable_name": "d", "ack_policy": "explicit", "ack_wait": 30 * 10**9, **config}}
    assert "error" not in await p.api(f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.d", body)
    await p.raw.send(pull(1))
    (first,) = await p.msgs(1)
    assert first.reply is not None
    await p.raw.send(pub(first.reply, b"", "_INBOX.api"))
    ev = await p.raw.next_event()
    assert isinstance(ev, PN.NatsMsg) and ev.subject == "_INBOX.api" and ev.payload == b""


def plus_ack(msg: PN.NatsMsg) -> bytes:
    """``ack()`` as the C, Go, Java, .NET and Rust clients write it: ``+ACK``."""
    assert msg.reply is not None
    return b"PUB %s 4\r\n+ACK\r\n" % msg.reply.encode()


@pytest.mark.parametrize("form", ["nats-py", "+ACK", "mixed"])
async def test_plain_acks_of_delivered_messages_let_the_pull_go_first(
    mock_clock: Any, peer: Any, nats_server: ServerHandle, monkeypatch: pytest.MonkeyPatch, form: str,
) -> None:
    """Whichever way the client writes its plain acks (an empty payload, ``+ACK``, or
    both in one write), they are taken as one run (``NatsParser.ack_run``) and the
    pull goes first; the connection counts each PUB and its payload bytes."""
    writes = {"nats-py": [ack] * 3, "+ACK": [plus_ack] * 3, "mixed": [plus_ack, ack, plus_ack]}[form]
    runs: list[int] = []
    take_ack_run = State.take_ack_run

    def spy(self: State, key: str, run: Any) -> bool:
        runs.append(len(run.seqs()))
        return take_ack_run(self, key, run)

    monkeypatch.setattr(State, "take_ack_run", spy)
    await consumer(peer)
    await peer.raw.send(pull(3))
    first = await peer.msgs(3)
    (session,) = [s.speaker for s in nats_server.services.guard.sessions]
    before = (session.in_msgs, session.in_bytes)
    await peer.raw.send(b"".join(write(m) for write, m in zip(writes, first)) + pull(3))
    second = await peer.msgs(3)
    assert runs == [3]
    assert (session.in_msgs - before[0], session.in_bytes - before[1]) == (4, 4 * writes.count(plus_ack) + len(b'{"batch": 3}'))
    assert peer.passed == [True]
    assert seen(first) + seen(second) == [(2, 2, 1, 7), (3, 3, 1, 6), (4, 4, 1, 5), (5, 5, 1, 4), (6, 6, 1, 3), (7, 7, 1, 2)]
    # delivered 7, acked 1-4, 3 outstanding, 2 pending, nothing redelivered, no pull waiting
    assert await peer.info() == (7, 4, 3, 2, 0, 0)
    await peer.raw.send(b"".join(ack(m) for m in second))
    assert await peer.info() == (7, 7, 0, 2, 0, 0)


async def test_a_pull_that_waits_joins_after_the_acks_are_settled(mock_clock: Any, peer: Any) -> None:
    await consumer(peer)
    await peer.raw.send(pull(8))
    msgs = await peer.msgs(8)
    await peer.raw.send(b"".join(ack(m) for m in msgs) + pull(2, expires=60 * 10**9))
    await trio.testing.wait_all_tasks_blocked()  # read and handled: the info request comes in a read of its own
    assert await peer.info() == (9, 9, 0, 0, 0, 1)
    assert peer.passed == [True]
    await peer.raw.send(pub("orders.9", b"m9"))
    assert seen(await peer.msgs(1)) == [(10, 10, 1, 0)]


@pytest.mark.parametrize("body", [b"", b"+ACK"])
async def test_an_ack_of_a_message_not_yet_delivered_does_not_ack_the_pulls_delivery_of_it(
    mock_clock: Any, peer: Any, body: bytes,
) -> None:
    """Acks as nats-py sends them (empty) and with a ``+ACK`` body (each read its own
    way, ``NatsParser.ack_run`` and ``ack_pubs``): one of them names a message the
    pull is about to deliver."""
    await consumer(peer)
    await peer.raw.send(pull(3))
    first = await peer.msgs(3)
    assert first[0].reply is not None
    t = first[0].reply.split(".")
    early = ".".join(t[:5] + ["6", "6"] + t[7:])  # stream sequence 6: not delivered yet
    await peer.raw.send(pub(first[0].reply, body) + pub(early, body) + pull(3))
    assert seen(await peer.msgs(3)) == [(5, 5, 1, 4), (6, 6, 1, 3), (7, 7, 1, 2)]
    assert peer.passed == [True]  # the ack of 6 is left out when they settle after it
    assert await peer.info() == (7, 2, 5, 2, 0, 0)  # 5 outstanding: 3, 4 and the three just delivered


async def test_acks_that_free_room_under_max_ack_pending_go_first(mock_clock: Any, peer: Any) -> None:
    await consumer(peer, max_ack_pending=3)
    await peer.raw.send(pull(3))
    first = await peer.msgs(3)
    await peer.raw.send(ack(first[0]) + ack(first[1]) + pull(3))
    assert seen(await peer.msgs(2)) == [(5, 5, 1, 4), (6, 6, 1, 3)]
    assert peer.passed == [False]
    assert await peer.info() == (6, 3, 3, 3, 0, 1)  # the pull waits for its third


async def test_a_nak_before_the_pull_goes_first(mock_clock: Any, peer: Any) -> None:
    await consumer(peer)
    await peer.raw.send(pull(3))
    first = await peer.msgs(3)
    assert first[0].reply is not None
    await peer.raw.send(pub(first[0].reply, b"-NAK") + ack(first[1]) + pull(2))
    assert seen(await peer.msgs(2)) == [(2, 5, 2, 5), (5, 6, 1, 4)]  # the NAK'd one first, delivered twice
    assert peer.passed == [False]
    assert await peer.info() == (5, 1, 3, 4, 1, 0)


async def test_acks_of_messages_due_again_go_first(mock_clock: Any, peer: Any) -> None:
    await consumer(peer)
    await peer.raw.send(pull(3))
    first = await peer.msgs(3)
    trio.lowlevel.current_clock().jump(31)  # type: ignore[attr-defined]
    await trio.testing.wait_all_tasks_blocked()  # the ack wait ran out: 2-4 are due again
    await peer.raw.send(ack(first[0]) + ack(first[1]) + pull(2))
    assert seen(await peer.msgs(2)) == [(4, 5, 2, 5), (5, 6, 1, 4)]  # 2 and 3 acked: not redelivered
    assert peer.passed == [False]
    assert await peer.info() == (5, 3, 2, 4, 1, 0)
