"""A sourcing partition's marks (``storage._sources``): where it is in each source,
kept across removals of the copies and across restarts, clean or not, and checked
when read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import protocol as P
from storage import Damage, MemoryBudget, MemoryPartitionLog, PartitionLog, SourceMark

SOURCES = ("A", "B")


def copy(log: PartitionLog, source: str, seqs: range) -> int:
    """Copies of ``source``'s messages ``seqs``, appended and noted as the broker
    does (one append, then the mark of its last record). Returns the last offset."""
    parts = [P.encode_body(f"s.{seq}", f"{source}:{seq}".encode()) for seq in seqs]
    starts, ends, pos = [], [], 0
    for b in parts:
        starts.append(pos)
        pos += len(b)
        ends.append(pos)
    res = log.append(b"".join(parts), starts, ends, 1000)
    last = res.first_offset + len(parts) - 1
    log.note_source(source, seqs[-1], "id-" + source, last)
    return last


def direct(log: PartitionLog, n: int) -> None:
    body = P.encode_body("d", b"direct")
    log.append(body * n, [len(body) * i for i in range(n)], [len(body) * (i + 1) for i in range(n)], 1000)


class SourceOf:
    """Reads the source of a record from its payload, counting the records read."""

    def __init__(self) -> None:
        self.read = 0

    def __call__(self, rec: memoryview) -> tuple[str, int, str] | None:
        self.read += 1
        raw = bytes(rec)
        m = P.decode_records(raw, 0, len(raw), 1)[0]
        if b":" not in m.payload:
            return None
        name, seq = m.payload.decode().split(":")
        return name, int(seq), "id-" + name


def reopen(path: Path, *sources: str, report: list[Damage] | None = None) -> tuple[PartitionLog, SourceOf]:
    log, _ = PartitionLog.open(str(path), 1 << 20, report=(report.append if report is not None else lambda d: None))
    reader = SourceOf()
    log.configure_sources(sources or SOURCES, reader)
    return log, reader


def crashed(path: Path) -> Path:
    """The partition's files as a ``kill -9`` leaves them: what was written, as it is."""
    n = 1
    while (dest := path.with_name(f"{path.name}-crashed{n}")).exists():
        n += 1
    shutil.copytree(path, dest)
    return dest


