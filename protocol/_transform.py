"""Subject transforms (NATS ADR-30), as the NATS server implements them.

A transform maps a subject that matches ``src`` (a filter; empty means ``>``) to a
new subject built from the ``dest`` template. Each ``dest`` token is either
literal, ``>`` (the rest of the input, from where ``>`` stands in ``src``), or a
reference to the input:

* ``$n`` and ``{{wildcard(n)}}``: the value of the n-th ``*`` of ``src`` (1-based
  among the ``*`` tokens, not token positions);
* ``{{partition(n, i, j...)}}``: FNV-1a 32 of the listed wildcard values joined
  without separator, modulo n; ``{{partition(n)}}``: of the whole subject;
* ``{{split(i, d)}}``: the value split on ``d``, empty pieces dropped, joined by ``.``;
* ``{{splitFromLeft(i, n)}}`` / ``{{splitFromRight(i, n)}}``: cut into two tokens n
  characters from the left / right;
* ``{{sliceFromLeft(i, n)}}`` / ``{{sliceFromRight(i, n)}}``: chunks of n from the left
  (remainder last) / from the right (remainder first);
* ``{{left(i, n)}}`` / ``{{right(i, n)}}``: the first / last n characters;
* ``{{random(n)}}``: uniform in 0..n-1.

A function's name accepts a capital first letter of each camel part
(``SplitFromLeft``, ``splitfromleft``), spaces around names and arguments are allowed,
and ``$`` followed by anything but digits is a literal token. A size that is not
strictly between 0 and the value's length leaves the value whole.

Validation follows the server (``docs/semantics.md`` §13.6, §13.7): both sides must be valid subjects
with no empty token; ``dest`` has no ``*``; ``src`` has ``>`` exactly when ``dest``
has; a reference must name an existing ``*`` of ``src``; a ``src`` without ``*`` allows
only ``partition`` (of the whole subject) and ``random``. Errors carry the server's
texts, ``invalid mapping destination: <reason> in <token>`` or ``invalid subject``.
One decision of ours (``docs/semantics.md`` §13.6): wildcard index 0 is refused
(ADR-30 numbers wildcards from 1; the server accepts 0 by accident).
"""

from __future__ import annotations

import random as _random
import re
from dataclasses import dataclass

__all__ = ["SubjectTransform", "TransformError", "fnv1a_32"]

_INT32_MAX = 2**31 - 1


