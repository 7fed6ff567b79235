"""Publishing: the PUBLISH command, the broker's hot path, as steps over a
:class:`~._batch.Batch`.

A batch is scanned, checked (``_admission.check``), routed subject by subject to
partitions, admitted into its topics (headers, TTLs, rollups, compare-and-set:
``_admission.admit_batch``), de-duplicated (``_admission.dedupe``), appended, held to
the per-subject limit, rolled up (``Nats-Rollup``), republished and delivered to
core subscriptions; each entry point then makes its answer from the batch. No step
awaits.

The entry points, one answer shape each:

* :meth:`Publisher.publish`: the binary PUBLISH handler (bound once into the
  session's dispatch table: keep this path free of extra per-call layers); its
  ``Reply`` is the Acks payload, or ``(payload, epoch)`` when it may go only once the
  group commit has made ``epoch`` durable;
* :meth:`Publisher.publish_frames`: the consecutive PUBLISH requests one read
  brought, as one batch: their response frames and an epoch, or None (go one at a
  time);
* :meth:`Publisher.publish_stored`: the NATS listener's publish: the first offset
  when the whole batch went in order into one partition, else the acks, and an epoch;
* :meth:`Publisher.publish_bodies`: the broker's own bodies (republished copies):
  nothing to answer;
* :meth:`Publisher.request`: a binary PUBLISH with a reply subject (a request,
  ``protocol.PublishWithReply``), answered as :meth:`Publisher.publish`; its messages
  reach the core subscribers with the reply subject, and a request that reaches none
  gets the no-responders status message on its reply subject, as from nats-server.

Speed: the common batch (plain messages into one partition, nothing refused) takes
the one-partition path: one append, TTLs scheduled in bulk (one insertion per
distinct TTL), no per-message objects, acks encoded without a per-message loop
(``protocol.encode_uniform_acks``), no delivery entries built when no subscription
matches its subjects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import protocol as P
from protocol import RemovalReason as R
from protocol import TTL_NEVER, TTL_NONE, BrokerError, ErrorCode, scan_bodies
from storage import AppendResult, MemoryBudget

from ._admission import ROLLUP_SUB, admit_batch, check, dedupe, self_contained
from ._batch import Appended, Batch, RequestBatch
from ._clock import Clock
from ._commit import Committer, Reply
from ._limits import refuse, trim, trim_in_order
from ._republish import Republisher
from ._retention import Retention
from ._routing import NO_TOPIC, Router
from ._schedules import Scheduler
from ._stats import Counters
from ._subscriptions import Entry, SubscriptionIndex
from ._topics import Partition, flags_for

_FLAG_NO_MARKER, _FLAG_TOMBSTONE = P.FLAG_NO_MARKER, P.FLAG_TOMBSTONE

__all__ = ["Publisher", "StoredReply", "Copy"]


class Copy(NamedTuple):
    """One message a mirror or source stores (:meth:`Publisher.publish_copies`)."""

    subject: bytes
    #: The header block in the record's format (``protocol.encode_headers``), b"" for none.
    headers: bytes
    payload: bytes
    #: The offset it must get (a mirror: the origin's sequence), or 0: the next one.
    offset: int = 0
    #: Its timestamp (a mirror: the origin's, ns), or 0: now.
    timestamp: int = 0


_COPY_HEADERS = frozenset((b"Nats-TTL", b"Nats-Rollup", b"KV-Operation", b"Nats-Marker-Reason"))

_DUPLICATE = int(ErrorCode.DUPLICATE_MESSAGE)
_NO_TOPIC = int(ErrorCode.NO_TOPIC_FOR_SUBJECT)
_Sealed = P.error_class(ErrorCode.TOPIC_SEALED)
_NO_ACK = P.PUBLISH_NO_ACK
#: A record's bytes beyond its body (``protocol.RECORD_HEADER``: what the memory
#: budget counts besides the bodies).
_RECORD_HEAD = 24
_MemoryFull = P.error_class(ErrorCode.MEMORY_STORAGE_FULL)
#: Where the bodies of a PUBLISH payload start (after u8 flags and u32 count).
_BODY_POS = 5
#: The place a DELIVERY gives a message no topic stored.
_NOT_STORED = P.delivery_entry(0, 0, 0)

#: :meth:`Publisher.publish_stored`'s answer: the first offset (message k of the batch
#: at ``first + k``) when the whole batch was stored in order into one partition,
#: else the encoded acks (b"" when the publish asked for none); and the epoch the
#: answer must wait for (0: none).
StoredReply = tuple[int | bytes, int]


def _record_views(res: AppendResult) -> list[memoryview]:
    """The records of an append, one view each."""
    records = memoryview(res.records)
    positions = res.positions
    ends = positions[1:] + [len(records)]
    return [records[p:e] for p, e in zip(positions, ends)]


class Publisher:
    """The broker's one publish path: the entry points (see the module docstring)
    and the steps they run over a :class:`Batch`.

    Args:
        max_payload: ``[limits] max_payload_bytes``.
        router, clock, counters, subs, committer, retention, republisher: the
            broker's parts a publish goes through.
        memory_budget: what the memory-storage topics may hold (``[limits]
            memory_storage_bytes``); ``reclaim_memory`` frees what their removed
            records hold (a cleaner pass over them), before a publish is refused.
    """

    def __init__(
        self, max_payload: int, router: Router, clock: Clock, counters: Counters, subs: SubscriptionIndex,
        committer: Committer, retention: Retention, republisher: Republisher,
        memory_budget: MemoryBudget | None = None, reclaim_memory: Callable[[], object] | None = None,
    ) -> None:
        self.memory_budget = memory_budget or MemoryBudget(0)
        self.reclaim_memory = reclaim_memory
        self.max_payload = max_payload
        self.router = router
        self.clock = clock
        self.counters = counters
        self.subs = subs
        self.committer = committer
        self.retention = retention
        self.republisher = republisher
        #: The message schedules (``_schedules.py``), set by the broker.
        self.scheduler: Scheduler | None = None

    # -- entry points ----------------------------------------------------------------

    def publish(self, session: object, cmd: P.Publish) -> Reply:
        """A PUBLISH request (``session`` unused: the dispatch table's signature).

        Raises:
            MalformedPayloadError: the bodies do not fill the payload.
        """
        data = cmd.data
        batch = Batch(data, scan_bodies(data, cmd.body_pos, cmd.count, self.max_payload))
        if batch.special:
            check(batch, self.max_payload)
        self._store(batch)
        if cmd.flags & _NO_ACK:  # (cmd.no_ack, without a property call)
            return b""
        epoch = batch.epoch
        part = batch.whole
        if part is not None:  # the common case: acks without a per-message loop
            topic = part.topic
            payload = P.encode_uniform_acks(topic.stream.id, topic.id, part.number, batch.first_offset, batch.count)
        else:
            payload = batch.acks().encode()
        return (payload, epoch) if epoch else payload

    def request(self, session: object, cmd: P.PublishWithReply) -> Reply:
        """A PUBLISH with a reply subject (a request): stored and acked as
        :meth:`publish` does, delivered to the core subscribers with the reply
        subject. When no subscription took any of its messages, and at least one
        was valid, the publishing ``session``'s first subscription that matches the
        reply subject gets the no-responders status message (:meth:`_no_responders`)
        before the acks.

        Raises:
            InvalidSubjectError: the reply subject is not a valid subject (nothing
                is stored or delivered).
            MalformedPayloadError: the bodies do not fill the payload.
        """
        try:
            reply = P.validate_subject(cmd.reply).encode()
        except BrokerError as err:
            raise P.error_class(ErrorCode.INVALID_SUBJECT)(f"reply subject: {err.message}") from None
        data = cmd.data
        batch = RequestBatch(data, scan_bodies(data, cmd.body_pos, cmd.count, self.max_payload), reply)
        if batch.special:
            check(batch, self.max_payload)
        self._store(batch)
        if not batch.reached and len(batch.failed) < batch.count:
            self._no_responders(session, batch)
        # The answer, as :meth:`publish` makes it (inline there: its hot path).
        if cmd.flags & _NO_ACK:
            return b""
        part = batch.whole
        if part is not None:
            topic = part.topic
            payload = P.encode_uniform_acks(topic.stream.id, topic.id, part.number, batch.first_offset, batch.count)
        else:
            payload = batch.acks().encode()
        return (payload, batch.epoch) if batch.epoch else payload

    def _no_responders(self, session: object, batch: RequestBatch) -> None:
        """Tell the publisher of a request that nothing took it, as nats-server tells
        a client whose CONNECT asked for it: a core message on the reply subject,
        with no payload and the headers ``Status: 503`` and ``Nats-Subject`` (the
        first valid message's subject; a NATS client reads a status line as the
        ``Status`` header), to the first (in match order) of the publisher's own
        subscriptions that match the reply subject; nobody else gets it. Counted in
        ``no_responders``."""
        self.counters.no_responders += 1
        reply = batch.reply
        assert reply is not None
        own = [s for s in self.subs.match(reply) if s.session is session]
        if not own:
            return
        sub = min(own, key=lambda s: P.match_order(s.tokens))
        subject = next(s for i, s in enumerate(batch.subjects) if i not in batch.failed)
        headers = P.encode_headers([("Status", "503"), ("Nats-Subject", subject.decode(errors="replace"))])
        record = P.encode_record(0, self.clock.now_ns(), P.encode_body(reply.decode(), b"", headers))
        sub.deliver_records([_NOT_STORED, record], self.counters)

    def publish_frames(self, session: object, requests: list[tuple[int, bytes, int]]) -> tuple[bytes, int] | None:
        """Consecutive PUBLISH requests (acked, at least one message each; ``(correlation
        id, payload, message count)``, as ``ProtocolConnection.take_publish`` gives them)
        as one batch: one pass over their bodies, one append per partition, one epoch
        for the group commit. Returns their response frames, joined, and the epoch to
        wait for (0: none),
        or None, with nothing done, when they must go one at a time: when one of them is
        malformed (it gets its own error), or when a message has a header whose effect
        depends on what the messages before it wrote (``Nats-Expected-Last-Subject-Sequence``
        and the other compare-and-set headers, ``Nats-Rollup``, ``Nats-Msg-Id``: all but
        ``_admission.SELF_CONTAINED``), checked one request at a time.

        The acks are what the requests would get one after the other: messages keep
        their order, and a request's errors name its own message indexes."""
        corrs: list[int] = []
        counts: list[int] = []
        positions: list[int] = []
        bodies: list[bytes] = []
        pos = 0
        for corr, payload, count in requests:
            body = payload[_BODY_POS:]
            corrs.append(corr)
            counts.append(count)
            positions.append(pos)
            bodies.append(body)
            pos += len(body)
        data = b"".join(bodies)
        try:
            batch = Batch(data, scan_bodies(data, 0, sum(counts), self.max_payload))
        except BrokerError:
            return None  # a malformed request among them: each gets its own answer
        if not batch.framed(counts, positions):
            return None
        if batch.special:
            check(batch, self.max_payload)
            if not self_contained(batch):
                return None  # a compare-and-set, rollup or de-duplication header: one request at a time
        self._store(batch)
        return batch.ack_frames(corrs, counts), batch.epoch

    def publish_stored(self, session: object, cmd: P.Publish, reply: bytes | None = None) -> StoredReply:
        """A publish of the NATS listener, which makes each PubAck from the offset
        where the message went: see :data:`StoredReply`. ``reply``: the reply subject
        its messages carry to the core subscriptions (as on nats-server, where the
        stream's capture is one more subscriber: they see the PUB's reply, and the
        stream's PubAck goes to it). No no-responders status: the stream answers.

        Raises:
            MalformedPayloadError: the bodies do not fill the payload.
        """
        data = cmd.data
        scan = scan_bodies(data, cmd.body_pos, cmd.count, self.max_payload)
        batch = Batch(data, scan) if reply is None else RequestBatch(data, scan, reply)
        if batch.special:
            check(batch, self.max_payload)
        self._store(batch)
        if batch.whole is not None:
            return batch.first_offset, batch.epoch
        return (b"" if cmd.flags & _NO_ACK else batch.acks().encode()), batch.epoch

    def publish_bodies(self, bodies: list[bytes], deliver: bool = True) -> None:
        """Message bodies the broker built itself (republished copies, the messages
        schedules produce), without acks: their flags, sizes and headers need no
        checking, and their ids are not de-duplicated. ``deliver=False``: stored
        only, not copied to the core subscriptions (a schedule's produced messages)."""
        data = b"".join(bodies)
        batch = Batch(data, scan_bodies(data, 0, len(bodies), self.max_payload), trusted=True)
        batch.quiet = not deliver
        self._store(batch)

    def publish_copies(self, part: Partition, copies: list[Copy], mark: tuple[str, int, str] | None = None) -> int:
        """Messages a mirror or source copied from its origin, stored into ``part``
        (its topic's one partition) without routing, admission or de-duplication:
        the origin checked them. A copy with an ``offset`` above the next one skips
        the offsets between (``PartitionLog.skip_to``); one at or below it is held
        already and is passed over (an offset is never given twice). ``Nats-TTL``
        is honoured only when the topic allows TTLs (otherwise the message is just
        kept: ADR-43); ``Nats-Rollup`` is applied (the origin allowed it); the
        limits, republish and the consumers apply as to any append. Not delivered
        to core subscriptions (nats-server does not publish what it copies).
        ``mark``: a source's ``(iname, origin sequence, origin identity)`` of the last
        copy, noted in the partition's marks with the append (before the limits or a
        rollup may remove it: ``PartitionLog.note_source``).
        Returns the epoch the caller must wait for before it asks for more (0: none).

        Raises:
            TopicSealedError, MemoryStorageFullError: nothing was stored.
        """
        topic = part.topic
        if topic.config.sealed:
            raise _Sealed(f"topic {topic.full_name} is sealed: no message goes in")
        if part.log.volatile:
            need = sum(len(c.subject) + len(c.headers) + len(c.payload) + 14 + _RECORD_HEAD for c in copies)
            budget = self.memory_budget
            if not budget.fits(need) and self.reclaim_memory is not None:
                self.reclaim_memory()
            if not budget.fits(need):
                self.counters.memory_storage_refused += len(copies)
                raise self._memory_full()
        now = self.clock.now_ns()
        epoch = 0
        i, n = 0, len(copies)
        while i < n:
            c = copies[i]
            off = c.offset
            log = part.log
            if off:
                if off < log.next_offset:
                    i += 1
                    continue
                log.skip_to(off)
            j = i + 1
            while j < n and (copies[j].offset == off + j - i if off else not copies[j].offset):
                j += 1
            epoch = max(epoch, self._append_copies(part, copies[i:j], now, mark if j == n else None))
            i = j
        return epoch

    def _append_copies(self, part: Partition, run: list[Copy], now: int, mark: tuple[str, int, str] | None) -> int:
        """One append of consecutive copies, each with its own timestamp (a mirror
        keeps its origin's; 0: ``now``)."""
        cfg = part.topic.config
        bodies: list[bytes] = []
        subjects: list[bytes] = []
        flags = bytearray(len(run))
        ttls: list[tuple[int, int]] = []
        rollups: list[tuple[int, int]] = []
        for k, c in enumerate(run):
            hv = P.header_values(c.headers, _COPY_HEADERS) if c.headers else {}
            ttl = TTL_NONE
            raw = hv.get(b"Nats-TTL")
            if raw and cfg.allow_msg_ttl:
                t = P.parse_ttl(raw)
                if t > 0:
                    ttl = t
            rflags = 0
            kv_op = hv.get(b"KV-Operation")
            if kv_op == b"PURGE" or hv.get(b"Nats-Marker-Reason"):
                rflags |= _FLAG_NO_MARKER
            if kv_op in (b"DEL", b"PURGE"):
                rflags |= _FLAG_TOMBSTONE
            bodies.append(P.encode_body(c.subject, c.payload, c.headers, ttl, rflags))
            subjects.append(c.subject)
            flags[k] = flags_for(ttl, rflags)
            if 0 < ttl < TTL_NEVER:
                ttls.append((k, ttl))
            kind = hv.get(b"Nats-Rollup")
            if kind in (b"sub", b"all"):
                rollups.append((k, ROLLUP_SUB if kind == b"sub" else 0))
        starts, ends, pos = [], [], 0
        for b in bodies:
            starts.append(pos)
            pos += len(b)
            ends.append(pos)
        lasts = part.last_offsets(subjects) if part.topic.republisher is not None else None
        times = [c.timestamp or now for c in run]
        ts = times[0]
        res = part.append(b"".join(bodies), starts, ends, subjects, ts, flags if any(flags) else None,
                          timestamps=None if times.count(ts) == len(times) else times)
        epoch = self.committer.note_write(part.log)
        first = res.first_offset
        if mark is not None:
            part.log.note_source(*mark, first + len(run) - 1)
        counters = self.counters
        counters.messages_in += len(run)
        counters.bytes_in += len(res.records)
        counters.messages_copied += len(run)
        self.retention.after_append(part, res, [(first + k, t) for k, t in ttls])
        for k, rollup in rollups:
            off = first + k
            if not part.log.is_live(off):
                continue
            if rollup == ROLLUP_SUB:
                doomed = _rolled_up(part, subjects[k], off)
            else:
                doomed = [o for o in part.live_offsets(except_offset=off) if o < off]
            if doomed:
                self.retention.remove(part, doomed, R.ROLLUP)
        if cfg.max_msgs_per_subject:
            self.enforce_max_msgs(part, subjects)
        if part.topic.trimming:
            trim(part, self.retention.remove)
        if lasts is not None:
            self.republisher.after_append(part, res, lasts, epoch)
        return epoch

    # -- the steps -------------------------------------------------------------------

    def _store(self, batch: Batch) -> None:
        """Every step after the check, in order: route, admit, dedupe, append, apply
        the limits and rollups, republish, deliver."""
        self._route(batch)
        groups = batch.groups
        if groups and (batch.special or (self.router.any_kv and any(p.topic.config.kv is not None for p in groups))):
            admit_batch(batch)
        batch.now = self.clock.now_ns()
        if batch.any_msg_id and not batch.trusted:
            dedupe(batch)
        if self.router.any_refusing and groups:
            refuse(batch, self.counters)
        for p in groups:
            if p.log.volatile:
                self._within_memory_budget(batch)
                break
        part = batch.one_partition()
        if part is not None:
            res = self._append_whole(batch, part)
            if part.topic.trimming and part.topic.config.max_msgs_per_subject and batch.count > 1:
                trim_in_order(part, batch.first_offset, batch.subjects, self.retention.remove)
            else:
                if part.topic.config.max_msgs_per_subject:
                    self.enforce_max_msgs(part, batch.subjects)
                if part.topic.trimming:
                    trim(part, self.retention.remove)
            if part.schedule_of:
                for s in batch.subjects:
                    if s in part.schedule_of:  # (plain messages only on this path)
                        part.drop_schedule(part.schedule_of[s])
            # Subscribers, but none on these subjects (a client's reply inbox): no entries to build.
            if self.subs and not batch.quiet and any(map(self.subs.match, batch.subjects)):
                head = P.delivery_entry(part.topic.stream.id, part.topic.id, part.number)
                entries: list[Entry] = [(s, head, rec) for s, rec in zip(batch.subjects, _record_views(res))]
                if batch.reply is None:
                    self.subs.deliver(entries)
                else:
                    self._deliver_request(batch, entries)
            return
        self._append(batch)
        for a in batch.appended:
            topic = a.partition.topic
            if topic.trimming and topic.config.max_msgs_per_subject and len(a.subjects) > 1:
                trim_in_order(a.partition, a.result.first_offset, a.subjects, self.retention.remove)
                continue
            if topic.config.max_msgs_per_subject:
                self.enforce_max_msgs(a.partition, a.subjects)
            if a.partition.schedule_of:
                self._overwrite_schedules(batch, a)
            if topic.trimming:
                trim(a.partition, self.retention.remove)
        if batch.fresh:
            self._register_ids(batch)
        if batch.duplicates:
            self._duplicate_acks(batch)
        if batch.rollups:
            self._apply_rollups(batch)
        if batch.schedules and self.scheduler is not None:
            self.scheduler.after_append(batch.schedules, batch.now)
        for a in batch.appended:
            if a.last_offsets is not None:
                self.republisher.after_append(a.partition, a.result, a.last_offsets, a.epoch)
        self._deliver(batch)
        for i, err in batch.failed.items():
            batch.refuse(i, int(err.code), err.message)
        self.counters.publish_errors += len(batch.failed)

    def _route(self, batch: Batch) -> None:
        """Each message not refused yet to its partition (``batch.groups``, in batch
        order), to ``batch.unrouted`` when no topic captures its subject, or to
        ``batch.failed`` when the subject is invalid or its topic is sealed."""
        if self.router.any_transform:
            self._route_transformed(batch)
        else:
            self._route_plain(batch)
        groups = batch.groups
        for part in [p for p in groups if p.topic.config.sealed]:
            err = _Sealed(f"topic {part.topic.full_name} is sealed: no message goes in")
            for i in groups.pop(part):
                batch.failed[i] = err

    def _route_transformed(self, batch: Batch) -> None:
        """:meth:`_route_plain` where some topic has a subject transform: a message
        it changes is stored under the new subject (its body rewritten at the end of
        the batch's bytes, the subject as published kept in ``batch.originals``)."""
        route_stored = self.router.route_stored
        groups, failed, unrouted, subjects = batch.groups, batch.failed, batch.unrouted, batch.subjects
        rewritten: list[bytes] = []
        end = len(batch.data)
        for i in range(batch.count):
            if failed and i in failed:
                continue
            subj = subjects[i]
            route, stored = route_stored(subj)
            if route.__class__ is Partition:
                groups.setdefault(route, []).append(i)
                if stored is not None:
                    if batch.originals is None:
                        batch.originals = {}
                    batch.originals[i] = subj
                    subjects[i] = stored
                    body = P.resubject_body(memoryview(batch.data)[batch.starts[i] : batch.ends[i]], stored)
                    batch.fields.pop(i, None)  # positions of the old body
                    batch.starts[i], batch.ends[i] = end, end + len(body)
                    end += len(body)
                    rewritten.append(body)
            elif route is NO_TOPIC:
                unrouted.append(i)
            else:
                assert isinstance(route, BrokerError)  # the subject is invalid
                failed[i] = route
        if rewritten:
            batch.data = b"".join((batch.data, *rewritten))

    def _route_plain(self, batch: Batch) -> None:
        cache = self.router.cache
        resolve = self.router.resolve
        groups = batch.groups
        failed = batch.failed
        unrouted = batch.unrouted
        subjects = batch.subjects
        for i in range(batch.count):  # (cheaper than enumerate)
            if failed and i in failed:
                continue
            subj = subjects[i]
            route = cache.get(subj)
            if route is None:
                route = resolve(subj)
            if route.__class__ is Partition:
                g = groups.get(route)
                if g is None:
                    groups[route] = g = []
                g.append(i)
            elif route is NO_TOPIC:
                unrouted.append(i)
            else:
                assert isinstance(route, BrokerError)  # the subject is invalid
                failed[i] = route

    def _memory_full(self) -> BrokerError:
        """The refusal of a publish the memory storage budget cannot hold."""
        budget = self.memory_budget
        return _MemoryFull(
            f"insufficient resources: the memory storage budget ([limits] memory_storage_bytes = "
            f"{budget.limit} bytes) is used up ({budget.used} bytes held by memory-storage topics)"
        )

    def _within_memory_budget(self, batch: Batch) -> None:
        """The messages for memory-storage partitions that the budget (``[limits]
        memory_storage_bytes``) cannot hold are refused (MEMORY_STORAGE_FULL; each
        group's first messages that fit are kept, in order), after one pass of the
        cleaner over the memory partitions has given back what removed records
        held."""
        budget = self.memory_budget
        starts, ends = batch.starts, batch.ends
        reclaimed = False
        for part, idx in list(batch.groups.items()):
            if not part.log.volatile:
                continue
            need = sum(ends[i] - starts[i] for i in idx) + _RECORD_HEAD * len(idx)
            if budget.fits(need):
                continue
            if not reclaimed and self.reclaim_memory is not None:
                reclaimed = True
                self.reclaim_memory()
                if budget.fits(need):
                    continue
            room = budget.limit - budget.used
            kept = 0
            for i in idx:
                n = ends[i] - starts[i] + _RECORD_HEAD
                if n > room:
                    break
                room -= n
                kept += 1
            err = self._memory_full()
            for i in idx[kept:]:
                batch.failed[i] = err
            self.counters.memory_storage_refused += len(idx) - kept
            if kept:
                batch.groups[part] = idx[:kept]
            else:
                del batch.groups[part]

    def _append_whole(self, batch: Batch, part: Partition) -> AppendResult:
        """Append the whole batch, in order, into ``part`` (message k of the batch at
        ``first_offset + k``), count it and schedule its TTLs in bulk, one insertion
        per distinct TTL."""
        n = batch.count
        flags: bytearray | None = None
        by_ttl: dict[int, list[int]] | None = None
        admitted = batch.admitted
        if admitted:
            by_ttl = {}
            for i, a in admitted.items():
                ttl = a.ttl
                if 0 < ttl < TTL_NEVER:
                    g = by_ttl.get(ttl)
                    if g is None:
                        by_ttl[ttl] = [i]
                    else:
                        g.append(i)
                if ttl == TTL_NEVER or a.flags:
                    if flags is None:
                        flags = bytearray(n)
                    flags[i] = flags_for(ttl, a.flags)
        res = part.append(batch.data, batch.starts, batch.ends, batch.subjects, batch.now, flags, batch.stamps or None)
        batch.epoch = self.committer.note_write(part.log)
        batch.whole = part
        first = batch.first_offset = res.first_offset
        counters = self.counters
        counters.messages_in += n
        counters.bytes_in += len(res.records)
        if by_ttl:
            for ttl, idx in by_ttl.items():
                by_ttl[ttl] = [first + i for i in idx]
        self.retention.after_append(part, res, None, by_ttl)
        return res

    def _append(self, batch: Batch) -> None:
        """Append each partition's share of the batch (``batch.appended``), count it,
        schedule its TTLs, and fill in the ack columns of what it stored."""
        batch.open_acks()
        batch.appended = appended = []
        batch.rollups = rollups = []
        subjects, starts, ends = batch.subjects, batch.starts, batch.ends
        admitted, stamps = batch.admitted, batch.stamps
        stream_ids, topic_ids, partitions, offsets = batch.stream_ids, batch.topic_ids, batch.partitions, batch.offsets
        counters = self.counters
        for part, idx in batch.groups.items():
            topic = part.topic
            gsubjects = [subjects[i] for i in idx]
            lasts = part.last_offsets(gsubjects) if topic.republisher is not None else None
            gflags = None
            gstamps = None
            if admitted:
                gflags = bytes(flags_for(a.ttl, a.flags) if (a := admitted.get(i)) else 0 for i in idx)
                if stamps:
                    gstamps = {k: st for k, i in enumerate(idx) if (st := stamps.get(i)) is not None}
            res = part.append(batch.data, [starts[i] for i in idx], [ends[i] for i in idx], gsubjects, batch.now, gflags, gstamps)
            epoch = self.committer.note_write(part.log)
            batch.epoch = max(batch.epoch, epoch)  # (0 for a memory partition: nothing to wait for)
            counters.messages_in += len(idx)
            counters.bytes_in += len(res.records)
            sid, tid, number = topic.stream.id, topic.id, part.number
            off = res.first_offset
            ttls: list[tuple[int, int]] = []
            for i in idx:
                stream_ids[i] = sid
                topic_ids[i] = tid
                partitions[i] = number
                offsets[i] = off
                a = admitted.get(i) if admitted else None
                if a is not None:
                    if 0 < a.ttl < TTL_NEVER:
                        ttls.append((off, a.ttl))
                    if a.rollup:
                        rollups.append((i, part, off, a.rollup))
                    if a.schedule:
                        batch.schedules.append((part, off, subjects[i], a.schedule, epoch))
                off += 1
            self.retention.after_append(part, res, ttls)
            appended.append(Appended(part, idx, gsubjects, res, lasts, epoch))

    @staticmethod
    def _overwrite_schedules(batch: Batch, a: Appended) -> None:
        """A message stored on a pending schedule's subject that is neither a schedule
        nor names one (``Nats-Scheduler``) ends that schedule (nats-server's
        ``removeSubject``)."""
        part, admitted = a.partition, batch.admitted
        for i, s in zip(a.indexes, a.subjects):
            if s in part.schedule_of and not ((adm := admitted.get(i)) is not None and adm.schedule):
                part.drop_schedule(part.schedule_of[s])

    def enforce_max_msgs(self, part: Partition, subjects: list[bytes]) -> None:
        """``max_msgs_per_subject``: each of ``subjects`` over the limit loses its
        oldest live messages. The deletions are deferred (recovery makes them again,
        ``Broker.open_topic_storage``) unless discard old also trims the partition:
        the two limits' removals depend on the order of the appends, which recovery
        does not see."""
        limit = part.topic.config.max_msgs_per_subject
        if limit:
            doomed = part.over_limit(subjects, limit)
            if doomed:
                self.retention.remove(part, doomed, R.MAX_MSGS_PER_SUBJECT, deferred=not part.topic.trimming)

    def _register_ids(self, batch: Batch) -> None:
        """The stored messages' ``Nats-Msg-Id`` go into their topics' tables."""
        assert batch.fresh is not None
        now, partitions, offsets = batch.now, batch.partitions, batch.offsets
        for (topic, msg_id), i in batch.fresh.items():
            topic.dedup.add(msg_id, now, partitions[i], offsets[i])

    def _duplicate_acks(self, batch: Batch) -> None:
        """Acks for duplicates: the original's place, status DUPLICATE_MESSAGE. The
        answer waits for everything written so far (the original may not be durable
        yet)."""
        dups = batch.duplicates
        assert dups is not None
        self.counters.duplicates += len(dups)
        partitions, offsets = batch.partitions, batch.offsets
        for i, (topic, original) in dups.items():
            if isinstance(original, int):
                partition, offset = partitions[original], offsets[original]
            else:
                partition, offset = original.partition, original.offset
            batch.stream_ids[i] = topic.stream.id
            batch.topic_ids[i] = topic.id
            partitions[i] = partition
            offsets[i] = offset
            msg_id = batch.admitted[i].msg_id
            assert msg_id is not None  # a duplicate had an id
            text = msg_id.decode(errors="replace")
            message = f"duplicate message: Nats-Msg-Id {text!r} is stored at partition {partition} offset {offset}"
            batch.refuse(i, _DUPLICATE, message)
            topic.duplicates += 1
        if not batch.epoch and self.committer.acks_wait:
            batch.epoch = self.committer.durable_at()

    def _apply_rollups(self, batch: Batch) -> None:
        """``Nats-Rollup``, in publish order: ``sub`` removes the earlier messages of
        the subject, ``all`` every earlier message of the topic (in other partitions,
        everything stored before it, so not the batch's later messages); see
        "Rollup" in ``docs/semantics.md``."""
        groups, offsets, subjects = batch.groups, batch.offsets, batch.subjects
        for i, part, off, kind in sorted(batch.rollups, key=lambda r: r[0]):
            if not part.log.is_live(off):
                continue  # a later rollup of this batch took it already
            if kind == ROLLUP_SUB:
                self.retention.remove(part, _rolled_up(part, subjects[i], off), R.ROLLUP)
                continue
            for q in part.topic.partitions:
                later = [offsets[j] for j in groups.get(q, ()) if j > i]
                limit = later[0] if later else q.log.next_offset
                doomed = [o for o in q.live_offsets(except_offset=off) if o < limit]
                if doomed:
                    self.retention.remove(q, doomed, R.ROLLUP)

    def _deliver(self, batch: Batch) -> None:
        """The stored messages and the unrouted ones (acked NO_TOPIC_FOR_SUBJECT,
        counted) to the matching core subscriptions, in batch order."""
        unrouted = batch.unrouted
        subjects = batch.subjects
        if unrouted:
            self.counters.messages_unrouted += len(unrouted)
            for i in unrouted:
                batch.refuse(i, _NO_TOPIC, f"no topic captures subject {subjects[i].decode(errors='replace')!r}")
        if not self.subs or batch.quiet:
            return
        entries: list[Entry | None] = [None] * batch.count
        originals = batch.originals
        for a in batch.appended:
            topic = a.partition.topic
            head = P.delivery_entry(topic.stream.id, topic.id, a.partition.number)
            for i, rec in zip(a.indexes, _record_views(a.result)):
                if originals and i in originals:
                    # A core subscriber gets it on the subject it was published on (as
                    # from nats-server, where the stream's capture is one more subscriber).
                    subject = originals[i]
                    body = P.resubject_body(memoryview(batch.data)[batch.starts[i] : batch.ends[i]], subject)
                    entries[i] = (subject, head, P.encode_record(batch.offsets[i], a.result.timestamp, body))
                else:
                    entries[i] = (subjects[i], head, rec)
        if unrouted:
            head = _NOT_STORED
            data, starts, ends, now = batch.data, batch.starts, batch.ends, batch.now
            for i in unrouted:
                entries[i] = (subjects[i], head, P.encode_record(0, now, data[starts[i] : ends[i]]))
        if batch.reply is None:
            self.subs.deliver([e for e in entries if e is not None])
        else:
            self._deliver_request(batch, [e for e in entries if e is not None])

    def _deliver_request(self, batch: Batch, entries: list[Entry]) -> None:
        """A request's messages to the core subscriptions, with its reply subject;
        how many took them goes into ``batch.reached``."""
        assert isinstance(batch, RequestBatch) and batch.reply is not None
        batch.reached = self.subs.deliver_request(entries, batch.reply)


def _rolled_up(part: Partition, subject: bytes, before: int) -> list[int]:
    """The live offsets below ``before`` that a subject roll-up on ``subject``
    removes: its own, or, when it has wildcard tokens, those of every subject it
    matches as a filter (nats-server's roll-up is a purge by that subject, which
    nats-py's ``kv.purge("a.*")`` relies on)."""
    text = subject.decode(errors="replace")
    if P.is_literal(text):
        return part.subject_offsets(subject, before=before)
    return sorted(o for s in part.subjects_matching(text) for o in part.subject_offsets(s, before=before))
