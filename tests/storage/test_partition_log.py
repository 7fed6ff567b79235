"""The partition log on real files: append, read, roll, delete, purge, reopen."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

import protocol as P
from storage import CorruptedRecord, PartitionLog, Segment, read_deletion_tags, segment_name


def bodies(n: int, start: int = 0, size: int = 40) -> tuple[bytes, list[int], list[int]]:
    parts = [P.encode_body(f"s.{(start + i) % 7}", f"m{start + i}".encode().ljust(size, b".")) for i in range(n)]
    starts, ends, pos = [], [], 0
    for b in parts:
        starts.append(pos)
        pos += len(b)
        ends.append(pos)
    return b"".join(parts), starts, ends


def append(log: PartitionLog, n: int, start: int = 0, ts: int = 1000) -> int:
    data, s, e = bodies(n, start)
    return log.append(data, s, e, ts).first_offset


def payloads(log: PartitionLog, offset: int = 1, count: int = 10**9) -> list[bytes]:
    res = log.read(offset, count, 1 << 30)
    recs = b"".join(bytes(r) for r in res.records)
    return [m.payload.rstrip(b".") for m in P.decode_records(recs, 0, len(recs), res.count)]


def test_append_assigns_consecutive_offsets_from_one(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert append(log, 3) == 1
    assert append(log, 2, 3) == 4
    assert log.next_offset == 6 and log.live_count == 5 and log.first_offset == 1
    assert payloads(log) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    res = log.read(2, 2, 1 << 20)
    assert res.offsets == [2, 3] and res.next_offset == 4 and res.runs == [(2, 2)]
    log.delete(3)
    res = log.read(1, 10, 1 << 20)
    assert res.runs == [(1, 2), (4, 2)] and res.count == 4  # a deletion splits a run


def test_segments_roll_at_size_and_are_named_by_first_offset(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    for k in range(20):
        append(log, 10, k * 10)
    assert len(log.segments) > 3
    names = sorted(p.name for p in tmp_path.glob("*.log"))
    assert names == [segment_name(s.base) + ".log" for s in log.segments]
    assert all(s.sealed for s in log.segments[:-1]) and not log.segments[-1].sealed
    for s in log.segments[:-1]:
        assert os.path.exists(s.index_path) and os.path.exists(s.time_path)
    assert payloads(log) == [f"m{i}".encode() for i in range(200)]
    assert [len(payloads(log, o, 3)) for o in (1, 50, 199, 200, 201)] == [3, 3, 2, 1, 0]


def test_max_bytes_bounds_a_read_but_returns_at_least_one(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    append(log, 50)
    one = len(log.read(1, 1, 1 << 20).records[0])
    three = log.read(1, 50, one * 3)
    assert three.count == 3 and len(three.records) == 1 and len(three.records[0]) == 3 * one  # one run
    assert log.read(1, 50, 1).count == 1


def test_reopen_restores_everything(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    for k in range(10):
        append(log, 7, k * 7, ts=1000 + k)
    assert log.delete(3) and log.delete(40)
    assert not log.delete(3)
    before = payloads(log)
    log.close()
    log2, reports = PartitionLog.open(str(tmp_path), 4096)
    assert not any(r.truncated_bytes or r.corrupt_offsets for r in reports)
    assert payloads(log2) == before and len(before) == 68
    assert log2.next_offset == 71 and log2.live_count == 68
    assert not log2.is_live(3) and not log2.is_live(40)
    assert log2.timestamp_of(1) == 1000 and log2.timestamp_of(70) == 1009
    assert append(log2, 1, 70) == 71


def _none(offset: int) -> bool:
    return False


def test_an_append_with_a_timestamp_for_each_record(tmp_path: Path) -> None:
    """A mirror's copies keep their origin's timestamps, one append for a batch:
    each record has its own (raised to the one before when it goes back), the time
    index finds them, and a reopen (which rebuilds the time index from the records)
    agrees."""
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    append(log, 2, ts=1000)
    data, s, e = bodies(5, 2)
    res = log.append(data, s, e, 0, timestamps=[1000, 1005, 1003, 1010, 1010])
    assert res.first_offset == 3 and res.timestamp == 1000 and res.timestamps == [1000, 1005, 1005, 1010, 1010]
    want = {1: 1000, 2: 1000, 3: 1000, 4: 1005, 5: 1005, 6: 1010, 7: 1010}
    recs = log.read(1, 10, 1 << 20)
    raw = b"".join(bytes(r) for r in recs.records)
    assert {m.offset: m.timestamp for m in P.decode_records(raw, 0, len(raw), recs.count)} == want
    assert {o: log.timestamp_of(o) for o in want} == want
    assert log.live_offsets_until(1004, _none) == [1, 2, 3] and log.live_offsets_until(1009, _none) == [1, 2, 3, 4, 5]
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert {o: log.timestamp_of(o) for o in want} == want and log.live_offsets_until(1004, _none) == [1, 2, 3]
    assert append(log, 1, 7, ts=1001) == 8 and log.timestamp_of(8) == 1010  # never back


def test_purge_is_durable_and_offsets_never_repeat(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    for k in range(5):
        append(log, 20, k * 20)
    assert log.purge() == 100
    assert log.live_count == 0 and log.first_offset == 0 and payloads(log) == []
    assert len(list(tmp_path.glob("*.log"))) == 1  # only the empty active segment
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    assert log.next_offset == 101 and log.live_count == 0
    assert append(log, 2, 100) == 101
    assert log.purge(101) == 1
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    assert payloads(log) == [b"m101"] and log.first_offset == 102


def test_purge_finishes_after_a_crash_before_unlinking(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    for k in range(6):
        append(log, 20, k * 20)
    kept = [s.log_path for s in log.segments]
    log.purge()
    log.close()
    # Bring back the removed files, as if the crash came right after the watermark.
    # (They are recreated empty-named with junk; the watermark must win.)
    for path in kept[:-1]:
        Path(path).write_bytes(b"junk that is never read")
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    assert log.live_count == 0 and payloads(log) == []
    assert sorted(tmp_path.glob("*.log")) == [Path(log.segments[0].log_path)]


def test_deletes_in_sealed_segments_survive_restart(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    for k in range(10):
        append(log, 10, k * 10)
    assert log.delete_many([1, 2, 50, 99, 100, 100, 5000]) == 5
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    assert log.live_count == 95 and log.first_offset == 3
    with pytest.raises(P.MessageNotFoundError):  # type: ignore[attr-defined]
        log.get(50)
    assert P.check_record(bytes(log.get(51)), 0, len(log.get(51))) > 0


def test_deletions_keep_their_tag(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    append(log, 6)
    log.delete_many([1, 2], tag=3)
    log.delete_many([2, 5], tag=15)  # 2 is already gone: its first tag stays
    log.delete(6)
    seg = log.segments[0]
    log.close()
    assert read_deletion_tags(seg.del_path) == {0: 3, 1: 3, 4: 15, 5: 0}
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert [log.is_live(o) for o in range(1, 7)] == [False, False, True, True, False, False]


def test_deferred_deletions_are_synced_only_when_asked_or_with_a_later_deletion(tmp_path: Path) -> None:
    """``delete_many(deferred=True)`` writes the entries but leaves them out of
    ``take_dirty_fds`` (the group commit of the append that caused them); a later
    plain deletion of the segment syncs them too, and a clean close syncs them."""
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    append(log, 6)
    seg = log.segments[0]
    log.take_dirty_fds()
    log.delete_many([1, 2], tag=6, deferred=True)
    assert log.take_dirty_fds() == [] and log.live_count == 4 and not log.is_live(1)
    fds = log.take_deferred_fds()  # both copies
    assert len(set(fds)) == 2 and min(fds) >= 0
    assert log.take_deferred_fds() == []
    log.delete_many([3], tag=6, deferred=True)
    log.delete(4)  # a plain deletion: its sync takes the deferred entry too
    assert len(log.take_dirty_fds()) == 2 and log.take_deferred_fds() == []
    log.delete_many([5], tag=6, deferred=True)
    assert log.deferred_segments
    log.close()  # clean: the deferred deletion is synced before the clean flag
    assert read_deletion_tags(seg.del_path) == {0: 6, 1: 6, 2: 6, 3: 0, 4: 6}
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert [log.is_live(o) for o in range(1, 7)] == [False, False, False, False, False, True]


def test_torn_delete_entry_is_ignored(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    append(log, 5)
    log.delete(2)
    seg = log.segments[0]
    log.close()
    with open(seg.del_path, "ab") as f:
        f.write(b"\x03\x00\x00")  # a torn second entry (delete of offset 4, never acked)
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert log.live_count == 4 and log.is_live(4) and not log.is_live(2)


def test_random_actions_against_a_model(tmp_path: Path) -> None:
    """Seeded random appends, deletes, purges, reads and reopens; the log must always
    agree with a plain dict model (sortedcontainers' stress-test style)."""
    rng = random.Random(0)
    log, _ = PartitionLog.open(str(tmp_path), 4096)
    model: dict[int, bytes] = {}
    counter = 0
    for _ in range(400):
        action = rng.choices(["append", "delete", "purge", "read", "reopen"], [50, 20, 3, 20, 7])[0]
        if action == "append":
            n = rng.randint(1, 30)
            first = append(log, n, counter)
            for i in range(n):
                model[first + i] = f"m{counter + i}".encode()
            counter += n
        elif action == "delete" and model:
            victims = rng.sample(sorted(model), min(len(model), rng.randint(1, 5)))
            assert log.delete_many(victims) == len(victims)
            for v in victims:
                del model[v]
        elif action == "purge":
            through = rng.randint(0, log.last_offset) if rng.random() < 0.5 else None
            removed = log.purge(through)
            doomed = [o for o in model if through is None or o <= through]
            assert removed == len(doomed) or (through is not None and through <= log.purged_through and removed == 0)
            for o in doomed:
                del model[o]
        elif action == "read":
            start = rng.randint(1, max(1, log.next_offset))
            res = log.read(start, rng.randint(1, 50), 1 << 20)
            expected = [o for o in sorted(model) if o >= start][: len(res.offsets)]
            assert res.offsets == expected
        else:
            log.close()
            log, reports = PartitionLog.open(str(tmp_path), 4096)
            assert not any(r.truncated_bytes or r.corrupt_offsets for r in reports)
        assert log.live_count == len(model)
        assert log.first_offset == (min(model) if model else 0)
    assert payloads(log) == [model[o] for o in sorted(model)]


def test_segment_files_roundtrip_through_open_sealed(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 1024)
    for k in range(6):
        append(log, 10, k * 10, ts=5000 + k)
    assert len(log.segments) > 2
    first = log.segments[0]
    seg, report = Segment.open_sealed(str(tmp_path), first.base, first.count)
    assert not report.index_rebuilt and list(seg.positions) == list(first.positions)
    assert list(seg.time_ts) == list(first.time_ts)
    seg.close()


def test_reading_a_corrupt_first_record_raises(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    append(log, 3)
    seg = log.segments[0]
    with open(seg.log_path, "r+b") as f:
        f.seek(seg.positions[0] + 30)
        b = f.read(1)
        f.seek(seg.positions[0] + 30)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(CorruptedRecord) as info:
        log.read(1, 10, 1 << 20)
    assert info.value.offset == 1 and info.value.code == P.ErrorCode.CORRUPTED_RECORD
    assert log.read(2, 10, 1 << 20).offsets == [2, 3]
    assert log.live_count == 2


def test_a_filtered_read_returns_the_wanted_records_and_reads_only_up_to_the_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``wanted`` (a consumer's filter): the first ``max_count`` live wanted records, the
    same bytes as an unfiltered read gives, within ``max_bytes`` (at least one); and one
    ``pread`` ends at the last record returned, never the segment's end."""
    log, _ = PartitionLog.open(str(tmp_path), 64 * 1024)
    for k in range(30):
        append(log, 50, k * 50)
    log.delete_many(list(range(3, 1500, 11)))
    read_sizes: list[int] = []
    real_pread = os.pread

    def pread(fd: int, n: int, pos: int) -> bytes:
        read_sizes.append(n)
        return real_pread(fd, n, pos)

    monkeypatch.setattr(os, "pread", pread)
    everything = log.read(1, 10**9, 1 << 30)
    by_offset = {}
    for view, (first, n) in zip(everything.records, everything.runs):
        recs = P.decode_records(bytes(view), 0, len(view), n)
        for i, m in enumerate(recs):
            by_offset[first + i] = (m.subject, m.payload)
    one = len(log.read(1, 1, 1 << 20).records[0])
    rng = random.Random(5)
    for _ in range(300):
        mod = rng.choice([1, 2, 3, 7, 40])
        wanted = (lambda o, mod=mod: o % mod == 0)
        start = rng.randint(1, log.next_offset)
        count = rng.randint(1, 120)
        max_bytes = rng.choice([1, one * 5, one * 37, 1 << 20])
        read_sizes.clear()
        res = log.read(start, count, max_bytes, wanted)
        expected = [o for o in sorted(by_offset) if o >= start and wanted(o)][:count]
        assert res.offsets == expected[: len(res.offsets)]
        if expected:
            assert res.offsets  # at least one
        if max_bytes == 1 << 20:
            assert res.offsets == expected
        got = []
        for view, (first, n) in zip(res.records, res.runs):
            recs = P.decode_records(bytes(view), 0, len(view), n)
            got += [(first + i, (m.subject, m.payload)) for i, m in enumerate(recs)]
        assert got == [(o, by_offset[o]) for o in res.offsets]
        if res.offsets:
            # Each pread covers records up to the last one returned (plus the records
            # skipped in between), not the rest of the segment.
            span = (res.offsets[-1] - res.offsets[0] + 1) * (one + 8)
            assert sum(read_sizes) <= span + len(read_sizes) * (one + 8)
    # Reading on from each ``next_offset`` finds every wanted record once, in order.
    for mod in (1, 3, 40):
        wanted = (lambda o, mod=mod: o % mod == 0)
        for count, max_bytes in ((1, 1 << 20), (7, one * 3), (100, 1 << 20)):
            offset, seen = 1, []
            while offset < log.next_offset:
                res = log.read(offset, count, max_bytes, wanted)
                assert res.next_offset > offset or res.offsets
                seen += res.offsets
                offset = res.next_offset
            assert seen == [o for o in sorted(by_offset) if wanted(o)]


def test_the_cleaner_removes_segments_together_with_one_directory_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage import _partition_log

    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    for k in range(3):
        append(log, 5, start=k * 5)
        log.seal_active()
    append(log, 5, start=15)
    syncs: list[str] = []
    monkeypatch.setattr(_partition_log, "fsync_dir", syncs.append)
    with pytest.raises(ValueError, match="only a sealed segment without live records can be removed"):
        log.remove_segments(log.segments[:2])  # live records: nothing is removed
    assert len(log.segments) == 4 and syncs == []
    log.delete_many(list(range(1, 11)))
    gone = log.reclaimable()
    assert [s.base for s in gone] == [1, 6]
    size = log.size_bytes - sum(s.size for s in gone)
    assert log.remove_segments(gone) > 0
    assert [s.base for s in log.segments] == [11, 16] and log.size_bytes == size and syncs == [str(tmp_path)]
    assert not any(os.path.exists(s.log_path) for s in gone)
    assert log.read(1, 100, 1 << 20).offsets == list(range(11, 21))
    log.close()


@pytest.mark.parametrize("reserve", [False, True])
def test_start_at_a_first_offset_survives_reopening(tmp_path: Path, reserve: bool) -> None:
    """A topic's first_seq: a log that never held a record starts at it, and so does
    the same log reopened, with nothing below it readable."""
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, reserve=reserve)
    log.start_at(500)
    assert (log.next_offset, log.last_offset, log.first_offset, log.live_count) == (500, 499, 0, 0)
    assert append(log, 3) == 500
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, reserve=reserve)
    assert log.first_offset == 500 and payloads(log) == [b"m0", b"m1", b"m2"]
    assert append(log, 1, 3) == 503
    with pytest.raises(ValueError):
        log.start_at(1000)
    log.close()


def test_a_crash_between_the_watermark_and_the_new_segment_reopens_at_the_first_offset(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    log.mark_purged(99)  # start_at's first step, then the crash
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert log.next_offset == 100 and append(log, 1) == 100
    log.close()
