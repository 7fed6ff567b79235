"""What NATS subscriptions cost the broker: issue 27's attack, measured.

Starts a ttlbroker subprocess with its NATS listener (``ttlbroker serve``, default
limits but for what a scenario changes) and has ``--connections`` (150) raw NATS
connections each pipeline ``--subs`` (1,024) ``SUB``s on long subjects, then a
PING, ten connections at a time, never unsubscribing. It reports the broker's RSS
(VmRSS from ``/proc/PID/status``) before, once every connection has had its PONG,
and a second after they all closed; the subscriptions the broker holds and its
estimate of their memory (``subscription_bytes``, against
``limits.max_subscription_bytes_total``); and the ``-ERR`` lines the connections got.

Without the subscription limits, the first scenario took the broker to 1.4 GB. The
scenarios:

* ``4000``: 4,000-byte subjects, the defaults: over
  ``limits.max_subscription_subject_bytes`` (1 KiB), every SUB gets
  ``-ERR 'Invalid Subject'``;
* ``1000``: 1,000-byte subjects, the defaults: the subscription budget (64 MiB)
  fills and the rest get ``-ERR 'maximum subscriptions exceeded'``;
* ``4000-allowed``: 4,000-byte subjects with ``max_subscription_subject_bytes =
  4096``: the budget again.

Progress goes to stderr, the table to stdout. Run from the repository root::

    .venv/bin/python bench/subscriptions.py                 # ~1 minute
    .venv/bin/python bench/subscriptions.py --only 1000 --connections 50
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Harness, Server, environment, format_table, log, proc_usage, run_uvloop, write_json  # noqa: E402

MiB = 1024 * 1024
#: name -> (subject bytes, config TOML)
SCENARIOS: dict[str, tuple[int, str]] = {
    "4000": (4000, ""),
    "1000": (1000, ""),
    "4000-allowed": (4000, "[limits]\nmax_subscription_subject_bytes = 4096\n"),
}
GAUGES = ("subscriptions", "subscription_bytes", "subscription_bytes_budget", "subscriptions_refused_total",
          "subscription_budget_refused_total")


def mb(n: float) -> str:
    return f"{n / MiB:,.0f} MiB"


def metrics(srv: Server) -> dict[str, float]:
    """The subscription numbers of the broker's ``/metrics``."""
    port = _monitoring_port(srv)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("ttlbroker_") and name[len("ttlbroker_"):] in GAUGES:
            out[name[len("ttlbroker_"):]] = float(value)
    return out


def _monitoring_port(srv: Server) -> int:
    for line in srv.log_path.read_text().splitlines():
        if line.startswith("monitoring on http://"):
            return int(line.rsplit(":", 1)[1])
    raise RuntimeError("the broker printed no 'monitoring on' line")


async def attacker(host: str, port: int, c: int, subs: int, subject_bytes: int, errors: Counter[str]) -> asyncio.StreamWriter:
    """One connection: CONNECT, ``subs`` SUBs and a PING in one write; reads up to
    the PONG, counting the -ERR lines; the connection is left open."""
    reader, writer = await asyncio.open_connection(host, port)
    await reader.readline()  # INFO
    lines = [b'CONNECT {"verbose":false,"pedantic":false}\r\n']
    for i in range(subs):
        head = f"s{c}.{i}.".encode()
        lines.append(b"SUB " + head + b"a" * (subject_bytes - len(head)) + f" {i}\r\n".encode())
    writer.write(b"".join(lines) + b"PING\r\n")
    await writer.drain()
    while True:
        line = await reader.readline()
        if not line:
            errors["connection closed"] += 1
            break
        if line.startswith(b"PONG"):
            break
        if line.startswith(b"-ERR"):
            errors[line.strip().decode()] += 1
    return writer


async def attack(srv: Server, connections: int, subs: int, subject_bytes: int) -> dict[str, Any]:
    assert srv.nats_url is not None
    host, port = srv.nats_url.removeprefix("nats://").rsplit(":", 1)
    out: dict[str, Any] = {"connections": connections, "subs": subs, "subject_bytes": subject_bytes}
    out["rss_before"] = proc_usage(srv.proc.pid).rss
    errors: Counter[str] = Counter()
    writers: list[asyncio.StreamWriter] = []
    t0 = time.perf_counter()
    for start in range(0, connections, 10):
        writers += await asyncio.gather(*(attacker(host, int(port), c, subs, subject_bytes, errors)
                                          for c in range(start, min(connections, start + 10))))
    out["seconds"] = time.perf_counter() - t0
    out["rss_held"] = proc_usage(srv.proc.pid).rss
    out["held"] = await asyncio.to_thread(metrics, srv)
    out["errors"] = dict(errors)
    for w in writers:
        w.close()
    await asyncio.sleep(1)
    out["rss_after_close"] = proc_usage(srv.proc.pid).rss
    out["after_close"] = await asyncio.to_thread(metrics, srv)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=150, help="NATS connections (default 150)")
    p.add_argument("--subs", type=int, default=1024, help="SUBs each connection sends (default 1,024)")
    p.add_argument("--only", choices=tuple(SCENARIOS), help="run one scenario only")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--keep-temp", action="store_true", help="keep the broker's temporary directory")
    args = p.parse_args(argv)
    if args.connections < 1 or args.subs < 1:
        p.error("every count must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    results: dict[str, Any] = {}
    with Harness("subscriptions", keep_temp=args.keep_temp) as h:
        for name, (subject_bytes, config) in SCENARIOS.items():
            if args.only and name != args.only:
                continue
            with h.ttlbroker(fsync="never", nats=True, config=config or None, extra_args=["--http-port", "-1"]) as srv:
                log(f"{name}: {args.connections} connections x {args.subs} SUBs on {subject_bytes}-byte subjects")
                results[name] = run_uvloop(attack(srv, args.connections, args.subs, subject_bytes))
                srv.check_alive()

    print()
    print(f"subscriptions: {args.connections} NATS connections x {args.subs} SUBs each "
          f"({env['cpus']} CPUs, {env['date']})")
    print()
    rows = []
    for name, r in results.items():
        held = r["held"]
        rows.append([
            name, mb(r["rss_before"]), mb(r["rss_held"]), mb(r["rss_after_close"]),
            f"{held.get('subscriptions', 0):,.0f}", mb(held.get("subscription_bytes", 0)),
            mb(held.get("subscription_bytes_budget", 0)),
            "; ".join(f"{k}: {v:,}" for k, v in sorted(r["errors"].items())) or "none",
            f"{r['after_close'].get('subscription_bytes', 0):,.0f}", f"{r['seconds']:.1f} s",
        ])
    print(format_table(["scenario", "RSS before", "RSS held", "RSS after close", "subscriptions", "counted",
                        "budget", "refused", "counted after close", "time"], rows, right=[1, 2, 3, 4, 5, 6, 8, 9]))
    if args.json:
        log(f"wrote {write_json(args.json, {'benchmark': 'subscriptions', 'environment': env, 'results': results})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
