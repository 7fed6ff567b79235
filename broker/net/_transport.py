"""One client connection's transport, whatever protocol it speaks: the stream, the
output queues, the writer task, the lifecycle, and the ending.

The binary session (``broker.server``) and the NATS session (``broker.nats``) each
*have* a :class:`Transport`; neither inherits from the other. A session reads with
:meth:`Transport.receive`, queues frames with :meth:`Transport.send_now` and
:meth:`Transport.send_durable`, and says what happened (:meth:`Transport.opened`,
:meth:`Transport.end_as`); the transport never parses a byte. What it needs of its
session is in :class:`Speaker`: the frame that says goodbye in that protocol, what
to release when the connection ends, and its name and subscriptions for log lines.

Rules of this file (after h11's ``_state.py``):

1. A connection's lifecycle is one :class:`Phase`, and every move between phases is
   in :data:`MOVES`. :meth:`Transport._move` is the only code that changes the
   phase; it refuses a move the table does not have, and sets the answers the rest
   of the code asks (:attr:`Transport.closing`, :attr:`Transport.awaiting_handshake`,
   :attr:`Transport.writable`) from the table :data:`ALLOWS`. Nothing else
   compares phases.
2. What the reader task is doing is one :class:`Reading`; each value says whether
   the reader sends what is queued itself and whether an ending may cancel it.
3. Whatever the peer does, only this connection ends: :meth:`run` catches,
   inside trio's exception groups, everything the connection's tasks raise except
   ``trio.Cancelled`` and non-``Exception`` errors.

Queues. Frames go into one of two queues: *now* (sent as soon as a writer runs)
and *durable* (sent once the group commit has made the epoch they wait for
durable; the commit calls the speaker's ``on_sync``). Whatever sends them, in
writes of up to :data:`WRITE_CHUNK` bytes of whole frames, is the reader at the
end of a read (:meth:`send_nowait`, then :meth:`write_queued`), or the writer task
(:meth:`_writer`) for what other tasks queue. Only one of them writes at a time.

Memory: every queued byte is counted in ``pending_bytes`` and in the broker-wide
``OutputBudget`` until it is sent (``_limits.py`` has the rules).
"""

from __future__ import annotations

import enum
import math
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sized
from typing import Protocol

import trio

from broker.core import Broker, get_logger
from protocol import BrokerError, ErrorCode

from ._limits import RECEIVE_SIZE, ConnectionGuard

__all__ = [
    "ALLOWS",
    "DRAIN_SECONDS",
    "GOODBYE_SECONDS",
    "MOVES",
    "SHORT_READ",
    "WRITE_CHUNK",
    "Phase",
    "Reading",
    "Speaker",
    "Transport",
]

log = get_logger(__name__)

#: How long a closing connection may take to send what is still queued.
DRAIN_SECONDS = 5.0
#: How long a connection the broker closes (GOODBYE) gets to take its last frames.
GOODBYE_SECONDS = 2.0
#: Bytes of whole frames joined into one write (a larger single frame goes alone).
WRITE_CHUNK = 1024 * 1024
#: A read shorter than this held one request or a few: when their answers wait for
#: a sync, the client is waiting for them (``Committer.sync_if_idle``).
SHORT_READ = 4096
#: What a connection reads at a time before its handshake (a handshake is small).
OPENING_RECEIVE_SIZE = 4096


class Phase(enum.Enum):
    """Where a connection is in its life (rule 1)."""

    #: Accepted; its handshake (binary HANDSHAKE, NATS CONNECT) has not come yet.
    OPENING = "opening"
    #: Handshaken: requests and deliveries flow.
    OPEN = "open"
    #: Ending: it handles no more requests and takes no deliveries; it still sends
    #: what it holds (a GOODBYE last), for a little while.
    CLOSING = "closing"
    #: The stream broke, or a write was cut half-way: nothing more can be sent.
    LOST = "lost"
    #: :meth:`Transport.run` has closed the stream.
    CLOSED = "closed"