def test_a_clean_restart_finds_every_mark_without_reading_a_record(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    copy(log, "A", range(1, 4))
    copy(log, "B", range(10, 12))
    direct(log, 3)
    log.close()
    log, reader = reopen(tmp_path)
    assert log.source_mark("A") == SourceMark(3, "id-A", 3)
    assert log.source_mark("B") == SourceMark(11, "id-B", 5)
    assert reader.read == 0
    log.close()


def test_removals_of_the_copies_keep_the_marks_across_a_crash(tmp_path: Path) -> None:
    """A purge (durable when it returns), then deletes of the newest copies: the
    marks were written before each removal, so a crash right after it loses none."""
    log, _ = reopen(tmp_path)
    copy(log, "A", range(1, 4))
    copy(log, "B", range(1, 3))
    assert log.purge() == 5
    after_purge = crashed(tmp_path)
    last_a = copy(log, "A", range(4, 6))
    direct(log, 2)
    last_b = copy(log, "B", range(3, 5))
    log.delete_many([last_b - 1, last_b])
    log.delete(last_a)
    after_deletes = crashed(tmp_path)
    log.close(clean=False)

    log, reader = reopen(after_purge)
    assert (log.source_mark("A"), log.source_mark("B")) == (SourceMark(3, "id-A", 3), SourceMark(2, "id-B", 5))
    log.close()
    log, reader = reopen(after_deletes)
    assert log.source_mark("A") == SourceMark(5, "id-A", last_a)
    assert log.source_mark("B") == SourceMark(4, "id-B", last_b)
    log.close()


def test_copies_after_the_last_write_are_found_by_scanning_down_to_it(tmp_path: Path) -> None:
    """After a crash, the marks come from the file and from the copies stored since
    it was written, read back from the newest to where the file's account begins."""
    log, _ = reopen(tmp_path)
    copy(log, "A", range(1, 3))
    copy(log, "B", range(1, 3))
    log.delete(1)  # the marks written: they account for offsets 1..4
    copy(log, "A", range(3, 6))
    direct(log, 4)
    log.close(clean=False)
    log, reader = reopen(crashed(tmp_path))
    assert log.source_mark("A") == SourceMark(5, "id-A", 7)
    assert log.source_mark("B") == SourceMark(2, "id-B", 4)
    assert reader.read == 7  # offsets 11 down to 5, not below
    log.close()


def test_without_a_file_each_source_is_searched_for_down_to_its_newest_copy(tmp_path: Path) -> None:
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    copy(log, "B", range(1, 3))
    copy(log, "A", range(1, 4))
    log.sources = None  # (a log written before marks were kept)
    log.close()
    log, reader = reopen(tmp_path)
    assert log.source_mark("A") == SourceMark(3, "id-A", 5)
    assert log.source_mark("B") == SourceMark(2, "id-B", 2)
    assert reader.read == 4  # from offset 5 down to offset 2, where B is found
    log.close()


def test_a_damaged_copy_of_the_file_is_reported_and_the_other_used(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    copy(log, "A", range(1, 3))
    log.delete(1)  # generation 1, in sources.state
    log.take_dirty_fds()  # (a group commit took it: the next write goes to the other copy)
    log.synced()
    copy(log, "A", range(3, 5))
    log.close()  # generation 2, in sources.state2
    newest = tmp_path / "sources.state2"
    raw = bytearray(newest.read_bytes())
    raw[36] ^= 0x01  # (in the entries)
    newest.write_bytes(bytes(raw))
    damage: list[Damage] = []
    log, reader = reopen(tmp_path, "A", report=damage)
    assert [(d.kind, d.path, d.detail) for d in damage] == [("sources_state", str(newest), "checksum mismatch")]
    assert "used the other copy" in damage[0].action
    # The older copy accounts for offsets 1..2; the scan finds the newer copies.
    assert log.source_mark("A") == SourceMark(4, "id-A", 4)
    assert reader.read == 1  # offset 4 (the newest copy of the only source)
    log.close()


def test_both_copies_damaged_are_reported_and_the_marks_come_from_the_scan(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    copy(log, "A", range(1, 3))
    log.delete(1)
    log.close()
    for name in ("sources.state", "sources.state2"):
        (tmp_path / name).write_bytes(b"TBSS" + bytes(40))
    damage: list[Damage] = []
    log, _ = reopen(tmp_path, report=damage)
    assert sorted(d.path for d in damage) == [str(tmp_path / "sources.state"), str(tmp_path / "sources.state2")]
    assert all(d.kind == "sources_state" and "scanning the copy back" in d.action for d in damage)
    assert log.source_mark("A") == SourceMark(2, "id-A", 2)
    log.close()


def test_a_mark_of_a_record_the_log_lost_is_not_trusted(tmp_path: Path) -> None:
    """A machine crash can keep the marks' write and lose the log's tail it names:
    the source then starts after its newest copy that survived (copied again, never
    skipped)."""
    log, _ = reopen(tmp_path)
    copy(log, "A", range(1, 3))
    log.delete(1)
    copy(log, "A", range(3, 5))
    log.delete(3)  # the marks name offset 4
    log.close(clean=False)
    seg = log.segments[-1]
    with open(seg.log_path, "r+b") as f:  # the last record lost
        f.truncate(seg.positions[3])
    log, _ = reopen(tmp_path)
    assert log.next_offset >= 4
    assert log.source_mark("A") == SourceMark(2, "id-A", 2)
    log.close()


def test_a_source_no_longer_configured_is_forgotten_and_none_removes_the_files(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    copy(log, "A", range(1, 3))
    copy(log, "B", range(1, 3))
    log.configure_sources(["A"], SourceOf())
    assert log.source_mark("B") is None and log.source_mark("A") is not None
    log.delete(1)
    assert os.path.exists(tmp_path / "sources.state")
    log.configure_sources([], SourceOf())
    assert not os.path.exists(tmp_path / "sources.state") and log.source_mark("A") is None
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert log.sources is None
    log.close()


def test_the_marks_file_is_synced_by_the_group_commit_with_the_deletion(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    copy(log, "A", range(1, 3))
    log.take_dirty_fds()
    log.synced()
    log.delete(2)
    fds = log.take_dirty_fds()
    assert log.sources is not None and log.sources._fds[0] in fds
    log.delete(1)  # below what the file covers: no write
    assert log.sources._fds[0] not in log.take_dirty_fds()
    log.close()


def test_a_memory_log_keeps_its_marks_in_memory_only(tmp_path: Path) -> None:
    log, _ = MemoryPartitionLog.open(str(tmp_path), 1 << 20, budget=MemoryBudget(1 << 20))
    log.configure_sources(["A"], SourceOf())
    copy(log, "A", range(1, 4))
    log.purge()
    assert log.source_mark("A") == SourceMark(3, "id-A", 3)
    log.close()
    assert not any(p.name.startswith("sources.state") for p in tmp_path.iterdir())


def test_ttlbroker_check_reads_the_marks_file(tmp_path: Path) -> None:
    log, _ = reopen(tmp_path)
    copy(log, "A", range(1, 3))
    log.close()
    (tmp_path / "sources.state").write_bytes(b"junk")
    damage: list[Damage] = []
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20, report=damage.append, readonly=True)
    assert [(d.kind, d.detail) for d in damage] == [("sources_state", "shorter than its header")]
    log.close()
