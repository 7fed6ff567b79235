"""Integrity of the metadata files: the catalog, consumer offsets and KV leases, the
export manifest, and directories the catalog does not name.

The rule: never serve a message whose deletion was acknowledged, never
drop or hide a live acknowledged message, never give out an offset or id twice,
never delete a directory or file the broker cannot prove is garbage; damage is
reported once with its file and position.

Each fault trial copies a real data directory (or metadata file pair), applies one
seeded random damage to one copy of a file (a bit flip, a truncation, or a zeroed
4 KiB page: for a file under 4 KiB the whole file or a random range), opens it, and
classifies the outcome. The accepted outcomes are:

* ``detected``: exactly one Damage naming the damaged file, the state is exactly
  what was written, both copies are valid and identical again, the damaged bytes
  are in the quarantine folder, nothing under ``streams/`` was removed;
* ``boundary cut`` (consumer offsets only): a truncation exactly on an entry
  boundary leaves a file that is valid but shorter. It cannot be told from a crash
  between the two appends, so it is not reported; the state is still exact (from
  the mirror) and the short copy is rewritten.

Anything else is a failure. ``pytest -s`` prints the table of trials by file kind,
damage and outcome.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import env_with_project, extra_missing, make_config, require, start_server

import protocol as P
from broker.core import Broker
from broker.server import Services
from broker.client import connect
from storage import ConsumerOffsets, Damage, DataDir, StorageFailure

PAGE = 4096
KINDS = ("flip", "truncate", "zero")
TABLE: collections.Counter[tuple[str, str, str]] = collections.Counter()


def damage(raw: bytes, how: str, rng: random.Random) -> bytes:
    """One seeded random damage of ``raw`` (always a change)."""
    while True:
        b = bytearray(raw)
        if how == "flip":
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif how == "truncate":
            del b[rng.randrange(len(b)) :]
        elif len(b) >= PAGE:
            page = rng.randrange((len(b) + PAGE - 1) // PAGE) * PAGE
            b[page : page + PAGE] = bytes(len(b[page : page + PAGE]))
        elif rng.random() < 0.5:
            b = bytearray(len(b))
        else:
            start = rng.randrange(len(b))
            end = rng.randrange(start + 1, len(b) + 1)
            b[start:end] = bytes(end - start)
        if bytes(b) != raw:
            return bytes(b)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (files with their bytes, directories as None)."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        out[p.relative_to(root).as_posix()] = p.read_bytes() if p.is_file() else None
    return out


def print_table(title: str) -> None:
    rows = sorted((k, n) for k, n in TABLE.items() if k[0] == title)
    print(f"\n{title}: {sum(n for _, n in rows)} trials")
    for (_, how, outcome), n in rows:
        print(f"  {how:<10} {outcome:<40} {n}")


# -- a real data directory to damage ------------------------------------------------------


async def _build(root: Path) -> None:
    async with start_server(make_config(root)) as h, connect(h.address) as c:
        await c.create_stream("shop")
        await c.create_topic("shop", "orders", partitions=3, subjects=["orders.>"])
        await c.create_topic("shop", "gone", subjects=["gone.>"])
        await c.create_topic("shop", "sessions", subjects=["session.>"], allow_msg_ttl=True, message_expiry=3600)
        await c.create_stream("audit")
        await c.create_topic("audit", "log", partitions=2, subjects=["audit.>"], max_msgs_per_subject=50)
        await c.publish_batch([(f"orders.{i % 7}", b"o%d" % i) for i in range(300)])
        await c.publish_batch([(f"audit.{i % 3}", b"a%d" % i) for i in range(60)])
        await c.publish_batch([(f"session.{i}", b"s", None, 600) for i in range(10)])
        await c.delete_topic("shop", "gone")
        for i in range(40):
            await c.store_offset("shop", "orders", f"group-{i % 6}", i % 3, i + 1)
        await c.delete_offset("shop", "orders", "group-5", 2)
        kv = await c.kv_create("cfg", ttl=3600, refresh="on_read_and_write")
        for i in range(8):
            await kv.put(f"k{i}", b"v")
        for i in range(8):
            await kv.touch(f"k{i}")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("template") / "data"
    root.mkdir()
    trio.run(_build, root)
    return root


def _copy(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest, ignore=shutil.ignore_patterns("LOCK"))
    return dest


def _open_broker(root: Path) -> tuple[Broker, list[Damage]]:
    b = Services(Broker(make_config(root))).broker  # with the consumers' and KV's hooks
    seen: list[Damage] = []
    forward = b.datadir.report

    def report(d: Damage) -> None:
        seen.append(d)
        forward(d)

    b.datadir.report = report
    b.open()
    return b, seen


# -- the catalog -------------------------------------------------------------------------


def test_catalog_trials(template: Path, tmp_path: Path) -> None:
    """Damage to one catalog copy: the other is used, exactly one report, both copies
    rewritten, the damaged one kept in quarantine/, nothing under streams/ removed."""
    names = ("catalog.json", "catalog.json.1")
    expected = DataDir(str(template)).load_catalog()
    skeleton = tmp_path / "skeleton"  # what the unknown-path check looks at: streams/<id>/topics/<id>
    for p in (template / "streams").glob("*/topics/*"):
        (skeleton / p.relative_to(template)).mkdir(parents=True)
    streams_before = tree(skeleton / "streams")
    rng = random.Random(10_001)
    n = 0
    for how in KINDS:
        for which in names:
            for _ in range(25):
                n += 1
                root = tmp_path / f"t{n}"
                root.mkdir()
                shutil.copy(template / names[0], root / names[0])
                shutil.copy(template / names[1], root / names[1])
                shutil.copytree(skeleton / "streams", root / "streams")
                bad = damage((root / which).read_bytes(), how, rng)
                (root / which).write_bytes(bad)
                seen: list[Damage] = []
                dd = DataDir(str(root), seen.append)
                body = dd.load_catalog()
                assert body == expected, (how, which)
                named = {s["id"]: {t["id"] for t in s["topics"]} for s in body["streams"]}
                _, pending = dd.remove_garbage([tuple(e) for e in body["removing"]], named)
                dd.report_unknown(named, pending)
                assert [(d.kind, d.path) for d in seen] == [("catalog", str(root / which))], (how, which, seen)
                assert tree(root / "streams") == streams_before
                assert (root / names[0]).read_bytes() == (root / names[1]).read_bytes() == (template / names[0]).read_bytes()
                kept = list((root / "quarantine").glob(which + ".*"))
                assert [p.read_bytes() for p in kept] == ([bad] if bad else [])
                again: list[Damage] = []
                assert DataDir(str(root), again.append).load_catalog() == expected and again == []
                TABLE["catalog", how, "detected, other copy used"] += 1
    print_table("catalog")


def test_catalog_trials_with_both_copies_damaged(template: Path, tmp_path: Path) -> None:
    """Damage to both copies: rebuilt from their intact parts when the damage does not
    overlap (two reports, exact state), otherwise the catalog is unreadable and
    nothing changes. Never a wrong catalog."""
    from storage import StorageFailure

    names = ("catalog.json", "catalog.json.1")
    expected = DataDir(str(template)).load_catalog()
    raw = (template / names[0]).read_bytes()
    rng = random.Random(10_004)
    n = 0
    for how_a in KINDS:
        for how_b in KINDS:
            for _ in range(10):
                n += 1
                root = tmp_path / f"t{n}"
                (root / "streams").mkdir(parents=True)
                bad = [damage(raw, how_a, rng), damage(raw, how_b, rng)]
                for name, data in zip(names, bad):
                    (root / name).write_bytes(data)
                seen: list[Damage] = []
                try:
                    body = DataDir(str(root), seen.append).load_catalog()
                except StorageFailure as exc:
                    assert "the broker will not start without it" in exc.message
                    assert [(root / m).read_bytes() for m in names] == bad and seen == []
                    outcome = "unreadable: refused, nothing changed"
                else:
                    assert body == expected, (how_a, how_b)
                    assert sorted(d.path for d in seen) == [str(root / m) for m in names]
                    assert (root / names[0]).read_bytes() == (root / names[1]).read_bytes() == raw
                    outcome = "rebuilt from both copies"
                TABLE["catalog", f"{how_a}+{how_b}", outcome] += 1
    print_table("catalog")


def test_flipped_topic_ids_in_the_catalog_delete_nothing(template: Path, tmp_path: Path) -> None:
    """The issue's case through Broker.open: a flip that keeps the JSON valid (an id
    1 turned into 3) in either copy. Same topics and messages, every file still
    there, one damage counted."""
    ref, _ = _open_broker(_copy(template, tmp_path / "ref"))
    expected = ref.catalog.to_json()
    counts = {t.full_name: t.messages_count for t in ref.catalog.topics()}
    ref.close()
    raw = (template / "catalog.json").read_bytes()
    positions = [i + len(b'"id": ') for i in range(len(raw)) if raw.startswith(b'"id": ', i)]
    assert len(positions) >= 6
    trials = 0
    for which in ("catalog.json", "catalog.json.1"):
        for pos in positions:
            for bit in (1, 2):
                trials += 1
                root = _copy(template, tmp_path / f"t{trials}")
                before = tree(root / "streams")
                data = bytearray((root / which).read_bytes())
                data[pos] ^= bit
                (root / which).write_bytes(bytes(data))
                json.loads(data)  # still valid JSON: only the checksum can tell
                b, seen = _open_broker(root)
                try:
                    assert b.catalog.to_json() == expected
                    assert {t.full_name: t.messages_count for t in b.catalog.topics()} == counts
                    assert [d.kind for d in seen] == ["catalog"] and b.counters.damage_detected == 1
                finally:
                    b.close()
                after = tree(root / "streams")
                assert set(before) <= set(after), set(before) - set(after)
                assert all(after[p] == v for p, v in before.items() if p.endswith(".log") and v is not None)
                TABLE["catalog", "id flip", "detected, nothing deleted"] += 1
    print_table("catalog")


def _serve_error(root: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--port", "0", "--data", str(root)],
        capture_output=True, text=True, env=env_with_project(), timeout=60,
    )
    return proc.returncode, "".join(line for line in proc.stderr.splitlines(keepends=True) if not line.startswith("ts="))


def test_both_catalog_copies_damaged_refuse_to_start(template: Path, tmp_path: Path) -> None:
    root = _copy(template, tmp_path / "data")
    (root / "catalog.json").write_bytes(b'{"crc32": 12')  # cut short
    raw = bytearray((root / "catalog.json.1").read_bytes())
    raw[raw.index(b'"name": "shop"') + 10] ^= 0x01  # shop -> rhop
    (root / "catalog.json.1").write_bytes(bytes(raw))
    before = tree(root / "streams")
    code, err = _serve_error(root)
    assert code == 2
    assert err == (
        f"error: STORAGE_FAILURE (4002): the catalog of {root} is damaged (catalog.json is not valid JSON "
        "(Expecting ',' delimiter: line 1 column 13 (char 12)); catalog.json.1 fails its checksum (its content changed after it was written)) "
        "and the broker will not start without it: restore catalog.json from a backup (both copies are left as "
        "they are; docs/operations.md, 'Files and what protects them', says how to mend one by hand)\n"
    )
    assert tree(root / "streams") == before


def test_a_missing_catalog_over_existing_data_refuses_to_start(template: Path, tmp_path: Path) -> None:
    root = _copy(template, tmp_path / "data")
    (root / "catalog.json").unlink()
    (root / "catalog.json.1").unlink()
    code, err = _serve_error(root)
    assert code == 2
    assert err == (
        f"error: STORAGE_FAILURE (4002): {root} has no catalog (catalog.json and catalog.json.1 are missing) "
        "but streams/ holds data; the broker will not start over it: restore catalog.json from a backup\n"
    )
    assert (root / "streams" / "1").is_dir()


def test_one_missing_copy_is_reported_and_rewritten(template: Path, tmp_path: Path) -> None:
    for which in ("catalog.json", "catalog.json.1"):
        root = _copy(template, tmp_path / which)
        (root / which).unlink()
        b, seen = _open_broker(root)
        b.close()
        assert [(d.kind, d.path, d.detail) for d in seen] == [("catalog", str(root / which), "copy is missing")]
        assert (root / which).read_bytes() == (template / which).read_bytes()


def test_a_crash_between_the_two_writes_is_not_damage(template: Path, tmp_path: Path) -> None:
    """catalog.json one generation ahead of catalog.json.1: the newer one wins, the
    other is brought up to date, nothing is reported."""
    root = _copy(template, tmp_path / "data")
    dd = DataDir(str(root))
    body = dd.load_catalog()
    assert body is not None
    old = (root / "catalog.json.1").read_bytes()
    body["streams"][0]["name"] = "renamed"
    dd.save_catalog(body)
    dd.close_catalog()  # the journal folded into a new snapshot: both copies rewritten
    (root / "catalog.json.1").write_bytes(old)  # as if the crash came before the second write
    seen: list[Damage] = []
    dd2 = DataDir(str(root), seen.append)
    assert dd2.load_catalog() == body and seen == []
    assert (root / "catalog.json").read_bytes() == (root / "catalog.json.1").read_bytes()
    assert dd2.catalog_generation == dd.catalog_generation


def test_a_catalog_of_the_previous_format_loads_and_is_upgraded(template: Path, tmp_path: Path) -> None:
    root = _copy(template, tmp_path / "data")
    body = DataDir(str(root)).load_catalog()
    assert body is not None
    legacy = {"version": 1, "streams": [{k: v for k, v in s.items() if k != "next_topic_id"} for s in body["streams"]]}
    (root / "catalog.json").write_bytes(json.dumps(legacy, indent=1, sort_keys=True).encode())
    (root / "catalog.json.1").unlink()
    b, seen = _open_broker(root)
    try:
        assert seen == []
        assert sorted(t.full_name for t in b.catalog.topics()) == sorted(
            f"{s['name']}/{t['config']['name']}" for s in body["streams"] for t in s["topics"]
        )
    finally:
        b.close()
    first = json.loads((root / "catalog.json").read_bytes())
    assert first["format"] == "ttlbroker.catalog" and first["generation"] >= 1
    assert (root / "catalog.json").read_bytes() == (root / "catalog.json.1").read_bytes()


# -- unknown directories and ids ---------------------------------------------------------------


def test_unknown_paths_are_reported_and_left_alone(template: Path, tmp_path: Path) -> None:
    root = _copy(template, tmp_path / "data")
    (root / "streams" / "1" / "topics" / "9" / "partitions" / "0").mkdir(parents=True)
    (root / "streams" / "1" / "topics" / "9" / "partitions" / "0" / "x.log").write_bytes(b"old data")
    (root / "streams" / "77").mkdir()
    (root / "streams" / "notes.txt").write_text("an operator's file")
    (root / "streams" / "1" / "topics" / "backup").mkdir()
    before = tree(root / "streams")
    b, seen = _open_broker(root)
    b.close()
    after = tree(root / "streams")
    assert set(before) <= set(after)
    assert {p: v for p, v in after.items() if "partition.state" not in p} == {
        p: v for p, v in before.items() if "partition.state" not in p
    }
    unknown = sorted((d.path, d.detail) for d in seen if d.kind == "unknown_path")
    assert unknown == sorted([
        (str(root / "streams" / "1" / "topics" / "9"), "a directory the catalog does not name"),
        (str(root / "streams" / "1" / "topics" / "backup"), "a directory the catalog does not name"),
        (str(root / "streams" / "77"), "a directory the catalog does not name"),
        (str(root / "streams" / "notes.txt"), "a file the catalog does not name"),
    ])
    assert all(d.action == "left in place; `ttlbroker repair` moves it to quarantine/" for d in seen)
    assert len(seen) == 4


def test_listed_removals_are_finished_at_start(template: Path, tmp_path: Path) -> None:
    """A stop between the catalog write of a delete (or create) and the end of the
    removal: the catalog lists the directory, so it is proven garbage."""
    root = _copy(template, tmp_path / "data")
    dd = DataDir(str(root))
    body = dd.load_catalog()
    assert body is not None
    shop = next(s for s in body["streams"] if s["name"] == "shop")
    orders = next(t for t in shop["topics"] if t["config"]["name"] == "orders")
    shop["topics"].remove(orders)
    body["removing"] = [[shop["id"], orders["id"]], [shop["id"], 40]]
    (root / "streams" / str(shop["id"]) / "topics" / "40").mkdir()  # a create cut short
    dd.save_catalog(body)
    b, seen = _open_broker(root)
    b.close()
    assert seen == []
    assert not (root / "streams" / str(shop["id"]) / "topics" / str(orders["id"])).exists()
    assert not (root / "streams" / str(shop["id"]) / "topics" / "40").exists()
    after = DataDir(str(root)).load_catalog()
    assert after is not None and after["removing"] == []


async def test_restart_after_damaging_catalog_json(data_dir: Path) -> None:
    """The issue's case through the server: a topic id 1 turned into 3 in catalog.json."""
    cfg = make_config(data_dir)
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        await c.publish_batch([(f"t.{i}", b"%d" % i) for i in range(300)])
    path = data_dir / "catalog.json"
    raw = bytearray(path.read_bytes())
    i = raw.index(b'"id": 1', raw.index(b'"topics"'))  # the topic's id, after the stream's
    raw[i + 6] ^= 0x02  # "1" -> "3"
    path.write_bytes(bytes(raw))
    async with start_server(cfg) as h, connect(h.address) as c:
        t = await c.get_topic("s", "t")
        assert t.id == 1 and t.messages_count == 300
        f = await c.fetch("s", "t", 0, 1, 1000)
        assert [m.payload for m in f.messages] == [b"%d" % i for i in range(300)]
        assert (await c.stats())["damage_detected"] >= 1
    assert path.read_bytes() == (data_dir / "catalog.json.1").read_bytes()
    assert len(list((data_dir / "quarantine").glob("catalog.json.*"))) == 1


