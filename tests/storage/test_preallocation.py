"""The active segment's log is allocated ahead of its last record: an fdatasync then
writes data, not a new file size. What a crash leaves (a tail of zero bytes) is cut
without a report; anything else in that tail keeps the torn-tail and damage rules."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from conftest import start_server
from test_recovery import fill, live_offsets

import protocol as P
from broker.client import connect
from storage import Damage, Journal, PartitionLog, Segment, sync_fds
from storage._durability import PREALLOCATE_MAX, PREALLOCATE_MIN


def crashed(tmp_path: Path, n: int, log: PartitionLog | None = None) -> tuple[Path, int, int]:
    """A partition of ``n`` records (or ``log``, written under ``tmp_path / "live"``) as a
    kill -9 leaves it: its files copied while the log is open (synced first, as the
    group commit does before any ack). Returns the copy, the active segment's size
    and the length of the allocated tail after it."""
    log = log or fill(tmp_path / "live", n)
    size = log.active.size
    sync_fds(log.take_dirty_fds())
    copy = tmp_path / "crashed"
    shutil.copytree(tmp_path / "live", copy)
    log.close()
    return copy, size, os.path.getsize(active_log(copy)) - size


def active_log(path: Path) -> Path:
    return sorted(path.glob("*.log"))[-1]


def append_one(log: PartitionLog, payload: bytes, subject: str = "s.x") -> int:
    body = P.encode_body(subject, payload)
    return log.append(body, [0], [len(body)], 5000).first_offset


def test_the_active_log_is_allocated_ahead_and_sizes_are_logical(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    seg = log.active
    on_disk = os.path.getsize(seg.log_path)
    assert on_disk == seg.size + PREALLOCATE_MIN and seg.size == log.size_bytes
    assert live_offsets(log) == list(range(1, 11))
    assert append_one(log, b"more") == 11 and log.size_bytes == seg.size
    assert os.path.getsize(seg.log_path) == on_disk  # written inside the allocated space
    with open(seg.log_path, "rb") as f:
        raw = f.read()
    assert raw[seg.size :] == bytes(on_disk - seg.size)
    log.close()


def test_allocation_grows_with_the_segment_and_stops_at_its_size_limit(tmp_path: Path) -> None:
    limit = 3 * PREALLOCATE_MIN
    log, _ = PartitionLog.open(str(tmp_path), limit)
    payload = b"p" * 4000
    for _ in range(200):
        append_one(log, payload)
        seg = log.active
        on_disk = os.path.getsize(seg.log_path)
        # Ahead by at most as much as the segment holds (or the minimum), never past the limit.
        assert seg.size <= on_disk <= max(seg.size, limit)
        assert on_disk <= seg.size + min(max(seg.size, PREALLOCATE_MIN), PREALLOCATE_MAX)
    assert len(log.segments) > 2
    for seg in log.segments[:-1]:
        assert os.path.getsize(seg.log_path) == seg.size  # a seal cuts the allocated space
    log.close()


def test_a_crash_with_an_allocated_tail_recovers_every_record(tmp_path: Path) -> None:
    found: list[Damage] = []
    copy, size, tail = crashed(tmp_path, 20, fill(tmp_path / "live", 20, batches=4))
    assert tail > 0
    log, reports = PartitionLog.open(str(copy), 1 << 20, report=found.append)
    assert found == [] and reports[-1].preallocated_bytes == tail and reports[-1].truncated_bytes == 0
    assert live_offsets(log) == list(range(1, 21)) and log.next_offset == 21
    assert os.path.getsize(active_log(copy)) == size == log.size_bytes
    assert append_one(log, b"after the crash") == 21
    log.close()
    log, reports = PartitionLog.open(str(copy), 1 << 20, report=found.append)
    assert found == [] and live_offsets(log) == list(range(1, 22))
    log.close()


@pytest.mark.parametrize("lost_cut", [0, 5000])
def test_a_clean_close_leaves_no_tail(tmp_path: Path, lost_cut: int) -> None:
    found: list[Damage] = []
    log = fill(tmp_path, 20)
    size = log.active.size
    log.close()
    assert os.path.getsize(active_log(tmp_path)) == size
    with open(active_log(tmp_path), "ab") as f:
        f.write(bytes(lost_cut))  # the close's cut did not reach the disk before a power loss
    log, reports = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    assert found == [] and reports[-1].tail_bytes == reports[-1].preallocated_bytes == lost_cut
    assert log.active.snapshot_columns is not None  # the clean close's snapshot describes the log
    assert os.path.getsize(active_log(tmp_path)) == size and live_offsets(log) == list(range(1, 21))
    log.close()


def test_a_nonzero_byte_in_the_allocated_tail_after_a_crash_is_a_torn_tail(tmp_path: Path) -> None:
    copy, size, tail = crashed(tmp_path, 10)
    path = active_log(copy)
    with open(path, "r+b") as f:
        f.seek(size + 1000)
        f.write(b"\x07")
    log, reports = PartitionLog.open(str(copy), 1 << 20)
    # Today's torn-tail rule, unchanged: after a crash, cut and counted as a torn write.
    assert reports[-1].preallocated_bytes == 0 and reports[-1].truncated_bytes == tail
    assert reports[-1].truncated_at_offset == 11 and live_offsets(log) == list(range(1, 11))
    log.close()


def test_a_nonzero_byte_in_a_tail_after_a_clean_close_is_damage_kept_aside(tmp_path: Path) -> None:
    found: list[Damage] = []
    log = fill(tmp_path, 10)
    size = log.active.size
    log.close()
    path = active_log(tmp_path)
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, size, 8192)
        os.pwrite(fd, b"\xff", size + 4000)
    finally:
        os.close(fd)
    log, reports = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append, quarantine_dir=str(tmp_path / "q"))
    assert reports[-1].preallocated_bytes == 0
    assert [(d.kind, d.position, d.detail) for d in found] == [
        ("segment", size, "8192 bytes after the last record of a segment that was closed cleanly")
    ]
    kept = list((tmp_path / "q").iterdir())
    assert len(kept) == 1 and kept[0].read_bytes() == bytes(4000) + b"\xff" + bytes(4191)
    assert live_offsets(log) == list(range(1, 11))
    log.close()


def test_zeros_where_acknowledged_records_were_are_damage_not_allocated_space(tmp_path: Path) -> None:
    found: list[Damage] = []
    log = fill(tmp_path, 10)
    last = log.active.positions[-1]
    log.close()  # records every offset up to 10 as acknowledged
    path = active_log(tmp_path)
    with open(path, "r+b") as f:
        f.seek(last)
        f.write(bytes(os.path.getsize(path) - last))  # record 10 zeroed
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    assert len(found) == 1 and "1 acknowledged record(s) missing" in found[0].detail and found[0].offsets == (10, 10)
    assert live_offsets(log) == list(range(1, 10)) and log.next_offset == 11
    log.close()


@pytest.mark.parametrize("keep", [1, 4, 24, 38, 43, 44, 60, 139])
def test_a_torn_record_followed_by_allocated_space_is_a_torn_tail(tmp_path: Path, keep: int) -> None:
    copy, size, tail = crashed(tmp_path, 5)
    path = active_log(copy)
    # The next record, whose payload ends in zero bytes, written in part over the zeros.
    record = P.encode_record(6, 5000, P.encode_body("s.x", b"abc" + bytes(100)))
    written = len(record.rstrip(b"\x00"))  # from here on the record is the zeros already there
    assert written == 44 and keep < len(record) and record[:keep].strip(b"\x00")
    with open(path, "r+b") as f:
        f.seek(size)
        f.write(record[:keep])
    log, reports = PartitionLog.open(str(copy), 1 << 20)
    assert reports[-1].preallocated_bytes == (tail - len(record) if keep >= written else 0)
    if keep < written:
        # Today's torn tail: the part written and the zeros after it, cut as one.
        assert reports[-1].truncated_bytes == tail and reports[-1].truncated_at_offset == 6
        assert live_offsets(log) == [1, 2, 3, 4, 5]
    else:
        # Every byte of the record is on disk (its last ones were zeros already): whole.
        assert reports[-1].truncated_bytes == 0 and live_offsets(log) == [1, 2, 3, 4, 5, 6]
        assert bytes(log.get(6)) == record
    assert append_one(log, b"again") == log.next_offset - 1
    log.close()


def test_a_whole_record_of_zero_payload_before_the_allocated_space_is_kept(tmp_path: Path) -> None:
    log = fill(tmp_path / "live", 3)
    append_one(log, bytes(300))
    copy, _, _ = crashed(tmp_path, 3, log)
    log, reports = PartitionLog.open(str(copy), 1 << 20)
    assert reports[-1].truncated_bytes == 0 and reports[-1].preallocated_bytes > 0
    assert live_offsets(log) == [1, 2, 3, 4] and bytes(log.get(4)).endswith(bytes(300))
    log.close()


def test_a_check_of_a_crashed_log_reports_and_changes_nothing(tmp_path: Path) -> None:
    found: list[Damage] = []
    copy, _, _ = crashed(tmp_path, 10)
    before = os.path.getsize(active_log(copy))
    log, reports = PartitionLog.open(str(copy), 1 << 20, report=found.append, readonly=True)
    assert found == [] and reports[-1].preallocated_bytes > 0 and live_offsets(log) == list(range(1, 11))
    log.close(clean=False)
    assert os.path.getsize(active_log(copy)) == before


def test_a_file_system_that_cannot_allocate_costs_only_the_saving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    log = fill(tmp_path, 10)
    assert append_one(log, b"still written") == 11
    assert os.path.getsize(log.active.log_path) == log.active.size == log.size_bytes
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert live_offsets(log) == list(range(1, 12))
    log.close()


def test_a_new_segment_is_created_empty(tmp_path: Path) -> None:
    seg = Segment.create(str(tmp_path), 1, 1 << 20)
    assert os.path.getsize(seg.log_path) == 0 and seg.size == 0
    seg.close()


async def test_sizes_reported_are_the_records_bytes(config, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    async with start_server(config) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        for i in range(20):
            await c.publish("t.x", f"message {i}".encode())
        topic = await c.get_topic("s", "t")
        stats = await c.stats()
        log_path = active_log(data_dir / "streams/1/topics/1/partitions/0")
        on_disk = os.path.getsize(log_path)
        fetched = await c.fetch("s", "t", 0, 1, 100)
        assert len(fetched.messages) == 20
        assert topic.size == stats["bytes_in_logs"] < on_disk  # the file is allocated ahead
    assert os.path.getsize(log_path) == topic.size  # a clean stop cuts it


# -- the consumer journal: two copies, allocated ahead alike ----------------------------------


def journal_copies(path: Path) -> list[Path]:
    return [path, Path(f"{path}.1")]


def test_the_journal_is_allocated_ahead_and_a_close_cuts_it(tmp_path: Path) -> None:
    path = tmp_path / "consumers.journal"
    j = Journal(str(path))
    for k in range(5):
        j.append(b"entry-%d" % k)
    assert all(os.path.getsize(p) > j.size for p in journal_copies(path))
    j.close()
    assert all(os.path.getsize(p) == j.size for p in journal_copies(path))
    found: list[Damage] = []
    j = Journal(str(path), report=found.append)
    assert j.payloads == [b"entry-%d" % k for k in range(5)] and found == []
    j.close()


def test_a_journal_left_with_allocated_tails_opens_without_damage(tmp_path: Path) -> None:
    path = tmp_path / "live" / "consumers.journal"
    j = Journal(str(path))
    for k in range(5):
        j.append(b"entry-%d" % k)
    sync_fds(j.take_dirty_fds())
    shutil.copytree(tmp_path / "live", tmp_path / "crashed")  # as a kill -9 leaves them
    j.close()
    copy = tmp_path / "crashed" / "consumers.journal"
    size = j.size
    assert all(os.path.getsize(p) > size for p in journal_copies(copy))
    found: list[Damage] = []
    j = Journal(str(copy), report=found.append)
    assert j.payloads == [b"entry-%d" % k for k in range(5)] and not j.gaps and found == []
    assert all(os.path.getsize(p) == size for p in journal_copies(copy))
    assert not (tmp_path / "crashed" / "quarantine").exists()
    j.append(b"after")
    j.close()
    assert Journal(str(copy), report=found.append).payloads[-1] == b"after" and found == []


def test_a_torn_journal_entry_before_allocated_space_is_still_a_torn_entry(tmp_path: Path) -> None:
    path = tmp_path / "live" / "consumers.journal"
    j = Journal(str(path))
    j.append(b"whole")
    size = j.size
    j.append(b"torn-entry")
    sync_fds(j.take_dirty_fds())
    shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    j.close()
    copy = tmp_path / "crashed" / "consumers.journal"
    for p in journal_copies(copy):
        raw = bytearray(p.read_bytes())
        raw[j.size - 5 : j.size] = bytes(5)  # the entry's last bytes never written
        p.write_bytes(bytes(raw))
    found: list[Damage] = []
    j = Journal(str(copy), report=found.append)
    assert j.payloads == [b"whole"] and not j.gaps
    assert len(found) == 2 and all("cut short" in d.detail and d.position == size for d in found)
    j.close()


def test_a_journal_a_file_system_cannot_allocate_is_written_all_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    path = tmp_path / "consumers.journal"
    j = Journal(str(path))
    for k in range(3):
        j.append(b"entry-%d" % k)
    assert all(os.path.getsize(p) == j.size for p in journal_copies(path))
    j.close()
    assert Journal(str(path)).payloads == [b"entry-0", b"entry-1", b"entry-2"]


def test_a_seal_syncs_the_log_even_after_the_group_commit_took_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    append_one(log, b"a" * 3000)
    append_one(log, b"b" * 3000)  # past the limit: the allocated space is used up
    seg = log.active
    assert os.path.getsize(seg.log_path) == seg.size > 4096
    taken = log.take_dirty_fds()  # the group commit took the log: its sync may still be under way
    assert taken == [seg.fileno()] and not seg.dirty
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    fd = seg.fileno()
    assert log.seal_active()
    assert fd in synced  # before the index that lists the records is written
    log.close()


# -- a segment's deletions: two copies, allocated ahead alike ---------------------------------


def test_deletions_are_allocated_ahead_and_a_close_cuts_them(tmp_path: Path) -> None:
    log = fill(tmp_path, 10)
    seg = log.active
    assert log.delete_many([2, 5]) == 2
    entries = 2 * 8
    assert os.path.getsize(seg.del_path) == os.path.getsize(seg.mirror_path) > entries
    log.close()
    assert os.path.getsize(seg.del_path) == os.path.getsize(seg.mirror_path) == entries
    found: list[Damage] = []
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, report=found.append)
    assert found == [] and live_offsets(log) == [1, 3, 4, 6, 7, 8, 9, 10]
    log.close()


def crashed_with_deletions(tmp_path: Path) -> tuple[Path, list[Path]]:
    """10 records, 2 and 5 deleted, as a kill -9 leaves them: the copy, and its
    active segment's two deletion files (16 bytes of entries, then allocated space)."""
    log = fill(tmp_path / "live", 10)
    seg = log.active
    assert log.delete_many([2, 5]) == 2
    copy, _, _ = crashed(tmp_path, 10, log)
    paths = [copy / os.path.basename(seg.del_path), copy / os.path.basename(seg.mirror_path)]
    assert all(os.path.getsize(p) > 16 for p in paths)
    return copy, paths


