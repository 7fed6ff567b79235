"""Admission: what the publish path checks and decides for each message before it is
stored, as steps over a :class:`~._batch.Batch`.

* :func:`check`: what needs no topic (reserved flags, the payload limit, the header
  rules), for the bodies the scan marked;
* :func:`admit_batch`: each marked message, and every message of a KV bucket,
  against its topic (:func:`admit`, then the compare-and-set headers against the
  partition);
* :func:`dedupe`: ``Nats-Msg-Id`` against the topic's duplicate window (``_dedup.py``).

Only messages that the publish scan marks *special* (a TTL field, flags, headers or
a big payload) are checked; plain messages go straight to storage. :func:`admit`
runs the checks in the NATS server's order (``processJetStreamMsg``), with
ttlbroker's choices where the server's behaviour is not followed (each is described
in ``docs/semantics.md``, under "Per-message TTL", "Rollup" and "De-duplication"):

0. a ``Nats-Batch-Id`` header (an ADR-50 atomic batch): ATOMIC_PUBLISH_DISABLED; a
   ``Nats-Incr`` header (an ADR-49 counter): MSG_COUNTER_DISABLED (ttlbroker has
   neither; nats-server's answer to a stream that does not allow them);
1. a TTL (field or ``Nats-TTL`` header) on a topic without ``allow_msg_ttl``:
   MSG_TTL_DISABLED, before the value is even looked at (so an invalid TTL there is
   MSG_TTL_DISABLED too);
2. a ``Nats-Rollup`` header on a topic without ``allow_rollup``: ROLLUP_DENIED; a
   value other than ``sub`` or ``all``: INVALID_ROLLUP;
3. an unparsable or sub-second ``Nats-TTL``: INVALID_MSG_TTL; so is a TTL field and
   a header that disagree (a client can send both; they must say the same thing);
4. the minimum-TTL rule: with subject delete markers on and ``max_msgs_per_subject``
   other than 1, a TTL below the marker TTL is raised to it (``never`` is not), and a
   ``Nats-TTL`` header is replaced by one with the integer seconds, appended at the
   end of the header block.

Then, for a topic with a ``duplicate_window``, the message's ``Nats-Msg-Id`` is
returned for :func:`dedupe` to look up: only a message that passes every check above
(and the compare-and-set headers) can be a duplicate or register its id. A message
carrying ``TTLB-Hops`` (a republished copy) registers no id.

The effective TTL is written into the record's TTL field, so storage, recovery and
the export read one field and never parse headers again. Headers are stored as sent
(or as rewritten by rule 4).
"""

from __future__ import annotations

import json

import protocol as P
from protocol.nats import schedule as S
from protocol import (
    FLAG_NO_MARKER,
    HOPS_HEADER,
    FLAG_TOMBSTONE,
    TTL_INVALID,
    TTL_NEVER,
    TTL_NONE,
    BrokerError,
    ErrorCode,
    error_class,
    header_values,
    parse_ttl,
    replace_header,
    restamp_body,
)

from ._batch import Admission, Batch
from ._dedup import MSG_ID, Original
from ._topic_config import TopicConfig
from ._topics import Partition, Topic

__all__ = [
    "Admission", "admit", "admit_batch", "check", "dedupe", "self_contained", "WANTED", "SELF_CONTAINED",
    "ROLLUP_NONE", "ROLLUP_SUB", "ROLLUP_ALL",
]

ROLLUP_NONE = 0
ROLLUP_SUB = 1
ROLLUP_ALL = 2

