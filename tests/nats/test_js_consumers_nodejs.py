"""A second language for consumers: nats.js under Node (tests/nats/js, installed by
``test_js_nodejs.node_nats``) pulls from a durable consumer with acks, takes push consumers with acks and a
queue group, and makes, writes and watches a bucket with its own KV API, on
ttlbroker's NATS listener. The
expected values are what the same script prints against nats-server 2.15."""

from __future__ import annotations

from pathlib import Path

from test_js_nodejs import _node, node_nats  # noqa: F401 (the fixture that installs nats.js)


async def test_nodejs_pull_consumer_and_kv_watch(node_nats: Path, nats_url: str) -> None:  # noqa: F811
    out = await _node(node_nats / "consumer_kv.mjs", nats_url)
    assert out["fetched"] == [["nj.0", "m0", 1, 1, 3], ["nj.1", "m1", 2, 1, 2], ["nj.2", "m2", 3, 1, 1]]
    assert out["info"] == {"delivered": [3, 3], "ack_floor": [3, 3], "num_pending": 1, "num_ack_pending": 0}
    # kv.watch(): the last value of each key, then every change (key, operation,
    # value, revision, delta), and kv.get after the watch.
    assert out["watched"] == [["a", "PUT", "1", 2, 0], ["b", "PUT", "2", 3, 0], ["a", "DEL", "", 4, 0]]
    assert out["got"] == ["2", "DEL"]


async def test_nodejs_push_consumers_with_acks_and_a_queue_group(node_nats: Path, nats_url: str) -> None:  # noqa: F811
    """nats.js's ``js.subscribe`` with ``consumerOpts``: a durable push consumer with
    manual acks, and two subscriptions of one durable with a deliver group."""
    out = await _node(node_nats / "push.mjs", nats_url)
    assert out["got"] == [[f"np.a.{i}", f"m{i}", 1] for i in range(4)]
    assert out["info"]["num_ack_pending"] == 0 and out["info"]["num_pending"] == 0
    a, b = out["jobs"]["a"], out["jobs"]["b"]
    assert sorted(a + b, key=lambda j: int(j[1:])) == [f"j{i}" for i in range(40)]
    assert a and b and not set(a) & set(b)
    assert out["workers"] == {"deliver_group": "workers", "delivered": 44}


def test_hpub_with_no_header_block_is_a_message_without_headers() -> None:
    """nats.js publishes a message without headers as ``HPUB subject reply 0 size``
    (nats-server accepts a header size of 0): the parser takes it, without headers."""
    from protocol.nats import NatsParser, NatsPub

    p = NatsParser()
    p.receive_data(b"HPUB nj.a _INBOX.x 0 2\r\nhi\r\n")
    ev = p.next_event()
    assert isinstance(ev, NatsPub) and (ev.subject, ev.reply, ev.headers, ev.payload) == ("nj.a", "_INBOX.x", b"", b"hi")