_O, _P, _C, _L, _X = Phase.OPENING, Phase.OPEN, Phase.CLOSING, Phase.LOST, Phase.CLOSED

#: Every move a connection can make: (phase, what happened) -> the next phase. An
#: ending that comes after another keeps the connection where it is (the first
#: reason given is the one kept).
MOVES: dict[tuple[Phase, str], Phase] = {
    (_O, "handshaken"): _P,
    (_O, "end"): _C, (_P, "end"): _C, (_C, "end"): _C, (_L, "end"): _L,
    (_O, "lost"): _L, (_P, "lost"): _L, (_C, "lost"): _L, (_L, "lost"): _L,
    (_C, "closed"): _X, (_L, "closed"): _X,
}

#: What each phase allows: (handles requests and takes deliveries, still waits for
#: its handshake, may write).
ALLOWS: dict[Phase, tuple[bool, bool, bool]] = {
    _O: (True, True, True),
    _P: (True, False, True),
    _C: (False, False, True),
    _L: (False, False, False),
    _X: (False, False, False),
}


class Reading(enum.Enum):
    """What the reader task is doing (rule 2). Each value carries: whether the
    reader sends what is queued meanwhile itself (the writer task is not woken for
    it), whether a cut-off (slow consumer, eviction) may cancel it, and whether a
    graceful shutdown may (it must not cut a frame in half)."""

    #: Waiting for bytes, or for room in the output limits.
    RECEIVING = ("receiving", False, True, True)
    #: Handling the requests of one read (synchronously, or between awaits).
    HANDLING = ("handling", True, True, True)
    #: Awaiting an asynchronous handler (an admin change half-way through must not
    #: be interrupted: the reader stops after it).
    IN_HANDLER = ("in_handler", True, False, False)
    #: Writing the answers of a read.
    WRITING = ("writing", False, True, False)

    def __init__(self, label: str, flushes: bool, cut_may_cancel: bool, shutdown_may_cancel: bool) -> None:
        self.label = label
        self.flushes = flushes
        self.cut_may_cancel = cut_may_cancel
        self.shutdown_may_cancel = shutdown_may_cancel


#: How each end of a connection is counted: reason -> counts as connections_failed
#: (a reason not here counts as failed: a NATS ``stale_connection``, ``tls_failed``).
FAILED: dict[str, bool] = {
    "closed": False,
    "shutdown": False,
    "slow_consumer": False,
    "evicted": False,
    "handshake_timeout": False,
    "unauthorized": False,
    "connection_lost": True,
    "closed_mid_frame": True,
    "protocol_error": True,
    "request_before_handshake": True,
    "handshake_refused": True,
    "tls_on_plain_port": False,  # counted in tls_handshake_failures
    "task_failed": True,
}


class Speaker(Protocol):
    """What a transport needs of the session that speaks over it."""

    @property
    def client_name(self) -> str: ...

    @property
    def subs(self) -> Sized:
        """Its subscriptions (counted in log lines)."""
        ...

    def goodbye_frame(self, code: ErrorCode, reason: str) -> bytes | None:
        """The frame that ends the connection with ``code`` in this protocol (None:
        none, the connection just closes)."""
        ...

    def on_sync(self) -> None:
        """The group commit made some of the queued answers durable (the transport's
        :meth:`Transport.on_sync` sends them; a session may order them first)."""
        ...

    def closed(self) -> None:
        """The connection ended: release what it held in the broker."""
        ...


