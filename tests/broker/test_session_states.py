"""The connection lifecycle table (``broker.net.Transport``), in the style of h11's
``test_state.py``: every move the table has is taken, every other one refused, the
answers the code asks follow the table; then real connections of both protocols, on
a real broker, walk the paths the table allows.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sized

import pytest
import trio
import trio.testing

from conftest import make_config, start_server
from helpers import handshake_bytes

import protocol as P

from broker.net import ALLOWS, MOVES, ConnectionGuard, Phase, Transport
from broker.server import ServerHandle

EVENTS = ("handshaken", "end", "lost", "closed")
O, OPEN, C, L, X = Phase.OPENING, Phase.OPEN, Phase.CLOSING, Phase.LOST, Phase.CLOSED


class _Speaker:
    client_name = "test"
    subs: Sized = ()

    def goodbye_frame(self, code: P.ErrorCode, reason: str) -> bytes | None:
        return b"bye"

    def on_sync(self) -> None:
        pass

    def closed(self) -> None:
        pass


def _transport(server: ServerHandle) -> Transport:
    stream, _ = trio.testing.memory_stream_pair()
    guard = ConnectionGuard(server.broker.config.limits)
    return Transport(server.broker, stream, 1, "127.0.0.1:1", guard, _Speaker(), "ttlbroker")


def _answers(t: Transport) -> tuple[bool, bool, bool]:
    return (not t.closing, t.awaiting_handshake, t.writable)


def test_the_table_has_a_row_for_every_phase_and_only_moves_between_them() -> None:
    assert set(ALLOWS) == set(Phase)
    assert {p for p, _ in MOVES} | set(MOVES.values()) <= set(Phase)
    assert {e for _, e in MOVES} == set(EVENTS)
    assert not any(p is X for p, _ in MOVES), "nothing leaves CLOSED"
    # Only an opening connection waits for its handshake; only a live one handles
    # requests; nothing that cannot write is live.
    assert [p for p in Phase if ALLOWS[p][1]] == [O]
    assert [p for p in Phase if ALLOWS[p][0]] == [O, OPEN]
    assert all(ALLOWS[p][2] for p in Phase if ALLOWS[p][0])


def _reachable(start: Phase) -> set[Phase]:
    """Every phase some path of moves leads to from ``start`` (itself included)."""
    seen, todo = {start}, [start]
    while todo:
        p = todo.pop()
        for (q, _), r in MOVES.items():
            if q is p and r not in seen:
                seen.add(r)
                todo.append(r)
    return seen


def test_every_phase_is_reachable_from_opening_and_ends_closed() -> None:
    assert _reachable(O) == set(Phase)
    for p in Phase:  # from anywhere, some path ends in CLOSED
        assert X in _reachable(p), p


async def test_each_move_goes_where_the_table_says_or_is_refused(server: ServerHandle) -> None:
    """Every path of up to four events from OPENING, on a real Transport: each step
    either lands where MOVES says (and the answers are ALLOWS' row), or, where the
    table has no move, raises and leaves the transport as it was."""
    for path in itertools.chain.from_iterable(itertools.product(EVENTS, repeat=n) for n in range(1, 5)):
        t = _transport(server)
        assert t.phase is O and _answers(t) == ALLOWS[O]
        for event in path:
            before = t.phase
            expected = MOVES.get((before, event))
            if expected is None:
                with pytest.raises(RuntimeError, match=f"a {before.value} connection cannot take '{event}'"):
                    t._move(event)
                assert t.phase is before and _answers(t) == ALLOWS[before]
                break
            t._move(event)
            assert t.phase is expected, (path, event)
            assert _answers(t) == ALLOWS[expected]


async def test_the_first_reason_an_ending_gives_is_kept(server: ServerHandle) -> None:
    t = _transport(server)
    t.end_as("slow_consumer")
    t.end_as("closed")
    t.lost()
    assert (t.phase, t.reason) == (L, "slow_consumer")
    t = _transport(server)
    t.lost()
    assert (t.phase, t.reason) == (L, "connection_lost")


# -- real connections ------------------------------------------------------------------


async def _only_transport(server: ServerHandle, before: set[Transport]) -> Transport:
    for _ in range(1000):
        new = server.services.guard.sessions - before
        if new:
            (t,) = new
            return t
        await trio.sleep(0.001)
    raise AssertionError("no new connection")


async def test_a_binary_connection_opens_on_its_handshake_and_closes_with_its_client(server: ServerHandle) -> None:
    guard = server.services.guard
    before = set(guard.sessions)
    stream = await trio.open_tcp_stream(server.host, server.port)
    t = await _only_transport(server, before)
    assert t.phase is O and t in guard.waiting
    await stream.send_all(handshake_bytes())
    assert await stream.receive_some(4096)  # the handshake's answer
    assert t.phase is OPEN and t not in guard.waiting
    await stream.aclose()
    await t.wait_ended()
    assert (t.phase, t.reason) == (X, "closed") and t not in guard.sessions


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (P.encode_frame(P.Command.PING, 0, 1, 0, b""), "request_before_handshake"),
        (b"\x00" * 16, "protocol_error"),
        (b"\x16\x03\x01\x00\x05hello", "tls_on_plain_port"),
    ],
)
async def test_a_binary_connection_that_never_opens_goes_from_opening_to_closed(
    server: ServerHandle, first: bytes, reason: str,
) -> None:
    before = set(server.services.guard.sessions)
    stream = await trio.open_tcp_stream(server.host, server.port)
    t = await _only_transport(server, before)
    await stream.send_all(first)
    await t.wait_ended()
    assert (t.phase, t.reason) == (X, reason)
    await stream.aclose()


async def test_no_handshake_in_time_ends_as_a_handshake_timeout(autojump_clock: trio.testing.MockClock, tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with start_server(make_config(tmp_path / "d")) as server:
        before = set(server.services.guard.sessions)
        stream = await trio.open_tcp_stream(server.host, server.port)
        t = await _only_transport(server, before)
        await t.wait_ended()
        assert (t.phase, t.reason) == (X, "handshake_timeout")
        await stream.aclose()


async def test_a_nats_connection_opens_on_connect_and_a_shutdown_closes_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with start_server(make_config(tmp_path / "d", **{"nats.enabled": True})) as server:
        before = set(server.services.guard.sessions)
        assert server.nats_port is not None
        stream = await trio.open_tcp_stream("127.0.0.1", server.nats_port)
        t = await _only_transport(server, before)
        assert t.protocol == "nats"
        info = await stream.receive_some(4096)
        assert info.startswith(b"INFO ") and t.phase is O
        await stream.send_all(b"CONNECT " + json.dumps({"verbose": False}).encode() + b"\r\nPING\r\n")
        assert (await stream.receive_some(4096)).endswith(b"PONG\r\n")
        assert t.phase is OPEN
        t.shut_down("the broker is shutting down")
        assert t.phase is C and t.closing
        assert await stream.receive_some(4096) == b""  # nats-server just closes
        await t.wait_ended()
        assert (t.phase, t.reason) == (X, "shutdown")
        await stream.aclose()
