"""(being written)"""

from ._jetstream import JetStream as JetStream
from ._session import TOO_MANY_CONNECTIONS as TOO_MANY_CONNECTIONS
from ._session import NatsSession as NatsSession

__all__ = ["JetStream", "NatsSession", "TOO_MANY_CONNECTIONS"]
