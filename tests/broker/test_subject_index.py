"""The subject index's bulk extension (recovery, large batches) leaves exactly the
state the message-by-message one does: same ids in the same order, counts, first
and last offsets, flags and version."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import broker.core._subject_index as subject_index
from broker.core._subject_index import SubjectIndex

SUBJECT = st.sampled_from([b"a", b"b", b"c.d", b"e"])
step = st.tuples(
    st.integers(0, 3),  # offsets skipped before the run (recovery gaps)
    st.one_of(
        st.lists(st.tuples(SUBJECT, st.integers(0, 31)), max_size=150),
        # one subject (a client's flood), as one object repeated or as equal ones
        st.tuples(SUBJECT, st.lists(st.integers(0, 31), min_size=1, max_size=150), st.booleans()).map(
            lambda t: [(t[0] if t[2] else bytes(bytearray(t[0])), f) for f in t[1]]),
    ),
    st.lists(st.integers(0, 1000), max_size=5),  # offsets (modulo) whose subject is emptied after
)


def snapshot(index: SubjectIndex) -> tuple[object, ...]:
    states = {s: (t.sid, t.count, t.first, t.last) for s, t in index.subjects.items()}
    return index.names, index.seq.tolist(), bytes(index.flags), index.version, states


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=8))
def test_bulk_extend_equals_one_by_one(steps) -> None:  # type: ignore[no-untyped-def]
    one, bulk = SubjectIndex(1, lambda o: True), SubjectIndex(1, lambda o: True)
    offset = 1
    for gap, run, emptied in steps:
        offset += gap
        subjects = [s for s, _ in run]
        flags = bytes(f for _, f in run)
        for index, threshold in ((one, 1 << 30), (bulk, 1)):
            saved = subject_index._BULK
            subject_index._BULK = threshold
            try:
                index.extend(offset, subjects, flags)
            finally:
                subject_index._BULK = saved
        offset += len(run)
        for e in emptied:
            if one.subjects:
                name = sorted(one.subjects)[e % len(one.subjects)]
                for index in (one, bulk):  # as removal leaves a subject with no message
                    t = index.subjects[name]
                    t.count = t.first = t.last = 0
        assert snapshot(bulk) == snapshot(one)
