"""Why the broker could not start, as one line an operator can act on.

``serve`` raises :class:`StartupError` for every cause the operator can fix (an
address in use, a data directory another broker holds, a damaged catalog, a missing
optional dependency); ``ttlbroker serve`` prints its message on one line and exits
2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["StartupError"]


class StartupError(Exception):
    """The broker cannot start; ``str(exc)`` names the cause and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
