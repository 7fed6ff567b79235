"""Publishing: the PUBLISH command, the broker's hot path, and what it applies on the
way in (admission of headers and TTLs, ``Nats-Rollup``, ``max_msgs_per_subject``).

A batch is routed subject by subject to partitions, appended, counted, scheduled for
expiry and delivered to core subscriptions. ``publish`` never awaits; its reply is
``(acks, epoch)`` when it must wait for the group commit. Keep this path free of extra
per-call layers: it is bound once into ``Broker.sync_handlers``.
"""

from __future__ import annotations

from typing import Any

import protocol as P
from protocol import RemovalReason as R
from protocol import TTL_NEVER, TTL_NONE, BrokerError, ErrorCode, error_class, scan_bodies

from ._admission import ROLLUP_SUB, SELF_CONTAINED, WANTED, Admission, admit
from ._clock import Clock
from ._commit import Committer, Reply
from ._dedup import Original
from ._republish import Republisher
from ._retention import Retention
from ._routing import NO_TOPIC, Router
from ._stats import Counters
from ._subscriptions import SubscriptionIndex
from ._topics import Partition, Topic, flags_for

_DUPLICATE = int(ErrorCode.DUPLICATE_MESSAGE)
_PUBLISH = int(P.Command.PUBLISH)
#: Where the bodies of a PUBLISH payload start (after u8 flags and u32 count).
_BODY_POS = 5
_TtlDisabled = error_class(ErrorCode.MSG_TTL_DISABLED)
#: id(KV bucket config) -> (the config, the admission of a message without TTL field,
#: flags or headers, its stamp): the same for each such message (a plain KV put), so
#: it is worked out once per config object (an update of the topic makes a new one).
_plain_kv: dict[int, tuple[Any, Admission, tuple[int, int] | None]] = {}

__all__ = ["Publisher"]


def _record_views(res: Any) -> list[memoryview]:
    """The records of an append, one view each."""
    records = memoryview(res.records)
    positions = res.positions
    ends = positions[1:] + [len(records)]
    return [records[p:e] for p, e in zip(positions, ends)]


def _check_expected_last(part: Partition, subject: bytes, expected: int, written: set[bytes]) -> None:
    st = part.index.get(subject)
    last = st.last if st is not None and st.count else 0
    if subject in written or last != expected:
        raise error_class(ErrorCode.WRONG_LAST_SEQUENCE)(f"wrong last sequence: {last}")


def _check_expects(part: Partition, expects: tuple[bytes | None, int | None, bytes | None], written: set[bytes]) -> None:
    """JetStream's ``Nats-Expected-Stream`` (the topic's name, ``stream/topic``, or the
    NATS stream name the topic was created with), ``Nats-Expected-Last-Sequence``
    (the partition's last offset; an earlier message of the same batch into the
    partition changes it) and ``Nats-Expected-Last-Msg-Id`` (the last id the
    topic's de-duplication holds), with the server's descriptions."""
    stream, seq, msg_id = expects
    topic = part.topic
    if stream is not None:
        nats = topic.config.nats or {}
        names = {topic.name, topic.full_name, nats.get("name")}
        if topic.config.kv is not None:
            names.add("KV_" + topic.name)
        if stream.decode(errors="replace") not in names:
            raise error_class(ErrorCode.WRONG_EXPECTED_STREAM)("expected stream does not match")
    if seq is not None:
        last = part.log.last_offset
        if written or last != seq:
            raise error_class(ErrorCode.WRONG_LAST_SEQUENCE)(f"wrong last sequence: {last}")
    if msg_id is not None:
        last_id = topic.dedup.last
        if last_id != msg_id:
            text = "" if last_id is None else last_id.decode(errors="replace")
            raise error_class(ErrorCode.WRONG_LAST_MSG_ID)(f"wrong last msg ID: {text}")






def _framed(starts: list[int], counts: list[int], positions: list[int]) -> bool:
    """Each request's bodies begin where its bytes do (so no body of one request
    was read out of another's bytes)."""
    i = 0
    for count, pos in zip(counts, positions):
        if not count or starts[i] != pos:
            return False
        i += count
    return True


