"""``PartitionLog.get`` (one ``pread`` of exactly the record and its CRC-32, no read
loop) against the general read of one record (``Segment.read``, as ``get`` used to
call it): the same bytes, the same error with the same message and offset, the same
corruption reports and the same state after, for any records, deletions, purges and
damage, in sealed and active segments, on real files; and ``PartitionLog.read_live``
(a KV get's one storage call) against ``is_live`` then ``get``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protocol as P
from storage import CorruptedRecord, PartitionLog
from storage._log import LIVE

_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

_Rec = tuple[str, bytes, Any, int]  # subject, payload, headers (a dict or b""), TTL field
_record = st.tuples(
    st.text("abcxyz.", min_size=1, max_size=40).filter(lambda s: not s.startswith(".") and ".." not in s and not s.endswith(".")),
    st.binary(max_size=600),
    st.one_of(st.just(b""), st.dictionaries(st.text("abXY-", min_size=1, max_size=8), st.text("vw 1", max_size=12), min_size=1, max_size=3)),
    st.one_of(st.just(P.TTL_NONE), st.integers(1, 10**6), st.just(P.TTL_NEVER)),
)
#: How a record's bytes are damaged after it was written: a flipped byte (at a
#: position as a share of the record), zeroed bytes, another record's bytes over it
#: (a valid record at the wrong place), or the log cut inside it.
_damage = st.tuples(st.sampled_from(["flip", "zero", "copy", "cut"]), st.floats(0, 0.999), st.integers(0, 10**6))


def _general_get(log: PartitionLog, offset: int) -> memoryview:
    """``PartitionLog.get`` as it was: the bounds, the state, then ``Segment.read`` of
    one record (its run-building loop)."""
    if offset < 1 or offset >= log.next_offset or offset <= log.purged_through:
        raise P.error_class(P.ErrorCode.MESSAGE_NOT_FOUND)(f"no message at offset {offset}")
    seg = log.segments[log._segment_index(offset)]
    rel = offset - seg.base
    if rel < 0 or rel >= seg.count or seg.state[rel] != LIVE:
        if 0 <= rel < seg.count and seg.state[rel] == 2:
            raise CorruptedRecord(f"record at offset {offset} is corrupted", offset)
        raise P.error_class(P.ErrorCode.MESSAGE_NOT_FOUND)(f"no message at offset {offset}")
    runs: list[tuple[memoryview, int, int]] = []
    seg.read(rel, 1, 1, None, runs, log._corrupt)
    if not runs or runs[0][1] != offset:
        raise CorruptedRecord(f"record at offset {offset} is not readable", offset)
    return runs[0][0]


def _outcome(fn: Callable[[PartitionLog, int], memoryview], log: PartitionLog, offset: int) -> tuple[object, ...]:
    try:
        got = fn(log, offset)
    except Exception as e:  # noqa: BLE001 - compared below, type and all
        return ("raised", type(e), str(e), getattr(e, "offset", None))
    assert isinstance(got, memoryview)
    return ("record", bytes(got))


def _build(path: Path, batches: list[list[_Rec]], reports: list[tuple[int, str]]) -> PartitionLog:
    log, _ = PartitionLog.open(str(path), 2048, lambda off, why: reports.append((off, why)))
    for k, batch in enumerate(batches):
        bodies = [
            P.encode_body(subject, payload, P.encode_headers(headers) if headers else b"", ttl)
            for subject, payload, headers, ttl in batch
        ]
        starts, ends, pos = [], [], 0
        for b in bodies:
            starts.append(pos)
            pos += len(b)
            ends.append(pos)
        log.append(b"".join(bodies), starts, ends, 1000 + k)
    return log


def _damage_record(log: PartitionLog, offset: int, how: str, share: float, salt: int) -> None:
    """Damage the bytes of ``offset``'s record in its log file (what a disk can do
    after the record was verified on the way in)."""
    seg = log.segments[log._segment_index(offset)]
    rel = offset - seg.base
    if not 0 <= rel < seg.count:
        return  # purged with its segment
    start = seg.positions[rel]
    end = seg.positions[rel + 1] if rel + 1 < seg.count else seg.size
    at = start + int((end - start) * share)
    fd = os.open(seg.log_path, os.O_RDWR)
    try:
        if at >= os.fstat(fd).st_size:
            pass  # the file was cut before it already
        elif how == "flip":
            old = os.pread(fd, 1, at)
            os.pwrite(fd, bytes([old[0] ^ (1 << (salt % 8))]), at)
        elif how == "copy":
            # Another record of the segment over this one: valid bytes, wrong offset.
            src = seg.positions[salt % seg.count]
            src_end = seg.positions[salt % seg.count + 1] if salt % seg.count + 1 < seg.count else seg.size
            os.pwrite(fd, os.pread(fd, min(src_end - src, end - start), src), start)
        elif how == "zero":
            os.pwrite(fd, bytes(min(end - at, 1 + salt % 64)), at)
        else:
            os.ftruncate(fd, at)
    finally:
        os.close(fd)


@_SETTINGS
@given(
    batches=st.lists(st.lists(_record, min_size=1, max_size=8), min_size=1, max_size=12),
    picks=st.lists(st.integers(-2, 120), max_size=40),
    deletes=st.lists(st.integers(1, 100), max_size=10),
    purge=st.one_of(st.none(), st.integers(0, 30)),
    damages=st.lists(st.tuples(st.integers(1, 100), _damage), max_size=4),
)
def test_fast_get_equals_the_general_read(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[_Rec]],
    picks: list[int],
    deletes: list[int],
    purge: int | None,
    damages: list[tuple[int, tuple[str, float, int]]],
) -> None:
    root = tmp_path_factory.mktemp("fastget")
    fast_reports: list[tuple[int, str]] = []
    general_reports: list[tuple[int, str]] = []
    fast = _build(root / "fast", batches, fast_reports)
    general = _build(root / "general", batches, general_reports)
    try:
        last = fast.last_offset
        assert general.last_offset == last
        for log in (fast, general):
            log.delete_many([d for d in deletes if d <= last])
            if purge is not None:
                log.purge(purge)
        for offset, (how, share, salt) in damages:
            if offset <= last:
                for log in (fast, general):
                    _damage_record(log, offset, how, share, salt)
        # Every offset in and around the log, then random ones again (a record found
        # corrupt the first time is refused by its state the second).
        order = list(range(-1, last + 3)) + [p for p in picks if p <= last + 2]
        for offset in order:
            want = _outcome(_general_get, general, offset)
            got = _outcome(PartitionLog.get, fast, offset)
            assert got == want, offset
            assert fast.is_live(offset) == general.is_live(offset)
        assert fast_reports == general_reports
        assert (fast.live_count, fast.corrupt_detected) == (general.live_count, general.corrupt_detected)
        assert [bytes(s.state) for s in fast.segments] == [bytes(s.state) for s in general.segments]
    finally:
        fast.close()
        general.close()
        shutil.rmtree(root)


def test_fast_get_reads_the_record_and_reports_damage(tmp_path: Path) -> None:
    """The fixed cases: a record in a sealed and in the active segment, deleted, purged,
    beyond the log, then damaged (reported once, refused with the same error after)."""
    reports: list[tuple[int, str]] = []
    batches = [[(f"s.{k}.{i}", bytes([k]) * (100 + i), {"H": "v"} if i % 2 else b"", 60 if k % 2 else P.TTL_NONE)
                for i in range(5)] for k in range(12)]
    log = _build(tmp_path, batches, reports)
    assert len(log.segments) > 2
    first_active = log.segments[-1].base
    for offset in (1, 7, first_active, log.last_offset):
        rec = log.get(offset)
        assert P.check_record(rec, 0, len(rec)) == len(rec)
        assert P.read_record_info(rec, 0).offset == offset
    log.delete(7)
    for offset in (0, -3, 7, log.next_offset, log.next_offset + 50):
        with pytest.raises(P.MessageNotFoundError):  # type: ignore[attr-defined]
            log.get(offset)
    _damage_record(log, 8, "flip", 0.9, 3)
    live = log.live_count
    with pytest.raises(CorruptedRecord) as info:
        log.get(8)
    assert info.value.offset == 8 and "fetch from offset 9" in str(info.value)
    assert reports == [(8, "checksum mismatch or truncated record")] and log.live_count == live - 1
    with pytest.raises(CorruptedRecord, match=r"record at offset 8 is corrupted \(CORRUPTED"):
        log.get(8)
    assert len(reports) == 1 and not log.is_live(8) and log.is_live(9)
    # The active segment's last record, its file cut inside it.
    last = log.last_offset
    _damage_record(log, last, "cut", 0.5, 0)
    with pytest.raises(CorruptedRecord):
        log.get(last)
    assert reports[-1] == (last, "checksum mismatch or truncated record")
    log.close(clean=False)


# -- read_live: the KV get's one storage call -------------------------------------------


def _is_live_then_get(log: PartitionLog, offset: int) -> memoryview | None:
    """What a KV get did before ``read_live``: ``is_live``, then ``get`` (whose
    "no message" for a live slot at or below the purge watermark meant absent too)."""
    if not log.is_live(offset):
        return None
    try:
        return log.get(offset)
    except P.MessageNotFoundError:  # type: ignore[attr-defined]
        return None


def _outcome_or_none(fn: Callable[[PartitionLog, int], memoryview | None], log: PartitionLog, offset: int) -> tuple[object, ...]:
    try:
        got = fn(log, offset)
    except Exception as e:  # noqa: BLE001 - compared below, type and all
        return ("raised", type(e), str(e), getattr(e, "offset", None))
    if got is None:
        return ("none",)
    assert isinstance(got, memoryview)
    return ("record", bytes(got))


@_SETTINGS
@given(
    batches=st.lists(st.lists(_record, min_size=1, max_size=8), min_size=1, max_size=12),
    picks=st.lists(st.integers(-2, 120), max_size=40),
    deletes=st.lists(st.integers(1, 100), max_size=10),
    purge=st.one_of(st.none(), st.integers(0, 30)),
    damages=st.lists(st.tuples(st.integers(1, 100), _damage), max_size=4),
)
def test_read_live_equals_is_live_then_get(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[_Rec]],
    picks: list[int],
    deletes: list[int],
    purge: int | None,
    damages: list[tuple[int, tuple[str, float, int]]],
) -> None:
    """``read_live`` (one search for the segment) answers what ``is_live`` then ``get``
    answered, for any records, deletions, purges and damage: the verified record, None
    for anything not live (a deleted or purged record is never returned), or the same
    CorruptedRecord, with the same reports and the same state after."""
    root = tmp_path_factory.mktemp("readlive")
    one_reports: list[tuple[int, str]] = []
    two_reports: list[tuple[int, str]] = []
    one = _build(root / "one", batches, one_reports)
    two = _build(root / "two", batches, two_reports)
    try:
        last = one.last_offset
        gone = {d for d in deletes if d <= last}
        for log in (one, two):
            log.delete_many(sorted(gone))
            if purge is not None:
                log.purge(purge)
        purged = one.purged_through
        for offset, (how, share, salt) in damages:
            if offset <= last:
                for log in (one, two):
                    _damage_record(log, offset, how, share, salt)
        order = list(range(-1, last + 3)) + [p for p in picks if p <= last + 2]
        for offset in order:
            want = _outcome_or_none(_is_live_then_get, two, offset)
            got = _outcome_or_none(PartitionLog.read_live, one, offset)
            assert got == want, offset
            if offset in gone or offset <= purged or offset > last:
                assert got == ("none",), offset
            if got[0] == "record":
                rec = got[1]
                assert isinstance(rec, bytes) and P.check_record(rec, 0, len(rec)) == len(rec)
                assert P.read_record_info(rec, 0).offset == offset
        assert one_reports == two_reports
        assert (one.live_count, one.corrupt_detected) == (two.live_count, two.corrupt_detected)
        assert [bytes(s.state) for s in one.segments] == [bytes(s.state) for s in two.segments]
    finally:
        one.close()
        two.close()
        shutil.rmtree(root)


def test_read_live_refuses_damage_and_never_returns_a_removed_record(tmp_path: Path) -> None:
    """The fixed cases: live records in a sealed and in the active segment; None for a
    deleted record, a purged one, and offsets outside the log; a damaged record raises
    CorruptedRecord once (reported, marked) and is None after; a record whose bytes
    were replaced by another valid record (a misplaced write) is refused too."""
    reports: list[tuple[int, str]] = []
    batches = [[(f"s.{k}.{i}", bytes([k]) * (100 + i), {"H": "v"} if i % 2 else b"", 60 if k % 2 else P.TTL_NONE)
                for i in range(5)] for k in range(12)]
    log = _build(tmp_path, batches, reports)
    assert len(log.segments) > 2
    for offset in (1, 7, log.segments[-1].base, log.last_offset):
        rec = log.read_live(offset)
        assert rec is not None and P.read_record_info(rec, 0).offset == offset
        assert bytes(rec) == bytes(log.get(offset))
    log.delete(7)
    log.purge(3)
    for offset in (0, -3, 1, 3, 7, log.next_offset, log.next_offset + 50):
        assert log.read_live(offset) is None
    assert log.read_live(4) is not None
    _damage_record(log, 8, "flip", 0.9, 3)
    live = log.live_count
    with pytest.raises(CorruptedRecord) as info:
        log.read_live(8)
    assert info.value.offset == 8 and "fetch from offset 9" in str(info.value)
    assert reports == [(8, "checksum mismatch or truncated record")] and log.live_count == live - 1
    assert log.read_live(8) is None and len(reports) == 1 and not log.is_live(8)
    _damage_record(log, 12, "copy", 0.0, 10)  # another record's valid bytes where 12's were: wrong offset
    with pytest.raises(CorruptedRecord):
        log.read_live(12)
    assert reports[-1] == (12, "checksum mismatch or truncated record") and log.read_live(12) is None
    last = log.last_offset
    _damage_record(log, last, "cut", 0.5, 0)
    with pytest.raises(CorruptedRecord):
        log.read_live(last)
    assert log.read_live(last) is None
    log.close(clean=False)
