"""Mirrors and sources: topics that copy other streams, in this broker or on other
servers (``docs/operations.md``, "Replicas and moves")."""

from ._copier import Copier as Copier
from ._copier import Replication as Replication
from ._copier import choose_origin as choose_origin
from ._local import LocalOrigin as LocalOrigin
from ._local import find_local_topic as find_local_topic
from ._origin import Origin as Origin
from ._origin import OriginGone as OriginGone
from ._origin import OriginMessage as OriginMessage
from ._origin import OriginUnavailable as OriginUnavailable
from ._remote import NatsLink as NatsLink
from ._remote import RemoteOrigin as RemoteOrigin

__all__ = [
    "Copier", "LocalOrigin", "NatsLink", "Origin", "OriginGone", "OriginMessage", "OriginUnavailable", "RemoteOrigin",
    "Replication", "choose_origin", "find_local_topic",
]
