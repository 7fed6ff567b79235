"""The per-request path of a session: reads straight from the socket
(``Transport.receive``), synchronous handlers called without a coroutine, answers
sent from the reader with non-blocking writes and the rest by the writer task.

What must hold whatever path a byte takes: a connection that never stops sending
does not keep the event loop from the others, and the answers queued to send at
once leave in the order they were queued, whether the socket took them at once or
the writer sent them later.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import trio
from conftest import make_config, start_server
from test_connections import _frame, open_raw

import protocol as P
from broker.client import connect
from helpers import RawPeer, handshake_bytes


def _flood(address: str, data: bytes, answers: int, received: list[int], done: threading.Event) -> None:
    """A blocking client in a thread: handshake, send ``data`` in one go, read until
    ``answers`` frames after the handshake's have come (counted in ``received``)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(handshake_bytes())
        decoder = P.FrameDecoder()
        seen = 0

        def read() -> None:
            nonlocal seen
            decoder.feed(s.recv(1 << 20))
            while decoder.next_frame() is not None:
                seen += 1
                received[0] = seen - 1

        while seen < 1:
            read()
        sender = threading.Thread(target=s.sendall, args=(data,))
        sender.start()
        while seen < answers + 1:
            read()
        sender.join()
    done.set()


async def test_a_connection_that_never_stops_sending_does_not_keep_the_loop(tmp_path: Path) -> None:
    """A client sends 4 MiB of PINGs in one go (its bytes never run out while the
    broker reads): another connection's request is answered meanwhile, before the
    flood is."""
    n = 4 * 1024 * 1024 // 16
    flood = b"".join(_frame(P.Command.PING, i + 2) for i in range(n))
    received = [0]
    done = threading.Event()
    cfg = make_config(tmp_path, **{"limits.max_pending_bytes_per_connection": "64 MiB"})
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.ping()
        thread = threading.Thread(target=_flood, args=(h.address, flood, n, received, done), daemon=True)
        thread.start()
        with trio.fail_after(30):
            while received[0] == 0:  # the broker is answering the flood
                await trio.sleep(0.001)
            await c.ping()
            answered_meanwhile = received[0]
            while not done.is_set():
                await trio.sleep(0.01)
        thread.join()
        assert 0 < answered_meanwhile < n


async def test_answers_leave_in_order_through_the_socket_and_the_writer(tmp_path: Path) -> None:
    """A client that pipelines 3,000 requests and reads nothing until it has sent
    them all: the socket takes some answers at once, the writer sends the rest
    later; every answer comes, whole, in the order of the requests."""
    cfg = make_config(tmp_path, **{"system.partition.fsync": "never"})
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        await c.publish("t.a", b"v" * 1000)
        get_last = P.GetLast(P.Identifier.of("s"), P.Identifier.of("t"), "t.a").encode()
        publish = P.Publish.from_bodies([P.encode_body("t.b", b"p")]).encode()
        raw = RawPeer(await open_raw(h.address, rcvbuf=16 * 1024))
        await raw.handshake()
        kinds = [(P.Command.PING, b""), (P.Command.GET_LAST, get_last), (P.Command.PUBLISH, publish)]
        n = 3000
        await raw.send(b"".join(_frame(kinds[i % 3][0], 100 + i, kinds[i % 3][1]) for i in range(n)))
        got = []
        with trio.fail_after(30):
            while len(got) < n:
                ev = await raw.next_event()
                assert isinstance(ev, P.Response), ev
                got.append(ev)
        assert [e.correlation_id for e in got] == list(range(100, 100 + n))
        assert [e.code for e in got] == [kinds[i % 3][0] for i in range(n)]
        last = [e.result for e in got if e.code == P.Command.GET_LAST]
        assert all(r.messages()[0].payload == b"v" * 1000 for r in last)
        offsets = [e.result.offsets[0] for e in got if e.code == P.Command.PUBLISH]
        assert offsets == list(range(2, 2 + n // 3))
        await raw.aclose()
