"""Durable consumers in the client: pulls, acks and the consume loop.

Written once for trio and asyncio, like the rest of the client. ``Client`` inherits
:class:`ConsumerMethods`, which fills the hooks of ``_connection.Connection``: the
connection's protocol object decodes pulled messages straight into
:class:`ConsumerMessage` (``ProtocolConnection.pulled_class``); a PULL's response
reaches the :class:`_PullCall` waiting under its correlation id like any response,
and ``PULL_MESSAGES`` pushes, which carry that id, are routed to it by
``_on_pull_push``; queued acks are dropped with a lost connection and made durable
before the client closes.

Acks that are not ``sync`` cost no round trip and no frame of their own: each
consumer's entries are queued and one ACK frame (no response) carries all the
entries queued during one turn of the event loop (or every 1,000 entries).
"""

from __future__ import annotations

import datetime as _dt
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol, cast

import protocol as P
from protocol import (
    ACK_SYNC,
    PULL_NO_WAIT,
    AckKind,
    BrokerError,
    ErrorCode,
    Identifier,
    PullBatch,
    PulledMessage,
    PullEnd,
)

from ._backend import Event, Waiter
from ._connection import _Conn
from ._errors import ConnectionClosedError, ConnectionLostError
from ._requests import Requests

__all__ = ["ConsumerInfo", "ConsumerMessage", "MessageStream", "ConsumerMethods", "consumer_config"]

#: Queued ack entries of one consumer that make the ACK frame go out at once. A
#: quarter of the default max_ack_pending (1,000): while the application works
#: through a batch, the broker already frees slots and fills the next pull, so the
#: two run side by side instead of taking turns (1,000 measured 240k msgs/s in
#: bench/consume.py, 250 measured 275k to 338k).
ACK_FLUSH_AT = 250
#: How long a pull waits by default (seconds) when not ``no_wait``.
DEFAULT_PULL_EXPIRES = 5.0
#: Longest wait (seconds) before joining a group again after it said NOT_A_MEMBER.
REJOIN_WAIT_MAX = 2.0

_U32_MAX = 0xFFFFFFFF


# -- configuration and info ---------------------------------------------------------


def _seconds(value: object, what: str) -> float:
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be seconds (a number) or a timedelta, not {value!r}")
    return float(value)


def _ns(value: object) -> int:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.astimezone()  # local time, as datetime.timestamp() takes it
        delta = value - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"opt_start_time must be a datetime or nanoseconds since the epoch, not {value!r}")
    return value


def consumer_config(**config: Any) -> dict[str, Any]:
    """The config map for CREATE/UPDATE_CONSUMER from keyword arguments (JetStream
    names): ``timedelta`` durations become seconds, a ``datetime`` start time
    nanoseconds since the epoch; ``filter_subject`` (one) is accepted for
    ``filter_subjects``. None values are left out (the broker's defaults apply)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if value is None:
            continue
        if key == "filter_subject":
            key, value = "filter_subjects", [value]
        if key == "filter_subjects":
            value = [value] if isinstance(value, str) else list(value)
        elif key in ("ack_wait", "member_timeout"):
            value = _seconds(value, key)
        elif key == "backoff":
            value = [_seconds(v, "backoff") for v in value]
        elif key == "opt_start_time":
            value = _ns(value)
        elif key == "opt_start_offset" and isinstance(value, Mapping):
            value = {str(int(p)): int(o) for p, o in value.items()}  # msgpack map keys are strings on the wire
        out[key] = value
    return out


class ConsumerInfo:
    """A consumer's info as the broker sent it. The main counters are attributes;
    every other field of the map is an attribute too, and ``raw`` is the map."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = dict(raw)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "raw":
            raise AttributeError(name)
        try:
            return self.raw[name]
        except KeyError:
            raise AttributeError(f"consumer info has no field {name!r}") from None

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    @property
    def name(self) -> str:
        return self.raw.get("name", "")

    @property
    def config(self) -> dict[str, Any]:
        return self.raw.get("config", {})

    @property
    def num_pending(self) -> int:
        return self.raw.get("num_pending", 0)

    @property
    def num_ack_pending(self) -> int:
        return self.raw.get("num_ack_pending", 0)

    @property
    def num_redelivered(self) -> int:
        return self.raw.get("num_redelivered", 0)

    @property
    def num_waiting(self) -> int:
        return self.raw.get("num_waiting", 0)

    @property
    def partitions(self) -> list[dict[str, Any]]:
        return self.raw.get("partitions", [])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConsumerInfo) and other.raw == self.raw

    def __repr__(self) -> str:
        return (
            f"ConsumerInfo(name={self.name!r}, num_pending={self.num_pending}, num_ack_pending={self.num_ack_pending}, "
            f"num_redelivered={self.num_redelivered}, num_waiting={self.num_waiting})"
        )


