"""Requests: the request path of the client and the broker's commands.

:class:`Requests` adds to :class:`~._connection.Connection` what happens to a request
when the connection is down or goes (wait for the reconnection within the timeout;
fail with :class:`ConnectionLostError` or send it again, as ``_client.py`` says), and
the commands on streams, topics, messages, core subscriptions and consumer offsets.
KV buckets (``_kv.py``) and durable consumers (``_consumers.py``) are built on it.

Request/reply (NATS's, across both protocols): :meth:`Requests.request` publishes
with a reply subject of the client's own inbox, ``_INBOX.<id>.<n>``, and waits for
the first message on it. As nats-py does, every request of a client shares one
wildcard subscription, ``_INBOX.<id>.*``, made at the first request (and made again
with the others after a reconnection): each reply completes the request whose ``n``
it carries (:class:`_Inbox`), with no task. :meth:`Requests.respond` answers a
message that carries a reply subject (``Message.reply``).
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import protocol as P
from protocol import EXPIRY_NONE, Ack, Acks, BrokerError, Command, ErrorCode, Identifier, Message

from ._backend import Event, Waiter
from ._connection import Connection, Subscription, _Conn
from ._errors import ConnectionClosedError, ConnectionLostError, NoRespondersError
from ._messages import MSG_ID_HEADER, Fetched, Msg, MsgTuple, encode_msg, has_msg_id

__all__ = ["Requests", "new_inbox", "INBOX_PREFIX"]

#: Where the inboxes of replies live, as in NATS (nats-py's ``new_inbox()``).
INBOX_PREFIX = "_INBOX."
_NUID_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NO_TOPIC = ErrorCode.NO_TOPIC_FOR_SUBJECT


def new_inbox() -> str:
    """A subject no one else uses, ``_INBOX.`` and 22 random characters of base 62
    (the length of a NATS NUID: 131 random bits)."""
    return INBOX_PREFIX + "".join(secrets.choice(_NUID_ALPHABET) for _ in range(22))


def _is_no_responders(m: Message) -> bool:
    """The broker's no-responders status message (``Status: 503``, no payload)."""
    return not m.payload and bool(m.headers_raw) and m.headers.get("Status") == "503"


class _Inbox(Subscription):
    """The one subscription, ``<inbox>.*``, that takes the replies of all of a
    client's requests: a reply completes the waiter of the request whose token (the
    last token of the reply subject) it carries, the first reply only; nothing is
    queued. Once made (``ready`` set), ``closed`` says whether it failed or ended."""

    def __init__(self, client: Connection, sid: int, prefix: str, ready: Event) -> None:
        super().__init__(client, sid, prefix + ".*", 1)
        self.prefix_len = len(prefix) + 1
        self.waiting: dict[str, Waiter] = {}
        self.ready = ready

    def _deliver(self, messages: Iterable[Message]) -> None:
        for m in messages:
            w = self.waiting.pop(m.subject[self.prefix_len :], None)
            if w is not None:
                w.set_result(m)

    def _end(self, error: BaseException | None = None) -> None:
        if not self.closed:
            why = error or self._client.close_reason or ConnectionClosedError("the client's inbox subscription ended")
            waiting, self.waiting = self.waiting, {}
            for w in waiting.values():
                w.set_exception(why)
        super()._end(error)


