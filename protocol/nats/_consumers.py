"""JetStream consumers as NATS clients see them, sans-IO: the consumer
configuration in the server's JSON, the pull request (``CONSUMER.MSG.NEXT``), the
``$JS.ACK`` reply subjects and the acknowledgement bodies.

* :func:`consumer_config_from_nats` turns the server's ``ConsumerConfig`` (durations
  in nanoseconds, times in RFC 3339) into the map ttlbroker's consumer engine checks
  (``ConsumerConfig.from_map``: durations in seconds) plus the NATS-only delivery
  settings (:class:`PushSettings`); what the engine does not have is refused with
  a ``JSError`` (``_jetstream.py``) carrying the server's ``{code, err_code, description}``,
  never silently accepted. :func:`consumer_config_to_nats` is the way back.
* :func:`parse_next_request` reads a pull request as nats-server's ``nextReqFromMsg``
  does (empty = one message, a bare number = a batch, or the JSON request).
* :func:`ack_subject` / :func:`parse_ack_subject` are the server's v1 ack reply
  subject ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream_seq>.<consumer_seq>.<timestamp_ns>.<pending>``
  (the 11-or-more-token v2 form with domain and account hash is read too).
* :func:`parse_ack_body` reads ``+ACK``, ``-NAK`` (optionally ``{"delay": ns}``),
  ``+TERM``, ``+WPI`` and ``+NXT``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from .._consumers import _PULL_ENTRY, AckKind, PulledRun, encode_pull_entry
from .._records import FIXED_SIZE, RECORD_FIXED
from ._jetstream import JSError, rfc3339, user_metadata, versioned_metadata
from ._json import loads as json_loads
from ._wire import encode_msg, encode_nats_headers, nats_message_of_record

__all__ = [
    "PushSettings", "NextRequest", "ACK_NEXT", "consumer_config_from_nats", "consumer_config_to_nats",
    "parse_next_request", "ack_subject", "parse_ack_subject", "AckReply", "parse_ack_body", "term_reason", "parse_pause_until", "parse_rfc3339", "with_header", "ack_metric", "sample_percent", "check_group_name",
    "js_delivery", "js_delivery_frames", "status_message", "idle_heartbeat",
]

NS = 1_000_000_000

#: ``+NXT``: ack, and ask for the next message(s) on the ack's reply subject.
ACK_NEXT = 100


#: Each deliver policy as the server's start-position errors name it.
_POLICY_WORDS = {
    "all": "all", "last": "last", "new": "new", "last_per_subject": "last per subject",
    "by_start_sequence": "by start sequence", "by_start_time": "by start time",
}


def _bad_start(policy: str, start: str) -> str:
    return f"consumer delivery policy is deliver {policy}, but optional start {start} is also set"


def _not_set(policy: str, missing: str) -> str:
    return f"consumer delivery policy is deliver {policy}, but optional {missing} is not set"


def _invalid(description: str) -> JSError:
    """A refused setting: the server's ``JSConsumerInvalidPolicyErrF`` (10094), whose
    description is the reason."""
    return JSError(400, 10094, description)


def parse_rfc3339(text: str) -> int:
    """An RFC 3339 time (Go's ``time.Time`` JSON: any offset, up to nanoseconds) in
    ns since the epoch. Raises ValueError."""
    if not isinstance(text, str) or "T" not in text:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    s = text.strip()
    tz = "+00:00"
    if s[-1:] in ("Z", "z"):
        s = s[:-1]
    else:
        i = max(s.rfind("+"), s.rfind("-"))
        if i > s.index("T"):
            s, tz = s[:i], s[i:]
    frac_ns = 0
    if "." in s:
        s, frac = s.split(".", 1)
        if not frac.isdigit() or len(frac) > 9:
            raise ValueError(f"not an RFC 3339 time: {text!r}")
        frac_ns = int(frac.ljust(9, "0"))
    dt = datetime.fromisoformat(s + tz)
    return int(dt.timestamp()) * NS + frac_ns


# -- configuration --------------------------------------------------------------------------


@dataclass(frozen=True)
class PushSettings:
    """What a NATS consumer has beyond the engine's configuration: how it delivers.

    ``deliver_subject`` set: a push consumer. ``durable``: created with a durable name
    (else ephemeral: removed ``inactive_threshold`` after it was last active).
    """

    durable: bool
    deliver_subject: str = ""
    #: A push consumer's queue group: each message goes to one subscriber of the
    #: deliver subject in this group.
    deliver_group: str = ""
    flow_control: bool = False
    idle_heartbeat_ns: int = 0
    headers_only: bool = False
    inactive_threshold_ns: int = 0
    mem_storage: bool = False
    num_replicas: int = 0
    #: An ``ack_policy`` none consumer's ``max_deliver`` of 1 and ``ack_wait``, as
    #: given (the engine delivers such a consumer's messages once and never waits for
    #: an ack, so it keeps neither; the server reports both as set).
    max_deliver: int = 0
    ack_wait_ns: int = 0
    #: Created with a name (in the subject or the config): the config shows it. An
    #: ephemeral created without one has a made-up name the config leaves out.
    named: bool = True
    #: The pull request limits (``max_batch``, ``max_expires``, ``max_bytes``; 0 =
    #: none): a pull over one is refused with the server's ``409 Exceeded ...``.
    max_batch: int = 0
    max_expires_ns: int = 0
    max_request_bytes: int = 0
    #: The consumer's ``metadata`` (a JSON object of strings, kept as its text).
    metadata: str = ""
    #: Delivers nothing before this time (ns since the epoch; 0: not paused).
    pause_until_ns: int = 0
    #: A push consumer's delivery rate in bits per second (0: unlimited).
    rate_limit_bps: int = 0
    #: ``replay_policy`` ``original``: what was stored when delivery started goes out
    #: with the gaps between the messages' own timestamps.
    replay_original: bool = False
    #: ``sample_freq`` as given ("50%", "100"; "" none): that share of acks gets an
    #: ack metric advisory (:func:`ack_metric`).
    sample_freq: str = ""
    #: ADR-42 priority groups: the group names (comma-separated), the policy
    #: (``overflow``, ``pinned_client``; "" for none), and a pin's time to live.
    priority_groups: str = ""
    priority_policy: str = ""
    pinned_ttl_ns: int = 0


#: Settings the server has and the engine does not: refused when set to anything but
#: the default, with the reason (field -> (is it set?, description)).
_UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "priority_policy": (lambda v: v == "prioritized", "consumer priority policy prioritized is not supported by ttlbroker"),
    "direct": (lambda v: bool(v), "direct consumers are not supported by ttlbroker"),
}

_KNOWN = {
    "name", "durable_name", "description", "deliver_policy", "opt_start_seq", "opt_start_time", "ack_policy",
    "ack_wait", "max_deliver", "backoff", "filter_subject", "filter_subjects", "replay_policy", "max_waiting",
    "max_ack_pending", "flow_control", "idle_heartbeat", "headers_only", "deliver_subject", "deliver_group", "inactive_threshold",
    "num_replicas", "mem_storage", "max_batch", "max_expires", "max_bytes", "metadata", "pause_until", "rate_limit_bps",
    "priority_groups", "priority_timeout", "sample_freq", "dead_letter_subject", "dead_letter_expired", *_UNSUPPORTED,
}


def _ns(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise JSError(400, 10025, f"invalid JSON: {key} must be an integer of nanoseconds")
    return value


def consumer_config_from_nats(raw: Any, durable: bool) -> tuple[dict[str, Any], PushSettings]:
    """The server's ``ConsumerConfig`` -> (the engine's config map, NATS settings).

    Raises:
        JSError: a setting is malformed, contradicts another (the server's error
            for it), or asks for something ttlbroker does not have.
    """
    if not isinstance(raw, dict):
        raise JSError(400, 10078, "consumer config required")
    for key, (is_set, text) in _UNSUPPORTED.items():
        if key in raw and is_set(raw[key]):
            raise _invalid(text)
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise _invalid(f"consumer option {unknown[0]!r} is not supported by ttlbroker")
    replay = raw.get("replay_policy") or "instant"
    if replay not in ("instant", "original"):
        raise JSError(400, 10182, "consumer replay policy invalid")
    if replay == "original" and not raw.get("deliver_subject"):
        raise _invalid("consumer replay policy original on a pull consumer is not supported by ttlbroker: use a push consumer")
    replicas = raw.get("num_replicas") or 0
    if replicas not in (0, 1):
        raise JSError(500, 10074, "replicas > 1 not supported in non-clustered mode")
    deliver = raw.get("deliver_subject") or ""
    out: dict[str, Any] = {}
    filters = raw.get("filter_subjects") or []
    single = raw.get("filter_subject") or ""
    if single and filters:
        raise JSError(400, 10136, "consumer cannot have both FilterSubject and FilterSubjects specified")
    if any(not f for f in filters):
        raise JSError(400, 10139, "consumer filter in FilterSubjects cannot be empty")
    out["filter_subjects"] = list(filters) if filters else ([single] if single and single != ">" else [])
    dp = raw.get("deliver_policy") or "all"
    # The server's start-position checks (``checkConsumerCfg``), in its order and words.
    seq, t = raw.get("opt_start_seq") or 0, raw.get("opt_start_time")
    words = _POLICY_WORDS.get(dp)
    if words is None:
        raise _invalid(f"consumer deliver policy {dp!r} is not valid")
    if dp == "by_start_sequence":
        if not seq:
            raise _invalid(_not_set(words, "start sequence"))
        if t:
            raise _invalid(_bad_start(words, "time"))
        out["deliver_policy"] = "by_start_offset"
        out["opt_start_offset"] = seq
    elif dp == "by_start_time":
        if not t:
            raise _invalid(_not_set(words, "start time"))
        if seq:
            raise _invalid(_bad_start(words, "start sequence"))
        try:
            out["opt_start_time"] = max(parse_rfc3339(t), 0)
        except ValueError:
            raise JSError(400, 10025, f"invalid JSON: opt_start_time {t!r} is not an RFC 3339 time") from None
        out["deliver_policy"] = dp
    else:
        if seq:
            raise _invalid(_bad_start(words, "sequence"))
        if t:
            raise _invalid(_bad_start(words, "time"))
        if dp == "last_per_subject" and not out["filter_subjects"] and not single:
            raise _invalid(_not_set(words, "filter subject"))
        out["deliver_policy"] = dp
    ap = raw.get("ack_policy") or "none"  # the server's zero value
    if ap not in ("none", "all", "explicit"):
        raise JSError(400, 10181, "consumer ack policy invalid")
    out["ack_policy"] = ap
    wait = _ns("ack_wait", raw.get("ack_wait") or 0)
    if wait < 0:
        raise JSError(400, 10183, "consumer ack wait needs to be positive")
    backoff = raw.get("backoff") or []
    if not isinstance(backoff, list):
        raise JSError(400, 10025, "invalid JSON: backoff must be a list of nanoseconds")
    if any(_ns("backoff", b) <= 0 for b in backoff):
        raise JSError(400, 10184, "consumer backoff needs to be positive")
    md = raw.get("max_deliver") or -1
    if backoff and md != -1 and md <= len(backoff):
        raise JSError(400, 10116, "max deliver is required to be > length of backoff values")
    if backoff:
        out["backoff"] = [b / NS for b in backoff]
    elif wait:
        out["ack_wait"] = wait / NS
    if ap != "none" or md not in (-1, 1):  # ack none delivers once: max_deliver 1 is what it does
        out["max_deliver"] = md
    mw = raw.get("max_waiting") or 0
    if deliver and mw:
        raise JSError(400, 10080, "consumer in push mode can not set max waiting")
    if mw > 0:
        out["max_waiting"] = mw
    mp = raw.get("max_ack_pending") or 0
    if mp and mp != -1 and ap == "none":
        raise JSError(400, 10082, "consumer requires ack policy for max ack pending")
    if mp and ap != "none":
        out["max_ack_pending"] = mp
    if raw.get("description"):
        out["description"] = raw["description"]
    if raw.get("dead_letter_subject"):  # a ttlbroker extension (the engine checks it)
        out["dead_letter_subject"] = raw["dead_letter_subject"]
    if "dead_letter_expired" in raw:
        out["dead_letter_expired"] = raw["dead_letter_expired"]
    hb = _ns("idle_heartbeat", raw.get("idle_heartbeat") or 0)
    fc = bool(raw.get("flow_control"))
    if not deliver:
        if hb:
            raise JSError(400, 10088, "consumer idle heartbeat requires a push based consumer")
        if fc:
            raise JSError(400, 10089, "consumer flow control requires a push based consumer")
    else:
        if any(t in ("*", ">") for t in deliver.split(".")):
            raise JSError(400, 10079, "consumer deliver subject has wildcards")
        if any(not t or any(c.isspace() for c in t) for t in deliver.split(".")):
            raise JSError(400, 10112, "invalid push consumer deliver subject")
        if hb and hb < NS // 10:
            raise JSError(400, 10083, "consumer idle heartbeat needs to be >= 100ms")
        if fc and not hb:
            raise JSError(400, 10108, "consumer with flow control also needs heartbeats")
    inactive = _ns("inactive_threshold", raw.get("inactive_threshold") or 0)
    if inactive < 0:
        raise _invalid("consumer inactive_threshold needs to be positive")
    rate = raw.get("rate_limit_bps") or 0
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
        raise JSError(400, 10025, "invalid JSON: rate_limit_bps must be an unsigned integer")
    if rate and not deliver:
        raise JSError(400, 10086, "consumer in pull mode can not have rate limit set")
    group = raw.get("deliver_group") or ""  # a pull consumer keeps it and ignores it, as the server
    if not isinstance(group, str):
        raise JSError(400, 10025, "invalid JSON: deliver_group must be a string")
    settings = PushSettings(
        durable=durable, deliver_subject=deliver, deliver_group=group, flow_control=fc, idle_heartbeat_ns=hb,
        headers_only=bool(raw.get("headers_only")), inactive_threshold_ns=inactive,
        mem_storage=bool(raw.get("mem_storage")), num_replicas=replicas,
        max_deliver=1 if ap == "none" and md == 1 else 0, ack_wait_ns=wait if ap == "none" else 0,
        metadata=_metadata(raw.get("metadata")), pause_until_ns=parse_pause_until(raw.get("pause_until")),
        rate_limit_bps=rate, replay_original=replay == "original", sample_freq=_sample_freq(raw.get("sample_freq")),
        **_priority(raw, push=bool(deliver)),
    )
    batch, expires, max_bytes = _request_limits(raw, pull=not deliver)
    return out, dataclasses.replace(settings, max_batch=batch, max_expires_ns=expires, max_request_bytes=max_bytes)


def _request_limits(raw: dict[str, Any], pull: bool) -> tuple[int, int, int]:
    """``max_batch``, ``max_expires`` (ns) and ``max_bytes``, as the server reads them
    (a negative one is 0, ``setConsumerConfigDefaults``), and checks them on a pull
    consumer (``checkConsumerCfg``)."""
    limits = []
    for key in ("max_batch", "max_expires", "max_bytes"):
        v = raw.get(key) or 0
        if isinstance(v, bool) or not isinstance(v, int):
            raise JSError(400, 10025, f"invalid JSON: {key} must be an integer")
        limits.append(max(v, 0))
    batch, expires, max_bytes = limits
    if pull and expires and expires < 1_000_000:
        raise JSError(400, 10115, "consumer max request expires needs to be >= 1ms")
    return batch, expires, max_bytes


def parse_pause_until(raw: Any) -> int:
    """``pause_until`` (an RFC 3339 time; none, or Go's zero time: not paused) in ns."""
    if not raw or (isinstance(raw, str) and raw.startswith("0001-01-01")):
        return 0
    try:
        return parse_rfc3339(raw)
    except ValueError:
        raise JSError(400, 10025, f"invalid JSON: pause_until {raw!r} is not an RFC 3339 time") from None


#: A priority group's name (the server's ``validGroupName``).
_GROUP_NAME = re.compile(r"[a-zA-Z0-9/_=-]{1,16}")
#: The server's default pin time to live (``JsDefaultPinnedTTL``).
DEFAULT_PINNED_TTL_NS = 120 * NS


def check_group_name(name: object) -> None:
    """A priority group's name, as the server's ``validGroupName`` checks it.

    Raises:
        JSError: 400 10162 with the server's description.
    """
    if not isinstance(name, str) or not _GROUP_NAME.fullmatch(name):
        raise JSError(400, 10162, "Valid priority group name must match A-Z, a-z, 0-9, -_/=)+ and may not exceed 16 characters")


def _priority(raw: dict[str, Any], push: bool) -> dict[str, Any]:
    """ADR-42's ``priority_groups``, ``priority_policy`` and ``priority_timeout``, with the
    server's defaults and checks (``setConsumerConfigDefaults``, ``checkConsumerCfg``)."""
    policy = raw.get("priority_policy") or "none"
    if policy not in ("none", "overflow", "pinned_client"):
        raise JSError(400, 10025, f"invalid JSON: can not unmarshal {policy!r} into PriorityPolicy")
    groups = raw.get("priority_groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise JSError(400, 10025, "invalid JSON: priority_groups must be a list of strings")
    ttl = _ns("priority_timeout", raw.get("priority_timeout") or 0)
    ttl = max(ttl, 0)
    if policy == "pinned_client" and not ttl:
        ttl = DEFAULT_PINNED_TTL_NS
    if policy != "none":
        if push:
            raise JSError(400, 10178, "priority groups can not be used with push consumers")
        if not groups:
            raise JSError(400, 10159, "Setting PriorityPolicy requires at least one PriorityGroup to be set")
        for g in groups:
            if not g:
                raise JSError(400, 10161, "Group name cannot be an empty string")
            check_group_name(g)
    else:
        if groups:
            raise JSError(400, 10196, "consumer can not have priority groups when policy is none")
        if ttl:
            raise JSError(400, 10197, "PinnedTTL cannot be set when PriorityPolicy is none")
    return {"priority_groups": ",".join(groups), "priority_policy": "" if policy == "none" else policy, "pinned_ttl_ns": ttl}


def _sample_freq(raw: Any) -> str:
    """``sample_freq``, checked as the server checks it (``strconv.Atoi`` of it without
    a trailing ``%``, not negative)."""
    if not raw:
        return ""
    if not isinstance(raw, str):
        raise JSError(400, 10025, "invalid JSON: sample_freq must be a string")
    digits = raw[:-1] if raw.endswith("%") else raw
    if not re.fullmatch(r"[+-]?[0-9]+", digits):
        raise JSError(400, 10095, f'failed to parse consumer sampling configuration: strconv.Atoi: parsing "{digits}": invalid syntax')
    if int(digits) < 0:
        raise JSError(400, 10095, "failed to parse consumer sampling configuration: %!s(<nil>)")
    return raw


def sample_percent(sample_freq: str) -> int:
    """The share of acks sampled (0 to 100 and over), from a checked ``sample_freq``."""
    return int(sample_freq.rstrip("%")) if sample_freq else 0


def ack_metric(stream: str, consumer: str, consumer_seq: int, stream_seq: int, ack_time_ns: int, deliveries: int, now_ns: int, event_id: str) -> bytes:
    """The server's ``io.nats.jetstream.metric.v1.consumer_ack`` advisory
    (``JSConsumerAckMetric``), sent to ``$JS.EVENT.METRIC.CONSUMER.ACK.<stream>.<consumer>``."""
    return json.dumps({
        "type": "io.nats.jetstream.metric.v1.consumer_ack", "id": event_id, "timestamp": rfc3339(now_ns),
        "stream": stream, "consumer": consumer, "consumer_seq": consumer_seq, "stream_seq": stream_seq,
        "ack_time": ack_time_ns, "deliveries": deliveries,
    }, separators=(",", ":")).encode()


def _metadata(raw: Any) -> str:
    """A consumer's ``metadata`` (strings to strings) as its JSON text ("" for none)."""
    if not raw:
        return ""
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise JSError(400, 10025, "invalid JSON: metadata must be an object of strings")
    raw = user_metadata(raw)
    return json.dumps(raw, sort_keys=True, separators=(",", ":")) if raw else ""


def consumer_config_to_nats(name: str, cfg: dict[str, Any], settings: PushSettings, default_inactive_ns: int) -> dict[str, Any]:
    """The engine's config map (``ConsumerConfig.to_map``) and the NATS settings as the
    server's ``ConsumerConfig`` JSON."""
    out: dict[str, Any] = {}
    if settings.durable:
        out["durable_name"] = name
    if settings.named or settings.durable:
        out["name"] = name
    if cfg.get("description"):
        out["description"] = cfg["description"]
    if cfg.get("dead_letter_subject"):
        out["dead_letter_subject"] = cfg["dead_letter_subject"]
    if cfg.get("dead_letter_expired"):
        out["dead_letter_expired"] = True
    if settings.deliver_subject:
        out["deliver_subject"] = settings.deliver_subject
    if settings.deliver_group:
        out["deliver_group"] = settings.deliver_group
    dp = cfg["deliver_policy"]
    if dp == "by_start_offset":
        out["deliver_policy"] = "by_start_sequence"
        start = cfg["opt_start_offset"]
        out["opt_start_seq"] = start if isinstance(start, int) else min(start.values())
    else:
        out["deliver_policy"] = dp
        if dp == "by_start_time":
            out["opt_start_time"] = rfc3339(cfg["opt_start_time"])
    out["ack_policy"] = cfg["ack_policy"]
    if cfg["ack_policy"] != "none":
        out["ack_wait"] = int(cfg["ack_wait"] * NS)
    elif settings.ack_wait_ns:
        out["ack_wait"] = settings.ack_wait_ns  # the server defaults it only when acks are wanted
    out["max_deliver"] = settings.max_deliver or cfg["max_deliver"]
    if cfg["backoff"]:
        out["backoff"] = [int(b * NS) for b in cfg["backoff"]]
    filters = cfg["filter_subjects"]
    if len(filters) == 1:
        out["filter_subject"] = filters[0]
    elif filters:
        out["filter_subjects"] = list(filters)
    out["replay_policy"] = "original" if settings.replay_original else "instant"
    if not settings.deliver_subject:
        out["max_waiting"] = cfg["max_waiting"]
    if cfg["ack_policy"] != "none":
        out["max_ack_pending"] = cfg["max_ack_pending"]
    if settings.flow_control:
        out["flow_control"] = True
    if settings.idle_heartbeat_ns:
        out["idle_heartbeat"] = settings.idle_heartbeat_ns
    if settings.headers_only:
        out["headers_only"] = True
    if settings.max_batch:
        out["max_batch"] = settings.max_batch
    if settings.max_expires_ns:
        out["max_expires"] = settings.max_expires_ns
    if settings.max_request_bytes:
        out["max_bytes"] = settings.max_request_bytes
    if not settings.durable:
        out["inactive_threshold"] = settings.inactive_threshold_ns or default_inactive_ns
    elif settings.inactive_threshold_ns:
        out["inactive_threshold"] = settings.inactive_threshold_ns
    # ADR-44: pausing and priority groups need API level 1 (the server's rule).
    required = 1 if settings.pause_until_ns or settings.priority_policy or settings.pinned_ttl_ns or settings.priority_groups else 0
    out["metadata"] = versioned_metadata(json.loads(settings.metadata) if settings.metadata else None, required)
    if settings.pause_until_ns:
        out["pause_until"] = rfc3339(settings.pause_until_ns)
    if settings.rate_limit_bps:
        out["rate_limit_bps"] = settings.rate_limit_bps
    if settings.sample_freq:
        out["sample_freq"] = settings.sample_freq
    if settings.priority_policy:
        out["priority_groups"] = settings.priority_groups.split(",")
        out["priority_policy"] = settings.priority_policy
        if settings.pinned_ttl_ns:
            out["priority_timeout"] = settings.pinned_ttl_ns
    out["num_replicas"] = settings.num_replicas
    if settings.mem_storage:
        out["mem_storage"] = True
    return out


# -- pull requests --------------------------------------------------------------------------


class NextRequest(NamedTuple):
    batch: int
    max_bytes: int
    expires_ns: int
    no_wait: bool
    heartbeat_ns: int
    #: The request was JSON (nats-server then always has a priority group for it,
    #: empty or not), and ADR-42's fields of it.
    json: bool = False
    group: str = ""
    min_pending: int = 0
    min_ack_pending: int = 0
    pin_id: str = ""


def parse_next_request(payload: bytes) -> NextRequest:
    """A ``CONSUMER.MSG.NEXT`` request, as nats-server's ``nextReqFromMsg`` reads it.

    Raises:
        ValueError: the reason, which the server sends as ``400 Bad Request - <reason>``.
    """
    req = bytes(payload).strip()
    if not req:
        return NextRequest(1, 0, 0, False, 0)
    if req[:1] != b"{":
        return NextRequest(int(req) if req.isdigit() else 1, 0, 0, False, 0)
    try:
        d = json_loads(req)
    except ValueError as exc:  # a nesting too deep too
        raise ValueError(str(exc)) from None
    if not isinstance(d, dict):
        raise ValueError("the request must be a JSON object")
    vals = []
    for key in ("batch", "max_bytes", "expires", "idle_heartbeat"):
        v = d.get(key) or 0
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"json: cannot unmarshal {type(v).__name__} into Go struct field {key}")
        vals.append(v)
    batch, max_bytes, expires, hb = vals
    if hb > 0 and hb * 2 > expires:
        raise ValueError("heartbeat value too large")
    group, pin_id = d.get("group") or "", d.get("id") or ""
    mins = [d.get("min_pending") or 0, d.get("min_ack_pending") or 0]
    if not isinstance(group, str) or not isinstance(pin_id, str) or any(isinstance(v, bool) or not isinstance(v, int) for v in mins):
        raise ValueError("json: cannot unmarshal the priority group")
    return NextRequest(batch, max_bytes, max(expires, 0), bool(d.get("no_wait")), hb, True, group, mins[0], mins[1], pin_id)


# -- ack subjects and bodies ------------------------------------------------------------------


def ack_subject(stream: str, consumer: str, delivered: int, stream_seq: int, consumer_seq: int, ts: int, pending: int) -> str:
    return _ack_reply(stream, consumer, delivered, stream_seq, consumer_seq, ts, pending).decode()


def _ack_reply(stream: str, consumer: str, delivered: int, stream_seq: int, consumer_seq: int, ts: int, pending: int) -> bytes:
    """:func:`ack_subject` as bytes, from the consumer's cached prefix."""
    return _ack_prefix(stream, consumer) + b"%d.%d.%d.%d.%d" % (delivered, stream_seq, consumer_seq, ts, pending)


@functools.lru_cache(maxsize=1024)
def _ack_prefix(stream: str, consumer: str) -> bytes:
    return f"$JS.ACK.{stream}.{consumer}.".encode()


class AckReply(NamedTuple):
    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    consumer_seq: int
    #: When the message was stored (ns since the epoch), and how many messages the
    #: consumer had pending after it when it was delivered (0 when not numbers).
    timestamp_ns: int = 0
    pending: int = 0


def parse_ack_subject(subject: str) -> AckReply | None:
    """The fields of a ``$JS.ACK`` subject (v1, or v2 with domain and account hash);
    None when it is not one."""
    t = subject.split(".")
    if len(t) == 9:
        i = 2
    elif len(t) >= 11:
        i = 4
    else:
        return None
    if t[0] != "$JS" or t[1] != "ACK":
        return None
    d, s, c, ts, p = t[i + 2], t[i + 3], t[i + 4], t[i + 5], t[i + 6]
    if not (_ack_number(d) and _ack_number(s) and _ack_number(c)):
        return None
    return AckReply(t[i], t[i + 1], int(d), int(s), int(c), int(ts) if _ack_number(ts) else 0, int(p) if _ack_number(p) else 0)


def _ack_number(token: str) -> bool:
    """A number of an ack subject: ASCII digits only (as the server's
    ``parseAckReplyNum``; ``str.isdigit`` alone would take ``²``, which ``int`` refuses)."""
    return token.isdigit() and token.isascii()


_PLAIN_ACK = (int(AckKind.ACK), 0)


def term_reason(payload: bytes | memoryview) -> str:
    """The reason a ``+TERM <reason>`` gives (trimmed, as nats-server reads it for its
    terminated advisory); "" when there is none."""
    body = bytes(payload)
    return body[5:].strip().decode(errors="replace") if body.startswith(b"+TERM") else ""


def parse_ack_body(payload: bytes) -> tuple[int, int]:
    """``(kind, value)``: an :class:`AckKind` and the NAK delay in ns, or
    ``(ACK_NEXT, batch)``. An empty body is ``+ACK`` (as on the server).

    Raises:
        ValueError: not an acknowledgement.
    """
    if not payload or payload == b"+ACK":
        return _PLAIN_ACK  # what nats-py and nats.js send for ack()
    body = bytes(payload).strip()
    if not body or body == b"+ACK":
        return _PLAIN_ACK
    head, _, rest = body.partition(b" ")
    if head == b"+ACK":
        return int(AckKind.ACK), 0
    if head == b"-NAK":
        delay = 0
        rest = rest.strip()
        if rest:
            try:
                d = json_loads(rest)
            except ValueError:
                d = None
            if isinstance(d, dict) and isinstance(d.get("delay"), int):
                delay = max(d["delay"], 0)
            elif isinstance(d, int):
                delay = max(d, 0)
        return int(AckKind.NAK), delay
    if head == b"+TERM":
        return int(AckKind.TERM), 0
    if head == b"+WPI":
        return int(AckKind.IN_PROGRESS), 0
    if head == b"+NXT":
        n = 1
        rest = rest.strip()
        if rest.isdigit():
            n = int(rest)
        elif rest[:1] == b"{":
            try:
                n = int(json_loads(rest).get("batch") or 1)
            except (ValueError, AttributeError, TypeError):
                n = 1
        return ACK_NEXT, max(n, 1)
    raise ValueError(f"not an acknowledgement: {body[:20]!r}")


# -- deliveries and status messages ---------------------------------------------------------


def js_delivery(
    head: bytes | memoryview, record: bytes | memoryview, stream: str, consumer: str, headers_only: bool = False,
) -> tuple[bytes, bytes, bytes | None, bytes | memoryview]:
    """One message of a pull batch (its entry head and record, from ``broker.consumers``' pulls) as
    the server delivers it: ``(subject, $JS.ACK reply, NATS header block or None,
    payload)``. ``headers_only``: no payload, and a ``Nats-Msg-Size`` header with its
    size (as the server's ``HeadersOnly``)."""
    _, dseq, delivered, pending = _PULL_ENTRY.unpack(head)
    offset, ts = RECORD_FIXED.unpack_from(record, 0)[2:4]
    subject, headers, payload = nats_message_of_record(record)
    reply = _ack_reply(stream, consumer, delivered, offset, dseq, ts, pending)
    if headers_only:
        size = f"Nats-Msg-Size: {len(payload)}\r\n\r\n".encode()
        return subject, reply, (headers[:-2] if headers else b"NATS/1.0\r\n") + size, b""
    return subject, reply, headers, payload


def with_header(block: bytes | None, name: str, value: str) -> bytes:
    """A NATS header block with ``name: value`` added at its end (a new block when
    there is none), as nats-server's ``genHeader`` adds one."""
    line = f"{name}: {value}\r\n".encode()
    if not block:
        return b"NATS/1.0\r\n" + line + b"\r\n"
    return block[:-2] + line + b"\r\n"


def js_delivery_frames(
    parts: list[Any], sid: bytes, stream: str, consumer: str, headers_only: bool = False, headers: bool = True,
) -> tuple[bytes, int]:
    """The messages of a pull batch (entry head and record each, or a
    :class:`~protocol.PulledRun` and its run) as the MSG/HMSG frames of
    the subscription ``sid``, and their payload bytes: byte for byte ``encode_msg``
    of each :func:`js_delivery` (``headers`` False: a client without header support,
    which gets the payloads alone), a message without headers in one formatting step."""
    prefix = _ack_prefix(stream, consumer)
    entry = _PULL_ENTRY.unpack_from
    fixed = RECORD_FIXED.unpack_from
    out: list[bytes] = []
    size = 0
    for i in range(0, len(parts), 2):
        head, record = parts[i], parts[i + 1]
        if head.__class__ is PulledRun:
            size += _run_frames(out, head, record, sid, prefix, stream, consumer, headers_only, headers)
            continue
        _, _, offset, ts, _, _, sl, hl, pl = fixed(record, 0)
        if headers_only or hl:
            subject, reply, block, payload = js_delivery(head, record, stream, consumer, headers_only)
            out.append(encode_msg(subject, sid, reply, block if headers else None, payload))
            size += len(payload)
            continue
        _, dseq, delivered, pending = entry(head, 0)
        p = FIXED_SIZE + sl
        out.append(_PLAIN_DELIVERY % (
            record[FIXED_SIZE:p], sid, prefix, delivered, offset, dseq, ts, pending, pl, record[p : p + pl],
        ))
        size += pl
    return b"".join(out), size


#: ``encode_msg`` of a delivery without headers, its ``$JS.ACK`` reply spelled out.
_PLAIN_DELIVERY = b"MSG %s %s %s%d.%d.%d.%d.%d %d\r\n%s\r\n"
#: :data:`_PLAIN_DELIVERY` from the reply's stream sequence on, after its lead
#: (``MSG <subject> <sid> $JS.ACK.<stream>.<consumer>.1.``).
_PLAIN_TAIL = b"%s%d.%d.%d.%d %d\r\n%s\r\n"


def _run_frames(
    out: list[bytes], run: PulledRun, records: bytes | memoryview, sid: bytes, prefix: bytes, stream: str, consumer: str,
    headers_only: bool, headers: bool,
) -> int:
    """:func:`js_delivery_frames` of the messages of a :class:`PulledRun` (first
    deliveries), read from the run's bytes in place of the heads and records
    ``expand_runs`` gives; returns their payload bytes. Messages without headers
    are :data:`_PLAIN_DELIVERY` with the part up to the reply's numbers made once a
    subject (:data:`_PLAIN_TAIL`), all formatted in one step."""
    data = bytes(records)  # one copy: slices of it are bytes, which ``%`` takes as they are
    fixed = RECORD_FIXED.unpack_from
    mid = b" %s %s1." % (sid, prefix)  # delivered once
    args: list[Any] = []
    plain = 0  # messages in ``args``
    subject: bytes | None = None
    lead = b""
    dseq = run.dseq
    pending = run.pending
    size = pos = 0
    for _ in range(run.messages):
        length, _, offset, ts, _, _, sl, hl, pl = fixed(data, pos)
        end = pos + 4 + length
        pending -= 1
        left = pending if pending > 0 else 0
        if headers_only or hl:
            if plain:
                out.append((_PLAIN_TAIL * plain) % tuple(args))
                args, plain = [], 0
            head = encode_pull_entry(run.partition, dseq, 1, left)
            s, reply, block, payload = js_delivery(head, data[pos:end], stream, consumer, headers_only)
            out.append(encode_msg(s, sid, reply, block if headers else None, payload))
            size += len(payload)
        else:
            p = pos + FIXED_SIZE + sl
            s = data[pos + FIXED_SIZE : p]
            if s != subject:
                subject, lead = s, b"MSG " + s + mid
            args += (lead, offset, dseq, ts, left, pl, data[p : p + pl])
            plain += 1
            size += pl
        pos = end
        dseq += 1
    if plain:
        out.append((_PLAIN_TAIL * plain) % tuple(args))
    return size


def status_message(code: int, description: str, pending_msgs: int | None = None, pending_bytes: int | None = None) -> bytes:
    """A status message's header block (``NATS/1.0 408 Request Timeout``), with the
    pull request's ``Nats-Pending-Messages`` / ``Nats-Pending-Bytes`` when given."""
    pairs = []
    if pending_msgs is not None:
        pairs = [("Nats-Pending-Messages", str(pending_msgs)), ("Nats-Pending-Bytes", str(pending_bytes or 0))]
    return encode_nats_headers(pairs, code, description)


def idle_heartbeat(last_consumer_seq: int, last_stream_seq: int, stalled: str = "") -> bytes:
    """``100 Idle Heartbeat`` with the last delivery's sequences (and the flow-control
    reply it waits for, when stalled), as the server's ``sendIdleHeartbeat``."""
    pairs = [("Nats-Last-Consumer", str(last_consumer_seq)), ("Nats-Last-Stream", str(last_stream_seq))]
    if stalled:
        pairs.append(("Nats-Consumer-Stalled", stalled))
    return encode_nats_headers(pairs, 100, "Idle Heartbeat")
