"""(being written)"""

from ._server import ServerHandle as ServerHandle
from ._server import run_server as run_server
from ._server import serve as serve

__all__ = ["ServerHandle", "run_server", "serve"]
