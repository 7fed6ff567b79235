"""The consumer commands (130..138): create, update, info, list, delete, pull, ack,
join and leave, as functions ``(engine, session, command) -> Reply``. The engine
they drive is ``_engine.py``; pulls are ``_pulls.py``, groups ``_groups.py``,
durability ``_journal.py``."""

from __future__ import annotations

from bisect import bisect_left
from typing import Protocol

import protocol as P
from broker.core import Reply, Topic, get_logger
from protocol import (
    ErrorCode,
    Identifier,
    PullEnd,
    encode_pull_batch,
    error_class,
    normalize_name,
)

from ._config import ConsumerConfig
from ._engine import ConsumerEngine
from ._groups import any_draining, join, leave, owned, rebalance
from ._model import (
    MS,
    Consumer,
    ConsumerClient,
    ConsumerPartition,
    PullClient,
    PullRequest,
    entries,
)
from ._pulls import collect, end, retire
from ._retention import consumer_deleted, work_queue_conflict

__all__ = [
    "create_consumer", "update_consumer", "consumer_info", "list_consumers", "delete_consumer", "pull", "ack",
    "join_group", "leave_group", "end_pulls", "new_consumer", "change_consumer", "remove_consumer", "session_closed",
]

log = get_logger(__name__)


def _name(raw: str) -> str:
    return normalize_name(raw, "consumer name")


class _ConsumerCommand(Protocol):
    """A command that names a durable consumer."""

    @property
    def stream(self) -> Identifier: ...

    @property
    def topic(self) -> Identifier: ...

    @property
    def name(self) -> str: ...


def _find(engine: ConsumerEngine, cmd: _ConsumerCommand) -> Consumer:
    topic = engine.broker.catalog.topic(cmd.stream, cmd.topic)
    c = engine.consumers_of(topic).get(_name(cmd.name))
    if c is None:
        raise error_class(ErrorCode.CONSUMER_NOT_FOUND)("consumer not found")
    return c


def _info(c: Consumer) -> bytes:
    return P.InfoMap(c.info()).encode()


# -- create, update, delete ----------------------------------------------------------


def create_consumer(engine: ConsumerEngine, session: object, cmd: P.CreateConsumer) -> Reply:
    topic = engine.broker.catalog.topic(cmd.stream, cmd.topic)
    name = _name(cmd.name)
    cfg = ConsumerConfig.from_map(dict(cmd.config))
    existing = engine.consumers_of(topic).get(name)
    if existing is not None:
        if existing.config == cfg:
            return _info(existing)
        raise error_class(ErrorCode.CONSUMER_EXISTS)("consumer already exists")
    c, epoch = new_consumer(engine, topic, name, cfg)
    return _info(c), epoch


def new_consumer(engine: ConsumerEngine, topic: Topic, name: str, cfg: ConsumerConfig) -> tuple[Consumer, int]:
    """Create a consumer that does not exist yet; returns it and the journal epoch
    that makes it durable."""
    journal = engine.journal_of(topic)
    most = topic.config.max_consumers  # durable and ephemeral ones alike, as the server counts
    if most and len(journal.consumers) >= most:
        raise error_class(ErrorCode.MAX_CONSUMERS_REACHED)(f"maximum consumers limit reached: topic {topic.full_name} has {most}")
    _check_retention(engine, topic, name, cfg)
    limit = engine.broker.config.limits.max_consumers_per_topic
    if len(journal.consumers) >= limit:
        raise error_class(ErrorCode.INVALID_CONSUMER_CONFIG)(f"topic {topic.full_name} already has {limit} consumers, the maximum")
    cid = journal.next_id
    journal.next_id += 1
    now = engine.clock.now_ns()
    c = Consumer(engine, topic, cid, name, cfg, now)
    starts = []
    for cp in c.parts:
        _start(cp, cfg, now)
        starts.append([cp.cursor, sorted(cp.only) if cp.only is not None else None, cp.only_until])
        cp.npending = cp.count_from(cp.cursor)
    epoch = journal.write(["c", cid, name, cfg.to_map(), now, starts])
    journal.consumers[name] = c
    engine.attach(c)
    log.info("consumer_created", topic=topic.full_name, consumer=name, deliver=cfg.deliver_policy, ack=cfg.ack_policy)
    engine.events.created(c)
    return c, epoch


