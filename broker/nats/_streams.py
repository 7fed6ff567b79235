"""The JetStream stream API over the broker's own operations: ``$JS.API.INFO``,
``STREAM.CREATE|UPDATE|INFO|DELETE|PURGE|NAMES|LIST|MSG.GET|MSG.DELETE`` and
``DIRECT.GET``, and ttlbroker's ``STREAM.REDRIVE`` (dead letters).

Every request maps onto what our own protocol's handlers do (``core.py``,
``core.py``, ``_kv.py``, the partition's index and log): no second copy of
topic creation, purge, delete or KV reads. JSON shapes and error numbers are the
NATS server's (``protocol/_jetstream.py``); what ttlbroker lacks is refused there.

A KV bucket's stream (``KV_<b>``) is the topic ``kv/<b>``: with ``allow_msg_ttl``
(nats-py and nats.go send it) its ``max_age`` is the bucket's default key TTL (the
``kv`` option's ``ttl``, so FLIP-25's refresh policy, set on our side, applies to
it); without (nats.js 2.x) the bucket has no key TTLs and ``max_age`` stays the
topic's max age, as nats-server treats such a stream. A get by last subject (``STREAM.MSG.GET`` or
``DIRECT.GET``) goes through the bucket's read rules (visibility, refresh on read),
as our own client's ``kv.get`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import protocol as P
from protocol import BrokerError, ErrorCode, Identifier, read_record_info, subject_matches
from protocol import RemovalReason as R
from protocol.nats import (
    API_LEVEL, STREAM_SEALED, BAD_REQUEST, INVALID_JSON, MEMORY_RESOURCES_EXCEEDED, MSG_DELETE_FAILED, NO_MESSAGE_FOUND, PURGE_FAILED, SEQUENCE_NOT_FOUND, STREAM_INVALID_CONFIG, STREAM_MISMATCH,
    STORE_FAILED, STREAM_NAME_EXIST, JSError, api_error, api_response, check_stream_name, js_error, msg_get_response, nats_error, rfc3339,
    stream_config, last_by_subj_of, parse_request, stream_config_to_topic, source_info,
)
from protocol.nats import encode_nats_headers, nats_message_of_record

from storage import CorruptedRecord

import broker.core as core
from broker.consumers import redrive_topic
from broker.core import DEFAULT_DUPLICATE_WINDOW, TopicConfig, check_option_types, get_logger, resolve

from ._jetstream import KV_PREFIX, KV_STREAM

if TYPE_CHECKING:
    from broker.core import Partition, Topic

    from ._jetstream import JetStream

__all__ = ["account_info", "api", "kv_get", "stream_info"]

log = get_logger(__name__)

#: nats-server's page sizes for STREAM.NAMES and STREAM.LIST.
NAMES_LIMIT = 1024
LIST_LIMIT = 256
#: nats-server's ``JSMaxSubjectDetails``: the subjects one STREAM.INFO page holds.
SUBJECTS_LIMIT = 100_000


def api(js: JetStream, tokens: list[str], reply: str | None, headers: bytes | None, payload: bytes) -> None:
    """One ``$JS.API.<tokens>`` request (not CONSUMER.*); answers ``reply``."""
    js.api_total += 1
    head = tokens[0]
    if head == "INFO" and len(tokens) == 1:
        js.respond(reply, api_response("account_info", account_info(js)))
        return
    if head == "DIRECT" and len(tokens) >= 3 and tokens[1] == "GET":
        _direct_get(js, tokens[2], ".".join(tokens[3:]), reply, payload)
        return
    if head != "STREAM" or len(tokens) < 2:
        js.no_responders(reply)
        return
    op = tokens[1]
    if op == "MSG" and len(tokens) == 4 and tokens[2] in ("GET", "DELETE"):
        kind, name = f"stream_msg_{tokens[2].lower()}", tokens[3]
    elif op in ("NAMES", "LIST") and len(tokens) == 2:
        kind, name = f"stream_{op.lower()}", ""
    elif op in ("CREATE", "UPDATE", "INFO", "DELETE", "PURGE", "REDRIVE") and len(tokens) == 3:
        kind, name = f"stream_{op.lower()}", tokens[2]
    else:
        js.no_responders(reply)
        return
    try:
        req = parse_request(payload)
        handler = _HANDLERS[kind]
        if kind in _ASYNC:
            js.spawn(_run_async, js, handler, kind, name, req, reply)
            return
        body, epoch = handler(js, name, req)
        if kind == "stream_msg_get":
            js.unaudited()
        js.respond(reply, body if body.__class__ is bytes else api_response(kind, body), epoch=epoch)
    except (BrokerError, JSError) as err:
        _fail(js, reply, kind, err)


async def _run_async(js: JetStream, handler: Any, kind: str, name: str, req: dict[str, Any], reply: str | None) -> None:
    try:
        body = await handler(js, name, req)
    except (BrokerError, JSError) as err:
        _fail(js, reply, kind, err)
        return
    except Exception as exc:  # answered, logged; never reaches the nursery
        log.error("jetstream_request_failed", kind=kind, error=repr(exc))
        _fail(js, reply, kind, JSError(500, 10077, f"internal error: {exc}"))
        return
    js.respond(reply, api_response(kind, body))


def _fail(js: JetStream, reply: str | None, kind: str, err: BrokerError | JSError) -> None:
    js.api_errors += 1
    js.respond(reply, api_error(kind, err))


# -- account and streams -------------------------------------------------------------


def account_info(js: JetStream) -> dict[str, Any]:
    topics = js.topics()
    return {
        "memory": sum(t.size_bytes for t in topics if t.config.storage == "memory"),
        "storage": sum(t.size_bytes for t in topics if t.config.storage != "memory"),
        "reserved_memory": 0,
        "reserved_storage": 0,
        "streams": len(topics),
        "consumers": sum(len(js.consumers.consumers_of(t)) for t in topics),
        "limits": {
            "max_memory": js.broker.memory_budget.limit, "max_storage": -1, "max_streams": -1, "max_consumers": -1, "max_ack_pending": -1,
            "memory_max_stream_bytes": -1, "storage_max_stream_bytes": -1, "max_bytes_required": False,
        },
        "api": {"level": API_LEVEL, "total": js.api_total, "errors": js.api_errors},
    } | ({"domain": js.domain} if js.domain else {})


def _max_age(topic: Topic) -> int:
    kv = topic.config.kv
    key_ttl = kv["ttl"] if kv is not None and topic.stream.name == KV_STREAM else 0
    return key_ttl or topic.config.message_expiry


def _first_last(topic: Topic) -> tuple[int, int]:
    """The stream's ``first_seq`` and ``last_seq`` as the server reports them: the
    first live sequence, or, with none, the one after the last (0 for a stream that
    never held a message)."""
    part = topic.partitions[0] if topic.partitions else None
    last = max((p.log.last_offset for p in topic.partitions), default=0)
    if part is not None and topic.messages_count:
        return part.log.first_offset, last
    return (last + 1 if last else 0), last


def stream_info(js: JetStream, topic: Topic, subjects_filter: str | None = None) -> dict[str, Any]:
    """A topic as the server's StreamInfo (config, created, state, ts)."""
    options = topic.config.options()
    if options["nats"] is None and topic.stream.name == KV_STREAM:
        options["nats"] = {"allow_direct": True}  # a bucket made by our own client
    cfg = stream_config(options, _max_age(topic), js.stream_name(topic))
    part = topic.partitions[0] if topic.partitions else None
    messages = topic.messages_count
    first, last = _first_last(topic)
    state: dict[str, Any] = {
        "messages": messages,
        "bytes": topic.live_bytes,
        "first_seq": first,
        "first_ts": rfc3339(part.log.timestamp_of(first) if messages and part is not None else 0),
        "last_seq": last,
        "last_ts": rfc3339(part.log.timestamp_of(last) if last and part is not None and part.log.is_live(last) else 0),
        "consumer_count": len(js.consumers.consumers_of(topic)),
    }
    counts: dict[str, int] = {}
    for p in topic.partitions:
        for raw, st in p.index.subjects.items():
            if st.count:
                counts[raw.decode(errors="replace")] = st.count
    if counts:
        state["num_subjects"] = len(counts)
    deleted = (last - first + 1) - messages if messages else 0
    if deleted > 0:
        state["num_deleted"] = deleted
    if subjects_filter:
        ftokens = tuple(subjects_filter.split("."))
        matching = {s: n for s, n in counts.items() if subject_matches(ftokens, s.split("."))}
        if matching:
            state["subjects"] = matching
    out: dict[str, Any] = {
        "config": cfg,
        "created": rfc3339(topic.created_at),
        "state": state,
    }
    repl = js.replication
    if repl is not None and (topic.config.mirror or topic.config.sources):
        mirror, sources = repl.info(topic)
        if topic.config.mirror:
            out["mirror"] = _copy_info(repl, topic.config.mirror, mirror)
        else:
            out["sources"] = [
                _copy_info(repl, s, sources[i] if i < len(sources) else None) for i, s in enumerate(topic.config.sources or [])
            ]
    out["ts"] = rfc3339(js.broker.clock.now_ns())
    return out


