"""What connections cost the broker: slow consumers and connections that never handshake.

Starts a ttlbroker subprocess (``ttlbroker serve --port 0 --data DIR``, the same entry
point as ``python -m broker serve``) on loopback with its default limits, and measures
its resident memory (VmRSS from ``/proc/PID/status``, sampled every 100 ms) in two
phases:

* **slow consumers**: ``--subscribers`` (100) raw connections handshake, subscribe to
  every subject of a topic and then never read a byte, while one asyncio client
  publishes ``--megabytes`` (500) MB to that topic in batches of 64 messages of
  16 KiB, 4 batches in flight. Every message is stored and offered to every
  subscriber: 100 times the published bytes of deliveries. Before the output budget
  and the slow-consumer limits the broker queued them all (6.6 GB RSS); now it queues
  at most the output budget (``limits.max_pending_bytes_total``, 512 MiB by default),
  cuts the subscribers off as slow consumers and drops what they cannot take.
* **connections that never handshake**: ``--attempts`` (10,000) connection attempts,
  ``--concurrency`` (2,000) at a time, each of which connects, sends nothing, and
  reads until the broker closes it. The broker holds at most
  ``limits.max_connections`` (1,024) of them, each until ``limits.handshake_timeout``
  (5 s) with a GOODBYE (HANDSHAKE_TIMEOUT); at the limit a new connection takes the
  place of the one that has waited longest (which gets a GOODBYE with
  TOO_MANY_CONNECTIONS). Meanwhile a well-behaved client connects and pings every
  250 ms, to show what an idle flood costs everyone else: it must always get in.

Progress goes to stderr, the tables to stdout. Run from the repository root::

    .venv/bin/python bench/connections.py                  # ~1-2 minutes
    .venv/bin/python bench/connections.py --megabytes 50 --attempts 2000   # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    Harness,
    Server,
    environment,
    format_table,
    log,
    proc_usage,
    run_uvloop,
    write_json,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import protocol as P  # noqa: E402
from broker.client.aio import connect  # noqa: E402

MiB = 1024 * 1024
PAYLOAD = 16 * 1024
BATCH = 64
IN_FLIGHT = 4


class RssWatch:
    """Samples a process's RSS every ``every`` seconds in the background."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.pid = pid
        self.every = every
        self.peak = 0
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    def now(self) -> int:
        rss = proc_usage(self.pid).rss
        self.peak = max(self.peak, rss)
        return rss

    async def _run(self) -> None:
        while True:
            self.now()
            self.samples += 1
            await asyncio.sleep(self.every)

    def __enter__(self) -> RssWatch:
        self.peak = self.now()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def mb(n: float) -> str:
    return f"{n / MiB:,.0f} MiB"


# -- phase 1: slow consumers ----------------------------------------------------------------


async def stuck_subscriber(address: str) -> asyncio.StreamWriter:
    """A connection that handshakes, subscribes to ``bench.>`` and never reads."""
    host, port = address.rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    hs = P.Handshake(P.PROTOCOL_VERSION, "", "stuck").encode()
    sub = P.Subscribe(1, "bench.>").encode()
    writer.write(P.encode_frame(P.Command.HANDSHAKE, 0, 1, 0, hs) + P.encode_frame(P.Command.SUBSCRIBE, 0, 2, 0, sub))
    await writer.drain()
    return writer


