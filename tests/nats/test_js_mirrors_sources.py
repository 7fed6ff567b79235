"""Mirrors and sources within one broker (docs/semantics.md, "Mirrors and sources"),
with nats-py against the NATS listener: what nats-server does, byte for byte where a
client can see it."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import nats
import pytest
import trio
import trio.testing

from broker.client import connect
from tests.conftest import make_config, start_server
from tests.helpers import api_request, in_asyncio
from test_js_streams import _js

API = "$JS.API."


async def _wait_for(nc: Any, name: str, pred: Any, timeout: float = 5.0) -> dict[str, Any]:
    """STREAM.INFO of ``name`` once ``pred(info)`` holds (the copier works beside the test)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        info = await api_request(nc, f"{API}STREAM.INFO.{name}", {})
        if pred(info) or loop.time() > end:
            return info
        await asyncio.sleep(0.01)


async def _get(nc: Any, name: str, seq: int) -> dict[str, Any]:
    return (await api_request(nc, f"{API}STREAM.MSG.GET.{name}", {"seq": seq}))


def _hdrs(msg: dict[str, Any]) -> str:
    return base64.b64decode(msg["hdrs"]).decode() if msg.get("hdrs") else ""


async def test_a_mirror_keeps_the_origin_sequences_gaps_and_timestamps(nats_url: str) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        await js.add_stream(name="O", subjects=["o.>"])
        for i in range(1, 7):
            await js.publish(f"o.{i}", f"m{i}".encode(), headers={"X-Num": str(i)})
        await js.delete_msg("O", 2)
        await js.delete_msg("O", 3)
        r = await api_request(nc, f"{API}STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
        assert "error" not in r, r
        assert r["config"]["mirror"] == {"name": "O"}
        assert "subjects" not in r["config"] or r["config"]["subjects"] == []
        info = await _wait_for(nc, "M", lambda i: i["state"]["last_seq"] == 6)
        assert info["state"]["messages"] == 4 and info["state"]["first_seq"] == 1
        assert info["mirror"]["name"] == "O" and info["mirror"]["lag"] == 0 and info["mirror"]["active"] >= 0
        for seq in (1, 4, 5, 6):
            o, m = (await _get(nc, "O", seq))["message"], (await _get(nc, "M", seq))["message"]
            assert (m["subject"], m["data"], m["time"], _hdrs(m)) == (o["subject"], o["data"], o["time"], _hdrs(o))
        assert (await _get(nc, "M", 2))["error"]["err_code"] == 10037
        # New messages follow, and a later gap too.
        await js.publish("o.7", b"m7")
        await js.publish("o.8", b"m8")
        await js.delete_msg("O", 7)
        await js.publish("o.9", b"m9")
        info = await _wait_for(nc, "M", lambda i: i["state"]["last_seq"] == 9)
        assert info["state"]["last_seq"] == 9
        # A direct publish reaches no stream: the mirror captures nothing.
        with pytest.raises(nats.js.errors.NoStreamResponseError):
            await js.publish("M", b"x")

    await _js(nats_url, scenario)


async def test_mirror_configuration_errors_as_the_server(nats_url: str) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        await js.add_stream(name="O", subjects=["o.>"])

        async def err(cfg: dict[str, Any], op: str = "CREATE") -> tuple[int, int, str]:
            r = await api_request(nc, f"{API}STREAM.{op}.{cfg['name']}", cfg)
            e = r["error"]
            return e["code"], e["err_code"], e["description"]

        assert await err({"name": "M", "mirror": {"name": "O"}, "subjects": ["m"]}) == (
            400, 10034, "stream mirrors can not contain subjects")
        assert await err({"name": "M", "mirror": {"name": "O"}, "sources": [{"name": "O"}]}) == (
            400, 10031, "stream mirrors can not also contain other sources")
        assert await err({"name": "M", "mirror": {"name": "O"}, "first_seq": 5}) == (
            400, 10143, "stream mirrors can not have first sequence configured")
        assert await err({"name": "M", "mirror": {"name": "O"}, "subject_delete_marker_ttl": 10**9,
                          "allow_msg_ttl": True, "allow_rollup_hdrs": True}) == (
            500, 10052, "subject delete markers forbidden on mirrors")
        assert await err({"name": "M", "mirror": {"name": "O.x"}}) == (400, 10142, "mirrored stream name is invalid")
        assert await err({"name": "M", "mirror": {"name": "O", "filter_subject": "o.a", "subject_transforms": [
            {"src": "o.b", "dest": "b"}]}}) == (
            400, 10150, "mirror with multiple subject transforms cannot also have a single subject filter")
        assert await err({"name": "S", "sources": [{"name": "O"}, {"name": "O"}]}) == (
            400, 10140, "duplicate source configuration detected")
        assert await err({"name": "S", "sources": [{"name": ""}]}) == (400, 10141, "sourced stream name is invalid")
        assert await err({"name": "S", "subjects": ["s.>"], "sources": [{"name": "S"}]}) == (500, 10052, "detected cycle")
        assert await err({"name": "M", "mirror": {"name": "O", "external": {"api": "$JS.hub.API", "deliver": ""}}}) == (
            500, 10052,
            "source 'O': JetStream domain 'hub' is not this server's and no [[nats.remotes]] entry has it (configured: none)")
        # A mirror's configuration can not change, nor be added by update.
        r = await api_request(nc, f"{API}STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
        assert "error" not in r, r
        assert await err({"name": "M", "mirror": {"name": "O", "opt_start_seq": 3}}, "UPDATE") == (
            400, 10055, "stream mirror configuration can not be updated")
        assert await err({"name": "O", "subjects": ["o.>"], "mirror": {"name": "M"}}, "UPDATE") == (
            400, 10034, "stream mirrors can not contain subjects")  # (checked first, as the server)
        await js.add_stream(name="P", subjects=["p.>"])
        assert await err({"name": "P", "mirror": {"name": "O"}}, "UPDATE") == (
            400, 10055, "stream mirror configuration can not be updated")

    await _js(nats_url, scenario)


async def test_sources_merge_with_filter_transform_and_the_source_header(nats_url: str) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        await js.add_stream(name="A", subjects=["a.>"])
        await js.add_stream(name="B", subjects=["b.>"])
        await js.publish("a.1", b"a1", headers={"Nats-Expected-Stream": "A"})
        await js.publish("a.skip", b"no")
        await js.publish("b.x", b"b1")
        r = await api_request(nc, f"{API}STREAM.CREATE.S", {
            "name": "S", "subjects": ["s.own"],
            "sources": [{"name": "A", "filter_subject": "a.1"},
                        {"name": "B", "subject_transforms": [{"src": "b.*", "dest": "from_b.{{wildcard(1)}}"}]}],
        })
        assert "error" not in r, r
        info = await _wait_for(nc, "S", lambda i: i["state"]["messages"] == 2)
        assert info["state"]["messages"] == 2
        by_subject = {}
        for seq in (1, 2):
            m = (await _get(nc, "S", seq))["message"]
            by_subject[m["subject"]] = _hdrs(m)
        a_hdr, b_hdr = by_subject["a.1"], by_subject["from_b.x"]
        assert "Nats-Expected-Stream" not in a_hdr
        a_src = next(line for line in a_hdr.split("\r\n") if line.startswith("Nats-Stream-Source:"))
        b_src = next(line for line in b_hdr.split("\r\n") if line.startswith("Nats-Stream-Source:"))
        a_fields = a_src.split(": ", 1)[1].split(" ")
        assert a_fields[:5] == ["A", "1", "a.1", ">", "a.1"] and len(a_fields) == 6 and len(a_fields[5]) == 8
        assert b_src.split(": ", 1)[1].split(" ")[:5] == ["B", "1", "b.*", "from_b.{{wildcard(1)}}", "b.x"]
        # Its own subjects still capture, with a new sequence.
        ack = await js.publish("s.own", b"mine")
        assert ack.stream == "S" and ack.seq == 3
        sources = {s["name"]: s for s in info["sources"]}
        assert sources["A"]["filter_subject"] == "a.1"
        assert sources["B"]["subject_transforms"] == [{"src": "b.*", "dest": "from_b.{{wildcard(1)}}"}]

    await _js(nats_url, scenario)


async def test_a_purged_source_copy_does_not_take_again_what_it_took(nats_url: str) -> None:
    """The copy purged, then its copiers started again (a source added): what the
    source already took is not taken again, though no message of the copy names it
    any more; what comes next is."""
    async def scenario(nc: Any, js: Any) -> None:
        await js.add_stream(name="A", subjects=["a.>"])
        await js.add_stream(name="B", subjects=["b.>"])
        for i in range(3):
            await js.publish(f"a.{i}", b"x")
        await api_request(nc, f"{API}STREAM.CREATE.S", {"name": "S", "sources": [{"name": "A"}]})
        await _wait_for(nc, "S", lambda i: i["state"]["messages"] == 3)
        await js.purge_stream("S")
        await js.publish("b.1", b"y")
        r = await api_request(nc, f"{API}STREAM.UPDATE.S", {"name": "S", "sources": [{"name": "A"}, {"name": "B"}]})
        assert "error" not in r, r
        info = await _wait_for(nc, "S", lambda i: i["state"]["messages"] == 1)
        await js.publish("a.3", b"z")
        info = await _wait_for(nc, "S", lambda i: i["state"]["messages"] == 2)
        await asyncio.sleep(0.2)  # (time for a wrong copy of a.0 to a.2 to show)
        info = await api_request(nc, f"{API}STREAM.INFO.S", {})
        assert (info["state"]["messages"], info["state"]["first_seq"], info["state"]["last_seq"]) == (2, 4, 5)
        subjects = {(await _get(nc, "S", seq))["message"]["subject"] for seq in (4, 5)}
        assert subjects == {"b.1", "a.3"}

    await _js(nats_url, scenario)


async def test_opt_start_seq_and_time(nats_url: str) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        await js.add_stream(name="O", subjects=["o.>"])
        for i in range(1, 6):
            await js.publish(f"o.{i}", b"x")
        third = (await _get(nc, "O", 3))["message"]["time"]
        await api_request(nc, f"{API}STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O", "opt_start_seq": 4}})
        await api_request(nc, f"{API}STREAM.CREATE.S", {"name": "S", "sources": [{"name": "O", "opt_start_time": third}]})
        m = await _wait_for(nc, "M", lambda i: i["state"]["messages"] == 2)
        assert (m["state"]["first_seq"], m["state"]["last_seq"]) == (4, 5)
        s = await _wait_for(nc, "S", lambda i: i["state"]["messages"] == 3)
        assert s["state"]["messages"] == 3
        first = (await _get(nc, "S", 1))["message"]
        assert first["subject"] == "o.3"

    await _js(nats_url, scenario)


