"""The server: one nursery that owns everything the broker runs.

``serve(config, task_status=...)`` first binds the broker's port, the NATS port
(``[nats]``, ``broker.nats``) and the monitoring port (``[http]``), so that an
address in use fails at once rather than after a long recovery, and serves the
monitoring endpoints from then on (``_monitoring.py``; ``/healthz`` answers 503).
It then opens the data directory and recovers it (in a worker thread), starts the
group committer and the background tasks, accepts connections on the ports it
bound, and reports :class:`ServerHandle` through
``task_status.started`` (trio's ``serve_listeners`` idiom); ``/healthz`` answers 200
from then on. It returns only when cancelled; cancelling it is a graceful shutdown:

1. ``/healthz`` answers 503; new requests are refused with SHUTTING_DOWN and the
   listeners close;
2. one last group commit makes everything written durable, so every ack already
   queued can be sent (connections get a few seconds to drain, then GOODBYE);
3. every file is synced and closed and the data directory's lock released;
4. the monitoring port closes (it is shielded from the cancellation until then).

``run_server`` wraps it for the command line: SIGINT and SIGTERM cancel it.

Resource handling: each connection runs in its own task (``Session.run``, or
``NatsSession.run`` on the NATS port), which closes its stream when it ends; on a
TLS port (``[server] tls_cert``) that task first completes the TLS handshake
(``broker.net``; a NATS client starts TLS after the server's INFO). Both ports count
against one ``limits.max_connections``. All connections share one output
budget and one failed-handshake throttle, and a watch task cuts off slow consumers
(``broker.net``).
Files and directories are created with ``[system] file_mode`` and ``dir_mode``.

Error handling: nothing a connection does can reach the server's nursery.
``_connection`` and ``Transport.run`` catch what one connection raises (inside trio's
exception groups too), log it and count it; only cancellation passes. Accept errors
that mean "out of file descriptors or memory" are logged and retried after 100 ms
(trio does that in ``serve_listeners``); any other accept error stops the server.
The monitoring port is held to the same rule (``_http.py``): a bad request costs its
own connection only, and an accept error there stops monitoring, not the broker.
"""

from __future__ import annotations

import errno
import gc
import ipaddress
import itertools
import signal
import ssl
from dataclasses import dataclass

import trio

import storage
from protocol import ErrorCode, ProtocolConnection, PushKind, Role
from storage import sync_fds

from broker.config import Config, ConfigError
from broker.consumers import ConsumerEngine
from broker.core import Broker, Clock, get_logger
from broker.kv import KvReads
from broker.monitoring import Monitor, State, serve_http
from broker.nats import TOO_MANY_CONNECTIONS, NatsSession, open_jetstream
from broker.replication import Replication
from broker.net import DRAIN_SECONDS, GOODBYE_SECONDS, ConnectionGuard, TlsAcceptor, watch_connections

from ._dispatch import Dispatch
from ._session import Session
from ._startup import StartupError, startup_failure

__all__ = ["serve", "run_server", "ServerHandle", "Services"]

log = get_logger(__name__)


class Services:
    """The broker and what the server builds around it, one of each: the consumer
    engine and the KV reads (both register their topic hooks before the broker
    recovers), the JetStream API, the connections' guard and the binary
    protocol's command table.

    Args:
        broker: the broker, not opened yet.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.kv = KvReads(broker)
        self.consumers = ConsumerEngine(broker)
        self.jetstream = open_jetstream(broker, self.consumers, self.kv)
        #: The mirrors' and sources' copiers (``broker.replication``).
        self.replication = Replication(broker)
        self.jetstream.replication = self.replication
        self.guard = ConnectionGuard(broker.config.limits)
        self.dispatch = Dispatch(broker, self.consumers, self.kv, self.guard)


@dataclass
class ServerHandle:
    """What ``serve`` reports once it accepts connections."""

    broker: Broker
    host: str
    port: int
    #: The consumer engine, KV reads, JetStream API and connections around the broker.
    services: Services
    #: The monitoring port's address (None with ``[http] port = 0``).
    http_host: str | None = None
    http_port: int | None = None
    #: The NATS listener's address (None with ``[nats] enabled = false``).
    nats_host: str | None = None
    nats_port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def monitoring_url(self) -> str | None:
        """``http://HOST:PORT`` of the monitoring endpoints, or None."""
        if self.http_host is None:
            return None
        host = f"[{self.http_host}]" if ":" in self.http_host else self.http_host
        return f"http://{host}:{self.http_port}"

    @property
    def nats_url(self) -> str | None:
        """``nats://HOST:PORT`` of the NATS listener, or None."""
        if self.nats_host is None:
            return None
        host = f"[{self.nats_host}]" if ":" in self.nats_host else self.nats_host
        return f"nats://{host}:{self.nats_port}"


