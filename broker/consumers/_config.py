"""A durable consumer's configuration, checked: a JetStream pull consumer's fields
(``docs/semantics.md``, "Durable consumers", lists them with their defaults).

The wire carries it as one msgpack map with the server's field names (durations in
seconds); :meth:`ConsumerConfig.from_map` checks every key and value and fills the
defaults, :meth:`ConsumerConfig.to_map` gives it back (and is what the journal
keeps). :meth:`ConsumerConfig.check_update` says what an update may change: the
server refuses a new deliver policy, start position or ack policy (and here the
mode); filters, waits, limits and the description may change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from protocol import BrokerError, ErrorCode, error_class, filters_overlap, validate_filter, validate_subject

__all__ = ["ConsumerConfig", "DELIVER_POLICIES", "ACK_POLICIES", "MODES"]

DELIVER_POLICIES = ("all", "new", "last", "last_per_subject", "by_start_offset", "by_start_time")
ACK_POLICIES = ("explicit", "none", "all")
MODES = ("shared", "partitioned")

#: Fields an update may not change (the server's ``checkConsumerCfg`` on update).
#: What an update may not change, in the server's order, with the server's words for
#: it ("deliver policy can not be updated", nats-server ``checkNewConsumerConfig``).
_FIXED = {
    "deliver_policy": "deliver policy",
    "opt_start_offset": "start sequence",
    "opt_start_time": "start time",
    "ack_policy": "ack policy",
    "mode": "mode",
}


#: ``ack_wait`` and ``member_timeout`` when not given, seconds (the server's ack wait).
_DEFAULT_WAIT = 30.0


def _invalid(text: str) -> Exception:
    return error_class(ErrorCode.INVALID_CONSUMER_CONFIG)(text)


def _seconds(key: str, value: object, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _invalid(f"{key} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise _invalid(f"{key} must be {'at least 0' if allow_zero else 'greater than 0'} seconds, got {value}")
    return float(value)


def _int(key: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{key} must be an integer, got {value!r}")
    if value < minimum:
        raise _invalid(f"{key} must be at least {minimum}, got {value}")
    return value


def _filters(raw: dict[str, Any]) -> tuple[str, ...]:
    """``filter_subjects`` (or the server's single-filter spelling, ``filter_subject``):
    valid subject filters, no two of which overlap."""
    filters = raw.get("filter_subjects", ())
    if "filter_subject" in raw:  # the server's single-filter spelling
        if filters:
            raise _invalid("consumer filter_subject and filter_subjects are mutually exclusive")  # NATS 10134's text
        filters = [raw["filter_subject"]] if raw["filter_subject"] else []
    if isinstance(filters, str) or not isinstance(filters, (list, tuple)):
        raise _invalid(f"filter_subjects must be a list of subject filters, got {filters!r}")
    for f in filters:
        if not isinstance(f, str) or not f:
            raise _invalid(f"a filter subject must be a non-empty string, got {f!r}")
        validate_filter(f)
    for i, a in enumerate(filters):
        for b in filters[i + 1 :]:
            if filters_overlap(a, b):
                raise error_class(ErrorCode.CONSUMER_FILTERS_OVERLAP)("consumer subject filters cannot overlap")
    return tuple(filters)


def _start_position(raw: dict[str, Any], policy: str) -> tuple[int | tuple[tuple[int, int], ...] | None, int | None]:
    """``opt_start_offset`` and ``opt_start_time``: each required by its deliver
    policy, and refused with any other."""
    start = raw.get("opt_start_offset")
    offset: int | tuple[tuple[int, int], ...] | None = None
    if policy == "by_start_offset":
        if start is None:
            raise _invalid("consumer deliver policy by_start_offset requires opt_start_offset")
        if isinstance(start, dict):
            pairs = []
            for p, o in start.items():
                try:
                    p = int(p)
                except (TypeError, ValueError):
                    raise _invalid(f"opt_start_offset keys must be partition numbers, got {p!r}") from None
                pairs.append((_int("opt_start_offset partition", p, 0), _int("opt_start_offset", o, 1)))
            offset = tuple(sorted(pairs))
        else:
            offset = _int("opt_start_offset", start, 1)
    elif start is not None:
        raise _invalid("consumer opt_start_offset requires deliver policy by_start_offset")
    t = raw.get("opt_start_time")
    start_time: int | None = None
    if policy == "by_start_time":
        if t is None:
            raise _invalid("consumer deliver policy by_start_time requires opt_start_time")
        start_time = _int("opt_start_time", t, 0)
    elif t is not None:
        raise _invalid("consumer opt_start_time requires deliver policy by_start_time")
    return offset, start_time


def _redelivery(raw: dict[str, Any], ack_policy: str) -> tuple[float, int, tuple[float, ...]]:
    """``(ack_wait, max_deliver, backoff)``: with a backoff, the ack wait is its first
    value (and ``max_deliver``, if limited, must be longer than it)."""
    ack_wait = _seconds("ack_wait", raw["ack_wait"]) if "ack_wait" in raw else _DEFAULT_WAIT
    md = raw.get("max_deliver", -1)
    md = -1 if md == 0 else md
    if md != -1:
        _int("max_deliver", md, 1)
    listed = raw.get("backoff", ())
    if not isinstance(listed, (list, tuple)):
        raise _invalid(f"backoff must be a list of seconds, got {listed!r}")
    backoff = tuple(_seconds("backoff", b) for b in listed)
    if backoff:
        if md != -1 and md <= len(backoff):
            # The server's text (NATS 10116).
            raise _invalid("max deliver is required to be > length of backoff values")
        if ack_policy != "explicit":
            raise _invalid("backoff requires the explicit ack policy")
        if "ack_wait" in raw and ack_wait != backoff[0]:
            raise _invalid("ack_wait is the first backoff value when backoff is set")
        ack_wait = backoff[0]
    return ack_wait, md, backoff


def _nats_settings(nats: object) -> tuple[tuple[str, Any], ...] | None:
    """The NATS settings kept with the configuration: a map of names to strings,
    integers or booleans (or None)."""
    if nats is None:
        return None
    if not isinstance(nats, dict) or not all(
        isinstance(k, str) and isinstance(x, (str, int, bool)) for k, x in nats.items()
    ):
        raise _invalid("nats must be a map of NATS consumer settings")
    return tuple(sorted(nats.items()))


def _dead_letter_subject(value: object) -> str:
    """``dead_letter_subject``: "" (none) or a subject without wildcards."""
    if not isinstance(value, str):
        raise _invalid(f"dead_letter_subject must be a subject, got {value!r}")
    if value:
        try:
            validate_subject(value)
        except BrokerError as err:
            raise _invalid(f"dead_letter_subject {value!r} is not a valid subject: {err.message}") from None
    return value


@dataclass(frozen=True)
class ConsumerConfig:
    filter_subjects: tuple[str, ...] = ()
    deliver_policy: str = "all"
    #: ``by_start_offset``: one offset for every partition, or ``{partition: offset}``.
    opt_start_offset: int | tuple[tuple[int, int], ...] | None = None
    #: ``by_start_time``: nanoseconds since the Unix epoch.
    opt_start_time: int | None = None
    ack_policy: str = "explicit"
    ack_wait: float = _DEFAULT_WAIT
    max_deliver: int = -1
    backoff: tuple[float, ...] = ()
    max_ack_pending: int = 1000
    max_waiting: int = 512
    mode: str = "shared"
    member_timeout: float = _DEFAULT_WAIT
    description: str = ""
    #: The NATS API's settings that have no engine equivalent (deliver subject, flow
    #: control, heartbeats, headers only, ephemeral and its inactive threshold:
    #: ``broker/nats/_consumers.py``), kept here so that they survive a restart; None
    #: for a consumer made by our own protocol. Each value is a string, an integer or
    #: a boolean, which one depending on the name (``protocol.nats.PushSettings``'
    #: fields): ``Any``, so that they can be handed to it by name.
    nats: tuple[tuple[str, Any], ...] | None = None
    #: A ttlbroker extension: where a copy of each message given up after
    #: ``max_deliver`` or terminated is published ("" for none; ``_dead_letters.py``).
    dead_letter_subject: str = ""
    #: With ``dead_letter_subject``: also copy the messages the consumer still owes
    #: (outstanding, or not delivered yet) that a TTL, the max age (``Expired``) or a
    #: limit (``Limit``) removes.
    dead_letter_expired: bool = False

    @classmethod
    def from_map(cls, raw: dict[str, Any]) -> ConsumerConfig:
        """The configuration a wire map asks for, every key and value checked (in the
        server's order: the first rule broken is the one reported), the defaults
        filled in.

        Raises:
            InvalidOptionsError: a key no consumer configuration has.
            InvalidConsumerConfigError, ConsumerFiltersOverlapError: a value, or a
                combination of values, that is refused (in the server's words where
                it has them).
        """
        if not isinstance(raw, dict):
            raise _invalid("the consumer configuration must be a map")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known - {"filter_subject"})
        if unknown:
            raise error_class(ErrorCode.INVALID_OPTIONS)(f"unknown consumer option {unknown[0]!r}")
        filters = _filters(raw)
        dp = raw.get("deliver_policy", "all")
        if dp == "by_start_sequence":
            dp = "by_start_offset"
        if dp not in DELIVER_POLICIES:
            raise _invalid(f"deliver_policy must be one of {', '.join(DELIVER_POLICIES)}, got {dp!r}")
        start_offset, start_time = _start_position(raw, dp)
        ap = raw.get("ack_policy", "explicit")
        if ap not in ACK_POLICIES:
            raise _invalid(f"ack_policy must be one of {', '.join(ACK_POLICIES)}, got {ap!r}")
        ack_wait, md, backoff = _redelivery(raw, ap)
        mp = raw.get("max_ack_pending", 1000)
        mp = -1 if mp == 0 else mp
        if mp != -1:
            _int("max_ack_pending", mp, 1)
        max_waiting = _int("max_waiting", raw.get("max_waiting", 512), 1)
        mode = raw.get("mode", "shared")
        if mode not in MODES:
            raise _invalid(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        member_timeout = _seconds("member_timeout", raw["member_timeout"]) if "member_timeout" in raw else _DEFAULT_WAIT
        desc = raw.get("description", "")
        if not isinstance(desc, str) or len(desc.encode()) > 4096:
            raise _invalid("description must be a string of at most 4096 bytes")
        nats = _nats_settings(raw.get("nats"))
        dead_letter = _dead_letter_subject(raw.get("dead_letter_subject", ""))
        expired = raw.get("dead_letter_expired", False)
        if not isinstance(expired, bool):
            raise _invalid(f"dead_letter_expired must be true or false, got {expired!r}")
        if expired and not dead_letter:
            raise _invalid("dead_letter_expired needs a dead_letter_subject to copy the messages to")
        if ap == "none" and (backoff or md != -1):
            raise _invalid("ack_policy none delivers each message once: backoff and max_deliver do not apply")
        return cls(
            filter_subjects=filters, deliver_policy=dp, opt_start_offset=start_offset, opt_start_time=start_time,
            ack_policy=ap, ack_wait=ack_wait, max_deliver=md, backoff=backoff, max_ack_pending=mp,
            max_waiting=max_waiting, mode=mode, member_timeout=member_timeout, description=desc, nats=nats,
            dead_letter_subject=dead_letter, dead_letter_expired=expired,
        )

    def to_map(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "filter_subjects": list(self.filter_subjects),
            "deliver_policy": self.deliver_policy,
            "ack_policy": self.ack_policy,
            "ack_wait": self.ack_wait,
            "max_deliver": self.max_deliver,
            "backoff": list(self.backoff),
            "max_ack_pending": self.max_ack_pending,
            "max_waiting": self.max_waiting,
            "mode": self.mode,
            "member_timeout": self.member_timeout,
            "description": self.description,
        }
        if self.opt_start_offset is not None:
            s = self.opt_start_offset
            out["opt_start_offset"] = s if isinstance(s, int) else {str(p): o for p, o in s}
        if self.opt_start_time is not None:
            out["opt_start_time"] = self.opt_start_time
        if self.nats is not None:
            out["nats"] = dict(self.nats)
        if self.dead_letter_subject:
            out["dead_letter_subject"] = self.dead_letter_subject
        if self.dead_letter_expired:
            out["dead_letter_expired"] = True
        return out

    def check_update(self, new: ConsumerConfig) -> None:
        for name, words in _FIXED.items():
            if getattr(self, name) != getattr(new, name):
                raise error_class(ErrorCode.CONSUMER_UPDATE_DENIED)(f"{words} can not be updated")

    def wait_ns(self, deliveries: int) -> int:
        """How long a delivery numbered ``deliveries`` (1 = the first) waits for its
        ack: the backoff entry for it (the last one past the list), else ack_wait."""
        if self.backoff:
            return int(self.backoff[min(deliveries, len(self.backoff)) - 1] * 1e9)
        return int(self.ack_wait * 1e9)

    def start_offset_for(self, partition: int) -> int:
        s = self.opt_start_offset
        if isinstance(s, int):
            return s
        return dict(s or ()).get(partition, 1)
