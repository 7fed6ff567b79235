"""What ``ttlbroker`` shows of streams, topics, consumers, KV buckets and the
broker's stats: the JSON object of each (``--json``), and the tables and titled
fields people read.

A key the broker sends that is not listed here (a newer broker's) is still shown,
under its own name, so nothing is hidden.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from protocol import EXPIRY_NONE, StreamDetails, TopicDetails, rfc3339_ns

from ._output import Out, count, duration, flag, listing, size
from broker.client import ConsumerInfo

__all__ = [
    "stream_json", "topic_json", "show_streams", "show_topics", "show_topic", "show_stats",
    "consumer_fields", "show_consumer", "show_consumers", "show_bucket", "show_buckets", "EMPTY",
]

#: What a list without entries says, natscli's words (``nats stream ls`` and so
#: on); nothing with ``--json``.
EMPTY = {
    "streams": "No Streams defined",
    "topics": "No Topics defined",
    "consumers": "No Consumers defined",
    "buckets": "No Key-Value buckets found",
    "keys": "No keys found in bucket",
}


def value_text(v: object) -> str:
    """Any value of a details map, for people: never a Python repr."""
    if isinstance(v, bool):
        return flag(v)
    if v is None:
        return "-"
    if isinstance(v, int):
        return count(v)
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return listing(value_text(x) for x in v)
    if isinstance(v, Mapping):
        return listing((f"{k} {value_text(x)}" for k, x in v.items()), empty="none")
    return str(v)


def _off_or(fmt: Callable[[Any], str], off: str) -> Callable[[Any], str]:
    return lambda v: off if not v else fmt(v)


# -- streams ------------------------------------------------------------------------


def stream_json(s: StreamDetails) -> dict[str, object]:
    return {"id": s.id, "name": s.name, "topics_count": s.topics_count, "size": s.size, "messages_count": s.messages_count}


def show_streams(out: Out, streams: list[StreamDetails]) -> None:
    if out.json:
        for s in streams:
            out.obj(stream_json(s))
    elif streams:
        out.table(
            ["ID>", "NAME", "TOPICS>", "MESSAGES>", "BYTES>"],
            [[str(s.id), s.name, count(s.topics_count), count(s.messages_count), size(s.size)] for s in streams],
        )
    else:
        out.note(EMPTY["streams"])


# -- topics -------------------------------------------------------------------------


def _details(t: TopicDetails) -> Mapping[str, Any]:
    """A topic's details map as the broker sent it (msgpack: each key's value is
    what ``docs/protocol.md`` says, not a type the protocol declares)."""
    return t.extra


def topic_json(t: TopicDetails) -> dict[str, Any]:
    x = _details(t)
    return {
        "id": t.id,
        "name": t.name,
        "stream_id": t.stream_id,
        "partitions_count": t.partitions_count,
        "message_expiry": t.message_expiry,
        "size": t.size,
        "messages_count": t.messages_count,
        **t.options,
        "pending_expiries": x.get("pending_expiries", 0),
        "pending_schedules": x.get("pending_schedules", 0),
        "removed": x.get("removed", {}),
        "markers": x.get("markers", {}),
        "duplicates": x.get("duplicates", 0),
        "partitions": x.get("partitions", []),
    }


def _max_age(seconds: int) -> str:
    return "none" if seconds in (0, EXPIRY_NONE) else duration(seconds)


def _republish(rp: Mapping[str, Any] | None) -> str:
    if not rp:
        return "-"
    text = f"{rp.get('src') or '>'} -> {rp.get('dest')}"
    return text + (" (headers only)" if rp.get("headers_only") else "")


def _bucket_options(kv: Mapping[str, Any] | None) -> str:
    if not kv:
        return "-"
    ttl = kv.get("ttl") or 0
    return f"ttl {duration(ttl) if ttl else 'none'}, refresh {kv.get('refresh')}, visibility {kv.get('visibility')}"


def _nats_options(nats: Mapping[str, Any]) -> str:
    """A NATS stream's settings with no topic equivalent: the ``nats`` topic option
    that the NATS listener's JetStream API sets (``docs/protocol.md``)."""
    extras = [k.replace("_", " ") for k in ("deny_delete", "allow_direct") if nats.get(k)]
    return str(nats.get("name", "-")) + (f" ({', '.join(extras)})" if extras else "")


