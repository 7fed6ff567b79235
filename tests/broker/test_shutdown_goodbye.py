"""The broker's GOODBYE on a graceful shutdown (docs/protocol.md, section 3, rule 8):
every connection gets one, with SHUTTING_DOWN and a reason, after everything already
acknowledged, as its last frame, and then the connection is closed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing
from conftest import make_config, start_server
from helpers import RawPeer

import protocol as P
from broker import ServerHandle
from broker.net import GOODBYE_SECONDS
from broker.client import ConnectionClosedError, ShuttingDownError, connect, encode_msg

REASON = "the broker is shutting down"


class Runner:
    """A broker in the test's nursery that the test stops (gracefully) when it likes."""

    def __init__(self, nursery: trio.Nursery, data_dir: Path, **config: object) -> None:
        self.nursery = nursery
        self.data_dir = data_dir
        self.config = config
        self.stopped_at: float | None = None

    async def start(self, port: int = 0) -> ServerHandle:
        changes = dict(self.config)
        if port:
            changes["server.port"] = port
        cfg = make_config(self.data_dir, **changes)
        self._scope = trio.CancelScope()
        self._done = trio.Event()

        async def run(task_status: trio.TaskStatus[ServerHandle]) -> None:
            try:
                with self._scope:
                    async with start_server(cfg) as h:
                        task_status.started(h)
                        await trio.sleep_forever()
            finally:
                self.stopped_at = trio.current_time()
                self._done.set()

        self.handle: ServerHandle = await self.nursery.start(run)
        return self.handle

    async def stop(self) -> None:
        self._scope.cancel()
        await self._done.wait()


@pytest.fixture
async def runner(data_dir: Path) -> AsyncIterator[Runner]:
    async with trio.open_nursery() as nursery:
        r = Runner(nursery, data_dir, **{"system.partition.fsync": "never"})
        await r.start()
        yield r
        nursery.cancel_scope.cancel()


def is_goodbye(event: object) -> bool:
    return isinstance(event, P.Push) and event.kind == P.PushKind.GOODBYE


async def read_to_the_end(peer: RawPeer, into: list[object]) -> None:
    """What a well-behaved client does: read until the broker closes, then close."""
    into.extend(await peer.wait_closed(timeout=10))
    await peer.stream.aclose()


async def test_every_connection_gets_a_goodbye_with_shutting_down(runner: Runner) -> None:
    ready = await RawPeer.open(runner.handle.address)
    await ready.handshake()
    fresh = await RawPeer.open(runner.handle.address)  # not handshaken yet
    seen: dict[str, list[object]] = {"ready": [], "fresh": []}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_to_the_end, ready, seen["ready"])
        nursery.start_soon(read_to_the_end, fresh, seen["fresh"])
        start = trio.current_time()
        await runner.stop()
    assert runner.stopped_at is not None and runner.stopped_at - start < 1  # they closed at once
    for events in seen.values():
        assert [(e.kind, e.status, e.value.reason) for e in events] == [  # type: ignore[attr-defined]
            (P.PushKind.GOODBYE, P.ErrorCode.SHUTTING_DOWN, REASON)
        ]
    assert ready.eof and fresh.eof


async def test_the_trio_client_reports_the_goodbye(runner: Runner) -> None:
    """With reconnect=False the GOODBYE ends the client: the iteration over a
    subscription raises it (code and reason), and so does every later call."""
    disconnects: list[ConnectionClosedError] = []
    closes: list[ConnectionClosedError] = []
    async with connect(
        runner.handle.address, reconnect=False, on_disconnect=disconnects.append, on_closed=closes.append
    ) as c:
        sub = await c.subscribe("anything.>")
        await runner.stop()
        with pytest.raises(ConnectionClosedError) as info:
            async for _ in sub:
                pass
        err = info.value
        assert type(err) is ConnectionClosedError
        assert err.reason == "the broker said goodbye: the broker is shutting down"
        assert str(err) == err.reason
        assert err.code == P.ErrorCode.SHUTTING_DOWN == 10
        assert isinstance(err.__cause__, ShuttingDownError) and err.__cause__.message == REASON
        assert c.closed and c.close_reason is err and not c.connected
        with pytest.raises(ConnectionClosedError) as later:
            await c.ping()
        assert later.value is err
        await trio.testing.wait_all_tasks_blocked()
        assert disconnects == [err] and closes == [err]


