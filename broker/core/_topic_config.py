"""A topic's configuration: the options map's keys, their types, and the rules.

The options map is the msgpack map that follows CreateTopic's fixed fields (Iggy's
layout, ``docs/protocol.md``), and the whole body of UpdateTopic. An unknown key or
a value of the wrong type is refused with INVALID_OPTIONS, never ignored: a client
asking for a policy this broker does not have must learn so.

:func:`resolve` checks a new configuration in the NATS server's order
(nats-server's ``checkStreamCfgLocked``, then ``configUpdateCheckLocked`` for an
update), applies the same automatic fixes unless ``pedantic`` is set, and refuses
with the server's exact descriptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from collections.abc import Iterable
from typing import Any

from protocol.nats import NATS_SETTINGS, nats_hash
from protocol import ErrorCode, SubjectTransform, TransformError, error_class, filters_overlap, validate_filter

__all__ = [
    "DEFAULT_DUPLICATE_WINDOW", "DISCARDS", "LIMITS", "RETENTIONS", "STORAGES", "TopicConfig", "OPTION_TYPES",
    "check_option_types", "apply_changes", "resolve", "stored_subject_transform", "copy_iname", "COPY_KEYS",
]

#: JetStream's default duplicate window (``StreamDefaultDuplicatesWindow``), seconds.
DEFAULT_DUPLICATE_WINDOW = 120

_Invalid = error_class(ErrorCode.INVALID_OPTIONS)
_Config = error_class(ErrorCode.INVALID_TOPIC_CONFIG)

#: The limits options (0 = unlimited), and the discard policies.
LIMITS = ("max_msgs", "max_bytes", "max_msg_size", "max_consumers")
DISCARDS = ("old", "new")

#: The retention policies, as JetStream's (``limits`` keeps messages until a limit removes them).
RETENTIONS = ("limits", "workqueue", "interest")

#: Where a topic's messages live: ``file`` (the segment files) or ``memory``
#: (``storage.MemoryPartitionLog``).
STORAGES = ("file", "memory")

#: key -> (accepted Python types, meaning). ``message_expiry`` travels in the fixed
#: layout on create and in the map on update; ``pedantic`` applies to the request
#: only and is not stored.
OPTION_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "subjects": ((list,), "subject filters the topic captures (default: ['<stream>.<topic>.>'])"),
    "max_msgs_per_subject": ((int,), "live messages kept per subject, oldest removed first; 0 = unlimited"),
    "deny_purge": ((bool,), "refuse purges and deletes"),
    "segment_size": ((int,), "bytes after which a partition's segment is sealed (default from the config)"),
    "allow_msg_ttl": ((bool,), "accept per-message TTLs (can be turned on by update, never off)"),
    "subject_delete_marker_ttl": ((int,), "seconds a subject delete marker lives; 0 = no markers"),
    "allow_rollup": ((bool,), "honour Nats-Rollup headers (sub, all)"),
    "retention": (
        (str,),
        "limits (default: kept until a limit removes them) | workqueue (removed once a consumer acks them; "
        "consumers' filters may not overlap) | interest (removed once every consumer that wants them acks them)",
    ),
    "duplicate_window": (
        (int,),
        "seconds a Nats-Msg-Id is remembered for de-duplication (default 120, at most the max age); 0 = off",
    ),
    "republish": (
        (dict, type(None)),
        "{'src': filter (default '>'), 'dest': transform template, 'headers_only': bool}; nil removes it",
    ),
    "kv": (
        (dict, type(None)),
        "a KV bucket: {'ttl': default key TTL seconds, 'refresh': on_write|on_read_and_write, "
        "'visibility': never_return_expired|return_expired_if_not_cleaned_up}",
    ),
    "nats": (
        (dict, type(None)),
        "what a NATS stream has and a topic does not: {'name' (as given), 'description', 'deny_delete', "
        "'allow_direct', 'discard', 'metadata'}; the NATS listener sets it",
    ),
    "allow_msg_schedules": ((bool,), "accept message schedules (Nats-Schedule, NATS ADR-51; never turned off)"),
    "storage": (
        (str,),
        "file (default: on disk) | memory (in memory only: gone after a restart, the configuration kept; "
        "bounded by [limits] memory_storage_bytes); cannot change by update",
    ),
    "subject_transform": (
        (dict, type(None)),
        "{'src': filter (default '>'), 'dest': transform template}: a message captured on a subject src matches "
        "is stored under the transformed subject ('dest' empty: none); nil removes it",
    ),
    "first_seq": ((int,), "create: the offset each partition's first message gets (default 1)"),
    "sealed": ((bool,), "update only: no message goes in or out any more (no publishes, deletes, purges); never undone"),
    "pedantic": ((bool,), "refuse instead of fixing the configuration automatically (this request only)"),
    "message_expiry": ((int,), "update only: max age in seconds; 0 = none"),
    "max_msgs": ((int,), "live messages kept per partition (see discard); 0 = unlimited"),
    "max_bytes": ((int,), "bytes of live records kept per partition (see discard); 0 = unlimited"),
    "max_msg_size": ((int,), "largest message accepted, headers and payload, in bytes; 0 = unlimited"),
    "max_consumers": ((int,), "durable and ephemeral consumers the topic may have; 0 = unlimited"),
    "discard": ((str,), "at max_msgs or max_bytes: old (default: remove the oldest) | new (refuse the new message)"),
    "discard_new_per_subject": (
        (bool,), "with discard new and max_msgs_per_subject: refuse a message on a subject at its limit",
    ),
    "mirror": (
        (dict, type(None)),
        "copy one origin stream, keeping its sequences and timestamps: {'name', 'opt_start_seq', 'opt_start_time' "
        "(RFC 3339), 'filter_subject', 'subject_transforms': [{'src', 'dest'}], 'external': {'api', 'deliver'}, "
        "'domain'}; no subjects; create only (nil by update promotes the mirror into a plain topic)",
    ),
    "sources": (
        (list, type(None)),
        "copy several origin streams, each message under a new offset with a Nats-Stream-Source header: a list of "
        "objects as mirror's",
    ),
}

#: A mirror's or source's keys (nats-server's ``StreamSource``, and ``domain``, which
#: its clients turn into ``external``) and their types.
COPY_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,), "opt_start_seq": (int,), "opt_start_time": (str,), "filter_subject": (str,),
    "subject_transforms": (list,), "external": (dict,), "domain": (str,),
}


def check_option_types(options: dict[str, Any], updating: bool) -> None:
    """Raises InvalidOptionsError for an unknown key or a value of the wrong type."""
    for key, value in options.items():
        if key not in OPTION_TYPES or (key == "message_expiry" and not updating):
            where = "in a topic update" if updating else "in a topic's options"
            hint = " (message_expiry is a field of CreateTopic)" if key == "message_expiry" else ""
            raise _Invalid(f"unknown option {key!r} {where}{hint}; known: {', '.join(sorted(OPTION_TYPES))}")
        types, _ = OPTION_TYPES[key]
        if isinstance(value, bool) and bool not in types:
            raise _Invalid(f"option {key!r} must be {' or '.join(t.__name__ for t in types)}, not bool")
        if not isinstance(value, types):
            raise _Invalid(f"option {key!r} must be {' or '.join(t.__name__ for t in types)}, not {type(value).__name__}")
    subjects = options.get("subjects")
    if subjects is not None and not all(isinstance(s, str) for s in subjects):
        raise _Invalid("option 'subjects' must be a list of strings")
    rp = options.get("republish")
    if rp is not None:
        unknown = set(rp) - {"src", "dest", "headers_only"}
        if unknown:
            raise _Invalid(f"option 'republish' has unknown keys {sorted(map(str, unknown))}; known: dest, headers_only, src")
        for key, kind in (("src", str), ("dest", str), ("headers_only", bool)):
            if key in rp and not isinstance(rp[key], kind):
                raise _Invalid(f"option 'republish': {key!r} must be {kind.__name__}, not {type(rp[key]).__name__}")
        if "dest" not in rp:
            raise _Invalid("option 'republish' needs 'dest'")
    st = options.get("subject_transform")
    if st is not None:
        unknown = set(st) - {"src", "dest"}
        if unknown:
            raise _Invalid(f"option 'subject_transform' has unknown keys {sorted(map(str, unknown))}; known: dest, src")
        for key in ("src", "dest"):
            if key in st and not isinstance(st[key], str):
                raise _Invalid(f"option 'subject_transform': {key!r} must be str, not {type(st[key]).__name__}")
    if options.get("mirror") is not None:
        _check_copy_types("mirror", options["mirror"])
    for src in options.get("sources") or ():
        if not isinstance(src, dict):
            raise _Invalid("option 'sources' must be a list of objects")
        _check_copy_types("sources", src)
    nats = options.get("nats")
    if nats is not None:
        for key, value in nats.items():
            if key not in NATS_SETTINGS or not isinstance(value, NATS_SETTINGS[key]):
                raise _Invalid(f"option 'nats': {key!r} is not one of {', '.join(NATS_SETTINGS)} with its type")
    for key in (
        "subject_delete_marker_ttl", "max_msgs_per_subject", "segment_size", "message_expiry", "duplicate_window",
        "first_seq", *LIMITS,
    ):
        v = options.get(key)
        if v is not None and not -(2**63) <= v < 2**63:
            raise _Invalid(f"option {key!r} is out of range")


def _check_copy_types(option: str, copy: dict[str, Any]) -> None:
    for key, value in copy.items():
        types = COPY_KEYS.get(key)
        if types is None:
            raise _Invalid(f"option {option!r} has unknown key {key!r}; known: {', '.join(sorted(COPY_KEYS))}")
        if isinstance(value, bool) or not isinstance(value, types):
            raise _Invalid(f"option {option!r}: {key!r} must be {types[0].__name__}, not {type(value).__name__}")
    for tr in copy.get("subject_transforms") or ():
        if not isinstance(tr, dict) or set(tr) - {"src", "dest"} or not all(isinstance(v, str) for v in tr.values()):
            raise _Invalid(f"option {option!r}: each subject transform is {{'src': str, 'dest': str}}")
    ext = copy.get("external")
    if ext is not None and (set(ext) - {"api", "deliver"} or not all(isinstance(v, str) for v in ext.values())):
        raise _Invalid(f"option {option!r}: 'external' is {{'api': str, 'deliver': str}}")
    seq = copy.get("opt_start_seq")
    if seq is not None and not 0 <= seq < 2**64:
        raise _Invalid(f"option {option!r}: 'opt_start_seq' is out of range")


@dataclass(frozen=True)
class TopicConfig:
    """Everything that defines a topic's behaviour (persisted in the catalog)."""

    name: str
    partitions_count: int
    message_expiry: int
    subjects: tuple[str, ...]
    segment_size: int
    max_msgs_per_subject: int = 0
    deny_purge: bool = False
    allow_msg_ttl: bool = False
    subject_delete_marker_ttl: int = 0
    allow_rollup: bool = False
    #: ``limits``, ``workqueue`` or ``interest`` (``broker/consumers/_retention.py``).
    retention: str = "limits"
    #: Seconds a ``Nats-Msg-Id`` is remembered (``_dedup.py``); 0 = no de-duplication.
    #: A catalog written before the option existed loads with the default.
    duplicate_window: int = DEFAULT_DUPLICATE_WINDOW
    #: ``{"src", "dest", "headers_only"}`` or None
    republish: dict[str, Any] | None = None
    #: ``{"ttl", "refresh", "visibility"}`` for a KV bucket, or None
    kv: dict[str, Any] | None = None
    #: The NATS stream settings with no topic equivalent (``protocol.nats.NATS_SETTINGS``), or None
    nats: dict[str, Any] | None = None
    #: Message schedules (NATS ADR-51, ``_schedules.py``).
    allow_msg_schedules: bool = False
    #: ``file`` or ``memory`` (:data:`STORAGES`); a catalog written before the option existed loads as file.
    storage: str = "file"
    #: ``{"src", "dest"}`` (ADR-30, applied at ingest: ``_routing.py``), or None
    subject_transform: dict[str, Any] | None = None
    #: The offset a new partition's first message gets (0 or 1: the default, 1).
    first_seq: int = 0
    #: Nothing goes in or out any more (``docs/semantics.md``, "Sealed topics").
    sealed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    #: The limits (``docs/semantics.md``, "Limits and discard policies"); 0 = unlimited.
    #: ``max_msgs`` and ``max_bytes`` hold per partition (a NATS stream has one).
    max_msgs: int = 0
    max_bytes: int = 0
    max_msg_size: int = 0
    max_consumers: int = 0
    #: ``old`` or ``new``: what a publish past ``max_msgs`` or ``max_bytes`` does.
    discard: str = "old"
    discard_new_per_subject: bool = False
    #: What the topic copies (``docs/semantics.md``, "Mirrors and sources"): one
    #: origin kept as is, or several merged; None / empty: nothing.
    mirror: dict[str, Any] | None = None
    sources: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        """Every field, the containers copied (``dataclasses.asdict``'s answer, in a
        fifth of its time: no field holds a dataclass)."""
        d = {name: _copied(getattr(self, name)) for name in _FIELD_NAMES}
        d["subjects"] = list(self.subjects)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TopicConfig:
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["subjects"] = tuple(d["subjects"])
        nats = d.get("nats")
        if nats and "discard" in nats:  # a catalog written when discard was a NATS setting
            nats = dict(nats)
            d.setdefault("discard", nats.pop("discard"))
            d["nats"] = nats
        return cls(**d)

    def options(self) -> dict[str, Any]:
        """The options map as topic details report it."""
        return {
            "subjects": list(self.subjects),
            "max_msgs_per_subject": self.max_msgs_per_subject,
            "deny_purge": self.deny_purge,
            "segment_size": self.segment_size,
            "allow_msg_ttl": self.allow_msg_ttl,
            "subject_delete_marker_ttl": self.subject_delete_marker_ttl,
            "allow_rollup": self.allow_rollup,
            "retention": self.retention,
            "duplicate_window": self.duplicate_window,
            "republish": dict(self.republish) if self.republish else None,
            "kv": dict(self.kv) if self.kv else None,
            "nats": dict(self.nats) if self.nats else None,
            "allow_msg_schedules": self.allow_msg_schedules,
            "storage": self.storage,
            "subject_transform": dict(self.subject_transform) if self.subject_transform is not None else None,
            "first_seq": self.first_seq,
            "sealed": self.sealed,
            "max_msgs": self.max_msgs,
            "max_bytes": self.max_bytes,
            "max_msg_size": self.max_msg_size,
            "max_consumers": self.max_consumers,
            "discard": self.discard,
            "discard_new_per_subject": self.discard_new_per_subject,
            "mirror": dict(self.mirror) if self.mirror else None,
            "sources": [dict(s) for s in self.sources] if self.sources else None,
        }

    def validate(self, max_partitions: int) -> None:
        """Shape rules that do not depend on a previous configuration."""
        if not 1 <= self.partitions_count <= max_partitions:
            raise error_class(ErrorCode.INVALID_PARTITIONS_COUNT)(
                f"partitions count must be 1..{max_partitions}, not {self.partitions_count}"
            )
        if not 0 <= self.message_expiry <= 0xFFFFFFFE:
            raise _Config("message expiry must be 0..4294967294 seconds")
        if not self.subjects and not self.mirror and not self.sources:
            raise error_class(ErrorCode.INVALID_SUBJECT_FILTER)("a topic needs at least one subject filter")
        for s in self.subjects:
            validate_filter(s)
        for i, a in enumerate(self.subjects):
            for b in self.subjects[i + 1 :]:
                if filters_overlap(a, b):
                    raise error_class(ErrorCode.SUBJECTS_OVERLAP)(f"the topic's own filters {a!r} and {b!r} overlap")
        if self.max_msgs_per_subject < 0:
            raise _Config("max_msgs_per_subject must not be negative (0 = unlimited)")
        if not 4096 <= self.segment_size <= 1024**3:
            raise _Config("segment_size must be between 4096 and 1073741824 bytes")
        if self.retention not in RETENTIONS:
            raise _Config(f"retention must be one of {', '.join(RETENTIONS)}, not {self.retention!r}")
        if self.storage not in STORAGES:
            raise _Config(f"storage must be one of {', '.join(STORAGES)}, not {self.storage!r}")
        if self.first_seq < 0:
            raise _Config("first_seq must not be negative (0 or 1 = the default)")
        for key in LIMITS:
            if getattr(self, key) < 0:
                raise _Config(f"{key} must not be negative (0 = unlimited)")
        if self.max_msg_size > 2**31 - 1:
            raise _Config("max_msg_size must fit in 31 bits (at most 2147483647 bytes)")
        if self.discard not in DISCARDS:
            raise _Config(f"discard must be old or new, not {self.discard!r}")


