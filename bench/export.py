"""The Parquet export and the Spark ``compact`` job: throughput, and what an export
costs publishers.

ttlbroker only (nats-server has no export to compare with). Every broker runs as a
subprocess on loopback with ``--export-dir`` and ``[export] interval = 3600``, so
that only the exports the benchmark asks for (``client.export(seal=True)``) run.
Each broker, and each export folder, is fresh.

**1. Segment-to-Parquet throughput**, for each N of ``--messages`` (default
1,000,000 and 5,000,000): a topic with ``--partitions`` partitions (default 4) and
the default 64 MiB segments is filled with N messages of 128 bytes (JSON-like,
unique, compressible about like real events) by ``publish_batch`` of 1,000, 4 in
flight, from one connection. Message ``i``:

* ``i % 10 == 0`` (10 %): on one of 1,000 subjects ``exp.gone.<j>``, all purged
  after the fill (``purge(stream, topic, "exp.gone.>")``), so they reach the export
  flagged ``removed`` (reason ``purge``);
* ``i % 10 == 5`` (10 %): a ``Nats-TTL: 1h`` header (and a ``source`` header) on
  one of ``--subjects`` subjects ``exp.k.<k>``; nothing expires during the run;
* the rest (80 %): no header, on ``exp.k.<k>`` as well.

Then one ``await client.export(seal=True)`` (active segments sealed first, so all
N messages are exported) is timed from the client: msgs/s = rows / wall seconds, and
MB/s = input bytes (the segment ``.log`` files: the topic's ``size``) / wall
seconds. The CPU time of the broker and of its export worker process (``python -m
spark_export.worker``) during the export, MB per CPU second of both (the export's
cost, whatever else the machine runs), the Parquet bytes written, and the
per-segment seconds the broker reports are shown too. The export is checked
with pyarrow: N rows, the purged ones flagged removed.

**2. Spark compact on local[*]**, on that export, with a cutoff far in the future
(2100-01-01), so that it keeps, per subject, the newest message that is not
removed and has no TTL (the TTL ones have expired by then):

* ``python -m spark_export compact --input EXPORT --output OUT --cutoff ...`` as a
  subprocess, timed wall-clock (Python and JVM start included). Its stderr lines
  are timestamped as they arrive: "start" is until the session is up (its
  ``spark: ...`` line), "job" from there to the job's last line.
* the same job in this process: ``spark_session("local[*]")`` once (its start is
  timed on its own), then ``jobs.compact(...)`` for each N. The JVM is warm from
  the second job on.

The rows written are compared with what the fill predicts (the subjects that got
at least one message without TTL).

**3. Publish latency with and without an export running**: a fresh broker with a
backlog of ``--latency-backlog`` messages (default 1,000,000, the same fill as
above, not yet exported) and a second topic ``latency`` (1 partition). One
connection publishes single 128-byte messages, each awaited before the next, at a
steady ``--latency-rate`` (default 1,000/s; a send that is late goes at once):
(a) for ``--latency-seconds`` (default 10) with nothing else running; (b) again,
while another connection runs ``export(seal=True)`` of the backlog, started one
second in; the run goes on until the export has finished (and at least
``--latency-seconds``). Latency is send-to-ack; (b) counts only the publishes sent
while the export ran. "Most behind schedule" is how late the latest send went: with
one publish in flight, a client that cannot keep the rate falls further behind.

``--fsync`` (default ``never``) applies to every broker: the fill and latency runs
do not wait for the disk, and no periodic sync lands in one run but not the other.
Progress goes to stderr, the tables to stdout; ``--json PATH`` also writes a JSON
record. Needs the ``spark`` extra (pyarrow, pyspark) and Java 17+. Run from the
repository root::

    .venv/bin/python bench/export.py             # 1M and 5M messages: 3-5 minutes on 2 cores
    .venv/bin/python bench/export.py --quick     # 100k messages, a smoke test: < 90 s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    print_cpu_share,
    REPO,
    CpuWatch,
    Harness,
    Progress,
    Server,
    environment,
    format_table,
    log,
    run_uvloop,
    write_json,
    log_environment,
)

STREAM = "bench"
TOPIC = "events"
LAT_TOPIC = "latency"
LAT_SUBJECT = "lat.x"
PAYLOAD_BYTES = 128
BATCH = 1000  # messages per publish_batch
BATCHES_IN_FLIGHT = 4
GONE_SUBJECTS = 1000  # exp.gone.<j>: purged after the fill
TTL_HEADERS = {"Nats-TTL": "1h", "source": "bench"}
CUTOFF = "2100-01-01T00:00:00Z"  # compact: every TTL has run out by then, nothing else
EXPORT_LEAD = 1.0  # seconds of latency run before the export starts
LAT_PAYLOAD = random.Random(1).randbytes(PAYLOAD_BYTES)

_HEX = random.Random(0).randbytes(4096).hex()


def payload(i: int) -> bytes:
    """128 bytes of JSON-like text, unique per message."""
    head = f'{{"id":{i},"user":"u{(i * 2654435761) % 1000003}","amount":{(i * 7919) % 100000},"note":"'
    n = PAYLOAD_BYTES - len(head) - 2
    s = (i * 131) % (len(_HEX) - n)
    return (head + _HEX[s : s + n] + '"}').encode()


def message(i: int, subjects: int, kept: bytearray) -> tuple[Any, ...]:
    """Message ``i`` of a fill (see the module docstring); marks in ``kept`` the
    subjects compact must keep."""
    kind = i % 10
    if kind == 0:
        return (f"exp.gone.{i % GONE_SUBJECTS}", payload(i))
    k = (i * 40503) % subjects
    if kind == 5:
        return (f"exp.k.{k}", payload(i), TTL_HEADERS)
    kept[k] = 1
    return (f"exp.k.{k}", payload(i))


def ensure_spark_export() -> None:
    """The broker (for its export) and the Spark jobs import ``spark_export``. An
    editable install made before the package existed does not map it: then take it
    from this checkout, here and in every child process (PYTHONPATH)."""
    try:
        import spark_export
    except ImportError:
        sys.path.insert(0, str(REPO))
        import spark_export  # noqa: F401

        log(f"note: spark_export is not installed in this environment (re-run `pip install -e .`); using {REPO} "
            "through PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


def broker_config(segment_size: str, worker_priority: str) -> str:
    return (f'[export]\ninterval = 3600\nworker_priority = "{worker_priority}"\n\n'
            f'[system.segment]\nsize_bytes = "{segment_size}"\n')


# -- results --------------------------------------------------------------------------------


@dataclass
class ExportRun:
    """One N: the fill, the export, and the Spark jobs over it."""

    messages: int
    fill_seconds: float = 0.0
    fill_errors: int = 0
    purged: int = 0
    expected_compact_rows: int = 0
    segment_bytes: int = 0  # the topic's .log bytes (what the export reads)
    export_seconds: float = 0.0
    export_broker_cpu: float = 0.0
    export_worker_cpu: float = 0.0
    rss_before: int = 0  # the broker's RSS when the export started
    rss_peak: int = 0  # and its peak during the export
    segments: int = 0
    rows: int = 0
    parquet_bytes: int = 0
    segment_seconds: list[float] = field(default_factory=list)
    segment_rows: list[int] = field(default_factory=list)
    check: dict[str, Any] = field(default_factory=dict)
    cli: dict[str, Any] = field(default_factory=dict)
    inproc: dict[str, Any] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        return self.rows / self.export_seconds if self.export_seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.segment_bytes / 1e6 / self.export_seconds if self.export_seconds else 0.0

    @property
    def mb_per_cpu_s(self) -> float:
        """Segment MB per CPU second of the broker and its export worker: what the
        export costs, whatever else the machine runs."""
        cpu = self.export_broker_cpu + self.export_worker_cpu
        return self.segment_bytes / 1e6 / cpu if cpu else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "msgs_per_s": round(self.msgs_per_s, 1), "mb_per_s": round(self.mb_per_s, 2),
                "mb_per_cpu_s": round(self.mb_per_cpu_s, 2)}


@dataclass
class LatencyRun:
    label: str
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # (due, sent, acked)
    seconds: float = 0.0
    broker_cpu: float = 0.0
    errors: int = 0
    window: tuple[float, float] | None = None  # the export's [start, end], perf_counter
    export: dict[str, Any] = field(default_factory=dict)
    loop: dict[str, Any] = field(default_factory=dict)  # the broker's loop stall and GC stats around the run

    def in_window(self) -> list[tuple[float, float, float]]:
        if self.window is None:
            return self.samples
        lo, hi = self.window
        return [s for s in self.samples if lo <= s[1] <= hi]

    def stats(self) -> dict[str, Any]:
        xs = self.in_window()
        span = (self.window[1] - self.window[0]) if self.window else self.seconds
        out = {"samples": len(xs), "seconds": round(span, 2), "rate": round(len(xs) / span, 1) if span else 0.0}
        out.update({f"{k}_ms": v for k, v in percentiles([a - s for _, s, a in xs]).items()})
        out.update({f"due_{k}_ms": v for k, v in percentiles([a - d for d, _, a in xs]).items()})
        lat = [a - s for _, s, a in xs]
        out["over_10ms"] = sum(1 for x in lat if x > 0.010)
        out["over_100ms"] = sum(1 for x in lat if x > 0.100)
        out["late_sends"] = sum(1 for d, s, _ in xs if s - d > 0.001)
        out["behind_max_ms"] = round(max((s - d for d, s, _ in xs), default=0.0) * 1e3, 3)
        return out


def percentiles(xs: list[float]) -> dict[str, float]:
    """Nearest-rank percentiles of seconds, in milliseconds."""
    if not xs:
        return {}
    xs = sorted(xs)
    n = len(xs)

    def pct(p: float) -> float:
        return round(xs[min(n - 1, max(0, math.ceil(p * n) - 1))] * 1e3, 3)

    return {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "p999": pct(0.999),
            "max": round(xs[-1] * 1e3, 3), "mean": round(sum(xs) / n * 1e3, 3)}


# -- the broker side -------------------------------------------------------------------------


async def setup_topic(c: Any, partitions: int) -> None:
    await c.create_stream(STREAM)
    await c.create_topic(STREAM, TOPIC, partitions=partitions, message_expiry=0, subjects=["exp.>"],
                         allow_msg_ttl=True)


async def fill(server: Server, c: Any, n: int, subjects: int, run: ExportRun) -> None:
    """Publish ``n`` messages (``publish_batch``, BATCH each, BATCHES_IN_FLIGHT in
    flight), then purge the ``exp.gone.*`` ones."""
    from broker.client import aio

    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(BATCHES_IN_FLIGHT)
    pending: set[asyncio.Task[Any]] = set()
    kept = bytearray(subjects)
    counts = [0, 0]
    progress = Progress("publish_batch (fill)", n)

    def done(t: asyncio.Task[Any]) -> None:
        pending.discard(t)
        sem.release()
        if t.cancelled() or t.exception() is not None:
            counts[1] += BATCH
            if counts[1] == BATCH:
                log(f"    first error: {t.exception() if not t.cancelled() else 'cancelled'!r}")
            return
        acks = t.result()
        bad = len(acks.errors)
        if bad and not counts[1]:
            log(f"    first refused message: {next(iter(acks.errors.values()))}")
        counts[0] += len(acks) - bad
        counts[1] += bad

    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        await sem.acquire()
        msgs = [message(i, subjects, kept) for i in range(start, min(n, start + BATCH))]
        t = loop.create_task(c.publish_batch(msgs))
        pending.add(t)
        t.add_done_callback(done)
        progress.update(counts[0])
    if pending:
        await asyncio.wait(pending)
    run.fill_seconds = time.perf_counter() - t0
    run.fill_errors = counts[1]
    run.expected_compact_rows = sum(kept)
    log(f"  filled {counts[0]:,} messages in {run.fill_seconds:.1f} s = {counts[0] / run.fill_seconds:,.0f} msgs/s"
        + (f", {counts[1]:,} ERRORS" if counts[1] else ""))
    async with aio.connect(server.address, name="bench-export-admin", timeout=None) as admin:
        t0 = time.perf_counter()
        run.purged = await admin.purge(STREAM, TOPIC, "exp.gone.>")
    log(f"  purged {run.purged:,} messages (exp.gone.>) in {time.perf_counter() - t0:.1f} s")


def _parquet_count(root: str) -> int:
    n = 0
    for _, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        n += sum(1 for f in files if f.endswith(".parquet"))
    return n


@dataclass
class ExportTiming:
    seconds: float
    broker_cpu: float
    rss_before: int  # the broker's RSS, bytes
    rss_peak: int  # the highest RSS seen while the export ran (sampled every 0.2 s)
    worker_cpu: float = 0.0  # the export worker processes' CPU seconds


def children_cpu(pid: int) -> float:
    """User + system CPU seconds of the finished children ``pid`` waited for (the
    broker's export workers): ``cutime`` and ``cstime`` of ``/proc/PID/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # fields[0] is field 3
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


async def run_export(server: Server, c: Any, export_dir: str, label: str) -> tuple[dict[str, Any], ExportTiming]:
    """``export(seal=True)`` on ``c``, with a progress line every few seconds;
    returns the result, and its wall seconds, the broker's CPU seconds and RSS, and
    the export worker's CPU seconds."""
    u0 = server.usage()
    w0 = children_cpu(server.proc.pid)
    peak = u0.rss
    t0 = time.perf_counter()
    next_log = t0 + 3.0
    task = asyncio.ensure_future(c.export(seal=True))
    while True:
        finished, _ = await asyncio.wait({task}, timeout=0.2)
        if finished:
            break
        with contextlib.suppress(OSError):
            peak = max(peak, server.usage().rss)
        if time.perf_counter() >= next_log:
            next_log += 3.0
            log(f"    {label}: {_parquet_count(export_dir)} Parquet file(s) written, {time.perf_counter() - t0:.0f} s")
    result = task.result()
    seconds = time.perf_counter() - t0
    u1 = server.usage()
    return result, ExportTiming(seconds, u1.cpu - u0.cpu, u0.rss, max(peak, u1.rss), children_cpu(server.proc.pid) - w0)


async def fill_and_export(server: Server, n: int, args: argparse.Namespace, export_dir: str) -> ExportRun:
    from broker.client import aio

    run = ExportRun(n)
    async with aio.connect(server.address, name="bench-export", timeout=None) as c:
        await setup_topic(c, args.partitions)
        await fill(server, c, n, args.subjects, run)
        run.segment_bytes = (await c.get_topic(STREAM, TOPIC)).size
        await asyncio.sleep(args.settle)
        log(f"  export(seal=True) of {n:,} messages, {run.segment_bytes / 1e6:,.1f} MB of segments")
        result, timing = await run_export(server, c, export_dir, "export")
    run.export_seconds, run.export_broker_cpu, run.export_worker_cpu = timing.seconds, timing.broker_cpu, timing.worker_cpu
    run.rss_before, run.rss_peak = timing.rss_before, timing.rss_peak
    entries = result["exported"]
    run.segments = len(entries)
    run.rows = sum(e["rows"] for e in entries)
    run.parquet_bytes = sum(e["bytes"] for e in entries)
    run.segment_seconds = [e["seconds"] for e in entries]
    run.segment_rows = [e["rows"] for e in entries]
    log(f"  exported {run.rows:,} rows from {run.segments} segment(s) in {run.export_seconds:.2f} s = "
        f"{run.msgs_per_s:,.0f} msgs/s, {run.mb_per_s:.1f} MB/s of segments; Parquet {run.parquet_bytes / 1e6:.1f} MB; "
        f"broker CPU {run.export_broker_cpu:.1f} s, worker CPU {run.export_worker_cpu:.1f} s, RSS {run.rss_before / 2**20:,.0f} -> {run.rss_peak / 2**20:,.0f} MiB")
    return run


def check_export(root: str) -> dict[str, Any]:
    """Rows, removed rows and rows with a TTL in the export (pyarrow)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    t = ds.dataset(root, format="parquet", partitioning="hive").to_table(columns=["removed", "ttl_seconds"])
    return {"rows": t.num_rows, "removed": int(pc.sum(t["removed"]).as_py() or 0),
            "with_ttl": t.num_rows - t["ttl_seconds"].null_count}


# -- Spark -------------------------------------------------------------------------------------


#: ``python -m spark_export`` that first asks Linux for SIGTERM when this process dies
#: (its JVM exits when its Python parent does). Set in the child itself: a
#: ``preexec_fn`` is unsafe here, since an in-process Spark has threads running.
_CHILD = (
    "import contextlib, ctypes, runpy, signal, sys\n"
    "with contextlib.suppress(Exception):\n"
    "    ctypes.CDLL('libc.so.6').prctl(1, signal.SIGTERM)\n"
    "sys.argv[0] = 'spark_export'\n"
    "runpy.run_module('spark_export', run_name='__main__', alter_sys=True)\n"
)


def spark_cli(job: list[str]) -> dict[str, Any]:
    """``python -m spark_export JOB...`` (see _CHILD) as a subprocess (its own process group, killed
    with it on any way out), its stderr timestamped line by line."""
    argv = [sys.executable, "-c", _CHILD, *job]
    t0 = time.perf_counter()
    marks: dict[str, float] = {}
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            now = time.perf_counter() - t0
            text = line.rstrip()
            if text.startswith("spark: "):
                marks.setdefault("session", now)
            elif text.startswith("reading "):
                marks.setdefault("reading", now)
            elif text.strip().startswith(("compact:", "analyze:")):
                marks["job_line"] = now
            if text:
                log(f"    | {text[:200]}")
        code = proc.wait()
        reader.join(10)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"{' '.join(job[:1])} exited with status {code}")
    result = json.loads(out[0].strip().splitlines()[-1]) if out and out[0].strip() else {}
    session = marks.get("session")
    end = marks.get("job_line")
    return {"wall_s": round(wall, 2), "start_s": round(session, 2) if session else None,
            "job_s": round(end - session, 2) if session and end else None, "result": result}


class InProcessSpark:
    """One SparkSession in this process, started on first use."""

    def __init__(self) -> None:
        self.spark: Any = None
        self.start_s: float | None = None

    def get(self) -> Any:
        if self.spark is None:
            from spark_export._session import spark_session

            t0 = time.perf_counter()
            self.spark = spark_session("local[*]", "bench-export")
            self.start_s = round(time.perf_counter() - t0, 2)
            log(f"  in-process SparkSession started in {self.start_s:.1f} s")
        return self.spark

    def stop(self) -> None:
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.stop()
            self.spark = None


def spark_phase(h: Harness, run: ExportRun, export_dir: str, spark: InProcessSpark, args: argparse.Namespace) -> None:
    import datetime as dt

    from spark_export import jobs

    out = h.tempdir(f"compact-cli-{run.messages}")
    log(f"  spark compact (CLI subprocess, local[*]) over {run.parquet_bytes / 1e6:.1f} MB of Parquet")
    run.cli = spark_cli(["compact", "--input", export_dir, "--output", str(out / "snapshot"), "--cutoff", CUTOFF])
    h.remove_tempdir(out)
    log(f"  compact CLI: {run.cli['wall_s']:.1f} s wall (start {run.cli['start_s']} s, job {run.cli['job_s']} s), "
        f"{run.cli['result'].get('rows', '?'):,} rows")

    out = h.tempdir(f"compact-inproc-{run.messages}")
    session = spark.get()
    cutoff = dt.datetime.fromisoformat(CUTOFF)
    t0 = time.perf_counter()
    result = jobs.compact(session, export_dir, str(out / "snapshot"), cutoff)
    run.inproc = {"job_s": round(time.perf_counter() - t0, 2), "rows": result["rows"],
                  "session_start_s": spark.start_s}
    if args.analyze:
        t0 = time.perf_counter()
        summary = jobs.analyze(session, export_dir, str(out / "analysis"))
        run.inproc["analyze_s"] = round(time.perf_counter() - t0, 2)
        run.inproc["analyze_messages"] = summary["messages"]
    h.remove_tempdir(out)
    log(f"  compact in-process: {run.inproc['job_s']:.1f} s, {result['rows']:,} rows"
        + (f"; analyze {run.inproc['analyze_s']:.1f} s" if args.analyze else ""))


# -- publish latency ------------------------------------------------------------------------------


async def latency_run(server: Server, c: Any, label: str, rate: float, seconds: float,
                      during: Callable[[], Any] | None = None) -> LatencyRun:
    """Publish one message at a time at ``rate`` per second for ``seconds``; with
    ``during`` (a coroutine function), start it EXPORT_LEAD seconds in and go on until
    it has finished too."""
    from broker.client import BrokerError

    out = LatencyRun(label)
    interval = 1.0 / rate
    side: asyncio.Task[Any] | None = None
    started_at = finished_at = 0.0
    progress = Progress(label, None, every=3.0)

    async def side_job() -> Any:
        nonlocal started_at, finished_at
        started_at = time.perf_counter()
        try:
            return await during()  # type: ignore[misc]
        finally:
            finished_at = time.perf_counter()

    s0 = await c.stats()
    u0 = server.usage()
    t0 = time.perf_counter()
    k = 0
    publish = c.publish
    while True:
        due = t0 + k * interval
        now = time.perf_counter()
        if during is not None and side is None and now >= t0 + EXPORT_LEAD:
            side = asyncio.ensure_future(side_job())
        if now >= t0 + seconds and (side is None or side.done()) and (during is None or side is not None):
            break
        if due > now:
            await asyncio.sleep(due - now)
        sent = time.perf_counter()
        try:
            await publish(LAT_SUBJECT, LAT_PAYLOAD)
        except BrokerError as exc:
            out.errors += 1
            if out.errors == 1:
                log(f"    first error: {exc!r}")
        out.samples.append((due, sent, time.perf_counter()))
        k += 1
        if not k & 255:
            progress.update(k)
    out.seconds = time.perf_counter() - t0
    out.broker_cpu = server.usage().cpu - u0.cpu
    s1 = await c.stats()
    out.loop = {"stall_max_ms": s1.get("loop_stall_max_ms"), "stall_max_before_ms": s0.get("loop_stall_max_ms"),
                "gc_collections": s1.get("gc_collections", 0) - s0.get("gc_collections", 0),
                "gc_pause_ms": round(s1.get("gc_pause_total_ms", 0) - s0.get("gc_pause_total_ms", 0), 1)}
    if side is not None:
        result, timing = side.result()
        out.window = (started_at, finished_at)
        out.export = {"seconds": round(timing.seconds, 2), "broker_cpu_s": round(timing.broker_cpu, 2),
                      "worker_cpu_s": round(timing.worker_cpu, 2), "rss_before": timing.rss_before, "rss_peak": timing.rss_peak,
                      "segments": len(result["exported"]), "rows": sum(e["rows"] for e in result["exported"])}
    st = out.stats()
    log(f"  {label}: {st['samples']:,} publishes over {st['seconds']:.1f} s: p50 {st.get('p50_ms', 0):.2f} ms, "
        f"p99 {st.get('p99_ms', 0):.2f} ms, max {st.get('max_ms', 0):.1f} ms")
    return out


async def latency_phase(server: Server, args: argparse.Namespace, export_dir: str) -> dict[str, Any]:
    from broker.client import aio

    backlog = ExportRun(args.latency_backlog)
    async with aio.connect(server.address, name="bench-export-latency", timeout=None) as c, \
            aio.connect(server.address, name="bench-export-admin", timeout=None) as admin:
        await setup_topic(admin, args.partitions)
        await admin.create_topic(STREAM, LAT_TOPIC, partitions=1, message_expiry=0, subjects=["lat.>"])
        await fill(server, admin, args.latency_backlog, args.subjects, backlog)
        backlog.segment_bytes = (await admin.get_topic(STREAM, TOPIC)).size
        for _ in range(200):  # warm-up, not measured
            await c.publish(LAT_SUBJECT, LAT_PAYLOAD)
        await asyncio.sleep(args.settle)
        quiet = await latency_run(server, c, "latency, no export", args.latency_rate, args.latency_seconds)
        await asyncio.sleep(args.settle)
        log(f"  now with export(seal=True) of the backlog ({backlog.segment_bytes / 1e6:,.1f} MB of segments) "
            f"started {EXPORT_LEAD:g} s in")
        busy = await latency_run(server, c, "latency, export running", args.latency_rate, args.latency_seconds,
                                 during=lambda: run_export(server, admin, export_dir, "export (latency run)"))
    return {"backlog_messages": args.latency_backlog, "backlog_segment_bytes": backlog.segment_bytes,
            "fill_seconds": round(backlog.fill_seconds, 2), "rate": args.latency_rate,
            "quiet": {**quiet.stats(), "broker_cpu_s": round(quiet.broker_cpu, 2), "errors": quiet.errors, "loop": quiet.loop},
            "export": {**busy.stats(), "broker_cpu_s": round(busy.broker_cpu, 2), "errors": busy.errors, "loop": busy.loop,
                       "run_seconds": round(busy.seconds, 2), "export": busy.export}}


# -- report ------------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 1) -> str:
    return "" if v is None else f"{v:,.{digits}f}"


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def report(runs: list[ExportRun], latency: dict[str, Any] | None, args: argparse.Namespace) -> str:
    parts = []
    if runs:
        rows = []
        for r in runs:
            us_row = sum(r.segment_seconds) / r.rows * 1e6 if r.rows else None
            per_seg = (f"{min(r.segment_seconds):.1f} / {_median(r.segment_seconds):.1f} / {max(r.segment_seconds):.1f}"
                       if r.segment_seconds else "")
            rows.append([f"{r.messages:,}", str(r.segments), _f(r.segment_bytes / 1e6), _f(r.parquet_bytes / 1e6),
                         _f(r.export_seconds, 2), _f(r.msgs_per_s, 0), _f(r.mb_per_s), _f(us_row, 2), per_seg,
                         _f(r.export_broker_cpu), _f(r.export_worker_cpu), _f(r.mb_per_cpu_s),
                         f"{r.rss_before / 2**20:,.0f} / {r.rss_peak / 2**20:,.0f}"])
        parts.append("Segments to Parquet (`export(seal=True)`, the broker's export worker process, timed from the client):\n\n"
                     + format_table(["messages", "segments", "segment MB", "Parquet MB", "export s", "msgs/s",
                                     "MB/s (segments)", "µs/row [1]", "s per segment min/median/max",
                                     "broker CPU s", "worker CPU s", "MB per CPU s [5]", "broker RSS MiB before / peak"], rows,
                                    right=(0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12)))
    spark_runs = [r for r in runs if r.cli or r.inproc]
    if spark_runs:
        rows = []
        for r in spark_runs:
            rows.append([f"{r.messages:,}", _f(r.parquet_bytes / 1e6), _f(r.cli.get("wall_s"), 1),
                         _f(r.cli.get("start_s"), 1), _f(r.cli.get("job_s"), 1),
                         _f(r.inproc.get("session_start_s"), 1), _f(r.inproc.get("job_s"), 1),
                         *([_f(r.inproc.get("analyze_s"), 1)] if args.analyze else []),
                         f"{r.inproc.get('rows', 0):,} / {r.expected_compact_rows:,}"])
        headers = ["messages", "Parquet MB in", "CLI wall s [2]", "CLI start s", "CLI job s",
                   "in-process session start s [3]", "in-process compact s",
                   *(["in-process analyze s"] if args.analyze else []), "rows out / expected"]
        parts.append("Spark `compact` on local[*] (cutoff 2100-01-01):\n\n"
                     + format_table(headers, rows, right=tuple(range(len(headers)))))
    if latency:
        q, e = latency["quiet"], latency["export"]
        rows = []
        for key, label in (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"), ("p999_ms", "p99.9"),
                           ("max_ms", "max"), ("mean_ms", "mean")):
            a, b = q.get(key), e.get(key)
            rows.append([f"{label} (ms)", _f(a, 2), _f(b, 2), f"{b / a:.1f}x" if a and b else ""])
        rows.append(["publishes over 10 ms / over 100 ms", f"{q['over_10ms']:,} / {q['over_100ms']:,}",
                     f"{e['over_10ms']:,} / {e['over_100ms']:,}", ""])
        rows.append(["publishes measured", f"{q['samples']:,}", f"{e['samples']:,}", ""])
        rows.append(["over (s) / achieved rate (msgs/s)", f"{q['seconds']:.1f} / {q['rate']:,.0f}",
                     f"{e['seconds']:.1f} / {e['rate']:,.0f}", ""])
        rows.append(["most behind schedule (ms) [4]", _f(q.get("behind_max_ms"), 1), _f(e.get("behind_max_ms"), 1), ""])
        ql, el = q.get("loop", {}), e.get("loop", {})
        rows.append(["broker loop stall max, before -> after (ms) [6]",
                     f"{_f(ql.get('stall_max_before_ms'), 1)} -> {_f(ql.get('stall_max_ms'), 1)}",
                     f"{_f(el.get('stall_max_before_ms'), 1)} -> {_f(el.get('stall_max_ms'), 1)}", ""])
        rows.append(["broker GC collections / pause total (ms)", f"{ql.get('gc_collections', 0):,} / {_f(ql.get('gc_pause_ms'), 1)}",
                     f"{el.get('gc_collections', 0):,} / {_f(el.get('gc_pause_ms'), 1)}", ""])
        ex = e.get("export", {})
        parts.append(
            f"Publish latency, one message at a time at {latency['rate']:,.0f}/s, send to ack "
            f"(backlog {latency['backlog_messages']:,} messages, {latency['backlog_segment_bytes'] / 1e6:,.0f} MB; "
            f"the export took {ex.get('seconds', 0):.1f} s for {ex.get('rows', 0):,} rows, "
            f"broker CPU {ex.get('broker_cpu_s', 0):.1f} s, worker CPU {ex.get('worker_cpu_s', 0):.1f} s, RSS {ex.get('rss_before', 0) / 2**20:,.0f} -> "
            f"{ex.get('rss_peak', 0) / 2**20:,.0f} MiB):\n\n"
            + format_table(["publish latency", "no export", "export running", "ratio"], rows, right=(1, 2, 3)))
    notes = [
        ("[1] sum of the per-segment seconds the broker reports / rows (conversion, Parquet write and fsync;"
         " without the snapshot, the manifest updates and the request)."),
        ("[2] `python -m spark_export compact ...` as a subprocess; start = until its session is up (Python imports"
         " and the JVM), job = from there to the job's last line; the wall also has the JVM's shutdown."),
        ("[3] `spark_session('local[*]')` in the benchmark process, once for all sizes; the compact jobs after the"
         " first run on a warm JVM."),
        ("[4] how late the most delayed send was against the steady schedule (one publish in flight: a client that"
         " cannot keep the rate falls further behind while the export runs)."),
        ("[5] segment MB / (broker + export worker CPU seconds): the export's cost, which the load of other"
         " processes on the machine does not change (the wall-clock MB/s does)."),
        ("[6] the broker's `loop_stall_max_ms` (`stats`, its longest batch of task steps between two waits for I/O"
         " since it started) at the start and the end of the run: a rise is the run's longest stall; no rise, the"
         " run's longest is at most the value before."),
    ]
    shown = {"[1]": bool(runs), "[2]": bool(spark_runs), "[3]": bool(spark_runs), "[4]": bool(latency), "[5]": bool(runs),
             "[6]": bool(latency)}
    text_notes = "\n".join(n for n in notes if shown[n[:3]])
    problems = []
    for r in runs:
        if r.fill_errors:
            problems.append(f"{r.messages:,}: {r.fill_errors:,} publishes refused")
        if r.rows != r.messages:
            problems.append(f"{r.messages:,}: exported {r.rows:,} rows")
        if r.check and (r.check.get("rows") != r.messages or r.check.get("removed") != r.purged):
            problems.append(f"{r.messages:,}: export has {r.check} (purged {r.purged:,})")
        for what, got in (("CLI", r.cli.get("result", {}).get("rows")), ("in-process", r.inproc.get("rows"))):
            if got is not None and got != r.expected_compact_rows:
                problems.append(f"{r.messages:,}: compact ({what}) wrote {got:,} rows, expected {r.expected_compact_rows:,}")
    if latency:
        for k in ("quiet", "export"):
            if latency[k]["errors"]:
                problems.append(f"latency ({k}): {latency[k]['errors']:,} publishes failed")
    text = "\n\n".join(parts) + "\n\n" + text_notes
    if problems:
        text += "\n\nPROBLEMS: " + "; ".join(problems)
    return text


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", default=None, metavar="N,N,...",
                   help="message counts to export, comma-separated (default 1000000,5000000; 100000 with --quick)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the exported topic (default 4)")
    p.add_argument("--subjects", type=int, default=50_000,
                   help="subjects exp.k.<k> the kept messages spread over (default 50,000)")
    p.add_argument("--segment-size", default="64 MiB", help="[system.segment] size_bytes (default 64 MiB)")
    p.add_argument("--fsync", default="never", help="--fsync of every broker (default never)")
    p.add_argument("--latency-backlog", type=int, default=None, metavar="N",
                   help="messages waiting to be exported in the latency runs (default 1,000,000; 100,000 with --quick; "
                        "0 skips the latency runs)")
    p.add_argument("--latency-rate", type=float, default=1000.0, help="publishes per second (default 1,000)")
    p.add_argument("--latency-seconds", type=float, default=None,
                   help="length of each latency run (default 10; 5 with --quick)")
    p.add_argument("--worker-priority", default="idle", choices=("idle", "low", "normal"),
                   help="[export] worker_priority of the broker (default idle, the broker's default)")
    p.add_argument("--no-spark", action="store_true", help="skip the Spark jobs")
    p.add_argument("--analyze", action="store_true", help="also time the analyze job in-process")
    p.add_argument("--settle", type=float, default=2.0, help="seconds of quiet before each timed phase (default 2)")
    p.add_argument("--quick", action="store_true", help="a smoke test: 100,000 messages, < 90 s")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (e.g. bench/results/export.json)")
    p.add_argument("--keep-temp", action="store_true", help="keep the temporary directories")
    args = p.parse_args(argv)
    if args.messages is None:
        args.messages = "100000" if args.quick else "1000000,5000000"
    try:
        args.messages = [int(x.replace("_", "")) for x in args.messages.split(",") if x.strip()]
    except ValueError:
        p.error("--messages takes comma-separated integers")
    if any(n < 1 for n in args.messages):
        p.error("--messages must be >= 1")
    if args.latency_backlog is None:
        args.latency_backlog = 100_000 if args.quick else 1_000_000
    if args.latency_seconds is None:
        args.latency_seconds = 5.0 if args.quick else 10.0
    if args.partitions < 1 or args.subjects < 1 or args.latency_rate <= 0:
        p.error("--partitions, --subjects and --latency-rate must be positive")
    return args


def check_disk(args: argparse.Namespace) -> None:
    """Segments (~190 bytes a message) plus Parquet (at most as much), for the largest N."""
    need = max([*args.messages, args.latency_backlog]) * 190 * 2.2
    free = shutil.disk_usage(tempfile.gettempdir()).free
    log(f"disk: {free / 1e9:.1f} GB free in {tempfile.gettempdir()}, about {need / 1e9:.1f} GB needed at most")
    if free < need:
        raise SystemExit(f"not enough disk space in {tempfile.gettempdir()}: {free / 1e9:.1f} GB free, "
                         f"about {need / 1e9:.1f} GB needed")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    log(f"export: {', '.join(f'{n:,}' for n in args.messages)} messages of {PAYLOAD_BYTES} bytes, "
        f"{args.partitions} partitions, segments of {args.segment_size}, fsync {args.fsync}; latency backlog "
        f"{args.latency_backlog:,}")
    log_environment(env)
    check_disk(args)
    ensure_spark_export()
    config = broker_config(args.segment_size, args.worker_priority)
    runs: list[ExportRun] = []
    latency: dict[str, Any] | None = None
    spark = InProcessSpark()
    t0 = time.perf_counter()
    cpu = CpuWatch()
    with Harness("exportbench", keep_temp=args.keep_temp) as h:
        try:
            if args.latency_backlog > 0:
                export_dir = h.tempdir("export-latency")
                with h.ttlbroker(fsync=args.fsync, config=config, extra_args=["--export-dir", str(export_dir)]) as srv:
                    log(f"{srv.label} on {srv.address}: publish latency with and without an export "
                        f"(backlog {args.latency_backlog:,})")
                    latency = run_uvloop(latency_phase(srv, args, str(export_dir)))
                h.remove_tempdir(export_dir)
            for n in args.messages:
                export_dir = h.tempdir(f"export-{n}")
                with h.ttlbroker(fsync=args.fsync, config=config, extra_args=["--export-dir", str(export_dir)]) as srv:
                    log(f"{srv.label} on {srv.address}: {n:,} messages")
                    run = run_uvloop(fill_and_export(srv, n, args, str(export_dir)))
                runs.append(run)
                run.check = check_export(str(export_dir))
                log(f"  export check (pyarrow): {run.check}")
                if not args.no_spark:
                    spark_phase(h, run, str(export_dir), spark, args)
                h.remove_tempdir(export_dir)
        finally:
            spark.stop()
    elapsed = time.perf_counter() - t0
    env["load_avg_at_end"] = os.getloadavg()
    env["cpu_during_run"] = others = cpu.stop()

    print()
    print(f"export: {PAYLOAD_BYTES}-byte JSON-like payloads, {args.partitions} partitions, segments of "
          f"{args.segment_size}, --fsync {args.fsync}; 10 % purged, 10 % with a Nats-TTL header; "
          f"{env['cpus']} CPUs, {env['date']}, {elapsed:.0f} s total, load average "
          f"{env['load_avg_at_start'][0]:.2f} at start, {env['load_avg_at_end'][0]:.2f} at end")
    print_cpu_share(others)
    print()
    text = report(runs, latency, args)
    print(text)
    if args.json:
        record = {
            "benchmark": "export",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "environment": env,
            "settings": {"messages": args.messages, "payload_bytes": PAYLOAD_BYTES, "partitions": args.partitions,
                         "subjects": args.subjects, "gone_subjects": GONE_SUBJECTS, "segment_size": args.segment_size,
                         "fsync": args.fsync, "batch": BATCH, "batches_in_flight": BATCHES_IN_FLIGHT,
                         "cutoff": CUTOFF, "latency_backlog": args.latency_backlog,
                         "latency_rate": args.latency_rate, "latency_seconds": args.latency_seconds,
                         "export_lead_s": EXPORT_LEAD, "settle_s": args.settle},
            "elapsed_s": round(elapsed, 1),
            "results": {"export": [r.as_dict() for r in runs], "latency": latency},
        }
        log(f"wrote {write_json(args.json, record)}")
    return 1 if "PROBLEMS:" in text else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers stopped and temporary directories removed")
        sys.exit(130)