async def test_acks_already_queued_come_before_the_goodbye_and_nothing_acked_is_lost(data_dir: Path) -> None:
    """A peer that pipelines publishes while the broker stops: every frame it gets is an
    ack of a stored message or a SHUTTING_DOWN refusal, the GOODBYE is the last one,
    and every acknowledged message is there after a restart."""
    async with trio.open_nursery() as nursery:
        runner = Runner(nursery, data_dir)  # fsync "always": acks wait for their sync
        await runner.start()
        async with connect(runner.handle.address) as admin:
            await admin.create_stream("s")
            await admin.create_topic("s", "t", subjects=["t.>"])
        peer = await RawPeer.open(runner.handle.address)
        await peer.handshake()
        sent: dict[int, bytes] = {}

        async def publisher() -> None:
            corr = 100
            try:
                while True:
                    frames = []
                    for _ in range(20):
                        corr += 1
                        payload = f"m{corr}".encode()
                        sent[corr] = payload
                        frames.append(P.encode_frame(P.Command.PUBLISH, 0, corr, 0, P.Publish.from_bodies([encode_msg("t.x", payload)]).encode()))
                    await peer.send(b"".join(frames))
                    await trio.sleep(0)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        events: list[object] = []
        async with trio.open_nursery() as pubs:
            pubs.start_soon(publisher)
            pubs.start_soon(read_to_the_end, peer, events)
            await trio.sleep(0.05)
            await runner.stop()
            pubs.cancel_scope.cancel()
        assert is_goodbye(events[-1]) and events[-1].status == P.ErrorCode.SHUTTING_DOWN  # type: ignore[attr-defined]
        acked: set[bytes] = set()
        refused = 0
        for ev in events[:-1]:
            if isinstance(ev, P.ErrorResponse):
                assert ev.error.code == P.ErrorCode.SHUTTING_DOWN and ev.error.message == REASON
                refused += 1
            else:
                assert isinstance(ev, P.Response) and ev.result[0].status == 0, ev  # type: ignore[attr-defined]
                acked.add(sent[ev.correlation_id])
        assert acked
        await runner.start()
        async with connect(runner.handle.address) as c:
            stored = {m.payload for m in (await c.fetch("s", "t", 0, 1, 100_000)).messages}
        assert acked <= stored
        nursery.cancel_scope.cancel()


async def test_requests_during_the_shutdown_are_refused_and_the_client_retries_them(data_dir: Path) -> None:
    """SHUTTING_DOWN means "not carried out": a reconnecting client sends the request
    again on its next connection, so the caller sees only the answer."""
    async with trio.open_nursery() as nursery:
        runner = Runner(nursery, data_dir, **{"system.partition.fsync": "never"})
        h = await runner.start()
        async with connect(h.address, reconnect_wait=0.01, reconnect_wait_max=0.05, max_reconnect_attempts=-1) as c:
            await c.create_stream("s")
            await c.create_topic("s", "t", subjects=["t.>"])
            h.broker.shutting_down = True  # what _shutdown does first
            result: list[object] = []

            async def publish() -> None:
                result.append(await c.publish("t.x", b"during the shutdown"))

            nursery.start_soon(publish)
            with trio.fail_after(10):
                while h.broker.counters.request_errors == 0:  # refused with SHUTTING_DOWN
                    await trio.sleep(0.01)
            await trio.sleep(0.05)
            assert result == []  # waiting for the next connection
            await runner.stop()
            await runner.start(h.port)
            with trio.fail_after(10):
                while not result:
                    await trio.sleep(0.01)
            (ack,) = result
            assert ack.offset == 1  # type: ignore[attr-defined]
            assert [m.payload for m in (await c.fetch("s", "t", 0, 1, 10)).messages] == [b"during the shutdown"]
        nursery.cancel_scope.cancel()


async def test_without_reconnect_a_refused_request_raises_shutting_down(runner: Runner) -> None:
    async with connect(runner.handle.address, reconnect=False) as c:
        runner.handle.broker.shutting_down = True
        with pytest.raises(ShuttingDownError) as info:
            await c.ping()
        assert info.value.code == P.ErrorCode.SHUTTING_DOWN and info.value.message == REASON
        runner.handle.broker.shutting_down = False


async def test_a_peer_that_never_closes_holds_the_shutdown_for_goodbye_seconds_at_most(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        runner = Runner(nursery, data_dir, **{"system.partition.fsync": "never"})
        await runner.start()
        reader = await RawPeer.open(runner.handle.address)
        await reader.handshake()
        mute = await RawPeer.open(runner.handle.address)  # reads nothing, closes nothing
        await mute.handshake()
        start = trio.current_time()
        await runner.stop()
        assert runner.stopped_at is not None and runner.stopped_at - start <= GOODBYE_SECONDS + 0.5
        assert [e.status for e in await reader.wait_closed()] == [P.ErrorCode.SHUTTING_DOWN]  # type: ignore[attr-defined]
        assert [e.status for e in await mute.wait_closed()] == [P.ErrorCode.SHUTTING_DOWN]  # type: ignore[attr-defined]
        nursery.cancel_scope.cancel()
