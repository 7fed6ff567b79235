"""A roll of a full active segment during an append, with its seal owed
(``PartitionLog.defer_seals``, the broker's way: only the switch on the event loop,
``Segment.write_seal_files`` in a worker thread later, then ``Segment.end_seal``): a
power loss after any file operation of the append that rolls, of the appends after
it, or of the owed seal's writes loses no synced record and leaves nothing recovery
reports as damage (a missing index is rebuilt)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from storage import Damage, PartitionLog, sync_fds

try:  # tests/fault as a package or as a rootdir-relative folder
    from .fsmodel import CrashState, FsModel
    from .test_seal_steps import append, recover
except ImportError:
    from fsmodel import CrashState, FsModel
    from test_seal_steps import append, recover

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the model reads descriptors back through /proc/self/fd")


@pytest.mark.parametrize("reserve", [False, True], ids=["always", "reserve"])
@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn"])
def test_a_power_loss_at_any_step_of_a_roll_with_its_seal_owed(tmp_path: Path, torn: bool, reserve: bool) -> None:
    root = tmp_path / "root"
    root.mkdir()
    log, _ = PartitionLog.open(str(root / "p"), 1 << 20)
    append(log, 0, 30)  # a segment of its own before the model starts: durable
    log.seal_active()
    log.close()
    states: list[tuple[str, CrashState, int]] = []
    synced = [0]
    with FsModel(root) as fs:
        log, _ = PartitionLog.open(str(root / "p"), 4096, expect_existing=True, reserve=reserve)
        owed: list[PartitionLog] = []
        log.defer_seals, log.on_seal_owed = True, owed.append
        append(log, 30, 30)  # under 4 KiB
        sync_fds(log.take_dirty_fds())  # acknowledged
        synced[0] = 60
        append(log, 60, 30)  # not synced yet, past 4 KiB: the next append rolls
        first_event = fs.events
        for n in range(first_event + 1, first_event + 120):
            fs.trigger_after(n, lambda m, n=n: states.append((f"after operation {n - first_event}", m.snapshot(), synced[0])))
        append(log, 90, 5)  # rolls: the switch only
        assert owed == [log] and len(log.owed_seals) == 1 and len(log.segments) == 3
        seg, crc = log.owed_seals[0]
        assert not seg.sealed and crc is not None and seg.count == 60
        assert not (root / "p" / f"{seg.base:020d}.index").exists()
        states.append(("after the roll", fs.snapshot(), synced[0]))
        sync_fds(log.take_dirty_fds())  # the new segment's records acknowledged before the seal's files
        synced[0] = 95
        states.append(("records of the new segment synced, seal owed", fs.snapshot(), synced[0]))
        wrote: list[bool] = []
        worker = threading.Thread(target=lambda: wrote.append(seg.write_seal_files(crc)))
        worker.start()
        append(log, 95, 5)  # the loop goes on appending meanwhile
        worker.join()
        assert wrote == [True]
        seg.end_seal(crc)
        log.seal_done(seg)
        assert seg.sealed and seg.sealed_crc == crc and log.owed_seals == []
        states.append(("after end_seal", fs.snapshot(), synced[0]))
        after = fs.events
        sync_fds(log.take_dirty_fds())
        log.close()
    assert fs.errors == [] and fs.untracked == [], (fs.errors, fs.untracked)
    assert after - first_event < 120, "the trigger range must cover the whole roll and seal"
    expected = [f"m{i}".encode() for i in range(100)]
    for k, (when, state, acked) in enumerate(states):
        got, damage, _ = recover(state, tmp_path / f"image{k}", torn)
        assert damage == [], f"{when}: {damage}"
        assert got == expected[: len(got)], f"{when}: records out of order or changed"
        assert len(got) >= acked, f"{when}: {acked - len(got)} synced records lost"
    _, _, bases = recover(states[-1][1], tmp_path / "last", torn)
    name = f"{bases[1]:020d}"
    for ext in (".index", ".timeindex", ".summary"):
        assert (tmp_path / "last" / "p" / (name + ext)).exists(), ext


@pytest.mark.parametrize("finish", [True, False], ids=["finished", "abandoned"])
def test_owed_seals_at_a_close_and_with_a_removed_segment(tmp_path: Path, finish: bool) -> None:
    """Owed seals are finished by ``finish_seals`` (the broker's stop) or left by a
    close (a deleted topic): the next start then rebuilds the missing index, which is
    not damage; the cleaner never leaves a gap after a segment whose seal is owed."""
    log, _ = PartitionLog.open(str(tmp_path / "p"), 1024)
    log.defer_seals = True
    for k in range(4):
        append(log, k * 20, 20)  # each append after the first rolls
    assert len(log.owed_seals) == 3 and not any(s.sealed for s in log.segments)
    first, second = log.segments[:2]
    log.delete_many(list(range(first.base, second.next_offset)))
    # The segment after one whose seal is owed is not reclaimable: after a crash before
    # that index is durable, the rebuilt index would expect the removed records.
    assert log.reclaimable() == [first]
    log.remove_segment(first)  # its owed seal goes with it
    assert [s for s, _ in log.owed_seals] == log.segments[:2] and log.reclaimable() == [second]
    log.remove_segment(second)
    assert [s for s, _ in log.owed_seals] == log.segments[:1]
    assert log.read(1, 1000, 1 << 20).count == 40  # readable while owed
    if finish:
        log.finish_seals()
        assert log.owed_seals == [] and log.segments[0].sealed
    log.close()
    damage: list[Damage] = []
    reopened, reports = PartitionLog.open(str(tmp_path / "p"), 1024, report=damage.append, expect_existing=True)
    assert damage == [] and [r.index_rebuilt for r in reports] == [not finish, False]
    assert reopened.read(1, 1000, 1 << 20).count == 40
    reopened.close()


@pytest.mark.parametrize("reserve", [False, True], ids=["always", "reserve"])
def test_a_growing_active_log_asks_to_be_synced_ahead_only_when_acks_do_not_wait(tmp_path: Path, reserve: bool) -> None:
    """Under fsync interval or never (``reserve``) nothing syncs the active log before
    its roll, whose sync on the event loop would write the whole segment: each eighth
    of a segment asks the owner to sync it ahead in a thread (``flush_active``)."""
    log, _ = PartitionLog.open(str(tmp_path / "p"), 8000, reserve=reserve)
    calls: list[PartitionLog] = []
    log.defer(calls.append)
    n = 0
    while log.active.size + 200 < 1000:  # under an eighth
        append(log, n, 1)
        n += 1
    assert not log.flush_wanted and calls == []
    append(log, n, 3)  # past 1,000 bytes
    assert log.active.size < 2000 and log.flush_wanted == reserve and calls == ([log] if reserve else [])
    log.flush_wanted = False
    append(log, n + 3, 1)  # the same eighth: no new request
    assert not log.flush_wanted and log.active.size < 2000
    append(log, n + 4, 12)
    assert log.flush_wanted == reserve
    log.close()
