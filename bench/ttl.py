"""Per-message TTL: ttlbroker against nats-server (JetStream, ``allow_msg_ttl``).

What it measures, for N messages (``--messages``, default 1,000,000) of 128 bytes,
each on its own subject ``ttl.<i>``, one partition / one stream, published from
one connection on uvloop, with TTLs uniform over whole seconds in
``[--ttl-min, --ttl-max]`` (default 10..60 s, the same seeded draw for both
servers):

* **publish throughput without and with a TTL**. ttlbroker: ``publish_batch`` of
  1,000 messages, 4 batches in flight, the TTL in the binary TTL field (and once
  more with the TTL as a ``Nats-TTL`` header instead). nats: ``js.publish_async``
  with 1,000 in flight (nats-py has no batch publish), the TTL as the ``Nats-TTL``
  header (``msg_ttl=``).
* **expiry lag** (removal time minus deadline, real clock): the topic / stream has
  subject delete markers with a TTL of one hour, so every expiry appends a marker
  whose timestamp is the removal time. A second connection follows the log while
  publishing and records each message's stored timestamp (ttlbroker: ``fetch``
  from the next offset; nats: an ordered consumer, the timestamp from the
  message's metadata). Deadline = stored timestamp + TTL. Once everything has
  expired, all markers are read back; lag = marker timestamp - deadline. p50,
  p99, max (and min: a negative lag would be a message removed early).
* **RSS per pending TTL beyond payload**: the server's VmRSS after publishing the
  N messages with TTLs minus its VmRSS after publishing the same N messages
  without TTL (two fresh servers, same topic / stream configuration), divided by
  the TTLs pending when it was read. In this phase every TTL is shifted by S
  seconds (about twice the time the server took to publish N without TTL), so
  that nothing expires before the RSS is read.
* **CPU spent expiring**: in that same phase, once the RSS is read, the run waits
  until every message expired: the server's user+system CPU time
  (``/proc/PID/stat``) from the end of publishing until the last expiry, minus
  what the same server spends idle over as long (measured right after, polled
  the same way), per expired message. Writing the markers is included, on both
  servers. No reader is connected in this phase.

* **the same lag with P TTLs pending beside them** (``--pending P``, e.g. 1,000,000):
  before phase 3 publishes, P messages with TTLs of an hour or more (they never expire
  during the run) go to a second topic / stream (``pend.<i>``), and while phase 3
  runs a background publisher keeps adding more there at ``--publish-rate`` messages a
  second, until every lag message has expired. ttlbroker also reports, from its
  ``stats``, the longest event-loop stall (the longest batch of task steps between two
  looks at I/O and timers) and its garbage collections' total and longest pause,
  since it started (so the preload and phase 3 only: every phase has a fresh server).

Both servers get the same durability setting (``--sync``, default ``2m``:
ttlbroker ``--fsync 2m``, nats ``sync_interval: "2m"``, which is nats's own
default; ``always`` is possible but nats then publishes at a few thousand
messages a second). So that TTLs below the marker TTL are not raised to it
(ADR-43; docs/semantics.md §6.7), both have ``max_msgs_per_subject = 1``, which changes
nothing else here since every subject has one message.

Each server runs three times, fresh each time: (1) publish without TTL, RSS;
(2) publish with TTLs shifted by S, RSS, wait for every expiry (CPU); (3) publish
with the TTLs as drawn while a reader follows, wait for every expiry, read the
markers (lag). The wall time is dominated by the waits (S + ``--ttl-max``, then
``--ttl-max``) and, for nats, by nats-py's publish rate. Run from
the repository root::

    .venv/bin/python bench/ttl.py              # 1,000,000 messages, TTL 10..60 s: ~11 minutes
    .venv/bin/python bench/ttl.py --quick      # 20,000 messages, TTL 2..5 s: < 1 minute
    .venv/bin/python bench/ttl.py --lag-only --pending 1000000   # phase 3 beside 1M pending TTLs
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import time
from array import array
from collections.abc import Awaitable, Callable
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
    Server,
    environment,
    fmt_ratio,
    format_table,
    log,
    run_uvloop,
    write_json,
    log_environment,
)

PAYLOAD = random.Random(0).randbytes(128)
BATCH = 1000  # messages per publish_batch (ttlbroker)
BATCHES_IN_FLIGHT = 4
WINDOW = 1000  # publish_async in flight (nats)
PAGE = 1000  # messages per fetch
PENDING_TOPIC = "pending"  # ttlbroker topic (and nats stream PEND) of --pending
PENDING_FILTER = "pend.>"
NATS_PENDING_STREAM = "PEND"
BACKGROUND_PERIOD = 0.02  # seconds between the background publisher's batches
WARMUP = 1000  # messages without TTL published first on every server (not timed)
MARKER_TTL = 3600  # seconds: markers outlive the benchmark
HEADER_SHIFT = 3600  # added to the TTLs of the Nats-TTL header publish, so nothing expires
POLL = 0.5  # seconds between pending-expiry polls
MARKER_HDR = "Nats-Marker-Reason"

STREAM = "ttl"  # ttlbroker stream
TOPIC = "expiry"  # ttlbroker topic
NATS_STREAM = "TTL"
FILTER = "ttl.>"


def index_of(subj: str) -> int | None:
    """``ttl.<i>`` -> i; None for anything else (``ttl.warm.<i>``)."""
    tail = subj[4:]
    return int(tail) if tail.isdigit() else None


# -- results ----------------------------------------------------------------------------


@dataclass
class Publish:
    messages: int = 0
    errors: int = 0
    seconds: float = 0.0
    last: int = 0  # highest offset / stream sequence acknowledged
    server_cpu: float = 0.0  # the server's user+sys CPU seconds during the phase

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_cpu_us(self) -> float | None:
        return self.server_cpu / self.messages * 1e6 if self.messages else None


@dataclass
class Window:
    """The server's CPU from the end of publishing until every message expired, and
    its idle CPU over a window of the same length measured right after."""

    expired_before: int = 0  # expired while publishing (not in the window)
    expired_in: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    idle_seconds: float = 0.0
    idle_cpu: float = 0.0
    all_expired: bool = False

    @property
    def cpu_expiring(self) -> float | None:
        if not self.seconds:
            return None
        idle_rate = self.idle_cpu / self.idle_seconds if self.idle_seconds else 0.0
        return max(0.0, self.cpu - idle_rate * self.seconds)

    @property
    def per_expired_us(self) -> float | None:
        cpu = self.cpu_expiring
        return None if cpu is None or not self.expired_in else cpu / self.expired_in * 1e6


@dataclass
class Side:
    """Everything measured on one server kind."""

    # phase 1: no TTL
    publish_plain: Publish | None = None
    rss_empty: ProcUsage | None = None  # after the warm-up, before publishing
    rss_plain: ProcUsage | None = None
    publish_ttl_header: Publish | None = None  # ttlbroker only: TTL as a Nats-TTL header
    # phase 2: TTLs shifted by `shift`, RSS, expiry CPU
    shift: int = 0
    publish_ttl: Publish | None = None
    rss_ttl: ProcUsage | None = None
    pending_at_rss: int = 0
    window: Window | None = None
    # phase 3: TTLs as drawn, a reader following, lag
    publish_lag_run: Publish | None = None
    timestamps_seen: int = 0
    ttl_mismatches: int = 0
    lag_window: Window | None = None  # CPU of the lag run (markers and reader included; no idle baseline)
    markers_read: int = 0
    markers_wrong_reason: int = 0
    lag: dict[str, float] = field(default_factory=dict)
    server_stats: dict[str, Any] = field(default_factory=dict)
    # --pending: the preload and the background publisher of phase 3
    publish_pending: Publish | None = None
    background: Publish | None = None

    @property
    def rss_per_ttl(self) -> float | None:
        if not (self.rss_plain and self.rss_ttl and self.pending_at_rss):
            return None
        return (self.rss_ttl.rss - self.rss_plain.rss) / self.pending_at_rss

    @property
    def rss_anon_per_ttl(self) -> float | None:
        if not (self.rss_plain and self.rss_ttl and self.pending_at_rss):
            return None
        return (self.rss_ttl.rss_anon - self.rss_plain.rss_anon) / self.pending_at_rss

    @property
    def rss_per_message(self) -> float | None:
        if not (self.rss_plain and self.rss_empty and self.publish_plain and self.publish_plain.messages):
            return None
        return (self.rss_plain.rss - self.rss_empty.rss) / self.publish_plain.messages

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("publish_plain", "publish_ttl", "publish_ttl_header", "publish_lag_run", "publish_pending", "background"):
            p = getattr(self, k)
            if p is not None:
                d[k].update(msgs_per_s=round(p.per_second, 1), server_cpu_us_per_msg=p.server_cpu_us)
        for k in ("window", "lag_window"):
            w = getattr(self, k)
            if w is not None:
                d[k].update(cpu_expiring_s=w.cpu_expiring, cpu_per_expired_us=w.per_expired_us)
        d.update(rss_per_pending_ttl_bytes=self.rss_per_ttl, rss_anon_per_pending_ttl_bytes=self.rss_anon_per_ttl,
                 rss_per_stored_message_bytes=self.rss_per_message)
        return d


def lag_stats(lags_ns: list[int]) -> dict[str, float]:
    """Percentiles (nearest rank) of the lags, in milliseconds."""
    if not lags_ns:
        return {}
    lags_ns.sort()
    n = len(lags_ns)

    def pct(p: float) -> float:
        return lags_ns[min(n - 1, max(0, math.ceil(p * n) - 1))] / 1e6

    return {
        "samples": n,
        "min_ms": lags_ns[0] / 1e6,
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": lags_ns[-1] / 1e6,
        "mean_ms": sum(lags_ns) / n / 1e6,
        "early": sum(1 for x in lags_ns if x < 0),
        "over_100ms": sum(1 for x in lags_ns if x > 100_000_000),
        "over_1s": sum(1 for x in lags_ns if x > 1_000_000_000),
    }


def draw_ttls(n: int, lo: int, hi: int, seed: int = 1) -> array:
    rnd = random.Random(seed)
    return array("I", (rnd.randint(lo, hi) for _ in range(n)))


def shift_for(plain: Publish | None, args: argparse.Namespace) -> int:
    """Seconds added to every TTL in phase 2: publishing with TTLs may take up to about
    twice as long as without, then the RSS is read after ``--settle`` seconds; the
    first deadline must come after that."""
    took = plain.seconds if plain else 0.0
    return max(0, math.ceil(2 * took + args.settle + 2 - args.ttl_min))


async def settle_usage(server: Server, seconds: float) -> ProcUsage:
    """The server's usage after ``seconds`` of quiet (lets buffers and GC settle)."""
    await asyncio.sleep(seconds)
    return server.usage()


