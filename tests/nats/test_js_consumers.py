"""JetStream consumers over the NATS listener (``broker/nats/_consumers.py``), driven by
nats-py against a real broker on loopback (``conftest.nats_server``).

Virtual time: the tests that need ack waits or delays to pass run under trio's
``mock_clock`` (time stands still unless moved) and move it from nats-py's side with
:func:`jump`, so a redelivery "after 30 s" takes no real time and nothing depends on
the machine's speed. nats-py's own timeouts are real time: they only bound how long a
fetch waits for something the broker already decided.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import nats
import pytest
import trio
import trio.testing
from conftest import start_server
from hypothesis import given
from hypothesis import strategies as st
from helpers import RawNats, api_request, in_asyncio
from nats.js import api
from nats.js.errors import APIError, NotFoundError


import protocol.nats as PN
from broker.nats._consumer_state import V1_ACK as _V1_ACK
from protocol.nats import parse_ack_subject

STREAM = "ORDERS"


async def _advance(seconds: float) -> None:
    trio.lowlevel.current_clock().jump(seconds)  # type: ignore[attr-defined]
    await trio.testing.wait_all_tasks_blocked()


def jump(seconds: float) -> None:
    """Move the broker's virtual time on (called from nats-py's thread) and let every
    timer that fell due run."""
    trio.from_thread.run(_advance, seconds)


async def connect(url: str) -> tuple[Any, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    return nc, js


async def orders(js: Any, n: int, start: int = 0, subject: str = "orders.{i}") -> None:
    try:
        await js.add_stream(name=STREAM, subjects=["orders.>"])
    except APIError:
        pass  # exists (a second phase of a test)
    for i in range(start, start + n):
        await js.publish(subject.format(i=i), b"m%d" % i)


async def fetch_or_none(psub: Any, n: int, timeout: float = 0.3) -> list[Any]:
    try:
        return list(await psub.fetch(n, timeout=timeout))
    except nats.errors.TimeoutError:
        return []


# -- pull consumers ---------------------------------------------------------------------


async def test_pull_fetch_ack_and_consumer_info_counters(mock_clock: Any, nats_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 5)
        psub = await js.pull_subscribe("orders.>", durable="dur")
        msgs = await psub.fetch(3, timeout=2)
        out: dict[str, Any] = {
            "subjects": [m.subject for m in msgs],
            "data": [m.data for m in msgs],
            "meta": [(m.metadata.sequence.stream, m.metadata.sequence.consumer, m.metadata.num_delivered,
                      m.metadata.num_pending, m.metadata.stream, m.metadata.consumer) for m in msgs],
        }
        await msgs[0].ack_sync()
        await msgs[2].ack_sync()
        out["info"] = await js.consumer_info(STREAM, "dur")
        await msgs[1].ack_sync()
        out["after"] = await js.consumer_info(STREAM, "dur")
        rest = await psub.fetch(10, timeout=1)
        out["rest"] = [(m.subject, m.metadata.num_pending) for m in rest]
        for m in rest:
            await m.ack()
        out["empty"] = await fetch_or_none(psub, 1)
        await nc.flush()
        out["final"] = await js.consumer_info(STREAM, "dur")
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["subjects"] == ["orders.0", "orders.1", "orders.2"]
    assert r["data"] == [b"m0", b"m1", b"m2"]
    assert r["meta"] == [(1, 1, 1, 4, STREAM, "dur"), (2, 2, 1, 3, STREAM, "dur"), (3, 3, 1, 2, STREAM, "dur")]
    info = r["info"]
    assert (info.name, info.stream_name, info.config.durable_name) == ("dur", STREAM, "dur")
    assert info.config.ack_policy == api.AckPolicy.EXPLICIT and info.config.filter_subject == "orders.>"
    assert (info.delivered.consumer_seq, info.delivered.stream_seq) == (3, 3)
    # seq 1 and 3 acked, 2 outstanding: the floor stays at 1, as on the server
    assert (info.ack_floor.consumer_seq, info.ack_floor.stream_seq) == (1, 1)
    assert (info.num_ack_pending, info.num_pending, info.num_redelivered, info.num_waiting) == (1, 2, 0, 0)
    after = r["after"]
    assert (after.ack_floor.consumer_seq, after.ack_floor.stream_seq, after.num_ack_pending) == (3, 3, 0)
    assert r["rest"] == [("orders.3", 1), ("orders.4", 0)]
    assert r["empty"] == []
    final = r["final"]
    assert (final.delivered.stream_seq, final.ack_floor.stream_seq, final.num_ack_pending, final.num_pending) == (5, 5, 0, 0)


async def _dead_request(nats_url: str, batch: int) -> None:
    """A client that starts ``fetch(batch)`` on the durable ``work`` and closes its
    connection while the request waits."""
    nc, js = await connect(nats_url)
    psub = await js.pull_subscribe("orders.>", durable="work")
    pending = asyncio.ensure_future(psub.fetch(batch, timeout=5))
    await asyncio.sleep(0.05)  # the request is out (real time: nats-py's own wait)
    pending.cancel()
    await nc.close()
    with pytest.raises(BaseException):
        await pending


async def _waiting_until(js: Any, n: int) -> Any:
    """The durable's info once ``num_waiting`` is ``n`` (the broker has seen the dead
    client's connection end)."""
    for _ in range(200):
        info = await js.consumer_info(STREAM, "work")
        if info.num_waiting == n:
            return info
        await asyncio.sleep(0.01)
    return info


async def test_a_pull_whose_client_has_gone_takes_no_message(mock_clock: Any, nats_url: str) -> None:
    """A waiting pull whose reply subject nobody hears is dropped before any message
    is handed to it, as nats-server does: after a worker restarts, the next message
    reaches the new worker at once (virtual time stands still: nothing comes back
    after an ack wait), and the consumer info counts no dead request."""

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        nc, js = await connect(nats_url)
        await orders(js, 0)
        await _dead_request(nats_url, 1)
        out["info"] = await _waiting_until(js, 0)
        psub = await js.pull_subscribe("orders.>", durable="work")
        await js.publish("orders.x", b"one")
        msgs = await fetch_or_none(psub, 1, timeout=2)
        out["got"] = [(m.data, m.metadata.num_delivered) for m in msgs]
        for m in msgs:
            await m.ack_sync()
        # A dead request for 100, then 50 messages: all 50 reach the live worker, in order.
        await _dead_request(nats_url, 100)
        await _waiting_until(js, 0)
        for i in range(50):
            await js.publish(f"orders.{i}", b"m%d" % i)
        got: list[Any] = []
        while len(got) < 50:
            batch = await fetch_or_none(psub, 50 - len(got), timeout=2)
            if not batch:
                break
            got += batch
        out["fifty"] = [(m.data, m.metadata.num_delivered) for m in got]
        out["after"] = await js.consumer_info(STREAM, "work")
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert (r["info"].num_waiting, r["info"].num_ack_pending) == (0, 0)
    assert r["got"] == [(b"one", 1)]
    assert r["fifty"] == [(b"m%d" % i, 1) for i in range(50)]
    assert (r["after"].num_ack_pending, r["after"].num_redelivered) == (50, 0)


async def test_redelivery_after_ack_wait_nak_delay_term_and_in_progress(mock_clock: Any, nats_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 4)
        psub = await js.pull_subscribe("orders.>", durable="w", config=api.ConsumerConfig(ack_wait=30))
        a, b, c, d = await psub.fetch(4, timeout=2)
        out: dict[str, Any] = {}
        # a: nak now -> next at once, delivered twice; b: nak with a 10 s delay;
        # c: term (never again); d: in progress at 20 s moves its deadline to 50 s.
        await a.nak()
        await nc.request(b.reply, b'-NAK {"delay": 10000000000}', timeout=5)  # the ack as a request: answered once durable
        await nc.request(c.reply, b"+TERM", timeout=5)
        again = await psub.fetch(1, timeout=2)
        out["nak_now"] = [(m.metadata.sequence.stream, m.metadata.num_delivered) for m in again]
        await again[0].ack_sync()
        out["before_delay"] = await fetch_or_none(psub, 1)
        jump(10.5)
        later = await psub.fetch(1, timeout=2)
        out["nak_delay"] = [(m.metadata.sequence.stream, m.metadata.num_delivered) for m in later]
        await later[0].ack_sync()
        jump(9.5)  # 20 s since d was delivered
        await nc.request(d.reply, b"+WPI", timeout=5)
        jump(15)  # 35 s: past d's ack wait, but in progress moved it
        out["in_progress"] = await fetch_or_none(psub, 1)
        info = await js.consumer_info(STREAM, "w")
        out["mid"] = (info.num_ack_pending, info.num_redelivered, info.num_pending)
        jump(16)  # 51 s
        redone = await psub.fetch(1, timeout=2)
        out["redelivered"] = [(m.metadata.sequence.stream, m.metadata.num_delivered) for m in redone]
        info = await js.consumer_info(STREAM, "w")
        out["end"] = (info.num_ack_pending, info.num_redelivered, info.ack_floor.stream_seq)
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["nak_now"] == [(1, 2)]
    assert r["before_delay"] == []
    assert r["nak_delay"] == [(2, 2)]
    assert r["in_progress"] == []
    assert r["mid"] == (1, 0, 0)  # only d outstanding; c was terminated
    assert r["redelivered"] == [(4, 2)]
    assert r["end"] == (1, 1, 3)


