"""Pull requests over the NATS listener (``CONSUMER.MSG.NEXT``): a :class:`NatsPull`
is a ``PullRequest`` of the consumer engine whose messages and end go to its reply
inbox as HMSGs with the ``$JS.ACK`` reply subject, then the server's status (``404
No Messages``, ``408 Request Timeout``, ``409 ...`` with
``Nats-Pending-Messages/Bytes``). A request whose reply subject nobody hears is
dropped before any message is handed to it, as the server drops requests without
interest. ADR-42's priority groups (``overflow``, ``pinned_client``) decide which
waiting request is served (:meth:`NatsPull.passes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol import BrokerError, PullEnd, format_go_duration_ns
from protocol.nats import NextRequest, PushSettings, idle_heartbeat, parse_next_request, status_message

from broker.consumers import PullRequest, collect, end, retire

from ._consumer_state import State

if TYPE_CHECKING:
    from broker.consumers import Consumer

__all__ = ["NatsPull", "last_stream_seq", "next_request"]

class NatsPull(PullRequest):
    """A ``CONSUMER.MSG.NEXT`` request waiting on its consumer."""

    __slots__ = ("state", "reply", "reply_bytes", "no_wait", "heartbeat_ns", "max_bytes", "policy", "group", "min_pending",
                 "min_ack_pending", "pin_id")

    takes_runs = True  # :meth:`State.deliver` formats them

    def __init__(self, state: State, reply: str, c: Consumer, nr: NextRequest) -> None:
        super().__init__(state.owner, 0, c, max(nr.batch, 1), nr.max_bytes, None)
        self.state = state
        self.reply = reply
        self.reply_bytes = reply.encode()
        self.no_wait = nr.no_wait
        self.heartbeat_ns = nr.heartbeat_ns
        self.max_bytes = nr.max_bytes
        #: ADR-42: the consumer's priority policy ("" none), and the request's group,
        #: overflow thresholds and pin id.
        self.policy = ""
        self.group = nr.group
        self.min_pending = nr.min_pending
        self.min_ack_pending = nr.min_ack_pending
        self.pin_id = nr.pin_id

    def passes(self) -> bool:
        """ADR-42, as nats-server's ``nextWaiting``: an overflow request with thresholds
        waits until the consumer has at least ``min_pending`` messages pending or
        ``min_ack_pending`` outstanding; under ``pinned_client``, the first request
        of the group is pinned (its messages carry ``Nats-Pin-Id``), a request
        without the pin waits, and one with another (a stale pin) ends with ``423
        Nats-Wrong-Pin-Id``."""
        policy = self.policy
        if not policy:
            return False
        c = self.consumer
        if policy == "overflow":
            if not (self.min_pending or self.min_ack_pending):
                return False
            return not ((self.min_pending and self.min_pending <= c.num_pending)
                        or (self.min_ack_pending and self.min_ack_pending <= c.num_ack_pending))
        st = self.state
        pin = st.pins.get(c)
        if pin is None:
            if self.group:
                self.pin_id = st.pin(c, self.group).id
            return False
        if self.pin_id == pin.id:
            return False
        if not self.pin_id:
            return True
        self.state.send(self.reply, None, status_message(423, "Nats-Wrong-Pin-Id", max(self.remaining, 0), self.bytes_left))
        retire(self)
        return True

    def unheard(self) -> bool:
        """No subscription matches the reply subject (its client closed, unsubscribed
        or timed out): nobody hears it, and it is dropped without an answer, as
        nats-server drops a waiting request without interest (``nextWaiting``,
        ``processWaiting``)."""
        return not self.state.broker.subs.match(self.reply_bytes)

    def _deliver(self, parts: list[Any], count: int) -> bool:
        """Send the messages; False (and the pull dropped) when nobody got them."""
        if count and not self.state.deliver(self.consumer, self.reply, parts, count, pin=self.pin_id if self.policy == "pinned_client" else ""):
            retire(self)
            return False
        return True

    def respond(self, status: PullEnd, parts: list[Any], count: int) -> None:
        if not self._deliver(parts, count):
            return
        if status == PullEnd.BATCH_COMPLETE:
            if self.max_bytes and self.bytes_left > 0:
                self._status(409, "Batch Completed")
        elif status == PullEnd.MAX_BYTES:
            self._status(409, "Message Size Exceeds MaxBytes")
        elif status == PullEnd.NO_MESSAGES:
            self.state.send(self.reply, None, status_message(404, "No Messages"))
        elif status == PullEnd.EXPIRED:
            self._status(408, "Request Timeout")

    def _status(self, code: int, text: str) -> None:
        self.state.send(self.reply, None, status_message(code, text, max(self.remaining, 0), self.bytes_left if self.max_bytes else 0))

    def more(self, parts: list[Any], count: int) -> None:
        if self._deliver(parts, count) and self.no_wait:
            end(self, PullEnd.NO_MESSAGES)  # no_wait with expires: returns once it has any

    def refuse(self, err: BrokerError) -> None:
        self.state.send(self.reply, None, status_message(409, "Consumer Deleted"))

    def tick(self, now_ns: int) -> None:
        """The pull's idle heartbeat."""
        if self.ended or self.consumer.deleted:
            return
        c = self.consumer
        if not self.state.send(self.reply, None, idle_heartbeat(c.dseq, last_stream_seq(c))):
            retire(self)
            return
        self.state.ticks.arm(self, now_ns + self.heartbeat_ns)


