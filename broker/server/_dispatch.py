"""The binary protocol's command table: which function handles each request.

Each family's handlers are functions ``(state, session, command) -> Reply`` in the
package that owns the family, bound here once to the state they work on: the
broker for the core's families (streams and topics, publish, fetch, delete and
purge, server info, stored offsets), the consumer engine for the consumer
commands, the KV reads for the KV commands, and this table itself for the
commands that need the server's connections (SUBSCRIBE, UNSUBSCRIBE, GET_STATS).
Binding costs nothing per call: a bound handler is called as a method is.

Handlers in :attr:`Dispatch.sync` run on the event loop without awaiting (the
publish path never awaits); those in :attr:`Dispatch.async_` rewrite the catalog or
wait for a worker thread, and the session awaits them one at a time.

Adding a command: its request type in ``protocol``, its handler in the package of
its family, and one line here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import MethodType
from typing import Any, Protocol

import trio

import protocol as P

import broker.consumers as C
import broker.core as core
import broker.kv as K
from broker.core import Broker, Reply
from broker.monitoring import stats_values
from broker.net import ConnectionGuard

from ._subscriptions import Subscriber, subscribe, unsubscribe

__all__ = ["AsyncHandler", "Dispatch", "Handler", "Requester"]


class Requester(C.PullClient, Subscriber, Protocol):
    """A binary-protocol session, as the handlers see it (``_session.Session``)."""


#: A bound handler: ``(session, command) -> Reply``, or None when the answer goes later
#: (a pull that waits) or never (an ack without sync).
Handler = Callable[[Requester, Any], "Reply | None"]
AsyncHandler = Callable[[Requester, Any], Awaitable[Reply]]


class Dispatch:
    """Args:
    broker: the broker.
    consumers: its consumer engine.
    kv: its KV reads.
    guard: the connections' limits and registry (for GET_STATS).
    """

    def __init__(self, broker: Broker, consumers: C.ConsumerEngine, kv: K.KvReads, guard: ConnectionGuard) -> None:
        self.broker = broker
        self.consumers = consumers
        self.kv = kv
        self.guard = guard
        families: list[tuple[object, dict[type, Callable[..., Any]]]] = [
            (broker, {
                P.Ping: core.ping,
                P.GetServerInfo: core.server_info,
                P.Fetch: core.fetch,
                P.GetLast: core.get_last,
                P.DeleteMessage: core.delete_message,
                P.Purge: core.purge,
                P.Subscribe: subscribe,
                P.Unsubscribe: unsubscribe,
                P.StoreConsumerOffset: C.store_consumer_offset,
                P.GetConsumerOffset: C.get_consumer_offset,
                P.DeleteConsumerOffset: C.delete_consumer_offset,
                P.Redrive: C.redrive,
                P.GetStream: core.get_stream,
                P.ListStreams: core.list_streams,
                P.GetTopic: core.get_topic,
                P.ListTopics: core.list_topics,
            }),
            (kv, {P.KvGet: K.kv_get, P.KvTouch: K.kv_touch, P.KvKeys: K.kv_keys}),
            (consumers, {
                P.CreateConsumer: C.create_consumer,
                P.UpdateConsumer: C.update_consumer,
                P.ConsumerInfoRequest: C.consumer_info,
                P.ListConsumers: C.list_consumers,
                P.DeleteConsumer: C.delete_consumer,
                P.Pull: C.pull,
                P.AckMessages: C.ack,
                P.JoinGroup: C.join_group,
                P.LeaveGroup: C.leave_group,
                P.EndPulls: C.end_pulls,
            }),
        ]
        #: Request type -> its handler, bound.
        self.sync: dict[type, Handler] = {
            cmd: MethodType(fn, owner) for owner, table in families for cmd, fn in table.items()
        }
        self.sync[P.Publish] = broker.publisher.publish  # the hot path: the publish path's own method
        self.sync[P.PublishWithReply] = broker.publisher.request
        async_families: list[tuple[object, dict[type, Callable[..., Awaitable[Reply]]]]] = [
            (broker, {
                P.Export: core.export,
                P.CreateStream: core.create_stream,
                P.UpdateStream: core.update_stream,
                P.DeleteStream: core.delete_stream,
                P.CreateTopic: core.create_topic,
                P.UpdateTopic: core.update_topic,
                P.DeleteTopic: core.delete_topic,
            }),
            (self, {P.GetStats: Dispatch._stats}),
        ]
        self.async_: dict[type, AsyncHandler] = {
            cmd: MethodType(fn, owner) for owner, table in async_families for cmd, fn in table.items()
        }

    async def _stats(self, session: Requester, cmd: P.GetStats) -> Reply:
        """GET_STATS: every counter and gauge (``broker.monitoring.stats_values``)."""
        disk = await trio.to_thread.run_sync(self.broker.datadir.size_on_disk)
        return P.InfoMap(stats_values(self.broker, self.consumers, self.guard, disk)).encode()

    def session_closed(self, session: Requester) -> None:
        """A session ended: its subscriptions, waiting pulls and memberships go."""
        subs = self.broker.subs
        for sub in session.subs.values():
            subs.remove(sub)
        session.subs.clear()
        if session.pulls or session.members:
            C.session_closed(self.consumers, session)

