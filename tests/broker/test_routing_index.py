"""The router's first-token index (``broker.core._routing.Router``): for any set of
topics whose filters were each admitted by :meth:`Router.check_overlap`, routing a
subject finds the topic a scan of every filter finds, and the overlap check refuses
exactly the filters that overlap one of another topic (``filters_overlap``, NATS
``SubjectsCollide``) and names it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import TopicConfig
from broker.core._routing import Router
from broker.core._topics import Stream, Topic
from protocol import BrokerError, ErrorCode, filters_overlap, subject_matches

_literal = st.sampled_from(["a", "b", "c"])
_filter_token = st.sampled_from(["a", "b", "c", "*"])


@st.composite
def _filter(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(_filter_token, min_size=1, max_size=3))
    if draw(st.booleans()):
        tokens.append(">")
    return ".".join(tokens)


def _topic(stream: Stream, tid: int, subjects: tuple[str, ...]) -> Topic:
    cfg = TopicConfig(name=f"t{tid}", partitions_count=1, message_expiry=0, subjects=subjects, segment_size=1 << 20)
    topic = Topic(stream, tid, cfg, 0)
    topic.partitions = [object()]  # type: ignore[list-item]
    return topic


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(_filter(), min_size=1, max_size=2), min_size=1, max_size=12),
    st.lists(st.lists(_literal, min_size=1, max_size=4), min_size=1, max_size=10),
    st.booleans(),
)
def test_the_index_routes_and_refuses_as_a_scan_of_every_filter(
    wanted: list[list[str]], subjects: list[list[str]], rebuilt: bool,
) -> None:
    stream = Stream(1, "s", 0)
    router = Router()
    topics: list[Topic] = []
    for tid, filters in enumerate(wanted, 1):
        clash = next(((f, g, t) for f in filters for t in topics for g in t.config.subjects if filters_overlap(f, g)), None)
        if clash is None and any(filters_overlap(f, g) for i, f in enumerate(filters) for g in filters[i + 1 :]):
            continue  # (a topic's own filters overlapping is another check's business)
        if clash is not None:
            with pytest.raises(BrokerError) as exc:
                router.check_overlap(tuple(filters))
            assert exc.value.code == ErrorCode.SUBJECTS_OVERLAP
            assert f"overlaps {clash[1]!r} of topic {clash[2].full_name}" in exc.value.message
            continue
        router.check_overlap(tuple(filters))
        topic = _topic(stream, tid, tuple(filters))
        topics.append(topic)
        router.add(topic)
        router.check_overlap(tuple(filters), ignore=topic)  # its own filters are not a clash
    if rebuilt:
        router.rebuild(topics)
    for tokens in subjects:
        subject = ".".join(tokens)
        scan = next((t for t in topics for f in t.config.subjects if subject_matches(f.split("."), tokens)), None)
        assert router.topic_for(subject) is scan
