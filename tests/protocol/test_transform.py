"""Subject transforms (ADR-30), table-driven from the NATS server's own tests
(nats-server's ``server/subject_transform_test.go``) plus hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import SubjectTransform, TransformError, filters_overlap, fnv1a_32, subject_matches

BAD: list[tuple[str, str, str]] = [
    ("foo..", "bar", "invalid subject"),
    ("foo.*", "bar.*", "invalid subject"),
    ("foo.*", "bar.$2", "invalid mapping destination: wildcard index out of range in $2: [2]"),
    ("foo.*", "bar.$1.>", "invalid subject"),
    ("foo.>", "bar.baz", "invalid subject"),
    ("foo.*", "foo.{{wildcard(2)}}", "invalid mapping destination: wildcard index out of range in {{wildcard(2)}}: [2]"),
    ("foo.*", "foo.{{unimplemented(1)}}", "invalid mapping destination: unknown function in {{unimplemented(1)}}"),
    ("foo.*", "foo.{{partition()}}", "invalid mapping destination: not enough arguments passed to the function in {{partition()}}"),
    ("foo.*", "foo.{{wildcard(foo)}}", "invalid mapping destination: function argument is invalid or in the wrong format in {{wildcard(foo)}}"),
    ("foo.*", "foo.{{wildcard()}}", "invalid mapping destination: not enough arguments passed to the function in {{wildcard()}}"),
    ("foo.*", "foo.{{wildcard(1,2)}}", "invalid mapping destination: too many arguments passed to the function in {{wildcard(1,2)}}"),
    ("foo.*", "foo.{{ wildcard5) }}", "invalid mapping destination: unknown function in {{ wildcard5) }}"),
    ("foo.*", "foo.{{splitLeft(2,2}}", "invalid mapping destination: unknown function in {{splitLeft(2,2}}"),
    ("foo", "bla.{{wildcard(1)}}", "invalid mapping destination: wildcard index out of range in {{wildcard(1)}}"),
    ("foo.*", "x.{{split(1)}}", "invalid mapping destination: not enough arguments passed to the function in {{split(1)}}"),
    ("foo.*", "x.{{split(1,a b)}}", "invalid mapping destination: function argument is invalid or in the wrong format in {{split(1,a b)}}"),
    ("foo.*", "x.{{left(1,2,3)}}", "invalid mapping destination: too many arguments passed to the function in {{left(1,2,3)}}"),
    ("foo.*", "x.{{random(1,2)}}", "invalid mapping destination: too many arguments passed to the function in {{random(1,2)}}"),
    # wildcard index 0 is refused (docs/semantics.md §13.6; the server reads token 0 by accident)
    ("foo.*", "x.$0", "invalid mapping destination: wildcard index out of range in $0: [0]"),
    ("*", "bar.{{partition(10, 0)}}", "invalid mapping destination: wildcard index out of range in {{partition(10, 0)}}: [0]"),
]


@pytest.mark.parametrize(("src", "dest", "message"), BAD)
def test_invalid_transforms(src: str, dest: str, message: str) -> None:
    with pytest.raises(TransformError) as exc:
        SubjectTransform(src, dest)
    assert str(exc.value) == message


OK = [
    ("foo.*.*", "bar.$2"), ("foo.*.*", "bar.{{wildcard(1)}}"), ("foo.*.*", "bar.{{partition(1)}}"), ("foo", "bar"),
    ("foo.*.bar.*.baz", "req.$2.$1"), ("baz.>", "mybaz.>"), ("*", "{{splitfromleft(1,1)}}"), ("", "prefix.>"),
    ("*.*", "{{partition(10,1,2)}}"), ("foo.*.*", "foo.{{wildcard(1)}}.{{wildcard(2)}}.{{partition(5,1,2)}}"),
    ("foo.*", "foo.$foo"), ("foo.*", "bar.{{Wildcard(1)}}"), ("foo", "bar.{{random(5)}}"), ("foo.bar", "x.{{partition(10)}}"),
]


@pytest.mark.parametrize(("src", "dest"), OK)
def test_valid_transforms(src: str, dest: str) -> None:
    SubjectTransform(src, dest)


MATCH = [
    ("", "prefix.>", "foo", "prefix.foo"),
    (">", ">", "a.b.c", "a.b.c"),
    ("foo", "bar", "foo", "bar"),
    ("foo.*.bar.*.baz", "req.$2.$1", "foo.A.bar.B.baz", "req.B.A"),
    ("foo.*.bar.*.baz", "req.{{wildcard(2)}}.{{wildcard(1)}}", "foo.A.bar.B.baz", "req.B.A"),
    ("foo.*.bar.*.baz", "req.{{ Wildcard (2) }}.$1", "foo.A.bar.B.baz", "req.B.A"),
    ("baz.>", "my.pre.>", "baz.1.2.3", "my.pre.1.2.3"),
    ("baz.>", "foo.bar.>", "baz.1.2.3", "foo.bar.1.2.3"),
    (">", "RP.>", "foo", "RP.foo"),
    ("*", "foo.bar.$1", "foo", "foo.bar.foo"),
    ("*", "{{splitfromleft(1,3)}}", "12345", "123.45"),
    ("*", "{{SplitFromRight(1,3)}}", "12345", "12.345"),
    ("*", "{{SliceFromLeft(1,3)}}", "1234567890", "123.456.789.0"),
    ("*", "{{SliceFromRight(1,3)}}", "1234567890", "1.234.567.890"),
    ("*", "{{sliceFromLeft(1,5)}}", "1234567890", "12345.67890"),
    ("*", "{{split(1,-)}}", "-abc-def--ghi-", "abc.def.ghi"),
    ("*", "{{split(1,-)}}", "abc-def--ghi-", "abc.def.ghi"),
    ("*.*", "{{split(2,-)}}.{{splitfromleft(1,2)}}", "foo.-abc-def--ghij-", "abc.def.ghij.fo.o"),
    ("*", "{{right(1,1)}}", "1234", "4"),
    ("*", "{{right(1,3)}}", "1234", "234"),
    ("*", "{{right(1,6)}}", "1234", "1234"),
    ("*", "{{left(1,1)}}", "1234", "1"),
    ("*", "{{left(1,3)}}", "1234", "123"),
    ("*", "{{left(1,6)}}", "1234", "1234"),
    ("in0.*", "{{left(1,3)}}", "in0.abcdef", "abc"),
    ("*", "bar.{{partition(0)}}", "baz", "bar.0"),
    ("*", "bar.{{partition(10, 1)}}", "foo", "bar.3"),
    ("*.*", "bar.{{partition(10)}}", "foo.bar", "bar.6"),
    ("*", "bar.{{partition(10)}}", "foo", "bar.3"),
    ("*", "bar.{{partition(10)}}", "baz", "bar.0"),
    ("*", "bar.{{partition(10)}}", "qux", "bar.9"),
    ("foo.bar", "p.{{partition(10)}}", "foo.bar", "p.6"),
    ("foo.baz", "p.{{partition(10)}}", "foo.baz", "p.4"),
    ("test.subject", "p.{{partition(5)}}", "test.subject", "p.0"),
    ("foo", "r.{{random(0)}}", "foo", "r.0"),
]


@pytest.mark.parametrize(("src", "dest", "subject", "expected"), MATCH)
def test_outputs(src: str, dest: str, subject: str, expected: str) -> None:
    assert SubjectTransform(src, dest).apply(subject) == expected


def test_no_match_gives_none_and_a_missing_token_reads_as_empty() -> None:
    assert SubjectTransform("foo.*", "bar.$1").apply("baz.x") is None
    assert SubjectTransform("foo.*", "bar.$1").apply("foo.x.y") is None
    assert SubjectTransform("foo.*", "one.two.{{wildcard(1)}}").transform_tokens(["foo"]) == "one.two."


def test_fnv1a_matches_go() -> None:
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"foo") == 0xA9F37ED7


def test_random_stays_in_range() -> None:
    t = SubjectTransform("foo", "r.{{random(3)}}")
    assert {t.apply("foo") for _ in range(200)} == {"r.0", "r.1", "r.2"}


token = st.text(alphabet="abcdefghij0123456789-_", min_size=1, max_size=8)


@given(st.lists(token, min_size=1, max_size=5), st.integers(1, 9))
def test_every_output_matches_the_transform_filter(tokens: list[str], n: int) -> None:
    """``as_filter`` covers every output, which the loop checks rely on."""
    src = ".".join(["*"] * len(tokens))
    dests = [
        "out." + ".".join(f"${i}" for i in range(len(tokens), 0, -1)),
        "out.{{split(1,-)}}.x",
        f"out.{{{{sliceFromLeft(1,{n})}}}}.{{{{partition({n},1)}}}}",
        f"out.{{{{left(1,{n})}}}}.{{{{right({len(tokens)},{n})}}}}.{{{{splitFromRight(1,{n})}}}}",
    ]
    subject = ".".join(tokens)
    for dest in dests:
        t = SubjectTransform(src, dest)
        out = t.apply(subject)
        assert out is not None
        assert subject_matches(tuple(t.as_filter().split(".")), out.split(".")) or "" in out.split(".")
        assert filters_overlap(t.as_filter(), out) or "" in out.split(".")


@given(st.lists(token, min_size=1, max_size=6))
def test_identity_and_prefix(tokens: list[str]) -> None:
    subject = ".".join(tokens)
    assert SubjectTransform(">", ">").apply(subject) == subject
    assert SubjectTransform("", "pre.>").apply(subject) == "pre." + subject
    assert SubjectTransform(tokens[0] + ".>", "x.>").apply(subject) == ("x." + ".".join(tokens[1:]) if len(tokens) > 1 else None)


def test_only_random_makes_a_transform_non_deterministic() -> None:
    assert SubjectTransform("a.*", "b.$1.{{partition(3,1)}}.{{split(1,-)}}").deterministic
    assert SubjectTransform(">", ">").deterministic
    assert not SubjectTransform("a.*", "b.$1.{{Random(3)}}").deterministic
