"""The one subscription index both protocols share (``broker/core/_subscriptions.py``): what
``match`` gives is what checking every subscription gives, whatever was added and
removed (``may_match`` never says no where it matches), and a queue group gets each
message at one member."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.core._subscriptions import SubscriptionIndex
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
        self.footprint = len(subject_filter)


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
            tokens = subject.split(".")
            if want and len(tokens) >= 2:  # never False where a subscription matches
                assert index.may_match(tokens[0], tokens[1])
    assert len(index) == len(live)
    assert not live or index.may_match("?", "?") == any(s.tokens[0] in ("*", ">") for s in live)


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


TAIL = st.sampled_from(["1", "2", "17", "x1", "*", ">"])
SHAPED_FILTER = st.tuples(
    st.sampled_from(["_INBOX", "a", "*"]), st.sampled_from(["id1", "id2", "*", ">"]),
    st.lists(TAIL, max_size=2),
).map(lambda t: ".".join([t[0], t[1], *t[2]]) if t[1] != ">" else f"{t[0]}.>")
SHAPED_SUBJECT = st.tuples(
    st.sampled_from(["_INBOX", "a"]), st.sampled_from(["id1", "id2"]),
    st.lists(st.sampled_from(["1", "2", "17", "x1", "99"]), min_size=0, max_size=3),
).map(lambda t: ".".join([t[0], t[1], *t[2]]))


def _shaped_steps(index: SubscriptionIndex, steps: list[tuple[str, bool, list[str]]]) -> Iterator[tuple[list[Sub], list[str]]]:
    """Each step's subscription added (and the oldest removed when it says so): the
    live subscriptions and the step's subjects, after each."""
    live: list[Sub] = []
    for subject_filter, remove_one, subjects in steps:
        sub = Sub(subject_filter)
        index.add(sub)
        live.append(sub)
        if remove_one:
            index.remove(live.pop(0))
        yield live, subjects


@given(st.lists(st.tuples(SHAPED_FILTER, st.booleans(), st.lists(SHAPED_SUBJECT, max_size=8)), max_size=20))
def test_answers_cached_by_shape_are_what_checking_every_subscription_gives(
    steps: list[tuple[str, bool, list[str]]],
) -> None:
    """Inbox-like subjects, many of one shape (first two tokens, number of tokens):
    the answer taken from the shape cache is the subscriptions that match that very
    subject, as subscriptions come and go."""
    index = SubscriptionIndex()
    for live, subjects in _shaped_steps(index, steps):
        for subject in subjects:
            want = {s for s in live if subject_matches(s.tokens, subject.split("."))}
            assert set(index.match(subject.encode())) == want


@settings(max_examples=300)
@given(st.lists(st.tuples(SHAPED_FILTER, st.booleans(), st.lists(SHAPED_SUBJECT, max_size=12)), max_size=20))
@example([("_INBOX.id1.*", False, ["_INBOX.id1.1", "_INBOX.id1.1.2", "_INBOX.id1.2", "_INBOX.id2.1", "a.id1.1"])])
def test_a_run_of_subjects_matches_as_each_one_alone(steps: list[tuple[str, bool, list[str]]]) -> None:
    """``match_run`` (a group commit's PubAck inboxes, taken together; a subject of
    the shape of the one before takes its answer) gives, subject by subject, the
    subscriptions that match it, whether the caches are cold or warm."""
    index = SubscriptionIndex()
    for live, subjects in _shaped_steps(index, steps):
        want = [{s for s in live if subject_matches(s.tokens, subject.split("."))} for subject in subjects]
        raw = [subject.encode() for subject in subjects]
        for _ in range(2):  # (cold, then from the caches)
            got = index.match_run(raw)
            assert [set(g) if g is not None else None for g in got] == want


def test_a_run_with_a_queue_group_answers_each_subject_on_its_own() -> None:
    """With a queue group, a subject's answer changes from message to message:
    ``match_run`` gives None for those (``match_fixed``), the others as ``match``."""
    index = SubscriptionIndex()
    inbox, queued = Sub("_INBOX.abc.*"), Sub("work.*", "q")
    index.add(inbox)
    index.add(queued)
    assert index.match_run([b"_INBOX.abc.1", b"work.x", b"_INBOX.abc.2", b"other"]) == [(inbox,), None, (inbox,), ()]


def test_an_inbox_subscription_answers_every_reply_subject_from_one_entry() -> None:
    """nats-py's ``_INBOX.<id>.*``: one shape entry for all its replies, none per
    subject; a subscription with a literal third token (or a queue group) keeps
    answers per subject, and any change of subscriptions clears them."""
    index = SubscriptionIndex()
    inbox = Sub("_INBOX.abc.*")
    index.add(inbox)
    for n in range(50):
        assert index.match(b"_INBOX.abc.%d" % n) == (inbox,)
    assert index.match(b"_INBOX.abc.1.2") == ()
    assert len(index._shapes) == 2 and not index._cache
    one = Sub("_INBOX.abc.7")
    index.add(one)
    assert not index._shapes
    assert set(index.match(b"_INBOX.abc.7")) == {inbox, one}
    assert index.match(b"_INBOX.abc.8") == (inbox,)
    assert not index._shapes and len(index._cache) == 2
    index.remove(one)
    assert index.match(b"_INBOX.abc.7") == (inbox,)
    assert len(index._shapes) == 1
    queued = Sub("_INBOX.xyz.*", "q")
    index.add(queued)
    assert index.match(b"_INBOX.xyz.1") == (queued,)
    assert not index._shapes and list(index._cache) == [b"_INBOX.xyz.1"]