#: Topic options in the order shown: key -> (label, format).
_TOPIC_OPTIONS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "subjects": ("subjects", listing),
    "max_msgs_per_subject": ("max msgs per subject", _off_or(count, "unlimited")),
    "segment_size": ("segment size", size),
    "duplicate_window": ("duplicate window", _off_or(duration, "off")),
    "allow_msg_ttl": ("per-message TTL", lambda v: "allowed" if v else "no"),
    "subject_delete_marker_ttl": ("marker TTL", _off_or(duration, "off")),
    "allow_rollup": ("rollup", lambda v: "allowed" if v else "no"),
    "deny_purge": ("deny purge", flag),
    "allow_msg_schedules": ("message schedules", lambda v: "allowed" if v else "no"),
    "retention": ("retention", str),
    "storage": ("storage", str),
    "max_msgs": ("max msgs", _off_or(count, "unlimited")),
    "max_bytes": ("max bytes", _off_or(size, "unlimited")),
    "max_msg_size": ("max msg size", _off_or(size, "unlimited")),
    "max_consumers": ("max consumers", _off_or(count, "unlimited")),
    "discard": ("discard", str),
    "discard_new_per_subject": ("discard per subject", flag),
    "republish": ("republish", _republish),
    "kv": ("KV bucket", _bucket_options),
    "nats": ("NATS stream", _nats_options),
    "subject_transform": ("subject transform", lambda v: f"{v.get('src') or '>'} -> {v.get('dest') or '(none)'}"),
    "first_seq": ("first offset", str),
    "sealed": ("sealed", flag),
    "mirror": ("mirror of", lambda v: _copy_text(v)),
    "sources": ("sources", lambda v: ", ".join(_copy_text(c) for c in v)),
}
#: Options shown only when set.
_WHEN_SET = {"kv", "nats", "subject_transform", "first_seq", "sealed", "allow_msg_schedules", "mirror", "sources"}


def _copy_text(copy: Mapping[str, Any]) -> str:
    """A mirror's or source's origin: its name, its filter, and the remote it is on."""
    text = str(copy.get("name", "?"))
    if copy.get("filter_subject"):
        text += f" ({copy['filter_subject']})"
    if copy.get("domain"):
        text += f" in domain {copy['domain']}"
    elif copy.get("external"):
        text += f" via {(copy['external'] or {}).get('api', '?')}"
    return text


#: Options shown only when set (the limits and discard policies: most topics have none).
_SHOWN_WHEN_SET = ("max_msgs", "max_bytes", "max_msg_size", "max_consumers", "discard", "discard_new_per_subject")


def show_topics(out: Out, topics: list[TopicDetails]) -> None:
    if out.json:
        for t in topics:
            out.obj(topic_json(t))
    elif topics:
        out.table(
            ["ID>", "NAME", "PARTITIONS>", "MAX AGE", "MESSAGES>", "BYTES>", "SUBJECTS"],
            [
                [str(t.id), t.name, str(t.partitions_count), _max_age(t.message_expiry), count(t.messages_count),
                 size(t.size), listing(t.options.get("subjects", []))]
                for t in topics
            ],
        )
    else:
        out.note(EMPTY["topics"])


def show_topic(out: Out, t: TopicDetails) -> None:
    if out.json:
        out.obj(topic_json(t))
        return
    x = _details(t)
    options = dict(x.get("options", {}))
    config = [("partitions", str(t.partitions_count)), ("max age", _max_age(t.message_expiry))]
    for key, (label, fmt) in _TOPIC_OPTIONS.items():
        if key in options:
            value = options.pop(key)
            if (key not in _WHEN_SET or value) and (key not in _SHOWN_WHEN_SET or value not in (0, False, "old")):
                config.append((label, fmt(value)))
    config += [(k.replace("_", " "), value_text(v)) for k, v in options.items()]
    out.fields(f"Topic {x.get('stream', t.stream_id)}/{t.name} (id {t.id})", config)
    out.blank()
    state = [
        ("messages", count(t.messages_count)),
        ("bytes", size(t.size)),
        ("pending expiries", count(x.get("pending_expiries", 0))),
        ("duplicates", count(x.get("duplicates", 0))),
        ("removed", value_text(x.get("removed", {}))),
        ("markers", value_text(x.get("markers", {}))),
    ]
    if t.options.get("allow_msg_schedules"):
        state.insert(3, ("pending schedules", count(x.get("pending_schedules", 0))))
    if x.get("consumers"):
        state.append(("consumers", listing(c["name"] for c in x["consumers"])))
    out.fields("State", state)
    out.blank()
    out.table(
        ["PARTITION>", "FIRST>", "LAST>", "MESSAGES>", "BYTES>", "SEGMENTS>", "SUBJECTS>"],
        [
            [str(p["partition"]), str(p["first_offset"]), str(p["last_offset"]), count(p["messages"]),
             size(p["size_bytes"]), str(p["segments"]), count(p["subjects"])]
            for p in x.get("partitions", [])
        ],
    )


