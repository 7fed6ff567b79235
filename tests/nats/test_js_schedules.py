"""Message schedules (NATS ADR-51) on the NATS listener, driven by nats-py: the
stream setting ``allow_msg_schedules`` and its rules, every publish error with
nats-server's code, err_code and description, the produced message and its headers,
a client's purge of a schedule (``broker/core/_schedules.py``). The expected values
were checked against nats-server 2.15.1 running the same scenarios."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats
import nats.js.errors as jse
from helpers import in_asyncio
from nats.js.api import StreamConfig

from broker import ServerHandle

SCHED, TARGET, TTL, ROLLUP, SOURCE, TZ = (
    "Nats-Schedule", "Nats-Schedule-Target", "Nats-Schedule-TTL", "Nats-Schedule-Rollup", "Nats-Schedule-Source",
    "Nats-Schedule-Time-Zone",
)
FAR = "@at 2099-01-01T00:00:00Z"
PAST = "@at 2020-01-01T00:00:00Z"


async def _error(coro: Any) -> tuple[int | None, int | None, str | None] | str:
    try:
        await coro
    except jse.APIError as err:
        return err.code, err.err_code, err.description
    return "stored"


async def config_scenario(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: dict[str, Any] = {}
    try:
        si = await js.add_stream(StreamConfig(name="S", subjects=["s.>"], allow_msg_schedules=True))
        out["created"] = (si.config.allow_msg_schedules, si.config.allow_rollup_hdrs, si.config.deny_purge,
                          (si.config.metadata or {}).get("_nats.req.level"))
        raw = await nc.request("$JS.API.STREAM.INFO.S", b"", timeout=5)
        out["raw"] = json.loads(raw.data)["config"].get("allow_msg_schedules")
        out["disable"] = await _error(js.update_stream(StreamConfig(name="S", subjects=["s.>"], allow_msg_schedules=False)))
        out["discard_new"] = await _error(js.add_stream(
            StreamConfig(name="D", subjects=["d.>"], allow_msg_schedules=True, discard="new")))
        si = await js.add_stream(StreamConfig(name="P", subjects=["p.>"]))
        si.config.allow_msg_schedules = True
        si = await js.update_stream(si.config)  # turned on by an update
        out["turned_on"] = (si.config.allow_msg_schedules, si.config.allow_rollup_hdrs)
    finally:
        await nc.close()
    return out


async def test_the_stream_setting_and_its_rules(nats_url: str, nats_server: ServerHandle) -> None:
    out = await in_asyncio(lambda: config_scenario(nats_url))
    assert out == {
        "created": (True, True, False, "2"),
        "raw": True,
        "disable": (500, 10052, "message schedules can not be disabled"),
        "discard_new": (500, 10052, "message scheduling cannot use discard new"),
        "turned_on": (True, True),
    }


async def errors_scenario(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: dict[str, Any] = {}
    try:
        await js.add_stream(StreamConfig(name="OFF", subjects=["off.>"]))
        await js.add_stream(StreamConfig(name="ON", subjects=["on.>"], allow_msg_schedules=True))
        await js.add_stream(StreamConfig(name="TTL", subjects=["ttl.>"], allow_msg_schedules=True, allow_msg_ttl=True))
        cases: dict[str, tuple[str, dict[str, str]]] = {
            "disabled": ("off.a", {SCHED: FAR, TARGET: "off.b"}),
            "disabled_bad_pattern": ("off.a", {SCHED: "nope", TARGET: "off.b"}),
            "disabled_scheduler": ("off.a", {"Nats-Schedule-Next": "purge", "Nats-Scheduler": "off.b"}),
            "pattern": ("on.a", {SCHED: "@at tomorrow", TARGET: "on.b"}),
            "pattern_every_short": ("on.a", {SCHED: "@every 500ms", TARGET: "on.b"}),
            "pattern_cron_fields": ("on.a", {SCHED: "* * * * *", TARGET: "on.b"}),
            "pattern_never": ("on.a", {SCHED: "0 0 0 30 2 *", TARGET: "on.b"}),
            "pattern_at_zone": ("on.a", {SCHED: FAR, TZ: "Europe/Berlin", TARGET: "on.b"}),
            "zone": ("on.a", {SCHED: "@daily", TZ: "Mars/Olympus", TARGET: "on.b"}),
            "target_missing": ("on.a", {SCHED: FAR}),
            "target_self": ("on.a", {SCHED: FAR, TARGET: "on.a"}),
            "target_outside": ("on.a", {SCHED: FAR, TARGET: "elsewhere"}),
            "target_wildcard": ("on.a", {SCHED: FAR, TARGET: "on.*"}),
            "ttl_invalid": ("ttl.a", {SCHED: FAR, TARGET: "ttl.b", TTL: "soon"}),
            "ttl_disabled": ("on.a", {SCHED: FAR, TARGET: "on.b", TTL: "5s"}),
            "schedule_rollup": ("on.a", {SCHED: FAR, TARGET: "on.b", ROLLUP: "all"}),
            "own_rollup": ("on.a", {SCHED: FAR, TARGET: "on.b", "Nats-Rollup": "all"}),
            "source_is_target": ("on.a", {SCHED: FAR, TARGET: "on.b", SOURCE: "on.b"}),
            "source_outside": ("on.a", {SCHED: FAR, TARGET: "on.b", SOURCE: "elsewhere"}),
            "next_not_purge": ("on.a", {"Nats-Schedule-Next": "later", "Nats-Scheduler": "on.b"}),
            "purge_no_scheduler": ("on.a", {"Nats-Schedule-Next": "purge"}),
            "scheduler_alone": ("on.a", {"Nats-Scheduler": "on.b"}),
            "ok_at": ("on.a", {SCHED: FAR, TARGET: "on.b"}),
            "ok_cron": ("on.c", {SCHED: "0 30 9 * * mon-fri", TZ: "America/New_York", TARGET: "on.b"}),
            "ok_every": ("ttl.a", {SCHED: "@every 1h", TARGET: "ttl.b", TTL: "5m", ROLLUP: "sub", SOURCE: "ttl.c"}),
            "ok_empty_pattern": ("on.d", {SCHED: "", TARGET: "on.b"}),
            "purge_names_plain": ("on.z", {"Nats-Schedule-Next": "purge", "Nats-Scheduler": "on.plain"}),
            "purge_names_nothing": ("on.z", {"Nats-Schedule-Next": "purge", "Nats-Scheduler": "on.none"}),
        }
        await js.publish("on.plain", b"not a schedule")
        for name, (subject, headers) in cases.items():
            out[name] = await _error(js.publish(subject, b"x", headers=headers))
        out["messages"] = {s: (await js.stream_info(s)).state.messages for s in ("OFF", "ON", "TTL")}
    finally:
        await nc.close()
    return out


async def test_every_publish_error_as_nats_server(nats_url: str, nats_server: ServerHandle) -> None:
    out = await in_asyncio(lambda: errors_scenario(nats_url))
    disabled = (400, 10188, "message schedules is disabled")
    pattern = (400, 10189, "message schedules pattern is invalid")
    target = (400, 10190, "message schedules target is invalid")
    rollup = (400, 10192, "message schedules invalid rollup")
    source = (400, 10203, "message schedules source is invalid")
    scheduler = (400, 10212, "message schedules invalid scheduler")
    assert out == {
        "disabled": disabled, "disabled_bad_pattern": disabled, "disabled_scheduler": disabled,
        "pattern": pattern, "pattern_every_short": pattern, "pattern_cron_fields": pattern, "pattern_never": pattern,
        "pattern_at_zone": pattern, "zone": (400, 10223, "message schedules time zone is invalid"),
        "target_missing": target, "target_self": target, "target_outside": target, "target_wildcard": target,
        "ttl_invalid": (400, 10191, "message schedules invalid per-message TTL"),
        "ttl_disabled": (400, 10166, "per-message TTL is disabled"),
        "schedule_rollup": rollup, "own_rollup": rollup, "source_is_target": source, "source_outside": source,
        "next_not_purge": scheduler, "purge_no_scheduler": scheduler, "scheduler_alone": scheduler,
        "ok_at": "stored", "ok_cron": "stored", "ok_every": "stored", "ok_empty_pattern": "stored",
        "purge_names_plain": scheduler, "purge_names_nothing": "stored",
        "messages": {"OFF": 0, "ON": 5, "TTL": 1},
    }


async def firing_scenario(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: dict[str, Any] = {}
    try:
        await js.add_stream(StreamConfig(name="F", subjects=["f.>"], allow_msg_schedules=True, allow_msg_ttl=True))
        sub = await nc.subscribe("f.out")
        await js.publish("f.src", b"from source", headers={"Src": "1"})
        ack = await js.publish("f.sched", b"own", headers={
            SCHED: PAST, TARGET: "f.out", TTL: "1m", SOURCE: "f.src", "Nats-Msg-Id": "m1",
            "Nats-Expected-Last-Subject-Sequence": "0", "App": "x",
        })
        for _ in range(100):  # (the server fires at most every 250 ms)
            if (await js.stream_info("F", subjects_filter="f.out")).state.subjects:
                break
            await asyncio.sleep(0.05)
        got = await js.get_msg("F", subject="f.out", direct=False)
        out["produced"] = (got.subject, got.data, dict(got.headers or {}))
        out["stored"] = got.seq > ack.seq
        try:  # stored into the stream, not published: a core subscriber hears nothing
            out["core"] = (await sub.next_msg(timeout=0.2)).subject
        except nats.errors.TimeoutError:
            out["core"] = None
        info = await js.stream_info("F", subjects_filter=">")
        out["subjects"] = info.state.subjects
        for _ in range(100):  # (the schedule's removal)
            if "f.sched" not in (info.state.subjects or {}):
                break
            await asyncio.sleep(0.05)
            info = await js.stream_info("F", subjects_filter=">")
        out["subjects"] = info.state.subjects
        # A client's purge of a pending schedule.
        await js.publish("f.later", b"", headers={SCHED: FAR, TARGET: "f.out"})
        await js.publish("f.other", b"", headers={"Nats-Schedule-Next": "purge", "Nats-Scheduler": "f.later"})
        info = await js.stream_info("F", subjects_filter=">")
        out["after_purge"] = info.state.subjects
    finally:
        await nc.close()
    return out


async def test_a_schedule_produces_its_message_with_the_servers_headers(nats_url: str, nats_server: ServerHandle) -> None:
    started = time.monotonic()
    out = await in_asyncio(lambda: firing_scenario(nats_url))
    assert time.monotonic() - started < 5
    assert out["produced"] == ("f.out", b"from source", {
        "Src": "1", "Nats-Scheduler": "f.sched", "Nats-Schedule-Next": "purge", "Nats-TTL": "1m",
    })
    assert out["stored"] is True
    assert out["core"] is None
    assert out["subjects"] == {"f.src": 1, "f.out": 1}  # the schedule went
    assert out["after_purge"] == {"f.src": 1, "f.out": 1, "f.other": 1}
