"""Work-queue and interest retention (a topic's ``retention`` option, JetStream's
retention policies): which messages the consumers let go, and their removal.

Rules (nats-server's ``stream.ackMsg``, ``noInterest`` and ``consumer.needAck``):

1. A consumer *needs* a live message when its filters match the message's subject
   and it has not settled it: the message is at or past the consumer's cursor (not
   delivered yet), or delivered and outstanding. An ``ack_policy`` ``none`` consumer
   settles a message by delivering it.
2. When a consumer settles messages (ack, ack all, term, a delivery given up after
   ``max_deliver``, a delivery of an ``ack_policy`` ``none`` consumer), each of them
   that no consumer needs any more is removed, with the reason ACKED.
3. ``interest``: a message published when no consumer needs it is removed at once
   (its offset is used, as the server's sequence is), and when a consumer is deleted,
   the messages no remaining consumer needs go.
4. ``workqueue``: a message stays until a consumer settles it (with no consumer, it
   waits for one). The consumers' filters may not overlap, and each acks explicitly
   and starts at the beginning (:func:`work_queue_conflict`), so each message has
   one consumer.
5. At start-up, once the consumers' journals are read, the same rules remove what a
   crash left between a settle made durable and the removal it led to
   (:func:`sweep`): an acknowledged work item never comes back, and the counters
   stay exact. A removal is itself written before the broker says anything more of
   it, so nothing unsettled is ever removed.

Topics with ``limits`` retention (the default) never get here: the one check is
``topic.config.retention``.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.core import Partition, Topic, get_logger
from protocol import RemovalReason, filters_overlap

from ._config import ConsumerConfig
from ._model import Consumer, Engine

__all__ = ["appended", "consumer_deleted", "release", "release_range", "sweep", "work_queue_conflict"]

log = get_logger(__name__)

LIMITS = "limits"
WORK_QUEUE = "workqueue"
INTEREST = "interest"


def _needed(engine: Engine, topic: Topic, part: Partition, offset: int, subject: bytes) -> bool:
    """Does any consumer of ``topic`` need the message at ``offset`` (rule 1)?"""
    n = part.number
    for c in engine.consumers_of(topic).values():
        cp = c.parts[n]
        if (offset >= cp.cursor or offset in cp.out) and c.match(subject):
            return True
    return False


def release(engine: Engine, c: Consumer, partition: int, offsets: Iterable[int]) -> int:
    """``c`` settled these offsets of one partition: remove those nobody needs any
    more (rule 2). Returns how many went."""
    topic = c.topic
    if topic.config.retention == LIMITS:
        return 0
    part = topic.partitions[partition]
    is_live = part.log.is_live
    subject_at = part.index.subject_at
    doomed = [o for o in offsets if is_live(o) and not _needed(engine, topic, part, o, subject_at(o))]
    if not doomed:
        return 0
    return len(engine.broker.retention.remove(part, sorted(doomed), RemovalReason.ACKED))


def release_range(engine: Engine, c: Consumer, partition: int, start: int, end: int) -> int:
    """An ``ack_policy`` ``none`` consumer delivered ``[start, end)`` of a partition
    (its cursor moved over them): what it delivered is settled."""
    if start >= end or c.topic.config.retention == LIMITS:
        return 0
    match = c.match
    subject_at = c.topic.partitions[partition].index.subject_at
    return release(engine, c, partition, [o for o in range(start, end) if match(subject_at(o))])


def appended(engine: Engine, part: Partition, first: int, subjects: list[bytes]) -> None:
    """Interest retention: the messages just appended that no consumer needs go at
    once (rule 3)."""
    topic = part.topic
    if topic.config.retention != INTEREST:
        return
    doomed = [first + i for i, s in enumerate(subjects) if not _needed(engine, topic, part, first + i, s)]
    if doomed:
        engine.broker.retention.remove(part, doomed, RemovalReason.ACKED)


def consumer_deleted(engine: Engine, topic: Topic) -> int:
    """Interest retention: a consumer went; what nobody needs now goes (rule 3)."""
    if topic.config.retention != INTEREST:
        return 0
    return sweep(engine, topic)


def sweep(engine: Engine, topic: Topic) -> int:
    """Remove every live message of ``topic`` that rules 1 to 4 say should be gone:
    with interest retention, those no consumer needs; with a work queue, those a
    consumer settled and nobody needs (rule 5). A walk of the live messages: at
    start-up and when an interest topic loses a consumer."""
    retention = topic.config.retention
    if retention == LIMITS:
        return 0
    consumers = list(engine.consumers_of(topic).values())
    if retention == WORK_QUEUE and not consumers:
        return 0
    total = 0
    for part in topic.partitions:
        plog = part.log
        end = plog.next_offset
        start = plog.first_offset or end
        is_live = plog.is_live
        subject_at = part.index.subject_at
        n = part.number
        doomed = []
        for o in range(start, end):
            if not is_live(o):
                continue
            subject = subject_at(o)
            if _needed(engine, topic, part, o, subject):
                continue
            if retention == WORK_QUEUE and not any(o < c.parts[n].cursor and c.match(subject) for c in consumers):
                continue  # nobody has taken it yet: it waits for a consumer
            doomed.append(o)
        if doomed:
            total += len(engine.broker.retention.remove(part, doomed, RemovalReason.ACKED))
    if total:
        log.info("retention_swept", topic=topic.full_name, retention=retention, removed=total)
    return total


def work_queue_conflict(engine: Engine, topic: Topic, name: str, cfg: ConsumerConfig, push: bool) -> tuple[int, str] | None:
    """Why a consumer ``name`` with ``cfg`` may not be on ``topic``, a work queue
    (rule 4), as nats-server's number and words (``addConsumerWithAssignment``); None
    when it may, or when the topic is no work queue."""
    if topic.config.retention != WORK_QUEUE:
        return None
    consumers = engine.consumers_of(topic)
    others = [c for n, c in consumers.items() if n != name]
    if cfg.ack_policy == "none" and not push:
        return 10084, "consumer in pull mode requires explicit ack policy on workqueue stream"
    if name not in consumers:
        if cfg.ack_policy != "explicit":
            return 10098, "workqueue stream requires explicit ack"
        if cfg.deliver_policy != "all":
            return 10101, "consumer must be deliver all on workqueue stream"
        if others and not cfg.filter_subjects:
            return 10099, "multiple non-filtered consumers not allowed on workqueue stream"
    mine = cfg.filter_subjects  # (the server's partitionUnique: an unfiltered one collides with any)
    for c in others:
        theirs = c.config.filter_subjects
        if not theirs or any(filters_overlap(a, b) for a in mine for b in theirs):
            return 10100, "filtered consumer not unique on workqueue stream"
    return None
