"""Every benchmark at a size that fits in about 20 minutes, and one summary table.

Runs each benchmark of ``bench/`` as a subprocess (each with nats-server side by
side where it has a nats side, each recording the machine's load), keeps their
JSON records in ``bench/results/all-<date>/``, then reads the rows of the targets
(``bench/README.md``, "Targets": the speed targets, then the NATS listener's
workloads, from ``nats_compat.py``, then the C client's, from ``nats_c.py``, then
the floor under the awaited publish, from ``roundtrip_floor.py``) out of them and
writes one table, every row against its target (a retired row shown without one), to
``bench/results/all-<date>.md`` (and ``.json``)::

    .venv/bin/python bench/all.py                        # about 20 minutes
    .venv/bin/python bench/all.py --only kv,republish    # some benchmarks only
    .venv/bin/python bench/all.py --from bench/results/all-2026-11-23   # table only

A benchmark that fails or runs past its time limit leaves its rows ``n/a`` (with
the reason under the table); the others still run. Progress goes to stderr, the
table to stdout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import environment, format_table, log, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Bench:
    """One benchmark run: its name, the arguments that size it, a time limit, and
    its script (by default ``<name>.py``)."""

    name: str
    args: tuple[str, ...]
    limit_s: float
    script: str = ""


#: Sizes chosen so the whole run fits in about 20 minutes on 2 cores.
BENCHES = (
    Bench("publish_fetch", ("--policies", "always,200ms", "--serial", "5000", "--messages", "100000",
                            "--batched", "1000000", "--no-fetch", "--max-seconds", "20"), 240),
    # Admission cost (ttlbroker against itself: TTL field, header, neither), then the
    # expiry lag with 1M TTLs pending and publishing going on, nats beside it.
    Bench("ttl", ("--quick", "--messages", "200000", "--only", "ttlbroker"), 180),
    Bench("ttl_lag", ("--lag-only", "--pending", "1000000", "--messages", "300000"), 420, "ttl.py"),
    Bench("kv", ("--keys", "20000", "--ops", "20000", "--serial", "2000", "--no-always",
                 "--max-seconds", "15"), 180),
    Bench("republish", ("--durability", "relaxed", "--cases", "plain,rp_none", "--messages", "200000",
                        "--nats-messages", "50000", "--repeat", "1", "--max-seconds", "10"), 120),
    Bench("export", ("--messages", "1000000", "--no-spark", "--latency-seconds", "5"), 240),
    Bench("startup", ("--messages", "1000000", "--topics", "200", "--scrapes", "5", "--runs", "2"), 180),
    Bench("consume", ("--messages", "200000", "--seconds", "5"), 120),
    # Dead letters (issue 30): consume and ack with a dead-letter subject configured
    # and unused against none, alternating rounds; last failed delivery -> stored.
    Bench("dead_letters", ("--messages", "100000", "--rounds", "7", "--samples", "300"), 180),
    # The NATS listener's target: nats-py against nats-server and against ttlbroker's NATS
    # listener; phases of a second or more each (a 3,000-key KV get phase lasted under half
    # a second: noise).
    Bench("nats_compat", ("--messages", "20000", "--serial", "5000", "--keys", "10000"), 600),
    # A ttlbroker copying from a ttlbroker and from a nats-server, every server at always.
    Bench("replication", ("--messages", "30000", "--seconds", "10"), 300),
    # The C client (libnats) against nats-server (default and always) and ttlbroker
    # (issue 29): 3 rounds; the 1M core publishes on ttlbroker take most of it.
    Bench("nats_c", ("--rounds", "3", "--max-seconds", "5"), 600),
    # The floor under the awaited publish (issue 29): an empty trio round trip and an
    # awaited ttlbroker publish in the same run.
    Bench("roundtrip_floor", ("--round-trips", "10000"), 180),
)


def dig(record: dict[str, Any] | None, *path: Any) -> Any:
    """``record[path[0]][path[1]]...``, or None where something is missing."""
    cur: Any = record
    for key in path:
        if isinstance(cur, dict):
            cur = cur.get(key)
        elif isinstance(cur, list) and isinstance(key, int) and -len(cur) <= key < len(cur):
            cur = cur[key]
        else:
            return None
    return cur


def _div(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return a / b
    return None


@dataclass
class Row:
    """One line of the summary: what ttlbroker did, what nats did, against a target."""

    path: str
    target: str
    value: str
    met: bool | None
    detail: str = ""
    #: Measured and shown, but held to no target any more (its verdict is another row's).
    retired: bool = False


Results = dict[str, dict[str, Any]]


def _rate_row(path: str, ours: Any, theirs: Any, want: float, detail: str = "") -> Row:
    ratio = _div(ours, theirs)
    value = "n/a" if ratio is None else f"{ratio:.2f}× ({ours:,.0f} vs {theirs:,.0f} msgs/s)"
    return Row(path, f"≥ {want:g}×", value, None if ratio is None else ratio >= want, detail)


def _publish_rows(r: Results) -> list[Row]:
    pf = dig(r, "publish_fetch", "results")
    rate = lambda label, phase: dig(pf, label, phase, "msgs_per_s")  # noqa: E731
    batched = rate("ttlbroker always", "batched")
    # The two awaited rows keep their 2x figure for reading, but their target is the
    # floor row's (``_floor_rows``): one round trip each, bounded by the machine.
    serial = [
        _rate_row("publish awaited one by one, `always` vs nats `sync always`",
                  rate("ttlbroker always", "serial"), rate("nats always", "serial"), 2),
        _rate_row("publish awaited one by one, `200ms` vs nats default",
                  rate("ttlbroker 200ms", "serial"), rate("nats default", "serial"), 2),
    ]
    for row in serial:
        row.target = f"(was {row.target}; see the floor row)"
        row.met, row.retired = None, True
    return [
        *serial,
        _rate_row("publish pipelined, 1,000 concurrent `publish()`, `always` vs nats default",
                  rate("ttlbroker always", "pipelined"), rate("nats default", "pipelined"), 1.5),
        Row("publish_batch at `always`", "≥ 500,000 msgs/s",
            "n/a" if batched is None else f"{batched:,.0f} msgs/s",
            None if batched is None else batched >= 500_000),
    ]


def _ttl_rows(r: Results) -> list[Row]:
    t = dig(r, "ttl", "results", "ttlbroker")
    plain = dig(t, "publish_plain", "msgs_per_s")
    rows = []
    for phase, label, want in (("publish_ttl", "TTL field", 0.8), ("publish_ttl_header", "`Nats-TTL` header", 0.7)):
        ratio = _div(dig(t, phase, "msgs_per_s"), plain)
        rows.append(Row(f"publish with the {label} / without", f"≥ {want:g}",
                        "n/a" if ratio is None else f"{ratio:.2f}", None if ratio is None else ratio >= want))
    return rows


def _lag_rows(r: Results) -> list[Row]:
    lag = dig(r, "ttl_lag", "results")
    p99, mx = dig(lag, "ttlbroker", "lag", "p99_ms"), dig(lag, "ttlbroker", "lag", "max_ms")
    n99, nmx = dig(lag, "nats", "lag", "p99_ms"), dig(lag, "nats", "lag", "max_ms")
    settings = dig(r, "ttl_lag", "settings") or {}
    label = (f"expiry lag p99 / max, {settings.get('messages', 0):,} TTLs expiring with "
             f"{settings.get('pending', 0):,} more pending, publishing going on")
    if p99 is None or mx is None:
        return [Row(label, "≤ 50 / 100 ms", "n/a", None)]
    theirs = "" if n99 is None else f" (nats {n99:.0f} / {nmx:.0f} ms)"
    stats = dig(lag, "ttlbroker", "server_stats") or {}
    detail = ""
    if "loop_stall_max_ms" in stats:
        detail = (f"longest event-loop stall {stats['loop_stall_max_ms']:.0f} ms, GC pauses "
                  f"{stats.get('gc_pause_total_ms', 0):.0f} ms in all (longest {stats.get('gc_pause_max_ms', 0):.0f} ms)")
    return [Row(label, "≤ 50 / 100 ms", f"{p99:.0f} / {mx:.0f} ms{theirs}", p99 <= 50 and mx <= 100, detail)]


def _kv_rows(r: Results) -> list[Row]:
    kv = dig(r, "kv", "results")
    rate = lambda label, op: dig(kv, label, "rates", op, "msgs_per_s")  # noqa: E731
    return [
        _rate_row("KV put (new keys, pipelined), sync 2 m",
                  rate("ttlbroker 2m", "put_new"), rate("nats 2m", "put_new"), 2),
        _rate_row("KV get (random keys, pipelined), sync 2 m",
                  rate("ttlbroker 2m", "get_random"), rate("nats 2m", "get_random"), 2),
    ]


def _republish_rows(r: Results) -> list[Row]:
    rp = dig(r, "republish", "results", "relaxed")
    ours, theirs = dig(rp, "ttlbroker", "rp_none", "msgs_per_s"), dig(rp, "nats", "rp_none", "msgs_per_s")
    plain = dig(rp, "ttlbroker", "plain", "msgs_per_s")
    detail = ""
    if ours and plain:
        detail = f"{(1 / ours - 1 / plain) * 1e6:.1f} µs per copy (rate with rule vs plain)"
    return [_rate_row("republish, relaxed durability, no listener", ours, theirs, 3, detail)]


def _export_rows(r: Results) -> list[Row]:
    ex = dig(r, "export", "results")
    mbs = dig(ex, "export", -1, "mb_per_s")
    idle, busy = dig(ex, "latency", "quiet", "p99_ms"), dig(ex, "latency", "export", "p99_ms")
    ratio = _div(busy, idle)
    return [
        Row("segment → Parquet export", "≥ 100 MB/s", "n/a" if mbs is None else f"{mbs:.0f} MB/s",
            None if mbs is None else mbs >= 100),
        Row("publish p99 while exporting / idle", "≤ 2×",
            "n/a" if ratio is None else f"{ratio:.1f}× ({busy:.2f} vs {idle:.2f} ms)",
            None if ratio is None else ratio <= 2),
    ]


def _startup_rows(r: Results) -> list[Row]:
    stored = dig(r, "startup", "results", "stored")
    runs = [x.get("healthy_s") for x in (dig(stored, "runs") or []) if isinstance(x, dict)]
    runs = [x for x in runs if isinstance(x, (int, float))]
    messages = dig(stored, "messages")
    per_m = _div(min(runs), messages / 1e6) if runs and messages else None
    ttl = dig(stored, "ttl")
    label = "restart to healthy, per million stored messages" + (f" (TTL {ttl} s on each)" if ttl else "")
    return [Row(label, "≤ 1 s", "n/a" if per_m is None else f"{per_m:.2f} s",
                None if per_m is None else per_m <= 1)]


def _consume_rows(r: Results) -> list[Row]:
    c = dig(r, "consume", "results")
    return [_rate_row("consume and ack, batches of 1,000",
                      dig(c, "ttlbroker", "consume", "msgs_per_s"), dig(c, "nats", "consume", "msgs_per_s"), 5)]


def _dead_letter_rows(r: Results) -> list[Row]:
    """Issue 30's two measurements (``dead_letters.py``): ttlbroker against itself."""
    t = dig(r, "dead_letters", "results", "throughput")
    ratio, plain, dlq = dig(t, "ratio"), dig(t, "plain", "msgs_per_s"), dig(t, "dlq", "msgs_per_s")
    each = dig(t, "round_ratios") or []
    value = "n/a" if ratio is None else (f"{ratio:.3f} (medians {dlq:,.0f} vs {plain:,.0f} msgs/s; rounds "
                                         f"{min(each):.3f}–{max(each):.3f})" if each else f"{ratio:.3f}")
    lat = dig(r, "dead_letters", "results", "latency")
    p99, mx = dig(lat, "all", "p99_ms"), dig(lat, "all", "max_ms")
    detail = ""
    if p99 is not None:
        detail = "p99 per way: " + ", ".join(f"{w} {dig(lat, w, 'p99_ms')} ms" for w in ("nak", "term", "ack_wait"))
    return [
        Row("consume and ack with a dead-letter subject configured but unused, over without one", "≥ 0.95",
            value, None if ratio is None else ratio >= 0.95),
        Row("last failed delivery (NAK, TERM, ack wait) → dead letter stored, p99", "< 50 ms",
            "n/a" if p99 is None else f"{p99:.1f} ms (max {mx:.1f} ms)", None if p99 is None else p99 < 50, detail),
    ]


