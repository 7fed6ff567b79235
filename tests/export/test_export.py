"""The Parquet export (pyarrow, no Spark): contents, exactly-once under crashes at
every step, idempotence, and the cleaner keeping what is not exported yet."""

from __future__ import annotations

from conftest import require_extra

require_extra("spark", "the export and Spark tests")  # before the imports it guards

import json
import os
import signal
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import trio
from conftest import BrokerProcess, make_config, start_server

import protocol as P
from broker import Clock
from broker.client import ExportNotConfiguredError, connect
from spark_export import CRASH_ENV, MANIFEST_NAME, SCHEMA, SCHEMA_VERSION, VERSION_KEY

NS = 1_000_000_000


def read_export(root: Path):  # type: ignore[no-untyped-def]
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table().to_pylist()


async def advance(seconds: float) -> None:
    trio.lowlevel.current_clock().jump(seconds)  # type: ignore[attr-defined]
    await trio.testing.wait_all_tasks_blocked()


async def test_export_of_plain_ttl_removed_and_marker_messages(mock_clock, tmp_path: Path) -> None:
    export = tmp_path / "export"
    cfg = make_config(tmp_path / "data", **{"export.dir": str(export), "system.partition.fsync": "never"})
    (tmp_path / "data").mkdir()
    async with start_server(cfg, Clock()) as server, connect(server.address, timeout=None) as c:
        await c.create_stream("Shop")
        await c.create_topic(
            "shop", "orders", subjects=["o.>"], message_expiry=3600, subject_delete_marker_ttl=60, max_msgs_per_subject=1
        )
        acks = await c.publish_batch([
            ("o.plain", b"p", {"K": "v"}),
            ("o.ttl", b"t", None, 10),
            ("o.never", b"n", {"Nats-TTL": "never"}),
            ("o.del", b"d"),
            ("o.bin", bytes(range(256))),
        ])
        await c.delete_message("shop", "orders", 0, acks[3].offset)  # Remove marker at 6
        await advance(10.2)  # o.ttl expires: MaxAge marker at 7
        res = await c.export(seal=True)
        assert res["sealed"] == 1 and len(res["exported"]) == 1
        entry = res["exported"][0]
        assert entry["path"] == "stream=shop/topic=orders/partition=0/1-7.parquet" and entry["rows"] == 7
        rows = read_export(export)
        by_offset = {r["offset"]: r for r in rows}
        assert sorted(by_offset) == [1, 2, 3, 4, 5, 6, 7]
        assert {(r["stream"], r["topic"], r["partition"]) for r in rows} == {("shop", "orders", 0)}
        p, t, nv, d, b, m_remove, m_age = (by_offset[k] for k in range(1, 8))
        assert p["subject"] == "o.plain" and p["headers"] == [("K", "v")] and p["payload"] == b"p"
        assert (p["ttl_seconds"], p["ttl_never"], p["removed"], p["is_marker"]) == (None, False, False, False)
        assert p["expires_at"].timestamp() == pytest.approx(p["timestamp"].timestamp() + 3600)
        assert (t["ttl_seconds"], t["removed"], t["removed_reason"]) == (10, True, "ttl")
        assert t["expires_at"].timestamp() == pytest.approx(t["timestamp"].timestamp() + 10)
        assert (nv["ttl_seconds"], nv["ttl_never"], nv["expires_at"]) == (None, True, None)
        assert (d["removed"], d["removed_reason"]) == (True, "delete")
        assert b["payload"] == bytes(range(256))
        assert (m_remove["is_marker"], m_remove["marker_reason"], m_remove["subject"], m_remove["ttl_seconds"]) == (True, "Remove", "o.del", 60)
        assert (m_age["is_marker"], m_age["marker_reason"], m_age["subject"]) == (True, "MaxAge", "o.ttl")
        # Versioned schema.
        f = pq.ParquetFile(str(export / entry["path"]))
        assert f.schema_arrow.metadata[VERSION_KEY] == str(SCHEMA_VERSION).encode()
        assert f.schema_arrow.remove_metadata() == SCHEMA.remove_metadata()
        # Idempotent: a second export changes nothing.
        before = {p.name: p.stat().st_mtime_ns for p in export.rglob("*")}
        again = await c.export()
        assert again["exported"] == [] and again["segments_in_export"] == 1
        assert {p.name: p.stat().st_mtime_ns for p in export.rglob("*")} == before
        stats = await c.stats()
        assert stats["segments_exported"] == 1 and stats["rows_exported"] == 7