def _start(cp: ConsumerPartition, cfg: ConsumerConfig, now: int) -> None:
    """Where a new consumer starts in one partition (its deliver policy)."""
    part = cp.part
    plog = part.log
    nxt = plog.next_offset
    first = plog.first_offset or nxt
    policy = cfg.deliver_policy
    c = cp.consumer
    if policy == "all":
        cp.cursor = first
    elif policy == "new":
        cp.cursor = nxt
    elif policy in ("last", "last_per_subject"):
        lasts = [st.last for s, st in part.index.subjects.items() if st.count and c.match(s)]
        if not lasts:
            cp.cursor = nxt
        elif policy == "last":
            cp.cursor = max(lasts)
        else:
            cp.only = set(lasts)
            cp.only_until = nxt
            cp.cursor = min(lasts)
    elif policy == "by_start_offset":
        cp.cursor = max(cfg.start_offset_for(part.number), first)
    else:  # by_start_time: the first message stored at or after it; a future time is "new"
        t = cfg.opt_start_time or 0
        if t > now:
            cp.cursor = nxt
        else:
            offsets = range(first, nxt)
            ts = plog.timestamp_of
            cp.cursor = first + bisect_left(offsets, t, key=lambda o: ts(o)) if offsets else nxt


def update_consumer(engine: ConsumerEngine, session: object, cmd: P.UpdateConsumer) -> Reply:
    c = _find(engine, cmd)
    epoch = change_consumer(engine, c, ConsumerConfig.from_map(dict(cmd.config)))
    return (_info(c), epoch) if epoch else _info(c)


def change_consumer(engine: ConsumerEngine, c: Consumer, cfg: ConsumerConfig) -> int:
    """Update a consumer's configuration (``ConsumerConfig.check_update`` says what may change); returns
    the journal epoch (0: nothing changed)."""
    c.config.check_update(cfg)
    if cfg == c.config:
        return 0
    _check_retention(engine, c.topic, c.name, cfg)
    epoch = engine.journal_of(c.topic).write(["u", c.id, cfg.to_map()])
    refilter = cfg.filter_subjects != c.config.filter_subjects
    c.config = cfg
    if refilter:
        for cp in c.parts:
            cp.npending = cp.count_from(cp.cursor)
    engine.kick(c)
    log.info("consumer_updated", topic=c.topic.full_name, consumer=c.name)
    return epoch


def _check_retention(engine: ConsumerEngine, topic: Topic, name: str, cfg: ConsumerConfig) -> None:
    """A work-queue topic's rules for its consumers (``_retention.work_queue_conflict``),
    refused with INVALID_CONSUMER_CONFIG and the server's words."""
    conflict = work_queue_conflict(engine, topic, name, cfg, push=False)  # (the binary protocol's consumers pull)
    if conflict is not None:
        raise error_class(ErrorCode.INVALID_CONSUMER_CONFIG)(conflict[1])


def consumer_info(engine: ConsumerEngine, session: object, cmd: P.ConsumerInfoRequest) -> Reply:
    return _info(_find(engine, cmd))


def list_consumers(engine: ConsumerEngine, session: object, cmd: P.ListConsumers) -> Reply:
    topic = engine.broker.catalog.topic(cmd.stream, cmd.topic)
    consumers = engine.consumers_of(topic).values()
    return P.InfoMap({"consumers": [c.info() for c in sorted(consumers, key=lambda c: c.name)]}).encode()


def delete_consumer(engine: ConsumerEngine, session: object, cmd: P.DeleteConsumer) -> Reply:
    return b"", remove_consumer(engine, _find(engine, cmd))


def remove_consumer(engine: ConsumerEngine, c: Consumer) -> int:
    """Delete a consumer; returns the journal epoch that makes it durable."""
    topic = c.topic
    epoch = engine.journal_of(topic).write(["x", c.id])
    engine.forget(c, "consumer deleted")
    log.info("consumer_deleted", topic=topic.full_name, consumer=c.name)
    consumer_deleted(engine, topic)  # interest retention: what nobody wants now goes
    return epoch


# -- pull and ack ----------------------------------------------------------------------


