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
    assert r["info"]["dead_lettered"] == {"MaxDeliveries": 2, "Terminated": 1}
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