_TTL = b"Nats-TTL"
_ROLLUP = b"Nats-Rollup"
_KV_OP = b"KV-Operation"
_MARKER_REASON = b"Nats-Marker-Reason"
_EXPECTED_LAST = b"Nats-Expected-Last-Subject-Sequence"
_EXPECTED_STREAM = b"Nats-Expected-Stream"
_EXPECTED_SEQ = b"Nats-Expected-Last-Sequence"
_EXPECTED_MSG_ID = b"Nats-Expected-Last-Msg-Id"
_HOPS = HOPS_HEADER.encode()
#: ADR-49 counters and ADR-50 atomic batches, which ttlbroker refuses (``docs/semantics.md``).
_INCR = b"Nats-Incr"
_BATCH_ID = b"Nats-Batch-Id"
_WANTED = frozenset(
    (_TTL, _ROLLUP, _KV_OP, _MARKER_REASON, _EXPECTED_LAST, MSG_ID, _HOPS, _EXPECTED_STREAM, _EXPECTED_SEQ, _EXPECTED_MSG_ID,
     _INCR, _BATCH_ID)
)
#: The headers admission reads.
WANTED = _WANTED
#: Those of them whose effect depends on nothing but the message and its topic (not
#: on what the messages before it in the same batch wrote, as a compare-and-set, a
#: rollup or a de-duplication id does): requests whose messages carry no others may
#: be joined into one batch (``Publisher.publish_frames``).
SELF_CONTAINED = frozenset((_TTL, _KV_OP, _MARKER_REASON))
_ROLLUPS = {b"sub": ROLLUP_SUB, b"all": ROLLUP_ALL}
_WANTED = _WANTED | S.SCHEDULE_HEADERS
WANTED = _WANTED
#: ``Admission.schedule``: the message is a schedule (``Nats-Schedule``); it asks for
#: the schedule on its ``Nats-Scheduler`` subject to be removed (``Nats-Schedule-Next:
#: purge``, a client's or a one-off's produced message); it is a repeating
#: schedule's produced message (``Nats-Schedule-Next: <time>``).
SCHEDULE, SCHEDULE_PURGE, SCHEDULE_PRODUCED = 1, 2, 3

_SchedDisabled = error_class(ErrorCode.SCHEDULES_DISABLED)
_SchedPattern = error_class(ErrorCode.INVALID_SCHEDULE_PATTERN)
_SchedTarget = error_class(ErrorCode.INVALID_SCHEDULE_TARGET)
_SchedTtl = error_class(ErrorCode.INVALID_SCHEDULE_TTL)
_SchedRollup = error_class(ErrorCode.INVALID_SCHEDULE_ROLLUP)
_SchedSource = error_class(ErrorCode.INVALID_SCHEDULE_SOURCE)
_Scheduler = error_class(ErrorCode.INVALID_SCHEDULER)
_SchedZone = error_class(ErrorCode.INVALID_SCHEDULE_TIME_ZONE)

_Disabled = error_class(ErrorCode.MSG_TTL_DISABLED)
_Invalid = error_class(ErrorCode.INVALID_MSG_TTL)
_RollupDenied = error_class(ErrorCode.ROLLUP_DENIED)
_RollupInvalid = error_class(ErrorCode.INVALID_ROLLUP)
_WrongLast = error_class(ErrorCode.WRONG_LAST_SEQUENCE)
_BadFlags = error_class(ErrorCode.INVALID_MESSAGE_FLAGS)
_TooLarge = error_class(ErrorCode.PAYLOAD_TOO_LARGE)
_WrongStream = error_class(ErrorCode.WRONG_EXPECTED_STREAM)
_WrongMsgId = error_class(ErrorCode.WRONG_LAST_MSG_ID)
_NoCounters = error_class(ErrorCode.MSG_COUNTER_DISABLED)
_NoAtomic = error_class(ErrorCode.ATOMIC_PUBLISH_DISABLED)

#: What the record gets written into it as it is built, when admission changes only
#: its TTL field and flags: ``(ttl, flags)``, or None when nothing changes.
Stamp = tuple[int, int] | None

#: id(KV bucket config) -> (the config, the admission of a message without TTL field,
#: flags or headers, its stamp): the same for each such message (a plain KV put), so
#: it is worked out once per config object (an update of the topic makes a new one)
#: and looked up once per partition of a batch.
_plain_kv: dict[int, tuple[TopicConfig, Admission, Stamp]] = {}


