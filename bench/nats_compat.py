"""nats-py against nats-server and against ttlbroker's NATS listener, side by side.

The same nats-py code runs against both servers: only the URL differs. The target
(``bench/README.md``, "Targets") is at least nats-server's rate on every workload.
Each server gets a fresh store; the stream ``BENCH`` captures ``bench.>`` (on
ttlbroker: the topic ``nats/bench``, one partition), payloads are ``--size`` bytes
(default 128). Workloads, in table order:

* **awaited publish**: ``await js.publish(...)`` one at a time (``--serial`` messages).
* **publish_async, 1,000 in flight**: ``js.publish_async`` with
  ``publish_async_max_pending=1000``, then ``publish_async_completed()`` (``--messages``).
* **pull consume with acks**: a durable pull consumer (``js.pull_subscribe``) on what
  publish_async stored, ``fetch(--batch)`` and ``await msg.ack()`` each, until all
  are consumed.
* **push consume with acks**: a durable push consumer (``js.subscribe(...,
  durable=..., manual_ack=True, cb=...)``, nats-py's first JetStream example) on the
  same messages, ``await msg.ack()`` in the callback, until all have come.
* **work queue, 4 workers**: a ``retention="workqueue"`` stream ``WQ`` holding
  ``--messages`` messages (published before the clock starts), consumed by four
  connections pulling from one durable consumer (``fetch(--batch)``, ``await
  msg.ack()`` each), each message removed from the stream by its ack.
* **KV put**, **KV get**: ``js.create_key_value(bucket=..., history=1)`` then
  ``--keys`` puts and as many gets of those keys, one at a time.
* **publish_async at max_msgs, discard old**: the stream ``LIMITED`` (``max_msgs=
  --max-msgs``, ``discard="old"``), filled before the clock starts, then ``--messages``
  more, each removing the oldest; the count must be exactly ``--max-msgs`` after.
* **memory storage: awaited publish**, **memory storage: publish_async**, **memory
  storage: pull consume with acks**: as the file workloads, on the stream ``MEM``
  with ``storage="memory"``; the table's footer gives each memory publish rate over
  ttlbroker's own file-storage rate of the same workload.
* **stream creations**: ``--streams`` ``js.add_stream`` calls one after the other,
  each a new stream with its own subjects.

Durability is equal on both: ``--sync always`` (default; ttlbroker ``--fsync always``,
nats ``sync_interval: always``: every ack after an fsync) or a duration for both
(``--sync 2m``).

Rounds (``--rounds``, default 5): each round runs every workload on a fresh
nats-server and on a fresh ttlbroker, one right after the other, the order swapped
from round to round (nats first in rounds 1, 3, 5). Each round gives one ratio per
workload from two runs made seconds apart, so a slow stretch of the shared machine
weighs on both sides of it. The verdict is the median of the rounds' ratios; the
table also gives each server's median rate, the range of the ratios, and each
server's CPU microseconds per message (its median round). Run from the repository
root::

    .venv/bin/python bench/nats_compat.py                # 5 rounds of 20,000 messages: about 2 minutes
    .venv/bin/python bench/nats_compat.py --quick        # 2,000 messages
    .venv/bin/python bench/nats_compat.py --rounds 1     # one pass on each server
    .venv/bin/python bench/nats_compat.py --only memory_publish,stream_create
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    RESULTS_DIR,
    CpuWatch,
    Harness,
    Progress,
    Rate,
    environment,
    fmt_rate,
    format_table,
    log,
    log_environment,
    measure,
    print_cpu_share,
    run_uvloop,
    write_json,
)

WORKLOADS = {
    "publish": "awaited publish",
    "publish_async": "publish_async, 1,000 in flight",
    "consume": "pull consume with acks",
    "push_consume": "push consume with acks",
    "work_queue": "work queue, 4 workers",
    "kv_put": "KV put",
    "kv_get": "KV get",
    "limit_publish": "publish_async at max_msgs, discard old",
    "memory_serial": "memory storage: awaited publish",
    "memory_publish": "memory storage: publish_async",
    "memory_consume": "memory storage: pull consume with acks",
    "stream_create": "stream creations",
}

#: Workloads that read what another one stored (``--only`` runs that one too).
CONSUMES_FROM = {"consume": "publish_async", "push_consume": "publish_async", "kv_get": "kv_put",
                 "memory_consume": "memory_publish"}


async def run_workloads(url: str, pid: int, args: argparse.Namespace) -> dict[str, Rate]:
    import nats

    nc = await nats.connect(url, max_reconnect_attempts=0)
    js = nc.jetstream(publish_async_max_pending=1000, timeout=30)
    payload = os.urandom(args.size)
    rates: dict[str, Rate] = {}

    async def phase(key: str, total: int, work: Callable[[Progress], Awaitable[tuple[int, int]]]) -> None:
        if key not in args.only:
            return
        try:
            rates[key] = await measure(WORKLOADS[key], work, total, server_pid=pid)
        except Exception as exc:  # a workload the server cannot do: reported, the rest run
            log(f"  {WORKLOADS[key]}: FAILED {exc!r}")
            rates[key] = Rate(0, 0.0, 1, note=repr(exc)[:200])

    try:
        await js.add_stream(name="BENCH", subjects=["bench.>"])
        for _ in range(100):  # warm-up
            await js.publish("bench.warm", payload)

        async def publish(subject: str, progress: Progress) -> tuple[int, int]:
            for i in range(args.serial):
                await js.publish(subject, payload)
                if not i & 255:
                    progress.update(i)
            return args.serial, 0

        async def publish_async(subject: str, progress: Progress) -> tuple[int, int]:
            for i in range(args.messages):
                await js.publish_async(subject, payload)
                if not i & 1023:
                    progress.update(i)
            await js.publish_async_completed()
            return args.messages, 0

        async def pull_all(subject: str, durable: str, stream: str, progress: Progress) -> tuple[int, int]:
            sub = await js.pull_subscribe(subject, durable=durable, stream=stream)
            done = 0
            while done < args.messages:
                for msg in await sub.fetch(args.batch, timeout=10):
                    await msg.ack()
                    done += 1
                progress.update(done)
            return done, 0

        async def push_consume(progress: Progress) -> tuple[int, int]:
            done = 0
            finished = asyncio.Event()

            async def cb(msg: Any) -> None:
                nonlocal done
                await msg.ack()
                done += 1
                if not done & 1023:
                    progress.update(done)
                if done == args.messages:
                    finished.set()

            sub = await js.subscribe("bench.async", durable="push", stream="BENCH", manual_ack=True, cb=cb)
            await asyncio.wait_for(finished.wait(), 120)
            await sub.unsubscribe()
            return done, 0

        async def work_queue(progress: Progress) -> tuple[int, int]:
            workers = [await nats.connect(url, max_reconnect_attempts=0) for _ in range(4)]
            done = 0
            try:
                async def worker(conn: Any) -> None:
                    nonlocal done
                    sub = await conn.jetstream().pull_subscribe("wq.>", durable="workers", stream="WQ")
                    while done < args.messages:
                        try:
                            msgs = await sub.fetch(args.batch, timeout=0.25)
                        except nats.errors.TimeoutError:
                            continue
                        for msg in msgs:
                            await msg.ack()
                            done += 1
                        progress.update(done)

                await asyncio.gather(*(worker(w) for w in workers))
            finally:
                for w in workers:
                    await w.close()
            return done, 0

        await phase("publish", args.serial, lambda progress: publish("bench.serial", progress))
        await phase("publish_async", args.messages, lambda progress: publish_async("bench.async", progress))
        await phase("consume", args.messages, lambda progress: pull_all("bench.async", "bench", "BENCH", progress))
        await phase("push_consume", args.messages, push_consume)
        if "work_queue" in args.only:
            await js.add_stream(name="WQ", subjects=["wq.>"], retention="workqueue")
            for i in range(args.messages):  # not timed: the work to share
                await js.publish_async(f"wq.{i & 3}", payload)
            await js.publish_async_completed()
            await phase("work_queue", args.messages, work_queue)

        kv = await js.create_key_value(bucket="bench", history=1)

        async def kv_put(progress: Progress) -> tuple[int, int]:
            for i in range(args.keys):
                await kv.put(f"k{i}", payload)
            return args.keys, 0

        async def kv_get(progress: Progress) -> tuple[int, int]:
            wrong = 0
            for i in range(args.keys):
                wrong += (await kv.get(f"k{i}")).value != payload
            return args.keys, wrong

        await phase("kv_put", args.keys, kv_put)
        await phase("kv_get", args.keys, kv_get)

        async def limit_publish(progress: Progress) -> tuple[int, int]:
            done, _ = await publish_async("limited.x", progress)
            info = await js.stream_info("LIMITED")
            return done, int(info.state.messages != args.max_msgs)  # a wrong count is reported as wrong

        async def stream_create(progress: Progress) -> tuple[int, int]:
            for i in range(args.streams):
                await js.add_stream(name=f"C{i}", subjects=[f"c{i}.>"])
                progress.update(i)
            return args.streams, 0

        if "limit_publish" in args.only:
            await js.add_stream(name="LIMITED", subjects=["limited.>"], max_msgs=args.max_msgs, discard="old")
            for _ in range(args.max_msgs):  # not timed: the stream starts full
                await js.publish_async("limited.x", payload)
            await js.publish_async_completed()
            await phase("limit_publish", args.messages, limit_publish)
        await js.add_stream(name="MEM", subjects=["mem.>"], storage="memory")
        await phase("memory_serial", args.serial, lambda progress: publish("mem.serial", progress))
        await phase("memory_publish", args.messages, lambda progress: publish_async("mem.x", progress))
        await phase("memory_consume", args.messages, lambda progress: pull_all("mem.>", "mem", "MEM", progress))
        await phase("stream_create", args.streams, stream_create)
    finally:
        await nc.close()
    return rates


def _median_round(runs: list[Rate]) -> Rate:
    """The run with the median rate (the lower middle one of an even count)."""
    ranked = sorted(runs, key=lambda r: r.per_second)
    return ranked[(len(ranked) - 1) // 2]


def _ratios(rounds: list[dict[str, dict[str, Rate]]], key: str) -> list[float]:
    """Each round's ttlbroker / nats-server rate for ``key`` (rounds where either failed
    are left out)."""
    out = []
    for rnd in rounds:
        t, n = rnd["ttlbroker"].get(key), rnd["nats"].get(key)
        if t and n and t.messages and n.messages and n.per_second:
            out.append(t.per_second / n.per_second)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20_000, help="publish_async and consume messages")
    p.add_argument("--serial", type=int, default=5_000, help="awaited publishes")
    p.add_argument("--keys", type=int, default=5_000, help="KV puts and gets")
    p.add_argument("--size", type=int, default=128, help="payload bytes")
    p.add_argument("--batch", type=int, default=100, help="fetch batch of the pull consumer")
    p.add_argument("--max-msgs", type=int, default=1_000, help="max_msgs of the stream the limit workload fills")
    p.add_argument("--streams", type=int, default=300, help="stream creations")
    p.add_argument("--sync", default="always", help="durability on both: always, or a duration such as 2m")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each a fresh run on both servers (order swapped each round)")
    p.add_argument("--quick", action="store_true", help="2,000 messages, 500 serial, 500 keys")
    p.add_argument("--only", help="comma-separated workloads to run (and the ones they consume from); default all: "
                   + ", ".join(WORKLOADS))
    p.add_argument("--json", default=str(RESULTS_DIR / "nats_compat.json"), help="write the results here as JSON")
    args = p.parse_args()
    if args.quick:
        args.messages, args.serial, args.keys = 2_000, 500, 500
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    args.only = set(WORKLOADS) if not args.only else {k.strip() for k in args.only.split(",")}
    if args.only - set(WORKLOADS):
        p.error(f"--only: unknown workload(s) {', '.join(sorted(args.only - set(WORKLOADS)))}")
    for consumer, producer in CONSUMES_FROM.items():
        if consumer in args.only:
            args.only.add(producer)
    env = environment()
    log_environment(env)
    cpu = CpuWatch()
    rounds: list[dict[str, dict[str, Rate]]] = []
    with Harness("nats_compat") as h:
        for r in range(args.rounds):
            order = ("nats", "ttlbroker") if r % 2 == 0 else ("ttlbroker", "nats")
            log(f"round {r + 1} of {args.rounds}: {order[0]} first")
            rnd: dict[str, dict[str, Rate]] = {}
            for side in order:
                if side == "nats":
                    with h.nats(sync_interval=args.sync) as srv:
                        log(f"nats-server sync_interval={args.sync}")
                        rnd["nats"] = run_uvloop(run_workloads(srv.url, srv.proc.pid, args))
                else:
                    with h.ttlbroker(fsync=args.sync, nats=True) as srv:
                        log(f"ttlbroker --fsync {args.sync}, NATS listener {srv.nats_url}")
                        assert srv.nats_url is not None
                        rnd["ttlbroker"] = run_uvloop(run_workloads(srv.nats_url, srv.proc.pid, args))
            rounds.append(rnd)
    others = cpu.stop()
    results: dict[str, dict[str, Rate]] = {"ttlbroker": {}, "nats": {}}
    ratios: dict[str, dict[str, Any]] = {}
    rows = []
    for key, label in WORKLOADS.items():
        if key not in args.only:
            continue
        for side in ("ttlbroker", "nats"):
            runs = [rnd[side][key] for rnd in rounds if key in rnd[side]]
            if runs:
                results[side][key] = _median_round(runs)
        t, n = results["ttlbroker"].get(key), results["nats"].get(key)
        tr = t.per_second if t and t.messages else None
        nr = n.per_second if n and n.messages else None
        each = _ratios(rounds, key)
        med = statistics.median(each) if each else None
        ratios[key] = {"median": None if med is None else round(med, 4), "rounds": [round(x, 4) for x in each]}
        tcpu = t.cpu_us_per_msg()[1] if t else None
        ncpu = n.cpu_us_per_msg()[1] if n else None
        rows.append([
            label, fmt_rate(tr), fmt_rate(nr), "" if med is None else f"{med:.2f}x",
            f"{min(each):.2f}-{max(each):.2f}" if each else "",
            "" if tcpu is None else f"{tcpu:.1f}", "" if ncpu is None else f"{ncpu:.1f}",
        ])
    print(f"\nnats-py against both servers, --sync {args.sync}, {args.size}-byte payloads, "
          f"{args.rounds} round(s), load {os.getloadavg()[0]:.2f}\n")
    print(format_table(
        ["workload", "ttlbroker msgs/s", "nats-server msgs/s", "ratio (median)", "ratio range",
         "ttlbroker CPU us/msg", "nats CPU us/msg"],
        rows, right=(1, 2, 3, 4, 5, 6),
    ))
    own: dict[str, float] = {}
    print()
    for mem_key, file_key in (("memory_serial", "publish"), ("memory_publish", "publish_async")):
        mem, disk = results["ttlbroker"].get(mem_key), results["ttlbroker"].get(file_key)
        if mem and disk and mem.messages and disk.messages and disk.per_second:
            own[mem_key] = round(mem.per_second / disk.per_second, 4)
            print(f"ttlbroker {WORKLOADS[mem_key]} / {WORKLOADS[file_key]} on file storage (--sync {args.sync}): "
                  f"{own[mem_key]:.2f}x (target: at least 2x at always)")
    print_cpu_share(others)
    data: dict[str, Any] = {
        "environment": env, "args": {**vars(args), "only": sorted(args.only)}, "other_cpu": others,
        # Each server's median round per workload (what the table shows).
        "results": {k: {w: r.as_dict() for w, r in v.items()} for k, v in results.items()},
        "ratios": ratios,
        "memory_over_file_publish": own,
        "rounds": [{k: {w: r.as_dict() for w, r in v.items()} for k, v in rnd.items()} for rnd in rounds],
    }
    log(f"wrote {write_json(args.json, data)}")


if __name__ == "__main__":
    main()
