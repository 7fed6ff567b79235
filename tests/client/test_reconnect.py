"""The client when its connection goes: reconnection with backoff, subscriptions that
go on, requests in flight that fail with ConnectionLostError (or are sent again when
that is safe), calls that wait for the reconnection, and a client that gives up.

Real brokers on loopback, restarted on the same port, on both flavours (trio
in-process, asyncio against a broker process). Where a test needs a connection to
drop at a precise moment it goes through :class:`Proxy`, a TCP proxy in a thread
that can hold the broker's answers, swallow the client's requests, refuse new
connections and cut the ones it carries.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import BrokerProcess, make_config, start_server

import protocol as P
from broker import ServerHandle
from broker.client import (
    MSG_ID_HEADER,
    Client,
    ConnectionClosedError,
    ConnectionLostError,
    ReconnectFailedError,
    Subscription,
    aio,
    connect,
    encode_msg,
)
from broker.client import RECONNECT_ATTEMPTS, RECONNECT_WAIT, RECONNECT_WAIT_MAX

GOODBYE = "the broker said goodbye: the broker is shutting down"
CLOSED = "the broker closed the connection"
IN_FLIGHT = "the connection was lost while the request was in flight, so it may or may not have been carried out"
#: Quick attempts, never giving up (a restarted broker may take a while on a busy machine).
FAST: dict[str, Any] = {"reconnect_wait": 0.01, "reconnect_wait_max": 0.05, "max_reconnect_attempts": -1}


# -- a fault-injecting TCP proxy ---------------------------------------------------------


class Proxy:
    """Forwards loopback TCP connections to ``target`` from a thread.

    ``hold`` keeps the broker's bytes from reaching the client (until ``release`` or a
    ``cut``); ``swallow`` drops the client's requests after its handshake; ``refuse``
    closes new connections at once; ``cut`` closes every connection it carries (a
    reset with ``reset=True``). ``requests`` are the requests the clients sent,
    decoded, in order.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.hold = False
        self.swallow = False
        self.refuse = False
        self.requests: list[Any] = []
        self.accepted = 0
        self._pairs: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def publishes(self) -> list[P.Publish]:
        with self._lock:
            return [r for r in self.requests if isinstance(r, P.Publish)]

    def _call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the proxy's thread, and wait for it."""
        done = threading.Event()
        with self._lock:
            self._todo = (fn, done)
        self._wake_w.send(b"x")
        done.wait(5)

    def cut(self, reset: bool = False) -> None:
        def do() -> None:
            for pair in self._pairs:
                if reset:
                    pair["client"].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self._close(pair)
            self._pairs.clear()
            self.hold = False

        self._call(do)

    def release(self) -> None:
        def do() -> None:
            self.hold = False
            for pair in self._pairs:
                if pair["held"]:
                    pair["client"].sendall(b"".join(pair["held"]))
                    pair["held"].clear()

        self._call(do)

    def close(self) -> None:
        self._stop = True
        self._wake_w.send(b"x")
        self._thread.join(5)
        for pair in self._pairs:
            self._close(pair)
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()

    @staticmethod
    def _close(pair: dict[str, Any]) -> None:
        for side in ("client", "server"):
            try:
                pair[side].close()
            except OSError:
                pass

    def _loop(self) -> None:
        while not self._stop:
            socks = [self.listener, self._wake_r] + [p[s] for p in self._pairs for s in ("client", "server")]
            readable, _, _ = select.select(socks, [], [], 0.5)
            for sock in readable:
                if sock is self._wake_r:
                    self._wake_r.recv(64)
                    with self._lock:
                        todo, self._todo = getattr(self, "_todo", None), None
                    if todo is not None:
                        todo[0]()
                        todo[1].set()
                elif sock is self.listener:
                    self._accept()
                else:
                    self._forward(sock)

    def _accept(self) -> None:
        client, _ = self.listener.accept()
        if self.refuse:
            client.close()
            return
        self.accepted += 1
        server = socket.create_connection(self.target)
        decoder = P.ProtocolConnection(P.Role.SERVER)
        self._pairs.append({"client": client, "server": server, "held": [], "decoder": decoder, "handshaken": False})

    def _forward(self, sock: socket.socket) -> None:
        pair = next((p for p in self._pairs if sock in (p["client"], p["server"])), None)
        if pair is None:
            return
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._close(pair)
            self._pairs.remove(pair)
            return
        try:
            if sock is pair["client"]:
                if self.swallow and pair["handshaken"]:
                    return
                pair["decoder"].receive_data(data)
                while (ev := pair["decoder"].next_event()) is not P.NEED_DATA:
                    if isinstance(ev, P.Request):
                        with self._lock:
                            self.requests.append(ev.command)
                        pair["handshaken"] = True
                        pair["decoder"].state = P.State.READY  # as if the broker had answered
                pair["server"].sendall(data)
            elif self.hold:
                pair["held"].append(data)
            else:
                pair["client"].sendall(data)
        except OSError:
            self._close(pair)
            self._pairs.remove(pair)