def _log_publish(label: str, out: Publish) -> None:
    err = f", {out.errors:,} ERRORS" if out.errors else ""
    log(f"  {label}: {out.messages:,} msgs in {out.seconds:.2f} s = {out.per_second:,.0f} msgs/s "
        f"(server CPU {out.server_cpu:.2f} s){err}")


# -- the expiry window (both servers) ------------------------------------------------------


async def wait_for_expiry(server: Server, n: int, expired: Callable[[], Awaitable[int]], wait_limit: float,
                          idle_seconds: float) -> Window:
    """From now (the end of publishing) until ``expired()`` reaches ``n``: the server's
    CPU; then, if ``idle_seconds``, as long again idle (at most ``idle_seconds``),
    polled the same way, for the baseline."""
    w = Window()
    u0 = server.usage()
    e0 = await expired()
    w.expired_before = e0
    limit = u0.at + wait_limit
    log(f"  waiting for expiry: {e0:,} of {n:,} expired already; giving up after {wait_limit:.0f} s")
    next_log = time.monotonic() + 5
    e = e0
    while True:
        e = await expired()
        if e >= n:
            w.all_expired = True
            break
        now = time.monotonic()
        if now > limit:
            log(f"  TIMEOUT: only {e:,} of {n:,} expired {wait_limit:.0f} s after publishing")
            break
        if now >= next_log:
            next_log = now + 5
            log(f"    expiring: {e:,}/{n:,} expired, {n - e:,} pending, {now - u0.at:.0f} s after publishing")
        await asyncio.sleep(POLL)
    u1 = server.usage()
    w.seconds, w.cpu, w.expired_in = u1.at - u0.at, u1.cpu - u0.cpu, e - e0
    log(f"  expiry window: {w.expired_in:,} expired in {w.seconds:.1f} s, server CPU {w.cpu:.2f} s")
    if idle_seconds > 0:
        idle = min(idle_seconds, max(1.0, w.seconds))
        i0 = server.usage()
        while time.monotonic() - i0.at < idle:
            await expired()
            await asyncio.sleep(POLL)
        i1 = server.usage()
        w.idle_seconds, w.idle_cpu = i1.at - i0.at, i1.cpu - i0.cpu
        log(f"  idle baseline: {w.idle_cpu:.2f} s CPU in {w.idle_seconds:.1f} s; "
            f"CPU spent expiring {w.cpu_expiring:.2f} s = {w.per_expired_us or 0:.1f} us per expired message")
    return w


