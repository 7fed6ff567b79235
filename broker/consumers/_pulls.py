"""Pull requests: collecting messages for a pull, and the pulls that wait.

A pull first takes what is ready at once, redeliveries first, then new messages up to
``max_ack_pending``; what it collects goes in its response when the pull ends at
once (batch full, ``max_bytes``, ``no_wait``), otherwise in a ``PULL_MESSAGES`` push
tagged with the pull's correlation id, and the pull joins the consumer's ``waiting``
queue. A waiting pull costs one object and, if it expires, one timer entry in the
deadline structure: nothing polls. When the engine marks the consumer dirty (a
publish became durable, an ack freed room, a redelivery fell due, a partition
changed hands) :func:`fill` hands messages to the waiting pulls in turn.
"""

from __future__ import annotations

import protocol as P
from broker.core import ExpiryEngine
from protocol import PulledRun, PullEnd, PullPart, encode_pull_entry, pull_entries

from ._model import (
    MS,
    Consumer,
    ConsumerLog,
    ConsumerPartition,
    Engine,
    Outstanding,
    PullRequest,
)
from ._retention import release_range

__all__ = ["PullTimers", "collect", "end", "fail", "fill", "retire"]


class PullTimers:
    """Owner of the expiry entries of waiting pulls (``offsets`` are pull ids)."""

    def __init__(self, expiry: ExpiryEngine) -> None:
        self.expiry = expiry
        self.by_id: dict[int, PullRequest] = {}
        self.next_id = 0

    def add(self, req: PullRequest) -> None:
        self.next_id += 1
        req.id = self.next_id
        self.by_id[req.id] = req
        self.expiry.schedule_timers(self, (req.id,), req.expires)

    def timers_due(self, ids: list[int], now_ns: int) -> None:
        for i in ids:
            req = self.by_id.pop(i, None)
            if req is not None and not req.ended:
                end(req, PullEnd.EXPIRED)


def retire(req: PullRequest) -> bool:
    """Take a pull out of every place that holds it (False: it had ended already)."""
    if req.ended:
        return False
    req.ended = True
    c = req.consumer
    try:
        c.waiting.remove(req)
    except ValueError:
        pass
    c.engine.pull_retired(req)
    req.session.pulls.discard(req)
    if req.member is not None:
        req.member.pull_ended(req)
    return True


def end(req: PullRequest, status: PullEnd, parts: list[PullPart] | None = None, count: int = 0) -> None:
    """End a waiting pull: its response, with the last messages, if any."""
    if retire(req) and not req.session.closing:
        req.respond(status, parts or [], count)


def fail(req: PullRequest, err: P.BrokerError) -> None:
    """End a waiting pull with an error (its consumer is gone)."""
    if retire(req) and not req.session.closing:
        req.refuse(err)


def collect(engine: Engine, c: Consumer, req: PullRequest) -> tuple[list[PullPart], int, bool]:
    """Take up to ``req.remaining`` messages (and ``req.bytes_left`` bytes) for a pull:
    redeliveries first, then new messages while ``max_ack_pending`` allows. Returns
    ``(parts, count, max_bytes_hit)``; ``parts`` are entry heads and records (and,
    for a request that ``takes_runs``, a ``PulledRun`` before each run of first
    deliveries taken whole: what ``pull_entries`` would give, not yet encoded).

    The consumers' hot path: each step below keeps its loops' state in locals. A
    paused consumer gives nothing (whoever paused it kicks the engine at the end)."""
    if c.paused_until and engine.clock.now_ns() < c.paused_until:
        return [], 0, False
    parts: list[PullPart] = []
    limit_bytes = req.bytes_left or engine.broker.config.limits.max_fetch_bytes
    now = engine.clock.now_ns()
    journal = engine.journal_of(c.topic)
    member = req.member
    mine = [cp for cp in c.parts if member is None or (cp.owner is member and not cp.draining)]
    if not mine:
        return parts, 0, False
    pending = sum(cp.npending for cp in c.parts)
    count, used, hit = _redeliveries(engine, c, mine, parts, req.remaining, limit_bytes, pending, now, journal)
    if hit:
        if count:
            c.delivered_at = now
        return parts, count, True
    count, used, hit = _first_deliveries(engine, c, mine, parts, req, count, used, limit_bytes, pending, now, journal)
    if count:
        engine.counters.messages_out += count
        engine.counters.bytes_out += used
        c.delivered_at = now
    return parts, count, hit


