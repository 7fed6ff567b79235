"""What keeps connections from costing unbounded memory: the output budget, the
slow-consumer watch, and the delay on failed handshakes.

Rules of this file:

1. Every byte a connection has queued for sending (responses, durable acks waiting
   for their fsync, pushes, a GOODBYE) is counted in its session's
   ``pending_bytes`` and in :class:`OutputBudget` ``total`` from the moment it is
   queued until ``send_all`` returns. ``_transport.py`` does the counting; this file
   decides what happens when the counts are too high.
2. Deliveries are never queued past a limit (they are dropped and counted:
   core subscriptions are at most once); responses are never dropped, the
   connection's reader waits instead. So the total can pass the budget only by the
   responses of the requests being handled when it was reached (one per connection).
3. A connection is cut off (GOODBYE with SLOW_CONSUMER, then closed) when its queue
   stays over its own limit for ``slow_consumer_seconds``, or when a write to it
   makes no progress for that long (nats-server closes at its ``max_pending``,
   64 MB, or when a write takes longer than ``write_deadline``, 10 s). It is also
   cut when the budget is spent (the total is over :data:`HIGH_WATER` of it, or a
   push found no room) and it is among those holding the most while its writes
   have stalled for :data:`STALL_SECONDS`: those are cut, largest first, until
   :data:`LOW_WATER` of the budget is left. A client that reads, however much it
   asked for, is never cut by the budget: its writes complete.
4. At ``max_connections``, a new connection takes the place of the connection that
   has waited longest without completing its handshake, if it has waited at least
   :data:`EVICT_AFTER_SECONDS` (it gets a GOODBYE with TOO_MANY_CONNECTIONS);
   otherwise the new one is refused. So connections that never handshake cannot
   lock clients out for the ``handshake_timeout`` they may each wait, and a client
   that got in has a second to handshake before a flood can push it out.

Time is ``trio.current_time()``, so tests drive all of this with a MockClock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import trio

__all__ = [
    "Connection", "ConnectionGuard", "OutputBudget", "FailureThrottle", "LogLimiter", "watch_connections",
    "RECEIVE_SIZE", "STALL_SECONDS", "SWEEP_SECONDS", "LOG_INTERVAL_SECONDS",
]

#: Bytes a connection reads from its socket at a time (once its handshake is done).
RECEIVE_SIZE = 256 * 1024


class Connection(Protocol):
    """A client connection of either protocol, as the limits see it."""

    #: Bytes queued or being written, and since when they are over the limit.
    pending_bytes: int
    over_limit_since: float | None

    @property
    def closing(self) -> bool: ...

    #: Which protocol it speaks: ``"ttlbroker"`` or ``"nats"``.
    @property
    def protocol(self) -> str: ...

    def write_stalled_since(self, now: float) -> float:
        """Seconds the current write has been waiting for the peer (0 if none)."""
        ...

    def cut_off(self, reason: str, rule: str) -> None:
        """Close it as a slow consumer (rule 3)."""

    def evict(self, limit: int) -> None:
        """Close it, still without a handshake, for a new connection (rule 4)."""

    def kick(self) -> None:
        """Wake its writer."""

    async def drain_queued(self) -> None:
        """Wait (a while) until what it has queued now is sent."""

    def shut_down(self, reason: str) -> None:
        """The broker is shutting down: say GOODBYE and end."""

    def abort(self) -> None:
        """End now, whatever it is doing."""

    async def wait_ended(self) -> None: ...

#: How often the watch looks at the connections' queues.
SWEEP_SECONDS = 0.1
#: A write that has not completed for this long means the peer is not reading.
STALL_SECONDS = 1.0
#: The budget counts as spent from this fraction of it (or when a push found no
#: room); the watch then cuts stalled connections until the total is back to
#: LOW_WATER of it, so that it does not cut one connection per sweep.
HIGH_WATER = 0.9
LOW_WATER = 0.5
#: A connection without a handshake may be evicted for a new one after this long
#: (or half the handshake timeout, if shorter).
EVICT_AFTER_SECONDS = 1.0
#: Failed handshakes of a host older than this are forgotten.
FAILURE_MEMORY_SECONDS = 60.0
#: Hosts remembered by the failure throttle (the oldest are forgotten first).
FAILURE_HOSTS = 10_000
#: At most one line about failed TLS handshakes per peer host in this many seconds.
LOG_INTERVAL_SECONDS = 10.0


class OutputBudget:
    """The queued output of all connections together, against ``limit``.

    Sessions add what they queue with :meth:`add` and subtract what they sent with
    :meth:`sent`; both are O(1) and run on every frame. Readers that must wait for
    room call :meth:`wait_room`.
    """

    __slots__ = ("limit", "total", "peak", "refused", "_room", "_busy")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        #: The highest total seen since start (the ``queued_bytes_max`` gauge).
        self.peak = 0
        #: Set when a push found no room (the watch clears it): the budget is spent.
        self.refused = False
        self._room: trio.Event | None = None
        self._busy: trio.Event | None = None

    def add(self, n: int) -> None:
        self.total = total = self.total + n
        if total > self.peak:
            self.peak = total
        if self._busy is not None:
            self._busy.set()
            self._busy = None

    def sent(self, n: int) -> None:
        self.total = total = self.total - n
        if self._room is not None and total <= self.limit:
            self._room.set()
            self._room = None

    @property
    def over(self) -> bool:
        return self.total > self.limit

    def has_room(self, n: int) -> bool:
        """Whether a push of ``n`` bytes fits; remembers when one did not."""
        if self.total + n <= self.limit:
            return True
        self.refused = True
        return False

    async def wait_room(self) -> None:
        """Wait until the total is back within the budget."""
        if self.total <= self.limit:
            return
        if self._room is None:
            self._room = trio.Event()
        await self._room.wait()

    async def wait_busy(self) -> None:
        """Wait until something is queued (the watch sleeps while nothing is)."""
        if self.total:
            return
        if self._busy is None:
            self._busy = trio.Event()
        await self._busy.wait()


class FailureThrottle:
    """How long to wait before answering a failed handshake, per peer host.

    The first failure from a host waits ``base`` seconds; each further failure from
    it within :data:`FAILURE_MEMORY_SECONDS` of the previous one doubles the wait, up
    to ``cap`` (OpenSSH's PerSourcePenalties and PostgreSQL's auth_delay work the
    same way). A successful handshake is never delayed. Memory is bounded by
    :data:`FAILURE_HOSTS` entries.
    """

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self._hosts: dict[str, tuple[int, float]] = {}

    def failure(self, host: str, now: float) -> float:
        """Record a failure from ``host``; returns the delay in seconds."""
        count, last = self._hosts.pop(host, (0, now))
        if now - last > FAILURE_MEMORY_SECONDS:
            count = 0
        count += 1
        self._hosts[host] = (count, now)
        if len(self._hosts) > FAILURE_HOSTS:
            del self._hosts[next(iter(self._hosts))]
        if self.base <= 0:
            return 0.0
        return min(self.base * 2.0 ** min(count - 1, 30), self.cap)


class LogLimiter:
    """At most one log line per peer host every ``interval`` seconds.

    :meth:`allow` says whether a line may be logged now and, if so, how many
    lines of that host were suppressed since its last one (the line reports it).
    Memory is bounded by ``hosts`` entries, the least recently logged forgotten
    first.
    """

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS, hosts: int = FAILURE_HOSTS) -> None:
        self.interval = interval
        self.max_hosts = hosts
        #: host -> [time of its last line, lines suppressed since].
        self._hosts: dict[str, list[float]] = {}

    def allow(self, host: str, now: float) -> int | None:
        """None: suppress this line (it is counted); else the number suppressed
        before it. Runtime complexity: O(1)."""
        entry = self._hosts.get(host)
        if entry is not None and now - entry[0] < self.interval:
            entry[1] += 1
            return None
        suppressed = int(entry[1]) if entry is not None else 0
        self._hosts.pop(host, None)
        self._hosts[host] = [now, 0]
        if len(self._hosts) > self.max_hosts:
            del self._hosts[next(iter(self._hosts))]
        return suppressed


class ConnectionGuard:
    """What all connections of one broker share: the output budget, the throttle
    on failed handshakes, the rate limit of the log lines about failed TLS
    handshakes, and the connections still waiting for their handshake (oldest
    first), and the registry of open connections."""

    def __init__(self, limits: Any) -> None:
        self.budget = OutputBudget(limits.max_pending_bytes_total)
        self.throttle = FailureThrottle(limits.auth_failure_delay, limits.auth_failure_delay_max)
        self.log_limit = LogLimiter()
        #: Every open connection, of both protocols.
        self.sessions: set[Connection] = set()
        #: Called with each connection as it closes, before its speaker releases what
        #: it held (the monitoring keeps the last ones for ``/connz?state=closed``).
        #: A hook must not raise.
        self.on_closed: list[Callable[[Any], None]] = []
        #: Connections without a handshake yet, oldest first, with their arrival time.
        self.waiting: dict[Connection, float] = {}
        self.evict_after = min(EVICT_AFTER_SECONDS, limits.handshake_timeout / 2)
        #: Where the connections read their sockets: one read at a time on the event
        #: loop, copied out before the next (a read into a new buffer each time costs
        #: an ``mmap`` and ``munmap`` per read once reads stop freeing whole buffers).
        self.receive_buffer = memoryview(bytearray(RECEIVE_SIZE))

    def evictable(self, now: float) -> Connection | None:
        """The connection that has waited longest for its handshake, if it has waited
        long enough to be evicted for a new one. Runtime complexity: O(1)."""
        for session, since in self.waiting.items():
            return session if now - since >= self.evict_after else None
        return None


async def watch_connections(sessions: Iterable[Connection], budget: OutputBudget, limit: int, slow_seconds: float) -> None:
    """Runs for the broker's lifetime: every :data:`SWEEP_SECONDS`, cut off the
    connections that are slow consumers (rule 3 above)."""
    while True:
        await budget.wait_busy()
        await trio.sleep(SWEEP_SECONDS)
        sweep(sessions, budget, limit, slow_seconds, trio.current_time())


def sweep(sessions: Iterable[Connection], budget: OutputBudget, limit: int, slow_seconds: float, now: float) -> None:
    """One pass of :func:`watch_connections`. Runtime complexity: O(connections),
    plus O(k log k) to order the k stalled connections when over the budget."""
    stalled: list[Connection] = []
    for s in list(sessions):
        if s.closing:
            continue
        stalled_for = s.write_stalled_since(now)
        if s.pending_bytes > limit:
            if s.over_limit_since is None:
                s.over_limit_since = now
            elif now - s.over_limit_since >= slow_seconds:
                s.cut_off(
                    f"slow consumer: {s.pending_bytes} bytes queued, over the connection limit of {limit} bytes "
                    f"for {slow_seconds:g} s",
                    "connection_limit",
                )
                continue
        else:
            s.over_limit_since = None
        if stalled_for >= slow_seconds:
            s.cut_off(
                f"slow consumer: {s.pending_bytes} bytes queued and none could be sent for {slow_seconds:g} s",
                "write_stalled",
            )
        elif stalled_for >= STALL_SECONDS:
            stalled.append(s)
    spent = budget.total >= budget.limit * HIGH_WATER or budget.refused
    budget.refused = False
    if not spent or not stalled:
        return
    stalled.sort(key=lambda s: s.pending_bytes, reverse=True)
    target = budget.limit * LOW_WATER
    for s in stalled:
        if budget.total <= target:
            break
        s.cut_off(
            f"slow consumer: the broker's queued output is over its budget of {budget.limit} bytes and this "
            f"connection holds {s.pending_bytes} bytes it does not read",
            "budget",
        )

