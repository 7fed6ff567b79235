"""The server: one nursery that owns everything the broker runs.

``serve(config, task_status=...)`` opens the data directory and recovers it (in a
worker thread), listens, starts the group committer and the background tasks, and
reports :class:`ServerHandle` through ``task_status.started`` once it accepts
connections (trio's ``serve_listeners`` idiom). It returns only when cancelled;
cancelling it is a graceful shutdown:

1. new requests are refused with SHUTTING_DOWN and the listeners close;
2. one last group commit makes everything written durable, so every ack already
   queued can be sent (connections get a few seconds to drain, then GOODBYE);
3. every file is synced and closed and the data directory's lock released.

``run_server`` wraps it for the command line: SIGINT and SIGTERM cancel it.

Resource handling: each connection runs in its own task (``Session.run``), which
closes its stream when it ends. All connections share one output budget and one
failed-handshake throttle, and a watch task cuts off slow consumers (``_limits.py``).
Files and directories are created with ``[system] file_mode`` and ``dir_mode``.

Error handling: nothing a connection does can reach the server's nursery.
``_connection`` and ``Session.run`` catch what one connection raises (inside trio's
exception groups too), log it and count it; only cancellation passes. Accept errors
that mean "out of file descriptors or memory" are logged and retried after 100 ms
(trio does that in ``serve_listeners``); any other accept error stops the server.
"""

from __future__ import annotations

import gc
import itertools
import signal
from dataclasses import dataclass

import trio

import storage
from protocol import ErrorCode, ProtocolConnection, PushKind, Role
from storage import sync_fds

from ._broker import Broker
from ._clock import Clock
from ._limits import ConnectionGuard, watch_connections
from ._log import get_logger
from ._session import DRAIN_SECONDS, GOODBYE_SECONDS, Session
from .config import Config

__all__ = ["serve", "run_server", "ServerHandle"]

log = get_logger(__name__)


@dataclass
class ServerHandle:
    """What ``serve`` reports once it accepts connections."""

    broker: Broker
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


async def serve(
    config: Config,
    *,
    clock: Clock | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a broker until cancelled. See the module docstring."""
    storage.set_modes(config.system.file_mode_bits, config.system.dir_mode_bits)
    broker = Broker(config, clock)
    await trio.to_thread.run_sync(broker.open)
    now = broker.clock.now_ns()
    for topic in broker.catalog.topics():  # ids that left the window while the broker was down
        topic.dedup.prune(now, topic.config.duplicate_window)
    try:
        listeners = await trio.open_tcp_listeners(config.server.port, host=config.server.host)
    except BaseException:
        broker.close()
        raise
    sockname = listeners[0].socket.getsockname()
    handle = ServerHandle(broker, sockname[0], sockname[1])
    ids = itertools.count(1)
    limits = config.limits
    guard = ConnectionGuard(limits)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.committer.run)
            for task in broker.background_tasks():
                nursery.start_soon(task)
            nursery.start_soon(
                watch_connections, broker.sessions, guard.budget, limits.max_pending_bytes_per_connection,
                limits.slow_consumer_seconds,
            )
            conn_nursery_holder: list[trio.Nursery] = []

            async def accept_all(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                async with trio.open_nursery() as conns:
                    conn_nursery_holder.append(conns)
                    await trio.serve_listeners(
                        lambda stream: _connection(broker, guard, stream, next(ids)), listeners,
                        handler_nursery=conns, task_status=task_status,
                    )

            await nursery.start(accept_all)
            log.info("listening", host=handle.host, port=handle.port, data=broker.datadir.root, fsync=str(config.system.partition.fsync))
            task_status.started(handle)
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await _shutdown(broker, listeners)
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await _close(broker)


async def _shutdown(broker: Broker, listeners: list[trio.SocketListener]) -> None:
    """Refuse new work, make it durable, send what is queued, then say GOODBYE
    (SHUTTING_DOWN) to every connection and close it.

    Connections do not see the server's cancellation (``Session.run`` shields
    itself): they are ended here, once their GOODBYE is out (or after
    ``GOODBYE_SECONDS`` for a client that does not read), and in any case by the
    ``abort`` at the end."""
    broker.shutting_down = True
    try:
        for listener in listeners:
            await listener.aclose()
        with trio.move_on_after(DRAIN_SECONDS):
            await broker.committer.sync_now()
            for session in list(broker.sessions):
                session.kick()
                await session.drain_queued()
        sessions = list(broker.sessions)
        log.info("shutting_down", connections=len(sessions))
        for session in sessions:
            session.shut_down("the broker is shutting down")
        with trio.move_on_after(GOODBYE_SECONDS):
            for session in sessions:
                await session.wait_ended()
    finally:
        for session in list(broker.sessions):
            session.abort()


async def _close(broker: Broker) -> None:
    fds: list[int] = []
    for src in broker.all_sync_sources():
        fds.extend(src.take_dirty_fds())
    try:
        await trio.to_thread.run_sync(sync_fds, fds)
    finally:
        broker.close()
    log.info("stopped")


def _peer_name(stream: trio.SocketStream) -> str:
    try:
        addr = stream.socket.getpeername()
    except OSError:  # already reset by the peer
        return "?"
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(addr) or "?"


async def _connection(broker: Broker, guard: ConnectionGuard, stream: trio.SocketStream, session_id: int) -> None:
    """One accepted connection, from accept to close. Never raises (but Cancelled).

    At the connection limit it takes the place of the connection that has waited
    longest for its handshake, if any (``_limits.py``, rule 4)."""
    peer = "?"
    try:
        peer = _peer_name(stream)
        broker.counters.connections_total += 1
        limit = broker.config.limits.max_connections
        if len(broker.sessions) >= limit or broker.shutting_down:
            victim = None if broker.shutting_down else guard.evictable(trio.current_time())
            if victim is None:
                await _refuse(broker, stream, peer, limit)
                return
            victim.evict(limit)
        session = Session(broker, stream, session_id, peer, guard)
        broker.sessions.add(session)
        log.debug("connection_opened", session=session_id, peer=peer)
        await session.run()
    except* Exception:
        # Session.run catches its own; this is a bug in the lines above.
        broker.counters.connections_failed += 1
        log.error("connection_failed", exc_info=True, session=session_id, peer=peer)
    finally:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)


async def _refuse(broker: Broker, stream: trio.SocketStream, peer: str, limit: int) -> None:
    broker.counters.connections_refused += 1
    code = ErrorCode.SHUTTING_DOWN if broker.shutting_down else ErrorCode.TOO_MANY_CONNECTIONS
    reason = "the broker is shutting down" if broker.shutting_down else f"the broker is at its limit of {limit} connections"
    frame = ProtocolConnection(Role.SERVER).send_push(PushKind.GOODBYE, reason.encode(), int(code))
    with trio.move_on_after(1):
        try:
            await stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    log.warning("connection_refused", peer=peer, reason=code.name)


#: Allocations between young collections (CPython's default is 700). The broker keeps
#: millions of small long-lived objects (subject states, index entries); collecting
#: them often costs pauses of hundreds of milliseconds that delay expiry and acks,
#: and they hold almost no reference cycles.
GC_THRESHOLD = (50_000, 20, 100)


async def run_server(config: Config) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully; prints
    ``listening on HOST:PORT`` on stdout once ready.

    As the process's owner it also tunes the garbage collector: what recovery built
    is frozen out of every later collection, and collections run less often."""
    gc.set_threshold(*GC_THRESHOLD)
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(serve, config)
        gc.collect()
        gc.freeze()
        print(f"listening on {handle.address}", flush=True)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("signal", signal=signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break

