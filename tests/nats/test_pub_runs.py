"""Runs of PUBs in one read (a C or Go client's buffered writes) are taken as a run
(``NatsSession._pub_run``): each subject routed once, each subscriber's core messages
made of the PUBs' own bytes and sent as one write. What subscribers get must be
byte for byte what nats-server sends them for the same bytes, however the PUBs are
spelled and whatever comes between them (stored messages, requests nobody answers,
``UNSUB max``, queue groups, pings)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import nats
import pytest
import trio
from conftest import make_config, start_server
from helpers import in_asyncio
from hypothesis import example, given
from hypothesis import strategies as st
from test_remote_origin import run_nats_server

from broker.core import Counters
from broker.core._subscriptions import SubscriptionIndex
from broker.nats._core import NatsSubscription, send_core, send_pub_acks
from broker.server import ServerHandle
from protocol.nats import pub_ack_format

CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,"protocol":1}\r\n'

#: One round of what the publisher writes; the publisher's whole write is many rounds.
ROUND = b"".join([
    b"PUB a 1\r\nx\r\n",
    b"PUB a _r.1 2\r\nxy\r\n",
    b"PUB a.b 0\r\n\r\n",
    b"PUB s.1 _r.ack 3\r\nabc\r\n",  # stored (stream S), acked to the publisher
    b"PUB a  5\r\nhello\r\n",  # nats-py's spelling, two spaces
    b"PUB a _r.2  003\r\nxyz\r\n",  # leading zeros and two spaces
    b"PUB m 1\r\n1\r\nPUB m 1\r\n2\r\nPUB m 1\r\n3\r\n",  # UNSUB 3 2 on the subscriber
    b"PUB q 1\r\nq\r\nPUB q 1\r\nq\r\n",  # a queue group of two on another connection
    b"PUB no.body _r.none 1\r\n.\r\n",  # a request nobody answers: the 503 goes to the publisher
    b"PUB s.2 _r.ack 1\r\nz\r\n",
    b"PUB a.b.c 4\r\nlast\r\n",
    b"PUB a.b 2\r\nab\r\n" * 5,  # a flood of one line (NatsParser.same_pubs)
    b"PUB a _r.3 1\r\nr\r\n" * 3,  # the same, with a reply
    b"PUB a.b 6\r\nPUB a.\r\n" * 2,  # a payload that starts as the line does
    # stored, one subject and size, a reply each (NatsParser.replied_pubs)
    b"PUB s.3 _r.ack.1 1\r\nx\r\nPUB s.3 _r.ack.2 1\r\ny\r\nPUB s.3 _r.ack.3 1\r\nz\r\n",
    b"PING\r\n",
])
ROUNDS = 60
_SERVER_OPS = re.compile(rb"(?m)^(?:INFO [^\r\n]*|PING)\r\n")


class Raw:
    """A NATS connection as bytes: what it receives is kept in :attr:`data`."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.data = bytearray()

    @classmethod
    async def open(cls, port: int, subs: bytes) -> Raw:
        raw = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await raw.until(lambda d: not d, first=True)  # (the INFO)
        await raw.stream.send_all(CONNECT + subs + b"PING\r\n")
        await raw.until(lambda d: d.endswith(b"PONG\r\n"))
        raw.data.clear()
        return raw

    async def until(self, done: object, first: bool = False) -> bytes:
        """Read until ``done(what it got)``."""
        with trio.move_on_after(20):
            while first or not done(bytes(self.data)):  # type: ignore[operator]
                first = False
                chunk = await self.stream.receive_some(1 << 16)
                assert chunk, bytes(self.data[-300:])
                self.data += chunk
                # the server's own: an INFO update, a PING (answered); never in these payloads
                pings = len(_SERVER_OPS.findall(self.data))
                self.data[:] = _SERVER_OPS.sub(b"", self.data)
                if pings:
                    await self.stream.send_all(b"PONG\r\n" * pings)
        assert done(bytes(self.data)), bytes(self.data[:200]) + b" ... " + bytes(self.data[-300:])  # type: ignore[operator]
        return bytes(self.data)

    async def drain(self) -> bytes:
        """Everything it got before the answer to one more PING (without that PONG)."""
        await self.stream.send_all(b"PING\r\n")
        data = await self.until(lambda d: d.endswith(b"PONG\r\n"))
        return data[: -len(b"PONG\r\n")]


