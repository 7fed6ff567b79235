"""``ttlbroker bench pub|sub|js``: throughput and latency against a running broker,
as ``nats bench`` measures nats-server (natscli's ``cli/bench_command.go`` and
``internal/bench/stats.go``: the same banner, per-client lines, aggregated stats and
latency percentiles, with ttlbroker's names).

* ``bench pub SUBJECT``: ``--pubs`` clients publish ``--msgs`` messages of ``--size``
  bytes between them, in batches of ``--batch`` (each batch's acks awaited: the
  broker's flow control). With ``--subs N``, N subscribing clients in this process
  receive them and measure the publish-to-receive latency.
* ``bench sub SUBJECT``: ``--subs`` clients each wait for ``--msgs`` messages (from
  a ``bench pub`` elsewhere), and measure the publish-to-receive latency.
* ``bench js SUBJECT``: ``--pubs`` clients store ``--msgs`` messages into a topic
  (``--stream``/``--topic``, made for the run unless it exists, and removed after
  unless ``--keep``), with ``--ack sync`` (each publish awaits its ack), ``async``
  (``--batch`` publishes in flight per client) or ``batch`` (``--batch`` messages per
  publish); the latency is the publish-ack one (per message, per batch with
  ``batch``).

Publish-to-receive latency: every payload of at least 12 bytes carries the
publisher's wall clock when its batch went (``protocol.stamped_payload``); a
subscriber takes its own clock at receipt from it (the same machine's clock, or
clocks kept in step). Payloads without the stamp (another publisher's) count but give
no latency.

While it runs, a progress bar on a terminal (stderr); the banner and each client's
start are lines on stderr led by the time, the summary goes to stdout (one JSON
object per side with ``--json``).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from protocol import BrokerError, ErrorCode, error_class, payload_stamp, stamped_payload

from ._args import tls_option
from ._exits import ExitStatus, error_line, say
from ._output import Out, count, size
from ._request import log_line
from broker.client import Client, connect, encode_msg

if TYPE_CHECKING:
    from ._progress import Progress

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_bench_commands", "cmd_bench", "parse_size", "Sample", "report_lines"]

#: How long ``bench pub --subs`` waits, once the publishers are done, for messages
#: that are still on their way (none arriving for this long ends the wait).
SETTLE_SECONDS = 2.0
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_UNITS = {"": 0, "B": 0, "K": 10, "KB": 10, "KIB": 10, "M": 20, "MB": 20, "MIB": 20, "G": 30, "GB": 30, "GIB": 30}
_NO_TOPIC = int(ErrorCode.NO_TOPIC_FOR_SUBJECT)
_LABELS = {"pub": "core publisher", "sub": "core subscriber"}


def parse_size(text: str) -> int:
    """argparse type: a message size as natscli reads it: ``128``, ``128B``, ``1KB``,
    ``1KiB``, ``2MB`` (K, M and G are powers of 1024)."""
    m = _SIZE.fullmatch(text)
    if m is None or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (use e.g. 128, 128B, 1KB, 2MiB)")
    return int(m.group(1)) << _UNITS[m.group(2).upper()]


def _at_least(low: int) -> Callable[[str], int]:
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    return check


def add_bench_commands(sub: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``bench pub``, ``bench sub`` and ``bench js`` on the main parser's subparsers."""
    helptext = "benchmark publishing, subscribing and storing, as `nats bench` does"
    bs = sub.add_parser("bench", parents=g, help=helptext, description=helptext).add_subparsers(
        dest="action", required=True, metavar="ACTION",
    )

    def common(p: argparse.ArgumentParser, clients: str, what: str) -> None:
        p.add_argument("subject", help="the subject to use")
        p.add_argument("--msgs", type=_at_least(1), default=100_000, metavar="N", help=f"{what} (default 100000)")
        p.add_argument(f"--{clients}", "--clients", dest="clients", type=_at_least(1), default=1, metavar="N",
                       help="how many clients (connections) (default 1)")

    def sized(p: argparse.ArgumentParser) -> None:
        p.add_argument("--size", type=parse_size, default=128, metavar="SIZE",
                       help="payload bytes of each message: 128, 1KB, 2MiB (default 128B)")

    p = bs.add_parser("pub", parents=g, help="publish core messages (optionally received by --subs in this process)")
    common(p, "pubs", "messages to publish, shared among the publishers")
    sized(p)
    p.add_argument("--batch", type=_at_least(1), default=100, metavar="N", help="messages per publish (default 100)")
    p.add_argument("--subs", type=_at_least(0), default=0, metavar="N",
                   help="also run N subscribers in this process, which measure the publish-to-receive latency (default 0)")

    p = bs.add_parser("sub", parents=g, help="receive core messages (from a `bench pub` elsewhere)")
    common(p, "subs", "messages each subscriber waits for")

    p = bs.add_parser("js", parents=g, help="store messages into a topic, measuring the publish-ack latency")
    common(p, "pubs", "messages to store, shared among the publishers")
    sized(p)
    p.add_argument("--stream", default="benchstream", help="the stream of the topic (default benchstream)")
    p.add_argument("--topic", default="benchtopic",
                   help="the topic, capturing SUBJECT; made for the run unless it exists (default benchtopic)")
    p.add_argument("--ack", choices=("sync", "async", "batch"), default="async",
                   help="sync: await each publish's ack; async: --batch publishes in flight; batch: --batch messages per "
                   "publish (default async)")
    p.add_argument("--batch", type=_at_least(1), default=100, metavar="N",
                   help="with --ack async, publishes in flight per client; with batch, messages per publish (default 100)")
    p.add_argument("--storage", choices=("file", "memory"), default="file", help="the storage of a topic made for the run (default file)")
    p.add_argument("--keep", action="store_true", help="keep the stream and topic made for the run (default: removed after)")