def _redeliveries(
    engine: Engine, c: Consumer, mine: list[ConsumerPartition], parts: list[PullPart], want: int, limit_bytes: int,
    pending: int, now: int, journal: ConsumerLog,
) -> tuple[int, int, bool]:
    """:func:`collect`'s first step: the messages due again (``redeliver``), partition
    by partition, each with its new delivery count, sequence and ack deadline, its
    timer re-armed, and one journal event per partition. A message gone meanwhile is
    dropped. Returns ``(count, bytes, max_bytes_hit)``."""
    count = used = 0
    cfg = c.config
    for cp in mine:
        if not cp.redeliver or count >= want:
            continue
        redone: list[int] = []
        first_dseq = c.dseq + 1
        out = cp.out
        get = cp.part.log.get
        hit = False
        while cp.redeliver and count < want:
            o = next(iter(cp.redeliver))
            e = out.get(o)
            if e is None:
                del cp.redeliver[o]
                continue
            try:
                rec = get(o)
            except P.BrokerError:
                del cp.redeliver[o]
                cp._drop(o)
                continue
            if count and used + len(rec) > limit_bytes:
                hit = True
                break
            del cp.redeliver[o]
            e.count += 1
            if e.count == 2:
                cp.num_redelivered += 1
            c.dseq += 1
            e.dseq = c.dseq
            e.deadline = now + cfg.wait_ns(e.count)
            redone.append(o)
            parts.append(encode_pull_entry(cp.part.number, c.dseq, e.count, pending))
            parts.append(rec)
            used += len(rec)
            count += 1
        if redone:
            by_deadline: dict[int, list[int]] = {}
            for o in redone:
                by_deadline.setdefault(out[o].deadline, []).append(o)
            for deadline, offs in by_deadline.items():
                fire = engine.arm(cp, offs, deadline)
                for o in offs:
                    out[o].fire = fire
            engine.counters.consumer_redelivered += len(redone)
            journal.write(["r", c.id, cp.part.number, redone, now // MS, first_dseq], lazy=True)
        if hit:
            return count, used, True
    return count, used, False


def _first_deliveries(
    engine: Engine, c: Consumer, mine: list[ConsumerPartition], parts: list[PullPart], req: PullRequest, count: int,
    used: int, limit_bytes: int, pending: int, now: int, journal: ConsumerLog,
) -> tuple[int, int, bool]:
    """:func:`collect`'s second step: new messages, while ``max_ack_pending`` allows,
    from the partitions in turn (each pull starts one partition further), each only
    up to what is visible (durable). ``count`` and ``used`` are what the first step
    took; returns them with this step's added, and whether ``max_bytes`` stopped it."""
    want = req.remaining
    room = c.room()
    hit = False
    n = len(mine)
    start = c.rotate % n
    c.rotate += 1
    for k in range(n):
        if count >= want or room <= 0 or hit:
            break
        cp = mine[(start + k) % n]
        vis = cp.part.visible_next
        if cp.cursor >= vis:
            continue
        scan_from = cp.cursor
        first_dseq = c.dseq + 1
        offsets, count, used, room, pending, hit = _take_new(
            c, cp, vis, parts, req.takes_runs, want, count, used, room, limit_bytes, pending
        )
        if offsets:
            _delivered(engine, c, cp, offsets, scan_from, first_dseq, now, journal)
    return count, used, hit


def _take_new(
    c: Consumer, cp: ConsumerPartition, vis: int, parts: list[PullPart], runs: bool, want: int, count: int, used: int,
    room: int, limit_bytes: int, pending: int,
) -> tuple[list[int], int, int, int, int, bool]:
    """Read ``cp``'s wanted messages from its cursor on, below ``vis``, into ``parts``
    (a ``PulledRun`` and the run for a run that fits whole when ``runs``, else an
    entry head and a record each), numbering them from ``c.dseq`` on, and move the
    cursor past what was read. Returns ``(offsets taken, count, used, room, pending,
    max_bytes_hit)``, the four numbers carried on from the caller's."""
    wanted = cp.wanted()
    offsets: list[int] = []
    read = cp.part.log.read
    number = cp.part.number
    hit = False
    while cp.cursor < vis and count < want and room > 0:
        take = min(want - count, room)
        res = read(cp.cursor, take, max(limit_bytes - used, 1), wanted, vis)
        for rec_run, (first, n_run) in zip(res.records, res.runs):
            if runs and len(rec_run) <= limit_bytes - used:  # all of it fits: pull_entries takes it all
                parts += (PulledRun(number, c.dseq + 1, n_run, pending), rec_run)
                k, size, hit = n_run, len(rec_run), False
            else:
                k, size, hit = pull_entries(parts, rec_run, number, c.dseq + 1, pending, limit_bytes - used, not count)
            c.dseq += k
            pending -= k
            used += size
            count += k
            room -= k
            offsets += range(first, first + k)
            if hit:
                break
        if hit:
            cp.cursor = offsets[-1] + 1 if offsets else cp.cursor
            break
        if res.next_offset <= cp.cursor:
            break
        cp.cursor = res.next_offset
    return offsets, count, used, room, pending, hit


def _delivered(
    engine: Engine, c: Consumer, cp: ConsumerPartition, offsets: list[int], scan_from: int, first_dseq: int, now: int,
    journal: ConsumerLog,
) -> None:
    """Record the first deliveries of ``offsets`` (read from ``scan_from`` on, delivery
    sequences from ``first_dseq``): ``npending``, the ``last_per_subject`` set, the
    counters, the journal event, and one outstanding delivery each with its ack
    timer, or, under ``ack_policy: none``, the stored offset moved instead."""
    cp.npending -= len(offsets)
    cp.last_delivered = offsets[-1]
    if cp.only is not None:
        if cp.cursor >= cp.only_until:
            cp.only = None
        else:
            cp.only.difference_update(offsets)
    engine.counters.consumer_delivered += len(offsets)
    if c.config.ack_policy == "none":
        journal.write(["d", c.id, cp.part.number, scan_from, cp.cursor, [], now // MS, first_dseq], lazy=True)
        engine.broker_offsets_store(c, cp)
        return
    deadline = now + c.config.wait_ns(1)
    fire = engine.arm(cp, offsets, deadline)
    out = cp.out
    dseq = first_dseq
    for o in offsets:
        out[o] = Outstanding(1, dseq, deadline, fire)
        dseq += 1
    journal.write(["d", c.id, cp.part.number, scan_from, cp.cursor, offsets, now // MS, first_dseq], lazy=True)


def fill(engine: Engine, c: Consumer) -> None:
    """Hand what is ready to the waiting pulls, in turn (one pass: each takes what it
    still wants; the next pass starts with the next pull). An ``ack_policy`` none
    consumer of a work-queue or interest topic settles what it delivers."""
    settles = c.config.ack_policy == "none" and c.topic.config.retention != "limits"
    starts = [cp.cursor for cp in c.parts] if settles else []
    _fill(engine, c)
    for cp, start in zip(c.parts, starts):
        release_range(engine, c, cp.part.number, start, cp.cursor)


def _fill(engine: Engine, c: Consumer) -> None:
    if c.paused_until and engine.clock.now_ns() < c.paused_until:
        return  # paused (collect would give nothing)
    for req in list(c.waiting):
        if req.ended:
            continue
        if req.unheard():  # nobody would get its messages: they stay for the next pull
            retire(req)
            continue
        if req.passes():
            continue
        parts, count, hit = collect(engine, c, req)
        if not count:
            if hit:
                end(req, PullEnd.MAX_BYTES)
            continue
        req.remaining -= count
        if req.bytes_left:
            req.bytes_left = max(req.bytes_left - sum(len(p) for p in parts[1::2]), 0)
        if req.remaining <= 0 or hit:
            end(req, PullEnd.BATCH_COMPLETE if req.remaining <= 0 else PullEnd.MAX_BYTES, parts, count)
        else:
            req.more(parts, count)
    if len(c.waiting) > 1:
        c.waiting.rotate(-1)
