"""The startup scan's fast path: a sealed segment whose ``.summary`` holds the log's
size and CRC-32 from seal time is verified with one CRC-32 of the file instead of one
per record, its records' fields come from its ``.columns`` file instead of the
records, and it yields exactly what the record-by-record scan yields. A summary that is
damaged, or that the segment no longer matches, falls back to the record-by-record
scan, reported; the records' state never depends on which path was taken."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import protocol as P
import storage._partition_recovery as partition_log
import storage._indexes as indexes_module
import storage._recovery as recovery_module
from storage import CORRUPT, Damage, PartitionLog

_CHECK_RECORD = partition_log.check_record
_EXTRACT = indexes_module.extract_columns
_SCAN = recovery_module.scan_records
extracted: list[int] = []
#: Bases of the segments read record by record on open (the active one, without its snapshot).
rescanned: list[int] = []
SEGMENT = 512  # a handful of records per segment: many sealed segments
SUBJECTS = [b"a", b"b.1", b"c.x.y"]
TTLS = [0, 0, 5, 60, P.TTL_NEVER]
FLAGS = [0, 0, 0, 0x01, P.FLAG_NO_MARKER, P.FLAG_TOMBSTONE]
HEADERS = [b"", b"", P.encode_headers({"Nats-Msg-Id": "m-1"}), P.encode_headers({"K": "v", "Nats-Msg-Id": "m-2"})]


def append(log: PartitionLog, records: list[tuple[int, int, int, int]], timestamp: int) -> None:
    bodies = [
        P.encode_body(SUBJECTS[s], b"p" * (20 + n % 40), HEADERS[h], TTLS[t], FLAGS[f])
        for s, t, f, h, n in ((*r, i) for i, r in enumerate(records))
    ]
    starts, ends, pos = [], [], 0
    for b in bodies:
        starts.append(pos)
        pos += len(b)
        ends.append(pos)
    log.append(b"".join(bodies), starts, ends, timestamp)


record = st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(0, 5), st.integers(0, 3))
appends = st.tuples(st.just("append"), st.lists(record, min_size=5, max_size=40))
op = st.one_of(
    appends,
    appends,
    appends,
    st.tuples(st.just("delete"), st.lists(st.integers(0, 10_000), max_size=8)),
    st.tuples(st.just("purge"), st.integers(0, 10_000)),
    st.tuples(st.just("restart"), st.booleans()),
)


def scanned(log: PartitionLog) -> list[tuple[object, ...]]:
    """What the scan says of each segment's live records (the subject numbering and
    whether per-subject stats come along may differ by path; the stats, when given,
    must be those of the live records)."""
    out = []
    for live in log.scan(headers=True):
        offs = live.offsets
        subjects = live.subjects
        if live.stats is not None:
            want: dict[bytes, list[int]] = {}
            for o, s in zip(offs, subjects):
                st = want.setdefault(s, [0, o, o])
                st[0] += 1
                st[2] = o
            assert {live.names[k]: list(v) for k, v in enumerate(live.stats)} == want
        out.append((live.runs, subjects, [live.flags[o - live.base] for o in offs], live.ttls, live.headers))
    return out


def offsets(scan: list[tuple[object, ...]]) -> list[int]:
    return [o for live in scan for first, n in live[0] for o in range(first, first + n)]  # type: ignore[attr-defined]


def columns(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.columns"))}


def state_of(log: PartitionLog) -> list[tuple[int, bytes, int]]:
    return [(s.base, bytes(s.state), s.live_count) for s in log.segments]


def open_counting(path: Path, monkeypatch: pytest.MonkeyPatch, found: list[Damage]) -> tuple[PartitionLog, list[int]]:
    """Open the partition, counting the records verified one by one (and, in
    ``extracted``, the records whose fields were read from the log)."""
    checked: list[int] = []

    def counting(buf: bytes, pos: int, end: int) -> int:
        checked.append(pos)
        return _CHECK_RECORD(buf, pos, end)

    def extracting(buf, positions):  # type: ignore[no-untyped-def]
        extracted.extend(positions)
        return _EXTRACT(buf, positions)

    def scanning(buf, base):  # type: ignore[no-untyped-def]
        rescanned.append(base)
        return _SCAN(buf, base)

    extracted.clear()
    rescanned.clear()
    monkeypatch.setattr(partition_log, "check_record", counting)
    monkeypatch.setattr(indexes_module, "extract_columns", extracting)
    monkeypatch.setattr(recovery_module, "scan_records", scanning)
    log, _ = PartitionLog.open(str(path), SEGMENT, report=found.append)
    return log, checked


def summaries(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.summary"))}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.tuples(appends, appends, st.lists(op, max_size=25)).map(lambda t: [t[0], t[1], *t[2]]))
def test_the_fast_path_gives_exactly_what_the_full_scan_gives(tmp_path_factory, monkeypatch, ops) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("fast")
    fast, slow = root / "fast", root / "slow"
    log, _ = PartitionLog.open(str(fast), SEGMENT)
    ts = 1_000
    for kind, arg in ops:
        if kind == "append":
            ts += 7
            append(log, arg, ts)
        elif kind == "delete":
            log.delete_many([1 + o % log.next_offset for o in arg])
        elif kind == "purge":
            log.purge(arg % (log.next_offset + 1))
        else:
            log.close(clean=arg)
            log, _ = PartitionLog.open(str(fast), SEGMENT)
            scanned(log)  # what a broker start does (and writes the summaries it lacks)
    log.close()
    shutil.copytree(fast, slow)
    shutil.copytree(fast, root / "no_columns")
    for p in [*slow.glob("*.summary"), *slow.glob("*.columns"), *slow.glob("*.snapshot"),
              *(root / "no_columns").glob("*.columns"), *(root / "no_columns").glob("*.snapshot")]:
        p.unlink()

    found: list[Damage] = []
    a, checked_fast = open_counting(fast, monkeypatch, found)
    got = scanned(a)
    # Every sealed segment has its columns, and the active one (closed cleanly) its
    # snapshot: no record is read field by field, none verified one by one.
    assert extracted == [] and rescanned == []
    c, _ = open_counting(root / "no_columns", monkeypatch, found)
    assert scanned(c) == got
    c.close()
    # The full scan wrote the missing columns files, byte for byte the ones sealing wrote.
    assert columns(root / "no_columns") == {k: v for k, v in columns(fast).items() if k in columns(root / "no_columns")}
    b, checked_slow = open_counting(slow, monkeypatch, found)
    try:
        assert got == scanned(b)
        assert state_of(a) == state_of(b)
        assert (a.live_count, a.next_offset, a.first_offset) == (b.live_count, b.next_offset, b.first_offset)
        for start in range(1, a.next_offset + 2):  # what a consumer's num_pending starts from
            assert a.live_count_from(start) == sum(a.is_live(o) for o in range(start, a.next_offset))
        assert found == []
        # Every sealed segment holding live records had a summary: nothing verified one by one.
        assert checked_fast == []
        assert len(checked_slow) == sum(s.live_count for s in b.segments if s.sealed)
        event(f"sealed segments with live records: {min(sum(1 for s in b.segments if s.sealed and s.live_count), 3)}")
        # The full scan wrote the summaries again, byte for byte the ones sealing wrote.
        assert summaries(slow) == {k: v for k, v in summaries(fast).items() if k in summaries(slow)}
    finally:
        a.close()
        b.close()


def sealed_log(path: Path) -> PartitionLog:
    log, _ = PartitionLog.open(str(path), SEGMENT)
    for k in range(8):
        append(log, [(k % 3, k % 5, 0, k % 4)] * 20, 1_000 + k)
    log.delete_many([3, 4, 40])
    log.close()
    log, _ = PartitionLog.open(str(path), SEGMENT)
    assert len(log.segments) > 3 and all(os.path.exists(s.summary_path) for s in log.segments[:-1])
    return log


def reference(path: Path, tmp: Path) -> list[tuple[object, ...]]:
    """What the full scan of a copy without summaries, columns or snapshot gives."""
    copy = tmp / "reference"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(path, copy)
    for p in [*copy.glob("*.summary"), *copy.glob("*.columns"), *copy.glob("*.snapshot")]:
        p.unlink()
    log, _ = PartitionLog.open(str(copy), SEGMENT)
    try:
        return scanned(log)
    finally:
        log.close()


def damage_a_sealed_segments_file(tmp_path: Path, which: str, change):  # type: ignore[no-untyped-def]
    """Seal segments, then ``change`` the second one's file ``which`` (a Segment path
    attribute). Returns the partition path, that segment, the full scan's result
    and the file's good bytes."""
    path = tmp_path / "p"
    log = sealed_log(path)
    victim = log.segments[1]
    log.close()
    want = reference(path, tmp_path)
    good = Path(getattr(victim, which)).read_bytes()
    rewrite(getattr(victim, which), change)
    return path, victim, want, good


