"""Dead-letter subjects (a ttlbroker extension, ``broker/consumers/_dead_letters.py``)
through nats-py: the option goes in the raw JSON of ``$JS.API.CONSUMER.CREATE``
(nats-py's ``ConsumerConfig`` drops keys it does not know), the copies are read back
with ``js.get_msg`` from the stream that captures the subject.

Ack waits run in virtual time (``mock_clock``, moved from nats-py's thread).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import nats
import pytest
from conftest import make_config, start_server
from helpers import in_asyncio
from test_js_advisories import jump

RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z"


def config(data_dir: Path) -> Any:
    return make_config(data_dir, **{"nats.enabled": True})


async def create_consumer(nc: Any, stream: str, cfg: dict[str, Any]) -> dict[str, Any]:
    req = {"stream_name": stream, "config": cfg}
    msg = await nc.request(f"$JS.API.CONSUMER.CREATE.{stream}.{cfg['durable_name']}", json.dumps(req).encode(), timeout=5)
    return json.loads(msg.data)


async def _scenario(url: str, retention: str) -> dict[str, Any]:
    """``bad`` is NAKed until max_deliver (2) is reached, ``poison`` terminated,
    ``late`` left to its ack wait on its last delivery, ``good`` acked."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="ORDERS", subjects=["orders.>"], retention=retention)
    await js.add_stream(name="DLQ", subjects=["dlq.orders"], max_age=30 * 86400)
    made = await create_consumer(nc, "ORDERS", {
        "durable_name": "work", "ack_policy": "explicit", "max_deliver": 2, "ack_wait": 30 * 10**9,
        "dead_letter_subject": "dlq.orders",
    })
    await js.publish("orders.bad", b"cannot parse", headers={"Trace": "t1"})
    await js.publish("orders.poison", b"never")
    await js.publish("orders.late", b"slow")
    await js.publish("orders.good", b"fine")
    worker = await js.pull_subscribe_bind("work", "ORDERS")
    for m in await worker.fetch(4, timeout=2):
        if m.subject == "orders.good":
            await m.ack_sync()
        elif m.subject == "orders.poison":
            await nc.request(m.reply, b"+TERM unparseable", timeout=5)
        elif m.subject == "orders.bad":
            await m.nak()
    jump(31)  # late's first ack wait
    for m in await worker.fetch(2, timeout=2):
        if m.subject == "orders.bad":
            await nc.request(m.reply, b"-NAK", timeout=5)
    jump(31)  # late's second (last) ack wait
    await nc.flush()
    dlq = []
    n = (await js.stream_info("DLQ")).state.messages
    for seq in range(1, n + 1):
        got = await js.get_msg("DLQ", seq)
        dlq.append((got.subject, got.data, dict(got.headers or {})))
    info = json.loads((await nc.request("$JS.API.CONSUMER.INFO.ORDERS.work", b"", timeout=5)).data)
    orders = (await js.stream_info("ORDERS")).state.messages
    for _ in range(100):  # (a work queue removes a dead letter's original once its copy is durable)
        if retention == "limits" or not orders:
            break
        await asyncio.sleep(0.01)
        orders = (await js.stream_info("ORDERS")).state.messages
    await nc.close()
    return {"made": made, "dlq": dlq, "info": info, "orders": orders}