def _copy_info(repl: Any, copy: dict[str, Any], copier: Any) -> dict[str, Any]:
    """One mirror's or source's StreamSourceInfo (its copier not started yet: never heard from)."""
    if copier is None:
        return source_info(copy, 0, -1, None)
    return source_info(copy, copier.lag, repl.active_ns(copier), copier.error)


def _topic_request(
    js: JetStream, name: str, req: dict[str, Any], existing: Topic | None = None,
) -> tuple[str, str, dict[str, Any], int, bool]:
    """A create or update request as (ttlbroker stream, topic name, options, max
    age seconds, pedantic); an update's ``existing`` topic stays where it is."""
    req = dict(req)
    pedantic = bool(req.pop("pedantic", False))
    check_stream_name(name)
    if req.get("name") not in (None, name):
        raise js_error(STREAM_MISMATCH)
    req["name"] = name
    options, max_age = stream_config_to_topic(req, pedantic)
    check_option_types(options, updating=False)  # the nested values (republish, metadata) too
    where, topic_name = js.place(name, req) if existing is None else (existing.stream.name, existing.name)
    if where == KV_STREAM and options["allow_msg_ttl"]:
        # A bucket: max_age is the default key TTL, so that the refresh policy applies.
        options["kv"] = {"ttl": max_age}
        max_age = 0
    elif where == KV_STREAM:
        options["kv"] = {"ttl": 0}  # a bucket without key TTLs: max_age is the topic's
    return where, topic_name, options, max_age, pedantic


