"""The PySpark jobs on real local Spark, checked against plain-Python references
computed from the same Parquet files; and loading a snapshot back into a broker."""

from __future__ import annotations

from conftest import require_extra

require_extra("spark", "the export and Spark tests")  # before the imports it guards

import datetime as dt
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import trio
import trio.testing
from conftest import env_with_project, make_config, start_server

from broker import Clock
from broker.client import connect
from spark_export import SCHEMA
from spark_export.jobs import TTL_BUCKETS, analyze, compact
from spark_export.load import load

pytestmark = pytest.mark.spark

NS = 1_000_000_000


async def _advance(seconds: float) -> None:
    trio.lowlevel.current_clock().jump(seconds)  # type: ignore[attr-defined]
    await trio.testing.wait_all_tasks_blocked()


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mixed export: two topics, plain, TTL'd (every bucket), never, deleted,
    purged, rolled up, expired by TTL and by max age, and markers."""
    root = tmp_path_factory.mktemp("spark")
    data, export = root / "data", root / "export"
    data.mkdir()

    async def main() -> None:
        cfg = make_config(data, **{"export.dir": str(export), "system.partition.fsync": "never"})
        async with start_server(cfg, Clock()) as server, connect(server.address, timeout=None) as c:
            await c.create_stream("shop")
            await c.create_topic("shop", "orders", partitions=3, subjects=["orders.>"], message_expiry=7200,
                                 subject_delete_marker_ttl=30, max_msgs_per_subject=1000)
            await c.create_topic("shop", "audit", subjects=["audit.>"], allow_msg_ttl=True)
            ttls = [None, "never", 5, 30, 90, 700, 4000, 90000]
            for k in range(400):
                ttl = ttls[k % len(ttls)]
                headers = {"n": str(k)} if k % 3 else {}
                if ttl is not None and k % 2:
                    headers["Nats-TTL"] = str(ttl)
                    ttl = None
                await c.publish_batch([(f"orders.{k % 23}", f"o{k}".encode() * (1 + k % 7), headers, ttl)])
                if k % 50 == 0:
                    await _advance(600)  # spread over several hours
            await c.publish_batch([(f"audit.{k % 5}", b"a" * k, None, 60 if k % 2 else None) for k in range(100)])
            await c.delete_message("shop", "orders", 0, 1)
            await c.purge("shop", "orders", "orders.7")
            await c.publish("orders.roll", b"r1")
            await c.update_topic("shop", "orders", allow_rollup=True)
            await c.publish("orders.roll", b"r2", headers={"Nats-Rollup": "sub"})
            await _advance(7300)  # max age passes for the oldest orders
            # A compare-and-set (as a KV update): its precondition is not replayed by load.
            first = await c.publish("orders.cas", b"c1", ttl="never")  # "never": still live at the snapshot's cut
            await c.publish("orders.cas", b"c2", headers={"Nats-Expected-Last-Subject-Sequence": str(first.offset)},
                            ttl="never")
            await c.export(seal=True)

    trio.run(main, clock=trio.testing.MockClock())
    return export


def _rows(root: Path) -> list[dict]:  # type: ignore[type-arg]
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table().to_pylist()


def _bucket(r: dict) -> str:  # type: ignore[type-arg]
    if r["ttl_never"]:
        return "never"
    t = r["ttl_seconds"]
    if t is None:
        return "none"
    for limit, name in ((60, "<1m"), (600, "1m-10m"), (3600, "10m-1h"), (86400, "1h-1d")):
        if t < limit:
            return name
    return ">=1d"


def test_analyze_matches_a_plain_python_reference(spark, export_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rows = _rows(export_dir)
    assert {r["removed_reason"] for r in rows if r["removed"]} >= {"delete", "purge", "rollup", "ttl", "max_age"}
    assert any(r["is_marker"] for r in rows)
    out = tmp_path / "analysis"
    summary = analyze(spark, str(export_dir), str(out))

    assert summary["messages"] == len(rows)
    assert summary["live"] == sum(not r["removed"] for r in rows)
    assert summary["bytes"] == sum(len(r["payload"]) for r in rows)
    assert summary["subjects"] == len({(r["stream"], r["topic"], r["subject"]) for r in rows})
    assert summary["removals"] == dict(Counter(r["removed_reason"] for r in rows if r["removed"]))
    assert summary["markers"] == dict(Counter(r["marker_reason"] for r in rows if r["is_marker"]))
    ref_ttl = Counter(_bucket(r) for r in rows)
    assert summary["ttl_distribution"] == {b: ref_ttl.get(b, 0) for b in TTL_BUCKETS}

    def table(name: str) -> list[dict]:  # type: ignore[type-arg]
        return pq.read_table(str(out / name)).to_pylist()

    per_subject = {(r["stream"], r["topic"], r["subject"]): (r["messages"], r["live"], r["bytes"]) for r in table("per_subject")}
    ref: dict = {}
    for r in rows:
        m, lv, b = ref.get((r["stream"], r["topic"], r["subject"]), (0, 0, 0))
        ref[(r["stream"], r["topic"], r["subject"])] = (m + 1, lv + (not r["removed"]), b + len(r["payload"]))
    assert per_subject == ref
    per_hour = Counter()
    for r in table("per_hour"):
        per_hour[(r["topic"], r["hour"].replace(tzinfo=None))] += r["messages"]
    ref_hour = Counter((r["topic"], r["timestamp"].replace(minute=0, second=0, microsecond=0, tzinfo=None)) for r in rows)
    assert per_hour == ref_hour and len(ref_hour) > 3
    largest = [(r["subject"], r["bytes"]) for r in table("largest_subjects")]
    ref_largest = sorted(ref.items(), key=lambda kv: (-kv[1][2], -kv[1][0], kv[0][2]))[:20]
    assert largest == [(k[2], v[2]) for k, v in ref_largest]
    report = (out / "report.md").read_text()
    assert "# ttlbroker export: analysis" in report and f"{len(rows):,}" in report
    for png in ("messages_per_hour.png", "ttl_distribution.png", "removals.png"):
        assert (out / "charts" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _reference_compaction(rows: list[dict], cutoff: dt.datetime) -> dict:  # type: ignore[type-arg]
    best: dict = {}
    for r in rows:
        if r["is_marker"] or r["removed"] or r["timestamp"] > cutoff:
            continue
        if r["expires_at"] is not None and r["expires_at"] <= cutoff:
            continue
        key = (r["stream"], r["topic"], r["subject"])
        if key not in best or r["offset"] > best[key]["offset"]:
            best[key] = r
    return best


def test_compact_matches_a_plain_python_reference(spark, export_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rows = _rows(export_dir)
    times = sorted(r["timestamp"] for r in rows)
    for cutoff in (times[len(times) // 2], times[-1] + dt.timedelta(seconds=100_000)):
        out = tmp_path / f"snap-{cutoff.timestamp():.0f}"
        result = compact(spark, str(export_dir), str(out), cutoff)
        got = _rows(out)
        ref = _reference_compaction(rows, cutoff)
        assert result["rows"] == len(got) == len(ref)
        assert {(r["stream"], r["topic"], r["subject"]): (r["offset"], r["payload"], r["partition"]) for r in got} == {
            k: (v["offset"], v["payload"], v["partition"]) for k, v in ref.items()
        }
        # Same schema (Spark keeps every column, types included) and partitioning.
        f = next(p for p in out.rglob("*.parquet"))
        assert f.relative_to(out).parts[:3][0].startswith("stream=") and f.relative_to(out).parts[2].startswith("partition=")
        schema = pq.read_schema(str(f))

        def kind(t):  # type: ignore[no-untyped-def]  # a map's field names differ between writers
            return (str(t.key_type), str(t.item_type)) if pa.types.is_map(t) else str(t)

        assert [(n, kind(schema.field(n).type)) for n in SCHEMA.names] == [(n, kind(SCHEMA.field(n).type)) for n in SCHEMA.names]


def test_load_a_snapshot_into_a_new_topic(spark, export_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    snap = tmp_path / "snap"
    # The broker ran on virtual time hours ahead of the wall clock: cut after all of it.
    compact(spark, str(export_dir), str(snap), dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1))
    expected = {
        r["subject"]: r for r in _rows(snap)
        if r["stream"] == "shop" and r["topic"] == "orders"
    }
    assert expected and "orders.cas" in expected
    assert {r["topic"] for r in _rows(snap)} == {"orders", "audit"}  # load the orders part of it

    async def main() -> None:
        (tmp_path / "data").mkdir()
        async with start_server(make_config(tmp_path / "data")) as server:
            async with connect(server.address) as c:
                await c.create_stream("restore")
                await c.create_topic("restore", "orders", partitions=2, subjects=["orders.>"], allow_msg_ttl=True)
            result = await load(str(snap), server.address, "restore", "orders", source="shop/orders")
            assert result["errors"] == 0 and result["published"] == len(expected)
            async with connect(server.address) as c:
                got = []
                for p in range(2):
                    got.extend((await c.fetch("restore", "orders", p, 1, 10_000)).messages)
        assert sorted(m.subject for m in got) == sorted(expected)
        now = dt.datetime.now(dt.timezone.utc)
        for m in got:
            r = expected[m.subject]
            assert m.payload == r["payload"]
            assert m.headers == {k: v for k, v in r["headers"]
                                 if k not in ("Nats-TTL", "Nats-Rollup") and not k.startswith("Nats-Expected-")}
            if r["ttl_never"]:
                assert m.never_expires
            elif r["ttl_seconds"]:
                remaining = (r["timestamp"] + dt.timedelta(seconds=r["ttl_seconds"]) - now).total_seconds()
                assert abs(m.ttl - remaining) <= 5
            else:
                assert m.ttl == 0

    trio.run(main)


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_export", *args], capture_output=True, text=True, timeout=300,
        env={**env_with_project(), **(env or {})},
    )


def test_cli_errors_are_one_clear_line(export_dir: Path, tmp_path: Path) -> None:
    p = _run_cli("analyze", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out"))
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [f"error: no such input: {tmp_path / 'nope'} is not a folder"]
    bad = tmp_path / "v99"
    (bad / "stream=s" / "topic=t" / "partition=0").mkdir(parents=True)
    table = pq.read_table(next(export_dir.rglob("*.parquet")))
    pq.write_table(table.replace_schema_metadata({b"ttlbroker.schema_version": b"99"}), bad / "stream=s" / "topic=t" / "partition=0" / "1-1.parquet")
    p = _run_cli("compact", "--input", str(bad), "--output", str(tmp_path / "out"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "schema version 99; this ttlbroker reads version 1 only" in p.stderr
    env = {"PATH": os.path.dirname(sys.executable), "JAVA_HOME": ""}
    p = _run_cli("analyze", "--input", str(export_dir), "--output", str(tmp_path / "out"), env=env)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["error: Spark needs Java 17 or newer: no `java` on PATH and JAVA_HOME is not set"]
