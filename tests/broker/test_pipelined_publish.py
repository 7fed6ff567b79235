"""Pipelined PUBLISH requests that arrive in one read are stored as one batch
(``Session._publish_run``, ``Publisher.publish_frames``): each request still gets
its own answer, under its correlation id, as if the requests had come one at a
time, and under fsync ``always`` no ack leaves before the fsync that covers it."""

from __future__ import annotations

import errno
import ssl
import threading
from pathlib import Path
from typing import Any

import nats
import pytest
import trio
import trustme
from conftest import make_config, start_server
from helpers import RawPeer, held_commit, in_asyncio

import protocol as P
from broker.core import _commit
from broker.server import _session
from broker.core._commit import Committer
from broker.core._stats import Counters
from broker.core import Publisher
from broker.client import Client, connect
from broker.server import ServerHandle
from storage import FsyncPolicy


def publish_frame(corr: int, *bodies: bytes, count: int | None = None) -> bytes:
    n = len(bodies) if count is None else count
    return P.encode_frame(P.Command.PUBLISH, 0, corr, 0, b"\x00" + n.to_bytes(4, "little") + b"".join(bodies))


def spy_on_joins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many requests each run the broker was offered it took as one batch (0:
    it sent them back to go one at a time)."""
    joined: list[int] = []

    real = Publisher.publish_frames

    def spy(publisher: Publisher, session: Any, cmds: list[P.Publish]) -> Any:
        reply = real(publisher, session, cmds)
        joined.append(0 if reply is None else len(cmds))
        return reply

    monkeypatch.setattr(Publisher, "publish_frames", spy)
    return joined


async def answers(raw: RawPeer, count: int) -> dict[int, object]:
    """The next ``count`` answers, by correlation id."""
    got: dict[int, object] = {}
    while len(got) < count:
        ev = await raw.next_event()
        assert isinstance(ev, (P.Response, P.ErrorResponse)), ev
        assert ev.correlation_id not in got
        got[ev.correlation_id] = ev
    return got


async def test_pipelined_frames_in_one_read_get_their_own_answers(
    server: ServerHandle, client: Client, topic: tuple[str, str], monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    await client.create_topic("shop", "one", partitions=1, subjects=["one.>"])
    joined = spy_on_joins(monkeypatch)
    raw = await RawPeer.open(server.address)
    await raw.handshake()
    body = P.encode_body

    def ping(corr: int) -> bytes:  # a request of another kind ends a run of PUBLISH
        return P.encode_frame(P.Command.PING, 0, corr, 0)

    frames = [
        # Joined: an unrouted message among them gets its error in its own request's acks.
        publish_frame(1, body("one.a", b"m1")),
        publish_frame(2, body("one.b", b"m2"), body("one.c", b"m3")),
        publish_frame(4, body("nowhere.x", b"m5"), body("one.d", b"m6")),
        publish_frame(7, body("one.f", b"m7")),
        ping(97),
        # One at a time: 3 is truncated and gets its own error; 10 is stored.
        publish_frame(3, body("one.a", b"m4")[:-1]),
        publish_frame(10, body("one.g", b"m10")),
        ping(98),
        # One at a time: they read right only together (5 says 2 messages and holds
        # 1, 6 says 1 and holds 2), and each alone is malformed.
        publish_frame(5, body("one.e", b"bad" * 8), count=2),
        publish_frame(6, body("one.e", b"bad"), body("one.e", b"bad"), count=1),
        ping(99),
        # One at a time (headers): 8's compare-and-set names the offset 7 gave one.f.
        publish_frame(11, body("one.h", b"m11")),
        publish_frame(8, body("one.f", b"m8", P.encode_headers({"Nats-Expected-Last-Subject-Sequence": "5"}))),
        publish_frame(9, body("one.g", b"m9")),
    ]
    await raw.send(b"".join(frames))  # one write: the broker reads them together
    got = await answers(raw, len(frames))
    assert joined == [4, 0, 0, 0]

    def offsets(corr: int) -> list[int]:
        ev = got[corr]
        assert isinstance(ev, P.Response), ev
        acks = ev.result
        assert isinstance(acks, P.Acks)
        assert not acks.errors
        return list(acks.offsets)

    assert offsets(1) == [1]
    assert offsets(2) == [2, 3]
    four = got[4].result  # type: ignore[union-attr]
    assert list(four.offsets) == [0, 4]
    assert list(four.statuses) == [P.ErrorCode.NO_TOPIC_FOR_SUBJECT, 0]
    assert four.errors == {0: "no topic captures subject 'nowhere.x'"}
    assert offsets(7) == [5]
    for corr in (3, 5, 6):
        ev = got[corr]
        assert isinstance(ev, P.ErrorResponse), ev
        assert ev.error.code == P.ErrorCode.MALFORMED_PAYLOAD
    assert "truncated" in got[3].error.message  # type: ignore[union-attr]
    assert "bytes follow the last of the 1 messages" in got[6].error.message  # type: ignore[union-attr]
    assert offsets(10) == [6]
    assert offsets(11) == [7]
    assert offsets(8) == [8]
    assert offsets(9) == [9]
    stored = (await client.fetch("shop", "one", 0, 1, 100)).messages
    assert [m.payload for m in stored] == [b"m1", b"m2", b"m3", b"m6", b"m7", b"m10", b"m11", b"m8", b"m9"]
    await raw.aclose()


async def test_frames_with_ttl_headers_are_joined_and_a_msg_id_goes_one_at_a_time(
    server: ServerHandle, client: Client, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    await client.create_stream("ttls")
    await client.create_topic("ttls", "t", partitions=1, subjects=["t.>"], allow_msg_ttl=True, duplicate_window=60)
    joined = spy_on_joins(monkeypatch)
    raw = await RawPeer.open(server.address)
    await raw.handshake()

    def body(subject: str, **headers: str) -> bytes:
        return P.encode_body(subject, b"x", P.encode_headers({k.replace("_", "-"): v for k, v in headers.items()}))

    frames = [
        # Joined: Nats-TTL depends on nothing but the message and its topic; a bad one
        # gets its error in its own request's acks.
        publish_frame(1, body("t.a", Nats_TTL="60")),
        publish_frame(2, body("t.b"), body("t.c", Nats_TTL="2m")),
        publish_frame(3, body("t.d", Nats_TTL="1d")),
        P.encode_frame(P.Command.PING, 0, 98, 0),
        # One at a time: a de-duplication id (the second is a duplicate of the first).
        publish_frame(4, body("t.e", Nats_Msg_Id="m1")),
        publish_frame(5, body("t.f", Nats_Msg_Id="m1", Nats_TTL="60")),
    ]
    await raw.send(b"".join(frames))
    got = await answers(raw, len(frames))
    assert joined == [3, 0]
    acks = {corr: got[corr].result for corr in (1, 2, 3, 4, 5)}  # type: ignore[union-attr]
    assert list(acks[1].offsets) == [1]
    assert list(acks[2].offsets) == [2, 3]
    assert list(acks[3].statuses) == [P.ErrorCode.INVALID_MSG_TTL]
    assert acks[3].errors == {0: "invalid per-message TTL"}
    assert list(acks[4].offsets) == [4]
    assert list(acks[5].statuses) == [P.ErrorCode.DUPLICATE_MESSAGE]
    stored = (await client.fetch("ttls", "t", 0, 1, 10)).messages
    assert [(m.subject, m.ttl) for m in stored] == [("t.a", 60), ("t.b", 0), ("t.c", 120), ("t.e", 0)]
    await raw.aclose()


async def test_frames_into_several_partitions_keep_their_order(
    server: ServerHandle, client: Client, topic: tuple[str, str]
) -> None:
    raw = await RawPeer.open(server.address)
    await raw.handshake()
    subjects = [f"orders.{k}" for k in range(12)]
    frames = [publish_frame(10 + i, P.encode_body(s, str(i).encode())) for i, s in enumerate(subjects)]
    await raw.send(b"".join(frames))
    got = await answers(raw, len(frames))
    for i, s in enumerate(subjects):
        ev = got[10 + i]
        assert isinstance(ev, P.Response), ev
        (ack,) = list(ev.result)  # type: ignore[call-overload]
        assert ack.error is None
        (m,) = (await client.fetch(*topic, ack.partition, ack.offset, 1)).messages
        assert (m.subject, m.payload) == (s, str(i).encode())
    await raw.aclose()


async def test_acks_of_pipelined_frames_wait_for_their_fsync(
    server: ServerHandle, client: Client, topic: tuple[str, str], monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """fsync ``always`` (the default): while the group commit is held, the broker
    stores the batch but sends none of its acks; they all leave after the one sync."""
    broker = server.broker
    assert broker.committer.acks_wait
    with held_commit(monkeypatch) as gate:
        raw = await RawPeer.open(server.address)
        await raw.handshake()
        count = 50
        before = broker.counters.messages_in
        await raw.send(b"".join(publish_frame(100 + i, P.encode_body("orders.x", b"%d" % i)) for i in range(count)))
        with trio.fail_after(5):
            while broker.counters.messages_in < before + count:
                await trio.sleep(0.01)
        fsyncs = broker.counters.fsyncs
        with trio.move_on_after(0.2):
            early = await raw.stream.receive_some(65536)
            raise AssertionError(f"an ack left before its fsync: {early!r}")
        gate.set()
        got = await answers(raw, count)
        assert broker.counters.fsyncs == fsyncs + 1  # one sync for the whole batch
        offsets = [got[100 + i].result[0].offset for i in range(count)]  # type: ignore[union-attr]
        assert offsets == list(range(offsets[0], offsets[0] + count))
        await raw.aclose()


async def test_a_slow_disk_is_synced_from_the_sync_thread(
    server: ServerHandle, client: Client, topic: tuple[str, str], monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A sync slower than ``INLINE_SYNC_SECONDS`` (here: every one) runs in the sync
    thread, not on the event loop; the acks still wait for it."""
    counters = server.broker.counters
    threads: list[str] = []
    real = _commit.sync_fds

    def recorded(fds: list[int]) -> None:
        threads.append(threading.current_thread().name)
        real(fds)

    monkeypatch.setattr(_commit, "sync_fds", recorded)
    monkeypatch.setattr(_commit, "INLINE_SYNC_SECONDS", 0.0)
    for i in range(5):
        before = counters.fsyncs
        ack = await client.publish("orders.x", b"%d" % i)
        assert ack is not None and ack.error is None
        assert counters.fsyncs > before  # the ack came after a sync
    assert len(threads) >= 5 and set(threads) == {"ttlbroker-fsync"}