_MSG = re.compile(rb"MSG (\S+) (\S+) (?:(\S+) )?(\d+)\r\n")


def _frames(data: bytes) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """A connection's MSG frames as (message, sid, payload, frame): ``message`` is the
    frame without its sid. Checks that the frames are all of ``data``."""
    out = []
    pos = 0
    while pos < len(data):
        m = _MSG.match(data, pos)
        assert m, data[pos : pos + 100]
        subject, sid, _, size = m.groups()
        end = m.end() + int(size)
        assert data.startswith(b"\r\n", end)
        frame = data[pos : end + 2]
        out.append((frame.replace(b" " + sid + b" ", b" ", 1), sid, data[m.end() : end], frame))
        pos = end + 2
    return out


def _by_message(data: bytes) -> list[list[bytes]]:
    """A connection's MSG frames, those of one message to several of its
    subscriptions together, sorted (the servers differ in the order they give
    those: nats-server's sublist order)."""
    out: list[tuple[bytes, set[bytes], list[bytes]]] = []
    for message, sid, _, frame in _frames(data):
        if out and out[-1][0] == message and sid not in out[-1][1]:
            out[-1][1].add(sid)
            out[-1][2].append(frame)
        else:
            out.append((message, {sid}, [frame]))
    return [sorted(frames) for *_, frames in out]


async def _scenario(port: int) -> dict[str, object]:
    """What each subscriber got when a publisher wrote :data:`ROUNDS` rounds at once."""
    pub = await Raw.open(port, b"SUB _r.> 9\r\n")
    create = json.dumps({"name": "S", "subjects": ["s.*"], "storage": "file"}).encode()
    await pub.stream.send_all(b"PUB $JS.API.STREAM.CREATE.S _r.create %d\r\n%s\r\n" % (len(create), create))
    await pub.until(lambda d: b"MSG _r.create" in d and d.endswith(b"}\r\n"))
    pub.data.clear()
    sub = await Raw.open(port, b"SUB a 1\r\nSUB a.> 2\r\nSUB m 3\r\nUNSUB 3 2\r\nSUB * 4\r\n")
    stored = await Raw.open(port, b"SUB s.* 5\r\n")
    queue = [await Raw.open(port, b"SUB q workers 6\r\n") for _ in range(2)]
    await pub.stream.send_all(ROUND * ROUNDS)
    acks = 5 * ROUNDS
    got = await pub.until(lambda d: d.count(b"PONG\r\n") == ROUNDS and len(re.findall(rb"MSG _r\.ack\S* 9 ", d)) == acks)
    # the publisher's own: PubAcks (their JSON is each server's) and 503s, one per round each
    replies = re.findall(rb"MSG (\S+) 9 (\d+)\r\n", got)
    statuses = re.findall(rb"HMSG _r.none 9 \d+ \d+\r\nNATS/1.0 503", got)
    out = {
        "sub": _by_message(await sub.drain()),
        # (stored: they reach the core subscriber with the PUB's reply, as the PubAck goes to it)
        "stored": [message for message, *_ in _frames(await stored.drain())],
        "queue": [(await q.drain()).count(b"MSG q 6 1\r\nq\r\n") for q in queue],
        "acks": sum(1 for subject, _ in replies if subject.startswith(b"_r.ack")),
        "no_responders": len(statuses),
    }
    for raw in (pub, sub, stored, *queue):
        await raw.stream.aclose()
    return out