async def _create(js: JetStream, name: str, req: dict[str, Any]) -> dict[str, Any]:
    broker = js.broker
    where, topic_name, options, max_age, pedantic = _topic_request(js, name, req)
    if options.get("sealed"):  # before the stream is looked up, as the server
        raise js_error(STREAM_INVALID_CONFIG, "stream configuration for create can not be sealed")
    try:
        existing = js.topic(name)
    except JSError:
        existing = None
    if existing is not None:
        if _same(broker, existing, options, max_age, pedantic):
            return stream_info(js, existing)
        raise js_error(STREAM_NAME_EXIST)
    if options.get("storage") == "memory":
        # nats-server's check of a memory stream against its max_memory_store
        # (``checkBytesLimits``: the stream's max_bytes, or 1 byte without one).
        wanted = req.get("max_bytes")
        wanted = wanted if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted > 0 else 1
        if wanted > broker.memory_budget.limit:
            raise js_error(MEMORY_RESOURCES_EXCEEDED)
    if not any(s.name == where for s in broker.catalog.streams.values()):
        try:
            await core.create_stream(broker, None, P.CreateStream(0, where))
        except BrokerError as err:
            if err.code != ErrorCode.STREAM_NAME_EXISTS:
                raise
    if options.get("mirror") and not options["mirror"].get("external"):
        origin = _local_topic(js, options["mirror"].get("name", ""))
        if origin is not None:  # nats-server: a mirror inherits its origin's direct gets
            options["nats"]["mirror_direct"] = bool((origin.config.nats or {}).get("allow_direct"))
    if pedantic:
        options["pedantic"] = True
    cmd = P.CreateTopic(Identifier.of(where), 0, 1, max_age or P.EXPIRY_NONE, topic_name, options)
    await core.create_topic(broker, None, cmd)
    return {**stream_info(js, js.topic(name)), "did_create": True}


