"""A topic's configuration: the options map's keys, their types, defaults and rules.

The options map is the msgpack map that follows the seed's fixed CreateTopic layout
(and the whole body of UpdateTopic). An unknown key or a value of the wrong type is
refused with INVALID_OPTIONS, never ignored: a client asking for a policy this
broker does not have must learn so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from protocol import ErrorCode, error_class, filters_overlap, validate_filter

__all__ = ["TopicConfig", "OPTION_TYPES", "check_option_types", "apply_changes"]

_Invalid = error_class(ErrorCode.INVALID_OPTIONS)
_Config = error_class(ErrorCode.INVALID_TOPIC_CONFIG)

#: key -> (accepted Python types, meaning). ``message_expiry`` travels in the fixed
#: layout on create and in the map on update.
OPTION_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "subjects": ((list,), "subject filters the topic captures (default: ['<stream>.<topic>.>'])"),
    "max_msgs_per_subject": ((int,), "live messages kept per subject, oldest removed first; 0 = unlimited"),
    "deny_purge": ((bool,), "refuse purges and deletes"),
    "segment_size": ((int,), "bytes after which a partition's segment is sealed (default from the config)"),
    "message_expiry": ((int,), "update only: max age in seconds; 0 = none"),
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
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["subjects"] = list(self.subjects)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TopicConfig:
        d = dict(d)
        d["subjects"] = tuple(d["subjects"])
        return cls(**d)

    def options(self) -> dict[str, Any]:
        """The options map as topic details report it."""
        return {
            "subjects": list(self.subjects),
            "max_msgs_per_subject": self.max_msgs_per_subject,
            "deny_purge": self.deny_purge,
            "segment_size": self.segment_size,
        }

    def validate(self, max_partitions: int) -> None:
        if not 1 <= self.partitions_count <= max_partitions:
            raise error_class(ErrorCode.INVALID_PARTITIONS_COUNT)(
                f"partitions count must be 1..{max_partitions}, not {self.partitions_count}"
            )
        if not 0 <= self.message_expiry <= 0xFFFFFFFE:
            raise _Config("message expiry must be 0..4294967294 seconds")
        if not self.subjects:
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


def apply_changes(cfg: TopicConfig, changes: dict[str, Any]) -> TopicConfig:
    """The config after an update (types already checked)."""
    kw: dict[str, Any] = {}
    for key, value in changes.items():
        kw[key] = tuple(value) if key == "subjects" else value
    return replace(cfg, **kw)
