"""The startup scan names the subject of each damaged record where something intact
still says it (``LiveRecords.damaged``, ``Segment.damaged_subjects``): the record
itself when it passes its checksum (put aside), else the ``.columns`` file or the
``.snapshot`` made when the log was intact; never the damaged record's own bytes,
which may be what the damage changed. The broker refuses a subject's last message
by it (``docs/semantics.md`` §3.4)."""

from __future__ import annotations

from pathlib import Path

from test_recovery import fill, flip

from storage import PartitionLog


def damaged(log: PartitionLog) -> list[tuple[int, bytes | None]]:
    return [d for live in log.scan() for d in live.damaged]


def subject_position(log: PartitionLog, offset: int) -> tuple[str, int]:
    """The ``.log`` file holding ``offset`` and the position of its subject's first
    byte (after the 38 fixed bytes)."""
    seg = log.segments[log.segment_index(offset)]
    return seg.log_path, seg.positions[offset - seg.base] + 38


def test_the_snapshot_names_a_damaged_record_of_the_active_segment_even_if_its_subject_bytes_changed(
    tmp_path: Path,
) -> None:
    log = fill(tmp_path, 10)  # subjects s.0 .. s.9
    path, at = subject_position(log, 4)
    log.close()  # clean: the active segment's .snapshot
    flip(path, at + 2)  # s.3 -> s.2: the record now says another subject (and fails its checksum)
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert damaged(log) == [(4, b"s.3")]
    log.close()  # a segment with damage gets no new snapshot: the old one stays
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert damaged(log) == [(4, b"s.3")]
    log.close()


def test_a_segment_sealed_with_its_damage_keeps_its_snapshot_to_name_it(tmp_path: Path) -> None:
    """The newest record damaged: acknowledged records are missing at the end, so
    the start seals the segment (new records go to a new one); the seal keeps the
    snapshot, which names the subject at every later start."""
    log = fill(tmp_path, 10)
    seg = log.segments[-1]
    log.close()
    flip(seg.log_path, seg.size - 1)  # the last record's payload
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert log.segments[0].sealed and Path(seg.snapshot_path).exists()
    assert damaged(log) == [(10, b"s.9")]
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert damaged(log) == [(10, b"s.9")]
    log.close()


def test_a_sealed_segment_names_it_from_its_columns_and_nothing_says_it_without_them(tmp_path: Path) -> None:
    log = fill(tmp_path, 60, segment_size=1024, batches=6)
    log.close()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)  # the first start writes the sealed segments' columns
    list(log.scan())
    sealed = log.segments[0]
    assert sealed.sealed and Path(sealed.columns_path).exists()
    path, at = subject_position(log, 3)
    log.close()
    flip(path, at + 1)
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert damaged(log) == [(3, b"s.2")]
    log.close()
    Path(sealed.columns_path).unlink()
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    assert damaged(log) == [(3, None)]  # not the bytes the damaged record holds now
    log.close()


def test_records_put_aside_name_their_own_subject(tmp_path: Path) -> None:
    log = fill(tmp_path, 5)
    log.delete_many([2])
    seg = log.segments[-1]
    log.close()
    for path in (seg.del_path, seg.mirror_path):
        flip(path, 1)  # that deletion unreadable in both copies: the segment's records put aside
    log, _ = PartitionLog.open(str(tmp_path), 1 << 20)
    # Which of them the lost entry deleted cannot be told (offset 2): all are in doubt.
    assert damaged(log) == [(1, b"s.0"), (2, b"s.1"), (3, b"s.2"), (4, b"s.3"), (5, b"s.4")]
    log.close()
