"""JetStream consumers over the NATS listener, on the consumer engine
(``broker/consumers``): no second engine. ``_jetstream.py`` dispatches
``$JS.API.CONSUMER.<op>`` here (:func:`consumer_api`) and the ``$JS.ACK.>`` /
``$JS.FC.>`` subjects (:func:`ack`). Everything is answered with core messages
(``send_core``) to the request's reply inbox.

* **Create, info, delete, names, list, pause, unpin**: the server's JSON
  (``protocol/nats/_consumers.py`` maps the config); the consumer is an ordinary
  consumer of the stream's topic (a one-partition topic, so stream sequence =
  offset), created, updated and deleted through the engine; the answer waits for
  the group commit that makes the change durable, like our own acks.
* **Pull requests** are ``_pull.py``'s, **push consumers** ``_push.py``'s, and the
  state they share (queued acks, settings, timers) ``_consumer_state.py``'s.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import TYPE_CHECKING, Any

import trio

from protocol import AckKind, BrokerError, normalize_name
from protocol import subject_matches
from protocol.nats import (
    FC_PREFIX, INVALID_JSON, STREAM_MISMATCH, JSError, api_error, api_response, js_error, parse_request, rfc3339,
)
from protocol.nats import (
    ACK_NEXT,
    check_group_name,
    PushSettings,
    consumer_config_from_nats,
    consumer_config_to_nats,
    parse_ack_body,
    parse_pause_until,
    term_reason,
)

from broker.consumers import (
    MS,
    ConsumerConfig,
    change_consumer,
    new_consumer,
    retire,
    work_queue_conflict,
)
from broker.core import get_logger

from ._consumer_state import DURABLE_SETTINGS, EPHEMERAL_INACTIVE_NS, State, delete_consumer, lookup
from ._pull import last_stream_seq, next_request
from ._push import Push, PushWindow

if TYPE_CHECKING:
    from broker.consumers import Consumer
    from broker.core import Topic

    from ._jetstream import JetStream

__all__ = ["consumer_api", "consumer_info", "ack", "run"]

log = get_logger(__name__)

#: Page sizes of CONSUMER.NAMES and CONSUMER.LIST (the server's).
NAMES_LIMIT = 1024
LIST_LIMIT = 256


def _state(js: JetStream) -> State:
    st = js.consumer_state
    if st is None:
        st = js.consumer_state = State(js, Push)
    return st


# -- the API -------------------------------------------------------------------------------


def consumer_api(
    js: JetStream, op: str, tokens: list[str], reply: str | None, headers: bytes | None, payload: bytes,
    last: bool = False,
) -> None:
    """``$JS.API.CONSUMER.<op>.<tokens...>`` (dispatched by ``JetStream.request``;
    ``last``: see there)."""
    st = _state(js)
    if op == "MSG.NEXT":
        c = lookup(st, tokens)
        if c is None:
            st.flush_acks()
            js.no_responders(reply)  # no consumer: nobody listens there
            return
        next_request(st, c, reply, payload, last)
        return
    st.flush_acks()  # a request sees every ack sent before it
    handler = _API.get(op)
    if handler is None:
        js.no_responders(reply)
        return
    kind, fn = handler
    try:
        body, epoch = fn(st, tokens, payload)
    except (JSError, BrokerError) as err:
        js.respond(reply, api_error(kind, err))
        return
    js.respond(reply, api_response(kind, body), epoch=epoch)

def _find(st: State, tokens: list[str]) -> Consumer:
    if len(tokens) != 2:
        raise JSError(400, 10003, "bad request")
    topic = st.js.topic(tokens[0])
    try:
        c = st.engine.consumers_of(topic).get(normalize_name(tokens[1], "consumer name"))
    except BrokerError:
        c = None
    if c is None:
        raise JSError(404, 10014, "consumer not found")
    return c


def _topic_for_consumers(st: State, stream: str) -> Topic:
    topic = st.js.topic(stream)
    if len(topic.partitions) != 1:
        raise JSError(400, 10094, f"consumers over NATS need a one-partition topic; {topic.full_name} has {len(topic.partitions)} partitions")
    return topic


def _create(st: State, tokens: list[str], payload: bytes, legacy: bool) -> tuple[dict[str, Any], int]:
    req = parse_request(payload)
    if not tokens or not tokens[0]:
        raise JSError(400, 10003, "bad request")
    stream = tokens[0]
    name = ""
    subject_filter = ""
    if legacy:
        if len(tokens) != 2:
            raise JSError(400, 10016, "consumer expected to be durable but no durable name set in subject")
        name = tokens[1]
    elif len(tokens) > 1:
        name = tokens[1]
        subject_filter = ".".join(tokens[2:])
    if req.get("stream_name") != stream:
        raise js_error(STREAM_MISMATCH)
    cfg = req.get("config")
    if not isinstance(cfg, dict):
        raise JSError(400, 10078, "consumer config required")
    if name and any(ch in name for ch in "/\\"):
        raise JSError(400, 10127, "Consumer name can not contain path separators")
    durable = cfg.get("durable_name") or ""
    given = cfg.get("name") or ""
    named = bool(name or given or durable)  # else a made-up name the config leaves out, as the server
    if legacy:
        if not durable:
            raise JSError(400, 10018, "consumer expected to be durable but a durable name was not set")
        if durable != name:
            raise JSError(400, 10017, "consumer name in subject does not match durable name in request")
    elif name:
        if durable and durable != name:
            raise JSError(400, 10017, "consumer name in subject does not match durable name in request")
    else:
        if durable:
            raise JSError(400, 10020, "consumer expected to be ephemeral but a durable name was set in request")
        name = given or secrets.token_hex(4)
    if given and durable and given != durable:
        raise JSError(400, 10132, "Consumer Durable and Name have to be equal if both are provided")
    if subject_filter:
        if cfg.get("filter_subjects"):
            raise JSError(400, 10137, "consumer with multiple subject filters cannot use subject based API")
        if cfg.get("filter_subject") != subject_filter:
            raise JSError(400, 10131, "Consumer create request did not match filtered subject from create subject")
    topic = _topic_for_consumers(st, stream)
    ours, settings = consumer_config_from_nats(cfg, durable=bool(durable))
    if not named:
        settings = dataclasses.replace(settings, named=False)
    if settings != DURABLE_SETTINGS:
        ours["nats"] = dataclasses.asdict(settings)
    try:
        cname = normalize_name(name, "consumer name")
    except BrokerError as err:  # the name rule is ours (stricter than the server's): say so
        raise JSError(400, 10094, err.message) from None
    deliver = settings.deliver_subject.split(".") if settings.deliver_subject else None
    if deliver and any(subject_matches(tuple(s.split(".")), deliver) for s in topic.config.subjects):
        raise JSError(400, 10081, "consumer deliver subject forms a cycle")  # its messages would be stored again
    config = ConsumerConfig.from_map(ours)
    conflict = work_queue_conflict(st.engine, topic, cname, config, push=bool(settings.deliver_subject))
    if conflict is not None:
        raise JSError(400, *conflict)
    action = req.get("action") or ""
    existing = st.engine.consumers_of(topic).get(cname)
    epoch = 0
    if existing is not None:
        if existing.config != config:
            if action == "create":
                raise JSError(400, 10148, "consumer already exists")
            old = st.settings_of(existing)
            if old.durable != settings.durable:
                raise JSError(400, 10148, "consumer already exists")
            existing.config.check_update(config)
            _check_update(st, old, settings, existing.config, config)
            epoch = change_consumer(st.engine, existing, config)
            st.updated(existing, old, settings)
        c = existing
    else:
        if action == "update":
            raise JSError(400, 10149, "consumer does not exist")
        c, epoch = new_consumer(st.engine, topic, cname, config)
        st.start(c, settings)
    return _info(st, c), epoch


def _check_update(st: State, old: PushSettings, new: PushSettings, was: ConsumerConfig, cfg: ConsumerConfig) -> None:
    """Refuse what the server refuses to update (``checkNewConsumerConfig``), after the
    engine's own fixed fields, with its words and its error (500 10012); a push
    consumer's deliver subject may move only while nobody listens on it (10013)."""
    denied = ""
    if old.mem_storage != new.mem_storage:
        denied = "storage type can not be updated"
    elif old.idle_heartbeat_ns != new.idle_heartbeat_ns:
        denied = "heart beats can not be updated"
    elif old.flow_control != new.flow_control:
        denied = "flow control can not be updated"
    elif old.deliver_subject != new.deliver_subject:
        if not old.deliver_subject:
            denied = "can not update pull consumer to push based"
        elif not new.deliver_subject:
            denied = "can not update push consumer to pull based"
        elif st.broker.subs.match(old.deliver_subject.encode()):
            raise JSError(400, 10013, "consumer name already in use")
    if not denied and was.max_waiting != cfg.max_waiting:
        denied = "max waiting can not be updated"
    if denied:
        raise JSError(500, 10012, denied)