class TransformError(ValueError):
    """A transform that cannot be built; the message is the server's text."""


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32 bits (Go's ``hash/fnv`` ``New32a``)."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


# Function kinds.
_LITERAL, _FWC, _WILDCARD, _PARTITION, _SPLIT, _SPLIT_LEFT, _SPLIT_RIGHT, _SLICE_LEFT, _SLICE_RIGHT, _LEFT, _RIGHT, _RANDOM = range(12)


def _fn(pattern: str) -> re.Pattern[str]:
    return re.compile(r"\{\{\s*" + pattern + r"\s*\((.*)\)\s*\}\}")


# In the server's order of trial (a name that is a prefix of another comes later).
_FUNCTIONS: list[tuple[re.Pattern[str], int]] = [
    (_fn("[wW]ildcard"), _WILDCARD),
    (_fn("[pP]artition"), _PARTITION),
    (_fn("[sS]plit[fF]rom[lL]eft"), _SPLIT_LEFT),
    (_fn("[sS]plit[fF]rom[rR]ight"), _SPLIT_RIGHT),
    (_fn("[sS]lice[fF]rom[lL]eft"), _SLICE_LEFT),
    (_fn("[sS]lice[fF]rom[rR]ight"), _SLICE_RIGHT),
    (_fn("[rR]ight"), _RIGHT),
    (_fn("[lL]eft"), _LEFT),
    (_fn("[sS]plit"), _SPLIT),
    (_fn("[rR]andom"), _RANDOM),
]
_COMMA = re.compile(r",\s*")
_INDEX_INT = {_SPLIT_LEFT, _SPLIT_RIGHT, _SLICE_LEFT, _SLICE_RIGHT, _LEFT, _RIGHT}
#: Functions whose output may be several tokens.
MULTI_TOKEN = frozenset({_SPLIT, _SPLIT_LEFT, _SPLIT_RIGHT, _SLICE_LEFT, _SLICE_RIGHT})

_NOT_ENOUGH = "not enough arguments passed to the function"
_TOO_MANY = "too many arguments passed to the function"
_INVALID_ARG = "function argument is invalid or in the wrong format"
_OUT_OF_RANGE = "wildcard index out of range"
_UNKNOWN = "unknown function"


def _dest_error(reason: str, token: str) -> TransformError:
    return TransformError(f"invalid mapping destination: {reason} in {token}")


def _atoi(text: str, token: str) -> int:
    t = text.strip(" ")
    if not re.fullmatch(r"[+-]?[0-9]+", t):
        raise _dest_error(_INVALID_ARG, token)
    return int(t)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: int
    text: str = ""
    indexes: tuple[int, ...] = ()  # wildcard numbers (1-based among the '*' of src)
    number: int = 0
    separator: str = ""


def _parse_token(token: str) -> _Token:
    """One ``dest`` token (the server's ``indexPlaceHolders``)."""
    if len(token) > 1 and token[0] == "$":
        if token[1:].isdigit() and token[1:].isascii():
            return _Token(_WILDCARD, token, (int(token[1:]),))
        return _Token(_LITERAL, token)
    if len(token) > 4 and token.startswith("{{") and token.endswith("}}"):
        for pattern, kind in _FUNCTIONS:
            m = pattern.fullmatch(token)
            if m is None:
                continue
            args = _COMMA.split(m.group(1))
            if kind == _WILDCARD:
                if args == [""]:
                    raise _dest_error(_NOT_ENOUGH, token)
                if len(args) > 1:
                    raise _dest_error(_TOO_MANY, token)
                return _Token(kind, token, (_atoi(args[0], token),))
            if kind == _PARTITION:
                if args == [""]:
                    raise _dest_error(_NOT_ENOUGH, token)
                n = _atoi(args[0], token)
                if not 0 <= n <= _INT32_MAX:
                    raise _dest_error(_INVALID_ARG, token)
                return _Token(kind, token, tuple(_atoi(a, token) for a in args[1:]), n)
            if kind == _RANDOM:
                if args == [""]:
                    raise _dest_error(_NOT_ENOUGH, token)
                if len(args) > 1:
                    raise _dest_error(_TOO_MANY, token)
                n = _atoi(args[0], token)
                if not 0 <= n <= _INT32_MAX:
                    raise _dest_error(_INVALID_ARG, token)
                return _Token(kind, token, (), n)
            if len(args) < 2:
                raise _dest_error(_NOT_ENOUGH, token)
            if len(args) > 2:
                raise _dest_error(_TOO_MANY, token)
            index = _atoi(args[0], token)
            if kind == _SPLIT:
                if " " in args[1] or "." in args[1] or not args[1]:
                    raise _dest_error(_INVALID_ARG, token)
                return _Token(kind, token, (index,), 0, args[1])
            n = _atoi(args[1], token)
            if not -(2**31) <= n <= _INT32_MAX:
                raise _dest_error(_INVALID_ARG, token)
            return _Token(kind, token, (index,), n)
        raise _dest_error(_UNKNOWN, token)
    if token == ">":
        return _Token(_FWC, token)
    return _Token(_LITERAL, token)


def _subject_info(subject: str) -> tuple[bool, list[str], int, bool]:
    """The server's ``subjectInfo``: valid, tokens, number of ``*``, has ``>``."""
    if not subject:
        return False, [], 0, False
    tokens = subject.split(".")
    pwcs = 0
    fwc = False
    for t in tokens:
        if not t or fwc:
            return False, [], 0, False
        if t == ">":
            fwc = True
        elif t == "*":
            pwcs += 1
    return True, tokens, pwcs, fwc


class SubjectTransform:
    """A validated transform. Build it with ``SubjectTransform(src, dest)``.

    Raises:
        TransformError: with the server's text (see the module docstring).
    """

    __slots__ = ("src", "dest", "deterministic", "_stokens", "_dtokens", "_positions", "_fwc_at", "_identity")

    def __init__(self, src: str, dest: str) -> None:
        src = src or ">"
        self.src = src
        self.dest = dest
        sv, stokens, npwcs, sfwc = _subject_info(src)
        dv, dtokens, dpwcs, dfwc = _subject_info(dest)
        if not sv or not dv or dpwcs or sfwc != dfwc:
            raise TransformError("invalid subject")
        self._identity = src == ">" and dest == ">"
        self._stokens = tuple(stokens)
        # wildcard number (1-based) -> token position in src
        self._positions = {k + 1: i for k, i in enumerate(i for i, t in enumerate(stokens) if t == "*")}
        parsed = []
        for token in dtokens:
            p = _parse_token(token)
            if p.kind in (_LITERAL, _FWC):
                parsed.append(p)
                continue
            if npwcs == 0 and not (p.kind == _RANDOM or (p.kind == _PARTITION and not p.indexes)):
                raise _dest_error(_OUT_OF_RANGE, token)
            for index in p.indexes:
                if index < 1 or index > npwcs:  # index 0: refused, docs/semantics.md §13.6
                    raise _dest_error(_OUT_OF_RANGE, f"{token}: [{index}]")
            parsed.append(p)
        self._dtokens = tuple(parsed)
        #: The same subject always gives the same result (no ``random``): a caller
        #: may keep the answer per subject.
        self.deterministic = all(p.kind != _RANDOM for p in parsed)
        self._fwc_at = len(stokens) - 1 if sfwc else -1

    def __repr__(self) -> str:
        return f"SubjectTransform({self.src!r}, {self.dest!r})"

    def matches(self, tokens: list[str]) -> bool:
        """Does the subject (as tokens) match ``src``?"""
        st = self._stokens
        for i, f in enumerate(st):
            if f == ">":
                return len(tokens) > i
            if i >= len(tokens) or (f != "*" and f != tokens[i]):
                return False
        return len(tokens) == len(st)

    def apply(self, subject: str) -> str | None:
        """The transformed subject, or None when ``subject`` does not match ``src``.

        The result is not validated: a function can produce an empty token or a
        character a subject may not hold (the caller checks it: ``docs/semantics.md``
        §13.6).
        """
        if self._identity:
            return subject
        tokens = subject.split(".")
        if not self.matches(tokens):
            return None
        return self.transform_tokens(tokens)

    def transform_tokens(self, tokens: list[str]) -> str:
        """Apply the template to tokens already known to match (a missing token reads
        as empty rather than failing, as the server does)."""
        out: list[str] = []
        pos = self._positions

        def value(k: int) -> str:
            i = pos.get(k, len(tokens))
            return tokens[i] if i < len(tokens) else ""

        for t in self._dtokens:
            kind = t.kind
            if kind == _LITERAL:
                out.append(t.text)
            elif kind == _FWC:
                out.extend(tokens[self._fwc_at :])
            elif kind == _WILDCARD:
                out.append(value(t.indexes[0]))
            elif kind == _PARTITION:
                key = "".join(value(k) for k in t.indexes) if t.indexes else ".".join(tokens)
                out.append(str(fnv1a_32(key.encode()) % t.number) if t.number else "0")
            elif kind == _RANDOM:
                out.append(str(_random.randrange(t.number)) if t.number else "0")
            elif kind == _SPLIT:
                out.append(".".join(p for p in value(t.indexes[0]).split(t.separator) if p))
            else:
                out.append(_sized(kind, value(t.indexes[0]), t.number))
        return ".".join(out)

    def as_filter(self) -> str:
        """A filter every output of the transform matches (for loop analysis): each
        reference becomes ``*``, and the rest after a function that can give several
        tokens becomes ``>``."""
        out: list[str] = []
        for t in self._dtokens:
            if t.kind == _LITERAL:
                out.append(t.text)
            elif t.kind == _FWC or t.kind in MULTI_TOKEN:
                out.append(">")
                break
            else:
                out.append("*")
        return ".".join(out)


def _sized(kind: int, v: str, n: int) -> str:
    if not 0 < n < len(v):
        return v
    if kind == _SPLIT_LEFT:
        return f"{v[:n]}.{v[n:]}"
    if kind == _SPLIT_RIGHT:
        return f"{v[: len(v) - n]}.{v[len(v) - n :]}"
    if kind == _LEFT:
        return v[:n]
    if kind == _RIGHT:
        return v[len(v) - n :]
    if kind == _SLICE_LEFT:
        return ".".join(v[i : i + n] for i in range(0, len(v), n))
    # _SLICE_RIGHT: remainder first, then chunks of n
    r = len(v) % n
    head = [v[:r]] if r else []
    return ".".join(head + [v[i : i + n] for i in range(r, len(v), n)])