async def test_a_failed_fsync_in_the_sync_thread_reaches_the_committer(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The error of a sync in the thread is raised where the sync was awaited (the
    committer then stops the broker; no ack is sent for what it covered)."""
    counters = Counters()
    committer = Committer(FsyncPolicy("always"), counters)
    committer.last_sync_seconds = 1.0

    class Source:
        def take_dirty_fds(self) -> list[int]:
            return [-1]

    def failing(fds: list[int]) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(_commit, "sync_fds", failing)
    committer.note_write(Source())
    with pytest.raises(OSError, match="Input/output error"):
        await committer.sync_now()
    assert committer.synced == 0 and counters.fsyncs == 0


async def test_durable_acks_of_a_nats_client_that_started_tls_go_out_encrypted(data_dir: Path, tmp_path: Path) -> None:
    """A NATS client starts TLS after INFO, on the connection's plain stream: the
    PubAcks the group commit releases must go through TLS (never written straight
    to the socket underneath)."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    config = make_config(data_dir, **{
        "nats.enabled": True, "server.tls_cert": str(tmp_path / "cert.pem"), "server.tls_key": str(tmp_path / "key.pem"),
    })

    async def publish_over_tls(url: str) -> list[int]:
        nc = await nats.connect(url, tls=ssl.create_default_context(cafile=str(tmp_path / "ca.pem")))
        try:
            js = nc.jetstream()
            await js.add_stream(name="TLSED", subjects=["tlsed.>"])
            return [(await js.publish("tlsed.a", b"%d" % i)).seq for i in range(3)]
        finally:
            await nc.close()

    async with start_server(config) as handle:
        assert handle.broker.committer.acks_wait
        assert await in_asyncio(publish_over_tls, handle.nats_url or "") == [1, 2, 3]