def _replication_rows(r: Results) -> list[Row]:
    """The copy keeps up with each origin (the live copy's rate over the origin's,
    every server at ``always``), and the lag p99 at a steady 5,000 msgs/s from a
    ttlbroker origin (a nats-server at ``sync_interval: always`` does not take that
    rate from one client: its row shows the rate it took)."""
    rep = dig(r, "replication", "results") or {}
    sync = dig(r, "replication", "args", "sync") or "?"
    rows = []
    for origin in ("ttlbroker", "nats-server"):
        ours, theirs = dig(rep, origin, "live_copy", "msgs_per_s"), dig(rep, origin, "live_origin", "msgs_per_s")
        ratio = _div(ours, theirs)
        value = "n/a" if ratio is None else f"{ratio:.2f} ({ours:,.0f} of {theirs:,.0f} msgs/s)"
        rows.append(Row(f"replication from a {origin}, sync {sync}: the live copy / what the origin accepts",
                        "≥ 0.95", value, None if ratio is None else ratio >= 0.95))
    st = dig(rep, "ttlbroker", "steady") or {}
    p99, ref = st.get("lag_p99_ms"), dig(rep, "ttlbroker", "reference", "lag_p99_ms")
    detail = "" if ref is None else f"the origin's own push consumer: p99 {ref:.1f} ms"
    nats_st = dig(rep, "nats-server", "steady") or {}
    if nats_st:
        detail += (f"; from a nats-server taking {nats_st.get('rate_sent', 0):,.0f} msgs/s: p99 "
                   f"{nats_st.get('lag_p99_ms', 0):.1f} ms (its own consumer "
                   f"{dig(rep, 'nats-server', 'reference', 'lag_p99_ms') or 0:.1f})")
    rows.append(Row(f"replication lag p99 at {st.get('rate_asked', 5000):,} msgs/s from a ttlbroker, sync {sync}",
                    "≤ 100 ms", "n/a" if p99 is None else f"{p99:.1f} ms", None if p99 is None else p99 <= 100, detail))
    return rows