async def test_a_run_of_pubs_reaches_subscribers_as_nats_server_sends_it(
    nats_server: ServerHandle, tmp_path: Path,
) -> None:
    with run_nats_server(tmp_path) as (_, port):
        want = await _scenario(port)
    assert want["sub"], "nats-server sent nothing?"
    assert sum(want["queue"]) == 2 * ROUNDS and want["acks"] == 5 * ROUNDS and want["no_responders"] == ROUNDS
    assert nats_server.nats_port is not None
    got = await _scenario(nats_server.nats_port)
    assert sum(got["queue"]) == sum(want["queue"])  # (each server picks its members at random)
    del got["queue"], want["queue"]
    assert got == want
    frames = sum(len(group) for group in got["sub"])  # type: ignore[attr-defined]
    assert frames > 8 * ROUNDS and nats_server.broker.counters.messages_out >= frames


async def test_a_run_to_a_full_connection_drops_what_does_not_fit(data_dir: Path) -> None:
    """A subscriber without room for a whole run gets what fits, one message at a
    time, in order; the rest is dropped and counted, as one by one."""
    limit = 64 * 1024
    config = make_config(data_dir, **{
        "nats.enabled": True, "limits.max_frame_bytes": limit, "limits.max_payload_bytes": 2048,
        "limits.max_pending_bytes_per_connection": limit,
        "limits.slow_consumer_seconds": 600,
    })
    async with start_server(config) as handle:
        port = handle.nats_port
        assert port is not None
        sleeper = await Raw.open(port, b"SUB a 1\r\n")  # reads nothing until the end
        pub = await Raw.open(port, b"")
        n, size = 12_000, 1000
        for first in range(0, n, 1000):
            await pub.stream.send_all(b"".join(b"PUB a %d\r\n%06d%s\r\n" % (size, i, b"x" * (size - 6))
                                               for i in range(first, first + 1000)))
        await pub.stream.send_all(b"PING\r\n")
        await pub.until(lambda d: d.endswith(b"PONG\r\n"))
        counters = handle.broker.counters
        assert counters.deliveries_dropped > 0
        got = await sleeper.drain()
        seen = [int(x) for x in re.findall(rb"MSG a 1 %d\r\n(\d{6})" % size, got)]
        assert len(got) == len(seen) * (len(b"MSG a 1 1000\r\n") + size + 2)  # whole messages only
        assert seen == sorted(set(seen)) and len(seen) + counters.deliveries_dropped == n


async def test_a_flood_of_stored_pubs_with_replies_stores_each_payload_and_acks_each_in_order(nats_url: str) -> None:
    """A flood of JetStream publishes (one subject and size, an inbox each, as
    ``js_PublishAsync`` writes them) that no core subscriber hears is taken as runs
    (``NatsParser.replied_pubs``, one body head for the run): each message stores its
    own payload, in order, and each inbox gets the PubAck of its own sequence."""
    n, seqs = 5000, (1, 2, 999, 1000, 1001, 2500, 5000)

    async def create() -> None:
        nc = await nats.connect(nats_url)
        await nc.jetstream().add_stream(name="F", subjects=["f.>"])
        await nc.close()

    async def stored() -> tuple[list[bytes], int]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        try:
            return [(await js.get_msg("F", seq)).data for seq in seqs], (await js.stream_info("F")).state.messages
        finally:
            await nc.close()

    await in_asyncio(create)
    pub = await Raw.open(int(nats_url.rsplit(":", 1)[1]), b"SUB _r.> 9\r\n")
    for first in range(0, n, 1000):  # (each write is a read or more of the flood)
        await pub.stream.send_all(b"".join(b"PUB f.x _r.%d 6\r\n%06d\r\n" % (i, i) for i in range(first, first + 1000)))
    got = await pub.until(lambda d: d.count(b"MSG _r.") == n)
    await pub.stream.aclose()
    frames = re.findall(rb"MSG _r\.(\d+) 9 (\d+)\r\n([^\r]*)\r\n", got)
    assert all(int(size) == len(body) for _, size, body in frames)  # (across 9 -> 10, 99 -> 100, ...)
    acks = {int(inbox): json.loads(body) for inbox, _, body in frames}
    assert acks == {i: {"stream": "F", "seq": i + 1} for i in range(n)}
    assert await in_asyncio(stored) == ([b"%06d" % (seq - 1) for seq in seqs], n)