def admit(
    body: bytes | memoryview, field_ttl: int, block: bytes, cfg: TopicConfig, hv: dict[bytes, bytes] | None = None,
    restamp: bool = True, subject: bytes = b"", trusted: bool = False,
) -> Admission:
    """Check one message for a topic; see the module docstring. ``field_ttl`` and
    ``block`` are the body's TTL field and header block.

    ``hv``: the values of the headers admission reads (``WANTED``), when the caller
    has them already (``checked_header_values``). ``restamp=False``: when only the
    TTL field or the flags change, ``body`` is None and the caller writes the new
    ``ttl`` and ``flags`` into the record (``build_records``'s stamps) instead of
    copying the body here.

    Raises:
        MsgTtlDisabledError, RollupDeniedError, InvalidRollupError, InvalidMsgTtlError,
        WrongLastSequenceError (an expected sequence that is not a number).
    """
    if hv is None:
        hv = header_values(block, _WANTED) if block else {}
    if _BATCH_ID in hv:  # nats-server looks at the batch first
        raise _NoAtomic("atomic publish is disabled")
    if _INCR in hv:
        raise _NoCounters("message counters is disabled")
    raw_ttl = hv.get(_TTL)
    header_ttl = parse_ttl(raw_ttl) if raw_ttl else TTL_NONE
    if not cfg.allow_msg_ttl and (field_ttl != TTL_NONE or header_ttl != TTL_NONE):
        raise _Disabled("per-message TTL is disabled")
    schedule = 0
    headers = block
    if not hv.keys().isdisjoint(S.SCHEDULE_HEADERS):
        schedule, headers = _check_schedule(hv, subject, cfg, block, trusted)
        if headers is not block:
            hv = {**hv, _ROLLUP: b"sub"}
    rollup = ROLLUP_NONE
    raw_rollup = hv.get(_ROLLUP)
    if raw_rollup:
        if not cfg.allow_rollup:
            raise _RollupDenied("rollup not permitted")
        rollup = _ROLLUPS.get(raw_rollup, -1)
        if rollup < 0:
            # The server's %q: the value double-quoted, quotes and backslashes escaped.
            raise _RollupInvalid(f"rollup value invalid: {json.dumps(raw_rollup.decode(errors='replace'), ensure_ascii=False)}")
    if header_ttl == TTL_INVALID:
        raise _Invalid("invalid per-message TTL")
    if field_ttl != TTL_NONE and raw_ttl is not None and header_ttl != TTL_NONE and field_ttl != header_ttl:
        raise _Invalid(
            f"invalid per-message TTL: the TTL field ({_ttl_text(field_ttl)}) and the Nats-TTL header "
            f"({raw_ttl.decode(errors='replace')!r}) disagree"
        )
    ttl = field_ttl or header_ttl
    if ttl == TTL_NONE and cfg.kv and cfg.kv.get("ttl"):
        ttl = cfg.kv["ttl"]  # a KV bucket's default TTL for a key put without one
    sdm = cfg.subject_delete_marker_ttl
    if sdm and ttl != TTL_NEVER and 0 < ttl < sdm and cfg.max_msgs_per_subject != 1:
        ttl = sdm
        if raw_ttl is not None:
            headers = replace_header(headers, "Nats-TTL", str(sdm))
    kv_op = hv.get(_KV_OP)
    flags = FLAG_NO_MARKER if kv_op == b"PURGE" or hv.get(_MARKER_REASON) else 0
    if kv_op in (b"DEL", b"PURGE"):
        flags |= FLAG_TOMBSTONE
    expected = None
    raw_expected = hv.get(_EXPECTED_LAST)
    if raw_expected:
        if not raw_expected.isdigit():
            raise _WrongLast(f"invalid Nats-Expected-Last-Subject-Sequence {raw_expected.decode(errors='replace')!r}")
        expected = int(raw_expected)
    expects = None
    raw_stream, raw_seq, raw_id = hv.get(_EXPECTED_STREAM), hv.get(_EXPECTED_SEQ), hv.get(_EXPECTED_MSG_ID)
    if raw_stream or raw_seq or raw_id:
        if raw_seq and not raw_seq.isdigit():
            raise _WrongLast(f"invalid Nats-Expected-Last-Sequence {raw_seq.decode(errors='replace')!r}")
        expects = (raw_stream or None, int(raw_seq) if raw_seq else None, raw_id or None)
    changed = headers is not block or (restamp and (ttl != field_ttl or flags))
    msg_id = (hv.get(MSG_ID) or None) if cfg.duplicate_window and _HOPS not in hv else None
    return Admission(
        ttl, rollup, flags, restamp_body(body, ttl, flags, headers) if changed else None, expected, msg_id, expects,
        schedule,
    )


