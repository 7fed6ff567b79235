"""Dead letters of removed messages (``dead_letter_expired``, docs/semantics.md §16.11)
through the bundled client, in virtual time (``mock_clock``, ``advance``): what a
TTL, the max age or a limit removes while a consumer still owes it (outstanding, or
not delivered yet and matching its filter) is copied to its dead-letter subject
once, with ``Nats-DLQ-Reason`` ``Expired`` or ``Limit``; what it does not owe (acked,
filtered out) is not, nor is a subject delete marker that expires.
"""

from __future__ import annotations

from typing import Any

import pytest
from ttl_helpers import advance, all_messages, broker_and_client

from broker.client import InvalidConsumerConfigError

ZERO = {"MaxDeliveries": 0, "Terminated": 0, "Expired": 0, "Limit": 0}


def origins(messages: list[Any]) -> list[tuple[str, str, str, str]]:
    """Each copy's origin subject, sequence, reason and deliveries."""
    return [(m.headers["Nats-DLQ-Subject"], m.headers["Nats-DLQ-Sequence"], m.headers["Nats-DLQ-Reason"],
             m.headers["Nats-DLQ-Deliveries"]) for m in messages]


async def test_ttl_and_max_age_copy_what_the_consumer_still_owes_once(mock_clock: Any, data_dir: Any) -> None:
    async with broker_and_client(data_dir) as (handle, c):
        await c.create_stream("s")
        await c.create_topic("s", "work", subjects=["w.>"], message_expiry=60, allow_msg_ttl=True, subject_delete_marker_ttl=1)
        await c.create_topic("s", "dlq", subjects=["dlq.w"])
        await c.create_consumer("s", "work", "owes", filter_subject="w.a", dead_letter_subject="dlq.w",
                                dead_letter_expired=True)
        await c.create_consumer("s", "work", "plain", filter_subject="w.a", dead_letter_subject="dlq.plain")
        await c.publish("w.a", b"acked", headers={"Nats-TTL": "5s"})          # 1
        await c.publish("w.a", b"outstanding", headers={"Nats-TTL": "5s", "Trace": "t"})  # 2
        await c.publish("w.a", b"undelivered", headers={"Nats-TTL": "5s"})    # 3
        await c.publish("w.b", b"filtered out", headers={"Nats-TTL": "5s"})   # 4
        await c.publish("w.a", b"aged")                                        # 5 (max age, 60 s)
        got = await c.pull("s", "work", "owes", 2)
        await got[0].ack(sync=True)
        await advance(6)  # the TTLs run out: 2 (delivered once, unacked) and 3 (never delivered)
        info = await c.consumer_info("s", "work", "owes")
        assert info.dead_lettered == {**ZERO, "Expired": 2}
        assert (info.num_ack_pending, info.num_pending) == (0, 1)
        copies = await all_messages(c, "s", "dlq")
        assert origins(copies) == [("w.a", "2", "Expired", "1"), ("w.a", "3", "Expired", "0")]
        assert (copies[0].payload, copies[0].headers["Trace"]) == (b"outstanding", "t")
        assert "Nats-TTL" not in copies[0].headers  # (it would expire the copy too)
        await advance(60)  # max age takes 5
        copies = await all_messages(c, "s", "dlq")
        assert origins(copies)[2:] == [("w.a", "5", "Expired", "0")]
        await advance(120)  # nothing more is owed (the markers that expire are no dead letters)
        assert handle.broker.counters.markers == 2
        assert len(await all_messages(c, "s", "dlq")) == 3
        assert (await c.consumer_info("s", "work", "plain")).dead_lettered == ZERO  # not opted in
        stats = await c.stats()
        assert (stats["dead_lettered_expired"], stats["dead_lettered_limit"]) == (3, 0)
        assert handle.broker.counters.expired_ttl == 4


async def test_a_limit_copies_what_it_discards_and_a_full_dead_letter_topic_does_not_loop(
    mock_clock: Any, data_dir: Any,
) -> None:
    """Discard old at max_msgs and max_msgs_per_subject are ``Limit``. The dead-letter
    topic captures its own consumer's dead-letter subject and is full too: what the
    publish of a copy discards there is not dead-lettered again."""
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        await c.create_topic("s", "work", subjects=["w.>"], max_msgs=2, discard="old", max_msgs_per_subject=1)
        await c.create_topic("s", "dlq", subjects=["dlq.>"], max_msgs=1, discard="old")
        await c.create_consumer("s", "work", "w", dead_letter_subject="dlq.w", dead_letter_expired=True)
        await c.create_consumer("s", "dlq", "d", dead_letter_subject="dlq.again", dead_letter_expired=True)
        await c.publish("w.a", b"1")
        await c.publish("w.b", b"2")
        await c.publish("w.a", b"3")  # per subject: 1 goes
        copies = await all_messages(c, "s", "dlq")
        assert origins(copies) == [("w.a", "1", "Limit", "0")]
        await c.publish("w.c", b"4")  # max_msgs: 2 goes; its copy pushes the first copy out of dlq
        copies = await all_messages(c, "s", "dlq")
        assert origins(copies) == [("w.b", "2", "Limit", "0")]
        assert (await c.consumer_info("s", "work", "w")).dead_lettered == {**ZERO, "Limit": 2}
        assert (await c.consumer_info("s", "dlq", "d")).dead_lettered == ZERO
        assert (await c.stats())["dead_lettered_limit"] == 2


async def test_dead_letter_expired_needs_a_subject_and_a_boolean(data_dir: Any) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        await c.create_topic("s", "work", subjects=["w.>"])
        with pytest.raises(InvalidConsumerConfigError) as err:
            await c.create_consumer("s", "work", "w", dead_letter_expired=True)
        assert err.value.message == "dead_letter_expired needs a dead_letter_subject to copy the messages to"
        with pytest.raises(InvalidConsumerConfigError) as err:
            await c.create_consumer("s", "work", "w", dead_letter_subject="dlq.w", dead_letter_expired="yes")
        assert err.value.message == "dead_letter_expired must be true or false, got 'yes'"
        info = await c.create_consumer("s", "work", "w", dead_letter_subject="dlq.w", dead_letter_expired=True)
        assert info.config["dead_letter_expired"] is True