# -- samples and the report (natscli's internal/bench/stats.go) -------------------------


@dataclass
class Sample:
    """What one client did: ``msgs`` messages of ``size`` bytes from ``start`` to
    ``end`` (``time.perf_counter`` seconds), and its latencies in nanoseconds."""

    msgs: int
    size: int
    start: float
    end: float
    latencies: list[int] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    @property
    def rate(self) -> int:
        return int(self.msgs / self.seconds)

    @property
    def throughput(self) -> float:
        return self.msgs * self.size / self.seconds


def _group(samples: list[Sample]) -> Sample:
    """The samples as one: their messages and latencies over the span from the
    first start to the last end."""
    lat = sorted(x for s in samples for x in s.latencies)
    return Sample(sum(s.msgs for s in samples), samples[0].size, min(s.start for s in samples), max(s.end for s in samples), lat)


def _us(ns: float) -> str:
    """Microseconds as natscli prints them (``humanize.CommafWithDigits(x, 2)``)."""
    text = f"{ns / 1000:,.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _percentile(lat: list[int], p: float) -> int:
    return lat[max(math.ceil(p / 100 * len(lat)) - 1, 0)]


def _latency(lat: list[int]) -> dict[str, float]:
    """min, avg, max, stddev and percentiles, in microseconds (``lat`` sorted)."""
    avg = sum(lat) / len(lat)
    std = math.sqrt(sum((x - avg) ** 2 for x in lat) / len(lat))
    out = {"min": lat[0], "avg": avg, "max": lat[-1], "stddev": std}
    out.update({f"p{p:g}": _percentile(lat, p) for p in (50, 90, 99, 99.9)})
    return {k: round(v / 1000, 3) for k, v in out.items()}


def _sample_text(s: Sample) -> str:
    text = f"{count(s.rate)} msgs/sec ~ {size(int(s.throughput))}/sec"
    if not s.latencies:
        return text
    lat = sorted(s.latencies)
    avg = sum(lat) / len(lat)
    return text + (
        f" ~ min: {_us(lat[0])}us ~ avg: {_us(avg)}us ~ max: {_us(lat[-1])}us ~ P50: {_us(_percentile(lat, 50))}us"
        f" ~ P90: {_us(_percentile(lat, 90))}us ~ P99: {_us(_percentile(lat, 99))}us ~ P99.9: {_us(_percentile(lat, 99.9))}us"
    )


