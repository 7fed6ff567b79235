"""bench/nats_c.py's C load generator (bench/nats_c_load.c, libnats): built with gcc,
then every workload run tiny against ttlbroker's NATS listener, what it reports
checked against what the broker holds (read back with nats-py). The full benchmark
(``--quick`` against three servers) takes about 20 s, too long for the suite.

Without gcc or libnats (``apt-get install libnats-dev``) the tests skip with the
reason; under CI (``CI`` set; ``.ci/run`` installs libnats-dev) they fail instead.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import ROOT, require
from helpers import in_asyncio

sys.path.insert(0, str(ROOT / "bench"))

import nats_c  # noqa: E402
from _harness import Rate  # noqa: E402

SIZE = 128
PAYLOAD = bytes(ord("a") + i % 26 for i in range(SIZE))  # what the C program sends


@pytest.fixture(scope="module")
def load_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return nats_c.build(tmp_path_factory.mktemp("nats_c"))
    except nats_c.BuildError as exc:
        if exc.missing:
            require(str(exc), "the C load generator's tests")
        raise


async def run(exe: Path, url: str, workload: str, count: int, param: int = 0, max_seconds: float = 0) -> Rate:
    return await trio.to_thread.run_sync(
        lambda: nats_c.run_workload(exe, url, workload, count, SIZE, param, server_pid=os.getpid(), timeout=60,
                                    max_seconds=max_seconds))


async def test_every_workload_against_ttlbroker(load_exe: Path, nats_url: str) -> None:
    rates = {}
    with trio.fail_after(60):
        for workload, count, param in (("pub", 5_000, 0), ("req", 50, 0), ("js_pub", 300, 100),
                                       ("js_fetch", 300, 100), ("kv_put", 40, 0), ("kv_get", 40, 0)):
            rates[workload] = r = await run(load_exe, nats_url, workload, count, param)
            assert (r.messages, r.errors) == (count, 0), (workload, r)
            assert r.seconds > 0 and r.server_cpu_s is not None and r.server_cpu_s >= 0
    assert rates["pub"].note.startswith("published 5000 in ")

    async def broker_holds(url: str) -> dict[str, Any]:
        import nats

        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            info = await js.stream_info("BENCH")
            first = await js.get_msg("BENCH", 1)
            consumer = await js.consumer_info("BENCH", "PULL")
            kv = await js.key_value("bench")
            return {"stored": info.state.messages, "subject": first.subject, "data": first.data,
                    "acked": consumer.ack_floor.stream_seq, "ack_pending": consumer.num_ack_pending,
                    "max_ack_pending": consumer.config.max_ack_pending,
                    "keys": sorted(await kv.keys(), key=int), "last": (await kv.get("39")).value}
        finally:
            await nc.close()

    held = await in_asyncio(broker_holds, nats_url)
    assert held == {"stored": 300, "subject": "bench.js", "data": PAYLOAD, "acked": 300, "ack_pending": 0,
                    "max_ack_pending": 100, "keys": [str(i) for i in range(40)], "last": PAYLOAD}


async def test_a_failed_setup_is_reported(load_exe: Path, nats_url: str) -> None:
    # No bucket yet: kv_get cannot bind to it.
    with trio.fail_after(30), pytest.raises(nats_c.WorkloadError) as info:
        await run(load_exe, nats_url, "kv_get", 10)
    assert str(info.value).startswith("kv_get js_KeyValue: ")
    assert "not found" in str(info.value).lower()


async def test_a_time_limit_stops_early_and_counts_what_was_done(load_exe: Path, nats_url: str) -> None:
    with trio.fail_after(30):
        put = await run(load_exe, nats_url, "kv_put", 1_000_000, max_seconds=0.25)
        assert 0 < put.messages < 1_000_000 and put.errors == 0 and put.note == "stopped after 0.25 s"
        assert 0.25 <= put.seconds < 5
        got = await run(load_exe, nats_url, "kv_get", put.messages)  # every key it put, read back right
        assert (got.messages, got.errors) == (put.messages, 0)
        one_more = await run(load_exe, nats_url, "kv_get", put.messages + 1)
    assert (one_more.messages, one_more.errors) == (put.messages, 1)
    assert one_more.note == f"key {put.messages}: Not Found"


def test_built_once_per_source(load_exe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built_at = load_exe.stat().st_mtime_ns
    assert nats_c.build(load_exe.parent) == load_exe and load_exe.stat().st_mtime_ns == built_at  # from the cache
    assert nats_c.libnats_version(load_exe).startswith("libnats ")
    changed = tmp_path / "nats_c_load.c"  # another source (a small one: gcc is quick on it)
    changed.write_text("int main(void) { return 0; }\n")
    monkeypatch.setattr(nats_c, "SOURCE", changed)
    rebuilt = nats_c.build(load_exe.parent)
    assert rebuilt != load_exe and rebuilt.parent == load_exe.parent and os.access(rebuilt, os.X_OK)
    assert sorted(p.name for p in load_exe.parent.iterdir()) == sorted([load_exe.name, rebuilt.name])  # no leftovers


def test_missing_gcc_or_libnats_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc at all
    with pytest.raises(nats_c.BuildError) as info:
        nats_c.build(tmp_path / "cache")
    assert info.value.missing and "needs gcc" in str(info.value) and "\n" not in str(info.value)
    # A gcc that fails as gcc does without the library's header.
    gcc = tmp_path / "gcc"
    gcc.write_text("#!/bin/sh\necho 'nats_c_load.c:30:10: fatal error: nats/nats.h: No such file or directory' >&2\n"
                   "exit 1\n")
    gcc.chmod(gcc.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(nats_c.BuildError) as info:
        nats_c.build(tmp_path / "cache")
    assert info.value.missing and "\n" not in str(info.value)
    assert str(info.value).endswith("needs the C client library libnats: install Debian's libnats-dev "
                                    "(apt-get install libnats-dev)")


def test_ratios_and_cpu_are_per_round_medians() -> None:
    def r(rate: float, cpu_s: float) -> Rate:
        return Rate(1000, 1000 / rate, server_cpu_s=cpu_s)

    rounds = [
        {"nats_default": {"kv_put": r(100, 0.002)}, "nats_always": {"kv_put": r(50, 0.004)},
         "ttlbroker": {"kv_put": r(80, 0.003)}},
        {"nats_default": {"kv_put": r(200, 0.001)}, "nats_always": {"kv_put": r(40, 0.005)},
         "ttlbroker": {"kv_put": r(60, 0.006)}},
        {"nats_default": {"kv_put": r(100, 0.003)}, "nats_always": {"kv_put": r(20, 0.006)},
         "ttlbroker": {"kv_put": Rate(0, 0.0, 1)}},  # failed: left out of ratios and CPU
    ]
    s = nats_c.summarize(rounds, ["kv_put"])["kv_put"]
    assert s["ratios"]["nats_default"] == {"median": 0.55, "rounds": [0.8, 0.3]}
    assert s["ratios"]["nats_always"] == {"median": 1.55, "rounds": [1.6, 1.5]}
    assert s["results"]["nats_default"]["msgs_per_s"] == 100.0  # the median run
    assert s["server_cpu_us_per_msg"] == {"nats_default": 2.0, "nats_always": 5.0, "ttlbroker": 4.5}
    row = nats_c.table({"kv_put": s}).splitlines()[2]
    assert "0.55x (0.30-0.80)" in row and "1.55x (1.50-1.60)" in row and "2.00 / 5.00 / 4.50" in row
