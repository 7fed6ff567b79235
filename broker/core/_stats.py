"""The broker's counters.

Counters only ever go up (like Prometheus counters); gauges (connections, bytes on
disk, pending expiries) are computed when stats are asked for. Everything is a plain
attribute increment on the event loop, so counting costs nothing measurable.

Each field's ``#:`` comment is its documentation: ``/metrics`` shows it as the
HELP text of ``ttlbroker_<name>_total`` (:func:`counter_help`).
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import asdict, dataclass, fields

__all__ = ["Counters", "counter_help"]


@dataclass
class Counters:
    #: Messages stored by publishes (markers and republished copies included).
    messages_in: int = 0
    #: Bytes of the records stored by publishes, as stored.
    bytes_in: int = 0
    #: Messages sent to clients by fetch, get-last and core subscriptions.
    messages_out: int = 0
    #: Bytes of records sent to clients.
    bytes_out: int = 0
    #: Messages refused in publish acks (any error).
    publish_errors: int = 0
    #: Messages not stored because their Nats-Msg-Id was within the topic's duplicate
    #: window (acked DUPLICATE_MESSAGE; not in publish_errors).
    duplicates: int = 0
    #: Messages published on subjects no topic captures (core delivery only).
    messages_unrouted: int = 0
    #: Core deliveries dropped because a subscriber fell too far behind.
    deliveries_dropped: int = 0
    #: Requests (publishes with a reply subject, of either protocol) that no core
    #: subscription took: the requester gets the no-responders status (503) when
    #: it can read it.
    no_responders: int = 0
    #: Messages removed by the delete API.
    deleted: int = 0
    #: Messages removed by purges.
    purged: int = 0
    #: Messages removed because max_msgs_per_subject was exceeded.
    removed_max_msgs_per_subject: int = 0
    #: Messages removed by work-queue or interest retention (settled by every consumer that wanted them).
    removed_acked: int = 0
    #: Messages removed to keep a topic within max_msgs or max_bytes (discard old).
    removed_limits: int = 0
    #: Messages refused by a topic's limits (discard new at max_msgs, max_bytes or a
    #: subject's limit, or over max_msg_size); also counted in publish_errors.
    refused_limits: int = 0
    #: Messages removed by a later message's Nats-Rollup header.
    removed_rollup: int = 0
    #: Messages removed by their per-message TTL.
    expired_ttl: int = 0
    #: Messages removed by the topic's max age.
    expired_max_age: int = 0
    #: Subject delete markers written.
    markers: int = 0
    #: Messages produced by message schedules (NATS ADR-51).
    schedules_fired: int = 0
    #: Messages republished.
    republished: int = 0
    #: Republished messages dropped by the hop limit.
    dropped_loops: int = 0
    #: Republished messages dropped because the transform gave an invalid subject.
    dropped_invalid_subject: int = 0
    #: Sealed segments exported to Parquet.
    segments_exported: int = 0
    #: Rows written to Parquet by the export.
    rows_exported: int = 0
    #: Export passes that failed (retried on the next pass).
    export_failures: int = 0
    #: Sealed segment files removed by the cleaner.
    segments_reclaimed: int = 0
    #: Bytes of the sealed segment files removed by the cleaner.
    bytes_reclaimed: int = 0
    #: Records found corrupt (checksum mismatch, truncated) on recovery or read.
    corrupt_records: int = 0
    #: Torn records cut from the tail of an active segment on recovery.
    torn_records_truncated: int = 0
    #: Messages refused because the memory storage budget ([limits] memory_storage_bytes) was used up.
    memory_storage_refused: int = 0
    #: fsync rounds of the group commit.
    fsyncs: int = 0
    #: Connections accepted since start.
    connections_total: int = 0
    #: Connections refused at the connection limit.
    connections_refused: int = 0
    #: Requests that got an error response.
    request_errors: int = 0
    #: Connections that ended on an error of their own (reset, broken pipe, bad frame).
    connections_failed: int = 0
    #: Connections closed because they did not complete the handshake in time.
    handshake_timeouts: int = 0
    #: Handshakes refused for missing or wrong credentials (a token, a user's
    #: password or NKey signature, an unknown user).
    auth_failures: int = 0
    #: Publishes refused by the publisher's permissions (nothing stored or delivered).
    publish_permission_violations: int = 0
    #: Subscriptions refused by the subscriber's permissions.
    subscribe_permission_violations: int = 0
    #: Failed TLS handshakes: on a TLS port, a client certificate missing or not signed
    #: by tls_ca, a client that does not trust the broker's certificate, a TLS version
    #: below 1.2, a client speaking the plain protocol; on a plain port, a TLS client.
    tls_handshake_failures: int = 0
    #: Subscriptions (NATS SUB, SUBSCRIBE) refused at a connection's limits: past
    #: limits.max_subscriptions_per_connection, or a subject (or queue group) longer
    #: than limits.max_subscription_subject_bytes.
    subscriptions_refused: int = 0
    #: Subscriptions refused because the subscription budget
    #: (limits.max_subscription_bytes_total) was used up.
    subscription_budget_refused: int = 0
    #: Connections closed as slow consumers (queued output over the limit too long).
    slow_consumers: int = 0
    #: Monitoring connections accepted.
    http_connections_total: int = 0
    #: Monitoring connections closed at once: at a connection limit of the monitoring
    #: port, with no connection to replace (every one was being served).
    http_connections_refused: int = 0
    #: Monitoring connections closed to make room for a new one at a connection limit
    #: (lingering after an error, idle, waiting for a request, or slow to take a response).
    http_connections_evicted: int = 0
    #: Monitoring requests that did not arrive whole within [http] head_timeout
    #: (answered 408, or closed if nothing came).
    http_request_timeouts: int = 0
    #: Monitoring responses the client did not take within 10 s (the connection was closed).
    http_response_timeouts: int = 0
    #: Damage found in the data directory's files (each piece once; see ``ttlbroker check``).
    damage_detected: int = 0
    #: Durable consumers' first deliveries of a message.
    consumer_delivered: int = 0
    #: Durable consumers' deliveries of a message again (nak, or the ack wait ran out).
    consumer_redelivered: int = 0
    #: Deliveries acknowledged (ack) by durable consumers' clients.
    consumer_acked: int = 0
    #: Deliveries refused (nak) by durable consumers' clients, to be delivered again.
    consumer_naked: int = 0
    #: Deliveries terminated (term) by durable consumers' clients: never delivered again.
    consumer_terminated: int = 0
    #: Outstanding deliveries given up after max_deliver.
    consumer_given_up: int = 0
    #: Messages copied to a consumer's dead-letter subject after max_deliver deliveries.
    dead_lettered_max_deliveries: int = 0
    #: Messages copied to a consumer's dead-letter subject because a client terminated them.
    dead_lettered_terminated: int = 0
    #: Messages copied to a consumer's dead-letter subject because their TTL or the
    #: topic's max age removed them while the consumer still owed them (``dead_letter_expired``).
    dead_lettered_expired: int = 0
    #: Messages copied to a consumer's dead-letter subject because a limit of the topic
    #: (max msgs, max bytes, max msgs per subject) removed them while the consumer still owed them.
    dead_lettered_limit: int = 0
    #: Dead letters published again on their original subjects (REDRIVE).
    dead_letters_redriven: int = 0
    #: Outstanding deliveries dropped because their message was removed.
    consumer_dropped: int = 0
    #: JetStream advisories published (``$JS.EVENT.ADVISORY.>``, each to someone: a
    #: subscription or a topic), by kind: a message given up after max_deliver.
    advisories_max_deliveries: int = 0
    #: Advisories published: a delivery terminated (``+TERM``).
    advisories_terminated: int = 0
    #: Advisories published: a delivery NAKed.
    advisories_nak: int = 0
    #: Advisories published: a consumer created or deleted.
    advisories_consumer_action: int = 0
    #: Advisories published: a stream created, updated or deleted.
    advisories_stream_action: int = 0
    #: Advisories published: a JetStream API request answered (the API audit).
    advisories_api_audit: int = 0
    #: Times a mirror or source found its origin stream missing (deleted or never
    #: made): it keeps its messages and retries slowly.
    copy_origin_missing: int = 0
    #: Times a mirror or source could not reach its origin (a remote down or
    #: refusing): it keeps its messages, readable, and retries with a backoff.
    copy_origin_unreachable: int = 0
    #: Messages a mirror or source stored from its origins.
    messages_copied: int = 0
    #: Times a copier failed for a reason not its origin's (logged with the
    #: traceback; retried after 30 s).
    copy_failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def counter_help() -> dict[str, str]:
    """Each counter's ``#:`` comment as one line of plain text (the field's name if
    it has none, or if the source cannot be read)."""
    names = [f.name for f in fields(Counters)]
    found: dict[str, str] = {}
    try:
        lines = inspect.getsource(Counters).splitlines()
    except (OSError, TypeError):
        lines = []
    comment: list[str] = []
    for line in lines:
        text = line.strip()
        if text.startswith("#:"):
            comment.append(text[2:].strip())
            continue
        if comment and ":" in text:
            try:
                node = ast.parse(text).body[0]
            except SyntaxError:
                node = None
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found[node.target.id] = re.sub(r"``?([^`]*)``?", r"\1", " ".join(comment))
        comment = []
    return {name: found.get(name, name.replace("_", " ")) for name in names}