def apply_changes(cfg: TopicConfig, changes: dict[str, Any]) -> TopicConfig:
    """The config after an update (types already checked; ``pedantic`` ignored)."""
    kw: dict[str, Any] = {k: (tuple(v) if k == "subjects" else v) for k, v in changes.items() if k != "pedantic"}
    for key in ("republish", "kv", "nats", "subject_transform", "mirror"):
        if kw.get(key) is not None:
            kw[key] = dict(kw[key])
    if kw.get("sources") is not None:
        kw["sources"] = [dict(s) for s in kw["sources"]]
    return replace(cfg, **kw)


def resolve(
    new: TopicConfig, old: TopicConfig | None, pedantic: bool, max_partitions: int, given: Iterable[str] = ()
) -> TopicConfig:
    """Check ``new`` (an update of ``old`` when given) and return it with the
    automatic fixes applied, in the NATS server's order (``checkStreamCfgLocked``,
    whose steps the comments below number: 3 and 5, counters and mirrors, have no
    equivalent here).
    ``given``: the option keys the request named (a duplicate window it did not
    name follows a shorter max age instead of being refused).

    Raises:
        InvalidTopicConfigError: with the server's description of the first broken rule.
        (and the shape errors of :meth:`TopicConfig.validate`)
    """
    new.validate(max_partitions)
    # 1. The duplicate window (the server's checks and its default's clamp to MaxAge).
    window = new.duplicate_window
    if window < 0:
        raise _Config("duplicates window can not be negative")
    if window > 0xFFFFFFFE:
        raise _Config("duplicates window must fit in 32 bits of seconds")
    if new.message_expiry and window > new.message_expiry:
        if "duplicate_window" in given:
            raise _Config("duplicates window can not be larger then max age")
        new = replace(new, duplicate_window=new.message_expiry)
    # 2. Roll-ups need the purge permission (checked before anything about markers).
    if new.deny_purge and new.allow_rollup:
        raise _Config("roll-ups require the purge permission")
    # 3. (counters have no equivalent) Discard new per subject needs discard new and a
    #    per-subject limit.
    if new.discard_new_per_subject:
        if new.discard != "new":
            raise _Config("discard new per subject requires discard new policy to be set")
        if new.max_msgs_per_subject <= 0:
            raise _Config("discard new per subject requires max msgs per subject > 0")
    # 4. Subject delete markers.
    sdm = new.subject_delete_marker_ttl
    if sdm < 0:
        raise _Config("subject delete marker TTL must not be negative")
    if sdm > 0:
        if sdm > 0xFFFFFFFE:
            raise _Config("subject delete marker TTL must fit in 32 bits of seconds")
        if not new.allow_msg_ttl:
            if pedantic:
                raise _Config("subject delete marker cannot be set if message TTLs are disabled")
            new = replace(new, allow_msg_ttl=True)
        if not new.allow_rollup:
            if pedantic:
                raise _Config("subject delete marker cannot be set if roll-ups are disabled")
            new = replace(new, allow_rollup=True, deny_purge=False)
    # Message schedules: a schedule rolls up its subject; not with discard new.
    if new.allow_msg_schedules:
        if new.discard == "new":
            raise _Config("message scheduling cannot use discard new")
        if not new.allow_rollup:
            if pedantic:
                raise _Config("message scheduling cannot be set if roll-ups are disabled")
            new = replace(new, allow_rollup=True, deny_purge=False)
    # 5. Mirrors and sources (the server's checks of the configuration alone; those
    #    that need the origin are the broker's ``copy_check``).
    if new.mirror is not None or new.sources is not None:
        new = _check_copies(new, old)
    # The subject transform (ADR-30), before republish, which may follow it.
    if new.subject_transform is not None:
        new = replace(new, subject_transform=_check_transform(new.subject_transform))
    # 6. Republish (NATS ADR-28): an empty destination (refused: ADR-28 requires
    #    one), the source default, the cycle through the topic's own subjects, then
    #    the transform.
    if new.republish is not None:
        new = replace(new, republish=_check_republish(new.republish, new, pedantic))
    if new.kv is not None:
        new = replace(new, kv=_check_kv(new))
    if old is None and new.sealed:
        raise _Config("stream configuration for create can not be sealed")
    # Update-only rules (configUpdateCheckLocked), on the fixed configuration.
    if old is not None:
        if new.mirror and new.mirror != old.mirror:
            # Removing it (promotion) is allowed; adding or changing it is not.
            raise error_class(ErrorCode.MIRROR_NOT_UPDATABLE)("stream mirror configuration can not be updated")
        if old.storage != new.storage:  # (the server checks it first)
            raise _Config("stream configuration update can not change storage type")
        if old.sealed and not new.sealed:  # checked before the permissions, as the server
            raise _Config("stream configuration update can not unseal a sealed stream")
        if old.allow_msg_ttl and not new.allow_msg_ttl:
            raise _Config("message TTL status can not be disabled")
        if old.allow_msg_schedules and not new.allow_msg_schedules:
            raise _Config("message schedules can not be disabled")
        if old.deny_purge and not new.deny_purge:
            raise _Config("stream configuration update can not cancel deny purge")
        if old.retention != new.retention and "workqueue" in (old.retention, new.retention):
            raise _Config("stream configuration update can not change retention policy to/from workqueue")
        if new.sealed:
            # What sealing sets, as nats-server (even in pedantic mode): no max age, no
            # purges, deletes or roll-ups, discard new, and NATS's deny delete.
            nats = None if new.nats is None else {**new.nats, "deny_delete": True}
            new = replace(new, message_expiry=0, deny_purge=True, allow_rollup=False, discard="new", nats=nats)
    return new


