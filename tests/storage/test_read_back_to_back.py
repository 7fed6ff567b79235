"""``Segment.read``'s one pass over live records that lie back to back
(``Segment._back_to_back``: a pull of records as they were appended) against its
record-by-record loop: the same runs, byte for byte, the same counts and next
offsets, the same error with the same message and offset, the same corruption
reports and the same state after, for any records, deletions, filters, limits and
damage, in sealed and active segments, on real files."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fast_get import _SETTINGS, _build, _damage, _damage_record, _Rec, _record

import protocol as P
from storage import PartitionLog
from storage._segment import Segment

#: Records of a few sizes only: a record copied over another of the same size is a
#: valid record of the right length at the wrong offset.
_same_sizes = st.tuples(st.sampled_from(["a.b", "c.d"]), st.sampled_from([b"", b"x" * 40]), st.just(b""), st.just(P.TTL_NONE))


def _read(log: PartitionLog, offset: int, count: int, max_bytes: int, wanted: Callable[[int], bool] | None) -> tuple[object, ...]:
    try:
        res = log.read(offset, count, max_bytes, wanted)
    except Exception as e:  # noqa: BLE001 - compared below, type and all
        return ("raised", type(e), str(e), getattr(e, "offset", None))
    return ("read", [bytes(r) for r in res.records], res.runs, res.count, res.next_offset)


@_SETTINGS
@given(
    batches=st.lists(st.lists(_record | _same_sizes, min_size=1, max_size=8), min_size=1, max_size=12),
    reads=st.lists(
        st.tuples(st.integers(-1, 110), st.integers(1, 60), st.sampled_from([1, 300, 2000, 1 << 20]),
                  st.sampled_from([0, 1, 2, 3, 5])),
        min_size=1, max_size=30,
    ),
    deletes=st.lists(st.integers(1, 100), max_size=10),
    damages=st.lists(st.tuples(st.floats(0, 0.999), _damage), max_size=4),
)
def test_back_to_back_reads_equal_the_record_by_record_loop(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    batches: list[list[_Rec]],
    reads: list[tuple[int, int, int, int]],
    deletes: list[int],
    damages: list[tuple[float, tuple[str, float, int]]],
) -> None:
    root = tmp_path_factory.mktemp("backtoback")
    fast_reports: list[tuple[int, str]] = []
    general_reports: list[tuple[int, str]] = []
    fast = _build(root / "fast", batches, fast_reports)
    general = _build(root / "general", batches, general_reports)
    one_pass = Segment._back_to_back
    taken = 0

    def counted(*args: object) -> bool:
        nonlocal taken
        ok: bool = one_pass(*args)  # type: ignore[arg-type]
        taken += ok
        return ok

    try:
        last = fast.last_offset
        for log in (fast, general):
            log.delete_many([d for d in deletes if d <= last])
        for where, (how, share, salt) in damages:
            for log in (fast, general):
                _damage_record(log, 1 + int(where * last), how, share, salt)
        # Every offset once, then the random reads (a record found corrupt the first
        # time is refused by its state the second).
        plan = [(o, 1000, 1 << 20, 0) for o in range(1, last + 2)] + reads
        for offset, count, max_bytes, mod in plan:
            wanted = None if not mod else (lambda o, mod=mod: o % mod != 1)
            monkeypatch.setattr(Segment, "_back_to_back", lambda *args: False)
            want = _read(general, offset, count, max_bytes, wanted)
            monkeypatch.setattr(Segment, "_back_to_back", counted)
            got = _read(fast, offset, count, max_bytes, wanted)
            assert got == want, (offset, count, max_bytes, mod)
        assert fast_reports == general_reports
        assert (fast.live_count, fast.corrupt_detected) == (general.live_count, general.corrupt_detected)
        assert [bytes(s.state) for s in fast.segments] == [bytes(s.state) for s in general.segments]
    finally:
        fast.close()
        general.close()
        shutil.rmtree(root)
    if not deletes and not damages:
        assert taken  # nothing in the way: every read of a whole segment run took the one pass


@pytest.mark.parametrize("how", ["flip", "copy", "zero", "cut"])
def test_damage_in_a_back_to_back_run_is_found_as_the_loop_finds_it(tmp_path: Path, how: str) -> None:
    """The fixed cases: records of one size back to back (a copy of another is a
    valid record at the wrong offset), one damaged in the middle of a run; the read
    stops before it and reports it, once; a read after it takes the rest."""
    reports: list[tuple[int, str]] = []
    log = _build(tmp_path, [[("a.b", b"x" * 40, b"", P.TTL_NONE)] * 5] * 4, reports)
    res = log.read(1, 100, 1 << 20)
    assert res.runs == [(1, 20)] and res.next_offset == 21
    _damage_record(log, 13 if how != "cut" else 20, how, 0.5, 7)
    bad = 13 if how != "cut" else 20
    res = log.read(1, 100, 1 << 20)
    assert res.runs == [(1, bad - 1)] and res.next_offset == bad
    assert reports == [(bad, "checksum mismatch or truncated record")]
    assert log.read(1, 100, 1 << 20).runs == [(1, bad - 1)] and len(reports) == 1  # refused by its state now
    assert log.read(bad + 1, 100, 1 << 20).offsets == list(range(bad + 1, 21))
    log.close(clean=False)