def _publish_subject(raw: bytes) -> bool:
    """The server's ``IsValidPublishSubject``."""
    try:
        text = raw.decode()
        P.validate_subject(text)
    except (UnicodeDecodeError, BrokerError):
        return False
    return P.is_literal(text)


def _check_schedule(
    hv: dict[bytes, bytes], subject: bytes, cfg: TopicConfig, block: bytes, trusted: bool
) -> tuple[int, bytes]:
    """The message schedule headers (NATS ADR-51), in the server's order
    (``processJetStreamMsg``): returns the message's :data:`SCHEDULE` kind and its
    header block (a schedule gets ``Nats-Rollup: sub`` appended when it has none)."""
    allowed = cfg.allow_msg_schedules
    kind = 0
    pattern = hv.get(S.SCHEDULE)
    try:
        zone = S.load_zone(hv.get(S.SCHEDULE_TIME_ZONE)) if S.SCHEDULE_TIME_ZONE in hv else None
    except S.ScheduleError:
        raise (_SchedDisabled("message schedules is disabled") if not allowed else _SchedZone("message schedules time zone is invalid")) from None
    if pattern and not trusted:
        try:
            S.next_fire(pattern.decode(), zone, 0, 0)
        except (S.ScheduleError, UnicodeDecodeError):
            raise (_SchedDisabled("message schedules is disabled") if not allowed else _SchedPattern("message schedules pattern is invalid")) from None
        if not allowed:
            raise _SchedDisabled("message schedules is disabled")
        ttl = hv.get(S.SCHEDULE_TTL)
        if not S.schedule_ttl_valid(ttl):
            raise _SchedTtl("message schedules invalid per-message TTL")
        srollup = hv.get(S.SCHEDULE_ROLLUP)
        if srollup and srollup != b"sub":
            raise _SchedRollup("message schedules invalid rollup")
        if ttl and not cfg.allow_msg_ttl:
            raise _Disabled("per-message TTL is disabled")
        target = hv.get(S.SCHEDULE_TARGET)
        if not target or not _publish_subject(target) or target == subject:
            raise _SchedTarget("message schedules target is invalid")
        source = hv.get(S.SCHEDULE_SOURCE)
        if source and (source == target or source == subject or not _publish_subject(source)):
            raise _SchedSource("message schedules source is invalid")
        if not any(P.filters_overlap(f, target.decode()) for f in cfg.subjects):
            raise _SchedTarget("message schedules target is invalid")
        if source and not any(P.filters_overlap(f, source.decode()) for f in cfg.subjects):
            raise _SchedSource("message schedules source is invalid")
        own = hv.get(_ROLLUP)
        if not own:
            block = block + P.encode_headers([("Nats-Rollup", "sub")])
        elif own != b"sub":
            raise _SchedRollup("message schedules invalid rollup")
        kind = SCHEDULE
    elif pattern:
        kind = SCHEDULE
    nxt = hv.get(S.SCHEDULE_NEXT)
    if nxt and trusted:
        return (S.SCHEDULE_NEXT_PURGE == nxt and SCHEDULE_PURGE or SCHEDULE_PRODUCED), block
    if nxt:
        if nxt != S.SCHEDULE_NEXT_PURGE:
            raise _Scheduler("message schedules invalid scheduler")
        scheduler = hv.get(S.SCHEDULER)
        if not scheduler or scheduler == subject or not _publish_subject(scheduler):
            raise _Scheduler("message schedules invalid scheduler")
        if not allowed:
            raise _SchedDisabled("message schedules is disabled")
        return SCHEDULE_PURGE, block
    if hv.get(S.SCHEDULER) and not trusted:
        raise _Scheduler("message schedules invalid scheduler")
    return kind, block


