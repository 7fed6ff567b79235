"""The copiers: one task per mirror, or per source of a sourcing topic.

A :class:`Copier` asks its origin (:func:`choose_origin`: the one place that picks a
local or a remote origin) for batches from where the copy is, stores each through
the broker's one publish path (``Publisher.publish_copies``), and asks for the
next once the batch is stored (under ``fsync always``: once the group commit made
it durable, as a PubAck waits). Where the copy is (``docs/semantics.md``,
"Mirrors and sources"): a mirror's next offset; for a source, the partition's mark
of it, which storage keeps across removals and restarts (``storage._sources``:
noted with each batch, found again from the ``Nats-Stream-Source`` headers of the
copies it does not account for, :func:`record_source`).

:class:`Replication` owns the copiers: a ``TopicHooks`` that starts, restarts and
stops them as topics open, change and go, and the task they run under
(:meth:`Replication.run`, in the server's nursery). It also checks a copy's
configuration against the catalog (``Broker.copy_check``).
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import trio

from protocol import RECORD_FIXED, BrokerError, ErrorCode, SubjectTransform, encode_headers, error_class, find_header
from protocol.nats import decode_nats_headers, nats_error, parse_rfc3339

from broker.config import remote_for
from broker.core import Broker, Copy, Partition, Topic, TopicConfig, TopicHooks, copy_iname, get_logger

from ._local import LocalOrigin, find_local_topic
from ._origin import Origin, OriginGone, OriginMessage, OriginUnavailable
from ._remote import RemoteOrigin

__all__ = ["Copier", "Replication", "choose_origin"]

log = get_logger(__name__)

#: Retries after the origin was found missing, and after other failures (seconds).
GONE_RETRY_SECONDS = 10.0
RETRY_SECONDS = (0.25, 30.0)
_SOURCE_HEADER = "Nats-Stream-Source"
_NS = 1_000_000_000


def choose_origin(broker: Broker, copy: dict[str, Any]) -> Origin:
    """The origin of one mirror or source configuration, the one place that picks
    it: a stream on another server when ``external.api`` or ``domain`` names a
    ``[[nats.remotes]]`` entry (``broker.config.remote_for``: a
    :class:`RemoteOrigin`, read through a flow-controlled consumer there), else a
    topic of this broker (a :class:`LocalOrigin`). Makes no connection.

    Raises:
        UnknownDomainError, InvalidExternalApiError: the domain or API names no remote.
    """
    remote = remote_for(broker.config, copy)
    if remote is not None:
        return RemoteOrigin.for_source(remote, copy)
    return LocalOrigin(broker, copy.get("name", ""))


def is_remote(broker: Broker, copy: dict[str, Any]) -> bool:
    return remote_for(broker.config, copy) is not None


def _filters(copy: dict[str, Any]) -> tuple[str, ...]:
    trs = copy.get("subject_transforms") or []
    if trs:
        return tuple(t.get("src") or ">" for t in trs)
    flt = copy.get("filter_subject")
    return (flt,) if flt else ()


def _transforms(copy: dict[str, Any]) -> list[SubjectTransform | None]:
    return [
        SubjectTransform(t.get("src") or ">", t["dest"]) if t.get("dest") else None
        for t in copy.get("subject_transforms") or []
    ]


class Copier:
    """One mirror (``index`` None) or one source (``index``: its place in ``sources``) of ``topic``."""

    def __init__(self, replication: Replication, topic: Topic, copy: dict[str, Any], index: int | None) -> None:
        self.replication = replication
        self.broker = replication.broker
        self.topic = topic
        self.copy = copy
        self.mirror = index is None
        self.iname = copy_iname(copy)
        self._iname_parts = self.iname.split(" ")
        self.transforms = _transforms(copy)
        self.filters = _filters(copy)
        #: What stream info reports: lag, the clock when the origin was last heard
        #: from (ns, 0: never), and the error, as the server's (code, err_code, description).
        self.lag = 0
        self.last_contact = 0
        self.error: tuple[int, int, str] | None = None
        self.scope = trio.CancelScope()

    # -- where the copy is ---------------------------------------------------------

    def _part(self) -> Partition:
        return self.topic.partitions[0]

    def resume_point(self) -> tuple[int, int | None]:
        """``(start sequence, start time)`` from the copy's own contents."""
        copy = self.copy
        start_time = parse_rfc3339(copy["opt_start_time"]) if copy.get("opt_start_time") else None
        start = copy.get("opt_start_seq") or (0 if start_time else 1)
        log_ = self._part().log
        if self.mirror:
            if log_.next_offset > 1 and log_.last_offset > 0:
                return log_.next_offset, None
            return (max(start, log_.next_offset) if start else 0), start_time
        # The partition's mark of this source (storage keeps it across purges,
        # removals, copier restarts and broker restarts): what the copy holds or held.
        mark = log_.source_mark(self.iname)
        if mark is not None:
            return mark.seq + 1, None
        return start, start_time

    # -- the task ------------------------------------------------------------------

    async def run(self) -> None:
        delay = RETRY_SECONDS[0]
        clock = self.broker.clock
        while True:
            try:
                origin = choose_origin(self.broker, self.copy)
                start, start_time = self.resume_point()
                async with aclosing(origin.batches(start, start_time, self.filters)) as batches:
                    async for batch in batches:
                        self.last_contact = clock.now_ns() or 1
                        if self.error is not None:
                            log.info("copy_resumed", topic=self.topic.full_name, origin=origin.label)
                        self.error = None
                        delay = RETRY_SECONDS[0]
                        if batch:
                            await self._store(origin, batch)
                            self.lag = batch[-1].pending
                        else:
                            self.lag = 0
            except OriginGone:
                self.broker.counters.copy_origin_missing += 1
                if self.error is None or self.error[1] != 10059:
                    log.warning(
                        "copy_origin_missing", topic=self.topic.full_name, origin=self.copy.get("name", ""),
                        action=f"messages kept; retried every {GONE_RETRY_SECONDS:g} s",
                    )
                self.error = (404, 10059, "stream not found")
                await trio.sleep(GONE_RETRY_SECONDS)
                continue
            except OriginUnavailable as exc:
                if self.error is None:
                    log.warning("copy_origin_unreachable", topic=self.topic.full_name, origin=self.copy.get("name", ""),
                                error=str(exc), action="messages kept and readable; retried with a backoff")
                self.broker.counters.copy_origin_unreachable += 1
                self.error = (503, 10008 if self.mirror else 10045, str(exc) or "origin unavailable")
            except BrokerError as err:
                e = nats_error(err)
                self.error = (e.code, e.err_code, e.description)
                log.warning("copy_failed", topic=self.topic.full_name, origin=self.copy.get("name", ""), error=err.message)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_SECONDS[1])

    async def _store(self, origin: Origin, batch: list[OriginMessage]) -> None:
        copies = [self._copy_of(origin, m) for m in batch]
        broker = self.broker
        part = self._part()
        mark = None if self.mirror else (self.iname, batch[-1].seq, getattr(origin, "identity", ""))
        epoch = broker.publisher.publish_copies(part, copies, mark)
        # As a PubAck: under ``fsync always`` the batch is durable before the next
        # is asked for; under an interval or ``never`` nobody waits for a sync.
        if epoch and broker.committer.acks_wait and not broker.committer.is_durable(epoch):
            done = trio.Event()
            broker.committer.after(epoch, done.set)
            await done.wait()

    def _copy_of(self, origin: Origin, m: OriginMessage) -> Copy:
        subject = m.subject
        for tr in self.transforms:
            if tr is None:
                continue
            out = tr.apply(subject)
            if out is not None:
                subject = out
                break
        pairs = _header_pairs(m.headers)
        if self.mirror:
            headers = encode_headers(pairs) if pairs else b""
            return Copy(subject.encode(), headers, m.payload, m.seq, m.timestamp_ns)
        pairs = [(k, v) for k, v in pairs if k != _SOURCE_HEADER and not k.startswith("Nats-Expected-")
                 and not k.startswith("Nats-Batch-")]
        a, b, c = self._iname_parts
        value = f"{a} {m.seq} {b} {c} {m.subject}"
        ident = getattr(origin, "identity", "")
        if ident:
            value += " " + ident
        pairs.append((_SOURCE_HEADER, value))
        return Copy(subject.encode(), encode_headers(pairs), m.payload)


