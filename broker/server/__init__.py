"""The trio server: start-up and shutdown (``serve``, ``run_server``, the one-line
``StartupError``), the listeners of both protocols, the binary protocol's sessions
(``_session.py``, over a ``broker.net.Transport``) and their command table
(``_dispatch.py``), core subscriptions of the binary protocol
(``_subscriptions.py``), and the composition of everything below around one broker
(``Services``: the consumer engine, the KV reads, the JetStream API, the
connections' guard, the command table).

May import: ``broker.nats``, ``broker.monitoring``, ``broker.net``,
``broker.consumers``, ``broker.kv``, ``broker.core``, ``broker.config``,
``protocol``, ``storage``.

Public names: below, in ``__all__``.
"""

from ._server import ServerHandle as ServerHandle
from ._server import Services as Services
from ._server import run_server as run_server
from ._server import serve as serve
from ._startup import StartupError as StartupError

__all__ = ["ServerHandle", "Services", "StartupError", "run_server", "serve"]