def report_lines(label: str, samples: list[Sample]) -> list[str]:
    """natscli's report of one side: one line for one client; else a line per client,
    the aggregated rate, the spread of the clients' rates and the latencies of all."""
    if len(samples) == 1:
        return [f"ttlbroker {label} stats: {_sample_text(samples[0])}"]
    out = [f" [{i}] {_sample_text(s)} ({count(s.msgs)} msgs)" for i, s in enumerate(samples, 1)]
    g = _group(samples)
    rates = [s.rate for s in samples]
    avg = sum(rates) // len(rates)
    std = math.sqrt(sum((r - avg) ** 2 for r in rates) / len(rates))
    out += [
        "",
        f" ttlbroker {label} aggregated stats: {count(g.rate)} msgs/sec ~ {size(int(g.throughput))}/sec",
        f" message rates min {count(min(rates))} | avg {count(avg)} | max {count(max(rates))} | stddev {count(int(std))} msgs",
    ]
    if g.latencies:
        lat = _latency(g.latencies)
        out.append(
            " latencies per operation "
            + " | ".join(f"{k.upper() if k.startswith('p') else k} {_us(v * 1000)}us" for k, v in lat.items())
        )
    return out


def _json(label: str, samples: list[Sample], **extra: Any) -> dict[str, Any]:
    g = _group(samples)
    out: dict[str, Any] = {
        "benchmark": label, "clients": len(samples), "msgs": g.msgs, "msg_size": g.size, "seconds": round(g.seconds, 6),
        "msgs_per_sec": g.rate, "bytes_per_sec": round(g.throughput), **extra,
    }
    if g.latencies:
        out["latency_us"] = _latency(g.latencies)
    if len(samples) > 1:
        out["per_client"] = [{"msgs": s.msgs, "msgs_per_sec": s.rate, "bytes_per_sec": round(s.throughput)} for s in samples]
    return out


def _banner(label: str, **values: object) -> None:
    """natscli's banner: the arguments in name order."""
    shown = ", ".join(f"{k.replace('_', '-')}={v}" for k, v in sorted(values.items()))
    log_line(f"Starting ttlbroker {label} benchmark [{shown}]")


# -- running ------------------------------------------------------------------------


def _shares(total: int, clients: int) -> list[int]:
    """``total`` messages spread over ``clients`` (natscli's ``msgsPerClient``)."""
    base, extra = divmod(total, clients)
    return [base + (1 if i < extra else 0) for i in range(clients)]


def _payload(n: int) -> bytes:
    """A payload of ``n`` bytes stamped with the wall clock now, when it has room."""
    return stamped_payload(n, time.time_ns())


class _Run:
    """One benchmark run: its clients' connections, the progress bar, the errors."""

    def __init__(self, args: argparse.Namespace, progress: Progress) -> None:
        self.args = args
        self.progress = progress
        self.done = 0
        self.errors = 0
        self.stored = 0

    def connect(self, n: int) -> Any:
        a = self.args
        return connect(a.server, token=a.token, user=a.user, password=a.password, name=f"ttlbroker-bench-{n}",
                       reconnect=False, tls=tls_option(a))

    def advance(self, n: int) -> None:
        self.done += n
        self.progress.update(self.done)

    def error(self, exc: BrokerError) -> None:
        self.errors += 1
        if self.errors == 1:
            say(error_line(exc))


async def cmd_bench(c: Client, args: argparse.Namespace, out: Out) -> None:
    from ._progress import Progress

    clients = min(args.clients, args.msgs)
    if args.action == "sub":
        total = args.msgs * clients
    else:
        total = args.msgs * (1 + getattr(args, "subs", 0))
    with Progress(f"bench {args.action}", total, "msgs", bar=True) as progress:
        run = _Run(args, progress)
        if args.action == "pub":
            await _bench_pub(run, out, clients)
        elif args.action == "sub":
            await _bench_sub(run, out, clients)
        else:
            await _bench_js(c, run, out, clients)
    if run.errors:
        raise ExitStatus(1)


def _in_order(samples: dict[int, Sample]) -> list[Sample]:
    """The samples by client number."""
    return [samples[n] for n in sorted(samples)]


def _print_report(out: Out, label: str, samples: list[Sample], **extra: Any) -> None:
    if out.json:
        out.obj(_json(label, samples, **extra))
        return
    print(flush=True)
    for line in report_lines(label, samples):
        print(line, flush=True)