async def test_an_unknown_directory_survives_a_restart_and_its_id_is_not_used(data_dir: Path) -> None:
    cfg = make_config(data_dir)
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
    stray = data_dir / "streams" / "1" / "topics" / "2"
    (stray / "partitions" / "0").mkdir(parents=True)
    (stray / "partitions" / "0" / "00000000000000000001.log").write_bytes(b"somebody's data")
    async with start_server(cfg) as h, connect(h.address) as c:
        assert (await c.stats())["damage_detected"] == 1
        t2 = await c.create_topic("s", "u", subjects=["u.>"])
        assert t2.id == 3  # 2 is the unknown directory's
        with pytest.raises(P.TopicIdExistsError) as info:  # type: ignore[attr-defined]
            await c.create_topic("s", "v", subjects=["v.>"], topic_id=2)
        assert info.value.message == (
            f"topic id 2 is taken by {stray}, a directory the catalog does not name "
            "(see the broker's unknown_path damage reports; `ttlbroker repair` moves it to quarantine/)"
        )
    assert (stray / "partitions" / "0" / "00000000000000000001.log").read_bytes() == b"somebody's data"


async def test_stream_and_topic_ids_are_never_reused(data_dir: Path) -> None:
    cfg = make_config(data_dir)
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        for name in ("a", "b", "c"):
            await c.create_topic("s", name, subjects=[f"{name}.>"])
        await c.delete_topic("s", "c")
        assert (await c.create_topic("s", "d", subjects=["d.>"])).id == 4
        await c.delete_topic("s", "d")
    async with start_server(cfg) as h, connect(h.address) as c:
        assert (await c.create_topic("s", "e", subjects=["e.>"])).id == 5
        await c.publish("e.1", b"new topic, empty directory")
        assert (await c.fetch("s", "e", 0, 1, 10)).messages[0].offset == 1
        await c.create_stream("x")
        assert (await c.get_stream("x")).id == 2
        await c.delete_stream("x")
    async with start_server(cfg) as h, connect(h.address) as c:
        assert (await c.create_stream("y")).id == 3
        assert (await c.stats())["damage_detected"] == 0
    assert sorted(p.name for p in (data_dir / "streams").iterdir()) == ["1"]
    assert sorted(p.name for p in (data_dir / "streams" / "1" / "topics").iterdir()) == ["1", "2", "5"]