# -- stats ----------------------------------------------------------------------------


def _ms(v: float) -> str:
    return f"{v:g} ms"


#: The groups of ``stats``: title -> [(key, label, format)]. Keys not listed go to
#: "Other" under their own names.
_STATS: list[tuple[str, list[tuple[str, str, Callable[[Any], str]]]]] = [
    ("Server", [
        ("name", "name", str), ("version", "version", str), ("uptime_seconds", "uptime", lambda v: duration(round(v))),
        ("fsync", "fsync", str), ("fsyncs", "fsyncs", count), ("last_fsync_seconds", "last fsync took", lambda v: _ms(v * 1000)),
    ]),
    ("Connections", [
        ("connections", "open", count), ("connections_total", "accepted", count),
        ("connections_refused", "refused (limit)", count), ("connections_failed", "failed", count),
        ("handshake_timeouts", "handshake timeouts", count), ("auth_failures", "auth failures", count),
        ("publish_permission_violations", "publish permission violations", count),
        ("subscribe_permission_violations", "subscribe permission violations", count),
        ("tls_handshake_failures", "TLS handshake failures", count),
        ("request_errors", "request errors", count), ("subscriptions", "subscriptions", count),
        ("slow_consumers", "slow consumers", count), ("queued_bytes", "queued", size),
        ("queued_bytes_max", "queued (peak)", size), ("queued_bytes_budget", "queue budget", size),
    ]),
    ("Messages", [
        ("messages_in", "in", count), ("bytes_in", "bytes in", size), ("messages_out", "out", count),
        ("bytes_out", "bytes out", size), ("publish_errors", "publish errors", count), ("duplicates", "duplicates", count),
        ("messages_unrouted", "unrouted", count), ("deliveries_dropped", "deliveries dropped", count),
        ("republished", "republished", count), ("dropped_loops", "dropped (loops)", count),
        ("dropped_invalid_subject", "dropped (invalid subject)", count),
    ]),
    ("Storage", [
        ("streams", "streams", count), ("topics", "topics", count), ("partitions", "partitions", count),
        ("segments", "segments", count), ("messages", "messages", count), ("bytes_in_logs", "bytes in logs", size),
        ("bytes_on_disk", "bytes on disk", size), ("segments_reclaimed", "segments reclaimed", count),
        ("bytes_reclaimed", "bytes reclaimed", size), ("corrupt_records", "corrupt records", count),
        ("torn_records_truncated", "torn records cut", count), ("damage_detected", "damage detected", count),
    ]),
    ("Removal and expiry", [
        ("deleted", "deleted", count), ("purged", "purged", count),
        ("removed_max_msgs_per_subject", "over max msgs per subject", count), ("removed_acked", "acked (work queue or interest)", count), ("removed_rollup", "rolled up", count),
        ("removed_limits", "over max msgs or max bytes", count), ("refused_limits", "refused by limits", count),
        ("expired_ttl", "expired (TTL)", count), ("expired_max_age", "expired (max age)", count),
        ("markers", "markers written", count), ("pending_expiries", "pending expiries", count),
        ("expiry_passes", "expiry passes", count), ("expiry_lag_max_ms", "expiry lag (max)", _ms),
        ("pending_schedules", "pending schedules", count), ("schedules_fired", "schedules fired", count),
    ]),
    ("Consumers", [
        ("consumers", "consumers", count), ("consumer_num_pending", "pending", count),
        ("consumer_num_ack_pending", "ack pending", count), ("consumer_num_redelivered", "redelivered (pending)", count),
        ("consumer_num_waiting", "waiting pulls", count), ("consumer_timers", "timers", count),
        ("consumer_delivered", "delivered", count), ("consumer_redelivered", "redelivered", count),
        ("consumer_acked", "acked", count), ("consumer_naked", "naked", count),
        ("consumer_terminated", "terminated", count), ("consumer_given_up", "given up", count),
        ("consumer_dropped", "dropped", count),
        ("dead_lettered_max_deliveries", "dead lettered (max deliveries)", count),
        ("dead_lettered_terminated", "dead lettered (terminated)", count),
        ("dead_lettered_expired", "dead lettered (expired)", count),
        ("dead_lettered_limit", "dead lettered (over a limit)", count),
        ("dead_letters_redriven", "dead letters redriven", count),
    ]),
    ("Export", [
        ("segments_exported", "segments", count), ("rows_exported", "rows", count),
        ("export_failures", "failures", count),
    ]),
    ("Monitoring port", [
        ("http_connections_total", "accepted", count), ("http_connections_refused", "refused (limits)", count),
        ("http_connections_evicted", "replaced (limits)", count), ("http_request_timeouts", "request timeouts", count),
        ("http_response_timeouts", "response timeouts", count),
    ]),
]


