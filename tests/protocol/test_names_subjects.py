"""The Iggy name rule, identifiers, and subject validation, matching and overlap."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

import protocol as P


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("  My Topic ", "my.topic"),
        ("orders", "orders"),
        ("Orders-EU_1", "orders-eu_1"),
        ("a b\tc", "a.b.c"),
        ("..", ".."),
        ("Zürich", "zürich"),
    ],
)
def test_name_rule_normalises(raw: str, normal: str) -> None:
    assert P.normalize_name(raw) == normal


@pytest.mark.parametrize("raw", ["", "   ", "a/b", "x:y", "a*b", "ü" * 128, "x" * 256])
def test_name_rule_refuses(raw: str) -> None:
    with pytest.raises(P.InvalidNameError):  # type: ignore[attr-defined]
        P.normalize_name(raw)


def test_identifier_encoding() -> None:
    assert P.Identifier.of(7).encode() == b"\x01\x04\x07\x00\x00\x00"
    assert P.Identifier.of("Shop").encode() == b"\x02\x04shop"
    assert P.Identifier.decode_from(b"\x02\x04shop", 0) == (P.Identifier("shop"), 6)
    for bad in (b"\x03\x01x", b"\x01\x03abc", b"\x01\x04\x00\x00\x00\x00", b"\x02\x00", b"\x02\x02\xff\xfe"):
        with pytest.raises(P.BrokerError):
            P.Identifier.decode_from(bad, 0)
    with pytest.raises(P.InvalidIdentifierError):  # type: ignore[attr-defined]
        P.Identifier.of(0)


@pytest.mark.parametrize("subject", ["a", "orders.eu.42", "a-b_c.d", "x" * 255, "ü.ö"])
def test_valid_subjects(subject: str) -> None:
    assert P.validate_subject(subject) == subject


@pytest.mark.parametrize("subject", ["", "a..b", ".a", "a.", "a.*", ">", "a.>", "a b", "a\tb", "a\r\nb", "x" * 256])
def test_invalid_subjects(subject: str) -> None:
    with pytest.raises(P.InvalidSubjectError):  # type: ignore[attr-defined]
        P.validate_subject(subject)


@pytest.mark.parametrize("f", ["a", "*", ">", "a.*.c", "a.>", "*.*.>", "foo*"])
def test_valid_filters(f: str) -> None:
    assert P.validate_filter(f) == f


@pytest.mark.parametrize("f", ["", "a..b", ">.a", "a.>.b", "a b"])
def test_invalid_filters(f: str) -> None:
    with pytest.raises(P.InvalidSubjectFilterError):  # type: ignore[attr-defined]
        P.validate_filter(f)


@pytest.mark.parametrize(
    ("f", "s", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        (">", "a", True),
        ("*.b", "a.b", True),
        ("foo*", "foox", False),
        ("foo*", "foo*", True),
    ],
)
def test_matching(f: str, s: str, expected: bool) -> None:
    assert P.subject_matches(tuple(f.split(".")), s.split(".")) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("orders.>", "orders.eu", True),
        ("orders.*", "orders.eu.1", False),
        ("orders.*.1", "orders.eu.*", True),
        ("a.b", "a.c", False),
        (">", "x", True),
        ("a.>", "b.>", False),
        ("*.x", "y.*", True),
    ],
)
def test_overlap(a: str, b: str, expected: bool) -> None:
    assert P.filters_overlap(a, b) is expected
    assert P.filters_overlap(b, a) is expected


tok = st.sampled_from(["a", "b", "c"])
subject_st = st.lists(tok, min_size=1, max_size=4)
filter_st = st.lists(st.one_of(tok, st.just("*")), min_size=1, max_size=4).flatmap(
    lambda ts: st.sampled_from([ts, ts + [">"]])
)


@given(filter_st, filter_st)
def test_overlap_is_exactly_a_common_subject(fa: list[str], fb: list[str]) -> None:
    """Overlap holds iff some subject (of a small alphabet and length) matches both."""
    import itertools

    a, b = ".".join(fa), ".".join(fb)
    ta, tb = tuple(fa), tuple(fb)
    common = any(
        P.subject_matches(ta, list(s)) and P.subject_matches(tb, list(s))
        for n in range(1, 7)
        for s in itertools.product("abcd", repeat=n)
    )
    assert P.filters_overlap(a, b) is common


@given(filter_st, filter_st, subject_st)
def test_subset_implies_matching(inner: list[str], outer: list[str], subject: list[str]) -> None:
    if P.filter_is_subset(".".join(inner), ".".join(outer)) and P.subject_matches(tuple(inner), subject):
        assert P.subject_matches(tuple(outer), subject)


@given(st.text(alphabet=string.ascii_lowercase + ".", max_size=20))
def test_literal_filters(text: str) -> None:
    if text and "*" not in text:
        assert P.is_literal(text)


def _sublist_order(filters: list[tuple[str, ...]], subject: list[str]) -> list[tuple[str, ...]]:
    """The order nats-server's sublist (``matchLevel``) finds the filters matching
    ``subject`` in: a trie walk that, at each level, takes the ``>`` node's
    subscriptions, then descends into ``*``, then into the literal token."""
    found: list[tuple[str, ...]] = []

    def walk(prefix: tuple[str, ...], level: int) -> None:
        if level == len(subject):
            found.extend(f for f in filters if f == prefix)
            return
        found.extend(f for f in filters if f == (*prefix, ">"))
        for token in ("*", subject[level]):
            if any(f[: level + 1] == (*prefix, token) for f in filters):
                walk((*prefix, token), level + 1)

    walk((), 0)
    return found


@given(st.lists(filter_st, min_size=1, max_size=8), subject_st)
def test_match_order_is_the_sublist_order(filters: list[list[str]], subject: list[str]) -> None:
    """The first of the matching filters by ``match_order`` is the one nats-server's
    sublist returns first (the subscription its no-responders status goes to)."""
    tupled = list(dict.fromkeys(tuple(f) for f in filters))
    matching = [f for f in tupled if P.subject_matches(f, subject)]
    if not matching:
        return
    assert min(matching, key=P.match_order) == _sublist_order(matching, subject)[0]
    assert sorted(matching, key=P.match_order) == _sublist_order(matching, subject)
