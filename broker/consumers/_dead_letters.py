"""Dead letters (a ttlbroker extension; ``docs/semantics.md``, "Dead letters"): a
consumer with a ``dead_letter_subject`` publishes a copy of each message it gives up
(``max_deliver`` reached, ``MaxDeliveries``) or that a client terminates
(``Terminated``) on that subject, exactly once, through the broker's own publish path
(``Publisher.publish_bodies``): the topic that captures the subject stores it, with
its own retention and limits. With ``dead_letter_expired`` it also copies what it
still owes (outstanding, or not delivered yet and matching its filter) when a TTL
or the max age (``Expired``) or a limit (``Limit``: max msgs, max bytes, max msgs
per subject) removes it: ``Partition.remove`` tells its watchers before the bytes go
(``ConsumerPartition.removing``: the copies are built, :meth:`DeadLetters.removing`)
and after (``removed``: the intents are journaled and the copies published, as
below, in the group commit of the removal).

Exactly once, crash or not:

1. the copy's body is built from the stored message (``protocol.dead_letter_body``)
   and written into the consumer journal as an *intent* event
   (``["l", cid, partition, [[offset, reason, body, hint], ...]]``) *before* the
   settle event, so a journal that keeps the settle keeps the intent (a journal
   keeps a prefix of what was written); replaying an intent settles the offset;
2. the copy is published at once, in the same group commit as the intent;
3. once that commit is durable, the intent is marked done (``["L", cid, partition,
   [offset, ...]]``, lazy) and, with work-queue or interest retention, the original
   is released (removed only after its copy is stored);
4. after a crash, each intent not marked done is looked for in the partition that
   captures the subject, from the offset that partition was at when the intent was
   written (``hint``): found, it is marked done; not found, its body is published
   again. A copy is never lost (its body is in the journal) and never made twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import protocol as P
from protocol import DLQ_REASONS, REDRIVE_DRY_RUN, dead_letter_body, dead_letter_origin, read_record_info, redriven_body, split_records
from storage import CorruptedRecord

from broker.core import Broker, Partition, Reply, Topic, get_logger

from ._journal import TopicJournal
from ._model import Consumer, Engine

__all__ = ["REDRIVE_MARK", "DeadLetters", "Intent", "Prepared", "redrive", "redrive_topic"]

log = get_logger(__name__)

#: A pending copy: its body and where its subject was captured when it was written
#: (``[stream id, topic id, partition, next offset]``, None: not stored anywhere).
Intent = tuple[bytes, "list[int] | None"]

#: The broker counter of each reason.
_COUNTER = {
    "MaxDeliveries": "dead_lettered_max_deliveries", "Terminated": "dead_lettered_terminated",
    "Expired": "dead_lettered_expired", "Limit": "dead_lettered_limit",
}


class Prepared(NamedTuple):
    """Copies built, not yet journaled nor published."""

    consumer: Consumer
    partition: int
    reason: str
    entries: list[list[Any]]  # [offset, reason code, body, hint] (the intent event's)
    bodies: list[bytes]


_READ_BYTES = 1 << 62
_SCAN_CHUNK = 1000


class DeadLetters:
    """The engine's dead letters: copies made, pending ones, recovery.

    Args:
        engine: the consumer engine.
        journal_of: each topic's consumer journal.
        all_consumers: every consumer (after a restart).
    """

    def __init__(self, engine: Engine, journal_of: Callable[[Topic], TopicJournal],
                 all_consumers: Callable[[], list[Consumer]]) -> None:
        self.engine = engine
        self.journal_of = journal_of
        self.all_consumers = all_consumers
        #: Making copies of removed messages (their publish may remove more).
        self._making = False

    def copy(self, c: Consumer, partition: int, items: list[tuple[int, int]], reason: str) -> set[int]:
        """Dead-letter ``items`` (``(offset, deliveries)``, settled just now, still
        stored) of ``c``'s ``partition`` for ``reason``. Returns the offsets whose
        release waits for the copy to be durable (empty: no dead-letter subject)."""
        prepared = self.prepare(c, partition, items, reason)
        return set() if prepared is None else self.make(prepared)

    def removing(self, c: Consumer, partition: int, items: list[tuple[int, int]], reason: str) -> Prepared | None:
        """``items`` owed by ``c`` are about to be removed (``Expired``, ``Limit``):
        their copies are built now, made by :meth:`removed` once they are gone. A
        removal that the publish of such a copy causes (the dead-letter topic is
        full and discards old, or it is the consumer's own topic) is not
        dead-lettered again: dead-letter topics that feed each other cannot loop."""
        if self._making:
            log.warning("dead_letter_skipped", consumer=c.name, topic=c.topic.full_name, partition=partition,
                        offsets=len(items), reason="removed by the publish of another dead letter")
            return None
        return self.prepare(c, partition, items, reason)

    def removed(self, prepared: Prepared) -> None:
        self._making = True
        try:
            self.make(prepared)
        finally:
            self._making = False

    def prepare(self, c: Consumer, partition: int, items: list[tuple[int, int]], reason: str) -> Prepared | None:
        """The copies of ``items`` (still stored), not yet journaled nor published."""
        subject = c.config.dead_letter_subject
        if not subject or not items:
            return None
        engine = self.engine
        part = c.parts[partition].part
        now = engine.clock.now_ns()
        route = engine.broker.router.resolve(subject.encode())
        hint = _hint(route) if isinstance(route, Partition) else None
        code = DLQ_REASONS.index(reason)
        bodies: list[bytes] = []
        entries: list[list[Any]] = []
        stream = engine.events.stream_name(c.topic)
        for o, deliveries in items:
            record = _read(part, o)
            if record is None:
                log.warning("dead_letter_skipped", consumer=c.name, topic=c.topic.full_name, partition=partition,
                            offset=o, reason="the message is gone or damaged")
                continue
            body = dead_letter_body(record, subject, stream, partition, c.name, reason, deliveries, now)
            bodies.append(body)
            entries.append([o, code, body, hint])
        return Prepared(c, partition, reason, entries, bodies) if entries else None

    def make(self, p: Prepared) -> set[int]:
        """Journal the intents, publish the copies (one group commit), count them;
        once durable, :meth:`_stored`. Returns their offsets."""
        c, partition, entries = p.consumer, p.partition, p.entries
        broker = self.engine.broker
        journal = self.journal_of(c.topic)
        epoch = journal.write(["l", c.id, partition, entries])
        journal.intended(c, partition, entries)
        broker.publisher.publish_bodies(p.bodies)
        self._count(c, p.reason, len(entries))
        offsets = [e[0] for e in entries]
        committer = broker.committer
        if committer.acks_wait:
            committer.after(epoch, lambda: self._stored(c, partition, offsets))
        else:
            self._stored(c, partition, offsets)
        return set(offsets)

    def _count(self, c: Consumer, reason: str, n: int) -> None:
        c.dead_lettered[reason] = c.dead_lettered.get(reason, 0) + n
        name = _COUNTER[reason]
        counters = self.engine.counters
        setattr(counters, name, getattr(counters, name) + n)

    def _stored(self, c: Consumer, partition: int, offsets: list[int]) -> None:
        """The copies of ``offsets`` are durable: the intents are done, the
        originals go as their retention says."""
        engine = self.engine
        if c.deleted:
            return
        journal = self.journal_of(c.topic)
        journal.write(["L", c.id, partition, offsets], lazy=True)
        journal.done(c, partition, offsets)
        if c.topic.config.retention != "limits":
            engine.released(c, partition, offsets)

    def recover(self) -> None:
        """After a restart: finish each copy whose intent is not marked done."""
        engine = self.engine
        broker = engine.broker
        for c in self.all_consumers():
            for cp in c.parts:  # (what was removed stays removed: only a live one could be copied twice)
                if cp.lettered:
                    cp.lettered = {o for o in cp.lettered if cp.part.log.is_live(o)}
            journal = self.journal_of(c.topic)
            for (cid, pn), intents in list(journal.pending.items()):
                if cid != c.id or not intents:
                    continue
                found = self._already_stored(c, pn, intents)
                missing = [o for o in intents if o not in found]
                if missing:
                    broker.publisher.publish_bodies([intents[o][0] for o in missing])
                    log.warning("dead_letters_recovered", consumer=c.name, topic=c.topic.full_name, partition=pn,
                                republished=len(missing), found=len(found))
                offsets = list(intents)
                epoch = journal.write(["L", c.id, pn, offsets])  # (noted as done below: once durable it is)
                committer = broker.committer
                if committer.acks_wait:
                    committer.after(epoch, self._recovered_later(c, pn, offsets))
                else:
                    self._recovered(c, pn, offsets)

    def _recovered_later(self, c: Consumer, pn: int, offsets: list[int]) -> Callable[[], None]:
        return lambda: self._recovered(c, pn, offsets)

    def _recovered(self, c: Consumer, pn: int, offsets: list[int]) -> None:
        if c.deleted:
            return
        self.journal_of(c.topic).done(c, pn, offsets)
        if c.topic.config.retention != "limits":
            self.engine.released(c, pn, offsets)

    def _already_stored(self, c: Consumer, pn: int, intents: dict[int, Intent]) -> set[int]:
        """The offsets among ``intents`` whose copy the capturing partition holds."""
        subject = c.config.dead_letter_subject
        route = self.engine.broker.router.resolve(subject.encode()) if subject else None
        if not isinstance(route, Partition):
            return set()
        here = _hint(route)
        starts = [h[3] for _, h in intents.values() if h is not None and h[:3] == here[:3]]
        if not starts:
            return set()
        found: set[int] = set()
        offset = max(min(starts), route.log.first_offset or 1)
        full_name = self.engine.events.stream_name(c.topic)
        while offset < route.log.next_offset and len(found) < len(intents):
            try:
                res = route.read(offset, _SCAN_CHUNK, _READ_BYTES, None)
            except CorruptedRecord:
                offset += 1
                continue
            if not res.count:
                break
            for run in res.records:
                for rec in split_records(run):
                    origin = dead_letter_origin(read_record_info(rec, 0).headers)
                    if (origin is not None and origin.stream == full_name and origin.partition == pn
                            and origin.consumer == c.name and origin.sequence in intents):
                        found.add(origin.sequence)
            offset = res.next_offset
        return found


def _hint(part: Partition) -> list[int]:
    return [part.topic.stream.id, part.topic.id, part.number, part.log.next_offset]


def _read(part: Partition, offset: int) -> bytes | None:
    """The stored record at ``offset`` (None: removed, or damaged)."""
    try:
        res = part.read(offset, 1, _READ_BYTES, None)
    except CorruptedRecord:
        return None
    if not res.count or res.runs[0][0] != offset:
        return None
    return bytes(split_records(res.records[0])[0])


#: The stored consumer offset, per partition of a dead-letter topic, of the last copy
#: redriven (``$`` keeps it apart from the names clients store offsets under).
REDRIVE_MARK = "$redrive"


def redrive(broker: Broker, session: object, cmd: P.Redrive) -> Reply:
    """REDRIVE: publish the dead letters a topic stored since its last redrive again,
    each on its ``Nats-DLQ-Subject`` (less its ``Nats-DLQ-*`` headers), and mark them:
    the mark (``REDRIVE_MARK``) is written before the copies are published, in the
    same group commit, so a copy is redriven at most once, crash or not. Records
    that are no dead letters are passed over (``skipped``). ``REDRIVE_DRY_RUN``:
    counted only."""
    topic = broker.catalog.topic(cmd.stream, cmd.topic)
    done, epoch = redrive_topic(broker, topic, bool(cmd.flags & REDRIVE_DRY_RUN))
    return P.InfoMap(done).encode(), epoch


def redrive_topic(broker: Broker, topic: Topic, dry: bool) -> tuple[dict[str, Any], int]:
    """REDRIVE of ``topic`` (the binary command and the NATS listener's
    ``$JS.API.STREAM.REDRIVE``): ``{"redriven": n, "skipped": n, "dry_run": bool}``
    and the epoch to answer after (0: nothing written)."""
    marks = topic.consumers
    assert marks is not None
    redriven = skipped = 0
    for part in topic.partitions:
        start = (marks.get(REDRIVE_MARK, part.number) or 0) + 1
        end = part.log.next_offset
        if start >= end:
            continue
        if not dry:
            marks.store(REDRIVE_MARK, part.number, end - 1)
        offset = max(start, part.log.first_offset or start)
        while offset < end:
            try:
                res = part.read(offset, _SCAN_CHUNK, _READ_BYTES, None)
            except CorruptedRecord:
                offset += 1
                skipped += 1
                continue
            if not res.count:
                break
            bodies = []
            for run, (first, n) in zip(res.records, res.runs):
                for k, rec in enumerate(split_records(run)):
                    if first + k >= end:
                        break
                    body = redriven_body(rec)
                    if body is None:
                        skipped += 1
                    else:
                        bodies.append(body)
            redriven += len(bodies)
            if bodies and not dry:
                broker.publisher.publish_bodies(bodies)
            offset = res.next_offset
    epoch = 0
    if not dry:
        epoch = broker.committer.note_write(marks)
        broker.counters.dead_letters_redriven += redriven
        log.info("dead_letters_redriven", topic=topic.full_name, redriven=redriven, skipped=skipped)
    return {"redriven": redriven, "skipped": skipped, "dry_run": dry}, epoch
