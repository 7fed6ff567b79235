"""The catalog: every stream the broker holds, looked up by id or name, the republish
check a new or changed topic must pass, and the JSON the data directory keeps of it.

(That a subject filter belongs to at most one topic in the whole broker is checked
by the router, which indexes every filter: ``Router.check_overlap``.)
"""

from __future__ import annotations

from typing import Any

from protocol import ErrorCode, Identifier, SubjectTransform, error_class, filters_overlap

from ._topic_config import TopicConfig
from ._topics import Stream, Topic, by_name

__all__ = ["Catalog"]


class Catalog:
    VERSION = 1

    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}
        #: The highest stream id ever given (ids are never reused).
        self.stream_id_mark = 0
        #: Directories that are garbage unless the catalog names them: ``(stream id,
        #: topic id)`` or ``(stream id, None)`` for a whole stream. Written before a
        #: deleted topic's files are removed (and before a new topic's are created),
        #: dropped once done; at start the broker removes what is still listed.
        self.removing: list[tuple[int, int | None]] = []
        #: Topics the catalog names whose directories may not all exist yet: ``(stream
        #: id, topic id)``. A create names the topic and lists it here in one catalog
        #: write, then makes its files; the next catalog write drops the entry. At start
        #: a listed topic's missing directories are made, not reported as damage.
        self.creating: list[tuple[int, int]] = []
        self._by_name: dict[str, Stream] = {}

    def stream(self, ident: Identifier) -> Stream:
        value = ident.value
        if isinstance(value, int):
            s = self.streams.get(value)
        else:
            s = by_name(self.streams, self._by_name, value)
        if s is None:
            raise error_class(ErrorCode.STREAM_NOT_FOUND)(f"no stream {ident.value!r}")
        return s

    def topic(self, stream: Identifier, topic: Identifier) -> Topic:
        return self.stream(stream).topic(topic)

    def topics(self) -> list[Topic]:
        return [t for s in self.streams.values() for t in s.topics.values()]

    def next_stream_id(self) -> int:
        """One more than the highest stream id ever given (the broker also skips ids
        that have a directory on disk)."""
        return max(max(self.streams, default=0), self.stream_id_mark) + 1

    def check_republish_cycles(self, topic: Topic, config: TopicConfig) -> None:
        """Refuse a configuration of ``topic`` that closes a republish loop through
        other topics (A republishes into what B captures, B into what A captures, or
        longer chains). ADR-28 only guards a topic against itself; this sees the
        whole graph. Before the change there was no cycle, so any new one runs
        through ``topic``: a depth-first search from it finds it.

        Raises:
            RepublishCycleError: naming every topic of the cycle.
        """
        if not config.republish:
            return  # no edge leaves the topic: no cycle runs through it
        topics = [t for t in self.topics() if t is not topic] + [topic]
        configs = {id(t): (config if t is topic else t.config) for t in topics}

        def targets(t: Topic) -> list[Topic]:
            rp = configs[id(t)].republish
            if not rp:
                return []
            out_filter = SubjectTransform(rp["src"], rp["dest"]).as_filter()
            return [u for u in topics if u is not t and any(filters_overlap(out_filter, f) for f in configs[id(u)].subjects)]

        path: list[Topic] = [topic]
        seen: set[int] = set()

        def visit(t: Topic) -> list[Topic] | None:
            for u in targets(t):
                if u is topic:
                    return path + [topic]
                if id(u) in seen:
                    continue
                seen.add(id(u))
                path.append(u)
                found = visit(u)
                if found:
                    return found
                path.pop()
            return None

        cycle = visit(topic)
        if cycle:
            names = " -> ".join(t.full_name for t in cycle)
            raise error_class(ErrorCode.REPUBLISH_CYCLE)(f"republish destination forms a cycle through topics: {names}")

    def top_json(self) -> dict[str, Any]:
        """The document's values besides its streams (small, whatever the catalog holds)."""
        return {
            "version": self.VERSION,
            "next_stream_id": self.next_stream_id(),
            "removing": [[s, t] for s, t in self.removing],
            **({"creating": [[s, t] for s, t in self.creating]} if self.creating else {}),
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.top_json(), "streams": [s.to_json() for s in sorted(self.streams.values(), key=lambda s: s.id)]}