def _local_topic(js: JetStream, name: str) -> Topic | None:
    try:
        return js.topic(name)
    except JSError:
        return None


def _same(broker: Any, topic: Topic, options: dict[str, Any], max_age: int, pedantic: bool) -> bool:
    """Would creating ``options`` give ``topic``'s configuration (the server answers
    a repeated create with the same config with the stream's info)?"""
    old = topic.config
    opts = dict(options)
    if opts.get("kv") is not None and old.kv is not None:
        opts["kv"] = {**old.kv, **opts["kv"]}
    new = TopicConfig(
        name=old.name, partitions_count=1, message_expiry=max_age, subjects=tuple(opts.pop("subjects")),
        segment_size=old.segment_size, **opts,
    )
    try:
        new = resolve(new, None, pedantic, broker.config.limits.max_partitions, options)
    except BrokerError:
        return False
    return new.to_json() == old.to_json()


async def _update(js: JetStream, name: str, req: dict[str, Any]) -> dict[str, Any]:
    """STREAM.UPDATE: the request is the whole new config, as for the server (what it
    leaves out takes its default, not the old value)."""
    topic = js.topic(name)
    _, _, options, max_age, pedantic = _topic_request(js, name, req, topic)
    if "duplicate_window" not in options:
        options["duplicate_window"] = min(DEFAULT_DUPLICATE_WINDOW, max_age) if max_age else DEFAULT_DUPLICATE_WINDOW
    if options.get("kv") is not None and topic.config.kv is not None:
        options["kv"] = {**topic.config.kv, **options["kv"]}  # keep our refresh and visibility
    options.setdefault("republish", None)  # left out or null: none (the whole config, as the server)
    options.setdefault("subject_transform", None)
    changes = {**options, "message_expiry": max_age}
    if pedantic:
        changes["pedantic"] = True
    await core.update_topic(js.broker, None, P.UpdateTopic(Identifier.of(topic.stream.id), Identifier.of(topic.id), changes))
    return stream_info(js, topic)


def _info(js: JetStream, name: str, req: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """STREAM.INFO, paged as the server pages it: with ``subjects_filter`` matching
    subjects, ``total`` is their count, ``offset`` the request's and ``limit``
    :data:`SUBJECTS_LIMIT`; a page other than the whole is taken from the sorted
    subjects. Otherwise all three are 0."""
    topic = js.topic(name)
    flt = req.get("subjects_filter")
    offset = req.get("offset") or 0
    if (flt is not None and not isinstance(flt, str)) or not isinstance(offset, int) or isinstance(offset, bool):
        raise js_error(BAD_REQUEST)
    info = stream_info(js, topic, flt)
    subjects = info["state"].get("subjects")
    if not subjects:
        return {"total": 0, "offset": 0, "limit": 0, **info}, 0
    offset = max(offset, 0)
    page = sorted(subjects)[offset : offset + SUBJECTS_LIMIT]  # sorted: Go writes a map's keys so
    if page:
        info["state"]["subjects"] = {s: subjects[s] for s in page}
    else:
        del info["state"]["subjects"]
    return {"total": len(subjects), "offset": offset, "limit": SUBJECTS_LIMIT, **info}, 0


async def _delete(js: JetStream, name: str, req: dict[str, Any]) -> dict[str, Any]:
    topic = js.topic(name)
    await core.delete_topic(js.broker, None, P.DeleteTopic(Identifier.of(topic.stream.id), Identifier.of(topic.id)))
    return {"success": True}


def _purge(js: JetStream, name: str, req: dict[str, Any]) -> tuple[dict[str, Any], int]:
    topic = js.topic(name)
    if topic.config.sealed:
        raise js_error(STREAM_SEALED)
    if topic.config.deny_purge:
        raise js_error(PURGE_FAILED, "stream purge not permitted")
    flt = req.get("filter") or ""
    seq = req.get("seq") or 0
    keep = req.get("keep") or 0
    if not isinstance(flt, str) or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in (seq, keep)):
        raise js_error(BAD_REQUEST)
    if seq or keep:
        return _purge_some(js, topic, flt, seq, keep)
    reply = core.purge(js.broker, None, P.Purge(Identifier.of(topic.stream.id), Identifier.of(topic.id), flt))
    payload, epoch = reply if isinstance(reply, tuple) else (reply, 0)
    return {"success": True, "purged": P.PurgeResult.decode(payload).purged}, epoch


