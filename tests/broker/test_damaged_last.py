"""A subject whose newest message is a damaged record (issue 27): reads of its last
message (a KV get or touch, GET_LAST) answer ``CORRUPTED_RECORD`` naming the record,
never the message before it as if it were current, nor "not found", across restarts;
``ttlbroker check`` says which subject's newest record it is and what a repair
changes; after ``ttlbroker repair`` the subject reads as its previous message
(``docs/semantics.md`` §3.4, §14.9).

Real brokers on loopback ports, real files under ``tmp_path``, damage made by
flipping a byte of the ``.log`` file while the broker is stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from conftest import BrokerProcess, env_with_project, make_config, start_server
from helpers import REPAIR, flip_last_payload_byte, partition_dir

import protocol as P
from broker.client import Client, MessageNotFoundError, WrongLastSequenceError, connect

CORRUPT = P.CorruptedRecordError  # type: ignore[attr-defined]


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True, env=env_with_project(), timeout=60
    )


def newest_damaged(bucket: str, key: str, revision: int) -> str:
    return (
        f"the newest revision of key '$KV.{bucket}.{key}' in bucket '{bucket}' is damaged: revision {revision} "
        f"cannot be read, and no older revision is served in its place {REPAIR}"
    )


async def assert_damaged(c: Client) -> None:
    """What the damaged buckets answer: ``cfg`` (history 5: mode 1 old, mode 2 new,
    damaged, other 3), ``one`` (history 1: k 1 a, removed; k 2 b, damaged)."""
    kv = await c.kv("cfg")
    for read in (lambda: kv.get("mode"), lambda: kv.touch("mode")):
        with pytest.raises(CORRUPT) as err:
            await read()
        assert (err.value.code, err.value.message) == (P.ErrorCode.CORRUPTED_RECORD, newest_damaged("cfg", "mode", 2))
    old = await kv.get("mode", revision=1)  # asked for by number: served, as what it is
    assert (old.value, old.revision) == (b"old", 1)
    with pytest.raises(CORRUPT) as err:
        await kv.get("mode", revision=2)
    assert err.value.message == (
        "revision 2 of key '$KV.cfg.mode' in bucket 'cfg' cannot be read: the record is damaged "
        "(`ttlbroker repair` writes it off)"
    )
    assert (await kv.get("other")).value == b"x"
    assert await kv.keys() == ["mode", "other"]
    with pytest.raises(WrongLastSequenceError) as wrong:  # a writer that knew revision 1 only
        await kv.update("mode", b"stale", 1)
    assert wrong.value.message == "wrong last sequence: 2"
    with pytest.raises(CORRUPT):  # create: the key is there (its newest revision damaged)
        await kv.create("mode", b"again")
    with pytest.raises(CORRUPT) as err:
        await c.get_last("kv", "cfg", "$KV.cfg.mode")
    assert err.value.message == (
        "the last message on subject '$KV.cfg.mode' in topic kv/cfg is damaged: offset 2 cannot be read, and no "
        f"older message is served in its place {REPAIR}"
    )
    one = await c.kv("one")
    with pytest.raises(CORRUPT) as err:  # never "not found": the key has a value, unreadable
        await one.get("k")
    assert err.value.message == newest_damaged("one", "k", 2)


async def test_the_issue_reproduction_a_damaged_newest_revision_is_an_error_not_the_old_value(data_dir: Path) -> None:
    """Issue 27, defect 3, exactly: put ``old``, put ``new``, flip the last payload
    byte of the newest record (the segment's last), restart; the get used to answer
    ``old``, revision 1. Now: CORRUPTED_RECORD (4001) naming revision 2, every time."""
    config = make_config(data_dir)
    async with start_server(config) as h, connect(h.address) as c:
        kv = await c.kv_create("cfg", history=5)
        assert [await kv.put("mode", b"old"), await kv.put("mode", b"new")] == [1, 2]
        part = partition_dir(h, "kv", "cfg")
    flip_last_payload_byte(part, 2)
    for _ in range(2):  # the first restart finds the damage; the second finds it again
        async with start_server(config) as h, connect(h.address) as c:
            kv = await c.kv("cfg")
            for _ in range(2):
                with pytest.raises(CORRUPT) as err:
                    await kv.get("mode")
                assert err.value.code == P.ErrorCode.CORRUPTED_RECORD and int(err.value.code) == 4001
                assert err.value.message == newest_damaged("cfg", "mode", 2)


async def test_the_issue_reproduction_after_a_kill_9_the_key_may_be_damaged(data_dir: Path) -> None:
    """The same after a kill -9 (no ``.snapshot`` was written, so nothing intact
    says the damaged record's key): the key still answers CORRUPTED_RECORD, worded
    "may be damaged", never ``old``."""
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always"))
    try:
        async with connect(proc.address, reconnect=False) as c:
            kv = await c.kv_create("cfg", history=5)
            assert [await kv.put("mode", b"old"), await kv.put("mode", b"new")] == [1, 2]
    finally:
        await trio.to_thread.run_sync(proc.kill9)
    (part,) = (data_dir / "streams").glob("*/topics/*/partitions/0")
    assert not list(part.glob("*.snapshot"))
    flip_last_payload_byte(part, 2)
    async with start_server(make_config(data_dir)) as h, connect(h.address) as c:
        with pytest.raises(CORRUPT) as err:
            await (await c.kv("cfg")).get("mode")
        assert (err.value.code, err.value.message) == (
            P.ErrorCode.CORRUPTED_RECORD,
            "the newest revision of key '$KV.cfg.mode' in bucket 'cfg' may be damaged: revision 2 cannot be read, nor "
            "can its subject, and it is newer than the newest readable revision (revision 1); no older revision is "
            f"served in its place {REPAIR}",
        )


async def test_a_damaged_newest_revision_is_refused_until_a_repair_then_the_previous_one_is_served(
    data_dir: Path,
) -> None:
    config = make_config(data_dir)
    async with start_server(config) as h, connect(h.address) as c:
        kv = await c.kv_create("cfg", history=5)
        assert [await kv.put("mode", b"old"), await kv.put("mode", b"new"), await kv.put("other", b"x")] == [1, 2, 3]
        one = await c.kv_create("one")
        assert [await one.put("k", b"a"), await one.put("k", b"b")] == [1, 2]
        cfg_dir, one_dir = partition_dir(h, "kv", "cfg"), partition_dir(h, "kv", "one")
    cfg_log = flip_last_payload_byte(cfg_dir, 2)
    one_log = flip_last_payload_byte(one_dir, 2)

    # The issue's reproduction: before, the get answered b"old", revision 1.
    async with start_server(config) as h, connect(h.address) as c:
        await assert_damaged(c)
        assert (await c.stats())["corrupt_records"] == 2
    async with start_server(config) as h, connect(h.address) as c:  # the damaged segments are sealed now
        await assert_damaged(c)

    p = tool("check", "--data", str(data_dir))
    assert p.returncode == 1, p.stdout + p.stderr
    lines = [line for line in p.stdout.splitlines() if line.startswith("newest damaged: ")]
    assert lines == [
        f"newest damaged: offset 2 in {cfg_log} is the newest record of subject '$KV.cfg.mode' (key 'mode' of KV "
        "bucket 'cfg'): reads of its last message fail with CORRUPTED_RECORD (4001), never answering an older one; "
        "`ttlbroker repair` writes it off, after which the subject reads as its previous record, offset 1",
        f"newest damaged: offset 2 in {one_log} is the newest record of subject '$KV.one.k' (key 'k' of KV bucket "
        "'one'): reads of its last message fail with CORRUPTED_RECORD (4001), never answering an older one; "
        "`ttlbroker repair` writes it off, after which the subject reads as absent (no older record of it is left)",
    ]
    p = tool("repair", "--data", str(data_dir))
    assert p.returncode == 0, p.stdout + p.stderr
    assert [line for line in p.stdout.splitlines() if line.startswith("newest damaged: ")] == [
        f"newest damaged: offset 2 in {cfg_log} is the newest record of subject '$KV.cfg.mode' (key 'mode' of KV "
        "bucket 'cfg'); written off, the subject now reads as its previous record, offset 1",
        f"newest damaged: offset 2 in {one_log} is the newest record of subject '$KV.one.k' (key 'k' of KV bucket "
        "'one'); written off, the subject now reads as absent (no older record of it is left)",
    ]
    assert tool("check", "--data", str(data_dir)).returncode == 0

    # The operator accepted the loss: the key is its previous revision again.
    async with start_server(config) as h, connect(h.address) as c:
        kv = await c.kv("cfg")
        e = await kv.get("mode")
        assert (e.value, e.revision) == (b"old", 1)
        assert (await c.get_last("kv", "cfg", "$KV.cfg.mode")).offset == 1
        assert await kv.update("mode", b"newer", 1) > 3
        with pytest.raises(MessageNotFoundError) as gone:
            await (await c.kv("one")).get("k")
        assert gone.value.message == "key '$KV.one.k' not found in bucket 'one'"


async def test_get_last_refuses_a_damaged_newest_message_in_a_sealed_segment_named_by_its_columns(
    data_dir: Path,
) -> None:
    """A sealed segment with its ``.columns`` file (written by a clean stop): the
    damaged record's subject comes from it, exactly, so only that subject is
    refused; a subject whose damaged message is not its newest, and one that never
    had a message, answer as before. Without the file, nothing intact says the
    record's subject: every subject whose newest message is older may be damaged."""
    config = make_config(data_dir)
    async with start_server(config) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"], segment_size=4096)
        assert (await c.publish("t.solo", b"only one")).offset == 1  # type: ignore[union-attr]
        for b in range(8):  # a segment rolls between batches
            acks = await c.publish_batch([("t.x", f"m{b}.{i}".encode().ljust(100, b".")) for i in range(10)])
            assert acks is not None and acks.ok
        part = partition_dir(h, "s", "t")
    async with start_server(config):  # a start and a clean stop: the sealed segments get their columns
        pass
    first = sorted(part.glob("*.log"))[0]
    assert first.with_suffix(".columns").exists() and len(list(part.glob("*.log"))) >= 3
    assert flip_last_payload_byte(part, 1) == first  # t.solo's only message
    flip_last_payload_byte(part, 2)  # t.x's first: not its newest
    async with start_server(config) as h, connect(h.address) as c:
        with pytest.raises(CORRUPT) as err:
            await c.get_last("s", "t", "t.solo")
        assert (err.value.code, err.value.message) == (
            P.ErrorCode.CORRUPTED_RECORD,
            f"the last message on subject 't.solo' in topic s/t is damaged: offset 1 cannot be read, and no older "
            f"message is served in its place {REPAIR}",
        )
        assert (await c.get_last("s", "t", "t.x")).offset == 81
        with pytest.raises(MessageNotFoundError):
            await c.get_last("s", "t", "t.never")
    first.with_suffix(".columns").unlink()
    async with start_server(config) as h, connect(h.address) as c:
        assert (await c.get_last("s", "t", "t.x")).offset == 81  # newer than any damaged record
        for subject in ("t.solo", "t.never"):
            with pytest.raises(CORRUPT) as err:
                await c.get_last("s", "t", subject)
            assert err.value.message == (
                f"the last message on subject {subject!r} in topic s/t may be damaged: offset 2 cannot be read, nor "
                f"can its subject, and no other message of it is readable; no older message is served in its place "
                f"{REPAIR}"
            )
    p = tool("check", "--data", str(data_dir))
    assert p.returncode == 1
    assert [line for line in p.stdout.splitlines() if line.startswith("newest damaged: ")] == [
        f"newest damaged: offset 2 in {first} cannot be read, nor its subject: it may be the newest record of any "
        "subject of its partition whose newest readable record is older, so reads of such a subject's last message "
        "(a KV get of such a key) fail with CORRUPTED_RECORD (4001), never answering an older one; `ttlbroker repair` "
        "writes it off, after which each such subject reads as its newest readable record",
    ]
    assert tool("repair", "--data", str(data_dir)).returncode == 0
    async with start_server(config) as h, connect(h.address) as c:
        with pytest.raises(MessageNotFoundError):
            await c.get_last("s", "t", "t.solo")
        assert (await c.get_last("s", "t", "t.x")).offset == 81


async def test_a_key_older_than_a_damaged_record_of_unknown_subject_may_be_damaged(data_dir: Path) -> None:
    """The active segment's ``.snapshot`` gone (as after a crash): the damaged
    record's own bytes cannot be trusted to say its key, so every key whose newest
    readable revision is older answers that it may be damaged; a newer one is read."""
    config = make_config(data_dir)
    async with start_server(config) as h, connect(h.address) as c:
        kv = await c.kv_create("b", history=5)
        assert [await kv.put("a", b"A"), await kv.put("b", b"B"), await kv.put("c", b"C")] == [1, 2, 3]
        part = partition_dir(h, "kv", "b")
    flip_last_payload_byte(part, 2)
    for snapshot in part.glob("*.snapshot"):
        os.unlink(snapshot)
    async with start_server(config) as h, connect(h.address) as c:
        kv = await c.kv("b")
        with pytest.raises(CORRUPT) as err:
            await kv.get("a")
        assert (err.value.code, err.value.message) == (
            P.ErrorCode.CORRUPTED_RECORD,
            "the newest revision of key '$KV.b.a' in bucket 'b' may be damaged: revision 2 cannot be read, nor can "
            "its subject, and it is newer than the newest readable revision (revision 1); no older revision is "
            f"served in its place {REPAIR}",
        )
        with pytest.raises(CORRUPT) as err:
            await kv.get("zzz")
        assert err.value.message == (
            "the newest revision of key '$KV.b.zzz' in bucket 'b' may be damaged: revision 2 cannot be read, nor can "
            f"its subject, and no other revision of it is readable; no older revision is served in its place {REPAIR}"
        )
        assert (await kv.get("c")).value == b"C"
        assert await kv.update("a", b"A2", 1) == 4  # only a known damaged record holds a compare-and-set back
        assert (await kv.get("a")).value == b"A2"  # newer than the damage now
