"""The client's KV get pieces that run once per get: the key check (one regular
expression for a valid key, the detailed checks for the error) and the entry made
without the frozen dataclass's ``__init__``: the same answers as the plain rules and
the plain constructor, for any input."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.client import InvalidKeyError
from broker.client._kv import Entry, _make_entry, validate_key

_KEY_CHARS = "-/_=.aZ09"


def _plain_rule(key: str) -> bool:
    """The NATS KV key rule, spelled out."""
    allowed = set("-/_=.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    return bool(key) and all(ch in allowed for ch in key) and not key.startswith(".") and not key.endswith(".") and ".." not in key


@given(st.one_of(st.text(_KEY_CHARS, max_size=12), st.text(max_size=12)))
def test_validate_key_is_the_key_rule(key: str) -> None:
    if _plain_rule(key):
        assert validate_key(key) is key
    else:
        with pytest.raises(InvalidKeyError) as exc:
            validate_key(key)
        assert exc.value.message.startswith(f"invalid key {key!r}: ")


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("a b", "keys are letters, digits and -/_=. only"),
        ("", "keys are letters, digits and -/_=. only"),
        ("é", "keys are letters, digits and -/_=. only"),
        (".a", "no leading, trailing or double dot"),
        ("a.", "no leading, trailing or double dot"),
        ("a..b", "no leading, trailing or double dot"),
        (7, "keys are letters, digits and -/_=. only"),
    ],
)
def test_validate_key_says_what_is_wrong(key: object, why: str) -> None:
    with pytest.raises(InvalidKeyError) as exc:
        validate_key(key)  # type: ignore[arg-type]
    assert exc.value.message == f"invalid key {key!r}: {why}"


@given(
    st.text(max_size=5), st.text(max_size=5), st.binary(max_size=20), st.integers(0, 2**64 - 1), st.integers(0, 2**63),
    st.sampled_from(["PUT", "DEL", "PURGE", "EXPIRED"]), st.one_of(st.none(), st.floats(0, 1e6)),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
)
def test_make_entry_is_the_dataclass(bucket, key, value, revision, created, operation, remaining, headers) -> None:  # type: ignore[no-untyped-def]
    args = (bucket, key, value, revision, created, operation, remaining, headers)
    made, plain = _make_entry(*args), Entry(*args)
    assert made == plain and repr(made) == repr(plain) and hash(made.key) == hash(plain.key)
    assert dataclasses.asdict(made) == dataclasses.asdict(plain) and type(made) is Entry
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.value = b"x"  # type: ignore[misc]
