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


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``json.loads(data)``; a document nested deeper than :data:`MAX_DEPTH` raises
    ``ValueError(TOO_DEEP)``, as a malformed one raises ``ValueError``.

    Runtime complexity: O(len(data)); the nesting is measured (a walk of the parsed
    value) only for a document with more than :data:`MAX_DEPTH` brackets.
    """
    if isinstance(data, memoryview):
        data = bytes(data)
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if isinstance(data, str):
        brackets = data.count("[") + data.count("{")
    else:
        brackets = data.count(b"[") + data.count(b"{")
    if brackets > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise ValueError(TOO_DEEP)
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` levels deep,
    level by level (no recursion: it must not fail as the parser did)."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        inner: list[Any] = []
        for v in level:
            for x in v.values() if isinstance(v, dict) else v:
                if isinstance(x, (dict, list)):
                    inner.append(x)
        level = inner
    return False
