"""A request's timeout on the client's fast path (``Client._call``): the waiter times
out by itself (on asyncio it shares its timer with every request due in the same
step), leaves nothing behind, and a request that went back to waiting for a
reconnection keeps to what is left of its timeout, saying the client's timeout.

Both flavours, through the fault-injecting proxy of ``test_reconnect.py`` (which
swallows requests so that no answer ever comes).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import trio
from test_reconnect import CLOSED, FAST, Proxy, Runner, proxy, runner, setup_topic, until  # noqa: F401 (fixtures)

from broker.client import MSG_ID_HEADER, Client, aio, connect
from helpers import in_asyncio


def _due_waiters(c: Client) -> int:
    """Waiters still in the asyncio backend's deadline sets."""
    deadlines = c._backend._deadlines  # type: ignore[attr-defined]
    return 0 if deadlines is None else sum(len(s) for s in deadlines._due.values())


async def test_a_request_with_no_answer_times_out_and_leaves_nothing_pending(runner: Runner, proxy: Proxy) -> None:
    async with connect(proxy.address, timeout=0.3, **FAST) as c:
        await setup_topic(c)
        proxy.swallow = True
        t = trio.current_time()
        with pytest.raises(TimeoutError) as info:
            await c.publish("t.x", b"lost")
        assert str(info.value) == "no answer within 0.3 s"
        assert trio.current_time() - t >= 0.3
        assert c._conn is not None and c._conn.pending == {}
        proxy.swallow = False
        assert (await c.publish("t.x", b"next")).offset == 1  # type: ignore[union-attr]


async def test_a_request_back_to_waiting_for_a_reconnection_keeps_to_its_timeout(runner: Runner, proxy: Proxy) -> None:
    """In flight at the drop, sent again once reconnected (it has a Nats-Msg-Id), but
    the broker stays away: the call ends at its deadline, not a timeout later."""
    async with connect(proxy.address, timeout=0.5, **FAST) as c:
        await setup_topic(c)
        proxy.swallow = True
        errors: list[BaseException] = []
        took: list[float] = []

        async def publish() -> None:
            t = time.monotonic()
            try:
                await c.publish("t.x", b"x", headers={MSG_ID_HEADER: "m-1"})
            except TimeoutError as exc:
                errors.append(exc)
            took.append(time.monotonic() - t)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish)
            await until(lambda: c._conn is not None and bool(c._conn.pending))
            proxy.refuse = True
            proxy.cut()
        assert [str(e) for e in errors] == [
            f"no answer within 0.5 s: the connection is down ({CLOSED}) and the client is still reconnecting"
        ]
        assert 0.5 <= took[0] < 0.95  # not a second timeout after the first


async def test_asyncio_requests_time_out_together_and_cancelled_ones_leave_nothing(runner: Runner, proxy: Proxy) -> None:
    """A thousand requests due in the same step time out together; cancelled ones
    leave the deadline sets at once; none stays in ``pending``."""

    async def main() -> None:
        async with aio.connect(proxy.address, timeout=0.4, **FAST) as c:
            await setup_topic(c)
            proxy.swallow = True
            tasks = [asyncio.ensure_future(c.publish("t.x", b"x")) for _ in range(1000)]
            cancelled = [asyncio.ensure_future(c.publish("t.x", b"y")) for _ in range(10)]
            await asyncio.sleep(0.05)
            assert _due_waiters(c) == 1010
            for task in cancelled:
                task.cancel()
            await asyncio.gather(*cancelled, return_exceptions=True)
            assert _due_waiters(c) == 1000
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert {str(r) for r in results} == {"no answer within 0.4 s"}
            assert all(type(r) is TimeoutError for r in results)
            assert _due_waiters(c) == 0 and c._conn is not None and c._conn.pending == {}
            proxy.swallow = False
            ack = await c.publish("t.x", b"after")
            assert ack is not None and ack.offset == 1
            assert _due_waiters(c) == 0

    await in_asyncio(main)


async def test_asyncio_publishes_cancelled_with_their_frames_queued_leave_the_rest_whole(runner: Runner, proxy: Proxy) -> None:
    """Publishes made in one loop turn share one write; cancelling some of them
    after their frames are queued (before that write) takes nothing out of it: every
    frame goes whole, the broker stores all, the others get their own acks in order,
    and the cancelled ones leave nothing in ``pending`` or the deadline sets."""

    async def main() -> None:
        async with aio.connect(proxy.address, timeout=5, **FAST) as c:
            await setup_topic(c)
            link = c._conn.link  # type: ignore[union-attr]
            tasks = [asyncio.ensure_future(c.publish("t.x", b"%d" % i)) for i in range(40)]
            await asyncio.sleep(0)  # their first steps ran: 40 frames queued, not yet written
            assert len(link._out) == 40 % aio_flush_frames()  # (every FLUSH_FRAMES went at once)
            cancelled = tasks[5:35:3]
            for task in cancelled:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            kept = [r for t, r in zip(tasks, results) if t not in cancelled]
            assert all(isinstance(r, asyncio.CancelledError) for t, r in zip(tasks, results) if t in cancelled)
            assert [a.offset for a in kept] == sorted(a.offset for a in kept)  # type: ignore[union-attr]
            assert c._conn is not None and c._conn.pending == {} and _due_waiters(c) == 0
            after = await c.publish("t.x", b"after")
            assert after is not None and after.offset == 41  # the 40 were all stored
            f = await c.fetch("s", "t", 0, 1, 100)
            assert [m.payload for m in f.messages] == [b"%d" % i for i in range(40)] + [b"after"]

    await in_asyncio(main)


def aio_flush_frames() -> int:
    from broker.client import _backend

    return _backend.FLUSH_FRAMES


async def test_asyncio_requests_of_one_turn_share_a_deadline_and_a_zero_timeout_still_fires(runner: Runner, proxy: Proxy) -> None:
    """The deadline worked out once per loop turn (``_Deadlines.set_at``) is each
    request's own: requests of one turn share one set, a later turn's requests get a
    later one, and a waiter with a timeout of 0 is never handed a set that already fired."""

    async def main() -> None:
        async with aio.connect(proxy.address, timeout=0.4, **FAST) as c:
            await setup_topic(c)
            backend = c._backend
            first = [backend.waiter(0.4) for _ in range(3)]  # type: ignore[attr-defined]
            assert len({id(w._due) for w in first}) == 1 and len({w.deadline for w in first}) == 1
            await asyncio.sleep(0.05)
            later = backend.waiter(0.4)  # type: ignore[attr-defined]
            assert later.deadline > first[0].deadline and later._due is not first[0]._due
            for _ in range(2):
                zero = backend.waiter(0)  # type: ignore[attr-defined]
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(zero.wait(), 1)
            for w in [*first, later]:
                w.cancel()
            assert _due_waiters(c) == 0

    await in_asyncio(main)