async def test_promotion_by_removing_the_mirror(nats_url: str) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        await js.add_stream(name="O", subjects=["o.>"])
        await js.publish("o.1", b"x")
        await api_request(nc, f"{API}STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
        await _wait_for(nc, "M", lambda i: i["state"]["messages"] == 1)
        r = await api_request(nc, f"{API}STREAM.UPDATE.M", {"name": "M", "subjects": ["m.>"]})
        assert "error" not in r, r
        assert "mirror" not in r["config"] and "mirror" not in r
        await js.publish("o.2", b"y")
        ack = await js.publish("m.1", b"own")
        assert ack.stream == "M" and ack.seq == 2
        await asyncio.sleep(0.1)
        info = await api_request(nc, f"{API}STREAM.INFO.M", {})
        assert info["state"]["messages"] == 2  # o.2 was not copied

    await _js(nats_url, scenario)


async def test_the_origin_deleted_is_reported_and_the_copy_kept(nats_server: Any, nats_url: str) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        await js.add_stream(name="O", subjects=["o.>"])
        await js.publish("o.1", b"x")
        await api_request(nc, f"{API}STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
        await _wait_for(nc, "M", lambda i: i["state"]["messages"] == 1)
        await js.delete_stream("O")
        info = await _wait_for(nc, "M", lambda i: "error" in i["mirror"])
        assert info["mirror"]["error"] == {"code": 404, "err_code": 10059, "description": "stream not found"}
        assert info["state"]["messages"] == 1

    await _js(nats_url, scenario)
    assert nats_server.broker.counters.copy_origin_missing >= 1


async def _in_rounds(config: Any, rounds: int, scenario: Any) -> None:
    """``scenario(nc, js, round)`` with nats-py against a broker started afresh on
    the same data directory for each round."""
    for r in range(rounds):
        async with start_server(config) as handle:
            async def run(url: str = handle.nats_url, r: int = r) -> None:
                nc = await nats.connect(url)
                try:
                    await scenario(nc, nc.jetstream(), r)
                finally:
                    await nc.close()

            await in_asyncio(run)


async def test_a_restart_resumes_with_no_duplicate_and_no_gap(data_dir: Path) -> None:
    async def scenario(nc: Any, js: Any, r: int) -> None:
        if r == 0:
            await js.add_stream(name="O", subjects=["o.>"])
            await api_request(nc, f"{API}STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
            await api_request(nc, f"{API}STREAM.CREATE.S", {"name": "S", "sources": [{"name": "O"}]})
        for i in range(5):
            await js.publish(f"o.{r}.{i}", b"x")
        n = 5 * (r + 1)
        m = await _wait_for(nc, "M", lambda i: i["state"]["messages"] == n)
        s = await _wait_for(nc, "S", lambda i: i["state"]["messages"] == n)
        assert m["state"]["messages"] == n and m["state"]["last_seq"] == n
        assert s["state"]["messages"] == n and s["state"]["last_seq"] == n

    await _in_rounds(make_config(data_dir, **{"nats.enabled": True}), 3, scenario)


@pytest.mark.parametrize("fsync", ["never", "1m", "always"])
async def test_copies_keep_up_batch_after_batch_under_every_fsync_setting(data_dir: Path, fsync: str) -> None:
    """A copier waits for the group commit only when a PubAck would (``always``):
    under an interval (here a minute) or ``never``, batch after batch is copied as it
    comes, not one per sync (or only the first)."""
    async with start_server(make_config(data_dir, **{"nats.enabled": True, "system.partition.fsync": fsync})) as handle:
        async def scenario(nc: Any, js: Any) -> None:
            await js.add_stream(name="O", subjects=["o.>"])
            await api_request(nc, f"{API}STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
            await api_request(nc, f"{API}STREAM.CREATE.S", {"name": "S", "sources": [{"name": "O"}]})
            for n in range(1, 5):  # one message at a time: one batch each
                await js.publish(f"o.{n}", b"x")
                for name in ("M", "S"):
                    info = await _wait_for(nc, name, lambda i, n=n: i["state"]["messages"] == n)
                    assert info["state"]["messages"] == n, (name, info["state"])

        await _js(handle.nats_url, scenario)


def _jump(seconds: float) -> None:
    """Move the broker's virtual time on (from nats-py's thread) and let what fell due run."""

    async def advance() -> None:
        trio.lowlevel.current_clock().jump(seconds)  # type: ignore[attr-defined]
        await trio.testing.wait_all_tasks_blocked()

    trio.from_thread.run(advance)


async def test_ttl_messages_are_kept_without_allow_msg_ttl_and_expire_with_it(mock_clock: Any, nats_url: str) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        await api_request(nc, f"{API}STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"], "allow_msg_ttl": True})
        await js.publish("o.1", b"x", headers={"Nats-TTL": "5s"})
        await api_request(nc, f"{API}STREAM.CREATE.K", {"name": "K", "mirror": {"name": "O"}})
        await api_request(nc, f"{API}STREAM.CREATE.E", {"name": "E", "mirror": {"name": "O"}, "allow_msg_ttl": True})
        await api_request(nc, f"{API}STREAM.CREATE.S", {"name": "S", "sources": [{"name": "O"}]})
        for name in ("K", "E", "S"):
            info = await _wait_for(nc, name, lambda i: i["state"]["messages"] == 1)
            assert info["state"]["messages"] == 1, name
        _jump(10)
        counts = {n: (await api_request(nc, f"{API}STREAM.INFO.{n}", {}))["state"]["messages"] for n in "OKES"}
        assert counts == {"O": 0, "K": 1, "E": 0, "S": 1}

    await _js(nats_url, scenario)


async def test_binary_protocol_mirror_option(server: Any) -> None:
    async with connect(server.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "orig", 1, subjects=["x.>"])
        await c.create_topic("s", "copy", 1, mirror={"name": "s/orig"})
        for i in range(3):
            await c.publish("x.%d" % i, b"p")
        for _ in range(200):
            details = await c.get_topic("s", "copy")
            if details.messages_count == 3:
                break
            await trio.sleep(0.01)
        assert details.messages_count == 3
        from broker.client import BrokerError as ClientError  # type: ignore[attr-defined]

        with pytest.raises(Exception) as exc:
            await c.create_topic("s", "bad", 1, mirror={"name": "s/orig"}, subjects=["y.>"])
        assert getattr(exc.value, "code", None) == 6060


@pytest.mark.parametrize("storage", ["file", "memory"])
async def test_a_restart_after_the_copies_lost_their_messages(data_dir: Path, storage: str) -> None:
    """The source's copy purged, then the broker restarted: a file source takes
    nothing again (its marks are kept on disk), a file mirror resumes after the
    origin sequence it reached; memory copies start over as nats-server's do
    (nothing of them survives a restart), a memory mirror holding its origin's
    messages under their sequences from 1 again."""
    async def scenario(nc: Any, js: Any, r: int) -> None:
        if r == 0:
            await js.add_stream(name="O", subjects=["o.>"])
            await api_request(nc, f"{API}STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}, "storage": storage})
            await api_request(nc, f"{API}STREAM.CREATE.S", {"name": "S", "sources": [{"name": "O"}], "storage": storage})
        for i in range(5):
            await js.publish(f"o.{r}.{i}", b"x")
        if r == 0:
            await _wait_for(nc, "M", lambda i: i["state"]["last_seq"] == 5)
            await _wait_for(nc, "S", lambda i: i["state"]["messages"] == 5)
            await js.purge_stream("S")
            return
        want_s = 5 if storage == "file" else 10
        await _wait_for(nc, "M", lambda i: i["state"]["last_seq"] == 10)
        await _wait_for(nc, "S", lambda i: i["state"]["messages"] == want_s)
        await asyncio.sleep(0.2)  # (time for a wrong copy to show)
        m = await api_request(nc, f"{API}STREAM.INFO.M", {})
        s = await api_request(nc, f"{API}STREAM.INFO.S", {})
        assert (m["state"]["messages"], m["state"]["first_seq"], m["state"]["last_seq"]) == (10, 1, 10)
        assert s["state"]["messages"] == want_s, s["state"]
        subjects = [(await _get(nc, "S", seq))["message"]["subject"]
                    for seq in range(s["state"]["first_seq"], s["state"]["last_seq"] + 1)]
        assert subjects == [f"o.{k}.{i}" for k in (range(1, 2) if storage == "file" else range(2)) for i in range(5)]

    await _in_rounds(make_config(data_dir, **{"nats.enabled": True}), 2, scenario)


async def test_a_work_queue_source_emptied_by_its_acks_takes_nothing_again_after_a_restart(data_dir: Path) -> None:
    """A work queue fed by a source: its consumer acks everything (the queue empties),
    the broker restarts, and only what the origin got since comes in."""
    async def scenario(nc: Any, js: Any, r: int) -> None:
        if r == 0:
            await js.add_stream(name="O", subjects=["o.>"])
            await api_request(nc, f"{API}STREAM.CREATE.Q", {
                "name": "Q", "sources": [{"name": "O"}], "retention": "workqueue"})
        for i in range(5):
            await js.publish(f"o.{r}.{i}", b"x")
        await _wait_for(nc, "Q", lambda i: i["state"]["messages"] == 5)
        sub = await js.pull_subscribe("", "w", stream="Q")
        got = await sub.fetch(5, timeout=5)
        assert [m.subject for m in got] == [f"o.{r}.{i}" for i in range(5)]
        for m in got:
            await m.ack_sync()
        info = await _wait_for(nc, "Q", lambda i: i["state"]["messages"] == 0)
        assert info["state"]["messages"] == 0
        await asyncio.sleep(0.2)  # (time for a wrong copy to show)
        info = await api_request(nc, f"{API}STREAM.INFO.Q", {})
        assert info["state"]["messages"] == 0 and info["state"]["last_seq"] == 5 * (r + 1), info["state"]

    await _in_rounds(make_config(data_dir, **{"nats.enabled": True}), 2, scenario)
