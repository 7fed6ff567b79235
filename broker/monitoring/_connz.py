"""``/connz`` and ``/subsz``: the connections of both listeners and their
subscriptions, in nats-server's JSON (``Connz``, ``ConnInfo``, ``Subsz`` and
``SubDetail`` of ``server/monitor.go``), with its query parameters and their errors.

* Every open connection is listed, NATS (``"type": "nats"``) and ttlbroker's binary
  protocol (``"type": "ttlbroker"``), ``"kind": "Client"``, ``cid`` the connection's
  session id (one sequence for both listeners). A NATS connection counts what
  nats-server counts (``in_msgs``/``in_bytes``: its PUB and HPUB operations and their
  payload and header bytes; ``out_msgs``/``out_bytes``: the MSG and HMSG it was
  sent; ``last_activity``: its last message or subscription); a binary connection
  is not counted so (zeros, and ``last_activity`` is its start). ``lang`` and
  ``version`` are a NATS client's CONNECT's. ``rtt`` is always ``0s``: the broker
  does not time its pings.
* The last :data:`CLOSED_KEPT` closed connections are kept (nats-server keeps
  10,000) for ``state=closed`` and ``state=all``, with ``stop`` and ``reason`` (in
  nats-server's words, :data:`REASONS`), without their subscriptions' list.
* Bounded work: a request looks at each connection once (at most ``[limits]
  max_connections`` open and :data:`CLOSED_KEPT` closed ones), sorts them (as
  nats-server sorts: ``cid`` and ``start`` ascending, ``uptime`` and ``reason``
  ascending, the others descending; ties by ``cid``) and lists at most ``limit``
  (default 1,024) from ``offset``; the subscription lists are made for those only.
  ``/subsz?subs=true`` walks the subscriptions once (the subscription budget bounds
  them) and lists at most ``limit`` (default 1,024) from ``offset``.
* One account, nats-server's global one (``$G``): ``acc=$G`` (or no ``acc``) is
  every connection, any other account none.
* ``/subsz``'s statistics of the subscription index (``num_cache``, ``num_inserts``,
  ``num_removes``, ``num_matches``, ``cache_hit_rate``, ``max_fanout``,
  ``avg_fanout``) are zeros: the index does not count them. ``num_subscriptions``
  is every subscription of both protocols.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from protocol import subject_matches
from protocol.nats import rfc3339, valid_nats_subject

from broker.core import Broker, get_logger
from broker.net import ConnectionGuard, Transport

from ._go import BadParameter, Query, uptime

__all__ = ["CLOSED_KEPT", "Connections", "DEFAULT_LIMIT", "GLOBAL_ACCOUNT", "REASONS"]

log = get_logger(__name__)

#: nats-server's ``DefaultConnListSize`` and ``DefaultSubListSize``.
DEFAULT_LIMIT = 1024
#: Closed connections kept for ``/connz?state=closed``.
CLOSED_KEPT = 1000
#: nats-server's global account, the only one here.
GLOBAL_ACCOUNT = "$G"
#: How a connection ended (``Transport.reason``) in nats-server's words (its
#: ``ClosedState`` texts).
REASONS = {
    "closed": "Client Closed",
    "closed_mid_frame": "Client Closed",
    "connection_lost": "Read Error",
    "shutdown": "Server Shutdown",
    "slow_consumer": "Slow Consumer (Pending Bytes)",
    "evicted": "Maximum Connections Exceeded",
    "handshake_timeout": "Authentication Timeout",
    "unauthorized": "Authentication Failure",
    "handshake_refused": "Authentication Failure",
    "protocol_error": "Protocol Violation",
    "request_before_handshake": "Protocol Violation",
    "stale_connection": "Stale Connection",
    "tls_failed": "TLS Handshake Failure",
    "tls_on_plain_port": "TLS Handshake Failure",
}
#: ``sort=`` values (nats-server's ``SortOpt``) and whether each sorts descending.
_DESCENDING = {
    "cid": False, "start": False, "subs": True, "pending": True, "msgs_to": True, "msgs_from": True, "bytes_to": True,
    "bytes_from": True, "last": True, "idle": True, "uptime": False, "stop": True, "reason": False, "rtt": True,
}
_CLOSED_ONLY = {"stop": "sort by stop only valid on closed connections", "reason": "sort by reason only valid on closed connections"}


class _Row:
    """One connection as ``/connz`` sees it: what its ConnInfo shows, read once (a
    closed one's when it closed: the plain values, the text made only if it is
    asked for), and an open one's transport, for its subscriptions."""

    __slots__ = (
        "cid", "nats", "peer", "start", "last", "stop", "reason", "pending", "in_msgs", "out_msgs", "in_bytes", "out_bytes",
        "subs", "name", "lang", "version", "tls", "user", "transport",
    )

    def __init__(self, t: Transport, stop: float | None = None) -> None:
        sp: Any = t.speaker
        self.cid = t.id
        self.nats = t.protocol == "nats"
        self.peer = t.peer
        self.start = t.opened_at
        self.last: float = getattr(sp, "last_activity", self.start)
        self.stop = stop
        self.reason = "" if stop is None else REASONS.get(t.reason or "closed", t.reason or "")
        self.pending = t.pending_bytes
        self.in_msgs: int = getattr(sp, "in_msgs", 0)
        self.out_msgs: int = getattr(sp, "out_msgs", 0)
        self.in_bytes: int = getattr(sp, "in_bytes", 0)
        self.out_bytes: int = getattr(sp, "out_bytes", 0)
        self.subs = len(sp.subs)
        self.name: str = sp.client_name
        self.lang: str = getattr(sp, "client_lang", "")
        self.version: str = getattr(sp, "client_version", "")
        self.tls = _tls(t)
        self.user = str(getattr(sp, "user", ""))
        self.transport = t if stop is None else None

    def info(self, now: float, auth: bool, subs: str) -> dict[str, Any]:
        """Its ConnInfo, as a query asks for it: with ``auth``, its user (and an open
        one's account's ``name_tag``); with ``subs`` (``list`` or ``detail``), an open
        connection's subscriptions."""
        ip, port = _ip_port(self.peer)
        end = self.stop if self.stop is not None else now
        out: dict[str, Any] = {
            "cid": self.cid, "kind": "Client", "type": "nats" if self.nats else "ttlbroker", "ip": ip, "port": port,
            "start": _time(self.start), "last_activity": _time(self.last),
        }
        if self.stop is not None:
            out["stop"] = _time(self.stop)
            out["reason"] = self.reason
        out.update(
            rtt="0s", uptime=uptime(end - self.start), idle=uptime(end - self.last), pending_bytes=self.pending,
            in_msgs=self.in_msgs, out_msgs=self.out_msgs, in_bytes=self.in_bytes, out_bytes=self.out_bytes,
            subscriptions=self.subs,
        )
        for key, value in (("name", self.name), ("lang", self.lang), ("version", self.version)):
            if value:
                out[key] = value
        out.update(self.tls)
        if auth and self.user:
            out["authorized_user"] = self.user
        t = self.transport
        if subs and t is not None and len(t.speaker.subs):
            listed = _subs_of(t)
            if subs == "detail":
                out["subscriptions_list_detail"] = [_detail(s, self.cid) for s in listed]
            else:
                out["subscriptions_list"] = [s.subject_filter for s in listed]
        if auth and t is not None:
            out["name_tag"] = GLOBAL_ACCOUNT  # (its account's; a closed one has none, as on nats-server)
        return out


