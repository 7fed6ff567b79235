"""The client, written once for both runtimes.

A :class:`Client` holds one connection: a background reader task turns frames into
events (``protocol.ProtocolConnection``) and completes the waiting request or feeds a
subscription; a background writer task sends everything queued in one write, so
concurrent requests are pipelined and coalesced. Requests are matched to responses by
correlation id. Error statuses become the matching :class:`protocol.BrokerError`
subclass (``StreamNotFoundError``, ``InvalidSubjectError``, ...), carrying ``code`` and
``message``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import protocol as P
from protocol import (
    EXPIRY_NONE,
    NEED_DATA,
    PROTOCOL_VERSION,
    TTL_NEVER,
    Ack,
    Acks,
    BrokerError,
    ErrorResponse,
    Identifier,
    Message,
    Push,
    PushKind,
    Response,
    Role,
)

from ._backend import Backend, QueueClosed, QueueFull
from ._kv import KV_STREAM, KeyValue, validate_bucket

__all__ = ["Client", "Msg", "Fetched", "Subscription", "ConnectionClosedError", "parse_address"]

DEFAULT_PORT = 8090


class ConnectionClosedError(ConnectionError):
    """The connection to the broker is gone; ``reason`` says why, if known."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"``, ``"host"`` or ``":port"`` → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep:
        return address or "127.0.0.1", DEFAULT_PORT
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "127.0.0.1", int(port)


class Msg(NamedTuple):
    """A message to publish.

    ``ttl``: seconds (int) or ``"never"`` for the binary TTL field; a ``Nats-TTL``
    header is the other way to give one.
    """

    subject: str
    payload: bytes | str = b""
    headers: Mapping[str, str] | None = None
    ttl: int | str | None = None


def _ttl_field(ttl: int | str | None) -> int:
    if ttl is None:
        return 0
    if isinstance(ttl, str):
        if ttl.lower() == "never":
            return TTL_NEVER
        raise ValueError(f"ttl must be seconds or 'never', not {ttl!r} (send other forms as a Nats-TTL header)")
    if not 0 <= ttl < TTL_NEVER:
        raise ValueError(f"ttl {ttl} does not fit the u32 TTL field")
    return ttl


def encode_msg(subject: str, payload: bytes | str = b"", headers: Mapping[str, str] | None = None, ttl: int | str | None = None) -> bytes:
    raw = payload.encode() if isinstance(payload, str) else payload
    return P.encode_body(subject, raw, P.encode_headers(headers) if headers else b"", _ttl_field(ttl))


@dataclass(frozen=True)
class Fetched:
    """The answer to a fetch: messages and where to continue."""

    messages: list[Message]
    next_offset: int
    first_offset: int
    last_offset: int
    partition: int

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)


