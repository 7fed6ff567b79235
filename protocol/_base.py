"""The two base classes of every message body: a request's and a response's.

Each module of commands (``_commands.py``, ``_consumers.py``) and of responses
(``_responses.py``) subclasses these, so the connection can type what it sends
and receives without importing every module.
"""

from __future__ import annotations

from typing import ClassVar

from ._codes import Command

__all__ = ["_Request", "_Response"]


class _Request:
    CODE: ClassVar[Command]

    def encode(self) -> bytes:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    @classmethod
    def decode(cls, payload: bytes) -> _Request:  # pragma: no cover
        raise NotImplementedError


class _Response:
    def encode(self) -> bytes:  # pragma: no cover
        raise NotImplementedError

    @classmethod
    def decode(cls, payload: bytes) -> _Response:  # pragma: no cover
        raise NotImplementedError