async def test_export_without_a_directory_is_a_clear_error(client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ExportNotConfiguredError) as exc:
        await client.export()
    assert exc.value.code == 5001 and "--export-dir" in exc.value.message


async def test_cleaner_keeps_segments_until_they_are_exported(mock_clock, tmp_path: Path) -> None:
    export = tmp_path / "export"
    (tmp_path / "data").mkdir()
    cfg = make_config(
        tmp_path / "data",
        **{"export.dir": str(export), "export.interval": 1000, "message_cleaner.interval": 10, "system.partition.fsync": "never"},
    )
    async with start_server(cfg, Clock()) as server, connect(server.address, timeout=None) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], allow_msg_ttl=True, segment_size=4096)
        for _ in range(3):
            await c.publish_batch([("a.x", b"x" * 400, None, 1)] * 10)
        await advance(2)
        await advance(10)
        assert (await c.stats())["segments_reclaimed"] == 0  # expired but not exported
        res = await c.export()  # the cleaner sealed the expired active segment too
        assert [e["rows"] for e in res["exported"]] == [10, 10, 10]
        await advance(10)
        assert (await c.stats())["segments_reclaimed"] == 3
        rows = read_export(export)
        assert len(rows) == 30 and all(r["removed"] and r["removed_reason"] == "ttl" for r in rows)
        # Reclaimed after export: never exported twice.
        await c.publish_batch([("a.y", b"y")] * 5)
        assert [e["path"] for e in (await c.export(seal=True))["exported"]] == ["stream=s/topic=t/partition=0/31-35.parquet"]
        assert len(read_export(export)) == 35


@pytest.mark.parametrize("step", ["before_write", "after_write", "after_rename"])
async def test_a_crash_at_any_step_leaves_each_segment_exactly_once(tmp_path: Path, step: str) -> None:
    """The export worker dies at ``step`` (the pass is run again at once and dies
    there again): the broker answers EXPORT_FAILED and stays up, and whatever the
    worker left behind, the next broker's export has every segment exactly once."""
    data, export = tmp_path / "data", tmp_path / "export"
    data.mkdir()
    broker = BrokerProcess(data, "--export-dir", str(export), "--fsync", "always", env={CRASH_ENV: step})
    try:
        async with connect(broker.address) as c:
            await c.create_stream("s")
            await c.create_topic("s", "t", subjects=["a.>"], partitions=2)
            await c.publish_batch([(f"a.{i}", str(i).encode()) for i in range(100)])
            with pytest.raises(P.ExportFailedError) as info:  # type: ignore[attr-defined]
                await c.export(seal=True)  # the worker dies at `step`, twice
            assert info.value.message == (
                f"export to {export} failed: the export worker exited with code 86 before the end of the pass"
            )
            stats = await c.stats()  # the broker is up
            assert (stats["export_failures"], stats["segments_exported"]) == (2, 0)
    finally:
        assert broker.stop(signal.SIGTERM) == 0
    assert broker.stderr.count("export_worker_crashed") == 2
    parquet = sorted(p.relative_to(export).as_posix() for p in export.rglob("*.parquet"))
    tmp = list(export.rglob("*.tmp"))
    if step == "before_write":
        assert parquet == [] and tmp == []
    elif step == "after_write":
        assert parquet == [] and len(tmp) == 1  # a partial name, never a .parquet
    else:
        assert len(parquet) == 1 and not (export / MANIFEST_NAME).exists()
    broker = BrokerProcess(data, "--export-dir", str(export))
    try:
        async with connect(broker.address) as c:
            res = await c.export(seal=True)
            assert res["segments_in_export"] == 2
            again = await c.export(seal=True)
            assert again["exported"] == []
    finally:
        assert broker.stop(signal.SIGTERM) == 0
    assert list(export.rglob("*.tmp")) == []
    rows = read_export(export)
    assert sorted(int(r["payload"]) for r in rows) == list(range(100))
    assert len({(r["partition"], r["offset"]) for r in rows}) == 100
    manifest = json.loads((export / MANIFEST_NAME).read_text())
    assert len(manifest["segments"]) == 2