def _header_pairs(block: bytes) -> list[tuple[str, str]]:
    """The (name, value) pairs of a NATS header block, in order (a status line dropped)."""
    if not block:
        return []
    try:
        _, _, pairs = decode_nats_headers(block)
    except BrokerError:
        return []
    return list(pairs)


def record_source(record: memoryview) -> tuple[str, int, str] | None:
    """The source a stored copy names in its ``Nats-Stream-Source``: ``(iname,
    origin sequence, origin identity)``, or None (how storage finds the copies its
    marks do not account for: ``PartitionLog.configure_sources``)."""
    value = _record_header(record, _SOURCE_HEADER)
    if value is None:
        return None
    fields = value.split(" ")
    if len(fields) < 4 or not fields[1].isdigit():
        return None
    return f"{fields[0]} {fields[2]} {fields[3]}", int(fields[1]), fields[5] if len(fields) > 5 else ""


def _record_header(record: memoryview, name: str) -> str | None:
    sl, hl = RECORD_FIXED.unpack_from(record, 0)[6:8]
    head = RECORD_FIXED.size
    if not hl:
        return None
    block = bytes(record[head + sl : head + sl + hl])
    raw = find_header(block, name.encode())
    return None if raw is None else bytes(raw).decode(errors="replace")


class Replication(TopicHooks):
    """The copiers of every mirror and sourcing topic (see the module docstring)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.copiers: dict[Topic, list[Copier]] = {}
        self._nursery: trio.Nursery | None = None
        self._waiting: list[Copier] = []
        self._token: trio.lowlevel.TrioToken | None = None  # (the loop, for starts from worker threads)
        broker.topic_hooks.append(self)
        broker.copy_check = self.check

    # -- the configuration against the catalog ---------------------------------------

    def check(self, cfg: TopicConfig, topic: Topic | None) -> None:
        """What nats-server checks of a copy against the streams it can see: a remote
        origin (refused for now), an origin of more than one partition, a source that
        is the topic itself or a cycle of copies."""
        copies = [cfg.mirror] if cfg.mirror else list(cfg.sources or [])
        for copy in copies:
            if is_remote(self.broker, copy):  # (refuses a domain no remote has)
                continue  # what the remote holds is checked when the copy reads it
            origin = find_local_topic(self.broker, copy.get("name", ""))
            if origin is not None and len(origin.partitions) != 1:
                raise error_class(ErrorCode.ORIGIN_NOT_COPYABLE)(
                    f"origin {copy.get('name')!r} has {len(origin.partitions)} partitions: a mirror or source "
                    "copies a topic of one"
                )
            if origin is not None and origin.config.max_msg_size and cfg.max_msg_size and cfg.max_msg_size < origin.config.max_msg_size:
                if cfg.mirror:
                    raise error_class(ErrorCode.INVALID_MIRROR)("stream mirror must have max message size >= source")
                raise error_class(ErrorCode.INVALID_SOURCE)("stream source must have max message size >= target")
        self._check_cycle(cfg, topic)

    def _check_cycle(self, cfg: TopicConfig, topic: Topic | None) -> None:
        """nats-server's cycle check: following sources and mirrors from the new
        configuration reaches it again (a source: only when its filter overlaps the
        subjects of the stream it was reached from)."""
        from protocol import filters_overlap

        def name_of(c: TopicConfig) -> str:
            return (c.nats or {}).get("name", c.name)

        todo: list[TopicConfig] = [cfg]
        visited: set[str] = set()
        while todo:
            c = todo.pop(0)
            visited.add(name_of(c))
            for src in c.sources or []:
                if is_remote(self.broker, src):
                    continue  # (a stream of another server: no cycle through this broker's catalog)
                name = src.get("name", "")
                if name in visited:
                    flt = src.get("filter_subject", "")
                    if not flt or any(filters_overlap(s, flt) for s in c.subjects):
                        raise error_class(ErrorCode.INVALID_TOPIC_CONFIG)("detected cycle")
                elif (t := find_local_topic(self.broker, name)) is not None and t is not topic:
                    todo.append(t.config)
            if c.mirror and not is_remote(self.broker, c.mirror):
                name = c.mirror.get("name", "")
                if name in visited:
                    raise error_class(ErrorCode.INVALID_TOPIC_CONFIG)("detected cycle")
                if (t := find_local_topic(self.broker, name)) is not None and t is not topic:
                    todo.append(t.config)

    # -- the copiers -------------------------------------------------------------------

    def topic_opened(self, topic: Topic, recovering: bool) -> None:
        self._start(topic)

    def topic_updated(self, topic: Topic, old: TopicConfig) -> None:
        new = topic.config
        if new.mirror != old.mirror or new.sources != old.sources:
            self._stop(topic)
            self._start(topic)

    def topic_deleted(self, topic: Topic) -> None:
        self._stop(topic)

    def topic_closed(self, topic: Topic) -> None:
        self._stop(topic)

    def _start(self, topic: Topic) -> None:
        cfg = topic.config
        if cfg.mirror:
            copiers = [Copier(self, topic, cfg.mirror, None)]
        elif cfg.sources:
            copiers = [Copier(self, topic, s, i) for i, s in enumerate(cfg.sources)]
        else:
            copiers = []
        if len(topic.partitions) == 1:
            topic.partitions[0].log.configure_sources([c.iname for c in copiers if not c.mirror], record_source)
        if not copiers:
            return
        self.copiers[topic] = copiers
        for c in copiers:
            if self._nursery is not None and self._token is not None:
                # (a topic opens in a worker thread of its create: start from the loop)
                self._token.run_sync_soon(self._launch, c)
            else:
                self._waiting.append(c)

    def _launch(self, copier: Copier) -> None:
        if self._nursery is not None and not copier.scope.cancel_called:
            self._nursery.start_soon(self._guarded, copier)

    def _stop(self, topic: Topic) -> None:
        for c in self.copiers.pop(topic, []):
            c.scope.cancel()
            if c in self._waiting:
                self._waiting.remove(c)

    async def _guarded(self, copier: Copier) -> None:
        """Run a copier until its topic stops it. A failure that is not the origin's
        (a bug) is logged, counted and retried after the longest backoff: it never
        reaches the server's nursery, and the copy never stops for good."""
        with copier.scope:
            while True:
                try:
                    await copier.run()
                except Exception as exc:
                    copier.error = (500, 10052, f"copy failed: {exc!r}")
                    self.broker.counters.copy_failures += 1
                    log.error("copier_failed", topic=copier.topic.full_name, error=repr(exc),
                              action=f"retried in {RETRY_SECONDS[1]:g} s", exc_info=True)
                await trio.sleep(RETRY_SECONDS[1])

    async def run(self) -> None:
        """Run the copiers for the broker's lifetime (started in the server's nursery)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            waiting, self._waiting = self._waiting, []
            for c in waiting:
                nursery.start_soon(self._guarded, c)
            await trio.sleep_forever()

    # -- what stream info reports --------------------------------------------------------

    def info(self, topic: Topic) -> tuple[Copier | None, list[Copier]]:
        """The mirror's copier (or None) and the sources' copiers of ``topic``."""
        copiers = self.copiers.get(topic, [])
        if topic.config.mirror:
            return (copiers[0] if copiers else None), []
        return None, copiers

    def active_ns(self, copier: Copier) -> int:
        if not copier.last_contact:
            return -1
        return max(self.broker.clock.now_ns() - copier.last_contact, 0)


def _nats_name(topic: Topic) -> str:
    nats = topic.config.nats
    return nats["name"] if nats and "name" in nats else topic.name
