"""JetStream API requests nested too deep to parse (issue 27): answered as any body
that is not JSON, ``400 10025 invalid JSON: exceeded max depth`` (nats-server's words
past its depth limit), never as an internal error, with nothing logged at error
level, and the connection goes on (``docs/semantics.md`` §18.30)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import nats
import pytest
from helpers import in_asyncio
from hypothesis import given
from hypothesis import strategies as st

from broker import ServerHandle
from protocol.nats import json_loads
from protocol.nats._json import MAX_DEPTH

#: ``"[" * 100000`` and ``{"a":`` nested 10,000 deep: what the issue sent.
DEEP = {"brackets": b"[" * 100_000, "objects": b'{"a":' * 10_000}


def nested(depth: int, inner: bytes = b"1") -> bytes:
    """A request object whose ``metadata`` nests ``depth - 1`` objects: ``depth``
    levels in all."""
    return b'{"metadata":' + b'{"a":' * (depth - 1) + inner + b"}" * depth


SUBJECTS = (
    ("$JS.API.STREAM.CREATE.T", "stream_create"),
    ("$JS.API.STREAM.UPDATE.S", "stream_update"),
    ("$JS.API.CONSUMER.CREATE.S", "consumer_create"),
    ("$JS.API.CONSUMER.DURABLE.CREATE.S.D", "consumer_create"),
    ("$JS.API.STREAM.MSG.GET.S", "stream_msg_get"),
    ("$JS.API.STREAM.MSG.DELETE.S", "stream_msg_delete"),
    ("$JS.API.STREAM.PURGE.S", "stream_purge"),
)


async def test_deeply_nested_requests_are_invalid_json_not_internal_errors(
    nats_url: str, nats_server: ServerHandle, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="broker")

    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"], allow_direct=True)
        await js.publish("s.a", b"x")
        await js.add_consumer("S", durable_name="C")
        out: dict[str, Any] = {}
        for subject, _ in SUBJECTS:
            for name, payload in (*DEEP.items(), ("one too deep", nested(MAX_DEPTH + 1))):
                reply = await nc.request(subject, payload, timeout=5)
                out[subject, name] = json.loads(reply.data)
            # The connection goes on: the next request is answered.
            out[subject, "then"] = json.loads((await nc.request("$JS.API.STREAM.INFO.S", b"", timeout=5)).data)
        for name, payload in DEEP.items():
            reply = await nc.request("$JS.API.DIRECT.GET.S", payload, timeout=5)
            out["direct", name] = (reply.headers, reply.data)
            reply = await nc.request("$JS.API.CONSUMER.MSG.NEXT.S.C", b'{"batch":' + payload, timeout=5)
            out["next", name] = (reply.headers, reply.data)
        out["get"] = (await js.get_msg("S", seq=1)).data
        await nc.close()
        return out

    out = await in_asyncio(scenario)
    too_deep = {"code": 400, "err_code": 10025, "description": "invalid JSON: exceeded max depth"}
    for subject, kind in SUBJECTS:
        for name in (*DEEP, "one too deep"):
            assert out[subject, name] == {"type": f"io.nats.jetstream.api.v1.{kind}_response", "error": too_deep}, (
                subject, name)
        assert out[subject, "then"]["config"]["name"] == "S", subject
    for name in DEEP:
        assert out["direct", name] == ({"Status": "408", "Description": "Malformed Request"}, b"")
        assert out["next", name] == ({"Status": "400", "Description": "Bad Request - exceeded max depth"}, b"")
    assert out["get"] == b"x"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_the_depth_limit_is_exact_and_does_not_depend_on_the_stack() -> None:
    """``MAX_DEPTH`` levels parse, one more does not, however deep the caller's stack
    (a nesting Python's parser follows parses, and is refused all the same); a wide
    document with many brackets is not deep."""
    assert json_loads(nested(MAX_DEPTH))["metadata"]["a"]
    wide = b"[" + b",".join([b"[[1]]"] * 10_000) + b"]"
    assert len(json_loads(wide)) == 10_000

    def at_depth(n: int) -> None:
        if n:
            at_depth(n - 1)
            return
        with pytest.raises(ValueError, match="^exceeded max depth$"):
            json_loads(nested(MAX_DEPTH + 1))
        assert json_loads(nested(MAX_DEPTH))

    for stack in (0, 300, 800):
        at_depth(stack)
    for payload in DEEP.values():
        with pytest.raises(ValueError, match="^exceeded max depth$"):
            json_loads(payload)
        with pytest.raises(ValueError, match="^exceeded max depth$"):
            json_loads(payload.decode())
    with pytest.raises(ValueError):
        json_loads(b"{nope")


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


#: Strings whose brackets, quotes and escapes are text, not nesting.
TEXT = st.text(alphabet='[]{}"\\ax\u00e9', max_size=6)


@given(st.integers(0, MAX_DEPTH + 20), st.lists(st.tuples(st.booleans(), TEXT), max_size=4), st.booleans())
def test_the_depth_is_the_nesting_of_arrays_and_objects_not_of_text(
    depth: int, leaves: list[tuple[bool, str]], as_text: bool,
) -> None:
    """A document is refused as too deep exactly when its arrays and objects nest
    more than ``MAX_DEPTH`` levels, whatever its strings hold (brackets, quotes,
    escapes); otherwise it is what ``json.loads`` makes of it."""
    value: Any = [text for _, text in leaves]
    for i in range(depth - 1):
        value = {"k": value, "s": leaves[i % len(leaves)][1]} if leaves and leaves[i % len(leaves)][0] else [value, "]"]
    data = json.dumps(value)
    raw: str | bytes = data if as_text else data.encode()
    if _depth(value) > MAX_DEPTH:
        with pytest.raises(ValueError, match="^exceeded max depth$"):
            json_loads(raw)
    else:
        assert json_loads(raw) == value


def test_a_raised_recursion_limit_changes_nothing() -> None:
    """The depth is checked before the parser runs: a process that raised the
    interpreter's recursion limit (mypy, run in-process, sets 16,384) refuses the
    same documents, and its parser is never asked to follow them."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(2**14)
    try:
        for payload in (*DEEP.values(), nested(MAX_DEPTH + 1), b"[" * 20_000 + b"]" * 20_000):
            with pytest.raises(ValueError, match="^exceeded max depth$"):
                json_loads(payload)
        assert json_loads(nested(MAX_DEPTH))
        unterminated = b'{"a": "' + b"[" * 500  # (its brackets are text: the string's end is what is missing)
        with pytest.raises(ValueError, match="Unterminated string"):
            json_loads(unterminated)
    finally:
        sys.setrecursionlimit(before)
