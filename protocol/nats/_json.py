"""JSON as the NATS side reads it off the wire (API requests, pull requests, acks,
``CONNECT``): ``json.loads``, refusing a document nested deeper than
:data:`MAX_DEPTH` levels as malformed (a ``ValueError``, as for any other).

Without the limit, a document nested deeper than the parser can follow (``[[[[...``)
makes ``json.loads`` raise ``RecursionError``, which no caller's ``except ValueError``
catches (the request was answered as an internal error and logged at error level
each time), and one a little less deep parses but makes later code that walks it
(a copy, an encoding) fail the same way, at a depth that depends on the stack in
use. A fixed limit, checked here, makes every such request what it is: one that
cannot be parsed, answered as such (``docs/semantics.md`` §18.30).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

__all__ = ["loads", "MAX_DEPTH", "TOO_DEEP"]

#: The deepest nesting of arrays and objects accepted (``[]`` is 1). nats-server's
#: parser (Go's ``encoding/json``) allows 10,000; Python's cannot follow so many
#: (its recursion limit), and no JetStream request nests more than a few levels.
MAX_DEPTH = 100
#: What is wrong with a deeper document, in the words of Go's ``encoding/json``:
#: nats-server answers one nested deeper than its limit ``invalid JSON: exceeded max
#: depth``.
TOO_DEEP = "exceeded max depth"


#: A JSON string (its escapes included), whose brackets are text, not nesting.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
#: Each byte's step of the nesting depth: ``[`` and ``{`` +1, ``]`` and ``}`` -1.
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``json.loads(data)``; a document nested deeper than :data:`MAX_DEPTH` raises
    ``ValueError(TOO_DEEP)``, as a malformed one raises ``ValueError``.

    The depth is measured on the text before it is parsed, so the parser never
    follows a document deeper than the limit: what it does past its own depth (a
    ``RecursionError``, at a depth set by the interpreter's recursion limit, which
    the process that embeds the broker may have raised) never comes into it.

    Runtime complexity: O(len(data)); the depth is measured (C-level passes over
    the text, strings left out) only for a document with more than
    :data:`MAX_DEPTH` brackets.
    """
    if isinstance(data, memoryview):
        data = bytes(data)
    raw = data.encode() if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _deeper_than(raw, MAX_DEPTH):
        raise ValueError(TOO_DEEP)
    try:
        return json.loads(data)
    except RecursionError:  # (not past the limit above: a stack already deep)
        raise ValueError(TOO_DEEP) from None


def _deeper_than(raw: bytes | bytearray, limit: int) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects more than ``limit``
    levels deep before its end or an unterminated string (its strings left out, as
    a parser reading it from the start sees them)."""
    text = _STRING.sub(b"", raw)
    open_string = text.find(b'"')
    if open_string >= 0:
        text = text[:open_string]
    brackets = text.translate(None, _NOT_BRACKETS)
    return bool(brackets) and max(accumulate(map(_STEP.__getitem__, brackets))) > limit
