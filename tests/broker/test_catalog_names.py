"""Streams and topics by name: ``_catalog.by_name``'s index answers what a scan of
the streams or topics would, whatever creations, deletions and re-creations under
the same name happened since it was made (they never touch it)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from broker.core._topics import by_name


@dataclass(eq=False)
class Named:
    id: int
    name: str


NAMES = st.sampled_from(["a", "b", "c", "orders", "kv_x"])
OPS = st.lists(st.tuples(st.sampled_from(["create", "delete", "lookup"]), NAMES), max_size=60)


@given(OPS)
def test_by_name_answers_what_a_scan_would(ops: list[tuple[str, str]]) -> None:
    by_id: dict[int, Named] = {}
    names: dict[str, Named] = {}
    next_id = 1
    for op, name in ops:
        scanned = next((x for x in by_id.values() if x.name == name), None)
        if op == "create" and scanned is None:
            by_id[next_id] = Named(next_id, name)
            next_id += 1
        elif op == "delete" and scanned is not None:
            del by_id[scanned.id]
        else:
            assert by_name(by_id, names, name) is scanned
    for name in ["a", "b", "c", "orders", "kv_x", "missing"]:
        assert by_name(by_id, names, name) is next((x for x in by_id.values() if x.name == name), None)
