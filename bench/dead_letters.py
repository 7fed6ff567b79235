"""Dead letters (issue 30): what a dead-letter subject costs a consumer that never
uses it, and how soon a dead letter is stored. ttlbroker only: nats-server has no
dead letters (its users build them from advisories).

One ttlbroker (``--fsync always``, its default; ``--fsync`` to change), driven by the
bundled asyncio client on uvloop, 128-byte payloads:

1. **consume and ack, dead-letter subject configured but unused**: in each of
   ``--rounds`` rounds, the two cases one after the other, in alternating order
   (``plain`` first in odd rounds, ``dlq`` first in even ones), each on a fresh topic:
   N = ``--messages`` messages are stored (not timed: ``publish_batch`` of 1,000),
   then one consumer with explicit acks (``ack_wait=30``) reads and acks all of them
   with ``consume(batch=1000)`` and ``await m.ack()``, the time including leaving the
   block (the queued acks durable), as ``bench/consume.py``. ``plain``: the consumer
   has no dead-letter subject; ``dlq``: it has ``dead_letter_subject`` (and
   ``dead_letter_expired``), captured by a topic of its own, and nothing fails, so
   nothing is copied (checked: the copies counted and stored are 0). Reported: each
   case's median rate over the rounds, the ratio of the medians (target ≥ 0.95,
   within 5 %) and each round's ratio.
2. **last failed delivery → dead letter stored**: a consumer with ``max_deliver=1``
   and a dead-letter subject captured by a topic, which a second consumer reads: the
   broker delivers a message of a topic only once its group commit is durable, so a
   copy's arrival there is the moment it is stored. ``--samples`` S messages each
   way, one after the other: the last delivery NAKed (``m.nak()``, the clock read
   just before), terminated (``m.term()``), and left to its ack wait (``ack_wait``
   0.5 s, pulled in batches of 50; the failure is the moment the ack wait ran out:
   the client's receipt of the delivery + 0.5 s, so the 10 ms timer buckets count
   in it). Latency = the copy's arrival minus that moment. p50 / p99 / max, per way
   and over all (target p99 < 50 ms).

Not assertions: numbers, with the command that made them (``--json`` record). Run
from the repository root::

    .venv/bin/python bench/dead_letters.py            # about 30 s on 2 cores
    .venv/bin/python bench/dead_letters.py --quick    # a smoke test, < 20 s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
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
    median_run,
    print_cpu_share,
    run_uvloop,
    write_json,
)

STREAM = "bench"
PAYLOAD = random.Random(0).randbytes(128)
BATCH = 1000
CASES = {"plain": "no dead-letter subject", "dlq": "dead-letter subject, unused"}
ACK_WAIT = 0.5
WAYS = ("nak", "term", "ack_wait")
#: The copy of a sample that never arrives is given up after this long.
PATIENCE_S = 10.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values_ms: list[float]) -> dict[str, Any]:
    if not values_ms:
        return {"count": 0}
    return {"count": len(values_ms), "p50_ms": round(pct(values_ms, 0.5), 2), "p99_ms": round(pct(values_ms, 0.99), 2),
            "max_ms": round(max(values_ms), 2)}


# -- 1. throughput --------------------------------------------------------------------------


async def consume_case(c: Any, case: str, rnd: int, n: int, pid: int | None) -> Rate:
    """Store ``n`` messages on a fresh topic, then consume and ack them all (timed)."""
    topic = f"{case}{rnd}"
    subject = f"{topic}.x"
    await c.create_topic(STREAM, topic, partitions=1, subjects=[f"{topic}.>"])
    dead: dict[str, Any] = {}
    if case == "dlq":
        await c.create_topic(STREAM, f"{topic}dead", partitions=1, subjects=[f"dead.{topic}"])
        dead = {"dead_letter_subject": f"dead.{topic}", "dead_letter_expired": True}
    batch = [(subject, PAYLOAD)] * BATCH
    sem = asyncio.Semaphore(4)

    async def load(k: int) -> None:
        async with sem:
            (await c.publish_batch(batch[:k])).raise_for_errors()

    await asyncio.gather(*(load(min(BATCH, n - i)) for i in range(0, n, BATCH)))
    await c.create_consumer(STREAM, topic, "acks", ack_wait=30, **dead)

    async def consume(progress: Progress) -> tuple[int, int]:
        got = 0
        async with c.consume(STREAM, topic, "acks", batch=BATCH) as msgs:
            async for m in msgs:
                await m.ack()
                got += 1
                if not got & 1023:
                    progress.update(got)
                if got >= n:
                    break
        return got, 0

    rate = await measure(f"round {rnd} {CASES[case]}", consume, n, pid)
    info = await c.consumer_info(STREAM, topic, "acks")
    problems = []
    if info.num_pending or info.num_ack_pending:
        problems.append(f"{info.num_pending:,} pending, {info.num_ack_pending:,} unacked after the phase")
    if case == "dlq":
        made = sum(info.dead_lettered.values())
        stored = (await c.get_topic(STREAM, f"{topic}dead")).messages_count
        if made or stored:
            problems.append(f"{made} dead letters made, {stored} stored: the subject was to stay unused")
        await c.delete_topic(STREAM, f"{topic}dead")
    if problems:
        rate.errors += 1
        rate.note = "; ".join(problems)
        log(f"    {rate.note}")
    await c.delete_topic(STREAM, topic)
    return rate


# -- 2. latency -----------------------------------------------------------------------------


class Arrivals:
    """The dead-letter topic's consumer: when each copy arrived, by origin sequence."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.reasons: dict[int, str] = {}
        self._waiting: dict[int, asyncio.Future[float]] = {}

    def arrived(self, seq: int, reason: str, t: float) -> None:
        self.at[seq] = t
        self.reasons[seq] = reason
        fut = self._waiting.pop(seq, None)
        if fut is not None and not fut.done():
            fut.set_result(t)

    async def wait(self, seq: int) -> float | None:
        if seq in self.at:
            return self.at[seq]
        fut = self._waiting[seq] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(fut, PATIENCE_S)
        except TimeoutError:
            return None


