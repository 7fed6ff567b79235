"""Consumer groups: a ``partitioned`` consumer gives each partition
to one member at a time, so one member processes a subject in order.

Members are connections that join under a member name (``JOIN_GROUP``); a
connection that joins under a name another one holds takes it over (a client that
reconnected). Partitions are dealt out round robin over the members sorted by
name, and move when a member joins, leaves, disconnects or stops pulling for
``member_timeout``. A partition moves only once its current owner holds nothing
of it: until then it is *draining* (its owner gets nothing new from it, and
nobody else does either), so a message is never out with two live members. When
a member leaves or disconnects, what it held goes back for redelivery at once;
when it only stopped pulling, what it held waits for its ack wait as usual.
"""

from __future__ import annotations

import trio

from protocol import PullEnd

from broker.core import Clock, ExpiryEngine, get_logger

from ._model import Consumer, Engine, Member, PullClient
from ._pulls import end

__all__ = ["GroupTimers", "any_draining", "join", "leave", "owned", "rebalance"]

log = get_logger(__name__)


class GroupTimers:
    """Owner of member-timeout entries in the deadline structure (ids: serials)."""

    def __init__(self, clock: Clock, expiry: ExpiryEngine) -> None:
        self.clock = clock
        self.expiry = expiry
        self.members: dict[int, Member] = {}
        self.serial = 0

    def new_serial(self) -> int:
        self.serial += 1
        return self.serial

    def watch(self, m: Member) -> None:
        """Check ``m`` once its timeout could have run out."""
        self.members[m.serial] = m
        due = self.clock.to_wall_ns(m.last_active + m.consumer.config.member_timeout)
        self.expiry.schedule_timers(self, (m.serial,), due)

    def timers_due(self, serials: list[int], now_ns: int) -> None:
        now = trio.current_time()
        for s in serials:
            m = self.members.pop(s, None)
            if m is None or m.consumer.members.get(m.name) is not m or m.pulls > 0:
                continue
            if now - m.last_active >= m.consumer.config.member_timeout - 1e-3:
                log.info("member_timed_out", consumer=m.consumer.name, member=m.name)
                leave(m, held_back=False)
            else:
                self.watch(m)


def join(engine: Engine, c: Consumer, session: PullClient, name: str) -> Member:
    old = c.members.get(name)
    if old is not None and old.session is session:
        return old
    m = Member(c, name, session, engine.new_member_serial())
    if old is not None:  # the same member on a new connection: it keeps what it holds
        for cp in c.parts:
            if cp.owner is old:
                cp.owner = m
        _forget_session(old)
        for req in [r for r in c.waiting if r.member is old]:
            end(req, PullEnd.NOT_A_MEMBER)
    c.members[name] = m
    session.members[c] = m
    engine.watch_member(m)
    rebalance(engine, c)
    log.info("member_joined", consumer=c.name, member=name, partitions=owned(c, m))
    return m


def _forget_session(m: Member) -> None:
    if m.session is not None:
        m.session.members.pop(m.consumer, None)
    m.session = None


def leave(m: Member, held_back: bool = True) -> None:
    """``m`` leaves (or disconnected, or timed out when ``held_back`` is false): what
    it held comes back at once if ``held_back``, else after its ack wait."""
    c = m.consumer
    if c.members.get(m.name) is not m:
        return
    del c.members[m.name]
    _forget_session(m)
    for req in [r for r in c.waiting if r.member is m]:
        end(req, PullEnd.NOT_A_MEMBER)
    for cp in c.parts:
        if cp.owner is m and held_back:
            for o, e in cp.out.items():
                if o not in cp.redeliver:
                    e.fire = 0
                    cp.redeliver[o] = None
    rebalance(c.engine, c)


def owned(c: Consumer, m: Member) -> list[int]:
    return [cp.part.number for cp in c.parts if cp.owner is m and not cp.draining]


def rebalance(engine: Engine, c: Consumer) -> None:
    """Deal the partitions out again; a partition whose owner still holds some of its
    messages drains first."""
    alive = sorted(c.members.values(), key=lambda m: m.name)
    changed = False
    for i, cp in enumerate(c.parts):
        want = alive[i % len(alive)] if alive else None
        if cp.owner is want:
            if cp.draining:
                cp.draining = False
                changed = True
            continue
        held = any(o not in cp.redeliver for o in cp.out)
        if cp.owner is None or not held:
            cp.owner = want
            cp.draining = False
            changed = True
        elif not cp.draining:
            cp.draining = True
            changed = True
    if changed:
        engine.kick(c)


def any_draining(c: Consumer) -> bool:
    return any(cp.draining for cp in c.parts)
