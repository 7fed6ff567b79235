"""Group commit: the one place acks wait for the disk.

Every write records the *epoch* current when it was made and marks its file dirty.
The committer loop takes all dirty descriptors at once, moves the epoch on, syncs
them in a worker thread, and then declares the old epoch durable. A write made while
a sync is running belongs to the next epoch, so it waits for the next sync; every
write waiting when a sync starts shares it. Under ``always`` the loop runs whenever
there is something to sync; under an interval it runs on that interval and acks do
not wait; under ``never`` it syncs only at shutdown.

A write nobody waits for (*lazy*: a consumer's deliveries and the acks sent without
asking for an answer) has no epoch: it goes with the next sync, and under ``always``
one runs at the latest :data:`LAZY_SYNC_SECONDS` after it. Anything that waits for
"everything written so far" (:meth:`Committer.durable_at`) includes it.

A *deferred* write (:meth:`Committer.note_deferred`: the deletions a limit makes,
which recovery makes again from the log and the configuration) is synced neither by
the syncs of the writes that caused it nor by a wait for everything written: at the
latest :data:`DEFERRED_SYNC_SECONDS` after the first of them, with whatever sync
runs then, and at a clean stop (``PartitionLog.close``).

A failed fsync is not retried: after one, the kernel may have dropped the dirty pages
and a later successful fsync proves nothing (PostgreSQL's "fsyncgate", 2018). The
committer raises, the broker stops, and no ack covering that data is ever sent.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import outcome
import trio

from storage import FsyncPolicy, sync_fds

from ._log import get_logger
from ._runq import tasks_runnable
from ._stats import Counters

__all__ = ["Committer", "Reply", "SyncSource", "SyncWatcher"]

log = get_logger(__name__)

#: A command's answer: its response payload, or ``(payload, epoch)`` when it may go
#: only once the group commit has made ``epoch`` durable.
Reply = bytes | tuple[bytes, int]

#: Sync on the event loop itself while the last sync took less than this; a slower
#: disk is synced from the sync thread so that it never freezes the loop for long.
INLINE_SYNC_SECONDS = 0.002
#: The sync thread ends after this long without work (the next sync starts another).
SYNC_THREAD_IDLE_SECONDS = 10.0
#: Writes nobody waits for (``note_write(..., lazy=True)``: a consumer's deliveries,
#: acks sent without asking for an answer) go with the next sync, which under
#: ``always`` runs at the latest this long after the first of them (nats-server
#: writes a consumer's state at most ten times a second, ``consumerFileStore``).
LAZY_SYNC_SECONDS = 0.05
#: Deferred writes (:meth:`Committer.note_deferred`) are synced at the latest this
#: long after the first of them: what recovery has to make again after a crash stays
#: small, and so does what a power loss can tear.
DEFERRED_SYNC_SECONDS = 1.0


class SyncSource(Protocol):
    """A file the group commit syncs: a partition's log, a topic's offsets file, a
    consumer journal. One that also has ``synced()`` is told, after the sync, that
    what it handed over is durable (looked up with ``getattr``: it is optional)."""

    def take_dirty_fds(self) -> list[int]:
        """The descriptors written since the last call (the caller syncs them)."""
        ...


class DeferredSource(Protocol):
    """A file with deferred writes (a partition's log, its limits' deletions)."""

    def take_deferred_fds(self) -> list[int]:
        """The descriptors of the deferred writes made since the last call."""
        ...


class SyncWatcher(Protocol):
    """Who waits for the next sync (:meth:`Committer.watch`): a session with answers
    held for it."""

    def on_sync(self) -> None: ...


class SyncThread:
    """One thread that runs the fsyncs handed to it, one after the other.

    ``trio.to_thread.run_sync`` costs about a tenth of a millisecond of CPU per call
    (a job through trio's thread cache, the thread named and renamed, contexts
    copied); here a sync costs one queue put to wake the thread and one
    ``run_sync_soon`` to wake the waiting task. The thread starts with the first
    sync and ends after :data:`SYNC_THREAD_IDLE_SECONDS` without one."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[list[int], trio.lowlevel.Task, trio.lowlevel.TrioToken]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False

    async def sync(self, fds: list[int]) -> None:
        """``sync_fds(fds)`` in the thread; raises what it raised. Not cancellable
        (an fsync under way cannot be taken back): a cancel waits for it."""
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()
        with self._lock:
            self._jobs.put((fds, task, token))
            if not self._running:
                self._running = True
                threading.Thread(target=self._work, name="ttlbroker-fsync", daemon=True).start()
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            try:
                fds, task, token = jobs.get(timeout=SYNC_THREAD_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if jobs.empty():
                        self._running = False
                        return
                continue
            result = outcome.capture(sync_fds, fds)
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)


