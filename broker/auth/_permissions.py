"""What one user may publish and subscribe to: nats-server's permission checks
(``client.go``: ``pubAllowedFullCheck``, ``canSubscribeInternal``,
``checkDenySub``, ``responseAllowed``), for one connection.

- **Publish**: allowed when no allow list is given or a subject of it matches, and
  no deny subject matches (deny overrules). A subject not allowed may still be a
  *response*: with ``allow_responses``, the reply subject of a message this
  connection received may be published to, ``max_msgs`` times within ``expires``.
- **Subscribe**: the subscription's subject, its wildcards taken as tokens like any
  other, is matched against the lists (so ``orders.*`` is allowed by ``orders.*``,
  ``orders.>`` or ``>``, not by ``orders.new``). An entry with a queue group
  (``"orders.* workers"``) allows or denies only subscriptions in a matching group;
  a plain subscription needs a plain allow entry. Deny overrules.
- **Delivery**: a deny entry does not stop a wider wildcard subscription
  (``orders.>`` with ``orders.secret`` denied): the messages on denied subjects are
  not delivered to it (:meth:`Permissions.delivery_denied`), as nats-server filters
  them.

Answers for publish subjects are cached (bounded), as nats-server caches them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from protocol import filter_is_subset, filters_overlap, subject_matches

from ._config import PermissionsConfig, ResponsePermission, SubjectPermission

__all__ = ["Permissions"]

#: Publish answers cached per connection, and reply subjects remembered for
#: responses (the oldest go first past these).
_PUB_CACHE = 1024
_REPLIES = 4096


@dataclass(frozen=True, slots=True)
class _Entry:
    tokens: tuple[str, ...]
    queue: tuple[str, ...] | None
    subject: str


def _entries(subjects: tuple[str, ...]) -> list[_Entry]:
    out = []
    for s in subjects:
        subject, _, queue = s.partition(" ")
        out.append(_Entry(tuple(subject.split(".")), tuple(queue.split(".")) if queue else None, subject))
    return out


class Permissions:
    """One user's compiled permissions, with the per-connection state of the
    checks (the publish cache, the reply subjects it may answer). Each connection
    has its own (:meth:`for_connection`)."""

    def __init__(self, cfg: PermissionsConfig) -> None:
        self.config = cfg
        pub = cfg.publish or SubjectPermission()
        sub = cfg.subscribe or SubjectPermission()
        self._pub_allow = _entries(pub.allow) if pub.allow is not None else None
        self._pub_deny = _entries(pub.deny)
        # As nats-server: an empty subscribe allow list allows everything (an empty
        # publish allow list allows nothing).
        self._sub_allow = _entries(sub.allow) if sub.allow else None
        self._sub_deny = _entries(sub.deny)
        self.responses: ResponsePermission | None = cfg.allow_responses
        self._pub_cache: dict[str, bool] = {}
        #: reply subject -> [delivery time (monotonic), responses sent]
        self._replies: dict[str, list[float]] = {}
        #: Whether every subject is allowed to publish to (no check needed).
        self.publish_unrestricted = self._pub_allow is None and not self._pub_deny

    def for_connection(self) -> Permissions:
        return Permissions(self.config)

    # -- publish -------------------------------------------------------------------

    def can_publish(self, subject: str) -> bool:
        if self.publish_unrestricted:
            return True
        cached = self._pub_cache.get(subject)
        if cached is None:
            tokens = subject.split(".")
            cached = (self._pub_allow is None or any(subject_matches(e.tokens, tokens) for e in self._pub_allow)) and not any(
                subject_matches(e.tokens, tokens) for e in self._pub_deny
            )
            if not cached and self.responses is not None:
                return self._response_allowed(subject)  # (not cached: it changes)
            if len(self._pub_cache) >= _PUB_CACHE:
                del self._pub_cache[next(iter(self._pub_cache))]
            self._pub_cache[subject] = cached
        elif not cached and self.responses is not None:
            return self._response_allowed(subject)
        return cached

    def publishes_all_under(self, subject_filter: str) -> bool:
        """Whether every subject matching ``subject_filter`` may be published to
        (the fast paths that skip the per-subject check)."""
        if self.publish_unrestricted:
            return True
        if self._pub_allow is not None and not any(filter_is_subset(subject_filter, e.subject) for e in self._pub_allow):
            return False
        return not any(filters_overlap(subject_filter, e.subject) for e in self._pub_deny)

    def received_reply(self, reply: str) -> None:
        """A message with reply subject ``reply`` was delivered to this connection:
        with ``allow_responses``, it may answer there."""
        if self.responses is None or reply in self._replies:
            return
        if len(self._replies) >= _REPLIES:
            self._prune_replies()
        self._replies[reply] = [time.monotonic(), 0]

    def _response_allowed(self, subject: str) -> bool:
        entry = self._replies.get(subject)
        resp = self.responses
        if entry is None or resp is None:
            return False
        entry[1] += 1
        if (resp.max_msgs > 0 and entry[1] > resp.max_msgs) or (
            resp.expires > 0 and time.monotonic() - entry[0] > resp.expires
        ):
            del self._replies[subject]
            return False
        return True

    def _prune_replies(self) -> None:
        """Drop the expired reply subjects, and the oldest half when none is."""
        resp = self.responses
        now = time.monotonic()
        if resp is not None and resp.expires > 0:
            for reply in [r for r, (t, _) in self._replies.items() if now - t > resp.expires]:
                del self._replies[reply]
        if len(self._replies) >= _REPLIES:
            for reply in list(self._replies)[: _REPLIES // 2]:
                del self._replies[reply]

    # -- subscribe -----------------------------------------------------------------

    def can_subscribe(self, subject: str, queue: str | None) -> bool:
        tokens = subject.split(".")
        qtokens = queue.split(".") if queue else None
        allowed = True
        if self._sub_allow is not None:
            plain = queued = False
            for e in self._sub_allow:
                if subject_matches(e.tokens, tokens):
                    if e.queue is None:
                        plain = True
                    elif qtokens is not None and subject_matches(e.queue, qtokens):
                        queued = True
            allowed = plain or queued
            if qtokens is not None and not queued and any(
                e.queue is not None and subject_matches(e.tokens, tokens) for e in self._sub_allow
            ):
                allowed = False  # queue entries for the subject name the groups allowed
        if allowed:
            for e in self._sub_deny:
                if subject_matches(e.tokens, tokens) and (
                    e.queue is None or (qtokens is not None and subject_matches(e.queue, qtokens))
                ):
                    return False
        return allowed

    def needs_delivery_check(self, subject: str, queue: str | None) -> bool:
        """Whether a subscription may receive messages on subjects its user is denied
        (a wildcard, or a queue group, that collides with a deny entry)."""
        if not self._sub_deny or not (queue or "*" in subject or ">" in subject):
            return False
        return any(filters_overlap(e.subject, subject) for e in self._sub_deny)

    def delivery_denied(self, subject: str, queue: str | None) -> bool:
        tokens = subject.split(".")
        qtokens = queue.split(".") if queue else None
        for e in self._sub_deny:
            if subject_matches(e.tokens, tokens) and (
                e.queue is None or (qtokens is not None and subject_matches(e.queue, qtokens))
            ):
                return True
        return False