def show_stats(out: Out, stats: dict[str, Any]) -> None:
    if out.json:
        out.obj(stats)
        return
    rest = dict(stats)
    groups = []
    for title, keys in _STATS:
        fields = [(label, fmt(rest.pop(key))) for key, label, fmt in keys if key in rest]
        if fields:
            groups.append((title, fields))
    if rest:
        groups.append(("Other", [(key, value_text(v)) for key, v in rest.items()]))
    for i, (title, fields) in enumerate(groups):
        if i:
            out.blank()
        out.fields(title, fields)


# -- consumers --------------------------------------------------------------------------


def _limit(v: int | None) -> str:
    return "unlimited" if v is None or v < 0 else count(v)


def _seq(d: Mapping[str, Any], partitions: list[dict[str, Any]], key: str) -> str:
    """A consumer's delivered or ack floor position: its consumer sequence, and the
    stream sequence (offset) it stands at. Each partition has offsets of its own, so
    a topic of several has one per partition (``P:N``, as ``--start-offset`` takes
    them), never one number for all."""
    if len(partitions) <= 1:
        return f"consumer seq {d.get('consumer_seq', 0)}, stream seq {d.get('stream_seq', 0)}"
    offsets = ", ".join(f"{p['partition']}:{p.get(key, 0)}" for p in partitions)
    return f"consumer seq {d.get('consumer_seq', 0)}, offset per partition {offsets}"