class _Client:
    """What ``send_pub_acks`` and ``send_core`` see of a NATS connection: what was
    queued to it, in order."""

    headers = True
    perms = None
    echo = True

    def __init__(self, broker: object) -> None:
        self.broker = broker
        self.out_msgs = self.out_bytes = 0
        self.got: list[tuple[bytes, int]] = []

    def has_room(self, n: int) -> bool:
        return True

    def push_nats(self, data: bytes, epoch: int = 0, direct: bool = False) -> bool:
        self.got.append((bytes(data), epoch))
        return True

    def remove_subscription(self, sub: NatsSubscription) -> None:
        self.broker.subs.remove(sub)


class _Broker:
    def __init__(self) -> None:
        self.subs = SubscriptionIndex()
        self.counters = Counters()


def _acks_world(subs: list[tuple[int, str, str, int | None]]) -> tuple[_Broker, list[_Client]]:
    broker = _Broker()
    clients = [_Client(broker) for _ in range(2)]
    for client, sid, subject_filter, remaining in subs:
        sub = NatsSubscription(clients[client], sid, subject_filter, None)
        sub.remaining = remaining
        broker.subs.add(sub)
    return broker, clients


def _by_sid(got: list[tuple[bytes, int]]) -> dict[bytes, list[tuple[bytes, bytes]]]:
    """Each subscription's frames, in order (the order among a connection's
    subscriptions that one reply reaches is the index's, not the PubAcks')."""
    data = b"".join(d for d, _ in got)
    frames = re.findall(rb"MSG (\S+) (\S+) (\d+)\r\n", data)
    out: dict[bytes, list[tuple[bytes, bytes]]] = {}
    pos = 0
    for reply, sid, size in frames:
        line = b"MSG %s %s %s\r\n" % (reply, sid, size)
        assert data.startswith(line, pos)
        pos += len(line)
        body = data[pos : pos + int(size)]
        assert data[pos + int(size) : pos + int(size) + 2] == b"\r\n"
        pos += int(size) + 2
        out.setdefault(sid, []).append((reply, body))
    assert pos == len(data)  # nothing but whole frames, each the length it says
    return out


SID = st.sampled_from(["1", "9", "%d", "a%"])
INBOX_FILTER = st.sampled_from(["_r.>", "_r.*", "_r.1", "_r.x.>", ">"])
REPLY = st.sampled_from([b"_r.1", b"_r.2", b"_r.10", b"_r.x.1", b"_r.%d", b"other"])


@given(
    st.lists(st.tuples(st.integers(0, 1), SID, INBOX_FILTER, st.one_of(st.none(), st.integers(1, 3))), max_size=4),
    st.lists(REPLY, max_size=12),
    st.integers(1, 2000),
    st.lists(st.integers(-120, 120), max_size=12),
    st.sampled_from(["F", "K%d", "KV_a"]),
    st.integers(0, 3),
)
@example([(0, "1", "_r.>", None)], [b"_r.1"] * 4, 8, [1, 1, 1, 1], "F", 0)  # 8, 9 | 10, 11: one digit more
@example([(0, "1", "_r.>", None)], [b"_r.1"] * 3, 99, [900, 1, 1], "F", 0)  # 99 | 999, 1000
@example([(0, "1", "_r.>", None)], [b"_r.1"] * 2, 10, [-1], "F", 0)  # 10 | 9: one digit fewer
def test_pub_acks_go_as_send_core_sends_each(
    subs: list[tuple[int, str, str, int | None]], replies: list[bytes], first: int, steps: list[int], stream: str, epoch: int,
) -> None:
    """``send_pub_acks`` (each MSG one format of a template, the PubAcks' lengths
    following their sequences' digits) queues, to every connection, the bytes that
    ``send_core`` of each PubAck queues, in the same order, and counts the same: plain
    subscriptions, several on one reply, ``UNSUB max`` ones (which go the general
    way), ``%`` in sids and stream names, sequences that cross a power of ten."""
    replies = replies[: len(steps)]
    seqs, seq = [], first
    for step in steps[: len(replies)]:
        seqs.append(seq)
        seq = max(1, seq + step)  # (ascending in a group commit; any order here)
    form = pub_ack_format(stream)
    run_broker, run_clients = _acks_world(subs)
    send_pub_acks(run_broker, replies, seqs, form, epoch)  # type: ignore[arg-type]
    each_broker, each_clients = _acks_world(subs)
    for reply, seq in zip(replies, seqs):
        send_core(each_broker, reply.decode(), None, None, form % seq, epoch=epoch)  # type: ignore[arg-type]
    for run, each in zip(run_clients, each_clients):
        assert _by_sid(run.got) == _by_sid(each.got)
        assert {e for _, e in run.got} <= {epoch}
        assert (run.out_msgs, run.out_bytes) == (each.out_msgs, each.out_bytes)
    assert run_broker.counters == each_broker.counters
    assert len(run_broker.subs) == len(each_broker.subs)