def test_other_readers_see_the_same_rows(tmp_path: Path) -> None:
    """The ecosystem check: pandas and DuckDB read the export as pyarrow does."""
    import duckdb
    import pandas as pd

    export = tmp_path / "export"

    async def main() -> None:
        (tmp_path / "data").mkdir()
        cfg = make_config(tmp_path / "data", **{"export.dir": str(export)})
        async with start_server(cfg) as server, connect(server.address) as c:
            await c.create_stream("s")
            await c.create_topic("s", "t", subjects=["a.>"], partitions=2)
            await c.publish_batch([(f"a.{i % 5}", str(i).encode(), {"n": str(i)}) for i in range(50)])
            await c.export(seal=True)

    trio.run(main)
    expected = sorted((r["subject"], r["payload"]) for r in read_export(export))
    frame = pd.read_parquet(str(export))
    assert sorted(zip(frame["subject"], frame["payload"])) == expected
    assert set(frame["stream"].astype(str)) == {"s"}
    con = duckdb.connect()
    got = con.execute(
        f"select subject, payload, stream, partition from read_parquet('{export}/**/*.parquet', hive_partitioning=true)"
    ).fetchall()
    assert sorted((s, bytes(p)) for s, p, _, _ in got) == expected
    assert {st for _, _, st, _ in got} == {"s"}


async def test_conversion_in_batches_gives_the_same_rows(tmp_path: Path) -> None:
    """Conversion runs in record batches (bounded memory and GIL holds): any batch
    size gives the same rows, corrupt records left out and counted."""
    from spark_export import SegmentJob
    from spark_export._convert import segment_batches

    (tmp_path / "data").mkdir()
    async with start_server(make_config(tmp_path / "data")) as server, connect(server.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], allow_msg_ttl=True)
        await c.publish_batch([(f"a.{i % 7}", str(i).encode(), {"h": str(i)} if i % 3 else None, 60 if i % 2 else None) for i in range(50)])
        await c.delete_message("s", "t", 0, 5)
        part = server.broker.catalog.topics()[0].partitions[0]
        seg = part.log.segments[0]
        job = SegmentJob(1, 1, 0, "s", "t", seg.base, seg.count, seg.log_path, seg.del_path, seg.positions.tobytes(),
                         bytes(seg.state), 0, 0)
        whole = [r for b, _ in segment_batches(job, 1000) for r in b.to_pylist()]
        parts = list(segment_batches(job, 7))
        assert [b.num_rows for b, _ in parts] == [7] * 7 + [1]
        assert [r for b, _ in parts for r in b.to_pylist()] == whole
        assert [r["offset"] for r in whole] == list(range(1, 51))
        assert [r["removed_reason"] for r in whole if r["removed"]] == ["delete"]


# -- a damaged manifest ------------------------------------------------------------------