def rewrite(path: str, change) -> None:  # type: ignore[no-untyped-def]
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    with open(path, "wb") as f:
        f.write(change(raw))


def flip_byte(raw: bytearray, at: int) -> bytearray:
    raw[at] ^= 0x20
    return raw


def with_count(raw: bytearray, count: int) -> bytearray:
    """The summary with another record count and a valid checksum of its own."""
    body = raw[:-4]
    struct.pack_into("<I", body, 8, count)
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        (lambda raw: flip_byte(raw, 20), "checksum mismatch or wrong length"),
        (lambda raw: raw[:-1], "checksum mismatch or wrong length"),
        (lambda raw: with_count(raw, 3), "it records 3 records"),
    ],
    ids=["bit_flip", "truncated", "wrong_count"],
)
def test_a_damaged_summary_falls_back_to_the_full_scan_reported_and_is_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change, detail  # type: ignore[no-untyped-def]
) -> None:
    path, victim, want, good = damage_a_sealed_segments_file(tmp_path, "summary_path", change)
    found: list[Damage] = []
    log, checked = open_counting(path, monkeypatch, found)
    assert [(d.kind, d.path) for d in found] == [("segment_summary", victim.summary_path)]
    assert detail in found[0].detail
    assert "verified one by one" in found[0].action
    assert scanned(log) == want
    assert len(checked) == log.segments[1].live_count  # that segment only, record by record
    assert Path(victim.summary_path).read_bytes() == good
    log.close()

    found.clear()
    log, checked = open_counting(path, monkeypatch, found)
    assert found == [] and checked == [] and scanned(log) == want
    log.close()