def _ttl_text(ttl: int) -> str:
    return "never" if ttl == TTL_NEVER else f"{ttl}s"


# -- the steps ---------------------------------------------------------------------


def check(batch: Batch, max_payload: int) -> None:
    """The checks that need no topic, for bodies with flags, headers or a payload
    over ``max_payload`` (bodies marked only by a TTL field need none): a refused
    one goes to ``batch.failed``. The fields of the bodies it decodes land in
    ``batch.fields``, and the values of the headers admission reads in
    ``batch.hvs``, for admission to reuse. A header block is checked once per batch
    however many bodies carry it."""
    data, starts = batch.data, batch.starts
    ttl_only, headed = batch.ttl_only, batch.headed
    failed, fields, hvs = batch.failed, batch.fields, batch.hvs
    checked: dict[bytes, dict[bytes, bytes] | BrokerError] = {}
    for i in batch.special:
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
                hvs[i] = got
            else:
                assert isinstance(got, BrokerError)  # the block broke a rule
                failed[i] = got
            continue
        f = fields[i] = P.body_fields(data, starts[i])
        if f.flags:
            failed[i] = _BadFlags(f"message flags {f.flags:#x} are reserved for the broker; publish with flags 0")
        elif f.payload_len > max_payload:
            failed[i] = _TooLarge(f"payload of {f.payload_len} bytes exceeds the maximum of {max_payload} bytes")
        elif f.headers:
            try:
                hvs[i] = P.checked_header_values(f.headers, WANTED)
            except BrokerError as err:
                failed[i] = err


def self_contained(batch: Batch) -> bool:
    """Do the checked messages carry no header but those of ``SELF_CONTAINED`` (so
    that the batch may join several requests)?"""
    hvs = batch.hvs
    return not hvs or SELF_CONTAINED.issuperset(set().union(*hvs.values()))


def admit_batch(batch: Batch) -> None:
    """Admit the special messages, and every message of a KV bucket, into the topics
    they were routed to (:func:`admit`): a refused one moves to ``batch.failed`` and
    leaves its group; the others land in ``batch.admitted``. A body whose TTL field
    or flags change (and nothing else) gets an entry in ``batch.stamps``, written as
    its record is built; a rewritten body (a new header block) is added to the
    batch's bytes and its bounds moved there. ``batch.any_rollup`` and
    ``batch.any_msg_id`` say whether a rollup or an id to de-duplicate was admitted.

    A body marked only by a TTL field has nothing to decode: only the topic's TTL
    rules apply (the minimum-TTL rule may raise the field), and the messages of a
    partition with the same TTL share one :class:`Admission`. So do the messages with
    the same TTL field and header block whose bodies admission leaves alone.

    ``Nats-Expected-Last-Subject-Sequence`` is checked against the subject's last
    offset when the batch arrived; a message whose subject an earlier message of the
    same batch wrote fails it (compare-and-set is one message at a time)."""
    todo = set(batch.special).difference(batch.failed)
    admitter = _Admitter(batch, todo)
    groups = batch.groups
    for part, idx in list(groups.items()):
        if part.topic.config.kv is None and todo.isdisjoint(idx):
            continue
        keep = admitter.group(part, idx)
        if keep:
            groups[part] = keep
        else:
            del groups[part]
    admitter.close()


