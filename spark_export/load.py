"""Load a compacted snapshot back into a running broker.

Reads the snapshot with pyarrow (no Spark needed) and publishes every row through the
bundled client, in pipelined batches, keeping its subject, headers and payload. The
remaining life of a message with a TTL of its own goes into the TTL field (rounded up
to whole seconds; rows already past their TTL are skipped), and ``never`` stays
``never``. Some headers are dropped: ``Nats-TTL`` (the field carries the remaining
life instead; the broker refuses a field and a header that disagree),
``Nats-Rollup`` (a snapshot is rolled up already; replaying ``all`` would erase the
rest of it) and every ``Nats-Expected-*`` (the original publish's preconditions,
checked when it was stored; replayed, they would test the new broker's offsets, and
a KV ``update`` would be refused). ``Nats-Msg-Id`` stays, so a load that is run
again after a failure stores nothing twice within the duplicate window.

Where rows go: each source topic (the snapshot's ``stream=``/``topic=`` folders)
into the stream and topic of the same names, unless ``stream`` and/or ``topic`` name
another target; ``source`` (``STREAM/TOPIC``) loads one source topic only.
``create_topic`` creates each target topic (and its stream when missing) with the
source topic's configuration as recorded at export time (``_manifest.py``), so a
snapshot restores into an empty broker. Without it the target topics must exist and
capture every subject loaded into them.
"""

from __future__ import annotations

import math
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow.dataset as ds

from ._inputs import JobError, check_input, read_marker, source_topics
from ._progress import Display

__all__ = ["snapshot_messages", "snapshot_rows", "load", "LoadState", "plan"]

NS = 1_000_000_000
_DROPPED = {"Nats-TTL", "Nats-Rollup"}

Publish = tuple[str, bytes, dict[str, str], Any]


def snapshot_rows(root: str) -> list[dict[str, Any]]:
    """The snapshot's rows in (stream, topic, partition, offset) order.

    Raises:
        JobError: ``root`` is not a snapshot (the output of ``compact``; an export
            holds removed messages and markers, which must not be published again).
    """
    check_input(root)
    marker = read_marker(root)
    if marker is None or marker.get("kind") != "compacted":
        raise JobError(
            f"{root} is not a snapshot: load takes the output of `python -m spark_export compact` "
            "(an export also holds removed messages and markers)"
        )
    table = ds.dataset(root, format="parquet", partitioning="hive").to_table()
    return sorted(table.to_pylist(), key=lambda r: (str(r["stream"]), str(r["topic"]), int(r["partition"]), r["offset"]))


def _publish_tuple(r: dict[str, Any], now_ns: int) -> Publish | None:
    ttl: Any = None
    if r["ttl_never"]:
        ttl = "never"
    elif r["ttl_seconds"]:
        remaining = r["timestamp_ns"] + r["ttl_seconds"] * NS - now_ns
        if remaining <= 0:
            return None
        ttl = max(1, math.ceil(remaining / NS))
    headers = {k: v for k, v in r["headers"] if k not in _DROPPED and not k.lower().startswith("nats-expected-")}
    return (r["subject"], r["payload"], headers, ttl)


