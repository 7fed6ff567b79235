"""Message schedules (NATS ADR-51) on the binary protocol, in virtual time: the
topic option ``allow_msg_schedules`` through the bundled client, firing never early
and within the expiry-lag target, a schedule before a TTL or max-age removal of the
same instant, the stats (``broker/core/_schedules.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ttl_helpers import NS, advance, all_messages, broker_and_client

from broker import Clock
from protocol import BrokerError, ErrorCode
from protocol.nats import rfc3339

#: A wall clock start on a whole second (virtual time moves from there).
T0 = 1_800_000_000 * NS


def _at(ns: int) -> str:
    return "@at " + rfc3339(ns).replace(".000000000", "")


async def _topic(c: Any, **options: Any) -> None:
    await c.create_stream("s")
    await c.create_topic("s", "t", subjects=["a.>"], allow_msg_schedules=True, **options)


async def test_the_option_turns_on_rollups_and_cannot_be_turned_off(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c)
        details = await c.get_topic("s", "t")
        assert details.options["allow_msg_schedules"] is True
        assert details.options["allow_rollup"] is True  # the automatic fix
        with pytest.raises(BrokerError) as err:
            await c.update_topic("s", "t", allow_msg_schedules=False)
        assert (err.value.code, err.value.message) == (ErrorCode.INVALID_TOPIC_CONFIG, "message schedules can not be disabled")
        await c.create_topic("s", "p", subjects=["p.>"])
        with pytest.raises(BrokerError) as err:
            await c.create_topic("s", "q", subjects=["q.>"], allow_msg_schedules=True, pedantic=True)
        assert err.value.message == "message scheduling cannot be set if roll-ups are disabled"
        with pytest.raises(BrokerError) as err:
            await c.publish("p.x", b"", headers={"Nats-Schedule": "@every 1s", "Nats-Schedule-Target": "p.y"})
        assert (err.value.code, err.value.message) == (ErrorCode.SCHEDULES_DISABLED, "message schedules is disabled")


async def test_a_one_off_fires_never_early_within_the_lag_target_and_goes(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir, Clock(T0)) as (h, c):
        await _topic(c, allow_msg_ttl=True)
        ack = await c.publish("a.sched", b"hello", headers={
            "Nats-Schedule": _at(T0 + 5 * NS), "Nats-Schedule-Target": "a.out", "Nats-Schedule-TTL": "30s",
            "Nats-Msg-Id": "x", "Custom": "kept",
        })
        stats = await c.stats()
        assert (stats["pending_schedules"], stats["schedules_fired"]) == (1, 0)
        await advance(4.999)
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["a.sched"]  # never early
        await advance(0.011)  # the 10 ms tick after the time (the target: within 100 ms)
        msgs = await all_messages(c, "s", "t")
        assert [m.subject for m in msgs] == ["a.out"]  # the schedule itself is gone
        out = msgs[0]
        assert out.payload == b"hello"
        assert out.headers == {"Custom": "kept", "Nats-Scheduler": "a.sched", "Nats-Schedule-Next": "purge", "Nats-TTL": "30s"}
        assert out.ttl == 30
        assert T0 + 5 * NS <= out.timestamp <= T0 + 5 * NS + 100_000_000
        assert out.offset > ack.offset
        stats = await c.stats()
        assert (stats["pending_schedules"], stats["schedules_fired"]) == (0, 1)
        await advance(30.02)
        assert await all_messages(c, "s", "t") == []  # its TTL applies


async def test_every_repeats_and_a_new_schedule_replaces_the_old(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir, Clock(T0)) as (_, c):
        await _topic(c)
        await c.publish("a.tick", b"t", headers={"Nats-Schedule": "@every 2s", "Nats-Schedule-Target": "a.out"})
        for _ in range(3):
            await advance(2.01)
        msgs = await all_messages(c, "s", "t")
        outs = [m for m in msgs if m.subject == "a.out"]
        assert len(outs) == 3
        assert [m.headers["Nats-Schedule-Next"] for m in outs] == [rfc3339(T0 + k * 2 * NS) for k in (2, 3, 4)]
        # The same subject again: a roll-up, one schedule pending.
        await c.publish("a.tick", b"u", headers={"Nats-Schedule": "@every 10s", "Nats-Schedule-Target": "a.out"})
        assert (await c.stats())["pending_schedules"] == 1
        assert len([m for m in await all_messages(c, "s", "t") if m.subject == "a.tick"]) == 1
        await advance(2.01)
        assert len([m for m in await all_messages(c, "s", "t") if m.subject == "a.out"]) == 3
        # Deleting the schedule message ends it.
        last = await c.get_last("s", "t", "a.tick")
        await c.delete_message("s", "t", 0, last.offset)
        assert (await c.stats())["pending_schedules"] == 0
        await advance(20)
        assert len([m for m in await all_messages(c, "s", "t") if m.subject == "a.out"]) == 3


@pytest.mark.parametrize("removal", ["ttl", "max_age", "own_ttl"])
async def test_a_schedule_due_when_its_source_expires_fires_first(mock_clock: Any, data_dir: Path, removal: str) -> None:
    """FLIP-25's order: at the same instant, the schedule (a user timer) before the
    TTL or max-age removal, so the source's message is still there to be produced."""
    async with broker_and_client(data_dir, Clock(T0)) as (h, c):
        await c.create_stream("s")
        expiry = 5 if removal == "max_age" else None
        await c.create_topic("s", "t", subjects=["a.>"], allow_msg_schedules=True, allow_msg_ttl=True, message_expiry=expiry)
        await c.publish("a.src", b"source", ttl=5 if removal == "ttl" else None)
        # Due exactly when the source (or the schedule itself) goes: the same virtual instant, the same tick.
        own = removal == "own_ttl"
        await c.publish("a.sched", b"own", ttl=5 if own else None, headers={
            "Nats-Schedule": _at(T0 + 5 * NS), "Nats-Schedule-Target": "a.out",
            **({} if own else {"Nats-Schedule-Source": "a.src"}),
        })
        await advance(5.01)
        out = [m for m in await all_messages(c, "s", "t") if m.subject == "a.out"]
        assert [m.payload for m in out] == [b"own" if own else b"source"]
        stats = await c.stats()
        # (its own TTL finds the one-off schedule gone already: the produced message removed it)
        assert stats["expired_max_age" if removal == "max_age" else "expired_ttl"] == (0 if own else 1)
        assert stats["schedules_fired"] == 1 and stats["pending_schedules"] == 0


