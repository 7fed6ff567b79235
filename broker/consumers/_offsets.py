"""Stored consumer offsets: STORE, GET and DELETE_CONSUMER_OFFSET, kept per topic in
its offsets file (written with the group commit).

These are the offsets a client stores by name (Iggy's consumer offsets); the
consumer engine's durable consumers keep their own state, in their journal."""

from __future__ import annotations

from typing import Protocol

import protocol as P
from protocol import ErrorCode, Identifier, error_class, normalize_name

from broker.core import Broker, Reply, Topic

__all__ = ["delete_consumer_offset", "get_consumer_offset", "store_consumer_offset"]


class _OffsetCommand(Protocol):
    """A command that names a stored consumer offset."""

    @property
    def stream(self) -> Identifier: ...

    @property
    def topic(self) -> Identifier: ...

    @property
    def partition(self) -> int: ...

    @property
    def consumer(self) -> str: ...


def _consumer(broker: Broker, cmd: _OffsetCommand) -> tuple[Topic, str]:
    topic = broker.catalog.topic(cmd.stream, cmd.topic)
    topic.partition(cmd.partition)
    return topic, normalize_name(cmd.consumer, "consumer name")


def store_consumer_offset(broker: Broker, session: object, cmd: P.StoreConsumerOffset) -> Reply:
    topic, name = _consumer(broker, cmd)
    assert topic.consumers is not None
    topic.consumers.store(name, cmd.partition, cmd.offset)
    return b"", broker.committer.note_write(topic.consumers)


def get_consumer_offset(broker: Broker, session: object, cmd: P.GetConsumerOffset) -> Reply:
    topic, name = _consumer(broker, cmd)
    assert topic.consumers is not None
    offset = topic.consumers.get(name, cmd.partition)
    if offset is None:
        raise error_class(ErrorCode.CONSUMER_OFFSET_NOT_FOUND)(
            f"consumer {name!r} has no offset for {topic.full_name} partition {cmd.partition}"
        )
    return P.ConsumerOffset(offset).encode()


def delete_consumer_offset(broker: Broker, session: object, cmd: P.DeleteConsumerOffset) -> Reply:
    topic, name = _consumer(broker, cmd)
    assert topic.consumers is not None
    if not topic.consumers.forget(name, cmd.partition):
        raise error_class(ErrorCode.CONSUMER_OFFSET_NOT_FOUND)(
            f"consumer {name!r} has no offset for {topic.full_name} partition {cmd.partition}"
        )
    return b"", broker.committer.note_write(topic.consumers)
