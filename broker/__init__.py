"""ttlbroker's server (trio) and its bundled client (``broker.client``).

Run ``ttlbroker serve`` (or ``python -m broker serve``) to start a broker, or from
code::

    async with trio.open_nursery() as nursery:
        handle = await nursery.start(broker.serve, broker.Config())
        print(handle.address)

The names below are imported when first used (PEP 562), so that ``import
broker.client`` and every ``ttlbroker`` command that only talks to a broker do not
load the server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import VERSION as __version__
    from .core import Clock as Clock
    from .config import Config as Config
    from .config import ConfigError as ConfigError
    from .config import load_config as load_config
    from .server import ServerHandle as ServerHandle
    from .server import run_server as run_server
    from .server import serve as serve

__all__ = ["Clock", "Config", "ConfigError", "ServerHandle", "load_config", "run_server", "serve", "__version__"]

_WHERE = {
    "Clock": (".core", "Clock"), "__version__": (".core", "VERSION"),
    "Config": (".config", "Config"), "ConfigError": (".config", "ConfigError"), "load_config": (".config", "load_config"),
    "ServerHandle": (".server", "ServerHandle"), "run_server": (".server", "run_server"), "serve": (".server", "serve"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'broker' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value
    return value
