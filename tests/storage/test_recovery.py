"""Recovery: torn tails are cut, corruption anywhere is found and reported, and
nothing valid after a damaged record is ever dropped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import protocol as P
from storage import CorruptedRecord, PartitionLog
from storage._state import StateFile


def fill(path: Path, n: int, segment_size: int = 1 << 20, batches: int = 1) -> PartitionLog:
    log, _ = PartitionLog.open(str(path), segment_size)
    per = n // batches
    for b in range(batches):
        parts = [P.encode_body(f"s.{i}", f"payload-{b * per + i:05d}".encode()) for i in range(per)]
        data = b"".join(parts)
        starts, ends, pos = [], [], 0
        for p in parts:
            starts.append(pos)
            pos += len(p)
            ends.append(pos)
        log.append(data, starts, ends, 1000 + b)
    return log


def flip(path: str, position: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        b = f.read(1)
        f.seek(position)
        f.write(bytes([b[0] ^ mask]))


def live_offsets(log: PartitionLog) -> list[int]:
    out: list[int] = []
    off = 1
    while off < log.next_offset:
        try:
            res = log.read(off, 1000, 1 << 30)
        except CorruptedRecord as err:
            off = err.offset + 1
            continue
        out.extend(res.offsets)
        if res.next_offset <= off:
            break
        off = res.next_offset
    return out


@pytest.mark.parametrize("cut", [1, 5, 23, 24, 30, 37, 38, 50])
def test_torn_tail_is_truncated_and_only_it(tmp_path: Path, cut: int) -> None:
    log = fill(tmp_path, 10)
    seg = log.segments[-1]
    last_start = seg.positions[-1]
    log.close(clean=False)  # a crash: nothing was synced, nothing acknowledged
    os.truncate(seg.log_path, last_start + cut)  # the last record, written in part
    log, reports = PartitionLog.open(str(tmp_path), 1 << 20)
    assert reports[-1].truncated_bytes == cut and reports[-1].truncated_at_offset == 10
    assert log.next_offset == 10 and live_offsets(log) == list(range(1, 10))
    assert os.path.getsize(seg.log_path) == last_start
    # Offsets continue from the last good one; the torn one is reused (it was never acked).
    log.append(P.encode_body("x", b"new"), [0], [len(P.encode_body("x", b"new"))], 2000)
    assert log.next_offset == 11


def test_garbage_after_the_tail_is_truncated(tmp_path: Path) -> None:
    log = fill(tmp_path, 5)
    path = log.segments[-1].log_path
    log.close(clean=False)
    with open(path, "ab") as f:
        f.write(b"\x00" * 100)  # preallocated-but-unwritten space after a crash
    size = os.path.getsize(path) - 100
    log, reports = PartitionLog.open(str(tmp_path), 1 << 20)
    # Allocated space, not a torn record: cut, counted apart, never a truncated record.
    assert reports[-1].truncated_bytes == 0 and reports[-1].preallocated_bytes == 100
    assert live_offsets(log) == [1, 2, 3, 4, 5] and os.path.getsize(path) == size


def test_bit_flip_inside_the_active_segment_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    seg = log.segments[-1]
    flip(seg.log_path, seg.positions[4] + 40)  # inside record 5's body
    log.close()
    log, reports = PartitionLog.open(str(tmp_path), 1 << 20)
    assert reports[-1].truncated_bytes == 0 and reports[-1].corrupt_offsets == [5]
    assert live_offsets(log) == [1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert log.next_offset == 11


def test_flipped_length_field_in_the_active_segment_keeps_what_follows(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    seg = log.segments[-1]
    flip(seg.log_path, seg.positions[2] + 1, 0x40)  # record 3's length becomes huge
    log.close()
    log, reports = PartitionLog.open(str(tmp_path), 1 << 20)
    assert reports[-1].truncated_bytes == 0 and reports[-1].corrupt_offsets == [3]
    assert live_offsets(log) == [1, 2, 4, 5, 6, 7, 8, 9, 10]


def test_bit_flip_in_a_sealed_segment_is_reported_on_read(tmp_path: Path) -> None:
    found: list[int] = []
    log = fill(tmp_path, 60, segment_size=1024, batches=6)
    assert len(log.segments) >= 3
    sealed = log.segments[0]
    victim = sealed.base + 3
    log.close()
    flip(sealed.log_path, sealed.positions[3] + 45)
    log, reports = PartitionLog.open(str(tmp_path), 1024, lambda off, why: found.append(off))
    assert not any(r.corrupt_offsets for r in reports)  # sealed segments are checked on read
    with pytest.raises(CorruptedRecord) as info:
        log.read(victim, 10, 1 << 20)
    assert info.value.offset == victim and found == [victim]
    assert "corrupt" in info.value.message
    offsets = live_offsets(log)
    assert victim not in offsets and len(offsets) == 59
    # A read that starts before it stops just before it, serving what precedes.
    res = log.read(1, 100, 1 << 20)
    assert res.offsets == list(range(1, victim))


def test_scan_verifies_every_record(tmp_path: Path) -> None:
    found: list[int] = []
    log = fill(tmp_path, 60, segment_size=1024, batches=6)
    sealed = log.segments[1]
    victim = sealed.base + 1
    log.close()
    flip(sealed.log_path, sealed.positions[1] + 30)
    log, _ = PartitionLog.open(str(tmp_path), 1024, lambda off, why: found.append(off))
    seen = [o for live in log.scan() for o in live.offsets]
    assert found == [victim] and victim not in seen and len(seen) == 59


def test_truncated_sealed_segment_marks_missing_records_corrupt(tmp_path: Path) -> None:
    log = fill(tmp_path, 60, segment_size=1024, batches=6)
    sealed = log.segments[0]
    count = sealed.count
    cut_at = sealed.positions[count - 3]
    log.close()
    os.truncate(sealed.log_path, cut_at + 7)  # lose the last three records (one in part)
    log, reports = PartitionLog.open(str(tmp_path), 1024)
    missing = [sealed.base + count - 3, sealed.base + count - 2, sealed.base + count - 1]
    assert reports[0].index_rebuilt and reports[0].corrupt_offsets == missing
    offsets = live_offsets(log)
    assert not set(missing) & set(offsets) and len(offsets) == 57
    # Nothing after the damaged segment was dropped.
    assert offsets[-1] == 60


def test_missing_index_is_rebuilt(tmp_path: Path) -> None:
    log = fill(tmp_path, 60, segment_size=1024, batches=6)
    sealed = log.segments[0]
    expected = list(sealed.positions)
    log.close()
    os.unlink(sealed.index_path)
    os.unlink(sealed.time_path)
    log, reports = PartitionLog.open(str(tmp_path), 1024)
    assert reports[0].index_rebuilt and list(log.segments[0].positions) == expected
    assert live_offsets(log) == list(range(1, 61))
    assert os.path.exists(sealed.index_path)


def test_old_purge_watermark_is_read_on_upgrade_and_damage_reported(tmp_path: Path) -> None:
    import struct
    import zlib

    log = fill(tmp_path, 5)
    log.close()
    # A partition of the first format: a ``purged`` file, no ``partition.state``.
    os.unlink(tmp_path / "partition.state")
    (tmp_path / "purged").write_bytes(struct.pack("<QI", 2, zlib.crc32(struct.pack("<Q", 2))))
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert log.purged_through == 2 and live_offsets(log) == [3, 4, 5]
    log.close()
    os.unlink(tmp_path / "partition.state")
    flip(str(tmp_path / "purged"), 0)
    found: list = []
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    assert [d.kind for d in found] == ["partition_state"] and "checksum" in found[0].detail


def commit(log: PartitionLog) -> None:
    """What the group commit does: take the dirty descriptors (and sync them), then
    tell the log that their records are durable (acknowledged)."""
    log.take_dirty_fds()
    log.synced()


def test_acknowledged_records_cut_on_a_record_boundary_are_damage_and_their_offsets_never_reused(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    commit(log)
    seg = log.segments[-1]
    cut = seg.positions[7]
    log.close(clean=False)
    os.truncate(seg.log_path, cut)  # records 8..10 gone, on a record boundary
    found: list = []
    log, reports = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    assert [(d.kind, d.offsets) for d in found] == [("segment", (8, 10))]
    assert "acknowledged" in found[0].detail and reports[-1].truncated_bytes == 0
    assert log.next_offset == 11 and live_offsets(log) == list(range(1, 8))
    with pytest.raises(CorruptedRecord):
        log.get(9)
    log.append(P.encode_body("x", b"new"), [0], [len(P.encode_body("x", b"new"))], 2000)
    assert log.last_offset == 11
    log.close()
    # Still reported, never reused, after the next start too.
    found.clear()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    assert log.next_offset == 12 and live_offsets(log) == list(range(1, 8)) + [11]


def test_acked_next_is_written_once_the_sync_completed_and_only_for_what_it_took(tmp_path: Path) -> None:
    """``acked_next`` moves when the group commit says a sync completed
    (``synced``), to the next offset of the moment it took the descriptors: not when
    they are taken, nor for records appended after."""
    state = tmp_path / "partition.state"

    def acked_next_on_disk() -> int:
        sf = StateFile.open(str(state), readonly=True)
        sf.close()
        return sf.state.acked_next

    log = fill(tmp_path, 10)
    before = acked_next_on_disk()
    assert log.take_dirty_fds()
    assert acked_next_on_disk() == before  # taken, not yet synced
    log.append(P.encode_body("x", b"later"), [0], [len(P.encode_body("x", b"later"))], 2000)  # during the sync
    log.synced()
    assert acked_next_on_disk() == 11  # what the sync took, not offset 11 appended after
    log.synced()
    assert acked_next_on_disk() == 11  # told twice: nothing more
    log.close(clean=False)
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert log.next_offset >= 12 and live_offsets(log) == list(range(1, 12))
    log.close()


def test_garbage_after_a_clean_stop_is_damage_not_a_torn_write(tmp_path: Path) -> None:
    log = fill(tmp_path, 5)
    path = log.segments[-1].log_path
    log.close()
    with open(path, "ab") as f:
        f.write(b"\x07" * 100)
    found: list = []
    log, reports = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append, quarantine_dir=str(tmp_path / "q"))
    assert [d.kind for d in found] == ["segment"] and "closed cleanly" in found[0].detail
    assert live_offsets(log) == [1, 2, 3, 4, 5] and log.next_offset == 6
    (kept,) = os.listdir(tmp_path / "q")
    assert (tmp_path / "q" / kept).read_bytes() == b"\x07" * 100


def test_a_zeroed_page_in_the_active_segment_loses_only_the_records_it_covered(tmp_path: Path) -> None:
    log = fill(tmp_path, 400)  # ~50 bytes each: a page covers about 80 records
    commit(log)
    seg = log.segments[-1]
    log.close(clean=False)
    with open(seg.log_path, "r+b") as f:
        f.seek(4096)
        f.write(bytes(4096))
    found: list = []
    log, reports = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    (first, last), = [d.offsets for d in found]
    assert last - first + 1 > 64  # more than the old resync window could bridge
    assert reports[-1].corrupt_offsets == list(range(first, last + 1))
    assert live_offsets(log) == [o for o in range(1, 401) if not first <= o <= last]
    assert log.next_offset == 401


def test_with_reservations_a_crash_never_hands_an_acknowledged_offset_out_again(tmp_path: Path) -> None:
    # fsync interval or never: acks leave before the data is on disk, so a machine
    # crash can lose acknowledged records; their offsets must stay used.
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, reserve=True)
    body = P.encode_body("s", b"x")
    for _ in range(10):
        log.append(body, [0], [len(body)], 1000)
    seg = log.segments[-1]
    log.close(clean=False)
    os.truncate(seg.log_path, seg.positions[5])  # the page cache never reached the disk
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, reserve=True)
    assert log.next_offset > 10 and log.skipped is not None and log.skipped[0] == 6
    assert live_offsets(log) == [1, 2, 3, 4, 5]
    log.append(body, [0], [len(body)], 2000)
    log.close()
    # A clean stop records the exact next offset: no skip on the next start.
    nxt = log.next_offset
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, reserve=True)
    assert log.next_offset == nxt and log.skipped is None


def test_one_damaged_copy_of_the_deletions_brings_nothing_back(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    log.delete_many([2, 5, 9])
    seg = log.segments[-1]
    log.close()
    with open(seg.del_path, "r+b") as f:
        f.write(bytes(8))  # the first entry zeroed
    found: list = []
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append, quarantine_dir=str(tmp_path / "q"))
    assert [d.kind for d in found] == ["deletions"] and found[0].position == 0
    assert live_offsets(log) == [1, 3, 4, 6, 7, 8, 10]
    assert os.listdir(tmp_path / "q")[0].startswith(os.path.basename(seg.del_path))
    # Rewritten from the good copy: the next start finds nothing wrong.
    log.close()
    found.clear()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    assert found == [] and live_offsets(log) == [1, 3, 4, 6, 7, 8, 10]


def test_deletions_unreadable_in_both_copies_put_the_segment_aside_for_good(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    log.delete_many([2, 5])
    seg = log.segments[-1]
    log.close()
    for path in (seg.del_path, seg.mirror_path):
        flip(path, 1)  # the first entry (offset 2's deletion) in both copies
    found: list = []
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    assert any("unreadable in both copies" in d.detail for d in found)
    # Which record that entry deleted cannot be told: none of the segment's records
    # is served (offset 2 must not come back), every read says why.
    assert live_offsets(log) == []
    with pytest.raises(CorruptedRecord):
        log.get(2)
    # Records appended later are not in doubt: they go to a new segment.
    body = P.encode_body("s", b"later")
    log.append(body, [0], [len(body)], 3000)
    assert live_offsets(log) == [11]
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert live_offsets(log) == [11]  # durable: the doubt is not forgotten on the next start
    # A sealed segment with records put aside is never reclaimed by the cleaner.
    assert log.segments[0].corrupt_count and log.reclaimable() == []


def test_a_damaged_index_is_rebuilt_and_reported(tmp_path: Path) -> None:
    log = fill(tmp_path, 60, segment_size=1024, batches=6)
    sealed = log.segments[0]
    times = [log.timestamp_of(o) for o in range(1, 61)]
    log.close()
    flip(sealed.time_path, 5)
    flip(sealed.index_path, 6)
    found: list = []
    log, _ = PartitionLog.open(str(tmp_path), 1024, report=found.append)
    assert sorted(d.kind for d in found) == ["offset_index", "time_index"]
    assert live_offsets(log) == list(range(1, 61))
    assert [log.timestamp_of(o) for o in range(1, 61)] == times


def test_both_state_slots_damaged_skip_offsets_and_keep_the_purge(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    log.purge()
    body = P.encode_body("s", b"x")
    log.append(body, [0], [len(body)], 2000)
    log.close()
    with open(tmp_path / "partition.state", "r+b") as f:
        f.write(bytes(8192))
    found: list = []
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    assert len([d for d in found if d.kind == "partition_state"]) == 2
    assert live_offsets(log) == [11] and log.next_offset > 12
