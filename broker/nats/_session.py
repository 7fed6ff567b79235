"""One NATS client connection: the NATS listener's sibling of the binary session.

:class:`NatsSession` speaks the NATS client protocol (``protocol.nats``) over a
:class:`broker.net.Transport`, as the binary session speaks ttlbroker's frames over
one: the output queue counted in ``pending_bytes`` and in the broker's output
budget, the slow-consumer cut-off, the connection limit and the graceful shutdown,
the lifecycle table, and the rule that whatever the peer does, only this connection
ends, are the transport's. A GOODBYE of the transport is a ``-ERR`` line here
(:meth:`NatsSession.goodbye_frame`).

The conversation, as nats-server holds it:

* the server sends ``INFO`` at once (``server_id``, ``version``, ``proto`` 1,
  ``headers``, ``max_payload``, ``auth_required`` with a token, ``tls_required``
  with TLS); on a TLS listener the client then starts TLS (``broker.net.TlsAcceptor``
  does the handshake) and the protocol goes on inside it;
* ``CONNECT`` carries the options (``verbose``: ``+OK`` after each operation;
  ``pedantic``; ``headers``; ``no_responders``; ``echo``; ``auth_token``, compared
  in constant time). With a token, anything else first, or a wrong token, is
  answered ``-ERR 'Authorization Violation'`` and the connection closed (after the
  failed-handshake delay of ``broker.net.FailureThrottle``); no ``CONNECT`` within
  ``limits.handshake_timeout`` is ``-ERR 'Authentication Timeout'``;
* ``PUB``/``HPUB``: a subject the JetStream API handles goes to
  ``broker.jetstream.request``; a subject a topic captures is stored through the
  broker's one publish path (``Publisher.publish_stored``), and a reply subject gets the
  PubAck (``broker.jetstream.pub_ack``/``pub_error``) once the message is durable
  as an ack is; any other subject is a core message (``send_core``),
  and a request (a reply subject) that reaches nobody gets nats-server's
  ``NATS/1.0 503`` status message (:meth:`NatsSession.no_responders`) when the
  client asked for ``no_responders``;
* ``SUB``/``UNSUB`` (with queue groups and a maximum) manage this connection's
  subscriptions (``NatsSubscription``), at most
  ``limits.max_subscriptions_per_connection`` and while the broker's subscription
  budget (``limits.max_subscription_bytes_total``) has room (``-ERR 'maximum
  subscriptions exceeded'``, nats-server's past its ``max_subs``: nats.go takes it
  as an error that leaves the connection up), each on a subject and queue group of
  at most ``limits.max_subscription_subject_bytes`` (``-ERR 'Invalid Subject'``);
* ``PING`` gets ``PONG``; the server sends ``PING`` every ``[nats] ping_interval``
  and closes with ``-ERR 'Stale Connection'`` when ``[nats] max_pings_out`` of them
  are unanswered.

Bad bytes (an unknown operation, a control line over ``[nats] max_control_line``
bytes, a payload over ``limits.max_payload_bytes``) get nats-server's ``-ERR`` and
close the connection; an invalid subject gets ``-ERR 'Invalid Subject'`` (SUB) or, with ``pedantic``,
``-ERR 'Invalid Publish Subject'`` and the connection goes on.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import TYPE_CHECKING, Any

import trio

import protocol as P
import protocol.nats as PN
from broker.auth import Permissions, new_nonce
from broker.consumers import session_closed
from broker.core import NO_TOPIC, VERSION, Broker, get_logger, subject_too_long
from broker.net import SHORT_READ, ConnectionGuard, Reading, TlsAcceptor, Transport
from protocol import ErrorCode
from protocol.nats import (
    NATS_VERSION,
    NATS_NEED_DATA,
    OK,
    PING,
    PONG,
    AckRun,
    NatsConnect,
    NatsEvent,
    NatsParser,
    NatsPing,
    NatsPong,
    NatsProtocolError,
    NatsPub,
    NatsSub,
    NatsUnsub,
    encode_err,
    encode_info,
    encode_msg,
    valid_nats_subject,
)

from ._core import CheckedSubscription, NatsClient, NatsSubscription, Queued, plain_subscriptions, send_core, send_queued

if TYPE_CHECKING:
    from ._jetstream import JetStream

__all__ = ["SERVER_ID", "TOO_MANY_CONNECTIONS", "NatsSession"]

log = get_logger(__name__)

#: This process's server id in INFO (nats-server's is a 56-character key).
SERVER_ID = "TTLBROKER" + secrets.token_hex(12).upper()
#: The nats-server version whose client protocol and JetStream API this listener
#: follows, sent as INFO's ``version``: NATS clients gate features on it (nats.js
#: refuses KV below 2.6.2; per-message TTL came with 2.11). Features of later servers
#: that ttlbroker does not have (counters, atomic batches, schedules) are refused.
#: ttlbroker's own version goes in ``ttlbroker_version``.

AUTH_VIOLATION = "Authorization Violation"
MAX_CONNECTIONS = "maximum connections exceeded"
#: What each GOODBYE or refused handshake of a session (a slow consumer cut off, a
#: handshake timeout, an eviction at the connection limit, a wrong token, a
#: shutdown) becomes for a NATS client (None: just close, as nats-server does when
#: it shuts down).
_ERR_OF_CODE: dict[int, str | None] = {
    ErrorCode.SLOW_CONSUMER: "Slow Consumer",
    ErrorCode.HANDSHAKE_TIMEOUT: "Authentication Timeout",
    ErrorCode.TOO_MANY_CONNECTIONS: MAX_CONNECTIONS,
    ErrorCode.UNAUTHORIZED: AUTH_VIOLATION,
    ErrorCode.SHUTTING_DOWN: None,
}
#: Consecutive PUBs to topics go to the publish path as one batch of at most this
#: many messages or bytes (a batch costs the publish path about what one message does).
#: A batch cut short in the middle of a read has its answers that may go at once (the
#: PubAcks of a memory topic, or at ``--fsync never``) sent before the rest of the read
#: is handled: a client with a window of publishes in flight (nats-py's
#: ``publish_async``) gets its first acks back and sends more while the broker works
#: through its read, instead of waiting for the whole read (up to 256 KiB) first.
BATCH_MESSAGES = 1000
BATCH_BYTES = 16 * 1024
#: The bytes of a batch whose PubAcks wait for the group commit's sync anyway
#: (``--fsync always``, file-storage topics only): none of them can go before the sync,
#: so the batch may take a whole read (then BATCH_MESSAGES bounds it) and its fixed
#: work is shared among more messages.
SYNCED_BATCH_BYTES = 256 * 1024
#: A client on a TLS listener that does not start TLS after INFO.
TLS_REQUIRED = "Secure Connection - TLS Required"
#: What a NATS client the broker cannot take is told (then closed).
TOO_MANY_CONNECTIONS = encode_err(MAX_CONNECTIONS)


class NatsSession:
    """See the module docstring.

    Larger than the usual class on purpose: the NATS protocol has a handful of
    operations, handled here rather than through a command table (PUB, the hot
    one, costs no dispatch), and the runs of acks and publishes that the read
    loop takes in one step need the session's own state. It reads in sections:
    what the transport calls, reading, operations, publishing."""

    def __init__(
        self, broker: Broker, js: JetStream, stream: trio.abc.Stream, session_id: int, peer: str, guard: ConnectionGuard,
        tls: TlsAcceptor | None = None,
    ) -> None:
        self.broker = broker
        self.js = js
        self.id = session_id
        self.peer = peer
        self.transport = t = Transport(broker, stream, session_id, peer, guard, self, "nats")
        # What is called most, bound once (no forwarding call per frame).
        self.send_now = t.send_now
        self.accepts_pushes = t.accepts_pushes
        self.has_room = t.has_room
        self.parser = NatsParser(server=True, max_control_line=broker.config.nats.max_control_line, max_payload=broker.max_payload)
        self.subs: dict[str, NatsSubscription] = {}
        #: Waiting pulls and consumer-group memberships (``broker.consumers``).
        self.pulls: set[Any] = set()
        self.members: dict[Any, Any] = {}
        self.tls = tls
        self.client_name = ""
        #: CONNECT's ``lang`` and ``version`` (the client library's: ``/connz`` and
        #: the ``ClientInfo`` of audit advisories, :meth:`client_info`), and when
        #: the connection was accepted.
        self.client_lang = ""
        self.client_version = ""
        self.started_ns = broker.clock.now_ns()
        #: What it sent and was sent, as nats-server counts them per connection
        #: (``/connz``): PUB/HPUB operations and their payload bytes (headers
        #: included), MSG/HMSG deliveries and theirs; and when its last message or
        #: subscription came (Unix time).
        self.in_msgs = 0
        self.in_bytes = 0
        self.out_msgs = 0
        self.out_bytes = 0
        self.last_activity = self.transport.opened_at
        #: Who the client is once its CONNECT was checked, and what it may do (None:
        #: everything): ``broker.auth``.
        self.user = ""
        self.perms: Permissions | None = None
        #: Whether the read loop's fast ack paths may skip the publish check.
        self._acks_unchecked = True
        #: Whether every message to this connection is looked at before it goes
        #: (nats-server's ``mperms``, see ``_subscribe``).
        self._deliveries_checked = False
        self.nonce = new_nonce() if broker.auth.needs_nonce else ""
        # nats-server's defaults (``defaultOpts``), for what CONNECT leaves out.
        self.verbose = True
        self.pedantic = True
        self.headers = False
        self.no_responders_wanted = False
        self.echo = True
        self.pings_out = 0
        #: Messages for the publish path not yet handed to it: (body, reply subject, topic).
        self._batch: list[tuple[bytes, bytes | None, Any]] = []
        self._batch_bytes = 0
        #: Every message of the batch goes to a file-storage topic (its acks, if
        #: acks wait for syncs, wait for one): the batch may reach SYNCED_BATCH_BYTES.
        self._batch_synced = True
        #: The last read was short and its answers wait for the group commit: the
        #: next read waits for the socket first (:meth:`_read_loop`).
        self._answers_wait = False
        #: The read being handled was short (``SHORT_READ``): its client waits for what it causes.
        self._short = False

    # -- what the transport and the broker call ------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it ends (``Transport.run``), with the pinger."""
        await self.transport.run(self._read_loop, self._pinger)

    @property
    def closing(self) -> bool:
        """The connection is ending (it handles no more requests, takes no messages)."""
        return self.transport.closing

    def goodbye_frame(self, code: ErrorCode, reason: str) -> bytes | None:
        """A GOODBYE is a ``-ERR`` line, or nothing where nats-server just closes (a
        shutdown): then nothing is queued (an empty write would hold the stream while
        the close half-closes it)."""
        text = _ERR_OF_CODE.get(code, "")
        if text is None:
            return None
        return encode_err(text or reason)

    def on_sync(self) -> None:
        """The group commit made answers of this connection durable: they go out
        after the consumer deliveries the same sync released (``JetStream.release``,
        which then calls ``Transport.on_sync``)."""
        self.js.release(self.transport)

    def closed(self) -> None:
        """The connection ended: its subscriptions, waiting pulls and memberships go."""
        subs = self.broker.subs
        for sub in self.subs.values():
            subs.remove(sub)
        self.subs.clear()
        if self.pulls or self.members:
            session_closed(self.js.consumers, self)

    def push_nats(self, data: bytes, epoch: int = 0, direct: bool = False) -> bool:
        """Queue a MSG/HMSG; False (nothing queued) when the connection is backed up
        or the output budget has no room (deliveries are at most once). With
        ``epoch``: it goes once the group commit has made that epoch durable (a
        PubAck), written by the sync itself (``Transport.send_durable``). ``direct``:
        written at once when it can be (``Transport.send_direct``)."""
        t = self.transport
        if not t.has_room(len(data)):
            return False
        if epoch:
            t.send_durable(epoch, data)
        elif direct:
            t.send_direct(data)
        else:
            t.send_now(data)
        return True

    def _fail(self, text: str, reason: str) -> None:
        """``-ERR 'text'``, then close."""
        self.broker.counters.request_errors += 1
        log.debug("protocol_error", session=self.id, peer=self.peer, error=text, protocol="nats")
        self.transport.fail(encode_err(text), reason)

    def _info(self) -> dict[str, Any]:
        config = self.broker.config
        host, port = self._address()
        info: dict[str, Any] = {
            "server_id": SERVER_ID, "server_name": config.server.name, "version": NATS_VERSION,
            "ttlbroker_version": VERSION, "proto": 1,
            "go": "python", "host": host, "port": port, "headers": True, "max_payload": self.broker.max_payload,
            "client_id": self.id, "jetstream": True,
        }
        if config.nats.domain:
            info["domain"] = config.nats.domain  # as nats-server's INFO with a JetStream domain
        client_ip = self._client_ip()
        if client_ip:
            info["client_ip"] = client_ip  # as nats-server: nats-py's ``nc.client_ip``
        auth = self.broker.auth
        if auth.required:
            info["auth_required"] = True
            if auth.needs_nonce:
                info["nonce"] = self.nonce
        if self.tls is not None:
            info["tls_required"] = True
            info["tls_available"] = True
            if config.server.tls_ca:
                info["tls_verify"] = True
        return info

    def client_info(self) -> dict[str, Any]:
        """This client as nats-server's ``ClientInfo`` in an advisory (its keys, empty
        ones left out; ``acc`` is nats-server's global account, the only one; no
        ``rtt``: the broker does not measure it)."""
        info: dict[str, Any] = {
            "start": PN.rfc3339(self.started_ns), "host": self.transport.peer_host, "id": self.id, "acc": "$G",
            "user": self.user, "name": self.client_name, "lang": self.client_lang, "ver": self.client_version,
            "server": self.broker.config.server.name, "kind": "Client", "client_type": "nats",
        }
        return {k: v for k, v in info.items() if v}

    def _address(self) -> tuple[str, int]:
        """The listener's address this client reached (INFO's host and port)."""
        socket = self._socket()
        if socket is None:
            return "", 0
        name = socket.getsockname()
        return name[0], name[1]

    def _socket(self) -> Any:
        """The connection's socket, under TLS too (None when it has none)."""
        stream = self.transport.stream
        while not hasattr(stream, "socket") and hasattr(stream, "transport_stream"):
            stream = stream.transport_stream
        return getattr(stream, "socket", None)

    def _client_ip(self) -> str:
        """The client's address as the listener sees it ("" when unknown)."""
        socket = self._socket()
        try:
            name = socket.getpeername() if socket is not None else None
        except OSError:  # already reset by the peer
            return ""
        return str(name[0]) if isinstance(name, tuple) and name else ""

    # -- reading -------------------------------------------------------------------------

    async def _pinger(self) -> None:
        """Server PINGs; too many unanswered ones mean a stale connection."""
        nats = self.broker.config.nats
        t = self.transport
        while True:
            await trio.sleep(nats.ping_interval)
            if t.closing:
                return
            if self.pings_out >= nats.max_pings_out:
                log.info("stale_connection", session=self.id, peer=self.peer, pings_out=self.pings_out)
                self._fail("Stale Connection", "stale_connection")
                t.stop_reading()
                return
            self.pings_out += 1
            self.send_now(PING)

    def _partial(self) -> int:
        return self.parser.buffered

    async def _read_loop(self) -> None:
        """INFO (after TLS, or before it), then: read, handle what the read
        completed, send its answers; until the connection ends.

        Every operation comes in through ``parser.next_event``, but for runs of
        plain acks (``parser.ack_run``, ``parser.ack_pubs``: nats-py sends one PUB
        per ``msg.ack()``, many per read), taken out of the read in one step. A
        read's writes leave the committer task asleep until the unhold: the
        ``sync_if_idle`` at the end makes them durable itself, or the unhold wakes
        it."""
        t = self.transport
        if self.tls is None:
            self.send_now(encode_info(self._info()))
        elif not await self._open_tls():
            return
        parser = self.parser
        committer = self.broker.committer
        while True:
            if t.closing:
                return
            if t.full():
                await self._wait_room()
            if self._answers_wait:
                # The last read was short and its client waits for its answers: it
                # sends nothing more before them, so reading at once would only find
                # nothing (a system call and an exception a request).
                self._answers_wait = False
                await t.wait_readable()
            data = await t.read(self._partial)
            if data is None:
                return
            committer.hold()
            msgs = self.in_msgs
            try:
                parser.receive_data(data)
                short = self._short = len(data) < SHORT_READ
                sent = t.sent_bytes
                acked = await self._handle_read()
                if acked is None:
                    return
                all_out = not t.has_queued() or t.send_nowait()
                if acked:
                    self._settle_soon()  # after the send: a pull that went ahead of them is out
                else:
                    self._settle_held()
                if not all_out:
                    committer.unhold()
                    await t.write_queued()  # what the socket did not take at once
                durable = short and t.has_durable()
                self._answers_wait = durable or (short and t.sent_bytes != sent)
                if durable:
                    committer.sync_if_idle()  # their client sends nothing more before them
            finally:
                committer.unhold()
                if self.in_msgs != msgs:
                    self.last_activity = time.time()

    async def _handle_read(self) -> bool | None:
        """Handle, in order, every operation the reads so far completed. True: some
        were acks (settled soon); None: the connection is ending."""
        t = self.transport
        parser = self.parser
        committer = self.broker.committer
        acked = False
        t.reading = Reading.HANDLING
        handled = False
        try:
            while True:
                if (not t.awaiting_handshake and not self.verbose and not self.pedantic and self._acks_unchecked
                        and parser.at_ack() and not self.broker.subs.may_match("$JS", "ACK")):
                    run = parser.ack_run()  # one PUB per msg.ack(), many per read
                    if run is not None and self._ack_run(*run):
                        acked = True
                        continue
                    acks = parser.ack_pubs()  # other acks (a reply, a body), or a mix
                    if acks:
                        acked = True
                        committer.unhold()  # (writes from here on wake it)
                        if not await self._acks(acks):
                            return None
                        continue
                if (parser.at_pub() and not t.awaiting_handshake and not self.verbose and not self.pedantic
                        and not t.closing and self._pub_run()):
                    if t.stopped_or_full():
                        self._flush()
                        committer.unhold()
                        if await self._ending():
                            return None
                    continue
                try:
                    event = parser.next_event()
                except NatsProtocolError as err:
                    self._flush()
                    self._fail(err.text, "protocol_error")
                    return None
                if event is NATS_NEED_DATA:
                    handled = True
                    return acked
                if t.awaiting_handshake:
                    committer.unhold()
                    if not await self._before_connect(event):
                        return None
                if t.closing:
                    return None
                self._event(event)
                if t.stopped_or_full():
                    self._flush()
                    committer.unhold()
                    if await self._ending():
                        return None
        finally:
            self._flush()
            t.reading = Reading.RECEIVING
            if not handled:
                self._settle_soon()

    async def _ending(self) -> bool:
        """After an operation: wait while the connection or the broker is over its
        output limit; True when the connection is ending."""
        t = self.transport
        if not t.closing and t.full():
            await self._wait_room()
        return t.closing

    async def _wait_room(self) -> None:
        self._settle_soon()  # acks queued by this read are not held while it waits
        await self.transport.wait_room()

    async def _open_tls(self) -> bool:
        """INFO then the client's TLS handshake, or, with ``[nats]
        tls_handshake_first``, the handshake first and INFO over TLS: always (true),
        or when the client starts one within the configured wait. False: closed."""
        first = self.broker.config.nats.tls_handshake_first
        if first is not False and (first is True or await self.transport.wait_speaks(first)):
            if not await self._start_tls():
                return False
            self.send_now(encode_info(self._info()))
            return True
        self.send_now(encode_info(self._info()))
        return await self._start_tls()

    async def _start_tls(self) -> bool:
        """The client starts TLS: after INFO (nats-py's ``start_tls``), or first."""
        t = self.transport
        await t.send_ready()
        assert self.tls is not None and isinstance(t.stream, trio.SocketStream), t.stream
        secured = await self.tls.accept(t.stream, self.peer, self.id, plain_reply=encode_err(TLS_REQUIRED))
        if secured is None:
            t.end_as("tls_failed")
            return False
        t.stream = secured
        return True

    async def _before_connect(self, event: NatsEvent) -> bool:
        """The first operation: CONNECT, its credentials checked (``broker.auth``), or,
        without auth, anything. False: the connection is refused."""
        auth = self.broker.auth
        if isinstance(event, NatsConnect):
            if auth.required:
                o = event.options
                identity = await auth.check(
                    user=_text(o.get("user")), password=_text(o.get("pass")), token=_text(o.get("auth_token")),
                    nkey=_text(o.get("nkey")), sig=_text(o.get("sig")), nonce=self.nonce,
                )
                if identity is None:
                    await self._refuse_auth(_text(o.get("user")) or _text(o.get("nkey")))
                    return False
                self.user = identity.user
                self.perms = identity.permissions
                if self.perms is not None:
                    self._acks_unchecked = self.perms.publishes_all_under("$JS.ACK.>")
        elif auth.required:
            await self._refuse_auth("")
            return False
        self.transport.opened()
        return True

    async def _refuse_auth(self, user: str) -> None:
        """``-ERR 'Authorization Violation'`` and the close, counted, delayed and
        logged as a refused handshake of the main port is (``Transport.refuse``)."""
        what = f"user {user!r}: unknown, or the password or signature is wrong" if user else "the credentials are missing or wrong"
        err = P.error_class(ErrorCode.UNAUTHORIZED)(what)
        await self.transport.refuse(err, encode_err(AUTH_VIOLATION))

    def _violation(self, text: str, kind: str, subject: str) -> None:
        """A permission violation: nats-server's ``-ERR`` line (the connection goes
        on), counted, and logged with the user and the peer at most once per peer
        host every 10 s (the line says how many were left out)."""
        counters = self.broker.counters
        if kind == "publish":
            counters.publish_permission_violations += 1
        else:
            counters.subscribe_permission_violations += 1
        self.send_now(encode_err(text))
        t = self.transport
        suppressed = t.guard.log_limit.allow("perm:" + t.peer_host, trio.current_time())
        if suppressed is not None:
            log.warning("permission_violation", session=self.id, peer=self.peer, user=self.user, kind=kind,
                        subject=subject, suppressed=suppressed)

    # -- operations ----------------------------------------------------------------------

    def _event(self, event: NatsEvent) -> None:
        if isinstance(event, NatsPub):
            self._publish(event)
        else:
            self._flush()  # the messages that came before are handled first
            if event is NatsPing:
                self.send_now(PONG)
                return
            if event is NatsPong:
                self.pings_out = 0
                return
            if isinstance(event, NatsSub):
                if not self._subscribe(event):
                    return
            elif isinstance(event, NatsUnsub):
                self._unsubscribe(event)
            elif isinstance(event, NatsConnect):
                self._connect(event.options)
                if self.transport.closing:
                    return
            if self.verbose:
                self.send_now(OK)

    def _ack_run(self, key: str, run: AckRun, end: int) -> bool:
        """A run of plain acks of one consumer (``NatsParser.ack_run``), queued for one
        settle as :meth:`_acks` queues them; False (nothing read) when the consumer is
        not one the ack path has seen (:meth:`_acks` then reads them)."""
        state = self.js.consumer_state
        if state is None:
            return False
        self._flush()  # the messages that came before are handled first
        if not state.take_ack_run(key, run):
            return False
        self.parser.skip_to(end)
        self.in_msgs += run.raw.count(b"PUB ")
        self.in_bytes += 4 * run.raw.count(b" 4\r\n+ACK\r\n")  # (the others' payloads are empty)
        return True

    async def _acks(self, acks: list[tuple[str, str | None, bytes, str, int]]) -> bool:
        """A run of PUBs on v1 ack subjects (``NatsParser.ack_pubs``), handled
        as :meth:`_publish` would handle each: the plain acks of known consumers are
        queued for one settle in a run (``State.take_acks``), anything else goes to
        ``JetStream.request`` one by one, the output budget checked after each as
        after any operation. False: the connection is closing."""
        self._flush()  # the messages that came before are handled first
        js = self.js
        state = js.consumer_state
        i = 0
        n = len(acks)
        self.in_msgs += n
        self.in_bytes += sum(len(a[2]) for a in acks)
        while i < n:
            if state is not None:
                i += state.take_acks(acks, i)
                if i == n:
                    break
            subject, reply, payload, _, _ = acks[i]
            i += 1
            js.request(subject, reply, None, payload, self)
            state = js.consumer_state
            if self.transport.stopped_or_full() and await self._ending():
                return False
        return True

    def _settle_soon(self) -> None:
        """The acks :meth:`_acks` queued are settled in the next turn of the event loop
        (unless a pull request read with them settled them already); those a pull went
        ahead of (:meth:`_publish`) are settled now."""
        state = self.js.consumer_state
        if state is not None:
            state.settle_held()
            state.wake_acks()

    def _settle_held(self) -> None:
        """Settle now the acks a pull went ahead of (``State.may_pass``)."""
        state = self.js.consumer_state
        if state is not None and state.held:
            state.settle_held()

    def _connect(self, options: dict[str, Any]) -> None:
        """CONNECT, as nats-server reads it into the options it has: a field left out
        keeps its value (at first the server's defaults: verbose, pedantic and echo
        on); then the protocol version and the no-responders/headers pairing are
        checked, each refusal closing the connection."""
        self.verbose = bool(options.get("verbose", self.verbose))
        self.pedantic = bool(options.get("pedantic", self.pedantic))
        self.headers = bool(options.get("headers", self.headers))
        self.no_responders_wanted = bool(options.get("no_responders", self.no_responders_wanted))
        self.echo = bool(options.get("echo", self.echo))
        self.client_name = str(options.get("name", ""))[:256]
        self.client_lang = _text(options.get("lang"))[:64]
        self.client_version = _text(options.get("version"))[:64]
        proto = options.get("protocol", 0)
        if proto.__class__ is not int or not 0 <= proto <= 1:
            self._fail("invalid client protocol", "protocol_error")
        elif self.no_responders_wanted and not self.headers:
            self._fail("no responders requires headers support", "protocol_error")

    def _subscribe(self, ev: NatsSub) -> bool:
        if not valid_nats_subject(ev.subject, wildcards=True) or (ev.queue is not None and not valid_nats_subject(ev.queue)):
            self.broker.counters.request_errors += 1
            self.send_now(encode_err("Invalid Subject"))
            return False
        perms = self.perms
        if perms is not None and not perms.can_subscribe(ev.subject, ev.queue):
            text = f"Permissions Violation for Subscription to {_quote(ev.subject)}"
            if ev.queue is not None:
                text += f" using queue {_quote(ev.queue)}"
            self._violation(text, "subscribe", ev.subject)
            return False
        if ev.sid in self.subs:
            return True  # nats-server keeps the first subscription of a sid
        limits = self.broker.config.limits
        if len(self.subs) >= limits.max_subscriptions_per_connection:
            self.broker.counters.request_errors += 1
            self.broker.counters.subscriptions_refused += 1
            self.send_now(encode_err("maximum subscriptions exceeded"))
            return False
        if subject_too_long(ev.subject, ev.queue, limits.max_subscription_subject_bytes):
            self.broker.counters.request_errors += 1
            self.broker.counters.subscriptions_refused += 1
            self.send_now(encode_err("Invalid Subject"))
            return False
        if perms is not None and not self._deliveries_checked and (
            perms.responses is not None or perms.needs_delivery_check(ev.subject, ev.queue)
        ):
            # As nats-server (loadMsgDenyFilterIfNeeded): once a subscription of the
            # connection could receive a denied subject, every delivery to the
            # connection is checked against the deny list, its other subscriptions'
            # too (a JetStream delivery to an inbox carries the stored subject).
            self._deliveries_checked = True
            for other in self.subs.values():
                other.__class__ = CheckedSubscription  # (same layout: no slots of its own)
        kind = CheckedSubscription if self._deliveries_checked else NatsSubscription
        sub = kind(self, ev.sid, ev.subject, ev.queue)
        self.subs[ev.sid] = sub
        try:
            self.broker.subs.add(sub)
        except P.error_class(ErrorCode.SUBSCRIPTION_BUDGET_EXCEEDED):  # the broker's budget is spent (counted there)
            del self.subs[ev.sid]
            self.broker.counters.request_errors += 1
            self.send_now(encode_err("maximum subscriptions exceeded"))
            return False
        self.last_activity = time.time()
        return True

    def _unsubscribe(self, ev: NatsUnsub) -> None:
        sub = self.subs.get(ev.sid)
        if sub is None:
            return  # as nats-server: unknown sids are ignored
        if ev.max_msgs and ev.max_msgs > sub.delivered:
            sub.remaining = ev.max_msgs - sub.delivered
        else:
            self.remove_subscription(sub)

    def remove_subscription(self, sub: NatsSubscription) -> None:
        if self.subs.get(sub.sid) is sub:
            del self.subs[sub.sid]
            self.broker.subs.remove(sub)

    # -- publishing ----------------------------------------------------------------------

    def _publish(self, ev: NatsPub) -> None:
        self.in_msgs += 1
        self.in_bytes += len(ev.payload) + (len(ev.headers) if ev.headers is not None else 0)
        if ev.headers is not None and not self.headers:
            # nats-server's parser knows HPUB only from a client whose CONNECT said headers.
            self._fail("Unknown Protocol Operation", "protocol_error")
            return
        broker = self.broker
        subject = ev.subject
        js = self.js
        handled = js.handles(subject)
        # A subject JetStream handles is not checked (but under ``pedantic``): an API
        # subject may end in a consumer's filter, wildcards and all
        # ($JS.API.CONSUMER.CREATE.S.C.$KV.b.>, as nats.js's KV watch sends it), which
        # nats-server's API subscription takes.
        # Outside ``pedantic``, as nats-server: a subject whose tokens are wildcards is
        # published like any other (its subscriptions and streams match the tokens
        # as they are: nats-py's ``kv.purge("a.*")`` stores a marker on ``$KV.b.a.*``).
        valid = (handled and not self.pedantic) or valid_nats_subject(subject, literal=not self.pedantic)
        if self.perms is not None and not self.perms.can_publish(subject):
            self._flush()  # (what came before is handled first)
            self._violation(f"Permissions Violation for Publish to {_quote(subject)}", "publish", subject)
            return
        if not valid and self.pedantic:
            broker.counters.request_errors += 1
            self.send_now(encode_err("Invalid Publish Subject"))
        if self.verbose:
            self.send_now(OK)  # as nats-server: after the header line's check, before any delivery
        if not valid and self.pedantic:
            return
        if handled:
            self._flush()
            # As on nats-server, where the API and each consumer's acks are one more
            # subscription: the core subscriptions that match an API request, an ack
            # or a flow-control answer get it too (monitoring tools watch $JS.API.>),
            # before it is handled. (The read loop's fast ack paths are taken only
            # while no subscription could match an ack subject.)
            send_core(broker, subject, ev.reply, ev.headers, ev.payload, origin=self)
            # The last operation of the read: the read loop sends what it queued,
            # then settles any acks it went ahead of, before anything else.
            js.request(subject, ev.reply, ev.headers, ev.payload, self, last=not self.parser.buffered)
            return
        if not valid:
            return
        subj = subject.encode()
        route = broker.router.cache.get(subj) if len(subj) <= 255 else NO_TOPIC
        if route is None:
            route = broker.router.resolve(subj)
        if route is NO_TOPIC:
            self._flush()
            broker.counters.messages_unrouted += 1  # as an unrouted publish of ours
            if not send_core(broker, subject, ev.reply, ev.headers, ev.payload, origin=self) and ev.reply:
                self.no_responders(ev.reply, subject)
            return
        self._store(ev.subject, ev.reply.encode() if ev.reply else None, ev.headers, ev.payload, route)

    def _pub_run(self) -> bool:
        """The run of plain PUBs at the read position (a C or Go client's buffered
        writes), each handled as :meth:`_event` would handle it, in order, except
        that each subject is routed once for the run, and that the core messages
        among them (no stream captures them, no JetStream subject, no permission to
        check, no queue group or ``UNSUB max``, only NATS subscribers) go to each
        subscriber as one write, made of the PUBs' own bytes, at the end of the run
        or before any other message of it is handled. The run ends after a message
        that goes the general way (:meth:`_publish`). False: the next operation is
        not such a PUB (nothing taken)."""
        parser = self.parser
        plans: dict[bytes, Any] = {}
        frames: dict[NatsClient, Queued] = {}
        counters = self.broker.counters
        took = False
        while (pub := parser.next_pub(plans)) is not None:
            took = True
            subj, rep, tail, size = pub
            if subj in plans:
                plan = plans[subj]
            else:
                plan = plans[subj] = self._plan(subj, frames)
            if plan.__class__ is tuple and self._batch:
                self._flush()  # (the stored messages that came before go first)
                plans.clear()  # (their deliveries may have changed the subscriptions)
                plan = plans[subj] = self._plan(subj, frames)
            if plan.__class__ is tuple and (plan or rep is None):
                tails = parser.same_pubs()  # (a flood: the same PUB line again, taken with it)
                tails.insert(0, tail)
                k = len(tails)
                self.in_msgs += k
                self.in_bytes += k * size
                counters.messages_unrouted += k  # (as unrouted publishes of ours)
                if len(plan) == 1:  # (one subscription: its frames in two list operations)
                    sub, head, pieces, sizes, subs = plan[0]
                    frames_of = [head] * (2 * k)
                    frames_of[1::2] = tails
                    pieces += frames_of
                    sizes += [size] * k
                    subs += [sub] * k
                else:  # (message by message: a connection's subscriptions get each in turn)
                    for tail in tails:
                        for sub, head, pieces, sizes, subs in plan:
                            pieces.append(head)
                            pieces.append(tail)
                            sizes.append(size)
                            subs.append(sub)
                continue
            send_queued(frames, self._short)
            payload = PN.pub_payload(tail, size)
            if plan.__class__ is tuple or plan is None:  # (a request nobody answers, or anything unusual)
                self._publish(NatsPub(subj.decode(), rep.decode() if rep is not None else None, None, payload))
                return True
            self.in_msgs += 1
            self.in_bytes += size
            self._store(subj, rep, None, payload, plan)
            if rep is not None:  # (a flood of JetStream publishes: the same subject and size, an inbox each)
                # Taken up to where the batch is full (a body is at most this long),
                # so that the read's rest is still buffered when the batch goes and
                # its acks leave at once (_store), or with the next sync.
                each = len(subj) + size + 64
                head, topic = P.body_head(subj, size), getattr(plan, "topic", None)
                synced = topic is not None and topic.config.storage == "file"
                while replied := parser.replied_pubs(min(BATCH_MESSAGES - len(self._batch),
                                                         max(1, ((self._batch_limit() if synced else BATCH_BYTES)
                                                                 - self._batch_bytes) // each))):
                    self.in_msgs += len(replied)
                    self.in_bytes += len(replied) * size
                    if self.broker.subs.match(subj):
                        for rep, cut in replied:  # (core subscribers see each reply: _store)
                            self._store(subj, rep, None, bytes(cut), plan)
                        continue
                    # What _store does for each, taken as a run: one body head (the
                    # subject was checked by _plan).
                    batch = self._batch
                    for rep, cut in replied:
                        batch.append((head + cut, rep, topic))
                    self._batch_bytes += len(replied) * (len(head) + size)
                    if not synced:
                        self._batch_synced = False
                    self._flush_if_full()
            if not self._batch:  # (a full batch went: its deliveries may have changed the subscriptions)
                plans.clear()
        send_queued(frames, self._short)
        return took

    def _plan(self, subj: bytes, frames: dict[NatsClient, Queued]) -> Any:
        """How :meth:`_pub_run` takes a plain PUB on ``subj``: the route of the topic
        that captures it; as a core message, for each subscription it reaches, the
        ``MSG`` line's head and where the run queues its frames (in ``frames``); or
        None: :meth:`_publish` takes it."""
        subject = subj.decode()
        broker = self.broker
        if (self.js.handles(subject) or (self.perms is not None and not self.perms.can_publish(subject))
                or not valid_nats_subject(subject, literal=True)):
            return None
        route = broker.router.cache.get(subj) if len(subj) <= 255 else NO_TOPIC
        if route is None:
            route = broker.router.resolve(subj)
        if route is not NO_TOPIC:
            return route
        subs = broker.subs.match_fixed(subj)
        if not plain_subscriptions(subs):
            return None
        skip = None if self.echo else self
        plan = []
        for sub in subs:
            session = sub.session
            if session is not skip:
                queued = frames.get(session)
                if queued is None:
                    queued = frames[session] = ([], [], [])
                plan.append((sub, b"MSG %s %s " % (subj, sub.sid_bytes), *queued))
        return tuple(plan)

    def no_responders(self, reply: str, subject: str) -> None:
        """A request on ``subject`` reached nobody: when this client's CONNECT asked
        for ``no_responders``, a ``NATS/1.0 503`` status message carrying
        ``Nats-Subject: <subject>`` to the first of its own subscriptions that match
        the reply subject (in the order nats-server's sublist finds them), as
        nats-server sends it (``client.processMsgResults``). Nobody else gets it.
        Counted in ``no_responders`` either way."""
        self.broker.counters.no_responders += 1
        if not self.no_responders_wanted:
            return
        tokens = reply.split(".")
        matching = [sub for sub in self.subs.values() if P.subject_matches(sub.tokens, tokens)]
        if not matching:
            return
        sub = min(matching, key=lambda s: P.match_order(s.tokens))
        self.push_nats(encode_msg(reply.encode(), sub.sid_bytes, None, PN.no_responders_status(subject), b""))

    def _store(self, subject: str | bytes, reply: bytes | None, headers: bytes | None, payload: bytes, route: Any) -> None:
        """A message a topic captures: queued for the broker's one publish path,
        which takes consecutive ones as one batch (:meth:`_flush`)."""
        topic = getattr(route, "topic", None)  # None: the route is the subject's error
        try:
            block = PN.nats_to_record_headers(headers) if headers else b""
            body = P.encode_body(subject, payload, block)
        except P.BrokerError as err:
            self._flush()
            js = self.js
            js.respond(reply.decode() if reply else None, js.pub_error(err, topic))
            return
        if reply is not None and self.broker.subs.match(subject if isinstance(subject, bytes) else subject.encode()):
            # Core subscribers on a stored subject see the PUB's reply, as on
            # nats-server: this message is stored on its own, with it.
            self._flush()
            self._batch.append((body, reply, topic))
            self._flush(reply)
            return
        self._batch.append((body, reply, topic))
        self._batch_bytes += len(body)
        if topic is None or topic.config.storage != "file":
            self._batch_synced = False
        self._flush_if_full()

    def _batch_limit(self) -> int:
        """The bytes the queued batch may reach (:data:`BATCH_BYTES`, or
        :data:`SYNCED_BATCH_BYTES` when its acks all wait for a sync)."""
        return SYNCED_BATCH_BYTES if self._batch_synced and self.broker.committer.acks_wait else BATCH_BYTES

    def _flush_if_full(self) -> None:
        """The queued messages go once they fill a batch."""
        if len(self._batch) >= BATCH_MESSAGES or self._batch_bytes >= self._batch_limit():
            self._flush()
            t = self.transport
            if t.has_queued() and self.parser.buffered:
                t.send_nowait()  # (what the socket does not take waits for the end of the read)

    def _flush(self, carried: bytes | None = None) -> None:
        """Store the queued messages as one publish, and send each one that has a
        reply subject its PubAck once it is as durable as an ack is. Called before
        anything else the client sent is handled, so the order holds. ``carried``: the
        one queued message's reply subject, for the core subscriptions it reaches."""
        batch = self._batch
        if not batch:
            return
        self._batch = []
        self._batch_bytes = 0
        self._batch_synced = True
        broker = self.broker
        acked = any(reply for _, reply, _ in batch)
        cmd = P.Publish.from_bodies([body for body, _, _ in batch], 0 if acked else P.PUBLISH_NO_ACK)
        payload, epoch = broker.publisher.publish_stored(self, cmd, carried)
        if not acked:
            return
        if not broker.committer.acks_wait:
            epoch = 0
        js = self.js
        if payload.__class__ is int:  # all stored, in order, from this offset on
            offset = payload
            replies: list[bytes] = []
            seqs: list[int] = []
            last: Any = batch[0][2]
            for _, reply, topic in batch:
                if reply:
                    if topic is not last:  # (the PubAcks of each stream's run, in order)
                        if replies:
                            js.respond_acks(replies, seqs, PN.pub_ack_format(js.stream_name(last)), epoch)
                            replies, seqs = [], []
                        last = topic
                    replies.append(reply)
                    seqs.append(offset)
                offset += 1
            if replies:
                js.respond_acks(replies, seqs, PN.pub_ack_format(js.stream_name(last)), epoch)
            return
        assert isinstance(payload, bytes), payload  # publish_stored: else the encoded acks
        acks = (P.Acks.first(payload),) if len(batch) == 1 else P.Acks.decode(payload)  # one: one unpack
        for i, (_, reply, topic) in enumerate(batch):
            if not reply:
                continue
            ack = acks[i]
            if ack.error is not None:
                answer = js.pub_error(ack.error, topic)
            else:
                answer = js.pub_ack(topic, ack.offset, ack.status == ErrorCode.DUPLICATE_MESSAGE)
            js.respond(reply.decode(), answer, epoch=epoch)


def _text(value: Any) -> str:
    """A CONNECT option that should be a string ("" when it is not one)."""
    return value if isinstance(value, str) else ""


def _quote(text: str) -> str:
    """``text`` as Go's ``%q`` writes it (nats-server's error lines)."""
    return json.dumps(text, ensure_ascii=False)
