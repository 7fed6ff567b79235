"""A segment's deletions: the ``.del`` file and its mirror ``.del2``
(:class:`Deletions`), written on each delete and read back by recovery.

``.del`` and ``.del2``
    Deletions, the same entries in both files: ``(u32 word, u32 CRC-32 of the word)``
    where the word holds the relative offset (low 28 bits) and a tag (top 4 bits).
    Appended on each delete and fsynced like the log, before the delete is
    acknowledged (a *deferred* deletion, one the broker makes again after a crash
    from the log itself, later: :meth:`Deletions.take_deferred_fds`). Two copies, so that one damaged write, page or truncation loses
    no acknowledged deletion: recovery takes the union of the valid entries of both.
    Allocated ahead like the active log (from one page, ``_files.AppendFile``) and
    cut at close; whole entries of zero bytes at a file's end are that space (an
    entry of zeros never passes its checksum), dropped and cut by recovery.

Deletions cannot be rebuilt from the log: a damaged entry is reported, and if neither
copy holds it the segment's live records are put aside (reads of them fail) rather
than risk serving a deleted message.
"""

from __future__ import annotations

import os
import struct
import zlib

from ._damage import Damage
from ._durability import fsync_dir
from ._files import AppendFile, atomic_write, keep_aside, open_file, read_if_exists
from ._log import DELETED, LIVE, SegmentLog
from ._recovery import Opening

__all__ = ["Deletions", "read_deletion_tags"]

_ENTRY = struct.Struct("<II")
_U32 = struct.Struct("<I")
#: An entry's first word: the record's index in the segment in the low 28 bits (a
#: segment of at most 1 GiB holds fewer than 2**25 records), and in the top 4 bits a
#: tag the caller gives (why it was deleted; 0 = not said).
_REL_MASK = 0x0FFFFFFF
_TAG_SHIFT = 28
#: A word no real entry has (relative offset beyond any segment, tag 15): the
#: segment's deletions could not all be read, so its remaining records are put aside.
_UNCERTAIN_WORD = 0xFFFFFFFF
#: The deletion files are allocated ahead from one page (512 entries), as much as
#: they hold after that (a segment with few deletions keeps little unused space).
_ALLOCATE_MIN = 4096


