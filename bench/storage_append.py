"""The storage layer alone: appends of record batches to one partition log, with the
group commit's bookkeeping (``take_dirty_fds``) after each batch and, under
``always``, its fdatasync. No network, no event loop: what the log itself costs per
record, stable enough to compare two versions of ``storage/`` (run it from each
tree; the medians of several rounds are printed).

    python bench/storage_append.py                  # always and never, 5 rounds
    python bench/storage_append.py --batches 1000 --rounds 9
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import protocol as P  # noqa: E402
from storage import PartitionLog, sync_fds  # noqa: E402


def one_round(mode: str, batches: int, size: int, payload: int) -> tuple[float, float]:
    folder = tempfile.mkdtemp(prefix="ttlbroker-append-")
    try:
        try:
            log, _ = PartitionLog.open(folder, 64 << 20, reserve=mode != "always")
        except TypeError:  # a tree from before offset reservations, for comparisons
            log, _ = PartitionLog.open(folder, 64 << 20)
        bodies = [P.encode_body(f"s.{i % 10}", b"x" * payload) for i in range(size)]
        data = b"".join(bodies)
        starts, ends, pos = [], [], 0
        for b in bodies:
            starts.append(pos)
            pos += len(b)
            ends.append(pos)
        wall, cpu = time.perf_counter(), time.process_time()
        for k in range(batches):
            log.append(data, starts, ends, 1000 + k)
            fds = log.take_dirty_fds()
            if mode == "always":
                sync_fds(fds)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        log.close()
        return wall, cpu
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=300, help="batches per round (default 300)")
    ap.add_argument("--size", type=int, default=1000, help="records per batch (default 1000)")
    ap.add_argument("--payload", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per mode; medians are printed (default 5)")
    ap.add_argument("--modes", default="always,never", help="fsync modes, comma-separated (default always,never)")
    args = ap.parse_args()
    records = args.batches * args.size
    for mode in args.modes.split(","):
        results = [one_round(mode, args.batches, args.size, args.payload) for _ in range(args.rounds)]
        wall = statistics.median(r[0] for r in results)
        cpu = statistics.median(r[1] for r in results)
        print(
            f"{mode:>6}: {records:,} records in {wall * 1000:.1f} ms wall, {cpu * 1000:.1f} ms CPU "
            f"({cpu / records * 1e9:.0f} ns CPU per record; {records / wall:,.0f} records/s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
