"""A topic's limits and discard policies, for both protocols in one place
(``docs/semantics.md``, "Limits and discard policies"), as nats-server's stores
apply them (``memstore.go`` / ``filestore.go`` ``storeRawMsg``, ``enforceMsgLimit``,
``enforceBytesLimit``):

* :func:`refuse`, before the append: ``max_msg_size`` (headers and payload), and
  with discard ``new`` the messages that do not fit: at ``max_msgs``, past
  ``max_bytes``, or (``discard_new_per_subject``) on a subject at
  ``max_msgs_per_subject`` unless the message is a rollup. A message on a subject at
  its per-subject limit replaces that subject's oldest, so it passes ``max_msgs``,
  and ``max_bytes`` when the oldest is at least as big, as on the server. The batch's
  messages are taken one after another, each seeing the ones admitted before it.
* :func:`trim`, after an append (and after markers, and when an update lowers a
  limit): with discard ``old``, the partition's oldest live messages go until it is
  within ``max_msgs`` and ``max_bytes`` (whatever consumers acked, as the server).

Both limits hold per partition (a NATS stream is one partition). A message's bytes
are its record's length, the measure ``bytes`` reports. Per message, O(1): the
counts are the log's (``live_count``; ``live_bytes`` once per batch, only for a
topic with ``max_bytes``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from protocol import RECORD_FIXED, ErrorCode, error_class
from protocol import RemovalReason as R

from ._batch import Batch
from ._stats import Counters
from ._topics import Partition

__all__ = ["refuse", "trim", "trim_in_order"]

_MaxMsgs = error_class(ErrorCode.MAX_MSGS_EXCEEDED)
_MaxBytes = error_class(ErrorCode.MAX_BYTES_EXCEEDED)
_PerSubject = error_class(ErrorCode.MAX_MSGS_PER_SUBJECT_EXCEEDED)
_TooLarge = error_class(ErrorCode.MESSAGE_TOO_LARGE)
#: A body's fixed fields (TTL, flags, lengths) before its subject, headers and payload.
_BODY_FIXED = RECORD_FIXED.size - 24
#: A record's header (length, CRC, offset, timestamp) before its body.
HEADER_SIZE = 24
_ROLLUP_SUB = 1


class _Subject:
    """One subject's live messages as the batch's admissions change them: the stored
    ones still there (oldest first, read from the index as needed) and the sizes of
    the batch's admitted ones."""

    __slots__ = ("next_off", "part", "sid", "sizes", "stored")

    def __init__(self, part: Partition, subject: bytes, empty: bool) -> None:
        self.part = part
        st = None if empty else part.index.get(subject)
        self.sid = st.sid if st is not None else 0
        self.stored = st.count if st is not None else 0
        self.next_off = st.first if st is not None and self.stored else 0
        self.sizes: deque[int] = deque()

    @property
    def count(self) -> int:
        return self.stored + len(self.sizes)

    def oldest_size(self) -> int:
        if self.stored:
            return self.part.log.record_size(self.next_off)
        return self.sizes[0] if self.sizes else 0

    def pop_oldest(self) -> int:
        if self.stored:
            size = self.part.log.record_size(self.next_off)
            self.stored -= 1
            self.next_off = self.part.index.next_live(self.sid, self.next_off + 1) if self.stored else 0
            return size
        return self.sizes.popleft()

    def drop_all_but_last(self) -> tuple[int, int]:
        """A subject rollup: every message but the newest goes; returns (count, bytes)."""
        n = b = 0
        while self.count > 1:
            b += self.pop_oldest()
            n += 1
        return n, b


def refuse(batch: Batch, counters: Counters) -> None:
    """Move the messages a topic's limits refuse to ``batch.failed`` (see the module
    docstring); they leave their groups."""
    groups = batch.groups
    n_refused = 0
    for part, idx in list(groups.items()):
        if not part.topic.refusing:
            continue
        keep = _group(batch, part, idx)
        n_refused += len(idx) - len(keep)
        if keep:
            groups[part] = keep
        else:
            del groups[part]
    counters.refused_limits += n_refused