async def serve(
    config: Config,
    *,
    clock: Clock | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a broker until cancelled. See the module docstring."""
    storage.set_modes(config.system.file_mode_bits, config.system.dir_mode_bits)
    try:
        tls_context = config.server.ssl_context()  # loaded again: the files may have changed
    except ConfigError as exc:
        raise StartupError(f"invalid configuration: {exc}") from None
    services = Services(Broker(config, clock))
    monitor = Monitor(services.broker, services.consumers, services.guard, services.jetstream)
    # Both ports before the recovery: one in use fails now, not after it.
    listeners = await trio.open_tcp_listeners(config.server.port, host=config.server.host)
    http_listeners: list[trio.SocketListener] = []
    nats_listeners: list[trio.SocketListener] = []
    failed: Exception | None = None
    try:
        monitor.address = _sockname(listeners[0])
        if config.nats.enabled:
            nats_listeners = await _listen_nats(config)
            monitor.nats_address = _sockname(nats_listeners[0])
        if config.http.enabled:
            http_listeners = await _listen_http(config)
            monitor.http_address = http_host, http_port = _sockname(http_listeners[0])
        # Monitoring outlives the broker's cancellation: /healthz answers 503 until
        # the shutdown is done, then this scope ends it.
        http_scope = trio.CancelScope(shield=True)

        async def run_http(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with http_scope:
                await serve_http(http_listeners, monitor.handle, monitor.http, config.http, task_status=task_status)

        async with trio.open_nursery() as monitoring:
            if http_listeners:
                await monitoring.start(run_http)
                log.info("monitoring", host=http_host, port=http_port)
            try:
                await _run(services, monitor, listeners, nats_listeners, tls_context, task_status)
            except Exception as exc:
                failed = exc  # raised below, not inside this nursery's exception group
            finally:
                http_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for listener in (*listeners, *nats_listeners, *http_listeners):
                await listener.aclose()
    if failed is not None:
        raise failed


async def _run(
    services: Services,
    monitor: Monitor,
    listeners: list[trio.SocketListener],
    nats_listeners: list[trio.SocketListener],
    tls_context: ssl.SSLContext | None,
    task_status: trio.TaskStatus[ServerHandle],
) -> None:
    """Recover, serve the bound ``listeners`` (and ``nats_listeners``) until
    cancelled, shut down."""
    broker, guard = services.broker, services.guard
    config = broker.config
    await trio.to_thread.run_sync(broker.open)
    try:
        now = broker.clock.now_ns()
        for topic in broker.catalog.topics():  # ids that left the window while the broker was down
            topic.dedup.prune(now, topic.config.duplicate_window)
        monitor.recovered = True
        host, port = _sockname(listeners[0])
        http_host, http_port = monitor.http_address or (None, None)
        handle = ServerHandle(broker, host, port, services, http_host, http_port)
        if nats_listeners:
            handle.nats_host, handle.nats_port = _sockname(nats_listeners[0])
        broker.listeners = {"ttlbroker": handle.address}  # what the server info shows
        if handle.nats_url is not None:
            broker.listeners["nats"] = handle.nats_url
        if handle.monitoring_url is not None:
            broker.listeners["http"] = handle.monitoring_url
        ids = itertools.count(1)
        limits = config.limits
        tls = TlsAcceptor(tls_context, broker, guard) if tls_context is not None else None
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.committer.run)
            for task in broker.background_tasks():
                nursery.start_soon(task)
            nursery.start_soon(services.consumers.run)
            nursery.start_soon(services.jetstream.run)  # the JetStream API's waiting work
            nursery.start_soon(services.replication.run)  # the mirrors' and sources' copiers
            nursery.start_soon(
                watch_connections, guard.sessions, guard.budget, limits.max_pending_bytes_per_connection,
                limits.slow_consumer_seconds,
            )
            conn_nursery_holder: list[trio.Nursery] = []

            async def binary_connection(stream: trio.SocketStream) -> None:
                await _connection(services, stream, next(ids), tls)

            async def nats_connection(stream: trio.SocketStream) -> None:
                await _connection(services, stream, next(ids), tls, nats=True)

            async def accept_all(task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED) -> None:
                async with trio.open_nursery() as conns:
                    conn_nursery_holder.append(conns)
                    await trio.serve_listeners(binary_connection, listeners, handler_nursery=conns, task_status=task_status)

            async def accept_nats(task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED) -> None:
                await trio.serve_listeners(
                    nats_connection, nats_listeners, handler_nursery=conn_nursery_holder[0], task_status=task_status,
                )

            await nursery.start(accept_all)
            if nats_listeners:
                await nursery.start(accept_nats)
                log.info("listening_nats", host=handle.nats_host, port=handle.nats_port)
            log.info("listening", host=handle.host, port=handle.port, data=broker.datadir.root, fsync=str(config.system.partition.fsync),
                     tls=tls is not None, client_certificates=bool(tls is not None and config.server.tls_ca))
            open_addresses = [(handle.host, handle.port)]
            if handle.nats_host is not None and handle.nats_port is not None:
                open_addresses.append((handle.nats_host, handle.nats_port))
            _warn_if_open(broker, open_addresses)
            monitor.state = State.READY
            task_status.started(handle)
            try:
                await trio.sleep_forever()
            finally:
                monitor.state = State.SHUTTING_DOWN
                with trio.CancelScope(shield=True):
                    await _shutdown(broker, guard, [*listeners, *nats_listeners])
                nursery.cancel_scope.cancel()
    finally:
        monitor.state = State.SHUTTING_DOWN
        with trio.CancelScope(shield=True):
            await _close(broker)


def _sockname(listener: trio.SocketListener) -> tuple[str, int]:
    name = listener.socket.getsockname()
    return name[0], name[1]


async def _listen_http(config: Config) -> list[trio.SocketListener]:
    """The monitoring port's listeners; an address in use or unusable is a
    :class:`StartupError` naming what to change."""
    host, port = config.http.host, config.http.port
    try:
        return await trio.open_tcp_listeners(max(port, 0), host=host)  # ANY_PORT: the OS picks
    except OSError as exc:
        where = f"{host}:{port}" if port > 0 else f"{host} (any free port)"
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(
                f"monitoring port {where} is in use (another broker? set [http] port or --http-port; 0 turns monitoring off)"
            ) from None
        raise StartupError(f"cannot listen for monitoring on {where}: {exc.strerror or exc} (set [http] host)") from None


async def _listen_nats(config: Config) -> list[trio.SocketListener]:
    """The NATS port's listeners; an address in use or unusable is a
    :class:`StartupError` naming what to change."""
    host, port = config.nats.host or config.server.host, config.nats.port
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        where = f"{host}:{port}" if port else f"{host} (any free port)"
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(
                f"NATS port {where} is in use (a nats-server or another broker?): set [nats] port or --nats-port "
                "(0 = any free one), or turn the NATS listener off with --no-nats or [nats] enabled = false"
            ) from None
        raise StartupError(f"cannot listen for NATS clients on {where}: {exc.strerror or exc} (set [nats] host)") from None


async def _shutdown(broker: Broker, guard: ConnectionGuard, listeners: list[trio.SocketListener]) -> None:
    """Refuse new work, make it durable, send what is queued, then say GOODBYE
    (SHUTTING_DOWN) to every connection and close it.

    Connections do not see the server's cancellation (``Transport.run`` shields
    itself): they are ended here, once their GOODBYE is out (or after
    ``GOODBYE_SECONDS`` for a client that does not read), and in any case by the
    ``abort`` at the end."""
    broker.shutting_down = True
    try:
        for listener in listeners:
            await listener.aclose()
        with trio.move_on_after(DRAIN_SECONDS):
            await broker.committer.sync_now()
            for session in list(guard.sessions):
                session.kick()
                await session.drain_queued()
        sessions = list(guard.sessions)
        log.info("shutting_down", connections=len(sessions))
        for session in sessions:
            session.shut_down("the broker is shutting down")
        with trio.move_on_after(GOODBYE_SECONDS):
            for session in sessions:
                await session.wait_ended()
    finally:
        for session in list(guard.sessions):
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


async def _connection(
    services: Services, stream: trio.SocketStream, session_id: int, tls: TlsAcceptor | None = None, nats: bool = False,
) -> None:
    """One accepted connection (``nats``: on the NATS port), from accept to close.
    Never raises (but Cancelled).

    On a TLS port it first completes the TLS handshake (``broker.net.TlsAcceptor``; a NATS session
    does that itself, after its INFO). At the connection limit it takes the place
    of the connection that has waited longest for its handshake, if any
    (``broker.net``, rule 4 of its limits)."""
    broker, guard = services.broker, services.guard
    peer = "?"
    session_stream: trio.abc.Stream = stream
    try:
        peer = _peer_name(stream)
        broker.counters.connections_total += 1
        if tls is not None and not nats:
            secured = await tls.accept(stream, peer, session_id)
            if secured is None:
                return
            session_stream = secured
        limit = broker.config.limits.max_connections
        if len(guard.sessions) >= limit or broker.shutting_down:
            victim = None if broker.shutting_down else guard.evictable(trio.current_time())
            if victim is None:
                await _refuse(broker, session_stream, peer, limit, nats)
                return
            victim.evict(limit)
        if nats:
            session: Session | NatsSession = NatsSession(
                broker, services.jetstream, session_stream, session_id, peer, guard, tls,
            )
        else:
            session = Session(broker, session_stream, session_id, peer, guard, services.dispatch)
        guard.sessions.add(session.transport)
        log.debug("connection_opened", session=session_id, peer=peer)
        await session.run()
    except* Exception:
        # Transport.run catches its own; this is a bug in the lines above.
        broker.counters.connections_failed += 1
        log.error("connection_failed", exc_info=True, session=session_id, peer=peer)
    finally:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(session_stream)


async def _refuse(broker: Broker, stream: trio.abc.Stream, peer: str, limit: int, nats: bool = False) -> None:
    broker.counters.connections_refused += 1
    code = ErrorCode.SHUTTING_DOWN if broker.shutting_down else ErrorCode.TOO_MANY_CONNECTIONS
    reason = "the broker is shutting down" if broker.shutting_down else f"the broker is at its limit of {limit} connections"
    if nats:  # nats-server's refusal; at a shutdown, it just closes
        frame = b"" if broker.shutting_down else TOO_MANY_CONNECTIONS
    else:
        frame = ProtocolConnection(Role.SERVER).send_push(PushKind.GOODBYE, reason.encode(), int(code))
    with trio.move_on_after(1):
        try:
            await stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    log.warning("connection_refused", peer=peer, reason=code.name)


#: Garbage collector thresholds (CPython's defaults are 700, 10, 10). The broker keeps
#: millions of small long-lived objects (a state per subject, per topic, per
#: consumer) that hold almost no reference cycles, and a collection walks every
#: object of the generations it collects, about 0.1-0.2 us each. So a young
#: collection walks at most 20,000 new objects and a middle one the survivors of two
#: young ones (a few milliseconds each; 50,000 x 20 used to make middle collections of
#: a million objects, 130-200 ms, during a bulk publish); a full collection, which
#: walks everything not frozen after recovery, stays rare: after 100 million tracked
#: allocations at the least, and (CPython's own rule) only once the long-lived
#: objects grew by a quarter since the last one.
GC_THRESHOLD = (20_000, 2, 2_500)


async def run_server(config: Config) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully; prints
    ``listening on HOST:PORT`` on stdout once ready, then ``monitoring on
    http://HOST:PORT`` (unless ``[http] port = 0``) and ``nats on
    nats://HOST:PORT`` (unless ``[nats] enabled = false``), each on its own line.

    A failure to start that an operator can fix is raised as one
    :class:`StartupError` (``_startup.py``), outside any exception group.

    As the process's owner it also tunes the garbage collector: what recovery built
    is frozen out of every later collection, and collections run less often."""
    gc.set_threshold(*GC_THRESHOLD)
    failure: StartupError | None = None
    async with trio.open_nursery() as nursery:
        try:
            handle: ServerHandle = await nursery.start(serve, config)
        except Exception as exc:  # the broker did not start: say why in one line if we can
            failure = startup_failure(exc, config)
            if failure is None:
                raise
        if failure is not None:
            nursery.cancel_scope.cancel()  # nothing else runs in it: the nursery just closes
        else:
            gc.collect()
            gc.freeze()
            print(f"listening on {handle.address}", flush=True)
            if handle.monitoring_url is not None:
                print(f"monitoring on {handle.monitoring_url}", flush=True)
            if handle.nats_url is not None:
                print(f"nats on {handle.nats_url}", flush=True)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("signal", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break
    if failure is not None:
        raise failure


def _warn_if_open(broker: Broker, addresses: list[tuple[str, int]]) -> None:
    """Without auth, a listener other machines can reach lets anyone read, write
    and delete everything: say so at start (one warning line per such listener)."""
    if broker.auth.required:
        return
    for host, port in addresses:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            log.warning("no_auth_on_open_listener", host=host, port=port,
                        action="anyone who can reach it may read, write and delete everything: set [[auth.users]] or [server] auth_token")