@pytest.mark.parametrize("retention", ["limits", "workqueue"])
async def test_max_deliveries_and_terminated_are_copied_once_with_their_origin(
    mock_clock: Any, data_dir: Path, retention: str,
) -> None:
    async with start_server(config(data_dir)) as handle:
        r = await in_asyncio(_scenario, handle.nats_url, retention)
        counters = handle.broker.counters
        assert (counters.dead_lettered_max_deliveries, counters.dead_lettered_terminated) == (2, 1)
    assert r["made"]["config"]["dead_letter_subject"] == "dlq.orders"
    by_subject = {h["Nats-DLQ-Subject"]: (subject, data, h) for subject, data, h in r["dlq"]}
    assert len(r["dlq"]) == 3 and set(by_subject) == {"orders.bad", "orders.poison", "orders.late"}
    subject, data, h = by_subject["orders.bad"]
    assert (subject, data) == ("dlq.orders", b"cannot parse")
    assert h["Trace"] == "t1"  # the message's own headers come along
    assert re.fullmatch(RFC3339, h.pop("Nats-DLQ-Time-Stamp"))
    assert {k: v for k, v in h.items() if k.startswith("Nats-DLQ-")} == {
        "Nats-DLQ-Stream": "ORDERS", "Nats-DLQ-Subject": "orders.bad",
        "Nats-DLQ-Partition": "0", "Nats-DLQ-Sequence": "1", "Nats-DLQ-Consumer": "work",
        "Nats-DLQ-Reason": "MaxDeliveries", "Nats-DLQ-Deliveries": "2",
    }
    assert by_subject["orders.poison"][2]["Nats-DLQ-Reason"] == "Terminated"
    assert by_subject["orders.poison"][2]["Nats-DLQ-Deliveries"] == "1"
    assert by_subject["orders.late"][2]["Nats-DLQ-Reason"] == "MaxDeliveries"
    assert r["info"]["dead_lettered"] == {"MaxDeliveries": 2, "Terminated": 1, "Expired": 0, "Limit": 0}
    assert (r["info"]["num_ack_pending"], r["info"]["num_pending"]) == (0, 0)
    # The originals stay, or go as the stream's retention says (after their copy).
    assert r["orders"] == (4 if retention == "limits" else 0)


async def test_an_invalid_dead_letter_subject_is_refused(data_dir: Path) -> None:
    async def steps(url: str) -> dict[str, Any]:
        nc = await nats.connect(url)
        await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.>"])
        got = await create_consumer(nc, "ORDERS", {"durable_name": "w", "ack_policy": "explicit", "dead_letter_subject": "dlq.*"})
        await nc.close()
        return got

    async with start_server(config(data_dir)) as handle:
        got = await in_asyncio(steps, handle.nats_url)
    assert got["error"]["err_code"] == 10012
    assert "dead_letter_subject 'dlq.*' is not a valid subject" in got["error"]["description"]


# -- the bundled client: the same option, the binary info, redrive ----------------------


async def test_bundled_client_dead_letters_and_redrive_once(mock_clock: Any, data_dir: Path) -> None:
    """Through the binary protocol: a NAK on the last allowed delivery and a term are
    copied; a dry run counts them, a redrive publishes them back on their original
    subjects (without the ``Nats-DLQ-*`` headers), and a second redrive publishes
    nothing."""
    from broker.client import connect

    async with start_server(make_config(data_dir)) as handle, connect(handle.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "work", subjects=["w.>"])
        await c.create_topic("s", "dlq", subjects=["dlq.w"])
        info = await c.create_consumer("s", "work", "w", max_deliver=1, dead_letter_subject="dlq.w")
        assert info.config["dead_letter_subject"] == "dlq.w"
        await c.publish("w.a", b"one", headers={"Trace": "t"})
        await c.publish("w.b", b"two")
        got = await c.pull("s", "work", "w", 2)
        await got[0].nak(sync=True)
        await got[1].term(sync=True)
        info = await c.consumer_info("s", "work", "w")
        assert info.dead_lettered == {"MaxDeliveries": 1, "Terminated": 1, "Expired": 0, "Limit": 0}
        f = await c.fetch("s", "dlq", 0, 1, 10)
        assert [(m.headers["Nats-DLQ-Subject"], m.headers["Nats-DLQ-Reason"], m.headers["Nats-DLQ-Stream"]) for m in f.messages] == [
            ("w.a", "MaxDeliveries", "s/work"), ("w.b", "Terminated", "s/work")]
        assert await c.redrive("s", "dlq", dry_run=True) == {"redriven": 2, "skipped": 0, "dry_run": True}
        assert await c.redrive("s", "dlq") == {"redriven": 2, "skipped": 0, "dry_run": False}
        assert await c.redrive("s", "dlq") == {"redriven": 0, "skipped": 0, "dry_run": False}
        f = await c.fetch("s", "work", 0, 3, 10)
        assert [(m.subject, m.payload, dict(m.headers)) for m in f.messages] == [
            ("w.a", b"one", {"Trace": "t"}), ("w.b", b"two", {})]
        stats = await c.stats()
        assert (stats["dead_lettered_max_deliveries"], stats["dead_lettered_terminated"], stats["dead_letters_redriven"]) == (1, 1, 2)
        # The redriven messages are new: the consumer gets them (and would dead-letter them again).
        again = await c.pull("s", "work", "w", 2)
        assert [m.offset for m in again] == [3, 4]
        with pytest.raises(Exception) as err:
            await c.redrive("s", "nope")
        assert type(err.value).__name__ == "TopicNotFoundError"