class Subscription:
    """A core subscription: an async iterator of :class:`Message`, and an async
    context manager that unsubscribes on exit.

    Attributes:
        subject_filter: what it subscribed to.
        dropped: messages discarded because more than ``max_pending`` were waiting
            to be read (core delivery is at most once; read faster or raise the
            limit).
    """

    def __init__(self, client: Client, sid: int, subject_filter: str, max_pending: int) -> None:
        self._client = client
        self.sid = sid
        self.subject_filter = subject_filter
        self._queue = client._backend.queue(max_pending)
        self.dropped = 0
        self.closed = False

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def _deliver(self, messages: Iterable[Message]) -> None:
        for m in messages:
            try:
                self._queue.put_nowait(m)
            except QueueFull:
                self.dropped += 1
            except QueueClosed:
                return

    async def next(self, timeout: float | None = None) -> Message:
        """The next message.

        Raises:
            TimeoutError: none arrived within ``timeout`` seconds.
            StopAsyncIteration: the subscription or the connection was closed.
        """
        with self._client._backend.timeout(timeout):
            try:
                return await self._queue.get()
            except QueueClosed:
                raise StopAsyncIteration from None

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        return await self.next()

    async def unsubscribe(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._client._subs.pop(self.sid, None)
        self._queue.close()
        if not self._client.closed:
            await self._client._request(P.Unsubscribe(self.sid))

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unsubscribe()


class Client:
    """A connection to a broker. Build one with ``broker.client.connect`` (trio) or
    ``broker.client.aio.connect`` (asyncio); both give this same class.

    Args:
        backend: the runtime backend.
        timeout: seconds to wait for any one response (None = forever).
    """

    def __init__(self, backend: Backend, timeout: float | None = 30.0) -> None:
        self._backend = backend
        self._timeout = timeout
        self._conn = P.ProtocolConnection(Role.CLIENT)
        self._corr = itertools.count(1)
        self._sids = itertools.count(1)
        self._pending: dict[int, Any] = {}
        self._subs: dict[int, Subscription] = {}
        self._link: Any = None
        self.closed = False
        self.close_reason: ConnectionClosedError | None = None
        self._goodbye: ConnectionClosedError | None = None
        self.server_info: dict[str, Any] = {}

    # -- connection ------------------------------------------------------------------

    async def _open(self, host: str, port: int, token: str = "", name: str = "ttlbroker-python") -> None:
        self._link = await self._backend.open_link(host, port, self._feed, self._lost)
        try:
            ok = await self._request(P.Handshake(PROTOCOL_VERSION, token, name))
        except BaseException:
            await self.aclose()
            raise
        self.server_info = ok.info

    async def aclose(self) -> None:
        """Close the connection (pending requests fail with ConnectionClosedError)."""
        link, self._link = self._link, None
        if link is None:
            return
        self._fail_all(ConnectionClosedError("the client closed the connection"))
        await link.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _fail_all(self, err: ConnectionClosedError) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = err
        pending, self._pending = self._pending, {}
        for w in pending.values():
            w.set_exception(err)
        for sub in list(self._subs.values()):
            sub._queue.close()

    def _lost(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        reason = self._goodbye or ConnectionClosedError(
            f"connection lost: {exc!r}" if exc is not None else "the broker closed the connection"
        )
        self._fail_all(reason)

    def _feed(self, data: bytes) -> None:
        """Bytes from the broker (called by the link, never concurrently)."""
        conn = self._conn
        try:
            conn.receive_data(data)
            while True:
                event = conn.next_event()
                if event is NEED_DATA:
                    return
                cls = event.__class__
                if cls is Response:
                    w = self._pending.pop(event.correlation_id, None)  # type: ignore[union-attr]
                    if w is not None:
                        w.set_result(event.result)  # type: ignore[union-attr]
                elif cls is ErrorResponse:
                    w = self._pending.pop(event.correlation_id, None)  # type: ignore[union-attr]
                    if w is not None:
                        w.set_exception(event.error)  # type: ignore[union-attr]
                elif cls is Push:
                    self._on_push(event)  # type: ignore[arg-type]
        except P.RemoteProtocolError as exc:
            self._fail_all(ConnectionClosedError(f"the broker broke the protocol: {exc}"))

    def _on_push(self, event: Push) -> None:
        if event.kind == PushKind.DELIVERY:
            delivery = event.value
            sub = self._subs.get(delivery.subscription_id)  # type: ignore[attr-defined]
            if sub is not None:
                sub._deliver(delivery.messages)  # type: ignore[attr-defined]
        elif event.kind == PushKind.GOODBYE:
            code = event.status
            text = event.value.reason  # type: ignore[attr-defined]
            err = BrokerError.from_code(code, text) if code else None
            self._goodbye = ConnectionClosedError(f"the broker said goodbye: {text}", code)
            if err is not None:
                self._goodbye.__cause__ = err
                # A goodbye on a connection still handshaking answers the handshake.
                pending, self._pending = self._pending, {}
                for w in pending.values():
                    w.set_exception(err)

    def _send(self, frame: bytes) -> None:
        self._link.write(frame)

    async def _request(self, command: Any) -> Any:
        if self.closed:
            raise self.close_reason or ConnectionClosedError("the connection is closed")
        corr = next(self._corr) & 0xFFFFFFFF or next(self._corr)
        waiter = self._backend.waiter()
        self._pending[corr] = waiter
        self._link.write(self._conn.send_request(corr, command))
        try:
            with self._backend.timeout(self._timeout):
                return await waiter.wait()
        finally:
            self._pending.pop(corr, None)

    # -- server --------------------------------------------------------------------

    async def ping(self) -> float:
        """Round trip time in seconds."""
        t = time.perf_counter()
        await self._request(P.Ping())
        return time.perf_counter() - t

    async def info(self) -> dict[str, Any]:
        return (await self._request(P.GetServerInfo())).values

    async def stats(self) -> dict[str, Any]:
        return (await self._request(P.GetStats())).values

    # -- KV buckets --------------------------------------------------------------------

    async def kv_create(
        self,
        bucket: str,
        *,
        history: int = 1,
        ttl: int = 0,
        refresh: str = "on_write",
        visibility: str = "never_return_expired",
        marker_ttl: int = 60,
    ) -> KeyValue:
        """Create a KV bucket (FLIP-25 semantics; ``docs/semantics.md``).

        Args:
            history: revisions kept per key.
            ttl: default TTL of a key in seconds (0: keys live until deleted).
            refresh: ``on_write`` (a put restarts the TTL) or ``on_read_and_write``
                (a get does too).
            visibility: ``never_return_expired`` or ``return_expired_if_not_cleaned_up``.
            marker_ttl: how long the marker an expired key leaves stays, in seconds.

        Raises:
            InvalidKeyError: a bad bucket name. TopicNameExistsError: it exists.
        """
        name = validate_bucket(bucket)
        try:
            await self.create_stream(KV_STREAM)
        except P.BrokerError as err:
            if err.code != P.ErrorCode.STREAM_NAME_EXISTS:
                raise
        info = await self.create_topic(
            KV_STREAM, name, partitions=1, message_expiry=0, subjects=[f"$KV.{name}.>"],
            max_msgs_per_subject=history, allow_msg_ttl=True, allow_rollup=True, subject_delete_marker_ttl=marker_ttl,
            kv={"ttl": ttl, "refresh": refresh, "visibility": visibility},
        )
        return KeyValue(self, name, info)

    async def kv(self, bucket: str) -> KeyValue:
        """An existing bucket.

        Raises:
            StreamNotFoundError / TopicNotFoundError: no such bucket. NotABucketError.
        """
        name = validate_bucket(bucket)
        info = await self.get_topic(KV_STREAM, name)
        if not info.options.get("kv"):
            raise P.error_class(P.ErrorCode.NOT_A_BUCKET)(f"topic {KV_STREAM}/{name} is not a KV bucket")
        return KeyValue(self, name, info)

    async def export(self, *, seal: bool = False) -> dict[str, Any]:
        """Export sealed segments to Parquet now (``seal``: seal the active segments
        first, so that everything stored so far is exported). Returns ``dir``,
        ``sealed``, ``exported`` (one entry per segment) and ``segments_in_export``.

        Raises:
            ExportNotConfiguredError: the broker has no export directory.
        """
        return (await self._request(P.Export(P.EXPORT_SEAL if seal else 0))).values

    # -- streams and topics ----------------------------------------------------------

    async def create_stream(self, name: str, stream_id: int = 0) -> P.StreamDetails:
        return await self._request(P.CreateStream(stream_id, name))

    async def get_stream(self, stream: int | str) -> P.StreamDetails:
        return await self._request(P.GetStream(Identifier.of(stream)))

    async def list_streams(self) -> list[P.StreamDetails]:
        return list((await self._request(P.ListStreams())).streams)

    async def update_stream(self, stream: int | str, name: str) -> P.StreamDetails:
        return await self._request(P.UpdateStream(Identifier.of(stream), name))

    async def delete_stream(self, stream: int | str) -> None:
        await self._request(P.DeleteStream(Identifier.of(stream)))

    async def create_topic(
        self,
        stream: int | str,
        name: str,
        partitions: int = 1,
        message_expiry: int | None = None,
        subjects: list[str] | None = None,
        topic_id: int = 0,
        **options: Any,
    ) -> P.TopicDetails:
        """Create a topic.

        Args:
            message_expiry: max age in seconds; ``None`` = the broker's default
                (``[system.segment] message_expiry``), ``0`` = none.
            subjects: the subject filters it captures (default
                ``["<stream>.<topic>.>"]``).
            options: further topic options (``max_msgs_per_subject``, ``deny_purge``,
                ``segment_size``, ...).
        """
        expiry = 0 if message_expiry is None else (EXPIRY_NONE if message_expiry == 0 else message_expiry)
        if subjects is not None:
            options["subjects"] = list(subjects)
        return await self._request(P.CreateTopic(Identifier.of(stream), topic_id, partitions, expiry, name, options))

    async def update_topic(self, stream: int | str, topic: int | str, **changes: Any) -> P.TopicDetails:
        """Change topic options (``message_expiry``, ``subjects``, ...); only the
        keys given change."""
        if "subjects" in changes and changes["subjects"] is not None:
            changes["subjects"] = list(changes["subjects"])
        return await self._request(P.UpdateTopic(Identifier.of(stream), Identifier.of(topic), changes))

    async def get_topic(self, stream: int | str, topic: int | str) -> P.TopicDetails:
        return await self._request(P.GetTopic(Identifier.of(stream), Identifier.of(topic)))

    async def list_topics(self, stream: int | str) -> list[P.TopicDetails]:
        return list((await self._request(P.ListTopics(Identifier.of(stream)))).topics)

    async def delete_topic(self, stream: int | str, topic: int | str) -> None:
        await self._request(P.DeleteTopic(Identifier.of(stream), Identifier.of(topic)))

    # -- messages --------------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        payload: bytes | str = b"",
        *,
        headers: Mapping[str, str] | None = None,
        ttl: int | str | None = None,
        ack: bool = True,
    ) -> Ack | None:
        """Publish one message and wait for its ack.

        Raises:
            BrokerError: the message was not stored (its ack's error); for a subject no
                topic captures that is NoTopicForSubjectError (core subscribers still
                received it).
        """
        body = encode_msg(subject, payload, headers, ttl)
        if not ack:
            self._send(self._conn.send_request(0, P.Publish.from_bodies([body], P.PUBLISH_NO_ACK)))
            await self._link.drain()
            return None
        acks: Acks = await self._request(P.Publish.from_bodies([body]))
        a = acks[0]
        if a.error is not None:
            raise a.error
        return a

    async def publish_batch(self, messages: Iterable[Msg | tuple[Any, ...] | bytes], *, ack: bool = True) -> Acks | None:
        """Publish many messages in one frame; one ack each, in order (errors are in
        the acks, not raised: see ``Acks.raise_for_errors``).

        ``messages`` may hold :class:`Msg`, ``(subject, payload[, headers[, ttl]])``
        tuples, or bodies already encoded with ``encode_msg``.
        """
        bodies = [m if isinstance(m, (bytes, bytearray)) else encode_msg(*m) for m in messages]
        cmd = P.Publish.from_bodies(bodies, 0 if ack else P.PUBLISH_NO_ACK)
        if not ack:
            self._send(self._conn.send_request(0, cmd))
            await self._link.drain()
            return None
        return await self._request(cmd)

    async def fetch(
        self,
        stream: int | str,
        topic: int | str,
        partition: int = 0,
        offset: int = 1,
        count: int = 100,
        *,
        max_bytes: int = 0,
        subject: str | None = None,
    ) -> Fetched:
        """Read up to ``count`` live messages of one partition from ``offset`` on.

        ``subject`` filters by subject (wildcards allowed). ``next_offset`` of the
        result is where to continue.

        Raises:
            CorruptedRecordError: the first record to return is corrupt (fetch from
                the next offset to read past it).
        """
        r: P.FetchResult = await self._request(
            P.Fetch(Identifier.of(stream), Identifier.of(topic), partition, offset, count, max_bytes, subject or "")
        )
        return Fetched(r.messages(), r.next_offset, r.first_offset, r.last_offset, r.partition)

    async def get_last(self, stream: int | str, topic: int | str, subject: str) -> Message:
        """The newest live message on ``subject``.

        Raises:
            MessageNotFoundError: none.
        """
        r: P.FetchResult = await self._request(P.GetLast(Identifier.of(stream), Identifier.of(topic), subject))
        return r.messages()[0]

    async def delete_message(self, stream: int | str, topic: int | str, partition: int, offset: int) -> None:
        await self._request(P.DeleteMessage(Identifier.of(stream), Identifier.of(topic), partition, offset))

    async def purge(self, stream: int | str, topic: int | str, subject: str | None = None) -> int:
        """Remove every message of the topic, or of the subjects matching ``subject``;
        returns how many went."""
        r = await self._request(P.Purge(Identifier.of(stream), Identifier.of(topic), subject or ""))
        return r.purged

    async def subscribe(self, subject_filter: str, *, max_pending: int = 65536) -> Subscription:
        """Receive every message published on matching subjects from now on, at most
        once (stored or not)."""
        sid = next(self._sids)
        sub = Subscription(self, sid, subject_filter, max_pending)
        self._subs[sid] = sub
        try:
            await self._request(P.Subscribe(sid, subject_filter))
        except BaseException:
            self._subs.pop(sid, None)
            raise
        return sub

    # -- consumer offsets ------------------------------------------------------------

    async def store_offset(self, stream: int | str, topic: int | str, consumer: str, partition: int, offset: int) -> None:
        await self._request(P.StoreConsumerOffset(Identifier.of(stream), Identifier.of(topic), partition, consumer, offset))

    async def get_offset(self, stream: int | str, topic: int | str, consumer: str, partition: int) -> int:
        """Raises: ConsumerOffsetNotFoundError."""
        r = await self._request(P.GetConsumerOffset(Identifier.of(stream), Identifier.of(topic), partition, consumer))
        return r.offset

    async def delete_offset(self, stream: int | str, topic: int | str, consumer: str, partition: int) -> None:
        await self._request(P.DeleteConsumerOffset(Identifier.of(stream), Identifier.of(topic), partition, consumer))

