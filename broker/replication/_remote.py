"""A stream on another server as an origin: ``RemoteOrigin``, over a minimal trio
NATS client (``NatsLink``).

The other server is a ttlbroker or a nats-server, named by a ``[[nats.remotes]]``
entry (``broker.config.RemoteSettings``). The broker connects to it as a NATS client
(``INFO``, then TLS when the URL is ``tls://``, the entry has TLS files or the
server's ``INFO`` requires it, then ``CONNECT`` with ``headers`` and
``no_responders``, and the token or user and password) and reads the stream the way
nats-server's own mirrors and sources do (``stream.go``, ``setupMirrorConsumer``,
``setupSourceConsumer``): it creates an ephemeral push consumer on
``<api>.CONSUMER.CREATE.<stream>`` (``<api>`` is the source's ``external.api``, else
``$JS.<domain>.API``), delivering to an inbox of its own, ``ack_policy`` none,
``max_deliver`` 1, ``flow_control``, a one-second ``idle_heartbeat``, starting
``by_start_sequence``, ``by_start_time`` or ``all``, with the filters.

What arrives is read as nats-server's ``processInboundMirrorMsg`` reads it:

* a delivery's sequence, timestamp and pending count come from its ``$JS.ACK``
  reply subject; its header block is kept as it came (``Nats-TTL`` and all);
* ``100`` status messages with a reply subject are flow-control requests. They are
  answered only once the caller asks for the next batch (after it stored the
  batch they followed): that is the backpressure, the remote delivers at most its
  flow-control window ahead of what the copy stored;
* an idle heartbeat is an empty batch (the origin is there); its
  ``Nats-Last-Consumer`` not being the last delivery's consumer sequence, or a
  delivery whose consumer sequence is not the next, is a gap: the consumer is
  created again from the last sequence yielded + 1. A heartbeat's
  ``Nats-Consumer-Stalled`` is a flow-control request the remote thinks
  unanswered, answered the same way;
* nothing at all for ``stall_timeout`` (three heartbeats): a PING; answered, the
  consumer is gone (the remote restarted, the stream was deleted), so it is created
  again; not answered, :class:`OriginUnavailable`.

Sequences yielded only increase: a delivery at or below the last one yielded (one of
a consumer recreated from an older position, or a late one of the old consumer) is
dropped. ``JetStream error 10059`` (stream not found) on the create is
:class:`OriginGone`; a lost or refused connection, a timeout, an ``-ERR`` or any
other refusal is :class:`OriginUnavailable`. The copier retries, with its backoff,
by iterating again.

One connection per iteration of :meth:`RemoteOrigin.batches`, read by the
iterating task itself (no background task, so no nursery is held across a
``yield``): origins of one remote do not share a connection yet. Iterate inside
``contextlib.aclosing`` so that the connection closes as soon as the caller stops.

Bytes are read only by ``protocol.nats.NatsParser(server=False)`` and written only
by its ``encode_*`` functions.
"""

from __future__ import annotations

import itertools
import json
import secrets
import ssl
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import trio

from protocol import BrokerError, RemoteProtocolError
from protocol.nats import (
    NATS_NEED_DATA, PING, PONG, NatsErr, NatsInfo, NatsMsg, NatsParser, NatsPing, NatsPong, decode_nats_headers,
    encode_connect, encode_pub, encode_sub, encode_unsub, json_loads, parse_ack_subject, rfc3339,
)

from broker.config import ConfigError, RemoteSettings
from broker.core import VERSION

from ._origin import OriginGone, OriginMessage, OriginUnavailable

__all__ = ["RemoteOrigin", "NatsLink", "STREAM_NOT_FOUND_CODE"]