async def latency(c: Any, samples: int) -> dict[str, Any]:
    await c.create_topic(STREAM, "work", partitions=1, subjects=["work.>"])
    await c.create_topic(STREAM, "dead", partitions=1, subjects=["dead.work"])
    for name, wait in (("fail", 30), ("slow", ACK_WAIT)):
        await c.create_consumer(STREAM, "work", name, filter_subject=f"work.{name}", ack_wait=wait, max_deliver=1,
                                dead_letter_subject="dead.work")
    await c.create_consumer(STREAM, "dead", "watch", ack_wait=30)
    arrivals = Arrivals()

    async def watch() -> None:
        async with c.consume(STREAM, "dead", "watch", batch=100) as msgs:
            async for m in msgs:
                arrivals.arrived(int(m.headers["Nats-DLQ-Sequence"]), m.headers["Nats-DLQ-Reason"], time.perf_counter())
                await m.ack()

    watcher = asyncio.get_running_loop().create_task(watch())
    out: dict[str, list[float]] = {w: [] for w in WAYS}
    missing = 0
    wrong = 0
    try:
        await asyncio.sleep(0.2)
        (await c.publish_batch([("work.fail", PAYLOAD)] * (2 * samples))).raise_for_errors()
        for way in ("nak", "term"):
            for _ in range(samples):
                m = (await c.pull(STREAM, "work", "fail", 1))[0]
                t0 = time.perf_counter()
                await (m.nak() if way == "nak" else m.term())
                t1 = await arrivals.wait(m.offset)
                if t1 is None:
                    missing += 1
                    continue
                out[way].append((t1 - t0) * 1000)
                if arrivals.reasons[m.offset] != ("MaxDeliveries" if way == "nak" else "Terminated"):
                    wrong += 1
            log(f"  {way}: {summary(out[way])}")
        left = samples
        while left > 0:
            k = min(50, left)
            (await c.publish_batch([("work.slow", PAYLOAD)] * k)).raise_for_errors()
            got = await c.pull(STREAM, "work", "slow", k)
            received = time.perf_counter()
            for m in got:
                t1 = await arrivals.wait(m.offset)
                if t1 is None:
                    missing += 1
                    continue
                out["ack_wait"].append((t1 - (received + ACK_WAIT)) * 1000)
                if arrivals.reasons[m.offset] != "MaxDeliveries":
                    wrong += 1
            left -= len(got)
        log(f"  ack_wait: {summary(out['ack_wait'])}")
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    made = {name: (await c.consumer_info(STREAM, "work", name)).dead_lettered for name in ("fail", "slow")}
    return {**{w: summary(v) for w, v in out.items()}, "all": summary([x for v in out.values() for x in v]),
            "missing": missing, "wrong_reason": wrong, "dead_lettered": made}


# -- run ------------------------------------------------------------------------------------


