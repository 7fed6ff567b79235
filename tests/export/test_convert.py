"""The columnar segment decode (``spark_export._convert``) against a per-record
reading of the same segment with ``protocol``'s own functions: every row and every
column the same, damaged records left out and counted, malformed header blocks
refused alike, for any batch size."""

from __future__ import annotations

from conftest import require_extra

require_extra("spark", "the export and Spark tests")  # before the imports it guards

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol as P
from spark_export import SCHEMA, SegmentJob
from spark_export._convert import segment_batches
from storage._segment import Segment

NS = 1_000_000_000
_MARKERS = {int(r): r.header_value for r in P.MarkerReason if r}
_REASONS = {int(r): r.label for r in P.RemovalReason}


def reference_rows(job: SegmentJob) -> tuple[list[dict[str, Any]], int]:
    """The segment read one record at a time: ``check_record``, ``RECORD_FIXED``,
    ``decode_headers`` (the export's conversion before it was columnar)."""
    from array import array

    from storage import read_deletion_tags

    positions = array("I")
    positions.frombytes(job.positions)
    buf = Path(job.log_path).read_bytes()
    tags = read_deletion_tags(job.del_path)
    cols: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    corrupt = 0
    for rel in range(job.count):
        pos = positions[rel]
        if P.check_record(buf, pos, len(buf)) < 0:
            corrupt += 1
            continue
        _, _, off, ts, ttl, flags, sl, hl, pl = P.RECORD_FIXED.unpack_from(buf, pos)
        s = pos + 38
        never = ttl == P.TTL_NEVER
        deadlines = ([ts + ttl * NS] if ttl and not never else []) + ([ts + job.max_age * NS] if job.max_age and not never else [])
        live = job.states[rel] == 1 if rel < len(job.states) else True
        if live:
            reason = None
        elif tags.get(rel):
            reason = _REASONS.get(tags[rel], "unknown")
        else:
            reason = "purge" if off <= job.purged_through else "unknown"
        row = {
            "offset": off, "timestamp": ts // 1000, "timestamp_ns": ts,
            "subject": buf[s : s + sl].decode(errors="replace"),
            "headers": list(P.decode_headers(buf[s + sl : s + sl + hl]).items()) if hl else [],
            "payload": buf[s + sl + hl : s + sl + hl + pl],
            "ttl_seconds": ttl if ttl and not never else None, "ttl_never": never,
            "expires_at": min(deadlines) // 1000 if deadlines else None,
            "is_marker": bool(flags & P.MARKER_MASK), "marker_reason": _MARKERS.get(flags & P.MARKER_MASK),
            "removed": not live, "removed_reason": reason,
        }
        for name in SCHEMA.names:
            cols[name].append(row[name])
    return pa.RecordBatch.from_pydict(cols, schema=SCHEMA).to_pylist(), corrupt


names = st.sampled_from(["K", "Nats-TTL", "a", "x" * 255, "k2"])
values = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20)
header_blocks = st.one_of(
    st.just(b""),
    st.lists(st.tuples(names, values), min_size=1, max_size=5).map(
        lambda pairs: b"".join(bytes([len(n.encode())]) + n.encode() + len(v.encode()).to_bytes(2, "little") + v.encode() for n, v in pairs)
    ),
)
messages = st.lists(
    st.tuples(
        st.one_of(st.text(min_size=1, max_size=30).filter(lambda s: 0 < len(s.encode()) <= 255).map(str.encode), st.binary(min_size=1, max_size=8)),
        header_blocks,
        st.binary(max_size=300),
        st.sampled_from([P.TTL_NONE, 1, 60, P.TTL_NEVER]),
        st.integers(0, 15),  # flags: the marker bits and others
        st.integers(0, 3),  # nanoseconds added to the timestamp
    ),
    min_size=4,
    max_size=30,
)


