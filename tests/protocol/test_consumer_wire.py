"""The consumers' hot path on the wire (``protocol/_consumers.py``): pulled batches,
as the broker frames them from stored records and as the client decodes them, and
ack frames."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import protocol as P
from protocol._consumers import PulledRun, expand_runs, pull_entries

_MESSAGES = st.lists(
    st.tuples(
        st.sampled_from(["a", "orders.eu.1", "é.x"]),
        st.binary(max_size=40),
        st.sampled_from([b"", P.encode_headers({"K": "v"}), P.encode_headers([("Nats-TTL", "5s"), ("X", "é")])]),
        st.integers(0, P.TTL_NEVER),
        st.integers(0, 15),
    ),
    max_size=12,
)


def _records(messages: list[tuple[str, bytes, bytes, int, int]], first: int) -> list[bytes]:
    return [
        P.encode_record(first + k, 1_000 + k, P.encode_body(s, p, h, ttl, flags))
        for k, (s, p, h, ttl, flags) in enumerate(messages)
    ]


class _Mine(P.PulledMessage):
    __slots__ = ("extra",)


@given(_MESSAGES, st.integers(0, 3), st.integers(1, 2**40), st.integers(0, 2**40), st.booleans())
def test_pulled_batch_round_trip(messages, partition, first, dseq, subclass) -> None:  # type: ignore[no-untyped-def]
    pulled = []
    for k, (s, p, h, ttl, flags) in enumerate(messages):
        m = P.PulledMessage(s, p, h, first + k, 1_000 + k, ttl, flags, partition, 7, 9)
        m.consumer_seq, m.num_delivered, m.pending = dseq + k, 1 + k % 3, 2**33 + k
        pulled.append(m)
    payload = P.PullBatch(int(P.PullEnd.EXPIRED), 7, 9, tuple(pulled)).encode()
    got = P.PullBatch.decode(payload, _Mine if subclass else None)
    assert (got.status, got.stream_id, got.topic_id) == (P.PullEnd.EXPIRED, 7, 9)
    assert len(got.messages) == len(pulled)
    for g, m in zip(got.messages, pulled):
        assert type(g) is (_Mine if subclass else P.PulledMessage)
        for slot in P.Message.__slots__ + P.PulledMessage.__slots__:
            if slot != "_reply":  # (set only on a core delivery of a request's messages)
                assert getattr(g, slot) == getattr(m, slot), slot  # every slot filled, none left unset
        assert g.reply is None
        assert g == m  # every Message field
        assert (g.consumer_seq, g.num_delivered, g.pending) == (m.consumer_seq, m.num_delivered, m.pending)
        assert g.headers == (P.decode_headers(m.headers_raw) if m.headers_raw else {})


@given(_MESSAGES, st.integers(0, 3), st.integers(1, 2**40), st.integers(-3, 20), st.integers(0, 600), st.booleans())
def test_pull_entries_frame_stored_records(messages, partition, dseq, pending, budget, free) -> None:  # type: ignore[no-untyped-def]
    """What the broker sends for a run of stored records: each record as stored, byte
    for byte, behind its entry head, while the budget lasts (the first one always
    when ``free``); the client decodes it back."""
    records = _records(messages, 100)
    parts: list[bytes | memoryview] = [b"head"]
    k, size, hit = pull_entries(parts, memoryview(b"".join(records)), partition, dseq, pending, budget, free)
    # The reference: record by record.
    want_k, used = 0, 0
    for rec in records:
        if (want_k or not free) and used + len(rec) > budget:
            break
        used += len(rec)
        want_k += 1
    assert (k, size, hit) == (want_k, used, want_k < len(records))
    assert parts[0] == b"head" and len(parts) == 1 + 2 * k
    assert [bytes(p) for p in parts[2::2]] == records[:k]
    got = P.PullBatch.decode(P.encode_pull_batch(0, 1, 2, k, parts[1:]))
    for j, m in enumerate(got.messages):
        assert (m.partition, m.offset, m.consumer_seq, m.num_delivered) == (partition, 100 + j, dseq + j, 1)
        assert m.pending == max(pending - 1 - j, 0)
        assert (m.subject, m.payload, m.headers_raw) == messages[j][:3]


@given(_MESSAGES, st.integers(0, 3), st.integers(1, 2**40), st.integers(-3, 20), st.integers(0, 600))
def test_a_pulled_run_expands_to_the_entries_pull_entries_gives(messages, partition, dseq, pending, extra) -> None:  # type: ignore[no-untyped-def]
    """The consumer engine's pulls (``broker.consumers``) put a ``PulledRun`` and the
    run where the whole run fits its budget: ``expand_runs`` gives for it what
    ``pull_entries`` would have appended (every record taken, none hit the budget),
    entries around it kept."""
    records = _records(messages, 100)
    run = memoryview(b"".join(records))
    expected: list[bytes | memoryview] = []
    k, size, hit = pull_entries(expected, run, partition, dseq, pending, len(run) + extra, True)
    assert (k, size, hit) == (len(records), len(run), False)
    parts = [b"head", b"record", PulledRun(partition, dseq, len(records), pending), run]
    got = expand_runs(parts)
    assert [bytes(p) for p in got] == [b"head", b"record"] + [bytes(p) for p in expected]


def _batch_error(payload: bytes) -> str:
    with pytest.raises(P.BrokerError) as exc:
        P.PullBatch.decode(payload)
    assert exc.value.code == P.ErrorCode.MALFORMED_PAYLOAD
    return exc.value.message


def test_malformed_pulled_batches() -> None:
    rec = P.encode_record(1, 2, P.encode_body("a", b"xyz"))
    entry = P.encode_pull_entry(0, 1, 1, 0)
    good = P.encode_pull_batch(1, 1, 1, 1, [entry, rec])
    assert len(P.PullBatch.decode(good).messages) == 1
    assert _batch_error(good[:-1]) == "PULL batch: a record's lengths do not add up"
    assert _batch_error(good[:30]) == "PULL batch: payload truncated"
    assert _batch_error(good + b"!") == "PULL batch: bytes after the last message"
    assert _batch_error(P.encode_pull_batch(9, 1, 1, 1, [entry, rec])) == "PULL batch: unknown status 9"
    longer = bytearray(good)
    longer[13 + 24] += 1  # the record's length field says one byte more than it holds
    assert _batch_error(bytes(longer)) == "PULL batch: a record's lengths do not add up"


_ENTRIES = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)), max_size=20)


@given(_ENTRIES, st.booleans())
def test_ack_frames_round_trip(entries, sync) -> None:  # type: ignore[no-untyped-def]
    cmd = P.AckMessages(P.Identifier.of("s"), P.Identifier.of(3), "c", tuple(entries), P.ACK_SYNC if sync else 0)
    assert P.AckMessages.decode(cmd.encode()) == cmd


@given(_ENTRIES, st.integers(0, 19), st.integers(4, 255))
def test_an_unknown_ack_kind_is_refused_with_the_first_one_named(entries, at, kind) -> None:  # type: ignore[no-untyped-def]
    entries = list(entries) or [(0, 0, 1, 0)]
    at %= len(entries)
    entries[at] = (kind, *entries[at][1:])
    payload = P.AckMessages(P.Identifier.of("s"), P.Identifier.of("t"), "c", tuple(entries)).encode()
    with pytest.raises(P.BrokerError) as exc:
        P.AckMessages.decode(payload)
    first = next(e[0] for e in entries if e[0] > 3)
    assert (exc.value.code, exc.value.message) == (P.ErrorCode.MALFORMED_PAYLOAD, f"ACK: unknown ack kind {first}")
