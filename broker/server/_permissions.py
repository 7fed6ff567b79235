"""The subject each binary-protocol command acts on, for a user's permissions
(``broker.auth``): subjects are the unit of permission on both protocols, so one
``[[auth.users]]`` entry says what its user may do whichever protocol it speaks.

A command on a topic is the JetStream API request that does the same on the NATS
listener (a topic's NATS name: its ``nats`` name when it is a NATS stream, else
``<stream>.<topic>``), so ``deny = ["$JS.API.STREAM.DELETE.>"]`` keeps a user from
deleting topics through either protocol; streams of topics, which NATS has not,
and the broker's own commands are under ``$TB.API``. The table is in
``docs/protocol.md`` ("Users and permissions"). Every subject is one the user
must be allowed to *publish* to, but SUBSCRIBE's, which it must be allowed to
subscribe to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import protocol as P
from protocol import BrokerError, ErrorCode, Identifier, error_class

from broker.core import Broker

__all__ = ["check_command"]

_SUBSCRIBE = "subscribe"
_PUBLISH = "publish"


def _name(broker: Broker, stream: Identifier, topic: Identifier) -> str:
    """The topic's NATS name (what ``$JS.API`` subjects carry)."""
    try:
        t = broker.catalog.topic(stream, topic)
    except BrokerError:  # (the command fails on it anyway; the identifiers name it)
        return f"{stream.value}.{topic.value}"
    if t.stream.name == broker.config.nats.stream:
        nats = t.config.nats
        return str(nats["name"]) if nats and "name" in nats else t.name
    return f"{t.stream.name}.{t.name}"


def _stream(broker: Broker, stream: Identifier) -> str:
    try:
        return broker.catalog.stream(stream).name
    except BrokerError:
        return str(stream.value)


def _topic(api: str) -> Callable[[Broker, Any], str]:
    return lambda b, c: f"$JS.API.{api}.{_name(b, c.stream, c.topic)}"


def _consumer(api: str) -> Callable[[Broker, Any], str]:
    return lambda b, c: f"$JS.API.{api}.{_name(b, c.stream, c.topic)}.{c.name}"


def _offset(api: str) -> Callable[[Broker, Any], str]:
    return lambda b, c: f"$JS.API.{api}.{_name(b, c.stream, c.topic)}.{c.consumer}"


#: Request type -> the subject it publishes to (see the module docstring).
SUBJECTS: dict[type, Callable[[Broker, Any], str]] = {
    P.GetStats: lambda b, c: "$TB.API.STATS",
    P.Export: lambda b, c: "$TB.API.EXPORT",
    P.Fetch: _topic("STREAM.MSG.GET"),
    P.GetLast: _topic("STREAM.MSG.GET"),
    P.DeleteMessage: _topic("STREAM.MSG.DELETE"),
    P.Purge: _topic("STREAM.PURGE"),
    P.StoreConsumerOffset: _offset("CONSUMER.CREATE"),
    P.DeleteConsumerOffset: _offset("CONSUMER.CREATE"),
    P.GetConsumerOffset: _offset("CONSUMER.INFO"),
    P.GetStream: lambda b, c: f"$TB.API.STREAM.INFO.{_stream(b, c.stream)}",
    P.ListStreams: lambda b, c: "$TB.API.STREAM.LIST",
    P.CreateStream: lambda b, c: f"$TB.API.STREAM.CREATE.{c.name}",
    P.UpdateStream: lambda b, c: f"$TB.API.STREAM.UPDATE.{_stream(b, c.stream)}",
    P.DeleteStream: lambda b, c: f"$TB.API.STREAM.DELETE.{_stream(b, c.stream)}",
    P.GetTopic: _topic("STREAM.INFO"),
    P.ListTopics: lambda b, c: "$JS.API.STREAM.LIST",
    P.CreateTopic: lambda b, c: f"$JS.API.STREAM.CREATE.{_new_topic_name(b, c)}",
    P.UpdateTopic: _topic("STREAM.UPDATE"),
    P.DeleteTopic: _topic("STREAM.DELETE"),
    P.KvGet: lambda b, c: f"$JS.API.DIRECT.GET.{_name(b, c.stream, c.topic)}.{c.subject}",
    P.KvKeys: _topic("CONSUMER.CREATE"),
    P.CreateConsumer: _consumer("CONSUMER.CREATE"),
    P.UpdateConsumer: _consumer("CONSUMER.CREATE"),
    P.ConsumerInfoRequest: _consumer("CONSUMER.INFO"),
    P.ListConsumers: _topic("CONSUMER.LIST"),
    P.DeleteConsumer: _consumer("CONSUMER.DELETE"),
    P.Pull: _consumer("CONSUMER.MSG.NEXT"),
    P.JoinGroup: _consumer("CONSUMER.MSG.NEXT"),
    P.LeaveGroup: _consumer("CONSUMER.MSG.NEXT"),
    P.EndPulls: _consumer("CONSUMER.MSG.NEXT"),
    P.Redrive: _topic("STREAM.REDRIVE"),
    P.AckMessages: lambda b, c: f"$JS.ACK.{_name(b, c.stream, c.topic)}.{c.name}",
}
#: Commands no permission governs (the handshake's own, and ending a subscription).
FREE = (P.Ping, P.GetServerInfo, P.Unsubscribe)


def _new_topic_name(broker: Broker, cmd: P.CreateTopic) -> str:
    name = _stream(broker, cmd.stream)
    return cmd.name if name == broker.config.nats.stream else f"{name}.{cmd.name}"


def check_command(broker: Broker, perms: Any, cmd: Any) -> None:
    """Refuse ``cmd`` unless ``perms`` allow the subject it acts on (each message's,
    for a PUBLISH; a KV_TOUCH writes its key's subject).

    Raises:
        PermissionDeniedError: naming the subject.
    """
    cls = cmd.__class__
    if cls is P.Publish or cls is P.PublishWithReply:
        scan = P.scan_bodies(cmd.data, cmd.body_pos, cmd.count, 1 << 62)
        for raw in dict.fromkeys(scan.subjects):
            subject = bytes(raw).decode(errors="replace")
            if not perms.can_publish(subject):
                _denied(broker, _PUBLISH, subject)
        return
    if cls is P.Subscribe:
        if not perms.can_subscribe(cmd.subject_filter, None):
            _denied(broker, _SUBSCRIBE, cmd.subject_filter)
        return
    if cls is P.KvTouch:
        subject = cmd.subject
    elif cls in FREE:
        return
    else:
        subject = SUBJECTS[cls](broker, cmd)
    if not perms.can_publish(subject):
        _denied(broker, _PUBLISH, subject)


def _denied(broker: Broker, kind: str, subject: str) -> None:
    counters = broker.counters
    if kind == _PUBLISH:
        counters.publish_permission_violations += 1
        what = f"publish to {subject!r}"
    else:
        counters.subscribe_permission_violations += 1
        what = f"subscribe to {subject!r}"
    raise error_class(ErrorCode.PERMISSION_DENIED)(f"permissions violation: this user may not {what}")