def _sequence_info(consumer_seq: int, stream_seq: int, at_ns: int) -> dict[str, Any]:
    """The server's ``SequenceInfo``: ``last_active`` (omitempty) is when the last
    delivery (or ack) happened."""
    out: dict[str, Any] = {"consumer_seq": consumer_seq, "stream_seq": stream_seq}
    if at_ns:
        out["last_active"] = rfc3339(at_ns)
    return out


def _num_waiting(c: Consumer) -> int:
    """The pull requests waiting on ``c`` that someone hears; those nobody hears go
    first (nats-server's ``processWaiting``, which its consumer info runs)."""
    n = 0
    for r in list(c.waiting):
        if isinstance(r, PushWindow) or r.ended:
            continue
        if r.unheard():
            retire(r)
        else:
            n += 1
    return n


def _info(st: State, c: Consumer) -> dict[str, Any]:
    cp = c.parts[0]
    settings = st.settings_of(c)
    info = {
        "stream_name": st.js.stream_name(c.topic),
        "name": c.name,
        "created": rfc3339(c.created_ns),
        "config": consumer_config_to_nats(c.name, c.config.to_map(), settings, EPHEMERAL_INACTIVE_NS),
        "delivered": _sequence_info(c.dseq, last_stream_seq(c), c.delivered_at),
        "ack_floor": _sequence_info(c._ack_floor_dseq(), cp.ack_floor, c.acked_at),
        "num_ack_pending": c.num_ack_pending,
        "num_redelivered": c.num_redelivered,
        "num_waiting": _num_waiting(c),
        "num_pending": c.num_pending,
    }
    if c.config.dead_letter_subject or any(c.dead_lettered.values()):
        info["dead_lettered"] = dict(c.dead_lettered)  # a ttlbroker extension, by Nats-DLQ-Reason
    if settings.deliver_subject and st.broker.subs.match(settings.deliver_subject.encode()):
        info["push_bound"] = True  # the server's omitempty: absent unless bound
    remaining = c.paused_until - st.broker.clock.now_ns()
    if remaining > 0:
        info["paused"] = True
        info["pause_remaining"] = remaining
    pin = st.pins.get(c)
    if settings.priority_policy == "pinned_client":
        info["priority_groups"] = [
            {"group": g, **({"pinned_client_id": pin.id, "pinned_ts": rfc3339(pin.since_ns)} if pin is not None and pin.group == g else {})}
            for g in settings.priority_groups.split(",")
        ]
    info["ts"] = rfc3339(st.broker.clock.now_ns())
    return info


