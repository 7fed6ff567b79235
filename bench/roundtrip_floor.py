"""The floor under an awaited round trip: what a request answered one at a time costs
with nothing in it, next to a ttlbroker publish and a nats-server publish.

The speed targets (``bench/README.md``, "Targets") ask for publishes awaited one by
one at 2x nats-server+nats-py. Each such publish is one round trip, so its rate is
bounded by the cheapest round trip the server's event loop and the client's can make. This benchmark measures that bound on
this machine, in the same run as the real thing:

* **trio echo**: a trio server answering each read with 16 bytes, reading and
  writing its socket the way the binary protocol's sessions (``broker.server``) do
  (non-blocking ``recv`` and ``send`` on the socket itself, ``wait_readable`` when
  nothing is there), and
* **uvloop echo**: the same answer from an asyncio protocol on uvloop, for scale,

both driven by the leanest client possible (an asyncio protocol on uvloop: one
``write`` and one future per request, the same 100-byte request every time); then

* **ttlbroker publish**: ``await client.publish()`` with ``broker.client.aio`` on uvloop
  (``--fsync 200ms``: the ack does not wait for a disk), and
* **nats-server publish**: ``await js.publish()`` with nats-py on uvloop (its default
  ``sync_interval``, 2 minutes).

For each it prints round trips per second, wall microseconds per round trip, and the
client's and the server's CPU microseconds per round trip. Run from the repository
root::

    .venv/bin/python bench/roundtrip_floor.py              # 20,000 round trips each
    .venv/bin/python bench/roundtrip_floor.py --quick      # 3,000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    RESULTS_DIR,
    CpuWatch,
    Harness,
    Progress,
    Rate,
    Server,
    _explain_death,
    _wait_for_log,
    environment,
    fmt_rate,
    format_table,
    log,
    log_environment,
    measure,
    print_cpu_share,
    run_uvloop,
    write_json,
)

REQUEST = b"r" * 100
SUBJECT = "floor.x"

TRIO_ECHO = """
import socket, trio
async def handle(stream):
    sock = socket.socket(fileno=stream.socket.fileno())
    sock.setblocking(False)
    try:
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            if not data:
                return
            sock.send(b"a" * 16)
    finally:
        sock.detach()
async def main():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print("port", listeners[0].socket.getsockname()[1], flush=True)
    await trio.serve_listeners(handle, listeners)
trio.run(main)
"""

UVLOOP_ECHO = """
import asyncio, uvloop
class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.transport.write(b"a" * 16)
async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    print("port", server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
uvloop.run(main())
"""


class _Client(asyncio.Protocol):
    """The leanest request/answer client: one write and one future per request."""

    waiter: asyncio.Future[bytes] | None = None

    def data_received(self, data: bytes) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(data)


async def echo_round_trips(host: str, port: int, n: int, pid: int, label: str) -> Rate:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_connection(_Client, host, port)
    try:
        async def one() -> None:
            proto.waiter = loop.create_future()
            transport.write(REQUEST)
            await proto.waiter

        for _ in range(500):  # warm-up
            await one()

        async def work(progress: Progress) -> tuple[int, int]:
            for i in range(n):
                await one()
                if not i & 1023:
                    progress.update(i)
            return n, 0

        return await measure(label, work, n, server_pid=pid)
    finally:
        transport.close()


async def ttlbroker_publishes(address: str, n: int, pid: int) -> Rate:
    from broker.client import aio

    async with aio.connect(address, name="bench-floor") as c:
        await c.create_stream("floor")
        await c.create_topic("floor", "x", partitions=1, subjects=["floor.>"])
        for _ in range(500):
            await c.publish(SUBJECT, REQUEST)

        async def work(progress: Progress) -> tuple[int, int]:
            for i in range(n):
                await c.publish(SUBJECT, REQUEST)
                if not i & 1023:
                    progress.update(i)
            return n, 0

        return await measure("ttlbroker publish, fsync 200ms", work, n, server_pid=pid)


async def nats_publishes(url: str, n: int, pid: int) -> Rate:
    import nats

    nc = await nats.connect(url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        await js.add_stream(name="FLOOR", subjects=["floor.>"])
        for _ in range(500):
            await js.publish(SUBJECT, REQUEST)

        async def work(progress: Progress) -> tuple[int, int]:
            for i in range(n):
                await js.publish(SUBJECT, REQUEST)
                if not i & 1023:
                    progress.update(i)
            return n, 0

        return await measure("nats-server publish, default sync", work, n, server_pid=pid)
    finally:
        await nc.close()


def echo_server(h: Harness, name: str, code: str) -> Server:
    workdir = h.tempdir(name)
    server = h._spawn(name, name, [sys.executable, "-c", code], workdir, {})
    m = _wait_for_log(server, re.compile(r"^port (\d+)$", re.M), 30.0)
    server.port = int(m.group(1))
    return server


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--round-trips", type=int, default=20_000, help="round trips per case")
    p.add_argument("--quick", action="store_true", help="3,000 round trips per case")
    p.add_argument("--json", default=str(RESULTS_DIR / "roundtrip_floor.json"), help="write the results here as JSON")
    args = p.parse_args()
    n = 3_000 if args.quick else args.round_trips
    env = environment()
    log_environment(env)
    cpu = CpuWatch()
    results: dict[str, Rate] = {}
    with Harness("roundtrip_floor") as h:
        for name, code, label in (("trio-echo", TRIO_ECHO, "trio echo (the broker's socket calls)"),
                                  ("uvloop-echo", UVLOOP_ECHO, "uvloop echo")):
            server = echo_server(h, name, code)
            try:
                with _explain_death(server):
                    results[label] = run_uvloop(echo_round_trips(server.host, server.port, n, server.proc.pid, label))
            finally:
                h.stop(server)
        with h.ttlbroker(fsync="200ms") as srv:
            results["ttlbroker publish, fsync 200ms"] = run_uvloop(ttlbroker_publishes(srv.address, n, srv.proc.pid))
        with h.nats() as srv:
            results["nats-server publish, default sync"] = run_uvloop(nats_publishes(srv.url, n, srv.proc.pid))
    others = cpu.stop()
    rows = []
    for label, r in results.items():
        c, s = r.cpu_us_per_msg()
        rows.append([label, fmt_rate(r.per_second), f"{r.seconds / r.messages * 1e6:.1f}",
                     "" if c is None else f"{c:.1f}", "" if s is None else f"{s:.1f}"])
    print(f"\nRound trips awaited one at a time, {len(REQUEST)}-byte requests, load {os.getloadavg()[0]:.2f}\n")
    print(format_table(["case", "round trips/s", "wall us", "client CPU us", "server CPU us"], rows, right=(1, 2, 3, 4)))
    nats_rate = results["nats-server publish, default sync"].per_second
    trio = results["trio echo (the broker's socket calls)"]
    budget = 1e6 / (2 * nats_rate) if nats_rate else 0.0
    floor = trio.seconds / trio.messages * 1e6
    print(f"\n2x nats-server's awaited publish is {2 * nats_rate:,.0f}/s: {budget:.1f} us per round trip, of which an "
          f"empty trio round trip with the leanest client takes {floor:.1f} us, leaving {budget - floor:.1f} us for "
          "the broker's and the client's work.")
    print_cpu_share(others)
    write_json(args.json, {"environment": env, "round_trips": n, "other_cpu": others,
                           "results": {k: r.as_dict() for k, r in results.items()},
                           "budget_us": round(budget, 1), "trio_floor_us": round(floor, 1)})


if __name__ == "__main__":
    main()
