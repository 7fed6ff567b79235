"""Per-partition subject state: how many live messages each subject has, its first
and last live offset, and which subject every offset belongs to.

The last of these is one ``u32`` subject id per offset, in an ``array('I')``: 4 bytes a
message, and finding the next message of a subject is a C-speed ``array.index``, the
previous one a C-speed ``rfind`` over the array's memory, a chunk at a time (the NATS
file store keeps the same per-subject ``first/last/total`` and recomputes "first"
lazily by scanning; we scan memory instead of blocks). Nothing here is persisted: it is rebuilt from the log when the
broker starts.

**Damaged records** are not live, so the counts and offsets above leave them out; but
a reader of a subject's last message must know when the newest one is a record it
cannot read, or it would serve the one before as current. So the index also keeps,
per subject, its newest damaged record (:attr:`SubjectIndex.damaged`, from the
startup scan, which names a damaged record's subject where an intact file still
says it, and from reads that find a live record damaged), and the newest damaged
record whose subject nothing intact says (:attr:`SubjectIndex.damaged_unknown`),
which could be any subject's; :meth:`SubjectIndex.damage_since` answers
(``docs/semantics.md`` §3.4). A repair writes damaged records off, and a purge
removes them: what the log no longer holds as damaged no longer counts.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable

__all__ = ["SubjectIndex", "SubjectState", "PENDING", "NEVER", "NO_MARKER", "MARKER", "TOMBSTONE"]

#: The id of offsets with no subject (recovery gaps): it matches nothing.
NO_SUBJECT = 0xFFFFFFFF
#: Ids per chunk when ``prev_live`` scans backwards.
_CHUNK = 65536
#: From this many messages on, :meth:`SubjectIndex.extend` works in bulk.
_BULK = 64

# Per-offset flags (one byte per message, beside its subject id):
#: the message has a live entry in the deadline structure
PENDING = 0x01
#: its TTL is ``never``: max age does not remove it
NEVER = 0x02
#: its removal by age leaves no marker (a KV purge tombstone)
NO_MARKER = 0x04
#: it is a subject delete marker (its removal never leaves another one)
MARKER = 0x08
#: it is a KV tombstone (``KV-Operation: DEL`` or ``PURGE``)
TOMBSTONE = 0x10


class SubjectState:
    """One subject in one partition."""

    __slots__ = ("sid", "count", "first", "last")

    def __init__(self, sid: int, offset: int) -> None:
        self.sid = sid
        self.count = 1
        self.first = offset
        self.last = offset

    def __repr__(self) -> str:
        return f"SubjectState(sid={self.sid}, count={self.count}, first={self.first}, last={self.last})"


class SubjectIndex:
    """Args:
    base: the first offset the id array describes (1 for a new partition).
    is_live: tells whether an offset is still live (the partition log knows).
    """

    def __init__(
        self, base: int, is_live: Callable[[int], bool], is_corrupt: Callable[[int], bool] = lambda offset: False,
    ) -> None:
        self.base = base
        self.seq = array("I")  # subject id per offset from ``base``
        self.flags = bytearray()  # one flag byte per offset from ``base``
        self.subjects: dict[bytes, SubjectState] = {}
        self.names: list[bytes] = []
        self._is_live = is_live
        self._is_corrupt = is_corrupt
        #: Bumped whenever a subject is added or forgotten (filter caches key on it).
        self.version = 0
        #: Subject -> the offset of its newest record found damaged (whatever the
        #: subject's live records: it may have none left).
        self.damaged: dict[bytes, int] = {}
        #: The offset of the newest damaged record whose subject is not known (0: none).
        self.damaged_unknown = 0

    def __len__(self) -> int:
        return len(self.subjects)

    def get(self, subject: bytes) -> SubjectState | None:
        return self.subjects.get(subject)

    def subject_at(self, offset: int) -> bytes:
        return self.names[self.seq[offset - self.base]]

    def sid_at(self, offset: int) -> int:
        return self.seq[offset - self.base]

    @property
    def end(self) -> int:
        """The offset after the last one indexed."""
        return self.base + len(self.seq)

    # -- adding --------------------------------------------------------------------

    def flags_at(self, offset: int) -> int:
        i = offset - self.base
        return self.flags[i] if 0 <= i < len(self.flags) else 0

    def set_flags(self, offset: int, value: int) -> None:
        self.flags[offset - self.base] = value

    def extend(self, first_offset: int, subjects: list[bytes], flags: bytes | bytearray | None = None) -> None:
        """Record that ``subjects[k]`` was stored at ``first_offset + k`` (with
        ``flags[k]``, zero when not given).

        Runtime complexity: O(len(subjects)), one dict lookup per message.
        """
        if first_offset != self.base + len(self.seq):
            # Offsets with no subject (recovery gaps): fill with an id that matches nothing.
            self._pad(first_offset)
        if len(subjects) >= _BULK:
            self._extend_bulk(first_offset, subjects, flags)
            return
        table = self.subjects
        ids: list[int] = []
        append = ids.append
        off = first_offset
        for s in subjects:
            st = table.get(s)
            if st is None:
                st = SubjectState(len(self.names), off)
                self.names.append(s)
                table[s] = st
                self.version += 1
            else:
                if not st.count:
                    st.first = off
                st.count += 1
                st.last = off
            append(st.sid)
            off += 1
        self.seq.extend(ids)
        self.flags += flags if flags is not None else bytes(len(ids))

    def _extend_bulk(self, first_offset: int, subjects: list[bytes], flags: bytes | bytearray | None) -> None:
        """:meth:`extend` for many messages: the per-message work is done by C loops
        (dict building, counting), the Python loop runs once per distinct subject;
        a batch of one subject (a client's flood) is one count and one repeat."""
        table = self.subjects
        names = self.names
        end = first_offset + len(subjects)
        one = subjects[0]
        if subjects.count(one) == len(subjects):
            sid = self._account(one, len(subjects), first_offset, end - 1)
            self.seq.extend(array("I", (sid,)) * len(subjects))
            self.flags += flags if flags is not None else bytes(len(subjects))
            return
        counts = Counter(subjects)  # in order of first appearance, like the ids
        last = dict(zip(subjects, range(first_offset, end)))  # the later one wins
        first: dict[bytes, int] | None = None
        ids = {}
        for s, n in counts.items():
            st = table.get(s)
            if st is None or not st.count:
                if first is None:
                    first = dict(zip(reversed(subjects), range(end - 1, first_offset - 1, -1)))
                if st is None:
                    st = table[s] = SubjectState(len(names), first[s])
                    names.append(s)
                    self.version += 1
                    st.count = 0
                else:
                    st.first = first[s]
            st.count += n
            st.last = last[s]
            ids[s] = st.sid
        self.seq.extend(array("I", map(ids.__getitem__, subjects)))
        self.flags += flags if flags is not None else bytes(len(subjects))

    def extend_ids(
        self, first_offset: int, names: list[bytes], ids: array, flags: bytes,
        stats: list[tuple[int, int, int]] | None = None,
    ) -> None:
        """:meth:`extend` for messages given as numbers ``ids[k]`` into ``names`` (a
        segment's subject table, the startup rebuild). ``stats``: per name ``(count,
        first offset, last offset)`` over exactly these messages, when known; then
        the Python work is one step per name, else one per distinct name and the
        per-message work is C loops.
        """
        if first_offset != self.base + len(self.seq):
            self._pad(first_offset)
        if stats is None:
            end = first_offset + len(ids)
            counts = Counter(ids)
            last = dict(zip(ids, range(first_offset, end)))
            first = dict(zip(reversed(ids), range(end - 1, first_offset - 1, -1)))
            stats_of = [(k, n, first[k], last[k]) for k, n in counts.items()]
        else:
            stats_of = [(k, n, f, la) for k, (n, f, la) in enumerate(stats) if n]
        to_global = array("I", bytes(4 * len(names)))
        for k, n, f, la in stats_of:
            to_global[k] = self._account(names[k], n, f, la)
        if all(to_global[k] == k for k, _, _, _ in stats_of):
            self.seq.extend(ids)  # the segment numbers its subjects as the index does
        else:
            self.seq.extend(array("I", map(to_global.__getitem__, ids)))
        self.flags += flags

    def _account(self, subject: bytes, n: int, first: int, last: int) -> int:
        """Count ``n`` more messages of ``subject``, the first of them at ``first``
        and the last at ``last`` (a new subject gets the next id); its id."""
        st = self.subjects.get(subject)
        if st is None:
            st = self.subjects[subject] = SubjectState(len(self.names), first)
            self.names.append(subject)
            self.version += 1
            st.count = 0
        elif not st.count:
            st.first = first
        st.count += n
        st.last = last
        return st.sid

    def _pad(self, offset: int) -> None:
        missing = offset - (self.base + len(self.seq))
        if missing > 0:
            self.seq.extend(array("I", (NO_SUBJECT,)) * missing)
            self.flags += bytes(missing)
        elif missing < 0:
            raise ValueError(f"offset {offset} was already indexed")

    # -- damaged records ------------------------------------------------------------

    def note_damaged(self, offset: int, subject: bytes | None) -> None:
        """The record at ``offset`` is damaged; its subject is ``subject`` (None: not
        known, so it may be any subject's). O(1)."""
        if subject is None:
            self.damaged_unknown = max(self.damaged_unknown, offset)
        elif offset > self.damaged.get(subject, 0):
            self.damaged[subject] = offset

    def note_damaged_at(self, offset: int) -> None:
        """A live record indexed at ``offset`` was found damaged by a read: its subject
        is the one it was indexed with."""
        i = offset - self.base
        if 0 <= i < len(self.seq) and self.seq[i] != NO_SUBJECT:
            self.note_damaged(offset, self.names[self.seq[i]])

    def damage_since(self, subject: bytes, last: int) -> tuple[int, bool] | None:
        """A damaged record that is, or may be, the newest message of ``subject``,
        whose newest readable (live) message is at ``last`` (0: none): ``(offset,
        known)``, ``known`` False when the record's subject is not known (it is then
        newer than ``last`` and could be this subject's), or None when there is none.
        A known one is preferred; each counts only while the log still holds it as
        damaged. O(1)."""
        d = self.damaged.get(subject, 0) if self.damaged else 0
        if d and d >= last and self._is_corrupt(d):
            return d, True
        u = self.damaged_unknown
        if u and u > last and self._is_corrupt(u):
            return u, False
        return None

    def damage_matching(self, matches: Callable[[bytes], bool], last: int) -> tuple[int, bool, bytes | None] | None:
        """:meth:`damage_since` for the subjects ``matches`` accepts (a wildcard
        filter), whose newest readable message is at ``last``: ``(offset, known,
        subject)``. O(subjects with damaged records)."""
        best = max(
            ((o, s) for s, o in self.damaged.items() if o >= last and matches(s) and self._is_corrupt(o)), default=None,
        )
        if best is not None:
            return best[0], True, best[1]
        u = self.damaged_unknown
        if u and u > last and self._is_corrupt(u):
            return u, False, None
        return None

    # -- removing ------------------------------------------------------------------

    def removed(self, offset: int) -> SubjectState | None:
        """Account for the removal of the live message at ``offset`` (call after the
        log no longer reports it live). Returns its subject's state (count may be 0).
        """
        i = offset - self.base
        if i < 0 or i >= len(self.seq):
            return None
        sid = self.seq[i]
        if sid == NO_SUBJECT:
            return None
        st = self.subjects[self.names[sid]]
        st.count -= 1
        if st.count <= 0:
            st.count = 0
            st.first = st.last = 0
        elif st.count == 1:
            # One left: it is whichever of first and last is not going away.
            st.first = st.last = st.last if offset == st.first else st.first
        else:
            if offset == st.first:
                st.first = self.next_live(sid, offset + 1)
            if offset == st.last:
                st.last = self.prev_live(sid, offset)
        return st

    def next_live(self, sid: int, start: int) -> int:
        """The first live offset >= ``start`` with subject ``sid`` (0 if none)."""
        seq = self.seq
        pos = max(start - self.base, 0)
        while True:
            try:
                i = seq.index(sid, pos)
            except ValueError:
                return 0
            off = self.base + i
            if self._is_live(off):
                return off
            pos = i + 1

    def prev_live(self, sid: int, before: int) -> int:
        """The last live offset < ``before`` with subject ``sid`` (0 if none)."""
        needle = array("I", (sid,)).tobytes()
        end = min(before - self.base, len(self.seq))
        with memoryview(self.seq) as ids:
            while end > 0:
                start = max(end - _CHUNK, 0)
                raw = ids[start:end].tobytes()
                j = len(raw)
                while (k := raw.rfind(needle, 0, j)) >= 0:
                    if k % 4:  # straddles two ids
                        j = k + 3
                        continue
                    off = self.base + start + k // 4
                    if self._is_live(off):
                        return off
                    j = k
                end = start
        return 0

    def trim(self, first_kept: int) -> None:
        """Forget ids below ``first_kept`` (after a purge removed them all)."""
        drop = min(first_kept - self.base, len(self.flags))
        if drop > 0:
            del self.seq[:drop]
            del self.flags[:drop]
            self.base += drop

    def forget_empty(self) -> None:
        """Drop subjects with no live message (after purges), so memory follows data.

        Their ids stay reserved in ``names`` (offsets in ``seq`` may still name them)
        but their state goes.
        """
        empty = [s for s, st in self.subjects.items() if not st.count]
        for s in empty:
            del self.subjects[s]
        if empty:
            self.version += 1

    def matching_ids(self, matches: Callable[[bytes], bool]) -> set[int]:
        """Ids of the known subjects for which ``matches(subject)`` is true."""
        # Empty subjects too: one may get a message again without a version bump.
        return {st.sid for s, st in self.subjects.items() if matches(s)}
