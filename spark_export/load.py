"""Load a compacted snapshot back into a topic of a running broker.

Reads the snapshot with pyarrow (no Spark needed) and publishes every row through the
bundled client, in pipelined batches, keeping its subject, headers and payload. The
remaining life of a message with a TTL of its own goes into the TTL field (rounded up
to whole seconds; rows already past their TTL are skipped), and ``never`` stays
``never``. Two headers are dropped: ``Nats-TTL`` (the field carries the remaining
life instead; the broker refuses a field and a header that disagree) and
``Nats-Rollup`` (a snapshot is rolled up already; replaying ``all`` would erase the
rest of it).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import pyarrow.dataset as ds

from ._inputs import JobError, check_input

__all__ = ["snapshot_messages", "load"]

NS = 1_000_000_000
_DROPPED = {"Nats-TTL", "Nats-Rollup"}


def snapshot_messages(root: str, now_ns: int | None = None) -> tuple[list[tuple[str, bytes, dict[str, str], Any]], int]:
    """The snapshot's rows as ``(subject, payload, headers, ttl)`` publish tuples, in
    (stream, topic, partition, offset) order, and how many were skipped as expired."""
    check_input(root)
    now_ns = time.time_ns() if now_ns is None else now_ns
    table = ds.dataset(root, format="parquet", partitioning="hive").to_table()
    rows = sorted(table.to_pylist(), key=lambda r: (str(r["stream"]), str(r["topic"]), int(r["partition"]), r["offset"]))
    out = []
    skipped = 0
    for r in rows:
        ttl: Any = None
        if r["ttl_never"]:
            ttl = "never"
        elif r["ttl_seconds"]:
            remaining = r["timestamp_ns"] + r["ttl_seconds"] * NS - now_ns
            if remaining <= 0:
                skipped += 1
                continue
            ttl = max(1, math.ceil(remaining / NS))
        headers = {k: v for k, v in r["headers"] if k not in _DROPPED}
        out.append((r["subject"], r["payload"], headers, ttl))
    return out, skipped


async def load(root: str, server: str, stream: str, topic: str, batch: int = 1000, in_flight: int = 4) -> dict[str, Any]:
    """Publish the snapshot at ``root`` into ``stream``/``topic`` on ``server``.

    Raises:
        JobError: the snapshot cannot be read, the topic does not exist, or a subject
            is not captured by that topic.
    """
    import trio

    from broker.client import BrokerError, connect

    messages, skipped = snapshot_messages(root)
    try:
        async with connect(server) as client:
            target = await client.get_topic(stream, topic)
            filters = [f.split(".") for f in target.options.get("subjects", [])]
            from protocol import subject_matches

            stray = [m[0] for m in messages if not any(subject_matches(tuple(f), m[0].split(".")) for f in filters)]
            if stray:
                raise JobError(f"topic {stream}/{topic} does not capture {stray[0]!r} (and {len(stray) - 1} more subjects)")
            published = errors = 0
            first_error = ""
            started = time.perf_counter()
            last_report = started
            limiter = trio.Semaphore(in_flight)

            async def send(chunk: list[Any]) -> None:
                nonlocal published, errors, first_error, last_report
                async with limiter:
                    acks = await client.publish_batch(chunk)
                assert acks is not None
                for a in acks:
                    if not a.ok:  # a duplicate (Nats-Msg-Id) counts as published
                        errors += 1
                        first_error = first_error or str(a.error)
                    else:
                        published += 1
                now = time.perf_counter()
                if now - last_report >= 1:
                    last_report = now
                    print(f"load: {published + errors:,}/{len(messages):,} published", file=sys.stderr, flush=True)

            async with trio.open_nursery() as nursery:
                for i in range(0, len(messages), batch):
                    await limiter.acquire()
                    limiter.release()
                    nursery.start_soon(send, messages[i : i + batch])
    except OSError as exc:
        raise JobError(f"cannot reach the broker at {server}: {exc.strerror or exc}") from None
    except BrokerError as exc:
        raise JobError(f"{exc.code.name} ({int(exc.code)}): {exc.message}") from None
    result = {
        "published": published,
        "errors": errors,
        "skipped_expired": skipped,
        "seconds": round(time.perf_counter() - started, 2),
    }
    if first_error:
        result["first_error"] = first_error
    print(f"load: {published:,} published, {errors:,} refused, {skipped:,} skipped (expired)", file=sys.stderr, flush=True)
    return result
