"""Core subscriptions: who receives a published message, at most once.

A subscription is a subject filter held by one connection. Matching a published
subject against every subscription would cost O(subscriptions) per message, so the
answer is cached per subject (cleared when subscriptions change or the cache grows
past ``CACHE_LIMIT``). With no subscription at all, publishing skips this entirely.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol import subject_matches

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["Subscription", "SubscriptionIndex"]

CACHE_LIMIT = 100_000


class Subscription:
    __slots__ = ("session", "sid", "subject_filter", "tokens", "delivered", "dropped")

    def __init__(self, session: Session, sid: int, subject_filter: str) -> None:
        self.session = session
        self.sid = sid
        self.subject_filter = subject_filter
        self.tokens = tuple(subject_filter.split("."))
        self.delivered = 0
        self.dropped = 0


class SubscriptionIndex:
    def __init__(self) -> None:
        self._all: set[Subscription] = set()
        self._cache: dict[bytes, tuple[Subscription, ...]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def add(self, sub: Subscription) -> None:
        self._all.add(sub)
        self._cache = {}

    def remove(self, sub: Subscription) -> None:
        self._all.discard(sub)
        self._cache = {}

    def match(self, subject: bytes) -> tuple[Subscription, ...]:
        """Subscriptions whose filter matches ``subject``. Runtime complexity: O(1)
        on a cache hit, O(subscriptions) on a miss."""
        hit = self._cache.get(subject)
        if hit is not None:
            return hit
        if len(self._cache) >= CACHE_LIMIT:
            self._cache = {}
        tokens = subject.decode(errors="replace").split(".")
        found = tuple(s for s in self._all if subject_matches(s.tokens, tokens))
        self._cache[subject] = found
        return found
