"""``PartitionLog.live_bytes`` (a NATS stream's ``bytes``): the bytes of exactly the
live records, through appends across segments, deletions, purges, damage found by
reads, and a reopen, on real files; against a count of every live record's length."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fast_get import _SETTINGS, _build, _damage, _damage_record, _record, _Rec

import protocol as P
from storage import PartitionLog
from storage._log import LIVE


def _append(log: PartitionLog, batch: list[_Rec]) -> None:
    bodies = [P.encode_body(subject, payload, P.encode_headers(headers) if headers else b"", ttl)
              for subject, payload, headers, ttl in batch]
    starts, ends, pos = [], [], 0
    for b in bodies:
        starts.append(pos)
        pos += len(b)
        ends.append(pos)
    log.append(b"".join(bodies), starts, ends, 5000)


def _counted(log: PartitionLog) -> int:
    """Every live record's length, one by one."""
    total = 0
    for seg in log.segments:
        for rel in range(seg.count):
            if seg.state[rel] == LIVE:
                end = seg.positions[rel + 1] if rel + 1 < seg.count else seg.size
                total += end - seg.positions[rel]
    return total


@_SETTINGS
@given(
    batches=st.lists(st.lists(_record, min_size=1, max_size=8), min_size=1, max_size=12),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("delete"), st.lists(st.integers(1, 100), max_size=6)),
            st.tuples(st.just("purge"), st.integers(0, 40)),
            st.tuples(st.just("damage"), st.tuples(st.integers(1, 100), _damage)),
            st.tuples(st.just("append"), st.lists(_record, min_size=1, max_size=4)),
        ),
        max_size=10,
    ),
)
def test_live_bytes_counts_exactly_the_live_records(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[_Rec]], steps: list[tuple[str, object]],
) -> None:
    root = tmp_path_factory.mktemp("livebytes")
    reports: list[tuple[int, str]] = []
    log = _build(root / "p", batches, reports)
    try:
        assert log.live_bytes() == _counted(log) == log.size_bytes
        for kind, arg in steps:
            if kind == "delete":
                log.delete_many([d for d in arg if d <= log.last_offset])  # type: ignore[attr-defined]
            elif kind == "purge":
                log.purge(min(arg, log.last_offset))  # type: ignore[type-var]
            elif kind == "damage":
                offset, (how, share, salt) = arg  # type: ignore[misc]
                if offset <= log.last_offset:
                    _damage_record(log, offset, how, share, salt)
                    try:
                        log.get(offset)  # a read finds it and puts it aside
                    except Exception:  # noqa: BLE001 - not found, corrupt: the state is what is checked
                        pass
            else:
                _append(log, arg)  # type: ignore[arg-type]
            assert log.live_bytes() == _counted(log), kind
            assert log.live_bytes() <= log.size_bytes
            assert (log.live_bytes() == 0) == (log.live_count == 0 or _counted(log) == 0)
        log.close()
        log, _ = PartitionLog.open(str(root / "p"), 2048, lambda off, why: None)
        assert log.live_bytes() == _counted(log)
    finally:
        log.close()
        shutil.rmtree(root)
