"""Persisted publish and fetch throughput: ttlbroker against nats-server (JetStream).

Starts, one after the other in the same run, a ttlbroker under each fsync policy
(``always``, ``200ms``, ``never``) and a ``nats-server -js`` with its default sync
(a background fsync every 2 minutes) and with ``sync_interval: always``. Each server
gets a fresh temporary directory and a free loopback port, and is driven by its own
Python client on a uvloop event loop (``broker.client.aio``; ``nats-py``), from
one connection. Messages have a 128-byte payload and one subject.

Workloads (N = ``--messages``):

* **publish, awaited one by one** (``--serial``, default N/20): ``await
  client.publish(...)`` / ``await js.publish(...)``, one at a time.
* **publish, pipelined, 1,000 in flight** (N): a sliding window of 1,000
  unacknowledged publishes, each its own request and ack. ttlbroker: 1,000
  concurrent ``client.publish`` tasks; nats: ``js.publish_async`` with
  ``publish_async_max_pending=1000``, then ``publish_async_completed()``.
* **publish_batch, 1,000 per batch, 4 batches in flight** (``--batched``, default
  5N), ttlbroker only: ``client.publish_batch`` of 1,000 ``(subject, payload)``
  tuples, one ack each. nats-py has no batch publish, so its column repeats its
  pipelined number, the best nats-py offers.
* **fetch, pages of 1,000, one at a time**: read back every message the server
  stored. ttlbroker: ``client.fetch(stream, topic, 0, offset, 1000)`` from
  ``next_offset`` to the end; nats: a pull consumer with ``AckPolicy.NONE`` (no
  acks are sent: a plain read, like ttlbroker's fetch) and ``sub.fetch(1000)``.
* **read, pipelined**: the same, with read-ahead. ttlbroker: 4 fetches of 1,000 in
  flight (page starts computed from the partition's offsets, which have no gaps
  here); nats: an ordered consumer (``js.subscribe(ordered_consumer=True,
  cb=...)``), where the server pushes the stream with flow control: the fastest
  read path nats-py has.

With ``--tls`` every ttlbroker policy runs twice, plain and over TLS (a certificate
made for the run by ``bench/_harness.make_certs``; the client verifies it), and a
table sets the two side by side.

Every phase is also capped at ``--max-seconds`` (then the rate is over what it did).
Progress goes to stderr, the table to stdout; ``--json PATH`` also writes a JSON
record. Run from the repository root::

    .venv/bin/python bench/publish_fetch.py            # the full run, ~3 minutes
    .venv/bin/python bench/publish_fetch.py --quick    # a smoke test, < 30 s
    .venv/bin/python bench/publish_fetch.py --only ttlbroker --tls --policies never   # TLS on and off
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    print_cpu_share,
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
    run_uvloop,
    write_json,
    log_environment,
)

SUBJECT = "bench.publish"
PAYLOAD = random.Random(0).randbytes(128)
WINDOW = 1000  # publishes in flight, pipelined
BATCH = 1000  # messages per publish_batch
BATCHES_IN_FLIGHT = 4
PAGE = 1000  # messages per fetch
PAGES_IN_FLIGHT = 4

TTL_POLICIES = ("always", "200ms", "never")
NATS_SYNCS = ("default", "always")


def workload_labels() -> dict[str, str]:
    return {
        "serial": "publish, awaited one by one",
        "pipelined": f"publish, pipelined, {WINDOW:,} in flight",
        "batched": f"publish_batch {BATCH:,}, {BATCHES_IN_FLIGHT} in flight",
        "fetch": f"fetch {PAGE:,}, one at a time",
        "read_ahead": f"read, pipelined (fetch {PAGE:,}, {PAGES_IN_FLIGHT} in flight)",
    }


WORKLOADS = workload_labels()
#: The nats measurement each ttlbroker workload is compared with; the ones marked
#: with * in the table are the closest thing nats-py has, not the same operation.
NATS_FOR = {"serial": "serial", "pipelined": "pipelined", "batched": "pipelined", "fetch": "fetch",
            "read_ahead": "ordered"}
NATS_SUBSTITUTE = {
    "batched": "nats-py has no batch publish: the nats columns repeat its pipelined publish_async number.",
    "read_ahead": "nats: an ordered push consumer (server-paced, flow-controlled), nats-py's fastest read path.",
}

Phase = Callable[[Progress], Awaitable[tuple[int, int]]]


def _check_every(done: int, progress: Progress, deadline: float) -> bool:
    """Progress and the time cap, checked every few hundred messages; True = stop."""
    progress.update(done)
    return time.perf_counter() > deadline


async def _sliding_window(start: Callable[[], Awaitable[Any]], count: Callable[[Any], tuple[int, int]],
                          total_units: int, window: int, progress: Progress, deadline: float,
                          units_per_start: int = 1) -> tuple[int, int]:
    """Keep ``window`` requests in flight until ``total_units`` are issued.

    ``start()`` makes one request's coroutine; ``count(result)`` turns its result
    into ``(messages stored, messages refused)``.
    """
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(window)
    pending: set[asyncio.Task[Any]] = set()
    totals = [0, 0]

    def on_done(t: asyncio.Task[Any]) -> None:
        pending.discard(t)
        sem.release()
        if t.cancelled():
            totals[1] += units_per_start
        elif t.exception() is not None:
            totals[1] += units_per_start
            if totals[1] == units_per_start:
                log(f"    first error: {t.exception()!r}")
        else:
            ok, bad = count(t.result())
            totals[0] += ok
            totals[1] += bad

    issued = 0
    while issued < total_units:
        await sem.acquire()
        t = loop.create_task(start())
        pending.add(t)
        t.add_done_callback(on_done)
        issued += units_per_start
        if issued % (16 * units_per_start) == 0 or units_per_start > 1:
            progress.update(totals[0])
            if time.perf_counter() > deadline:
                break
    if pending:
        await asyncio.wait(pending)
    return totals[0], totals[1]


# -- ttlbroker ---------------------------------------------------------------------------


async def run_ttlbroker(address: str, n: dict[str, int], max_seconds: float, pid: int | None = None,
                        tls: Any = None) -> dict[str, Rate]:
    from broker.client import BrokerError, aio

    out: dict[str, Rate] = {}
    async with aio.connect(address, name="bench-publish-fetch", tls=tls) as c:
        await c.create_stream("bench")
        await c.create_topic("bench", "publish", partitions=1, subjects=["bench.>"])
        publish = c.publish

        # Warm-up (not timed): creates the segment files and settles the connection.
        await c.publish_batch([(SUBJECT, PAYLOAD)] * min(BATCH, n["pipelined"]))

        async def serial(progress: Progress) -> tuple[int, int]:
            deadline = time.perf_counter() + max_seconds
            done = errors = 0
            for i in range(n["serial"]):
                try:
                    await publish(SUBJECT, PAYLOAD)
                    done += 1
                except BrokerError as exc:
                    errors += 1
                    if errors == 1:
                        log(f"    first error: {exc!r}")
                if not i & 127 and _check_every(done, progress, deadline):
                    break
            return done, errors

        async def pipelined(progress: Progress) -> tuple[int, int]:
            return await _sliding_window(
                lambda: publish(SUBJECT, PAYLOAD), lambda ack: (1, 0),
                n["pipelined"], WINDOW, progress, time.perf_counter() + max_seconds,
            )

        batch = [(SUBJECT, PAYLOAD)] * BATCH

        def count_acks(acks: Any) -> tuple[int, int]:
            bad = len(acks.errors)
            if bad and not count_acks.logged:  # type: ignore[attr-defined]
                count_acks.logged = True  # type: ignore[attr-defined]
                log(f"    first refused message: {next(iter(acks.errors.values()))}")
            return len(acks) - bad, bad

        count_acks.logged = False  # type: ignore[attr-defined]

        async def batched(progress: Progress) -> tuple[int, int]:
            return await _sliding_window(
                lambda: c.publish_batch(batch), count_acks,
                n["batched"], BATCHES_IN_FLIGHT, progress, time.perf_counter() + max_seconds,
                units_per_start=BATCH,
            )

        async def fetch(progress: Progress) -> tuple[int, int]:
            deadline = time.perf_counter() + max_seconds
            offset, got = 1, 0
            while True:
                page = await c.fetch("bench", "publish", 0, offset, PAGE)
                msgs = page.messages
                if not msgs:
                    break
                if got == 0 and msgs[0].payload != PAYLOAD:
                    raise AssertionError("fetched a payload that differs from the published one")
                got += len(msgs)
                offset = page.next_offset
                progress.update(got)
                if time.perf_counter() > deadline:
                    break
            return got, 0

        async def read_ahead(progress: Progress) -> tuple[int, int]:
            first = await c.fetch("bench", "publish", 0, 1, 1)
            starts = range(first.first_offset, first.last_offset + 1, PAGE)
            it = iter(starts)
            return await _sliding_window(
                lambda: c.fetch("bench", "publish", 0, next(it), PAGE), lambda page: (len(page.messages), 0),
                len(starts) * PAGE, PAGES_IN_FLIGHT, progress, time.perf_counter() + max_seconds, units_per_start=PAGE,
            )

        phases: dict[str, Phase] = {"serial": serial, "pipelined": pipelined, "batched": batched}
        for key, phase in phases.items():
            if n[key] > 0:
                out[key] = await measure(WORKLOADS[key], phase, n[key], pid)
        if n["fetch"]:
            stored = (await c.get_topic("bench", "publish")).messages_count
            out["fetch"] = await measure(WORKLOADS["fetch"] + f" ({stored:,} stored)", fetch, stored, pid)
            out["read_ahead"] = await measure(WORKLOADS["read_ahead"], read_ahead, stored, pid)
    return out


# -- nats ---------------------------------------------------------------------------------


async def run_nats(url: str, n: dict[str, int], max_seconds: float, pid: int | None = None) -> dict[str, Rate]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    out: dict[str, Rate] = {}
    nc = await nats.connect(url, name="bench-publish-fetch", allow_reconnect=False)
    try:
        js = nc.jetstream(publish_async_max_pending=WINDOW, timeout=30)
        await js.add_stream(name="BENCH", subjects=["bench.>"], storage=StorageType.FILE)

        # Warm-up (not timed), as for ttlbroker.
        for _ in range(min(BATCH, n["pipelined"])):
            await js.publish_async(SUBJECT, PAYLOAD)
        await js.publish_async_completed()

        async def serial(progress: Progress) -> tuple[int, int]:
            deadline = time.perf_counter() + max_seconds
            done = errors = 0
            for i in range(n["serial"]):
                try:
                    await js.publish(SUBJECT, PAYLOAD)
                    done += 1
                except nats.errors.Error as exc:
                    errors += 1
                    if errors == 1:
                        log(f"    first error: {exc!r}")
                if not i & 127 and _check_every(done, progress, deadline):
                    break
            return done, errors

        async def pipelined(progress: Progress) -> tuple[int, int]:
            # publish_async itself keeps at most publish_async_max_pending (= WINDOW)
            # unacknowledged: it waits on a semaphore, as _sliding_window does.
            deadline = time.perf_counter() + max_seconds
            totals = [0, 0]

            def on_ack(f: asyncio.Future[Any]) -> None:
                if f.cancelled() or f.exception() is not None:
                    totals[1] += 1
                    if totals[1] == 1:
                        log(f"    first error: {f.exception() if not f.cancelled() else 'cancelled'!r}")
                else:
                    totals[0] += 1

            for i in range(n["pipelined"]):
                fut = await js.publish_async(SUBJECT, PAYLOAD)
                fut.add_done_callback(on_ack)
                if not i & 1023 and _check_every(totals[0], progress, deadline):
                    break
            await js.publish_async_completed()
            await asyncio.sleep(0)  # let the last done-callbacks run
            return totals[0], totals[1]

        async def fetch(progress: Progress) -> tuple[int, int]:
            deadline = time.perf_counter() + max_seconds
            sub = await js.pull_subscribe(
                SUBJECT, stream="BENCH",
                config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
            )
            got = 0
            while got < stored:
                msgs = await sub.fetch(min(PAGE, stored - got), timeout=10)
                if got == 0 and msgs[0].data != PAYLOAD:
                    raise AssertionError("fetched a payload that differs from the published one")
                got += len(msgs)
                progress.update(got)
                if time.perf_counter() > deadline:
                    break
            await sub.unsubscribe()
            return got, 0

        async def ordered(progress: Progress) -> tuple[int, int]:
            deadline = time.perf_counter() + max_seconds
            loop = asyncio.get_running_loop()
            finished = loop.create_future()
            got = [0]

            async def on_msg(msg: Any) -> None:
                got[0] += 1
                if got[0] >= stored or (not got[0] & 1023 and time.perf_counter() > deadline):
                    if not finished.done():
                        finished.set_result(None)
                elif not got[0] & 1023:
                    progress.update(got[0])

            sub = await js.subscribe(SUBJECT, stream="BENCH", ordered_consumer=True, cb=on_msg)
            await finished
            await sub.unsubscribe()
            return got[0], 0

        for key, phase in {"serial": serial, "pipelined": pipelined}.items():
            if n[key] > 0:
                out[key] = await measure(WORKLOADS[key], phase, n[key], pid)
        if n["fetch"]:
            stored = (await js.stream_info("BENCH")).state.messages
            out["fetch"] = await measure(WORKLOADS["fetch"] + f" ({stored:,} stored)", fetch, stored, pid)
            out["ordered"] = await measure("read, ordered consumer", ordered, stored, pid)
    finally:
        await nc.close()
    return out


# -- report ---------------------------------------------------------------------------------


def _rate(results: dict[str, dict[str, Rate]], server: str, workload: str) -> float | None:
    r = results.get(server, {}).get(workload)
    return r.per_second if r is not None else None


def report(results: dict[str, dict[str, Rate]]) -> str:
    """The table: one row per workload and ttlbroker policy, with both nats columns."""
    headers = ["workload", "ttlbroker fsync", "ttlbroker msgs/s", "nats default msgs/s",
               "nats sync always msgs/s", "ttlbroker / nats default", "ttlbroker / nats always"]
    rows = []
    marks: dict[str, str] = {}
    policies = [server.split(" ", 1)[1] for server in results if server.startswith("ttlbroker ")]
    for key, label in WORKLOADS.items():
        nats_key = NATS_FOR[key]
        if key == "batched" and not policies:
            continue  # nothing but a repeat of the pipelined nats numbers
        nd, na = _rate(results, "nats default", nats_key), _rate(results, "nats always", nats_key)
        mark = ""
        if key in NATS_SUBSTITUTE and (nd or na):
            mark = marks.setdefault(key, " " + "*" * (len(marks) + 1))
        first = True
        for policy in policies or [""]:
            tb = _rate(results, f"ttlbroker {policy}", key)
            if tb is None and nd is None and na is None:
                continue
            rows.append([label if first else "", policy, fmt_rate(tb), fmt_rate(nd) + mark, fmt_rate(na) + mark,
                         fmt_ratio(tb, nd), fmt_ratio(tb, na)])
            first = False
    text = format_table(headers, rows, right=(2, 3, 4, 5, 6))
    if marks:
        text += "\n\n" + "\n".join(f"{m.strip()} {NATS_SUBSTITUTE[k]}" for k, m in marks.items())
    errors = [f"{server} {key}: {r.errors:,}" for server, rs in results.items() for key, r in rs.items() if r.errors]
    if errors:
        text += "\n\nERRORS (messages refused or failed): " + "; ".join(errors)
    return text


def cpu_table(results: dict[str, dict[str, Rate]]) -> str:
    """CPU microseconds per message, client and server, for every measurement: where
    the time goes (a side near its wall-clock share per message is the bottleneck)."""
    rows = []
    for server, rs in results.items():
        for key, r in rs.items():
            c, s = r.cpu_us_per_msg()
            wall = 1e6 / r.per_second if r.per_second else None
            label = WORKLOADS.get(key, "read, ordered consumer" if key == "ordered" else key)
            rows.append([server, label, "" if wall is None else f"{wall:.1f}",
                         "" if c is None else f"{c:.1f}", "" if s is None else f"{s:.1f}"])
    if not rows:
        return ""
    return format_table(["server", "workload", "wall µs/msg", "client CPU µs/msg", "server CPU µs/msg"],
                        rows, right=(2, 3, 4))


def targets(results: dict[str, dict[str, Rate]]) -> str:
    """This benchmark's first targets, each against what was measured."""
    rows = []
    policies = [server.split(" ", 1)[1] for server in results if server.startswith("ttlbroker ")]

    def row(what: str, value: float | None, goal: float | None, unit: str) -> None:
        if value is None or goal is None:
            return
        ok = "met" if value >= goal else "MISSED"
        fmt = (lambda v: f"{v:,.0f} msgs/s") if unit == "rate" else (lambda v: f"{v:.2f}x")
        rows.append([what, fmt(value), fmt(goal), ok])

    for policy in policies:
        row(f"batched pipelined publish, fsync={policy}", _rate(results, f"ttlbroker {policy}", "batched"), 400_000, "rate")
    for policy in policies:
        equal = "nats always" if policy.split()[0] == "always" else "nats default"
        tb, nt = _rate(results, f"ttlbroker {policy}", "serial"), _rate(results, equal, "serial")
        row(f"one-by-one publish, fsync={policy} vs {equal}", tb / nt if tb and nt else None, 2.0, "ratio")
    for policy in policies:
        row(f"fetch one at a time, fsync={policy}", _rate(results, f"ttlbroker {policy}", "fetch"), 400_000, "rate")
    for policy in policies:
        row(f"fetch 4 in flight, fsync={policy}", _rate(results, f"ttlbroker {policy}", "read_ahead"), 400_000, "rate")
    if not rows:
        return ""
    return format_table(["target", "measured", "goal", ""], rows, right=(1, 2))


