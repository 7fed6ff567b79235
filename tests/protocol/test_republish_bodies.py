"""The bodies of republished copies (protocol/_republish.py) against the header rules
of docs/semantics.md §13.4, built the slow way with encode_headers and encode_body."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import protocol as P
from protocol import build_records, copy_plan, encode_body, encode_headers, record_keys, republish_bodies, rfc3339_ns

header = st.tuples(st.sampled_from(["K", "Nats-Stream", "TTLB-Hops", "x-y"]), st.text("abc 7é", max_size=5))
message = st.tuples(
    st.sampled_from(["a.x", "a.y", "a.long.subject"]), st.binary(max_size=40), st.lists(header, max_size=3),
    st.integers(0, 10**19),
)


def _expected(subject: str, payload: bytes, stored: list[tuple[str, str]], offset: int, ts: int, last: int,
              headers_only: bool, hops: int) -> bytes:
    ours = [(k, v) for k, v in stored if k != "TTLB-Hops"] + [
        ("Nats-Stream", "s/t"), ("Nats-Subject", subject), ("Nats-Sequence", str(offset)),
        ("Nats-Time-Stamp", rfc3339_ns(ts)), ("Nats-Last-Sequence", str(last)),
    ]
    if headers_only:
        ours.append(("Nats-Msg-Size", str(len(payload))))
    ours.append(("TTLB-Hops", str(hops)))
    return encode_body("rp." + subject, b"" if headers_only else payload, encode_headers(ours))


@given(st.lists(message, min_size=1, max_size=6), st.integers(1, 10**18), st.integers(0, 2**63), st.booleans())
def test_copies_match_the_header_rules(messages, first_offset, ts, headers_only) -> None:  # type: ignore[no-untyped-def]
    bodies = [encode_body(s, p, encode_headers(h), ttl=7) for s, p, h, _ in messages]
    data = b"".join(bodies)
    starts = [sum(map(len, bodies[:i])) for i in range(len(bodies))]
    ends = [s + len(b) for s, b in zip(starts, bodies)]
    records, positions = build_records(data, starts, ends, first_offset, ts)
    keys = record_keys(records, positions)
    assert keys == [(s.encode(), encode_headers(h)) for s, _, h, _ in messages]
    plans = []
    for (subject, block), k in zip(keys, range(len(keys))):
        if k == 1:
            plans.append(None)  # no copy for this one
            continue
        hops = P.hops_of(block) + 1
        plans.append(copy_plan("rp." + subject.decode(), block, "s/t", subject.decode(), hops))
    lasts = [m[3] for m in messages]
    got = republish_bodies(records, positions, plans, lasts, headers_only)
    want = [
        _expected(s, p, h, first_offset + k, ts, lasts[k], headers_only, P.hops_of(encode_headers(h)) + 1)
        for k, (s, p, h, _) in enumerate(messages) if k != 1
    ]
    assert got == want