def _priority_refusal(st: State, c: Consumer, s: PushSettings, nr: NextRequest) -> tuple[int, str] | None:
    """ADR-42's checks of a pull request, as nats-server's ``processNextMsgRequest``
    (a JSON request always has a priority group there, empty or not); a request with
    the current pin id keeps the pin alive."""
    if not nr.json:
        return None
    if (nr.min_pending or nr.min_ack_pending) and s.priority_policy != "overflow":
        return 400, "Bad Request - Not a Overflow Priority consumer"
    if nr.pin_id and s.priority_policy != "pinned_client":
        return 400, "Bad Request - Not a Pinned Client Priority consumer"
    if s.priority_policy:
        if not nr.group:
            return 400, "Bad Request - Priority Group missing"
        if nr.group not in s.priority_groups.split(","):
            return 400, "Bad Request - Invalid Priority Group"
        pin = st.pins.get(c)
        if pin is not None:
            if nr.pin_id == pin.id:
                pin.touch()
            elif nr.pin_id:
                return 423, "Nats-Pin-Id mismatch"
    return None


def _over_limits(s: PushSettings, nr: NextRequest) -> str:
    """The server's refusal of a pull over the consumer's request limits ("": none)."""
    if s.max_batch and nr.batch > s.max_batch:
        return f"Exceeded MaxRequestBatch of {s.max_batch}"
    if nr.expires_ns and s.max_expires_ns and nr.expires_ns > s.max_expires_ns:
        return f"Exceeded MaxRequestExpires of {format_go_duration_ns(s.max_expires_ns)}"
    if nr.max_bytes and s.max_request_bytes and nr.max_bytes > s.max_request_bytes:
        return f"Exceeded MaxRequestMaxBytes of {s.max_request_bytes}"
    return ""


def last_stream_seq(c: Consumer) -> int:
    cp = c.parts[0]
    return cp.last_delivered or max(cp.cursor - 1, 0)


def next_request(st: State, c: Consumer, reply: str | None, payload: bytes, last: bool = False) -> None:
    """A pull request. It sees every ack sent before it: they are settled first, or,
    when ``last`` and :meth:`State.may_pass` says that cannot change what it takes,
    held for its connection to settle once the messages are on their way."""
    if not reply:
        st.flush_acks()
        return
    settings = st.settings_of(c)
    if settings.deliver_subject:
        st.flush_acks()
        st.send(reply, None, status_message(409, "Consumer is push based"))
        return
    try:
        nr = parse_next_request(payload)
    except ValueError as exc:
        st.flush_acks()
        st.send(reply, None, status_message(400, f"Bad Request - {exc}"))
        return
    refused = _over_limits(settings, nr)
    if refused:
        st.flush_acks()
        st.send(reply, None, status_message(409, refused))
        return
    priority = _priority_refusal(st, c, settings, nr)
    if priority is not None:
        st.flush_acks()
        st.send(reply, None, status_message(*priority))
        return
    if st.acks:
        if last and st.may_pass(c, max(nr.batch, 1)):
            st.hold(c)
        else:
            st.flush_acks()
    st.touch(c)
    if nr.no_wait:
        available = c.num_pending + sum(len(cp.redeliver) for cp in c.parts)
        if not available and not nr.expires_ns:
            st.send(reply, None, status_message(404, "No Messages"))
            return
        if available and available < sum(w.remaining for w in c.waiting):
            # What there is goes to the requests already waiting (the server's rule).
            st.send(reply, None, status_message(408, "Requests Pending"))
            return
    if len(c.waiting) >= c.config.max_waiting:
        if not nr.heartbeat_ns:
            st.send(reply, None, status_message(409, "Exceeded MaxWaiting"))
        return
    engine = st.engine
    req = NatsPull(st, reply, c, nr)
    req.policy = settings.priority_policy
    parts, count, hit = ([], 0, False) if req.passes() else collect(engine, c, req)
    req.remaining -= count
    if req.bytes_left:
        req.bytes_left = max(req.bytes_left - sum(len(p) for p in parts[1::2]), 1)
    if req.remaining <= 0:
        end(req, PullEnd.BATCH_COMPLETE, parts, count)
    elif hit:
        end(req, PullEnd.MAX_BYTES, parts, count)
    elif nr.no_wait and (count or not nr.expires_ns):
        end(req, PullEnd.NO_MESSAGES, parts, count)
    else:
        st.settle_held()  # before it waits: what they free goes to it as it would have
        if count and not req._deliver(parts, count):
            return
        if nr.expires_ns:
            req.expires = st.broker.clock.now_ns() + nr.expires_ns
            engine.pull_timers.add(req)
        c.waiting.append(req)
        st.owner.pulls.add(req)
        if nr.heartbeat_ns:
            st.ticks.arm(req, st.broker.clock.now_ns() + nr.heartbeat_ns)
