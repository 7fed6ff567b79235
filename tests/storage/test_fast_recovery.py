"""The startup scan's fast path: a sealed segment whose ``.summary`` holds the log's
size and CRC-32 from seal time is verified with one CRC-32 of the file instead of one
per record, and yields exactly what the record-by-record scan yields. A summary that is
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
import storage._partition_log as partition_log
from storage import CORRUPT, Damage, PartitionLog

_CHECK_RECORD = partition_log.check_record
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
    return [tuple(live) for live in log.scan(headers=True)]


def offsets(scan: list[tuple[object, ...]]) -> list[int]:
    return [o for live in scan for o in partition_log.LiveRecords(*live).offsets]  # type: ignore[arg-type]


def state_of(log: PartitionLog) -> list[tuple[int, bytes, int]]:
    return [(s.base, bytes(s.state), s.live_count) for s in log.segments]


def open_counting(path: Path, monkeypatch: pytest.MonkeyPatch, found: list[Damage]) -> tuple[PartitionLog, list[int]]:
    """Open the partition, counting the records verified one by one."""
    checked: list[int] = []

    def counting(buf: bytes, pos: int, end: int) -> int:
        checked.append(pos)
        return _CHECK_RECORD(buf, pos, end)

    monkeypatch.setattr(partition_log, "check_record", counting)
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
    for p in slow.glob("*.summary"):
        p.unlink()

    found: list[Damage] = []
    a, checked_fast = open_counting(fast, monkeypatch, found)
    b, checked_slow = open_counting(slow, monkeypatch, found)
    try:
        assert scanned(a) == scanned(b)
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
    """What the full scan of a copy without summaries gives."""
    copy = tmp / "reference"
    shutil.copytree(path, copy)
    for p in copy.glob("*.summary"):
        p.unlink()
    log, _ = PartitionLog.open(str(copy), SEGMENT)
    try:
        return scanned(log)
    finally:
        log.close()


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
    path = tmp_path / "p"
    log = sealed_log(path)
    victim = log.segments[1]
    log.close()
    want = reference(path, tmp_path)
    good = Path(victim.summary_path).read_bytes()
    rewrite(victim.summary_path, change)

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
