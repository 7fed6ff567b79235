"""ttlbroker's server (trio) and its bundled client (``broker.client``).

Run ``ttlbroker serve`` (or ``python -m broker serve``) to start a broker, or from
code::

    async with trio.open_nursery() as nursery:
        handle = await nursery.start(broker.serve, broker.Config())
        print(handle.address)
"""

from ._broker import VERSION as __version__
from ._clock import Clock as Clock
from .config import Config as Config
from .config import ConfigError as ConfigError
from .config import load_config as load_config
from .server import ServerHandle as ServerHandle
from .server import run_server as run_server
from .server import serve as serve

__all__ = ["Clock", "Config", "ConfigError", "ServerHandle", "load_config", "run_server", "serve", "__version__"]