def spy_on_runs(monkeypatch: pytest.MonkeyPatch, broker: Any) -> list[tuple[int, int, int, int]]:
    """Per run of PUBLISH requests the broker took as one batch: ``(requests, its
    group-commit epoch, the durable epoch and the bytes the session had sent when
    the run came)``."""
    runs: list[tuple[int, int, int, int]] = []

    real = Publisher.publish_frames

    def spy(publisher: Publisher, session: Any, cmds: list[P.Publish]) -> Any:
        synced, sent = broker.committer.synced, session.transport.sent_bytes
        reply = real(publisher, session, cmds)
        assert reply is not None
        runs.append((len(cmds), reply[1], synced, sent))
        return reply

    monkeypatch.setattr(Publisher, "publish_frames", spy)
    return runs


def run_of_three(monkeypatch: pytest.MonkeyPatch, frame: bytes) -> None:
    """Runs of PUBLISH requests end after three ``frame``-sized requests."""
    monkeypatch.setattr(_session, "PUBLISH_RUN_BYTES", 3 * (len(frame) - 16))  # the payload, after the 16-byte header


async def test_a_long_read_is_answered_a_run_at_a_time_each_after_its_fsync(
    server: ServerHandle, client: Client, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """fsync ``always``: a read holding more than PUBLISH_RUN_BYTES of PUBLISH
    requests is stored a run at a time, and each run's acks go out after its own
    fsync, before the broker handles the next run (a pipelining client gets them
    while the broker works on the rest); the acks name every message's place in
    the order the requests came."""
    await client.create_stream("runs")
    await client.create_topic("runs", "r", partitions=1, subjects=["r.>"])
    broker = server.broker
    assert broker.committer.acks_wait
    # Syncs on the event loop (a slow one goes to the sync thread, and the reader
    # handles the next run meanwhile: the run joins the next sync).
    monkeypatch.setattr(_commit, "INLINE_SYNC_SECONDS", float("inf"))
    frames = [publish_frame(200 + i, P.encode_body("r.x", b"m%02d" % i)) for i in range(10)]
    run_of_three(monkeypatch, frames[0])
    runs = spy_on_runs(monkeypatch, broker)
    raw = await RawPeer.open(server.address)
    await raw.handshake()
    fsyncs = broker.counters.fsyncs
    await raw.send(b"".join(frames))  # one write: the broker reads them together
    got = await answers(raw, len(frames))
    assert [n for n, _, _, _ in runs] == [3, 3, 3]  # and the tenth alone, ending the read
    for (_, epoch, _, sent), (_, _, synced, sent_then) in zip(runs, runs[1:]):
        assert synced >= epoch  # the run before was durable when this one came
        assert sent_then > sent  # and its acks had gone out
    assert broker.counters.fsyncs == fsyncs + 4
    offsets = [got[200 + i].result[0].offset for i in range(10)]  # type: ignore[union-attr]
    assert offsets == list(range(1, 11))
    stored = (await client.fetch("runs", "r", 0, 1, 20)).messages
    assert [m.payload for m in stored] == [b"m%02d" % i for i in range(10)]
    await raw.aclose()


async def test_on_a_slow_disk_a_long_read_goes_with_one_sync(
    server: ServerHandle, client: Client, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """When syncs go to the sync thread (the last one was slow), the runs of a read
    are not synced one by one: a sync of the first run alone would make the others
    wait for the next sync. The read is stored, then one sync covers it all."""
    await client.create_stream("slow")
    await client.create_topic("slow", "s", partitions=1, subjects=["s.>"])
    broker = server.broker
    monkeypatch.setattr(_commit, "INLINE_SYNC_SECONDS", 0.0)
    frames = [publish_frame(500 + i, P.encode_body("s.x", b"%d" % i)) for i in range(10)]
    run_of_three(monkeypatch, frames[0])
    runs = spy_on_runs(monkeypatch, broker)
    raw = await RawPeer.open(server.address)
    await raw.handshake()
    fsyncs = broker.counters.fsyncs
    await raw.send(b"".join(frames))
    got = await answers(raw, len(frames))
    assert [n for n, _, _, _ in runs] == [3, 3, 3]
    assert len({epoch for _, epoch, _, _ in runs}) == 1  # no sync began in the read
    assert broker.counters.fsyncs == fsyncs + 1
    assert [got[500 + i].result[0].offset for i in range(10)] == list(range(1, 11))  # type: ignore[union-attr]
    await raw.aclose()


async def test_acks_of_a_long_read_wait_for_the_fsync_of_their_run(
    server: ServerHandle, client: Client, topic: tuple[str, str], monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """With the group commit held, runs are stored but none of their acks leaves;
    all of them leave once the syncs may happen."""
    broker = server.broker
    frames = [publish_frame(300 + i, P.encode_body("orders.x", b"%d" % i)) for i in range(9)]
    run_of_three(monkeypatch, frames[0])
    runs = spy_on_runs(monkeypatch, broker)
    with held_commit(monkeypatch) as gate:
        raw = await RawPeer.open(server.address)
        await raw.handshake()
        before = broker.counters.messages_in
        await raw.send(b"".join(frames))
        with trio.fail_after(5):
            while broker.counters.messages_in < before + len(frames):
                await trio.sleep(0.01)
        with trio.move_on_after(0.2):
            early = await raw.stream.receive_some(65536)
            raise AssertionError(f"an ack left before its fsync: {early!r}")
        gate.set()
        got = await answers(raw, len(frames))
    assert [n for n, _, _, _ in runs] == [3, 3, 3]
    offsets = [got[300 + i].result[0].offset for i in range(9)]  # type: ignore[union-attr]
    assert offsets == list(range(offsets[0], offsets[0] + 9))
    await raw.aclose()


async def test_without_fsync_waits_each_run_of_a_long_read_is_answered_before_the_next(
    data_dir: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """fsync ``never`` (acks do not wait): each run's acks are written before the
    broker handles the next run of the same read."""
    config = make_config(data_dir, **{"system.partition.fsync": "never"})
    frames = [publish_frame(400 + i, P.encode_body("n.x", b"%d" % i)) for i in range(7)]
    run_of_three(monkeypatch, frames[0])
    async with start_server(config) as handle:
        broker = handle.broker
        assert not broker.committer.acks_wait
        runs = spy_on_runs(monkeypatch, broker)
        async with connect(handle.address) as c:
            await c.create_stream("n")
            await c.create_topic("n", "t", partitions=1, subjects=["n.>"])
        raw = await RawPeer.open(handle.address)
        await raw.handshake()
        await raw.send(b"".join(frames))
        got = await answers(raw, len(frames))
        assert [n for n, _, _, _ in runs] == [3, 3]  # and the seventh alone
        assert runs[0][3] < runs[1][3]
        assert [got[400 + i].result[0].offset for i in range(7)] == list(range(1, 8))  # type: ignore[union-attr]
        await raw.aclose()


async def test_errors_in_the_runs_of_a_long_read_are_each_requests_own(
    server: ServerHandle, client: Client, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A read cut into runs: an unrouted message, a bad TTL header and a truncated
    request each get their exact error in their own request's answer, wherever the
    runs end; the other messages are stored, in order."""
    await client.create_stream("errs")
    await client.create_topic("errs", "e", partitions=1, subjects=["e.>"], allow_msg_ttl=True)
    body = P.encode_body
    frames = [
        publish_frame(1, body("e.a", b"m1")),
        publish_frame(2, body("nowhere.b", b"m2")),
        publish_frame(3, body("e.c", b"m3")),
        publish_frame(4, body("e.d", b"m4", P.encode_headers({"Nats-TTL": "1d"}))),
        publish_frame(5, body("e.e", b"m5")[:-1]),  # truncated: MALFORMED_PAYLOAD
        publish_frame(6, body("e.f", b"m6")),
        publish_frame(7, body("e.g", b"m7")),
    ]
    run_of_three(monkeypatch, frames[0])
    raw = await RawPeer.open(server.address)
    await raw.handshake()
    await raw.send(b"".join(frames))
    got = await answers(raw, len(frames))

    def ack(corr: int) -> P.Ack:
        ev = got[corr]
        assert isinstance(ev, P.Response), ev
        (a,) = list(ev.result)  # type: ignore[call-overload]
        return a

    assert ack(2).error is not None and ack(2).error.code == P.ErrorCode.NO_TOPIC_FOR_SUBJECT
    assert ack(2).error.message == "no topic captures subject 'nowhere.b'"
    assert ack(4).error is not None and ack(4).error.code == P.ErrorCode.INVALID_MSG_TTL
    assert ack(4).error.message == "invalid per-message TTL"
    bad = got[5]
    assert isinstance(bad, P.ErrorResponse) and bad.error.code == P.ErrorCode.MALFORMED_PAYLOAD
    assert bad.error.message == "message 0 of the batch is truncated or has an empty subject"
    assert [ack(c).offset for c in (1, 3, 6, 7)] == [1, 2, 3, 4]
    assert all(ack(c).error is None for c in (1, 3, 6, 7))
    stored = (await client.fetch("errs", "e", 0, 1, 20)).messages
    assert [m.payload for m in stored] == [b"m1", b"m3", b"m6", b"m7"]
    await raw.aclose()
