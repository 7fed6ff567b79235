"""Simulated power loss: nothing acknowledged under ``fsync = "always"`` may be lost.

``fsmodel.FsModel`` follows every file operation of the (in-process) broker on its
data directory and knows, at any instant, what a power loss on a strict POSIX file
system would leave: file data only as of each file's last fsync, directory entries
only as of each directory's last fsync. The first half of this file tests the model
on plain files; the second runs a real broker inside it, takes the crash image at a
seeded random file operation while clients publish, delete, purge, store consumer
offsets and write KV keys, starts a new broker on the image, and checks the promises
of the README: every acknowledged message is there with its offset and payload, no
acknowledged deletion came back, no offset is given out twice, acknowledged consumer
offsets and topics are there.

Each trial runs two broker lifetimes in a row, each crashed at a seeded point (odd
seeds also keep a seeded prefix of unsynced appends: a "torn" image), and checks the
recovery of each inside the next one, so recovery's own writes are under the model
too. The workload and the crash point (the n-th file operation after the set-up)
come from the seed; the interleaving of the clients does not (real sockets, a real
group commit), so a seed names a scenario, not an exact history. A failure message
says what was not durable at the crash (which entry of which directory, which file's
bytes) and the operations that made it.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import extra_missing, make_config, require, start_server
from helpers import RawPeer

import protocol as P
from broker.client import Client, connect, encode_msg

try:  # tests/fault as a package or as a rootdir-relative folder
    from .fsmodel import CrashState, FsModel, ModelError, Op
except ImportError:
    from fsmodel import CrashState, FsModel, ModelError, Op

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the model reads descriptors back through /proc/self/fd")

RW = os.O_WRONLY | os.O_CREAT
DIRFLAGS = os.O_RDONLY | os.O_DIRECTORY


# -- helpers for the model's own tests ----------------------------------------------------


def write_file(path: Path | str, data: bytes, *, sync: bool = True, flags: int = os.O_TRUNC) -> None:
    fd = os.open(path, RW | flags, 0o600)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path | str) -> None:
    fd = os.open(path, DIRFLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: file content, or None for a directory."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in files:
            full = os.path.join(dirpath, f)
            out[os.path.relpath(full, root)] = Path(full).read_bytes()
    return out


class Images:
    """Numbered crash images of one model, under ``tmp_path``."""

    def __init__(self, tmp_path: Path) -> None:
        self.base = tmp_path / "images"
        self.n = 0

    def __call__(self, fs: FsModel, **kw: Any) -> dict[str, bytes | None]:
        self.n += 1
        return tree(fs.crash_image(self.base / str(self.n), **kw))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    r.mkdir()
    return r


@pytest.fixture
def image(tmp_path: Path) -> Images:
    return Images(tmp_path)


# -- the model on plain files -------------------------------------------------------------


def test_what_exists_at_start_is_durable(root: Path, image: Images) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "a").write_bytes(b"alpha")
    (root / "d" / "e" / "b").write_bytes(b"beta")
    os.link(root / "a", root / "d" / "a2")
    with FsModel(root) as fs:
        img = image(fs)
    assert img == {"a": b"alpha", "d": None, "d/e": None, "d/e/b": b"beta", "d/a2": b"alpha"}
    assert os.stat(image.base / "1" / "a").st_ino == os.stat(image.base / "1" / "d" / "a2").st_ino
    assert fs.errors == [] and fs.untracked == []


def test_data_not_fsynced_is_lost(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        write_file(root / "f", b"synced", sync=True)
        sync_dir(root)
        fd = os.open(root / "f", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b" and more")
        assert image(fs) == {"f": b"synced"}
        os.fdatasync(fd)  # fdatasync covers data and size
        assert image(fs) == {"f": b"synced and more"}
        os.close(fd)
        write_file(root / "g", b"never synced", sync=False)
        sync_dir(root)
        assert image(fs) == {"f": b"synced and more", "g": b""}
        assert fs.differences() == []
    assert fs.errors == [] and fs.untracked == []


def test_a_synced_file_needs_its_directory_entry_synced(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        write_file(root / "f", b"data", sync=True)
        assert image(fs) == {}
        sync_dir(root)
        assert image(fs) == {"f": b"data"}


def test_a_new_directory_needs_every_parent_synced(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        os.makedirs(root / "a" / "b")
        write_file(root / "a" / "b" / "f", b"data")
        sync_dir(root / "a" / "b")
        assert image(fs) == {}
        sync_dir(root / "a")
        assert image(fs) == {}, "the entry of 'a' in the root is still not durable"
        sync_dir(root)
        assert image(fs) == {"a": None, "a/b": None, "a/b/f": b"data"}


def test_a_new_directory_synced_before_its_content_is_empty(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        os.mkdir(root / "d")
        sync_dir(root)
        write_file(root / "d" / "f", b"data")
        assert image(fs) == {"d": None}


def test_rename_without_directory_sync_reverts(root: Path, image: Images) -> None:
    write_file(root / "cfg", b"v1")
    with FsModel(root) as fs:
        write_file(root / "cfg.tmp", b"v2", sync=True)
        os.replace(root / "cfg.tmp", root / "cfg")
        assert image(fs) == {"cfg": b"v1"}, "the old file comes back, the temporary was never durable"
        sync_dir(root)
        assert image(fs) == {"cfg": b"v2"}


def test_a_renamed_file_keeps_its_own_durable_data(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        write_file(root / "a", b"synced")
        sync_dir(root)
        write_file(root / "a", b"+unsynced", sync=False, flags=os.O_APPEND)
        os.rename(root / "a", root / "b")
        sync_dir(root)
        assert image(fs) == {"b": b"synced"}


def test_a_rename_across_directories_needs_both_synced(root: Path, image: Images) -> None:
    (root / "x").mkdir()
    (root / "y").mkdir()
    (root / "x" / "f").write_bytes(b"data")
    with FsModel(root) as fs:
        os.rename(root / "x" / "f", root / "y" / "f")
        sync_dir(root / "y")
        assert image(fs) == {"x": None, "y": None, "x/f": b"data", "y/f": b"data"}
        sync_dir(root / "x")
        assert image(fs) == {"x": None, "y": None, "y/f": b"data"}


def test_removals_come_back_until_the_directory_is_synced(root: Path, image: Images) -> None:
    (root / "t" / "p").mkdir(parents=True)
    (root / "t" / "p" / "seg").write_bytes(b"records")
    (root / "x").write_bytes(b"x")
    with FsModel(root) as fs:
        os.unlink(root / "x")
        shutil.rmtree(root / "t")  # unlink and rmdir relative to directory descriptors
        assert not (root / "t").exists()
        assert image(fs) == {"x": b"x", "t": None, "t/p": None, "t/p/seg": b"records"}
        sync_dir(root)
        assert image(fs) == {}
        assert fs.differences() == []
    assert fs.errors == [] and fs.untracked == []


def test_truncate_overwrite_and_o_trunc_wait_for_a_sync(root: Path, image: Images) -> None:
    write_file(root / "f", b"0123456789")
    write_file(root / "g", b"old")
    with FsModel(root) as fs:
        fd = os.open(root / "f", os.O_RDWR)
        os.ftruncate(fd, 4)
        os.pwrite(fd, b"AB", 1)
        os.lseek(fd, 0, os.SEEK_END)
        os.write(fd, b"!")
        write_file(root / "g", b"", sync=False)  # O_TRUNC, not synced
        assert image(fs) == {"f": b"0123456789", "g": b"old"}
        os.fdatasync(fd)
        os.close(fd)
        os.truncate(root / "g", 2)
        assert image(fs) == {"f": b"0AB3!", "g": b"old"}
        fd = os.open(root / "g", os.O_RDONLY)
        os.fsync(fd)  # fsync through a read-only descriptor syncs the file
        os.close(fd)
        assert image(fs) == {"f": b"0AB3!", "g": b"\0\0"}
        assert fs.differences() == []


def test_hard_links_share_the_file(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        write_file(root / "a", b"one")
        os.link(root / "a", root / "b")
        sync_dir(root)
        write_file(root / "b", b"+two", flags=os.O_APPEND)
        assert image(fs) == {"a": b"one+two", "b": b"one+two"}


def test_builtin_open_and_pathlib_writes(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        with open(root / "m.json", "w", encoding="utf-8") as f:
            f.write('{"a": 1}')
            f.flush()
            os.fsync(f.fileno())
        (root / "p").write_bytes(b"pathlib, never synced")
        sync_dir(root)
        assert image(fs) == {"m.json": b'{"a": 1}', "p": b""}
        with open(root / "m.json", "a", encoding="utf-8") as f:
            f.write("\n")
        assert image(fs) == {"m.json": b'{"a": 1}', "p": b""}
        assert fs.differences() == []
    assert fs.errors == [] and fs.untracked == []


def test_writes_the_model_did_not_see_are_adopted_not_trusted(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        code = f"open({str(root / 'ext')!r}, 'wb').write(b'from elsewhere')"
        subprocess.run([sys.executable, "-c", code], check=True)
        assert image(fs) == {}
        fd = os.open(root / "ext", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        sync_dir(root)
        assert image(fs) == {"ext": b"from elsewhere"}
    assert any("ext" in u for u in fs.untracked)


def test_torn_images_keep_a_seeded_prefix_of_unsynced_appends(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        write_file(root / "log", b"durable|")
        write_file(root / "other", b"x")
        sync_dir(root)
        write_file(root / "log", b"0123456789", sync=False, flags=os.O_APPEND)
        state = fs.snapshot()
    seen = set()
    for seed in range(40):
        a = tree(state.materialize(image.base / f"a{seed}", torn=True, seed=seed))
        b = tree(state.materialize(image.base / f"b{seed}", torn=True, seed=seed))
        assert a == b, "the same seed gives the same image"
        assert a["other"] == b"x"
        assert a["log"].startswith(b"durable|") and (b"durable|0123456789").startswith(a["log"])
        seen.add(len(a["log"]))
    assert len(seen) > 3 and len(b"durable|") in seen
    assert tree(state.materialize(image.base / "plain")) == {"log": b"durable|", "other": b"x"}


def test_allocated_space_is_zeros_and_torn_images_keep_a_prefix_of_what_was_written_over_it(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        write_file(root / "log", b"durable|")
        sync_dir(root)
        fd = os.open(root / "log", os.O_RDWR)
        os.posix_fallocate(fd, 8, 24)
        assert image(fs) == {"log": b"durable|"}, "the new size is durable once synced"
        os.fdatasync(fd)
        assert image(fs) == {"log": b"durable|" + bytes(24)}
        os.pwrite(fd, b"0123456789", 8)
        state = fs.snapshot()
        os.close(fd)
        assert fs.differences() == []
    assert fs.errors == [] and fs.untracked == []
    seen = set()
    for seed in range(40):
        got = tree(state.materialize(image.base / f"t{seed}", torn=True, seed=seed))["log"]
        assert got is not None and len(got) == 32 and got.startswith(b"durable|")
        written = got[8:].rstrip(b"\0")
        assert b"0123456789".startswith(written)
        seen.add(len(written))
    assert len(seen) > 3 and 0 in seen
    assert tree(state.materialize(image.base / "plain")) == {"log": b"durable|" + bytes(24)}


def test_wrappers_behave_like_the_originals(root: Path, tmp_path: Path) -> None:
    originals = {n: getattr(os, n) for n in ("open", "write", "fsync", "replace", "mkdir", "unlink", "close")}
    import builtins

    builtin_open = builtins.open
    with pytest.raises(RuntimeError):
        with FsModel(root):
            assert os.open is not originals["open"]
            with pytest.raises(FileNotFoundError) as e1:
                os.open(root / "missing" / "f", os.O_RDONLY)
            assert e1.value.errno == errno.ENOENT
            os.mkdir(root / "d")
            with pytest.raises(FileExistsError):
                os.mkdir(root / "d")
            with pytest.raises(FileNotFoundError):
                os.replace(root / "nope", root / "d2")
            (root / "d" / "f").write_bytes(b"")
            with pytest.raises(OSError) as e2:
                os.rmdir(root / "d")
            assert e2.value.errno == errno.ENOTEMPTY
            fd = os.open(root / "r", os.O_RDONLY | os.O_CREAT, 0o600)
            with pytest.raises(OSError) as e3:
                os.write(fd, b"x")  # read-only descriptor
            assert e3.value.errno == errno.EBADF
            wfd = os.open(root / "w", RW, 0o600)
            assert os.write(wfd, memoryview(b"abcdef")[2:]) == 4
            assert os.pwrite(wfd, bytearray(b"Z"), 0) == 1
            os.close(wfd)
            assert (root / "w").read_bytes() == b"Zdef"
            os.close(fd)
            with pytest.raises(OSError) as e4:
                os.fsync(fd)
            assert e4.value.errno == errno.EBADF
            with pytest.raises(OSError):
                os.close(fd)
            os.makedirs(root / "d" / "x" / "y", exist_ok=True)
            os.makedirs(root / "d" / "x" / "y", exist_ok=True)
            raise RuntimeError("leaving the block by an exception restores everything")
    assert {n: getattr(os, n) for n in originals} == originals
    assert builtins.open is builtin_open
    with FsModel(root) as fs:  # and a new model can start
        with pytest.raises(ModelError):
            with FsModel(tmp_path):
                pass
    assert fs.errors == []


def test_paths_outside_the_root_are_not_followed(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    with FsModel(root) as fs:
        write_file(outside / "f", b"x")
        os.rename(outside / "f", outside / "g")
        sync_dir(outside)
        shutil.rmtree(outside)
    assert fs.events == 0 and fs.errors == [] and fs.untracked == []


def test_threads_writing_and_syncing_at_once(root: Path, image: Images) -> None:
    with FsModel(root) as fs:
        def worker(k: int) -> None:
            d = root / f"w{k}"
            os.mkdir(d)
            fd = os.open(d / "log", RW | os.O_APPEND, 0o600)
            for i in range(200):
                os.write(fd, f"{k}:{i};".encode())
                if i % 7 == 0:
                    os.fdatasync(fd)
            os.fsync(fd)
            os.close(fd)
            sync_dir(d)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sync_dir(root)
        img = image(fs)
        assert fs.differences() == []
    for k in range(6):
        assert img[f"w{k}/log"] == b"".join(f"{k}:{i};".encode() for i in range(200))
    assert fs.errors == [] and fs.untracked == []


def test_trigger_after_snapshots_from_inside_an_operation(root: Path, image: Images) -> None:
    states: list[CrashState] = []
    with FsModel(root) as fs:
        write_file(root / "f", b"v1")
        sync_dir(root)
        fs.trigger_after(fs.events + 2, lambda m: states.append(m.snapshot(extra=lambda: "mine")))
        write_file(root / "f", b"v2")  # truncate (1), write (2): the trigger fires here
        sync_dir(root)
    (state,) = states
    assert state.extra == "mine"
    assert tree(state.materialize(image.base / "t")) == {"f": b"v1"}


def test_explain_names_the_missing_sync(root: Path) -> None:
    with FsModel(root) as fs:
        os.makedirs(root / "s" / "t")
        write_file(root / "s" / "t" / "seg", b"r")
        sync_dir(root / "s" / "t")
        state = fs.snapshot()
    why = state.explain("s/t/seg")
    assert "'s' is not a durable entry of '.'" in why and "never fsynced" in why and "mkdir" in why
    assert any("lost entry" in line for line in state.diff("s"))


def test_storage_helpers_are_durable_when_they_return(root: Path, image: Images) -> None:
    import storage

    with FsModel(root) as fs:
        storage.makedirs(str(root / "a" / "b" / "c"))
        storage.atomic_write(str(root / "a" / "b" / "c" / "state"), b"v1")
        assert image(fs) == {"a": None, "a/b": None, "a/b/c": None, "a/b/c/state": b"v1"}
        storage.atomic_write(str(root / "a" / "b" / "c" / "state"), b"v2")
        assert image(fs)["a/b/c/state"] == b"v2"
    assert fs.errors == [] and fs.untracked == []


# -- the broker under the model -----------------------------------------------------------

STREAM = "shop"
#: topic -> (partitions, subjects, options)
TOPICS: dict[str, tuple[int, list[str], dict[str, Any]]] = {
    "orders": (3, ["orders.>"], {"segment_size": 4096}),
    "sessions": (2, ["session.>"], {"allow_msg_ttl": True, "segment_size": 4096}),
    "scratch": (1, ["scratch.>"], {"segment_size": 4096}),
}
KV_BUCKET = "cfg"
KV_TOPIC = "kv/cfg"
CONSUMERS = ("audit", "billing")

Key = tuple[str, int, int]  # (topic, partition, offset)


@dataclass
class Ledger:
    """What the clients were told (acks) and what they asked for (in flight).

    Mutated from the event loop only, always under ``lock``; the crash trigger (which
    may run in a worker thread, under the model's lock) copies it under the same
    lock, so the copy is one instant: nothing acknowledged in it can be missing from
    the durable state taken at that instant.
    """

    lock: threading.RLock = field(default_factory=threading.RLock)
    topics: set[str] = field(default_factory=set)  # acknowledged creations
    ids: dict[tuple[int, int], str] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)
    sent: dict[bytes, str] = field(default_factory=dict)  # every payload ever sent -> topic
    acked: dict[Key, bytes] = field(default_factory=dict)
    gone: dict[Key, bytes] = field(default_factory=dict)  # acknowledged deletions (and what recovery lost)
    maybe_gone: set[Key] = field(default_factory=set)  # deletions in flight
    high: dict[tuple[str, int], int] = field(default_factory=dict)  # highest offset acked or observed
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # (consumer, partition) -> acked
    offsets_pending: dict[tuple[str, int], int] = field(default_factory=dict)
    kv_revs: dict[str, list[int]] = field(default_factory=dict)  # key -> acked live revisions
    subjects: dict[tuple[str, int], str] = field(default_factory=dict)  # a subject per partition
    violations: list[str] = field(default_factory=list)  # seen at ack time (offsets reused)
    floor: dict[tuple[str, int], int] = field(default_factory=dict)  # highest offset before the last crash
    corrupt: set[Key] = field(default_factory=set)  # reported corrupt by an earlier recovery

    def copy(self) -> Ledger:
        with self.lock:
            return Ledger(
                threading.RLock(), set(self.topics), dict(self.ids), dict(self.partitions), dict(self.sent),
                dict(self.acked), dict(self.gone), set(self.maybe_gone), dict(self.high), dict(self.offsets),
                dict(self.offsets_pending), {k: list(v) for k, v in self.kv_revs.items()}, dict(self.subjects),
                list(self.violations), dict(self.floor), set(self.corrupt),
            )

    def ack(self, topic: str, partition: int, offset: int, payload: bytes, subject: str) -> None:
        with self.lock:
            key = (topic, partition, offset)
            if key in self.acked and self.acked[key] != payload:
                self.violations.append(f"{topic}/{partition}: offset {offset} acknowledged twice, for two messages")
            elif offset <= self.floor.get((topic, partition), 0):
                self.violations.append(f"{topic}/{partition}: offset {offset} acknowledged, at or below {self.floor[(topic, partition)]} acknowledged before the crash")
            self.acked[key] = payload
            self.high[(topic, partition)] = max(self.high.get((topic, partition), 0), offset)
            self.subjects.setdefault((topic, partition), subject)


@dataclass
class Observed:
    messages: dict[Key, bytes]
    last: dict[tuple[str, int], int]
    offsets: dict[tuple[str, int], int]
    topics: set[str]
    kv_subjects: dict[int, str]
    corrupt: list[Key]


async def read_everything(c: Client, ledger: Ledger) -> Observed:
    """Every live message of every topic the ledger knows, by fetching."""
    messages: dict[Key, bytes] = {}
    last: dict[tuple[str, int], int] = {}
    kv_subjects: dict[int, str] = {}
    topics: set[str] = set()
    corrupt: list[Key] = []
    for topic in sorted(ledger.partitions):
        stream, name = topic.split("/")
        try:
            await c.get_topic(stream, name)
        except P.BrokerError:
            continue
        topics.add(topic)
        for p in range(ledger.partitions[topic]):
            offset = 1
            while True:
                try:
                    f = await c.fetch(stream, name, p, offset, 1000)
                except P.CorruptedRecordError as err:  # type: ignore[attr-defined]
                    bad = int(str(err).split("offset ")[1].split()[0])
                    corrupt.append((topic, p, bad))
                    offset = bad + 1
                    continue
                last[(topic, p)] = f.last_offset
                for m in f.messages:
                    if m.is_marker:
                        continue
                    messages[(topic, p, m.offset)] = m.payload
                    if topic == KV_TOPIC:
                        kv_subjects[m.offset] = m.subject
                if f.next_offset > f.last_offset or f.next_offset <= offset:
                    break
                offset = f.next_offset
    offsets: dict[tuple[str, int], int] = {}
    if "shop/orders" in topics:
        for consumer in CONSUMERS:
            for p in range(3):
                try:
                    offsets[(consumer, p)] = await c.get_offset(STREAM, "orders", consumer, p)
                except P.BrokerError:
                    pass
    return Observed(messages, last, offsets, topics, kv_subjects, corrupt)


def partition_dir(ledger: Ledger, topic: str, partition: int) -> str:
    for (sid, tid), name in ledger.ids.items():
        if name == topic:
            return os.path.join("streams", str(sid), "topics", str(tid), "partitions", str(partition))
    return "?"


def topic_dir(ledger: Ledger, topic: str) -> str:
    return os.path.dirname(os.path.dirname(partition_dir(ledger, topic, 0)))


@dataclass
class Findings:
    """What a recovery broke: ``loss`` (a promise about acknowledged state: a message,
    deletion, offset, consumer offset or topic) and ``damage`` (records reported
    corrupt, served as ``CORRUPTED_RECORD``, where a clean power loss left nothing
    damaged), each line followed by what the crash state says was not durable."""

    loss: list[str] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)


def compare(expected: Ledger, seen: Observed, state: CrashState | None) -> Findings:
    """Everything the observation breaks of the ledger's promises, explained by the
    crash state (which entries and bytes were not durable) where there is one."""
    found = Findings()
    loss = found.loss
    lost: dict[tuple[str, int], list[int]] = {}
    corrupt_parts: set[tuple[str, int]] = set()
    for key in seen.corrupt:
        if key in expected.corrupt:
            continue  # reported after an earlier crash already
        if key in expected.acked and key not in expected.gone:
            loss.append(f"{key}: acknowledged, served as a corrupted record after recovery")
        else:
            found.damage.append(f"{key}: never acknowledged, served as a corrupted record after recovery")
        corrupt_parts.add(key[:2])
    for topic in sorted(expected.topics - seen.topics):
        loss.append(f"topic {topic}, acknowledged, is gone")
    for key, payload in sorted(expected.acked.items()):
        have = seen.messages.get(key)
        if key in expected.gone:
            if have is not None and have == expected.gone[key]:
                loss.append(f"{key}: acknowledged deletion came back")
        elif key in expected.maybe_gone:
            if have is not None and have != payload:
                loss.append(f"{key}: holds {have[:40]!r}, acknowledged {payload[:40]!r}")
        elif have is None:
            if key[0] in seen.topics and key not in seen.corrupt:
                lost.setdefault(key[:2], []).append(key[2])
        elif have != payload:
            loss.append(f"{key}: holds {have[:40]!r}, acknowledged {payload[:40]!r}")
    for (topic, p), offs in sorted(lost.items()):
        loss.append(f"{topic} partition {p}: {len(offs)} acknowledged messages lost, offsets {offs[:8]}{'...' if len(offs) > 8 else ''}")
    where: dict[bytes, Key] = {}
    for key, payload in sorted(seen.messages.items()):
        if payload in where:
            loss.append(f"{key}: duplicate of {where[payload]}")
        where[payload] = key
        if key not in expected.acked and payload not in expected.sent:
            loss.append(f"{key}: a message nobody sent: {payload[:40]!r}")
        if key not in expected.acked:
            acked_at = [k for k, v in expected.acked.items() if v == payload]
            if acked_at:
                loss.append(f"{key}: message acknowledged at {acked_at[0]} moved here")
    for (topic, p), high in sorted(expected.high.items()):
        if topic in seen.topics and seen.last.get((topic, p), 0) < high:
            loss.append(f"{topic}/{p}: last offset {seen.last.get((topic, p), 0)} is below the acknowledged {high}: offsets will be reused")
    for ck, value in sorted(expected.offsets.items()):
        have = seen.offsets.get(ck)
        if have != value and not (ck in expected.offsets_pending and have == expected.offsets_pending[ck]):
            loss.append(f"consumer offset {ck}: {have}, acknowledged {value}")
    loss.extend(expected.violations)
    if state is None:
        return found
    for lines, parts in ((loss, set(lost)), (found.damage, corrupt_parts)):
        if not lines:
            continue
        for k, payload in expected.gone.items():
            if lines is loss and seen.messages.get(k) == payload:
                parts.add(k[:2])
        why: list[str] = []
        for topic, p in sorted(parts):
            pdir = partition_dir(expected, topic, p)
            why.extend(line for line in state.diff(pdir, limit=12) + indexes_ahead(state, pdir) if line not in why)
        if any(line.startswith("consumer offset") for line in lines):
            tdir = topic_dir(expected, "shop/orders")
            why.extend(state.explain(path) for path in sorted(state.volatile) if os.path.dirname(path) == tdir and "consumers" in path)
        if any("is gone" in line for line in lines):
            why.extend(state.diff("", limit=12))
        lines.append(f"-- not durable at the crash (event #{state.event}):")
        lines.extend("   " + line for line in why)
    return found


def indexes_ahead(state: CrashState, pdir: str) -> list[str]:
    """Segment indexes made durable while their log had writes not yet synced."""
    out = []
    for op in state.ops:
        if op.op != "rename" or not op.rel.startswith(pdir + os.sep) or not op.rel.endswith("index"):
            continue
        log = op.rel.rsplit(".", 1)[0] + ".log"
        ops = [o for o in state.ops if o.rel == log and o.event < op.event]
        synced = max((o.event for o in ops if o.op in ("fsync", "fdatasync")), default=0)
        unsynced = [o for o in ops if o.op in ("write", "pwrite", "ftruncate") and o.event > synced]
        if unsynced:
            out.append(
                f"'{op.rel}' renamed into place at #{op.event} while '{log}' had {len(unsynced)} writes "
                f"(#{unsynced[0].event}..#{unsynced[-1].event}) not yet synced (last sync #{synced or 'never'})"
            )
    return out


def rebase(ledger: Ledger, seen: Observed) -> None:
    """After a recovery checked: what is there now is the new truth (it was read
    back, so it must stay); what is not there must never come back."""
    with ledger.lock:
        for key, payload in ledger.acked.items():
            if key not in seen.messages:
                ledger.gone.setdefault(key, payload)
        for key, payload in seen.messages.items():
            ledger.acked[key] = payload
            ledger.high[key[:2]] = max(ledger.high.get(key[:2], 0), key[2])
            ledger.gone.pop(key, None)
        ledger.maybe_gone.clear()
        ledger.offsets = dict(seen.offsets)
        ledger.offsets_pending.clear()
        ledger.kv_revs = {}
        for off, subject in sorted(seen.kv_subjects.items()):
            ledger.kv_revs.setdefault(subject.rsplit(".", 1)[-1], []).append(off)
        ledger.topics &= seen.topics
        ledger.floor = dict(ledger.high)
        ledger.corrupt |= set(seen.corrupt)


async def set_up(c: Client, ledger: Ledger, *, kv: bool = True) -> None:
    """Create what the ledger does not have yet (acknowledged creations recorded)."""
    try:
        await c.create_stream(STREAM)
    except P.BrokerError as err:
        if err.code != P.ErrorCode.STREAM_NAME_EXISTS:
            raise
    for name, (parts, subjects, options) in TOPICS.items():
        topic = f"{STREAM}/{name}"
        if topic in ledger.topics:
            continue
        try:
            info = await c.create_topic(STREAM, name, partitions=parts, subjects=subjects, **options)
        except P.BrokerError as err:
            if err.code != P.ErrorCode.TOPIC_NAME_EXISTS:
                raise
            info = await c.get_topic(STREAM, name)
        with ledger.lock:
            ledger.topics.add(topic)
            ledger.partitions[topic] = parts
    for topic in list(ledger.topics):
        stream, name = topic.split("/")
        info = await c.get_topic(stream, name)
        sid = (await c.get_stream(stream)).id
        ledger.ids[(sid, info.id)] = topic
    if kv and KV_TOPIC not in ledger.topics:
        try:
            await c.kv_create(KV_BUCKET, history=1)
        except P.BrokerError as err:
            if err.code != P.ErrorCode.TOPIC_NAME_EXISTS:
                raise
        info = await c.get_topic("kv", KV_BUCKET)
        sid = (await c.get_stream("kv")).id
        with ledger.lock:
            ledger.topics.add(KV_TOPIC)
            ledger.partitions[KV_TOPIC] = 1
            ledger.ids[(sid, info.id)] = KV_TOPIC


class Workload:
    """Clients that publish, delete, purge, store offsets and write KV keys, writing
    down every request before it is sent and every ack when it arrives."""

    def __init__(self, address: str, ledger: Ledger, rng: random.Random, tag: str, size: int) -> None:
        self.address = address
        self.ledger = ledger
        self.rng = rng
        self.tag = tag
        self.size = size
        self.stop = threading.Event()
        self.errors: list[str] = []

    def topic_of(self, ack: P.Ack) -> str:
        return self.ledger.ids[(ack.stream_id, ack.topic_id)]

    def payload(self, *parts: object) -> bytes:
        return (":".join(map(str, (self.tag, *parts))) + "|" + "x" * self.rng.randint(0, 240)).encode()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for k in range(3):
                nursery.start_soon(self.publisher, k, random.Random(self.rng.random()))
            nursery.start_soon(self.deleter, random.Random(self.rng.random()))
            nursery.start_soon(self.purger)
            nursery.start_soon(self.scratch)
            nursery.start_soon(self.offsets)
            nursery.start_soon(self.kv, random.Random(self.rng.random()))

    async def publisher(self, k: int, rng: random.Random) -> None:
        async with connect(self.address) as c:
            for i in range(self.size):
                if self.stop.is_set():
                    return
                batch = []
                for j in range(rng.randint(1, 6)):
                    pl = (f"{self.tag}:p{k}:{i}:{j}|" + "x" * rng.randint(0, 240)).encode()
                    if rng.random() < 0.7:
                        batch.append((f"orders.{rng.choice('abc')}.{rng.randint(0, 7)}", pl, None, None, "shop/orders"))
                    else:
                        batch.append((f"session.u{rng.randint(0, 9)}", pl, None, 3600, "shop/sessions"))
                with self.ledger.lock:
                    for s, pl, _, _, topic in batch:
                        self.ledger.sent[pl] = topic
                acks = await c.publish_batch([m[:4] for m in batch])
                assert acks is not None
                for (s, pl, *_), ack in zip(batch, acks):
                    if ack.error is not None:
                        self.errors.append(f"publish {s}: {ack.error}")
                        continue
                    self.ledger.ack(self.topic_of(ack), ack.partition, ack.offset, pl, s)

    async def deleter(self, rng: random.Random) -> None:
        async with connect(self.address) as c:
            for _ in range(self.size // 2):
                await trio.sleep(0.002)
                if self.stop.is_set():
                    return
                with self.ledger.lock:
                    candidates = [
                        k for k in self.ledger.acked
                        if k[0] == "shop/orders" and k not in self.ledger.gone and k not in self.ledger.maybe_gone
                        and b":purge:" not in self.ledger.acked[k]
                    ]
                    if not candidates:
                        continue
                    key = rng.choice(sorted(candidates))
                    self.ledger.maybe_gone.add(key)
                await c.delete_message(STREAM, "orders", key[1], key[2])
                with self.ledger.lock:
                    self.ledger.gone[key] = self.ledger.acked[key]
                    self.ledger.maybe_gone.discard(key)

    async def purger(self) -> None:
        """Publish on a subject of its own, then purge that subject."""
        async with connect(self.address) as c:
            for k in range(max(1, self.size // 10)):
                if self.stop.is_set():
                    return
                subject = f"orders.purge.{self.tag}{k}"
                keys = []
                for i in range(3):
                    pl = self.payload("purge", k, i).replace(b"|", b":purge:|", 1)
                    with self.ledger.lock:
                        self.ledger.sent[pl] = "shop/orders"
                    ack = await c.publish(subject, pl)
                    assert ack is not None
                    self.ledger.ack("shop/orders", ack.partition, ack.offset, pl, subject)
                    keys.append(("shop/orders", ack.partition, ack.offset))
                with self.ledger.lock:
                    self.ledger.maybe_gone.update(keys)
                await c.purge(STREAM, "orders", subject)
                with self.ledger.lock:
                    for key in keys:
                        self.ledger.gone[key] = self.ledger.acked[key]
                        self.ledger.maybe_gone.discard(key)

    async def scratch(self) -> None:
        """Publish a few messages, then purge the whole topic."""
        async with connect(self.address) as c:
            for k in range(max(1, self.size // 10)):
                if self.stop.is_set():
                    return
                keys = []
                for i in range(4):
                    pl = self.payload("scratch", k, i)
                    with self.ledger.lock:
                        self.ledger.sent[pl] = "shop/scratch"
                    ack = await c.publish(f"scratch.{k}", pl)
                    assert ack is not None
                    self.ledger.ack("shop/scratch", ack.partition, ack.offset, pl, f"scratch.{k}")
                    keys.append(("shop/scratch", ack.partition, ack.offset))
                if k % 2:
                    continue  # keep some
                with self.ledger.lock:
                    keys = [key for key in self.ledger.acked if key[0] == "shop/scratch" and key not in self.ledger.gone]
                    self.ledger.maybe_gone.update(keys)
                await c.purge(STREAM, "scratch")
                with self.ledger.lock:
                    for key in keys:
                        self.ledger.gone[key] = self.ledger.acked[key]
                        self.ledger.maybe_gone.discard(key)

    async def offsets(self) -> None:
        async with connect(self.address) as c:
            for i in range(self.size):
                if self.stop.is_set():
                    return
                ck = (CONSUMERS[i % 2], i % 3)
                value = self.ledger.offsets.get(ck, 0) + 1 + i
                with self.ledger.lock:
                    self.ledger.offsets_pending[ck] = value
                await c.store_offset(STREAM, "orders", ck[0], ck[1], value)
                with self.ledger.lock:
                    self.ledger.offsets[ck] = value
                    self.ledger.offsets_pending.pop(ck, None)
                await trio.sleep(0.001)

    async def kv(self, rng: random.Random) -> None:
        if KV_TOPIC not in self.ledger.topics:
            return
        async with connect(self.address) as c:
            bucket = await c.kv(KV_BUCKET)
            for i in range(self.size):
                if self.stop.is_set():
                    return
                key = f"k{rng.randint(0, 4)}"
                pl = self.payload("kv", i)
                with self.ledger.lock:
                    self.ledger.sent[pl] = KV_TOPIC
                    older = list(self.ledger.kv_revs.get(key, []))
                    self.ledger.maybe_gone.update((KV_TOPIC, 0, r) for r in older)
                rev = await bucket.put(key, pl)
                with self.ledger.lock:
                    self.ledger.ack(KV_TOPIC, 0, rev, pl, f"$KV.{KV_BUCKET}.{key}")
                    for r in older:  # history 1: the put removed them
                        self.ledger.gone[(KV_TOPIC, 0, r)] = self.ledger.acked[(KV_TOPIC, 0, r)]
                        self.ledger.maybe_gone.discard((KV_TOPIC, 0, r))
                    self.ledger.kv_revs[key] = [rev]


@dataclass
class Crash:
    state: CrashState
    ledger: Ledger


async def check_recovery(data: Path, ledger: Ledger, state: CrashState | None) -> tuple[Findings, Observed]:
    """Start a broker on ``data`` (outside any model) and compare what it serves."""
    async with start_server(make_config(data)) as h, connect(h.address) as c:
        seen = await read_everything(c, ledger)
    return compare(ledger, seen, state), seen


async def run_phase(
    data: Path, ledger: Ledger, rng: random.Random, tag: str, *, size: int, crash_at: int | None,
    after: CrashState | None = None,
) -> tuple[Crash | None, FsModel, Findings]:
    """One broker lifetime inside the model: recover (and, after a crash, check what
    it serves against ``ledger`` and ``after``), set up, run the workload, and take
    the crash state ``crash_at`` file operations after the set-up (None: at the end).
    Returns the crash (None if the check found a loss), the model and what the
    check found."""
    crashes: list[Crash] = []
    fired = threading.Event()

    def crash(model: FsModel) -> None:
        if not fired.is_set():
            crashes.append(Crash(model.snapshot(), ledger.copy()))
            fired.set()

    with FsModel(data) as fs:
        async with start_server(make_config(data)) as h:
            async with connect(h.address) as c:
                found = Findings()
                if after is not None:
                    seen = await read_everything(c, ledger)
                    found = compare(ledger, seen, after)
                    if found.loss:
                        return None, fs, found
                    rebase(ledger, seen)
                await set_up(c, ledger)
            if crash_at is not None:
                fs.trigger_after(fs.events + crash_at, crash)
            work = Workload(h.address, ledger, rng, tag, size)
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    while not fired.is_set():
                        await trio.sleep(0.001)
                    # The crash state is taken: let each client finish the request it
                    # has in flight and close (cancelling them mid-request only makes
                    # the broker's graceful stop wait for them to drain).
                    work.stop.set()
                    nursery.cancel_scope.deadline = trio.current_time() + 10

                nursery.start_soon(watch)
                await work.run()
                fs.trigger_after(0, crash)  # the workload ended first: crash now
            assert work.errors == [], work.errors
        assert fs.errors == [], fs.errors
        assert fs.untracked == [], fs.untracked
        assert fs.differences() == [], "the model lost track of the disk"
    return crashes[0], fs, found


def count_events(tmp_path: Path, size: int) -> int:
    """How many file operations a phase of this size makes (to choose crash points)."""
    data = tmp_path / "calibrate"
    data.mkdir()

    async def main() -> int:
        _, fs, _ = await run_phase(data, Ledger(), random.Random(0), "cal", size=size, crash_at=None)
        return fs.events

    return trio.run(main)


SIZE = 60
#: File operations after the set-up in one phase of SIZE, measured (count_events) and
#: rounded; crash points are drawn below it, so a few land after the end.
EVENTS = 2500


async def trial(tmp_path: Path, seed: int, phases: int = 2) -> Findings:
    """Phases of (broker under the model: recovery checked, workload, crash), each on
    the previous crash image, then a last recovery and one publish per partition;
    returns what broke (stopping at the first loss)."""
    rng = random.Random(seed)
    ledger = Ledger()
    data = tmp_path / "p0" / "data"
    data.mkdir(parents=True)
    torn = seed % 2 == 1
    state: CrashState | None = None
    where = ""
    total = Findings()

    def note(found: Findings) -> bool:
        for mine, theirs in ((total.loss, found.loss), (total.damage, found.damage)):
            if theirs:
                mine.extend([f"seed {seed}, recovering {where}:", *theirs])
        return bool(found.loss)

    for phase in range(phases):
        crash_at = 0 if (seed == 0 and phase == 0) else rng.randint(0, EVENTS)
        crash, _, found = await run_phase(
            data, ledger, random.Random(rng.random()), f"s{seed}p{phase}", size=SIZE, crash_at=crash_at, after=state
        )
        if note(found):
            return total
        assert crash is not None
        data = tmp_path / f"p{phase + 1}" / "data"
        crash.state.materialize(data, torn=torn, seed=seed * 1000 + phase)
        where = f"from the crash of phase {phase}, {crash_at} operations after the set-up (torn files: {crash.state.torn_files if torn else 'no torn image'})"
        ledger, state = crash.ledger, crash.state
    found, seen = await check_recovery(data, ledger, state)
    if note(found):
        return total
    rebase(ledger, seen)
    # New publishes get offsets above every acknowledged one.
    async with start_server(make_config(data)) as h, connect(h.address) as c:
        for (topic, p), subject in sorted(ledger.subjects.items()):
            if topic == KV_TOPIC or topic not in ledger.topics:
                continue
            ack = await c.publish(subject, b"after the last crash", ttl=3600 if topic == "shop/sessions" else None)
            assert ack is not None
            if ack.partition == p and ack.offset <= ledger.high.get((topic, p), 0):
                total.loss.append(f"seed {seed}: {topic}/{p} gave offset {ack.offset}, acknowledged up to {ledger.high[(topic, p)]}")
    return total


TRIALS = 20
_trials: dict[int, Findings] = {}


async def run_trial(tmp_path_factory: pytest.TempPathFactory, seed: int) -> Findings:
    """One trial per seed per session, shared by the tests that judge it."""
    if seed not in _trials:
        _trials[seed] = await trial(tmp_path_factory.mktemp(f"trial{seed}"), seed)
    return _trials[seed]


@pytest.mark.parametrize("seed", range(TRIALS))
async def test_power_loss_under_load_loses_nothing_acknowledged(tmp_path_factory: pytest.TempPathFactory, seed: int) -> None:
    """Crash at a seeded random file operation while clients publish, delete, purge,
    store offsets and write KV keys (odd seeds: torn images), twice in a row: every
    acknowledged message, deletion, consumer offset and topic is there, no offset
    is given out twice."""
    found = await run_trial(tmp_path_factory, seed)
    assert not found.loss, "\n".join(found.loss)


@pytest.mark.parametrize("seed", range(TRIALS))
async def test_power_loss_under_load_reports_no_damage(tmp_path_factory: pytest.TempPathFactory, seed: int) -> None:
    """The same trials: a power loss under ``always`` damages nothing, so recovery
    reports no corrupt record (unacknowledged bytes are a torn tail to cut). Found
    sealed segments whose indexes reached the disk before their last records."""
    found = await run_trial(tmp_path_factory, seed)
    assert not found.damage, "\n".join(found.damage)


# -- targeted scenarios: one promise each, the crash taken right after the ack ----------------


async def crash_after(tmp_path: Path, actions: Callable[[Client, Ledger], Any], *, before: Callable[[Client, Ledger], Any] | None = None) -> list[str]:
    """Optionally run ``before`` on a broker outside the model (its files then count
    as durable), then run ``actions`` on a broker inside it, take the crash image
    right after the last ack, recover it and compare."""
    data = tmp_path / "data"
    data.mkdir()
    ledger = Ledger()
    if before is not None:
        async with start_server(make_config(data)) as h, connect(h.address) as c:
            await before(c, ledger)
    with FsModel(data) as fs:
        async with start_server(make_config(data)) as h, connect(h.address) as c:
            await actions(c, ledger)
            state = fs.snapshot(extra=ledger.copy)
    assert fs.errors == [] and fs.untracked == [], (fs.errors, fs.untracked)
    image = tmp_path / "image"
    state.materialize(image)
    found, _ = await check_recovery(image, state.extra, state)
    return found.loss + found.damage


async def publish_some(c: Client, ledger: Ledger, n: int = 40, prefix: str = "m") -> None:
    for i in range(0, n, 8):
        batch = [(f"orders.{'abc'[j % 3]}.{j}", f"{prefix}{i + j}|{'y' * (i * 7 % 200)}".encode()) for j in range(8)]
        for _, pl in batch:
            ledger.sent[pl] = "shop/orders"
        acks = await c.publish_batch(batch)
        assert acks is not None
        acks.raise_for_errors()
        for (s, pl), a in zip(batch, acks):
            ledger.ack("shop/orders", a.partition, a.offset, pl, s)


async def test_messages_acknowledged_right_after_topic_creation_survive(tmp_path: Path) -> None:
    async def actions(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)
        await publish_some(c, ledger)

    problems = await crash_after(tmp_path, actions)
    assert not problems, "\n".join(problems)


async def test_an_acknowledged_topic_creation_survives(tmp_path: Path) -> None:
    async def actions(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=True)

    problems = await crash_after(tmp_path, actions)
    assert not problems, "\n".join(problems)


async def test_acknowledged_deletes_and_subject_purges_survive(tmp_path: Path) -> None:
    async def before(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)
        await publish_some(c, ledger)

    async def actions(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)
        rebase(ledger, await read_everything(c, ledger))
        for key in sorted(ledger.acked)[::5]:
            await c.delete_message(STREAM, "orders", key[1], key[2])
            ledger.gone[key] = ledger.acked[key]
        n = await c.purge(STREAM, "orders", "orders.a.>")
        assert n > 0
        for key, pl in ledger.acked.items():
            if pl.decode().split("|")[0][1:].isdigit() and int(pl.decode().split("|")[0][1:]) % 8 % 3 == 0:
                ledger.gone[key] = pl

    problems = await crash_after(tmp_path, actions, before=before)
    assert not problems, "\n".join(problems)


async def test_acknowledged_whole_topic_purge_survives_and_offsets_go_on(tmp_path: Path) -> None:
    async def before(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)
        await publish_some(c, ledger, 80)

    async def actions(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)
        rebase(ledger, await read_everything(c, ledger))
        await c.purge(STREAM, "orders")
        for key, pl in ledger.acked.items():
            ledger.gone[key] = pl
        await publish_some(c, ledger, 16, prefix="after")

    problems = await crash_after(tmp_path, actions, before=before)
    assert not problems, "\n".join(problems)


async def test_acknowledged_consumer_offsets_survive(tmp_path: Path) -> None:
    async def actions(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)
        for i in range(10):
            await c.store_offset(STREAM, "orders", CONSUMERS[i % 2], i % 3, 100 + i)
            ledger.offsets[(CONSUMERS[i % 2], i % 3)] = 100 + i

    problems = await crash_after(tmp_path, actions)
    assert not problems, "\n".join(problems)


async def test_consumer_offsets_stored_after_a_compacting_restart_survive(tmp_path: Path) -> None:
    """Many stores, a restart (which compacts the offsets file by rewriting it), then
    one more acknowledged store."""

    async def before(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)
        for i in range(300):
            await c.store_offset(STREAM, "orders", CONSUMERS[0], 0, i + 1)

    async def actions(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)
        await c.store_offset(STREAM, "orders", CONSUMERS[1], 1, 7)
        ledger.offsets[(CONSUMERS[0], 0)] = 300
        ledger.offsets[(CONSUMERS[1], 1)] = 7

    problems = await crash_after(tmp_path, actions, before=before)
    assert not problems, "\n".join(problems)


async def test_acknowledged_kv_overwrites_survive(tmp_path: Path) -> None:
    async def actions(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=True)
        bucket = await c.kv(KV_BUCKET)
        revs: dict[str, int] = {}
        for i in range(12):
            key = f"k{i % 3}"
            pl = f"v{i}".encode()
            ledger.sent[pl] = KV_TOPIC
            rev = await bucket.put(key, pl)
            ledger.ack(KV_TOPIC, 0, rev, pl, f"$KV.{KV_BUCKET}.{key}")
            if key in revs:
                ledger.gone[(KV_TOPIC, 0, revs[key])] = ledger.acked[(KV_TOPIC, 0, revs[key])]
            revs[key] = rev

    problems = await crash_after(tmp_path, actions)
    assert not problems, "\n".join(problems)


async def test_messages_in_rolled_segments_survive(tmp_path: Path) -> None:
    async def before(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)

    async def actions(c: Client, ledger: Ledger) -> None:
        await set_up(c, ledger, kv=False)
        await publish_some(c, ledger, 400)  # segments of 4 KiB: dozens of rolls

    problems = await crash_after(tmp_path, actions, before=before)
    assert not problems, "\n".join(problems)


async def test_a_power_loss_during_a_segment_roll_reports_no_damage(tmp_path: Path) -> None:
    """Two publishes in one read: the first fills the active segment, the second
    rolls it (the old segment is sealed) before the group commit has synced the
    first. A power loss right after the roll must leave nothing reported damaged:
    the first message was never acknowledged."""
    data = tmp_path / "data"
    data.mkdir()
    ledger = Ledger()
    states: list[CrashState] = []
    with FsModel(data) as fs:
        async with start_server(make_config(data)) as h:
            async with connect(h.address) as c:
                await set_up(c, ledger, kv=False)
                pdir = partition_dir(ledger, "shop/scratch", 0)
                for i in range(6):  # about 3 KiB of the 4 KiB segment
                    pl = f"fill{i}|{'f' * 480}".encode()
                    ledger.sent[pl] = "shop/scratch"
                    ack = await c.publish("scratch.a", pl)
                    assert ack is not None
                    ledger.ack("shop/scratch", 0, ack.offset, pl, "scratch.a")
            sealed = []

            def after_seal(op: Op) -> bool:
                """The partition directory's fsync after the sealed segment's indexes."""
                if op.op == "rename" and op.rel.startswith(pdir) and op.rel.endswith(".timeindex"):
                    sealed.append(op)
                return bool(sealed) and op.op == "fsync" and op.rel == pdir

            fs.trigger_on(after_seal, lambda m: states.append(m.snapshot(extra=ledger.copy)))
            peer = await RawPeer.open(h.address)
            await peer.handshake()
            big, small = f"big|{'b' * 1500}".encode(), b"small|rolls the segment"
            ledger.sent[big] = ledger.sent[small] = "shop/scratch"
            first, second = (
                peer.conn.send_request(corr, P.Publish.from_bodies([encode_msg("scratch.a", pl)]))
                for corr, pl in ((7, big), (8, small))
            )
            # One write: both in one read of the broker's, a PING between them so that
            # they are two appends (consecutive PUBLISH requests would be one batch).
            await peer.send(first + peer.conn.send_request(9, P.Ping()) + second)
            for _ in range(3):
                assert isinstance(await peer.next_event(), P.Response)
            await peer.aclose()
    assert states, f"no roll seen: {[o for o in fs.ops if o.rel.startswith(pdir)][-12:]}"
    assert fs.errors == [] and fs.untracked == []
    image = tmp_path / "image"
    states[0].materialize(image)
    found, _ = await check_recovery(image, states[0].extra, states[0])
    assert not (found.loss or found.damage), "\n".join(found.loss + found.damage)


@pytest.mark.parametrize("export_dir_exists", [True, False], ids=["existing_export_dir", "new_export_dir"])
async def test_an_acknowledged_export_survives(tmp_path: Path, export_dir_exists: bool) -> None:
    """After ``export`` returns, the manifest is there and every segment it lists has
    its Parquet file (a manifest naming a lost file would never export it again)."""
    require(extra_missing("spark"), "the export's power-loss test")
    root = tmp_path / "root"
    data, export = root / "data", root / "export"
    data.mkdir(parents=True)
    if export_dir_exists:
        export.mkdir()
    ledger = Ledger()
    with FsModel(root) as fs:
        async with start_server(make_config(data, **{"export.dir": str(export), "export.interval": 3600})) as h:
            async with connect(h.address) as c:
                await set_up(c, ledger, kv=False)
                await publish_some(c, ledger, 40)
                # The broker runs a pass in a worker process, out of the file system
                # model's sight: the pass's code runs here instead, on the broker's jobs.
                from spark_export import export_segments

                partitions = h.broker.all_partitions()
                for part in partitions:
                    part.log.seal_active()
                jobs = h.broker.exporter.snapshot(partitions)
                result = {"exported": await trio.to_thread.run_sync(export_segments, str(export), jobs)}
                assert result["exported"]
                state = fs.snapshot()
    image = tmp_path / "image"
    state.materialize(image)
    from spark_export import Manifest

    problems = []
    if not (image / "export").is_dir():
        problems.append(f"the export directory is gone: {state.explain('export')}")
    else:
        manifest = Manifest.load(str(image / "export"))
        if set(manifest.segments) != {e["key"] for e in result["exported"]}:
            problems.append(f"the manifest lists {sorted(manifest.segments)}, exported {[e['key'] for e in result['exported']]}: {state.diff('export')}")
        for key, entry in manifest.segments.items():
            if not (image / "export" / entry["path"]).exists():
                problems.append(f"{key}: {entry['path']} is in the manifest, not on disk: {state.explain(os.path.join('export', entry['path']))}")
    assert not problems, "\n".join(problems)
