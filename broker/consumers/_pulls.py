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

from typing import Any

import protocol as P
from protocol import PullEnd, encode_pull_entry
from protocol import PulledRun, pull_entries

from broker.core import ExpiryEngine

from ._model import MS, Consumer, Engine, Outstanding, PullRequest

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


def end(req: PullRequest, status: PullEnd, parts: list[Any] | None = None, count: int = 0) -> None:
    """End a waiting pull: its response, with the last messages, if any."""
    if retire(req) and not req.session.closing:
        req.respond(status, parts or [], count)


def fail(req: PullRequest, err: P.BrokerError) -> None:
    """End a waiting pull with an error (its consumer is gone)."""
    if retire(req) and not req.session.closing:
        req.refuse(err)


def collect(engine: Engine, c: Consumer, req: PullRequest) -> tuple[list[Any], int, bool]:
    """Take up to ``req.remaining`` messages (and ``req.bytes_left`` bytes) for a pull:
    redeliveries first, then new messages while ``max_ack_pending`` allows. Returns
    ``(parts, count, max_bytes_hit)``; ``parts`` are entry heads and records (and,
    for a request that ``takes_runs``, a ``PulledRun`` before each run of first
    deliveries taken whole: what ``pull_entries`` would give, not yet encoded)."""
    parts: list[Any] = []
    count = 0
    want = req.remaining
    max_bytes = req.bytes_left
    limit_bytes = max_bytes or engine.broker.config.limits.max_fetch_bytes
    used = 0
    hit = False
    now = engine.clock.now_ns()
    cfg = c.config
    journal = engine.journal_of(c.topic)
    member = req.member
    mine = [cp for cp in c.parts if member is None or (cp.owner is member and not cp.draining)]
    if not mine:
        return parts, 0, False
    pending = sum(cp.npending for cp in c.parts)
    # 1. redeliveries
    for cp in mine:
        if not cp.redeliver or count >= want:
            continue
        redone: list[int] = []
        first_dseq = c.dseq + 1
        out = cp.out
        get = cp.part.log.get
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
            if count:
                c.delivered_at = now
            return parts, count, True
    # 2. new messages
    room = c.room()
    none = cfg.ack_policy == "none"
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
        wanted = cp.wanted()
        scan_from = cp.cursor
        offsets: list[int] = []
        first_dseq = c.dseq + 1
        wait = cfg.wait_ns(1)
        read = cp.part.log.read
        number = cp.part.number
        runs = req.takes_runs
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
        if not offsets:
            continue
        cp.npending -= len(offsets)
        cp.last_delivered = offsets[-1]
        if cp.only is not None:
            if cp.cursor >= cp.only_until:
                cp.only = None
            else:
                cp.only.difference_update(offsets)
        engine.counters.consumer_delivered += len(offsets)
        if none:
            journal.write(["d", c.id, cp.part.number, scan_from, cp.cursor, [], now // MS, first_dseq], lazy=True)
            engine.broker_offsets_store(c, cp)
            continue
        deadline = now + wait
        fire = engine.arm(cp, offsets, deadline)
        out = cp.out
        dseq = first_dseq
        for o in offsets:
            out[o] = Outstanding(1, dseq, deadline, fire)
            dseq += 1
        journal.write(["d", c.id, cp.part.number, scan_from, cp.cursor, offsets, now // MS, first_dseq], lazy=True)
    if count:
        engine.counters.messages_out += count
        engine.counters.bytes_out += used
    if count:
        c.delivered_at = now
    return parts, count, hit


def fill(engine: Engine, c: Consumer) -> None:
    """Hand what is ready to the waiting pulls, in turn (one pass: each takes what it
    still wants; the next pass starts with the next pull)."""
    for req in list(c.waiting):
        if req.ended:
            continue
        if req.session.closing:
            end(req, PullEnd.EXPIRED)
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