def lag_limit(args: argparse.Namespace) -> float:
    return args.ttl_max + args.expiry_timeout


async def publish_in_background(send: Callable[[int, int], Awaitable[int]], rate: float, stop: asyncio.Event) -> Publish:
    """``rate`` messages a second, a batch every ``BACKGROUND_PERIOD``, until ``stop``:
    ``send(first, count)`` publishes ``pend.bg.<first>`` ... and returns how many
    were refused or failed."""
    out = Publish()
    per = max(1, round(rate * BACKGROUND_PERIOD))
    t0 = next_at = time.perf_counter()
    while not stop.is_set():
        errors = await send(out.messages + out.errors, per)
        out.errors += errors
        out.messages += per - errors
        next_at += BACKGROUND_PERIOD
        delay = next_at - time.perf_counter()
        if delay > 0:
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass
    out.seconds = time.perf_counter() - t0
    log(f"  background: {out.messages:,} msgs in {out.seconds:.1f} s = {out.per_second:,.0f} msgs/s"
        + (f", {out.errors:,} ERRORS" if out.errors else ""))
    return out


def pending_ttls(args: argparse.Namespace) -> array:
    """The preload's TTLs: an hour and more, so none expires during the run."""
    return array("I", (t + HEADER_SHIFT for t in draw_ttls(args.pending, args.ttl_min, args.ttl_max, seed=2)))


# -- ttlbroker ---------------------------------------------------------------------------


async def tb_setup(c: Any, topic: str = TOPIC, filt: str = FILTER) -> None:
    if not any(s.name == STREAM for s in await c.list_streams()):
        await c.create_stream(STREAM)
    await c.create_topic(
        STREAM, topic, partitions=1, message_expiry=0, subjects=[filt],
        allow_msg_ttl=True, subject_delete_marker_ttl=MARKER_TTL, allow_rollup=True, max_msgs_per_subject=1,
    )


async def tb_warmup(c: Any) -> None:
    (await c.publish_batch([(f"ttl.warm.{i}", PAYLOAD) for i in range(WARMUP)])).raise_for_errors()


async def tb_publish(server: Server, c: Any, n: int, ttls: array | None, label: str, shift: int = 0,
                     header: bool = False, prefix: str = "ttl") -> Publish:
    """Publish ``n`` messages in batches of ``BATCH``, ``BATCHES_IN_FLIGHT`` in flight."""
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(BATCHES_IN_FLIGHT)
    pending: set[asyncio.Task[Any]] = set()
    out = Publish()
    progress = Progress(label, n)

    def done(t: asyncio.Task[Any]) -> None:
        pending.discard(t)
        sem.release()
        if t.cancelled() or t.exception() is not None:
            out.errors += BATCH
            if out.errors == BATCH:
                log(f"    first error: {t.exception() if not t.cancelled() else 'cancelled'!r}")
            return
        acks = t.result()
        bad = len(acks.errors)
        if bad and out.errors == 0:
            log(f"    first refused message: {next(iter(acks.errors.values()))}")
        out.errors += bad
        out.messages += len(acks) - bad
        out.last = max(out.last, max(acks.offsets))

    u0 = server.usage()
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        await sem.acquire()
        end = min(n, start + BATCH)
        if ttls is None:
            msgs = [(f"{prefix}.{i}", PAYLOAD) for i in range(start, end)]
        elif header:
            msgs = [(f"{prefix}.{i}", PAYLOAD, {"Nats-TTL": str(ttls[i] + shift)}) for i in range(start, end)]
        else:
            msgs = [(f"{prefix}.{i}", PAYLOAD, None, ttls[i] + shift) for i in range(start, end)]
        t = loop.create_task(c.publish_batch(msgs))
        pending.add(t)
        t.add_done_callback(done)
        progress.update(out.messages)
    if pending:
        await asyncio.wait(pending)
    out.seconds = time.perf_counter() - t0
    out.server_cpu = server.usage().cpu - u0.cpu
    _log_publish(label, out)
    return out