_BadMirror = error_class(ErrorCode.INVALID_MIRROR)
_BadSource = error_class(ErrorCode.INVALID_SOURCE)


def copy_iname(src: dict[str, Any]) -> str:
    """nats-server's ``composeIName``: the stream name (``:<hash of the api prefix>``
    when external), the filter and the transforms' destinations, space-separated (a
    source's identity in the ``Nats-Stream-Source`` header)."""
    iname = src.get("name", "")
    ext = src.get("external")
    if ext is not None:
        iname += ":" + nats_hash(ext.get("api", ""))
    trs = src.get("subject_transforms") or []
    if not trs:
        source, dest = src.get("filter_subject") or ">", ">"
    else:
        source = "\f".join(t.get("src") or ">" for t in trs)
        dest = "\f".join(t.get("dest") or ">" for t in trs)
    return " ".join((iname, source, dest))


def _asset_name(name: str) -> bool:
    """nats-server's ``isValidAssetName`` (no whitespace, '.', '*', '>', path separators),
    or a topic's full name ``stream/topic`` (ttlbroker's own origins)."""
    if name.count("/") == 1:
        return all(_asset_name(part) for part in name.split("/"))
    return bool(name) and not any(c in " \t\r\n\f.*>/\\" for c in name)


def _check_copy_transforms(copy: dict[str, Any], err: type[Exception], what: str, overlap_text: str) -> None:
    trs = copy.get("subject_transforms") or []
    if copy.get("filter_subject") and trs:
        raise err(f"{what} with multiple subject transforms cannot also have a single subject filter")
    for tr in trs:
        src, dest = tr.get("src", ""), tr.get("dest", "")
        if src:
            try:
                validate_filter(src)
            except Exception:
                raise err(f"{what} transform source: invalid subject {src}") from None
        if dest:
            try:
                SubjectTransform(src, dest)
            except TransformError as e:
                raise err(f"{what} transform: {e}") from None
    for i, a in enumerate(trs):
        for j, b in enumerate(trs):
            if i != j and filters_overlap(a.get("src") or ">", b.get("src") or ">"):
                raise err(overlap_text)
    flt = copy.get("filter_subject")
    if flt:
        try:
            validate_filter(flt)
        except Exception:
            raise err(f"{what} transform source: invalid subject {flt}") from None


