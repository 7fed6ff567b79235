"""Subjects and subject filters: validation, matching and overlap.

A *subject* is a dot-separated string of non-empty tokens (``orders.eu.42``), 1..255
bytes of UTF-8, with no whitespace or control characters, and no token that is a
wildcard. A *filter* may also use the wildcard tokens ``*`` (exactly one token) and
``>`` (one or more tokens, only as the last token). Wildcards are whole tokens, as in
NATS: ``foo*`` is a literal token.

Everything here is pure; results are cached by the callers that need speed.
"""

from __future__ import annotations

import re

from ._errors import ErrorCode, error_class

__all__ = [
    "MAX_SUBJECT_BYTES",
    "validate_subject",
    "validate_published_subject",
    "validate_filter",
    "filter_tokens",
    "match_order",
    "subject_matches",
    "filters_overlap",
    "filter_is_subset",
    "is_literal",
]

MAX_SUBJECT_BYTES = 255
_FORBIDDEN = frozenset(" \t\r\n\f\v\x00")


def _check_text(text: str, what: str, code: ErrorCode) -> None:
    if not text:
        raise error_class(code)(f"{what} must not be empty")
    if len(text.encode()) > MAX_SUBJECT_BYTES:
        raise error_class(code)(f"{what} {text[:40]!r}... is longer than {MAX_SUBJECT_BYTES} bytes")
    for ch in text:
        if ch in _FORBIDDEN or ch < " " or ch == "\x7f":
            raise error_class(code)(f"{what} {text!r} contains whitespace or a control character")


#: Subjects the checks of :func:`validate_subject` accept at a glance (one match, not a
#: loop over the characters): at most 63 characters (so at most 252 bytes of UTF-8),
#: tokens of characters that are none of whitespace, control characters, dots and
#: wildcards (nor lone surrogates, which cannot be UTF-8). Anything else goes
#: through the checks, which name what is wrong.
_PLAIN_SUBJECT = re.compile(r"[^\x00-\x20\x7f.*>\ud800-\udfff]+(?:\.[^\x00-\x20\x7f.*>\ud800-\udfff]+)*")


def validate_subject(subject: str) -> str:
    """Check that ``subject`` is a valid publish subject and return it.

    Raises:
        InvalidSubjectError: empty, too long, an empty token, a wildcard token, or a
            whitespace/control character.
    """
    if len(subject) <= 63 and _PLAIN_SUBJECT.fullmatch(subject):
        return subject
    return _check_subject(subject)


def _check_subject(subject: str, wildcards_literal: bool = False) -> str:
    _check_text(subject, "subject", ErrorCode.INVALID_SUBJECT)
    for token in subject.split("."):
        if not token:
            raise error_class(ErrorCode.INVALID_SUBJECT)(f"subject {subject!r} has an empty token")
        if not wildcards_literal and (token == "*" or token == ">"):
            raise error_class(ErrorCode.INVALID_SUBJECT)(
                f"subject {subject!r} contains the wildcard {token!r}; wildcards are for filters"
            )
    return subject


def validate_published_subject(subject: str) -> str:
    """Check the subject of a message being published and return it: as
    :func:`validate_subject`, except that ``*`` and ``>`` may be tokens. In a
    published subject they are literal tokens, as in NATS (nats-server stores a
    publish to ``a.*``, and ``kv.purge("a.*")`` relies on it): filters match them
    token by token (``a.*`` and ``a.>`` capture ``a.*``; ``a.b`` does not).

    Raises:
        InvalidSubjectError: empty, too long, an empty token, or a whitespace/control
            character.
    """
    if len(subject) <= 63 and _PLAIN_SUBJECT.fullmatch(subject):
        return subject
    return _check_subject(subject, wildcards_literal=True)


def validate_filter(subject_filter: str, code: ErrorCode = ErrorCode.INVALID_SUBJECT_FILTER) -> str:
    """Check that ``subject_filter`` is a valid filter and return it.

    Raises:
        InvalidSubjectFilterError (or the class of ``code``): empty, too long, an empty
            token, ``>`` not last, or a whitespace/control character.
    """
    _check_text(subject_filter, "subject filter", code)
    tokens = subject_filter.split(".")
    for i, token in enumerate(tokens):
        if not token:
            raise error_class(code)(f"subject filter {subject_filter!r} has an empty token")
        if token == ">" and i != len(tokens) - 1:
            raise error_class(code)(f"subject filter {subject_filter!r}: '>' may only be the last token")
    return subject_filter


def filter_tokens(subject_filter: str) -> tuple[str, ...]:
    return tuple(subject_filter.split("."))


def is_literal(subject_filter: str) -> bool:
    """True when the filter has no wildcard token (it names exactly one subject)."""
    if "*" not in subject_filter and ">" not in subject_filter:
        return True  # the common case, without splitting it (a KV get asks this per request)
    return not any(t == "*" or t == ">" for t in subject_filter.split("."))


#: Where a token puts a filter in nats-server's match order (its sublist visits, at
#: each level, ``>`` then ``*`` then the literal token).
_MATCH_RANK = {">": 0, "*": 1}


def match_order(ftokens: tuple[str, ...]) -> list[int]:
    """The sort key that puts filters matching one subject in the order nats-server's
    sublist returns them: at the first token where two differ, ``>`` before ``*``
    before a literal (two filters matching one subject have the same literal there)."""
    return [_MATCH_RANK.get(t, 2) for t in ftokens]


def subject_matches(ftokens: tuple[str, ...], stokens: list[str] | tuple[str, ...]) -> bool:
    """Does the subject (as tokens) match the filter (as tokens)?

    Runtime complexity: O(number of tokens).
    """
    n = len(ftokens)
    for i in range(n):
        f = ftokens[i]
        if f == ">":
            return len(stokens) > i
        if i >= len(stokens):
            return False
        if f != "*" and f != stokens[i]:
            return False
    return len(stokens) == n


def filters_overlap(a: str, b: str) -> bool:
    """True when some subject matches both filters (NATS ``SubjectsCollide``)."""
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        if i >= len(ta) or i >= len(tb):
            return False
        x, y = ta[i], tb[i]
        if x == ">" or y == ">":
            return True
        if x != "*" and y != "*" and x != y:
            return False
    return True


def filter_is_subset(inner: str, outer: str) -> bool:
    """True when every subject matching ``inner`` also matches ``outer``."""
    ti, to = inner.split("."), outer.split(".")
    for i, o in enumerate(to):
        if o == ">":
            return len(ti) > i
        if i >= len(ti):
            return False
        x = ti[i]
        if x == ">":
            return False
        if o == "*":
            continue
        if x == "*" or x != o:
            return False
    return len(ti) == len(to)
