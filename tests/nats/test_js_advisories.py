"""JetStream advisories (``broker/nats/_advisories.py``): what nats-server publishes on
``$JS.EVENT.ADVISORY.>``, published by ttlbroker, seen by real clients: nats-py
applications (a dead-letter queue built from advisories, as NATS users build one),
the bundled client's consumers, and the real ``nats-server`` doing the same steps.

Ack waits run in virtual time (``mock_clock``, moved from nats-py's thread by
:func:`jump`): a redelivery "after 30 s" takes no real time.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import trio
import trio.testing
from conftest import make_config, start_server
from helpers import in_asyncio, subscribed
from nats.js import api

from protocol.nats import advisories as A
from protocol.nats import term_reason
from broker.client import connect as ttl_connect

STREAM = "ORDERS"
RFC3339_NS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z")


def jump(seconds: float) -> None:
    """Move the broker's virtual time on (from nats-py's thread); every timer that
    fell due runs."""

    async def advance() -> None:
        trio.lowlevel.current_clock().jump(seconds)  # type: ignore[attr-defined]
        await trio.testing.wait_all_tasks_blocked()

    trio.from_thread.run(advance)


class Heard:
    """What a nats-py subscription got, in order: (subject, the JSON of an advisory)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.event = asyncio.Event()

    async def cb(self, msg: Any) -> None:
        self.got.append((msg.subject, json.loads(msg.data) if msg.subject.startswith("$JS.EVENT.") else {}))
        self.event.set()

    async def until(self, subject: str, timeout: float = 5) -> dict[str, Any]:
        """The first advisory on ``subject`` (waiting for it)."""
        async def first() -> dict[str, Any]:
            while True:
                for s, doc in self.got:
                    if s == subject:
                        return doc
                self.event.clear()
                await self.event.wait()

        try:
            return await asyncio.wait_for(first(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"no advisory on {subject} within {timeout} s; heard {self.subjects()}") from None

    def subjects(self) -> list[str]:
        return [s for s, _ in self.got]


def advisory_config(data_dir: Path, **more: Any) -> Any:
    return make_config(data_dir, **{"nats.enabled": True, **more})


# -- the dead-letter queue, as an application builds it ---------------------------------


async def _dead_letters(url: str, timeout_path: bool) -> dict[str, Any]:
    """A nats-py application's dead-letter queue: it listens for max-deliveries and
    terminated advisories and copies each message they name (``js.get_msg`` by
    ``stream_seq``) to its DLQ list. A worker NAKs ``bad`` (or, with
    ``timeout_path``, never answers it and lets ``ack_wait`` run out) and terminates
    ``poison`` with a reason."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    dlq: list[tuple[str, str, bytes, int, str]] = []

    async def on_advisory(msg: Any) -> None:
        adv = json.loads(msg.data)
        stored = await js.get_msg(adv["stream"], adv["stream_seq"])
        dlq.append((adv["type"], stored.subject, stored.data, adv["deliveries"], adv.get("reason", "")))

    await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>", cb=on_advisory)
    await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>", cb=on_advisory)
    await subscribed(nc)
    await js.add_stream(name=STREAM, subjects=["orders.>"])
    await js.add_consumer(STREAM, api.ConsumerConfig(durable_name="work", ack_policy="explicit", max_deliver=2, ack_wait=30))
    await js.publish("orders.bad", b"cannot parse")
    await js.publish("orders.poison", b"never")
    await js.publish("orders.good", b"fine")
    worker = await js.pull_subscribe_bind("work", STREAM)
    out: dict[str, Any] = {"deliveries": []}
    for batch in (3, 1):  # all three, then bad again
        for m in await worker.fetch(batch, timeout=2):
            out["deliveries"].append((m.subject, m.metadata.num_delivered))
            if m.subject == "orders.good":
                await m.ack_sync()
            elif m.subject == "orders.poison":
                await nc.request(m.reply, b"+TERM unparseable payload", timeout=5)
            elif not timeout_path:
                await m.nak()
        if timeout_path:
            jump(31)  # past bad's ack wait
    await nc.flush()
    try:
        out["third"] = [m.subject for m in await worker.fetch(1, timeout=0.3)]
    except nats.errors.TimeoutError:
        out["third"] = []
    for _ in range(100):
        if len(dlq) >= 2:
            break
        await asyncio.sleep(0.02)
    info = await js.consumer_info(STREAM, "work")
    out["pending"] = (info.num_ack_pending, info.num_pending)
    out["dlq"] = sorted(dlq)
    await nc.close()
    return out


@pytest.mark.parametrize("timeout_path", [False, True], ids=["nak", "ack_wait"])
async def test_a_dead_letter_queue_built_from_advisories_works_unchanged(
    mock_clock: Any, data_dir: Path, timeout_path: bool,
) -> None:
    async with start_server(advisory_config(data_dir)) as handle:
        r = await in_asyncio(_dead_letters, handle.nats_url, timeout_path)
        counters = handle.broker.counters
        assert (counters.advisories_max_deliveries, counters.advisories_terminated) == (1, 1)
        # Counted when they reach someone: nobody listens for the NAKs or the API.
        assert (counters.advisories_nak, counters.advisories_api_audit, counters.advisories_stream_action) == (0, 0, 0)
    assert ("orders.bad", 2) in r["deliveries"] and ("orders.bad", 3) not in r["deliveries"]
    assert r["third"] == []  # given up after max_deliver, whichever way the last delivery ended
    assert r["pending"] == (0, 0)
    assert r["dlq"] == [
        ("io.nats.jetstream.advisory.v1.max_deliver", "orders.bad", b"cannot parse", 2, ""),
        ("io.nats.jetstream.advisory.v1.terminated", "orders.poison", b"never", 1, "unparseable payload"),
    ]


# -- the same advisories as nats-server ---------------------------------------------------


async def _lifecycle(url: str) -> dict[str, Any]:
    """Streams and consumers created, updated and deleted, a NAK, a give-up and a
    term, with a stream capturing the consumer advisories; every advisory heard."""
    nc = await nats.connect(url, name="auditor")
    heard = Heard()
    await nc.subscribe("$JS.EVENT.ADVISORY.>", cb=heard.cb)
    await subscribed(nc)
    js = nc.jetstream()
    await js.add_stream(name="EVENTS", subjects=["$JS.EVENT.ADVISORY.CONSUMER.>"])
    await js.add_stream(name="S", subjects=["s.>"])
    await js.update_stream(api.StreamConfig(name="S", subjects=["s.>"], max_msgs=100))
    await js.stream_info("S")
    # (lower-case consumer names: ttlbroker's are case-insensitive and reported lower-cased)
    cfg = api.ConsumerConfig(durable_name="c", ack_policy="explicit", max_deliver=2, ack_wait=30)
    await js.add_consumer("S", cfg)
    await js.add_consumer("S", cfg)  # the same again: no consumer advisory
    await js.add_consumer("S", api.ConsumerConfig(durable_name="c", ack_policy="explicit", max_deliver=2, ack_wait=30,
                                                  description="updated"))  # an update: no consumer advisory either
    await js.publish("s.1", b"one")
    sub = await js.pull_subscribe_bind("c", "S")
    for _ in range(2):
        for m in await sub.fetch(1, timeout=2):
            await m.nak()
    try:
        await sub.fetch(1, timeout=0.3)  # (nats-server gives up when it would redeliver)
    except nats.errors.TimeoutError:
        pass
    await js.publish("s.2", b"two")
    for m in await sub.fetch(1, timeout=2):
        await nc.request(m.reply, b"+TERM  no good ", timeout=5)
    await js.add_consumer("S", api.ConsumerConfig(durable_name="d", ack_policy="explicit"))
    await js.delete_consumer("S", "c")
    await js.delete_stream("S")  # d goes with it
    await heard.until("$JS.EVENT.ADVISORY.STREAM.DELETED.S")
    await heard.until("$JS.EVENT.ADVISORY.CONSUMER.DELETED.S.d")
    first = await js.get_msg("EVENTS", 1)  # (a message get that finds its message is not audited)
    stored = (await js.stream_info("EVENTS")).state.messages
    for _ in range(250):  # (its audit follows the answer on nats-server)
        if any(d.get("subject") == "$JS.API.STREAM.INFO.EVENTS" for _, d in heard.got):
            break
        await asyncio.sleep(0.02)
    await nc.close()
    return {"heard": heard.got, "stored": stored, "first": (first.subject, json.loads(first.data)["type"])}


def _shape(heard: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, tuple[str, ...], tuple[str, ...], str]]:
    """Each advisory as (subject, its keys, its client's keys but ``rtt``, the API
    subject audited), in a stable order (the two servers send some from different
    queues)."""
    out = []
    for subject, doc in heard:
        client = doc.get("client") or {}
        out.append((subject, tuple(sorted(doc)), tuple(sorted(k for k in client if k != "rtt")), doc.get("subject", "")))
    return sorted(out)


async def test_the_same_advisories_as_nats_server(mock_clock: Any, data_dir: Path, tmp_path: Path) -> None:
    """The same nats-py steps against nats-server and ttlbroker give the same
    advisories: the same subjects, the same JSON keys (the client's too, but for
    ``rtt``, which ttlbroker does not measure), the same API requests audited, and
    the same consumer advisories stored by a stream that captures them. Ids,
    timestamps and server names differ by nature and are not compared."""
    from test_remote_origin import run_nats_server

    real_dir = tmp_path / "real"
    real_dir.mkdir()
    with run_nats_server(real_dir) as (_proc, port):
        theirs = await in_asyncio(_lifecycle, f"nats://127.0.0.1:{port}")
    async with start_server(advisory_config(data_dir, **{"nats.domain": "hub"})) as handle:
        ours = await in_asyncio(_lifecycle, handle.nats_url)
    assert _shape(ours["heard"]) == _shape(theirs["heard"])
    assert ours["stored"] == theirs["stored"] == 8  # created C and D, 2 NAKs, max deliveries, term, deleted C and D
    assert ours["first"] == theirs["first"] == ("$JS.EVENT.ADVISORY.CONSUMER.CREATED.S.c", "io.nats.jetstream.advisory.v1.consumer_action")
    docs = {(s, d.get("subject", "")): d for s, d in ours["heard"]}
    assert docs[("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.S.c", "")] | {"id": "", "timestamp": ""} == {
        "type": "io.nats.jetstream.advisory.v1.terminated", "id": "", "timestamp": "", "stream": "S", "consumer": "c",
        "consumer_seq": 3, "stream_seq": 2, "deliveries": 1, "reason": "no good", "domain": "hub"}
    assert docs[("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.S.c", "")]["deliveries"] == 2
    naks = [d for s, d in ours["heard"] if s == "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.S.c"]
    assert [(d["consumer_seq"], d["stream_seq"], d["deliveries"]) for d in naks] == [(1, 1, 1), (2, 1, 2)]
    audit = docs[(A.API_AUDIT_SUBJECT, "$JS.API.STREAM.UPDATE.S")]
    assert json.loads(audit["request"])["max_msgs"] == 100
    assert json.loads(audit["response"])["config"]["max_msgs"] == 100
    assert audit["client"]["name"] == "auditor" and audit["client"]["lang"] == "python3" and audit["server"] == "ttlbroker"
    assert "request" not in docs[(A.API_AUDIT_SUBJECT, "$JS.API.STREAM.DELETE.S")]  # an empty body is left out
    ids = [d["id"] for _, d in ours["heard"]]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[0-9A-Za-z]{22}", i) for i in ids)
    assert all(RFC3339_NS.fullmatch(d["timestamp"]) for _, d in ours["heard"])


# -- cost, permissions, the binary protocol's consumers, counters --------------------------


async def test_nothing_is_built_while_nobody_could_hear_an_advisory(mock_clock: Any, data_dir: Path) -> None:
    """With no subscription and no topic that could take a ``$JS.EVENT`` subject, the
    broker builds no advisory (its id generator never moves) and counts none; a
    subscription to another ``$JS`` subject changes nothing."""

    async def steps(url: str) -> None:
        nc = await nats.connect(url)
        await nc.subscribe("$JS.API.>")  # (a monitor of the API, not of the events)
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=["orders.>"])
        await js.add_consumer(STREAM, api.ConsumerConfig(durable_name="w", max_deliver=1))
        await js.publish("orders.1", b"x")
        sub = await js.pull_subscribe_bind("w", STREAM)
        for m in await sub.fetch(1, timeout=2):
            await m.nak()
        await js.delete_stream(STREAM)
        await nc.close()

    async with start_server(advisory_config(data_dir)) as handle:
        ids = handle.services.jetstream.advisories.ids
        before = (ids.prefix, ids.seq)
        await in_asyncio(steps, handle.nats_url)
        assert (ids.prefix, ids.seq) == before
        assert {k: v for k, v in handle.broker.counters.as_dict().items() if k.startswith("advisories_")} == dict.fromkeys(
            [f"advisories_{k}" for k in ("max_deliveries", "terminated", "nak", "consumer_action", "stream_action", "api_audit")], 0)
        assert handle.broker.counters.consumer_given_up == 1


PERMISSIONS = [
    {"user": "admin", "password": "a", "permissions": {}},
    # Everything but the events (a subscription to > is allowed: each delivery is checked).
    {"user": "app", "password": "b", "permissions": {"subscribe": {"allow": [">"], "deny": ["$JS.EVENT.>"]}}},
]


async def test_subscribe_permissions_gate_advisories(data_dir: Path) -> None:
    """A user whose subscribe permissions exclude ``$JS.EVENT.>`` gets no advisory on
    a wider subscription (nor may it subscribe to them: the server's permissions
    violation), while a user allowed everything gets them, with its user name in the
    audit's client info."""

    async def steps(url: str) -> dict[str, Any]:
        admin = await nats.connect(url.replace("nats://", "nats://admin:a@"))
        errors: list[Exception] = []

        async def on_error(e: Exception) -> None:
            errors.append(e)

        app = await nats.connect(url.replace("nats://", "nats://app:b@"), error_cb=on_error)
        mine, theirs = Heard(), Heard()
        await admin.subscribe("$JS.EVENT.ADVISORY.>", cb=mine.cb)
        await app.subscribe(">", cb=theirs.cb)
        await app.subscribe("$JS.EVENT.ADVISORY.API")
        await subscribed(admin)
        await subscribed(app)
        await app.jetstream().add_stream(name=STREAM, subjects=["orders.>"])
        audit = await mine.until(A.API_AUDIT_SUBJECT)
        await admin.publish("ping", b"")  # a core message, which reaches app's > after the advisories
        await admin.flush()
        await theirs.until("ping")
        out = {"mine": mine.subjects(), "theirs": theirs.subjects(), "user": audit["client"].get("user"),
               "errors": [str(e) for e in errors]}
        await app.close()
        await admin.close()
        return out

    config = make_config(data_dir, **{"nats.enabled": True, "limits.auth_failure_delay": 0, "auth.users": PERMISSIONS})
    async with start_server(config) as handle:
        r = await in_asyncio(steps, handle.nats_url)
    assert r["mine"] == [f"$JS.EVENT.ADVISORY.STREAM.CREATED.{STREAM}", A.API_AUDIT_SUBJECT]
    assert not any(s.startswith("$JS.EVENT.") for s in r["theirs"]) and "ping" in r["theirs"]
    assert r["user"] == "app"
    assert any("permissions violation for subscription to \"$js.event.advisory.api\"" in e.lower() for e in r["errors"])


async def test_the_binary_protocols_consumers_publish_the_same_advisories(mock_clock: Any, data_dir: Path) -> None:
    """A consumer created through the binary protocol on a NATS stream's topic is a
    JetStream consumer: its creation, NAKs, give-ups, terms and deletion are
    advisories to NATS subscribers (and to our own client's subscriptions), and
    they are counted in the broker's stats and /metrics."""

    async def listen(url: str, ready: trio.Event) -> list[tuple[str, dict[str, Any]]]:
        nc = await nats.connect(url)
        heard = Heard()
        await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.>", cb=heard.cb)
        await subscribed(nc)
        trio.from_thread.run_sync(ready.set)
        await heard.until("$JS.EVENT.ADVISORY.CONSUMER.DELETED.orders.work")
        await nc.close()
        return heard.got

    config = advisory_config(data_dir, **{"http.port": -1, "http.host": "127.0.0.1"})
    async with start_server(config) as handle, ttl_connect(handle.address) as client:
        await client.create_stream("nats")  # the NATS streams' namespace ([nats] stream)
        await client.create_topic("nats", "orders", partitions=1, subjects=["orders.>"])
        sub = await client.subscribe("$JS.EVENT.ADVISORY.CONSUMER.>")
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            got: list[Any] = []

            async def run_listener() -> None:
                got.extend(await in_asyncio(listen, handle.nats_url, ready))

            nursery.start_soon(run_listener)
            await ready.wait()
            await client.create_consumer("nats", "orders", "work", max_deliver=2)
            await client.publish("orders.1", b"a")
            await client.publish("orders.2", b"b")
            for batch in (2, 1):  # both, then orders.1 again
                for m in await client.pull("nats", "orders", "work", batch=batch, expires=1):
                    await (m.nak(sync=True) if m.subject == "orders.1" else m.term(sync=True))
            assert await client.pull("nats", "orders", "work", no_wait=True) == []
            await client.delete_consumer("nats", "orders", "work")
        ours = []
        with trio.fail_after(5):
            async for msg in sub:
                ours.append(msg.subject)
                if msg.subject.endswith("DELETED.orders.work"):
                    break
        stats = await client.stats()
        async with httpx.AsyncClient(base_url=handle.monitoring_url or "", timeout=10) as http:
            metrics = (await http.get("/metrics")).text
    pre = "$JS.EVENT.ADVISORY.CONSUMER."
    assert [s for s, _ in got] == [
        pre + "CREATED.orders.work", pre + "MSG_NAKED.orders.work", pre + "MSG_TERMINATED.orders.work",
        pre + "MSG_NAKED.orders.work", pre + "MAX_DELIVERIES.orders.work", pre + "DELETED.orders.work",
    ]
    assert ours == [s for s, _ in got]
    docs = [d for _, d in got]
    assert (docs[2]["stream_seq"], docs[2]["deliveries"], "reason" in docs[2]) == (2, 1, False)
    assert (docs[4]["stream_seq"], docs[4]["deliveries"]) == (1, 2)
    assert (stats["advisories_nak"], stats["advisories_max_deliveries"], stats["advisories_terminated"],
            stats["advisories_consumer_action"]) == (2, 1, 1, 2)
    assert "ttlbroker_advisories_nak_total 2.0" in metrics
    assert "ttlbroker_advisories_consumer_action_total 2.0" in metrics


# -- the codecs ---------------------------------------------------------------------------------


def test_term_reasons_and_advisory_json_follow_nats_server() -> None:
    assert term_reason(b"+TERM") == term_reason(b"+TERM   ") == term_reason(b"+ACK") == ""
    assert term_reason(b"+TERM  bad \xff input ") == "bad \ufffd input"
    subject, body = A.delivery_terminated("S", "C", 3, 2, 1, "", "ID", 1_700_000_000_123_000_000)
    assert subject == "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.S.C"
    assert list(json.loads(body)) == ["type", "id", "timestamp", "stream", "consumer", "consumer_seq", "stream_seq", "deliveries"]
    assert json.loads(body)["timestamp"] == "2023-11-14T22:13:20.123Z"
    subject, body = A.stream_action("updated", "S", "ID", 1, "hub")
    assert (subject, json.loads(body)["action"], list(json.loads(body))[-1]) == ("$JS.EVENT.ADVISORY.STREAM.UPDATED.S", "modify", "domain")
    nuid = A.Nuid()
    ids = {nuid.next() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 22 for i in ids)
    nuid.seq = A.Nuid._MAX_SEQ - 1  # the sequence runs out: a new prefix
    prefix = nuid.prefix
    assert nuid.next()[:12] != prefix