#: nats_compat's workloads, each a row of the NATS listener's target (at least as fast
#: as nats-server, both driven by nats-py at equal durability).
NATS_WORKLOADS = (
    ("publish", "awaited publish"),
    ("publish_async", "publish_async, 1,000 in flight"),
    ("consume", "pull consume with acks"),
    ("kv_put", "KV put"),
    ("kv_get", "KV get"),
)


def _rounds_row(path: str, med: Any, each: list[float], ours: Any, theirs: Any, want: float) -> Row:
    """A row whose verdict is the median of several rounds' ratios (each round runs
    both servers back to back), shown with each server's median rate and the
    ratios' range; with fewer than two rounds, a plain ratio row."""
    if med is None or len(each) < 2 or not isinstance(ours, (int, float)) or not isinstance(theirs, (int, float)):
        return _rate_row(path, ours, theirs, want)
    value = (f"{med:.2f}× median of {len(each)} rounds ({min(each):.2f}–{max(each):.2f}; "
             f"medians {ours:,.0f} vs {theirs:,.0f} msgs/s)")
    return Row(path, f"≥ {want:g}×", value, med >= want)


def _nats_compat_rows(r: Results) -> list[Row]:
    """One row a workload, the median of the rounds' ratios."""
    nc = dig(r, "nats_compat", "results")
    sync = dig(r, "nats_compat", "args", "sync") or "?"
    rate = lambda server, key: dig(nc, server, key, "msgs_per_s")  # noqa: E731
    rows = []
    for key, label in NATS_WORKLOADS:
        ratios = dig(r, "nats_compat", "ratios", key) or {}
        rows.append(_rounds_row(f"NATS listener: nats-py {label}, sync {sync}", ratios.get("median"),
                                ratios.get("rounds") or [], rate("ttlbroker", key), rate("nats", key), 1))
    return rows


