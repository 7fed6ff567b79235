"""The consumer journal's files: two checksummed copies, snapshots, damage."""

from __future__ import annotations

from pathlib import Path

from storage import Damage, Journal


def _reports() -> tuple[list[Damage], object]:
    found: list[Damage] = []
    return found, found.append


def test_entries_survive_reopen_and_a_snapshot_starts_the_read(tmp_path: Path) -> None:
    path = str(tmp_path / "consumers.journal")
    j = Journal(path)
    for k in range(5):
        j.append(b"e%d" % k)
    j.close()
    j = Journal(path)
    assert j.payloads == [b"e%d" % k for k in range(5)] and not j.gaps
    j.compact(b"snap")
    j.append(b"after")
    j.close()
    j = Journal(path)
    assert j.payloads == [b"snap", b"after"] and j.snapshot_first
    j.close()


def test_damage_in_one_copy_is_repaired_from_the_other(tmp_path: Path) -> None:
    path = tmp_path / "consumers.journal"
    j = Journal(str(path))
    for k in range(4):
        j.append(b"entry-%d" % k)
    j.close()
    raw = bytearray(path.read_bytes())
    raw[30] ^= 0xFF  # inside the second entry of the first copy
    path.write_bytes(bytes(raw))
    found, report = _reports()
    j = Journal(str(path), report=report)  # type: ignore[arg-type]
    assert j.payloads == [b"entry-%d" % k for k in range(4)] and not j.gaps
    assert [d.kind for d in found] == ["consumer_journal"] and found[0].path == str(path)
    j.close()
    assert path.read_bytes() == Path(str(path) + ".1").read_bytes()  # rewritten whole
    assert list((tmp_path / "quarantine").iterdir())  # the damaged copy kept aside


def test_an_entry_lost_in_both_copies_is_a_gap(tmp_path: Path) -> None:
    path = tmp_path / "consumers.journal"
    j = Journal(str(path))
    for k in range(4):
        j.append(b"entry-%d" % k)
    j.close()
    for p in (path, Path(str(path) + ".1")):
        raw = bytearray(p.read_bytes())
        raw[30] ^= 0xFF
        p.write_bytes(bytes(raw))
    found, report = _reports()
    j = Journal(str(path), report=report)  # type: ignore[arg-type]
    assert j.payloads == [b"entry-0", b"entry-2", b"entry-3"] and j.gaps == [1]
    assert any("missing from both copies" in d.detail for d in found)
    j.close()


def test_a_torn_last_entry_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "consumers.journal"
    j = Journal(str(path))
    j.append(b"whole")
    j.append(b"torn-entry")
    j.close()
    for p in (path, Path(str(path) + ".1")):
        p.write_bytes(p.read_bytes()[:-5])
    found, report = _reports()
    j = Journal(str(path), report=report)  # type: ignore[arg-type]
    assert j.payloads == [b"whole"] and not j.gaps
    assert len(found) == 2 and all("cut short" in d.detail for d in found)
    j.append(b"next")
    j.close()
    found.clear()
    assert Journal(str(path), report=report).payloads == [b"whole", b"next"]  # type: ignore[arg-type]
    assert not found  # the torn bytes were cut, not left before the next entry
