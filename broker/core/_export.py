"""The export task: sealed segments to Parquet, in a worker process.

Every ``[export] interval`` seconds (and on demand, by the EXPORT command behind
``ttlbroker export``), the task snapshots on the event loop the sealed segments that
the manifest does not list yet, and hands them to ``spark_export.export_in_worker``,
which runs the conversion (numpy and pyarrow) in a process of its own
(``python -m spark_export.worker``, at a lower priority): it never shares the GIL
with the event loop, so publishing goes on at full speed. The loop only reads one
line per exported segment. Sealed segment files never change, so the worker reads
them while the loop goes on appending to the active ones; deletions made meanwhile
show up in the next segment's export only.

A worker that crashes (killed, out of memory, a bug) is logged
(``export_worker_crashed``), counted in ``export_failures`` and the pass run again
at once, up to ``CRASH_RETRIES`` times; the segments it finished before are kept
(the manifest lists them), and the broker never goes down with it. Shutting down
terminates the worker and waits for it.

While the export is on, the segment cleaner keeps every segment not yet exported
(:meth:`Exporter.keeps`): a message that expired before it was exported still reaches
the export, flagged as removed. ``spark_export`` (and pyarrow) are imported only when
an export directory is configured.

A damaged manifest copy is reported (``export_manifest``) and rewritten from the
other. When neither copy is valid the export is *paused*: which segments are
already exported is unknown, so nothing is exported (a segment could end up in the
export twice) and the cleaner keeps every segment (one could be lost before it is
exported); EXPORT answers EXPORT_FAILED saying why and what to do, until the
manifest is restored and the broker restarted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from protocol import BrokerError, ErrorCode, error_class
from storage import Damage

from ._log import get_logger

if TYPE_CHECKING:
    from spark_export import SegmentJob
    from storage import Report, Segment

    from ._sealing import Sealer
    from ._stats import Counters
    from ._topics import Partition

__all__ = ["Exporter"]

log = get_logger(__name__)

#: How many times a pass whose worker crashed is run again at once.
CRASH_RETRIES = 1


class Exporter:
    """Args:
    root: the export directory ('' = export off).
    interval: seconds between passes.
    counters: the broker's counters.
    priority: the worker's CPU priority (``[export] worker_priority``).
    """

    def __init__(self, root: str, interval: float, counters: Counters, sealer: Sealer, priority: str = "idle") -> None:
        self.root = root
        self.interval = interval
        self.counters = counters
        self.priority = priority
        self.exported: set[str] = set()
        #: Why the export is paused (no valid manifest copy), or "".
        self.paused = ""
        self._report: Report = lambda damage: None
        self._lock = trio.Lock()
        #: The export pass under way: segments it has to write, and has written (both
        #: 0 between passes), as the worker reports them; ``stats`` reads them, and
        #: ``ttlbroker export`` draws its progress bar from them.
        self.pass_segments = 0
        self.pass_done = 0
        #: The worker's command line (tests put a wrapper there).
        self.worker_command: tuple[str, ...] | None = None
        #: The broker's sealer: a pass first waits for the seals the logs owe.
        self.sealer = sealer

    @property
    def enabled(self) -> bool:
        return bool(self.root)

    def open(self, report: Report | None = None) -> None:
        """Load the manifest (blocking; the broker calls it from its worker thread at
        start) and clear what a crash left half-written. Damage in the manifest goes
        to ``report``; with no valid copy the export is paused (see above)."""
        if report is not None:
            self._report = report
        if not self.enabled:
            return
        try:
            # export_in_worker too: its imports (about 2 ms) here, not on the loop at
            # the first pass.
            from spark_export import Manifest, ManifestUnreadable, export_in_worker  # noqa: F401
        except ImportError as exc:
            raise error_class(ErrorCode.EXPORT_NOT_CONFIGURED)(
                f"the export needs pyarrow ({exc}): pip install 'ttlbroker[spark]'"
            ) from None

        try:
            manifest = Manifest.load(self.root, self._report)
        except ManifestUnreadable as exc:
            self._pause(exc.message)
            return
        self.exported = set(manifest.segments)

    def _pause(self, why: str) -> None:
        self.paused = why
        log.error("export_paused", dir=self.root, reason=why)

    @staticmethod
    def key(part: Partition, seg: Segment) -> str:
        t = part.topic
        # The topic's creation time tells a topic from a later one that got its id.
        return f"{t.stream.id}/{t.id}@{t.created_at}/{part.number}/{seg.base}"

    def keeps(self, part: Partition, seg: Segment) -> bool:
        """True when the cleaner must keep ``seg`` (the export is on and it is not
        exported yet). Never a memory-storage segment: it is not exported."""
        return self.enabled and not part.log.volatile and (bool(self.paused) or self.key(part, seg) not in self.exported)

    def snapshot(self, partitions: list[Partition]) -> list[SegmentJob]:
        """The jobs of the sealed segments of
        ``partitions`` not exported yet, as they are now. A job's positions are a view
        of the sealed segment's own array (it never changes once sealed; the pipe to
        the worker takes them from there): no megabyte copied per segment here."""
        from spark_export import SegmentJob

        jobs: list[SegmentJob] = []
        for part in partitions:
            topic = part.topic
            for seg in part.log.segments[:-1]:
                if not seg.count or seg.fileno() < 0 or self.key(part, seg) in self.exported:
                    continue  # (closed: its topic was deleted during the seal's awaits)
                jobs.append(
                    SegmentJob(
                        stream_id=topic.stream.id, topic_id=topic.id, partition=part.number,
                        stream=topic.stream.name, topic=topic.name, base=seg.base, count=seg.count,
                        log_path=seg.log_path, del_path=seg.del_path, positions=memoryview(seg.positions),
                        states=bytes(seg.state), purged_through=part.log.purged_through,
                        max_age=topic.config.message_expiry, generation=topic.created_at,
                        topic_config={
                            "partitions": topic.config.partitions_count,
                            "message_expiry": topic.config.message_expiry,
                            "options": topic.config.options(),
                        },
                        log_crc=seg.sealed_crc,
                    )
                )
        return jobs

    async def export_now(self, partitions: list[Partition], seal: bool = False) -> dict[str, Any]:
        """One export pass; returns what it exported.

        Raises:
            ExportNotConfiguredError: no export directory.
            ExportFailedError: the conversion or a write failed (nothing half-written
                is left under a final name; the next pass retries).
        """
        if not self.enabled:
            raise error_class(ErrorCode.EXPORT_NOT_CONFIGURED)(
                "the broker has no export directory: start it with --export-dir DIR or set [export] dir"
            )
        # Memory-storage topics have no segment files, and their messages are meant
        # not to outlive the broker: not exported (docs/semantics.md §19.8).
        partitions = [p for p in partitions if not p.log.volatile]
        async with self._lock:
            if self.paused:
                raise error_class(ErrorCode.EXPORT_FAILED)(self.paused)
            sealed = 0
            if seal:
                for part in partitions:
                    if await self._seal(part):
                        sealed += 1
            for part in partitions:  # segments rolled by appends or the cleaner: sealed first
                await self.sealer.finish(part.log)
            jobs = self.snapshot(partitions)
            started = time.perf_counter()
            done = await self._export_pass(partitions, jobs)
            rows = sum(e["rows"] for e in done)
            if done:
                log.info("exported", segments=len(done), rows=rows, seconds=round(time.perf_counter() - started, 3), dir=self.root)
            return {"dir": self.root, "sealed": sealed, "exported": done, "segments_in_export": len(self.exported)}

    async def _export_pass(self, partitions: list[Partition], jobs: list[SegmentJob]) -> list[dict[str, Any]]:
        """Export ``jobs`` in the worker; returns the manifest entries it wrote, each
        recorded (:attr:`exported`, the counters, the pass's progress) as the worker
        reports it, so that a later failure keeps it.

        Raises:
            ExportFailedError: as :meth:`export_now` (a manifest with no valid copy
                also pauses the export).
        """
        from spark_export import ManifestUnreadable, WorkerCrashed, WorkerFailed

        segments = {self.key(p, s): s for p in partitions for s in p.log.segments[:-1]}
        done: list[dict[str, Any]] = []
        self.pass_segments, self.pass_done = len(jobs), 0

        def listed(keys: list[str], todo: int) -> None:  # the manifest lists these already
            self.exported.update(keys)
            self.pass_segments, self.pass_done = todo, 0

        def exported(entry: dict[str, Any], n: int, of: int) -> None:
            # Recorded as each segment is in the manifest: a later failure keeps it.
            done.append(entry)
            self.exported.add(entry["key"])
            self.counters.segments_exported += 1
            self.counters.rows_exported += entry["rows"]
            self.pass_segments, self.pass_done = of, n

        def gone(key: str, path: str) -> None:  # its log file was not there for the worker
            seg = segments.get(key)
            if seg is None or seg.fileno() < 0:  # deleted with its topic while the pass ran
                log.info("export_segment_gone", segment=key, path=path)
            else:
                self._report(Damage(
                    "segment", path, None, "the log file of a sealed segment is missing",
                    "left out of this export pass (the broker still reads it through its open file); the next pass tries again",
                ))

        try:
            await self._run_worker(jobs, listed, exported, gone)
        except ManifestUnreadable as exc:
            self._pause(exc.message)
            raise error_class(ErrorCode.EXPORT_FAILED)(exc.message) from None
        except WorkerFailed as exc:
            if not isinstance(exc, WorkerCrashed):
                self.counters.export_failures += 1
                log.error("export_failed", error=exc.message, stderr=exc.stderr[-2000:])
            raise error_class(ErrorCode.EXPORT_FAILED)(f"export to {self.root} failed: {exc.message}") from None
        except OSError as exc:  # the worker could not be started
            self.counters.export_failures += 1
            log.error("export_failed", error=repr(exc))
            raise error_class(ErrorCode.EXPORT_FAILED)(f"export to {self.root} failed: {exc}") from None
        finally:
            self.pass_segments = self.pass_done = 0
        return done

    async def _run_worker(
        self, jobs: list[SegmentJob], listed: Callable[[list[str], int], None],
        exported: Callable[[dict[str, Any], int, int], None], gone: Callable[[str, str], None],
    ) -> None:
        """``spark_export.export_in_worker`` with these callbacks, run again at once
        (up to :data:`CRASH_RETRIES` times) when the worker crashes; each crash is
        logged and counted.

        Raises:
            what ``export_in_worker`` raises (``WorkerCrashed`` once the retries are spent).
        """
        from spark_export import WORKER_COMMAND, WorkerCrashed, export_in_worker

        for attempt in range(CRASH_RETRIES + 1):
            try:
                await export_in_worker(
                    self.root, jobs, self._report, listed, exported, self.worker_command or WORKER_COMMAND,
                    self.priority, gone,
                )
                return
            except WorkerCrashed as exc:
                self.counters.export_failures += 1
                retry = attempt < CRASH_RETRIES
                log.error("export_worker_crashed", error=exc.message, retry=retry, stderr=exc.stderr[-2000:])
                if not retry:
                    raise

    async def _seal(self, part: Partition) -> bool:
        """Seal ``part``'s active segment (if it holds records) with the event loop
        held only for the switch to a new active segment: the fdatasync of up to a
        segment of records (tens of ms) runs in a thread first, so that the switch's
        own sync has only what was appended meanwhile; the index and summary writes
        (three fsynced files, 1.5-20 ms) run in a thread after it
        (``PartitionLog.begin_roll``, ``Sealer.finish``)."""
        if not part.log.active.count:
            return False
        await trio.to_thread.run_sync(part.log.flush_active)
        if part.log.active.fileno() < 0:
            return False  # its topic was deleted meanwhile
        if not part.log.begin_roll():
            return False
        await self.sealer.finish(part.log)
        return True

    async def run(self, partitions: Callable[[], list[Partition]]) -> None:
        """The periodic task (``partitions()`` gives the current partitions)."""
        while True:
            await trio.sleep(self.interval)
            try:
                await self.export_now(partitions())
            except BrokerError:
                pass  # logged and counted in export_now; the next pass retries
            except Exception as exc:  # a bug here must not stop the broker
                self.counters.export_failures += 1
                log.error("export_failed", error=repr(exc))