# -- trio: a broker that restarts on the same port ----------------------------------------


class Runner:
    """An in-process broker the test stops and starts again (same data, same port)."""

    def __init__(self, nursery: trio.Nursery, data_dir: Path) -> None:
        self.nursery = nursery
        self.data_dir = data_dir
        self.port = 0

    async def start(self) -> ServerHandle:
        cfg = make_config(self.data_dir, **{"system.partition.fsync": "never", "server.port": self.port})
        self._scope = trio.CancelScope()
        self._done = trio.Event()

        async def run(task_status: trio.TaskStatus[ServerHandle]) -> None:
            try:
                with self._scope:
                    async with start_server(cfg) as h:
                        task_status.started(h)
                        await trio.sleep_forever()
            finally:
                self._done.set()

        self.handle: ServerHandle = await self.nursery.start(run)
        self.port = self.handle.port
        return self.handle

    async def stop(self) -> None:
        self._scope.cancel()
        await self._done.wait()


@pytest.fixture
async def runner(data_dir: Path) -> AsyncIterator[Runner]:
    async with trio.open_nursery() as nursery:
        r = Runner(nursery, data_dir)
        await r.start()
        yield r
        nursery.cancel_scope.cancel()


@pytest.fixture
def proxy(runner: Runner):  # type: ignore[no-untyped-def]
    p = Proxy(runner.handle.address)
    try:
        yield p
    finally:
        p.close()


async def until(predicate: Callable[[], bool], seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.005)


async def setup_topic(c: Client) -> None:
    await c.create_stream("s")
    await c.create_topic("s", "t", subjects=["t.>"])


async def stored(c: Client) -> list[bytes]:
    return [m.payload for m in (await c.fetch("s", "t", 0, 1, 10_000)).messages]