def _check_copies(new: TopicConfig, old: TopicConfig | None) -> TopicConfig:
    """nats-server's ``checkStreamCfg`` for ``Mirror`` and ``Sources``, in its order."""
    m = new.mirror
    if m is not None:
        if new.first_seq > 0:
            raise error_class(ErrorCode.MIRROR_WITH_FIRST_SEQ)("stream mirrors can not have first sequence configured")
        if new.subjects:
            raise error_class(ErrorCode.MIRROR_WITH_SUBJECTS)("stream mirrors can not contain subjects")
        if new.sources:
            raise error_class(ErrorCode.MIRROR_WITH_SOURCES)("stream mirrors can not also contain other sources")
        if new.allow_msg_schedules:
            raise _BadMirror("stream mirrors can not also schedule messages")
        _check_copy_transforms(m, _BadMirror, "mirror", "mirror subject filters can not overlap")
        if new.subject_delete_marker_ttl > 0:
            raise _Config("subject delete markers forbidden on mirrors")
        if m.get("external") is None and not _asset_name(m.get("name", "")):
            raise _BadMirror("mirrored stream name is invalid")
        if m.get("opt_start_seq") and m.get("opt_start_time"):
            raise _BadMirror("stream mirrors can not have both start seq and start time configured")
        _check_start_time(m, _BadMirror, "mirror")
    if new.sources:
        if new.allow_msg_schedules:
            raise _BadSource("stream source can not also schedule messages")
        seen: set[str] = set()
        for src in new.sources:
            if not _asset_name(src.get("name", "")):
                raise _BadSource("sourced stream name is invalid")
            iname = copy_iname(src)
            if iname in seen:
                raise _BadSource("duplicate source configuration detected")
            seen.add(iname)
            _check_copy_transforms(src, _BadSource, "source", "source filters can not overlap")
            _check_start_time(src, _BadSource, "source")
    return replace(new, mirror=m if m else None, sources=list(new.sources) if new.sources else None)


