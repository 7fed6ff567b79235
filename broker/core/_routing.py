"""Subject -> partition routing, with a cache in front.

A published subject is looked up in a dict first (one lookup per message on the hot
path); a miss validates the subject, finds the one topic whose filters capture it,
picks the partition by the subject's stable hash, and caches the answer. The cache is
dropped whenever topics change, and cleared when it grows past ``CACHE_LIMIT``
subjects (so a stream of unique subjects costs memory only up to that bound).

A topic with a ``subject_transform`` (ADR-30) captures by its filters on the subject
as published, and stores the message under the transformed subject:
:meth:`Router.route_stored` gives both, and the partition is the stored subject's
(so one stored subject stays in one partition, whatever it was published as). A
transform that produces an invalid subject refuses the message. Transforms with
``{{random(n)}}`` are worked out at each publish, never cached.
"""

from __future__ import annotations

from protocol import BrokerError, ErrorCode, error_class, filters_overlap, subject_matches, validate_published_subject

from ._topics import Topic
from ._topics import Partition

__all__ = ["Router", "NO_TOPIC"]

CACHE_LIMIT = 100_000


class _NoTopic:
    def __repr__(self) -> str:
        return "NO_TOPIC"


#: Route result for a valid subject that no topic captures.
NO_TOPIC = _NoTopic()


class Router:
    """Every topic's subject filters, indexed by their first token: a subject (or a
    new filter) whose first token is a literal is compared only with the filters that
    start with that token and those that start with a wildcard, so routing a new
    subject and checking a new topic's filters cost the same with 10 topics or 10,000
    (as long as their filters do not all start with a wildcard)."""

    def __init__(self) -> None:
        #: (filter tokens, topic) in catalog order; by first token; those whose first
        #: token is ``*`` or ``>``. Each entry carries its position in ``_filters``.
        self._filters: list[tuple[tuple[str, ...], Topic]] = []
        self._by_first: dict[str, list[tuple[int, tuple[str, ...], Topic]]] = {}
        self._wild_first: list[tuple[int, tuple[str, ...], Topic]] = []
        #: subject bytes -> Partition, NO_TOPIC, or the BrokerError for an invalid subject
        self.cache: dict[bytes, Partition | _NoTopic | BrokerError] = {}
        #: subject bytes -> the subject it is stored under, for the cached subjects a
        #: topic's transform changes.
        self.stored: dict[bytes, bytes] = {}
        #: Some topic has a subject transform (publishes then use :meth:`route_stored`).
        self.any_transform = False
        self.any_kv = False
        self.any_refusing = False

    def rebuild(self, topics: list[Topic]) -> None:
        self._filters = []
        self._by_first = {}
        self._wild_first = []
        for t in topics:
            self._index(t)
        self.cache = {}
        self.stored = {}
        self.any_transform = any(t.transform is not None for t in topics)
        #: Some topic is a KV bucket (whose every message goes through admission).
        self.any_kv = any(t.config.kv is not None for t in topics)
        #: Some topic may refuse a publish by its limits (``Topic.refusing``).
        self.any_refusing = any(t.refusing for t in topics)

    def add(self, topic: Topic) -> None:
        """A new topic (what :meth:`rebuild` would give, without going through the
        others: no two topics' filters overlap, so their order does not matter)."""
        self._index(topic)
        self.cache = {}
        self.stored = {}
        self.any_transform = self.any_transform or topic.transform is not None
        self.any_refusing = self.any_refusing or topic.refusing
        self.any_kv = self.any_kv or topic.config.kv is not None

    def _index(self, topic: Topic) -> None:
        for f in topic.config.subjects:
            tokens = tuple(f.split("."))
            entry = (len(self._filters), tokens, topic)
            self._filters.append((tokens, topic))
            if tokens[0] in ("*", ">"):
                self._wild_first.append(entry)
            else:
                self._by_first.setdefault(tokens[0], []).append(entry)

    def _candidates(self, first: str) -> list[tuple[int, tuple[str, ...], Topic]]:
        """The filters a subject or filter whose first token is ``first`` may meet,
        in catalog order."""
        if first in ("*", ">"):
            return [(i, tokens, t) for i, (tokens, t) in enumerate(self._filters)]
        same = self._by_first.get(first, [])
        if not self._wild_first:
            return same
        if not same:
            return self._wild_first
        return sorted(same + self._wild_first, key=lambda e: e[0])

    def may_capture(self, first: str) -> bool:
        """Whether some topic's filters could capture a subject whose first token is
        ``first`` (a literal). Runtime complexity: O(1)."""
        return bool(self._wild_first or self._by_first.get(first))

    def check_overlap(self, subjects: tuple[str, ...], ignore: Topic | None = None) -> None:
        """Refuse filters that overlap a filter of another topic (``ignore``: the
        topic being changed): a subject filter belongs to at most one topic in the
        whole broker.

        Raises:
            BrokerError: SUBJECTS_OVERLAP, naming both filters and the other topic.
        """
        for mine in subjects:
            for _, tokens, other in self._candidates(mine.split(".", 1)[0]):
                if other is not ignore and filters_overlap(mine, ".".join(tokens)):
                    raise error_class(ErrorCode.SUBJECTS_OVERLAP)(
                        f"subject filter {mine!r} overlaps {'.'.join(tokens)!r} of topic {other.full_name}"
                    )

    def resolve(self, subject: bytes) -> Partition | _NoTopic | BrokerError:
        """Route one subject (and cache the answer). Runtime complexity: O(filters)."""
        return self._resolve(subject)[0]

    def route_stored(self, subject: bytes) -> tuple[Partition | _NoTopic | BrokerError, bytes | None]:
        """The route of a subject and, when its topic's transform changes it, the
        subject it is stored under (else None)."""
        route = self.cache.get(subject)
        if route is not None:
            return route, self.stored.get(subject)
        return self._resolve(subject)

    def _resolve(self, subject: bytes) -> tuple[Partition | _NoTopic | BrokerError, bytes | None]:
        if len(self.cache) >= CACHE_LIMIT:
            self.cache = {}
            self.stored = {}
        result: Partition | _NoTopic | BrokerError
        stored = None
        cache = True
        try:
            text = validate_published_subject(subject.decode())
        except UnicodeDecodeError:
            result = error_class(ErrorCode.INVALID_SUBJECT)("subject is not valid UTF-8")
        except BrokerError as err:
            result = err
        else:
            topic = self.topic_for(text)
            if topic is None:
                result = NO_TOPIC
            elif topic.transform is None:
                result = topic.partition_for(subject)
            else:
                cache = topic.transform.deterministic
                out = topic.transform.apply(text)
                if out is None or out == text:
                    result = topic.partition_for(subject)
                else:
                    try:
                        stored = validate_published_subject(out).encode()
                    except BrokerError as err:
                        result = error_class(ErrorCode.INVALID_SUBJECT)(
                            f"the subject transform of topic {topic.full_name} gives {out!r} for {text!r}, "
                            f"which is not a valid subject: {err.message}"
                        )
                        stored = None
                    else:
                        result = topic.partition_for(stored)
                        if cache:
                            self.stored[subject] = stored
        if cache:
            self.cache[subject] = result
        return result, stored

    def topic_for(self, subject: str) -> Topic | None:
        tokens = subject.split(".")
        for _, ftokens, topic in self._candidates(tokens[0]):
            if subject_matches(ftokens, tokens):
                return topic
        return None
