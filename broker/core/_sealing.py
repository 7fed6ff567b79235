"""Seals owed by segment rolls, finished off the event loop.

A partition's log rolls on the event loop when an append finds its active segment
full, when the cleaner seals an emptied one, or on a purge (``PartitionLog._roll``);
the loop does only the switch (``PartitionLog.begin_roll``: the new segment, the old
log cut and synced, the directory synced) and the log keeps the rest owed
(``PartitionLog.owed_seals``; the cleaner leaves the segment after an owed one, whose
removal would make a lost index expect records up to the next base). :class:`Sealer` runs it: the index, time index and
summary writes in a worker thread (``Segment.write_seal_files``), then
``Segment.end_seal`` back on the loop. The export's ``seal=True`` uses the same step.

Until then the segment is readable and deletable like any other, takes no appends,
and is not "sealed" (no summary CRC known): a crash leaves it without an index, which
the next start rebuilds from the log (not damage, no data lost). A clean stop
finishes what is still owed (``Broker.close``); a deleted topic's are dropped.
"""

from __future__ import annotations

import weakref

import trio

from storage import PartitionLog

from ._log import get_logger

__all__ = ["Sealer"]

log = get_logger(__name__)


class Sealer:
    """One per broker: finishes the seals the partitions' logs owe (:meth:`run`, a
    background task, woken by :meth:`owe`), and lets the export wait for them
    (:meth:`finish`). Under fsync interval or never it also syncs a growing active
    log ahead (``PartitionLog.flush_wanted``), so that the roll's own sync on the
    loop has at most an eighth of a segment to write."""

    def __init__(self) -> None:
        self._owed: dict[PartitionLog, None] = {}
        self._wake = trio.Event()
        #: One finisher at a time per log, so that :meth:`finish` returns only once
        #: every seal the log owed is done, even one the task was writing.
        self._locks: weakref.WeakKeyDictionary[PartitionLog, trio.Lock] = weakref.WeakKeyDictionary()

    def attach(self, plog: PartitionLog) -> None:
        """Have ``plog`` leave its seals owed, to this sealer."""
        plog.defer(self.owe)

    def owe(self, plog: PartitionLog) -> None:
        """``plog`` owes a seal (called on the event loop, by its roll)."""
        self._owed[plog] = None
        self._wake.set()

    async def finish(self, plog: PartitionLog) -> None:
        """Finish every seal ``plog`` owes (and wait for one being finished)."""
        lock = self._locks.get(plog)
        if lock is None:
            lock = self._locks[plog] = trio.Lock()
        async with lock:
            if plog.flush_wanted:  # fsync interval or never: the active log synced ahead
                plog.flush_wanted = False
                await trio.to_thread.run_sync(plog.flush_active)
            while plog.owed_seals:
                seg, crc = plog.owed_seals[0]
                # Cancelled before the thread starts (a shutdown), or failed: still
                # owed, to the stop (``Broker.close``) or the next pass.
                wrote = await trio.to_thread.run_sync(seg.write_seal_files, crc)
                seg.end_seal(crc if wrote else None)
                plog.seal_done(seg)

    async def run(self) -> None:
        """The background task."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._owed:
                plog = next(iter(self._owed))
                del self._owed[plog]
                try:
                    await self.finish(plog)
                except OSError as exc:
                    # Still owed: the next roll's pass or the close tries again (a
                    # crash meanwhile costs a rebuilt index at the next start).
                    log.error("seal_files_failed", path=plog.path, error=repr(exc))
