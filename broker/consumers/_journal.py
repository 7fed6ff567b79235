"""The consumers of one topic and their journal: what the engine writes, and how it
is read back.

Each change of consumer state is one msgpack event appended to the topic's
:class:`storage.Journal` (two checksummed, mirrored copies) and made durable by the
group commit, like a message; a ``sync`` ack is answered once its event's epoch is
durable. Deliveries and acks without ``sync`` are written lazily: nobody waits for them,
so they go with the next sync (within ``LAZY_SYNC_SECONDS`` under ``always``). Events (``cid`` is the consumer's id within the topic)::

    ["c", cid, name, config, created_ns, [[cursor, only | None, only_until], ...]]   create
    ["u", cid, config]                                                           update
    ["x", cid]                                                                   delete
    ["d", cid, partition, scan_from, cursor, [offset, ...], now_ms, first_dseq]  first deliveries
    ["r", cid, partition, [offset, ...], now_ms, first_dseq]                     redeliveries
    ["a", cid, [partition, kind, offset, deadline_ms, ...]]                      acks, naks, terms, in progress
    ["l", cid, partition, [[offset, reason, body, hint], ...]]                   dead letters intended
    ["L", cid, partition, [offset, ...]]                                         dead letters stored
    ["s", {"next_id": n, "consumers": [state, ...]}]                             snapshot

An ``l`` event settles its offsets (it is written before their term: a journal
that keeps the term keeps it) and holds each copy's body until an ``L`` says the
copy is stored (``_dead_letters.py``).

When the file grows past its limit it is compacted to one snapshot. Deadlines are
kept in milliseconds of wall-clock time, so after a restart an outstanding message
comes back when its ack wait ends, not up to a second early.

Reading back is self-checking: a ``d`` event names where its scan started, so if
events are missing (damage both copies share, reported by storage) the messages in
the hole that would be delivered are taken as outstanding and delivered again at
once: a lost event can cause a redelivery, never a lost message.
"""

from __future__ import annotations

from typing import Any

import msgpack

from protocol import DLQ_REASONS, AckKind
from storage import Journal

from broker.core import Topic, get_logger

from ._config import ConsumerConfig
from ._model import MS, Consumer, ConsumerPartition, Engine, Outstanding

#: Dead letters written but not known to be stored: ``(cid, partition) -> {offset:
#: (body, hint)}`` (``_dead_letters.Intent``).
Pending = dict[tuple[int, int], dict[int, tuple[bytes, "list[int] | None"]]]

__all__ = ["TopicJournal"]

#: The first reason code of a copy made because its message was removed (``Expired``).
_REMOVED_CODE = DLQ_REASONS.index("Expired")

log = get_logger(__name__)

#: Compact when the journal passes this size (or four times the last snapshot).
COMPACT_BYTES = 4 * 1024 * 1024

_pack = msgpack.Packer(use_bin_type=True).pack