class Events:
    """The callbacks' calls, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def options(self) -> dict[str, Any]:
        return {
            "on_disconnect": lambda err: self.seen.append(("disconnect", err)),
            "on_reconnect": lambda attempts: self.seen.append(("reconnect", attempts)),
            "on_closed": lambda err: self.seen.append(("closed", err)),
        }

    def kinds(self) -> list[str]:
        return [k for k, _ in self.seen]


# -- the defaults ---------------------------------------------------------------------------


def test_the_defaults_are_those_of_nats_py() -> None:
    assert RECONNECT_ATTEMPTS == 60 and RECONNECT_WAIT == 0.25 and RECONNECT_WAIT_MAX == 2.0
    c = Client(trio_backend(), 30.0)
    assert c._reconnect and c._max_attempts == 60


def trio_backend() -> Any:
    from broker.client import TrioBackend

    return TrioBackend()


def test_the_backoff_doubles_up_to_its_cap_with_up_to_half_taken_off_at_random() -> None:
    c = Client(trio_backend(), 30.0, reconnect_wait=0.1, reconnect_wait_max=1.0)
    for attempt, full in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (6, 1.0), (60, 1.0), (10_000, 1.0)]:
        waits = [c._backoff(attempt) for _ in range(500)]
        assert all(full / 2 <= w <= full for w in waits), (attempt, min(waits), max(waits))
        assert max(waits) - min(waits) > full / 4  # jittered, not fixed
    with pytest.raises(ValueError, match="must not be negative"):
        Client(trio_backend(), 30.0, reconnect_wait=-1)


# -- trio ---------------------------------------------------------------------------------


async def test_a_client_survives_a_broker_restart(runner: Runner) -> None:
    """Graceful restart on the same port: the GOODBYE is reported, the client comes back
    on its own, the old Subscription object goes on, publishes succeed, and nothing
    acknowledged is lost."""
    events = Events()
    async with connect(runner.handle.address, **FAST, **events.options()) as c:
        await setup_topic(c)
        sub = await c.subscribe("t.>")
        before = [(await c.publish(f"t.{i}", f"before {i}".encode())) for i in range(50)]
        got = [await sub.next(timeout=5) for _ in range(50)]
        assert [m.payload for m in got] == [f"before {i}".encode() for i in range(50)]

        await runner.stop()
        await until(lambda: events.kinds() == ["disconnect"])
        lost = events.seen[0][1]
        assert type(lost) is ConnectionClosedError and lost.reason == GOODBYE and lost.code == P.ErrorCode.SHUTTING_DOWN
        assert not c.connected and not c.closed and c.last_error is lost

        await runner.start()  # same data directory, same port
        ack = await c.publish("t.after", b"after the restart")  # waits for the reconnection
        assert ack is not None and ack.offset == 51
        assert (await sub.next(timeout=5)).payload == b"after the restart"
        assert c.connected and c.reconnects == 1 and sub.dropped == 0
        assert events.kinds() == ["disconnect", "reconnect"] and events.seen[1][1] >= 1
        assert await stored(c) == [f"before {i}".encode() for i in range(50)] + [b"after the restart"]
        assert {a.offset for a in before if a} == set(range(1, 51))
        stats = await c.stats()
        assert stats["subscriptions"] == 1  # re-created once, not twice


async def test_async_for_goes_on_across_two_restarts(runner: Runner) -> None:
    async with connect(runner.handle.address, **FAST) as c, connect(runner.handle.address, **FAST) as publisher:
        await setup_topic(c)
        sub = await c.subscribe("t.>")
        received: list[bytes] = []

        async def consume() -> None:
            async for m in sub:
                received.append(m.payload)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            for round_ in range(3):
                await publisher.publish("t.x", f"round {round_}".encode())
                await until(lambda: len(received) == round_ + 1)
                if round_ < 2:
                    await runner.stop()
                    await runner.start()
                    await until(lambda: c.reconnects == round_ + 1 and publisher.reconnects == round_ + 1)
            await sub.unsubscribe()  # ends the iteration normally
        assert received == [b"round 0", b"round 1", b"round 2"]


async def test_messages_published_while_disconnected_are_not_delivered(runner: Runner, proxy: Proxy) -> None:
    """Core subscriptions are at most once: what was published while the subscriber
    had no connection is gone for it (a fetch still finds it)."""
    async with connect(proxy.address, **FAST) as c, connect(runner.handle.address) as publisher:
        await setup_topic(publisher)
        sub = await c.subscribe("t.>")
        proxy.refuse = True
        proxy.cut()
        await until(lambda: not c.connected)
        await publisher.publish("t.x", b"while away")
        proxy.refuse = False
        await until(lambda: c.connected)
        await publisher.publish("t.x", b"after")
        assert (await sub.next(timeout=5)).payload == b"after"
        assert sub.pending == 0
        assert await stored(c) == [b"while away", b"after"]


async def test_requests_in_flight_at_the_drop_fail_with_connection_lost(runner: Runner, proxy: Proxy) -> None:
    async with connect(proxy.address, **FAST) as c, connect(runner.handle.address) as direct:
        await setup_topic(c)
        proxy.hold = True  # the broker's answers stop here
        failures: dict[str, BaseException] = {}

        async def attempt(name: str, call: Callable[[], Any]) -> None:
            try:
                await call()
            except ConnectionLostError as exc:
                failures[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt, "publish", lambda: c.publish("t.x", b"stored, but was it?"))
            nursery.start_soon(attempt, "fetch", lambda: c.fetch("s", "t", 0, 1))
            nursery.start_soon(attempt, "create", lambda: c.create_stream("other"))
            await until(lambda: len(proxy.requests) == 6)  # handshake, 2 admin, 3 in flight
            # The broker carried them out; their answers are held. Now the connection goes.
            with trio.fail_after(5):
                while (await direct.get_topic("s", "t")).messages_count < 1:
                    await trio.sleep(0.01)
            proxy.cut()
        assert set(failures) == {"publish", "fetch", "create"}
        for exc in failures.values():
            assert type(exc) is ConnectionLostError
            assert exc.reason == f"{IN_FLIGHT} ({CLOSED})" and str(exc) == exc.reason
            assert exc.code is None
            assert type(exc.__cause__) is ConnectionClosedError and exc.__cause__.reason == CLOSED
        # It reconnects by itself; what was carried out is there.
        assert await stored(c) == [b"stored, but was it?"]
        assert [s.name for s in await c.list_streams()] == ["s", "other"]
        assert c.reconnects == 1


async def test_a_reset_is_reported_with_the_system_error(runner: Runner, proxy: Proxy) -> None:
    events = Events()
    async with connect(proxy.address, **FAST, **events.options()) as c:
        proxy.hold = True
        async with trio.open_nursery() as nursery:

            async def ping() -> None:
                with pytest.raises(ConnectionLostError) as info:
                    await c.ping()
                assert info.value.reason == f"{IN_FLIGHT} (the connection broke (Connection reset by peer))"

            nursery.start_soon(ping)
            await until(lambda: len(proxy.requests) == 2)
            proxy.cut(reset=True)
        await until(lambda: events.kinds() == ["disconnect", "reconnect"])
        assert events.seen[0][1].reason == "the connection broke (Connection reset by peer)"
        await c.ping()


async def test_a_publish_with_a_msg_id_is_sent_again_after_reconnecting(runner: Runner, proxy: Proxy) -> None:
    """The client sends the message again, on the new connection, and returns that
    answer; the topic's duplicate window (Nats-Msg-Id de-duplication) stores it once."""
    async with connect(proxy.address, **FAST) as c:
        await setup_topic(c)
        proxy.hold = True
        acks: list[Any] = []

        async def publish() -> None:
            acks.append(await c.publish("t.x", b"exactly once, please", headers={MSG_ID_HEADER: "order-42"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish)
            await until(lambda: len(proxy.publishes()) == 1)
            proxy.cut()
        (ack,) = acks
        assert ack.partition == 0 and ack.offset >= 1
        first, second = proxy.publishes()  # the same message, sent on two connections
        assert first.encode() == second.encode()
        assert proxy.accepted == 2 and c.reconnects == 1
        copies = [m for m in (await c.fetch("s", "t", 0, 1, 10)).messages if m.headers.get(MSG_ID_HEADER) == "order-42"]
        assert len(copies) == 1 and copies[0].offset == ack.offset
        # The first copy reached the broker (only its answer was held): the resent
        # one is acked as a duplicate of it.
        assert ack.duplicate and (await c.stats())["duplicates"] == 1


async def test_a_batch_is_sent_again_only_if_every_message_has_a_msg_id(runner: Runner, proxy: Proxy) -> None:
    async with connect(proxy.address, **FAST) as c:
        await setup_topic(c)
        results: dict[str, Any] = {}

        async def batch(name: str, messages: list[Any]) -> None:
            try:
                results[name] = await c.publish_batch(messages)
            except ConnectionLostError as exc:
                results[name] = exc

        with_ids = [("t.a", b"1", {MSG_ID_HEADER: "a-1"}), encode_msg("t.a", b"2", {MSG_ID_HEADER: "a-2"})]
        partly = [("t.b", b"1", {MSG_ID_HEADER: "b-1"}), ("t.b", b"2")]
        proxy.hold = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch, "with_ids", with_ids)
            nursery.start_soon(batch, "partly", partly)
            await until(lambda: len(proxy.publishes()) == 2)
            proxy.cut()
        assert isinstance(results["with_ids"], P.Acks) and results["with_ids"].ok and len(results["with_ids"]) == 2
        assert type(results["partly"]) is ConnectionLostError
        assert len(proxy.publishes()) == 3  # only the first batch went again


async def test_calls_wait_for_the_reconnection_within_their_timeout(runner: Runner, proxy: Proxy) -> None:
    async with connect(proxy.address, timeout=0.5, **FAST) as c:
        await setup_topic(c)
        proxy.refuse = True
        proxy.cut()
        await until(lambda: not c.connected)
        with pytest.raises(TimeoutError) as info:
            await c.ping()
        assert str(info.value) == f"no answer within 0.5 s: the connection is down ({CLOSED}) and the client is still reconnecting"
        with pytest.raises(TimeoutError) as info:
            await c.subscribe("t.>")
        assert str(info.value) == f"no answer within 0.5 s: the connection is down ({CLOSED}) and the client is still reconnecting"
        assert c._subs == {}

        results: list[Any] = []

        async def later() -> None:
            results.append(await c.publish("t.x", b"waited"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(later)
            await trio.sleep(0.1)
            assert results == []  # waiting, not failed
            proxy.refuse = False
        assert results[0].offset == 1 and c.connected


async def test_subscribe_and_unsubscribe_while_disconnected(runner: Runner, proxy: Proxy) -> None:
    async with connect(proxy.address, **FAST) as c, connect(runner.handle.address) as publisher:
        await setup_topic(publisher)
        gone = await c.subscribe("t.gone")
        proxy.refuse = True
        proxy.cut()
        await until(lambda: not c.connected)
        await gone.unsubscribe()  # nothing to tell the broker: it forgot it already
        subs: list[Subscription] = []

        async def subscribe() -> None:
            subs.append(await c.subscribe("t.new"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscribe)
            await trio.sleep(0.05)
            proxy.refuse = False
        await publisher.publish("t.gone", b"not for the old one")
        await publisher.publish("t.new", b"for the new one")
        (new,) = subs
        assert (await new.next(timeout=5)).payload == b"for the new one"
        with pytest.raises(StopAsyncIteration):
            await gone.next(timeout=1)
        assert (await c.stats())["subscriptions"] == 1


async def test_a_subscribe_in_flight_at_the_drop_is_sent_again(runner: Runner, proxy: Proxy) -> None:
    async with connect(proxy.address, **FAST) as c, connect(runner.handle.address) as publisher:
        await setup_topic(publisher)
        proxy.hold = True
        subs: list[Subscription] = []

        async def subscribe() -> None:
            subs.append(await c.subscribe("t.>"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscribe)
            await until(lambda: sum(isinstance(r, P.Subscribe) for r in proxy.requests) == 1)
            proxy.cut()
        (sub,) = subs
        await publisher.publish("t.x", b"hello")
        assert (await sub.next(timeout=5)).payload == b"hello"
        assert (await c.stats())["subscriptions"] == 1
        assert sum(isinstance(r, P.Subscribe) for r in proxy.requests) == 2


async def test_a_kv_watch_misses_nothing_across_a_reconnection(runner: Runner, proxy: Proxy) -> None:
    """Core deliveries are at most once, but a KV watch fills the gap from the bucket
    after a reconnection: every revision once, in order."""
    async with connect(proxy.address, **FAST) as c, connect(runner.handle.address) as writer:
        kv = await writer.kv_create("cfg")
        await kv.put("a", b"before the watch")
        watched = await c.kv("cfg")
        seen: list[tuple[str, bytes, int, str]] = []

        async def watch() -> None:
            async for e in watched.watch():
                seen.append((e.key, e.value, e.revision, e.operation))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            with trio.fail_after(10):
                while (await writer.stats())["subscriptions"] < 1:
                    await trio.sleep(0.01)
            await kv.put("b", b"live")
            await until(lambda: len(seen) == 1)
            proxy.refuse = True
            proxy.cut()
            await until(lambda: not c.connected)
            await kv.put("c", b"while away")
            await kv.delete("b")
            proxy.refuse = False
            await until(lambda: c.connected)
            await kv.put("d", b"after")
            await until(lambda: len(seen) == 4)
            await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert seen == [
            ("b", b"live", 2, "PUT"), ("c", b"while away", 3, "PUT"), ("b", b"", 4, "DEL"), ("d", b"after", 5, "PUT"),
        ]


async def test_a_client_that_gives_up_raises_from_pending_calls_and_async_for(runner: Runner) -> None:
    events = Events()
    async with connect(runner.handle.address, **{**FAST, "max_reconnect_attempts": 3}, **events.options()) as c:
        await setup_topic(c)
        sub = await c.subscribe("t.>")
        await c.publish("t.x", b"read before the end")
        await until(lambda: sub.pending == 1)
        received: list[bytes] = []
        failures: dict[str, BaseException] = {}

        async def consume() -> None:
            try:
                async for m in sub:
                    received.append(m.payload)
            except ReconnectFailedError as exc:
                failures["async for"] = exc

        async def ping() -> None:
            await until(lambda: not c.connected)
            try:
                await c.ping()
            except ReconnectFailedError as exc:
                failures["ping"] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            nursery.start_soon(ping)
            await runner.stop()  # and never comes back
        err = c.close_reason
        assert isinstance(err, ReconnectFailedError) and c.closed and not c.connected
        assert failures == {"async for": err, "ping": err}
        assert received == [b"read before the end"]  # what had arrived is read first
        assert err.reason == f"gave up reconnecting after 3 attempts ({GOODBYE}; the last one failed: Connection refused)"
        assert err.code == P.ErrorCode.SHUTTING_DOWN and err.attempts == 3
        assert isinstance(err.last_error, OSError)
        assert type(err.__cause__) is ConnectionClosedError and err.__cause__.reason == GOODBYE
        with pytest.raises(ReconnectFailedError):
            await c.publish("t.x", b"too late")
        with pytest.raises(ReconnectFailedError):
            await sub.next()
        await trio.testing.wait_all_tasks_blocked()
        assert events.kinds() == ["disconnect", "closed"] and events.seen[1][1] is err


async def test_with_reconnect_false_the_first_loss_ends_the_client(runner: Runner, proxy: Proxy) -> None:
    events = Events()
    async with connect(proxy.address, reconnect=False, **events.options()) as c:
        sub = await c.subscribe("t.>")
        proxy.hold = True
        async with trio.open_nursery() as nursery:

            async def ping() -> None:
                with pytest.raises(ConnectionLostError) as info:
                    await c.ping()
                assert info.value.reason == f"{IN_FLIGHT} ({CLOSED})"

            nursery.start_soon(ping)
            await until(lambda: len(proxy.requests) == 3)
            proxy.cut()
        with pytest.raises(ConnectionClosedError) as info:
            async for _ in sub:
                pass
        assert type(info.value) is ConnectionClosedError and info.value.reason == CLOSED and info.value.code is None
        assert c.closed and c.close_reason is info.value
        await trio.testing.wait_all_tasks_blocked()
        assert events.kinds() == ["disconnect", "closed"]
        assert proxy.accepted == 1  # no attempt to reconnect


async def test_aclose_ends_iterations_normally_and_stops_reconnecting(runner: Runner, proxy: Proxy) -> None:
    events = Events()
    ended: list[str] = []
    failures: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        async with connect(proxy.address, **FAST, **events.options()) as c:
            sub = await c.subscribe("t.>")

            async def consume() -> None:
                async for _ in sub:
                    pass
                ended.append("normally")

            async def ping() -> None:
                try:
                    await c.ping()
                except ConnectionClosedError as exc:
                    failures.append(exc)

            nursery.start_soon(consume)
            proxy.refuse = True
            proxy.cut()
            await until(lambda: not c.connected)
            nursery.start_soon(ping)
            await trio.testing.wait_all_tasks_blocked()
        await until(lambda: bool(ended) and bool(failures))
    assert ended == ["normally"]
    (err,) = failures
    assert type(err) is ConnectionClosedError and err.reason == "the client closed the connection"
    assert events.kinds() == ["disconnect"]  # no reconnect, no closed: we closed it
    accepted = proxy.accepted
    await trio.sleep(0.2)
    assert proxy.accepted == accepted  # no more attempts


async def test_the_first_connection_is_not_retried(runner: Runner) -> None:
    port = runner.port
    await runner.stop()
    with pytest.raises(OSError) as info:
        async with connect(f"127.0.0.1:{port}"):
            pass
    assert not isinstance(info.value, ConnectionClosedError)


async def test_async_callbacks_are_awaited_in_order(runner: Runner, proxy: Proxy) -> None:
    seen: list[str] = []

    async def on_disconnect(err: ConnectionClosedError) -> None:
        await trio.sleep(0.05)
        seen.append(f"disconnect: {err.reason}")

    def on_reconnect(attempts: int) -> None:
        seen.append("reconnect")

    async with connect(proxy.address, on_disconnect=on_disconnect, on_reconnect=on_reconnect, reconnect_wait=0, reconnect_wait_max=0) as c:
        proxy.cut()
        await until(lambda: len(seen) == 2)
        assert seen == [f"disconnect: {CLOSED}", "reconnect"]
        await c.ping()


# -- asyncio --------------------------------------------------------------------------------


@pytest.fixture
def proc(data_dir: Path):  # type: ignore[no-untyped-def]
    p = BrokerProcess(data_dir, "--fsync", "never")
    try:
        yield p
    finally:
        if p.proc.returncode is None:  # not stopped by the test
            p.stop()


def port_of(address: str) -> str:
    return address.rsplit(":", 1)[1]


def test_asyncio_client_survives_a_broker_restart(proc: BrokerProcess, data_dir: Path) -> None:
    async def main() -> BrokerProcess:
        loop = asyncio.get_running_loop()
        events = Events()
        async with aio.connect(proc.address, **FAST, **events.options()) as c:
            await setup_topic(c)
            sub = await c.subscribe("t.>")
            await c.publish("t.x", b"before")
            assert (await sub.next(timeout=5)).payload == b"before"
            await loop.run_in_executor(None, proc.stop)  # SIGTERM: a graceful shutdown
            for _ in range(500):
                if events.kinds():
                    break
                await asyncio.sleep(0.01)
            lost = events.seen[0][1]
            assert type(lost) is ConnectionClosedError and lost.reason == GOODBYE and lost.code == P.ErrorCode.SHUTTING_DOWN
            again = await loop.run_in_executor(None, lambda: BrokerProcess(data_dir, "--fsync", "never", "--port", port_of(proc.address)))
            ack = await c.publish("t.x", b"after")
            assert ack is not None and ack.offset == 2
            assert (await sub.next(timeout=5)).payload == b"after"
            assert await stored(c) == [b"before", b"after"]
            assert c.reconnects == 1 and events.kinds() == ["disconnect", "reconnect"]
            assert (await c.stats())["subscriptions"] == 1
            return again

    again = aio.run(main())
    again.stop()


def test_asyncio_client_reports_the_goodbye_and_gives_up(proc: BrokerProcess) -> None:
    async def main() -> None:
        events = Events()
        async with aio.connect(proc.address, reconnect=False, **events.options()) as c:
            sub = await c.subscribe("t.>")
            await asyncio.get_running_loop().run_in_executor(None, proc.stop)
            with pytest.raises(ConnectionClosedError) as info:
                async for _ in sub:
                    pass
            err = info.value
            assert type(err) is ConnectionClosedError and err.reason == GOODBYE and err.code == P.ErrorCode.SHUTTING_DOWN
            assert isinstance(err.__cause__, P.ShuttingDownError)  # type: ignore[attr-defined]
            with pytest.raises(ConnectionClosedError) as later:
                await c.ping()
            assert later.value is err
            await asyncio.sleep(0.05)
            assert events.kinds() == ["disconnect", "closed"]

    aio.run(main())


def test_asyncio_client_that_gives_up_raises_from_pending_calls_and_async_for(proc: BrokerProcess) -> None:
    async def main() -> None:
        async with aio.connect(proc.address, **{**FAST, "max_reconnect_attempts": 2}) as c:
            sub = await c.subscribe("t.>")

            async def consume() -> None:
                async for _ in sub:
                    pass

            iteration = asyncio.ensure_future(consume())
            await asyncio.sleep(0.05)
            await asyncio.get_running_loop().run_in_executor(None, proc.stop)
            while c.connected:
                await asyncio.sleep(0.01)
            pending = asyncio.ensure_future(c.ping())
            results = await asyncio.gather(iteration, pending, return_exceptions=True)
            err = c.close_reason
            assert isinstance(err, ReconnectFailedError)
            assert results == [err, err]
            assert err.reason == f"gave up reconnecting after 2 attempts ({GOODBYE}; the last one failed: Connection refused)"
            assert err.code == P.ErrorCode.SHUTTING_DOWN

    aio.run(main())


def test_asyncio_requests_in_flight_fail_and_msg_id_publishes_are_sent_again(proc: BrokerProcess) -> None:
    proxy = Proxy(proc.address)

    async def main() -> None:
        async with aio.connect(proxy.address, **FAST) as c:
            await setup_topic(c)
            proxy.hold = True
            plain = asyncio.ensure_future(c.publish("t.x", b"plain"))
            with_id = asyncio.ensure_future(c.publish("t.x", b"with an id", headers={MSG_ID_HEADER: "m-1"}))
            while len(proxy.publishes()) < 2:
                await asyncio.sleep(0.005)
            proxy.cut()
            results = await asyncio.gather(plain, with_id, return_exceptions=True)
            assert type(results[0]) is ConnectionLostError and results[0].reason == f"{IN_FLIGHT} ({CLOSED})"
            assert isinstance(results[1], P.Ack) and results[1].error is None
            assert len(proxy.publishes()) == 3 and c.reconnects == 1

    try:
        aio.run(main())
    finally:
        proxy.close()


def test_asyncio_aclose_ends_iterations_normally(proc: BrokerProcess) -> None:
    async def main() -> None:
        async with aio.connect(proc.address) as c:
            sub = await c.subscribe("t.>")

            async def consume() -> str:
                async for _ in sub:
                    pass
                return "ended"

            task = asyncio.ensure_future(consume())
            await asyncio.sleep(0.05)
        assert await asyncio.wait_for(task, 5) == "ended"

    aio.run(main())
