"""The publish path alone: CPU per message of ``broker.publisher``'s entry points on
fixed batches, called directly (no network, no client, no fsync), to compare two
trees of ``broker/`` (run it from each tree, e.g. ``PYTHONPATH=/other/tree``).

A broker is started in-process (fsync ``never``) with the topics the cases need;
then each case calls one entry point on pre-built requests, over and over:

* ``one``: the binary PUBLISH of one plain message (the usual request);
* ``plain100``: 100 plain messages into one partition (the one-partition fast path);
* ``ttl100``: 100 bodies with a TTL field (one shared admission, bulk scheduling);
* ``hdr100``: 100 bodies with the same ``Nats-TTL`` header block (checked once);
* ``kv100``: 100 plain KV puts (the per-config plain-KV admission);
* ``parts100``: 100 messages over 4 partitions, one of them unrouted (per-message acks);
* ``msgid100``: 100 messages with fresh ``Nats-Msg-Id`` each (de-duplication);
* ``frames10x10``: ``publish_frames`` of 10 requests of 10 messages;
* ``nats100``: the NATS listener's stored publish of 100 messages;
* ``inbox100``: ``plain100`` with a core subscriber on another subject;
* ``sub100``: ``plain100`` with a core subscriber on the subject (deliveries);
* ``trusted100``: the broker's own publish of 100 bodies with headers (republish).

Two measures:

* default: CPU time (``time.process_time``) per message, the median of ``--rounds``
  rounds of ``--iterations`` calls each (after a warm-up round);
* ``--callgrind``: instructions per message under ``valgrind --tool=callgrind``,
  counted only while the measured loop runs (``--toggle-collect`` on the C function
  of ``itertools.filterfalse``, which nothing on the publish path calls): exact and
  indifferent to other load on the machine. Needs valgrind; about 10x slower.

    python bench/publish_cpu.py                    # every case, CPU ns/msg
    python bench/publish_cpu.py --callgrind        # every case, instructions/msg
    PYTHONPATH=/path/to/other/tree python bench/publish_cpu.py --callgrind
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio  # noqa: E402

import protocol as P  # noqa: E402
from broker.client import connect  # noqa: E402
from broker.config import Config  # noqa: E402
from broker.server import serve  # noqa: E402

CASES = [
    "one", "plain100", "ttl100", "hdr100", "kv100", "parts100", "msgid100", "frames10x10", "nats100",
    "inbox100", "sub100", "trusted100",
]


class _Session:
    def accepts_pushes(self) -> bool:
        return True


class _Sub:
    """A core subscriber that takes every delivery and keeps nothing."""

    def __init__(self, subject: str) -> None:
        self.tokens = tuple(subject.split("."))
        self.queue = None
        self.delivered = 0
        self.dropped = 0
        self.session = _Session()
        self.footprint = 0  # (the subscription budget: nothing counted)

    def deliver_records(self, parts: list[Any], counters: Any) -> None:
        self.delivered += len(parts) // 2

    def send_core(self, *args: Any) -> bool:
        return True


def _body(subject: str, payload: bytes, headers: dict[str, str] | None = None, ttl: int = 0) -> bytes:
    return P.encode_body(subject, payload, P.encode_headers(headers) if headers else b"", ttl=ttl)


def _cmd(bodies: list[bytes]) -> P.Publish:
    return P.Publish.decode(P.Publish.from_bodies(bodies, 0).encode())


def _entry_points(publisher: Any) -> dict[str, Callable[..., Any]]:
    """The entry points, in this tree's spelling (older trees had one ``publish``
    with mode flags)."""
    if hasattr(publisher, "publish_stored"):
        stored = publisher.publish_stored
    else:
        def stored(session: Any, cmd: P.Publish) -> Any:
            return publisher.publish(session, cmd, stored=True)
    return {"publish": publisher.publish, "frames": publisher.publish_frames, "stored": stored,
            "bodies": publisher.publish_bodies}


async def _setup(address: str) -> None:
    async with connect(address, timeout=None) as c:
        await c.create_stream("b")
        await c.create_topic("b", "one", subjects=["one.>"])
        await c.create_topic("b", "ttl", subjects=["ttl.>"], allow_msg_ttl=True)
        await c.create_topic("b", "four", partitions=4, subjects=["four.>"])
        await c.create_topic("b", "ids", subjects=["ids.>"], duplicate_window=3600)
        await c.create_topic("b", "sub", subjects=["sub.>"])
        await c.kv_create("kv", history=1)


def _case(name: str, iterations: int, ep: dict[str, Callable[..., Any]], broker: Any) -> tuple[Callable[[int], object], int]:
    """The call of one iteration of a case (given the iteration's number) and how
    many messages it publishes."""
    pay = b"x" * 128
    publish, stored, frames, bodies = ep["publish"], ep["stored"], ep["frames"], ep["bodies"]
    if name == "one":
        cmd = _cmd([_body("one.a", pay)])
        return (lambda k: publish(None, cmd)), 1
    if name == "plain100":
        cmd = _cmd([_body(f"one.s{i % 10}", pay) for i in range(100)])
        return (lambda k: publish(None, cmd)), 100
    if name == "ttl100":
        cmd = _cmd([_body(f"ttl.s{i % 10}", pay, ttl=3600 + i % 4) for i in range(100)])
        return (lambda k: publish(None, cmd)), 100
    if name == "hdr100":
        cmd = _cmd([_body(f"ttl.h{i % 10}", pay, {"Nats-TTL": "2h"}) for i in range(100)])
        return (lambda k: publish(None, cmd)), 100
    if name == "kv100":
        cmd = _cmd([_body(f"$KV.kv.k{i}", pay) for i in range(100)])
        return (lambda k: publish(None, cmd)), 100
    if name == "parts100":
        cmd = _cmd([_body(f"four.s{i}" if i != 50 else "nowhere.x", pay) for i in range(100)])
        return (lambda k: publish(None, cmd)), 100
    if name == "msgid100":
        cmds = [_cmd([_body(f"ids.s{i % 10}", pay, {"Nats-Msg-Id": f"{k}-{i}"}) for i in range(100)])
                for k in range(iterations)]
        return (lambda k: publish(None, cmds[k])), 100
    if name == "frames10x10":
        reqs = []
        for r in range(10):
            payload = P.Publish.from_bodies([_body(f"one.f{i}", pay) for i in range(10)], 0).encode()
            reqs.append((r + 1, payload, 10))
        return (lambda k: frames(None, reqs)), 100
    if name == "nats100":
        cmd = _cmd([_body(f"one.n{i % 10}", pay) for i in range(100)])
        return (lambda k: stored(None, cmd)), 100
    if name in ("inbox100", "sub100"):
        cmd = _cmd([_body(f"sub.s{i % 10}", pay) for i in range(100)])
        return (lambda k: publish(None, cmd)), 100
    if name == "trusted100":
        block = {"Nats-Stream": "S", "Nats-Subject": "x.y", "Nats-Sequence": "1", "Nats-Last-Sequence": "0"}
        raw = [_body(f"one.r{i % 10}", pay, block) for i in range(100)]
        return (lambda k: bodies(raw)), 100
    raise SystemExit(f"unknown case {name!r}")


def _subscribe(broker: Any, name: str) -> Any:
    if name == "inbox100":
        sub = _Sub("_INBOX.abc.*")
    elif name == "sub100":
        sub = _Sub("sub.>")
    else:
        return None
    broker.subs.add(sub)
    return sub


def _measured(call: Callable[[int], object], iterations: int) -> None:
    """The loop callgrind counts: all of it runs inside one ``filterfalse_next``."""
    for _ in itertools.filterfalse(lambda k: call(k) and False or True, range(iterations)):
        pass


async def _run(args: argparse.Namespace) -> dict[str, float]:
    data = tempfile.mkdtemp(prefix="ttlbroker-pubcpu-")
    config = Config().replace(**{
        "server.port": 0, "http.port": -1, "nats.enabled": False, "system.path": data,
        "system.partition.fsync": "never",
    })
    out: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(lambda task_status: serve(config, task_status=task_status))
        await _setup(handle.address)
        broker = handle.broker
        ep = _entry_points(broker.publisher)
        for name in args.cases:
            sub = _subscribe(broker, name)
            # fresh ids each call: fewer calls, so the pre-built requests stay small
            per_round = args.iterations // 5 if name == "msgid100" and not args.count_only else args.iterations
            call, msgs = _case(name, per_round * (args.rounds + 1), ep, broker)
            gc.collect()
            if args.count_only:
                _measured(call, per_round)
            else:
                offset = 0
                times: list[float] = []
                for r in range(args.rounds + 1):  # the first is the warm-up
                    base = offset
                    t = time.process_time()
                    for k in range(base, base + per_round):
                        call(k)
                    elapsed = time.process_time() - t
                    offset += per_round
                    if r:
                        times.append(elapsed)
                    await trio.lowlevel.checkpoint()  # the broker's tasks (sealing, expiry) run between rounds
                out[name] = statistics.median(times) / (per_round * msgs) * 1e9
            if sub is not None:
                broker.subs.remove(sub)
            await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    return out


def _callgrind(args: argparse.Namespace) -> dict[str, float]:
    """Each case in a valgrind run of its own, its loop alone counted."""
    out: dict[str, float] = {}
    for name in args.cases:
        with tempfile.TemporaryDirectory() as tmp:
            outfile = Path(tmp) / "callgrind.out"
            argv = [
                "valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=filterfalse_next",
                f"--callgrind-out-file={outfile}", sys.executable, __file__, "--count-only",
                "--cases", name, "--iterations", str(args.iterations),
            ]
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            total = 0
            for line in outfile.read_text().splitlines():
                if line.startswith("totals:") or line.startswith("summary:"):
                    total = int(line.split()[1])
            msgs = 1 if name == "one" else 100
            out[name] = total / (args.iterations * msgs)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=lambda s: s.split(","), default=CASES, help="comma-separated (default: all)")
    ap.add_argument("--iterations", type=int, default=0, help="calls per round (default 2000; 200 with --callgrind)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds; the median is printed (default 7)")
    ap.add_argument("--callgrind", action="store_true", help="count instructions under valgrind instead")
    ap.add_argument("--count-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.count_only:
        args.rounds = 0
        trio.run(_run, args)
        return 0
    args.iterations = args.iterations or (200 if args.callgrind else 2000)
    import broker
    tree = str(Path(broker.__file__).resolve().parent.parent)
    if args.callgrind:
        result, unit = _callgrind(args), "instructions/msg"
    else:
        result, unit = trio.run(_run, args), "CPU ns/msg"
    print(f"publish_cpu: {tree}, {args.iterations} calls per {'run' if args.callgrind else 'round'}, load {os.getloadavg()[0]:.2f}")
    print(f"| case | {unit} |")
    print("|---|---:|")
    for name, value in result.items():
        print(f"| {name} | {value:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
