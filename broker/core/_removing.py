"""Removing: DELETE_MESSAGE (one message by offset) and PURGE (a topic, or the
messages of the subjects a filter matches). Both refuse on a ``deny_purge`` topic and
reply once the group commit has made the removal durable."""

from __future__ import annotations

import protocol as P
from protocol import RemovalReason as R
from protocol import ErrorCode, error_class, validate_filter

from ._broker import Broker, Reply
from ._topics import Partition, Topic

__all__ = ["delete_message", "matching_subjects", "purge"]


def _check_purge_allowed(topic: Topic, what: str) -> None:
    if topic.config.sealed:
        raise error_class(ErrorCode.TOPIC_SEALED)(f"topic {topic.full_name} is sealed: it refuses {what}")
    if topic.config.deny_purge:
        raise error_class(ErrorCode.PURGE_DENIED)(f"topic {topic.full_name} denies {what} (deny_purge is set)")


def delete_message(broker: Broker, session: object, cmd: P.DeleteMessage) -> Reply:
    topic = broker.catalog.topic(cmd.stream, cmd.topic)
    part = topic.partition(cmd.partition)
    _check_purge_allowed(topic, "deletes")
    if not broker.retention.remove(part, [cmd.offset], R.DELETE):
        raise error_class(ErrorCode.MESSAGE_NOT_FOUND)(
            f"topic {topic.full_name} partition {part.number} has no live message at offset {cmd.offset}"
        )
    return b"", broker.committer.note_write(part.log)


def matching_subjects(topic: Topic, subject_filter: str) -> list[tuple[Partition, list[bytes]]]:
    """The subjects with live messages that a filter matches, by partition."""
    validate_filter(subject_filter)
    if P.is_literal(subject_filter):
        raw = subject_filter.encode()
        return [(topic.partition_for(raw), [raw])]
    return [(p, p.subjects_matching(subject_filter)) for p in topic.partitions]


def purge(broker: Broker, session: object, cmd: P.Purge) -> Reply:
    topic = broker.catalog.topic(cmd.stream, cmd.topic)
    _check_purge_allowed(topic, "purges")
    total = 0
    epoch = 0
    if not cmd.subject:
        for part in topic.partitions:
            total += broker.retention.purge_all(part)
    else:
        for part, subjects in matching_subjects(topic, cmd.subject):
            offsets = [o for s in subjects for o in part.subject_offsets(s)]
            if offsets:
                total += len(broker.retention.remove(part, offsets, R.PURGE))
                epoch = broker.committer.note_write(part.log)
    payload = P.PurgeResult(total).encode()
    return (payload, epoch) if epoch else payload
