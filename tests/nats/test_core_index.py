"""The one subscription index both protocols share (broker/_subscriptions.py): what
``match`` gives is what checking every subscription gives, whatever was added and
removed, and a queue group gets each message at one member."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker._subscriptions import SubscriptionIndex
from protocol import subject_matches

TOKEN = st.sampled_from(["a", "b", "_INBOX", "x1", "x2"])
FILTER_TOKEN = st.one_of(TOKEN, st.just("*"))
FILTER = st.one_of(
    st.lists(FILTER_TOKEN, min_size=1, max_size=4).map(".".join),
    st.lists(FILTER_TOKEN, min_size=0, max_size=3).map(lambda t: ".".join([*t, ">"])),
)
SUBJECT = st.lists(TOKEN, min_size=1, max_size=5).map(".".join)


class Sub:
    def __init__(self, subject_filter: str, queue: str | None = None) -> None:
        self.tokens = tuple(subject_filter.split("."))
        self.queue = queue


@given(st.lists(st.tuples(FILTER, st.booleans()), max_size=30), st.lists(SUBJECT, min_size=1, max_size=10))
def test_match_is_what_checking_every_subscription_gives(ops: list[tuple[str, bool]], subjects: list[str]) -> None:
    index = SubscriptionIndex()
    live: list[Sub] = []
    for subject_filter, remove_one in ops:
        sub = Sub(subject_filter)
        index.add(sub)
        live.append(sub)
        if remove_one:
            gone = live.pop(len(live) // 2)
            index.remove(gone)
            index.remove(gone)  # twice: no effect
        for subject in subjects:
            want = {s for s in live if subject_matches(s.tokens, subject.split("."))}
            assert set(index.match(subject.encode())) == want
            assert set(index.match(subject.encode())) == want  # from the cache
    assert len(index) == len(live)


def test_a_queue_group_gets_each_message_at_one_member() -> None:
    index = SubscriptionIndex()
    plain, a1, a2, b1 = Sub("work.>"), Sub("work.*", "a"), Sub("work.x", "a"), Sub(">", "b")
    for sub in (plain, a1, a2, b1):
        index.add(sub)
    seen = set()
    for _ in range(200):
        got = index.match(b"work.x")
        assert len(got) == 3 and plain in got and b1 in got and (a1 in got) != (a2 in got)
        seen.add(a1 in got)
    assert seen == {True, False}  # both members of group a get some
    assert index.match(b"work.y.z") == (plain, b1)
