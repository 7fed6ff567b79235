"""(being written)"""

from ._server import ServerHandle as ServerHandle
from ._server import Services as Services
from ._server import run_server as run_server
from ._server import serve as serve
from ._startup import StartupError as StartupError

__all__ = ["ServerHandle", "Services", "StartupError", "run_server", "serve"]