async def _export_two_segments(data: Path, export: Path) -> bytes:
    """Two segments exported (rows 0..19 then 20..39); returns the manifest as it was
    after the first."""
    async with start_server(make_config(data, **{"export.dir": str(export)})) as server, connect(server.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"])
        await c.publish_batch([(f"a.{i}", str(i).encode()) for i in range(20)])
        await c.export(seal=True)
        first = (export / MANIFEST_NAME).read_bytes()
        await c.publish_batch([(f"a.{i}", str(i).encode()) for i in range(20, 40)])
        await c.export(seal=True)
    return first


async def test_a_damaged_manifest_copy_is_reported_and_nothing_is_exported_twice(tmp_path: Path) -> None:
    data, export = tmp_path / "data", tmp_path / "export"
    data.mkdir()
    await _export_two_segments(data, export)
    path = export / MANIFEST_NAME
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x08
    path.write_bytes(bytes(raw))
    async with start_server(make_config(data, **{"export.dir": str(export)})) as server, connect(server.address) as c:
        assert (await c.stats())["damage_detected"] == 1
        again = await c.export(seal=True)
        assert again["exported"] == [] and again["segments_in_export"] == 2
        await c.publish_batch([(f"a.{i}", str(i).encode()) for i in range(40, 50)])
        assert [e["rows"] for e in (await c.export(seal=True))["exported"]] == [10]
    assert path.read_bytes() == (export / (MANIFEST_NAME + ".1")).read_bytes()
    assert [p.read_bytes() for p in (export / "_quarantine").glob(MANIFEST_NAME + ".*")] == [bytes(raw)]
    rows = read_export(export)
    assert sorted(int(r["payload"]) for r in rows) == list(range(50))


async def test_a_damaged_manifest_over_a_copy_one_generation_behind_exports_the_last_segment_once(tmp_path: Path) -> None:
    """A crash between the two manifest writes left the second copy one segment
    behind, and the newer copy is damaged: the older one is used, and the segment it
    lacks is exported again under the same name, so it is in the export once."""
    data, export = tmp_path / "data", tmp_path / "export"
    data.mkdir()
    first = await _export_two_segments(data, export)
    (export / (MANIFEST_NAME + ".1")).write_bytes(first)
    (export / MANIFEST_NAME).write_bytes((export / MANIFEST_NAME).read_bytes()[:-40])
    async with start_server(make_config(data, **{"export.dir": str(export)})) as server, connect(server.address) as c:
        assert (await c.stats())["damage_detected"] == 1
        res = await c.export()
        assert [e["path"] for e in res["exported"]] == ["stream=s/topic=t/partition=0/21-40.parquet"]
        assert res["segments_in_export"] == 2
    rows = read_export(export)
    assert sorted(int(r["payload"]) for r in rows) == list(range(40))


async def test_both_manifest_copies_damaged_pause_the_export(tmp_path: Path) -> None:
    data, export = tmp_path / "data", tmp_path / "export"
    data.mkdir()
    await _export_two_segments(data, export)
    (export / MANIFEST_NAME).write_bytes(b"")
    raw = bytearray((export / (MANIFEST_NAME + ".1")).read_bytes())
    raw[raw.index(b'"rows": 20') + 9] ^= 0x01  # 20 -> 21
    (export / (MANIFEST_NAME + ".1")).write_bytes(bytes(raw))
    before = {p.relative_to(export).as_posix(): p.read_bytes() for p in export.rglob("*") if p.is_file()}
    async with start_server(make_config(data, **{"export.dir": str(export)})) as server, connect(server.address) as c:
        assert (await c.stats())["damage_detected"] == 2
        with pytest.raises(P.ExportFailedError) as info:  # type: ignore[attr-defined]
            await c.export(seal=True)
        assert info.value.message == (
            f"the export manifest of {export} is damaged (_manifest.json is empty; _manifest.json.1 fails its "
            "checksum (its content changed after it was written)), so which segments are already exported is "
            "unknown and the export is paused: restore _manifest.json from a backup and restart the broker, or "
            f"move {export} aside to export every segment again into a new directory (segments the cleaner "
            "removed after exporting them are only in the old one)"
        )
        part = server.broker.catalog.topics()[0].partitions[0]
        assert all(server.broker.exporter.keeps(part, seg) for seg in part.log.segments)  # the cleaner keeps all
    after = {p.relative_to(export).as_posix(): p.read_bytes() for p in export.rglob("*") if p.is_file()}
    assert after == before  # nothing rewritten, nothing exported


async def test_a_manifest_of_the_previous_format_loads(tmp_path: Path) -> None:
    data, export = tmp_path / "data", tmp_path / "export"
    data.mkdir()
    await _export_two_segments(data, export)
    segments = json.loads((export / MANIFEST_NAME).read_bytes())["segments"]
    (export / MANIFEST_NAME).write_text(json.dumps({"version": 1, "segments": segments}, indent=1, sort_keys=True))
    (export / (MANIFEST_NAME + ".1")).unlink()
    async with start_server(make_config(data, **{"export.dir": str(export)})) as server, connect(server.address) as c:
        assert (await c.stats())["damage_detected"] == 0
        res = await c.export(seal=True)
        assert res["exported"] == [] and res["segments_in_export"] == 2
    upgraded = json.loads((export / MANIFEST_NAME).read_bytes())
    assert upgraded["format"] == "ttlbroker.export_manifest" and upgraded["segments"] == segments
    assert (export / MANIFEST_NAME).read_bytes() == (export / (MANIFEST_NAME + ".1")).read_bytes()
    # The next segment exported writes version 2, with the topic's configuration.
    async with start_server(make_config(data, **{"export.dir": str(export)})) as server, connect(server.address) as c:
        await c.publish("a.new", b"x")
        assert len((await c.export(seal=True))["exported"]) == 1
    v2 = json.loads((export / MANIFEST_NAME).read_bytes())
    assert v2["version"] == 2 and len(v2["segments"]) == 3
    assert [(t["stream"], t["topic"]) for t in v2["topics"].values()] == [("s", "t")]


async def test_the_manifest_records_each_topics_configuration(tmp_path: Path) -> None:
    """What ``load --create-topic`` needs to create a topic again: its partition
    count, max age and options, as of its latest exported segment."""
    from spark_export import Manifest

    data, export = tmp_path / "data", tmp_path / "export"
    data.mkdir()
    async with start_server(make_config(data, **{"export.dir": str(export)})) as server, connect(server.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", partitions=2, message_expiry=600, subjects=["a.>", "b.*"], subject_delete_marker_ttl=5)
        await c.create_topic("s", "u", subjects=["u.*"], republish={"src": "u.*", "dest": "copy.{{wildcard(1)}}"})
        await c.publish_batch([("a.1", b"1"), ("b.2", b"2"), ("u.x", b"3")])
        await c.export(seal=True)
        await c.update_topic("s", "t", max_msgs_per_subject=3)
        await c.publish("a.1", b"again")
        await c.export(seal=True)
        t, u = await c.get_topic("s", "t"), await c.get_topic("s", "u")
    manifest = Manifest.load(str(export), readonly=True)
    by_name = manifest.topics_by_name()
    assert sorted(by_name) == [("s", "t"), ("s", "u")] and len(manifest.topics) == 2
    for details, name in ((t, "t"), (u, "u")):
        entry = by_name[("s", name)]
        assert (entry["partitions"], entry["message_expiry"], entry["options"]) == (
            details.partitions_count, details.message_expiry, details.options
        )
    assert by_name[("s", "t")]["options"]["max_msgs_per_subject"] == 3  # the newer configuration
    assert by_name[("s", "u")]["options"]["republish"] == {"src": "u.*", "dest": "copy.{{wildcard(1)}}", "headers_only": False}
    assert json.loads((export / MANIFEST_NAME).read_bytes())["version"] == 2


async def test_stats_show_the_progress_of_the_pass_under_way(tmp_path: Path) -> None:
    """``export_pass_done`` of ``export_pass_segments`` while a pass runs (what
    ``ttlbroker export`` draws its bar from), both 0 between passes."""
    import functools
    import os
    import sys

    go_on = tmp_path / "go_on"
    os.mkfifo(go_on)
    cfg = make_config(tmp_path / "data", **{"export.dir": str(tmp_path / "export"), "system.partition.fsync": "never"})
    (tmp_path / "data").mkdir()
    async with start_server(cfg, Clock()) as server, connect(server.address) as c, connect(server.address) as watcher:
        server.broker.exporter.worker_command = (sys.executable, str(Path(__file__).with_name("held_worker.py")), str(go_on))
        await c.create_stream("s")
        await c.create_topic("s", "t", partitions=3, subjects=["a.>"])
        await c.publish_batch([(f"a.{i}", b"x") for i in range(30)])
        stats = await watcher.stats()
        assert (stats["export_pass_segments"], stats["export_pass_done"]) == (0, 0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(c.export, seal=True))  # seal the 3 active segments, export them
            with trio.fail_after(30):
                while (stats := await watcher.stats())["export_pass_done"] == 0:  # the worker is held after one
                    await trio.sleep(0.01)
            await trio.to_thread.run_sync(go_on.write_text, "go on")
        assert (stats["export_pass_segments"], stats["export_pass_done"]) == (3, 1)
        stats = await watcher.stats()
        assert (stats["export_pass_segments"], stats["export_pass_done"], stats["segments_exported"]) == (0, 0, 3)


async def test_segments_gone_while_the_worker_runs_are_left_out_and_the_pass_goes_on(tmp_path: Path) -> None:
    """A segment whose log file is gone when the worker comes to it is left out and
    the pass exports the rest: silently (a log line) when its topic was deleted
    meanwhile, reported as damage when the broker still has the segment."""
    import functools
    import sys

    go_on = tmp_path / "go_on"
    os.mkfifo(go_on)
    cfg = make_config(tmp_path / "data", **{"export.dir": str(tmp_path / "export"), "system.partition.fsync": "never"})
    (tmp_path / "data").mkdir()
    async with start_server(cfg, Clock()) as server, connect(server.address) as c, connect(server.address) as admin:
        server.broker.exporter.worker_command = (sys.executable, str(Path(__file__).with_name("held_worker.py")), str(go_on))
        await c.create_stream("s")
        for name in ("t", "u", "v"):
            await c.create_topic("s", name, subjects=[f"{name}.>"])
            await c.publish_batch([(f"{name}.{i}", b"x") for i in range(5)])
        logs = {p.topic.name: p.log for p in server.broker.all_partitions()}
        res: dict[str, object] = {}

        async def export() -> None:
            res.update(await c.export(seal=True))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(export))
            with trio.fail_after(30):
                while (await admin.stats())["export_pass_done"] == 0:  # held after t's segment
                    await trio.sleep(0.01)
            await admin.delete_topic("s", "u")
            os.unlink(logs["v"].segments[0].log_path)  # v is still there: this is damage
            await trio.to_thread.run_sync(go_on.write_text, "go on")
        stats = await admin.stats()
    assert [e["topic"] for e in res["exported"]] == ["t"]  # type: ignore[union-attr]
    assert stats["damage_detected"] == 1 and stats["export_failures"] == 0


async def test_seal_syncs_each_segment_off_the_loop_and_skips_a_topic_deleted_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``export(seal=True)`` syncs each active segment's records in a worker thread
    before sealing it (the loop goes on serving: here it deletes a topic meanwhile),
    and a partition whose topic was deleted during that sync is not sealed."""
    import threading

    from storage import PartitionLog

    syncing, go_on = threading.Event(), threading.Event()
    synced_in: list[bool] = []
    held: list[PartitionLog] = []
    flush = PartitionLog.flush_active

    def flush_held(log: PartitionLog) -> None:
        synced_in.append(threading.current_thread() is not threading.main_thread())
        if log in held:
            syncing.set()
            go_on.wait(30)
        flush(log)

    cfg = make_config(tmp_path / "data", **{"export.dir": str(tmp_path / "export")})
    (tmp_path / "data").mkdir()
    async with start_server(cfg, Clock()) as server, connect(server.address) as c, connect(server.address) as admin:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        await c.create_topic("s", "u", subjects=["u.>"])
        await c.publish_batch([("t.1", b"x"), ("u.1", b"y")])
        held.extend(p.log for p in server.broker.all_partitions() if p.topic.name == "u")
        monkeypatch.setattr(PartitionLog, "flush_active", flush_held)
        res: dict[str, object] = {}

        async def export() -> None:
            res.update(await c.export(seal=True))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(export)
            with trio.fail_after(30):
                await trio.to_thread.run_sync(syncing.wait, 30)
                await admin.delete_topic("s", "u")  # served while u's segment is being synced
            go_on.set()
    assert synced_in == [True, True]
    assert res["sealed"] == 1
    assert [e["path"] for e in res["exported"]] == ["stream=s/topic=t/partition=0/1-1.parquet"]  # type: ignore[attr-defined]


async def test_seal_writes_index_files_off_the_loop_and_none_for_a_topic_deleted_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``export(seal=True)`` writes each sealed segment's index and summary files in a
    worker thread (``Segment.write_seal_files``) after switching to a new active
    segment: the loop goes on serving meanwhile (here a publish to the same
    partition, and a topic deletion), and a segment whose topic was deleted while
    its files were being written gets none."""
    import threading

    from storage import Segment

    writing, go_on = threading.Event(), threading.Event()
    written_in: list[bool] = []
    write = Segment.write_seal_files

    def write_held(seg: Segment, crc: int | None, sync_dir: bool = True) -> bool:
        written_in.append(threading.current_thread() is not threading.main_thread())
        if seg.directory in held_dirs:
            writing.set()
            go_on.wait(30)
        return write(seg, crc, sync_dir)

    held_dirs: list[str] = []
    cfg = make_config(tmp_path / "data", **{"export.dir": str(tmp_path / "export")})
    (tmp_path / "data").mkdir()
    async with start_server(cfg, Clock()) as server, connect(server.address) as c, connect(server.address) as admin:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        await c.create_topic("s", "u", subjects=["u.>"])
        await c.publish_batch([("t.1", b"x"), ("u.1", b"y")])
        held_dirs.extend(p.log.path for p in server.broker.all_partitions() if p.topic.name == "u")
        u_seg = next(p.log.active for p in server.broker.all_partitions() if p.topic.name == "u")
        monkeypatch.setattr(Segment, "write_seal_files", write_held)
        res: dict[str, object] = {}

        async def export() -> None:
            res.update(await c.export(seal=True))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(export)
            with trio.fail_after(30):
                await trio.to_thread.run_sync(writing.wait, 30)
                ack = await admin.publish("u.2", b"z")  # served while u's index is being written
                assert ack.offset == 2  # in the new active segment
                await admin.delete_topic("s", "u")
            go_on.set()
    assert written_in == [True, True]
    assert res["sealed"] == 2
    assert [e["path"] for e in res["exported"]] == ["stream=s/topic=t/partition=0/1-1.parquet"]  # type: ignore[attr-defined]
    assert u_seg.sealed and not os.path.exists(u_seg.index_path) and not os.path.exists(u_seg.summary_path)


async def test_a_record_damaged_on_disk_is_left_out_counted_and_reported(tmp_path: Path) -> None:
    """A byte of a sealed segment changed after it was sealed (its summary's CRC-32 no
    longer matches the file): the worker checks each record, leaves the damaged one
    out, counts it in ``corrupt_records`` and reports it as damage to the broker."""
    export = tmp_path / "export"
    (tmp_path / "data").mkdir()
    cfg = make_config(tmp_path / "data", **{"export.dir": str(export), "system.partition.fsync": "never"})
    async with start_server(cfg) as server, connect(server.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], segment_size=4096)
        for _ in range(2):  # the second batch goes to a new segment: the first one is sealed
            await c.publish_batch([(f"a.{i}", str(i).encode() * 400) for i in range(10)])
        plog = server.broker.catalog.topics()[0].partitions[0].log
        await server.broker.sealer.finish(plog)  # the roll's seal, owed to the background task
        seg = plog.segments[0]
        assert seg.sealed_crc is not None and seg.count == 10
        with open(seg.log_path, "r+b") as f:  # the payload of the record at offset 4
            f.seek(seg.positions[3] + 60)
            f.write(b"!")
        res = await c.export()
        (entry,) = res["exported"]
        assert (entry["rows"], entry["corrupt_records"]) == (9, 1)
        assert sorted(int(r["payload"][:1]) for r in read_export(export)) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
        assert (await c.stats())["damage_detected"] == 1