# -- acks ----------------------------------------------------------------------------


class _Acker:
    """One consumer's ack queue: entries queued by the messages' settle methods and
    sent in one ACK frame (no response) per turn of the event loop."""

    __slots__ = ("client", "stream", "topic", "name", "entries", "scheduled", "unsynced")

    def __init__(self, client: Requests, stream: Identifier, topic: Identifier, name: str) -> None:
        self.client = client
        self.stream = stream
        self.topic = topic
        self.name = name
        self.entries: list[tuple[int, int, int, int]] = []
        self.scheduled = False
        #: Entries went out without ACK_SYNC since the last sync (applied by the
        #: broker, maybe not yet durable).
        self.unsynced = False

    def add(self, entry: tuple[int, int, int, int]) -> None:
        entries = self.entries
        entries.append(entry)
        n = len(entries)
        if n >= ACK_FLUSH_AT:
            self.flush()
            return
        if n == 1:
            self.client._queued.add(self)  # sent before the client's next request
        if not self.scheduled:
            self.scheduled = True
            self.client._backend.spawn(self._flush_soon)

    async def _flush_soon(self) -> None:
        self.scheduled = False
        self.flush()
        conn = self.client._conn
        if conn is not None:
            await conn.link.drain()

    def flush(self) -> None:
        """Send what is queued, without a response; dropped when no connection is up
        (those messages are delivered again after their ack wait)."""
        self.client._queued.discard(self)
        entries = self.entries
        if not entries:
            return
        self.entries = []
        conn = self.client._conn
        if conn is None or conn.lost is not None:
            return
        conn.link.write(conn.proto.send_request(0, P.AckMessages(self.stream, self.topic, self.name, tuple(entries))))
        self.unsynced = True

    async def sync(self, entry: tuple[int, int, int, int] | None) -> None:
        """Send what is queued (and ``entry``) with ACK_SYNC and wait until the broker
        has made it durable, with every ack sent before it on this connection (an
        ACK_SYNC with no entries makes those durable)."""
        entries, self.entries = self.entries, []
        self.client._queued.discard(self)
        if entry is not None:
            entries.append(entry)
        if not entries and not self.unsynced:
            return
        await self.client._request(P.AckMessages(self.stream, self.topic, self.name, tuple(entries), ACK_SYNC))
        self.unsynced = False


def _delay_ms(delay: float | _dt.timedelta | None) -> int:
    if delay is None:
        return 0
    ms = round(_seconds(delay, "delay") * 1000)
    return min(max(ms, 0), _U32_MAX)