# -- consumer offsets and KV leases ----------------------------------------------------------


def _offsets_template(root: Path) -> tuple[Path, dict[tuple[str, int], int]]:
    """A consumers.log pair past 4 KiB: entries, a compaction (snapshot marker), then
    more entries, forgets and KV leases."""
    path = root / "consumers.log"
    c = ConsumerOffsets(str(path))
    rng = random.Random(7)
    for i in range(120):
        c.store(f"consumer-group-{i % 9}", i % 4, i + 1)
    c.close()
    c = ConsumerOffsets(str(path))  # compacts: 120 entries for 36 names
    for i in range(150):
        r = rng.random()
        if r < 0.6:
            c.store(f"consumer-group-{rng.randrange(12)}", rng.randrange(4), rng.randrange(1, 10**9))
        elif r < 0.85:
            c.store(f"$refresh.{rng.randrange(1, 500)}", 0, rng.randrange(10**18, 2 * 10**18))
        else:
            key = rng.choice(sorted(c.offsets))
            c.forget(*key)
    c.close()
    assert path.stat().st_size > PAGE and path.read_bytes() == Path(str(path) + ".1").read_bytes()
    return path, dict(c.offsets)


def _boundaries(raw: bytes) -> set[int]:
    from storage._datadir import _HEAD

    out, pos = {0}, 0
    while pos < len(raw):
        pos += _HEAD.size + raw[pos + 1] + 4
        out.add(pos)
    return out


