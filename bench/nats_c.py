"""The C client (libnats) against nats-server and against ttlbroker's NATS listener.

nats-py spends more CPU per message than either server, so in ``nats_compat.py``
the client sets most of the rates. Here the load comes from a small C program,
``bench/nats_c_load.c``, built with gcc against Debian's ``libnats-dev``
(``apt-get install libnats-dev``) when the benchmark starts. It is built into a
cache directory (``$XDG_CACHE_HOME/ttlbroker-bench``, else
``~/.cache/ttlbroker-bench``), named by a hash of the source and the flags, so it
is rebuilt only when the source changes. Python only starts the servers, runs one
C process per workload and reads the servers' CPU time.

Workloads, in table order (payloads of ``--size`` bytes, default 128):

* **core publish**: ``--core-messages`` (default 1,000,000) ``natsConnection_Publish``
  on ``bench.core``, one subscriber on its own connection counting them. The rate is
  the subscriber's, from its first message to its last; a message that never came
  is an error.
* **request/reply, sequential**: ``--requests`` ``natsConnection_Request`` one after
  the other, answered by a C responder on its own connection.
* **JetStream async publish, 4,000 in flight**: ``--js-messages`` ``js_PublishAsync``
  into the stream ``BENCH`` (subject ``bench.js``, file storage) with
  ``PublishAsync.MaxPending`` = ``--in-flight``, until ``js_PublishAsyncComplete``;
  the stream must then hold them all.
* **JetStream pull, fetch 1,000 + ack**: a durable pull consumer on ``BENCH``
  (explicit acks, max ack pending = ``--batch``, as ``nats bench js fetch`` makes it),
  ``natsSubscription_Fetch(--batch)`` and ``natsMsg_Ack`` of each, over everything
  the publish stored.
* **KV put, sequential**: ``kvStore_Put`` of ``--keys`` keys ("0", "1", ...) into the
  bucket ``bench`` (history 1), one after the other.
* **KV put over the same keys, sequential**: ``kvStore_Put`` of each of those keys
  again: each put replaces the key's revision (history 1), so the server also
  deletes the one before, as applications updating a key make it do.
* **KV get, sequential**: ``kvStore_Get`` of each of those keys, the value checked.

Request/reply, the publish and the KV put start nothing new after ``--max-seconds``
(default 10; the publish still waits for the acks in flight): nats-server at
``sync_interval: always`` takes a few hundred async publishes a second on a busy
disk. Their rate is over what they did; the pull and the gets read what was stored.

Each C process sets itself up (connections, stream, consumer, bucket), says
``ready``, and the clock starts when it is told to go: each server's CPU time is
read from ``/proc/<pid>/stat`` (utime + stime) just before and just after.

Every workload runs on three servers: nats-server at its default sync (in the
background every 2 minutes), nats-server at ``sync_interval: always``, and ttlbroker
at ``--fsync always``. Rounds (``--rounds``, default 3): each round starts the three
afresh and runs them one after the other, the order reversed from one round to the
next, so a slow stretch of the shared machine weighs on all of them. The table gives
each server's median rate, the medians and ranges of the rounds' ratios (ttlbroker
over each nats-server), each server's CPU microseconds per message (median of the
rounds), the load average and the CPU other processes used during the run::

    .venv/bin/python bench/nats_c.py                 # 3 rounds: 4-6 minutes on 2 busy cores
    .venv/bin/python bench/nats_c.py --quick         # small counts, one round: about 20 s
    .venv/bin/python bench/nats_c.py --only kv_put,kv_get
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    RESULTS_DIR,
    CpuWatch,
    Harness,
    Rate,
    environment,
    format_table,
    log,
    log_environment,
    median_run,
    print_cpu_share,
    proc_usage,
    round_ratios,
    write_json,
)

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "nats_c_load.c"
CFLAGS = ("-O2", "-std=gnu11", "-Wall", "-Werror")
LIBS = ("-lnats",)
INSTALL = "install Debian's libnats-dev (apt-get install libnats-dev)"

#: key: (the C program's workload, the table's label)
WORKLOADS = {
    "pub": ("pub", "core publish, one subscriber"),
    "req": ("req", "request/reply, sequential"),
    "js_pub": ("js_pub", "JetStream async publish, 4,000 in flight"),
    "js_fetch": ("js_fetch", "JetStream pull, fetch 1,000 + ack"),
    "kv_put": ("kv_put", "KV put, sequential"),
    "kv_update": ("kv_put", "KV put over the same keys, sequential"),
    "kv_get": ("kv_get", "KV get, sequential"),
}
#: Workloads that read (or, ``kv_update``, overwrite) what another one stored
#: (``--only`` runs that one too).
CONSUMES_FROM = {"js_fetch": "js_pub", "kv_update": "kv_put", "kv_get": "kv_put"}
#: The three servers of a round, in the order of the first round.
SIDES = ("nats_default", "nats_always", "ttlbroker")
SIDE_LABELS = {"nats_default": "nats-server default sync", "nats_always": "nats-server sync_interval: always",
               "ttlbroker": "ttlbroker --fsync always"}


# -- the C program ----------------------------------------------------------------------


class BuildError(RuntimeError):
    """The load generator could not be built. ``missing``: because gcc or libnats is
    not installed (the message says which and how to get it), not because the source
    does not compile."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ttlbroker-bench"