@pytest.mark.parametrize(("fsync", "storage", "larger"), [("always", "file", True), ("always", "memory", False), ("200ms", "file", False)])
async def test_a_flood_whose_acks_wait_for_a_sync_goes_in_larger_batches(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, fsync: str, storage: str, larger: bool,
) -> None:
    """A flood of JetStream publishes goes to the publish path in batches of at most
    ``BATCH_BYTES``, so that acks that may go at once (a memory topic, an fsync
    interval) leave while the rest of the read is handled; at ``always`` into a
    file-storage topic, where every ack waits for the group commit's sync anyway,
    batches reach ``SYNCED_BATCH_BYTES``. Either way each inbox gets its own PubAck,
    in order."""
    from broker.core._publishing import Publisher
    from broker.nats._session import BATCH_BYTES, SYNCED_BATCH_BYTES

    sizes: list[int] = []
    publish_stored = Publisher.publish_stored

    def spy(self: Publisher, session: object, cmd: Any, *args: Any) -> Any:
        sizes.append(len(cmd.data))
        return publish_stored(self, session, cmd, *args)

    n, payload = 3000, b"x" * 100
    async with start_server(make_config(data_dir, **{"nats.enabled": True, "system.partition.fsync": fsync})) as handle:
        assert handle.nats_port is not None
        pub = await Raw.open(handle.nats_port, b"SUB _r.> 9\r\n")
        create = json.dumps({"name": "F", "subjects": ["f.>"], "storage": storage}).encode()
        await pub.stream.send_all(b"PUB $JS.API.STREAM.CREATE.F _r.create %d\r\n%s\r\n" % (len(create), create))
        await pub.until(lambda d: b"MSG _r.create" in d)
        pub.data.clear()
        monkeypatch.setattr(Publisher, "publish_stored", spy)
        await pub.stream.send_all(b"".join(b"PUB f.x _r.%d %d\r\n%s\r\n" % (i, len(payload), payload) for i in range(n)))
        got = await pub.until(lambda d: d.count(b"MSG _r.") == n)
        await pub.stream.aclose()
    seqs = [json.loads(body)["seq"] for body in re.findall(rb"MSG _r\.\d+ 9 \d+\r\n([^\r]*)\r\n", got)]
    inboxes = [int(i) for i in re.findall(rb"MSG _r\.(\d+) ", got)]
    assert sorted(zip(inboxes, seqs)) == [(i, i + 1) for i in range(n)]
    body = 14 + len(b"f.x") + len(payload)
    limit = SYNCED_BATCH_BYTES if larger else BATCH_BYTES
    assert sum(sizes) == sum(5 for _ in sizes) + n * body  # every message in one batch or another
    assert max(sizes) <= 5 + limit + body
    assert (max(sizes) > 5 + BATCH_BYTES + body) is larger