def _time(unix: float) -> str:
    return rfc3339(int(unix * 1e9))


def _sort_key(sort: str, now: float) -> Callable[[_Row], Any]:
    """What ``sort=`` orders by (rtt: nothing, every rtt is 0)."""
    keys: dict[str, Callable[[_Row], Any]] = {
        "subs": lambda r: r.subs, "pending": lambda r: r.pending, "msgs_to": lambda r: r.out_msgs,
        "msgs_from": lambda r: r.in_msgs, "bytes_to": lambda r: r.out_bytes, "bytes_from": lambda r: r.in_bytes,
        "last": lambda r: r.last, "idle": lambda r: now - r.last,
        "uptime": lambda r: (r.stop if r.stop is not None else now) - r.start, "stop": lambda r: r.stop or 0.0,
        "reason": lambda r: r.reason, "rtt": lambda r: 0,
    }
    return keys.get(sort, lambda r: r.cid)  # cid, start


def _ip_port(peer: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` (``Transport.peer``) as (ip, port)."""
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        return "", 0
    return host.strip("[]"), int(port)


def _tls(transport: Transport) -> dict[str, str]:
    """``tls_version`` and ``tls_cipher_suite`` of a TLS connection (nothing for a
    plain one): ``1.3``, as nats-server writes the version, and OpenSSL's name of
    the cipher."""
    stream: Any = transport.stream
    if not hasattr(stream, "cipher"):
        return {}
    try:
        version, cipher = stream.version(), stream.cipher()
    except Exception:  # the handshake is not done
        return {}
    out = {}
    if version:
        out["tls_version"] = str(version).removeprefix("TLSv")
    if cipher:
        out["tls_cipher_suite"] = str(cipher[0])
    return out


def _subs_of(transport: Transport) -> list[Any]:
    subs: Any = transport.speaker.subs
    return list(subs.values())


def _detail(sub: Any, cid: int) -> dict[str, Any]:
    """A subscription as nats-server's SubDetail (without its account)."""
    out: dict[str, Any] = {"subject": sub.subject_filter}
    if sub.queue:
        out["qgroup"] = sub.queue
    out["sid"] = str(sub.sid)
    out["msgs"] = sub.delivered
    remaining = getattr(sub, "remaining", None)  # (an ``UNSUB sid max`` of NATS)
    if remaining is not None:
        out["max"] = sub.delivered + remaining
    out["cid"] = cid
    return out


class Connections:
    """The connections' endpoints, and the closed connections they remember.

    Args:
        broker: the broker (its subscription index).
        guard: the connections' registry; closing connections are recorded through
            its ``on_closed`` hook.
        server_id: the ``server_id`` the answers carry (the NATS INFO's).
    """

    def __init__(self, broker: Broker, guard: ConnectionGuard, server_id: str) -> None:
        self.broker = broker
        self.guard = guard
        self.server_id = server_id
        self.closed: deque[_Row] = deque(maxlen=CLOSED_KEPT)
        #: NATS connections closed as stale (unanswered pings): ``/varz``'s ``stale_connections``.
        self.stale = 0
        guard.on_closed.append(self._closed)

    def open(self) -> list[Transport]:
        """The open connections, by cid."""
        sessions: Iterable[Any] = self.guard.sessions
        return sorted(sessions, key=lambda t: t.id)

    def _closed(self, t: Transport) -> None:
        """``ConnectionGuard.on_closed``: remember a closing connection."""
        try:
            self.closed.append(_Row(t, stop=time.time()))
            if t.reason == "stale_connection":
                self.stale += 1
        except Exception:  # a bug here must not cost the connection its ending
            log.error("connz_record_failed", exc_info=True, session=t.id)

    # -- /connz ------------------------------------------------------------------------

    def connz(self, q: Query) -> dict[str, Any]:
        """The ``/connz`` document for the query (see the module docstring).

        Raises:
            BadParameter: a parameter nats-server refuses, in its words.
        """
        sort = q.get("sort")
        auth = q.flag("auth")
        detail = q.get("subs").lower() == "detail"
        subs = False if detail else q.flag("subs")
        offset = q.integer("offset")
        limit = q.integer("limit")
        cid = q.uint64("cid")
        state = q.state()
        user, acc, mqtt = q.get("user"), q.get("acc"), q.get("mqtt_client")
        if sort and sort not in _DESCENDING:
            raise BadParameter(f"invalid sorting option: {sort}")
        offset = max(offset, 0)
        if limit <= 0:
            limit = DEFAULT_LIMIT
        if sort in _CLOSED_ONLY and state != "closed":
            raise BadParameter(_CLOSED_ONLY[sort])
        if cid:
            limit = 1
        now = time.time()
        out: dict[str, Any] = {"server_id": self.server_id, "now": _time(now), "num_connections": 0, "total": 0,
                               "offset": offset, "limit": limit, "connections": []}
        if acc and acc != GLOBAL_ACCOUNT:
            return out  # no such account: nothing (as nats-server)
        rows = [_Row(t) for t in self.open()] if state in ("open", "all") else []
        if state in ("closed", "all"):
            rows += self.closed
        out["total"] = len(rows)  # (nats-server's total is before the cid and user filters too)
        if cid:
            rows = [r for r in rows if r.cid == cid][:1]  # an open one first, as nats-server looks
        if user:
            rows = [r for r in rows if r.user == user]
        if mqtt:
            rows = []  # no MQTT clients here
        rows.sort(key=lambda r: r.cid)
        rows.sort(key=_sort_key(sort, now), reverse=_DESCENDING.get(sort, False))
        page = rows[offset:][:limit]
        listed = "detail" if detail else "list" if subs else ""
        out["connections"] = [r.info(now, auth, listed) for r in page]
        out["num_connections"] = len(page)
        return out

    # -- /subsz ------------------------------------------------------------------------

    def subsz(self, q: Query) -> dict[str, Any]:
        """The ``/subsz`` document for the query (see the module docstring).

        Raises:
            BadParameter: a parameter nats-server refuses, in its words.
        """
        listed = q.flag("subs")
        offset = max(q.integer("offset"), 0)
        limit = q.integer("limit")
        if limit <= 0:
            limit = DEFAULT_LIMIT
        test, acc = q.get("test"), q.get("acc")
        if test and not valid_nats_subject(test):
            raise BadParameter(f"invalid test subject, must be valid publish subject: {test}")
        ours = not acc or acc == GLOBAL_ACCOUNT
        out: dict[str, Any] = {
            "server_id": self.server_id, "now": rfc3339(time.time_ns()), "num_subscriptions": len(self.broker.subs) if ours else 0,
            "num_cache": 0, "num_inserts": 0, "num_removes": 0, "num_matches": 0, "cache_hit_rate": 0, "max_fanout": 0,
            "avg_fanout": 0, "total": 0, "offset": offset, "limit": limit,
        }
        if not listed:
            return out
        page: list[dict[str, Any]] = []
        total = 0
        if ours:
            tokens = test.split(".") if test else None
            for cid, sub in self._subscriptions():
                if tokens is not None and not subject_matches(sub.tokens, tokens):
                    continue
                if offset <= total < offset + limit:
                    page.append({"account": GLOBAL_ACCOUNT, "account_tag": GLOBAL_ACCOUNT, **_detail(sub, cid)})
                total += 1
        out["total"] = total
        if page:
            out["subscriptions_list"] = page
        return out

    def _subscriptions(self) -> Iterator[tuple[int, Any]]:
        for t in self.open():
            for sub in _subs_of(t):
                yield t.id, sub