async def test_max_ack_pending_holds_new_messages_back(mock_clock: Any, nats_url: str) -> None:
    async def scenario() -> tuple[list[int], list[int], list[int], int]:
        nc, js = await connect(nats_url)
        await orders(js, 5)
        psub = await js.pull_subscribe("orders.>", durable="cap", config=api.ConsumerConfig(max_ack_pending=2))
        first = await psub.fetch(5, timeout=1)
        held = await fetch_or_none(psub, 5)
        await first[0].ack_sync()
        more = await psub.fetch(5, timeout=1)
        info = await js.consumer_info(STREAM, "cap")
        await nc.close()
        return ([m.metadata.sequence.stream for m in first], [m.metadata.sequence.stream for m in held],
                [m.metadata.sequence.stream for m in more], info.num_ack_pending)

    first, held, more, pending = await in_asyncio(scenario)
    assert first == [1, 2]
    assert held == []
    assert more == [3]
    assert pending == 2


async def test_a_no_wait_pull_behind_waiting_requests_gets_408_requests_pending(mock_clock: Any, nats_url: str) -> None:
    """As nats-server: a ``no_wait`` request when the messages there are fewer than
    the waiting requests still want is answered ``408 Requests Pending`` (here a
    waiting request of 10 holds max_ack_pending's one message, 2 more wait for it);
    once nothing waits, the same request gets a message."""

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 3)
        await js.add_consumer(STREAM, durable_name="busy", ack_policy="explicit", max_ack_pending=1)
        nxt = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.busy"
        waiting, asking = nc.new_inbox(), nc.new_inbox()
        wsub, asub = await nc.subscribe(waiting), await nc.subscribe(asking)
        await nc.publish(nxt, json.dumps({"batch": 10, "expires": 5_000_000_000}).encode(), reply=waiting)
        first = await wsub.next_msg(timeout=2)
        await nc.publish(nxt, json.dumps({"batch": 1, "no_wait": True}).encode(), reply=asking)
        out: dict[str, Any] = {"first": first.subject, "behind": (await asub.next_msg(timeout=2)).headers}
        trio.from_thread.run(_advance, 5.5)  # the waiting request expires
        out["expired"] = (await wsub.next_msg(timeout=2)).headers["Status"]
        await first.ack()
        await nc.publish(nxt, json.dumps({"batch": 1, "no_wait": True}).encode(), reply=asking)
        out["alone"] = (await asub.next_msg(timeout=2)).subject
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["first"] == "orders.0"
    assert r["behind"] == {"Status": "408", "Description": "Requests Pending"}
    assert r["expired"] == "408"
    assert r["alone"] == "orders.1"


async def test_pull_request_statuses(mock_clock: Any, nats_url: str) -> None:
    """The raw pull protocol: 404 for no_wait with nothing, messages then 404 for a
    partial no_wait batch, 408 with the pending counts when a request expires, 409
    past max_waiting, and 400 for a malformed request."""

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 2)
        await js.add_consumer(STREAM, durable_name="raw", ack_policy="explicit", max_waiting=1)
        nxt = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.raw"
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)

        async def ask(body: dict[str, Any] | bytes, n: int) -> list[Any]:
            await nc.publish(nxt, body if isinstance(body, bytes) else json.dumps(body).encode(), reply=inbox)
            return [await sub.next_msg(timeout=2) for _ in range(n)]

        out: dict[str, Any] = {}
        got = await ask({"batch": 5, "no_wait": True}, 3)
        out["partial"] = [(m.subject, m.headers) for m in got]
        got = await ask({"batch": 1, "no_wait": True}, 1)
        out["none"] = got[0].headers
        await nc.publish(nxt, json.dumps({"batch": 3, "expires": 5_000_000_000}).encode(), reply=inbox)
        await nc.flush()
        got = await ask({"batch": 1, "expires": 5_000_000_000}, 1)
        out["max_waiting"] = got[0].headers
        await js.publish("orders.9", b"late")
        got = [await sub.next_msg(timeout=2)]
        trio.from_thread.run(_advance, 5.5)
        got.append(await sub.next_msg(timeout=2))
        out["expired"] = [(m.subject, m.headers) for m in got]
        got = await ask(b'{"batch": "x"}', 1)
        out["bad"] = got[0].headers
        try:
            await nc.request(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.nope", b"", timeout=2)
        except nats.errors.NoRespondersError as exc:
            out["no_consumer"] = exc
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert [s for s, _ in r["partial"][:2]] == ["orders.0", "orders.1"]
    assert r["partial"][2][1] == {"Status": "404", "Description": "No Messages"}
    assert r["none"] == {"Status": "404", "Description": "No Messages"}
    assert r["max_waiting"] == {"Status": "409", "Description": "Exceeded MaxWaiting"}
    assert r["expired"][0][0] == "orders.9"
    assert r["expired"][1][1] == {"Status": "408", "Description": "Request Timeout",
                                  "Nats-Pending-Messages": "2", "Nats-Pending-Bytes": "0"}
    assert r["bad"]["Status"] == "400" and r["bad"]["Description"].startswith("Bad Request - ")
    assert isinstance(r["no_consumer"], nats.errors.NoRespondersError)


# -- the API's answers and errors -----------------------------------------------------------


async def test_create_info_names_list_delete_and_errors(nats_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 1)
        out: dict[str, Any] = {}

        async def err(coro: Any) -> tuple[int | None, int | None, str | None]:
            try:
                await coro
            except APIError as e:
                return e.code, e.err_code, e.description
            return None, None, None

        create = f"$JS.API.CONSUMER.CREATE.{STREAM}"
        await js.add_consumer(STREAM, durable_name="a", ack_policy="explicit")
        again = await js.add_consumer(STREAM, durable_name="a", ack_policy="explicit")  # the same: a no-op
        out["again"] = again.name
        await js.add_consumer(STREAM, name="b", ack_policy="explicit", filter_subject="orders.eu.>")
        out["names"] = await api_request(nc, f"$JS.API.CONSUMER.NAMES.{STREAM}", b"")
        out["list"] = await api_request(nc, f"$JS.API.CONSUMER.LIST.{STREAM}", {"offset": 1})
        out["not_found"] = await err(js.consumer_info(STREAM, "zz"))
        out["no_stream"] = await err(js.consumer_info("NOPE", "a"))
        out["exists"] = await api_request(nc, f"{create}.a", {
            "stream_name": STREAM, "action": "create", "config": {"durable_name": "a", "ack_policy": "explicit", "max_deliver": 3}})
        out["update_missing"] = await api_request(nc, f"{create}.c", {
            "stream_name": STREAM, "action": "update", "config": {"durable_name": "c", "ack_policy": "explicit"}})
        out["mismatch"] = await api_request(nc, f"{create}.x", {"stream_name": STREAM, "config": {"durable_name": "y"}})
        out["legacy_no_durable"] = await api_request(nc, f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.d", {
            "stream_name": STREAM, "config": {"ack_policy": "explicit"}})
        out["stream_mismatch"] = await api_request(nc, f"{create}.x", {"stream_name": "OTHER", "config": {"name": "x"}})
        out["filter_mismatch"] = await api_request(nc, f"{create}.f.orders.eu", {
            "stream_name": STREAM, "config": {"name": "f", "filter_subject": "orders.us"}})
        out["replay"] = await err(js.add_consumer(STREAM, durable_name="r", replay_policy="original"))
        out["sample"] = await err(js.add_consumer(STREAM, durable_name="s", sample_freq="-5%"))
        out["push_durable"] = await js.add_consumer(STREAM, durable_name="p", deliver_subject="here", deliver_group="g")
        out["hb_pull"] = await err(js.add_consumer(STREAM, durable_name="h", idle_heartbeat=1.0))
        out["backoff"] = await err(js.add_consumer(STREAM, durable_name="bo", backoff=[1, 2, 3], max_deliver=2))
        out["overlap"] = await err(js.add_consumer(STREAM, durable_name="o", filter_subjects=["orders.>", "orders.eu"]))
        out["bad_json"] = await api_request(nc, f"{create}.j", b"{nope")
        out["deleted"] = await js.delete_consumer(STREAM, "a")
        out["after_delete"] = await err(js.consumer_info(STREAM, "a"))
        out["delete_missing"] = await err(js.delete_consumer(STREAM, "a"))
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["again"] == "a"
    names = r["names"]
    assert names["type"] == "io.nats.jetstream.api.v1.consumer_names_response"
    assert (names["total"], names["offset"], names["limit"], names["consumers"]) == (2, 0, 1024, ["a", "b"])
    lst = r["list"]
    assert (lst["total"], lst["offset"], lst["limit"]) == (2, 1, 256)
    assert [c["name"] for c in lst["consumers"]] == ["b"]
    b = lst["consumers"][0]
    assert b["config"]["filter_subject"] == "orders.eu.>" and "durable_name" not in b["config"]
    assert b["num_pending"] == 0 and b["config"]["inactive_threshold"] == 5_000_000_000
    assert r["not_found"] == (404, 10014, "consumer not found")
    assert r["no_stream"] == (404, 10059, "stream not found")
    assert r["exists"]["error"] == {"code": 400, "err_code": 10148, "description": "consumer already exists"}
    assert r["update_missing"]["error"] == {"code": 400, "err_code": 10149, "description": "consumer does not exist"}
    assert r["mismatch"]["error"] == {"code": 400, "err_code": 10017,
                                      "description": "consumer name in subject does not match durable name in request"}
    assert r["legacy_no_durable"]["error"] == {"code": 400, "err_code": 10018,
                                               "description": "consumer expected to be durable but a durable name was not set"}
    assert r["stream_mismatch"]["error"] == {"code": 400, "err_code": 10056,
                                             "description": "stream name in subject does not match request"}
    assert r["filter_mismatch"]["error"] == {
        "code": 400, "err_code": 10131, "description": "Consumer create request did not match filtered subject from create subject"}
    assert r["replay"] == (400, 10094, "consumer replay policy original on a pull consumer is not supported by ttlbroker: "
                                       "use a push consumer")
    assert r["sample"] == (400, 10095, "failed to parse consumer sampling configuration: %!s(<nil>)")  # the server's words
    push = r["push_durable"].config
    assert (push.durable_name, push.deliver_subject, push.deliver_group, push.ack_policy) == ("p", "here", "g", api.AckPolicy.EXPLICIT)
    assert r["hb_pull"] == (400, 10088, "consumer idle heartbeat requires a push based consumer")
    assert r["backoff"] == (400, 10116, "max deliver is required to be > length of backoff values")
    assert r["overlap"] == (400, 10138, "consumer subject filters cannot overlap")
    assert r["bad_json"]["error"]["err_code"] == 10025 and r["bad_json"]["error"]["description"].startswith("invalid JSON: ")
    assert r["deleted"] is True
    assert r["after_delete"] == (404, 10014, "consumer not found")
    assert r["delete_missing"] == (404, 10014, "consumer not found")