NS = 1_000_000_000
#: JetStream's ``err_code`` for "stream not found".
STREAM_NOT_FOUND_CODE = 10059
#: nats-server's ``sourceHealthHB`` and ``sourceHealthCheckInterval``.
HEARTBEAT = 1.0
INACTIVE_THRESHOLD = 10.0
#: nats-server's mirror consumers' ``AckWait`` (unused with ack none, but as sent).
_ACK_WAIT_NS = 22 * 3600 * NS
#: Bytes read from the socket at a time.
_READ_SIZE = 64 * 1024
#: At most this many messages in one batch.
MAX_BATCH = 1024
_CONTROL = b"NATS/1.0 100"


def _token() -> str:
    return secrets.token_hex(11)


class NatsLink:
    """One client connection to a NATS server, read by its owner: :meth:`event` waits
    for the next event (answering the server's PINGs on the way), :meth:`request`
    and :meth:`ping` wait for their answer and keep what else arrived meanwhile for
    :meth:`event`. Every failure is :class:`OriginUnavailable`."""

    def __init__(self, stream: trio.abc.Stream, parser: NatsParser, info: dict[str, Any], label: str) -> None:
        self.stream = stream
        self.parser = parser
        self.info = info
        self.label = label
        self._kept: deque[Any] = deque()
        self._sids = itertools.count(2)
        self._inbox = f"_INBOX.{_token()}"
        self._replies = itertools.count(1)
        self._closed = False

    @classmethod
    async def open(cls, remote: RemoteSettings, timeout: float, name: str = "ttlbroker replication") -> NatsLink:
        """Connect, upgrade to TLS when asked, authenticate, and wait for the PONG
        of the first PING (so a refusal shows here).

        Raises:
            OriginUnavailable: refused, timed out, TLS failed, authentication failed.
        """
        label = f"{remote.domain} ({remote.url})"
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(timeout):
                stream = await trio.open_tcp_stream(remote.host, remote.port)
                parser = NatsParser(server=False)
                link = cls(stream, parser, {}, label)
                ev = await link._next()
                if not isinstance(ev, NatsInfo):
                    raise OriginUnavailable(f"{label}: the server did not start with INFO ({ev!r})")
                info = ev.info
                link.info = info
                mp = info.get("max_payload")
                if isinstance(mp, int) and mp > 0:
                    parser.max_payload = max(mp + 64 * 1024, parser.max_payload)
                tls = remote.tls or bool(info.get("tls_required"))
                if tls:
                    try:
                        ctx = remote.ssl_context()
                    except ConfigError as exc:  # a TLS file gone or changed since the start
                        raise OriginUnavailable(f"{label}: {exc}") from None
                    ssl_stream = trio.SSLStream(stream, ctx, server_hostname=remote.host)
                    await ssl_stream.do_handshake()
                    link.stream = stream = ssl_stream
                options: dict[str, Any] = {
                    "verbose": False, "pedantic": False, "tls_required": tls, "name": name, "lang": "python-ttlbroker",
                    "version": VERSION, "protocol": 1, "headers": True, "no_responders": True,
                }
                if remote.token:
                    options["auth_token"] = remote.token
                if remote.user:
                    options["user"], options["pass"] = remote.user, remote.password
                await link.send(encode_connect(options) + encode_sub(f"{link._inbox}.*", None, "1") + PING)
                while True:
                    ev = await link._next()
                    if ev is NatsPong:
                        break
                    link._kept.append(ev)
                return link
        except trio.TooSlowError:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise OriginUnavailable(f"{label}: no answer to the connection within {timeout:g} s") from None
        except OriginUnavailable:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise
        except OSError as exc:  # refused, unreachable, name not found
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise OriginUnavailable(f"{label}: cannot connect: {exc.strerror or exc}") from None
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            cause = exc.__cause__ or exc
            raise OriginUnavailable(f"{label}: the TLS handshake failed: {cause}") from None
        except BaseException:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await trio.aclose_forcefully(self.stream)

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise OriginUnavailable(f"{self.label}: the connection was lost ({exc!r})") from None

    def new_sid(self) -> str:
        return str(next(self._sids))

    async def _next(self) -> Any:
        """The next event the server sent (PINGs answered, ``-ERR`` raised)."""
        parser = self.parser
        while True:
            try:
                ev = parser.next_event()
            except RemoteProtocolError as exc:
                raise OriginUnavailable(f"{self.label}: the server broke the NATS protocol: {exc}") from None
            if ev is NATS_NEED_DATA:
                try:
                    data = await self.stream.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise OriginUnavailable(f"{self.label}: the connection was lost ({exc!r})") from None
                if not data:
                    raise OriginUnavailable(f"{self.label}: the server closed the connection")
                parser.receive_data(data)
                continue
            if ev is NatsPing:
                await self.send(PONG)
                continue
            if isinstance(ev, NatsErr):
                raise OriginUnavailable(f"{self.label}: the server refused: -ERR '{ev.text}'")
            return ev

    async def event(self, timeout: float) -> Any:
        """The next event, None when nothing came for ``timeout`` seconds."""
        while self._kept:
            ev = self._kept.popleft()
            if ev is NatsPing:
                await self.send(PONG)
            elif ev is not NatsPong:
                return ev
        with trio.move_on_after(timeout):
            return await self._next()
        return None

    def ready_event(self) -> Any:
        """An event already received, without waiting (None: none is complete).

        Raises:
            OriginUnavailable: the server broke the protocol or sent ``-ERR``.
        """
        if self._kept and self._kept[0] is not NatsPing:
            return self._kept.popleft()
        if self._kept:
            return None  # the PING is answered by the next wait
        while True:
            try:
                ev = self.parser.next_event()
            except RemoteProtocolError as exc:
                raise OriginUnavailable(f"{self.label}: the server broke the NATS protocol: {exc}") from None
            if ev is NATS_NEED_DATA:
                return None
            if ev is NatsPing:
                self._kept.append(ev)  # answered by the next wait
                return None
            if isinstance(ev, NatsErr):
                raise OriginUnavailable(f"{self.label}: the server refused: -ERR '{ev.text}'")
            return ev

    async def request(self, subject: str, payload: bytes, timeout: float, headers: bytes | None = None) -> NatsMsg:
        """Publish with a reply inbox and wait for the answer.

        Raises:
            OriginUnavailable: no answer within ``timeout``, or the connection failed.
        """
        reply = f"{self._inbox}.{next(self._replies)}"
        await self.send(encode_pub(subject, reply, headers, payload))
        kept: list[Any] = []
        try:
            with trio.fail_after(timeout):
                while True:
                    ev = await self._next()
                    if isinstance(ev, NatsMsg) and ev.sid == "1":
                        if ev.subject == reply:
                            return ev
                        continue  # the late answer of an earlier request
                    kept.append(ev)
        except trio.TooSlowError:
            raise OriginUnavailable(f"{self.label}: no answer to {subject} within {timeout:g} s") from None
        finally:
            self._kept.extend(kept)

    async def ping(self, timeout: float) -> bool:
        """Whether the server answers a PING within ``timeout``."""
        await self.send(PING)
        kept: list[Any] = []
        try:
            with trio.move_on_after(timeout):
                while True:
                    ev = await self._next()
                    if ev is NatsPong:
                        return True
                    kept.append(ev)
            return False
        finally:
            self._kept.extend(kept)