def test_consumer_offsets_trials(tmp_path: Path) -> None:
    src, expected = _offsets_template(tmp_path / "template")
    raw = src.read_bytes()
    bounds = _boundaries(raw)
    rng = random.Random(10_002)
    n = 0
    for how in KINDS:
        for which in ("consumers.log", "consumers.log.1"):
            for _ in range(30):
                n += 1
                folder = tmp_path / f"t{n}"
                folder.mkdir()
                for name in ("consumers.log", "consumers.log.1"):
                    (folder / name).write_bytes(raw)
                bad = damage(raw, how, rng)
                (folder / which).write_bytes(bad)
                seen: list[Damage] = []
                c = ConsumerOffsets(str(folder / "consumers.log"), seen.append)
                c.close()
                assert c.offsets == expected, (how, which)
                if how == "truncate" and len(bad) in bounds:
                    assert seen == []
                    outcome = "boundary cut: exact from the mirror"
                else:
                    assert [(d.kind, d.path) for d in seen] == [("consumer_offsets", str(folder / which))], (how, seen)
                    assert seen[0].position is not None and seen[0].position <= len(bad)
                    kept = list((folder / "quarantine").glob(which + ".*"))
                    assert [p.read_bytes() for p in kept] == [bad]
                    outcome = "detected, exact from the mirror"
                a, b = (folder / "consumers.log").read_bytes(), (folder / "consumers.log.1").read_bytes()
                assert a == b
                again: list[Damage] = []
                c2 = ConsumerOffsets(str(folder / "consumers.log"), again.append)
                assert c2.offsets == expected and again == []
                c2.store("after", 0, 1)  # sequence numbers go on above every old entry
                c2.close()
                c3 = ConsumerOffsets(str(folder / "consumers.log"))
                assert c3.offsets == {**expected, ("after", 0): 1}
                c3.close()
                TABLE["consumer offsets", how, outcome] += 1
    print_table("consumer offsets")


