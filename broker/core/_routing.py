"""Subject -> partition routing, with a cache in front.

A published subject is looked up in a dict first (one lookup per message on the hot
path); a miss validates the subject, finds the one topic whose filters capture it,
picks the partition by the subject's stable hash, and caches the answer. The cache is
dropped whenever topics change, and cleared when it grows past ``CACHE_LIMIT``
subjects (so a stream of unique subjects costs memory only up to that bound).
"""

from __future__ import annotations

from protocol import BrokerError, ErrorCode, error_class, subject_matches, validate_published_subject

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
    def __init__(self) -> None:
        self._filters: list[tuple[tuple[str, ...], Topic]] = []
        #: subject bytes -> Partition, NO_TOPIC, or the BrokerError for an invalid subject
        self.cache: dict[bytes, Partition | _NoTopic | BrokerError] = {}
        self.any_kv = False
        self.any_refusing = False

    def rebuild(self, topics: list[Topic]) -> None:
        self._filters = [(tuple(f.split(".")), t) for t in topics for f in t.config.subjects]
        self.cache = {}
        #: Some topic is a KV bucket (whose every message goes through admission).
        self.any_kv = any(t.config.kv is not None for t in topics)
        #: Some topic may refuse a publish by its limits (``Topic.refusing``).
        self.any_refusing = any(t.refusing for t in topics)

    def resolve(self, subject: bytes) -> Partition | _NoTopic | BrokerError:
        """Route one subject (and cache the answer). Runtime complexity: O(filters)."""
        if len(self.cache) >= CACHE_LIMIT:
            self.cache = {}
        result: Partition | _NoTopic | BrokerError
        try:
            text = validate_published_subject(subject.decode())
        except UnicodeDecodeError:
            result = error_class(ErrorCode.INVALID_SUBJECT)("subject is not valid UTF-8")
        except BrokerError as err:
            result = err
        else:
            topic = self.topic_for(text)
            result = NO_TOPIC if topic is None else topic.partition_for(subject)
        self.cache[subject] = result
        return result

    def topic_for(self, subject: str) -> Topic | None:
        tokens = subject.split(".")
        for ftokens, topic in self._filters:
            if subject_matches(ftokens, tokens):
                return topic
        return None