async def tb_plain(server: Server, n: int, ttls: array, side: Side, args: argparse.Namespace) -> None:
    """Phase 1: publish N without TTL, read the RSS; then (throughput only, on a second
    topic) N with the TTL as a Nats-TTL header."""
    from broker.client import aio

    async with aio.connect(server.address, name="bench-ttl") as c:
        await tb_setup(c)
        await tb_warmup(c)
        side.rss_empty = await settle_usage(server, args.settle)
        side.publish_plain = await tb_publish(server, c, n, None, "publish_batch, no TTL")
        side.rss_plain = await settle_usage(server, args.settle)
        await tb_setup(c, "header", "hdr.>")
        side.publish_ttl_header = await tb_publish(server, c, n, ttls, "publish_batch, TTL as Nats-TTL header",
                                                   shift=HEADER_SHIFT, header=True, prefix="hdr")


async def tb_pending(server: Server, n: int, ttls: array, side: Side, args: argparse.Namespace) -> None:
    """Phase 2: publish N with TTLs + shift, read the RSS, wait for every expiry (CPU)."""
    from broker.client import aio

    async with aio.connect(server.address, name="bench-ttl") as c:
        await tb_setup(c)
        await tb_warmup(c)
        side.publish_ttl = await tb_publish(server, c, n, ttls, f"publish_batch, TTL field (+{side.shift} s)",
                                            shift=side.shift)
        t_end = time.monotonic()
        side.rss_ttl = await settle_usage(server, args.settle)
        st = await c.stats()
        side.pending_at_rss = st["pending_expiries"]
        if st["expired_ttl"]:
            log(f"  note: {st['expired_ttl']:,} expired before the RSS was read (S too small)")

        async def expired() -> int:
            return (await c.stats())["expired_ttl"]

        limit = side.shift + lag_limit(args) - (time.monotonic() - t_end)
        side.window = await wait_for_expiry(server, side.publish_ttl.messages, expired, limit, args.idle_seconds)


async def tb_lag(server: Server, n: int, ttls: array, side: Side, args: argparse.Namespace) -> None:
    """Phase 3: publish N with TTLs while a reader records the stored timestamps, wait
    for every expiry, then read the markers back (lag)."""
    from broker.client import aio

    ts = array("q", bytes(8 * n))
    state = {"publishing": True, "last": 0}

    async def follow(r: Any) -> None:
        offset, seen, mismatched = 1, 0, 0
        while True:
            page = await r.fetch(STREAM, TOPIC, 0, offset, PAGE)
            for m in page.messages:
                if m.is_marker:
                    continue
                i = index_of(m.subject)
                if i is not None and i < n:
                    ts[i] = m.timestamp
                    seen += 1
                    if m.ttl != ttls[i]:
                        mismatched += 1
            offset = max(offset, page.next_offset)
            if not page.messages:
                if not state["publishing"] and offset > state["last"]:
                    break
                await asyncio.sleep(0.005)
        side.timestamps_seen, side.ttl_mismatches = seen, mismatched

    async with aio.connect(server.address, name="bench-ttl") as c, \
            aio.connect(server.address, name="bench-ttl-reader") as r, \
            aio.connect(server.address, name="bench-ttl-background") as b:
        await tb_setup(c)
        await tb_warmup(c)
        stop = asyncio.Event()
        background = None
        if args.pending:
            await tb_setup(c, PENDING_TOPIC, PENDING_FILTER)
            side.publish_pending = await tb_publish(server, c, args.pending, pending_ttls(args),
                                                    f"publish_batch, {args.pending:,} TTLs of an hour to stay pending",
                                                    prefix="pend")

            async def send(first: int, count: int) -> int:
                acks = await b.publish_batch([(f"pend.bg.{i}", PAYLOAD, None, HEADER_SHIFT)
                                              for i in range(first, first + count)])
                return len(acks.errors)

            background = asyncio.create_task(publish_in_background(send, args.publish_rate, stop))
        side.server_stats["pending_at_start"] = (await c.stats())["pending_expiries"]
        reader = asyncio.create_task(follow(r))
        try:
            side.publish_lag_run = await tb_publish(server, c, n, ttls, "publish_batch, TTL field, reader following")
        finally:
            state["publishing"] = False
        state["last"] = side.publish_lag_run.last
        await asyncio.wait_for(reader, timeout=120)
        log(f"  recorded {side.timestamps_seen:,} stored timestamps")

        async def expired() -> int:
            return (await c.stats())["expired_ttl"]

        side.lag_window = await wait_for_expiry(server, side.publish_lag_run.messages, expired, lag_limit(args), 0)
        stop.set()
        if background is not None:
            side.background = await background

        lags: list[int] = []
        progress = Progress("reading markers", n)
        offset, markers, wrong = 1, 0, 0
        while True:
            page = await r.fetch(STREAM, TOPIC, 0, offset, PAGE)
            for m in page.messages:
                if not m.is_marker:
                    continue
                markers += 1
                if m.marker_reason.name != "MAX_AGE":
                    wrong += 1
                i = index_of(m.subject)
                if i is not None and i < n and ts[i]:
                    lags.append(m.timestamp - (ts[i] + ttls[i] * 1_000_000_000))
            progress.update(markers)
            offset = max(offset, page.next_offset)
            if not page.messages and offset > page.last_offset:
                break
        side.markers_read, side.markers_wrong_reason = markers, wrong
        side.lag = lag_stats(lags)
        st = await c.stats()
        side.server_stats.update({k: st.get(k) for k in (
            "expired_ttl", "markers", "pending_expiries", "expiry_passes", "expiry_lag_max_ms", "messages",
            "publish_errors", "loop_stall_max_ms", "gc_collections", "gc_pause_total_ms", "gc_pause_max_ms")})
        log(f"  {markers:,} markers read, {len(lags):,} lags: p50 {side.lag.get('p50_ms', 0):.1f} ms, "
            f"max {side.lag.get('max_ms', 0):.1f} ms; the server says expiry_lag_max_ms="
            f"{st.get('expiry_lag_max_ms')} over {st.get('expiry_passes')} passes, loop stall max "
            f"{st.get('loop_stall_max_ms')} ms, {st.get('gc_collections')} garbage collections: "
            f"{st.get('gc_pause_total_ms')} ms in all, {st.get('gc_pause_max_ms')} ms the longest")