def build(cache: Path | None = None) -> Path:
    """``bench/nats_c_load.c`` compiled, from the cache when this source was already
    built with these flags; raises :class:`BuildError` (one line when gcc or libnats
    is missing)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("bench/nats_c.py needs gcc to build its C load generator: none on PATH "
                         "(apt-get install gcc)", missing=True)
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(b"\0".join([source, *(f.encode() for f in CFLAGS + LIBS)])).hexdigest()[:16]
    directory = cache or cache_dir()
    exe = directory / f"nats_c_load-{digest}"
    if exe.is_file() and os.access(exe, os.X_OK):
        return exe
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=exe.name + ".", dir=directory)
    os.close(fd)
    try:
        p = subprocess.run([gcc, *CFLAGS, "-o", tmp, str(SOURCE), *LIBS], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            if "nats/nats.h" in p.stderr or "-lnats" in p.stderr:
                raise BuildError(f"bench/nats_c.py needs the C client library libnats: {INSTALL}", missing=True)
            raise BuildError(f"gcc could not build {SOURCE}:\n{p.stderr}")
        os.replace(tmp, exe)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return exe


def libnats_version(exe: Path) -> str:
    p = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=10)
    return p.stdout.strip() or "unknown"


class WorkloadError(RuntimeError):
    """The C program failed to set up or run a workload."""


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_workload(exe: Path, url: str, workload: str, count: int, size: int, param: int = 0,
                 server_pid: int | None = None, timeout: float = 300.0, max_seconds: float = 0) -> Rate:
    """Run one workload of the C program against ``url``: its own timing and counts,
    with the CPU time ``server_pid`` spent between the go and the result (None
    without a pid) and the C program's own CPU time (its setup included).
    ``max_seconds`` (req, js_pub, kv_put): stop after that long, the rate over what
    was done."""
    argv = [str(exe), url, workload, str(count), str(size), str(param), *([str(max_seconds)] if max_seconds else [])]
    c0 = _children_cpu()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise WorkloadError(_failure(proc, line, timeout))
        s0 = proc_usage(server_pid).cpu if server_pid else None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        s1 = proc_usage(server_pid).cpu if server_pid else None
        try:
            out = json.loads(line)
        except ValueError:
            raise WorkloadError(_failure(proc, line, timeout)) from None
        if "error" in out:
            raise WorkloadError(out["error"])
        proc.stdin.close()
        if proc.wait(30) != 0:
            raise WorkloadError(_failure(proc, line, timeout))
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None and not f.closed:
                f.close()
    return Rate(out["messages"], out["seconds"], out["errors"], note=out["detail"],
                client_cpu_s=round(_children_cpu() - c0, 3),
                server_cpu_s=None if s0 is None or s1 is None else round(s1 - s0, 3))


def _failure(proc: subprocess.Popen[str], line: str, timeout: float) -> str:
    """What a C process that did not answer as it should said."""
    if proc.poll() is None:
        proc.kill()
    code = proc.wait()
    err = proc.stderr.read().strip() if proc.stderr else ""
    if line.startswith('{"error"'):
        return str(json.loads(line)["error"])
    if code == -9:
        return f"killed after {timeout:.0f} s"
    return f"exit status {code}: {(line + err).strip()[:300] or 'no output'}"


# -- one server, every workload ----------------------------------------------------------


def counts(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    """key -> (count, param) for the C program."""
    return {"pub": (args.core_messages, 0), "req": (args.requests, 0), "js_pub": (args.js_messages, args.in_flight),
            "js_fetch": (args.js_messages, args.batch), "kv_put": (args.keys, 0), "kv_update": (args.keys, 0), "kv_get": (args.keys, 0)}


def run_server(exe: Path, url: str, pid: int, args: argparse.Namespace) -> dict[str, Rate]:
    """Every chosen workload, in table order, against one server. A workload that
    fails is reported (its rate 0, one error) and the others still run; a consumer
    whose producer stored nothing is left out."""
    rates: dict[str, Rate] = {}
    sizes = counts(args)
    for key, (workload, label) in WORKLOADS.items():
        if key not in args.only:
            continue
        count, param = sizes[key]
        producer = CONSUMES_FROM.get(key)
        if producer is not None:
            stored = rates.get(producer)
            if stored is None or not stored.messages:
                log(f"  {label}: skipped ({WORKLOADS[producer][1]} stored nothing)")
                continue
            count = stored.messages
        try:
            rate = run_workload(exe, url, workload, count, args.size, param, pid, args.timeout,
                                0 if producer else args.max_seconds)
        except WorkloadError as exc:
            log(f"  {label}: FAILED {exc}")
            rates[key] = Rate(0, 0.0, 1, note=str(exc)[:300])
            continue
        rates[key] = rate
        _, server_us = rate.cpu_us_per_msg()
        err = f", {rate.errors:,} ERRORS ({rate.note})" if rate.errors else ""
        cpu = "" if server_us is None else f", server CPU {server_us:.2f} us/msg"
        log(f"  {label}: {rate.messages:,} msgs in {rate.seconds:.2f} s = {rate.per_second:,.0f} msgs/s{err}{cpu}")
    return rates


# -- the summary --------------------------------------------------------------------------


def _median_cpu(rounds: Sequence[dict[str, dict[str, Rate]]], side: str, key: str) -> float | None:
    each = [r[side][key].cpu_us_per_msg()[1] for r in rounds if key in r.get(side, {})]
    values = [x for x in each if x is not None]
    return statistics.median(values) if values else None


def summarize(rounds: Sequence[dict[str, dict[str, Rate]]], keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per workload: each server's median run, the rounds' ratios of ttlbroker over
    each nats-server (median and all) and each server's median CPU us per message."""
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        entry: dict[str, Any] = {"results": {}, "ratios": {}, "server_cpu_us_per_msg": {}}
        for side in SIDES:
            runs = [r[side][key] for r in rounds if key in r.get(side, {})]
            if runs:
                entry["results"][side] = median_run(runs).as_dict()
            cpu = _median_cpu(rounds, side, key)
            entry["server_cpu_us_per_msg"][side] = None if cpu is None else round(cpu, 3)
        for theirs in ("nats_default", "nats_always"):
            each = round_ratios(rounds, key, "ttlbroker", theirs)
            entry["ratios"][theirs] = {"median": round(statistics.median(each), 4) if each else None,
                                       "rounds": [round(x, 4) for x in each]}
        out[key] = entry
    return out


