"""A seal run in steps, the way ``export(seal=True)`` runs it so that the event loop
is held only for the switch (``PartitionLog.roll_active`` on the loop, then
``Segment.write_seal_files`` in a worker thread, then ``Segment.end_seal``): a power
loss after any file operation of it, or between the steps, loses no synced record
and leaves nothing that recovery reports as damage (an index that reached the disk
before the records it lists would be); the files it skips for a segment closed
meanwhile are never written."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

import protocol as P
from storage import Damage, PartitionLog, sync_fds

try:  # tests/fault as a package or as a rootdir-relative folder
    from .fsmodel import CrashState, FsModel
except ImportError:
    from fsmodel import CrashState, FsModel

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the model reads descriptors back through /proc/self/fd")


def append(log: PartitionLog, first: int, n: int) -> None:
    parts = [P.encode_body(f"s.{i % 3}", f"m{i}".encode().ljust(40 + i % 50, b".")) for i in range(first, first + n)]
    starts, ends, pos = [], [], 0
    for b in parts:
        starts.append(pos)
        pos += len(b)
        ends.append(pos)
    log.append(b"".join(parts), starts, ends, 1000 + first)


def payloads(log: PartitionLog) -> list[bytes]:
    res = log.read(1, 10**9, 1 << 30)
    recs = b"".join(bytes(r) for r in res.records)
    return [m.payload.rstrip(b".") for m in P.decode_records(recs, 0, len(recs), res.count)]


def recover(state: CrashState, dest: Path, torn: bool) -> tuple[list[bytes], list[Damage], list[int]]:
    state.materialize(dest, torn=torn, seed=7)
    damage: list[Damage] = []
    log, _ = PartitionLog.open(str(dest / "p"), 1 << 20, report=damage.append, expect_existing=True)
    try:
        return payloads(log), damage, [s.base for s in log.segments]
    finally:
        log.close()


@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn"])
def test_a_power_loss_at_any_step_of_a_seal_in_steps(tmp_path: Path, torn: bool) -> None:
    root = tmp_path / "root"
    root.mkdir()
    log, _ = PartitionLog.open(str(root / "p"), 1 << 20)
    append(log, 0, 30)  # a segment of its own before the model starts: durable
    log.seal_active()
    log.close()
    states: list[tuple[str, CrashState]] = []
    with FsModel(root) as fs:
        log, _ = PartitionLog.open(str(root / "p"), 1 << 20, expect_existing=True)
        append(log, 30, 200)
        sync_fds(log.take_dirty_fds())  # acknowledged
        synced = 230
        append(log, 230, 20)  # appended after the export's flush_active: not synced yet
        first_event = fs.events
        for n in range(first_event + 1, first_event + 80):
            fs.trigger_after(n, lambda m, n=n: states.append((f"after operation {n - first_event}", m.snapshot())))
        rolled = log.roll_active()
        assert rolled is not None
        seg, crc = rolled
        assert crc is not None
        states.append(("between roll_active and write_seal_files", fs.snapshot()))
        wrote: list[bool] = []
        worker = threading.Thread(target=lambda: wrote.append(seg.write_seal_files(crc)))
        worker.start()
        append(log, 250, 5)  # the loop goes on appending to the new segment meanwhile
        worker.join()
        assert wrote == [True]
        seg.end_seal(crc)
        assert seg.sealed and seg.sealed_crc == crc and seg.count == 220
        states.append(("after end_seal", fs.snapshot()))
        after = fs.events
        sync_fds(log.take_dirty_fds())
        log.close()
    assert fs.errors == [] and fs.untracked == [], (fs.errors, fs.untracked)
    assert after - first_event < 80, "the trigger range must cover the whole seal"
    expected = [f"m{i}".encode() for i in range(255)]
    for k, (when, state) in enumerate(states):
        got, damage, bases = recover(state, tmp_path / f"image{k}", torn)
        assert damage == [], f"{when}: {damage}"
        assert got == expected[: len(got)], f"{when}: records out of order or changed"
        assert len(got) >= synced, f"{when}: {synced - len(got)} synced records lost"
    # The last state: the sealed segment's index and summary are durable.
    _, _, bases = recover(states[-1][1], tmp_path / "last", torn)
    sealed_base = bases[1]
    name = f"{sealed_base:020d}"
    for ext in (".index", ".timeindex", ".summary"):
        assert (tmp_path / "last" / "p" / (name + ext)).exists(), ext


def test_the_seal_files_of_a_segment_closed_meanwhile_are_not_written(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path / "p"), 1 << 20)
    append(log, 0, 10)
    rolled = log.roll_active()
    assert rolled is not None
    seg, crc = rolled
    seg.remove_files()  # a topic deleted (or a purge) before the worker thread ran
    assert seg.write_seal_files(crc) is False
    assert not any(n.startswith(f"{seg.base:020d}") for n in os.listdir(tmp_path / "p"))
    log.close()


def test_a_removal_while_the_seal_files_are_written_waits_for_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic deleted (or a segment removed) while a worker thread writes the seal's
    files: the removal waits for the thread, then removes them with the rest."""
    from storage import Segment

    log, _ = PartitionLog.open(str(tmp_path / "p"), 1 << 20)
    append(log, 0, 10)
    rolled = log.roll_active()
    assert rolled is not None
    seg, crc = rolled
    writing, go_on, closing = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []
    write_indexes, close_files, close = Segment._write_indexes, Segment._close, Segment.close

    def held_write(self: Segment) -> None:
        writing.set()
        assert go_on.wait(30)
        write_indexes(self)
        order.append("indexes written")

    def logged_close(self: Segment) -> None:
        order.append("files closed")
        close_files(self)

    def announced_close(self: Segment) -> None:
        closing.set()
        close(self)

    monkeypatch.setattr(Segment, "_write_indexes", held_write)
    monkeypatch.setattr(Segment, "_close", logged_close)
    monkeypatch.setattr(Segment, "close", announced_close)
    wrote: list[bool] = []
    writer = threading.Thread(target=lambda: wrote.append(seg.write_seal_files(crc)))
    writer.start()
    assert writing.wait(30)
    remover = threading.Thread(target=seg.remove_files)
    remover.start()
    assert closing.wait(30)
    go_on.set()
    writer.join(30)
    remover.join(30)
    assert wrote == [True]
    assert order == ["indexes written", "files closed"]
    assert not any(n.startswith(f"{seg.base:020d}") for n in os.listdir(tmp_path / "p"))
    monkeypatch.undo()
    log.close()