async def test_updates_refused_and_allowed_as_on_the_server(mock_clock: Any, nats_url: str) -> None:
    """What an update may not change is refused with nats-server's own words (500
    10012, in its order); a push consumer's deliver subject moves only while nobody
    listens there (400 10013), and then delivers to the new one; a new
    inactive_threshold counts from the last activity."""
    create = f"$JS.API.CONSUMER.CREATE.{STREAM}"

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        try:
            await orders(js, 1)
            out: dict[str, Any] = {}

            async def update(name: str, cfg: dict[str, Any]) -> Any:
                r = await api_request(nc, f"{create}.{name}", {"stream_name": STREAM, "config": cfg})
                return r.get("error") or r["config"]

            pull = {"durable_name": "a", "ack_policy": "explicit"}
            await update("a", pull)
            for key, value in [("deliver_policy", "last"), ("ack_policy", "none"), ("max_waiting", 7),
                               ("opt_start_seq", 1)]:
                changed = {**pull, key: value} if key != "opt_start_seq" else {
                    **pull, "deliver_policy": "by_start_sequence", "opt_start_seq": 1}
                out[key] = await update("a", changed)
            out["max_deliver"] = (await update("a", {**pull, "max_deliver": 4}))["max_deliver"]
            push = {"name": "p", "deliver_subject": "d.p", "ack_policy": "none", "idle_heartbeat": 10**9,
                    "flow_control": True}
            await update("p", push)
            out["heartbeat"] = await update("p", {**push, "idle_heartbeat": 2 * 10**9})
            out["flow_control"] = await update("p", {**push, "flow_control": False})
            plain = {"name": "q", "deliver_subject": "d.q", "ack_policy": "none"}
            await update("q", plain)
            out["push_to_pull"] = await update("q", {"name": "q", "ack_policy": "none"})
            await update("n", {"name": "n", "ack_policy": "none"})
            out["pull_to_push"] = await update("n", {"name": "n", "ack_policy": "none", "deliver_subject": "d.n"})
            # the deliver subject moves only while nobody listens on the old one
            old = await nc.subscribe("d.q")
            await nc.flush()
            out["moved_while_bound"] = await update("q", {**plain, "deliver_subject": "d.r"})
            out["old_got"] = (await old.next_msg(timeout=2)).data
            await old.unsubscribe()
            new = await nc.subscribe("d.r")
            await nc.flush()
            out["moved"] = (await update("q", {**plain, "deliver_subject": "d.r"}))["deliver_subject"]
            await js.publish("orders.later", b"later")
            out["delivered"] = (await new.next_msg(timeout=2)).data
            # a shorter inactive_threshold counts from the last activity
            await update("e", {"name": "e", "ack_policy": "explicit", "inactive_threshold": 60 * 10**9})
            out["threshold"] = (await update("e", {"name": "e", "ack_policy": "explicit",
                                                   "inactive_threshold": 2 * 10**9}))["inactive_threshold"]
            jump(2.5)
            try:
                await js.consumer_info(STREAM, "e")
            except NotFoundError as e:
                out["gone"] = e.err_code
            return out
        finally:
            await nc.close()

    r = await in_asyncio(scenario)

    def denied(text: str) -> dict[str, Any]:
        return {"code": 500, "err_code": 10012, "description": text}

    assert r["deliver_policy"] == denied("deliver policy can not be updated")
    assert r["ack_policy"] == denied("ack policy can not be updated")
    assert r["max_waiting"] == denied("max waiting can not be updated")
    assert r["opt_start_seq"] == denied("deliver policy can not be updated")
    assert r["max_deliver"] == 4
    assert r["heartbeat"] == denied("heart beats can not be updated")
    assert r["flow_control"] == denied("flow control can not be updated")
    assert r["push_to_pull"] == denied("can not update push consumer to pull based")
    assert r["pull_to_push"] == denied("can not update pull consumer to push based")
    assert r["moved_while_bound"] == {"code": 400, "err_code": 10013, "description": "consumer name already in use"}
    assert r["moved"] == "d.r"
    assert (r["old_got"], r["delivered"]) == (b"m0", b"later")
    assert r["threshold"] == 2 * 10**9
    assert r["gone"] == 10014


