"""How long ``ttlbroker serve`` takes to become healthy, and what a ``/metrics``
scrape costs.

Three measurements, each on a ttlbroker subprocess (``ttlbroker serve``) on
loopback with a fresh temporary data directory:

* **start, empty**: from starting ``ttlbroker serve`` on an empty data directory
  to the first ``/healthz`` 200, polled every 5 ms from the moment the process is
  started (``--runs`` times). Also when the monitoring port first answered (the
  interpreter and the imports take most of the time before it).
* **start, N stored messages**: the data directory is filled with ``--messages``
  (1,000,000) messages of 128 bytes on 100 subjects, in one topic of
  ``--partitions`` (1) partitions, with the asyncio client's ``publish_batch``
  (1,000 a batch, 4 in flight, ``fsync never`` while filling); the broker is
  stopped, then restarted on it (``fsync always``, the default) and timed as above
  (``--runs`` times). Between its first 503 and its 200 the broker is recovering.
  With ``--ttl SECONDS`` every message carries that TTL (the topic allows
  per-message TTLs), so the restart also rebuilds a deadline per message.
* **/metrics with T topics**: ``--topics`` (1,000) topics of one partition, each with
  one message, then ``--scrapes`` (20) scrapes one after another: wall time of each
  (the client's view; the broker builds the families on its event loop and encodes
  them in a worker thread), and the size and the number of samples of the text.

Progress goes to stderr, the tables to stdout. Run from the repository root::

    .venv/bin/python bench/startup.py                     # a few minutes
    .venv/bin/python bench/startup.py --quick             # 100,000 messages, 200 topics
    .venv/bin/python bench/startup.py --only stored --ttl 3600   # restart with a TTL on every message
    .venv/bin/python bench/startup.py --json bench/results/startup-$(date +%F).json
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    CpuWatch,
    Harness,
    Server,
    environment,
    find_executable,
    format_table,
    log,
    print_cpu_share,
    proc_usage,
    run_uvloop,
    write_json,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client.aio import connect  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

PAYLOAD = b"x" * 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(h: Harness, data: Path, workdir: Path, http_port: int, fsync: str, label: str) -> tuple[Server, float]:
    """``ttlbroker serve`` on ``data``; returns the server and when it was started."""
    argv = [find_executable("ttlbroker"), "serve", "--data", str(data), "--port", "0", "--http-port", str(http_port),
            "--fsync", fsync]
    t0 = time.monotonic()
    return h._spawn("ttlbroker", label, argv, workdir, {"fsync": fsync}), t0


def wait_healthy(server: Server, http_port: int, t0: float, timeout: float = 600.0) -> dict[str, float]:
    """Poll /healthz every 5 ms; seconds from ``t0`` to the first answer and to 200, and
    the server's CPU seconds at 200 (steadier than wall time on a busy machine)."""
    url = f"http://127.0.0.1:{http_port}/healthz"
    first: float | None = None
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            status = 0
        now = time.monotonic() - t0
        if status and first is None:
            first = now
        if status == 200:
            cpu = proc_usage(server.proc.pid).cpu  # the server's own CPU seconds (all threads) so far
            return {"monitoring_s": first if first is not None else now, "healthy_s": now, "server_cpu_s": cpu}
        server.check_alive()
        if now > timeout:
            raise RuntimeError(f"not healthy after {timeout} s")
        time.sleep(0.005)


def address_of(server: Server) -> str:
    import re

    deadline = time.monotonic() + 10  # /healthz may answer before the line is written
    while not (m := re.search(r"^listening on (\S+)\s*$", server.log_path.read_text(errors="replace"), re.M)):
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.01)
    return m.group(1)


async def fill(address: str, messages: int, partitions: int, ttl: int) -> float:
    t = time.perf_counter()
    async with connect(address, timeout=None) as c:
        await c.create_stream("bench")
        await c.create_topic("bench", "fill", partitions=partitions, subjects=["fill.>"],
                             **({"allow_msg_ttl": True} if ttl else {}))
        batch = [(f"fill.{i % 100}", PAYLOAD, None, ttl or None) for i in range(1000)]
        sem = asyncio.Semaphore(4)
        done = 0
        next_log = time.perf_counter() + 5

        async def one(n: int) -> None:
            nonlocal done, next_log
            async with sem:
                await c.publish_batch(batch[:n])
                done += n
                if time.perf_counter() > next_log:
                    next_log = time.perf_counter() + 5
                    log(f"    filled {done:,}/{messages:,}")

        tasks = []
        left = messages
        while left:
            n = min(1000, left)
            left -= n
            await sem.acquire()
            sem.release()
            tasks.append(asyncio.ensure_future(one(n)))
        await asyncio.gather(*tasks)
        assert (await c.stats())["messages"] == messages
    return time.perf_counter() - t


async def make_topics(address: str, topics: int) -> None:
    async with connect(address, timeout=None) as c:
        await c.create_stream("many")
        for i in range(topics):
            await c.create_topic("many", f"t{i}", subjects=[f"m.{i}.>"])
        await asyncio.gather(*(c.publish(f"m.{i}.x", PAYLOAD) for i in range(topics)))


