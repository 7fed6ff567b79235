"""``ttlbroker stream report`` and ``consumer report``: natscli's report tables
(``nats stream report``, ``nats consumer report``), for ttlbroker's streams,
topics and partitions.

A NATS stream is what a ttlbroker topic is (its subjects, limits, storage and
consumers), so the stream report has a row per topic, under its stream; a stream
without topics has a row of its own. ``DELETED`` is natscli's count of deleted
messages: the offsets between each partition's first and last that hold no message
any more (deleted, purged by subject, removed by a limit or a TTL). Rows are sorted
as natscli sorts them: by bytes unless ``--consumers``, ``--messages``, ``--name``
or ``--storage`` says otherwise (then by stream and topic name).

The consumer report has a row per consumer of a topic (``consumer report STREAM
TOPIC``) or of every topic of a stream (``consumer report STREAM``): its mode, ack
policy and wait, deliveries, what waits for an ack, what was redelivered, the
waiting pulls, what it has not yet had (``UNPROCESSED``, with its share of the
topic's messages as natscli shows it) and its ack floor (per partition when the
topic has several).

``--raw`` prints the numbers unformatted; ``--json`` prints one object per row.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from protocol import TopicDetails

from ._args import ident
from ._output import Out, count, duration, size
from ._tables import EMPTY
from broker.client import Client, ConsumerInfo

__all__ = ["stream_report", "consumer_report", "deleted_count"]


def deleted_count(t: TopicDetails) -> int:
    """The offsets between each partition's first and last that hold no message."""
    total = 0
    details: Mapping[str, Any] = t.extra  # msgpack: what docs/protocol.md says each key holds
    for p in details.get("partitions", []):
        span = p["last_offset"] - p["first_offset"] + 1
        total += max(0, span - p["messages"])
    return total


def _numbers(raw: bool) -> tuple[Callable[[int], str], Callable[[int], str]]:
    """How counts and byte sizes are printed: for people, or unformatted (``--raw``)."""
    return (str, str) if raw else (count, size)


#: ``stream report``'s sort options -> the row field they sort by (bytes otherwise).
_SORTS = {"sort_consumers": "consumers", "sort_messages": "messages", "sort_name": "name", "sort_storage": "storage"}


async def stream_report(c: Client, args: argparse.Namespace, out: Out) -> None:
    rows: list[dict[str, Any]] = []
    for s in await c.list_streams():
        topics = await c.list_topics(s.id)
        if not topics:
            rows.append({"stream": s.name, "topic": None, "storage": None, "partitions": 0, "consumers": 0,
                         "messages": 0, "bytes": 0, "deleted": 0})
        for t in topics:
            details: Mapping[str, Any] = t.extra
            rows.append({
                "stream": s.name, "topic": t.name, "storage": t.options.get("storage", "file"),
                "partitions": t.partitions_count, "consumers": len(details.get("consumers", [])),
                "messages": t.messages_count, "bytes": t.size, "deleted": deleted_count(t),
            })
    if not rows:
        out.note(EMPTY["streams"])
        return
    by = next((field for option, field in _SORTS.items() if getattr(args, option)), "bytes")
    rows.sort(key=lambda r: (0 if by == "name" else r[by] or "" if by == "storage" else r[by], r["stream"], r["topic"] or ""))
    if out.json:
        for r in rows:
            out.obj(r)
        return
    n, b = _numbers(args.raw)
    out.table(
        ["STREAM", "TOPIC", "STORAGE", "PARTITIONS>", "CONSUMERS>", "MESSAGES>", "BYTES>", "DELETED>"],
        [[r["stream"], r["topic"] or "-", r["storage"] or "-", str(r["partitions"]), n(r["consumers"]), n(r["messages"]),
          b(r["bytes"]), n(r["deleted"])] for r in rows],
        title="Stream Report",
    )


def _unprocessed(pending: int, messages: int, raw: bool) -> str:
    """natscli's ``UNPROCESSED``: ``1,234 / 12%`` of the topic's messages (at most
    100%), ``0`` when nothing is pending."""
    if raw or not pending:
        return str(pending)
    share = 100 if not messages else min(100, math.floor(pending / messages * 100))
    return f"{count(pending)} / {share}%"


def _ack_floor(info: ConsumerInfo) -> list[int]:
    return [p.get("ack_floor", 0) for p in info.partitions]


async def consumer_report(c: Client, args: argparse.Namespace, out: Out) -> None:
    s = ident(args.stream)
    topics: Sequence[TopicDetails] = [await c.get_topic(s, ident(args.topic))] if args.topic else await c.list_topics(s)
    rows: list[tuple[TopicDetails, ConsumerInfo]] = []
    for t in topics:
        rows += [(t, info) for info in await c.list_consumers(s, t.id)]
    if out.json:
        for t, info in rows:
            cfg = info.config
            out.obj({
                "stream": info.get("stream", args.stream), "topic": t.name, "name": info.name, "mode": cfg.get("mode"),
                "ack_policy": cfg.get("ack_policy"), "ack_wait": cfg.get("ack_wait"),
                "delivered": info.get("delivered", {}).get("consumer_seq", 0), "num_ack_pending": info.num_ack_pending,
                "num_redelivered": info.num_redelivered, "num_waiting": info.num_waiting, "num_pending": info.num_pending,
                "topic_messages": t.messages_count, "ack_floor": _ack_floor(info),
            })
        return
    if not rows:
        out.note(EMPTY["consumers"])
        return
    whole_stream = not args.topic
    where = str(args.stream) if whole_stream else f"{args.stream}/{topics[0].name}"
    n, _ = _numbers(args.raw)
    table = []
    for t, info in rows:
        cfg = info.config
        floors = _ack_floor(info)
        table.append(([t.name] if whole_stream else []) + [
            info.name, str(cfg.get("mode")), str(cfg.get("ack_policy")), duration(cfg.get("ack_wait", 0)),
            n(info.get("delivered", {}).get("consumer_seq", 0)), n(info.num_ack_pending), n(info.num_redelivered),
            n(info.num_waiting), _unprocessed(info.num_pending, t.messages_count, args.raw),
            n(floors[0]) if len(floors) == 1 else ", ".join(f"{p}:{f}" for p, f in enumerate(floors)),
        ])
    out.table(
        (["TOPIC"] if whole_stream else []) + [
            "CONSUMER", "MODE", "ACK POLICY", "ACK WAIT", "DELIVERED>", "ACK PENDING>", "REDELIVERED>", "WAITING>",
            "UNPROCESSED>", "ACK FLOOR>",
        ],
        table,
        title=f"Consumer report for {where} with {count(len(rows))} consumer{'' if len(rows) == 1 else 's'}",
    )