async def test_durable_consumer_survives_a_restart(nats_config: Any) -> None:
    async def before(url: str) -> list[int]:
        nc, js = await connect(url)
        await orders(js, 3)
        psub = await js.pull_subscribe("orders.>", durable="keep", config=api.ConsumerConfig(ack_wait=0.5))
        msgs = await psub.fetch(2, timeout=2)
        await msgs[0].ack_sync()
        await nc.close()
        return [m.metadata.sequence.stream for m in msgs]

    async def after(url: str) -> tuple[Any, list[tuple[int, int]]]:
        nc, js = await connect(url)
        info = await js.consumer_info(STREAM, "keep")
        psub = await js.pull_subscribe_bind("keep", STREAM)
        got: list[Any] = []
        while len(got) < 2:  # seq 2 comes back once its ack wait has run out, seq 3 at once
            got += await fetch_or_none(psub, 2, timeout=1)
        await nc.close()
        return info, sorted((m.metadata.sequence.stream, m.metadata.num_delivered) for m in got)

    async with start_server(nats_config) as handle:
        assert await in_asyncio(before, handle.nats_url) == [1, 2]
    async with start_server(nats_config) as handle:
        info, got = await in_asyncio(after, handle.nats_url)
    assert (info.delivered.consumer_seq, info.delivered.stream_seq) == (2, 2)
    assert (info.ack_floor.consumer_seq, info.ack_floor.stream_seq) == (1, 1)
    assert (info.num_ack_pending, info.num_pending, info.config.ack_wait) == (1, 1, 0.5)
    assert got == [(2, 2), (3, 1)]


# -- push consumers ----------------------------------------------------------------------------


async def test_ordered_push_consumer_with_flow_control(nats_url: str) -> None:
    """``js.subscribe(ordered_consumer=True)``: every message in order, across more
    than one flow-control window, then what is published later."""
    n = 2500

    async def scenario() -> tuple[list[int], Any, list[bytes]]:
        nc, js = await connect(nats_url)
        await orders(js, n, subject="orders.a")
        sub = await js.subscribe("orders.>", ordered_consumer=True)
        seqs = []
        for _ in range(n):
            m = await sub.next_msg(timeout=5)
            seqs.append(m.metadata.sequence.stream)
        info = await sub.consumer_info()
        await js.publish("orders.b", b"later")
        late = [(await sub.next_msg(timeout=5)).data]
        await nc.close()
        return seqs, info, late

    seqs, info, late = await in_asyncio(scenario)
    assert seqs == list(range(1, n + 1))
    assert info.config.ack_policy == api.AckPolicy.NONE and info.config.flow_control is True
    assert info.config.deliver_subject and info.num_pending == 0 and info.delivered.stream_seq == n
    assert late == [b"later"]


@pytest.mark.parametrize(("size", "n"), [(64, 4096), (1024, 2048), (16 * 1024, 256), (256 * 1024, 24), (1000 * 1024, 6)])
async def test_an_ordered_consumer_keeps_up_with_flow_control_at_every_size(nats_url: str, size: int, n: int) -> None:
    """An ordered consumer subscribed before the publishes has every message once the
    last PubAck is back (nats-py reads on while flow control is answered): from 64
    bytes to the 1 MiB payload limit, across several flow-control limits."""

    async def scenario() -> tuple[int, list[int]]:
        nc, js = await connect(nats_url)
        await orders(js, 0)
        sub = await js.subscribe("orders.>", ordered_consumer=True)
        body = b"x" * size
        for i in range(n):
            await js.publish_async(f"orders.{i}", body)
        await js.publish_async_completed()
        seqs = []
        while len(seqs) < n:
            m = await sub.next_msg(timeout=5)
            assert len(m.data) == size
            seqs.append(m.metadata.sequence.stream)
        await nc.close()
        return len(seqs), seqs

    count, seqs = await in_asyncio(scenario)
    assert count == n and seqs == list(range(1, n + 1))


# -- KV watchers (ordered push consumers on a bucket's stream) ------------------------------------


