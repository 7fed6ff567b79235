"""The memory partition log (``storage.MemoryPartitionLog``) against the file log:
the same operations give the same reads, counts, offsets and sizes (a hypothesis
state comparison); the budget counts exactly what the memory segments hold; a
reopen is empty and continues beyond every offset handed out, after a clean close
and after a crash (no close)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_partition_log import append, bodies

from storage import MemoryBudget, MemoryPartitionLog, PartitionLog

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 30)),
        st.tuples(st.just("delete"), st.integers(0, 400)),
        st.tuples(st.just("purge"), st.integers(0, 400)),
        st.tuples(st.just("purge_all"), st.just(0)),
        st.tuples(st.just("seal"), st.just(0)),
        st.tuples(st.just("clean"), st.just(0)),
    ),
    max_size=40,
)


def _view(log: PartitionLog) -> tuple[object, ...]:
    res = log.read(1, 10**6, 1 << 30)
    records = [bytes(r) for r in res.records]
    gets = [bytes(log.get(o)) for o in res.offsets[:5]]
    return (
        res.runs, records, gets, log.next_offset, log.live_count, log.first_offset, log.last_offset, log.size_bytes,
        log.live_bytes(), [s.base for s in log.segments], log.live_count_from(log.last_offset // 2),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_memory_log_reads_as_the_file_log(ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        budget = MemoryBudget(1 << 30)
        flog, _ = PartitionLog.open(str(Path(d) / "file"), 4096)
        mlog, _ = MemoryPartitionLog.open(str(Path(d) / "mem"), 4096, budget=budget)
        n = 0
        for op, arg in ops:
            for log in (flog, mlog):
                if op == "append":
                    append(log, arg, n, ts=1000 + n)
                elif op == "delete":
                    log.delete_many([arg, arg + 3])
                elif op == "purge":
                    log.purge(arg)
                elif op == "purge_all":
                    log.purge()
                elif op == "seal":
                    log.seal_active()
                else:
                    gone = log.reclaimable()
                    if gone:
                        log.remove_segments(gone)
            if op == "append":
                n += arg
            assert _view(mlog) == _view(flog)
            assert budget.used == sum(len(s.data) for s in mlog.segments) == mlog.size_bytes
        flog.close()
        mlog.close()
        assert budget.used == 0


def test_reopen_is_empty_and_never_reuses_an_offset(tmp_path: Path) -> None:
    budget = MemoryBudget(1 << 20)
    log, _ = MemoryPartitionLog.open(str(tmp_path), 4096, budget=budget)
    append(log, 50)
    assert log.next_offset == 51 and budget.used > 0
    log.close()  # clean: the exact next offset is recorded
    assert budget.used == 0
    log, _ = MemoryPartitionLog.open(str(tmp_path), 4096, budget=budget, expect_existing=True)
    assert (log.next_offset, log.live_count, log.first_offset, log.skipped) == (51, 0, 0, None)
    assert append(log, 5) == 51
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partition.state"]
    # A crash: no close. The next start begins at the reservation, beyond 55.
    crashed = MemoryPartitionLog.open(str(tmp_path), 4096, budget=MemoryBudget(1 << 20), expect_existing=True)[0]
    assert crashed.next_offset > 55 and crashed.skipped == (51, crashed.next_offset - 1)
    data, s, e = bodies(3)
    assert crashed.append(data, s, e, 1).first_offset == crashed.skipped[1] + 1
    log.close()
    crashed.close()