def consumer_info(js: JetStream, c: Consumer) -> dict[str, Any]:
    """A consumer as the server's ConsumerInfo, what ``CONSUMER.INFO`` answers (the
    monitoring's ``/jsz`` shows it too)."""
    return _info(_state(js), c)


def _api_create(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    return _create(st, tokens, payload, legacy=False)


def _api_durable_create(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    return _create(st, tokens, payload, legacy=True)


def _api_info(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    return _info(st, _find(st, tokens)), 0


def _api_delete(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    return {"success": True}, delete_consumer(st, _find(st, tokens))


def _page(st: State, tokens: list[str], payload: bytes, limit: int) -> tuple[list[Consumer], int, int]:
    if len(tokens) != 1:
        raise JSError(400, 10003, "bad request")
    req = parse_request(payload)
    offset = req.get("offset") or 0
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise js_error(INVALID_JSON, "invalid JSON: offset must be a non-negative integer")
    topic = st.js.topic(tokens[0])
    consumers = sorted(st.engine.consumers_of(topic).values(), key=lambda c: c.name)
    return consumers[offset : offset + limit], len(consumers), offset


def _api_names(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    page, total, offset = _page(st, tokens, payload, NAMES_LIMIT)
    return {"total": total, "offset": offset, "limit": NAMES_LIMIT, "consumers": [c.name for c in page]}, 0


def _api_list(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    page, total, offset = _page(st, tokens, payload, LIST_LIMIT)
    return {"total": total, "offset": offset, "limit": LIST_LIMIT, "consumers": [_info(st, c) for c in page]}, 0


def _optional_body(payload: bytes) -> dict[str, Any]:
    """A request body that may be empty (then ``{}``)."""
    return parse_request(payload) if bytes(payload).strip() else {}


def _api_pause(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    """``CONSUMER.PAUSE.<stream>.<consumer>`` with ``{"pause_until": time}`` (none, or
    Go's zero time: resume), as the server answers it; the change is in the
    consumer's configuration (journaled), so it survives a restart."""
    c = _find(st, tokens)
    req = _optional_body(payload)
    until = parse_pause_until(req.get("pause_until"))
    old = st.settings_of(c)
    new = dataclasses.replace(old, pause_until_ns=until)
    epoch = change_consumer(st.engine, c, ConsumerConfig.from_map({**c.config.to_map(), "nats": dataclasses.asdict(new)}))
    st.updated(c, old, new)
    body: dict[str, Any] = {"paused": False, "pause_until": rfc3339(until)}
    remaining = until - st.broker.clock.now_ns()
    if remaining > 0:
        body["paused"] = True
        body["pause_remaining"] = remaining
    return body, epoch


def _api_unpin(st: State, tokens: list[str], payload: bytes) -> tuple[dict[str, Any], int]:
    """``CONSUMER.UNPIN.<stream>.<consumer>`` with ``{"group": name}`` (ADR-42): the
    pinned client of that group is unpinned; the next request gets a new pin."""
    c = _find(st, tokens)
    group = _optional_body(payload).get("group") or ""
    if not group:
        raise JSError(400, 10025, "invalid JSON: consumer group not specified")
    check_group_name(group)
    if group not in st.settings_of(c).priority_groups.split(","):
        raise JSError(400, 10160, "Provided priority group does not exist for this consumer")
    st.unpin(c)
    return {}, 0


_API = {
    "CREATE": ("consumer_create", _api_create),
    "UNPIN": ("consumer_unpin", _api_unpin),
    "PAUSE": ("consumer_pause", _api_pause),
    "DURABLE.CREATE": ("consumer_create", _api_durable_create),
    "INFO": ("consumer_info", _api_info),
    "DELETE": ("consumer_delete", _api_delete),
    "NAMES": ("consumer_names", _api_names),
    "LIST": ("consumer_list", _api_list),
}


# -- acks --------------------------------------------------------------------------------------


def ack(js: JetStream, subject: str, reply: str | None, payload: bytes) -> None:
    """A ``$JS.ACK...`` acknowledgement or a ``$JS.FC...`` flow-control answer."""
    st = _state(js)
    if subject.startswith(FC_PREFIX):
        push = st.flow.get(subject)
        if push is not None:
            push.flow_reply(subject)
        return
    found = st.consumer_of_ack(subject)
    if found is None:
        return
    c, stream_seq = found
    try:
        kind, value = parse_ack_body(payload)
    except ValueError:
        return
    if kind == ACK_NEXT:
        st.queue_ack(c, (AckKind.ACK, 0, stream_seq, 0), None)
        st.flush_acks()
        if reply:
            next_request(st, c, reply, str(value).encode())
        return
    st.queue_ack(c, (kind, 0, stream_seq, -(-value // MS) if value else 0), reply,
                 term_reason(payload) if kind == AckKind.TERM else "")


async def run(js: JetStream) -> None:
    """Settles the acks a turn of the event loop brought (``JetStream.run`` runs it)."""
    st = _state(js)
    while True:
        await st.ack_wake.wait()
        st.ack_wake = trio.Event()
        try:
            st.flush_acks()
        except Exception:
            log.error("js_ack_flush_failed", exc_info=True)