def _purge_some(js: JetStream, topic: Topic, flt: str, seq: int, keep: int) -> tuple[dict[str, Any], int]:
    """Purge with ``seq`` (the matching messages below it) and/or ``keep`` (all but
    the newest ``keep`` matching ones), as the server's ``PurgeEx``: oldest first,
    stopping once ``keep`` are left. Leaves ``Purge`` markers as any subject purge."""
    part = topic.partitions[0]  # a NATS stream has one partition
    if flt and flt != ">":
        matching = sorted(o for _, subjects in core.matching_subjects(topic, flt) for s in subjects
                          for o in part.subject_offsets(s))
    else:
        matching = part.live_offsets()
    doomed = [o for o in matching if o < seq] if seq else matching
    if keep:
        doomed = doomed[: max(0, len(matching) - keep)]
    removed = js.broker.retention.remove(part, doomed, R.PURGE) if doomed else []
    return {"success": True, "purged": len(removed)}, js.broker.committer.note_write(part.log) if removed else 0


def _redrive(js: JetStream, name: str, req: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``STREAM.REDRIVE.<name>``, a ttlbroker extension (docs/semantics.md §16.11):
    the binary REDRIVE of the dead-letter stream ``name``. ``{"dry_run": bool}`` ->
    ``{"redriven": n, "skipped": n, "dry_run": bool}``, once the mark is durable."""
    dry = req.get("dry_run", False)
    if not isinstance(dry, bool):
        raise js_error(BAD_REQUEST)
    return redrive_topic(js.broker, js.topic(name), dry)


def _filter_of(req: dict[str, Any]) -> str:
    flt = req.get("subject") or ""
    if not isinstance(flt, str):
        raise js_error(BAD_REQUEST)
    return flt


def _page(topics: list[Topic], req: dict[str, Any], limit: int) -> tuple[list[Topic], int, int]:
    flt = _filter_of(req)
    if flt:
        topics = [t for t in topics if any(P.filters_overlap(flt, s) for s in t.config.subjects)]
    offset = req.get("offset") or 0
    if not isinstance(offset, int) or offset < 0:
        raise js_error(BAD_REQUEST)
    return topics[offset : offset + limit], len(topics), offset


def _names(js: JetStream, name: str, req: dict[str, Any]) -> tuple[dict[str, Any], int]:
    page, total, offset = _page(js.topics(), req, NAMES_LIMIT)
    return {"total": total, "offset": offset, "limit": NAMES_LIMIT, "streams": [js.stream_name(t) for t in page]}, 0


def _list(js: JetStream, name: str, req: dict[str, Any]) -> tuple[dict[str, Any], int]:
    page, total, offset = _page(js.topics(), req, LIST_LIMIT)
    return {"total": total, "offset": offset, "limit": LIST_LIMIT, "streams": [stream_info(js, t) for t in page]}, 0


# -- messages --------------------------------------------------------------------------


class _Found:
    """One stored message as the get APIs report it."""

    __slots__ = ("seq", "subject", "headers", "payload", "timestamp")

    def __init__(self, seq: int, subject: str, headers: bytes | None, payload: bytes, timestamp: int) -> None:
        self.seq = seq
        self.subject = subject
        self.headers = headers
        self.payload = payload
        self.timestamp = timestamp

    @classmethod
    def of_record(cls, seq: int, record: bytes | memoryview) -> _Found:
        subject, headers, payload = nats_message_of_record(record)
        return cls(seq, subject.decode(), headers, bytes(payload), read_record_info(record, 0).timestamp)

    @classmethod
    def of_kv_read(cls, subject: str, read: tuple[Any, ...]) -> _Found:
        """From a KV read (``KvReads.read``, what ``KvReads.get`` puts in its entry),
        which has read the record already."""
        offset, _, rec, created, _, payload_at, end, headers, _, _, _ = read
        return cls(offset, subject, encode_nats_headers(list(headers.items())) if headers else None,
                   bytes(rec[payload_at:end]), created)


def _load(js: JetStream, topic: Topic, req: dict[str, Any]) -> tuple[_Found, int]:
    """The message a get request names (``seq``, ``last_by_subj``, ``next_by_subj``
    from ``seq``); for a bucket's last-by-subject, through the bucket's read rules.
    Returns it and the epoch the answer waits for (a refresh lease; 0 = none).

    Raises:
        JSError: 404 10037 "no message found"; 400 10003 for a malformed request;
            503 10077 for a damaged record (:func:`_load_from`).
    """
    seq = req.get("seq") or 0
    last_by = req.get("last_by_subj")
    next_by = req.get("next_by_subj")
    if (
        not isinstance(seq, int) or seq < 0
        or (last_by is not None and not isinstance(last_by, str)) or (next_by is not None and not isinstance(next_by, str))
    ):
        raise js_error(BAD_REQUEST)
    if (last_by and (seq or next_by)) or not (seq or last_by or next_by):
        raise js_error(BAD_REQUEST)
    part = topic.partitions[0]
    try:
        return _load_from(js, topic, part, seq, last_by, next_by)
    except BrokerError as err:
        if err.code == ErrorCode.CORRUPTED_RECORD:
            raise nats_error(err) from None  # 503 10077 naming the damaged record (docs/semantics.md §18.31)
        raise


def _load_from(
    js: JetStream, topic: Topic, part: Partition, seq: int, last_by: str | None, next_by: str | None,
) -> tuple[_Found, int]:
    """:func:`_load` once the request is checked. A get by last subject whose newest
    message is, or may be, a damaged record, and a get of a damaged sequence, raise
    ``CorruptedRecord`` (never the message before it: ``docs/semantics.md`` §3.4).

    Raises:
        JSError: 404 10037 "no message found".
        CorruptedRecord: as above.
    """
    if last_by:
        if not P.is_literal(last_by):
            # A filter, as on nats-server: the newest message it matches (nats-py's
            # ObjectStore.list() and KV watch() ask for ``$O.b.M.>``, ``$KV.b.>``).
            newest = max(((part.index.subjects[s].last, s) for s in part.subjects_matching(last_by)), default=None)
            ftokens = tuple(last_by.split("."))
            part.refuse_damaged_matching(
                lambda s: subject_matches(ftokens, s.decode(errors="replace").split(".")), newest[0] if newest else 0,
                f"the last message matching {last_by!r} in stream {js.stream_name(topic)!r}", "message", "sequence",
            )
            if newest is None:
                raise js_error(NO_MESSAGE_FOUND)
            last_by = newest[1].decode()
            if topic.config.kv is None:
                return _Found.of_record(newest[0], part.log.get(newest[0])), 0
        if topic.config.kv is not None:
            try:
                read = js.kv.read(topic, last_by, 0, js.broker.clock.now_ns())
            except BrokerError as err:
                if err.code == ErrorCode.CORRUPTED_RECORD:
                    raise
                raise js_error(NO_MESSAGE_FOUND) from None
            return _Found.of_kv_read(last_by, read), read[-1]
        raw = last_by.encode()
        st = part.index.get(raw)
        last = st.last if st is not None and st.count else 0
        what = f"the last message on subject {last_by!r} in stream {js.stream_name(topic)!r}"
        part.refuse_damaged_last(raw, last, what, "message", "sequence")
        if not last:
            raise js_error(NO_MESSAGE_FOUND)
        try:
            return _Found.of_record(last, part.log.get(last)), 0
        except CorruptedRecord:
            part.refuse_damaged_last(raw, last, what, "message", "sequence")  # found damaged by this read
            raise
    if next_by:
        ftokens = tuple(next_by.split("."))
        wanted = part.wanted_for(next_by, lambda s: subject_matches(ftokens, s.decode(errors="replace").split(".")))
        res = part.read(max(seq, 1), 1, js.broker.config.limits.max_fetch_bytes, wanted)
        if not res or not res.count:
            raise js_error(NO_MESSAGE_FOUND)
        rec = res.records[0]
        return _Found.of_record(read_record_info(rec, 0).offset, rec), 0
    if not 1 <= seq <= part.log.last_offset or not part.log.is_live(seq):
        if 1 <= seq and part.log.is_corrupt(seq):
            raise CorruptedRecord(
                f"message {seq} of stream {js.stream_name(topic)!r} cannot be read: the record is damaged "
                "(`ttlbroker repair` writes it off)", seq,
            )
        raise js_error(NO_MESSAGE_FOUND)
    return _Found.of_record(seq, part.log.get(seq)), 0


def _msg_get(js: JetStream, name: str, req: dict[str, Any]) -> tuple[bytes, int]:
    """The answer is built as bytes (``msg_get_response``): a KV get is this request."""
    topic = js.topic(name)
    found, epoch = _load(js, topic, req)
    return _msg_get_answer(found), epoch


def _msg_get_answer(found: _Found) -> bytes:
    """STREAM.MSG.GET's answer for a message found, as both :func:`_msg_get` and
    :func:`kv_get` give it."""
    return msg_get_response(found.subject, found.seq, found.headers, found.payload, rfc3339(found.timestamp))


def kv_get(js: JetStream, bucket: str, reply: str | None, payload: bytes) -> bool:
    """``$JS.API.STREAM.MSG.GET.KV_<bucket>`` with ``{"last_by_subj": <a literal
    subject>}``, nats-py's ``kv.get`` of a bucket without direct gets, answered with
    what :func:`api` answers (the same read, answer, error and counters) without its
    dispatch, request dictionary and checks; False, nothing done, for any other
    request (another stream, not a bucket, another request), which :func:`api`
    then answers."""
    if "." in bucket:
        return False
    subject = last_by_subj_of(payload)
    if not subject or "*" in subject or ">" in subject:
        return False  # refused, or a wildcard (no message found): api() says so
    try:
        topic = js.topic(KV_PREFIX + bucket)
    except JSError:
        return False
    if topic.config.kv is None:
        return False
    js.api_total += 1
    try:
        read = js.kv.read(topic, subject, 0, js.broker.clock.now_ns())
    except BrokerError as err:
        _fail(js, reply, "stream_msg_get", err if err.code == ErrorCode.CORRUPTED_RECORD else js_error(NO_MESSAGE_FOUND))
        return True
    js.unaudited()
    js.respond(reply, _msg_get_answer(_Found.of_kv_read(subject, read)), epoch=read[-1])
    return True


def _msg_delete(js: JetStream, name: str, req: dict[str, Any]) -> tuple[dict[str, Any], int]:
    topic = js.topic(name)
    seq = req.get("seq", 0)
    if not req or not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise js_error(BAD_REQUEST)
    nats = topic.config.nats or {}
    if topic.config.sealed:
        raise js_error(STREAM_SEALED)
    if nats.get("deny_delete") or topic.config.deny_purge:
        raise js_error(MSG_DELETE_FAILED, "message delete not permitted")
    if seq == 0:
        raise js_error(MSG_DELETE_FAILED, "no message found")  # before the first, as the server
    try:
        reply = core.delete_message(
            js.broker, None, P.DeleteMessage(Identifier.of(topic.stream.id), Identifier.of(topic.id), 0, seq)
        )
    except BrokerError as err:
        if err.code == ErrorCode.MESSAGE_NOT_FOUND:
            # As the server's file store tells the three apart: past the last
            # sequence, removed from between the first and the last, before the first.
            first, last = _first_last(topic)
            if seq > last:
                raise js_error(MSG_DELETE_FAILED, "stream store EOF") from None
            if seq >= first:
                raise js_error(SEQUENCE_NOT_FOUND, f"sequence {seq} not found") from None
            raise js_error(MSG_DELETE_FAILED, "no message found") from None
        raise
    _, epoch = reply if isinstance(reply, tuple) else (reply, 0)
    return {"success": True}, epoch


def _direct_get(js: JetStream, name: str, subject: str, reply: str | None, payload: bytes) -> None:
    """``$JS.API.DIRECT.GET.<stream>[.<subject>]``: the message itself, with
    Nats-Stream, Nats-Subject, Nats-Sequence and Nats-Time-Stamp appended to its
    headers; a 404 status when there is none (408 for a malformed request, as the
    server: ``Malformed Request`` when it is not JSON, nested too deep included); a
    500 status with the error's text when the message is a damaged record
    (``docs/semantics.md`` §18.31). A stream without ``allow_direct`` does not
    answer (no responders)."""
    try:
        topic = js.topic(name)
    except JSError:
        js.no_responders(reply)
        return
    if not (topic.config.nats or {}).get("allow_direct", topic.stream.name == KV_STREAM):
        js.no_responders(reply)
        return
    try:
        req = {"last_by_subj": subject} if subject else parse_request(payload)
        found, epoch = _load(js, topic, req)
    except JSError as err:
        if err.err_code == NO_MESSAGE_FOUND[1]:
            js.respond(reply, b"", headers=encode_nats_headers([], 404, "Message Not Found"))
        elif err.err_code == INVALID_JSON[1]:
            js.respond(reply, b"", headers=encode_nats_headers([], 408, "Malformed Request"))  # as nats-server
        elif err.err_code == STORE_FAILED[1]:
            # A damaged record (docs/semantics.md §18.31): a status clients raise as
            # an error with this description. Not 503, which they take for "no
            # responders"; nats-server answers 404 here, which reads as "absent".
            js.respond(reply, b"", headers=encode_nats_headers([], 500, err.description))
        else:
            js.respond(reply, b"", headers=encode_nats_headers([], 408, "Bad Request"))
        return
    # Appended to the message's own header block as it is, as nats-server appends
    # them (a stream name and a subject hold no space, CR or LF).
    own = b"Nats-Stream: %s\r\nNats-Subject: %s\r\nNats-Sequence: %d\r\nNats-Time-Stamp: %s\r\n\r\n" % (
        js.stream_name(topic).encode(), found.subject.encode(), found.seq, rfc3339(found.timestamp).encode())
    block = found.headers
    js.respond(reply, found.payload, headers=block[:-2] + own if block else _HEADER_LINE + own, epoch=epoch)


_HEADER_LINE = b"NATS/1.0\r\n"

_HANDLERS: dict[str, Any] = {
    "stream_create": _create,
    "stream_update": _update,
    "stream_info": _info,
    "stream_delete": _delete,
    "stream_purge": _purge,
    "stream_redrive": _redrive,
    "stream_names": _names,
    "stream_list": _list,
    "stream_msg_get": _msg_get,
    "stream_msg_delete": _msg_delete,
}
_ASYNC = frozenset(("stream_create", "stream_update", "stream_delete"))