class RemoteOrigin:
    """A stream on another server, read through a flow-controlled push consumer (see
    the module docstring).

    Args:
        remote: the ``[[nats.remotes]]`` entry of the server.
        stream: the stream's name there.
        api_prefix: the JetStream API to ask; default the remote's
            (``RemoteSettings.api_prefix``: its ``api``, else ``$JS.<domain>.API``).
        deliver_prefix: the prefix of the deliver subject (a source's
            ``external.deliver``); default ``_INBOX``.
        heartbeat: the consumer's ``idle_heartbeat`` in seconds (at least 0.1).
        request_timeout: how long the connection and each API request may take.
        stall_timeout: how long nothing may arrive before the connection is checked
            with a PING and the consumer created again; default 3 heartbeats.
        inactive_threshold: the consumer's ``inactive_threshold`` in seconds (it
            goes that long after this side stops reading).
    """

    def __init__(
        self, remote: RemoteSettings, stream: str, *, api_prefix: str = "", deliver_prefix: str = "",
        heartbeat: float = HEARTBEAT, request_timeout: float = 5.0, stall_timeout: float | None = None,
        inactive_threshold: float = INACTIVE_THRESHOLD,
    ) -> None:
        self.remote = remote
        self.stream = stream
        self.api = api_prefix.rstrip(".") or remote.api_prefix
        self.deliver_prefix = (deliver_prefix or "_INBOX").rstrip(".")
        self.heartbeat = heartbeat
        self.request_timeout = request_timeout
        self.stall_timeout = stall_timeout if stall_timeout is not None else 3 * heartbeat
        self.inactive_threshold = inactive_threshold
        self.label = f"{stream}@{remote.domain}"
        #: Consumers created, and recreated after a gap or a stall, since this
        #: object was made (for stream info and tests).
        self.consumers_created = 0
        self.gaps = 0
        #: Flow-control requests answered.
        self.flow_replies = 0

    @classmethod
    def for_source(cls, remote: RemoteSettings, source: Mapping[str, Any], **kwargs: Any) -> RemoteOrigin:
        """The origin a mirror's or source's configuration (``{"name", "external":
        {"api", "deliver"}, "domain"}``) names on ``remote`` (what
        ``broker.config.remote_for`` chose for it): its stream, asked on the
        remote's API prefix (``external.api`` only chose the remote), delivered
        under ``external.deliver`` when given."""
        external = source.get("external") or {}
        return cls(remote, str(source["name"]), deliver_prefix=str(external.get("deliver") or ""), **kwargs)

    def _create_request(self, deliver: str, start_seq: int, start_time_ns: int | None, filters: tuple[str, ...]) -> bytes:
        config: dict[str, Any] = {
            "deliver_subject": deliver, "ack_policy": "none", "ack_wait": _ACK_WAIT_NS, "max_deliver": 1,
            "flow_control": True, "idle_heartbeat": int(self.heartbeat * NS),
            "inactive_threshold": int(self.inactive_threshold * NS), "replay_policy": "instant",
        }
        if start_seq > 0:
            config["deliver_policy"], config["opt_start_seq"] = "by_start_sequence", start_seq
        elif start_time_ns is not None:
            config["deliver_policy"], config["opt_start_time"] = "by_start_time", rfc3339(start_time_ns)
        else:
            config["deliver_policy"] = "all"
        if len(filters) == 1:
            config["filter_subject"] = filters[0]
        elif filters:
            config["filter_subjects"] = list(filters)
        return json.dumps({"stream_name": self.stream, "config": config}, separators=(",", ":")).encode()

    async def _create(
        self, link: NatsLink, start_seq: int, start_time_ns: int | None, filters: tuple[str, ...],
    ) -> tuple[str, str]:
        """Subscribe to a new deliver subject and create the consumer on it:
        ``(sid, consumer name)``.

        Raises:
            OriginGone: the stream does not exist.
            OriginUnavailable: any other refusal, or no answer.
        """
        deliver = f"{self.deliver_prefix}.{_token()}"
        sid = link.new_sid()
        await link.send(encode_sub(deliver, None, sid))
        subject = f"{self.api}.CONSUMER.CREATE.{self.stream}"
        answer = await link.request(subject, self._create_request(deliver, start_seq, start_time_ns, filters), self.request_timeout)
        if answer.headers and not answer.payload:
            try:
                status, description, _ = decode_nats_headers(answer.headers)
            except BrokerError:
                status, description = None, ""
            if status == 503:
                raise OriginUnavailable(f"{self.label}: nothing answers {subject} (no JetStream there, or not that domain)")
            raise OriginUnavailable(f"{self.label}: {subject} answered status {status} {description}".rstrip())
        try:
            body = json_loads(answer.payload)
        except ValueError:  # a nesting too deep too
            raise OriginUnavailable(f"{self.label}: {subject} answered something that is not JSON") from None
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code, text = err.get("err_code"), err.get("description", "")
            if code == STREAM_NOT_FOUND_CODE:
                raise OriginGone(f"{self.label}: the stream does not exist ({text}, {err.get('code')} {code})")
            raise OriginUnavailable(f"{self.label}: creating the consumer was refused: {text} ({err.get('code')} {code})")
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise OriginUnavailable(f"{self.label}: {subject} answered no consumer")
        self.consumers_created += 1
        return sid, body["name"]

    async def batches(
        self, start_seq: int, start_time_ns: int | None, filters: tuple[str, ...],
    ) -> AsyncGenerator[list[OriginMessage], None]:
        """See ``Origin.batches``."""
        link = await NatsLink.open(self.remote, self.request_timeout)
        try:
            async for batch in self._read(link, start_seq, start_time_ns, filters):
                yield batch
        finally:
            await link.aclose()

    async def _read(
        self, link: NatsLink, start_seq: int, start_time_ns: int | None, filters: tuple[str, ...],
    ) -> AsyncIterator[list[OriginMessage]]:
        #: The last sequence yielded: only later ones are yielded.
        last = start_seq - 1 if start_seq > 0 else 0
        sid, _name = await self._create(link, start_seq, start_time_ns, filters)
        dseq = 0  # the consumer sequence of the current consumer's last delivery
        owed: list[str] = []  # flow-control replies, sent once the caller asks again
        while True:
            ev = await link.event(self.stall_timeout)
            if ev is None:
                if not await link.ping(self.request_timeout):
                    raise OriginUnavailable(f"{self.label}: the server stopped answering")
                ev = _STALLED
            batch: list[OriginMessage] = []
            beat = False
            gap = ev is _STALLED
            while ev is not None and not gap:
                if isinstance(ev, NatsMsg) and ev.sid == sid:
                    headers = ev.headers or b""
                    if not ev.payload and headers.startswith(_CONTROL):
                        if ev.reply:  # a flow-control request
                            owed.append(ev.reply)
                        else:
                            beat = True
                            pairs = _pairs(headers)
                            last_consumer = pairs.get("Nats-Last-Consumer", "")
                            if last_consumer.isdigit() and int(last_consumer) not in (0, dseq):
                                gap = True
                            stalled = pairs.get("Nats-Consumer-Stalled")
                            if stalled and stalled not in owed:
                                owed.append(stalled)
                    elif not ev.payload and headers.startswith(b"NATS/1.0 ") and not ev.reply:
                        gap = True  # another status (409 Consumer Deleted ...): start over
                    else:
                        ack = parse_ack_subject(ev.reply or "")
                        if ack is not None:
                            if ack.consumer_seq != dseq + 1:
                                gap = True
                            else:
                                dseq = ack.consumer_seq
                                if ack.stream_seq > last:
                                    last = ack.stream_seq
                                    batch.append(OriginMessage(
                                        ack.stream_seq, ev.subject, headers, ev.payload, ack.timestamp_ns, ack.pending))
                if gap or len(batch) >= MAX_BATCH:
                    break
                ev = link.ready_event()
            if gap:
                self.gaps += 1
                await link.send(encode_unsub(sid))
                owed.clear()
                if last:
                    sid, _name = await self._create(link, last + 1, None, filters)
                else:
                    sid, _name = await self._create(link, start_seq, start_time_ns, filters)
                dseq = 0
            if batch or beat:
                yield batch
            if owed:
                # The caller asked for more: it stored everything delivered before
                # these requests (or there was nothing to store).
                await link.send(b"".join(encode_pub(r, None, None, b"") for r in owed))
                self.flow_replies += len(owed)
                owed.clear()


_STALLED = object()


def _pairs(block: bytes) -> dict[str, str]:
    try:
        return dict(decode_nats_headers(block)[2])
    except BrokerError:  # a malformed block: no header to go by
        return {}