class _Admitter:
    """One batch's admission, a partition at a time (:meth:`group`); bodies it
    rewrites are kept aside and added to the batch's bytes at the end (:meth:`close`)."""

    __slots__ = ("batch", "todo", "view", "rewritten", "end")

    def __init__(self, batch: Batch, todo: set[int]) -> None:
        self.batch = batch
        self.todo = todo
        self.view = memoryview(batch.data)
        self.rewritten: list[bytes] = []
        #: Where the next rewritten body will start once they are added.
        self.end = len(batch.data)

    def close(self) -> None:
        self.view.release()
        if self.rewritten:
            batch = self.batch
            batch.data = b"".join((batch.data, *self.rewritten))

    def group(self, part: Partition, idx: list[int]) -> list[int]:
        """Admit the messages of one partition (``idx``, in batch order); returns
        those it keeps. The admissions shared within it, and the subjects its
        messages wrote so far (for the compare-and-set headers), are per partition.
        One loop, with no call per message but :func:`admit` where it must run (a
        call costs about 1 % of a message's admission, ``bench/publish_cpu.py``)."""
        batch = self.batch
        todo, view = self.todo, self.view
        ttl_only, headed, fields, hvs = batch.ttl_only, batch.headed, batch.fields, batch.hvs
        subjects, starts, ends = batch.subjects, batch.starts, batch.ends
        admitted, stamps, failed = batch.admitted, batch.stamps, batch.failed
        cfg = part.topic.config
        kv = cfg.kv is not None
        plain: tuple[Admission, Stamp, bool] | None = None  # a plain KV put's
        keep = []
        written: set[bytes] = set()
        shared: dict[int, tuple[Admission, Stamp]] = {}  # TTL field -> admission, stamp
        # (TTL field, header block) -> the same, and whether nothing is left to check per message
        same: dict[tuple[int, bytes], tuple[Admission, Stamp, bool]] = {}
        sdm = cfg.subject_delete_marker_ttl if cfg.max_msgs_per_subject != 1 else 0
        for i in idx:
            if ttl_only and i in ttl_only and i in todo:
                ttl = ttl_only[i]
                got = shared.get(ttl)
                if got is None:
                    if not cfg.allow_msg_ttl:
                        failed[i] = _Disabled("per-message TTL is disabled")
                        continue
                    got = shared[ttl] = _ttl_only_admission(ttl, sdm)
                a, stamp = got
            elif kv or i in todo:
                h = headed.get(i) if headed else None
                if h is not None:
                    alike = same.get(h)
                elif i not in todo:
                    alike = plain or (plain := _plain_kv_admission(cfg))
                else:
                    alike = None
                if alike is not None and alike[2]:  # nothing to check: as a ttl_only message
                    a, stamp = alike[0], alike[1]
                else:
                    try:
                        if alike is not None:
                            a, stamp = alike[0], alike[1]
                        else:
                            if h is not None:
                                field_ttl, block = h
                            else:
                                f = fields.get(i) or P.body_fields(batch.data, starts[i])
                                field_ttl, block = f.ttl, f.headers
                            a = admit(
                                view[starts[i] : ends[i]], field_ttl, block, cfg, hvs.get(i), restamp=False,
                                subject=subjects[i], trusted=batch.trusted,
                            )
                            stamp = (a.ttl, a.flags) if a.body is None and (a.ttl != field_ttl or a.flags) else None
                            if h is not None and a.body is None and not a.schedule:  # for the messages alike
                                simple = a.expected_last is None and a.expects is None and not a.rollup and a.msg_id is None
                                same[h] = (a, stamp, simple)
                        if a.schedule == SCHEDULE_PURGE and not batch.trusted:
                            _check_purged_schedule(part, view[starts[i] : ends[i]])
                        if a.expected_last is not None:
                            _check_expected_last(part, subjects[i], a.expected_last, written)
                        if a.expects is not None:
                            _check_expects(part, a.expects, written)
                    except BrokerError as err:
                        failed[i] = err
                        continue
                    if a.rollup or a.schedule:
                        batch.any_rollup = True
                    if a.msg_id is not None:
                        batch.any_msg_id = True
                    if a.body is not None:
                        self._rewrite(i, a.body)
            else:
                keep.append(i)  # a plain message
                continue
            admitted[i] = a
            if stamp is not None:
                stamps[i] = stamp
            written.add(subjects[i])
            keep.append(i)
        return keep

    def _rewrite(self, i: int, body: bytes) -> None:
        """Message ``i`` is stored as ``body`` (admission rewrote its header block)."""
        batch = self.batch
        start = self.end
        self.end = start + len(body)
        batch.starts[i] = start
        batch.ends[i] = self.end
        self.rewritten.append(body)