async def test_an_at_in_the_past_fires_at_once_and_cron_with_a_zone(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir, Clock(T0)) as (_, c):
        await _topic(c)
        await c.publish("a.past", b"p", headers={"Nats-Schedule": _at(T0 - 3600 * NS), "Nats-Schedule-Target": "a.out"})
        # 2027-01-15T08:00:00Z is 09:00 in Berlin (T0 is 2027-01-15T08:00:00Z).
        await c.publish("a.cron", b"c", headers={
            "Nats-Schedule": "0 0 9 * * *", "Nats-Schedule-Time-Zone": "Europe/Berlin", "Nats-Schedule-Target": "a.out2",
        })
        await advance(0.011)
        msgs = await all_messages(c, "s", "t")
        assert [m.subject for m in msgs if m.subject.startswith("a.out")] == ["a.out"]
        await advance(86400)
        out2 = [m for m in await all_messages(c, "s", "t") if m.subject == "a.out2"]
        assert len(out2) == 1
        assert out2[0].timestamp >= T0 + 86400 * NS
        assert out2[0].headers["Nats-Schedule-Next"] == rfc3339(T0 + 2 * 86400 * NS)


async def test_schedules_survive_a_restart_and_what_passed_meanwhile_fires_once(mock_clock: Any, data_dir: Path) -> None:
    clock = Clock(T0)
    async with broker_and_client(data_dir, clock) as (_, c):
        await _topic(c)
        await c.publish("a.once", b"o", headers={"Nats-Schedule": _at(T0 + 10 * NS), "Nats-Schedule-Target": "a.out1"})
        await c.publish("a.rep", b"r", headers={"Nats-Schedule": "@every 5s", "Nats-Schedule-Target": "a.out2"})
        await c.publish("a.late", b"l", headers={"Nats-Schedule": _at(T0 + 3600 * NS), "Nats-Schedule-Target": "a.out3"})
        await advance(5.01)  # the repeating one fired once
    await advance(60)  # down while the one-off's time and many repeats pass
    async with broker_and_client(data_dir, clock) as (_, c):
        assert (await c.stats())["pending_schedules"] in (2, 3)  # (the one-off may have fired already)
        await advance(0.011)  # what passed fires at once after the start, once
        subjects = [m.subject for m in await all_messages(c, "s", "t")]
        assert subjects.count("a.out1") == 1 and "a.once" not in subjects
        assert subjects.count("a.out2") == 2  # one before the stop, one catching up (never one per missed repeat)
        assert "a.out3" not in subjects  # not early
        assert (await c.stats())["pending_schedules"] == 2
        await advance(5.01)
        assert [m.subject for m in await all_messages(c, "s", "t")].count("a.out2") == 3


async def test_a_crash_between_producing_and_removing_the_schedule_never_fires_it_twice(
    mock_clock: Any, data_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from broker.core._schedules import Scheduler

    clock = Clock(T0)
    with monkeypatch.context() as m:
        m.setattr(Scheduler, "_purge", lambda self, topic, subject, epoch: None)  # the removal never happens
        async with broker_and_client(data_dir, clock) as (_, c):
            await _topic(c)
            await c.publish("a.once", b"o", headers={"Nats-Schedule": _at(T0 + 1 * NS), "Nats-Schedule-Target": "a.out"})
            await advance(1.01)
            subjects = [m.subject for m in await all_messages(c, "s", "t")]
            assert subjects == ["a.once", "a.out"]  # produced; its schedule is still stored
    async with broker_and_client(data_dir, clock) as (_, c):
        stats = await c.stats()
        assert stats["pending_schedules"] == 0
        await advance(10)
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["a.out"]  # the schedule went, not fired again


async def test_a_plain_message_on_the_schedules_subject_ends_it(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir, Clock(T0)) as (_, c):
        await _topic(c)
        await c.publish("a.s", b"", headers={"Nats-Schedule": "@every 1s", "Nats-Schedule-Target": "a.out"})
        await c.publish("a.s", b"plain")  # nats-server's removeSubject: no roll-up, the schedule just ends
        assert (await c.stats())["pending_schedules"] == 0
        await advance(5)
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["a.s", "a.s"]
        with pytest.raises(BrokerError) as err:  # a purge must name a schedule's subject
            await c.publish("a.x", b"", headers={"Nats-Schedule-Next": "purge", "Nats-Scheduler": "a.s"})
        assert (err.value.code, err.value.message) == (ErrorCode.INVALID_SCHEDULER, "message schedules invalid scheduler")
