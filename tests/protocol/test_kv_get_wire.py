"""The KV get's fast paths give what the general ones give: ``InfoMap.pack`` the bytes
of ``InfoMap(...).encode()`` (the reply of every KV get), ``InfoMap.values_of`` and
``KvGet.decode`` the same value or the same refusal as the ``Reader`` they skip, for
any bytes; the server's connection lets through a READY connection's commands
exactly as the state table does."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol as P
from protocol._connection import ProtocolConnection, Role, State
from protocol._state import command_allowed
from protocol._wire import short_str, u64
from protocol._wire import Reader

texts = st.text(max_size=30)
headers = st.dictionaries(st.text(min_size=1, max_size=20), texts, max_size=4)
ns = st.integers(0, 2**63 - 1)
entries = st.fixed_dictionaries({
    "subject": texts,
    "revision": st.integers(1, 2**64 - 1),
    "latest": st.booleans(),
    "operation": st.sampled_from(["PUT", "DEL", "PURGE", "EXPIRED", "REMOVE"]),
    "value": st.binary(max_size=300),
    "headers": headers,
    "created": ns,
    "ttl": st.integers(0, 2**63 - 1),
    "deadline": ns,
    "ttl_remaining_ms": st.none() | st.integers(0, 2**40),
})


@given(entries)
@settings(max_examples=300)
def test_packed_entry_is_the_encoded_map(entry: dict[str, Any]) -> None:
    assert P.InfoMap.pack(entry) == P.InfoMap(entry).encode()
    assert P.InfoMap.values_of(P.InfoMap.pack(entry)) == entry


def test_packing_after_a_failed_map_starts_afresh() -> None:
    try:
        P.InfoMap.pack({"bad": object()})
    except TypeError:
        pass
    else:  # pragma: no cover
        raise AssertionError("an object cannot be packed")
    assert P.InfoMap.pack({"a": 1}) == P.InfoMap({"a": 1}).encode()
    assert P.InfoMap.pack({}) == P.InfoMap({}).encode() == b"\0\0\0\0"


def _outcome(fn: Any, payload: bytes) -> Any:
    try:
        return ("ok", fn(payload))
    except P.BrokerError as err:
        return ("error", err.code, err.message)


def _values_by_reader(payload: bytes) -> dict[str, object]:
    r = Reader(payload, "info response")
    out = r.map(limit=len(payload))
    r.end()
    return out


maps = st.one_of(
    entries.map(P.InfoMap.pack),
    st.binary(max_size=40),
    st.binary(max_size=40).map(lambda b: len(b).to_bytes(4, "little") + b),  # the right length, any bytes
    st.sampled_from([
        b"\x04\0\0\0\x93\x01\x02\x03",  # an array, not a map
        b"\x03\0\0\0\x81\x01\x02",  # a map with an integer key
        b"\x03\0\0\0\x81\xa1",  # a map cut short
        b"\x04\0\0\0\x80\x80\x80\x80",  # a map and bytes after it
        b"\x00\0\0\0",  # the empty map
    ]),
)


@given(maps)
@settings(max_examples=500)
def test_info_map_values_as_the_reader_reads_them(payload: bytes) -> None:
    assert _outcome(P.InfoMap.values_of, payload) == _outcome(_values_by_reader, payload)


def _kv_get_by_reader(payload: bytes) -> P.KvGet:
    r = Reader(payload, "KV_GET")
    out = P.KvGet(r.ident(), r.ident(), r.short_str("subject"), r.u64())
    r.end()
    return out


idents = st.one_of(st.integers(1, 2**32 - 1), st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True)).map(P.Identifier.of)
kv_gets = st.builds(P.KvGet, idents, idents, st.text(max_size=40), st.integers(0, 2**64 - 1)).map(lambda c: c.encode())
payloads = st.one_of(
    kv_gets,
    st.tuples(kv_gets, st.integers(0, 60)).map(lambda t: t[0][: t[1]]),  # cut short anywhere
    st.tuples(kv_gets, st.binary(min_size=1, max_size=3)).map(lambda t: t[0] + t[1]),  # bytes after it
    st.tuples(kv_gets, st.integers(0, 50), st.integers(0, 255)).map(  # one byte changed
        lambda t: t[0][: t[1]] + bytes([t[2]]) + t[0][t[1] + 1 :]
    ),
    st.binary(max_size=60),
)


@given(payloads)
@settings(max_examples=1000)
def test_kv_get_decodes_as_the_reader_reads_it(payload: bytes) -> None:
    assert _outcome(P.KvGet.decode, payload) == _outcome(_kv_get_by_reader, payload)


def test_a_ready_connection_takes_every_command_but_the_handshake() -> None:
    """``_server_event`` skips the state table for a READY connection's commands
    other than the handshake: the table must allow every one of them."""
    for code in P.COMMAND_TYPES:
        assert command_allowed(State.READY, code) == (code != P.Command.HANDSHAKE)
    conn = ProtocolConnection(Role.SERVER)
    conn.state = State.READY
    conn.receive_data(P.encode_frame(P.Command.HANDSHAKE, 0, 9, 0, P.Handshake(1).encode()))
    event = conn.next_event()
    assert isinstance(event, P.InvalidRequest)
    assert (event.error.code, event.error.message) == (P.ErrorCode.MALFORMED_PAYLOAD, "the handshake was already done on this connection")


def _subject_outcome(fn: Any, subject: str) -> Any:
    try:
        return ("ok", fn(subject))
    except Exception as err:  # noqa: BLE001 - the same refusal, whatever it is
        return ("error", type(err), str(err))


subject_chars = st.sampled_from(["a", "Z", "9", "$", "-", ".", ".", "*", ">", " ", "\t", "\x00", "\x1f", "\x7f", "\x85", "é", "\ud800", "€"])
subjects = st.one_of(
    st.lists(subject_chars, max_size=70).map("".join),
    st.lists(st.sampled_from(["ab", "*", ">", "a*", ">b", "", "x" * 40]), max_size=5).map(".".join),
    st.text(max_size=80),
)


@given(subjects)
@settings(max_examples=1000)
def test_subjects_accepted_at_a_glance_are_those_the_checks_accept(subject: str) -> None:
    from protocol._subjects import _check_subject, validate_subject

    assert _subject_outcome(validate_subject, subject) == _subject_outcome(_check_subject, subject)


def test_kv_get_targets_are_remembered_within_a_bound() -> None:
    from protocol import _commands

    for n in range(1, _commands._KV_TARGETS_MAX * 2 + 2):
        cmd = P.KvGet(P.Identifier.of("kv"), P.Identifier.of(n), f"$KV.b{n}.k", n)
        assert P.KvGet.decode(cmd.encode()) == cmd
        assert P.KvGet.decode(cmd.encode()) == cmd  # remembered, or forgotten at the bound
        assert len(_commands._KV_TARGETS) <= _commands._KV_TARGETS_MAX


def test_the_fast_decode_builds_the_same_frozen_command() -> None:
    """``KvGet.decode`` fills the slots itself (no dataclass ``__init__``): the object
    is a KvGet like any other, equal, hashable and frozen."""
    cmd = P.KvGet(P.Identifier.of("kv"), P.Identifier.of(7), "$KV.b.k", 2**64 - 1)
    got = P.KvGet.decode(cmd.encode())
    assert type(got) is P.KvGet and got == cmd and hash(got) == hash(cmd) and repr(got) == repr(cmd)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.subject = "x"  # type: ignore[misc]


@given(st.binary(max_size=12), st.text(max_size=300), st.integers(0, 2**64 - 1))
def test_the_client_payload_is_the_layout(target: bytes, subject: str, revision: int) -> None:
    """``KvGet.payload`` (a client's KV get) is ``target | str8 subject | u64
    revision`` byte for byte, and a subject over 255 bytes is refused as before."""
    try:
        want: object = target + short_str(subject, "subject") + u64(revision)
    except P.BrokerError as e:
        want = (e.code, e.message)
    try:
        got: object = P.KvGet.payload(target, subject, revision)
    except P.BrokerError as e:
        got = (e.code, e.message)
    assert got == want


@given(payloads)
@settings(max_examples=500)
def test_kv_get_split_gives_the_parts_decode_reads(payload: bytes) -> None:
    """``KvGet.split`` (the session's run of gets) reads what ``decode`` reads, in
    place: the identifiers' bytes, the subject's bytes and the revision of any payload
    that decode accepts (the identifiers as sent, which may be spelled another way
    than their encoding)."""
    parts = P.KvGet.split(payload)
    try:
        r = Reader(payload, "KV_GET")
        stream, topic, subject, revision = r.ident(), r.ident(), r.short_str("subject"), r.u64()
        r.end()
    except P.BrokerError:
        return  # decode refuses it: split may still have found lengths that add up
    assert parts is not None
    target, key, rev = parts
    assert (key, rev) == (subject.encode(), revision)
    assert target + bytes([len(key)]) + key + rev.to_bytes(8, "little") == payload
    assert P.KvGet.decode(target + P.KvGet.payload(b"", subject, revision)) == P.KvGet(stream, topic, subject, revision)


def test_kv_get_split_refuses_what_does_not_add_up() -> None:
    payload = P.KvGet(P.Identifier.of("kv"), P.Identifier.of("b"), "$KV.b.k", 9).encode()
    assert P.KvGet.split(payload) == (P.Identifier.of("kv").encode() + P.Identifier.of("b").encode(), b"$KV.b.k", 9)
    assert P.KvGet.split(payload[:-1]) is None and P.KvGet.split(payload + b"\x00") is None
    assert P.KvGet.split(b"") is None and P.KvGet.split(payload[:3]) is None
