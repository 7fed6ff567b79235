"""The catalog's journal (``storage/_catalog_files.py``): a change costs one entry of
its own size, whatever the number of topics; a clean stop folds the journal into
``catalog.json``; a crash at any step of a create or a compaction leaves a catalog
that starts without a damage report; lost or contradicting entries stop the broker
with a message that says what to do."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import trio
from conftest import make_config, start_server

from broker.core import Broker
from broker.client import connect
from storage import Damage, DataDir, StorageFailure

JOURNAL = "catalog.journal"


async def _topics(root: Path, names: list[str], stream: str = "s") -> None:
    async with start_server(make_config(root)) as h, connect(h.address) as c:
        if stream:
            await c.create_stream(stream)
        for name in names:
            await c.create_topic("s", name, subjects=[f"{name}.>"])
        await c.publish_batch([(f"{name}.x", b"v") for name in names])


def _entry_sizes(root: Path) -> list[int]:
    """The size of each journal entry (head 14 bytes, payload, crc 4 bytes)."""
    raw = (root / JOURNAL).read_bytes()
    sizes, pos = [], 0
    while pos + 14 <= len(raw) and raw[pos] == 0xC7:
        length = int.from_bytes(raw[pos + 2 : pos + 6], "little")
        sizes.append(14 + length + 4)
        pos += 14 + length + 4
    return sizes


def test_a_create_appends_one_entry_of_its_own_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating the 60th topic writes as many bytes as creating the 2nd, and
    catalog.json is not rewritten while the broker runs (below the compaction
    size)."""
    root = tmp_path / "data"
    sizes: list[int] = []
    generations: list[int] = []

    async def run() -> None:
        async with start_server(make_config(root)) as h, connect(h.address) as c:
            await c.create_stream("s")
            for i in range(60):
                await c.create_topic("s", f"t{i:03}", subjects=[f"t{i:03}.>"])
                sizes.append(sum(_entry_sizes(root)))
                generations.append(json.loads((root / "catalog.json").read_bytes())["generation"])

    trio.run(run)
    growth = [b - a for a, b in zip(sizes, sizes[1:])]
    # The same bytes per create (give or take an id's digit), 2 topics or 60.
    assert max(growth) - min(growth) <= 8, growth
    assert len(set(generations)) == 1  # the snapshot untouched while running
    assert (root / JOURNAL).read_bytes() == (root / f"{JOURNAL}.1").read_bytes()
    # The clean stop folded everything into catalog.json: the journal only names it.
    body = json.loads((root / "catalog.json").read_bytes())
    assert body["generation"] == generations[0] + 1
    assert len(body["streams"][0]["topics"]) == 60 and "creating" not in body
    assert len(_entry_sizes(root)) == 1


def test_a_restart_after_a_crash_replays_the_journal(tmp_path: Path) -> None:
    """The journal as a crash leaves it (no fold at the stop): every change is there."""
    root = tmp_path / "data"
    trio.run(_topics, root, ["a", "b"])
    saved_json = {n: (root / n).read_bytes() for n in ("catalog.json", "catalog.json.1")}
    saved_journal = {n: (root / n).read_bytes() for n in (JOURNAL, f"{JOURNAL}.1")}

    async def more() -> None:
        async with start_server(make_config(root)) as h, connect(h.address) as c:
            await c.create_topic("s", "c", subjects=["c.>"])
            await c.delete_topic("s", "a")
            snapshot_now = {n: (root / n).read_bytes() for n in ("catalog.json", "catalog.json.1")}
            assert snapshot_now == saved_json  # only the journal changed
            journal = {n: (root / n).read_bytes() for n in (JOURNAL, f"{JOURNAL}.1")}
        # As if killed before the stop: the snapshot and the journal as they were.
        for n, raw in journal.items():
            (root / n).write_bytes(raw)
        for n, raw in saved_json.items():
            (root / n).write_bytes(raw)

    trio.run(more)
    assert saved_journal != {n: (root / n).read_bytes() for n in (JOURNAL, f"{JOURNAL}.1")}
    seen: list[Damage] = []
    b = Broker(make_config(root))
    b.datadir.report = seen.append
    b.open()
    try:
        assert sorted(t.name for t in b.catalog.topics()) == ["b", "c"]
        assert {t.name: t.messages_count for t in b.catalog.topics()} == {"b": 1, "c": 0}
        assert seen == []
        assert not (root / "streams" / "1" / "topics" / "1").exists()  # the delete stays done
    finally:
        b.close()