async def test_a_pass_whose_worker_crashed_is_run_again_at_once(tmp_path: Path) -> None:
    import sys

    (tmp_path / "data").mkdir()
    cfg = make_config(tmp_path / "data", **{"export.dir": str(tmp_path / "export"), "system.partition.fsync": "never"})
    async with start_server(cfg) as server, connect(server.address) as c:
        mark = tmp_path / "crashed_once"
        server.broker.exporter.worker_command = (sys.executable, str(Path(__file__).with_name("crash_once_worker.py")), str(mark))
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"])
        await c.publish_batch([(f"a.{i}", b"x") for i in range(5)])
        res = await c.export(seal=True)
        assert mark.exists() and [e["rows"] for e in res["exported"]] == [5]
        stats = await c.stats()
        assert (stats["export_failures"], stats["segments_exported"]) == (1, 1)


async def test_stopping_the_broker_stops_its_export_worker(tmp_path: Path) -> None:
    """A broker shut down in the middle of a pass terminates its worker and waits for
    it: no worker outlives the broker (and writes the manifest beside the next one's)."""
    import os
    import sys

    held, pidfile = tmp_path / "held", tmp_path / "worker.pid"
    os.mkfifo(held)  # never written: the worker stays held after its first segment
    cfg = make_config(tmp_path / "data", **{"export.dir": str(tmp_path / "export"), "system.partition.fsync": "never"})
    (tmp_path / "data").mkdir()

    async def export(c) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(Exception):  # the broker goes away under it
            await c.export(seal=True)

    async with start_server(cfg, Clock()) as server, connect(server.address) as c, connect(server.address) as watcher:
        server.broker.exporter.worker_command = (
            sys.executable, str(Path(__file__).with_name("held_worker.py")), str(held), str(pidfile)
        )
        await c.create_stream("s")
        await c.create_topic("s", "t", partitions=2, subjects=["a.>"])
        await c.publish_batch([(f"a.{i}", b"x") for i in range(20)])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(export, c)
            with trio.fail_after(30):
                while (await watcher.stats())["export_pass_done"] == 0:
                    await trio.sleep(0.01)
            pid = int(pidfile.read_text())
            os.kill(pid, 0)  # the worker is there, held
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE  # [export] worker_priority = "idle", the default
            nursery.cancel_scope.cancel()
    with pytest.raises(ProcessLookupError):  # terminated and reaped when the broker stopped
        os.kill(pid, 0)
    assert (tmp_path / "export" / MANIFEST_NAME).exists() and not list((tmp_path / "export").rglob("*.tmp"))


