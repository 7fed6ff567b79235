"""De-duplication by ``Nats-Msg-Id`` (JetStream's duplicate window), one table per topic.

A publish whose ``Nats-Msg-Id`` was stored on the topic within the last
``duplicate_window`` seconds is not stored again; its ack says ``DUPLICATE_MESSAGE``
with the original's partition and offset (``_publishing.py``). The table is
independent of the messages, as on the NATS server: removing the original (delete,
expiry, rollup, purge) does not forget its id.

Memory is bounded by the window: ids sit in a dict (id -> entry) and, in the order
they were stored, in a deque; every lookup and insert first drops the entries older
than the window from the deque's head, so pruning costs O(1) amortised per id and
never needs a timer. After a restart the table is rebuilt from the stored records
that carry the header (``Retention.rebuild``).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

__all__ = ["MSG_ID", "DedupTable", "Original"]

#: The header that names a message for de-duplication (exact, case-sensitive).
MSG_ID = b"Nats-Msg-Id"

NS = 1_000_000_000


class Original(NamedTuple):
    """Where the first message with an id was stored, and when (ns)."""

    timestamp: int
    partition: int
    offset: int


class DedupTable:
    def __init__(self) -> None:
        self.ids: dict[bytes, Original] = {}
        self._order: deque[tuple[int, bytes]] = deque()

    def __len__(self) -> int:
        return len(self.ids)

    def prune(self, now_ns: int, window_s: int) -> None:
        """Forget the ids stored before ``now - window``."""
        order = self._order
        if not order:
            return
        cutoff = now_ns - window_s * NS
        ids = self.ids
        while order and order[0][0] < cutoff:
            ts, msg_id = order.popleft()
            o = ids.get(msg_id)
            if o is not None and o.timestamp == ts:
                del ids[msg_id]

    def get(self, msg_id: bytes, now_ns: int, window_s: int) -> Original | None:
        """The original of ``msg_id`` if it was stored within the window."""
        o = self.ids.get(msg_id)
        if o is None:
            return None
        if o.timestamp < now_ns - window_s * NS:
            self.prune(now_ns, window_s)
            return None
        return o

    def add(self, msg_id: bytes, timestamp: int, partition: int, offset: int) -> None:
        self.ids[msg_id] = Original(timestamp, partition, offset)
        self._order.append((timestamp, msg_id))

    @property
    def last(self) -> bytes | None:
        """The id stored last (within the window), or None."""
        return self._order[-1][1] if self._order else None

    def clear(self) -> None:
        self.ids.clear()
        self._order.clear()

    def load(self, entries: list[tuple[int, bytes, int, int]], window_s: int) -> None:
        """Add stored records (one partition's, after a restart): ``(timestamp, id,
        partition, offset)`` in any order, merged with what the table holds so the
        time order holds across partitions. Entries older than the window before the
        newest one are left out (the clock may not be readable yet; the first lookup
        prunes the rest). Of two records with one id the newer wins (the older one
        was stored again outside the window, or while de-duplication was off)."""
        if not entries or not window_s:
            return
        merged = [(o.timestamp, msg_id, o.partition, o.offset) for msg_id, o in self.ids.items()]
        merged.extend(entries)
        merged.sort(key=lambda e: e[0])
        cutoff = merged[-1][0] - window_s * NS
        self.clear()
        for ts, msg_id, partition, offset in merged:
            if ts >= cutoff:
                self.add(msg_id, ts, partition, offset)