async def slow_consumers(srv: Server, subscribers: int, megabytes: int) -> dict[str, Any]:
    out: dict[str, Any] = {"subscribers": subscribers, "published_mb": megabytes}
    async with connect(srv.address, timeout=120) as c:
        await c.create_stream("bench")
        await c.create_topic("bench", "t", subjects=["bench.>"])
        out["rss_idle"] = proc_usage(srv.proc.pid).rss
        writers = [await stuck_subscriber(srv.address) for _ in range(subscribers)]
        await asyncio.sleep(0.5)
        out["rss_with_subscribers"] = proc_usage(srv.proc.pid).rss
        total = megabytes * 1000 * 1000
        batches = -(-total // (PAYLOAD * BATCH))
        batch = [("bench.x", b"p" * PAYLOAD)] * BATCH
        sem = asyncio.Semaphore(IN_FLIGHT)
        done = 0
        t0 = time.perf_counter()

        async def one() -> None:
            nonlocal done
            async with sem:
                acks = await c.publish_batch(batch)
                assert acks is not None
                acks.raise_for_errors()
                done += 1
                if done % 100 == 0:
                    log(f"  published {done * PAYLOAD * BATCH / 1e6:,.0f} MB")

        with RssWatch(srv.proc.pid) as rss:
            tasks = [asyncio.create_task(one()) for _ in range(batches)]
            await asyncio.gather(*tasks)
            out["publish_seconds"] = time.perf_counter() - t0
            out["rss_at_last_ack"] = rss.now()
            deadline = time.monotonic() + 30  # the watch cuts them off within seconds
            while True:
                stats = await c.stats()
                if stats["slow_consumers"] >= subscribers or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            out["cut_seconds"] = time.perf_counter() - t0
            await asyncio.sleep(1)
            out["rss_after"] = rss.now()
        out["rss_peak"] = rss.peak
        out["rss_samples"] = rss.samples
        for w in writers:
            w.close()
        for key in ("slow_consumers", "deliveries_dropped", "messages_out", "queued_bytes", "queued_bytes_max",
                    "queued_bytes_budget", "messages_in", "connections", "connections_failed"):
            out[key] = stats.get(key)
    return out


# -- phase 2: connections that never handshake ------------------------------------------------


async def idle_attempt(address: str, outcomes: Counter[str]) -> None:
    """Connect, send nothing, read until the broker closes; classify the close."""
    host, port = address.rsplit(":", 1)
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
    except OSError as exc:
        outcomes[f"connect failed ({type(exc).__name__})"] += 1
        return
    try:
        data = await asyncio.wait_for(reader.read(), 60)
    except (OSError, asyncio.TimeoutError) as exc:
        outcomes[f"read failed ({type(exc).__name__})"] += 1
        data = b""
    finally:
        writer.close()
    if len(data) >= 16:
        _, code, flags, _, status = struct.unpack_from("<IHHII", data)
        if flags & 0x2 and code == P.PushKind.GOODBYE:
            try:
                outcomes[P.ErrorCode(status).name] += 1
            except ValueError:
                outcomes[f"GOODBYE {status}"] += 1
            return
    outcomes["closed without GOODBYE"] += 1


async def probe(address: str, stop: asyncio.Event, results: Counter[str]) -> None:
    """A well-behaved client trying to connect and ping every 250 ms."""
    while not stop.is_set():
        try:
            async with connect(address, timeout=10) as c:
                await c.ping()
            results["ok"] += 1
        except Exception as exc:  # noqa: BLE001 - we count what happened
            results[getattr(exc, "__class__").__name__] += 1
        await asyncio.sleep(0.25)


async def idle_flood(srv: Server, attempts: int, concurrency: int) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    probes: Counter[str] = Counter()
    sem = asyncio.Semaphore(concurrency)
    out: dict[str, Any] = {"attempts": attempts, "concurrency": concurrency}
    out["rss_before"] = proc_usage(srv.proc.pid).rss

    async def one() -> None:
        async with sem:
            await idle_attempt(srv.address, outcomes)

    stop = asyncio.Event()
    t0 = time.perf_counter()
    with RssWatch(srv.proc.pid) as rss:
        prober = asyncio.create_task(probe(srv.address, stop, probes))
        tasks = [asyncio.create_task(one()) for _ in range(attempts)]
        while not all(t.done() for t in tasks):
            await asyncio.sleep(2)
            log(f"  {sum(outcomes.values()):,} of {attempts:,} attempts closed: {dict(outcomes)}")
        await asyncio.gather(*tasks)
        stop.set()
        await prober
        out["seconds"] = time.perf_counter() - t0
        await asyncio.sleep(1)
        out["rss_after"] = rss.now()
    out["rss_peak"] = rss.peak
    out["outcomes"] = dict(outcomes)
    out["probe"] = dict(probes)
    async with connect(srv.address) as c:
        stats = await c.stats()
    for key in ("connections_total", "connections_refused", "handshake_timeouts", "connections_failed", "connections"):
        out[key] = stats.get(key)
    return out


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subscribers", type=int, default=100, help="subscribers that never read (default 100)")
    p.add_argument("--megabytes", type=int, default=500, help="MB published while they do not read (default 500)")
    p.add_argument("--attempts", type=int, default=10_000, help="connection attempts that never handshake (default 10,000)")
    p.add_argument("--concurrency", type=int, default=2_000, help="of those, how many at a time (default 2,000)")
    p.add_argument("--fsync", default="never", help="the broker's fsync policy (default never: this measures memory)")
    p.add_argument("--only", choices=("slow", "idle"), help="run one phase only")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--keep-temp", action="store_true", help="keep the broker's temporary directory")
    args = p.parse_args(argv)
    if args.subscribers < 1 or args.megabytes < 1 or args.attempts < 1 or args.concurrency < 1:
        p.error("every count must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    with Harness("connections", keep_temp=args.keep_temp) as h:
        if args.only != "idle":
            with h.ttlbroker(fsync=args.fsync) as srv:
                log(f"slow consumers: {args.subscribers} subscribers that never read, {args.megabytes} MB published "
                    f"to {srv.label} on {srv.address}")
                results["slow"] = run_uvloop(slow_consumers(srv, args.subscribers, args.megabytes))
                srv.check_alive()
        if args.only != "slow":
            with h.ttlbroker(fsync=args.fsync) as srv:
                log(f"idle flood: {args.attempts:,} attempts, {args.concurrency:,} at a time, to {srv.label}")
                results["idle"] = run_uvloop(idle_flood(srv, args.attempts, args.concurrency))
                srv.check_alive()
    elapsed = time.perf_counter() - t0

    print()
    print(f"connections: ttlbroker with its default limits, fsync={args.fsync} ({env['cpus']} CPUs, {env['date']}, "
          f"{elapsed:.0f} s total)")
    if "slow" in results:
        r = results["slow"]
        print()
        print(f"Slow consumers: {r['subscribers']} subscribers that never read, {r['published_mb']:,} MB published "
              f"({PAYLOAD // 1024} KiB messages, {BATCH} per batch, {IN_FLIGHT} batches in flight) "
              f"in {r['publish_seconds']:.1f} s")
        print()
        print(format_table(["measure", "value"], [
            ["broker RSS, idle", mb(r["rss_idle"])],
            ["broker RSS, subscribers connected", mb(r["rss_with_subscribers"])],
            ["broker RSS, peak while publishing", mb(r["rss_peak"])],
            ["broker RSS, at the last ack", mb(r["rss_at_last_ack"])],
            [f"broker RSS, 1 s after all were cut off ({r['cut_seconds']:.1f} s after the first publish)",
             mb(r["rss_after"])],
            ["output budget (limits.max_pending_bytes_total)", mb(r["queued_bytes_budget"] or 0)],
            ["queued output, highest (queued_bytes_max)", mb(r["queued_bytes_max"] or 0)],
            ["subscribers cut off as slow consumers", f"{r['slow_consumers']:,} of {r['subscribers']:,}"],
            ["deliveries dropped", f"{r['deliveries_dropped']:,}"],
            ["deliveries queued (messages_out)", f"{r['messages_out']:,}"],
            ["messages stored (messages_in)", f"{r['messages_in']:,}"],
        ], right=[1]))
    if "idle" in results:
        r = results["idle"]
        print()
        print(f"Connections that never handshake: {r['attempts']:,} attempts, {r['concurrency']:,} at a time, "
              f"in {r['seconds']:.1f} s")
        print()
        rows = [[f"closed with GOODBYE {k}" if k.isupper() else k, f"{v:,}"] for k, v in sorted(r["outcomes"].items())]
        rows += [
            ["broker: connections_refused (refused or evicted at max_connections)", f"{r['connections_refused']:,}"],
            ["broker: handshake_timeouts", f"{r['handshake_timeouts']:,}"],
            ["broker RSS, before", mb(r["rss_before"])],
            ["broker RSS, peak", mb(r["rss_peak"])],
            ["broker RSS, 1 s after the last close", mb(r["rss_after"])],
            ["well-behaved client meanwhile (connect + ping every 250 ms)",
             ", ".join(f"{k}: {v}" for k, v in sorted(r["probe"].items()))],
        ]
        print(format_table(["measure", "value"], rows, right=[1]))
    if args.json:
        log(f"wrote {write_json(args.json, {'benchmark': 'connections', 'environment': env, 'results': results})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
