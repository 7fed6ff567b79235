"""The monitoring port: HTTP (h11) serving ``/healthz``, ``/metrics`` (Prometheus),
``/varz``, and nats-server's ``/connz``, ``/subsz`` and ``/jsz``, and the numbers
they show.

Owns: :class:`Monitor` (the endpoints and the broker's lifecycle state as the
server reports it), the Prometheus exposition, nats-server's JSON documents
(``_varz.py``, ``_connz.py``, ``_jsz.py``, with ``_go.py`` for how nats-server reads
and refuses query parameters), the HTTP server with its own connection limits, and
:func:`stats_values` (every counter and gauge, also what GET_STATS answers).

May import: ``broker.nats``, ``broker.net``, ``broker.consumers``, ``broker.kv``,
``broker.core``, ``broker.config``, ``protocol``, ``storage``.

Public names: below, in ``__all__``.
"""

from ._http import HttpStats as HttpStats
from ._http import serve_http as serve_http
from ._monitor import Monitor as Monitor
from ._monitor import State as State
from ._stats import stats_values as stats_values

__all__ = ["HttpStats", "Monitor", "State", "serve_http", "stats_values"]
