"""Administration: streams and topics (create, update, delete, get, list).

The handlers that rewrite the catalog are async and hold ``Broker.admin_lock`` so
that concurrent creates and deletes cannot interleave. A directory being created or
removed is listed in the catalog's ``removing`` until the catalog names it (or no
longer does), so a crash in between leaves nothing unaccounted for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

import protocol as P
from protocol import EXPIRY_NONE, BrokerError, ErrorCode, error_class, normalize_name, validate_filter
from storage import deferred_dir_syncs, sync_fds

from ._broker import Broker, Reply
from ._log import get_logger
from ._limits import trim
from ._topic_config import TopicConfig, apply_changes, check_option_types, resolve
from ._topics import Stream, Topic

__all__ = [
    "create_stream", "create_topic", "delete_stream", "delete_topic", "get_stream", "get_topic",
    "list_streams", "list_topics", "update_stream", "update_topic",
]

log = get_logger(__name__)


# -- streams -------------------------------------------------------------------


def _stream_details(broker: Broker, stream: Stream, with_topics: bool) -> P.StreamDetails:
    topics = tuple(broker.topic_details(t) for t in sorted(stream.topics.values(), key=lambda t: t.id)) if with_topics else ()
    return P.StreamDetails(stream.id, len(stream.topics), stream.size_bytes, stream.messages_count, stream.name, topics)


def get_stream(broker: Broker, session: object, cmd: P.GetStream) -> Reply:
    return _stream_details(broker, broker.catalog.stream(cmd.stream), True).encode()


def list_streams(broker: Broker, session: object, cmd: P.ListStreams) -> Reply:
    streams = sorted(broker.catalog.streams.values(), key=lambda s: s.id)
    return P.StreamList(tuple(_stream_details(broker, s, False) for s in streams)).encode()


async def _new_id(wanted: int, kind: str, used: set[int], on_disk: Callable[[int], bool], pending: set[int],
                  next_id: int, where: Callable[[int], str], parent: str) -> int:
    """The id of a new stream or topic: ``wanted``, or (0) the next id never given.
    Never an id whose directory is on disk (one the catalog does not name, or one
    still being removed), so a new stream or topic can never open old data. Only the
    candidates are looked up on disk: the cost does not grow with the topics."""
    code = ErrorCode.STREAM_ID_EXISTS if kind == "stream" else ErrorCode.TOPIC_ID_EXISTS
    if wanted:
        if wanted in used:
            raise error_class(code)(f"{parent}a {kind} with id {wanted} already exists")
        if wanted in pending or await trio.to_thread.run_sync(on_disk, wanted):
            raise error_class(code)(
                f"{kind} id {wanted} is taken by {where(wanted)}, a directory the catalog does not name "
                "(see the broker's unknown_path damage reports; `ttlbroker repair` moves it to quarantine/)"
            )
        return wanted

    def first_free() -> int:
        new = next_id
        while new in used or new in pending or on_disk(new):
            new += 1
        return new

    new = await trio.to_thread.run_sync(first_free)
    if new > 0xFFFFFFFF:
        raise error_class(code)(f"{parent}no {kind} id is left (ids are u32 and never reused)")
    return new


async def create_stream(broker: Broker, session: object, cmd: P.CreateStream) -> Reply:
    async with broker.admin_lock:
        name = normalize_name(cmd.name, "stream name")
        if any(s.name == name for s in broker.catalog.streams.values()):
            raise error_class(ErrorCode.STREAM_NAME_EXISTS)(f"a stream named {name!r} already exists")
        sid = await _new_id(
            cmd.stream_id, "stream", set(broker.catalog.streams), broker.datadir.stream_on_disk,
            {s for s, t in broker.catalog.removing if t is None}, broker.catalog.next_stream_id(),
            broker.datadir.stream_dir, "",
        )
        stream = Stream(sid, name, broker.clock.now_ns())
        broker.catalog.streams[sid] = stream
        # Kept even if the save fails: a copy on disk may already name the id.
        broker.catalog.stream_id_mark = max(broker.catalog.stream_id_mark, sid)
        try:
            await broker.save_catalog()
        except BaseException:
            del broker.catalog.streams[sid]
            raise
        log.info("stream_created", stream=name, id=sid)
        return _stream_details(broker, stream, True).encode()


async def update_stream(broker: Broker, session: object, cmd: P.UpdateStream) -> Reply:
    async with broker.admin_lock:
        stream = broker.catalog.stream(cmd.stream)
        name = normalize_name(cmd.name, "stream name")
        if any(s.name == name and s is not stream for s in broker.catalog.streams.values()):
            raise error_class(ErrorCode.STREAM_NAME_EXISTS)(f"a stream named {name!r} already exists")
        old, stream.name = stream.name, name
        try:
            await broker.save_catalog()
        except BaseException:
            stream.name = old
            raise
        return _stream_details(broker, stream, True).encode()


async def delete_stream(broker: Broker, session: object, cmd: P.DeleteStream) -> Reply:
    async with broker.admin_lock:
        stream = broker.catalog.stream(cmd.stream)
        del broker.catalog.streams[stream.id]
        entry: tuple[int, int | None] = (stream.id, None)
        await _list_as_garbage(broker, entry, lambda: broker.catalog.streams.__setitem__(stream.id, stream))
        for topic in stream.topics.values():
            _close_topic(broker, topic)
        await _finish_removal(broker, entry)
        log.info("stream_deleted", stream=stream.name, id=stream.id)
        return b""


# -- topics --------------------------------------------------------------------


def get_topic(broker: Broker, session: object, cmd: P.GetTopic) -> Reply:
    return broker.topic_details(broker.catalog.topic(cmd.stream, cmd.topic)).encode()


def list_topics(broker: Broker, session: object, cmd: P.ListTopics) -> Reply:
    stream = broker.catalog.stream(cmd.stream)
    return P.TopicList(tuple(broker.topic_details(t) for t in sorted(stream.topics.values(), key=lambda t: t.id))).encode()


def _expiry(broker: Broker, wire_value: int) -> int:
    if wire_value == 0:
        return broker.config.system.segment.message_expiry
    if wire_value == EXPIRY_NONE:
        return 0
    return wire_value


async def create_topic(broker: Broker, session: object, cmd: P.CreateTopic) -> Reply:
    async with broker.admin_lock:
        stream = broker.catalog.stream(cmd.stream)
        name = normalize_name(cmd.name, "topic name")
        check_option_types(cmd.options, updating=False)
        if stream.topic_named(name) is not None:
            raise error_class(ErrorCode.TOPIC_NAME_EXISTS)(f"stream {stream.name!r} already has a topic named {name!r}")
        tid = await _new_id(
            cmd.topic_id, "topic", set(stream.topics), lambda t: broker.datadir.topic_on_disk(stream.id, t),
            {t for s, t in broker.catalog.removing if s == stream.id and t is not None}, stream.next_topic_id(),
            lambda t: broker.datadir.topic_dir(stream.id, t), f"stream {stream.name!r}: ",
        )
        opts: dict[str, Any] = dict(cmd.options)  # the options map, its types checked above
        pedantic = bool(opts.pop("pedantic", False))
        copies = bool(opts.get("mirror") or opts.get("sources"))  # a copy captures nothing unless told
        subjects = tuple(opts.pop("subjects", None) or (() if copies else (f"{stream.name}.{name}.>",)))
        cfg = TopicConfig(
            name=name,
            partitions_count=cmd.partitions_count,
            message_expiry=_expiry(broker, cmd.message_expiry),
            subjects=subjects,
            segment_size=opts.pop("segment_size", broker.config.system.segment.size_bytes),
            **opts,
        )
        if "subjects" not in cmd.options and subjects:
            try:
                validate_filter(subjects[0])
            except BrokerError:
                raise error_class(ErrorCode.INVALID_SUBJECT_FILTER)(
                    f"the default subject filter {subjects[0]!r} is not valid for these names; "
                    "give the topic's subjects explicitly"
                ) from None
        cfg = resolve(cfg, None, pedantic, broker.config.limits.max_partitions, cmd.options)
        if broker.copy_check is not None and (cfg.mirror or cfg.sources):
            broker.copy_check(cfg, None)
        broker.router.check_overlap(cfg.subjects)
        topic = Topic(stream, tid, cfg, broker.clock.now_ns())
        broker.catalog.check_republish_cycles(topic, cfg)
        # One catalog write names the topic and lists it in ``creating`` (its files
        # may not exist yet); then its directories and first files are made, durable
        # before the reply. A crash in between: the next start makes what is missing.
        # The catalog state is made here, on the loop; the files in one worker hop.
        entry = (stream.id, tid)
        stream.topic_id_mark = max(stream.topic_id_mark, tid)
        broker.catalog.creating.append(entry)
        # Only the topic, its stream's entry and the top-level values change: a save
        # of those (the whole document is made only for a data directory's first save).
        top, header, entry_json = broker.catalog.top_json(), stream.header_json(), topic.to_json()
        broker.catalog.creating.remove(entry)
        done: list[str] = []

        def whole() -> dict[str, Any]:
            # (Only for a data directory never saved before; the admin lock keeps
            # the catalog still meanwhile.)
            doc = broker.catalog.to_json()
            for sd in doc["streams"]:
                if sd["id"] == stream.id:
                    sd["topics"] = sorted([*sd["topics"], entry_json], key=lambda t: t["id"])
            return {**doc, **top}

        def build() -> None:
            broker.datadir.save_catalog_change(top, [header], [(stream.id, entry_json)], whole)
            done.append("named")
            with deferred_dir_syncs():  # the new tree is durable before the reply
                broker.datadir.make_topic_dirs(stream.id, tid, cfg.partitions_count)
                broker.open_topic_storage(topic, False)

        try:
            await trio.to_thread.run_sync(build)
        except BaseException:
            if done:  # the catalog names the topic: take it back out, as a delete does
                with trio.CancelScope(shield=True):
                    await _list_as_garbage(broker, entry, lambda: None)
                    _close_topic(broker, topic)
                    await _finish_removal(broker, entry)
            raise
        stream.add_topic(topic)  # ``creating`` is dropped by the next catalog write
        broker.router.add(topic)
        log.info("topic_created", topic=topic.full_name, id=tid, partitions=cfg.partitions_count, subjects=",".join(cfg.subjects))
        return broker.topic_details(topic).encode()


async def update_topic(broker: Broker, session: object, cmd: P.UpdateTopic) -> Reply:
    async with broker.admin_lock:
        topic = broker.catalog.topic(cmd.stream, cmd.topic)
        check_option_types(cmd.changes, updating=True)
        new = apply_changes(topic.config, cmd.changes)
        new = resolve(new, topic.config, bool(cmd.changes.get("pedantic")), broker.config.limits.max_partitions, cmd.changes)
        if broker.copy_check is not None and (new.mirror or new.sources):
            broker.copy_check(new, topic)
        if new.subjects != topic.config.subjects:
            broker.router.check_overlap(new.subjects, ignore=topic)
        broker.catalog.check_republish_cycles(topic, new)
        # The limit's deferred deletions are made again after a crash under the
        # catalog's configuration: durable before a new one is (a raised limit would
        # bring back what the old one removed).
        deferred = [fd for p in topic.partitions for fd in p.log.take_deferred_fds()]
        if deferred:
            await trio.to_thread.run_sync(sync_fds, deferred)
        old, topic.config = topic.config, new
        try:
            await broker.save_catalog()
        except BaseException:
            topic.config = old
            raise
        for p in topic.partitions:
            p.log.segment_size = new.segment_size
            # A mirror promoted to a topic of its own hands out offsets from now on.
            p.log.reserve_ahead = broker.reserves_offsets(new)
        if new.max_msgs_per_subject and new.max_msgs_per_subject != old.max_msgs_per_subject:
            for p in topic.partitions:
                broker.publisher.enforce_max_msgs(p, [s for s, st in p.index.subjects.items() if st.count])
        if topic.trimming:  # a lowered max_msgs or max_bytes applies at once (discard old)
            for p in topic.partitions:
                trim(p, broker.retention.remove)
        if new.message_expiry != old.message_expiry:
            for p in topic.partitions:
                broker.retention.rearm_age(p)
        for hooks in broker.topic_hooks:
            hooks.topic_updated(topic, old)
        if not new.duplicate_window:
            topic.dedup.clear()  # off forgets; a window set later starts empty
        # Turning allow_msg_ttl on schedules nothing: a topic without it refuses
        # every TTL, so none of its stored messages carries one (docs/semantics.md).
        broker.router.rebuild(broker.catalog.topics())
        log.info("topic_updated", topic=topic.full_name, changes=",".join(sorted(cmd.changes)))
        return broker.topic_details(topic).encode()


async def delete_topic(broker: Broker, session: object, cmd: P.DeleteTopic) -> Reply:
    async with broker.admin_lock:
        topic = broker.catalog.topic(cmd.stream, cmd.topic)
        topic.stream.remove_topic(topic)
        entry: tuple[int, int | None] = (topic.stream.id, topic.id)
        await _list_as_garbage(broker, entry, lambda: topic.stream.add_topic(topic))
        _close_topic(broker, topic)
        await _finish_removal(broker, entry)
        log.info("topic_deleted", topic=topic.full_name)
        return b""


async def _finish_removal(broker: Broker, entry: tuple[int, int | None]) -> None:
    """Remove a directory the catalog lists in ``removing`` (fsyncing its parent),
    then drop the entry. A failure leaves the entry: the next start retries."""
    sid, tid = entry
    if tid is None:
        path, done = broker.datadir.stream_dir(sid), await trio.to_thread.run_sync(broker.datadir.remove_stream, sid)
    else:
        path, done = broker.datadir.topic_dir(sid, tid), await trio.to_thread.run_sync(broker.datadir.remove_topic, sid, tid)
    if not done:
        log.error("removal_failed", path=path, action="listed in the catalog; retried at the next start")
        return
    broker.catalog.removing.remove(entry)
    try:
        await broker.save_catalog()
    except Exception as exc:  # the files are gone; a stale entry only makes the next start look again
        log.error("catalog_save_failed", error=str(exc), action="retried with the next catalog change")


async def _list_as_garbage(broker: Broker, entry: tuple[int, int | None], undo: Callable[[], None]) -> None:
    """Save the catalog with ``entry``'s directory listed as garbage, before any file
    goes (the caller has taken it out of the catalog; ``undo`` puts it back if the
    save fails)."""
    broker.catalog.removing.append(entry)
    broker.router.rebuild(broker.catalog.topics())
    try:
        await broker.save_catalog()
    except BaseException:
        undo()
        broker.catalog.removing.remove(entry)
        broker.router.rebuild(broker.catalog.topics())
        raise


def _close_topic(broker: Broker, topic: Topic) -> None:
    for hooks in broker.topic_hooks:
        hooks.topic_deleted(topic)
    for p in topic.partitions:
        broker.retention.forget(p)
        p.log.close()
    if topic.consumers is not None:
        topic.consumers.close()
