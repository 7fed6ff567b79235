"""JetStream advisories, sans-IO: the subjects and the JSON of nats-server's
``io.nats.jetstream.advisory.v1.*`` events (its ``server/jetstream_events.go``, the
``JSAdvisory...Pre`` subjects of ``jetstream_api.go``), field for field and in its
order: ``type``, ``id`` (a NUID), ``timestamp`` (RFC 3339, UTC, nanoseconds), then
the event's own fields, ``domain`` last and only when set (``omitempty``).

Each builder returns ``(subject, JSON bytes)``. What the broker publishes, and when,
is ``broker/nats/_advisories.py``'s (docs/semantics.md, "JetStream advisories").
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from ._jetstream import rfc3339

__all__ = [
    "API_AUDIT_SUBJECT", "EVENT_TOKENS", "Nuid", "api_audit", "consumer_action", "delivery_exceeded",
    "delivery_nak", "delivery_terminated", "stream_action",
]

#: The first two tokens of every advisory subject (``$JS.EVENT.ADVISORY.``): what a
#: cheap "may anyone hear it" check looks at.
EVENT_TOKENS = ("$JS", "EVENT")
#: ``JSAuditAdvisory``: every JetStream API request answered.
API_AUDIT_SUBJECT = "$JS.EVENT.ADVISORY.API"
_PRE = {
    "max_deliveries": "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES",
    "terminated": "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED",
    "nak": "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED",
    "consumer_created": "$JS.EVENT.ADVISORY.CONSUMER.CREATED",
    "consumer_deleted": "$JS.EVENT.ADVISORY.CONSUMER.DELETED",
    "stream_created": "$JS.EVENT.ADVISORY.STREAM.CREATED",
    "stream_updated": "$JS.EVENT.ADVISORY.STREAM.UPDATED",
    "stream_deleted": "$JS.EVENT.ADVISORY.STREAM.DELETED",
}
_TYPE = "io.nats.jetstream.advisory.v1."
_ACTIONS = {"created": "create", "deleted": "delete", "updated": "modify"}
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class Nuid:
    """Ids as nats-server's ``nuid.Next()`` makes them: 22 base-62 characters, a
    random 12-character prefix and a 10-character sequence that moves on by a random
    step (a new prefix when it runs out). Unique without a lock or a system call."""

    _MAX_SEQ = 62**10

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.prefix = "".join(secrets.choice(_B62) for _ in range(12))
        self.seq = secrets.randbelow(self._MAX_SEQ // 2)
        self.step = 33 + secrets.randbelow(300)

    def next(self) -> str:
        self.seq += self.step
        if self.seq >= self._MAX_SEQ:
            self._reset()
        n, out = self.seq, []
        for _ in range(10):
            n, r = divmod(n, 62)
            out.append(_B62[r])
        return self.prefix + "".join(reversed(out))


def _event(kind: str, event_id: str, now_ns: int, fields: dict[str, Any], domain: str) -> bytes:
    doc: dict[str, Any] = {"type": _TYPE + kind, "id": event_id, "timestamp": rfc3339(now_ns), **fields}
    if domain:
        doc["domain"] = domain
    return json.dumps(doc, separators=(",", ":")).encode()


def delivery_exceeded(
    stream: str, consumer: str, stream_seq: int, deliveries: int, event_id: str, now_ns: int, domain: str = "",
) -> tuple[str, bytes]:
    """``JSConsumerDeliveryExceededAdvisory``: a message was delivered ``max_deliver``
    times and is given up."""
    return f"{_PRE['max_deliveries']}.{stream}.{consumer}", _event("max_deliver", event_id, now_ns, {
        "stream": stream, "consumer": consumer, "stream_seq": stream_seq, "deliveries": deliveries}, domain)


def delivery_nak(
    stream: str, consumer: str, consumer_seq: int, stream_seq: int, deliveries: int, event_id: str, now_ns: int,
    domain: str = "",
) -> tuple[str, bytes]:
    """``JSConsumerDeliveryNakAdvisory``: a client NAKed a delivery."""
    return f"{_PRE['nak']}.{stream}.{consumer}", _event("nak", event_id, now_ns, {
        "stream": stream, "consumer": consumer, "consumer_seq": consumer_seq, "stream_seq": stream_seq,
        "deliveries": deliveries}, domain)


def delivery_terminated(
    stream: str, consumer: str, consumer_seq: int, stream_seq: int, deliveries: int, reason: str, event_id: str,
    now_ns: int, domain: str = "",
) -> tuple[str, bytes]:
    """``JSConsumerDeliveryTerminatedAdvisory``: a client terminated a delivery
    (``+TERM``, with the ``reason`` that followed it, if any)."""
    fields: dict[str, Any] = {
        "stream": stream, "consumer": consumer, "consumer_seq": consumer_seq, "stream_seq": stream_seq,
        "deliveries": deliveries,
    }
    if reason:
        fields["reason"] = reason
    return f"{_PRE['terminated']}.{stream}.{consumer}", _event("terminated", event_id, now_ns, fields, domain)


def consumer_action(
    action: str, stream: str, consumer: str, event_id: str, now_ns: int, domain: str = "",
) -> tuple[str, bytes]:
    """``JSConsumerActionAdvisory`` for ``action`` ``created`` or ``deleted`` (the
    server has no advisory for a consumer's update)."""
    return f"{_PRE['consumer_' + action]}.{stream}.{consumer}", _event("consumer_action", event_id, now_ns, {
        "stream": stream, "consumer": consumer, "action": _ACTIONS[action]}, domain)


def stream_action(action: str, stream: str, event_id: str, now_ns: int, domain: str = "") -> tuple[str, bytes]:
    """``JSStreamActionAdvisory`` for ``action`` ``created``, ``updated`` or ``deleted``."""
    return f"{_PRE['stream_' + action]}.{stream}", _event("stream_action", event_id, now_ns, {
        "stream": stream, "action": _ACTIONS[action]}, domain)


def api_audit(
    server: str, client: dict[str, Any] | None, subject: str, request: bytes | memoryview, response: bytes | memoryview,
    event_id: str, now_ns: int, domain: str = "",
) -> tuple[str, bytes]:
    """``JSAPIAudit``: a JetStream API request (``subject``, its body, omitted when
    empty) and the JSON it was answered with; ``client``: the requester's
    ``ClientInfo`` (keys as the server's, empty ones left out)."""
    fields: dict[str, Any] = {"server": server, "client": client, "subject": subject}
    req = bytes(request).decode(errors="replace")
    if req:
        fields["request"] = req
    fields["response"] = bytes(response).decode(errors="replace")
    return API_AUDIT_SUBJECT, _event("api_audit", event_id, now_ns, fields, domain)