# -- nats -----------------------------------------------------------------------------------


def js_meta(reply: str) -> tuple[int, int]:
    """(stream sequence, timestamp ns) from a JetStream message's reply subject."""
    t = reply.split(".")
    if len(t) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
        return int(t[5]), int(t[7])
    return int(t[7]), int(t[9])  # v2: with domain and account hash


async def nats_connect(url: str, name: str) -> Any:
    import nats

    return await nats.connect(url, name=name, allow_reconnect=False)


async def nats_setup(js: Any, name: str = NATS_STREAM, filt: str = FILTER) -> None:
    from nats.js.api import StorageType, StreamConfig

    await js.add_stream(StreamConfig(
        name=name, subjects=[filt], storage=StorageType.FILE, allow_msg_ttl=True,
        subject_delete_marker_ttl=MARKER_TTL, allow_rollup_hdrs=True, max_msgs_per_subject=1,
    ))


async def nats_warmup(js: Any) -> None:
    for i in range(WARMUP):
        await js.publish_async(f"ttl.warm.{i}", PAYLOAD)
    await js.publish_async_completed()


async def nats_publish(server: Server, js: Any, n: int, ttls: array | None, label: str, shift: int = 0,
                       prefix: str = "ttl") -> Publish:
    """``js.publish_async`` with ``WINDOW`` unacknowledged at most."""
    out = Publish()
    progress = Progress(label, n)

    def on_ack(f: asyncio.Future[Any]) -> None:
        if f.cancelled() or f.exception() is not None:
            out.errors += 1
            if out.errors == 1:
                log(f"    first error: {f.exception() if not f.cancelled() else 'cancelled'!r}")
        else:
            out.messages += 1
            seq = f.result().seq
            out.last = max(out.last, seq)

    u0 = server.usage()
    t0 = time.perf_counter()
    publish = js.publish_async
    for i in range(n):
        if ttls is None:
            fut = await publish(f"{prefix}.{i}", PAYLOAD)
        else:
            fut = await publish(f"{prefix}.{i}", PAYLOAD, msg_ttl=ttls[i] + shift)
        fut.add_done_callback(on_ack)
        if not i & 1023:
            progress.update(out.messages)
    await js.publish_async_completed()
    await asyncio.sleep(0)  # let the last done-callbacks run
    out.seconds = time.perf_counter() - t0
    out.server_cpu = server.usage().cpu - u0.cpu
    _log_publish(label, out)
    return out


def nats_expired_counter(js: Any, published: int) -> Callable[[], Awaitable[int]]:
    """Every expiry appends one marker (each subject holds one message), so the
    sequences beyond the ``published`` messages count the expiries so far."""

    async def expired() -> int:
        return (await js.stream_info(NATS_STREAM)).state.last_seq - published

    return expired


async def nats_plain(server: Server, n: int, ttls: array, side: Side, args: argparse.Namespace) -> None:
    nc = await nats_connect(server.url, "bench-ttl")
    try:
        js = nc.jetstream(publish_async_max_pending=WINDOW, timeout=30)
        await nats_setup(js)
        await nats_warmup(js)
        side.rss_empty = await settle_usage(server, args.settle)
        side.publish_plain = await nats_publish(server, js, n, None, "publish_async, no TTL")
        side.rss_plain = await settle_usage(server, args.settle)
    finally:
        await nc.close()


async def nats_pending(server: Server, n: int, ttls: array, side: Side, args: argparse.Namespace) -> None:
    nc = await nats_connect(server.url, "bench-ttl")
    try:
        js = nc.jetstream(publish_async_max_pending=WINDOW, timeout=30)
        await nats_setup(js)
        await nats_warmup(js)
        side.publish_ttl = await nats_publish(server, js, n, ttls, f"publish_async, Nats-TTL header (+{side.shift} s)",
                                              shift=side.shift)
        t_end = time.monotonic()
        side.rss_ttl = await settle_usage(server, args.settle)
        expired = nats_expired_counter(js, WARMUP + side.publish_ttl.messages)
        early = await expired()
        side.pending_at_rss = side.publish_ttl.messages - early
        if early:
            log(f"  note: {early:,} expired before the RSS was read (S too small)")
        limit = side.shift + lag_limit(args) - (time.monotonic() - t_end)
        side.window = await wait_for_expiry(server, side.publish_ttl.messages, expired, limit, args.idle_seconds)
    finally:
        await nc.close()