class ConsumerMessage(PulledMessage):
    """A message delivered by a durable consumer, with the methods that settle it.

    Attributes (beyond :class:`protocol.Message`'s ``subject``, ``payload``,
    ``headers``, ``partition``, ``offset``, ...):
        consumer_seq: the consumer's delivery sequence of this delivery.
        num_delivered: how many times it has been delivered, this time included.
        pending: messages matching the consumer still to be delivered after it.

    Settling is cheap: without ``sync`` the entry is queued and sent with the others
    of the same turn of the event loop, with no response. With ``sync=True`` the call
    returns once the broker has made the new state durable (and raises
    :class:`ConnectionLostError` if the connection drops meanwhile). Settling twice is
    harmless.
    """

    __slots__ = ("_acker",)

    _acker: _Acker

    async def ack(self, sync: bool = False) -> None:
        """Processed: never delivered again."""
        if sync:
            await self._acker.sync((0, self.partition, self.offset, 0))
        else:
            self._acker.add((0, self.partition, self.offset, 0))

    async def nak(self, delay: float | _dt.timedelta | None = None, sync: bool = False) -> None:
        """Not processed: deliver it again now, or after ``delay`` seconds."""
        entry = (1, self.partition, self.offset, _delay_ms(delay))
        if sync:
            await self._acker.sync(entry)
        else:
            self._acker.add(entry)

    async def term(self, sync: bool = False) -> None:
        """Never deliver it again, unprocessed."""
        entry = (2, self.partition, self.offset, 0)
        if sync:
            await self._acker.sync(entry)
        else:
            self._acker.add(entry)

    async def in_progress(self, sync: bool = False) -> None:
        """Still working on it: restart its ack wait."""
        entry = (3, self.partition, self.offset, 0)
        if sync:
            await self._acker.sync(entry)
        else:
            self._acker.add(entry)

    def __repr__(self) -> str:
        return (
            f"ConsumerMessage(subject={self.subject!r}, partition={self.partition}, offset={self.offset}, "
            f"consumer_seq={self.consumer_seq}, num_delivered={self.num_delivered}, payload={self.payload[:40]!r})"
        )


# -- pulls ---------------------------------------------------------------------------


class _Sink(Protocol):
    """Where the frames of a pull go: a direct ``pull()`` (:class:`_OnePull`), a
    :class:`MessageStream`, or NAKs (:class:`_NakSink`) once nobody waits."""

    def _pull_frame(self, call: _PullCall, messages: tuple[ConsumerMessage, ...], status: int | None) -> None: ...
    def _pull_failed(self, call: _PullCall, exc: BaseException) -> None: ...


class _PullCall:
    """One PULL in flight, in its connection's ``pending`` under its correlation id
    (so a lost connection fails it like any request). Its frames go to ``sink``."""

    __slots__ = ("acker", "sink", "remaining", "conn")

    def __init__(self, acker: _Acker, sink: _Sink, batch: int, conn: _Conn) -> None:
        self.acker = acker
        self.sink = sink
        self.remaining = batch
        self.conn = conn

    def take(self, batch: PullBatch, final: bool) -> None:
        # Decoded as the connection's pulled_class, ConsumerMessage (``_pulled_class``).
        messages = cast("tuple[ConsumerMessage, ...]", batch.messages)
        acker = self.acker
        for m in messages:
            m._acker = acker
        self.remaining -= len(messages)
        self.sink._pull_frame(self, messages, batch.status if final else None)

    # In its connection's ``pending``, it is answered like a waiter.
    def set_result(self, batch: PullBatch) -> None:
        self.take(batch, True)

    def set_exception(self, exc: BaseException) -> None:
        self.sink._pull_failed(self, exc)

    def abandon(self) -> None:
        """Nobody waits for it any more: what still comes for it is NAKed at once, so
        it is delivered again without waiting for its ack wait."""
        self.sink = _NAK_SINK


class _NakSink:
    @staticmethod
    def _pull_frame(call: _PullCall, messages: tuple[ConsumerMessage, ...], status: int | None) -> None:
        for m in messages:
            call.acker.add((AckKind.NAK, m.partition, m.offset, 0))

    @staticmethod
    def _pull_failed(call: _PullCall, exc: BaseException) -> None:
        pass


_NAK_SINK = _NakSink()


class _OnePull:
    """The sink of a direct ``pull()``: collects, and wakes the caller at the end."""

    __slots__ = ("messages", "status", "waiter")

    def __init__(self, waiter: Waiter) -> None:
        self.messages: list[ConsumerMessage] = []
        self.status: int | None = None
        self.waiter = waiter

    def _pull_frame(self, call: _PullCall, messages: tuple[ConsumerMessage, ...], status: int | None) -> None:
        self.messages.extend(messages)
        if status is not None:
            self.status = status
            self.waiter.set_result(status)

    def _pull_failed(self, call: _PullCall, exc: BaseException) -> None:
        self.waiter.set_exception(exc)


