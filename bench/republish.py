"""Publish throughput with and without republish (NATS ADR-28): ttlbroker against
nats-server (JetStream) with a RePublish stream.

The same publish workload runs, each time against a fresh server, in four cases:

* **no republish**: a topic (stream) capturing ``bench.>``, nothing else;
* **republish, no listener**: the same with ``republish = {src: ">", dest: "rp.>"}``;
  the copies go to ``rp.bench.publish``, where nobody listens;
* **republish + 1 core subscriber**: the same, and a second connection subscribes
  to ``rp.>``; the phase ends when that subscriber has received every copy;
* **republish into a 2nd topic**: the same, and a second topic (ttlbroker) or
  stream (nats) captures ``rp.>`` and stores every copy; the phase ends when it
  holds them all.

ttlbroker: ``publish_batch`` of 1,000 ``(subject, payload)`` tuples, 4 batches in
flight (the batched workload of ``publish_fetch.py``), one connection. nats-py has no
batch publish: ``js.publish_async`` with as many publishes in flight as ttlbroker has
messages in flight (4,000), then ``publish_async_completed()``. Payloads are 128 bytes,
every message on one subject. The subscriber runs in the same process as the
publisher (its own connection, same uvloop loop); it counts every copy and checks
the first one (subject, payload, republish headers).

Each case starts with an untimed warm-up batch whose copies are awaited too.
Publishing stops after ``--messages`` (``--nats-messages``) or ``--max-seconds``,
whichever comes first; the rate is over what was published, timed until the last
ack and, where the case has one, until the last copy arrived. A copy that never
arrives (after 10 s without progress) counts as an error, as does a refused publish
or, for ttlbroker, a ``republished`` counter that does not match. Every case runs
``--repeat`` times (in whole rounds) and the fastest run is reported: other load on
the machine only ever slows a run down.

Durability, the same on both sides: ``always`` runs ttlbroker with ``fsync =
"always"`` (group commit: an ack, and a copy, only after the fsync covering its
message) against nats-server with ``sync_interval: always``; ``relaxed`` runs
ttlbroker with ``fsync = "2m"`` against nats-server's default (a background sync every
2 minutes; acks do not wait for the disk on either side).

The table gives msgs/s for each case, each republish case's throughput as a fraction
of the no-republish case on the same server (and the time it adds per message), and
ttlbroker / nats. Progress goes to stderr, the tables to stdout; ``--json PATH`` also
writes a JSON record. Run from the repository root::

    .venv/bin/python bench/republish.py            # the full run, about 4.5 minutes
    .venv/bin/python bench/republish.py --quick    # a smoke test, < 60 s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
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
DEST = "rp.>"
COPY_SUBJECT = "rp." + SUBJECT
PAYLOAD = random.Random(0).randbytes(128)
BATCH = 1000  # messages per publish_batch (ttlbroker) and the warm-up
BATCHES_IN_FLIGHT = 4
NATS_WINDOW = BATCH * BATCHES_IN_FLIGHT  # publish_async in flight (nats)
#: A phase waiting for copies gives up when none arrived for this long.
STALL_SECONDS = 10.0

CASES = {
    "plain": "no republish",
    "rp_none": "republish, no listener",
    "rp_sub": "republish + 1 core subscriber",
    "rp_store": "republish into a 2nd topic/stream",
}
#: name: (ttlbroker --fsync, nats sync_interval (None = the server's default), label)
DURABILITY = {
    "always": ("always", "always", "fsync before ack (ttlbroker fsync=always, group commit; nats sync_interval: always)"),
    "relaxed": ("2m", None, "sync every 2 min, acks do not wait (ttlbroker fsync=2m; nats default sync_interval)"),
}


# -- shared pieces ---------------------------------------------------------------------


class Copies:
    """Counts the copies a subscriber received; :meth:`wait_for` waits until there
    are ``target`` of them, or none came for ``STALL_SECONDS``."""

    def __init__(self) -> None:
        self.got = 0
        self.first: str | None = None  # the first copy's subject
        self.problem: str | None = None  # what was wrong with it
        self._target: int | None = None
        self._reached = asyncio.get_running_loop().create_future()

    def hit(self) -> None:
        self.got += 1
        if self.got == self._target and not self._reached.done():
            self._reached.set_result(None)

    def reset(self) -> None:
        self.got = 0
        self._target = None
        self._reached = asyncio.get_running_loop().create_future()

    async def wait_for(self, target: int, progress: Progress | None = None) -> int:
        self._target = target
        if self.got >= target:
            return self.got

        async def count() -> int:
            return self.got

        return await _wait_until(count, target, progress, self._reached)


async def _wait_until(count: Callable[[], Awaitable[int]], target: int, progress: Progress | None,
                      reached: asyncio.Future[None] | None = None, poll: float = 0.02) -> int:
    """Wait until ``await count()`` reaches ``target`` (or ``reached`` is set), polling
    every ``poll`` seconds; give up after ``STALL_SECONDS`` without progress. Returns
    the last count."""
    last, last_change = -1, time.perf_counter()
    while True:
        if reached is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(reached), poll * 10)
                return await count()
        else:
            await asyncio.sleep(poll)
        got = await count()
        if got >= target:
            return got
        now = time.perf_counter()
        if got != last:
            last, last_change = got, now
            if progress is not None:
                progress.update(got)
        elif now - last_change > STALL_SECONDS:
            log(f"    gave up waiting: {got:,} of {target:,} copies after {STALL_SECONDS:g} s without progress")
            return got


async def _batched_window(publish_batch: Callable[[], Awaitable[Any]], count: Callable[[Any], tuple[int, int]],
                          total: int, in_flight: int, progress: Progress, deadline: float) -> tuple[int, int]:
    """Keep ``in_flight`` batches of ``BATCH`` messages outstanding until ``total``
    messages were sent (or ``deadline`` passed); returns (stored, refused)."""
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(in_flight)
    pending: set[asyncio.Task[Any]] = set()
    totals = [0, 0]

    def on_done(t: asyncio.Task[Any]) -> None:
        pending.discard(t)
        sem.release()
        if t.cancelled() or t.exception() is not None:
            totals[1] += BATCH
            if totals[1] == BATCH:
                log(f"    first error: {'cancelled' if t.cancelled() else t.exception()!r}")
        else:
            ok, bad = count(t.result())
            totals[0] += ok
            totals[1] += bad

    issued = 0
    while issued < total:
        await sem.acquire()
        t = loop.create_task(publish_batch())
        pending.add(t)
        t.add_done_callback(on_done)
        issued += BATCH
        progress.update(totals[0])
        if time.perf_counter() > deadline:
            break
    if pending:
        await asyncio.wait(pending)
    return totals[0], totals[1]


def _copy_problem(subject: str, payload: bytes, headers: Any) -> str | None:
    """What is wrong with a received copy, or None."""
    if subject != COPY_SUBJECT or bytes(payload) != PAYLOAD:
        return f"unexpected copy: subject {subject!r}, {len(payload)}-byte payload"
    if headers is None or not any(k.lower() == "nats-sequence" for k in headers):
        return f"the copy lacks the republish headers: {headers!r}"
    return None


def _check_first_copy(copies: Copies, subject: str, payload: bytes, headers: Any) -> None:
    copies.first = subject
    copies.problem = _copy_problem(subject, payload, headers)
    if copies.problem:
        log(f"    {copies.problem}")


# -- ttlbroker ---------------------------------------------------------------------------


async def run_ttlbroker(address: str, case: str, n: int, max_seconds: float, pid: int | None) -> Rate:
    from broker.client import aio

    async with contextlib.AsyncExitStack() as stack:
        c = await stack.enter_async_context(aio.connect(address, name="bench-republish"))
        await c.create_stream("bench")
        options: dict[str, Any] = {} if case == "plain" else {"republish": {"src": ">", "dest": DEST}}
        await c.create_topic("bench", "publish", partitions=1, subjects=["bench.>"], **options)
        if case == "rp_store":
            await c.create_topic("bench", "copies", partitions=1, subjects=[DEST])

        copies: Copies | None = None
        if case == "rp_sub":
            sc = await stack.enter_async_context(aio.connect(address, name="bench-republish-sub"))
            sub = await sc.subscribe(DEST, max_pending=max(65536, 2 * n))
            copies = Copies()

            async def consume() -> None:
                assert copies is not None
                async for m in sub:
                    if copies.first is None:
                        _check_first_copy(copies, m.subject, m.payload, m.headers)
                    copies.hit()

            consumer = asyncio.get_running_loop().create_task(consume())
            stack.callback(consumer.cancel)

        async def stored_copies() -> int:
            return (await c.get_topic("bench", "copies")).messages_count

        batch = [(SUBJECT, PAYLOAD)] * BATCH
        # Warm-up (not timed): one batch, and its copies.
        (await c.publish_batch(batch)).raise_for_errors()
        if copies is not None:
            if await copies.wait_for(BATCH) < BATCH:
                raise AssertionError("the subscriber did not receive the warm-up copies")
            copies.reset()
        base = await stored_copies() if case == "rp_store" else 0
        if case == "rp_store" and base != BATCH:
            raise AssertionError(f"the copies topic holds {base} messages after the warm-up, not {BATCH}")
        before = await c.stats()

        def count_acks(acks: Any) -> tuple[int, int]:
            bad = len(acks.errors)
            if bad and not count_acks.logged:  # type: ignore[attr-defined]
                count_acks.logged = True  # type: ignore[attr-defined]
                log(f"    first refused message: {next(iter(acks.errors.values()))}")
            return len(acks) - bad, bad

        count_acks.logged = False  # type: ignore[attr-defined]

        async def phase(progress: Progress) -> tuple[int, int]:
            stored, refused = await _batched_window(lambda: c.publish_batch(batch), count_acks, n, BATCHES_IN_FLIGHT,
                                                    progress, time.perf_counter() + max_seconds)
            missing = 0
            if copies is not None:
                missing = stored - await copies.wait_for(stored, progress)
            elif case == "rp_store":
                async def count() -> int:
                    return await stored_copies() - base

                missing = stored - await _wait_until(count, stored, progress)
            return stored, refused + max(0, missing)

        rate = await measure(CASES[case], phase, n, pid)
        after = await c.stats()
        republished = after["republished"] - before["republished"]
        expected = 0 if case == "plain" else rate.messages
        notes = []
        if republished != expected:
            notes.append(f"republished {republished:,}, expected {expected:,}")
        if case == "rp_sub":
            assert copies is not None
            dropped = after["deliveries_dropped"] - before["deliveries_dropped"]
            notes.append(f"subscriber got {copies.got:,} copies")
            if copies.problem:
                notes.append(copies.problem)
                rate.errors += 1
            if dropped or sub.dropped:
                notes.append(f"dropped: {dropped:,} by the broker, {sub.dropped:,} by the client queue")
        if notes:
            rate.note = "; ".join(notes)
            log(f"    {rate.note}")
        if republished != expected:
            rate.errors += abs(expected - republished)
        return rate


# -- nats ---------------------------------------------------------------------------------


async def run_nats(url: str, case: str, n: int, max_seconds: float, pid: int | None) -> Rate:
    import nats
    from nats.js.api import RePublish, StorageType

    conns = []
    try:
        nc = await nats.connect(url, name="bench-republish", allow_reconnect=False)
        conns.append(nc)
        js = nc.jetstream(publish_async_max_pending=NATS_WINDOW, timeout=30)
        options: dict[str, Any] = {} if case == "plain" else {"republish": RePublish(src=">", dest=DEST)}
        info = await js.add_stream(name="BENCH", subjects=["bench.>"], storage=StorageType.FILE, **options)
        if case != "plain" and (info.config.republish is None or info.config.republish.dest != DEST):
            raise AssertionError(f"nats-server did not take the RePublish config: {info.config.republish!r}")
        if case == "rp_store":
            await js.add_stream(name="COPIES", subjects=[DEST], storage=StorageType.FILE)

        copies: Copies | None = None
        if case == "rp_sub":
            slow = [0]

            async def on_error(exc: Exception) -> None:
                if isinstance(exc, nats.errors.SlowConsumerError):
                    slow[0] += 1
                else:
                    log(f"    nats subscriber error: {exc!r}")

            sc = await nats.connect(url, name="bench-republish-sub", allow_reconnect=False, error_cb=on_error)
            conns.append(sc)
            copies = Copies()

            async def on_msg(msg: Any) -> None:
                assert copies is not None
                if copies.first is None:
                    _check_first_copy(copies, msg.subject, msg.data, msg.headers)
                copies.hit()

            # No byte limit and a message limit above what can be pending: the client
            # never drops (the server still may, for a slow consumer).
            await sc.subscribe(DEST, cb=on_msg, pending_msgs_limit=max(65536, 2 * n), pending_bytes_limit=0)
            await sc.flush()

        async def stored_copies() -> int:
            return (await js.stream_info("COPIES")).state.messages

        # Warm-up (not timed): one batch worth, and its copies.
        for _ in range(BATCH):
            await js.publish_async(SUBJECT, PAYLOAD)
        await js.publish_async_completed()
        if copies is not None:
            if await copies.wait_for(BATCH) < BATCH:
                raise AssertionError("the subscriber did not receive the warm-up copies")
            copies.reset()
        base = 0
        if case == "rp_store":
            base = await _wait_until(stored_copies, BATCH, None)
            if base != BATCH:
                raise AssertionError(f"the copies stream holds {base} messages after the warm-up, not {BATCH}")

        async def phase(progress: Progress) -> tuple[int, int]:
            deadline = time.perf_counter() + max_seconds
            totals = [0, 0]

            def on_ack(f: asyncio.Future[Any]) -> None:
                if f.cancelled() or f.exception() is not None:
                    totals[1] += 1
                    if totals[1] == 1:
                        log(f"    first error: {f.exception() if not f.cancelled() else 'cancelled'!r}")
                else:
                    totals[0] += 1

            # publish_async itself keeps at most NATS_WINDOW unacknowledged.
            for i in range(n):
                fut = await js.publish_async(SUBJECT, PAYLOAD)
                fut.add_done_callback(on_ack)
                if not i & 1023:
                    progress.update(totals[0])
                    if time.perf_counter() > deadline:
                        break
            await js.publish_async_completed()
            await asyncio.sleep(0)  # let the last done-callbacks run
            stored, refused = totals
            missing = 0
            if copies is not None:
                missing = stored - await copies.wait_for(stored, progress)
            elif case == "rp_store":
                async def count() -> int:
                    return await stored_copies() - base

                missing = stored - await _wait_until(count, stored, progress)
            return stored, refused + max(0, missing)

        rate = await measure(CASES[case], phase, n, pid)
        if copies is not None:
            rate.note = f"subscriber got {copies.got:,} copies" + (
                f"; {slow[0]:,} copies dropped by the client (slow consumer)" if slow[0] else "")
            if copies.problem:
                rate.note += f"; {copies.problem}"
                rate.errors += 1
        return rate
    finally:
        for conn in reversed(conns):
            with contextlib.suppress(Exception):
                await conn.close()


# -- report ---------------------------------------------------------------------------------

Results = dict[str, dict[str, dict[str, Rate]]]  # durability -> server kind -> case -> Rate


def _rate(results: Results, durability: str, kind: str, case: str) -> float | None:
    r = results.get(durability, {}).get(kind, {}).get(case)
    return r.per_second if r is not None and r.messages else None


def _added_us(rate: float | None, plain: float | None) -> str:
    if not rate or not plain:
        return ""
    return f"{1e6 / rate - 1e6 / plain:+.2f}"


def report(results: Results, runs: dict[str, dict[str, dict[str, list[Rate]]]]) -> str:
    headers = ["durability", "case", "ttlbroker msgs/s", "vs no republish", "added µs/msg",
               "nats msgs/s", "vs no republish", "added µs/msg", "ttlbroker / nats"]
    rows = []
    for dur in results:
        tp, np_ = _rate(results, dur, "ttlbroker", "plain"), _rate(results, dur, "nats", "plain")
        first = True
        for case, label in CASES.items():
            t, nt = _rate(results, dur, "ttlbroker", case), _rate(results, dur, "nats", case)
            if t is None and nt is None:
                continue
            plain = case == "plain"
            rows.append([dur if first else "", label,
                         fmt_rate(t), "" if plain else fmt_ratio(t, tp), "" if plain else _added_us(t, tp),
                         fmt_rate(nt), "" if plain else fmt_ratio(nt, np_), "" if plain else _added_us(nt, np_),
                         fmt_ratio(t, nt)])
            first = False
    text = format_table(headers, rows, right=(2, 3, 4, 5, 6, 7, 8))
    text += "\n\n" + "\n".join(f"{d}: {DURABILITY[d][2]}" for d in results)
    problems = [f"{d} {k} {CASES[c]}: {r.errors:,}" + (f" ({r.note})" if r.note else "")
                for d, ks in runs.items() for k, cs in ks.items() for c, rs in cs.items() for r in rs if r.errors]
    if problems:
        text += "\n\nERRORS (messages refused, copies missing or miscounted): " + "; ".join(problems)
    return text


def cpu_table(results: Results) -> str:
    """CPU microseconds per message, client (publisher and subscriber: one process)
    and server: where the time goes."""
    rows = []
    for dur, ks in results.items():
        for kind, cs in ks.items():
            for case, r in cs.items():
                c, s = r.cpu_us_per_msg()
                wall = 1e6 / r.per_second if r.per_second else None
                rows.append([dur, kind, CASES[case], f"{r.messages:,}", f"{r.seconds:.1f}",
                             "" if wall is None else f"{wall:.2f}",
                             "" if c is None else f"{c:.2f}", "" if s is None else f"{s:.2f}"])
    if not rows:
        return ""
    return format_table(["durability", "server", "case", "msgs", "s", "wall µs/msg", "client CPU µs/msg",
                         "server CPU µs/msg"], rows, right=(3, 4, 5, 6, 7))


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=None, metavar="N",
                   help="messages published per ttlbroker case (default 300,000; 30,000 with --quick)")
    p.add_argument("--nats-messages", type=int, default=None, metavar="N",
                   help="messages per nats case, whose Python client is slower (default N/3)")
    p.add_argument("--durability", default=None,
                   help="comma-separated: always, relaxed (default: always,relaxed; always with --quick)")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated subset of {', '.join(CASES)} (default: all)")
    p.add_argument("--only", choices=("ttlbroker", "nats"), help="run one side only")
    p.add_argument("--repeat", type=int, default=None, metavar="R",
                   help="run every case R times, in R rounds, and report the fastest run (default 2; 1 with --quick)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="cap on the publishing of each case; the rate is over what it did (default 10; 5 with --quick)")
    p.add_argument("--quick", action="store_true", help="a smoke test: small counts, finishes in < 60 s")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (e.g. bench/results/x.json)")
    p.add_argument("--keep-temp", action="store_true", help="keep the servers' temporary directories")
    args = p.parse_args(argv)
    if args.messages is None:
        args.messages = 30_000 if args.quick else 300_000
    if args.nats_messages is None:
        args.nats_messages = max(BATCH, args.messages // 3)
    if args.max_seconds is None:
        args.max_seconds = 5.0 if args.quick else 10.0
    if args.repeat is None:
        args.repeat = 1 if args.quick else 2
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.durability is None:
        args.durability = "always" if args.quick else "always,relaxed"
    args.durability = [x.strip() for x in args.durability.split(",") if x.strip()]
    args.cases = [x.strip() for x in args.cases.split(",") if x.strip()]
    for d in args.durability:
        if d not in DURABILITY:
            p.error(f"unknown durability {d!r}; known: {', '.join(DURABILITY)}")
    for c in args.cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}; known: {', '.join(CASES)}")
    for name in ("messages", "nats_messages"):
        if getattr(args, name) < BATCH:
            p.error(f"--{name.replace('_', '-')} must be >= {BATCH}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    sides = [s for s in ("ttlbroker", "nats") if args.only in (None, s)]
    log(f"republish: {args.messages:,} (ttlbroker) / {args.nats_messages:,} (nats) publishes of {len(PAYLOAD)} bytes "
        f"per case; cases {', '.join(args.cases)}; durability {', '.join(args.durability)}")
    log_environment(env)
    runs: dict[str, dict[str, dict[str, list[Rate]]]] = {}
    t0 = time.perf_counter()
    cpu = CpuWatch()
    with Harness("rpbench", keep_temp=args.keep_temp) as h:
        # Whole rounds one after the other, so that a burst of other load hits one
        # run of a case rather than every run of it.
        for rnd in range(1, args.repeat + 1):
            if args.repeat > 1:
                log(f"round {rnd} of {args.repeat}")
            for dur in args.durability:
                fsync, sync_interval, _ = DURABILITY[dur]
                for side in sides:
                    for case in args.cases:
                        if side == "ttlbroker":
                            with h.ttlbroker(fsync=fsync) as srv:
                                log(f"{srv.label} on {srv.address}")
                                rate = run_uvloop(run_ttlbroker(srv.address, case, args.messages, args.max_seconds,
                                                                srv.proc.pid))
                        else:
                            with h.nats(sync_interval=sync_interval) as srv:
                                log(f"{srv.label} on {srv.address}")
                                rate = run_uvloop(run_nats(srv.url, case, args.nats_messages, args.max_seconds,
                                                           srv.proc.pid))
                        runs.setdefault(dur, {}).setdefault(side, {}).setdefault(case, []).append(rate)
    # The fastest run of each case: other load only ever slows a run down.
    results: Results = {d: {k: {c: max(rs, key=lambda r: r.per_second) for c, rs in cs.items()}
                            for k, cs in ks.items()} for d, ks in runs.items()}
    elapsed = time.perf_counter() - t0
    env["load_avg_at_end"] = os.getloadavg()
    env["cpu_during_run"] = others = cpu.stop()

    print()
    print(f"republish: {len(PAYLOAD)}-byte payloads; ttlbroker publish_batch {BATCH:,} x {BATCHES_IN_FLIGHT} in flight, "
          f"nats publish_async {NATS_WINDOW:,} in flight; uvloop clients"
          + (f"; best of {args.repeat} runs per case" if args.repeat > 1 else "")
          + f" ({env['cpus']} CPUs, {env['date']}, "
          f"{elapsed:.0f} s total, load average {env['load_avg_at_start'][0]:.2f} at start, "
          f"{env['load_avg_at_end'][0]:.2f} at end)")
    print_cpu_share(others)
    print()
    print(report(results, runs))
    c = cpu_table(results)
    if c:
        print()
        print("CPU per message (client = this process: publisher and subscriber; nats-server uses several threads):")
        print()
        print(c)
    if args.json:
        record = {
            "benchmark": "republish",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "environment": env,
            "settings": {"payload_bytes": len(PAYLOAD), "batch": BATCH, "batches_in_flight": BATCHES_IN_FLIGHT,
                         "nats_window": NATS_WINDOW, "messages": args.messages, "nats_messages": args.nats_messages,
                         "max_seconds": args.max_seconds, "repeat": args.repeat,
                         "republish": {"src": ">", "dest": DEST},
                         "durability": {d: DURABILITY[d][2] for d in args.durability}},
            "elapsed_s": round(elapsed, 1),
            "results": {d: {k: {c: r.as_dict() for c, r in cs.items()} for k, cs in ks.items()}
                        for d, ks in results.items()},
            "runs": {d: {k: {c: [r.as_dict() for r in rs] for c, rs in cs.items()} for k, cs in ks.items()}
                     for d, ks in runs.items()},
        }
        log(f"wrote {write_json(args.json, record)}")
    return 1 if any(r.errors for ks in runs.values() for cs in ks.values() for rs in cs.values() for r in rs) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers stopped and temporary directories removed")
        sys.exit(130)
