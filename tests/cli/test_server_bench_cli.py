"""``ttlbroker server info|ping`` and ``ttlbroker bench pub|sub|js``, run in this
process on the test's trio loop (``run_client``) against a broker on the same loop,
with tiny counts."""

from __future__ import annotations

import json
import re

import pytest
import trio

import protocol as P
from broker import ServerHandle
from broker.cli import build_parser, main
from broker.cli._bench import Sample, _payload, report_lines
from broker.cli._run import run_client
from broker.client import Client, connect


async def cli(server: ServerHandle, *argv: str) -> int:
    return await run_client(build_parser().parse_args(["--server", server.address, *argv]))


def json_lines(text: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in text.splitlines()]


# -- server ------------------------------------------------------------------------------


async def test_server_info(nats_server: ServerHandle, capsys: pytest.CaptureFixture[str]) -> None:
    async with connect(nats_server.address) as client:
        await client.create_stream("shop")
        await client.create_topic("shop", "orders", subjects=["orders.>"])
        await client.publish("orders.1", b"x")
        assert await cli(nats_server, "server", "info") == 0
        out = capsys.readouterr().out
    sections = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert sections == ["Server ttlbroker", "Connections", "Limits", "Statistics", "Storage"]
    fields = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines() if line.startswith("  "))
    assert fields["ttlbroker"] == nats_server.address and fields["nats"] == nats_server.nats_url
    assert fields["monitoring"] == nats_server.monitoring_url
    assert fields["connections"] == "2 (2 ttlbroker, 0 nats)"  # the test's client and the command's
    assert fields["version"] == "0.1.0" and fields["max payload"] == "1.0 MiB" and fields["topics"] == "1"
    assert fields["start time"].endswith("Z") and fields["auth required"] == "no"
    assert await cli(nats_server, "server", "info", "--json") == 0
    (info,) = json_lines(capsys.readouterr().out)
    assert info["listeners"] == {"ttlbroker": nats_server.address, "nats": nats_server.nats_url, "http": nats_server.monitoring_url}
    assert (info["name"], info["reply_subjects"], info["messages_in"], info["streams"]) == ("ttlbroker", True, 1, 1)


async def test_server_ping(server: ServerHandle, capsys: pytest.CaptureFixture[str]) -> None:
    assert await cli(server, "server", "ping", "--count", "3") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [re.sub(r"rtt=\S+", "rtt=T", " ".join(line.split())) for line in lines[:3]] == [
        f"ttlbroker seq={i} rtt=T" for i in (1, 2, 3)
    ]
    assert all(re.search(r"rtt=[\d.]+(ns|µs|ms|s)$", line) for line in lines[:3])
    assert lines[3:5] == ["", "---- ping statistics ----"]
    m = re.fullmatch(r"3 replies max: ([\d.]+) min: ([\d.]+) avg: ([\d.]+)", lines[5])
    assert m is not None and float(m[2]) <= float(m[3]) <= float(m[1])
    assert await cli(server, "server", "ping", "--count", "2", "--json") == 0
    *pings, summary = json_lines(capsys.readouterr().out)
    assert [(p["server"], p["seq"]) for p in pings] == [("ttlbroker", 1), ("ttlbroker", 2)]
    assert summary["replies"] == 2 and summary["min_ms"] <= summary["avg_ms"] <= summary["max_ms"]


# -- bench -------------------------------------------------------------------------------


