"""``TopicConfig.to_json`` (the catalog's entry of a topic's configuration) is what
``dataclasses.asdict`` gives, with the subjects as a list, and shares no container
with the configuration it came from: a hypothesis test over JSON-like fields."""

from __future__ import annotations

from dataclasses import asdict

from hypothesis import given
from hypothesis import strategies as st

from broker.core._topic_config import TopicConfig

plain = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5))
json_like = st.recursive(plain, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.tuples(inner, inner), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=10)
maybe_dict = st.one_of(st.none(), st.dictionaries(st.text(max_size=3), json_like, max_size=3))


@given(st.lists(st.text(min_size=1, max_size=5), max_size=3), maybe_dict, maybe_dict, maybe_dict,
       st.one_of(st.none(), st.lists(st.dictionaries(st.text(max_size=3), json_like, max_size=3), max_size=2)),
       st.dictionaries(st.text(max_size=3), json_like, max_size=2))
def test_to_json_is_asdict_with_its_own_containers(
    subjects: list[str], republish: dict | None, nats: dict | None, mirror: dict | None, sources: list | None, extra: dict,
) -> None:
    cfg = TopicConfig(name="t", partitions_count=2, message_expiry=5, subjects=tuple(subjects), segment_size=1 << 20,
                      republish=republish, nats=nats, mirror=mirror, sources=sources, extra=extra)
    expected = asdict(cfg)
    expected["subjects"] = list(subjects)
    got = cfg.to_json()
    assert got == expected
    assert got["subjects"] is not cfg.subjects
    for name in ("republish", "nats", "mirror", "sources", "extra"):
        value = getattr(cfg, name)
        if value:
            assert got[name] is not value
    if sources:
        assert all(a is not b for a, b in zip(got["sources"], sources))