def test_consumer_offsets_files_are_made_by_the_first_entry(tmp_path: Path) -> None:
    """A topic's offset files do not exist until a name's offset is stored (most
    topics never store one, and two fewer files make a stream's creation cheaper);
    the first store makes both, and they read back. Read-only, a store still fails
    and makes nothing."""
    path = tmp_path / "t" / "consumers.log"
    mirror = Path(str(path) + ".1")
    c = ConsumerOffsets(str(path))
    assert not path.exists() and not mirror.exists()
    assert c.take_dirty_fds() == []
    assert c.forget("nobody", 0) is False and not path.exists()
    c.close()
    assert ConsumerOffsets(str(path)).offsets == {}  # reopened: still nothing, nothing reported
    ro = ConsumerOffsets(str(path), readonly=True)
    with pytest.raises(StorageFailure):
        ro.store("g", 0, 1)
    assert not path.exists() and not mirror.exists()
    c = ConsumerOffsets(str(path))
    c.store("g", 0, 7)
    assert path.exists() and mirror.exists() and path.read_bytes() == mirror.read_bytes()
    assert len(c.take_dirty_fds()) == 2
    c.close()
    with pytest.raises(StorageFailure):
        c.store("g", 0, 8)  # closed: no silent reopen
    seen: list[Damage] = []
    again = ConsumerOffsets(str(path), seen.append)
    assert again.offsets == {("g", 0): 7} and seen == []
    again.store("h", 1, 3)
    again.close()
    assert ConsumerOffsets(str(path)).offsets == {("g", 0): 7, ("h", 1): 3}


