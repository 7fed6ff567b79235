"""Reading: FETCH (a range of a partition, optionally filtered by subject) and
GET_LAST (the last message on a subject: never an older one when the newest is a
damaged record, ``docs/semantics.md`` §3.4)."""

from __future__ import annotations

import protocol as P
from protocol import ErrorCode, error_class, validate_filter, validate_subject

from storage import CorruptedRecord

from ._broker import Broker, Reply

__all__ = ["fetch", "get_last"]


def fetch(broker: Broker, session: object, cmd: P.Fetch) -> Reply:
    topic = broker.catalog.topic(cmd.stream, cmd.topic)
    part = topic.partition(cmd.partition)
    limit = broker.config.limits.max_fetch_bytes
    max_bytes = min(cmd.max_bytes or limit, limit)
    wanted = None
    if cmd.subject_filter:
        validate_filter(cmd.subject_filter)
        ftokens = tuple(cmd.subject_filter.split("."))
        wanted = part.wanted_for(
            cmd.subject_filter, lambda s: P.subject_matches(ftokens, s.decode(errors="replace").split("."))
        )
    res = part.read(cmd.offset, min(cmd.count, 1_000_000), max_bytes, wanted) if cmd.count else None
    records = res.records if res else []
    count = res.count if res else 0
    next_offset = res.next_offset if res else max(cmd.offset, 1)
    broker.counters.messages_out += count
    broker.counters.bytes_out += sum(len(r) for r in records)
    return P.FetchResult.encode_parts(
        topic.stream.id, topic.id, part.number, next_offset, part.log.first_offset, part.log.last_offset,
        count, records,
    )


def get_last(broker: Broker, session: object, cmd: P.GetLast) -> Reply:
    topic = broker.catalog.topic(cmd.stream, cmd.topic)
    validate_subject(cmd.subject)
    raw = cmd.subject.encode()
    part = topic.partition_for(raw)
    st = part.index.get(raw)
    last = st.last if st is not None and st.count else 0
    what = f"the last message on subject {cmd.subject!r} in topic {topic.full_name}"
    part.refuse_damaged_last(raw, last, what)
    try:
        rec = part.last(raw)
    except CorruptedRecord:
        part.refuse_damaged_last(raw, last, what)  # found damaged by this read: said as above
        raise
    if rec is None:
        raise error_class(ErrorCode.MESSAGE_NOT_FOUND)(f"topic {topic.full_name} has no message on subject {cmd.subject!r}")
    assert st is not None
    broker.counters.messages_out += 1
    broker.counters.bytes_out += len(rec)
    return P.FetchResult.encode_parts(
        topic.stream.id, topic.id, part.number, st.last + 1, part.log.first_offset, part.log.last_offset, 1, [rec]
    )