def test_a_sealed_log_changed_since_its_summary_is_verified_record_by_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p"
    log = sealed_log(path)
    victim = log.segments[1]
    bad = victim.base + 2
    at = victim.positions[2] + 40
    log.close()
    want = reference(path, tmp_path)
    good = Path(victim.summary_path).read_bytes()
    rewrite(victim.log_path, lambda raw: flip_byte(raw, at))

    corrupt: list[int] = []
    log, _ = PartitionLog.open(str(path), SEGMENT, lambda off, why: corrupt.append(off))
    got = scanned(log)
    assert corrupt == [bad]
    assert log.segments[1].state[2] == CORRUPT
    assert offsets(got) == [o for o in offsets(want) if o != bad]
    # The summary still records the sealed log: kept, and the damage is found again next time.
    assert Path(victim.summary_path).read_bytes() == good
    log.close()


def test_a_segment_with_damaged_records_is_sealed_without_a_summary(tmp_path: Path) -> None:
    path = tmp_path / "p"
    log, _ = PartitionLog.open(str(path), 1 << 20)
    append(log, [(0, 0, 0, 0)] * 10, 1_000)
    seg = log.segments[-1]
    at = seg.positions[4] + 40
    log.close()
    rewrite(seg.log_path, lambda raw: flip_byte(raw, at))
    log, _ = PartitionLog.open(str(path), 1 << 20)  # the damaged record is found by the active scan
    assert log.segments[-1].crc is None
    log.seal_active()
    assert not os.path.exists(log.segments[0].summary_path)
    log.close()