class Committer:
    """Args:
    policy: the fsync policy.
    counters: the broker's counters (``fsyncs``).
    """

    def __init__(self, policy: FsyncPolicy, counters: Counters) -> None:
        self.policy = policy
        self.counters = counters
        #: The epoch a write made now belongs to.
        self.epoch = 1
        #: Every write of an epoch up to this one is durable.
        self.synced = 0
        self._dirty: set[SyncSource] = set()
        #: Sources written lazily since the last sync, and when they are due (0: none).
        self._lazy: set[SyncSource] = set()
        self._lazy_due = 0.0
        #: Sources with deferred writes, and when they are due (0: none).
        self._deferred: set[DeferredSource] = set()
        self._deferred_due = 0.0
        self._work = trio.Event()
        #: Set by the next sync; made when someone waits for it (:meth:`wait_progress`).
        self._progress: trio.Event | None = None
        self._watchers: set[SyncWatcher] = set()
        self._after: list[tuple[int, Callable[[], None]]] = []
        #: ``after`` actions that run before the answers of their sync go out.
        self._first: list[tuple[int, Callable[[], None]]] = []
        #: Called with the durable epoch after every sync, before the ``after``
        #: actions (the consumer engine hands newly durable messages to waiting pulls).
        self.on_synced: list[Callable[[int], None]] = []
        self.last_sync_seconds = 0.0
        self._thread = SyncThread()
        #: A sync that failed outside the committer task (:meth:`sync_if_idle`): the
        #: task raises it.
        self._failed: OSError | None = None
        #: The task between :meth:`hold` and :meth:`unhold`, and whether it wrote
        #: meanwhile without waking the committer task.
        self._holder: trio.lowlevel.Task | None = None
        self._held = False

    @property
    def acks_wait(self) -> bool:
        return self.policy.acks_wait_for_sync

    def note_write(self, source: SyncSource, lazy: bool = False) -> int:
        """Record that ``source`` was written.

        Returns the epoch the write belongs to; ``source.synced()``, if it has one,
        is called after the sync that made the write durable, once the answers it
        released are out. ``lazy``: nobody waits for this write; it goes with the
        next sync (under ``always``, within :data:`LAZY_SYNC_SECONDS`), and 0 is
        returned: no epoch to wait on.
        A source with nothing durable to sync (a memory partition's log: its
        ``volatile`` is true) is not recorded, and 0 is returned.
        Runtime complexity: O(1).
        """
        if getattr(source, "volatile", False):
            return 0
        if lazy and self.policy.mode == "always":
            self._lazy.add(source)
            if not self._lazy_due:
                self._lazy_due = trio.current_time() + LAZY_SYNC_SECONDS
                if not self._work.is_set():
                    self._work.set()  # the loop arms the deadline
            return 0
        self._dirty.add(source)
        if not self._work.is_set():
            if self._holder is not None and self._holder is trio.lowlevel.current_task():
                self._held = True  # its reader syncs it, or wakes us (unhold)
            else:
                self._work.set()
        return self.epoch

    def note_deferred(self, source: DeferredSource) -> None:
        """Record that ``source`` holds deferred writes: nothing waits for them, and
        only a sync at least :data:`DEFERRED_SYNC_SECONDS` after the first of them
        takes them (under an interval, the next sync; under ``never``, none: the
        clean stop). Runtime complexity: O(1)."""
        if getattr(source, "volatile", False) or self.policy.mode == "never":
            return
        self._deferred.add(source)
        if not self._deferred_due:
            self._deferred_due = trio.current_time() + DEFERRED_SYNC_SECONDS
            if not self._work.is_set() and self.policy.mode == "always":
                self._work.set()  # the loop arms the deadline

    def hold(self) -> None:
        """The current task (a session's reader, about to handle what it read) will
        call :meth:`unhold` before it next awaits anything: until then its own writes
        do not wake the committer task, so that when its :meth:`sync_if_idle` syncs
        them the task neither wakes nor takes an empty turn (one task switch less a
        request awaited by its client)."""
        if self._held:  # (an unhold missed: never leave writes without a sync)
            self.unhold()
        self._holder = trio.lowlevel.current_task()

    def unhold(self) -> None:
        """The end of :meth:`hold`: the committer task is woken for the writes made
        meanwhile that no :meth:`sync_if_idle` synced."""
        self._holder = None
        if self._held:
            self._held = False
            if self._dirty and not self._work.is_set():
                self._work.set()

    @property
    def slow_disk(self) -> bool:
        """The last sync took :data:`INLINE_SYNC_SECONDS` or more: syncs go to the
        sync thread (the loop is not frozen for them)."""
        return self.last_sync_seconds >= INLINE_SYNC_SECONDS

    def watch(self, session: SyncWatcher) -> None:
        """Have ``session.on_sync()`` called after the next sync completes."""
        self._watchers.add(session)

    def after(self, epoch: int, action: Callable[[], None], before_answers: bool = False) -> None:
        """Run ``action`` on the event loop once epoch ``epoch`` is durable (at once
        if it is already). ``before_answers``: in the same turn as the sync's end,
        before any answer it released is sent (what the answer must already show);
        otherwise after them."""
        if epoch <= self.synced:
            action()
        elif before_answers:
            self._first.append((epoch, action))
        else:
            self._after.append((epoch, action))

    def durable_at(self) -> int:
        """The epoch after which everything written so far is durable (0: it is now).
        Lazy writes are included: someone waits for them now."""
        if self._lazy:
            self._dirty |= self._lazy
            self._lazy = set()
            if not self._work.is_set():
                self._work.set()
        if self._dirty:
            return self.epoch
        if self.synced < self.epoch - 1:
            return self.epoch - 1  # a sync is running
        return 0

    def is_durable(self, epoch: int) -> bool:
        return epoch <= self.synced

    async def wait_progress(self) -> None:
        """Return after the next sync completes."""
        if self._progress is None:
            self._progress = trio.Event()
        await self._progress.wait()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.policy.mode == "always":
            while True:
                await self._work.wait()
                self._work = trio.Event()
                if not (self._dirty or self._lazy or self._deferred or self._failed is not None):
                    continue  # a session's reader synced it (sync_if_idle) before our turn
                if not self._dirty and self._failed is None:
                    # Only lazy or deferred writes: they go with the next write
                    # someone waits for, or when due.
                    due = min((d for d in (self._lazy_due, self._deferred_due) if d), default=trio.current_time())
                    with trio.move_on_at(due):
                        await self._work.wait()
                    self._work = trio.Event()
                    if not (self._dirty or self._lazy or trio.current_time() >= self._deferred_due):
                        self._work.set()  # (woken for nothing due yet: wait again)
                        continue
                await self.sync_now()
                if self._deferred and not self._work.is_set():
                    self._work.set()  # deferred writes not due yet: arm their deadline
        elif self.policy.mode == "interval":
            while True:
                await trio.sleep(self.policy.interval_ms / 1000)
                await self.sync_now()
        else:
            await trio.sleep_forever()

    def _begin(self) -> tuple[int, list[int], set[SyncSource]]:
        """A sync starts: the epoch it makes durable, the descriptors to sync, and
        the sources they are taken from."""
        target = self.epoch
        self.epoch += 1
        sources = self._dirty
        if self._lazy:
            sources |= self._lazy
            self._lazy = set()
        self._lazy_due = 0.0
        fds = self._take_fds(sources)
        self._dirty = set()
        if self._deferred and (self.policy.mode != "always" or trio.current_time() >= self._deferred_due):
            for src in self._deferred:
                fds.extend(src.take_deferred_fds())
            self._deferred = set()
            self._deferred_due = 0.0
        return target, fds, sources

    async def sync_now(self) -> None:
        """Sync everything written so far (used by the loop and at shutdown)."""
        if self._failed is not None:
            raise self._failed
        target, fds, sources = self._begin()
        if fds:
            started = time.perf_counter()
            try:
                if not self.slow_disk:
                    # A fast disk: blocking the loop for a fraction of a millisecond
                    # costs less than the round trip through the sync thread, and the
                    # requests that arrive meanwhile join the next group anyway.
                    sync_fds(fds)
                else:
                    await self._thread.sync(fds)
            except OSError as exc:
                log.error("fsync_failed", error=str(exc))
                raise
            self.last_sync_seconds = time.perf_counter() - started
            self.counters.fsyncs += 1
        self._released(target)
        self._synced(sources)
        if self._after:
            # Let the sessions send the acks this sync released before the actions
            # (republished copies) take the loop.
            await trio.lowlevel.checkpoint()
            due = [a for e, a in self._after if e <= target]
            self._after = [(e, a) for e, a in self._after if e > target]
            for action in due:
                try:
                    action()
                except Exception as exc:  # one failed action must not stop durability
                    log.error("after_sync_failed", error=repr(exc))

    def sync_if_idle(self) -> bool:
        """Sync now, on the event loop, when that is all the committer task would do
        at its next turn: under ``always``, with writes waiting, the disk fast (the
        last sync ran inline), no after-action due, and no task but the committer
        queued to run (none whose writes would join the group). A session calls it
        after a short read whose answers wait for a sync (one request awaited by its
        client): the answers go a turn of the event loop sooner. True if it synced.
        A failed sync is raised by the committer task, as its own would be. (The
        committer task is queued when a write woke it; not when the writes were held,
        :meth:`hold`.)"""
        if (
            self.policy.mode != "always" or not self._dirty or self._after or self._failed is not None
            or self.last_sync_seconds >= INLINE_SYNC_SECONDS
            or tasks_runnable() > (1 if self._work.is_set() else 0)
        ):
            return False
        self._held = False  # all written so far is taken now
        target, fds, sources = self._begin()
        if fds:
            started = time.perf_counter()
            try:
                sync_fds(fds)
            except OSError as exc:
                log.error("fsync_failed", error=str(exc))
                self._failed = exc
                self._work.set()
                return False
            self.last_sync_seconds = time.perf_counter() - started
            self.counters.fsyncs += 1
        self._released(target)
        self._synced(sources)
        return True

    def _released(self, target: int) -> None:
        """Epoch ``target`` is durable: wake who waits for it."""
        self.synced = target
        progress = self._progress
        if progress is not None:
            self._progress = None
            progress.set()
        watchers, self._watchers = self._watchers, set()
        for w in watchers:
            w.on_sync()
        for hook in self.on_synced:
            try:
                hook(target)
            except Exception as exc:  # a failed hook must not stop durability
                log.error("after_sync_failed", error=repr(exc), exc_info=True)
        if self._first:
            due = [a for e, a in self._first if e <= target]
            self._first = [(e, a) for e, a in self._first if e > target]
            for action in due:  # (the sessions woken above run at the next checkpoint)
                try:
                    action()
                except Exception as exc:
                    log.error("after_sync_failed", error=repr(exc), exc_info=True)

    @staticmethod
    def _synced(sources: Iterable[SyncSource]) -> None:
        """The sync of ``sources``' descriptors completed and the answers it released
        are out: ``synced()`` for those that have it (a partition's log records
        what is durable now, without a system call before the answers)."""
        for src in sources:
            done: Callable[[], None] | None = getattr(src, "synced", None)
            if done is not None:
                done()

    @staticmethod
    def _take_fds(sources: Iterable[SyncSource]) -> list[int]:
        fds: list[int] = []
        for src in sources:
            fds.extend(src.take_dirty_fds())
        return fds