def consumer_fields(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A consumer's configuration for people: (label, value) in the order shown."""
    cfg = dict(config)
    deliver = cfg.get("deliver_policy", "all")
    if "opt_start_offset" in cfg:
        start = cfg["opt_start_offset"]  # N, or {partition: N} as --start-offset P:N,... takes it
        deliver += " from " + (",".join(f"{p}:{o}" for p, o in start.items()) if isinstance(start, Mapping) else str(start))
    if "opt_start_time" in cfg:
        deliver += f" from {rfc3339_ns(cfg['opt_start_time'])}"
    fields = [
        ("filter", listing(cfg.get("filter_subjects") or [], empty="(all subjects)")),
        ("deliver", deliver),
        ("ack policy", str(cfg.get("ack_policy"))),
        ("ack wait", duration(cfg.get("ack_wait", 0))),
        ("max deliver", _limit(cfg.get("max_deliver"))),
    ]
    if cfg.get("backoff"):
        fields.append(("backoff", listing(duration(b) for b in cfg["backoff"])))
    fields += [
        ("max ack pending", _limit(cfg.get("max_ack_pending"))),
        ("max waiting", _limit(cfg.get("max_waiting"))),
        ("mode", str(cfg.get("mode"))),
    ]
    if cfg.get("mode") == "partitioned":
        fields.append(("member timeout", duration(cfg.get("member_timeout", 0))))
    if cfg.get("description"):
        fields.append(("description", str(cfg["description"])))
    if cfg.get("dead_letter_subject"):
        fields.append(("dead letter", str(cfg["dead_letter_subject"])
                       + (" (also expired and over limits)" if cfg.get("dead_letter_expired") else "")))
    return fields


def _dead_lettered(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The copies made to the dead-letter subject, by reason (shown when the consumer
    has a dead-letter subject or made some): ``12 (MaxDeliveries 10, Expired 2)``."""
    made = raw.get("dead_lettered") or {}
    if not raw.get("config", {}).get("dead_letter_subject") and not any(made.values()):
        return []
    by_reason = ", ".join(f"{reason} {count(n)}" for reason, n in made.items() if n)
    return [("dead lettered", count(sum(made.values())) + (f" ({by_reason})" if by_reason else ""))]


def show_consumer(out: Out, info: ConsumerInfo) -> None:
    if out.json:
        out.obj(info.raw)
        return
    raw = info.raw
    out.fields(f"Consumer {raw.get('stream', '?')}/{raw.get('topic', '?')}/{info.name}", consumer_fields(info.config))
    out.blank()
    out.fields("State", [
        ("pending", count(info.num_pending)),
        ("ack pending", count(info.num_ack_pending)),
        ("redelivered", count(info.num_redelivered)),
        ("waiting pulls", count(info.num_waiting)),
        ("delivered", _seq(raw.get("delivered", {}), info.partitions, "delivered")),
        ("ack floor", _seq(raw.get("ack_floor", {}), info.partitions, "ack_floor")),
    ] + _dead_lettered(raw))
    if info.partitions:
        owned = any("owner" in p for p in info.partitions)
        out.blank()
        out.table(
            ["PARTITION>", "DELIVERED>", "ACK FLOOR>", "PENDING>", "ACK PENDING>", "REDELIVERED>"] + (["OWNER"] if owned else []),
            [
                [str(p["partition"]), str(p.get("delivered", 0)), str(p.get("ack_floor", 0)), count(p.get("num_pending", 0)),
                 count(p.get("num_ack_pending", 0)), count(p.get("num_redelivered", 0))]
                + ([p.get("owner") or "-"] if owned else [])
                for p in info.partitions
            ],
        )
    members = raw.get("members", [])
    if members:
        out.blank()
        out.table(
            ["MEMBER", "PARTITIONS", "CONNECTED"],
            [[m["name"], listing(m.get("partitions", [])), flag(m.get("connected"))] for m in members],
        )


def show_consumers(out: Out, infos: Iterable[ConsumerInfo]) -> None:
    infos = list(infos)
    if out.json:
        for info in infos:
            out.obj(info.raw)
    elif infos:
        out.table(
            ["NAME", "MODE", "PENDING>", "ACK PENDING>", "REDELIVERED>", "WAITING>", "FILTER"],
            [
                [info.name, str(info.config.get("mode")), count(info.num_pending), count(info.num_ack_pending),
                 count(info.num_redelivered), count(info.num_waiting),
                 listing(info.config.get("filter_subjects") or [], empty="(all)")]
                for info in infos
            ],
        )
    else:
        out.note(EMPTY["consumers"])


# -- KV buckets -------------------------------------------------------------------------


def show_bucket(out: Out, status: dict[str, Any]) -> None:
    if out.json:
        out.obj(status)
        return
    s = dict(status)
    fields = [
        ("history", count(s.pop("history", 1) or 1)),
        ("ttl", _off_or(duration, "none")(s.pop("ttl", 0))),
        ("marker TTL", _off_or(duration, "off")(s.pop("marker_ttl", 0))),
        ("refresh", str(s.pop("refresh", "-"))),
        ("visibility", str(s.pop("visibility", "-"))),
        ("values", count(s.pop("values", 0))),
        ("messages", count(s.pop("messages", 0))),
        ("bytes", size(s.pop("bytes", 0))),
        ("pending expiries", count(s.pop("pending_expiries", 0))),
    ]
    name = s.pop("bucket", "?")
    fields += [(k.replace("_", " "), value_text(v)) for k, v in s.items()]
    out.fields(f"Bucket {name}", fields)


def show_buckets(out: Out, statuses: list[dict[str, Any]]) -> None:
    if out.json:
        for s in statuses:
            out.obj(s)
    elif statuses:
        out.table(
            ["BUCKET", "VALUES>", "HISTORY>", "TTL", "MESSAGES>", "BYTES>"],
            [
                [s["bucket"], count(s.get("values", 0)), count(s.get("history") or 1),
                 _off_or(duration, "none")(s.get("ttl", 0)), count(s.get("messages", 0)), size(s.get("bytes", 0))]
                for s in statuses
            ],
        )
    else:
        out.note(EMPTY["buckets"])