async def test_kv_keys_history_and_watch_see_puts_deletes_and_ttl_markers(mock_clock: Any, nats_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        try:
            kv = await js.create_key_value(bucket="cfg", history=5, limit_marker_ttl=5)
            await kv.put("a", b"1")
            await kv.put("b", b"1")
            await kv.put("a", b"2")
            await kv.delete("b")
            out: dict[str, Any] = {"keys": await kv.keys()}
            out["history"] = [(e.key, e.value, e.revision, e.operation) for e in await kv.history("a")]
            w = await kv.watchall()
            initial = []
            while (e := await w.updates(timeout=5)) is not None:
                initial.append((e.key, e.value, e.revision, e.operation, e.delta))
            out["initial"] = initial
            await kv.put("c", b"3")
            await kv.create("d", b"4", msg_ttl=1)  # raised to the marker TTL, 5 s (docs/semantics.md §6.7)
            live = [await w.updates(timeout=5) for _ in range(2)]
            jump(5.5)  # d's TTL runs out: its marker reaches the watcher
            live.append(await w.updates(timeout=5))
            out["live"] = [(e.key, e.value, e.revision, e.operation) for e in live]
            await w.stop()
            return out
        finally:
            await nc.close()

    r = await in_asyncio(scenario)
    assert r["keys"] == ["a"]
    assert r["history"] == [("a", b"1", 1, None), ("a", b"2", 3, None)]
    assert r["initial"] == [("a", b"2", 3, None, 1), ("b", b"", 4, "DEL", 0)]
    assert r["live"] == [("c", b"3", 5, None), ("d", b"4", 6, None), ("d", b"", 7, "PURGE")]


async def test_pull_idle_heartbeats_and_ephemeral_consumers_going_when_unused(mock_clock: Any, nats_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        try:
            await orders(js, 1)
            out: dict[str, Any] = {}
            # a waiting pull with idle_heartbeat gets "100 Idle Heartbeat" while it waits
            await js.add_consumer(STREAM, durable_name="hb", ack_policy="explicit")
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.hb", b"", reply=inbox)
            await (await sub.next_msg(timeout=2)).ack_sync()
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.hb",
                             json.dumps({"batch": 1, "expires": 10 * 10**9, "idle_heartbeat": 10**9}).encode(), reply=inbox)
            await nc.flush()
            jump(1.05)
            out["heartbeat"] = (await sub.next_msg(timeout=2)).headers
            await js.publish("orders.x", b"now")
            out["then"] = (await sub.next_msg(timeout=2)).data
            # an ephemeral pull consumer goes inactive_threshold after it was last used
            eph = await js.add_consumer(STREAM, name="eph", ack_policy="explicit", inactive_threshold=10)
            out["eph"] = (eph.name, eph.config.durable_name, eph.config.inactive_threshold)
            jump(6)
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.eph", b"", reply=inbox)  # used: the clock restarts
            out["eph_msg"] = (await sub.next_msg(timeout=2)).subject
            jump(6)
            out["eph_used"] = (await js.consumer_info(STREAM, "eph")).name
            jump(5)
            try:
                await js.consumer_info(STREAM, "eph")
            except NotFoundError as e:
                out["eph_gone"] = e.err_code
            # an ordered push consumer stays while subscribed, goes once unsubscribed
            osub = await js.subscribe("orders.>", ordered_consumer=True)
            name = (await osub.consumer_info()).name
            jump(6)
            out["push_bound"] = (await js.consumer_info(STREAM, name)).push_bound
            await osub.unsubscribe()
            await nc.flush()
            jump(6)
            try:
                await js.consumer_info(STREAM, name)
            except NotFoundError as e:
                out["push_gone"] = e.err_code
            return out
        finally:
            await nc.close()

    r = await in_asyncio(scenario)
    assert r["heartbeat"] == {"Status": "100", "Description": "Idle Heartbeat",
                              "Nats-Last-Consumer": "1", "Nats-Last-Stream": "1"}
    assert r["then"] == b"now"
    assert r["eph"] == ("eph", None, 10.0)
    assert r["eph_msg"] == "orders.0"
    assert r["eph_used"] == "eph"
    assert r["eph_gone"] == 10014
    assert r["push_bound"] is True
    assert r["push_gone"] == 10014


async def test_ack_next_and_no_wait_with_expires(mock_clock: Any, nats_url: str) -> None:
    """``+NXT`` acks and sends the next message to the ack's reply subject; a no_wait
    request with expires waits for a message, then ends at once with ``404``."""

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        try:
            await orders(js, 2)
            await js.add_consumer(STREAM, durable_name="nx", ack_policy="explicit")
            nxt = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.nx"
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish(nxt, b"", reply=inbox)
            first = await sub.next_msg(timeout=2)
            await nc.publish(first.reply, b"+NXT", reply=inbox)
            second = await sub.next_msg(timeout=2)
            await nc.publish(second.reply, b"+ACK")
            await nc.flush()
            info = await js.consumer_info(STREAM, "nx")
            out: dict[str, Any] = {"seqs": [first.metadata.sequence.stream, second.metadata.sequence.stream],
                                   "floor": info.ack_floor.stream_seq}
            await nc.publish(nxt, json.dumps({"batch": 2, "no_wait": True, "expires": 5 * 10**9}).encode(), reply=inbox)
            await nc.flush()
            await js.publish("orders.late", b"late")
            got = [await sub.next_msg(timeout=2) for _ in range(2)]
            out["waited"] = [(m.subject, m.headers) for m in got]
            return out
        finally:
            await nc.close()

    r = await in_asyncio(scenario)
    assert r["seqs"] == [1, 2]
    assert r["floor"] == 2
    assert r["waited"][0] == ("orders.late", None)
    assert r["waited"][1][1] == {"Status": "404", "Description": "No Messages"}


async def test_ephemeral_consumer_keeps_its_settings_across_a_restart_and_goes_when_unused(mock_clock: Any, nats_config: Any) -> None:
    async def before(url: str) -> None:
        nc, js = await connect(url)
        await orders(js, 1)
        await js.add_consumer(STREAM, name="eph", ack_policy="explicit", inactive_threshold=10)
        await js.add_consumer(STREAM, durable_name="dur", ack_policy="explicit")
        await nc.close()

    async def after(url: str) -> dict[str, Any]:
        nc, js = await connect(url)
        try:
            eph = await js.consumer_info(STREAM, "eph")
            out: dict[str, Any] = {"eph": (eph.config.durable_name, eph.config.inactive_threshold)}
            jump(11)
            try:
                await js.consumer_info(STREAM, "eph")
            except NotFoundError as e:
                out["gone"] = e.err_code
            out["dur"] = (await js.consumer_info(STREAM, "dur")).config.durable_name
            return out
        finally:
            await nc.close()

    async with start_server(nats_config) as handle:
        await in_asyncio(before, handle.nats_url)
    async with start_server(nats_config) as handle:
        r = await in_asyncio(after, handle.nats_url)
    assert r == {"eph": (None, 10.0), "gone": 10014, "dur": "dur"}


async def test_malformed_ack_subjects_of_a_known_consumer_ack_nothing(
    nats_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Once a consumer's ack subjects are known (its first ack), an ack subject with
    that consumer's prefix is still read as the server reads it: numbers that are
    not ASCII digits, too few or too many tokens, or another verb ack nothing (and
    log no error); the well-formed one acks."""
    caplog.set_level(logging.INFO, logger="broker")

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        try:
            await orders(js, 2)
            psub = await js.pull_subscribe("orders.>", durable="acks")
            first, second = await psub.fetch(2, timeout=2)
            await first.ack_sync()  # the consumer's ack subjects are known from here on
            t = second.reply.split(".")
            bad = [
                ".".join(t[:5] + ["x"] + t[6:]),  # stream sequence not a number
                ".".join(t[:5] + ["\u00b2"] + t[6:]),  # a digit, but not an ASCII one
                ".".join(t[:4] + ["\u0663"] + t[5:]),  # delivered count in Arabic-Indic digits
                ".".join(t[:8]),  # one token short
                ".".join([*t, "1"]),  # one token too many (not the v2 form either)
                ".".join(["$JS", "NAK", *t[2:]]),
            ]
            for subject in bad:
                await nc.publish(subject, b"+ACK")
            await nc.flush()
            before = await js.consumer_info(STREAM, "acks")
            await second.ack_sync()
            after = await js.consumer_info(STREAM, "acks")
            return {"before": (before.num_ack_pending, before.ack_floor.stream_seq),
                    "after": (after.num_ack_pending, after.ack_floor.stream_seq)}
        finally:
            await nc.close()

    r = await in_asyncio(scenario)
    assert r["before"] == (1, 1)
    assert r["after"] == (0, 2)
    assert [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR] == []


ACK_TOKEN = st.sampled_from(["", "1", "0", "42", "x", "\u00b2", "\u0663", "ACK", "$JS", "1a", "S"])


@given(st.lists(ACK_TOKEN, min_size=0, max_size=11), st.booleans())
def test_the_v1_ack_fast_path_reads_what_parse_ack_subject_reads(tokens: list[str], prefixed: bool) -> None:
    """The match that finds a known consumer from a v1 ack subject takes exactly the
    nine-token subjects ``parse_ack_subject`` reads, with the same stream, consumer
    and stream sequence."""
    subject = ".".join((["$JS", "ACK"] if prefixed else []) + tokens)
    m = _V1_ACK.fullmatch(subject)
    a = parse_ack_subject(subject)
    if subject.count(".") == 8:
        assert (m is None) == (a is None)
    else:
        assert m is None
    if m is not None:
        assert a is not None
        assert (m.group(1), int(m.group(2))) == (f"$JS.ACK.{a.stream}.{a.consumer}", a.stream_seq)


async def test_a_run_of_acks_in_one_write_settles_each_as_sent_alone(nats_url: str) -> None:
    """nats-py writes the PUBs of many ``msg.ack()`` calls at once; the session takes
    such a run of ``$JS.ACK`` PUBs in one pass (``NatsParser.plain_pubs``,
    ``State.take_acks``) for the plain acks and hands everything else in the run to
    the general path in order: two consumers interleaved, an empty body and
    ``+ACK``, a NAK, a TERM, an in-progress, an ack with a reply (answered), a
    malformed subject, a core message on an ack subject of nobody."""

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        try:
            await orders(js, 8)
            p1 = await js.pull_subscribe("orders.>", durable="one", config=api.ConsumerConfig(ack_wait=30))
            p2 = await js.pull_subscribe("orders.>", durable="two", config=api.ConsumerConfig(ack_wait=30))
            m1 = await p1.fetch(8, timeout=2)
            m2 = await p2.fetch(2, timeout=2)
            await m1[0].ack_sync()  # both consumers' ack subjects known from here on
            await m2[0].ack_sync()
            answers: list[bytes] = []
            inbox = nc.new_inbox()
            got = asyncio.Event()

            async def on_answer(msg: Any) -> None:
                answers.append(msg.data)
                got.set()

            await nc.subscribe(inbox, cb=on_answer)
            await nc.flush()
            t = m1[7].reply.split(".")
            # One buffer: nats-py sends these in one write at the flush.
            await nc.publish(m1[1].reply, b"")
            await nc.publish(m2[1].reply, b"+ACK")
            await nc.publish(m1[2].reply, b"-NAK")
            await nc.publish(m1[3].reply, b"+ACK")
            await nc.publish(m1[4].reply, b"+TERM")
            await nc.publish(".".join(t[:5] + ["x"] + t[6:]), b"+ACK")  # malformed: acks nothing
            await nc.publish("$JS.ACK.NOPE.none.1.1.1.1.0", b"+ACK")  # no such consumer
            await nc.publish(m1[5].reply, b"+WPI")
            await nc.publish(m1[6].reply, b"+ACK", reply=inbox)
            await nc.flush()
            await asyncio.wait_for(got.wait(), 5)
            await m1[7].ack_sync()  # a run of one plain ack, nothing after it: answered once settled
            again = await p1.fetch(1, timeout=2)
            i1 = await js.consumer_info(STREAM, "one")
            i2 = await js.consumer_info(STREAM, "two")
            return {
                "answers": answers,
                "again": [(m.metadata.sequence.stream, m.metadata.num_delivered) for m in again],
                "one": (i1.num_ack_pending, i1.ack_floor.stream_seq, i1.num_pending, i1.num_redelivered),
                "two": (i2.num_ack_pending, i2.ack_floor.stream_seq, i2.num_pending),
            }
        finally:
            await nc.close()

    r = await in_asyncio(scenario)
    assert r["answers"] == [b""]
    assert r["again"] == [(3, 2)]  # the NAK'd one, at once, delivered twice
    # outstanding: 3 (redelivered), 6 (in progress); 5 terminated
    assert r["one"] == (2, 2, 0, 1)
    assert r["two"] == (0, 2, 6)


async def test_deliveries_and_plain_acks_wait_for_no_sync_of_their_own_but_an_ack_sync_does(
    mock_clock: Any, nats_server: Any, nats_url: str,
) -> None:
    """Under ``fsync = "always"`` nobody waits for a pull's deliveries or for acks sent
    without a reply (``msg.ack()``): their consumer-journal events go with the next
    sync, at the latest ``LAZY_SYNC_SECONDS`` later (nats-server writes a consumer's
    state at most ten times a second). An ``ack_sync`` is answered after a sync that
    covers it and every ack before it, also when it changes nothing (the message was
    acked already, without a reply)."""
    from broker.core._commit import LAZY_SYNC_SECONDS

    broker = nats_server.broker
    assert broker.committer.acks_wait

    def journal_dirty() -> bool:
        topic = nats_server.services.jetstream.topic(STREAM)
        return bool(nats_server.services.consumers.journal_of(topic).file.dirty)

    def state() -> tuple[int, bool]:
        return broker.counters.fsyncs, journal_dirty()

    async def settled() -> tuple[int, bool]:
        committer = broker.committer
        while committer.synced < committer.epoch - 1:  # a sync under way (perhaps in the sync thread)
            await committer.wait_progress()
        return state()

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 6)
        psub = await js.pull_subscribe("orders.>", durable="lazy")
        out: dict[str, Any] = {"start": trio.from_thread.run_sync(state)}
        msgs = await psub.fetch(3, timeout=2)
        for m in msgs:
            await m.ack()
        await nc.flush()  # the acks are read and settled
        out["after_plain"] = trio.from_thread.run_sync(state)
        # An ack_sync of a message acked already (nats-py refuses a second ack of a
        # Msg, so the request is sent as ack_sync sends it): answered once
        # everything before it is durable.
        await nc.request(msgs[0].reply, b"", timeout=5)
        out["after_sync"] = trio.from_thread.run_sync(state)
        more = await psub.fetch(3, timeout=2)
        for m in more:
            await m.ack()
        await nc.flush()
        out["plain_again"] = trio.from_thread.run_sync(state)
        jump(LAZY_SYNC_SECONDS)
        out["due"] = trio.from_thread.run(settled)
        out["info"] = await js.consumer_info(STREAM, "lazy")
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    fsyncs, dirty = r["start"]
    assert not dirty  # the consumer's creation was synced before its answer
    assert r["after_plain"] == (fsyncs, True)  # deliveries and plain acks: written, not synced
    synced, dirty = r["after_sync"]
    assert synced > fsyncs and not dirty  # the ack_sync's answer came after a sync of them all
    assert r["plain_again"] == (synced, True)
    assert r["due"] == (synced + 1, False)  # synced when due, once
    info = r["info"]
    assert (info.num_ack_pending, info.num_pending, info.ack_floor.stream_seq) == (0, 0, 6)


async def test_consumer_info_has_push_bound_only_when_bound(nats_url: str) -> None:
    """``push_bound`` is the server's ``omitempty`` bool: absent from a pull consumer's
    info (and an unbound push consumer's), never ``null``."""

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        try:
            await orders(js, 1)
            await js.pull_subscribe("orders.>", durable="pb", stream=STREAM)
            return await api_request(nc, f"$JS.API.CONSUMER.INFO.{STREAM}.pb", b"")
        finally:
            await nc.close()

    info = await in_asyncio(scenario)
    assert "push_bound" not in info
    assert list(info)[-2:] == ["num_pending", "ts"]


@pytest.mark.parametrize(
    ("config", "description"),
    [
        ({"deliver_policy": "last_per_subject"}, "consumer delivery policy is deliver last per subject, but optional filter subject is not set"),
        ({"deliver_policy": "all", "opt_start_seq": 2}, "consumer delivery policy is deliver all, but optional start sequence is also set"),
        ({"deliver_policy": "new", "opt_start_time": "2026-01-01T00:00:00Z"}, "consumer delivery policy is deliver new, but optional start time is also set"),
        ({"deliver_policy": "by_start_sequence"}, "consumer delivery policy is deliver by start sequence, but optional start sequence is not set"),
        ({"deliver_policy": "by_start_sequence", "opt_start_seq": 1, "opt_start_time": "2026-01-01T00:00:00Z"},
         "consumer delivery policy is deliver by start sequence, but optional start time is also set"),
        ({"deliver_policy": "by_start_time"}, "consumer delivery policy is deliver by start time, but optional start time is not set"),
        ({"deliver_policy": "by_start_time", "opt_start_time": "2026-01-01T00:00:00Z", "opt_start_seq": 1},
         "consumer delivery policy is deliver by start time, but optional start start sequence is also set"),  # sic: the server's words
    ],
)
async def test_start_position_refusals_in_the_servers_words(nats_url: str, config: dict[str, Any], description: str) -> None:
    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        try:
            await orders(js, 1)
            return await api_request(nc, f"$JS.API.CONSUMER.CREATE.{STREAM}", {"stream_name": STREAM, "config": config})
        finally:
            await nc.close()

    assert (await in_asyncio(scenario))["error"] == {"code": 400, "err_code": 10094, "description": description}


async def test_ack_none_and_unnamed_consumer_configs_as_the_server(nats_url: str) -> None:
    """An ``ack_policy`` none consumer shows ``ack_wait`` only when it was given and its
    ``max_deliver`` as given; an ephemeral created without a name has none in its
    config (its made-up name is the info's ``name``)."""

    async def scenario() -> list[dict[str, Any]]:
        nc, js = await connect(nats_url)
        try:
            await orders(js, 1)
            out = []
            for subject, config in (
                (f"$JS.API.CONSUMER.CREATE.{STREAM}", {"deliver_subject": "_INBOX.o", "ack_policy": "none", "max_deliver": 1,
                                                       "flow_control": True, "idle_heartbeat": 5_000_000_000}),
                (f"$JS.API.CONSUMER.CREATE.{STREAM}", {"ack_policy": "none", "ack_wait": 7_000_000_000}),
                (f"$JS.API.CONSUMER.CREATE.{STREAM}.named", {"name": "named", "ack_policy": "explicit"}),
            ):
                out.append(await api_request(nc, subject, {"stream_name": STREAM, "config": config}))
            return out
        finally:
            await nc.close()

    push, pull, named = await in_asyncio(scenario)
    assert "name" not in push["config"] and push["name"]
    assert "ack_wait" not in push["config"] and push["config"]["max_deliver"] == 1
    assert "name" not in pull["config"] and pull["config"]["ack_wait"] == 7_000_000_000 and pull["config"]["max_deliver"] == -1
    assert named["config"]["name"] == "named" and named["config"]["ack_wait"] == 30_000_000_000


async def test_pull_batches_reach_subscriptions_with_a_maximum_and_ttlbroker_subscribers(nats_server: Any, nats_url: str) -> None:
    """A pull's messages go to whoever subscribes to its reply subject, each as a
    fetch gets it (subject, headers, payload, ``$JS.ACK`` reply): a NATS subscription
    with a maximum gets only as many as it has left (the batch is delivered all the
    same); beside a ttlbroker subscription, each message goes to both."""
    from broker.client import connect as native

    api_subject = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.dur"

    async def setup() -> None:
        nc, js = await connect(nats_url)
        try:
            await js.add_stream(name=STREAM, subjects=["orders.>"])
            for i in range(7):
                await js.publish(f"orders.{i}", b"m%d" % i, headers={"K": "v"} if i in (1, 5) else None)
            await js.add_consumer(STREAM, durable_name="dur", ack_policy="explicit")
        finally:
            await nc.close()

    def seen(subject: str, reply: str | None, headers: Any, data: bytes) -> tuple[Any, ...]:
        assert reply is not None
        return subject, data, headers, reply.split(".")[:7], reply.split(".")[8]

    await in_asyncio(setup)
    peer = await RawNats.open(nats_url)
    await peer.connect(headers=True)
    await peer.send(b"SUB _INBOX.limited 5\r\nUNSUB 5 2\r\nPUB %s _INBOX.limited 11\r\n{\"batch\":3}\r\nPING\r\n" % api_subject.encode())
    limited = [await peer.next_event() for _ in range(3)]
    assert limited[2] is PN.NatsPong  # two messages, then nothing for that subscription
    got = [seen(m.subject, m.reply, dict(PN.decode_nats_headers(m.headers)[2]) if m.headers else None, m.payload)
           for m in limited[:2]]
    async with native(nats_server.address) as client:
        mixed = await client.subscribe("_INBOX.mixed")

        async def scenario() -> dict[str, Any]:
            nc, js = await connect(nats_url)
            try:
                both = await nc.subscribe("_INBOX.mixed")
                await nc.flush()
                await nc.publish(api_subject, b'{"batch":2}', reply="_INBOX.mixed")
                msgs = [await both.next_msg(5) for _ in range(2)]
                psub = await js.pull_subscribe("orders.>", durable="dur")
                msgs += await psub.fetch(2, timeout=2)
                info = await js.consumer_info(STREAM, "dur")
                return {
                    "got": [seen(m.subject, m.reply, m.headers, m.data) for m in msgs],
                    "info": (info.delivered.stream_seq, info.num_ack_pending, info.num_pending),
                }
            finally:
                await nc.close()

        r = await in_asyncio(scenario)
        native_got = [await mixed.next(timeout=5) for _ in range(2)]
    ack = ["$JS", "ACK", STREAM, "dur", "1"]
    assert got + r["got"] == [
        ("orders.0", b"m0", None, [*ack, "1", "1"], "6"),
        ("orders.1", b"m1", {"K": "v"}, [*ack, "2", "2"], "5"),
        # orders.2 went to the limited subscription, which had no room left for it
        ("orders.3", b"m3", None, [*ack, "4", "4"], "3"),
        ("orders.4", b"m4", None, [*ack, "5", "5"], "2"),
        ("orders.5", b"m5", {"K": "v"}, [*ack, "6", "6"], "1"),
        ("orders.6", b"m6", None, [*ack, "7", "7"], "0"),
    ]
    assert r["info"] == (7, 7, 0)
    assert [(m.subject, m.payload, m.headers) for m in native_got] == [("orders.3", b"m3", {}), ("orders.4", b"m4", {})]


async def test_consumer_info_says_when_it_last_delivered_and_was_acked(nats_url: str) -> None:
    """``delivered.last_active`` and ``ack_floor.last_active``: the times of the last
    delivery and the last ack (the server's ``omitempty``: absent before the first)."""

    async def scenario() -> list[dict[str, Any]]:
        nc, js = await connect(nats_url)
        try:
            await orders(js, 2)
            psub = await js.pull_subscribe("orders.>", durable="la", stream=STREAM)
            out = [await api_request(nc, f"$JS.API.CONSUMER.INFO.{STREAM}.la", b"")]
            msgs = await psub.fetch(2, timeout=5)
            out.append(await api_request(nc, f"$JS.API.CONSUMER.INFO.{STREAM}.la", b""))
            await msgs[0].nak()
            out.append(await api_request(nc, f"$JS.API.CONSUMER.INFO.{STREAM}.la", b""))
            await msgs[1].ack()
            out.append(await api_request(nc, f"$JS.API.CONSUMER.INFO.{STREAM}.la", b""))
            return out
        finally:
            await nc.close()

    fresh, fetched, naked, acked = await in_asyncio(scenario)
    assert list(fresh["delivered"]) == ["consumer_seq", "stream_seq"] and list(fresh["ack_floor"]) == ["consumer_seq", "stream_seq"]
    assert list(fetched["delivered"]) == ["consumer_seq", "stream_seq", "last_active"] and fetched["delivered"]["last_active"].endswith("Z")
    assert "last_active" not in naked["ack_floor"]  # a NAK is not an ack
    assert acked["ack_floor"]["last_active"].endswith("Z") and acked["ack_floor"]["last_active"] >= fetched["delivered"]["last_active"]


async def test_pull_request_limits_metadata_headers_only_and_a_durables_inactive_threshold(mock_clock: Any, nats_url: str) -> None:
    """``max_batch``, ``max_expires`` and ``max_bytes`` refuse a pull over them with the
    server's 409s; ``metadata`` is kept and may change; a durable ``headers_only``
    consumer delivers headers alone; a durable with an ``inactive_threshold`` goes
    once unused for that long (virtual time), as on the server. (nats-py's
    ConsumerConfig has no request limits: the API's JSON is sent as is.)"""

    def create(metadata: dict[str, str]) -> dict[str, Any]:
        return {"stream_name": STREAM, "config": {
            "durable_name": "lim", "ack_policy": "explicit", "max_batch": 5, "max_expires": 2 * 10**9, "max_bytes": 1000,
            "metadata": metadata, "headers_only": True,
        }}

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 2)
        out: dict[str, Any] = {}
        created = await api_request(nc, f"$JS.API.CONSUMER.CREATE.{STREAM}.lim", create({"team": "shop"}))
        c = created["config"]
        out["config"] = (c["max_batch"], c["max_expires"], c["max_bytes"], c["metadata"], c["headers_only"])
        nxt = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.lim"
        statuses = []
        for req in ({"batch": 6}, {"batch": 1, "expires": 3 * 10**9}, {"batch": 1, "max_bytes": 2000}):
            m = await nc.request(nxt, json.dumps(req).encode(), timeout=5)
            statuses.append((m.headers or {}).get("Status"))
            statuses.append((m.headers or {}).get("Description"))
        out["statuses"] = statuses
        psub = await js.pull_subscribe_bind("lim", stream=STREAM)
        (m,) = await psub.fetch(1, timeout=2)
        out["headers_only"] = (m.data, m.headers.get("Nats-Msg-Size"))
        updated = await api_request(nc, f"$JS.API.CONSUMER.CREATE.{STREAM}.lim", create({"team": "ops"}))
        out["updated"] = updated["config"]["metadata"]
        await js.add_consumer(STREAM, api.ConsumerConfig(durable_name="idle", inactive_threshold=10.0))
        out["idle"] = (await js.consumer_info(STREAM, "idle")).config.inactive_threshold
        jump(11)
        try:
            await js.consumer_info(STREAM, "idle")
            out["gone"] = False
        except NotFoundError:
            out["gone"] = True
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    # ADR-44: the server's versioning keys beside the client's own, as nats-server reports them.
    versioning = {"_nats.req.level": "0", "_nats.ver": "2.12.0", "_nats.level": "2"}
    assert r["config"] == (5, 2 * 10**9, 1000, {"team": "shop", **versioning}, True)
    assert r["statuses"] == [
        "409", "Exceeded MaxRequestBatch of 5", "409", "Exceeded MaxRequestExpires of 2s", "409", "Exceeded MaxRequestMaxBytes of 1000",
    ]
    assert r["headers_only"] == (b"", "2")  # m0
    assert r["updated"] == {"team": "ops", **versioning}
    assert r["idle"] == 10.0
    assert r["gone"] is True


async def test_pause_until_and_the_pause_api(mock_clock: Any, nats_url: str) -> None:
    """``$JS.API.CONSUMER.PAUSE`` and ``pause_until``: a paused consumer delivers
    nothing (its pulls wait), reports ``paused`` and ``pause_remaining``, and delivers
    again when the pause ends (virtual time) or is lifted."""

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 2)
        out: dict[str, Any] = {}
        info = await js.add_consumer(STREAM, durable_name="p", ack_policy="explicit")
        now = int(info.created.timestamp()) * 10**9 + info.created.microsecond * 1000  # (nats-py parses it into a datetime)
        until = PN.rfc3339(now + 60 * 10**9)
        pause = f"$JS.API.CONSUMER.PAUSE.{STREAM}.p"
        r = await api_request(nc, pause, {"pause_until": until})
        out["paused"] = (r["type"], r["paused"], r["pause_until"], r["pause_remaining"])
        raw = json.loads((await nc.request(f"$JS.API.CONSUMER.INFO.{STREAM}.p", b"", timeout=5)).data)
        out["info"] = (raw["paused"], raw["pause_remaining"], raw["config"]["pause_until"])
        psub = await js.pull_subscribe_bind("p", stream=STREAM)
        out["while_paused"] = await fetch_or_none(psub, 1)
        jump(61)
        out["after"] = [m.data for m in await fetch_or_none(psub, 1, timeout=2)]
        await api_request(nc, pause, {"pause_until": PN.rfc3339(now + 3600 * 10**9)})
        r = await api_request(nc, pause, {})
        out["resumed"] = (r["paused"], r["pause_until"], "pause_remaining" in r)
        out["again"] = [m.data for m in await fetch_or_none(psub, 1, timeout=2)]
        out["missing"] = await api_request(nc, f"$JS.API.CONSUMER.PAUSE.{STREAM}.nope", {})
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["paused"][:2] == ("io.nats.jetstream.api.v1.consumer_pause_response", True)
    assert 60 * 10**9 - 1000 < r["paused"][3] <= 60 * 10**9  # (nats-py's datetime keeps microseconds)
    assert r["info"] == (True, r["paused"][3], r["paused"][2])  # virtual time stands still
    assert r["while_paused"] == []
    assert r["after"] == [b"m0"]
    assert r["resumed"] == (False, "0001-01-01T00:00:00Z", False)
    assert r["again"] == [b"m1"]
    assert r["missing"]["error"] == {"code": 404, "err_code": 10014, "description": "consumer not found"}


async def test_priority_groups_overflow_and_pinned_client(mock_clock: Any, nats_url: str) -> None:
    """ADR-42 as nats-server 2.11 has it: an overflow request with ``min_pending``
    waits until that many messages are pending; a pinned-client consumer pins the
    first request of its group (messages carry ``Nats-Pin-Id``), makes a request
    without the pin wait, refuses another pin id (423), unpins after its
    ``priority_timeout`` without requests (virtual time) or on UNPIN; and the
    configuration rules in the server's words."""

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 3)
        out: dict[str, Any] = {}
        create = f"$JS.API.CONSUMER.CREATE.{STREAM}"
        r = await api_request(nc, f"{create}.over", {"stream_name": STREAM, "config": {
            "durable_name": "over", "ack_policy": "explicit", "priority_groups": ["jobs"], "priority_policy": "overflow"}})
        out["over_config"] = (r["config"]["priority_groups"], r["config"]["priority_policy"])
        nxt = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.over"

        async def pull(subject: str, req: dict[str, Any], timeout: float = 0.5) -> Any:
            """One pull request with its own inbox (a delivery carries the stored
            subject, which nats-py's request inbox would not route), its first answer."""
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish(subject, json.dumps(req).encode(), reply=inbox)
            try:
                return await sub.next_msg(timeout=timeout)
            except nats.errors.TimeoutError:
                return None
            finally:
                await sub.unsubscribe()

        out["overflow_waits"] = await pull(nxt, {"batch": 1, "group": "jobs", "min_pending": 5, "expires": 10**9})
        m = await pull(nxt, {"batch": 1, "group": "jobs", "min_pending": 3})
        out["overflow_served"] = m.data
        out["missing_group"] = (await pull(nxt, {"batch": 1})).headers
        out["bad_group"] = (await pull(nxt, {"batch": 1, "group": "nope"})).headers
        r = await api_request(nc, f"{create}.pin", {"stream_name": STREAM, "config": {
            "durable_name": "pin", "ack_policy": "explicit", "priority_groups": ["jobs"], "priority_policy": "pinned_client",
            "priority_timeout": 30 * 10**9}})
        out["pin_config"] = r["config"]["priority_timeout"]
        pnxt = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.pin"
        m = await pull(pnxt, {"batch": 1, "group": "jobs"})
        pin = m.headers["Nats-Pin-Id"]
        out["pinned"] = (m.data, bool(pin))
        out["other_waits"] = await pull(pnxt, {"batch": 1, "group": "jobs", "expires": 10**9})
        out["wrong_pin"] = (await pull(pnxt, {"batch": 1, "group": "jobs", "id": "NOTTHEPIN"})).headers
        m = await pull(pnxt, {"batch": 1, "group": "jobs", "id": pin})
        out["same_pin"] = (m.data, m.headers["Nats-Pin-Id"] == pin)
        raw = json.loads((await nc.request(f"$JS.API.CONSUMER.INFO.{STREAM}.pin", b"", timeout=5)).data)
        out["info"] = [(g["group"], g.get("pinned_client_id") == pin) for g in raw["priority_groups"]]
        jump(31)
        m = await pull(pnxt, {"batch": 1, "group": "jobs"})
        out["repinned"] = m.headers["Nats-Pin-Id"] != pin
        out["unpin"] = await api_request(nc, f"$JS.API.CONSUMER.UNPIN.{STREAM}.pin", {"group": "jobs"})
        out["unpin_bad"] = await api_request(nc, f"$JS.API.CONSUMER.UNPIN.{STREAM}.pin", {"group": "other"})
        out["rules"] = [
            (await api_request(nc, f"{create}.x", {"stream_name": STREAM, "config": {"durable_name": "x", **cfg}}))["error"]
            for cfg in (
                {"priority_policy": "overflow"},
                {"priority_policy": "overflow", "priority_groups": [""]},
                {"priority_policy": "overflow", "priority_groups": ["way-too-long-group-name"]},
                {"priority_groups": ["jobs"]},
                {"priority_policy": "overflow", "priority_groups": ["jobs"], "deliver_subject": "dlv"},
            )
        ]
        await nc.close()
        return out

    r = await in_asyncio(scenario)
    assert r["over_config"] == (["jobs"], "overflow")
    assert r["overflow_waits"] is None  # it waits (then nobody hears it: dropped)
    assert r["overflow_served"] == b"m0"
    assert (r["missing_group"]["Status"], r["missing_group"]["Description"]) == ("400", "Bad Request - Priority Group missing")
    assert (r["bad_group"]["Status"], r["bad_group"]["Description"]) == ("400", "Bad Request - Invalid Priority Group")
    assert r["pin_config"] == 30 * 10**9
    assert r["pinned"] == (b"m0", True)
    assert r["other_waits"] is None
    assert (r["wrong_pin"]["Status"], r["wrong_pin"]["Description"]) == ("423", "Nats-Pin-Id mismatch")
    assert r["same_pin"] == (b"m1", True)
    assert r["info"] == [("jobs", True)]
    assert r["repinned"] is True
    assert r["unpin"] == {"type": "io.nats.jetstream.api.v1.consumer_unpin_response"}
    assert r["unpin_bad"]["error"] == {"code": 400, "err_code": 10160, "description": "Provided priority group does not exist for this consumer"}
    assert [(e["err_code"], e["description"]) for e in r["rules"]] == [
        (10159, "Setting PriorityPolicy requires at least one PriorityGroup to be set"),
        (10161, "Group name cannot be an empty string"),
        (10162, "Valid priority group name must match A-Z, a-z, 0-9, -_/=)+ and may not exceed 16 characters"),
        (10196, "consumer can not have priority groups when policy is none"),
        (10178, "priority groups can not be used with push consumers"),
    ]