# -- removed while owed (dead_letter_expired), and $JS.API.STREAM.REDRIVE ----------------


async def test_expired_while_owed_is_copied_and_redriven_through_the_api(mock_clock: Any, data_dir: Path) -> None:
    """``dead_letter_expired`` in the raw JSON: a message whose ``Nats-TTL`` runs out
    while it is outstanding, and one that max age takes before it is delivered, are
    copied (``Expired``); the acked one is not. ``$JS.API.STREAM.REDRIVE.DLQ`` (dry
    run, then for real, then again) publishes them back once."""
    async def steps(url: str) -> dict[str, Any]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"], max_age=60, allow_msg_ttl=True)
        await js.add_stream(name="DLQ", subjects=["dlq.orders"])
        out: dict[str, Any] = {"made": await create_consumer(nc, "ORDERS", {
            "durable_name": "work", "ack_policy": "explicit", "ack_wait": 600 * 10**9,
            "dead_letter_subject": "dlq.orders", "dead_letter_expired": True,
        })}
        out["refused"] = await create_consumer(nc, "ORDERS", {"durable_name": "w2", "dead_letter_expired": True})
        await js.publish("orders.acked", b"a", headers={"Nats-TTL": "5s"})
        await js.publish("orders.held", b"h", headers={"Nats-TTL": "5s"})
        worker = await js.pull_subscribe_bind("work", "ORDERS")
        got = await worker.fetch(2, timeout=2)
        await got[0].ack_sync()
        await js.publish("orders.late", b"l")  # never fetched: max age takes it
        jump(6)
        jump(61)
        await nc.flush()
        out["dlq"] = [dict((await js.get_msg("DLQ", seq)).headers or {}) for seq in (1, 2)]
        out["info"] = json.loads((await nc.request("$JS.API.CONSUMER.INFO.ORDERS.work", b"", timeout=5)).data)

        async def redrive(body: bytes) -> dict[str, Any]:
            return json.loads((await nc.request("$JS.API.STREAM.REDRIVE.DLQ", body, timeout=5)).data)

        out["dry"] = await redrive(b'{"dry_run": true}')
        out["first"] = await redrive(b"")
        out["second"] = await redrive(b'{"dry_run": false}')
        out["bad"] = await redrive(b'{"dry_run": "yes"}')
        out["missing"] = json.loads((await nc.request("$JS.API.STREAM.REDRIVE.NOPE", b"", timeout=5)).data)
        out["orders"] = (await js.stream_info("ORDERS")).state.last_seq
        await nc.close()
        return out

    async with start_server(config(data_dir)) as handle:
        r = await in_asyncio(steps, handle.nats_url)
        assert (handle.broker.counters.dead_lettered_expired, handle.broker.counters.dead_letters_redriven) == (2, 2)
    assert r["made"]["config"]["dead_letter_expired"] is True
    assert r["refused"]["error"] == {  # (nats-server's JSConsumerCreateErrF: 500 10012)
        "code": 500, "err_code": 10012, "description": "dead_letter_expired needs a dead_letter_subject to copy the messages to"}
    assert [(h["Nats-DLQ-Subject"], h["Nats-DLQ-Reason"], h["Nats-DLQ-Deliveries"]) for h in r["dlq"]] == [
        ("orders.held", "Expired", "1"), ("orders.late", "Expired", "0")]
    assert r["info"]["dead_lettered"] == {"MaxDeliveries": 0, "Terminated": 0, "Expired": 2, "Limit": 0}
    resp = "io.nats.jetstream.api.v1.stream_redrive_response"
    assert r["dry"] == {"type": resp, "redriven": 2, "skipped": 0, "dry_run": True}
    assert r["first"] == {"type": resp, "redriven": 2, "skipped": 0, "dry_run": False}
    assert r["second"] == {"type": resp, "redriven": 0, "skipped": 0, "dry_run": False}
    assert r["bad"]["error"] == {"code": 400, "err_code": 10003, "description": "bad request"}
    assert r["missing"]["error"] == {"code": 404, "err_code": 10059, "description": "stream not found"}
    assert r["orders"] == 5  # the two redriven copies are new messages of ORDERS
