"""The NATS listener: NATS client connections (``NatsSession``, over a
``broker.net.Transport``), core NATS subscriptions and messages, and the JetStream
API (``$JS.API.>``: streams, direct gets, KV, consumers and their acks) on the
broker's own topics, consumers and KV reads.

Inside: ``_session.py`` (one connection), ``_core.py`` (core subscriptions and
messages), ``_jetstream.py`` (the ``JetStream`` object and its dispatch),
``_streams.py`` and ``_consumers.py`` (the API families), ``_api.py`` (the API put
together: ``open_jetstream``); under ``_consumers.py``: ``_consumer_state.py`` (the
state of the NATS consumers: queued acks, settings, timers, deliveries),
``_pull.py`` (pull requests) and ``_push.py`` (push consumers' delivery).

For the monitoring (``broker.monitoring``'s ``/varz``, ``/connz``, ``/jsz``): the
server id of INFO, and the StreamInfo, ConsumerInfo and account info the API answers.

May import: ``broker.consumers``, ``broker.kv``, ``broker.net``, ``broker.core``,
``broker.config``, ``protocol``.

Public names: below, in ``__all__``.
"""

from ._api import open_jetstream as open_jetstream
from ._consumers import consumer_info as consumer_info
from ._jetstream import JetStream as JetStream
from ._session import SERVER_ID as SERVER_ID
from ._session import TOO_MANY_CONNECTIONS as TOO_MANY_CONNECTIONS
from ._session import NatsSession as NatsSession
from ._streams import account_info as account_info
from ._streams import stream_info as stream_info

__all__ = [
    "JetStream", "NatsSession", "SERVER_ID", "TOO_MANY_CONNECTIONS", "account_info", "consumer_info", "open_jetstream",
    "stream_info",
]