class Requests(Connection):
    """The requests of a :class:`~broker.client.Client`: how each is sent and
    answered, and the broker's commands (the client's public methods but those of
    KV buckets and durable consumers)."""

    def _init_parts(self) -> None:
        super()._init_parts()
        #: The subscription of the requests' replies (made at the first request).
        self._inbox: _Inbox | None = None
        self._request_tokens = itertools.count(1)

    # -- the request path ------------------------------------------------------------

    # ``command`` is a protocol request (its base class is private to ``protocol``) and
    # the answer is whatever response that command has: both are typed Any here.
    async def _request(self, command: Any, retry: bool | Callable[[], bool] = False) -> Any:
        """Send a request and wait for its answer, within the timeout; wait for a
        reconnection first if the connection is down. ``retry`` (or what it returns,
        asked only then): the request may be sent again after a reconnection if the
        connection drops with it in flight."""
        return await self._call(command.CODE, command.encode(), retry)

    async def _call(self, code: int, payload: bytes, retry: bool | Callable[[], bool] = False) -> Any:
        """:meth:`_request` for a payload already encoded (``code``: its Command).

        With the connection up (the common case) this is one frame written and one
        waiter whose timeout shares a timer with every other request's
        (``Backend.waiter``): no task, no cancel scope, no timer of its own. What
        happens after a loss or a refusal goes to :meth:`_call_again`."""
        conn = self._conn
        if conn is None or conn.lost is not None:
            return await self._call_again(code, payload, retry, self._timeout, None)
        corr = next(self._corr) & 0xFFFFFFFF or next(self._corr)
        w = self._backend.waiter(self._timeout)
        pending = conn.pending
        pending[corr] = w
        if self._queued:
            self._flush_queued()  # (:meth:`_write_request`, inline: the hot path)
        conn.link.write(P.encode_frame(code, 0, corr, 0, payload))
        try:
            return await w.wait()
        except TimeoutError as exc:
            raise self._timeout_error(exc) from None
        except ConnectionLostError:
            if not self._sends_again(retry):
                raise
            again = None
        except BrokerError as err:
            if not self._sends_again(retry, err):
                raise
            again = conn
        finally:
            if pending.pop(corr, None) is not None:
                w.cancel()  # abandoned: timed out, or our caller was cancelled
        left = None if self._timeout is None else w.deadline - self._backend.now()
        return await self._call_again(code, payload, retry, left, again)

    async def _call_again(
        self, code: int, payload: bytes, retry: bool | Callable[[], bool], seconds: float | None, gone: _Conn | None,
    ) -> Any:
        """The rest of :meth:`_call`: wait for a connection (after ``gone`` ends, when
        given), send, and again after a loss (if ``retry``) or a SHUTTING_DOWN
        refusal, all within ``seconds``."""
        conn = None
        try:
            with self._backend.timeout(seconds, self._timeout):
                if gone is not None:
                    await gone.gone.wait()
                while True:
                    if conn is None:
                        conn = await self._wait_connected()
                    try:
                        return await self._roundtrip(conn, code, payload)
                    except ConnectionLostError:
                        if not self._sends_again(retry):
                            raise
                    except BrokerError as err:
                        if not self._sends_again(retry, err):
                            raise
                        await conn.gone.wait()
                    conn = None
        except TimeoutError as exc:
            raise self._timeout_error(exc) from None

    def _sends_again(self, retry: bool | Callable[[], bool], refusal: BrokerError | None = None) -> bool:
        """Whether a request goes again once reconnected: after a loss with it in
        flight when ``retry`` says so; after a ``refusal``, when the broker refused
        it on its way down (SHUTTING_DOWN: not carried out)."""
        if not self._reconnect or self.closed:
            return False
        if refusal is not None:
            return refusal.code == ErrorCode.SHUTTING_DOWN
        return retry() if callable(retry) else retry

    def _timeout_error(self, exc: TimeoutError) -> TimeoutError:
        """The timeout, saying so when the connection is down."""
        if self._conn is None and not self.closed and self.last_error is not None:
            return TimeoutError(f"{exc}: the connection is down ({self.last_error.reason}) and the client is still reconnecting")
        return exc

    async def _send_no_ack(self, command: Any) -> None:
        """Send a request that gets no response (waiting for a connection first)."""
        conn = self._conn
        if conn is None:
            with self._backend.timeout(self._timeout):
                conn = await self._wait_connected()
        self._write_request(conn, conn.proto.send_request(0, command))
        await conn.link.drain()

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
                ``segment_size``, ``storage="memory"``, the limits ``max_msgs``, ``max_bytes``,
                ``max_msg_size``, ``max_consumers`` with ``discard`` and
                ``discard_new_per_subject``, ...: ``docs/protocol.md``).
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
        reply: str | None = None,
    ) -> Ack | None:
        """Publish one message and wait for its ack.

        ``reply``: a reply subject the message carries to the core subscribers (a
        request: what :meth:`request` does, with its own inbox). A subscriber that
        reads it as ``Message.reply`` answers with :meth:`respond`. A request no
        subscriber takes makes the broker send the no-responders status message
        (``Status: 503``) to this client's subscriptions that match ``reply``.

        A message with a ``Nats-Msg-Id`` header is sent again after a reconnection if
        the connection dropped before its ack came: the topic's duplicate window
        (``duplicate_window``) makes the broker store it once. Without one, the loss
        raises :class:`ConnectionLostError` (it may or may not have been stored).
        ``ack=False`` sends and forgets (at most once).

        Raises:
            BrokerError: the message was not stored (its ack's error); for a subject no
                topic captures that is NoTopicForSubjectError (core subscribers still
                received it).
            ConnectionLostError: the connection dropped with the publish in flight.
            TimeoutError: no ack (or no connection) within the client's timeout.
        """
        if reply is not None:
            return await self._publish_with_reply(reply, encode_msg(subject, payload, headers, ttl), ack)
        if not ack:
            await self._send_no_ack(P.Publish.from_bodies([encode_msg(subject, payload, headers, ttl)], P.PUBLISH_NO_ACK))
            return None
        retry = headers is not None and MSG_ID_HEADER in headers
        a = Acks.first(await self._call(Command.PUBLISH, encode_msg(subject, payload, headers, ttl, prefix=P.PUBLISH_ONE), retry))
        if a.error is not None:
            raise a.error
        return a

    async def _publish_with_reply(self, reply: str, body: bytes, ack: bool, unrouted_ok: bool = False) -> Ack | None:
        """One message carrying ``reply``; ``unrouted_ok``: a subject no topic
        captures is no error (a request's, a reply's)."""
        if not ack:
            await self._send_no_ack(P.PublishWithReply.to(reply, [body], P.PUBLISH_NO_ACK))
            return None
        a = Acks.first(await self._call(Command.PUBLISH, P.PublishWithReply.to(reply, [body]).encode(), has_msg_id(body)))
        if a.error is not None and not (unrouted_ok and a.error.code == _NO_TOPIC):
            raise a.error
        return a

    def new_inbox(self) -> str:
        """A fresh subject to take replies on (``_INBOX.`` and 22 random characters),
        as nats-py's ``new_inbox()``: subscribe to it, then publish with ``reply=``."""
        return new_inbox()

    async def request(
        self,
        subject: str,
        payload: bytes | str = b"",
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Message:
        """Publish a request and return the first reply (NATS request/reply, with
        subscribers of either protocol: a nats-py ``nc.subscribe`` callback's
        ``msg.respond`` answers it as :meth:`respond` does).

        The request carries a reply subject of the client's inbox (see the module
        docstring); its ack is awaited first, so a refusal (an invalid subject,
        permissions) raises the broker's error. ``timeout``: seconds to wait for the
        reply, from the call (default: the client's timeout).

        Raises:
            NoRespondersError: no subscriber took the request (the broker says so at
                once, as nats-server does).
            TimeoutError: no reply within ``timeout``.
            BrokerError: the broker refused the request.
        """
        seconds = self._timeout if timeout is None else timeout
        inbox = await self._inbox_for_requests()
        token = str(next(self._request_tokens))
        w = self._backend.waiter(seconds)
        inbox.waiting[token] = w
        try:
            await self._publish_with_reply(inbox.subject_filter[:-1] + token, encode_msg(subject, payload, headers), True, True)
            m: Message = await w.wait()
        except TimeoutError:
            raise TimeoutError(f"no reply to the request on {subject!r} within {seconds:g} s") from None
        finally:
            inbox.waiting.pop(token, None)
            w.cancel()
        if _is_no_responders(m):
            raise NoRespondersError(subject)
        return m

    async def respond(
        self, message: Message, payload: bytes | str = b"", *, headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer ``message`` (a request): publish ``payload`` on its reply subject,
        as nats-py's ``msg.respond`` does.

        Raises:
            ValueError: the message carries no reply subject.
            BrokerError: the broker refused the answer.
        """
        if not message.reply:
            raise ValueError(f"the message on {message.subject!r} carries no reply subject: there is nobody to answer")
        a = Acks.first(await self._call(Command.PUBLISH, encode_msg(message.reply, payload, headers, prefix=P.PUBLISH_ONE)))
        if a.error is not None and a.error.code != _NO_TOPIC:
            raise a.error

    async def _inbox_for_requests(self) -> _Inbox:
        """The subscription the replies of requests come on, made at the first
        request (the requests of the meantime wait for it)."""
        while True:
            inbox = self._inbox
            if inbox is not None:
                if not inbox.ready.is_set():
                    await inbox.ready.wait()
                    continue
                if not inbox.closed:
                    return inbox
            sid = next(self._sids)
            inbox = self._inbox = _Inbox(self, sid, new_inbox(), self._backend.event())
            try:
                await self._subscribe(inbox)
            except BaseException:
                self._inbox = None
                raise
            finally:
                inbox.ready.set()
            return inbox

    async def publish_batch(self, messages: Iterable[Msg | MsgTuple | bytes], *, ack: bool = True) -> Acks | None:
        """Publish many messages in one frame; one ack each, in order (errors are in
        the acks, not raised: see ``Acks.raise_for_errors``).

        ``messages`` may hold :class:`Msg`, ``(subject, payload[, headers[, ttl]])``
        tuples, or bodies already encoded with ``encode_msg``. A batch whose every
        message has a ``Nats-Msg-Id`` header is sent again after a reconnection, as
        :meth:`publish` does; any other raises :class:`ConnectionLostError`.
        """
        bodies = [m if isinstance(m, (bytes, bytearray)) else encode_msg(*m) for m in messages]
        cmd = P.Publish.from_bodies(bodies, 0 if ack else P.PUBLISH_NO_ACK)
        if not ack:
            await self._send_no_ack(cmd)
            return None
        # The acks come as their raw payload (``_feed``).
        return Acks.decode(await self._request(cmd, lambda: bool(bodies) and all(has_msg_id(b) for b in bodies)))

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
        once (stored or not). A request's messages carry its reply subject
        (``Message.reply``): answer with :meth:`respond`."""
        sub = Subscription(self, next(self._sids), subject_filter, max_pending)
        await self._subscribe(sub)
        return sub

    async def _subscribe(self, sub: Subscription) -> None:
        """Make ``sub`` on the broker (and keep it across reconnections)."""
        sid = sub.sid
        self._subs[sid] = sub  # before the answer: deliveries may come with it
        try:
            with self._backend.timeout(self._timeout):
                while True:
                    conn = await self._wait_connected()
                    if sub._error is not None:
                        raise sub._error
                    if sub._conn is conn:
                        break  # a reconnection subscribed it meanwhile
                    try:
                        await self._roundtrip(conn, self._subscribe_command(sub))
                    except ConnectionLostError:
                        # The broker forgot it with the connection: subscribe again.
                        if not self._reconnect or self.closed:
                            raise
                        continue
                    except BrokerError as err:
                        if err.code != ErrorCode.SHUTTING_DOWN or not self._reconnect or self.closed:
                            raise
                        await conn.gone.wait()
                        continue
                    sub._conn = conn
                    break
        except TimeoutError as exc:
            self._subs.pop(sid, None)
            sub._end()
            raise self._timeout_error(exc) from None
        except BaseException:
            self._subs.pop(sid, None)
            sub._end()
            raise

    # -- consumer offsets ------------------------------------------------------------

    async def store_offset(self, stream: int | str, topic: int | str, consumer: str, partition: int, offset: int) -> None:
        await self._request(P.StoreConsumerOffset(Identifier.of(stream), Identifier.of(topic), partition, consumer, offset))

    async def get_offset(self, stream: int | str, topic: int | str, consumer: str, partition: int) -> int:
        """Raises: ConsumerOffsetNotFoundError."""
        r = await self._request(P.GetConsumerOffset(Identifier.of(stream), Identifier.of(topic), partition, consumer))
        return r.offset

    async def delete_offset(self, stream: int | str, topic: int | str, consumer: str, partition: int) -> None:
        await self._request(P.DeleteConsumerOffset(Identifier.of(stream), Identifier.of(topic), partition, consumer))