def test_consumer_offsets_damaged_in_both_copies_at_different_entries(tmp_path: Path) -> None:
    path = tmp_path / "consumers.log"
    c = ConsumerOffsets(str(path))
    for i in range(30):
        c.store(f"g{i % 5}", 0, i)
    c.close()
    raw = path.read_bytes()
    entry = len(raw) // 30
    a, b = bytearray(raw), bytearray(raw)
    a[5 * entry + 3] ^= 0x40
    b[20 * entry + 9] ^= 0x01
    path.write_bytes(bytes(a))
    Path(str(path) + ".1").write_bytes(bytes(b))
    seen: list[Damage] = []
    c = ConsumerOffsets(str(path), seen.append)
    c.close()
    assert c.offsets == {(f"g{i}", 0): 25 + i for i in range(5)}
    assert sorted((os.path.basename(d.path), d.position) for d in seen) == [
        ("consumers.log", 5 * entry), ("consumers.log.1", 20 * entry),
    ]


def test_a_stale_copy_left_by_a_crash_during_compaction_brings_nothing_back(tmp_path: Path) -> None:
    """consumers.log compacted (its snapshot marker says what was live), the mirror
    still the old uncompacted file whose forget entry is damaged: the forgotten
    offset stays forgotten."""
    path = tmp_path / "consumers.log"
    c = ConsumerOffsets(str(path))
    for i in range(100):
        c.store(f"g{i % 3}", 0, i)
    c.forget("g1", 0)
    c.close()
    old = bytearray(Path(str(path) + ".1").read_bytes())
    c = ConsumerOffsets(str(path))  # compacts both
    c.close()
    assert c.offsets == {("g0", 0): 99, ("g2", 0): 98}
    old[-5] ^= 0x10  # the forget entry (the last one) of the stale mirror
    Path(str(path) + ".1").write_bytes(bytes(old))
    seen: list[Damage] = []
    c = ConsumerOffsets(str(path), seen.append)
    c.close()
    assert c.offsets == {("g0", 0): 99, ("g2", 0): 98}
    assert [d.kind for d in seen] == ["consumer_offsets"]