def _check_start_time(copy: dict[str, Any], err: type[Exception], what: str) -> None:
    t = copy.get("opt_start_time")
    if t is not None:
        from protocol.nats import parse_rfc3339

        try:
            parse_rfc3339(t)
        except ValueError:
            raise err(f"{what} opt_start_time {t!r} is not an RFC 3339 time") from None


def stored_subject_transform(cfg: TopicConfig) -> SubjectTransform | None:
    """The transform a topic applies to what it captures, or None (no
    ``subject_transform``, or one with an empty ``dest``)."""
    st = cfg.subject_transform
    if not st or not st.get("dest"):
        return None
    return SubjectTransform(st.get("src", ""), st["dest"])


def _check_transform(st: dict[str, Any]) -> dict[str, Any]:
    """A topic's ``subject_transform``: ``src`` a valid filter (empty: ``>``), ``dest``
    a valid template for it; an empty ``dest`` is no transform (as nats-server)."""
    src, dest = st.get("src", ""), st.get("dest", "")
    if dest:
        try:
            SubjectTransform(src, dest)
        except TransformError as err:
            raise error_class(ErrorCode.INVALID_TRANSFORM)(
                f"stream subject transform from '{src}' to '{dest}' not valid: {err}"
            ) from None
    return {"src": src, "dest": dest}