async def nats_lag(server: Server, n: int, ttls: array, side: Side, args: argparse.Namespace) -> None:
    nc = await nats_connect(server.url, "bench-ttl")
    nr = await nats_connect(server.url, "bench-ttl-reader")
    try:
        js = nc.jetstream(publish_async_max_pending=WINDOW, timeout=30)
        jr = nr.jetstream(timeout=30)
        await nats_setup(js)
        await nats_warmup(js)

        ts = array("q", bytes(8 * n))
        st = {"max_seq": 0, "last": 0, "seen": 0}
        caught_up = asyncio.Event()

        async def on_msg(msg: Any) -> None:
            seq, t = js_meta(msg.reply)
            st["max_seq"] = max(st["max_seq"], seq)
            hdr = msg.headers
            if not (hdr and MARKER_HDR in hdr):
                i = index_of(msg.subject)
                if i is not None and i < n:
                    ts[i] = t
                    st["seen"] += 1
            if st["last"] and st["max_seq"] >= st["last"]:
                caught_up.set()

        stop = asyncio.Event()
        background = None
        if args.pending:
            await nats_setup(js, NATS_PENDING_STREAM, PENDING_FILTER)
            side.publish_pending = await nats_publish(server, js, args.pending, pending_ttls(args),
                                                      f"publish_async, {args.pending:,} TTLs of an hour to stay pending",
                                                      prefix="pend")

            async def send(first: int, count: int) -> int:
                futs = [await js.publish_async(f"pend.bg.{i}", PAYLOAD, msg_ttl=HEADER_SHIFT)
                        for i in range(first, first + count)]
                done = await asyncio.gather(*futs, return_exceptions=True)
                return sum(isinstance(d, BaseException) for d in done)

            background = asyncio.create_task(publish_in_background(send, args.publish_rate, stop))
            side.server_stats["pending_at_start"] = (await js.stream_info(NATS_PENDING_STREAM)).state.messages
        sub = await jr.subscribe(FILTER, stream=NATS_STREAM, ordered_consumer=True, cb=on_msg)
        side.publish_lag_run = await nats_publish(server, js, n, ttls, "publish_async, Nats-TTL header, reader following")
        st["last"] = side.publish_lag_run.last
        if st["max_seq"] >= st["last"]:
            caught_up.set()
        try:
            await asyncio.wait_for(caught_up.wait(), timeout=120)
        except TimeoutError:
            log(f"  the reader did not catch up: sequence {st['max_seq']:,} of {st['last']:,}")
        await sub.unsubscribe()
        side.timestamps_seen = st["seen"]
        log(f"  recorded {side.timestamps_seen:,} stored timestamps")

        expired = nats_expired_counter(js, WARMUP + side.publish_lag_run.messages)
        side.lag_window = await wait_for_expiry(server, side.publish_lag_run.messages, expired, lag_limit(args), 0)
        stop.set()
        if background is not None:
            side.background = await background

        # Read every marker back, from the start (the expired messages are gone).
        info = await js.stream_info(NATS_STREAM)
        target = info.state.messages
        lags: list[int] = []
        counts = {"got": 0, "markers": 0, "wrong": 0}
        finished = asyncio.Event()
        progress = Progress("reading markers", target)

        async def on_marker(msg: Any) -> None:
            counts["got"] += 1
            hdr = msg.headers
            reason = hdr.get(MARKER_HDR) if hdr else None
            if reason is not None:
                counts["markers"] += 1
                if reason != "MaxAge":
                    counts["wrong"] += 1
                i = index_of(msg.subject)
                if i is not None and i < n and ts[i]:
                    lags.append(js_meta(msg.reply)[1] - (ts[i] + ttls[i] * 1_000_000_000))
            if counts["got"] >= target:
                finished.set()
            elif not counts["got"] & 1023:
                progress.update(counts["got"])

        sub = await jr.subscribe(FILTER, stream=NATS_STREAM, ordered_consumer=True, cb=on_marker)
        last = -1
        while not finished.is_set():
            try:
                await asyncio.wait_for(finished.wait(), timeout=30)
            except TimeoutError:
                if counts["got"] == last:
                    log(f"  reading markers stalled at {counts['got']:,} of {target:,}")
                    break
                last = counts["got"]
        await sub.unsubscribe()
        side.markers_read, side.markers_wrong_reason = counts["markers"], counts["wrong"]
        side.lag = lag_stats(lags)
        side.server_stats.update(messages=info.state.messages, last_seq=info.state.last_seq)
        log(f"  {counts['markers']:,} markers read, {len(lags):,} lags: p50 {side.lag.get('p50_ms', 0):.1f} ms, "
            f"max {side.lag.get('max_ms', 0):.1f} ms")
    finally:
        await nr.close()
        await nc.close()


# -- report ---------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 0) -> str:
    return "" if v is None else f"{v:,.{digits}f}"


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _mib(u: ProcUsage | None) -> float | None:
    return u.rss / 2**20 if u else None


def _count(a: int | None, n: int | None) -> str:
    return "" if a is None or not n else f"{a:,} / {n:,}"