async def run(address: str, args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    from broker.client import aio

    async with aio.connect(address, name="bench-dead-letters") as c:
        await c.create_stream(STREAM)
        rounds: list[dict[str, Rate]] = []
        for rnd in range(1, args.rounds + 1):
            order = ("plain", "dlq") if rnd % 2 else ("dlq", "plain")
            rounds.append({case: await consume_case(c, case, rnd, args.messages, pid) for case in order})
        lat = await latency(c, args.samples) if args.samples else {}
    plain = median_run([r["plain"] for r in rounds])
    dlq = median_run([r["dlq"] for r in rounds])
    return {
        "throughput": {
            "plain": plain.as_dict(), "dlq": dlq.as_dict(),
            "ratio": round(dlq.per_second / plain.per_second, 4) if plain.per_second else None,
            "round_ratios": [round(r["dlq"].per_second / r["plain"].per_second, 4) for r in rounds if r["plain"].per_second],
            "runs": [{k: v.as_dict() for k, v in r.items()} for r in rounds],
            "errors": sum(v.errors for r in rounds for v in r.values()),
        },
        "latency": lat,
    }


def report(res: dict[str, Any]) -> str:
    t = res["throughput"]
    rows = [[CASES[k], fmt_rate(t[k]["msgs_per_s"])] for k in CASES]
    text = format_table(["consume and ack (median of the rounds)", "msgs/s"], rows, right=(1,))
    ratio = t["ratio"]
    text += (f"\n\ndead-letter subject configured, unused / none: {ratio:.3f} (target ≥ 0.95: "
             f"{'met' if ratio is not None and ratio >= 0.95 else 'NOT met'}); rounds: "
             + ", ".join(f"{x:.3f}" for x in t["round_ratios"]))
    lat = res["latency"]
    if lat:
        labels = {"nak": "NAK of the last delivery", "term": "TERM", "ack_wait": "last ack wait ran out", "all": "all"}
        rows = [[labels[k], str(lat[k].get("count", 0)), f"{lat[k].get('p50_ms', 0):.1f}", f"{lat[k].get('p99_ms', 0):.1f}",
                 f"{lat[k].get('max_ms', 0):.1f}"] for k in (*WAYS, "all")]
        text += "\n\n" + format_table(["last failed delivery → dead letter stored", "samples", "p50 ms", "p99 ms", "max ms"],
                                      rows, right=(1, 2, 3, 4))
        p99 = lat["all"].get("p99_ms")
        text += (f"\n\np99 over all: {p99} ms (target < 50 ms: {'met' if p99 is not None and p99 < 50 else 'NOT met'})"
                 f"; copies missing {lat['missing']}, with a wrong reason {lat['wrong_reason']}")
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=None, metavar="N",
                   help="messages consumed per case and round (default 100,000; 10,000 with --quick)")
    p.add_argument("--rounds", type=int, default=None, metavar="R", help="rounds of both cases (default 7; 3 with --quick)")
    p.add_argument("--samples", type=int, default=None, metavar="S",
                   help="dead letters timed each way (default 300; 50 with --quick; 0: no latency phase)")
    p.add_argument("--fsync", default="always", help="the broker's fsync (default always)")
    p.add_argument("--quick", action="store_true", help="a smoke test: small counts")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--keep-temp", action="store_true", help="keep the server's temporary directory")
    args = p.parse_args(argv)
    if args.messages is None:
        args.messages = 10_000 if args.quick else 100_000
    if args.rounds is None:
        args.rounds = 3 if args.quick else 7
    if args.samples is None:
        args.samples = 50 if args.quick else 300
    if args.messages < 1 or args.rounds < 1 or args.samples < 0:
        p.error("--messages and --rounds must be >= 1, --samples >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    log(f"dead letters: {args.rounds} rounds of {args.messages:,} messages per case, {args.samples} samples each way, "
        f"fsync {args.fsync}")
    log_environment(env)
    cpu = CpuWatch()
    t0 = time.perf_counter()
    with Harness("dlbench", keep_temp=args.keep_temp) as h, h.ttlbroker(fsync=args.fsync) as srv:
        log(f"{srv.label} on {srv.address}")
        res = run_uvloop(run(srv.address, args, srv.proc.pid))
    elapsed = time.perf_counter() - t0
    env["load_avg_at_end"] = os.getloadavg()
    env["cpu_during_run"] = others = cpu.stop()
    print()
    print(f"dead letters: {len(PAYLOAD)}-byte payloads, fsync {args.fsync}, {args.rounds} rounds of "
          f"{args.messages:,} messages, {args.samples} samples each way ({env['cpus']} CPUs, {env['date']}, "
          f"{elapsed:.0f} s total, load average {env['load_avg_at_start'][0]:.2f} at start, "
          f"{env['load_avg_at_end'][0]:.2f} at end)")
    print_cpu_share(others)
    print()
    print(report(res))
    if args.json:
        record = {"benchmark": "dead_letters", "command": " ".join([Path(sys.executable).name, *sys.argv]),
                  "environment": env, "args": vars(args), "elapsed_s": round(elapsed, 1), "results": res}
        log(f"wrote {write_json(args.json, record)}")
    lat = res["latency"]
    failed = res["throughput"]["errors"] or (lat and (lat["missing"] or lat["wrong_reason"]))
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; server stopped and temporary directory removed")
        sys.exit(130)