class TopicJournal:
    """Args:
    engine: the engine that holds the topic's consumers.
    topic: the topic.
    """

    def __init__(self, engine: Engine, topic: Topic) -> None:
        self.engine = engine
        self.topic = topic
        #: The topic's consumers, by name.
        self.consumers: dict[str, Consumer] = {}
        self.file: Journal | None = None
        self.next_id = 1
        self.limit = COMPACT_BYTES
        self.pending: Pending = {}

    def _open(self) -> Journal:
        if self.file is None:
            t = self.topic
            self.file = self.engine.broker.datadir.consumer_journal(t.stream.id, t.id)
        return self.file

    # -- writing ---------------------------------------------------------------------------

    def write(self, event: list[object], lazy: bool = False) -> int:
        """Append an event; returns the epoch that makes it durable. ``lazy``: nobody
        waits for it (deliveries, acks without an answer): it goes with the next sync
        (``Committer.note_write``) and 0 is returned."""
        f = self._open()
        f.append(_pack(event))
        epoch = self.engine.broker.committer.note_write(f, lazy)
        if f.size > self.limit:
            self.compact()
        return epoch

    def settled(self, c: Consumer, partition: int, kind: int, offsets: list[int]) -> int:
        flat: list[int] = []
        for o in offsets:
            flat += (partition, kind, o, 0)
        return self.write(["a", c.id, flat])

    def intended(self, c: Consumer, partition: int, entries: list[list[Any]]) -> None:
        """Dead letters were written (an ``l`` event): pending until stored."""
        held = self.pending.setdefault((c.id, partition), {})
        for o, _, body, hint in entries:
            held[o] = (body, hint)

    def done(self, c: Consumer, partition: int, offsets: list[int]) -> None:
        held = self.pending.get((c.id, partition))
        if held is None:
            return
        for o in offsets:
            held.pop(o, None)
        if not held:
            del self.pending[c.id, partition]

    def forget(self, c: Consumer) -> None:
        """``c`` is deleted: its pending dead letters go with it."""
        for key in [k for k in self.pending if k[0] == c.id]:
            del self.pending[key]

    def compact(self) -> None:
        f = self._open()
        snap = _pack(["s", self.snapshot()])
        f.compact(snap)
        self.limit = max(COMPACT_BYTES, 4 * len(snap))
        log.debug("consumer_journal_compacted", topic=self.topic.full_name, bytes=len(snap))

    def snapshot(self) -> dict[str, Any]:
        consumers = []
        for c in self.consumers.values():
            consumers.append({
                "id": c.id, "name": c.name, "config": c.config.to_map(), "created": c.created_ns, "dseq": c.dseq,
                "parts": [
                    [cp.cursor, cp.last_delivered, sorted(cp.only) if cp.only is not None else None, cp.only_until,
                     [[o, e.count, e.dseq, e.deadline // MS] for o, e in cp.out.items()]]
                    for cp in c.parts
                ],
                "dl": dict(c.dead_lettered),
                "dlp": [[pn, o, body, hint] for (cid, pn), held in self.pending.items() if cid == c.id
                        for o, (body, hint) in held.items()],
            })
        return {"next_id": self.next_id, "consumers": consumers}

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    # -- reading back --------------------------------------------------------------------------

    def load(self) -> list[Consumer]:
        """Replay the journal into :attr:`consumers` (startup, after the
        partitions are recovered); returns the consumers."""
        t = self.topic
        if not self.engine.broker.datadir.has_consumer_journal(t.stream.id, t.id):
            return []
        f = self._open()
        consumers: dict[int, Consumer] = {}
        holes = 0
        for i, raw in enumerate(f.payloads):
            try:
                ev = msgpack.unpackb(raw, raw=False, strict_map_key=False)
                holes += self._apply(consumers, ev)
            except Exception as exc:  # a checksummed entry we cannot apply: a bug or a newer broker
                log.error("consumer_journal_event_skipped", topic=t.full_name, index=i, error=repr(exc))
        replayed = bool(f.payloads)
        f.payloads = []  # replayed: not kept for the broker's lifetime
        out = list(consumers.values())
        for c in out:
            self._reconcile(c)
        self.consumers = {c.name: c for c in out}
        if holes:
            log.warning("consumer_journal_gap", topic=t.full_name, redelivered=holes,
                        action="messages whose events were lost are delivered again")
        if replayed:
            self.compact()
        return out

    def _new(self, cid: int, name: str, config: dict[str, Any], created: int) -> Consumer:
        self.next_id = max(self.next_id, cid + 1)
        return Consumer(self.engine, self.topic, cid, name, ConsumerConfig.from_map(config), created)

    def _apply(self, consumers: dict[int, Consumer], ev: list[Any]) -> int:
        kind = ev[0]
        if kind == "s":
            consumers.clear()
            self.pending.clear()
            snap = ev[1]
            self.next_id = max(self.next_id, snap.get("next_id", 1))
            for d in snap["consumers"]:
                made = self._new(d["id"], d["name"], d["config"], d["created"])
                made.dseq = d["dseq"]
                for cp, (cursor, last, only, until, out) in zip(made.parts, d["parts"]):
                    cp.cursor, cp.last_delivered, cp.only_until = cursor, last, until
                    cp.only = set(only) if only is not None else None
                    for o, count, dseq, dl in out:
                        cp.out[o] = Outstanding(count, dseq, dl * MS, 0)
                made.dead_lettered.update(d.get("dl", {}))
                for pn, o, body, hint in d.get("dlp", ()):
                    self.pending.setdefault((made.id, pn), {})[o] = (body, hint)
                consumers[made.id] = made
            return 0
        if kind == "c":
            _, cid, name, config, created, starts = ev
            made = self._new(cid, name, config, created)
            for cp, (cursor, only, until) in zip(made.parts, starts):
                cp.cursor, cp.only_until = cursor, until
                cp.only = set(only) if only is not None else None
            consumers[cid] = made
            return 0
        c = consumers.get(ev[1])
        if c is None:
            return 0  # its create was lost with damage (reported by storage)
        if kind == "u":
            c.config = ConsumerConfig.from_map(ev[2])
        elif kind == "x":
            del consumers[ev[1]]
            self.forget(c)
        elif kind == "l":
            _, _, pn, entries = ev
            cp = c.parts[pn]
            for o, code, _, _ in entries:
                cp.out.pop(o, None)
                if code >= _REMOVED_CODE:
                    cp.lettered.add(o)  # (Expired, Limit: if the crash undid the removal, not copied twice)
                reason = DLQ_REASONS[code]
                c.dead_lettered[reason] = c.dead_lettered.get(reason, 0) + 1
            self.intended(c, pn, entries)
        elif kind == "L":
            self.done(c, ev[2], ev[3])
        elif kind == "d":
            _, _, pn, scan_from, cursor, offsets, now_ms, first = ev
            cp = c.parts[pn]
            holes = self._fill_hole(cp, scan_from) if scan_from > cp.cursor else 0
            deadline = now_ms * MS + c.config.wait_ns(1)
            for k, o in enumerate(offsets):
                cp.out[o] = Outstanding(1, first + k, deadline, 0)
            cp.cursor = max(cp.cursor, cursor)
            if offsets:
                cp.last_delivered = offsets[-1]
                c.dseq = max(c.dseq, first + len(offsets) - 1)
            if cp.only is not None:
                if cp.cursor >= cp.only_until:
                    cp.only = None
                else:
                    cp.only.difference_update(offsets)
            return holes
        elif kind == "r":
            _, _, pn, offsets, now_ms, first = ev
            cp = c.parts[pn]
            for k, o in enumerate(offsets):
                e = cp.out.get(o)
                if e is not None:
                    e.count += 1
                    e.dseq = first + k
                    e.deadline = now_ms * MS + c.config.wait_ns(e.count)
            if offsets:
                c.dseq = max(c.dseq, first + len(offsets) - 1)
        elif kind == "a":
            flat = ev[2]
            for i in range(0, len(flat), 4):
                pn, k, o, dl = flat[i : i + 4]
                cp = c.parts[pn]
                if k == AckKind.ACK or k == AckKind.TERM:
                    cp.out.pop(o, None)
                else:
                    e = cp.out.get(o)
                    if e is not None:
                        e.deadline = dl * MS
        return 0

    @staticmethod
    def _fill_hole(cp: ConsumerPartition, scan_from: int) -> int:
        """Events between the cursor and ``scan_from`` were lost: whatever there would
        be delivered is outstanding, due at once."""
        wanted = cp.wanted()
        is_live = cp.part.log.is_live
        start = max(cp.cursor, cp.part.log.first_offset or scan_from)
        n = 0
        for o in range(start, min(scan_from, cp.part.log.next_offset)):
            if o not in cp.out and is_live(o) and (wanted is None or wanted(o)):
                cp.out[o] = Outstanding(1, 0, 0, 0)
                n += 1
        cp.cursor = scan_from
        return n

    def _reconcile(self, c: Consumer) -> None:
        """After replay: drop what was removed meanwhile, recount, re-arm the timers."""
        engine = self.engine
        for cp in c.parts:
            is_live = cp.part.log.is_live
            for o in [o for o in cp.out if not is_live(o)]:
                del cp.out[o]
            if cp.only is not None:
                cp.only = {o for o in cp.only if is_live(o)}
            cp.out = dict(sorted(cp.out.items()))
            cp.num_redelivered = sum(1 for e in cp.out.values() if e.count > 1)
            cp.npending = cp.count_from(cp.cursor)
            by_deadline: dict[int, list[int]] = {}
            for o, e in cp.out.items():
                if e.deadline:
                    by_deadline.setdefault(e.deadline, []).append(o)
                else:
                    cp.redeliver[o] = None  # from a hole: due at once
            for deadline, offs in by_deadline.items():
                fire = engine.arm(cp, offs, deadline)
                for o in offs:
                    cp.out[o].fire = fire