def test_creates_among_other_changes_and_compactions_replay_to_the_same_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A create records only what it touched (its topic, its stream's entry, the
    top-level values; ``CatalogFiles.save_change``), other changes the whole
    document's difference, and compactions (made small here) fold the saved parts:
    after a crash the catalog read back is the one the broker ran with."""
    from storage import _catalog_files

    monkeypatch.setattr(_catalog_files, "COMPACT_MIN", 4096)
    root = tmp_path / "data"
    names = ("catalog.json", "catalog.json.1", JOURNAL, f"{JOURNAL}.1")
    expected: dict[str, object] = {}
    generations: set[int] = set()

    async def run() -> None:
        async with start_server(make_config(root)) as h, connect(h.address) as c:
            await c.create_stream("s")
            await c.create_stream("u")
            for i in range(40):
                await c.create_topic("s" if i % 3 else "u", f"t{i}", subjects=[f"t{i}.>"])
                if i % 7 == 3:
                    await c.delete_topic("s" if (i - 1) % 3 else "u", f"t{i - 1}")
                if i % 5 == 4:
                    await c.update_topic("s" if i % 3 else "u", f"t{i}", message_expiry=60, subjects=[f"t{i}.>", f"x{i}.>"])
                generations.add(json.loads((root / "catalog.json").read_bytes())["generation"])
            expected.update(h.broker.catalog.to_json())
            files = {n: (root / n).read_bytes() for n in names}
        for n, raw in files.items():  # as if killed before the stop's fold
            (root / n).write_bytes(raw)

    trio.run(run)
    assert len(generations) > 2  # compactions happened while creating
    b = Broker(make_config(root))
    b.open()
    try:
        got = b.catalog.to_json()
        got.pop("creating", None)
        expected.pop("creating", None)
        assert got == expected
    finally:
        b.close()


def test_a_crash_after_the_create_was_named_makes_its_files_at_start(tmp_path: Path) -> None:
    """The create's one catalog write lists the topic in ``creating``; a crash before
    its directories exist: the next start makes them, without a damage report."""
    root = tmp_path / "data"
    trio.run(_topics, root, ["a"])
    dd = DataDir(str(root))
    dd.lock()
    doc = dd.load_catalog()
    assert doc is not None
    stream = doc["streams"][0]
    topic = json.loads(json.dumps(stream["topics"][0]))
    topic["id"], topic["config"]["name"], topic["config"]["subjects"] = 2, "new", ["new.>"]
    stream["topics"].append(topic)
    stream["next_topic_id"] = 3
    doc["creating"] = [[stream["id"], 2]]
    dd.save_catalog(doc)  # what the create writes before any of its files
    dd.unlock()  # no close: a crash (the journal keeps the entry)
    assert not (root / "streams" / "1" / "topics" / "2").exists()
    seen: list[Damage] = []
    b = Broker(make_config(root))
    b.datadir.report = seen.append
    b.open()
    try:
        assert seen == []
        assert sorted(t.name for t in b.catalog.topics()) == ["a", "new"]
        assert (root / "streams" / "1" / "topics" / "2" / "partitions" / "0").is_dir()
        assert "creating" not in b.catalog.to_json()
    finally:
        b.close()
    assert "creating" not in json.loads((root / "catalog.json").read_bytes())

    async def use() -> None:
        async with start_server(make_config(root)) as h, connect(h.address) as c:
            acks = await c.publish_batch([("new.x", b"1")])
            assert [a.offset for a in acks] == [1]

    trio.run(use)


def test_a_crash_in_the_middle_of_a_compaction_is_not_damage(tmp_path: Path) -> None:
    """The snapshot written, the journal not yet replaced: its entries are in the
    snapshot already and are not applied twice."""
    root = tmp_path / "data"
    trio.run(_topics, root, ["a"])
    dd = DataDir(str(root))
    dd.lock()
    doc = dd.load_catalog()
    assert doc is not None
    doc["streams"][0]["name"] = "renamed"
    dd.save_catalog(doc)
    old_journal = {n: (root / n).read_bytes() for n in (JOURNAL, f"{JOURNAL}.1")}
    dd.close_catalog()  # compaction: snapshot, then the journal
    dd.unlock()
    for n, raw in old_journal.items():  # as if the crash came between the two
        (root / n).write_bytes(raw)
    seen: list[Damage] = []
    dd2 = DataDir(str(root), seen.append)
    assert dd2.load_catalog() == doc and seen == []
    dd2.close_catalog()


def test_one_damaged_journal_copy_is_reported_and_rewritten(tmp_path: Path) -> None:
    root = tmp_path / "data"
    trio.run(_topics, root, ["a"])
    dd = DataDir(str(root))
    doc = dd.load_catalog()
    assert doc is not None
    doc["streams"][0]["name"] = "renamed"
    dd.save_catalog(doc)
    raw = bytearray((root / JOURNAL).read_bytes())
    raw[-10] ^= 0x40  # inside the last entry
    (root / JOURNAL).write_bytes(bytes(raw))
    seen: list[Damage] = []
    dd2 = DataDir(str(root), seen.append)
    assert dd2.load_catalog() == doc
    assert [(d.kind, d.path) for d in seen] == [("catalog_journal", str(root / JOURNAL))]
    dd2.close_catalog()


def _serve_error(root: Path) -> str:
    b = Broker(make_config(root))
    with pytest.raises(StorageFailure) as info:
        b.open()
    return info.value.message


def test_an_entry_lost_from_both_copies_stops_the_broker(tmp_path: Path) -> None:
    """A lost entry may have deleted a topic: the broker does not start on a guess."""
    root = tmp_path / "data"
    trio.run(_topics, root, ["a"])
    dd = DataDir(str(root))
    doc = dd.load_catalog()
    assert doc is not None
    for name in ("x", "y", "z"):
        doc["streams"][0]["name"] = name
        dd.save_catalog(doc)
    sizes = _entry_sizes(root)
    start = sum(sizes[:2])  # the second change
    for n in (JOURNAL, f"{JOURNAL}.1"):
        raw = (root / n).read_bytes()
        (root / n).write_bytes(raw[:start] + raw[start + sizes[2] :])
    before = {n: (root / n).read_bytes() for n in ("catalog.json", "catalog.json.1")}
    msg = _serve_error(root)
    assert msg == (
        f"the catalog of {root} cannot be read: entries of catalog.journal and catalog.journal.1 are missing from "
        "both copies (a lost entry may have deleted a stream or topic); the broker will not start on a guess. "
        "Restore catalog.json and catalog.journal from a backup, or remove catalog.journal and its copy "
        "catalog.journal.1 to "
        "start from catalog.json alone (the changes since it are then lost; docs/operations.md, 'Files and what "
        "protects them')"
    )
    assert before == {n: (root / n).read_bytes() for n in ("catalog.json", "catalog.json.1")}
    for n in (JOURNAL, f"{JOURNAL}.1"):  # the documented way out
        shutil.move(root / n, tmp_path / n)
    b = Broker(make_config(root))
    b.open()
    try:
        assert [s.name for s in b.catalog.streams.values()] == ["s"]
    finally:
        b.close()


def test_a_snapshot_older_than_the_journal_stops_the_broker(tmp_path: Path) -> None:
    """catalog.json restored from an older backup while the journal holds later
    changes: refused, both left as they are."""
    root = tmp_path / "data"
    trio.run(_topics, root, ["a"])
    backup = {n: (root / n).read_bytes() for n in ("catalog.json", "catalog.json.1")}
    trio.run(_topics, root, ["b"], "")  # a second run: compacted at its stop (generation + 1)
    dd = DataDir(str(root))
    doc = dd.load_catalog()
    assert doc is not None
    doc["streams"][0]["name"] = "later"
    dd.save_catalog(doc)  # a change in the journal, no stop
    for n, raw in backup.items():
        (root / n).write_bytes(raw)
    msg = _serve_error(root)
    assert "catalog.journal and catalog.journal.1 holds 1 change(s) made after generation 3 of the catalog, " \
        "but there is catalog.json at generation 2 (restored or edited after those changes)" in msg
    assert backup == {n: (root / n).read_bytes() for n in ("catalog.json", "catalog.json.1")}


def test_check_reads_the_journal(tmp_path: Path) -> None:
    """``ttlbroker check`` sees the catalog with its journal applied, and changes nothing."""
    from storage import check_data_dir

    root = tmp_path / "data"
    trio.run(_topics, root, ["a", "b"])
    dd = DataDir(str(root))
    doc = dd.load_catalog()
    assert doc is not None
    doc["streams"][0]["topics"] = doc["streams"][0]["topics"][:1]
    doc["removing"] = [[doc["streams"][0]["id"], 2]]
    dd.save_catalog(doc)
    files = {n: (root / n).read_bytes() for n in os.listdir(root) if n.startswith("catalog")}
    summary = check_data_dir(str(root), lambda d: None)
    assert summary.topics == 1 and summary.damage == []
    assert files == {n: (root / n).read_bytes() for n in os.listdir(root) if n.startswith("catalog")}