def _dedupe(
    groups: dict[Partition, list[int]], admitted: dict[int, Admission], now: int
) -> tuple[dict[int, tuple[Topic, Original | int]] | None, dict[tuple[Topic, bytes], int] | None]:
    """``Nats-Msg-Id`` de-duplication (``_dedup.py``), in batch order: returns the
    duplicates (index -> the original stored earlier, or the index of the same
    batch's earlier message with that id), which leave their groups, and the ids to
    register once the batch is appended ((topic, id) -> index)."""
    cands = [i for i, a in admitted.items() if a.msg_id is not None]
    if not cands:
        return None, None
    cands.sort()
    wanted = set(cands)
    part_of = {i: part for part, idx in groups.items() for i in idx if i in wanted}
    dups: dict[int, tuple[Topic, Original | int]] = {}
    fresh: dict[tuple[Topic, bytes], int] = {}
    pruned: set[Topic] = set()
    for i in cands:
        topic = part_of[i].topic
        window = topic.config.duplicate_window
        table = topic.dedup
        if topic not in pruned:
            table.prune(now, window)
            pruned.add(topic)
        msg_id: bytes = admitted[i].msg_id  # type: ignore[assignment]
        key = (topic, msg_id)
        first = fresh.get(key)
        if first is not None:
            dups[i] = (topic, first)
            continue
        original = table.get(msg_id, now, window)
        if original is not None:
            dups[i] = (topic, original)
            continue
        fresh[key] = i
    if dups:
        for part, idx in list(groups.items()):
            keep = [i for i in idx if i not in dups]
            if len(keep) != len(idx):
                if keep:
                    groups[part] = keep
                else:
                    del groups[part]
    return dups, fresh






def _admit(
    data: bytes,
    subjects: list[bytes],
    starts: list[int],
    ends: list[int],
    special: list[int],
    ttl_only: dict[int, int] | None,
    headed: dict[int, tuple[int, bytes]] | None,
    failed: dict[int, BrokerError],
    groups: dict[Partition, list[int]],
    admitted: dict[int, Admission],
    fields: dict[int, P.BodyFields],
    hvs: dict[int, dict[bytes, bytes]],
    stamps: dict[int, tuple[int, int]],
) -> tuple[bytes, list[int], list[int], int]:
    """Admit the special messages, and every message of a KV bucket, into their
    topics (``_admission.py``): refused ones move to ``failed`` and leave their
    group; the others land in ``admitted``. A body whose TTL field or flags change
    (and nothing else) gets an entry in ``stamps`` (index -> ``(ttl, flags)``,
    written as its record is built); rewritten bodies (a new header block) are
    appended to the batch's bytes and their bounds moved there. Returns the batch's
    ``(data, starts, ends)`` and what else admission found: 1 a rollup, 2 a
    ``Nats-Msg-Id`` to de-duplicate on (or-ed).

    A body marked only by a TTL field (``ttl_only``) has nothing to decode: only the
    topic's TTL rules apply (the minimum-TTL rule may raise the field), and
    messages with the same TTL share one :class:`Admission`. So do messages with the
    same TTL field and header block (``headed``) whose bodies admission leaves alone.

    ``Nats-Expected-Last-Subject-Sequence`` is checked here against the subject's
    last offset when the batch arrived; a message whose subject an earlier message
    of the same batch wrote fails it (compare-and-set is one message at a time)."""
    todo = set(special).difference(failed)
    extra = 0
    rewritten: list[bytes] = []
    new_starts: list[int] = starts
    new_ends: list[int] = ends
    pos = len(data)
    view = memoryview(data)
    for part, idx in list(groups.items()):
        cfg = part.topic.config
        kv = cfg.kv is not None
        if not kv and todo.isdisjoint(idx):
            continue
        keep = []
        written: set[bytes] = set()
        shared: dict[int, tuple[Admission, tuple[int, int] | None]] = {}  # field TTL -> admission, stamp
        # (TTL, headers) -> the same, and whether nothing is left to check per message
        same: dict[tuple[int, bytes], tuple[Admission, tuple[int, int] | None, bool]] = {}
        sdm = cfg.subject_delete_marker_ttl if cfg.max_msgs_per_subject != 1 else 0
        for i in idx:
            if ttl_only and i in ttl_only and i in todo:
                ttl = ttl_only[i]
                got = shared.get(ttl)
                if got is None:
                    if not cfg.allow_msg_ttl:
                        failed[i] = _TtlDisabled("per-message TTL is disabled")
                        continue
                    # The minimum-TTL rule (SEMANTICS 2.3), as admit() applies it.
                    eff = sdm if sdm and ttl != TTL_NEVER and 0 < ttl < sdm else ttl
                    got = shared[ttl] = (Admission(eff, 0, 0, None), (eff, 0) if eff != ttl else None)
                a, stamp = got
                admitted[i] = a
                if stamp is not None:
                    stamps[i] = stamp
                written.add(subjects[i])
                keep.append(i)
                continue
            if kv or i in todo:
                h = headed.get(i) if headed else None
                if h is not None:
                    got = same.get(h)  # type: ignore[arg-type]
                    if got is not None and got[2]:  # as a ttl_only message
                        admitted[i] = got[0]
                        if got[1] is not None:
                            stamps[i] = got[1]
                        written.add(subjects[i])
                        keep.append(i)
                        continue
                else:
                    got = _plain_kv_admission(cfg) if i not in todo else None
                try:
                    if got is None:
                        if h is not None:
                            field_ttl, block = h
                        else:
                            f = fields.get(i) or P.body_fields(data, starts[i])
                            field_ttl, block = f.ttl, f.headers
                        a = admit(view[starts[i] : ends[i]], field_ttl, block, cfg, hvs.get(i), restamp=False)
                        stamp = (a.ttl, a.flags) if a.body is None and (a.ttl != field_ttl or a.flags) else None
                        if h is not None and a.body is None:
                            simple = a.expected_last is None and a.expects is None and not a.rollup and a.msg_id is None
                            same[h] = (a, stamp, simple)
                    else:
                        a, stamp = got[0], got[1]
                    if a.expected_last is not None:
                        _check_expected_last(part, subjects[i], a.expected_last, written)
                    if a.expects is not None:
                        _check_expects(part, a.expects, written)
                except BrokerError as err:
                    failed[i] = err
                    continue
                admitted[i] = a
                written.add(subjects[i])
                if a.rollup:
                    extra |= 1
                if a.msg_id is not None:
                    extra |= 2
                if a.body is None:
                    if stamp is not None:
                        stamps[i] = stamp
                else:
                    if new_starts is starts:
                        new_starts, new_ends = list(starts), list(ends)
                    new_starts[i] = pos
                    pos += len(a.body)
                    new_ends[i] = pos
                    rewritten.append(a.body)
            keep.append(i)
        if keep:
            groups[part] = keep
        else:
            del groups[part]
    view.release()
    if rewritten:
        data = b"".join((data, *rewritten))
    return data, new_starts, new_ends, extra


