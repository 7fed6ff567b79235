"""Durable consumers: ttlbroker against nats-server (JetStream pull consumers).

Starts a ttlbroker (``--fsync always``, its default; ``--fsync`` to change) and a
``nats-server -js`` (its default sync, a background fsync every 2 minutes;
``--nats-sync always`` to fsync every write), one after the other, each in a fresh temporary directory on a free
loopback port, driven by its Python client on uvloop (``broker.client.aio``;
``nats-py``). Payloads are 128 bytes.

Measurements (N = ``--messages``, default 200,000; 10,000 with ``--quick``):

1. **consume and ack**: N messages are stored first (not timed: ttlbroker
   ``publish_batch`` of 1,000; nats ``publish_async``), then one durable consumer
   with explicit acks reads and acks all of them. ttlbroker:
   ``create_consumer(..., ack_wait=30)`` and ``async with client.consume(...,
   batch=1000) as msgs: async for m in msgs: await m.ack()`` (acks queued and sent
   once per turn of the event loop, no response); the time includes leaving the
   block, which waits until the queued acks are durable. nats:
   ``js.pull_subscribe(subject, durable=..., config=ConsumerConfig(ack_wait=30))``,
   ``await sub.fetch(1000)`` and ``await m.ack()`` for each, then ``nc.flush()``.
   Both consumers keep their server's default ``max_ack_pending`` (1,000). After
   the phase, each consumer's info must show nothing pending and nothing unacked.
2. **publish-to-delivery latency**: a consumer waits for new messages on a fresh
   subject while a second connection (same process, same event loop) publishes
   ``--rate`` (1,000) messages/s for ``--seconds`` (5) s, each publish awaited in
   its own task started on a fixed schedule (ttlbroker: fsync ``always``, so a
   message is delivered only once durable; nats: default sync). The payload carries
   ``time.monotonic_ns()`` taken just before the publish; latency = receive time
   minus that. ttlbroker: ``client.consume(batch=100)``; nats: a push consumer
   (``js.subscribe(durable=..., manual_ack=True, cb=...)``), because nats-py's
   ``fetch(batch>1)`` on an empty stream holds the first message until the batch
   fills or the request expires. Every message is acked. p50/p99/max.
3. **redelivery precision**: a consumer with ``ack_wait=1`` s; ``--redeliver`` R
   (1,000) messages pulled without acking, in 10 pulls spaced 100 ms apart (so the
   deadlines spread over a second); then a waiting loop pulls until every message
   comes back with ``num_delivered == 2`` and acks it. Lateness = time of the second
   receipt minus (time of the first + ack_wait). The ack wait starts on the server
   when it sends the message, slightly before the client receives it, so a value
   can be a little below zero without a deadline firing early: only values below
   ``-1`` ms count as early. nats too, with the same pattern sent as raw pull
   requests (``$JS.API.CONSUMER.MSG.NEXT``: 10 ``no_wait`` pulls, then waiting pulls
   of 1,000 that expire after 600 ms, one every 500 ms) to an inbox whose callback
   times each message as it arrives: nats-py's ``fetch`` returns only whole batches.

Progress goes to stderr, the tables to stdout; a JSON record goes to
``bench/results/consume-<date>.json`` (``--json PATH`` to change it). Run from
the repository root::

    .venv/bin/python bench/consume.py            # the full run, ~1-2 minutes
    .venv/bin/python bench/consume.py --quick    # a smoke test, < 30 s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    RESULTS_DIR,
    CpuWatch,
    Harness,
    Progress,
    Rate,
    environment,
    fmt_rate,
    fmt_ratio,
    format_table,
    log,
    measure,
    print_cpu_share,
    run_uvloop,
    write_json,
    log_environment,
)

PAYLOAD = random.Random(0).randbytes(128)
BATCH = 1000  # messages per pull / fetch, and per publish_batch when loading
STREAM, TOPIC = "bench", "consume"
SUBJECT = "bench.consume"
LAT_SUBJECT = "lat.events"
RED_SUBJECT = "red.events"
RED_PULLS = 10  # the unacked messages are pulled in this many pulls ...
RED_SPACING = 0.1  # ... this many seconds apart
ACK_WAIT_REDELIVER = 1.0
EARLY_MS = -1.0  # a redelivery more than this early counts as early


def stamp() -> bytes:
    """A 128-byte payload starting with the send time (monotonic ns)."""
    return struct.pack("<q", time.monotonic_ns()) + PAYLOAD[8:]


def sent_at(payload: bytes) -> int:
    return struct.unpack_from("<q", payload)[0]


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1), nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def summary(values_ms: list[float]) -> dict[str, Any]:
    if not values_ms:
        return {"count": 0}
    return {"count": len(values_ms), "min": round(min(values_ms), 3), "p50": round(pct(values_ms, 0.5), 3),
            "p99": round(pct(values_ms, 0.99), 3), "max": round(max(values_ms), 3),
            "mean": round(statistics.fmean(values_ms), 3)}


async def _paced_publisher(publish: Any, rate: float, seconds: float, label: str) -> dict[str, Any]:
    """Start one awaited publish every 1/rate s for ``seconds`` s; returns counts."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[Any]] = set()
    counts = {"sent": 0, "errors": 0}

    def done(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if t.cancelled() or t.exception() is not None:
            counts["errors"] += 1
            if counts["errors"] == 1:
                log(f"    first publish error: {t.exception() if not t.cancelled() else 'cancelled'!r}")

    async def one() -> None:
        await publish(stamp())

    progress = Progress(label, round(rate * seconds))
    total = round(rate * seconds)
    t0 = time.monotonic()
    for i in range(total):
        due = t0 + i / rate
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        t = loop.create_task(one())
        tasks.add(t)
        t.add_done_callback(done)
        counts["sent"] += 1
        progress.update(i)
    if tasks:
        await asyncio.wait(tasks)
    counts["seconds"] = round(time.monotonic() - t0, 3)
    return counts


# -- ttlbroker ---------------------------------------------------------------------------


async def run_ttlbroker(address: str, args: argparse.Namespace, pid: int) -> dict[str, Any]:
    from broker.client import aio

    out: dict[str, Any] = {}
    async with aio.connect(address, name="bench-consume") as c, aio.connect(address, name="bench-consume-pub") as pub:
        await c.create_stream(STREAM)
        await c.create_topic(STREAM, TOPIC, partitions=1, subjects=["bench.>"])
        await c.create_topic(STREAM, "latency", partitions=1, subjects=["lat.>"])
        await c.create_topic(STREAM, "redeliver", partitions=1, subjects=["red.>"])

        # -- 1. consume and ack ------------------------------------------------------
        n = args.messages
        if n:
            t0 = time.perf_counter()
            batch = [(SUBJECT, PAYLOAD)] * BATCH
            sem = asyncio.Semaphore(4)

            async def load(k: int) -> None:
                async with sem:
                    acks = await c.publish_batch(batch[:k])
                    if acks.errors:
                        raise RuntimeError(f"refused while loading: {next(iter(acks.errors.values()))}")

            await asyncio.gather(*(load(min(BATCH, n - i)) for i in range(0, n, BATCH)))
            stored = (await c.get_topic(STREAM, TOPIC)).messages_count
            log(f"  stored {stored:,} messages in {time.perf_counter() - t0:.1f} s (not timed)")
            await c.create_consumer(STREAM, TOPIC, "acks", ack_wait=30)

            async def consume(progress: Progress) -> tuple[int, int]:
                got = 0
                async with c.consume(STREAM, TOPIC, "acks", batch=BATCH) as msgs:
                    async for m in msgs:
                        await m.ack()
                        got += 1
                        if not got & 1023:
                            progress.update(got)
                        if got >= stored:
                            break
                return got, 0

            out["consume"] = await measure(f"consume and ack ({stored:,} stored)", consume, stored, pid)
            info = await c.consumer_info(STREAM, TOPIC, "acks")
            out["consume_check"] = {"num_pending": info.num_pending, "num_ack_pending": info.num_ack_pending,
                                    "num_redelivered": info.num_redelivered}
            if info.num_pending or info.num_ack_pending:
                log(f"  WARNING: after the phase the consumer has {info.num_pending:,} pending, "
                    f"{info.num_ack_pending:,} unacked")

        # -- 2. latency -------------------------------------------------------------
        if args.seconds > 0:
            await c.create_consumer(STREAM, "latency", "lat", ack_wait=30)
            total = round(args.rate * args.seconds)
            lat: list[float] = []

            async def receive() -> None:
                async with c.consume(STREAM, "latency", "lat", batch=100) as msgs:
                    async for m in msgs:
                        lat.append((time.monotonic_ns() - sent_at(m.payload)) / 1e6)
                        await m.ack()
                        if len(lat) >= total:
                            break

            recv = asyncio.create_task(receive())
            await asyncio.sleep(0.2)
            pubs = await _paced_publisher(lambda p: pub.publish(LAT_SUBJECT, p), args.rate, args.seconds,
                                          "ttlbroker latency publishes")
            try:
                await asyncio.wait_for(recv, 10)
            except TimeoutError:
                log(f"  WARNING: only {len(lat):,} of {total:,} messages arrived")
            out["latency"] = {**summary(lat), **pubs}
            log(f"  latency: {out['latency']}")

        # -- 3. redelivery ----------------------------------------------------------
        if args.redeliver:
            out["redelivery"] = await _ttl_redelivery(c, args.redeliver)
            log(f"  redelivery lateness: {out['redelivery']}")
    return out


async def _ttl_redelivery(c: Any, r: int) -> dict[str, Any]:
    await c.publish_batch([(RED_SUBJECT, PAYLOAD)] * r)
    await c.create_consumer(STREAM, "redeliver", "red", ack_wait=ACK_WAIT_REDELIVER, max_ack_pending=max(1000, r))
    first: dict[tuple[int, int], int] = {}
    late: list[float] = []
    per = -(-r // RED_PULLS)
    for i in range(RED_PULLS):
        got = await c.pull(STREAM, "redeliver", "red", batch=per, no_wait=True)
        now = time.monotonic_ns()
        for m in got:
            first[(m.partition, m.offset)] = now
        if i < RED_PULLS - 1:
            await asyncio.sleep(RED_SPACING)
    log(f"  redelivery: {len(first):,} messages pulled, not acked; waiting for them to come back")
    deadline = time.monotonic() + ACK_WAIT_REDELIVER + RED_PULLS * RED_SPACING + 10
    back: set[tuple[int, int]] = set()
    other = 0
    async with c.consume(STREAM, "redeliver", "red", batch=1000) as msgs:
        while len(back) < len(first) and time.monotonic() < deadline:
            try:
                m = await msgs.next(timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                break
            now = time.monotonic_ns()
            key = (m.partition, m.offset)
            if m.num_delivered == 2 and key in first and key not in back:
                back.add(key)
                late.append((now - first[key]) / 1e6 - ACK_WAIT_REDELIVER * 1000)
            else:
                other += 1
            await m.ack()
    s = summary(late)
    s["pulled"] = len(first)
    s["unexpected_deliveries"] = other
    s["early"] = sum(1 for x in late if x < EARLY_MS)
    return s


# -- nats ---------------------------------------------------------------------------------


async def run_nats(url: str, args: argparse.Namespace, pid: int) -> dict[str, Any]:
    import nats
    from nats.js.api import ConsumerConfig, StorageType

    out: dict[str, Any] = {}
    nc = await nats.connect(url, name="bench-consume", allow_reconnect=False)
    pc = await nats.connect(url, name="bench-consume-pub", allow_reconnect=False)
    try:
        js = nc.jetstream(publish_async_max_pending=BATCH, timeout=30)
        pjs = pc.jetstream(timeout=30)
        await js.add_stream(name="BENCH", subjects=["bench.>"], storage=StorageType.FILE)
        await js.add_stream(name="LAT", subjects=["lat.>"], storage=StorageType.FILE)
        await js.add_stream(name="RED", subjects=["red.>"], storage=StorageType.FILE)

        # -- 1. consume and ack ------------------------------------------------------
        n = args.messages
        if n:
            t0 = time.perf_counter()
            for _ in range(n):
                await js.publish_async(SUBJECT, PAYLOAD)
            await js.publish_async_completed()
            stored = (await js.stream_info("BENCH")).state.messages
            log(f"  stored {stored:,} messages in {time.perf_counter() - t0:.1f} s (not timed)")
            sub = await js.pull_subscribe(SUBJECT, durable="acks", stream="BENCH",
                                          config=ConsumerConfig(ack_wait=30))

            async def consume(progress: Progress) -> tuple[int, int]:
                got = 0
                while got < stored:
                    msgs = await sub.fetch(BATCH, timeout=10)
                    for m in msgs:
                        await m.ack()
                    got += len(msgs)
                    progress.update(got)
                await nc.flush()
                return got, 0

            out["consume"] = await measure(f"consume and ack ({stored:,} stored)", consume, stored, pid)
            for _ in range(50):  # acks are processed asynchronously by the server (not timed)
                info = await js.consumer_info("BENCH", "acks")
                if not info.num_ack_pending:
                    break
                await asyncio.sleep(0.02)
            out["consume_check"] = {"num_pending": info.num_pending, "num_ack_pending": info.num_ack_pending,
                                    "num_redelivered": info.num_redelivered}
            await sub.unsubscribe()

        # -- 2. latency -------------------------------------------------------------
        if args.seconds > 0:
            total = round(args.rate * args.seconds)
            lat: list[float] = []
            finished = asyncio.get_running_loop().create_future()

            async def on_msg(m: Any) -> None:
                lat.append((time.monotonic_ns() - sent_at(m.data)) / 1e6)
                await m.ack()
                if len(lat) >= total and not finished.done():
                    finished.set_result(None)

            sub = await js.subscribe(LAT_SUBJECT, durable="lat", stream="LAT", manual_ack=True, cb=on_msg,
                                     config=ConsumerConfig(ack_wait=30))
            await asyncio.sleep(0.2)
            pubs = await _paced_publisher(lambda p: pjs.publish(LAT_SUBJECT, p), args.rate, args.seconds,
                                          "nats latency publishes")
            try:
                await asyncio.wait_for(finished, 10)
            except TimeoutError:
                log(f"  WARNING: only {len(lat):,} of {total:,} messages arrived")
            await sub.unsubscribe()
            out["latency"] = {**summary(lat), **pubs}
            log(f"  latency: {out['latency']}")

        # -- 3. redelivery ----------------------------------------------------------
        if args.redeliver:
            out["redelivery"] = await _nats_redelivery(js, args.redeliver)
            log(f"  redelivery lateness: {out['redelivery']}")
    finally:
        await pc.close()
        await nc.close()
    return out


async def _nats_redelivery(js: Any, r: int) -> dict[str, Any]:
    from nats.js.api import ConsumerConfig

    for _ in range(r):
        await js.publish_async(RED_SUBJECT, PAYLOAD)
    await js.publish_async_completed()
    await js.add_consumer("RED", ConsumerConfig(durable_name="red", ack_wait=ACK_WAIT_REDELIVER,
                                                max_ack_pending=max(1000, r)))
    # Pull requests sent by hand to an inbox, each message timed in the callback as
    # it arrives: nats-py's fetch() returns a batch only once it is complete (and
    # fetch(batch > 1) on an empty consumer holds what comes until the batch fills or
    # the request expires), which would time the client, not the server.
    nc = js._nc
    first: dict[int, int] = {}
    late: list[float] = []
    back: set[int] = set()
    received: list[Any] = []
    counts = {"other": 0}
    all_back = asyncio.get_running_loop().create_future()

    async def on_msg(m: Any) -> None:
        if not m.reply or not m.reply.startswith("$JS.ACK."):
            return  # a status message (no messages, request expired)
        now = time.monotonic_ns()
        seq, n = m.metadata.sequence.stream, m.metadata.num_delivered
        if n == 1 and seq not in first:
            first[seq] = now
        elif n == 2 and seq in first and seq not in back:
            back.add(seq)
            late.append((now - first[seq]) / 1e6 - ACK_WAIT_REDELIVER * 1000)
            received.append(m)
            if len(back) >= len(first) and not all_back.done():
                all_back.set_result(None)
        else:
            counts["other"] += 1
            received.append(m)

    inbox = nc.new_inbox()
    isub = await nc.subscribe(inbox, cb=on_msg)
    subject = "$JS.API.CONSUMER.MSG.NEXT.RED.red"
    per = -(-r // RED_PULLS)
    for i in range(RED_PULLS):
        await nc.publish(subject, json.dumps({"batch": per, "no_wait": True}).encode(), reply=inbox)
        await nc.flush()
        if i < RED_PULLS - 1:
            await asyncio.sleep(RED_SPACING)
    await asyncio.sleep(0.05)
    log(f"  redelivery: {len(first):,} messages pulled, not acked; waiting for them to come back")
    deadline = time.monotonic() + ACK_WAIT_REDELIVER + RED_PULLS * RED_SPACING + 10
    request = json.dumps({"batch": max(1000, r), "expires": 600_000_000}).encode()
    while len(back) < len(first) and time.monotonic() < deadline:
        await nc.publish(subject, request, reply=inbox)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(all_back), 0.5)
    for m in received:
        await m.ack()
    await nc.flush()
    await isub.unsubscribe()
    s = summary(late)
    s["pulled"] = len(first)
    s["unexpected_deliveries"] = counts["other"]
    s["early"] = sum(1 for x in late if x < EARLY_MS)
    return s


# -- report ---------------------------------------------------------------------------------


def _ms(d: dict[str, Any] | None, key: str) -> str:
    if not d or key not in d:
        return ""
    return f"{d[key]:.2f}"


def report(results: dict[str, dict[str, Any]]) -> str:
    tb, nt = results.get("ttlbroker", {}), results.get("nats", {})
    parts = []
    a = tb.get("consume")
    b = nt.get("consume")
    if a or b:
        parts.append(format_table(
            ["workload", "ttlbroker msgs/s", "nats msgs/s", "ttlbroker / nats"],
            [["consume and ack, durable consumer, batches of 1,000",
              fmt_rate(a.per_second if a else None), fmt_rate(b.per_second if b else None),
              fmt_ratio(a.per_second if a else None, b.per_second if b else None)]],
            right=(1, 2, 3)))
    rows = []
    for label, key in (("publish-to-delivery latency (ms)", "latency"), ("redelivery lateness (ms)", "redelivery")):
        for server, r in (("ttlbroker", tb), ("nats", nt)):
            d = r.get(key)
            if not d:
                continue
            rows.append([label, server, f"{d.get('count', 0):,}", _ms(d, "min"), _ms(d, "p50"), _ms(d, "p99"),
                         _ms(d, "max")])
            label = ""
    if rows:
        parts.append(format_table(["measurement", "server", "messages", "min", "p50", "p99", "max"], rows,
                                  right=(2, 3, 4, 5, 6)))
    notes = []
    for server, r in (("ttlbroker", tb), ("nats", nt)):
        lat = r.get("latency")
        if lat:
            notes.append(f"{server}: {lat.get('sent', 0):,} publishes in {lat.get('seconds', 0):.2f} s "
                         f"({lat.get('sent', 0) / max(lat.get('seconds', 1), 1e-9):,.0f}/s), {lat.get('errors', 0)} errors")
        red = r.get("redelivery")
        if red:
            notes.append(f"{server}: redelivery: {red.get('pulled', 0):,} pulled unacked, {red.get('count', 0):,} "
                         f"came back as delivery 2, {red.get('early', 0)} early (< {EARLY_MS:g} ms), "
                         f"{red.get('unexpected_deliveries', 0)} other deliveries")
        chk = r.get("consume_check")
        if chk:
            notes.append(f"{server}: after consume and ack: {chk['num_pending']:,} pending, "
                         f"{chk['num_ack_pending']:,} unacked, {chk['num_redelivered']:,} redelivered")
    if notes:
        parts.append("\n".join(notes))
    return "\n\n".join(parts)


def cpu_table(results: dict[str, dict[str, Any]]) -> str:
    rows = []
    for server, r in results.items():
        rate: Rate | None = r.get("consume")
        if rate is None:
            continue
        c, s = rate.cpu_us_per_msg()
        rows.append([server, f"{1e6 / rate.per_second:.2f}" if rate.per_second else "",
                     "" if c is None else f"{c:.2f}", "" if s is None else f"{s:.2f}"])
    if not rows:
        return ""
    return format_table(["consume and ack", "wall µs/msg", "client CPU µs/msg", "server CPU µs/msg"], rows,
                        right=(1, 2, 3))


def targets(results: dict[str, dict[str, Any]]) -> str:
    tb, nt = results.get("ttlbroker", {}), results.get("nats", {})
    rows = []
    a, b = tb.get("consume"), nt.get("consume")
    if a and b and b.per_second:
        ratio = a.per_second / b.per_second
        rows.append(["consume and ack, ttlbroker / nats", f"{ratio:.2f}x", ">= 5x", "met" if ratio >= 5 else "MISSED"])
    lat = tb.get("latency")
    if lat and lat.get("count"):
        rows.append(["publish-to-delivery p99, ttlbroker", f"{lat['p99']:.2f} ms", "< 5 ms",
                     "met" if lat["p99"] < 5 else "MISSED"])
    red = tb.get("redelivery")
    if red and red.get("count"):
        rows.append(["redelivery never early, ttlbroker", f"min {red['min']:.2f} ms, {red['early']} early",
                     f">= {EARLY_MS:g} ms", "met" if red["early"] == 0 else "MISSED"])
        rows.append(["redelivery lateness p99, ttlbroker", f"{red['p99']:.2f} ms", "<= 50 ms",
                     "met" if red["p99"] <= 50 else "MISSED"])
        if red["count"] < red["pulled"]:
            rows.append(["redelivered, ttlbroker", f"{red['count']:,} of {red['pulled']:,}", "all", "MISSED"])
    if not rows:
        return ""
    return format_table(["target", "measured", "goal", ""], rows, right=(1, 2))


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=None, metavar="N",
                   help="messages stored, then consumed and acked (default 200,000; 10,000 with --quick)")
    p.add_argument("--rate", type=float, default=1000.0, help="publishes per second in the latency phase (default 1000)")
    p.add_argument("--seconds", type=float, default=None,
                   help="length of the latency phase (default 5; 2 with --quick; 0 skips it)")
    p.add_argument("--redeliver", type=int, default=None, metavar="R",
                   help="messages pulled without acking in the redelivery phase (default 1,000; 200 with --quick; 0 skips)")
    p.add_argument("--only", choices=("ttlbroker", "nats"), help="run one side only")
    p.add_argument("--fsync", default="always", help="ttlbroker's fsync policy (default always)")
    p.add_argument("--nats-sync", default="default",
                   help="nats-server's sync_interval: default (a background sync every 2 min), always, or a duration")
    p.add_argument("--quick", action="store_true", help="a smoke test: small counts, finishes in < 30 s")
    p.add_argument("--json", metavar="PATH", help="where to write the JSON record "
                   "(default bench/results/consume-<date>.json)")
    p.add_argument("--no-json", action="store_true", help="write no JSON record")
    p.add_argument("--keep-temp", action="store_true", help="keep the servers' temporary directories")
    args = p.parse_args(argv)
    if args.messages is None:
        args.messages = 10_000 if args.quick else 200_000
    if args.seconds is None:
        args.seconds = 2.0 if args.quick else 5.0
    if args.redeliver is None:
        args.redeliver = 200 if args.quick else 1000
    for name in ("messages", "redeliver"):
        if getattr(args, name) < 0:
            p.error(f"--{name} must be >= 0")
    if args.seconds < 0 or args.rate <= 0:
        p.error("--seconds must be >= 0 and --rate > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    log(f"consume: {args.messages:,} stored messages of {len(PAYLOAD)} bytes; latency at {args.rate:g} msgs/s "
        f"for {args.seconds:g} s; {args.redeliver:,} redeliveries with ack_wait {ACK_WAIT_REDELIVER:g} s")
    log_environment(env)
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    cpu = CpuWatch()
    with Harness("consumebench", keep_temp=args.keep_temp) as h:
        if args.only != "nats":
            with h.ttlbroker(fsync=args.fsync) as srv:
                log(f"{srv.label} on {srv.address}")
                results["ttlbroker"] = run_uvloop(run_ttlbroker(srv.address, args, srv.proc.pid))
        if args.only != "ttlbroker":
            with h.nats(sync_interval=None if args.nats_sync == "default" else args.nats_sync) as srv:
                log(f"{srv.label} on {srv.address}")
                results["nats"] = run_uvloop(run_nats(srv.url, args, srv.proc.pid))
    elapsed = time.perf_counter() - t0
    env["load_avg_at_end"] = os.getloadavg()
    env["cpu_during_run"] = others = cpu.stop()

    print()
    print(f"consume: {len(PAYLOAD)}-byte payloads, ttlbroker fsync={args.fsync}, nats-server sync_interval={args.nats_sync}, "
          f"uvloop clients "
          f"({env['cpus']} CPUs, {env['date']}, {elapsed:.0f} s total, load average "
          f"{env['load_avg_at_start'][0]:.2f} at start, {env['load_avg_at_end'][0]:.2f} at end)")
    print_cpu_share(others)
    print()
    print(report(results))
    t = targets(results)
    if t:
        print()
        print("Targets:")
        print()
        print(t)
    c = cpu_table(results)
    if c:
        print()
        print("CPU per message (client = this process; nats-server uses several threads):")
        print()
        print(c)
    if not args.no_json:
        path = args.json or RESULTS_DIR / f"consume-{dt.date.today().isoformat()}{'-quick' if args.quick else ''}.json"
        record = {
            "benchmark": "consume",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "environment": env,
            "settings": {"payload_bytes": len(PAYLOAD), "messages": args.messages, "batch": BATCH,
                         "latency_rate": args.rate, "latency_seconds": args.seconds,
                         "redeliver": args.redeliver, "ack_wait_redeliver_s": ACK_WAIT_REDELIVER,
                         "ttlbroker_fsync": args.fsync, "nats_sync": args.nats_sync},
            "elapsed_s": round(elapsed, 1),
            "results": {server: {k: (v.as_dict() if isinstance(v, Rate) else v) for k, v in r.items()}
                        for server, r in results.items()},
        }
        log(f"wrote {write_json(path, record)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers stopped and temporary directories removed")
        sys.exit(130)