def report(results: dict[str, Side], args: argparse.Namespace) -> str:
    tb, nt = results.get("ttlbroker", Side()), results.get("nats", Side())
    rows: list[list[str]] = []

    def row(what: str, a: float | None, b: float | None, better: str, digits: int = 0, ratio: bool = True) -> None:
        rows.append([what, _f(a, digits), _f(b, digits), fmt_ratio(a, b) if ratio else "", better])

    def rate(p: Publish | None) -> float | None:
        return p.per_second if p else None

    def cpu_us(p: Publish | None) -> float | None:
        return p.server_cpu_us if p else None

    def win(s: Side, attr: str) -> Any:
        return getattr(s.window, attr) if s.window else None

    def published(s: Side) -> int | None:
        return s.publish_lag_run.messages if s.publish_lag_run else None

    row("publish, no TTL (msgs/s) [1]", rate(tb.publish_plain), rate(nt.publish_plain), "higher")
    row("publish, TTL on every message (msgs/s) [1]", rate(tb.publish_ttl), rate(nt.publish_ttl), "higher")
    if tb.publish_ttl_header:
        row("publish, TTL as Nats-TTL header (msgs/s) [2]", rate(tb.publish_ttl_header), rate(nt.publish_ttl), "higher")
    row("  with TTL / without TTL", _div(rate(tb.publish_ttl), rate(tb.publish_plain)),
        _div(rate(nt.publish_ttl), rate(nt.publish_plain)), "higher", 2, ratio=False)
    row("  server CPU per message published, no TTL (us)", cpu_us(tb.publish_plain), cpu_us(nt.publish_plain), "lower", 1)
    row("  server CPU per message published, TTL (us)", cpu_us(tb.publish_ttl), cpu_us(nt.publish_ttl), "lower", 1)
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        row(f"expiry lag {label} (ms) [3]", tb.lag.get(key), nt.lag.get(key), "lower", 1)
    row("  expiry lag min (ms; < 0 = removed early)", tb.lag.get("min_ms"), nt.lag.get("min_ms"), "", 1, ratio=False)
    rows.append(["  lags measured / messages", _count(tb.lag.get("samples"), published(tb)),
                 _count(nt.lag.get("samples"), published(nt)), "", ""])
    if args.pending:
        row("  TTLs pending beside them, at the start [6]", tb.server_stats.get("pending_at_start"),
            nt.server_stats.get("pending_at_start"), "", ratio=False)
        row("  background publishing meanwhile (msgs/s) [6]", rate(tb.background), rate(nt.background), "", ratio=False)
    stats = tb.server_stats
    row("  longest event-loop stall (ms) [7]", stats.get("loop_stall_max_ms"), None, "lower", 1, ratio=False)
    row("  garbage collections [7]", stats.get("gc_collections"), None, "", ratio=False)
    row("  GC pauses in all (ms) [7]", stats.get("gc_pause_total_ms"), None, "lower", 1, ratio=False)
    row("  longest GC pause (ms) [7]", stats.get("gc_pause_max_ms"), None, "lower", 1, ratio=False)
    row("RSS, N stored without TTL (MiB)", _mib(tb.rss_plain), _mib(nt.rss_plain), "lower", 1)
    row("RSS, N stored with TTLs pending (MiB)", _mib(tb.rss_ttl), _mib(nt.rss_ttl), "lower", 1)
    row("RSS per pending TTL beyond payload (bytes) [4]", tb.rss_per_ttl, nt.rss_per_ttl, "lower")
    row("  RSS per stored message, no TTL (bytes)", tb.rss_per_message, nt.rss_per_message, "lower")
    row("CPU spent expiring N messages (s, user+sys) [5]", win(tb, "cpu_expiring"), win(nt, "cpu_expiring"), "lower", 2)
    row("  per expired message (us)", win(tb, "per_expired_us"), win(nt, "per_expired_us"), "lower", 1)
    rows.append(["  expired in the window / messages",
                 _count(win(tb, "expired_in"), tb.publish_ttl.messages if tb.publish_ttl else None),
                 _count(win(nt, "expired_in"), nt.publish_ttl.messages if nt.publish_ttl else None), "", ""])
    text = format_table(["measurement", "ttlbroker", "nats-server", "ttlbroker / nats", "better"], rows,
                        right=(1, 2, 3))
    shifts = ", ".join(f"{name} {s.shift} s" for name, s in results.items() if s.publish_ttl)
    text += (
        f"\n\n[1] ttlbroker: publish_batch of {BATCH:,} messages, {BATCHES_IN_FLIGHT} in flight, the TTL in the binary"
        f" field; nats: js.publish_async, {WINDOW:,} in flight, the TTL as a Nats-TTL header (nats-py has no batch"
        f" publish). Each subject once. TTLs {args.ttl_min}..{args.ttl_max} s plus S ({shifts}) in this phase."
        f"\n[2] ttlbroker with the TTL sent as a Nats-TTL header instead of the field; the nats column repeats [1]."
        f"\n[3] marker timestamp - (stored timestamp + TTL), TTLs {args.ttl_min}..{args.ttl_max} s, a separate run"
        " with a reader following the publisher (which slows publishing)."
        f"\n[4] (RSS with N TTLs pending - RSS with N messages without TTL) / N, after {args.settle:g} s of quiet."
        "\n[5] server CPU from the end of publishing until the last expiry, minus the same server's idle CPU over"
        " as long; includes writing one subject delete marker per expired message."
        f"\n[6] --pending {args.pending:,}: TTLs of an hour and more published to a second topic (nats: stream) before"
        f" [3], and more at --publish-rate {args.publish_rate:,.0f} msgs/s until the last expiry of [3]."
        "\n[7] ttlbroker's stats at the end of [3] (a fresh server: its warm-up, the preload of [6] and [3]):"
        " the longest batch of task steps between two looks at I/O and timers, and gc.callbacks' timings."
    )
    problems = []
    for name, s in results.items():
        for key in ("publish_plain", "publish_ttl", "publish_ttl_header", "publish_lag_run"):
            p = getattr(s, key)
            if p is not None and p.errors:
                problems.append(f"{name} {key}: {p.errors:,} messages refused or failed")
        for key in ("window", "lag_window"):
            w = getattr(s, key)
            if w is not None and not w.all_expired:
                problems.append(f"{name}: not every message expired in time ({key})")
        if s.lag.get("early"):
            problems.append(f"{name}: {s.lag['early']:,} messages removed BEFORE their deadline")
        if s.ttl_mismatches:
            problems.append(f"{name}: {s.ttl_mismatches:,} messages stored with a TTL other than the one sent")
        if s.markers_wrong_reason:
            problems.append(f"{name}: {s.markers_wrong_reason:,} markers with a reason other than MaxAge")
        if s.publish_lag_run and s.markers_read != s.publish_lag_run.messages:
            problems.append(f"{name}: {s.markers_read:,} markers for {s.publish_lag_run.messages:,} expired messages")
        if s.background is not None and s.background.errors:
            problems.append(f"{name} background: {s.background.errors:,} messages refused or failed")
        if s.publish_lag_run and s.timestamps_seen != s.publish_lag_run.messages:
            problems.append(f"{name}: the reader saw {s.timestamps_seen:,} of {s.publish_lag_run.messages:,} messages")
    if problems:
        text += "\n\nPROBLEMS: " + "; ".join(problems)
    return text