def _plain_kv_admission(cfg: Any) -> tuple[Admission, tuple[int, int] | None]:
    """The admission (and stamp) of a message with no TTL field, flags or headers
    into the KV bucket configured by ``cfg``."""
    got = _plain_kv.get(id(cfg))
    if got is None or got[0] is not cfg:
        if len(_plain_kv) >= 1024:
            _plain_kv.clear()
        a = admit(b"", TTL_NONE, b"", cfg, {}, restamp=False)
        got = _plain_kv[id(cfg)] = (cfg, a, (a.ttl, a.flags) if a.ttl or a.flags else None)
    return got[1], got[2]


class Publisher:
    """The broker's one publish path: routes a batch subject by subject, admits it,
    appends it, counts it, schedules its expiries, applies rollups and the
    per-subject limit, republishes it and delivers it to core subscriptions.

    Args:
        max_payload: ``[limits] max_payload_bytes``.
        router, clock, counters, subs, committer, retention, republisher: the
            broker's parts a publish goes through.
    """

    def __init__(
        self, max_payload: int, router: Router, clock: Clock, counters: Counters, subs: SubscriptionIndex,
        committer: Committer, retention: Retention, republisher: Republisher,
    ) -> None:
        self.max_payload = max_payload
        self.router = router
        self.clock = clock
        self.counters = counters
        self.subs = subs
        self.committer = committer
        self.retention = retention
        self.republisher = republisher

    def publish_bodies(self, bodies: list[bytes]) -> None:
        """Message bodies the broker built itself (republished copies), without acks."""
        self.publish(None, P.Publish.from_bodies(bodies, P.PUBLISH_NO_ACK), trusted=True)

    def publish(
        self, session: Any, cmd: P.Publish, trusted: bool = False,
        frames: tuple[list[int], list[int], list[int]] | None = None, stored: bool = False,
    ) -> Reply | tuple[bytes, int] | tuple[int, int] | None:
        """A batch of messages (``trusted``: bodies the broker built itself, such as
        republished copies, whose flags, sizes and headers need no checking).

        ``stored``: when the whole batch is stored, in order, into one partition (the
        common case) the reply is ``(first_offset, epoch)``, message k at
        ``first_offset + k``, instead of its acks: the NATS listener makes each PubAck
        from the offset, and would only decode acks encoded for it. Any other outcome
        replies as without it.

        ``frames``: ``cmd`` joins the bodies of several PUBLISH requests (see
        :func:`publish_frames`): their correlation ids, message counts and the
        positions of their first bodies. The reply is then ``(frames, epoch)``, the
        requests' response frames joined, or None (nothing done) when the requests must
        go one at a time instead."""
        data: bytes = cmd.data
        n = cmd.count
        if frames is None:
            scan = scan_bodies(data, cmd.body_pos, n, self.max_payload)
        else:
            try:
                scan = scan_bodies(data, cmd.body_pos, n, self.max_payload)
            except BrokerError:
                return None  # a malformed request among them: each gets its own answer
        subjects = scan.subjects
        starts, ends = scan.starts, scan.ends
        special = scan.special
        ttl_only = scan.ttl_only
        headed = scan.headed
        if frames is not None and not _framed(starts, frames[1], frames[2]):
            return None
        fields: dict[int, P.BodyFields] = {}
        hvs: dict[int, dict[bytes, bytes]] = {}
        failed: dict[int, BrokerError] = (
            self._check_basic(data, starts, special, ttl_only, headed, fields, hvs) if special and not trusted else {}
        )
        if frames is not None and hvs and not SELF_CONTAINED.issuperset(set().union(*hvs.values())):
            return None  # a compare-and-set, rollup or de-duplication header: one request at a time

        cache = self.router.cache
        resolve = self.router.resolve
        groups: dict[Partition, list[int]] = {}
        unrouted: list[int] = []
        for i in range(n):
            if failed and i in failed:
                continue
            subj = subjects[i]
            route = cache.get(subj)
            if route is None:
                route = resolve(subj)
            if route.__class__ is Partition:
                g = groups.get(route)  # type: ignore[arg-type]
                if g is None:
                    groups[route] = g = []  # type: ignore[index]
                g.append(i)
            elif route is NO_TOPIC:
                unrouted.append(i)
            else:
                failed[i] = route  # type: ignore[assignment]
        admitted: dict[int, Admission] = {}
        stamps: dict[int, tuple[int, int]] = {}
        extra = 0  # admission found a rollup (1) or a Nats-Msg-Id (2)
        if groups and (special or (self.router.any_kv and any(p.topic.config.kv is not None for p in groups))):
            data, starts, ends, extra = _admit(
                data, subjects, starts, ends, special, ttl_only, headed, failed, groups, admitted, fields, hvs, stamps
            )

        now = self.clock.now_ns()
        dups: dict[int, tuple[Topic, Original | int]] | None = None
        fresh: dict[tuple[Topic, bytes], int] | None = None
        if extra & 2 and not trusted:
            dups, fresh = _dedupe(groups, admitted, now)
        counters = self.counters
        delivering = len(self.subs) > 0
        if len(groups) == 1 and not failed and not unrouted and not extra and next(iter(groups)).topic.republisher is None:
            # Everything into one partition, in order: the common case (message k of the
            # batch is stored at first_offset + k). TTLs go to the deadline structure in
            # bulk, one insertion per distinct TTL.
            (part, _), = groups.items()
            flags: bytearray | None = None
            by_ttl: dict[int, list[int]] | None = None
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
            res = part.append(data, starts, ends, subjects, now, flags, stamps or None)
            epoch = self.committer.note_write(part.log)
            counters.messages_in += n
            counters.bytes_in += len(res.records)
            if by_ttl:
                first = res.first_offset
                for ttl, idx in by_ttl.items():
                    by_ttl[ttl] = [first + i for i in idx]
            self.retention.after_append(part, res, by_ttl=by_ttl)
            self.enforce_max_msgs(part, subjects)
            # Subscribers, but none on these subjects (a client's reply inbox): no entries to build.
            if delivering and any(map(self.subs.match, subjects)):
                head = P.delivery_entry(part.topic.stream.id, part.topic.id, part.number)
                self.subs.deliver([(s, head, rec) for s, rec in zip(subjects, _record_views(res))])
            if cmd.no_ack:
                return b""
            if stored:
                return res.first_offset, epoch
            topic = part.topic
            sid, tid, number, first = topic.stream.id, topic.id, part.number, res.first_offset
            if frames is not None:
                return P.uniform_ack_frames(zip(frames[0], frames[1]), sid, tid, number, first), epoch
            return P.encode_uniform_acks(sid, tid, number, first, n), epoch

        epoch = 0
        stream_ids = [0] * n
        topic_ids = [0] * n
        partitions = [0] * n
        offsets = [0] * n
        statuses = [0] * n
        errors: dict[int, str] = {}
        entries: list[tuple[bytes, bytes, memoryview | bytes] | None] | None = [None] * n if delivering else None
        rollups: list[tuple[int, Partition, int, int]] = []
        republish: list[tuple[Partition, Any, list[int], int]] = []
        for part, idx in groups.items():
            gsubjects = [subjects[i] for i in idx]
            lasts = part.last_offsets(gsubjects) if part.topic.republisher is not None else None
            gflags = None
            gstamps = None
            if admitted:
                gflags = bytes(flags_for(a.ttl, a.flags) if (a := admitted.get(i)) else 0 for i in idx)
                if stamps:
                    gstamps = {k: st for k, i in enumerate(idx) if (st := stamps.get(i)) is not None}
            res = part.append(data, [starts[i] for i in idx], [ends[i] for i in idx], gsubjects, now, gflags, gstamps)
            epoch = self.committer.note_write(part.log)
            counters.messages_in += len(idx)
            counters.bytes_in += len(res.records)
            topic = part.topic
            off = res.first_offset
            ttls: list[tuple[int, int]] = []
            for i in idx:
                stream_ids[i] = topic.stream.id
                topic_ids[i] = topic.id
                partitions[i] = part.number
                offsets[i] = off
                a = admitted.get(i) if admitted else None
                if a is not None:
                    if 0 < a.ttl < TTL_NEVER:
                        ttls.append((off, a.ttl))
                    if a.rollup:
                        rollups.append((i, part, off, a.rollup))
                off += 1
            self.retention.after_append(part, res, ttls)
            self.enforce_max_msgs(part, gsubjects)
            if lasts is not None:
                republish.append((part, res, lasts, epoch))
            if entries is not None:
                head = P.delivery_entry(topic.stream.id, topic.id, part.number)
                for i, rec in zip(idx, _record_views(res)):
                    entries[i] = (subjects[i], head, rec)
        if fresh:
            for (topic, msg_id), i in fresh.items():
                topic.dedup.add(msg_id, now, partitions[i], offsets[i])
        if dups:
            self._duplicate_acks(dups, admitted, stream_ids, topic_ids, partitions, offsets, statuses, errors)
            if not epoch and self.committer.acks_wait:
                epoch = self.committer.durable_at()  # the original may not be durable yet
        if rollups:
            self._apply_rollups(rollups, subjects, groups, offsets)
        for part, res, lasts, at in republish:
            self.republisher.after_append(part, res, lasts, at)
        if unrouted:
            counters.messages_unrouted += len(unrouted)
            head = P.delivery_entry(0, 0, 0)
            for i in unrouted:
                if not cmd.no_ack:
                    statuses[i] = ErrorCode.NO_TOPIC_FOR_SUBJECT
                    errors[i] = f"no topic captures subject {subjects[i].decode(errors='replace')!r}"
                if entries is not None:
                    entries[i] = (subjects[i], head, P.encode_record(0, now, data[starts[i] : ends[i]]))
        if entries is not None:
            self.subs.deliver([e for e in entries if e is not None])
        for i, err in failed.items():
            statuses[i] = int(err.code)
            errors[i] = err.message
        counters.publish_errors += len(failed)
        if cmd.no_ack:
            return b""
        if frames is not None:
            out = []
            a = 0
            for corr, count in zip(frames[0], frames[1]):
                b = a + count
                errs = {i - a: e for i, e in errors.items() if a <= i < b} if errors else {}
                payload = P.Acks(stream_ids[a:b], topic_ids[a:b], partitions[a:b], offsets[a:b], statuses[a:b], errs).encode()
                out.append(P.encode_frame(_PUBLISH, P.FLAG_RESPONSE, corr, 0, payload))
                a = b
            return b"".join(out), epoch
        payload = P.Acks(stream_ids, topic_ids, partitions, offsets, statuses, errors).encode()
        return (payload, epoch) if epoch else payload

    def publish_frames(self, session: Any, requests: list[tuple[int, bytes, int]]) -> tuple[bytes, int] | None:
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
        joined = P.Publish(sum(counts), b"".join(bodies), 0)
        return self.publish(session, joined, frames=(corrs, counts, positions))  # type: ignore[return-value]

    def _duplicate_acks(
        self,
        dups: dict[int, tuple[Topic, Original | int]],
        admitted: dict[int, Admission],
        stream_ids: list[int],
        topic_ids: list[int],
        partitions: list[int],
        offsets: list[int],
        statuses: list[int],
        errors: dict[int, str],
    ) -> None:
        """Acks for duplicates: the original's place, status DUPLICATE_MESSAGE."""
        self.counters.duplicates += len(dups)
        for i, (topic, original) in dups.items():
            if isinstance(original, int):
                partition, offset = partitions[original], offsets[original]
            else:
                partition, offset = original.partition, original.offset
            stream_ids[i] = topic.stream.id
            topic_ids[i] = topic.id
            partitions[i] = partition
            offsets[i] = offset
            statuses[i] = _DUPLICATE
            msg_id = admitted[i].msg_id.decode(errors="replace")  # type: ignore[union-attr]
            errors[i] = f"duplicate message: Nats-Msg-Id {msg_id!r} is stored at partition {partition} offset {offset}"
            topic.duplicates += 1

    def _check_basic(
        self, data: bytes, starts: list[int], special: list[int], ttl_only: dict[int, int] | None,
        headed: dict[int, tuple[int, bytes]] | None, fields: dict[int, P.BodyFields], hvs: dict[int, dict[bytes, bytes]],
    ) -> dict[int, BrokerError]:
        """Checks that need no topic, for bodies with flags, headers or a big payload
        (bodies marked only by a TTL field need none). Their fields land in ``fields``,
        and the header values admission reads in ``hvs``, for admission to reuse. A
        header block is checked once per batch however many bodies carry it."""
        failed: dict[int, BrokerError] = {}
        checked: dict[bytes, dict[bytes, bytes] | BrokerError] = {}
        for i in special:
            if ttl_only and i in ttl_only:
                continue
            if headed and (h := headed.get(i)) is not None:
                block = h[1]
                got = checked.get(block)
                if got is None:
                    try:
                        got = P.checked_header_values(block, WANTED)
                    except BrokerError as err:
                        got = err
                    checked[block] = got
                if got.__class__ is dict:
                    hvs[i] = got  # type: ignore[assignment]
                else:
                    failed[i] = got  # type: ignore[assignment]
                continue
            f = fields[i] = P.body_fields(data, starts[i])
            if f.flags:
                failed[i] = error_class(ErrorCode.INVALID_MESSAGE_FLAGS)(
                    f"message flags {f.flags:#x} are reserved for the broker; publish with flags 0"
                )
            elif f.payload_len > self.max_payload:
                failed[i] = error_class(ErrorCode.PAYLOAD_TOO_LARGE)(
                    f"payload of {f.payload_len} bytes exceeds the maximum of {self.max_payload} bytes"
                )
            elif f.headers:
                try:
                    hvs[i] = P.checked_header_values(f.headers, WANTED)
                except BrokerError as err:
                    failed[i] = err
        return failed

    def _apply_rollups(
        self, rollups: list[tuple[int, Partition, int, int]], subjects: list[bytes], groups: dict[Partition, list[int]],
        offsets: list[int],
    ) -> None:
        """``Nats-Rollup`` (decision 10.7), in publish order: ``sub`` removes the earlier
        messages of the subject, ``all`` every earlier message of the topic (in other
        partitions, everything stored before it, so not the batch's later messages)."""
        for i, part, off, kind in sorted(rollups, key=lambda r: r[0]):
            if not part.log.is_live(off):
                continue  # a later rollup of this batch took it already
            if kind == ROLLUP_SUB:
                self.retention.remove(part, part.subject_offsets(subjects[i], before=off), R.ROLLUP)
                continue
            for q in part.topic.partitions:
                later = [offsets[j] for j in groups.get(q, ()) if j > i]
                limit = later[0] if later else q.log.next_offset
                doomed = [o for o in q.live_offsets(except_offset=off) if o < limit]
                if doomed:
                    self.retention.remove(q, doomed, R.ROLLUP)

    def enforce_max_msgs(self, part: Partition, subjects: list[bytes]) -> None:
        limit = part.topic.config.max_msgs_per_subject
        if limit:
            doomed = part.over_limit(subjects, limit)
            if doomed:
                self.retention.remove(part, doomed, R.MAX_MSGS_PER_SUBJECT)