def test_deletions_left_with_allocated_tails_open_without_damage(tmp_path: Path) -> None:
    copy, paths = crashed_with_deletions(tmp_path)
    found: list[Damage] = []
    log, _ = PartitionLog.open(str(copy), 1 << 20, report=found.append)
    assert found == [] and live_offsets(log) == [1, 3, 4, 6, 7, 8, 9, 10]
    assert all(os.path.getsize(p) == 16 for p in paths)
    assert log.delete(7)
    log.close()
    log, _ = PartitionLog.open(str(copy), 1 << 20, report=found.append)
    assert found == [] and live_offsets(log) == [1, 3, 4, 6, 8, 9, 10]
    log.close()


def test_a_nonzero_byte_after_the_deletions_is_still_damage(tmp_path: Path) -> None:
    copy, (path, _) = crashed_with_deletions(tmp_path)
    with open(path, "r+b") as f:
        f.seek(16 + 100)
        f.write(b"\x01")
    found: list[Damage] = []
    log, _ = PartitionLog.open(str(copy), 1 << 20, report=found.append)
    # Today's rule for bytes in a deletion file that no entry explains: the copy is
    # reported at the first of them, and the entries neither copy can give make the
    # segment's live records put aside rather than risk serving a deleted one.
    assert [(d.kind, d.path, d.position) for d in found][0] == ("deletions", str(path), 16)
    assert "unreadable in both copies" in found[1].detail and len(found) == 2
    assert not log.is_live(2) and not log.is_live(5) and live_offsets(log) == []
    log.close()