def build_segment(
    directory: str, msgs: list[Any], damaged: list[tuple[int, int]], deleted: list[tuple[int, int]], seal: bool
) -> Segment:
    """The messages in a segment (sealed, with its summary, if ``seal``), then the
    ``deleted`` records deleted and the ``damaged`` records damaged (one byte each)."""
    seg = Segment.create(directory, 1)
    ts = 1_700_000_000 * NS
    for i, (subject, headers, payload, ttl, flags, ns) in enumerate(msgs):
        record = P.encode_record(1 + i, ts + i * NS + ns, P.encode_body(subject, payload, headers, ttl, flags))
        seg.append(record, [seg.size], ts + i * NS + ns)
    for rel, tag in deleted:
        seg.delete_many([rel % len(msgs)], tag)
    if seal:
        seg.seal()
        assert seg.sealed_crc is not None
    seg.close()
    with open(seg.log_path, "r+b") as f:
        for rel, at in damaged:
            rel %= len(msgs)
            start = seg.positions[rel]
            end = seg.positions[rel + 1] if rel + 1 < len(msgs) else seg.size
            f.seek(start + at % (end - start))
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0x5A]))
    return seg


@settings(max_examples=300, deadline=None)
@given(
    msgs=messages,
    damaged=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), max_size=3),
    deleted=st.lists(st.tuples(st.integers(0, 1000), st.sampled_from([0, 0, 1, 3, 4, 6, 15])), max_size=12),
    purged_around=st.integers(-1, 1),
    max_age=st.sampled_from([0, 30]),
    batch_rows=st.integers(1, 50),
    garbage=st.one_of(st.none(), st.tuples(st.integers(0, 1000), st.binary(min_size=1, max_size=12))),
    seal=st.booleans(),
)
def test_the_columnar_decode_reads_every_record_as_protocol_does(msgs, damaged, deleted, purged_around, max_age, batch_rows, garbage, seal) -> None:  # type: ignore[no-untyped-def]
    if garbage is not None:  # one header block of random bytes, usually malformed
        i = garbage[0] % len(msgs)
        msgs[i] = (msgs[i][0], garbage[1], *msgs[i][2:])
    # The purge watermark next to a deleted record's offset (the first deletion's).
    purged_through = deleted[0][0] % len(msgs) + 1 + purged_around if deleted else 0
    with tempfile.TemporaryDirectory() as d:
        seg = build_segment(d, msgs, damaged, deleted, seal)
        job = SegmentJob(1, 1, 0, "s", "t", 1, seg.count, seg.log_path, seg.del_path, seg.positions.tobytes(),
                         bytes(seg.state[: len(msgs) - len(msgs) // 3]),  # the last records' states not known
                         purged_through, max_age,
                         log_crc=seg.sealed_crc)  # the whole file checked at once, unless damaged since
        try:
            expected, corrupt = reference_rows(job)
        except P.InvalidHeadersError:  # type: ignore[attr-defined]
            with pytest.raises(P.InvalidHeadersError):  # type: ignore[attr-defined]
                list(segment_batches(job, batch_rows))
            return
        batches = list(segment_batches(job, batch_rows))
        assert [r for b, _ in batches for r in b.to_pylist()] == expected
        assert sum(len(c) for _, c in batches) == corrupt
        assert all(b.schema == SCHEMA for b, _ in batches)


def test_the_worker_converts_without_importing_pandas(tmp_path: Path) -> None:
    """pyarrow's ``pa.array`` and ``to_numpy`` import pandas on first use (a quarter
    of a second of every export worker's start): the conversion never calls them."""
    import subprocess
    import sys

    from spark_export._wire import job_messages

    repeated = P.encode_headers([("K", "1"), ("K", "2"), ("L", "3")])
    seg = build_segment(str(tmp_path), [(b"a.b", repeated, b"x", 60, 1, 0), (b"a.c", b"", b"y", 0, 0, 0)], [], [(0, 3)], True)
    job = SegmentJob(1, 1, 0, "s", "t", 1, seg.count, seg.log_path, seg.del_path, seg.positions.tobytes(), bytes(seg.state), 0, 0,
                     log_crc=seg.sealed_crc)
    code = (
        "import sys\n"
        "from spark_export._convert import segment_batches\n"
        "from spark_export._wire import read_jobs\n"
        "_, (job,) = read_jobs(sys.stdin.buffer)\n"
        "batches = list(segment_batches(job))\n"
        "pandas = 'pandas' in sys.modules\n"
        "rows = [r for b, _ in batches for r in b.to_pylist()]\n"
        "print(len(rows), rows[0]['headers'], rows[0]['removed_reason'], pandas)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=b"".join(job_messages("unused", [job])), capture_output=True, check=True)
    assert out.stdout.decode().split("\n")[0] == "2 [('K', '1'), ('L', '3')] delete False"