def _floor_rows(r: Results) -> list[Row]:
    """The target of the awaited publish (issue 29): an awaited ttlbroker publish
    (``--fsync 200ms``) at most 1.3x the wall time of an empty trio round trip made
    with the broker's socket calls and the leanest client, in the same run
    (``roundtrip_floor.py``)."""
    res = dig(r, "roundtrip_floor", "results") or {}
    per = lambda label: _div(dig(res, label, "seconds"), dig(res, label, "messages"))  # noqa: E731
    ours, floor = per("ttlbroker publish, fsync 200ms"), per("trio echo (the broker's socket calls)")
    ratio = _div(ours, floor)
    nats = per("nats-server publish, default sync")
    value = "n/a" if ratio is None or ours is None or floor is None else (
        f"{ratio:.2f}× ({ours * 1e6:.1f} vs {floor * 1e6:.1f} µs a round trip)")
    detail = "" if nats is None else f"nats-server's awaited publish with nats-py in the same run: {nats * 1e6:.1f} µs"
    return [Row("publish awaited one by one, `200ms`: wall time per publish / an empty trio round trip", "≤ 1.3×",
                value, None if ratio is None else ratio <= 1.3, detail)]


#: nats_c's rows (issue 29): workload, label, which nats-server the ratio is over, target.
NATS_C_ROWS = (
    ("js_pub", "JetStream async publish, 4,000 in flight, `always` vs nats-server's default sync", "nats_default", 1),
    ("req", "request/reply, sequential, vs nats-server `sync_interval: always`", "nats_always", 1),
    ("kv_put", "KV put, sequential, `always` vs nats-server `sync_interval: always`", "nats_always", 1),
    ("kv_get", "KV get, sequential, vs nats-server `sync_interval: always`", "nats_always", 1),
    ("js_fetch", "JetStream pull, fetch 1,000 + ack, `always` vs nats-server `sync_interval: always`", "nats_always", 1),
)