def _check_republish(rp: dict[str, Any], cfg: TopicConfig, pedantic: bool) -> dict[str, Any]:
    subjects = cfg.subjects
    src = rp.get("src", "")
    dest = rp.get("dest", "")
    if not dest:
        raise _Config("republish destination can not be empty")
    if not src:
        if pedantic:
            raise error_class(ErrorCode.PEDANTIC)("pedantic mode: republish source can not be empty")
        src = ">"
    # The server's implicit republish: '>' to '>' on a topic whose one filter the
    # subject transform takes as its source republishes the stored subjects as they are.
    st = cfg.subject_transform
    if src == dest == ">" and st and st.get("dest") and len(subjects) == 1 and st.get("src") == subjects[0]:
        if pedantic:
            raise error_class(ErrorCode.PEDANTIC)("pedantic mode: implicit republish based on subject transform")
        src = dest = st["dest"]
    cycle = error_class(ErrorCode.REPUBLISH_CYCLE)("stream configuration for republish destination forms a cycle")
    # The server's check compares the template itself with the subjects ...
    if any(filters_overlap(dest, s) for s in subjects):
        raise cycle
    try:
        transform = SubjectTransform(src, dest)
    except TransformError as err:
        raise error_class(ErrorCode.INVALID_TRANSFORM)(
            f"stream configuration for republish with transform from '{src}' to '{dest}' not valid: {err}"
        ) from None
    # ... ours also sees what the references in it can become ({{wildcard(1)}}.x
    # can give any subject ending in .x).
    if any(filters_overlap(transform.as_filter(), s) for s in subjects):
        raise cycle
    return {"src": src, "dest": dest, "headers_only": bool(rp.get("headers_only", False))}