@pytest.mark.parametrize(("priority", "policy", "nicer"), [("idle", "SCHED_IDLE", 0), ("low", "SCHED_OTHER", 10), ("normal", "SCHED_OTHER", 0)])
def test_the_worker_priority_is_lowered_as_configured(priority: str, policy: str, nicer: int) -> None:
    import os
    import subprocess
    import sys

    from spark_export._spawn import lower_priority

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert lower_priority(proc.pid, priority) == priority
        assert os.sched_getscheduler(proc.pid) == getattr(os, policy)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + nicer)
    finally:
        proc.communicate(b"")


async def test_a_worker_that_does_not_speak_the_protocol_fails_the_pass(tmp_path: Path) -> None:
    import sys

    (tmp_path / "data").mkdir()
    cfg = make_config(tmp_path / "data", **{"export.dir": str(tmp_path / "export"), "system.partition.fsync": "never"})
    async with start_server(cfg) as server, connect(server.address) as c:
        server.broker.exporter.worker_command = (sys.executable, "-c", "print('hello')")
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"])
        await c.publish("a.1", b"x")
        with pytest.raises(P.ExportFailedError) as info:  # type: ignore[attr-defined]
            await c.export(seal=True)
        assert info.value.message == (
            f"export to {tmp_path / 'export'} failed: the export worker wrote what is not an event: b'hello'"
        )
        stats = await c.stats()  # crashed, run again, crashed again
        assert (stats["export_failures"], stats["segments_exported"], stats["export_pass_segments"]) == (2, 0, 0)