def _nats_c_rows(r: Results) -> list[Row]:
    """The C client's workloads (``nats_c.py``): core publish at least half
    nats-server's rate or at most 1.2 µs of server CPU a message; the others at least
    nats-server's rate, each the median of the rounds' ratios."""
    w = dig(r, "nats_c", "workloads") or {}
    rate = lambda key, side: dig(w, key, "results", side, "msgs_per_s")  # noqa: E731
    n, size = dig(r, "nats_c", "counts", "pub"), dig(r, "nats_c", "args", "size")
    path = f"C client: core publish, {n or 0:,} × {size or 0} B, one subscriber, vs nats-server"
    ratios = dig(w, "pub", "ratios", "nats_default") or {}
    cpu = dig(w, "pub", "server_cpu_us_per_msg") or {}
    row = _rounds_row(path, ratios.get("median"), ratios.get("rounds") or [], rate("pub", "ttlbroker"),
                      rate("pub", "nats_default"), 0.5)
    row.target = "≥ 0.5× or server CPU ≤ 1.2 µs/msg"
    ours_cpu, their_cpu = cpu.get("ttlbroker"), cpu.get("nats_default")
    if isinstance(ours_cpu, (int, float)):
        row.value += f"; server CPU {ours_cpu:.2f} vs {their_cpu or 0:.2f} µs/msg"
        row.met = bool(row.met) or ours_cpu <= 1.2
    rows = [row]
    for key, label, theirs, want in NATS_C_ROWS:
        ratios = dig(w, key, "ratios", theirs) or {}
        rows.append(_rounds_row(f"C client: {label}", ratios.get("median"), ratios.get("rounds") or [],
                                rate(key, "ttlbroker"), rate(key, theirs), want))
    return rows


#: Which rows come from which benchmark, in the order of the table of targets in
#: ``bench/README.md`` (the speed targets, then the NATS listener's).
ROWS: tuple[tuple[str, Callable[[Results], list[Row]]], ...] = (
    ("publish_fetch", _publish_rows),
    ("ttl", _ttl_rows),
    ("ttl_lag", _lag_rows),
    ("kv", _kv_rows),
    ("republish", _republish_rows),
    ("export", _export_rows),
    ("startup", _startup_rows),
    ("consume", _consume_rows),
    ("dead_letters", _dead_letter_rows),
    ("replication", _replication_rows),
    ("nats_compat", _nats_compat_rows),
    ("nats_c", _nats_c_rows),
    ("roundtrip_floor", _floor_rows),
)


@dataclass
class Outcome:
    name: str
    seconds: float = 0.0
    error: str = ""
    load: list[float] = field(default_factory=list)