class Deletions:
    """Both copies of one segment's deletions (path stem ``stem``, in ``directory``).

    Attributes:
        dirty: written to since the group commit last took the descriptors.
        deferred: holds entries appended with ``deferred`` (deletions that recovery
            can make again, nobody waits for) that no sync has taken yet, and no
            other entry since (which would make them :attr:`dirty`).
        uncertain: some deletion of this segment could not be read: its records are
            put aside, and nothing more may be appended to it (new records are not
            in doubt).
    """

    def __init__(self, directory: str, stem: str) -> None:
        self.directory = directory
        self.path = stem + ".del"
        self.mirror_path = stem + ".del2"
        self._fd = -1
        self._mirror_fd = -1
        #: Both copies, once opened for writing.
        self._files: list[AppendFile] = []
        self.dirty = False
        self.deferred = False
        self.uncertain = False

    @property
    def paths(self) -> tuple[str, str]:
        return self.path, self.mirror_path

    # -- writing -------------------------------------------------------------------

    def append(self, rels: list[int], tag: int, deferred: bool = False) -> None:
        """Record the deletion of records ``rels`` with ``tag`` (0..15): one write to
        each copy. Durable once :meth:`take_dirty_fds`' descriptors are synced.
        ``deferred``: a deletion that recovery makes again from the log itself (a
        limit's): the files are written now, but only :meth:`take_deferred_fds`
        hands them to a sync (unless a later entry makes them dirty).

        Raises:
            StorageFailure: a write failed.
        """
        high = (tag & 0xF) << _TAG_SHIFT
        entries = b"".join([_entry(rel | high) for rel in rels])
        if self._fd < 0:
            self._fd, self._mirror_fd = self._open()
            self._files = [AppendFile(fd, os.fstat(fd).st_size, _ALLOCATE_MIN) for fd in (self._fd, self._mirror_fd)]
        for out in self._files:
            out.append(entries)
        if not deferred:
            self.dirty = True
        elif not self.dirty:
            self.deferred = True

    def _open(self) -> tuple[int, int]:
        flags = os.O_WRONLY | os.O_CREAT
        created = not os.path.exists(self.path) or not os.path.exists(self.mirror_path)
        fds = open_file(self.path, flags), open_file(self.mirror_path, flags)
        if created:
            fsync_dir(self.directory)  # the new files' entries, before any delete is acked
        return fds

    def take_dirty_fds(self) -> list[int]:
        if not self.dirty:
            return []
        self.dirty = self.deferred = False  # (a sync of the files takes every entry)
        return [self._fd, self._mirror_fd]

    def take_deferred_fds(self) -> list[int]:
        """The descriptors to sync for the deferred entries (none if there are none)."""
        if not self.deferred:
            return []
        self.deferred = False
        return [self._fd, self._mirror_fd]

    def close(self) -> None:
        """Close both copies, each cut to its entries first (a failure to cut leaves
        zero bytes that the next start cuts)."""
        for out in self._files:
            try:
                out.cut()
            except OSError:
                pass
        self._files = []
        for attr in ("_fd", "_mirror_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                setattr(self, attr, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass

    # -- recovery ------------------------------------------------------------------

    def apply(self, log: SegmentLog, opening: Opening) -> None:
        """Apply the recorded deletions to ``log``'s states: the union of both copies'
        valid entries.

        Copies that differ are made equal again (after a crash between the two
        writes, or damage to one); damaged bytes are kept aside first. An entry that
        neither copy can give is an acknowledged deletion the broker cannot place:
        the segment's live records are put aside (marked corrupt, durably, with an
        ``UNCERTAIN`` entry) rather than risk serving a deleted message.
        """
        found = [read_if_exists(self.path), read_if_exists(self.mirror_path)]
        if found[0] is None and found[1] is None:
            return
        copies = [_without_allocated(raw) for raw in found]
        words, unknown, damaged = _merge(copies, opening.clean)
        self._report_copies(copies, damaged, unknown, opening)
        if unknown:
            words[_UNCERTAIN_WORD] = None
        self._apply_words(log, words, unknown, opening)
        if not opening.readonly:
            self._rewrite(found, copies, damaged, b"".join(_entry(w) for w in words), opening)

    def _report_copies(
        self, copies: list[bytes | None], damaged: list[int | None], unknown: int, opening: Opening
    ) -> None:
        """Report each copy that is missing or damaged."""
        for k, path in enumerate(self.paths):
            raw = copies[k]
            if raw is None:
                if opening.strict:
                    opening.report(Damage("deletions", path, None, "missing", opening.act("recreated from the other copy")))
            elif damaged[k] is not None:
                opening.report(Damage(
                    "deletions", path, damaged[k], "entries fail their checksum or are missing",
                    opening.act("the other copy holds them; rewritten from it (old bytes kept in quarantine)"
                                if not unknown else "kept in quarantine"),
                ))

    def _apply_words(self, log: SegmentLog, words: dict[int, None], unknown: int, opening: Opening) -> None:
        """Mark the records ``words`` name deleted; with the uncertain word among
        them, put the segment's remaining live records aside (and report it)."""
        state = log.state
        n = len(state)
        uncertain = _UNCERTAIN_WORD in words
        for word in words:
            rel = word & _REL_MASK
            if rel < n and state[rel] != DELETED:
                if state[rel] == LIVE:
                    log.lose_live([rel])
                state[rel] = DELETED
        if not uncertain:
            return
        self.uncertain = True
        held = [rel for rel in range(n) if state[rel] == LIVE]
        for rel in held:
            log.mark_corrupt(rel)
        if unknown or held:
            opening.report(Damage(
                "deletions", self.path, None,
                f"{unknown} deletion entr{'y' if unknown == 1 else 'ies'} unreadable in both copies"
                if unknown else "the segment's deletions were found unreadable before",
                opening.act(f"{len(held)} live record(s) of the segment put aside: reads of them fail with "
                            "CORRUPTED_RECORD (ttlbroker check lists them)"),
                (log.base, log.base + n - 1) if n else None,
            ))

    def _rewrite(
        self, found: list[bytes | None], copies: list[bytes | None], damaged: list[int | None], merged: bytes,
        opening: Opening,
    ) -> None:
        """Make both copies hold ``merged``, the entries of both: a copy that differs
        is replaced (its damaged bytes kept aside first); one that only ends in
        allocated space is cut."""
        for k, path in enumerate(self.paths):
            if copies[k] != merged:
                if copies[k] and damaged[k] is not None:
                    keep_aside(path, opening.quarantine_dir, ".damaged")
                atomic_write(path, merged)
            elif found[k] is not copies[k]:
                # Only allocated space after the entries. Not synced: until it is, a
                # crash leaves the same zeros to cut again.
                os.truncate(path, len(merged))


def _entry(word: int) -> bytes:
    raw = _U32.pack(word)
    return raw + _U32.pack(zlib.crc32(raw))


def _without_allocated(raw: bytes | None) -> bytes | None:
    """A deletion file's bytes without the zero bytes that end it, from the end of
    the last entry holding anything else (space allocated ahead: an entry of zero
    bytes never passes its checksum, the CRC-32 of a zero word not being 0)."""
    if raw is None:
        return None
    keep = -(-len(raw.rstrip(b"\0")) // _ENTRY.size) * _ENTRY.size
    return raw[:keep] if keep < len(raw) else raw


def _parse(raw: bytes) -> list[int | None]:
    """Each entry's word, or None where the entry fails its checksum."""
    out: list[int | None] = []
    crc32 = zlib.crc32
    for i in range(0, len(raw) - len(raw) % 8, 8):
        word, crc = _ENTRY.unpack_from(raw, i)
        out.append(word if crc32(raw[i : i + 4]) == crc else None)
    return out


def _merge(copies: list[bytes | None], clean: bool) -> tuple[dict[int, None], int, list[int | None]]:
    """Merge the two copies of a segment's deletions, entry by entry (both get the
    same entries in the same order).

    Returns ``(words, unknown, damaged)``: the valid words in order (as dict keys),
    how many entries neither copy can give, and for each copy the byte position of
    its first damage (None: undamaged). After an unclean stop, a bad or partial
    last entry is a torn write (that delete was never acknowledged) and a copy that
    lacks the other's last entries was cut between the two writes: neither is damage.
    """
    parsed = [_parse(raw) if raw is not None else None for raw in copies]
    longest = max(len(p) for p in parsed if p is not None)
    words: dict[int, None] = {}
    unknown = 0
    damaged: list[int | None] = [None, None]
    for k, raw in enumerate(copies):
        if raw is not None and len(raw) % 8 and clean:
            damaged[k] = len(raw) - len(raw) % 8
    for i in range(longest):
        good = False
        for k, p in enumerate(parsed):
            if p is None:
                continue
            if i < len(p):
                w = p[i]
                if w is not None:
                    words[w] = None
                    good = True
                elif (clean or i < len(p) - 1) and damaged[k] is None:
                    damaged[k] = i * 8
            elif clean and damaged[k] is None:
                damaged[k] = len(copies[k] or b"")  # cut short
        if not good and (clean or i < longest - 1):
            unknown += 1
    return words, unknown, damaged


def read_deletion_tags(del_path: str) -> dict[int, int]:
    """``{record index: tag}`` of a segment's recorded deletions, from both copies
    (the first entry for a record wins; damaged entries are skipped). Safe to call
    while the files are appended to."""
    out: dict[int, int] = {}
    for path in (del_path, del_path + "2"):
        raw = read_if_exists(path)
        if raw is None:
            continue
        for word in _parse(raw):
            if word is not None and word != _UNCERTAIN_WORD:
                out.setdefault(word & _REL_MASK, word >> _TAG_SHIFT)
    return out
