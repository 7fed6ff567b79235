"""The bundled client with the ``storage`` topic option (``storage: memory``): a
memory topic and a memory KV bucket behave as file ones, report their storage,
refuse a change of it, and come back empty (configuration kept, offsets not reused)
after a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_config, start_server

from broker.client import Client, connect
from protocol import BrokerError, ErrorCode


async def test_memory_topic_and_bucket(client: Client) -> None:
    await client.create_stream("s")
    t = await client.create_topic("s", "mem", partitions=2, subjects=["m.>"], storage="memory", allow_msg_ttl=True)
    assert t.options["storage"] == "memory"
    f = await client.create_topic("s", "disk", subjects=["d.>"])
    assert f.options["storage"] == "file"
    acks = await client.publish_batch([(f"m.{i}", b"v%d" % i) for i in range(10)])
    assert acks is not None and acks.ok
    got = {m.payload for p in range(2) for m in (await client.fetch("s", "mem", p, 1, 100)).messages}
    assert got == {b"v%d" % i for i in range(10)}
    last = await client.get_last("s", "mem", "m.3")
    assert last is not None and last.payload == b"v3"
    with pytest.raises(BrokerError) as err:
        await client.update_topic("s", "mem", storage="file")
    assert (err.value.code, err.value.message) == (
        ErrorCode.INVALID_TOPIC_CONFIG, "stream configuration update can not change storage type",
    )
    with pytest.raises(BrokerError) as err:
        await client.create_topic("s", "bad", subjects=["b.>"], storage="disk")
    assert (err.value.code, err.value.message) == (ErrorCode.INVALID_TOPIC_CONFIG, "storage must be one of file, memory, not 'disk'")
    kv = await client.kv_create("cache", storage="memory")
    await kv.put("k", b"v")
    entry = await kv.get("k")
    assert entry is not None and entry.value == b"v"
    assert (await client.get_topic("kv", "cache")).options["storage"] == "memory"


async def test_restart_empties_a_memory_topic_and_keeps_its_offsets_moving(data_dir: Path) -> None:
    config = make_config(data_dir)
    async with start_server(config) as srv, connect(srv.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "mem", subjects=["m.>"], storage="memory")
        for i in range(7):
            await c.publish("m.a", b"%d" % i)
    async with start_server(config) as srv, connect(srv.address) as c:
        info = await c.get_topic("s", "mem")
        assert info.options["storage"] == "memory"
        assert info.messages_count == 0
        ack = await c.publish("m.a", b"after")
        assert ack is not None and ack.offset == 8
        f = await c.fetch("s", "mem", 0, 1, 100)
        assert [(m.offset, m.payload) for m in f.messages] == [(8, b"after")]