def test_consumer_offsets_of_the_first_format_load_and_are_upgraded(tmp_path: Path) -> None:
    import struct
    import zlib

    def old_entry(name: str, partition: int, offset: int) -> bytes:
        head = struct.pack("<IQB", partition, offset, len(name)) + name.encode()
        return head + struct.pack("<I", zlib.crc32(head))

    path = tmp_path / "consumers.log"
    entries = [old_entry("a", 0, 5), old_entry("b", 1, 7), old_entry("a", 0, 9), old_entry("b", 1, 2**64 - 1)]
    path.write_bytes(b"".join(entries))
    seen: list[Damage] = []
    c = ConsumerOffsets(str(path), seen.append)
    c.close()
    assert c.offsets == {("a", 0): 9} and seen == []
    assert path.read_bytes() == Path(str(path) + ".1").read_bytes() and path.read_bytes()[0] == 0xC0
    # A damaged old-format file: the scan resynchronises, the damage is reported.
    bad = bytearray(b"".join(entries[:3]))
    bad[len(entries[0]) + 2] ^= 0x08
    path.write_bytes(bytes(bad))
    Path(str(path) + ".1").unlink()
    c = ConsumerOffsets(str(path), seen.append)
    c.close()
    assert c.offsets == {("a", 0): 9}
    assert [(d.kind, d.position) for d in seen] == [("consumer_offsets", len(entries[0]))]


async def test_consumer_offsets_survive_a_flipped_bit_in_one_mirror(data_dir: Path) -> None:
    cfg = make_config(data_dir)
    stored: dict[tuple[str, int], int] = {}
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", partitions=3, subjects=["t.>"])
        for i in range(60):
            key = (f"reader-{i % 7}", i % 3)
            await c.store_offset("s", "t", key[0], key[1], 1000 + i)
            stored[key] = 1000 + i
    path = data_dir / "streams" / "1" / "topics" / "1" / "consumers.log"
    raw = bytearray(path.read_bytes())
    raw[len(raw) - 20] ^= 0x04  # in the newest entries: the mirror still has them
    path.write_bytes(bytes(raw))
    async with start_server(cfg) as h, connect(h.address) as c:
        for (name, p), off in stored.items():
            assert await c.get_offset("s", "t", name, p) == off
        assert (await c.stats())["damage_detected"] == 1
    assert path.read_bytes() == Path(str(path) + ".1").read_bytes()
    assert len(list((data_dir / "quarantine").rglob("consumers.log.*"))) == 1


# -- the export manifest -----------------------------------------------------------------


def _manifest_template(root: Path) -> dict[str, Any]:
    require(extra_missing("spark"), "the export manifest tests")
    from spark_export import Manifest

    m = Manifest.load(str(root))
    for i in range(25):
        base = 1 + i * 1000
        m.record(f"1/{1 + i % 3}@1763900000000000000/{i % 2}/{base}", {
            "path": f"stream=shop/topic=t{i % 3}/partition={i % 2}/{base}-{base + 999}.parquet",
            "stream": "shop", "topic": f"t{i % 3}", "partition": i % 2, "first_offset": base,
            "last_offset": base + 999, "rows": 1000, "bytes": 123_456 + i, "corrupt_records": 0,
            "exported_at": 1763900000.125 + i,
        })
    return dict(m.segments)