def table(summary: dict[str, dict[str, Any]]) -> str:
    def rate(entry: dict[str, Any], side: str) -> str:
        r = entry["results"].get(side)
        return "" if not r or not r["messages"] else f"{r['msgs_per_s']:,.0f}"

    def ratio(entry: dict[str, Any], theirs: str) -> str:
        rt = entry["ratios"][theirs]
        if rt["median"] is None:
            return ""
        each = rt["rounds"]
        spread = f" ({min(each):.2f}-{max(each):.2f})" if len(each) > 1 else ""
        return f"{rt['median']:.2f}x{spread}"

    def cpu(entry: dict[str, Any]) -> str:
        c = entry["server_cpu_us_per_msg"]
        return " / ".join("-" if c[s] is None else f"{c[s]:.2f}" for s in SIDES)

    rows = [[WORKLOADS[key][1], rate(e, "nats_default"), rate(e, "nats_always"), rate(e, "ttlbroker"),
             ratio(e, "nats_default"), ratio(e, "nats_always"), cpu(e)] for key, e in summary.items()]
    return format_table(
        ["workload (C client)", "nats-server default msgs/s", "nats-server always msgs/s", "ttlbroker always msgs/s",
         "ratio / nats default (range)", "ratio / nats always (range)",
         "server CPU us/msg: nats default / nats always / ttlbroker"],
        rows, right=(1, 2, 3, 4, 5, 6))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--core-messages", type=int, default=1_000_000, help="core publishes")
    p.add_argument("--requests", type=int, default=10_000, help="sequential requests")
    p.add_argument("--js-messages", type=int, default=50_000, help="JetStream async publishes (and fetched messages)")
    p.add_argument("--keys", type=int, default=5_000, help="KV puts and gets")
    p.add_argument("--size", type=int, default=128, help="payload bytes")
    p.add_argument("--in-flight", type=int, default=4_000, help="js_PublishAsync's max pending")
    p.add_argument("--batch", type=int, default=1_000, help="the pull consumer's fetch batch (and max ack pending)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each on three fresh servers (order reversed each round)")
    p.add_argument("--quick", action="store_true", help="20,000 core publishes, 500 requests, 2,000 JetStream "
                   "messages, 300 keys; one round unless --rounds is given")
    p.add_argument("--only", help="comma-separated workloads to run (and the ones they consume from); default all: "
                   + ", ".join(WORKLOADS))
    p.add_argument("--max-seconds", type=float, default=10.0, help="request/reply, JetStream publish and KV put stop "
                   "after this long, the rate over what they did (what the pull and KV get then read); 0: no limit")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one workload may take before it is killed")
    p.add_argument("--json", default=str(RESULTS_DIR / "nats_c.json"), help="write the results here as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.core_messages, args.requests, args.js_messages, args.keys = 20_000, 500, 2_000, 300
        if "--rounds" not in (argv if argv is not None else sys.argv[1:]):
            args.rounds = 1
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    for name in ("core_messages", "requests", "js_messages", "keys", "in_flight", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    only = set(WORKLOADS) if not args.only else {k.strip() for k in args.only.split(",")}
    if only - set(WORKLOADS):
        p.error(f"--only: unknown workload(s) {', '.join(sorted(only - set(WORKLOADS)))}")
    for consumer, producer in CONSUMES_FROM.items():
        if consumer in only:
            only.add(producer)
    args.only = only
    try:
        exe = build()
    except BuildError as exc:
        print(f"nats_c.py: {exc}", file=sys.stderr)
        return 2
    env = environment()
    env["libnats"] = libnats_version(exe)
    log_environment(env)
    cpu = CpuWatch()
    rounds: list[dict[str, dict[str, Rate]]] = []
    loads: list[list[float]] = []
    with Harness("nats_c") as h:
        for r in range(args.rounds):
            order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
            log(f"round {r + 1} of {args.rounds}: {', '.join(SIDE_LABELS[s] for s in order)}")
            rnd: dict[str, dict[str, Rate]] = {}
            for side in order:
                if side == "ttlbroker":
                    with h.ttlbroker(fsync="always", nats=True) as srv:
                        assert srv.nats_url is not None
                        log(f"{SIDE_LABELS[side]}, NATS listener {srv.nats_url}")
                        rnd[side] = run_server(exe, srv.nats_url, srv.proc.pid, args)
                else:
                    with h.nats(sync_interval="always" if side == "nats_always" else None) as srv:
                        log(SIDE_LABELS[side])
                        rnd[side] = run_server(exe, srv.url, srv.proc.pid, args)
            rounds.append(rnd)
            loads.append(list(os.getloadavg()))
    env["cpu_during_run"] = others = cpu.stop()
    keys = [k for k in WORKLOADS if k in args.only]
    summary = summarize(rounds, keys)
    print(f"\nThe C client ({env['libnats']}) against both servers, {args.size}-byte payloads, "
          f"{args.rounds} round(s), load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{args.core_messages:,} core publishes, {args.requests:,} requests, {args.js_messages:,} JetStream "
          f"publishes ({args.in_flight:,} in flight; fetches of {args.batch:,}), {args.keys:,} keys; "
          + (f"request/reply, JetStream publish and KV put stop after {args.max_seconds:g} s\n" if args.max_seconds
             else "no time limit\n"))
    print(table(summary))
    print()
    print_cpu_share(others)
    failed = [f"{SIDE_LABELS[side]}: {WORKLOADS[key][1]}: {rate.note or f'{rate.errors} errors'}"
              for rnd in rounds for side, rates in rnd.items() for key, rate in rates.items() if rate.errors]
    for line in failed:
        print(f"ERROR {line}")
    data: dict[str, Any] = {
        "benchmark": "nats_c",
        "environment": env,
        "args": {**vars(args), "only": sorted(args.only)},
        "counts": {k: v[0] for k, v in counts(args).items()},
        "load_after_each_round": loads,
        "workloads": summary,
        "rounds": [{side: {k: r.as_dict() for k, r in rates.items()} for side, rates in rnd.items()} for rnd in rounds],
    }
    log(f"wrote {write_json(args.json, data)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
