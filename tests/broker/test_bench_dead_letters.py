"""bench/dead_letters.py's workloads, tiny, against a broker of the suite: what the
benchmark reports (rates, latencies, the checks it makes) comes out whole and clean.
The full benchmark (``--quick``) runs a server of its own and takes about 5 s."""

from __future__ import annotations

import argparse
import sys

from conftest import ROOT
from helpers import in_asyncio

from broker import ServerHandle

sys.path.insert(0, str(ROOT / "bench"))

import dead_letters  # noqa: E402


async def test_the_benchmark_runs_small(server: ServerHandle) -> None:
    args = argparse.Namespace(messages=300, rounds=2, samples=3)
    res = await in_asyncio(dead_letters.run, str(server.address), args, None)
    t = res["throughput"]
    assert t["errors"] == 0 and len(t["round_ratios"]) == 2 and t["ratio"] > 0
    assert t["plain"]["messages"] == t["dlq"]["messages"] == 300
    lat = res["latency"]
    assert (lat["missing"], lat["wrong_reason"]) == (0, 0)
    assert [lat[w]["count"] for w in ("nak", "term", "ack_wait", "all")] == [3, 3, 3, 9]
    assert lat["ack_wait"]["p50_ms"] > -5  # measured from the ack wait's end, not before it
    assert lat["dead_lettered"]["fail"] == {"MaxDeliveries": 3, "Terminated": 3, "Expired": 0, "Limit": 0}
    assert lat["dead_lettered"]["slow"]["MaxDeliveries"] == 3
    assert "target ≥ 0.95" in dead_letters.report(res)