def scrape(http_port: int) -> tuple[float, bytes]:
    t = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=30) as r:
        body = r.read()
    return time.perf_counter() - t, body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ttl", type=int, default=0, metavar="SECONDS",
                    help="give every stored message this TTL (restart then rebuilds a deadline each; default none)")
    ap.add_argument("--only", choices=("empty", "stored", "metrics"), action="append",
                    help="run only this measurement (repeatable; default all three)")
    ap.add_argument("--data", metavar="DIR", help="fill this data directory (kept afterwards) or, if it exists, "
                    "restart on what it holds (repeat a restart measurement without filling again)")
    ap.add_argument("--quick", action="store_true", help="100,000 messages, 200 topics, 5 scrapes, 1 run")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.topics, args.scrapes, args.runs = 100_000, 200, 5, 1
    started = time.monotonic()
    env = environment()
    cpu = CpuWatch()
    results: dict[str, Any] = {}
    want = set(args.only or ("empty", "stored", "metrics"))
    with Harness("startup") as h:
        # 1. empty
        if "empty" in want:
            runs = []
            for i in range(args.runs):
                work = h.tempdir("empty")
                port = free_port()
                server, t0 = spawn(h, work / "data", work, port, "always", "ttlbroker empty")
                runs.append(wait_healthy(server, port, t0))
                h.stop(server)
                log(f"empty, run {i + 1}: healthy after {runs[-1]['healthy_s']:.3f} s")
            results["empty"] = runs

        # 2. N stored messages
        if "stored" in want:
            work = Path(args.data).parent if args.data else h.tempdir("full")
            data = Path(args.data) if args.data else work / "data"
            port = free_port()
            fill_s = None
            if data.exists():
                log(f"restarting on the messages already in {data} (--data)")
            else:
                server, t0 = spawn(h, data, work, port, "never", "ttlbroker fill")
                wait_healthy(server, port, t0)
                log(f"filling {args.messages:,} messages" + (f" with a TTL of {args.ttl} s" if args.ttl else ""))
                fill_s = run_uvloop(fill(address_of(server), args.messages, args.partitions, args.ttl))
                log(f"filled in {fill_s:.1f} s ({args.messages / fill_s:,.0f} msgs/s)")
                h.stop(server, timeout=120)
            disk = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
            runs = []
            for i in range(args.runs):
                server, t0 = spawn(h, data, work, port, "always", "ttlbroker restart")
                runs.append(wait_healthy(server, port, t0))
                h.stop(server, timeout=120)
                log(f"{args.messages:,} messages, run {i + 1}: healthy after {runs[-1]['healthy_s']:.3f} s "
                    f"(recovering {runs[-1]['healthy_s'] - runs[-1]['monitoring_s']:.3f} s)")
            results["stored"] = {"messages": args.messages, "partitions": args.partitions, "ttl": args.ttl,
                                 "bytes_on_disk": disk, "fill_seconds": fill_s and round(fill_s, 2), "runs": runs}

        # 3. /metrics with many topics
        if "metrics" in want:
            work = h.tempdir("topics")
            port = free_port()
            server, t0 = spawn(h, work / "data", work, port, "never", "ttlbroker topics")
            wait_healthy(server, port, t0)
            log(f"creating {args.topics:,} topics")
            run_uvloop(make_topics(address_of(server), args.topics))
            scrape(port)  # warm
            times = []
            body = b""
            for _ in range(args.scrapes):
                t, body = scrape(port)
                times.append(t)
            families = list(text_string_to_metric_families(body.decode()))
            nsamples = sum(len(f.samples) for f in families)
            h.stop(server)
            results["metrics"] = {
                "topics": args.topics, "scrapes": args.scrapes, "bytes": len(body), "families": len(families),
                "samples": nsamples, "seconds": [round(t, 4) for t in times],
                "median_s": round(statistics.median(times), 4), "max_s": round(max(times), 4),
            }
    others = cpu.stop()

    def med(rs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rs)

    print(f"\n## Start-up: `ttlbroker serve` to /healthz 200 (median of {args.runs})\n")
    rows = []
    if "empty" in results:
        rows.append(["empty data directory", f"{med(results['empty'], 'monitoring_s'):.3f}",
                     f"{med(results['empty'], 'healthy_s'):.3f}", "", f"{med(results['empty'], 'server_cpu_s'):.2f}", ""])
    if "stored" in results:
        st = results["stored"]
        healthy = med(st["runs"], "healthy_s")
        recovering = statistics.median(r["healthy_s"] - r["monitoring_s"] for r in st["runs"])
        ttl = f", TTL {args.ttl} s" if args.ttl else ""
        rows.append([f"{args.messages:,} messages{ttl} ({st['bytes_on_disk'] / 1e6:,.0f} MB)",
                     f"{med(st['runs'], 'monitoring_s'):.3f}", f"{healthy:.3f}", f"{recovering:.3f}",
                     f"{med(st['runs'], 'server_cpu_s'):.2f}", f"{healthy / args.messages * 1e6:.3f}"])
    print(format_table(["data", "monitoring answers (s)", "/healthz 200 (s)", "recovering (s)", "server CPU to 200 (s)",
                        "200 per million (s)"], rows, right=(1, 2, 3, 4, 5)))
    if "metrics" in results:
        mt = results["metrics"]
        print(f"\n## /metrics with {mt['topics']:,} topics ({mt['scrapes']} scrapes)\n")
        print(format_table(
            ["median (ms)", "max (ms)", "bytes", "families", "samples"],
            [[f"{mt['median_s'] * 1000:.1f}", f"{mt['max_s'] * 1000:.1f}", f"{mt['bytes']:,}", str(mt["families"]),
              f"{mt['samples']:,}"]],
            right=(0, 1, 2, 3, 4),
        ))
    print_cpu_share(others)
    if args.json:
        env["cpu_during_run"] = others
        path = write_json(args.json, {"benchmark": "startup", "command": " ".join(["python", *sys.argv]), "environment": env,
                                      "settings": vars(args), "elapsed_s": round(time.monotonic() - started, 1),
                                      "results": results})
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
