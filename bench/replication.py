"""Replication: a ttlbroker copying a stream from another server.

The copier is a ttlbroker whose config names the origin as ``[[nats.remotes]]``
(domain ``hub``); its mirrors and sources read the origin through a flow-controlled
push consumer there, as nats-server's do (docs/operations.md, "Replicas and moves").
Two origins, one after the other: a ttlbroker (``[nats] domain = "hub"``) and a
nats-server (``jetstream { domain: hub }``). Durability is ``--sync`` on all three
servers (default ``always``: ttlbroker ``--fsync always``, nats-server
``sync_interval: always``). Payloads are ``--size`` bytes (default 128).

Rows, for each origin, in the order they run:

* **steady rate**: ``--seconds`` at ``--rate`` msgs/s at the origin (a tick every
  10 ms), each message with an ``X-Sent`` header (the wall clock, ns). The mirror
  republishes headers only to ``lag.>``; a core subscriber at the copier takes
  for each now - ``Nats-Time-Stamp`` (the origin's timestamp, which a mirror
  keeps): stored at the origin to stored in the copy, the copy's fsync included,
  with the republish and its delivery on top (the replication lag); and now -
  ``X-Sent``: the same from the publish, with the origin's own ack time (and its
  queue when it accepts less than the rate). p50, p99, max.
* **reference**: the same rate into another stream of the origin, read there by a
  push consumer as a copy reads (flow control, ack none) from nats-py: stored at the
  origin to delivered, the origin's own delivery lag, which no copy can beat.
* **backlog → mirror**: the origin holds ``--messages``; from the mirror's
  ``STREAM.CREATE`` on the copier until it holds them all.
* **backlog → source**: the same with a stream sourcing it.
* **live, flat out**: a mirror in place, then ``--messages`` ``publish_async`` at the
  origin as fast as it acknowledges them: the origin's accept rate, the copy's rate
  (first publish to the copy complete) and the catch-up after the last PubAck.

And once, beside them: **the copier's own publish rate**, the same ``publish_async``
into a stream of its own (the rate a copy cannot beat: it stores through the same
publish path).

Target (``bench/README.md``, "Targets"): the copy keeps up with whatever the origin
accepts (live copy rate at the origin's accept rate, catch-up near 0) and the lag
p99 at 5,000 msgs/s is under 100 ms. All three servers and the client share the
machine: on 2 cores, the copier's rate is also what is left to it. Run from the
repository root::

    .venv/bin/python bench/replication.py            # 50,000 messages, 10 s steady: about 2 minutes
    .venv/bin/python bench/replication.py --quick    # 5,000 messages, 3 s steady
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    RESULTS_DIR,
    CpuWatch,
    Harness,
    Rate,
    environment,
    fmt_rate,
    format_table,
    log,
    log_environment,
    print_cpu_share,
    proc_usage,
    run_uvloop,
    write_json,
)

from protocol.nats import parse_rfc3339  # noqa: E402

API = "$JS.API"


async def _api(nc: Any, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    msg = await nc.request(f"{API}.{subject}", json.dumps(body).encode() if body is not None else b"", timeout=30)
    ans: dict[str, Any] = json.loads(msg.data)
    if "error" in ans:
        raise RuntimeError(f"{subject}: {ans['error']}")
    return ans


async def _wait_count(nc: Any, stream: str, n: int, timeout: float) -> float:
    """The perf_counter time at which ``stream`` holds ``n`` messages (polled every 5 ms)."""
    end = time.perf_counter() + timeout
    last = -1
    next_log = time.perf_counter() + 2
    while True:
        info = await _api(nc, f"STREAM.INFO.{stream}")
        got = info["state"]["messages"]
        now = time.perf_counter()
        if got >= n:
            return now
        if now > end:
            raise RuntimeError(f"{stream} holds {got:,} of {n:,} after {timeout:g} s: {info.get('mirror') or info.get('sources')}")
        if now > next_log and got != last:
            log(f"    {stream}: {got:,}/{n:,}")
            next_log, last = now + 2, got
        await asyncio.sleep(0.005)


async def _publish_all(js: Any, subject: str, n: int, payload: bytes) -> None:
    for _ in range(n):
        await js.publish_async(subject, payload)
    await js.publish_async_completed()


async def copier_publish_rate(copier_url: str, args: argparse.Namespace) -> Rate:
    import nats

    nc = await nats.connect(copier_url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(publish_async_max_pending=1000, timeout=30)
        await js.add_stream(name="OWN", subjects=["own.>"])
        payload = os.urandom(args.size)
        t0 = time.perf_counter()
        await _publish_all(js, "own.x", args.messages, payload)
        rate = Rate(args.messages, time.perf_counter() - t0)
        log(f"  the copier's own publish_async: {rate.per_second:,.0f} msgs/s")
        return rate
    finally:
        await nc.close()


def _cpu(pid: int) -> float:
    return proc_usage(pid).cpu


async def _steady(js: Any, subject: str, nc: Any, listen: str, lag_of: Any, payload: bytes,
                  args: argparse.Namespace) -> dict[str, Any]:
    """``--rate`` msgs/s for ``--seconds`` to ``subject`` at the origin (a tick every
    10 ms), each with ``X-Sent``; each message heard on ``listen`` (at ``nc``) gives
    ``lag_of(msg, now_ns)`` (None: not a message) and now - ``X-Sent``, in ms."""
    lags: list[float] = []  # the lag ``lag_of`` measures
    sent_lags: list[float] = []  # published -> heard
    total = int(args.rate * args.seconds)
    per_tick = max(1, args.rate // 100)
    got_all = asyncio.Event()

    async def heard(msg: Any) -> None:
        now = time.time_ns()
        lag = lag_of(msg, now)
        if lag is None:
            return
        lags.append(lag)
        sent_lags.append((now - int(msg.headers["X-Sent"])) / 1e6)
        if len(lags) >= total:
            got_all.set()

    sub = await nc.subscribe(listen, cb=heard)
    await nc.flush()
    t0 = time.perf_counter()
    sent = tick = 0
    while sent < total:
        delay = t0 + tick * 0.01 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        for _ in range(min(per_tick, total - sent)):
            await js.publish_async(subject, payload, headers={"X-Sent": str(time.time_ns())})
            sent += 1
        tick += 1
    await js.publish_async_completed()
    sending = time.perf_counter() - t0
    try:
        await asyncio.wait_for(got_all.wait(), 60)
    except TimeoutError:
        raise RuntimeError(f"the steady phase on {subject}: {len(lags):,} of {total:,} heard") from None
    seconds = time.perf_counter() - t0
    await sub.unsubscribe()
    q = statistics.quantiles(lags, n=100, method="inclusive")
    qs = statistics.quantiles(sent_lags, n=100, method="inclusive")
    out = {
        "rate_asked": args.rate, "rate_sent": round(total / sending, 1), "messages": total, "seconds": round(seconds, 3),
        "lag_p50_ms": round(q[49], 2), "lag_p99_ms": round(q[98], 2), "lag_max_ms": round(max(lags), 2),
        "sent_lag_p50_ms": round(qs[49], 2), "sent_lag_p99_ms": round(qs[98], 2), "sent_lag_max_ms": round(max(sent_lags), 2),
    }
    log(f"  steady {args.rate:,} msgs/s to {subject} (sent at {total / sending:,.0f}): lag p50 {q[49]:.1f} ms, "
        f"p99 {q[98]:.1f} ms, max {max(lags):.1f} ms; from the publish p50 {qs[49]:.1f}, p99 {qs[98]:.1f} ms")
    return out


async def run_origin(origin_url: str, copier_url: str, copier_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    import nats

    there = await nats.connect(origin_url, max_reconnect_attempts=0)
    here = await nats.connect(copier_url, max_reconnect_attempts=0)
    js = there.jetstream(publish_async_max_pending=1000, timeout=30)
    payload = os.urandom(args.size)
    n = args.messages
    out: dict[str, Any] = {}
    try:
        # -- a steady rate (first, on servers that have nothing else to do): the lag of
        # each message, in the copy and at a plain consumer of the origin -----------
        await _api(there, "STREAM.CREATE.P", {"name": "P", "subjects": ["p.>"]})
        await _api(here, "STREAM.CREATE.MP", {
            "name": "MP", "mirror": {"name": "P", "domain": "hub"},
            "republish": {"src": ">", "dest": "lag.>", "headers_only": True},
        })

        def copy_lag(msg: Any, now: int) -> float | None:  # the mirror keeps the origin's timestamp
            return (now - parse_rfc3339(msg.headers["Nats-Time-Stamp"])) / 1e6

        c0 = _cpu(copier_pid)
        out["steady"] = await _steady(js, "p.x", here, "lag.>", copy_lag, payload, args)
        out["steady"]["copier_cpu_share"] = round((_cpu(copier_pid) - c0) / out["steady"]["seconds"], 3)

        # The same rate into another stream of the origin, read by a push consumer there
        # as the copy reads (flow control, ack none), from nats-py: the origin's own
        # delivery lag, which a copy cannot beat.
        await _api(there, "STREAM.CREATE.R", {"name": "R", "subjects": ["r.>"]})
        inbox = there.new_inbox()
        await _api(there, "CONSUMER.CREATE.R", {"stream_name": "R", "config": {
            "deliver_subject": inbox, "ack_policy": "none", "flow_control": True,
            "idle_heartbeat": 1_000_000_000, "deliver_policy": "all", "max_deliver": 1,
        }})

        def consumer_lag(msg: Any, now: int) -> float | None:
            if not msg.data:  # a heartbeat or a flow-control request
                if msg.reply:
                    asyncio.ensure_future(there.publish(msg.reply, b""))
                return None
            return (now - int(msg.reply.split(".")[-2])) / 1e6  # $JS.ACK.<...>.<timestamp>.<pending>

        out["reference"] = await _steady(js, "r.x", there, inbox, consumer_lag, payload, args)
        # -- a backlog, copied by a mirror, then by a source --------------------------------
        await _api(there, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"]})
        await _publish_all(js, "s.x", n, payload)
        for kind, cfg in (
            ("backlog_mirror", {"name": "M", "mirror": {"name": "S", "domain": "hub"}}),
            ("backlog_source", {"name": "C", "sources": [{"name": "S", "external": {"api": "$JS.hub.API"}}]}),
        ):
            c0, t0 = _cpu(copier_pid), time.perf_counter()
            await _api(here, f"STREAM.CREATE.{cfg['name']}", cfg)
            t1 = await _wait_count(here, str(cfg["name"]), n, 120)
            out[kind] = Rate(n, t1 - t0, server_cpu_s=round(_cpu(copier_pid) - c0, 3))
            log(f"  {kind}: {out[kind].per_second:,.0f} msgs/s")

        # -- live, flat out -----------------------------------------------------------------
        await _api(there, "STREAM.CREATE.L", {"name": "L", "subjects": ["l.>"]})
        await _api(here, "STREAM.CREATE.ML", {"name": "ML", "mirror": {"name": "L", "domain": "hub"}})
        c0, t0 = _cpu(copier_pid), time.perf_counter()
        await _publish_all(js, "l.x", n, payload)
        acked = time.perf_counter()
        copied = await _wait_count(here, "ML", n, 120)
        out["live_origin"] = Rate(n, acked - t0)
        out["live_copy"] = Rate(n, copied - t0, server_cpu_s=round(_cpu(copier_pid) - c0, 3))
        out["live_catch_up_ms"] = round((copied - acked) * 1000, 1)
        log(f"  live: origin accepted {out['live_origin'].per_second:,.0f} msgs/s, the copy "
            f"{out['live_copy'].per_second:,.0f} msgs/s, caught up {out['live_catch_up_ms']:.0f} ms after the last PubAck")

        info = await _api(here, "STREAM.INFO.ML")
        out["mirror_info"] = info.get("mirror")
    finally:
        await here.close()
        await there.close()
    return out


def _steady_row(origin: str, label: str, st: dict[str, Any], note: str) -> list[str]:
    return [origin, label.format(rate=st["rate_asked"]),
            f"{st['lag_p50_ms']:.1f} / {st['lag_p99_ms']:.1f} / {st['lag_max_ms']:.1f} ms",
            f"sent at {st['rate_sent']:,.0f} msgs/s; from the publish p99 {st['sent_lag_p99_ms']:.1f} ms{note}"]


def _us(rate: Rate) -> str:
    return f"the copier's CPU {rate.cpu_us_per_msg()[1]:.0f} µs/msg"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--rate", type=int, default=5_000, help="the steady phase's msgs/s at the origin")
    ap.add_argument("--seconds", type=float, default=10.0, help="the steady phase's length")
    ap.add_argument("--sync", default="always", help="every server's durability: always, or a duration (200ms)")
    ap.add_argument("--origin-sync", help="the origin's durability, when not --sync's (nats-server: 'default' for its 2 minutes)")
    ap.add_argument("--only", default="ttlbroker,nats-server", help="origins to run: ttlbroker,nats-server")
    ap.add_argument("--quick", action="store_true", help="5,000 messages, 3 s steady")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.seconds = 5_000, 3.0
    env = environment()
    log_environment(env)
    watch = CpuWatch()
    fsync = args.sync
    results: dict[str, Any] = {}
    with Harness("replication") as h:
        origins = [o.strip() for o in args.only.split(",") if o.strip()]
        for origin in origins:
            osync = args.origin_sync or fsync
            log(f"origin: {origin}, sync {osync}; the copier: sync {fsync}")
            if origin == "ttlbroker":
                cm = h.ttlbroker(fsync="1s" if osync == "default" else osync, nats=True, config='[nats]\ndomain = "hub"\n')
            else:
                cm = h.nats(sync_interval=None if osync == "default" else osync, domain="hub")
            with cm as src:
                url = src.nats_url if origin == "ttlbroker" else f"nats://{src.host}:{src.port}"
                remote = f'[[nats.remotes]]\ndomain = "hub"\nurl = "{url}"\n'
                with h.ttlbroker(fsync=fsync, nats=True, config=remote) as copier:
                    results[origin] = run_uvloop(run_origin(url, copier.nats_url, copier.proc.pid, args))
        with h.ttlbroker(fsync=fsync, nats=True) as copier:
            own = run_uvloop(copier_publish_rate(copier.nats_url, args))
    others = watch.stop()

    rows = []
    for origin, r in results.items():
        rows += [
            [origin, "backlog → mirror", fmt_rate(r["backlog_mirror"].per_second), _us(r["backlog_mirror"])],
            [origin, "backlog → source", fmt_rate(r["backlog_source"].per_second), _us(r["backlog_source"])],
            [origin, "live: the origin accepts", fmt_rate(r["live_origin"].per_second), ""],
            [origin, "live: the copy", fmt_rate(r["live_copy"].per_second),
             f"caught up {r['live_catch_up_ms']:.0f} ms after the last PubAck; {_us(r['live_copy'])}"],
            _steady_row(origin, "steady {rate:,} msgs/s: stored at the origin → copied, p50 / p99 / max", r["steady"],
                        f"; the copier used {r['steady']['copier_cpu_share']:.0%} of a core"),
            _steady_row(origin, "  reference: the origin → its own push consumer (nats-py)", r["reference"], ""),
        ]
    rows.append(["(copier)", "its own publish_async", fmt_rate(own.per_second), "the bound on a copy's rate"])
    osync = f", the origins' {args.origin_sync}" if args.origin_sync else ""
    print(f"\nReplication into ttlbroker, sync {fsync}{osync}, {args.messages:,} messages of {args.size} B\n")
    print(format_table(["origin", "row", "value", "note"], rows, right=[2]))
    print()
    print_cpu_share(others)
    if args.json:
        def plain(v: Any) -> Any:
            return v.as_dict() if isinstance(v, Rate) else v

        data = {"benchmark": "replication", "environment": env, "args": vars(args), "other_cpu": others,
                "copier_publish_async": own.as_dict(),
                "results": {o: {k: plain(v) for k, v in r.items()} for o, r in results.items()}}
        path = write_json(args.json if os.path.isabs(args.json) else Path.cwd() / args.json, data)
        log(f"wrote {path} (results usually go in {RESULTS_DIR})")


if __name__ == "__main__":
    main()
