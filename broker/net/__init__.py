"""What every client connection shares, whatever protocol it speaks: its transport
(the stream, the output queues, the writer, the lifecycle table and the ending), the
limits that bound its memory (the output budget, the slow-consumer watch, the
connection limit and eviction), the delay on failed handshakes, the registry of open
connections, and TLS.

May import: ``broker.core``, ``broker.config``, ``protocol``.

Public names: below, in ``__all__``.
"""

from ._limits import RECEIVE_SIZE as RECEIVE_SIZE
from ._limits import STALL_SECONDS as STALL_SECONDS
from ._limits import SWEEP_SECONDS as SWEEP_SECONDS
from ._limits import Connection as Connection
from ._limits import ConnectionGuard as ConnectionGuard
from ._limits import FailureThrottle as FailureThrottle
from ._limits import LogLimiter as LogLimiter
from ._limits import OutputBudget as OutputBudget
from ._limits import watch_connections as watch_connections
from ._tls import TLS_REQUIRED_REASON as TLS_REQUIRED_REASON
from ._tls import TlsAcceptor as TlsAcceptor
from ._transport import ALLOWS as ALLOWS
from ._transport import DRAIN_SECONDS as DRAIN_SECONDS
from ._transport import GOODBYE_SECONDS as GOODBYE_SECONDS
from ._transport import MOVES as MOVES
from ._transport import SHORT_READ as SHORT_READ
from ._transport import Phase as Phase
from ._transport import Reading as Reading
from ._transport import Speaker as Speaker
from ._transport import Transport as Transport

__all__ = [
    "ALLOWS", "DRAIN_SECONDS", "GOODBYE_SECONDS", "MOVES", "SHORT_READ", "Phase", "Reading", "Speaker", "Transport",
    "RECEIVE_SIZE", "STALL_SECONDS", "SWEEP_SECONDS", "TLS_REQUIRED_REASON", "Connection", "ConnectionGuard",
    "FailureThrottle", "LogLimiter", "OutputBudget", "TlsAcceptor", "watch_connections",
]