KV_REFRESH = ("on_write", "on_read_and_write")
KV_VISIBILITY = ("never_return_expired", "return_expired_if_not_cleaned_up")


def _check_kv(cfg: TopicConfig) -> dict[str, Any]:
    """A KV bucket's settings (FLIP-25), and what a bucket needs of its topic."""
    kv = cfg.kv or {}
    unknown = set(kv) - {"ttl", "refresh", "visibility"}
    if unknown:
        raise _Invalid(f"option 'kv' has unknown keys {sorted(map(str, unknown))}; known: refresh, ttl, visibility")
    ttl = kv.get("ttl", 0)
    refresh = kv.get("refresh", "on_write")
    visibility = kv.get("visibility", "never_return_expired")
    if not isinstance(ttl, int) or isinstance(ttl, bool) or not 0 <= ttl <= 0xFFFFFFFE:
        raise _Config("kv ttl must be 0..4294967294 seconds (0 = keys live until deleted)")
    if refresh not in KV_REFRESH:
        raise _Config(f"kv refresh must be one of {', '.join(KV_REFRESH)}, not {refresh!r}")
    if visibility not in KV_VISIBILITY:
        raise _Config(f"kv visibility must be one of {', '.join(KV_VISIBILITY)}, not {visibility!r}")
    # Markers are optional, as in NATS KV (limit_marker_ttl): without them an expired
    # key goes without a trace.
    if not cfg.allow_rollup:
        raise _Config("a KV bucket needs allow_rollup")
    if ttl and not cfg.allow_msg_ttl:
        raise _Config("a KV bucket with a key ttl needs allow_msg_ttl")
    if cfg.partitions_count != 1:
        raise _Config("a KV bucket has exactly one partition")
    if stored_subject_transform(cfg) is not None:
        raise _Config("a KV bucket can not transform its subjects (its keys are its subjects)")
    return {"ttl": ttl, "refresh": refresh, "visibility": visibility}


_FIELD_NAMES = tuple(f.name for f in fields(TopicConfig))


def _copied(value: Any) -> Any:
    """A deep copy of a JSON-like value (dicts, lists and tuples of plain values)."""
    cls = value.__class__
    if cls is dict:
        return {k: _copied(v) for k, v in value.items()}
    if cls is list or cls is tuple:
        return cls(_copied(v) for v in value)
    return value