async def test_sample_freq_sends_the_servers_ack_metric_advisories(mock_clock: Any, nats_url: str) -> None:
    """``sample_freq`` (here 100%): each ack of a delivery gets nats-server's
    ``io.nats.jetstream.metric.v1.consumer_ack`` on
    ``$JS.EVENT.METRIC.CONSUMER.ACK.<stream>.<consumer>``; a frequency that does not
    parse is 10095."""

    async def scenario() -> dict[str, Any]:
        nc, js = await connect(nats_url)
        await orders(js, 2)
        events = await nc.subscribe(f"$JS.EVENT.METRIC.CONSUMER.ACK.{STREAM}.sampled")
        info = await js.add_consumer(STREAM, api.ConsumerConfig(durable_name="sampled", ack_policy="explicit", sample_freq="100%"))
        psub = await js.pull_subscribe_bind("sampled", stream=STREAM)
        msgs = await psub.fetch(2, timeout=2)
        jump(1.5)
        for m in msgs:
            await m.ack_sync()
        got = [json.loads((await events.next_msg(timeout=2)).data) for _ in range(2)]
        bad = await api_request(nc, f"$JS.API.CONSUMER.CREATE.{STREAM}.bad", {"stream_name": STREAM, "config": {
            "durable_name": "bad", "sample_freq": "often"}})
        await nc.close()
        return {"config": info.config.sample_freq, "events": got, "bad": bad["error"]}

    r = await in_asyncio(scenario)
    assert r["config"] == "100%"
    for i, e in enumerate(r["events"], 1):
        assert e["type"] == "io.nats.jetstream.metric.v1.consumer_ack" and e["id"] and e["timestamp"]
        assert (e["stream"], e["consumer"], e["consumer_seq"], e["stream_seq"], e["deliveries"]) == (STREAM, "sampled", i, i, 1)
        assert e["ack_time"] == 1_500_000_000  # virtual time: delivered, then 1.5 s
    assert r["bad"] == {"code": 400, "err_code": 10095,
                        "description": 'failed to parse consumer sampling configuration: strconv.Atoi: parsing "often": invalid syntax'}