class MessageStream:
    """What ``Client.consume`` gives: an async context manager and an async iterator
    of :class:`ConsumerMessage`.

    It keeps up to two pulls in flight and at most about ``2 × batch`` messages
    buffered, so that the next batch is there when the application finishes the
    last. Across a reconnection it joins its group again (``member``), pulls again
    and goes on; messages buffered and not acked may then come again (at least
    once). When the client gives up reconnecting the iteration raises
    :class:`ReconnectFailedError`; when the client is closed it ends.

    Attributes:
        member / partitions: with ``member``, the group membership and the
            partitions it owns (from the last JoinGroup).
        delivered: messages handed to the application so far.
    """

    def __init__(
        self, client: ConsumerMethods, stream: int | str, topic: int | str, name: str, *,
        batch: int, expires: float, max_bytes: int, member: str | None, max_pulls: int = 2,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self._client = client
        self._acker = client._acker(stream, topic, name)
        self._batch = batch
        self._expires_ms = min(max(round(expires * 1000), 1), _U32_MAX)
        self._max_bytes = max_bytes
        self.member = member
        self.partitions: list[int] = []
        self.delivered = 0
        self._max_pulls = max_pulls
        self._buffer: deque[ConsumerMessage] = deque()
        self._calls: list[_PullCall] = []
        self._outstanding = 0
        self._conn: _Conn | None = None
        self._wake: Event | None = None
        self._error: BaseException | None = None
        self._rejoin = False
        self._rejoins = 0
        self._closed = False
        self._started = False

    # -- the pulls ----------------------------------------------------------------

    def _fill(self) -> None:
        """Issue pulls while there is room (called when a message handed out makes
        room, and when a pull ends)."""
        conn = self._conn
        if conn is None or conn is not self._client._conn or conn.lost is not None:
            return
        if self._rejoin or self._error is not None or self._closed:
            return
        batch = self._batch
        while len(self._calls) < self._max_pulls and len(self._buffer) + self._outstanding + batch <= 2 * batch:
            cmd = P.Pull(self._acker.stream, self._acker.topic, self._acker.name, batch, self._max_bytes, self._expires_ms, 0)
            call = _PullCall(self._acker, self, batch, conn)
            client = self._client
            corr = next(client._corr) & 0xFFFFFFFF or next(client._corr)
            conn.pending[corr] = call
            client._write_request(conn, conn.proto.send_request(corr, cmd))
            self._calls.append(call)
            self._outstanding += batch

    def _pull_frame(self, call: _PullCall, messages: tuple[ConsumerMessage, ...], status: int | None) -> None:
        if messages:
            self._buffer.extend(messages)
            self._outstanding -= len(messages)
        if status is not None:
            self._end_call(call)
            if status == PullEnd.NOT_A_MEMBER:
                self._rejoin = True
            elif self._rejoins and messages:
                self._rejoins = 0
            self._fill()
        self._wakeup()

    def _pull_failed(self, call: _PullCall, exc: BaseException) -> None:
        self._end_call(call)
        if isinstance(exc, BrokerError) and exc.code == ErrorCode.NOT_A_MEMBER:
            self._rejoin = True
        elif isinstance(exc, BrokerError) and exc.code == ErrorCode.SHUTTING_DOWN:
            pass  # not carried out; pulled again once reconnected
        elif isinstance(exc, BrokerError):
            if self._error is None:
                self._error = exc
        # ConnectionClosedError: __anext__ sees the connection change and pulls again.
        self._wakeup()

    def _end_call(self, call: _PullCall) -> None:
        try:
            self._calls.remove(call)
        except ValueError:
            return
        self._outstanding -= max(call.remaining, 0)

    def _wakeup(self) -> None:
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    async def _connect(self) -> None:
        """On the client's current connection (waiting for one): join the group when
        there is one, and pull."""
        client = self._client
        while True:
            conn = await client._wait_connected()
            for call in self._calls:  # left on a connection that is gone
                call.abandon()
            self._calls.clear()
            self._outstanding = 0
            if self.member is not None:
                try:
                    joined = await client._roundtrip(conn, P.JoinGroup(self._acker.stream, self._acker.topic, self._acker.name, self.member))
                except ConnectionClosedError:
                    if client.closed or not client._reconnect:
                        raise
                    continue
                except BrokerError as err:
                    if err.code == ErrorCode.SHUTTING_DOWN and client._reconnect and not client.closed:
                        await conn.gone.wait()
                        continue
                    raise
                self.partitions = list(joined.values.get("partitions", []))
            self._conn = conn
            self._rejoin = False
            self._fill()
            return

    # -- the iteration ------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[ConsumerMessage]:
        return self

    async def __anext__(self) -> ConsumerMessage:
        buffer = self._buffer
        if buffer:
            m = buffer.popleft()
            self.delivered += 1
            if len(self._calls) < self._max_pulls and len(buffer) + self._outstanding <= self._batch:
                self._fill()  # there is room for a pull (_fill's own test, without the call)
            return m
        return await self._next_slow()

    async def _next_slow(self) -> ConsumerMessage:
        client = self._client
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            conn = client._conn
            try:
                if conn is None or conn is not self._conn or conn.lost is not None:
                    await self._connect()
                    continue
                if self._rejoin:
                    if self._rejoins:
                        await client._backend.sleep(min(REJOIN_WAIT_MAX, 0.05 * 2 ** min(self._rejoins, 8)))
                    self._rejoins += 1
                    self._conn = None  # join again on the current connection
                    continue
            except ConnectionClosedError:
                if client._user_closed:
                    raise StopAsyncIteration from None
                raise
            self._fill()
            if self._buffer:
                break
            self._wake = wake = client._backend.event()
            self._acker.flush()
            await wake.wait()
        m = self._buffer.popleft()
        self.delivered += 1
        self._fill()
        return m

    async def next(self, timeout: float | None = None) -> ConsumerMessage:
        """The next message. Raises TimeoutError if none came within ``timeout``."""
        with self._client._backend.timeout(timeout):
            return await self.__anext__()

    # -- the context ----------------------------------------------------------------

    async def start(self) -> MessageStream:
        if not self._started:
            self._started = True
            self._client._streams.add(self)
            await self._connect()
        return self

    async def stop(self) -> None:
        """Stop pulling: what still arrives for pulls in flight and what is buffered
        unread is NAKed (delivered again at once), queued acks are sent and made
        durable, and the group is left."""
        if self._closed:
            return
        self._closed = True
        client = self._client
        client._streams.discard(self)
        for call in self._calls:
            call.abandon()
        self._calls.clear()
        self._outstanding = 0
        acker = self._acker
        for m in self._buffer:
            acker.entries.append((AckKind.NAK, m.partition, m.offset, 0))
        self._buffer.clear()
        self._wakeup()
        conn = client._conn
        if conn is None or client.closed:
            acker.entries.clear()
            return
        try:
            with client._backend.timeout(client._timeout):
                # End our waiting pulls now rather than when they expire: nothing more
                # is delivered to them (and NAKed back, counting towards max_deliver).
                await client._roundtrip(conn, P.EndPulls(acker.stream, acker.topic, acker.name))
                await acker.sync(None)
                if self.member is not None and self._conn is conn:
                    await client._roundtrip(conn, P.LeaveGroup(acker.stream, acker.topic, acker.name))
        except (ConnectionClosedError, TimeoutError):
            pass  # gone with the connection: the broker forgets the member, redelivers what was not acked
        except BrokerError as err:
            if err.code not in (ErrorCode.NOT_A_MEMBER, ErrorCode.CONSUMER_NOT_FOUND, ErrorCode.SHUTTING_DOWN):
                raise

    async def __aenter__(self) -> MessageStream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# -- the client's methods -------------------------------------------------------------


class ConsumerMethods(Requests):
    """The durable-consumer methods of :class:`~broker.client.Client`, and what
    consumers add to its connection (the hooks of ``Connection``)."""

    _pulled_class = ConsumerMessage
    _ackers: dict[tuple[Identifier, Identifier, str], _Acker]
    _streams: set[MessageStream]

    def _init_parts(self) -> None:
        super()._init_parts()
        self._ackers = {}
        self._streams = set()

    def _acker(self, stream: int | str, topic: int | str, name: str) -> _Acker:
        s, t = Identifier.of(stream), Identifier.of(topic)
        key = (s, t, name)
        acker = self._ackers.get(key)
        if acker is None:
            acker = self._ackers[key] = _Acker(self, s, t, name)
        return acker

    def _on_pull_push(self, conn: _Conn, correlation_id: int, batch: PullBatch) -> None:
        """A ``PULL_MESSAGES`` push: to the pull it carries the correlation id of."""
        call = conn.pending.get(correlation_id)
        if isinstance(call, _PullCall):
            call.take(batch, False)

    def _on_disconnected(self) -> None:
        """The connection went: acks queued for it go with it (those messages are
        delivered again after their ack wait)."""
        super()._on_disconnected()
        for acker in self._ackers.values():
            acker.entries.clear()
            acker.unsynced = False

    async def _before_close(self) -> None:
        """Make queued acks, and those sent without a response, durable before the
        client closes (best effort)."""
        await super()._before_close()
        for stream in list(self._streams):
            try:
                await stream.stop()
            except (BrokerError, ConnectionClosedError, TimeoutError):
                pass
        if self._conn is None:
            return
        for acker in list(self._ackers.values()):
            if acker.entries or acker.unsynced:
                try:
                    with self._backend.timeout(self._timeout):
                        await acker.sync(None)
                except (BrokerError, ConnectionClosedError, TimeoutError):
                    pass

    # -- management ---------------------------------------------------------------

    async def create_consumer(self, stream: int | str, topic: int | str, name: str, **config: Any) -> ConsumerInfo:
        """Create a durable consumer (idempotent with the same configuration).

        Keyword arguments are its configuration, with JetStream's names:
        ``filter_subjects`` (or ``filter_subject``), ``deliver_policy`` (``all``,
        ``new``, ``last``, ``last_per_subject``, ``by_start_offset`` with
        ``opt_start_offset`` (an offset for every partition, or ``{partition:
        offset}``), ``by_start_time`` with ``opt_start_time`` (a datetime or ns since
        the epoch)), ``ack_policy`` (``explicit``, ``none``, ``all``), ``ack_wait``
        (seconds or a timedelta), ``max_deliver``, ``backoff`` (a list of durations),
        ``max_ack_pending``, ``max_waiting``, ``mode`` (``shared`` or
        ``partitioned``), ``member_timeout``, ``description``, and ttlbroker's
        ``dead_letter_subject`` (where a copy of each message given up after
        ``max_deliver`` or terminated is published; ``info.dead_lettered`` counts
        them by reason).

        Raises:
            ConsumerExistsError: it exists with another configuration.
            ConsumerFiltersOverlapError, InvalidConsumerConfigError, StreamNotFoundError,
            TopicNotFoundError.
        """
        r = await self._request(P.CreateConsumer(Identifier.of(stream), Identifier.of(topic), name, consumer_config(**config)))
        return ConsumerInfo(r.values)

    async def update_consumer(self, stream: int | str, topic: int | str, name: str, **config: Any) -> ConsumerInfo:
        """Replace a consumer's configuration (the whole new one; fields that cannot
        change must stay as they are: ConsumerUpdateDeniedError)."""
        r = await self._request(P.UpdateConsumer(Identifier.of(stream), Identifier.of(topic), name, consumer_config(**config)))
        return ConsumerInfo(r.values)

    async def redrive(self, stream: int | str, topic: int | str, dry_run: bool = False) -> dict[str, Any]:
        """Publish the dead letters ``topic`` stored since its last redrive again on
        their original subjects, each at most once (``dry_run``: only count them);
        returns ``{"redriven": n, "skipped": n, "dry_run": bool}``."""
        r = await self._request(P.Redrive(Identifier.of(stream), Identifier.of(topic), P.REDRIVE_DRY_RUN if dry_run else 0))
        return dict(r.values)

    async def consumer_info(self, stream: int | str, topic: int | str, name: str) -> ConsumerInfo:
        """Raises: ConsumerNotFoundError."""
        r = await self._request(P.ConsumerInfoRequest(Identifier.of(stream), Identifier.of(topic), name))
        return ConsumerInfo(r.values)

    async def list_consumers(self, stream: int | str, topic: int | str) -> list[ConsumerInfo]:
        r = await self._request(P.ListConsumers(Identifier.of(stream), Identifier.of(topic)))
        return [ConsumerInfo(v) for v in r.values.get("consumers", [])]

    async def delete_consumer(self, stream: int | str, topic: int | str, name: str) -> None:
        """Delete a consumer and all its state. Raises: ConsumerNotFoundError."""
        await self._request(P.DeleteConsumer(Identifier.of(stream), Identifier.of(topic), name))
        self._ackers.pop((Identifier.of(stream), Identifier.of(topic), name), None)

    async def join_group(self, stream: int | str, topic: int | str, name: str, member: str) -> dict[str, Any]:
        """Join a ``partitioned`` consumer as ``member`` (this connection); returns
        ``{"member": ..., "partitions": [...]}``. ``consume(member=...)`` does this
        for you, again after each reconnection."""
        r = await self._request(P.JoinGroup(Identifier.of(stream), Identifier.of(topic), name, member))
        return dict(r.values)

    async def leave_group(self, stream: int | str, topic: int | str, name: str) -> None:
        await self._request(P.LeaveGroup(Identifier.of(stream), Identifier.of(topic), name))

    # -- messages -----------------------------------------------------------------

    async def pull(
        self,
        stream: int | str,
        topic: int | str,
        name: str,
        batch: int = 1,
        *,
        max_bytes: int = 0,
        expires: float | _dt.timedelta | None = None,
        no_wait: bool = False,
    ) -> list[ConsumerMessage]:
        """Up to ``batch`` messages from a consumer, waiting up to ``expires``
        seconds (default 5) for them to arrive; ``no_wait`` answers at once with what
        is ready (maybe nothing). Settle each with its ``ack``/``nak``/``term``/
        ``in_progress``.

        Raises:
            ConsumerNotFoundError, MaxWaitingExceededError, NotAMemberError, ...
            ConnectionLostError: the connection dropped with the pull in flight
                (messages it delivered are delivered again after their ack wait).
            TimeoutError: no answer (nor connection) within ``expires`` plus the
                client's timeout.
        """
        if batch < 1:
            raise ValueError("batch must be at least 1")
        if no_wait:
            expires_ms, flags = 0, PULL_NO_WAIT
            wait = 0.0
        else:
            wait = DEFAULT_PULL_EXPIRES if expires is None else _seconds(expires, "expires")
            expires_ms, flags = min(max(round(wait * 1000), 1), _U32_MAX), 0
        acker = self._acker(stream, topic, name)
        cmd = P.Pull(acker.stream, acker.topic, name, batch, max_bytes, expires_ms, flags)
        limit = None if self._timeout is None else self._timeout + wait
        try:
            with self._backend.timeout(limit):
                while True:
                    conn = await self._wait_connected()
                    sink = _OnePull(self._backend.waiter())
                    call = _PullCall(acker, sink, batch, conn)
                    corr = next(self._corr) & 0xFFFFFFFF or next(self._corr)
                    conn.pending[corr] = call
                    self._write_request(conn, conn.proto.send_request(corr, cmd))
                    try:
                        await sink.waiter.wait()
                    except ConnectionLostError:
                        raise
                    except BrokerError as err:
                        if err.code != ErrorCode.SHUTTING_DOWN or not self._reconnect or self.closed:
                            raise
                        await conn.gone.wait()
                        continue
                    except BaseException:
                        call.abandon()  # cancelled: NAK what still comes for it
                        raise
                    return sink.messages
        except TimeoutError as exc:
            raise self._timeout_error(exc) from None

    def consume(
        self,
        stream: int | str,
        topic: int | str,
        name: str,
        *,
        batch: int = 500,
        expires: float | _dt.timedelta = 30.0,
        max_bytes: int = 0,
        member: str | None = None,
    ) -> MessageStream:
        """Process a consumer's messages as they come::

            async with client.consume("shop", "orders", "billing") as messages:
                async for m in messages:
                    ...
                    await m.ack()

        Keeps pulls of ``batch`` messages in flight (each waiting up to ``expires``
        seconds) with at most about ``2 × batch`` buffered. ``member``: join the
        (partitioned) consumer's group under that name first, and leave it at the
        end. Leaving the block sends the queued acks (and waits until they are
        durable), and NAKs what was received but not handed out. See
        :class:`MessageStream` for reconnections.
        """
        return MessageStream(
            self, stream, topic, name, batch=batch, expires=_seconds(expires, "expires"), max_bytes=max_bytes, member=member,
        )
