"""KV buckets: ttlbroker against nats-server's KV (JetStream, through nats-py).

N keys (``--keys``, default 100,000) ``k0`` .. ``k<N-1>`` with 128-byte values, in a
bucket with history 1 and a TTL of one hour (``--ttl``) on both servers: ttlbroker
``client.kv_create(bucket, history=1, ttl=3600, refresh=...)``; nats
``js.create_key_value(bucket=..., history=1, ttl=3600, direct=True)``, where the
TTL is the stream's max age (a key lives an hour after its last put; no read or
touch extends it, as ttlbroker's ``on_write``) and ``direct=True`` is the Go
client's default for KV (gets are answered by ``$JS.API.DIRECT.GET``).

Every request is its own round trip on one connection, from a uvloop client.
*Pipelined* = ``--window`` (default 500) coroutines each awaiting one request at a
time over the same connection (a sliding window of 500 in flight); *one by one* =
one coroutine. Random keys are a seeded uniform draw, the same for both servers.

Workloads (ttlbroker: ``await kv.put/get/touch``; nats: ``await kv.put/get``):

* **put, new keys, pipelined**: the N keys, each put once (the bucket fills).
* **memory per key with a TTL**: the server's RSS after those N puts minus its RSS
  before them (bucket created, warm-up done, ``--settle`` s of quiet each time),
  divided by N. ttlbroker fills a second bucket (``on_read_and_write``) after this
  reading, so it is not counted.
* **get, a key's first get, one by one** (N/20 keys), then **get, each key once,
  pipelined** (every other key), **get, random keys, pipelined / one by one**.
* **put, existing keys (random), pipelined / one by one**: overwrites; history 1,
  so every put also removes the key's previous revision.
* ttlbroker only: **touch, each key once / random keys, pipelined**.
* ttlbroker only, **references**: the plain operations KV is built on, on the same
  server, in a topic like the bucket but without ``kv`` (one partition, history 1,
  ``allow_msg_ttl``): ``publish(subject, value, ttl=TTL)`` of new then existing
  (random) subjects, and ``get_last`` of random subjects, pipelined. A second table
  gives each KV workload against its reference and the server CPU the KV part adds
  per operation (the aim: KV should cost a plain operation plus what is truly extra).

**on_read_and_write against on_write** (ttlbroker): the same server holds a second
bucket of N keys with ``refresh="on_read_and_write"``; its gets run alternately with
those of the ``on_write`` bucket, in the same state. With ``on_read_and_write`` the
first get of a key after a put pushes its deadline out and, because the deadline is
then past the durable one, writes a *lease* (the new deadline + a headroom of TTL/10,
a 30-byte append to the topic's offsets file). Later gets within the headroom (here
6 minutes) only update an in-memory dict and write nothing. So the first-get phases
(every get writes a lease) are the worst case and "random keys" (after them: no
lease to write) the steady state. Under ``--fsync always`` a lease-writing get's
reply waits for the group commit (an fsync) that covers the lease, as a put's ack
does; under an interval it does not wait. A touch writes leases the same way,
whatever the policy.

Durability: ``--sync`` (default ``2m``) on both servers (ttlbroker ``--fsync 2m``;
nats ``sync_interval: "2m"``, its default); then everything again with ``always`` on
both (ttlbroker group-commits; nats fsyncs each write), unless ``--no-always``.
Every phase but the two that fill the buckets stops after ``--max-seconds`` (the
rate is then over what it did). Run from the repository root::

    .venv/bin/python bench/kv.py            # 100,000 keys, 100,000 random ops per phase: ~5.5 minutes
    .venv/bin/python bench/kv.py --quick    # 5,000 keys: ~30 s
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    print_cpu_share,
    CpuWatch,
    Harness,
    ProcUsage,
    Progress,
    Rate,
    Server,
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

VALUE = random.Random(0).randbytes(128)
WINDOW = 500  # requests in flight, pipelined
WARMUP = 500  # keys put, got and touched in a separate bucket before anything is measured
SEED = 7

#: Workload keys, in table order, with their labels.
WORKLOADS = {
    "put_new": "put, new keys, pipelined",
    "put_existing": "put, existing keys (random), pipelined",
    "put_serial": "put, existing keys, one by one",
    "get_first_serial": "get, a key's first get, one by one",
    "get_once": "get, each key once, pipelined",
    "get_random": "get, random keys, pipelined",
    "get_serial": "get, random keys, one by one",
    "touch_once": "touch, each key once, pipelined",
    "touch_random": "touch, random keys, pipelined",
    "ref_put_new": "reference: publish with a TTL into a plain topic (history 1), new subjects, pipelined",
    "ref_put_existing": "reference: the same, existing subjects (random), pipelined",
    "ref_get": "reference: get_last on that topic, random subjects, pipelined",
}
#: ttlbroker only: what a KV operation costs beyond the plain operation it is built on.
#: (KV workload, the plain workload it is built on).
REFERENCE_WORKLOADS = (("put_new", "ref_put_new"), ("put_existing", "ref_put_existing"), ("get_random", "ref_get"))
REFRESH_WORKLOADS = ("get_first_serial", "get_once", "get_random", "get_serial")


# -- results ----------------------------------------------------------------------------


@dataclass
class Run:
    """One server (one durability setting): rates per workload and bucket."""

    kind: str  # ttlbroker | nats
    sync: str
    rates: dict[str, Rate] = field(default_factory=dict)  # "<workload>" (on_write / nats) or "rw:<workload>"
    rss_empty: ProcUsage | None = None
    rss_full: ProcUsage | None = None  # N keys in the on_write bucket
    rss_two: ProcUsage | None = None  # ttlbroker: + N keys in the on_read_and_write bucket
    rss_leased: ProcUsage | None = None  # ttlbroker: + a lease for every key of that bucket
    keys: int = 0
    wrong_values: int = 0
    notes: list[str] = field(default_factory=list)

    def rate(self, key: str) -> float | None:
        r = self.rates.get(key)
        return r.per_second if r is not None and r.messages else None

    def per_key(self, attr: str, before: ProcUsage | None, after: ProcUsage | None) -> float | None:
        if before is None or after is None or not self.keys:
            return None
        return (getattr(after, attr) - getattr(before, attr)) / self.keys

    @property
    def rss_per_key(self) -> float | None:
        return self.per_key("rss", self.rss_empty, self.rss_full)

    @property
    def anon_per_key(self) -> float | None:
        return self.per_key("rss_anon", self.rss_empty, self.rss_full)

    @property
    def rss_per_lease(self) -> float | None:
        return self.per_key("rss", self.rss_two, self.rss_leased)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rates"] = {k: r.as_dict() for k, r in self.rates.items()}
        d.update(rss_per_key_bytes=self.rss_per_key, rss_anon_per_key_bytes=self.anon_per_key,
                 rss_per_lease_bytes=self.rss_per_lease)
        return d


# -- driving requests ---------------------------------------------------------------------


async def drive(op: Callable[[str], Awaitable[Any]], keys: Sequence[str], window: int, progress: Progress,
                max_seconds: float, check: Callable[[Any], bool] | None = None,
                wrong: list[int] | None = None) -> tuple[int, int]:
    """Run ``op(key)`` for every key, ``window`` at a time: ``window`` coroutines, each
    awaiting one request at a time, share an iterator over ``keys``. Returns (done,
    errors); ``check(result)`` False counts into ``wrong[0]``."""
    it = iter(keys)
    totals = [0, 0]
    deadline = time.perf_counter() + max_seconds
    stop = False

    async def worker() -> None:
        nonlocal stop
        task = asyncio.current_task()
        for key in it:
            if stop:
                return
            try:
                result = await op(key)
            except Exception as exc:
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError from exc
                totals[1] += 1
                if totals[1] == 1:
                    log(f"    first error ({key}): {exc!r}")
                if totals[1] >= 1000 and totals[0] == 0:
                    stop = True  # nothing works: do not spin through the rest
                continue
            if task is not None and task.cancelling():
                # A cancellation some client library swallowed (asyncio.wait_for can,
                # when the reply and the cancel cross): on Ctrl-C, every task is
                # cancelled at once, and the next request would wait for ever.
                raise asyncio.CancelledError
            totals[0] += 1
            if check is not None and not check(result) and wrong is not None:
                wrong[0] += 1
                if wrong[0] == 1:
                    log(f"    unexpected result for {key}: {result!r}")
            if not totals[0] & 255:
                progress.update(totals[0])
                if time.perf_counter() > deadline:
                    stop = True

    if window <= 1:
        await worker()
    else:
        await asyncio.gather(*(worker() for _ in range(window)))
    return totals[0], totals[1]


@dataclass
class Plan:
    n: int
    ops: int
    serial: int
    window: int
    max_seconds: float
    ttl: int
    settle: float
    names: list[str]  # the N keys, in order
    once: list[str]  # each key once, shuffled
    random: list[str]  # ops random keys
    random2: list[str]  # another ops random keys (the second bucket / the overwrites)


def make_plan(args: argparse.Namespace) -> Plan:
    rnd = random.Random(SEED)
    names = [f"k{i}" for i in range(args.keys)]
    once = names[:]
    rnd.shuffle(once)
    return Plan(
        n=args.keys, ops=args.ops, serial=args.serial, window=args.window, max_seconds=args.max_seconds,
        ttl=args.ttl, settle=args.settle, names=names, once=once,
        random=[names[rnd.randrange(args.keys)] for _ in range(args.ops)],
        random2=[names[rnd.randrange(args.keys)] for _ in range(args.ops)],
    )


async def settle_usage(server: Server, seconds: float) -> ProcUsage:
    await asyncio.sleep(seconds)
    return server.usage()


def _mib(u: ProcUsage | None) -> str:
    return f"{u.rss / 2**20:.1f} MiB (anon {u.rss_anon / 2**20:.1f})" if u else "?"


# -- ttlbroker ---------------------------------------------------------------------------


async def run_ttlbroker(server: Server, run: Run, plan: Plan) -> None:
    from broker.client import aio

    pid = server.proc.pid
    async with aio.connect(server.address, name="bench-kv", timeout=30) as c:
        ow = await c.kv_create("ow", history=1, ttl=plan.ttl, refresh="on_write")
        rw = await c.kv_create("rw", history=1, ttl=plan.ttl, refresh="on_read_and_write")
        warm = await c.kv_create("warm", history=1, ttl=plan.ttl, refresh="on_read_and_write")
        # Warm-up (not timed): every code path once, in a bucket of its own.
        put_warm = lambda key: warm.put(key, VALUE)
        for key in plan.names[:10]:
            await put_warm(key)
        await drive(put_warm, plan.names[:WARMUP], plan.window, Progress("warm-up"), 60)
        await drive(warm.get, plan.names[:WARMUP], plan.window, Progress("warm-up"), 60)
        await drive(warm.touch, plan.names[:WARMUP], plan.window, Progress("warm-up"), 60)

        wrong = [0]
        n, w, cap = plan.n, plan.window, plan.max_seconds
        ttl_ms = plan.ttl * 1000

        def good_put(rev: Any) -> bool:
            return isinstance(rev, int) and rev > 0

        def good_get(e: Any) -> bool:  # the value, and a TTL running
            return e.value == VALUE and e.ttl_remaining is not None and 0 < e.ttl_remaining * 1000 <= ttl_ms

        def good_get_rw(e: Any) -> bool:  # the get restarted the TTL
            return e.value == VALUE and e.ttl_remaining is not None and ttl_ms - 2000 < e.ttl_remaining * 1000 <= ttl_ms

        def good_touch(remaining: Any) -> bool:
            return remaining is not None and ttl_ms - 2000 < remaining * 1000 <= ttl_ms

        async def phase(key: str, op: Callable[[str], Awaitable[Any]], keys: Sequence[str], window: int,
                        check: Callable[[Any], bool], label_extra: str = "") -> None:
            label = WORKLOADS[key.split(":")[-1]] + label_extra
            async def work(progress: Progress) -> tuple[int, int]:
                # filling a bucket is never cut short: every later phase needs every key
                limit = float("inf") if key.endswith("put_new") else cap
                return await drive(op, keys, window, progress, limit, check, wrong)

            run.rates[key] = await measure(label, work, len(keys), pid)

        run.rss_empty = await settle_usage(server, plan.settle)
        log(f"  RSS before the puts: {_mib(run.rss_empty)}")
        put = lambda key: ow.put(key, VALUE)
        await phase("put_new", put, plan.names, w, good_put)
        run.keys = n
        run.rss_full = await settle_usage(server, plan.settle)
        log(f"  RSS with {n:,} keys: {_mib(run.rss_full)} = {run.rss_per_key or 0:,.0f} bytes per key")

        rw_put = lambda key: rw.put(key, VALUE)
        await phase("rw:put_new", rw_put, plan.names, w, good_put, " (on_read_and_write bucket)")
        run.rss_two = await settle_usage(server, plan.settle)

        # gets, alternating between the two buckets; first the first get of
        # `serial` keys one by one, then the first get of every other key
        first, rest = plan.once[: plan.serial], plan.once[plan.serial :]
        await phase("get_first_serial", ow.get, first, 1, good_get, " (on_write)")
        await phase("rw:get_first_serial", rw.get, first, 1, good_get_rw, " (on_read_and_write: a lease each)")
        await phase("get_once", ow.get, rest, w, good_get, " (on_write)")
        await phase("rw:get_once", rw.get, rest, w, good_get_rw, " (on_read_and_write: a lease each)")
        run.rss_leased = await settle_usage(server, plan.settle)
        log(f"  RSS after a lease for each of {n:,} keys: {_mib(run.rss_leased)} = "
            f"{run.rss_per_lease or 0:,.0f} bytes per lease")
        await phase("get_random", ow.get, plan.random, w, good_get, " (on_write)")
        await phase("rw:get_random", rw.get, plan.random, w, good_get_rw, " (on_read_and_write)")
        await phase("get_serial", ow.get, plan.random2[: plan.serial], 1, good_get, " (on_write)")
        await phase("rw:get_serial", rw.get, plan.random2[: plan.serial], 1, good_get_rw, " (on_read_and_write)")

        # overwrites and touches, on the on_write bucket
        await phase("put_existing", put, plan.random2, w, good_put)
        await phase("put_serial", put, plan.random[: plan.serial], 1, good_put)
        # the overwrites made new revisions: "each key once" touches every key's first
        # refresh of the latest revision (a lease each), "random" the ones after it
        await phase("touch_once", ow.touch, plan.once, w, good_touch, " (a lease each)")
        await phase("touch_random", ow.touch, plan.random, w, good_touch)

        # The plain operations a put and a get are built on, on the same server: a
        # topic like the bucket (one partition, history 1, the same TTL) without kv.
        await c.create_stream("plain")
        await c.create_topic("plain", "t", partitions=1, subjects=["plain.>"], allow_msg_ttl=True,
                             max_msgs_per_subject=1)
        ref_put = lambda key: c.publish("plain." + key, VALUE, ttl=plan.ttl)
        await phase("ref_put_new", ref_put, plan.names, w, lambda a: a is not None and a.offset > 0)
        await phase("ref_put_existing", ref_put, plan.random2, w, lambda a: a is not None and a.offset > 0)
        await phase("ref_get", lambda key: c.get_last("plain", "t", "plain." + key), plan.random, w,
                    lambda m: m.payload == VALUE)

        st = await c.stats()
        run.notes.append(f"server stats: fsyncs={st.get('fsyncs')}, messages={st.get('messages')}, "
                         f"pending_expiries={st.get('pending_expiries')}")
        run.wrong_values = wrong[0]
        if wrong[0]:
            log(f"  {wrong[0]:,} unexpected results")


# -- nats -----------------------------------------------------------------------------------


async def run_nats(server: Server, run: Run, plan: Plan) -> None:
    import nats

    pid = server.proc.pid
    nc = await nats.connect(server.url, name="bench-kv", allow_reconnect=False, pending_size=64 * 2**20)
    try:
        js = nc.jetstream(timeout=30)
        kv = await js.create_key_value(bucket="ow", history=1, ttl=plan.ttl, direct=True)
        warm = await js.create_key_value(bucket="warm", history=1, ttl=plan.ttl, direct=True)
        put_warm = lambda key: warm.put(key, VALUE)
        await drive(put_warm, plan.names[:WARMUP], plan.window, Progress("warm-up"), 60)
        await drive(put_warm, plan.names[:WARMUP], plan.window, Progress("warm-up"), 60)
        await drive(warm.get, plan.names[:WARMUP], plan.window, Progress("warm-up"), 60)

        wrong = [0]
        w, cap = plan.window, plan.max_seconds

        def good_put(rev: Any) -> bool:
            return isinstance(rev, int) and rev > 0

        def good_get(e: Any) -> bool:
            return e.value == VALUE

        async def phase(key: str, op: Callable[[str], Awaitable[Any]], keys: Sequence[str], window: int,
                        check: Callable[[Any], bool]) -> None:
            async def work(progress: Progress) -> tuple[int, int]:
                # filling a bucket is never cut short: every later phase needs every key
                limit = float("inf") if key.endswith("put_new") else cap
                return await drive(op, keys, window, progress, limit, check, wrong)

            run.rates[key] = await measure(WORKLOADS[key], work, len(keys), pid)

        put = lambda key: kv.put(key, VALUE)
        run.rss_empty = await settle_usage(server, plan.settle)
        log(f"  RSS before the puts: {_mib(run.rss_empty)}")
        await phase("put_new", put, plan.names, w, good_put)
        run.keys = plan.n
        run.rss_full = await settle_usage(server, plan.settle)
        log(f"  RSS with {plan.n:,} keys: {_mib(run.rss_full)} = {run.rss_per_key or 0:,.0f} bytes per key")
        await phase("get_first_serial", kv.get, plan.once[: plan.serial], 1, good_get)
        await phase("get_once", kv.get, plan.once[plan.serial :], w, good_get)
        await phase("get_random", kv.get, plan.random, w, good_get)
        await phase("get_serial", kv.get, plan.random2[: plan.serial], 1, good_get)
        await phase("put_existing", put, plan.random2, w, good_put)
        await phase("put_serial", put, plan.random[: plan.serial], 1, good_put)
        info = await js.stream_info("KV_ow")
        run.notes.append(f"stream KV_ow: {info.state.messages:,} messages, max_age {info.config.max_age} s")
        if info.state.messages != plan.n:
            run.notes.append(f"WARNING: the bucket holds {info.state.messages:,} messages, not {plan.n:,}")
        run.wrong_values = wrong[0]
        if wrong[0]:
            log(f"  {wrong[0]:,} unexpected results")
    finally:
        await nc.close()


# -- report ---------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 0) -> str:
    return "" if v is None else f"{v:,.{digits}f}"


def main_table(runs: dict[str, Run], sync: str) -> str:
    """ttlbroker against nats, per durability setting: ops/s and ratios."""
    syncs = [s for s in (sync, "always") if f"ttlbroker {s}" in runs or f"nats {s}" in runs]
    headers = ["workload"]
    for s in syncs:
        headers += [f"ttlbroker {s}", f"nats {s}", "ttlbroker / nats"]
    rows = []
    for key, label in WORKLOADS.items():
        row = [label + (" (ttlbroker on_write)" if key.startswith("get") else "")]
        have = False
        for s in syncs:
            tb, nt = runs.get(f"ttlbroker {s}"), runs.get(f"nats {s}")
            a = tb.rate(key) if tb else None
            b = nt.rate(key) if nt else None
            have = have or a is not None or b is not None
            row += [fmt_rate(a), fmt_rate(b) if b is not None else ("n/a" if key.startswith(("touch", "ref")) else ""),
                    fmt_ratio(a, b)]
        if have:
            rows.append(row)
    for attr, label in (("rss_per_key", "memory per key with a TTL: RSS (bytes) [1]"),
                        ("anon_per_key", "  of which anonymous memory (bytes) [1]")):
        row = [label]
        for s in syncs:
            tb, nt = runs.get(f"ttlbroker {s}"), runs.get(f"nats {s}")
            a = getattr(tb, attr) if tb else None
            b = getattr(nt, attr) if nt else None
            row += [_f(a), _f(b), fmt_ratio(a, b)]
        rows.append(row)
    return format_table(headers, rows, right=tuple(range(1, len(headers))))


def reference_table(runs: dict[str, Run]) -> str:
    """ttlbroker: each KV operation against the plain operation it is built on."""
    rows = []
    for name, r in runs.items():
        if r.kind != "ttlbroker":
            continue
        for kv_key, ref_key in REFERENCE_WORKLOADS:
            a, b = r.rates.get(kv_key), r.rates.get(ref_key)
            if a is None or b is None or not a.messages or not b.messages:
                continue
            sa, sb = a.cpu_us_per_msg()[1], b.cpu_us_per_msg()[1]
            rows.append([name, WORKLOADS[kv_key], fmt_rate(a.per_second), fmt_rate(b.per_second),
                         fmt_ratio(a.per_second, b.per_second), _f(sa, 1), _f(sb, 1),
                         _f(sa - sb, 1) if sa is not None and sb is not None else ""])
    if not rows:
        return ""
    return format_table(["server", "KV workload", "KV ops/s", "plain ops/s", "KV / plain", "KV server CPU µs/op",
                         "plain server CPU µs/op", "KV extra µs/op"], rows, right=(2, 3, 4, 5, 6, 7))


def refresh_table(runs: dict[str, Run], sync: str) -> str:
    """ttlbroker gets: on_read_and_write against on_write, per fsync setting."""
    rows = []
    for s in (sync, "always"):
        r = runs.get(f"ttlbroker {s}")
        if r is None:
            continue
        for key in REFRESH_WORKLOADS:
            a, b = r.rate(f"rw:{key}"), r.rate(key)
            what = WORKLOADS[key]
            if key in ("get_once", "get_first_serial"):
                what += " (on_read_and_write: each get writes a lease)"
            elif key == "get_random":
                what += " (after it: within the headroom, no write)"
            rows.append([what, s, fmt_rate(b), fmt_rate(a), fmt_ratio(a, b)])
        rows.append(["put, new keys, pipelined (the bucket's own)", s, fmt_rate(r.rate("put_new")),
                     fmt_rate(r.rate("rw:put_new")), fmt_ratio(r.rate("rw:put_new"), r.rate("put_new"))])
        if r.rss_per_lease is not None:
            rows.append(["memory per lease: RSS (bytes) [2]", s, "", _f(r.rss_per_lease), ""])
    if not rows:
        return ""
    return format_table(["ttlbroker workload", "fsync", "on_write ops/s", "on_read_and_write ops/s",
                         "on_read_and_write / on_write"], rows, right=(2, 3, 4))


def cpu_table(runs: dict[str, Run]) -> str:
    rows = []
    for name, r in runs.items():
        for key, rate in r.rates.items():
            c, s = rate.cpu_us_per_msg()
            wall = 1e6 / rate.per_second if rate.per_second else None
            bucket, _, wk = key.rpartition(":")
            label = WORKLOADS[wk] + (" (on_read_and_write)" if bucket else "")
            rows.append([name, label, _f(wall, 1), _f(c, 1), _f(s, 1)])
    return format_table(["server", "workload", "wall µs/op", "client CPU µs/op", "server CPU µs/op"], rows,
                        right=(2, 3, 4))


def problems(runs: dict[str, Run]) -> list[str]:
    out = []
    for name, r in runs.items():
        errs = [f"{k} {rate.errors:,}" for k, rate in r.rates.items() if rate.errors]
        if errs:
            out.append(f"{name}: errors: " + ", ".join(errs))
        if r.wrong_values:
            out.append(f"{name}: {r.wrong_values:,} unexpected results (value, revision or TTL)")
        out += [f"{name}: {x}" for x in r.notes if x.startswith("WARNING")]
    return out


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=None, metavar="N", help="keys (default 100,000; 5,000 with --quick)")
    p.add_argument("--ops", type=int, default=None, metavar="N",
                   help="random gets, overwrites and touches per phase (default N)")
    p.add_argument("--serial", type=int, default=None, metavar="N", help="one-by-one gets and puts (default ops/20)")
    p.add_argument("--window", type=int, default=WINDOW, help=f"requests in flight when pipelined (default {WINDOW})")
    p.add_argument("--ttl", type=int, default=3600, help="the buckets' TTL in seconds (default 3600)")
    p.add_argument("--sync", default="2m",
                   help="relaxed durability on both servers: ttlbroker --fsync SYNC, nats sync_interval SYNC "
                        "(default 2m, nats's own default)")
    p.add_argument("--no-always", action="store_true", help="skip the runs with fsync always on both servers")
    p.add_argument("--only", choices=("ttlbroker", "nats"), help="run one side only")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds of quiet before reading RSS (default 3; 1 with --quick)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="cap on each phase; the rate is over what it did (default 30; 5 with --quick)")
    p.add_argument("--quick", action="store_true", help="a smoke test: 5,000 keys, < 1 minute")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (e.g. bench/results/kv.json)")
    p.add_argument("--keep-temp", action="store_true", help="keep the servers' temporary directories")
    args = p.parse_args(argv)
    if args.keys is None:
        args.keys = 5_000 if args.quick else 100_000
    if args.ops is None:
        args.ops = args.keys
    if args.serial is None:
        args.serial = max(1, args.ops // 20)
    if args.settle is None:
        args.settle = 1.0 if args.quick else 3.0
    if args.max_seconds is None:
        args.max_seconds = 5.0 if args.quick else 30.0
    if args.keys < WARMUP:
        p.error(f"--keys must be >= {WARMUP}")
    if args.ops < 1 or args.window < 1 or args.ttl < 60:
        p.error("need --ops >= 1, --window >= 1 and --ttl >= 60")
    args.serial = min(args.serial, args.ops, args.keys // 2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    env = environment()
    syncs = [args.sync] + ([] if args.no_always or args.sync == "always" else ["always"])
    log(f"kv: {plan.n:,} keys of {len(VALUE)} bytes, {plan.ops:,} random ops per phase, {plan.serial:,} one by one, "
        f"{plan.window} in flight, TTL {plan.ttl} s; durability {', '.join(syncs)} on both servers")
    log_environment(env)
    runs: dict[str, Run] = {}
    t0 = time.perf_counter()
    cpu = CpuWatch()
    with Harness("kvbench", keep_temp=args.keep_temp) as h:
        for sync in syncs:
            if args.only != "nats":
                with h.ttlbroker(fsync=sync) as srv:
                    log(f"{srv.label} on {srv.address}")
                    run = runs[f"ttlbroker {sync}"] = Run("ttlbroker", sync)
                    run_uvloop(run_ttlbroker(srv, run, plan))
            if args.only != "ttlbroker":
                with h.nats(sync_interval=sync) as srv:
                    log(f"{srv.label} on {srv.address}")
                    run = runs[f"nats {sync}"] = Run("nats", sync)
                    run_uvloop(run_nats(srv, run, plan))
    elapsed = time.perf_counter() - t0
    env["load_avg_at_end"] = os.getloadavg()
    env["cpu_during_run"] = others = cpu.stop()

    print()
    print(f"kv: {plan.n:,} keys, {len(VALUE)}-byte values, history 1, TTL {plan.ttl} s; {plan.ops:,} random ops "
          f"per pipelined phase ({plan.window} in flight), {plan.serial:,} one by one; one connection per server, "
          f"uvloop clients ({env['cpus']} CPUs, {env['date']}, {elapsed:.0f} s total, load average "
          f"{env['load_avg_at_start'][0]:.2f} at start, {env['load_avg_at_end'][0]:.2f} at end)")
    print_cpu_share(others)
    print()
    print("ttlbroker (bucket refresh on_write) against nats-server KV, ops/s:")
    print()
    print(main_table(runs, args.sync))
    print()
    print(f"[1] (server RSS after putting the {plan.n:,} keys - RSS before) / {plan.n:,}, after {plan.settle:g} s of"
          " quiet; nats: the bucket's TTL is the stream's max age.")
    ref = reference_table(runs)
    if ref:
        print()
        print("ttlbroker KV against the plain operations it is built on (same server; put: a publish with a TTL into a "
              "topic with history 1; get: get_last):")
        print()
        print(ref)
    rt = refresh_table(runs, args.sync)
    if rt:
        print()
        print("ttlbroker gets, refresh on_read_and_write against on_write (same server, alternating):")
        print()
        print(rt)
        print()
        print("[2] (RSS after the first get of every key of the on_read_and_write bucket - RSS before) / "
              f"{plan.n:,}: the lease ($refresh.<offset> in the offsets dict) and the in-memory deadline.")
    print()
    print("CPU per operation (client = this process; nats-server uses several threads):")
    print()
    print(cpu_table(runs))
    notes = [f"{name}: {x}" for name, r in runs.items() for x in r.notes if not x.startswith("WARNING")]
    if notes:
        print()
        print("\n".join(notes))
    found = problems(runs)
    if found:
        print()
        print("PROBLEMS: " + "; ".join(found))
    if args.json:
        record = {
            "benchmark": "kv",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "environment": env,
            "settings": {"keys": plan.n, "ops": plan.ops, "serial": plan.serial, "window": plan.window,
                         "value_bytes": len(VALUE), "ttl_s": plan.ttl, "history": 1, "syncs": syncs,
                         "settle_s": plan.settle, "max_seconds": plan.max_seconds, "warmup_keys": WARMUP,
                         "nats_direct_get": True},
            "elapsed_s": round(elapsed, 1),
            "results": {name: r.as_dict() for name, r in runs.items()},
        }
        log(f"wrote {write_json(args.json, record)}")
    return 1 if found else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers stopped and temporary directories removed")
        sys.exit(130)