def tls_table(results: dict[str, dict[str, Rate]]) -> str:
    """Each ttlbroker policy's workloads with TLS off and on, side by side."""
    rows = []
    for server in results:
        if not server.startswith("ttlbroker ") or server.endswith(" tls") or f"{server} tls" not in results:
            continue
        policy = server.split(" ", 1)[1]
        for key, label in WORKLOADS.items():
            plain, tls = _rate(results, server, key), _rate(results, f"{server} tls", key)
            if plain is None and tls is None:
                continue
            change = f"{(tls / plain - 1) * 100:+.0f}%" if plain and tls else ""
            rows.append([label, policy, fmt_rate(plain), fmt_rate(tls), fmt_ratio(tls, plain), change])
    if not rows:
        return ""
    return format_table(["workload", "ttlbroker fsync", "plain msgs/s", "TLS msgs/s", "TLS / plain", "change"],
                        rows, right=(2, 3, 4, 5))


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=None, metavar="N",
                   help="pipelined publishes per server (default 200,000; 20,000 with --quick)")
    p.add_argument("--serial", type=int, default=None, metavar="N", help="one-by-one publishes (default N/20)")
    p.add_argument("--batched", type=int, default=None, metavar="N", help="messages sent with publish_batch (default 5N)")
    p.add_argument("--no-fetch", action="store_true", help="skip the fetch phases")
    p.add_argument("--window", type=int, default=WINDOW, help=f"publishes in flight when pipelined (default {WINDOW})")
    p.add_argument("--batch-size", type=int, default=BATCH, help=f"messages per publish_batch (default {BATCH})")
    p.add_argument("--batches-in-flight", type=int, default=BATCHES_IN_FLIGHT,
                   help=f"publish_batch calls in flight (default {BATCHES_IN_FLIGHT})")
    p.add_argument("--pages-in-flight", type=int, default=PAGES_IN_FLIGHT,
                   help=f"fetches in flight when reading ahead (default {PAGES_IN_FLIGHT})")
    p.add_argument("--only", choices=("ttlbroker", "nats"), help="run one side only")
    p.add_argument("--tls", action="store_true",
                   help="run every ttlbroker policy twice, plain and over TLS, and compare them")
    p.add_argument("--policies", default=",".join(TTL_POLICIES),
                   help="ttlbroker fsync policies to run, comma-separated (default: always,200ms,never)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="cap on each phase; the rate is over what it did (default 30; 5 with --quick)")
    p.add_argument("--quick", action="store_true", help="a smoke test: small counts, finishes in < 30 s")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (e.g. bench/results/x.json)")
    p.add_argument("--keep-temp", action="store_true", help="keep the servers' temporary directories")
    args = p.parse_args(argv)
    if args.messages is None:
        args.messages = 20_000 if args.quick else 200_000
    if args.serial is None:
        args.serial = max(1, args.messages // 20)
    if args.batched is None:
        args.batched = 5 * args.messages
    if args.max_seconds is None:
        args.max_seconds = 5.0 if args.quick else 30.0
    args.policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    for name in ("messages", "serial", "batched"):
        if getattr(args, name) < 0:
            p.error(f"--{name} must be >= 0")
    for name in ("window", "batch_size", "batches_in_flight", "pages_in_flight"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    global WINDOW, BATCH, BATCHES_IN_FLIGHT, PAGES_IN_FLIGHT, WORKLOADS
    args = parse_args(argv)
    WINDOW, BATCH, BATCHES_IN_FLIGHT, PAGES_IN_FLIGHT = (
        args.window, args.batch_size, args.batches_in_flight, args.pages_in_flight)
    WORKLOADS = workload_labels()
    counts = {"serial": args.serial, "pipelined": args.messages, "batched": args.batched, "fetch": 0 if args.no_fetch else 1}
    env = environment()
    log(f"publish_fetch: {args.serial:,} one-by-one, {args.messages:,} pipelined, {args.batched:,} batched "
        f"publishes of {len(PAYLOAD)} bytes per server; phases capped at {args.max_seconds:g} s")
    log_environment(env)
    results: dict[str, dict[str, Rate]] = {}
    t0 = time.perf_counter()
    cpu = CpuWatch()
    with Harness("ttlbench", keep_temp=args.keep_temp) as h:
        if args.only != "nats":
            for policy in args.policies:
                for tls in (False, True) if args.tls else (False,):
                    with h.ttlbroker(fsync=policy, tls=tls) as srv:
                        log(f"{srv.label} on {srv.address}")
                        results[f"ttlbroker {policy}{' tls' if tls else ''}"] = run_uvloop(
                            run_ttlbroker(srv.address, counts, args.max_seconds, srv.proc.pid, srv.client_tls()))
        if args.only != "ttlbroker":
            for sync in NATS_SYNCS:
                with h.nats(sync_interval=None if sync == "default" else sync) as srv:
                    log(f"{srv.label} on {srv.address}")
                    nats_counts = {**counts, "batched": 0}
                    results[f"nats {sync}"] = run_uvloop(run_nats(srv.url, nats_counts, args.max_seconds, srv.proc.pid))
    elapsed = time.perf_counter() - t0
    env["load_avg_at_end"] = os.getloadavg()
    env["cpu_during_run"] = others = cpu.stop()

    print()
    print(f"publish_fetch: {len(PAYLOAD)}-byte payloads, one connection per server, uvloop clients "
          f"({env['cpus']} CPUs, {env['date']}, {elapsed:.0f} s total, load average "
          f"{env['load_avg_at_start'][0]:.2f} at start, {env['load_avg_at_end'][0]:.2f} at end)")
    print_cpu_share(others)
    print()
    print(report(results))
    t = tls_table(results)
    if t:
        print()
        print("TLS off and on (the same client and workload; TLS 1.3, the certificate made for the run):")
        print()
        print(t)
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
    if args.json:
        record = {
            "benchmark": "publish_fetch",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "environment": env,
            "settings": {"payload_bytes": len(PAYLOAD), "window": WINDOW, "batch": BATCH,
                         "batches_in_flight": BATCHES_IN_FLIGHT, "page": PAGE,
                         "pages_in_flight": PAGES_IN_FLIGHT,
                         "counts": {**counts, "fetch": "every stored message" if counts["fetch"] else 0},
                         "max_seconds": args.max_seconds, "tls": args.tls},
            "elapsed_s": round(elapsed, 1),
            "results": {server: {k: r.as_dict() for k, r in rs.items()} for server, rs in results.items()},
        }
        log(f"wrote {write_json(args.json, record)}")
    return 1 if any(r.errors for rs in results.values() for r in rs.values()) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers stopped and temporary directories removed")
        sys.exit(130)