def test_export_manifest_trials(tmp_path: Path) -> None:
    require(extra_missing("spark"), "the export manifest tests")
    from spark_export import MANIFEST_NAME, Manifest

    src = tmp_path / "template"
    expected = _manifest_template(src)
    names = (MANIFEST_NAME, MANIFEST_NAME + ".1")
    raw = (src / names[0]).read_bytes()
    assert len(raw) > PAGE and raw == (src / names[1]).read_bytes()
    rng = random.Random(10_003)
    n = 0
    for how in KINDS:
        for which in names:
            for _ in range(25):
                n += 1
                root = tmp_path / f"t{n}"
                root.mkdir()
                for name in names:
                    (root / name).write_bytes(raw)
                bad = damage(raw, how, rng)
                (root / which).write_bytes(bad)
                seen: list[Damage] = []
                m = Manifest.load(str(root), seen.append)
                assert m.segments == expected
                assert [(d.kind, d.path) for d in seen] == [("export_manifest", str(root / which))], (how, seen)
                assert (root / names[0]).read_bytes() == (root / names[1]).read_bytes() == raw
                kept = list((root / "_quarantine").glob(which + ".*"))
                assert [p.read_bytes() for p in kept] == ([bad] if bad else [])
                again: list[Damage] = []
                assert Manifest.load(str(root), again.append).segments == expected and again == []
                TABLE["export manifest", how, "detected, other copy used"] += 1
    print_table("export manifest")


def test_readonly_reports_the_same_damage_and_changes_nothing(template: Path, tmp_path: Path) -> None:
    """``ttlbroker check`` opens every kind read-only: same reports, no byte changed."""
    require(extra_missing("spark"), "the export manifest tests")
    from spark_export import MANIFEST_NAME, Manifest

    root = _copy(template, tmp_path / "data")
    _manifest_template(tmp_path / "export")
    targets = [
        root / "catalog.json.1",
        root / "streams" / "1" / "topics" / "1" / "consumers.log",
        tmp_path / "export" / MANIFEST_NAME,
    ]
    for path in targets:
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x20
        path.write_bytes(bytes(raw))
    before = tree(tmp_path)
    seen: list[Damage] = []
    dd = DataDir(str(root), seen.append)
    body = dd.load_catalog(readonly=True)
    c = dd.consumer_offsets(1, 1, readonly=True)
    m = Manifest.load(str(tmp_path / "export"), seen.append, readonly=True)
    assert tree(tmp_path) == before
    assert [(d.kind, d.path) for d in seen] == [
        ("catalog", str(targets[0])), ("consumer_offsets", str(targets[1])), ("export_manifest", str(targets[2])),
    ]
    assert all("left as is (check)" in d.action for d in seen)
    assert body == DataDir(str(template)).load_catalog() and len(m.segments) == 25 and c.offsets


def test_kv_refresh_leases_survive_damage_to_one_mirror(template: Path, tmp_path: Path) -> None:
    """Through Broker.open: a flipped bit in a bucket's consumers.log, where its
    refresh leases live; every lease is back in place (keys keep their refreshed
    deadlines), one damage counted."""
    ref, _ = _open_broker(_copy(template, tmp_path / "ref"))
    bucket = next(t for t in ref.catalog.topics() if t.config.kv is not None)
    leases = dict(bucket.partitions[0].refreshed)
    where = (bucket.stream.id, bucket.id)
    ref.close()
    assert len(leases) == 8
    for trial, pos in enumerate((10, 45, 200)):
        root = _copy(template, tmp_path / f"t{trial}")
        path = Path(DataDir(str(root)).topic_dir(*where)) / "consumers.log"
        raw = bytearray(path.read_bytes())
        raw[pos % len(raw)] ^= 0x10
        path.write_bytes(bytes(raw))
        b, seen = _open_broker(root)
        try:
            bucket = next(t for t in b.catalog.topics() if t.config.kv is not None)
            assert dict(bucket.partitions[0].refreshed) == leases
            assert [d.kind for d in seen] == ["consumer_offsets"] and b.counters.damage_detected == 1
        finally:
            b.close()
        TABLE["consumer offsets", "KV lease flip", "detected, exact from the mirror"] += 1
    print_table("consumer offsets")