def run_one(bench: Bench, out_dir: Path) -> Outcome:
    """Run one benchmark, its JSON into ``out_dir``; stderr passes through."""
    out = out_dir / f"{bench.name}.json"
    argv = [sys.executable, str(HERE / (bench.script or f"{bench.name}.py")), *bench.args, "--json", str(out)]
    log(f"all: {bench.name}: {' '.join(argv[1:])} (limit {bench.limit_s:.0f} s)")
    started = time.monotonic()
    outcome = Outcome(bench.name)
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=bench.limit_s, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        outcome.error = f"stopped after its limit of {bench.limit_s:.0f} s"
    else:
        if proc.returncode != 0:
            outcome.error = f"exit status {proc.returncode}"
        (out_dir / f"{bench.name}.txt").write_text(proc.stdout)
    outcome.seconds = time.monotonic() - started
    outcome.load = list(os.getloadavg())
    log(f"all: {bench.name}: {outcome.seconds:.0f} s{' — ' + outcome.error if outcome.error else ''}")
    return outcome


def load_results(out_dir: Path, names: list[str]) -> Results:
    results: Results = {}
    for name in names:
        path = out_dir / f"{name}.json"
        if path.exists():
            results[name] = json.loads(path.read_text())
    return results


def summarize(results: Results, names: list[str]) -> list[Row]:
    return [row for name, rows in ROWS if name in names for row in rows(results)]


def render(rows: list[Row], outcomes: list[Outcome], results: Results, started: str) -> str:
    mark = {True: "met", False: "**not met**", None: "n/a"}
    table = format_table(
        ("path", "ttlbroker (vs nats)", "target", "status"),
        [(r.path, r.value, r.target, "retired" if r.retired else mark[r.met]) for r in rows],
    )
    lines = [f"# All benchmarks, {started}", "", table, ""]
    met = sum(1 for r in rows if r.met)
    held = sum(1 for r in rows if not r.retired)
    lines.append(f"{met} of {held} rows meet their target" + (f" ({len(rows) - held} retired, shown only)." if held < len(rows) else "."))
    details = [f"- {r.path}: {r.detail}" for r in rows if r.detail]
    if details:
        lines += ["", *details]
    lines += ["", "| benchmark | seconds | load average after | other CPU share | result |", "| --- | --- | --- | --- | --- |"]
    for o in outcomes:
        share = dig(results, o.name, "environment", "cpu_during_run", "other_share_of_machine")
        load = " / ".join(f"{x:.2f}" for x in o.load) if o.load else ""
        lines.append(f"| {o.name} | {o.seconds:.0f} | {load} | {'' if share is None else f'{share:.0%}'} | "
                     f"{o.error or 'ok'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    names = [b.name for b in BENCHES]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"comma-separated benchmarks to run, of: {', '.join(names)}")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks not to run")
    parser.add_argument("--from", dest="from_dir", metavar="DIR",
                        help="make the table from the JSON records in DIR, running nothing")
    parser.add_argument("--out", metavar="DIR", help="where the records and the table go (default bench/results)")
    args = parser.parse_args()

    chosen = names if not args.only else args.only.split(",")
    unknown = (set(chosen) | set(filter(None, args.skip.split(",")))) - set(names)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}; choose from {', '.join(names)}")
    chosen = [n for n in chosen if n not in args.skip.split(",")]

    started = dt.date.today().isoformat()
    results_dir = Path(args.out) if args.out else HERE / "results"
    outcomes: list[Outcome] = []
    if args.from_dir:
        out_dir = Path(args.from_dir)
    else:
        out_dir = results_dir / f"all-{started}"
        out_dir.mkdir(parents=True, exist_ok=True)
        for i, bench in enumerate(b for b in BENCHES if b.name in chosen):
            log(f"all: [{i + 1}/{len(chosen)}]")
            outcomes.append(run_one(bench, out_dir))
    results = load_results(out_dir, chosen)
    rows = summarize(results, chosen)
    text = render(rows, outcomes, results, started)
    print(text)
    if not args.from_dir:
        (results_dir / f"all-{started}.md").write_text(text)
        write_json(results_dir / f"all-{started}.json", {
            "benchmark": "all",
            "command": "python " + " ".join(sys.argv),
            "environment": environment(),
            "runs": [o.__dict__ for o in outcomes],
            "rows": [r.__dict__ for r in rows],
        })
    return 0 if all(not o.error for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