def _group(batch: Batch, part: Partition, idx: list[int]) -> list[int]:
    cfg = part.topic.config
    subjects, starts, ends, failed, admitted = batch.subjects, batch.starts, batch.ends, batch.failed, batch.admitted
    cap = cfg.max_msg_size
    new = cfg.discard == "new"
    max_msgs, max_bytes, per = cfg.max_msgs, cfg.max_bytes, cfg.max_msgs_per_subject
    log = part.log
    msgs = log.live_count
    nbytes = log.live_bytes() if max_bytes and new else 0
    states: dict[bytes, _Subject] = {}
    rolled_all = False  # a rollup of everything in this batch: stored subjects are gone
    keep: list[int] = []
    for i in idx:
        s = subjects[i]
        body = ends[i] - starts[i]
        if cap and body - _BODY_FIXED - len(s) > cap:
            failed[i] = _TooLarge(
                f"message of {body - _BODY_FIXED - len(s)} bytes (headers and payload) exceeds "
                f"the topic's max_msg_size of {cap} bytes"
            )
            continue
        if not new:
            keep.append(i)
            continue
        size = body + HEADER_SIZE
        a = admitted.get(i) if admitted else None
        rollup = a.rollup if a is not None else 0
        st = states.get(s)
        if st is None and (per or rollup):
            st = states[s] = _Subject(part, s, rolled_all)
        at_limit = per > 0 and st is not None and st.count >= per
        if at_limit and cfg.discard_new_per_subject and not rollup:
            failed[i] = _PerSubject(f"maximum messages per subject exceeded: the subject holds {per}")
            continue
        if max_msgs and msgs >= max_msgs and not at_limit:
            failed[i] = _MaxMsgs(f"maximum messages exceeded: the partition holds {max_msgs}")
            continue
        if max_bytes and nbytes + size > max_bytes and (not at_limit or st is None or st.oldest_size() < size):
            failed[i] = _MaxBytes(f"maximum bytes exceeded: {nbytes} + {size} bytes would pass {max_bytes}")
            continue
        keep.append(i)
        msgs += 1
        nbytes += size
        if st is None:
            continue
        st.sizes.append(size)
        if per and st.count > per:  # max_msgs_per_subject takes the subject's oldest
            nbytes -= st.pop_oldest()
            msgs -= 1
        if rollup == _ROLLUP_SUB:
            n, b = st.drop_all_but_last()
            msgs -= n
            nbytes -= b
        elif rollup:
            msgs, nbytes, rolled_all = 1, size, True
            states = {s: st}
            st.stored = 0
            st.sizes = deque([size])
    return keep


def trim(part: Partition, remove: Callable[[Partition, list[int], R], object]) -> None:
    """Discard old: remove the partition's oldest live messages until it is within
    ``max_msgs`` and ``max_bytes`` (``remove``: the broker's ``Retention.remove``)."""
    cfg = part.topic.config
    log = part.log
    over_n = log.live_count - cfg.max_msgs if cfg.max_msgs else 0
    over_b = log.live_bytes() - cfg.max_bytes if cfg.max_bytes else 0
    if over_n > 0 or over_b > 0:
        doomed = log.oldest_to_drop(over_n, over_b)
        if doomed:
            remove(part, doomed, R.LIMITS)


def trim_in_order(
    part: Partition, first: int, subjects: list[bytes], remove: Callable[[Partition, list[int], R], object],
) -> None:
    """``max_msgs_per_subject`` and discard old after a batch of messages appended at
    ``first`` on ``subjects`` (more than one), taken one message after another as
    the server stores them: a subject's removal can bring the partition back under
    a limit that the message before it passed, so the batch's end state alone does
    not say which of the oldest go. O(1) per message, plus the removals."""
    cfg = part.topic.config
    log, index = part.log, part.index
    per, max_msgs, max_bytes = cfg.max_msgs_per_subject, cfg.max_msgs, cfg.max_bytes
    offsets = range(first, first + len(subjects))
    sizes = [log.record_size(o) for o in offsets]
    count = log.live_count - len(subjects)
    nbytes = log.live_bytes() - sum(sizes) if max_bytes else 0
    by_subject: set[int] = set()
    by_limits: set[int] = set()
    # subject -> [its oldest candidate offset, sid, live count before the batch's next message]
    heads: dict[bytes, list[int]] = {}
    for s in subjects:
        h = heads.get(s)
        if h is None:
            st = index.get(s)
            assert st is not None  # the batch wrote it
            heads[s] = [st.first, st.sid, st.count - 1]
        else:
            h[2] -= 1
    oldest = _live_offsets(part)
    head = next(oldest, 0)
    for o, s, size in zip(offsets, subjects, sizes):
        count += 1
        nbytes += size
        h = heads[s]
        h[2] += 1
        if h[2] > per:
            while h[0] in by_limits or h[0] in by_subject:
                h[0] = index.next_live(h[1], h[0] + 1)
            by_subject.add(h[0])
            nbytes -= log.record_size(h[0])
            h[0] = index.next_live(h[1], h[0] + 1)
            h[2] -= 1
            count -= 1
        while (max_msgs and count > max_msgs) or (max_bytes and nbytes > max_bytes):
            while head and (head in by_subject or head in by_limits):
                head = next(oldest, 0)
            if not head or head > o:
                break
            by_limits.add(head)
            count -= 1
            nbytes -= log.record_size(head)
            hs = heads.get(index.subject_at(head))
            if hs is not None:
                hs[2] -= 1
            head = next(oldest, 0)
    if by_subject:
        remove(part, sorted(by_subject), R.MAX_MSGS_PER_SUBJECT)
    if by_limits:
        remove(part, sorted(by_limits), R.LIMITS)


def _live_offsets(part: Partition) -> Iterator[int]:
    for seg in part.log.segments:
        rel = seg.first_live_rel()
        while rel >= 0:
            yield seg.base + rel
            rel = seg.first_live_rel(rel + 1)
