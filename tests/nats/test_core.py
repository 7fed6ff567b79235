"""The NATS listener's core protocol, driven by nats-py (the real client) against
a real broker on loopback (``conftest.nats_server``)."""

from __future__ import annotations

import nats
from helpers import in_asyncio


async def test_pub_sub(nats_url: str) -> None:
    async def scenario() -> list[bytes]:
        nc = await nats.connect(nats_url)
        sub = await nc.subscribe("greet.*")
        await nc.publish("greet.joe", b"hello")
        msg = await sub.next_msg(timeout=5)
        await nc.close()
        return [msg.subject.encode(), msg.data]

    assert await in_asyncio(scenario) == [b"greet.joe", b"hello"]
