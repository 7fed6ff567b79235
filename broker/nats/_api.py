"""The JetStream API put together: the :class:`~._jetstream.JetStream` object made
with the entry points of the API modules (``_streams.py``, ``_consumers.py``).

The API modules import ``_jetstream.py`` for the object they work on; this module
imports them all, so none of them imports another's importer. Adding an API
subject family: a module with its entry point, and its place in
:class:`~._jetstream.ApiHandlers`, :meth:`JetStream.request` and :data:`HANDLERS`.
"""

from __future__ import annotations

from broker.consumers import ConsumerEngine
from broker.core import Broker
from broker.kv import KvReads

from ._consumers import ack as consumer_ack
from ._consumers import consumer_api
from ._consumers import run as consumers_run
from ._jetstream import ApiHandlers, JetStream
from ._streams import api as streams_api
from ._streams import kv_get

__all__ = ["HANDLERS", "open_jetstream"]

HANDLERS = ApiHandlers(
    kv_get=kv_get, streams=streams_api, consumers=consumer_api, ack=consumer_ack, background=consumers_run,
)


def open_jetstream(broker: Broker, consumers: ConsumerEngine, kv: KvReads) -> JetStream:
    """The JetStream API of ``broker`` (one per broker)."""
    return JetStream(broker, consumers, kv, HANDLERS)