def snapshot_messages(root: str, now_ns: int | None = None) -> tuple[list[Publish], int]:
    """The snapshot's rows as ``(subject, payload, headers, ttl)`` publish tuples, in
    (stream, topic, partition, offset) order, and how many were skipped as expired."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    out, skipped = [], 0
    for r in snapshot_rows(root):
        m = _publish_tuple(r, now_ns)
        if m is None:
            skipped += 1
        else:
            out.append(m)
    return out, skipped


@dataclass
class Target:
    """Where the rows of one or more source topics go."""

    stream: str
    topic: str
    sources: list[tuple[str, str]] = field(default_factory=list)
    messages: list[Publish] = field(default_factory=list)


def _name(pair: tuple[str, str]) -> str:
    return f"{pair[0]}/{pair[1]}"


def plan(
    rows: list[dict[str, Any]], stream: str | None, topic: str | None, source: str | None, now_ns: int
) -> tuple[list[Target], int]:
    """Group the rows by target topic (see the module's docstring); returns the
    targets in order and how many rows were skipped as expired.

    Raises:
        JobError: ``source`` is not ``STREAM/TOPIC`` or not in the snapshot.
    """
    present = sorted({(str(r["stream"]), str(r["topic"])) for r in rows})
    if source is not None:
        want = tuple(source.split("/", 1))
        if len(want) != 2 or not all(want):
            raise JobError(f"--source takes STREAM/TOPIC, not {source!r}")
        if want not in present:
            raise JobError(f"the snapshot holds no topic {source} (it holds {', '.join(map(_name, present)) or 'none'})")
        rows = [r for r in rows if (str(r["stream"]), str(r["topic"])) == want]
    targets: dict[tuple[str, str], Target] = {}
    skipped = 0
    for r in rows:
        src = (str(r["stream"]), str(r["topic"]))
        key = (stream or src[0], topic or src[1])
        t = targets.setdefault(key, Target(*key))
        if src not in t.sources:
            t.sources.append(src)
        m = _publish_tuple(r, now_ns)
        if m is None:
            skipped += 1
        else:
            t.messages.append(m)
    return list(targets.values()), skipped


@dataclass
class LoadState:
    """What a load has done so far (the caller keeps it to report an interruption)."""

    total: int = 0
    published: int = 0
    errors: int = 0
    skipped: int = 0
    created: list[str] = field(default_factory=list)
    first_error: str = ""
    targets: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def summary(self) -> str:
        return (
            f"load: {self.published:,} published, {self.errors:,} refused, {self.skipped:,} skipped (expired) "
            f"in {time.perf_counter() - self.started:.1f} s"
        )

    def interrupted(self) -> str:
        into = f" into {', '.join(self.targets)}" if self.targets else ""
        return (
            f"load: interrupted after {self.published:,} of {self.total:,} messages published{into} "
            f"({self.errors:,} refused); batches in flight at that moment may have been stored too"
        )


async def _check(client: Any, t: Target, create: bool, recorded: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Refuse a target that cannot be loaded: with ``create``, one fed by several
    source topics, one whose configuration is not recorded, or one that exists;
    without, one that does not exist or does not capture every subject loaded into
    it. Changes nothing on the broker."""
    from protocol import ErrorCode, error_class, subject_matches

    stream_not_found = error_class(ErrorCode.STREAM_NOT_FOUND)
    topic_not_found = error_class(ErrorCode.TOPIC_NOT_FOUND)
    name = f"{t.stream}/{t.topic}"
    try:
        target = await client.get_topic(t.stream, t.topic)
    except (stream_not_found, topic_not_found) as exc:
        target = None
        missing = exc
    if create:
        if len(t.sources) > 1:
            raise JobError(
                f"--create-topic: {', '.join(map(_name, t.sources))} would all load into {name}, which can be created "
                "with one configuration only: pick one with --source STREAM/TOPIC"
            )
        if t.sources[0] not in recorded:
            raise JobError(
                f"--create-topic: the snapshot does not record the configuration of {_name(t.sources[0])} (exported "
                f"before ttlbroker recorded it): create {name} yourself and load without --create-topic"
            )
        if target is not None:
            raise JobError(f"--create-topic: topic {name} exists already: load into it without --create-topic, or name another --topic")
        return
    if target is None:
        if isinstance(missing, stream_not_found):
            raise JobError(f"no stream {t.stream} on the broker: create it and the topic first, or pass --create-topic")
        raise JobError(
            f"no topic {name} on the broker: create it first, or pass --create-topic to create it with the "
            f"configuration of {', '.join(map(_name, t.sources))}"
        )
    filters = [f.split(".") for f in target.options.get("subjects", [])]
    stray = [m[0] for m in t.messages if not any(subject_matches(tuple(f), m[0].split(".")) for f in filters)]
    if stray:
        raise JobError(f"topic {name} does not capture {stray[0]!r} (and {len(stray) - 1} more subjects)")


async def _create(client: Any, t: Target, info: dict[str, Any], state: LoadState) -> None:
    """Create the target topic (and its stream when missing) with ``info``, a
    recorded configuration."""
    from protocol import ErrorCode, error_class

    try:
        await client.get_stream(t.stream)
    except error_class(ErrorCode.STREAM_NOT_FOUND):
        await client.create_stream(t.stream)
        state.created.append(t.stream)
    options = dict(info.get("options") or {})
    subjects = options.pop("subjects", None)
    await client.create_topic(
        t.stream, t.topic, partitions=int(info.get("partitions", 1)), message_expiry=int(info.get("message_expiry", 0)),
        subjects=subjects, **options,
    )
    state.created.append(f"{t.stream}/{t.topic}")


async def load(
    root: str,
    server: str,
    stream: str | None = None,
    topic: str | None = None,
    *,
    source: str | None = None,
    create_topic: bool = False,
    token: str = "",
    user: str = "",
    password: str = "",
    tls: ssl.SSLContext | bool | None = None,
    batch: int = 1000,
    in_flight: int = 4,
    state: LoadState | None = None,
    display: Display | None = None,
) -> dict[str, Any]:
    """Publish the snapshot at ``root`` into the broker at ``server`` (see the
    module's docstring for where rows go). ``token``, ``user``, ``password`` and
    ``tls`` are ``broker.client.connect``'s; ``state`` (yours to keep) counts what is done as it
    goes, and ``display`` shows it.

    Raises:
        JobError: the snapshot cannot be read, the broker cannot be reached or
            refuses, a target topic does not exist (or, with ``create_topic``, exists
            already), or a subject is not captured by its target topic.
    """
    import trio

    from broker.client import BrokerError, connect

    state = state if state is not None else LoadState()
    display = display or Display()
    rows = snapshot_rows(root)
    targets, state.skipped = plan(rows, stream, topic, source, time.time_ns())
    del rows
    state.total = sum(len(t.messages) for t in targets)
    recorded = source_topics(root) if create_topic else {}
    try:
        async with connect(server, token=token, user=user, password=password, tls=tls) as client:
            for t in targets:  # every check before anything is created
                await _check(client, t, create_topic, recorded)
            if create_topic:
                for t in targets:
                    await _create(client, t, recorded[t.sources[0]], state)
            state.targets = [f"{t.stream}/{t.topic}" for t in targets]
            for name in state.created:
                display.say(f"load: created {name}")
            with display:
                bar = display.add("load", state.total, "msg")
                limiter = trio.Semaphore(in_flight)
                last_report = time.perf_counter()

                async def send(chunk: list[Publish]) -> None:
                    nonlocal last_report
                    try:
                        acks = await client.publish_batch(chunk)
                    finally:
                        limiter.release()
                    assert acks is not None
                    for a in acks:
                        if not a.ok:  # a duplicate (Nats-Msg-Id) counts as published
                            state.errors += 1
                            state.first_error = state.first_error or str(a.error)
                        else:
                            state.published += 1
                    display.update(bar, completed=state.published + state.errors)
                    now = time.perf_counter()
                    if not display.live and now - last_report >= 5:
                        last_report = now
                        display.say(f"load: {state.published + state.errors:,}/{state.total:,} published")

                async with trio.open_nursery() as nursery:
                    for t in targets:
                        for i in range(0, len(t.messages), batch):
                            await limiter.acquire()
                            nursery.start_soon(send, t.messages[i : i + batch])
    except ssl.SSLError as exc:
        raise JobError(f"TLS with the broker at {server} failed: {exc.reason or exc}") from None
    except OSError as exc:
        raise JobError(f"cannot reach the broker at {server}: {exc.strerror or exc}") from None
    except BrokerError as exc:
        raise JobError(f"{exc.code.name} ({int(exc.code)}): {exc.message}") from None
    result: dict[str, Any] = {
        "published": state.published,
        "errors": state.errors,
        "skipped_expired": state.skipped,
        "created": state.created,
        "seconds": round(time.perf_counter() - state.started, 2),
    }
    if state.first_error:
        result["first_error"] = state.first_error
    return result