async def test_bench_pub_with_subscribers(server: ServerHandle, capsys: pytest.CaptureFixture[str]) -> None:
    assert await cli(server, "bench", "pub", "b.core", "--msgs", "300", "--batch", "40", "--subs", "2", "--json") == 0
    out, err = capsys.readouterr()
    pub, sub = json_lines(out)
    assert (pub["benchmark"], pub["clients"], pub["msgs"], pub["msg_size"], pub["stored"], pub["errors"]) == (
        "core publisher", 1, 300, 128, 0, 0,
    )
    assert pub["msgs_per_sec"] > 0 and pub["bytes_per_sec"] > 0 and "latency_us" not in pub
    assert (sub["benchmark"], sub["clients"], sub["expected"], sub["received"]) == ("core subscriber", 2, 600, 600)
    lat = sub["latency_us"]  # publish to receive
    assert list(lat) == ["min", "avg", "max", "stddev", "p50", "p90", "p99", "p99.9"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    lines = [line.split(" ", 1)[1] for line in err.splitlines()]
    assert lines == [
        "Starting ttlbroker core publisher benchmark [batch=40, clients=1, msg-size=128 B, msgs=300, subject=b.core, subs=2]",
        "[1] Starting ttlbroker core subscriber, expecting 300 messages",
        "[2] Starting ttlbroker core subscriber, expecting 300 messages",
        "[1] Starting ttlbroker core publisher, publishing 300 messages",
    ]
    assert server.broker.counters.messages_unrouted >= 300 and len(server.broker.subs) == 0  # nothing left behind


async def test_bench_pub_report_with_several_publishers(server: ServerHandle, capsys: pytest.CaptureFixture[str]) -> None:
    assert await cli(server, "bench", "pub", "b.many", "--msgs", "101", "--pubs", "2", "--size", "1KB") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ""
    assert re.fullmatch(r" \[1\] [\d,]+ msgs/sec ~ [\d.]+ \w?i?B/sec \(51 msgs\)", lines[1]), lines[1]
    assert re.fullmatch(r" \[2\] [\d,]+ msgs/sec ~ [\d.]+ \w?i?B/sec \(50 msgs\)", lines[2]), lines[2]
    assert lines[3] == ""
    assert re.fullmatch(r" ttlbroker core publisher aggregated stats: [\d,]+ msgs/sec ~ [\d.]+ \w?i?B/sec", lines[4])
    assert re.fullmatch(r" message rates min [\d,]+ \| avg [\d,]+ \| max [\d,]+ \| stddev [\d,]+ msgs", lines[5])


def test_the_report_is_natscli_s() -> None:
    """The layout of ``internal/bench/stats.go``, on numbers worked out by hand."""
    one = Sample(1000, 1024, 0.0, 0.5, [1000 * (i + 1) for i in range(100)])  # 1..100 µs
    assert report_lines("stored publisher (sync acks)", [one]) == [
        "ttlbroker stored publisher (sync acks) stats: 2,000 msgs/sec ~ 2.0 MiB/sec ~ min: 1us ~ avg: 50.5us ~ max: 100us"
        " ~ P50: 50us ~ P90: 90us ~ P99: 99us ~ P99.9: 100us",
    ]
    two = Sample(500, 1024, 0.25, 1.0, [2_500_000])
    lines = report_lines("core publisher", [Sample(1000, 1024, 0.0, 0.5), Sample(500, 1024, 0.25, 1.0)])
    assert lines == [
        " [1] 2,000 msgs/sec ~ 2.0 MiB/sec (1,000 msgs)",
        " [2] 666 msgs/sec ~ 666.7 KiB/sec (500 msgs)",
        "",
        " ttlbroker core publisher aggregated stats: 1,500 msgs/sec ~ 1.5 MiB/sec",
        " message rates min 666 | avg 1,333 | max 2,000 | stddev 667 msgs",
    ]
    assert report_lines("x", [one, two])[-1] == (
        " latencies per operation min 1us | avg 74.75us | max 2,500us | stddev 244.22us | P50 51us | P90 91us"
        " | P99 100us | P99.9 2,500us"
    )


async def test_bench_sub_measures_what_a_publisher_sends(
    server: ServerHandle, client: Client, capsys: pytest.CaptureFixture[str],
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cli, server, "bench", "sub", "b.sub", "--msgs", "50", "--subs", "2", "--json")
        with trio.fail_after(10):
            while len(server.broker.subs) < 2:
                await trio.sleep(0.005)
        acks = await client.publish_batch([("b.sub", _payload(64))] * 50)
        assert acks is not None and set(acks.statuses) == {P.ErrorCode.NO_TOPIC_FOR_SUBJECT}
    (report,) = json_lines(capsys.readouterr().out)
    assert (report["benchmark"], report["clients"], report["expected"], report["received"], report["msg_size"]) == (
        "core subscriber", 2, 100, 100, 64,
    )
    assert report["latency_us"]["min"] > 0 and len(report["per_client"]) == 2


@pytest.mark.parametrize("ack", ["sync", "async", "batch"])
async def test_bench_js_stores_and_cleans_up(server: ServerHandle, client: Client, ack: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert await cli(server, "bench", "js", "b.js", "--msgs", "30", "--ack", ack, "--batch", "8", "--pubs", "2", "--json") == 0
    out, err = capsys.readouterr()
    (report,) = json_lines(out)
    assert (report["benchmark"], report["msgs"], report["clients"], report["errors"]) == (f"stored publisher ({ack} acks)", 30, 2, 0)
    assert [c["msgs"] for c in report["per_client"]] == [15, 15]
    ops = report["latency_us"]
    assert 0 < ops["min"] <= ops["max"]  # publish-ack latencies
    assert "Created benchstream/benchtopic capturing 'b.js' (file storage)" in err
    assert "Removed benchstream (made for the run; --keep keeps it)" in err
    assert await client.list_streams() == []
    assert server.broker.counters.messages_in == 30


async def test_bench_js_keeps_and_reuses(server: ServerHandle, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    await client.create_stream("mine")
    await client.create_topic("mine", "t", subjects=["b.mine"])
    assert await cli(server, "bench", "js", "b.mine", "--stream", "mine", "--topic", "t", "--msgs", "12", "--ack", "batch") == 0
    assert len((await client.fetch("mine", "t")).messages) == 12  # not made for the run: kept
    assert await cli(server, "bench", "js", "b.kept", "--topic", "kept", "--msgs", "5", "--keep", "--storage", "memory") == 0
    t = await client.get_topic("benchstream", "kept")
    assert t.messages_count == 5 and t.extra["options"]["storage"] == "memory"
    out, err = capsys.readouterr()
    assert "Removed" not in err and "Created benchstream/kept capturing 'b.kept' (memory storage)" in err
    assert out.splitlines()[-1].startswith("ttlbroker stored publisher (async acks) stats: ")


async def test_bench_js_errors_leave_nothing_behind(server: ServerHandle, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    await client.create_stream("other")
    await client.create_topic("other", "t", subjects=["b.>"])
    assert await cli(server, "bench", "js", "b.taken", "--msgs", "5") == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: SUBJECTS_OVERLAP (2006): subject filter 'b.taken' overlaps 'b.>'")
    assert [s.name for s in await client.list_streams()] == ["other"]  # the stream made for the run went again


def test_bench_arguments_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["bench", "pub", "x", "--size", "12XB"], "argument --size: invalid size '12XB' (use e.g. 128, 128B, 1KB, 2MiB)"),
        (["bench", "js", "x", "--msgs", "0"], "argument --msgs: 0 is below 1"),
        (["bench", "pub", "x", "--subs", "-1"], "argument --subs: -1 is below 0"),
        (["bench", "sub", "x", "--clients", "many"], "argument --subs/--clients: invalid number 'many'"),
    ]:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert message in capsys.readouterr().err.splitlines()[-1], argv
    args = build_parser().parse_args(["bench", "pub", "x", "--size", "2KiB", "--pubs", "3"])
    assert (args.size, args.clients, args.msgs, args.batch, args.subs) == (2048, 3, 100_000, 100, 0)
