"""Seeded damage to one partition's files, and the verdict by the rule for damage.

A trial builds a partition log in a fresh directory (several sealed segments and an
active one, some deletions, commits so the acknowledged mark is set), stops it
cleanly or as a crash would, damages one file of one kind in one way (a flipped
bit, a truncation, a zeroed 4 KiB page), reopens it and reads every offset. The
rule:

* never serve a message whose deletion was acknowledged (``resurrected``);
* never drop or hide a live acknowledged message without saying so (``lost``);
* never serve other bytes than were stored (``wrong_data``), or a wrong
  timestamp (``wrong_time``: max age would expire the wrong messages);
* never give out an offset twice (``offset_reused``);
* never crash on open (``crashed``);
* the startup scan (what a broker rebuilds its subject index and TTL deadlines
  from) gives only live records, each as stored.

A trial that breaks none of them is ``detected`` when damage was reported (by the
open, or by a read that found a corrupt record) and ``harmless`` when nothing was
reported and everything reads back exactly as stored.

Used by ``test_storage_damage.py`` (hundreds of trials) and by
``bench/fault_campaign.py`` (thousands, printed as a table).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import protocol as P
from protocol import BrokerError
from storage import CorruptedRecord, Damage, PartitionLog

KINDS = (
    "active_log", "sealed_log", "offset_index", "time_index", "segment_summary", "segment_columns", "active_snapshot",
    "deletions",
    "deletions_mirror", "partition_state",
)
DAMAGES = ("flip", "truncate", "zero_page")
_SUBJECT_LEN_AT = 5  # in a message body: ttl (4), flags (1), subject length (1), ...
_SUBJECT_AT = 14  # after the body header
FAILURES = ("resurrected", "lost", "wrong_data", "wrong_time", "offset_reused", "crashed")


@dataclass
class Trial:
    kind: str
    damage: str
    seed: int
    outcome: str = ""
    problems: list[str] = field(default_factory=list)
    reported: list[Damage] = field(default_factory=list)


def _body(i: int, rng: random.Random) -> bytes:
    return P.encode_body(f"s.{i % 7}", f"payload-{i:05d}-".encode() + rng.randbytes(rng.randrange(0, 40)))


def _append(log: PartitionLog, bodies: list[bytes], ts: int) -> int:
    data = b"".join(bodies)
    starts, ends, pos = [], [], 0
    for b in bodies:
        starts.append(pos)
        pos += len(b)
        ends.append(pos)
    return log.append(data, starts, ends, ts).first_offset


def build(path: Path, rng: random.Random, reserve: bool) -> tuple[dict[int, bytes], dict[int, int], set[int], PartitionLog]:
    """A partition with sealed segments, an active one and deletions. Returns the
    stored bodies and timestamps by offset, the deleted offsets, and the open log
    (every write 'acknowledged': synced through take_dirty_fds and synced() as the
    group commit does)."""
    log, _ = PartitionLog.open(str(path), 2048, reserve=reserve)
    bodies: dict[int, bytes] = {}
    times: dict[int, int] = {}
    deleted: set[int] = set()
    for batch in range(rng.randrange(10, 16)):
        n = rng.randrange(1, 12)
        bs = [_body(len(bodies) + k, rng) for k in range(n)]
        ts = 1_000_000 + batch * 1000
        first = _append(log, bs, ts)
        for k, b in enumerate(bs):
            bodies[first + k] = b
            times[first + k] = log.timestamp_of(first + k)
        if rng.random() < 0.5:
            doomed = rng.sample(sorted(set(bodies) - deleted), k=min(len(bodies) - len(deleted), rng.randrange(1, 4)))
            log.delete_many(doomed, tag=rng.randrange(0, 16))
            deleted.update(doomed)
        log.take_dirty_fds()  # a group commit takes the descriptors,
        log.synced()  # and what it took is durable
    log.take_dirty_fds()
    log.synced()
    return bodies, times, deleted, log


def _files_of(path: Path, kind: str, log: PartitionLog) -> list[str]:
    segs = log.segments
    if kind == "active_log":
        return [segs[-1].log_path]
    if kind == "sealed_log":
        return [s.log_path for s in segs[:-1]]
    if kind == "offset_index":
        return [s.index_path for s in segs[:-1]]
    if kind == "time_index":
        return [s.time_path for s in segs[:-1]]
    if kind == "segment_summary":
        return [s.summary_path for s in segs[:-1] if os.path.exists(s.summary_path)]
    if kind == "segment_columns":
        return [s.columns_path for s in segs[:-1] if os.path.exists(s.columns_path)]
    if kind == "active_snapshot":
        return [s.snapshot_path for s in segs[-1:] if os.path.exists(s.snapshot_path)]
    if kind == "deletions":
        return [s.del_path for s in segs if os.path.exists(s.del_path)]
    if kind == "deletions_mirror":
        return [s.mirror_path for s in segs if os.path.exists(s.mirror_path)]
    if kind == "partition_state":
        return [str(path / "partition.state")]
    raise ValueError(kind)


#: Where the bytes that matter lie in files with unused space (the state file's two
#: slots); a flip elsewhere changes nothing and would only dilute the trials.
_MEANINGFUL = {"partition.state": [(0, 44), (4096, 4140)]}


def damage_file(target: str, how: str, rng: random.Random) -> tuple[int, int]:
    """Damage ``target``; returns the byte range ``[start, end)`` that was changed."""
    size = os.path.getsize(target)
    with open(target, "r+b") as f:
        if how == "flip" and size:
            ranges = _MEANINGFUL.get(os.path.basename(target), [(0, size)])
            lo, hi = rng.choice(ranges)
            pos = rng.randrange(lo, min(hi, size))
            f.seek(pos)
            b = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([b ^ (1 << rng.randrange(8))]))
            return pos, pos + 1
        if how == "truncate":
            cut = rng.randrange(size) if size else 0
            f.truncate(cut)
            return cut, max(size, cut + 1)
        if how == "zero_page" and size:
            page = 4096
            start = rng.randrange(max(1, (size + page - 1) // page)) * page
            if size < page:  # a small file: zero a random range of it
                start = rng.randrange(size)
            f.seek(start)
            f.write(bytes(min(page, size - start)))
            return start, start + page
    return 0, 0


def run_trial(tmp: Path, kind: str, how: str, seed: int) -> Trial:
    trial = Trial(kind, how, seed)
    rng = random.Random(f"{kind}/{how}/{seed}")
    reserve = rng.random() < 0.5
    clean = rng.random() < 0.5
    path = tmp / f"{kind}-{how}-{seed}"
    bodies, times, deleted, log = build(path, rng, reserve)
    acked_next = log.next_offset
    where = {}  # offset -> (log file, first byte, end byte) of each record
    for seg in log.segments:
        for rel in range(seg.count):
            end = seg.positions[rel + 1] if rel + 1 < seg.count else seg.size
            where[seg.base + rel] = (seg.log_path, seg.positions[rel], end)
    log.close(clean=clean)  # a clean close writes the columns and the snapshot
    files = _files_of(path, kind, log)
    if not files:
        trial.outcome = "not_applicable"
        return trial
    target = rng.choice(files)
    lo, hi = damage_file(target, how, rng)

    def intact(off: int) -> bool:
        """The record's own bytes were not touched (only log damage may hide it)."""
        f, a, b = where[off]
        return f != target or b <= lo or a >= hi
    corrupt_seen: list[int] = []
    try:
        log, _ = PartitionLog.open(
            str(path), 2048, lambda off, why: corrupt_seen.append(off), report=trial.reported.append, reserve=reserve,
            expect_existing=True,
        )
    except Exception as exc:  # noqa: BLE001 - a crash on open is a verdict, not an error of the harness
        trial.problems.append(f"crashed: {type(exc).__name__}: {exc}")
        trial.outcome = "crashed"
        return trial
    try:
        # What a broker start rebuilds its state from (the fast path where the
        # segment summaries allow it): only live records, each as stored.
        for live in log.scan(headers=True):
            for off, subject in zip(live.offsets, live.subjects):
                if off in deleted:
                    trial.problems.append(f"resurrected: the startup scan gives deleted offset {off}")
                elif subject != bodies[off][_SUBJECT_AT : _SUBJECT_AT + bodies[off][_SUBJECT_LEN_AT]]:
                    trial.problems.append(f"wrong_data: the startup scan gives another subject for offset {off}")
            # A damaged record's subject, when the scan names it (the broker then
            # refuses that subject's last message, and only it), must be the true one.
            for off, subject in live.damaged:
                if subject is not None and off in bodies and (
                    subject != bodies[off][_SUBJECT_AT : _SUBJECT_AT + bodies[off][_SUBJECT_LEN_AT]]
                ):
                    trial.problems.append(f"wrong_data: the startup scan names another subject for damaged offset {off}")
        hidden = 0
        for off in range(1, acked_next):
            try:
                rec = bytes(log.get(off))
            except CorruptedRecord:
                if off in deleted:
                    continue
                hidden += 1
                if intact(off):
                    trial.problems.append(f"lost: offset {off} is intact on disk but unreadable")
                continue
            except BrokerError:
                if off not in deleted:
                    trial.problems.append(f"lost: offset {off} is live but not found")
                continue
            if off in deleted:
                trial.problems.append(f"resurrected: offset {off} was deleted")
            elif rec[24:] != bodies[off] or int.from_bytes(rec[8:16], "little") != off:
                trial.problems.append(f"wrong_data: offset {off}")
            elif log.timestamp_of(off) != times[off]:
                trial.problems.append(f"wrong_time: offset {off}")
        if hidden and not (trial.reported or corrupt_seen):
            trial.problems.append(f"lost: {hidden} live record(s) unreadable and nothing reported")
        nxt = log.next_offset
        if nxt < acked_next:
            trial.problems.append(f"offset_reused: next offset {nxt} after acknowledged {acked_next - 1}")
        # The log must take new writes after recovery, at a fresh offset.
        first = _append(log, [_body(0, rng)], 9_000_000)
        if first < acked_next:
            trial.problems.append(f"offset_reused: appended at {first}")
    finally:
        log.close()
    if trial.problems:
        trial.outcome = trial.problems[0].split(":")[0]
    else:
        trial.outcome = "detected" if (trial.reported or corrupt_seen) else "harmless"
    return trial