def test_a_seal_in_steps_gives_the_files_a_seal_gives(tmp_path: Path) -> None:
    """Same index, time index and summary bytes as ``seal_active``, and the same
    state: sealed, with the summary's CRC-32, its ``.columns`` file owed."""
    whole, _ = PartitionLog.open(str(tmp_path / "a"), 1 << 20)
    steps, _ = PartitionLog.open(str(tmp_path / "b"), 1 << 20)
    for log in (whole, steps):
        for k in range(5):
            append(log, k * 7, 7)
    whole.seal_active()
    rolled = steps.roll_active()
    assert rolled is not None
    seg, crc = rolled
    seg.end_seal(crc if seg.write_seal_files(crc) else None)
    a, b = whole.segments[0], steps.segments[0]
    assert (b.sealed, b.sealed_crc, b.columns_owed) == (a.sealed, a.sealed_crc, a.columns_owed) == (True, a.crc, True)
    for ext in (".log", ".index", ".timeindex", ".summary"):
        name = f"{a.base:020d}{ext}"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), ext
    import struct

    raw = (tmp_path / "b" / f"{a.base:020d}.timeindex").read_bytes()
    entries = list(struct.iter_unpack("<IQ", raw[: 12 * len(b.time_rel)]))
    assert len(b.time_rel) == 5 and entries == list(zip(b.time_rel, b.time_ts))
    assert steps.roll_active() is None  # the new active segment is empty
    whole.close()
    steps.close()
