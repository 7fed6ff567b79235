"""The connection state machine, in tables.

Rules of this file (after h11's ``_state.py``):

1. Every state a protocol connection can be in, and every transition between them,
   is in the tables below. Code elsewhere asks these tables; it never compares
   states itself.
2. The tables know nothing of sockets or of the broker's policy (for example,
   whether a token is right): the connection object reports *what happened*
   (``handshake_accepted``, ``handshake_refused``, ``protocol_error``, ``close``)
   and the table says where that leads.

Theory of operation. A client opens with exactly one HANDSHAKE request; until the
server has answered it successfully, the server accepts nothing else (other commands
get HANDSHAKE_REQUIRED; the table leaves the connection usable, and the broker's
policy is to close it, so that idle or probing sockets cannot hold connection slots).
A refused handshake closes the connection. After the handshake both
sides are READY: requests flow one way, responses and pushes the other, matched by
correlation id, in any order. A frame that cannot be delimited moves the receiving
side to ERROR, from which every call refuses; the broker then says GOODBYE and
closes that connection only.
"""

from __future__ import annotations

from enum import Enum

from ._codes import Command

__all__ = ["Role", "State", "transition", "command_allowed"]


class Role(Enum):
    CLIENT = "client"
    SERVER = "server"


class State(Enum):
    #: Server: waiting for the client's handshake. Client: not yet sent it.
    AWAIT_HANDSHAKE = "await_handshake"
    #: Client: handshake sent, waiting for the answer.
    HANDSHAKE_SENT = "handshake_sent"
    #: Handshake done; any command may flow.
    READY = "ready"
    #: Closed on purpose (refused handshake, goodbye, local close).
    CLOSED = "closed"
    #: The peer broke the framing; nothing more can be read.
    ERROR = "error"


_TRANSITIONS: dict[tuple[Role, State, str], State] = {
    (Role.CLIENT, State.AWAIT_HANDSHAKE, "send_handshake"): State.HANDSHAKE_SENT,
    (Role.CLIENT, State.HANDSHAKE_SENT, "handshake_accepted"): State.READY,
    (Role.CLIENT, State.HANDSHAKE_SENT, "handshake_refused"): State.CLOSED,
    (Role.SERVER, State.AWAIT_HANDSHAKE, "handshake_accepted"): State.READY,
    (Role.SERVER, State.AWAIT_HANDSHAKE, "handshake_refused"): State.CLOSED,
}

#: Events that lead to the same state from anywhere.
_FROM_ANY = {"protocol_error": State.ERROR, "close": State.CLOSED}

#: Which request codes the server accepts in each state.
_ALLOWED: dict[State, frozenset[int]] = {
    State.AWAIT_HANDSHAKE: frozenset({Command.HANDSHAKE}),
    State.READY: frozenset(c for c in Command if c != Command.HANDSHAKE),
}


def transition(role: Role, state: State, event: str) -> State:
    """The state after ``event``; raises KeyError for an event the table forbids."""
    if event in _FROM_ANY:
        return _FROM_ANY[event]
    return _TRANSITIONS[(role, state, event)]


def command_allowed(state: State, code: int) -> bool:
    return code in _ALLOWED.get(state, frozenset())
