"""Durable consumers: the engine, pulls, consumer groups, their journal, and the
consumer commands.

Owns: every durable consumer of every topic (:class:`ConsumerEngine`), what each
delivered and what is settled, exact at every moment; waiting pulls and their
timers; partitioned consumers' groups; each topic's consumer journal, written
through the group commit; the consumer commands of the binary protocol (functions
``(engine, session, command) -> Reply``) and the stored consumer offsets (functions
``(broker, session, command) -> Reply``); work-queue and interest retention (what the
consumers settle is removed once nobody needs it). The NATS listener's consumers
(``broker.nats``) are views of these.

May import: ``broker.core``, ``broker.config``, ``protocol``, ``storage``.

Public names: below, in ``__all__``.
"""

from ._config import ConsumerConfig as ConsumerConfig
from ._dead_letters import redrive as redrive
from ._dead_letters import redrive_topic as redrive_topic
from ._engine import ConsumerEngine as ConsumerEngine
from ._handlers import ack as ack
from ._handlers import change_consumer as change_consumer
from ._handlers import consumer_info as consumer_info
from ._handlers import create_consumer as create_consumer
from ._handlers import delete_consumer as delete_consumer
from ._handlers import end_pulls as end_pulls
from ._handlers import join_group as join_group
from ._handlers import leave_group as leave_group
from ._handlers import list_consumers as list_consumers
from ._handlers import new_consumer as new_consumer
from ._handlers import pull as pull
from ._handlers import remove_consumer as remove_consumer
from ._retention import work_queue_conflict as work_queue_conflict
from ._handlers import session_closed as session_closed
from ._handlers import update_consumer as update_consumer
from ._model import MS as MS
from ._model import Consumer as Consumer
from ._model import ConsumerEvents as ConsumerEvents
from ._model import ConsumerPartition as ConsumerPartition
from ._model import Member as Member
from ._model import ConsumerClient as ConsumerClient
from ._model import PullClient as PullClient
from ._model import PullOwner as PullOwner
from ._model import PullRequest as PullRequest
from ._offsets import delete_consumer_offset as delete_consumer_offset
from ._offsets import get_consumer_offset as get_consumer_offset
from ._offsets import store_consumer_offset as store_consumer_offset
from ._pulls import collect as collect
from ._pulls import end as end
from ._pulls import fail as fail
from ._pulls import retire as retire

__all__ = [
    "MS", "Consumer", "ConsumerClient", "ConsumerConfig", "ConsumerEngine", "ConsumerEvents", "ConsumerPartition", "Member", "PullClient",
    "PullOwner", "PullRequest",
    "ack", "change_consumer", "collect", "consumer_info", "create_consumer", "delete_consumer",
    "delete_consumer_offset", "end", "end_pulls", "fail", "get_consumer_offset", "join_group", "leave_group",
    "list_consumers", "new_consumer", "pull", "redrive", "redrive_topic", "remove_consumer", "retire", "session_closed", "store_consumer_offset",
    "work_queue_conflict",
    "update_consumer",
]