class Transport:
    """See the module docstring. ``protocol`` names what the speaker speaks
    (``"ttlbroker"`` or ``"nats"``, as ``net.Connection`` has it).

    It is one class of more than the usual size on purpose: every method works on
    the same connection's phase, queues and socket, and the per-frame calls
    (``send_now``, ``send_nowait``, ``receive``) must not go through a second
    object. It reads in sections: the lifecycle, the endings, the queues, the
    tasks, reading, writing."""

    def __init__(
        self, broker: Broker, stream: trio.abc.Stream, session_id: int, peer: str, guard: ConnectionGuard,
        speaker: Speaker, protocol: str,
    ) -> None:
        limits = broker.config.limits
        self.broker = broker
        self.stream = stream
        self.speaker = speaker
        self.protocol = protocol
        #: The stream's socket, for reads and writes that need not wait (None over
        #: TLS): a second object on the same descriptor, made and detached by
        #: :meth:`run`, used only while ``self.stream`` is still ``_sock_stream`` (a
        #: NATS client may start TLS on it later).
        self._sock: socket.socket | None = None
        self._sock_stream: trio.abc.Stream | None = None
        self.id = session_id
        self.peer = peer
        #: When it was accepted (Unix time: the monitoring's ``/connz`` shows it).
        self.opened_at = time.time()
        self.peer_host = peer.rsplit(":", 1)[0]
        self.guard = guard
        self.budget = guard.budget
        guard.waiting[self] = trio.current_time()  # until its handshake
        self.phase = Phase.OPENING
        #: The answers of :data:`ALLOWS` for the phase (set by :meth:`_move` only).
        live, self.awaiting_handshake, self.writable = ALLOWS[Phase.OPENING]
        self.closing = not live
        self.reading = Reading.RECEIVING
        self._now: deque[bytes] = deque()
        self.now_bytes = 0
        self._durable: deque[tuple[int, bytes]] = deque()
        #: Bytes queued or being written (the in-flight write included).
        self.pending_bytes = 0
        #: Bytes written since the connection opened.
        self.sent_bytes = 0
        #: When pending_bytes went over the limit (the watch in _limits.py sets it).
        self.over_limit_since: float | None = None
        self.limit = limits.max_pending_bytes_per_connection
        self._wake = trio.Event()
        self._drained = trio.Event()
        #: A task is writing (the reader or the writer: one at a time).
        self._sending = False
        self._write_started: float | None = None
        self.reason: str | None = None
        self.drain_seconds = DRAIN_SECONDS
        self._read_scope: trio.CancelScope | None = None
        self._task_scope: trio.CancelScope | None = None
        #: Shields the connection from the server's cancellation, so that a shutdown
        #: can say GOODBYE first; :meth:`abort` cancels it (before :meth:`run` too).
        self._shield = trio.CancelScope(shield=True)
        self._ended = trio.Event()
        #: Bytes :meth:`receive` read since its last checkpoint.
        self.unchecked_bytes = 0

    # -- the lifecycle -----------------------------------------------------------------

    def _move(self, event: str) -> None:
        """Take the move of :data:`MOVES` for ``event`` (rule 1)."""
        try:
            phase = MOVES[(self.phase, event)]
        except KeyError:
            raise RuntimeError(f"a {self.phase.value} connection cannot take {event!r}") from None
        self.phase = phase
        live, self.awaiting_handshake, self.writable = ALLOWS[phase]
        self.closing = not live

    def opened(self) -> None:
        """The handshake succeeded: no longer a candidate for eviction, no deadline."""
        self._move("handshaken")
        self.guard.waiting.pop(self, None)
        if self._read_scope is not None:
            self._read_scope.deadline = math.inf

    def end_as(self, reason: str) -> None:
        """The connection is ending; the first reason given is the one kept."""
        self._move("end")
        self.guard.waiting.pop(self, None)  # no longer a candidate for eviction
        if self.reason is None:
            self.reason = reason

    def lost(self) -> None:
        """The stream broke (reset, broken pipe): end now, nothing more can be sent."""
        if self.reason is None:
            self.reason = "connection_lost"
        self._move("lost")
        self.guard.waiting.pop(self, None)
        if self._task_scope is not None:
            self._task_scope.cancel()

    def stop_reading(self) -> None:
        """Cut the reader off now, unless it is in an asynchronous handler (it stops
        after it, seeing ``closing``)."""
        if self._read_scope is not None and self.reading.cut_may_cancel:
            self._read_scope.cancel()

    def goodbye(self, code: ErrorCode, reason: str) -> None:
        """Queue the speaker's last frame (whatever the limits), and wake the writer
        for it."""
        frame = self.speaker.goodbye_frame(code, reason)
        if frame is not None:
            self.send_now(frame)
            self.kick()

    def fail(self, frame: bytes, reason: str) -> None:
        """Queue ``frame`` (an error) as the last frame, and end."""
        self.send_now(frame)
        self.end_as(reason)
        self.drain_seconds = GOODBYE_SECONDS

    def cut_off(self, reason: str, rule: str) -> None:
        """Close a slow consumer: drop what it has queued (freeing the budget at once),
        say goodbye with SLOW_CONSUMER, and stop reading its requests."""
        if self.closing:
            return  # ending anyway, within GOODBYE_SECONDS or DRAIN_SECONDS
        self.broker.counters.slow_consumers += 1
        log.warning(
            "slow_consumer", session=self.id, peer=self.peer, client=self.speaker.client_name, rule=rule,
            pending_bytes=self.pending_bytes, subscriptions=len(self.speaker.subs),
        )
        self.end_as("slow_consumer")
        dropped = self.now_bytes + sum(len(f) for _, f in self._durable)
        self._now.clear()
        self._durable.clear()
        self.now_bytes = 0
        self.pending_bytes -= dropped
        self.budget.sent(dropped)
        self.goodbye(ErrorCode.SLOW_CONSUMER, reason)
        self.drain_seconds = GOODBYE_SECONDS
        self.stop_reading()

    def evict(self, limit: int) -> None:
        """Make room for a new connection: this one, still without a handshake, is
        told TOO_MANY_CONNECTIONS and closed."""
        if self.closing:
            return
        self.broker.counters.connections_refused += 1
        log.warning("connection_refused", session=self.id, peer=self.peer, reason="evicted_without_handshake")
        self.end_as("evicted")
        self.goodbye(
            ErrorCode.TOO_MANY_CONNECTIONS,
            f"the broker is at its limit of {limit} connections and this one has not handshaken",
        )
        self.drain_seconds = GOODBYE_SECONDS
        self.stop_reading()

    def shut_down(self, reason: str) -> None:
        """The broker is shutting down: say goodbye with SHUTTING_DOWN (after every
        answer already durable; one whose fsync has not happened is dropped, its
        request may or may not have been carried out) and stop reading. The
        connection then sends what it holds, waits a little for the client to close
        (so the goodbye is not lost to a reset), and ends."""
        if self.closing:
            return  # ending anyway, with its own goodbye or none
        self.end_as("shutdown")
        synced = self.broker.committer.synced
        dropped = 0
        while self._durable:
            epoch, frame = self._durable.popleft()
            if epoch <= synced:
                self._now.append(frame)
                self.now_bytes += len(frame)
            else:
                dropped += len(frame)
        self.pending_bytes -= dropped
        self.budget.sent(dropped)
        self.goodbye(ErrorCode.SHUTTING_DOWN, reason)
        self.drain_seconds = GOODBYE_SECONDS
        # A reader in a handler or in the middle of a write sees ``closing`` when it
        # gets back to its loop; a cancel could cut a frame in half.
        if self._read_scope is not None and self.reading.shutdown_may_cancel:
            self._read_scope.cancel()

    def abort(self) -> None:
        """End the connection now, whatever it is doing (the end of a shutdown)."""
        self._shield.cancel()

    async def wait_ended(self) -> None:
        """Wait until :meth:`run` has closed the connection."""
        await self._ended.wait()

    def write_stalled_since(self, now: float) -> float:
        """Seconds the current write has been waiting for the peer (0 if none)."""
        started = self._write_started
        return 0.0 if started is None else now - started

    async def refuse(self, err: BrokerError, frame: bytes) -> None:
        """A failed handshake: count it, log it (at most one line per host per 10 s,
        saying how many lines of that host were left out since its last), and after
        the failure throttle's delay send ``frame`` (the refusal) and end."""
        counters = self.broker.counters
        counters.request_errors += 1
        if err.code == ErrorCode.UNAUTHORIZED:
            counters.auth_failures += 1
            self.end_as("unauthorized")
        else:
            self.end_as("handshake_refused")
        now = trio.current_time()
        delay = self.guard.throttle.failure(self.peer_host, now)
        suppressed = self.guard.log_limit.allow(self.peer_host, now)  # a guesser must not flood the log
        if suppressed is not None:
            log.warning(
                "handshake_failed", session=self.id, peer=self.peer, code=err.code.name, error=err.message,
                delay_seconds=round(delay, 3), suppressed=suppressed,
            )
        if self._read_scope is not None:
            self._read_scope.deadline = math.inf  # the delay is ours, not a timeout
        await trio.sleep(delay)
        self.send_now(frame)
        self.drain_seconds = GOODBYE_SECONDS

    # -- the queues --------------------------------------------------------------------

    def kick(self) -> None:
        """Wake the writer task."""
        if not self._wake.is_set():
            self._wake.set()

    def send_now(self, frame: bytes) -> None:
        """Queue ``frame`` to go as soon as a writer runs (never dropped)."""
        n = len(frame)
        self._now.append(frame)
        self.now_bytes += n
        self.pending_bytes += n
        self.budget.add(n)
        if not self.reading.flushes:  # else the reader sends what it queues itself
            self.kick()

    def send_direct(self, frame: bytes) -> None:
        """:meth:`send_now`, written at once with a non-blocking send when this
        connection's reader is not handling a read (which sends what it queues
        itself) and nothing is queued before it: no task switch to the writer, which
        is woken only for what the socket does not take. For a batch of deliveries
        another connection made in one go (a run of core messages, one frame)."""
        if self.reading.flushes or self._now:
            self.send_now(frame)
            return
        n = len(frame)
        self._now.append(frame)
        self.now_bytes += n
        self.pending_bytes += n
        self.budget.add(n)
        if not self.send_nowait():
            self.kick()

    def send_durable(self, epoch: int, frame: bytes) -> None:
        """Queue ``frame`` to go once ``epoch`` is durable: the group commit calls the
        speaker's ``on_sync`` then (nothing wakes the writer before)."""
        n = len(frame)
        self._durable.append((epoch, frame))
        self.pending_bytes += n
        self.budget.add(n)
        self.broker.committer.watch(self.speaker)

    def on_sync(self) -> None:
        """Send what the group commit made durable now, and wake the writer only for
        what the socket did not take."""
        if not self.send_nowait():
            self.kick()  # the writer sends the rest (and watches for the next sync)
        elif self._durable:
            self.broker.committer.watch(self.speaker)  # written after the sync began

    def has_room(self, n: int) -> bool:
        """Whether a delivery of ``n`` bytes may be queued: the connection takes
        deliveries, it is within its limit, and the budget has room (a delivery is
        dropped otherwise: core subscriptions are at most once)."""
        return not self.closing and self.pending_bytes <= self.limit and self.budget.has_room(n)

    def accepts_pushes(self) -> bool:
        """False when any delivery would be dropped (this connection or the broker is full)."""
        return self.has_room(1)

    def full(self) -> bool:
        """It or the broker is over its output limit (the reader waits: :meth:`wait_room`)."""
        budget = self.budget
        return self.pending_bytes > self.limit or budget.total > budget.limit

    def stopped_or_full(self) -> bool:
        """The connection is ending, or it or the broker is over its output limit
        (then :meth:`ending` has something to do)."""
        budget = self.budget
        return self.closing or self.pending_bytes > self.limit or budget.total > budget.limit

    async def ending(self) -> bool:
        """After a request: wait while the connection or the broker is over its
        output limit; True when the connection is ending."""
        if not self.closing and self.full():
            await self.wait_room()
        return self.closing

    async def wait_room(self) -> None:
        """Backpressure: wait until this connection is within its limit and the
        broker within its budget; the writer sends meanwhile."""
        reading, self.reading = self.reading, Reading.RECEIVING
        budget = self.budget
        try:
            while not self.closing:
                if self.pending_bytes > self.limit:
                    await self._wait_sent()
                elif budget.total > budget.limit:
                    self.kick()
                    await budget.wait_room()
                else:
                    return
        finally:
            self.reading = reading

    def has_durable(self) -> bool:
        """Answers wait for the group commit."""
        return bool(self._durable)

    def has_queued(self) -> bool:
        """Frames may go now."""
        return bool(self._now)

    # -- the tasks ---------------------------------------------------------------------

    async def run(self, read_loop: Callable[[], Awaitable[None]], *tasks: Callable[[], Awaitable[None]]) -> None:
        """Serve the connection until it ends: ``read_loop`` reads and handles its
        requests (the handshake must come within the timeout), the writer task and
        ``tasks`` run beside it. Never raises anything but ``trio.Cancelled`` (and
        BaseExceptions such as KeyboardInterrupt).

        The server's cancellation does not reach it (a shutdown first says goodbye,
        see :meth:`shut_down`); :meth:`abort` ends it."""
        with self._shield:
            try:
                await self._run(read_loop, tasks)
            finally:
                self._ended.set()

    async def _run(self, read_loop: Callable[[], Awaitable[None]], tasks: tuple[Callable[[], Awaitable[None]], ...]) -> None:
        try:
            if isinstance(self.stream, trio.SocketStream):
                self._sock = socket.socket(fileno=self.stream.socket.fileno())
                self._sock.setblocking(False)
                self._sock_stream = self.stream
            async with trio.open_nursery() as nursery:
                self._task_scope = nursery.cancel_scope
                nursery.start_soon(self._writer)
                for task in tasks:
                    nursery.start_soon(task)
                await self._read(read_loop)
                if not self.closing:
                    self.end_as("closed")  # (a read loop returns once the connection ends)
                self.kick()  # send what the reader queued before it stopped
                await self.drain(self.drain_seconds)
                if self.reason == "shutdown" and not self.pending_bytes and self.writable:
                    await self._linger(GOODBYE_SECONDS)
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            self.lost()
        except* Exception:
            # Not the peer's doing: a bug in our code. It costs this connection only.
            self.end_as("task_failed")
            log.error("connection_task_failed", exc_info=True, session=self.id, peer=self.peer)
        finally:
            self._close()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)
            reason = self.reason or "closed"
            if FAILED.get(reason, True):
                self.broker.counters.connections_failed += 1
            log.debug("connection_closed", session=self.id, peer=self.peer, reason=reason)

    def _close(self) -> None:
        """What the connection held goes: in the broker (the speaker's), in the
        guard, in the budget."""
        if not self.closing:
            self.end_as("closed")  # aborted
        self._move("closed")
        self.guard.waiting.pop(self, None)
        for hook in self.guard.on_closed:  # before the speaker lets its subscriptions go
            hook(self)
        self.speaker.closed()
        self.guard.sessions.discard(self)
        leftover, self.pending_bytes = self.pending_bytes, 0
        self.budget.sent(leftover)
        self._now.clear()
        self._durable.clear()
        if self._sock is not None:
            self._sock.detach()  # the stream owns the descriptor and closes it
            self._sock = None

    async def _read(self, read_loop: Callable[[], Awaitable[None]]) -> None:
        timeout = self.broker.config.limits.handshake_timeout
        with trio.CancelScope(deadline=trio.current_time() + timeout) as scope:
            self._read_scope = scope
            await read_loop()
        self._read_scope = None
        if scope.cancelled_caught and self.awaiting_handshake:
            self.broker.counters.handshake_timeouts += 1
            log.info("handshake_timeout", session=self.id, peer=self.peer, seconds=timeout)
            self.end_as("handshake_timeout")
            self.goodbye(ErrorCode.HANDSHAKE_TIMEOUT, f"no handshake within {timeout:g} s")
            self.drain_seconds = GOODBYE_SECONDS

    async def _linger(self, seconds: float) -> None:
        """After the last frame: half-close, and read (discarding) until the client
        closes too, for at most ``seconds``. Closing a socket with unread bytes
        resets it, and a reset can destroy the goodbye before the client reads it."""
        with trio.move_on_after(seconds):
            try:
                send_eof = getattr(self.stream, "send_eof", None)
                if send_eof is not None:
                    await send_eof()
                while await self.stream.receive_some(RECEIVE_SIZE):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def drain(self, seconds: float = DRAIN_SECONDS) -> None:
        """Wait (at most ``seconds``) until everything queued has been sent."""
        with trio.move_on_after(seconds):
            while self.pending_bytes and self.writable:
                await self._wait_sent()

    async def drain_queued(self, seconds: float = DRAIN_SECONDS) -> None:
        """Wait (at most ``seconds``) until what is queued now has been sent; what is
        queued meanwhile (a client that goes on sending requests) is not waited for."""
        target = self.sent_bytes + self.pending_bytes
        with trio.move_on_after(seconds):
            while self.sent_bytes < target and self.pending_bytes and self.writable:
                await self._wait_sent()

    async def _wait_sent(self) -> None:
        """Wait for the next write that leaves the connection within its limit (or
        empties its queues). Every waiter shares one event."""
        if self._drained.is_set():
            self._drained = trio.Event()
        self.kick()
        await self._drained.wait()

    # -- reading -----------------------------------------------------------------------

    def plain_socket(self) -> socket.socket | None:
        """The socket to read and write without waiting, while the stream is the plain
        socket it was accepted as (None over TLS)."""
        sock = self._sock
        return sock if sock is not None and self.stream is self._sock_stream else None

    async def receive(self) -> bytes | bytearray:
        """The next bytes the client sent (b"" at its end). On a plain socket, read
        the socket itself: at once when bytes are waiting (a client that sent its
        next request while we answered the last), with no trip through trio's
        scheduler, and after waiting until it is readable otherwise (a wait is a
        checkpoint). Once :data:`RECEIVE_SIZE` bytes came in without a checkpoint it
        checkpoints before reading again, so a client that never stops sending keeps
        the loop no longer than with one checkpoint per full read. Over TLS, the
        stream's ``receive_some``. Before the handshake, at most
        :data:`OPENING_RECEIVE_SIZE` bytes a read.

        The socket is read into the broker's one receive buffer and what came is
        copied out: ``recv`` would allocate :data:`RECEIVE_SIZE` bytes a read and
        shrink them to what came, which the C allocator serves with an
        ``mmap``, ``mremap`` and ``munmap`` a read once reads stop freeing whole
        buffers (a request and its answer at a time)."""
        size = OPENING_RECEIVE_SIZE if self.awaiting_handshake else RECEIVE_SIZE
        sock = self._sock
        if sock is None or self.stream is not self._sock_stream:
            return await self.stream.receive_some(size)
        if self.unchecked_bytes >= RECEIVE_SIZE:
            self.unchecked_bytes = 0
            await trio.lowlevel.checkpoint()
        buffer = self.guard.receive_buffer
        while True:
            try:
                data = buffer[: sock.recv_into(buffer, size)].tobytes()
            except BlockingIOError:
                self.unchecked_bytes = 0
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            self.unchecked_bytes += len(data)
            return data

    async def read(self, partial: Callable[[], int]) -> bytes | bytearray | None:
        """The reader's next read: the bytes, or None when the connection ends (the
        stream broke, the client closed (``closed_mid_frame`` when ``partial()``
        says a frame was cut), or it ended while the bytes were on their way: its
        goodbye is the last frame)."""
        try:
            data = await self.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.lost()
            return None
        if not data:
            self.end_as("closed_mid_frame" if partial() else "closed")
            return None
        if self.closing:
            return None
        return data

    async def wait_readable(self) -> None:
        """Wait until the plain socket has bytes (at once over TLS: its reads wait)."""
        sock = self.plain_socket()
        if sock is not None:
            self.unchecked_bytes = 0
            await trio.lowlevel.wait_readable(sock)

    async def wait_speaks(self, seconds: float) -> bool:
        """Whether the client sends something (a TLS ClientHello, or its end) within
        ``seconds``, before the server has said anything."""
        sock = self.plain_socket()
        if sock is None:
            return True
        with trio.move_on_after(seconds):
            await trio.lowlevel.wait_readable(sock)
            return True
        return False

    # -- writing -----------------------------------------------------------------------

    async def write_queued(self) -> None:
        """The reader sends what may go now, waiting for the peer as it must (a
        shutdown does not cancel it meanwhile)."""
        self.reading = Reading.WRITING
        try:
            await self.send_ready()
        finally:
            self.reading = Reading.RECEIVING

    async def send_answers(self) -> None:
        """At the end of a read: send its answers, at once when the socket takes
        them, else waiting for the peer."""
        if self._now and not self.send_nowait():
            await self.write_queued()

    async def _writer(self) -> None:
        """Sends what the reader did not: durable answers once their epoch is synced,
        and deliveries queued by other connections' publishes."""
        committer = self.broker.committer
        while True:
            await self.send_ready()
            if self._durable:
                committer.watch(self.speaker)  # the next sync kicks us
            await self._wake.wait()
            self._wake = trio.Event()

    def _take_chunk(self) -> bytes | None:
        """Up to WRITE_CHUNK bytes of whole frames that may go now, or None."""
        now = self._now
        durable = self._durable
        if durable:
            synced = self.broker.committer.synced
            while durable and durable[0][0] <= synced:
                frame = durable.popleft()[1]
                now.append(frame)
                self.now_bytes += len(frame)
        if not now:
            return None
        if self.now_bytes <= WRITE_CHUNK:
            data = now[0] if len(now) == 1 else b"".join(now)
            now.clear()
            self.now_bytes = 0
            return data
        frames = [now.popleft()]
        size = len(frames[0])
        while now and size + len(now[0]) <= WRITE_CHUNK:
            frame = now.popleft()
            frames.append(frame)
            size += len(frame)
        self.now_bytes -= size
        return frames[0] if len(frames) == 1 else b"".join(frames)

    async def send_ready(self) -> None:
        """Send every frame that may go now. Only one task sends at a time; the other
        one returns at once (the sender loops). A broken stream ends the connection
        here, so no stream error leaves this method."""
        if self._sending or not self.writable:
            return
        self._sending = True
        try:
            while True:
                data = self._take_chunk()
                if data is None:
                    return
                self._write_started = trio.current_time()
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.lost()
                    return
                except trio.Cancelled:
                    self._move("lost")  # part of a frame may be out: send nothing more
                    raise
                self._write_started = None
                self._sent(len(data))
        finally:
            self._sending = False
            self._write_started = None

    def send_nowait(self) -> bool:
        """Send what may go now with non-blocking writes on the socket itself, when no
        write is under way; True when nothing that may go is left. One system call
        and no task switch for the common case, a client that reads its answers (what
        the socket does not take goes back to the front of the queue, for
        :meth:`send_ready`). Over TLS there is no socket to write to: False."""
        sock = self._sock
        if sock is None or self._sending or not self.writable or self.stream is not self._sock_stream:
            return False
        while True:
            data = self._take_chunk()
            if data is None:
                return True
            try:
                n = sock.send(data)
            except BlockingIOError:
                n = 0
            except OSError:
                self.lost()
                return True
            self._sent(n)
            if n < len(data):
                rest = data[n:]
                self._now.appendleft(rest)
                self.now_bytes += len(rest)
                return False

    def _sent(self, n: int) -> None:
        """``n`` queued bytes went out."""
        self.sent_bytes += n
        self.pending_bytes -= n
        self.budget.sent(n)
        if self.pending_bytes <= self.limit:
            self.over_limit_since = None
            self._drained.set()
        elif not (self._now or self._durable):
            self._drained.set()
