"""Push consumers (a deliver subject; durable or ephemeral, any ack policy, with or
without a ``deliver_group``: what ``js.subscribe`` creates). A :class:`Push` keeps
one :class:`PushWindow` waiting on the consumer while the deliver subject has a
subscriber; a window takes up to :data:`WINDOW_MSGS` messages or
:data:`WINDOW_BYTES` and the next one starts at once, unless flow control is at its
limit. Flow control is nats-server's sliding limit (``FC_START_PENDING`` doubling to
``FC_MAX_PENDING``; ``100 FlowControl Request`` past half of it, the client answers
on ``$JS.FC...``); idle heartbeats (``100 Idle Heartbeat`` with
``Nats-Last-Consumer/Stream``) go out when nothing was delivered for a heartbeat
interval; ``rate_limit_bps`` is a token bucket, ``replay_policy: original`` keeps
the stored gaps. Acks and redeliveries are the engine's, as for pulls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol import BrokerError, PullEnd
from protocol.nats import FC_PREFIX, NextRequest, PushSettings, idle_heartbeat, status_message

from broker.consumers import retire

from ._consumer_state import State
from ._pull import NatsPull, last_stream_seq

if TYPE_CHECKING:
    from broker.consumers import Consumer

__all__ = ["FC_MAX_PENDING", "FC_START_PENDING", "WINDOW_BYTES", "WINDOW_MSGS", "Push", "PushWindow"]

#: The most a push consumer hands to its deliver subject in one step (a window, a
#: pull of the engine's): the next step starts at once, unless flow control waits.
#: Small steps pipeline with the client: with 1,000 acks pending, nats-py acks a
#: whole batch before it reads on, and the first of the next messages leaves after
#: 256 of them are formatted, not after all 1,000 (bench/nats_compat.py, push
#: consume: the client's wait at each batch went from about 7 ms to 2 ms).
WINDOW_MSGS = 256
WINDOW_BYTES = 256 * 1024
#: Flow control, as nats-server's: bytes delivered and not yet covered by a
#: flow-control reply may reach the current limit, which starts at a sixteenth of
#: FC_MAX_PENDING and doubles with each reply up to it; the request goes out once
#: they pass half the limit, so delivery goes on while it is answered.
FC_MAX_PENDING = 32 * 1024 * 1024
FC_START_PENDING = FC_MAX_PENDING // 16


class PushWindow(NatsPull):
    """One flow-control window of a push consumer: it waits on the consumer like a
    pull and sends to the deliver subject."""

    __slots__ = ("push",)

    def __init__(self, push: Push, max_bytes: int, max_msgs: int = WINDOW_MSGS) -> None:
        nr = NextRequest(max_msgs, max_bytes, 0, False, 0)
        super().__init__(push.state, push.subject, push.consumer, nr)
        self.push = push

    def unheard(self) -> bool:
        """The deliver subject lost its last subscriber: the window goes, and the push
        waits for one (nothing is delivered meanwhile, nothing is lost)."""
        if self.state.broker.subs.match(self.reply_bytes):
            return False
        self.push.unbind()
        return True

    def _deliver(self, parts: list[Any], count: int) -> bool:
        if count:
            reached = self.state.deliver(self.consumer, self.reply, parts, count)
            self.push.delivered(reached, sum(len(p) for p in parts[1::2]))
            if not reached:  # the subscriber went away: wait for another
                self.push.unbind()
                return False
        return True

    def respond(self, status: PullEnd, parts: list[Any], count: int) -> None:
        if self._deliver(parts, count) and status in (PullEnd.BATCH_COMPLETE, PullEnd.MAX_BYTES):
            self.push.window_done()

    def refuse(self, err: BrokerError) -> None:
        pass


class Push:
    """A push consumer's delivery: windows, flow control, the rate limit, replay at the
    original pace, idle heartbeats."""

    def __init__(self, state: State, c: Consumer, settings: PushSettings) -> None:
        self.state = state
        self.consumer = c
        self.subject = settings.deliver_subject
        self.flow_control = settings.flow_control
        self.heartbeat_ns = settings.idle_heartbeat_ns
        self.fc_reply = ""
        self.fc_count = 0
        #: Flow control (nats-server's ``pbytes``, ``maxpb``, ``fcsz``): bytes
        #: delivered and not yet covered by a reply, the current limit, and the bytes
        #: the outstanding request covers.
        self.pending_bytes = 0
        self.max_pending = FC_START_PENDING
        self.fc_size = 0
        #: ``rate_limit_bps``, as the server's token bucket (``setRateLimit``): bytes
        #: a second, a burst of the broker's max payload, the bytes in the bucket
        #: (below zero: owed) as of ``tokens_at``, and a window waiting for them.
        self.rate = settings.rate_limit_bps / 8
        self.burst = state.broker.max_payload
        self.tokens = float(self.burst)
        self.tokens_at = 0
        self.window_held = False
        #: ``replay_policy`` ``original`` (the server's ``o.replay``): until the
        #: consumer is past what the stream held when delivery started, one message
        #: a window, each after the gap between its timestamp and the last one's.
        self.replay_until = 0
        if settings.replay_original:
            self.replay_until = c.parts[0].part.log.next_offset - 1
        self.busy = False  # something was delivered since the last heartbeat tick
        self.window: PushWindow | None = None

    def start(self) -> None:
        self.bind()
        if self.heartbeat_ns:
            self.state.ticks.arm(self, self.state.broker.clock.now_ns() + self.heartbeat_ns)

    def bind(self) -> None:
        """Deliver if the deliver subject has a subscriber (as on the server, a push
        consumer without interest delivers nothing), else wait for one."""
        if self.state.broker.subs.match(self.subject.encode()):
            self.state.unbound.discard(self)
            if self.window is None and self._has_room():
                self.open_window()
        elif not self.consumer.deleted:
            self.state.unbound.add(self)

    def unbind(self) -> None:
        self.stop()
        self.state.unbound.add(self)

    def _has_room(self) -> bool:
        """Flow control lets more go (always, without it), and the rate limit is not
        waiting for its bucket to fill."""
        if self.window_held:
            return False
        return not self.flow_control or self.pending_bytes < self.max_pending

    def _refill(self) -> float:
        """The rate limit's bucket now (tokens are bytes)."""
        now = self.state.broker.clock.now_ns()
        if self.tokens_at:
            self.tokens = min(self.burst, self.tokens + (now - self.tokens_at) * self.rate / 1e9)
        self.tokens_at = now
        return self.tokens

    def open_window(self) -> None:
        c = self.consumer
        if c.deleted:
            return
        room = WINDOW_BYTES
        if self.flow_control:
            room = min(room, max(self.max_pending - self.pending_bytes, 1))
        if self.rate:
            room = min(room, max(int(self._refill()), 1))
        self.window = w = PushWindow(self, room, 1 if self._replaying() else WINDOW_MSGS)
        c.waiting.append(w)
        self.state.owner.pulls.add(w)
        self.state.engine.kick(c)

    def delivered(self, reached: int, size: int) -> None:
        """``reached`` of the messages of ``size`` bytes went out: with flow control,
        they count as pending, and the request goes out once they pass half the
        limit (nats-server's ``needFlowControl``)."""
        self.busy = True
        if reached:
            self.state.touch(self.consumer)
        if self.rate:
            self._refill()
            self.tokens -= size
        if not self.flow_control:
            return
        self.pending_bytes += size
        if not self.fc_reply:
            if self.pending_bytes > self.max_pending // 2:
                self._request_flow()
        elif self.pending_bytes - self.fc_size >= self.max_pending:
            self.fc_size += size

    def _request_flow(self) -> None:
        self.fc_count += 1
        c = self.consumer
        self.fc_reply = f"{FC_PREFIX}{self.state.js.stream_name(c.topic)}.{c.name}.{self.fc_count}"
        self.fc_size = self.pending_bytes
        self.state.flow[self.fc_reply] = self
        if self.state.send(self.subject, self.fc_reply, status_message(100, "FlowControl Request")):
            self.state.touch(c)

    def window_done(self) -> None:
        """The window is used up: the next starts at once, or, with flow control at
        its limit, when the outstanding request is answered."""
        self.window = None
        if self._replaying():
            delay_ns = self._replay_gap()
            if delay_ns > 1_000_000:  # as the server: a gap of a millisecond or less is none
                self.window_held = True
                self.state.ticks.arm(WindowTimer(self), self.state.broker.clock.now_ns() + delay_ns)
                return
        if self.rate and self._refill() < 0:
            # What was sent is owed: the next window waits until the bucket is back
            # at zero (the server's ReserveN delay).
            self.window_held = True
            wait_ns = int(-self.tokens / self.rate * 1e9) + 1
            self.state.ticks.arm(WindowTimer(self), self.tokens_at + wait_ns)
            return
        if self._has_room():
            self.open_window()

    def _replaying(self) -> bool:
        if not self.replay_until:
            return False
        if self.consumer.parts[0].cursor > self.replay_until:
            self.replay_until = 0  # caught up: from here on, as instant
            return False
        return True

    def _replay_gap(self) -> int:
        """Nanoseconds between the last message delivered and the next one the
        consumer will deliver (0 when unknown)."""
        cp = self.consumer.parts[0]
        log_ = cp.part.log
        last = cp.last_delivered
        if not last or not log_.is_live(last):
            return 0
        wanted = cp.wanted()
        for o in range(cp.cursor, self.replay_until + 1):
            if log_.is_live(o) and (wanted is None or wanted(o)):
                return max(log_.timestamp_of(o) - log_.timestamp_of(last), 0)
        return 0

    def tokens_back(self) -> None:
        """A held window's wait is over (the rate limit's, or a replay gap)."""
        self.window_held = False
        if self.window is None and not self.consumer.deleted and self._has_room() and self.state.pushes.get(self.consumer) is self:
            self.open_window()

    def flow_reply(self, subject: str) -> None:
        """The answer to the latest flow-control request (an older one is ignored, as
        on the server): the bytes it covers are no longer pending, the limit doubles
        (up to FC_MAX_PENDING), and delivery goes on."""
        if subject != self.fc_reply:
            return
        self.max_pending = min(self.max_pending * 2, FC_MAX_PENDING)
        self.pending_bytes = max(self.pending_bytes - self.fc_size, 0)
        self._clear_flow()
        if self.window is None and self._has_room():
            self.open_window()

    def _clear_flow(self) -> None:
        self.state.flow.pop(self.fc_reply, None)
        self.fc_reply = ""
        self.fc_size = 0

    def tick(self, now_ns: int) -> None:
        c = self.consumer
        if c.deleted or self.state.pushes.get(c) is not self:  # deleted (by our own API too), or moved
            self.stop()
            return
        if not self.busy:
            if self.state.send(self.subject, None, idle_heartbeat(c.dseq, last_stream_seq(c), self.fc_reply)):
                self.state.touch(c)
        self.busy = False
        self.state.ticks.arm(self, now_ns + self.heartbeat_ns)

    def stop(self) -> None:
        self.state.unbound.discard(self)
        self._clear_flow()
        self.pending_bytes = 0  # nats-server resets its flow accounting too
        if self.window is not None:
            retire(self.window)
            self.window = None


class WindowTimer:
    """When a held push window may open: the rate limit's bucket is back at zero, or a
    replay's gap has passed."""

    def __init__(self, push: Push) -> None:
        self.push = push

    def tick(self, now_ns: int) -> None:
        self.push.tokens_back()