def pull(engine: ConsumerEngine, session: PullClient, cmd: P.Pull) -> Reply | None:
    c = _find(engine, cmd)
    member = None
    if c.config.mode == "partitioned":
        member = session.members.get(c)
        if member is None:
            raise error_class(ErrorCode.NOT_A_MEMBER)(
                f"consumer {c.name} is partitioned: join its group (JOIN_GROUP) before pulling"
            )
        if any_draining(c):
            rebalance(engine, c)
    if cmd.batch < 1:
        raise error_class(ErrorCode.INVALID_CONSUMER_CONFIG)("a pull asks for a batch of at least 1 message")
    if not cmd.no_wait and len(c.waiting) >= c.config.max_waiting:
        raise error_class(ErrorCode.MAX_WAITING_EXCEEDED)("Exceeded MaxWaiting")
    req = PullRequest(session, session.corr, c, cmd.batch, cmd.max_bytes, member)
    parts, count, hit = collect(engine, c, req)
    t = c.topic
    if member is not None:
        member.last_active = engine.clock.trio_time()
    if count >= cmd.batch or hit or cmd.no_wait:
        status = PullEnd.BATCH_COMPLETE if count >= cmd.batch else PullEnd.MAX_BYTES if hit else PullEnd.NO_MESSAGES
        return encode_pull_batch(int(status), t.stream.id, t.id, count, entries(parts))
    if count:
        session.push_pull(req.corr, encode_pull_batch(int(PullEnd.MORE), t.stream.id, t.id, count, entries(parts)))
        req.remaining -= count
        if req.bytes_left:
            req.bytes_left = max(req.bytes_left - sum(len(p) for p in parts[1::2]), 1)
    if cmd.expires_ms:
        req.expires = engine.clock.now_ns() + cmd.expires_ms * MS
        engine.pull_timers.add(req)
    c.waiting.append(req)
    session.pulls.add(req)
    if member is not None:
        member.pull_started()
    return None  # answered when it ends (_pulls.end)


def ack(engine: ConsumerEngine, session: object, cmd: P.AckMessages) -> Reply | None:
    try:
        c = _find(engine, cmd)
    except P.BrokerError:
        if cmd.sync:
            raise
        return None  # an ack nobody waits for, of a consumer that is gone: harmless
    epoch = engine.settle(c, cmd.entries, cmd.sync)
    if c.config.mode == "partitioned" and any_draining(c):
        rebalance(engine, c)
    if not cmd.sync:
        return None
    if not epoch:
        # Nothing changed: the entries (if any) were settled by an earlier ack sent
        # without sync, perhaps not durable yet. The answer waits until everything
        # written so far is, as an ack sync promises.
        epoch = engine.committer.durable_at()
    return (b"", epoch) if epoch else b""


# -- groups ----------------------------------------------------------------------------


def join_group(engine: ConsumerEngine, session: PullClient, cmd: P.JoinGroup) -> Reply:
    c = _find(engine, cmd)
    if c.config.mode != "partitioned":
        raise error_class(ErrorCode.INVALID_CONSUMER_CONFIG)(
            f"consumer {c.name} is not partitioned (mode {c.config.mode!r}): pull from it without joining"
        )
    m = join(engine, c, session, normalize_name(cmd.member, "member name"))
    return P.InfoMap({"member": m.name, "partitions": owned(c, m)}).encode()


def leave_group(engine: ConsumerEngine, session: PullClient, cmd: P.LeaveGroup) -> Reply:
    c = _find(engine, cmd)
    m = session.members.get(c)
    if m is None:
        raise error_class(ErrorCode.NOT_A_MEMBER)(f"this connection is not a member of consumer {c.name}")
    leave(m)
    return b""


def end_pulls(engine: ConsumerEngine, session: PullClient, cmd: P.EndPulls) -> Reply:
    c = _find(engine, cmd)
    for req in [r for r in c.waiting if r.session is session]:
        end(req, PullEnd.ENDED)
    return b""


def session_closed(engine: ConsumerEngine, session: ConsumerClient) -> None:
    """A connection ended: its waiting pulls go, its memberships end (what its
    members held comes back at once)."""
    for req in list(session.pulls):
        retire(req)
    for m in list(session.members.values()):
        leave(m)