def problems_found(results: dict[str, Side]) -> bool:
    for s in results.values():
        pubs = (s.publish_plain, s.publish_ttl, s.publish_ttl_header, s.publish_lag_run)
        if any(p is not None and p.errors for p in pubs):
            return True
        if any(w is not None and not w.all_expired for w in (s.window, s.lag_window)):
            return True
        if s.lag.get("early"):
            return True
    return False


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=None, metavar="N",
                   help="messages per phase (default 1,000,000; 20,000 with --quick)")
    p.add_argument("--ttl-min", type=int, default=None, metavar="S", help="shortest TTL, seconds (default 10; 2 with --quick)")
    p.add_argument("--ttl-max", type=int, default=None, metavar="S", help="longest TTL, seconds (default 60; 5 with --quick)")
    p.add_argument("--sync", default="2m",
                   help="durability on both servers: 'always' (ttlbroker --fsync always, nats sync_interval: always) "
                        "or an interval such as 2m or 200ms (default 2m, nats's own default)")
    p.add_argument("--only", choices=("ttlbroker", "nats"), help="run one side only")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds of quiet before reading RSS (default 3; 1 with --quick)")
    p.add_argument("--idle-seconds", type=float, default=None,
                   help="longest idle CPU baseline after the expiry window (default 20; 3 with --quick)")
    p.add_argument("--expiry-timeout", type=float, default=60.0,
                   help="stop waiting this many seconds after the last deadline could be (default 60)")
    p.add_argument("--pending", type=int, default=0, metavar="P",
                   help="measure the expiry lag with P more TTLs (of an hour) pending on a second topic, and publishing "
                        "going on there meanwhile (e.g. 1000000; default 0)")
    p.add_argument("--publish-rate", type=float, default=5000.0, metavar="R",
                   help="with --pending: messages a second the background publisher adds while the lag is measured "
                        "(default 5,000)")
    p.add_argument("--lag-only", action="store_true", help="run the expiry lag phase (3/3) only")
    p.add_argument("--quick", action="store_true", help="a smoke test: 20,000 messages, TTL 2..5 s, < 1 minute")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (e.g. bench/results/ttl.json)")
    p.add_argument("--keep-temp", action="store_true", help="keep the servers' temporary directories")
    args = p.parse_args(argv)
    if args.messages is None:
        args.messages = 20_000 if args.quick else 1_000_000
    if args.ttl_min is None:
        args.ttl_min = 2 if args.quick else 10
    if args.ttl_max is None:
        args.ttl_max = 5 if args.quick else 60
    if args.settle is None:
        args.settle = 1.0 if args.quick else 3.0
    if args.idle_seconds is None:
        args.idle_seconds = 3.0 if args.quick else 20.0
    if args.messages < 1:
        p.error("--messages must be >= 1")
    if args.pending < 0 or args.publish_rate <= 0:
        p.error("need --pending >= 0 and --publish-rate > 0")
    if not 1 <= args.ttl_min <= args.ttl_max:
        p.error("need 1 <= --ttl-min <= --ttl-max")
    if args.ttl_max >= MARKER_TTL:
        p.error(f"--ttl-max must be below the marker TTL ({MARKER_TTL} s)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    n = args.messages
    ttls = draw_ttls(n, args.ttl_min, args.ttl_max)
    log(f"ttl: {n:,} messages of {len(PAYLOAD)} bytes per phase, TTLs {args.ttl_min}..{args.ttl_max} s, "
        f"sync {args.sync} on both servers")
    log_environment(env)
    results: dict[str, Side] = {}
    t0 = time.perf_counter()
    cpu = CpuWatch()
    with Harness("ttlbench", keep_temp=args.keep_temp) as h:
        kinds = [k for k in ("ttlbroker", "nats") if args.only in (None, k)]
        for kind in kinds:
            side = results[kind] = Side()
            if kind == "ttlbroker":
                start: Any = lambda: h.ttlbroker(fsync=args.sync)
                phases = (("1/3 no TTL", tb_plain), ("2/3 TTLs pending, then expiring", tb_pending),
                          ("3/3 expiry lag", tb_lag))
            else:
                start = lambda: h.nats(sync_interval=args.sync)
                phases = (("1/3 no TTL", nats_plain), ("2/3 TTLs pending, then expiring", nats_pending),
                          ("3/3 expiry lag", nats_lag))
            if args.lag_only:
                phases = phases[2:]
            for label, phase in phases:
                if phase in (tb_pending, nats_pending):
                    side.shift = shift_for(side.publish_plain, args)
                with start() as srv:
                    log(f"{srv.label} on {srv.address}: phase {label}")
                    run_uvloop(phase(srv, n, ttls, side, args))
    elapsed = time.perf_counter() - t0
    env["load_avg_at_end"] = os.getloadavg()
    env["cpu_during_run"] = others = cpu.stop()

    print()
    print(f"ttl: {n:,} messages of {len(PAYLOAD)} bytes, one subject each, TTLs uniform {args.ttl_min}..{args.ttl_max} s; "
          f"ttlbroker --fsync {args.sync}, nats-server sync_interval {args.sync}; markers with a {MARKER_TTL} s TTL; "
          f"uvloop clients ({env['cpus']} CPUs, {env['date']}, {elapsed:.0f} s total, load average "
          f"{env['load_avg_at_start'][0]:.2f} at start, {env['load_avg_at_end'][0]:.2f} at end)")
    print_cpu_share(others)
    print()
    print(report(results, args))
    if args.json:
        record = {
            "benchmark": "ttl",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "environment": env,
            "settings": {"messages": n, "payload_bytes": len(PAYLOAD), "ttl_min": args.ttl_min, "ttl_max": args.ttl_max,
                         "sync": args.sync, "batch": BATCH, "batches_in_flight": BATCHES_IN_FLIGHT, "window": WINDOW,
                         "marker_ttl": MARKER_TTL, "header_shift": HEADER_SHIFT, "settle_s": args.settle,
                         "idle_s": args.idle_seconds, "warmup": WARMUP, "pending": args.pending,
                         "publish_rate": args.publish_rate, "lag_only": args.lag_only},
            "elapsed_s": round(elapsed, 1),
            "results": {name: s.as_dict() for name, s in results.items()},
        }
        log(f"wrote {write_json(args.json, record)}")
    return 1 if problems_found(results) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers stopped and temporary directories removed")
        sys.exit(130)