async def _bench_pub(run: _Run, out: Out, clients: int) -> None:
    args = run.args
    _banner("core publisher", subject=args.subject, msgs=count(args.msgs), msg_size=size(args.size), clients=clients,
            batch=args.batch, subs=args.subs)
    go = trio.Event()
    published = trio.Event()
    pubs: dict[int, Sample] = {}
    subs: dict[int, Sample] = {}
    async with trio.open_nursery() as nursery:
        for i in range(args.subs):
            await nursery.start(_subscriber, run, i + 1, args.msgs, subs, published)
        async with trio.open_nursery() as publishers:
            for i, n in enumerate(_shares(args.msgs, clients)):
                await publishers.start(_publisher, run, i + 1, n, pubs, go)
            go.set()  # all connected: they start together
        published.set()
    _print_report(out, _LABELS["pub"], _in_order(pubs), stored=run.stored, errors=run.errors)
    if run.stored:
        log_line(f"{count(run.stored)} of the messages were stored: a topic captures {args.subject!r}")
    if subs:
        _print_report(out, _LABELS["sub"], _in_order(subs), expected=args.msgs * args.subs,
                      received=sum(s.msgs for s in subs.values()))


async def _publisher(
    run: _Run, n: int, msgs: int, samples: dict[int, Sample], go: trio.Event,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A core publisher: batches of ``--batch``, each one's acks awaited (a subject
    no topic captures is acked NO_TOPIC_FOR_SUBJECT: no error here)."""
    args = run.args
    async with run.connect(n) as c:
        log_line(f"[{n}] Starting ttlbroker {_LABELS['pub']}, publishing {count(msgs)} messages")
        task_status.started()
        await go.wait()
        start = time.perf_counter()
        left = msgs
        while left:
            k = min(args.batch, left)
            acks = await c.publish_batch([encode_msg(args.subject, _payload(args.size))] * k)
            assert acks is not None
            statuses = acks.statuses
            stored = statuses.count(0)
            run.stored += stored
            if stored + statuses.count(_NO_TOPIC) != k:
                for a in acks:
                    if a.error is not None and a.error.code != _NO_TOPIC:
                        run.error(a.error)
            left -= k
            run.advance(k)
        await c.ping()  # (every batch was acked: this only closes the span, as natscli's Flush)
        samples[n] = Sample(msgs, args.size, start, time.perf_counter())


async def _subscriber(
    run: _Run, n: int, msgs: int, samples: dict[int, Sample], published: trio.Event | None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A core subscriber waiting for ``msgs`` messages; with ``published`` (the
    publishers are in this process), it stops once they are done and no message
    came for :data:`SETTLE_SECONDS`, with what it got (core delivery is at most
    once)."""
    args = run.args
    async with run.connect(1000 + n) as c:
        sub = await c.subscribe(args.subject, max_pending=max(msgs, 65536))
        log_line(f"[{n}] Starting ttlbroker {_LABELS['sub']}, expecting {count(msgs)} messages")
        task_status.started()
        got = shown = msg_size = 0
        lat: list[int] = []
        start = end = 0.0
        while got < msgs:
            try:
                m = await sub.next(None if published is None else SETTLE_SECONDS)
            except TimeoutError:
                if published is not None and published.is_set():
                    break
                continue
            end = time.perf_counter()
            start = start or end
            got += 1
            msg_size = len(m.payload)
            sent = payload_stamp(m.payload)
            if sent is not None:
                lat.append(time.time_ns() - sent)
            if got - shown >= 100 or got == msgs:
                run.advance(got - shown)
                shown = got
        if got < msgs:
            log_line(f"[{n}] received {count(got)} of {count(msgs)} messages (core delivery is at most once)")
        if got:
            samples[n] = Sample(got, msg_size, start, end, lat)


async def _bench_sub(run: _Run, out: Out, clients: int) -> None:
    args = run.args
    _banner("core subscriber", subject=args.subject, msgs=count(args.msgs), clients=clients)
    samples: dict[int, Sample] = {}
    async with trio.open_nursery() as nursery:
        for i in range(clients):
            await nursery.start(_subscriber, run, i + 1, args.msgs, samples, None)
    _print_report(out, _LABELS["sub"], _in_order(samples), expected=args.msgs * clients,
                  received=sum(s.msgs for s in samples.values()))


# -- js ---------------------------------------------------------------------------------


