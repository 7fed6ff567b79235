"""Mirrors and sources: topics that copy other streams, in this broker or on other
servers (``docs/operations.md``, "Replicas and moves")."""

from ._origin import Origin as Origin
from ._origin import OriginGone as OriginGone
from ._origin import OriginMessage as OriginMessage
from ._origin import OriginUnavailable as OriginUnavailable
from ._remote import NatsLink as NatsLink
from ._remote import RemoteOrigin as RemoteOrigin

__all__ = ["NatsLink", "Origin", "OriginGone", "OriginMessage", "OriginUnavailable", "RemoteOrigin"]