def test_a_missing_summary_is_no_damage_and_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments sealed by an older version have none: the first start writes them."""
    path = tmp_path / "p"
    log = sealed_log(path)
    log.close()
    want = reference(path, tmp_path)
    written = summaries(path)
    for p in path.glob("*.summary"):
        p.unlink()
    found: list[Damage] = []
    log, checked = open_counting(path, monkeypatch, found)
    assert scanned(log) == want and found == [] and checked
    log.close()
    assert summaries(path) == written


def with_log_crc(raw: bytearray, crc: int) -> bytearray:
    """The columns file for another log CRC-32, with a valid checksum of its own."""
    body = raw[:-4]
    struct.pack_into("<I", body, 36, crc)
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        (lambda raw: flip_byte(raw, len(raw) // 2), "checksum mismatch or cut short"),
        (lambda raw: raw[:-1], "checksum mismatch or cut short"),
        (lambda raw: with_log_crc(raw, 7), "CRC-32 0x00000007"),
    ],
    ids=["bit_flip", "truncated", "other_log"],
)
def test_damaged_columns_fall_back_to_the_records_reported_and_are_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change, detail  # type: ignore[no-untyped-def]
) -> None:
    path, victim, want, good = damage_a_sealed_segments_file(tmp_path, "columns_path", change)
    found: list[Damage] = []
    log, checked = open_counting(path, monkeypatch, found)
    got = scanned(log)
    assert [(d.kind, d.path) for d in found] == [("segment_columns", victim.columns_path)]
    assert detail in found[0].detail
    assert got == want and checked == []  # the log is intact: one CRC-32, its fields read from the records
    assert extracted == list(victim.positions)
    assert Path(victim.columns_path).read_bytes() == good
    log.close()

    found.clear()
    log, checked = open_counting(path, monkeypatch, found)
    assert scanned(log) == want and found == [] and checked == []
    assert extracted == []  # the victim's from its file again
    log.close()


def test_a_clean_close_leaves_a_snapshot_of_the_active_segment_that_the_next_start_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p"
    log = sealed_log(path)
    active = log.segments[-1]
    assert active.live_count
    log.close()
    want = reference(path, tmp_path)
    found: list[Damage] = []
    log, checked = open_counting(path, monkeypatch, found)
    assert scanned(log) == want
    assert found == [] and checked == [] and extracted == [] and rescanned == []
    log.close()
    # Appends after a start and a crash: the snapshot no longer describes the log.
    log, _ = PartitionLog.open(str(path), 1 << 20)  # no roll: the same active segment
    append(log, [(1, 2, 0, 2)] * 3, 5_000)
    log.take_dirty_fds()
    log.close(clean=False)
    want = reference(path, tmp_path)
    log, checked = open_counting(path, monkeypatch, found)
    assert scanned(log) == want and found == []
    assert rescanned == [active.base]  # read record by record, as without a snapshot
    log.close()
    # Sealing removes it.
    log, _ = PartitionLog.open(str(path), SEGMENT)
    assert os.path.exists(log.segments[-1].snapshot_path)
    log.seal_active()
    assert not os.path.exists(log.segments[-2].snapshot_path)
    log.close()


@pytest.mark.parametrize("change", [lambda raw: flip_byte(raw, len(raw) // 2), lambda raw: raw[:-3]],
                         ids=["bit_flip", "truncated"])
def test_a_damaged_snapshot_is_reported_and_the_active_segment_read_record_by_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change  # type: ignore[no-untyped-def]
) -> None:
    path = tmp_path / "p"
    log = sealed_log(path)
    active = log.segments[-1]
    log.close()
    want = reference(path, tmp_path)
    rewrite(active.snapshot_path, change)
    found: list[Damage] = []
    log, checked = open_counting(path, monkeypatch, found)
    assert [(d.kind, d.path, d.detail) for d in found] == [
        ("segment_snapshot", active.snapshot_path, "checksum mismatch or cut short")
    ]
    assert scanned(log) == want
    assert rescanned == [active.base] and extracted == list(active.positions)
    log.close()


def test_columns_are_written_by_a_clean_close_or_else_by_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p"
    log, _ = PartitionLog.open(str(path), SEGMENT)
    for k in range(8):
        append(log, [(k % 3, k % 5, 0, k % 4)] * 20, 1_000 + k)
    sealed = log.segments[:-1]
    assert len(sealed) > 3 and all(os.path.exists(s.summary_path) for s in sealed)
    assert not any(os.path.exists(s.columns_path) for s in sealed)  # sealing does not read the records back
    log.take_dirty_fds()
    log.close(clean=False)
    assert not any(os.path.exists(s.columns_path) for s in sealed)
    want = reference(path, tmp_path)
    found: list[Damage] = []
    log, checked = open_counting(path, monkeypatch, found)
    assert scanned(log) == want and found == [] and checked == []
    assert extracted == [p for s in log.segments if s.live_count for p in s.positions]  # all of them, this once
    assert all(os.path.exists(s.columns_path) for s in sealed)
    append(log, [(1, 0, 0, 0)] * 40, 9_000)
    newly = [s for s in log.segments[:-1] if s.base >= sealed[-1].next_offset]
    assert newly and not any(os.path.exists(s.columns_path) for s in newly)
    log.close()
    assert all(os.path.exists(s.columns_path) for s in newly)
    log, _ = open_counting(path, monkeypatch, found)
    scanned(log)
    assert extracted == [] and found == []
    log.close()