def _ttl_only_admission(ttl: int, sdm: int) -> tuple[Admission, Stamp]:
    """The admission (and stamp) of a body marked only by the TTL field ``ttl``, into
    a topic that allows TTLs: :func:`admit`'s minimum-TTL rule (rule 4 of the module
    docstring) is all there is to apply (``sdm``: the marker TTL when the rule
    applies, else 0)."""
    eff = sdm if sdm and ttl != TTL_NEVER and 0 < ttl < sdm else ttl
    return Admission(eff, 0, 0, None), (eff, 0) if eff != ttl else None


def _plain_kv_admission(cfg: TopicConfig) -> tuple[Admission, Stamp, bool]:
    """The admission (and stamp) of a message with no TTL field, flags or headers
    into the KV bucket configured by ``cfg``, and True: with no header it has
    nothing to check against the partition, and its body is stored as sent."""
    got = _plain_kv.get(id(cfg))
    if got is None or got[0] is not cfg:
        if len(_plain_kv) >= 1024:
            _plain_kv.clear()
        a = admit(b"", TTL_NONE, b"", cfg, {}, restamp=False)
        assert a.body is None and a.expected_last is None and a.expects is None and not a.rollup and a.msg_id is None
        got = _plain_kv[id(cfg)] = (cfg, a, (a.ttl, a.flags) if a.ttl or a.flags else None)
    return got[1], got[2], True


def _check_purged_schedule(part: Partition, body: memoryview) -> None:
    """A client's ``Nats-Schedule-Next: purge`` must name a subject whose last
    message is a schedule, or one with no message (the server's rule)."""
    f = P.body_fields(body, 0)
    scheduler = header_values(f.headers, S.SCHEDULE_HEADERS).get(S.SCHEDULER, b"")
    last = part.topic.partition_for(scheduler).last(scheduler)
    if last is not None:
        _, _, _, h_at, p_at, _ = P.record_spans(last)
        if not header_values(last[h_at:p_at], S.SCHEDULE_HEADERS).get(S.SCHEDULE):
            raise _Scheduler("message schedules invalid scheduler")


def _check_expected_last(part: Partition, subject: bytes, expected: int, written: set[bytes]) -> None:
    """``Nats-Expected-Last-Subject-Sequence``: the subject's last offset in the
    partition (0: none stored), unless an earlier message of the batch wrote it. A
    newer record of the subject known to be damaged is its last (``docs/semantics.md``
    §3.4): a compare-and-set against the revision before it is refused, as it was
    before the damage."""
    st = part.index.get(subject)
    last = st.last if st is not None and st.count else 0
    damaged = part.index.damaged
    if damaged:
        d = damaged.get(subject, 0)
        if d > last and part.log.is_corrupt(d):
            last = d
    if subject in written or last != expected:
        raise _WrongLast(f"wrong last sequence: {last}")


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
            raise _WrongStream("expected stream does not match")
    if seq is not None:
        last = part.log.last_offset
        if written or last != seq:
            raise _WrongLast(f"wrong last sequence: {last}")
    if msg_id is not None:
        last_id = topic.dedup.last
        if last_id != msg_id:
            text = "" if last_id is None else last_id.decode(errors="replace")
            raise _WrongMsgId(f"wrong last msg ID: {text}")


def dedupe(batch: Batch) -> None:
    """``Nats-Msg-Id`` de-duplication (``_dedup.py``) of the admitted messages, in
    batch order, at ``batch.now``: fills in ``batch.duplicates`` (index -> the
    original stored earlier, or the index of the same batch's earlier message with
    that id), which leave their groups, and ``batch.fresh``, the ids to register once
    the batch is appended ((topic, id) -> index)."""
    admitted = batch.admitted
    cands = [i for i, a in admitted.items() if a.msg_id is not None]
    if not cands:
        return
    cands.sort()
    groups = batch.groups
    now = batch.now
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
        msg_id = admitted[i].msg_id
        assert msg_id is not None  # a candidate
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
    batch.duplicates, batch.fresh = dups, fresh