async def _bench_js(c: Client, run: _Run, out: Out, clients: int) -> None:
    """Store into ``--stream``/``--topic`` (made for the run unless it exists, and
    removed after unless ``--keep``, also when the run fails or is interrupted)."""
    args = run.args
    label = f"stored publisher ({args.ack} acks)"
    made = await _make_topic(c, args)
    _banner(label, subject=args.subject, msgs=count(args.msgs), msg_size=size(args.size), clients=clients,
            stream=args.stream, topic=args.topic, ack=args.ack, batch=args.batch, storage=args.storage,
            keep=str(args.keep).lower())
    samples: dict[int, Sample] = {}
    try:
        async with trio.open_nursery() as nursery:
            for i, n in enumerate(_shares(args.msgs, clients)):
                nursery.start_soon(_js_publisher, run, i + 1, n, samples)
    finally:
        if made and not args.keep:
            with trio.CancelScope(shield=True):
                await _remove(c, args, made)
    _print_report(out, label, _in_order(samples), errors=run.errors)


async def _make_topic(c: Client, args: argparse.Namespace) -> str:
    """Make what is missing of ``--stream``/``--topic``; returns ``"stream"`` (the
    stream was made, with the topic), ``"topic"`` (only the topic) or ``""``."""
    made = ""
    try:
        await c.get_stream(args.stream)
    except error_class(ErrorCode.STREAM_NOT_FOUND):
        await c.create_stream(args.stream)
        made = "stream"
    try:
        await c.get_topic(args.stream, args.topic)
    except error_class(ErrorCode.TOPIC_NOT_FOUND):
        try:
            await c.create_topic(args.stream, args.topic, subjects=[args.subject], storage=args.storage)
        except BrokerError:
            if made:
                await c.delete_stream(args.stream)
            raise
        made = made or "topic"
    if made:
        log_line(f"Created {args.stream}/{args.topic} capturing {args.subject!r} ({args.storage} storage)")
    return made


async def _remove(c: Client, args: argparse.Namespace, made: str) -> None:
    try:
        if made == "stream":
            await c.delete_stream(args.stream)
        else:
            await c.delete_topic(args.stream, args.topic)
    except (BrokerError, OSError, TimeoutError) as exc:
        say(f"warning: could not remove {args.stream}/{args.topic} made for the run: {exc}")
        return
    log_line(f"Removed {args.stream if made == 'stream' else args.stream + '/' + args.topic} (made for the run; --keep keeps it)")


async def _js_publisher(run: _Run, n: int, msgs: int, samples: dict[int, Sample]) -> None:
    args = run.args
    lat: list[int] = []
    async with run.connect(n) as c:
        log_line(f"[{n}] Starting ttlbroker stored publisher, publishing {count(msgs)} messages")
        start = time.perf_counter()
        if args.ack == "batch":
            await _js_batches(c, run, msgs, lat)
        else:
            window = 1 if args.ack == "sync" else args.batch
            await _js_singles(c, run, msgs, lat, window)
        samples[n] = Sample(msgs, args.size, start, time.perf_counter(), lat)


async def _timed(lat: list[int], call: Callable[[], Awaitable[Any]]) -> Any:
    t = time.perf_counter_ns()
    result = await call()
    lat.append(time.perf_counter_ns() - t)
    return result


async def _js_singles(c: Client, run: _Run, msgs: int, lat: list[int], window: int) -> None:
    """One message per publish, ``window`` of them in flight (1: each awaited)."""
    args = run.args
    limit = trio.Semaphore(window)

    async def one() -> None:
        try:
            await _timed(lat, lambda: c.publish(args.subject, _payload(args.size)))
        except BrokerError as exc:
            run.error(exc)
        finally:
            limit.release()
        run.advance(1)

    async with trio.open_nursery() as nursery:
        for _ in range(msgs):
            await limit.acquire()
            if window == 1:
                await one()
            else:
                nursery.start_soon(one)


async def _js_batches(c: Client, run: _Run, msgs: int, lat: list[int]) -> None:
    args = run.args
    left = msgs
    while left:
        k = min(args.batch, left)
        acks = await _timed(lat, lambda: c.publish_batch([encode_msg(args.subject, _payload(args.size))] * k))
        for a in acks:
            if a.error is not None:
                run.error(a.error)
        left -= k
        run.advance(k)
