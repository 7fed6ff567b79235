"""natscli's habits in the ``ttlbroker`` command, part 4: ``pub`` templates in the
subject, the data and the header values, ``pub --sleep`` (time driven by trio's
MockClock), and ``sub --raw``."""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import make_config, start_server
from helpers import BrokerThread, MainCLI

from broker.cli import build_parser
from broker.cli._run import run_client
from broker.cli._templates import MessageTemplate
from broker.client import connect


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """With stream tpl, topic t capturing tpl.>; frames of at most 256 KiB."""
    from broker.cli import main

    b = BrokerThread(Path(tmp_path_factory.mktemp("pub-data")),  # small frames: pub --count must split its batches
                     **{"limits.max_frame_bytes": 256 * 1024, "limits.max_payload_bytes": 200 * 1024})
    try:
        assert main(["--server", b.address, "stream", "create", "tpl"]) == 0
        assert main(["--server", b.address, "topic", "create", "tpl", "t", "--subjects", "tpl.>"]) == 0
        yield b
    finally:
        b.stop()


@pytest.fixture
def cli(broker: BrokerThread, capsys: pytest.CaptureFixture[str]) -> MainCLI:
    return MainCLI(capsys, broker.address)


def fetched(cli: MainCLI, after: int) -> list[dict[str, Any]]:
    return cli.json("fetch", "tpl", "t", "--offset", str(after + 1), "--count", "1000")


def last_offset(cli: MainCLI) -> int:
    return int(cli.json("topic", "info", "tpl", "t")[0]["partitions"][0]["last_offset"])


def test_count_subject_data_and_header_templates(cli: MainCLI) -> None:
    start = last_offset(cli)
    out = cli("pub", "tpl.{{Count}}", "n={{Count}} r={{ Random 5 5 }} {{.Cnt}}", "--count", "3",
              "--header", "X-Seq={{Cnt}}", "--header", "X-Id={{ID}}", "--header", "X-Plain=as is")
    assert re.fullmatch(r"published 3 messages on tpl\.\{\{Count\}\} in \d+\.\d s \([\d,]+ msgs/s\)\n", out), out
    msgs = fetched(cli, start)
    assert [m["subject"] for m in msgs] == ["tpl.1", "tpl.2", "tpl.3"]
    for i, m in enumerate(msgs, 1):
        assert re.fullmatch(rf"n={i} r=[A-Za-z0-9]{{5}} {i}", m["payload"]), m["payload"]
        assert m["headers"]["X-Seq"] == str(i) and m["headers"]["X-Plain"] == "as is"
        assert re.fullmatch(r"[0-9A-Za-z]{22}", m["headers"]["X-Id"])
    assert len({m["headers"]["X-Id"] for m in msgs}) == 3 and len({m["payload"] for m in msgs}) == 3
    # one message: rendered as message 1, and the line names the subject it went to
    out = cli("pub", "tpl.one.{{Count}}", "{{Count}}")
    assert out.startswith("published tpl.one.1 -> partition 0 offset ")
    assert fetched(cli, start + 3)[0]["payload"] == "1"


def test_time_templates(cli: MainCLI) -> None:
    start = last_offset(cli)
    before = time.time_ns()
    cli("pub", "tpl.time", "{{Unix}} {{UnixNano}} {{TimeStamp}} {{Time}}")
    after = time.time_ns()
    unix, nano, stamp, kitchen = fetched(cli, start)[0]["payload"].split()
    assert before // 10**9 <= int(unix) <= after // 10**9
    assert before <= int(nano) <= after and int(nano) // 10**9 == int(unix)  # one time for the whole message
    t = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert t.tzinfo is not None and int(t.timestamp()) == int(unix)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)", stamp)  # RFC 3339, to the second
    local = dt.datetime.fromtimestamp(int(unix))
    assert kitchen == f"{local.hour % 12 or 12}:{local.minute:02d}{'AM' if local.hour < 12 else 'PM'}"


@pytest.mark.parametrize(("argv", "error"), [
    (["tpl.x", "{{Nope}}"], "the data: {{Nope}} is not a template function (Count, Cnt, TimeStamp, Unix, UnixNano, "
                            "Time, ID, Random; --no-templates sends the text as it is)"),
    (["tpl.{{Count", "x"], "the subject: a {{ at character 5 is never closed with }}"),
    (["tpl.x", "{{Random 5}}"], "the data: {{Random 5}}: Random takes two whole numbers, the shortest and the longest length"),
    (["tpl.x", "x", "--header", "H={{Count 2}}"], "header H: {{Count 2}} is not a template function (Count, Cnt, "
                                                 "TimeStamp, Unix, UnixNano, Time, ID, Random; --no-templates sends the "
                                                 "text as it is)"),
])
def test_a_bad_template_is_refused_before_anything_is_sent(cli: MainCLI, argv: list[str], error: str) -> None:
    start = last_offset(cli)
    assert cli.err("pub", *argv, "--count", "2", status=2) == f"error: BAD_ARGUMENT: pub: {error}\n"
    assert last_offset(cli) == start


def test_no_templates_and_binary_data_go_as_they_are(cli: MainCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    start = last_offset(cli)
    cli("pub", "tpl.raw", "{{Count}} {{Nope}}", "--no-templates", "--header", "H={{Count}}")
    m = fetched(cli, start)[0]
    assert (m["payload"], m["headers"]) == ("{{Count}} {{Nope}}", {"H": "{{Count}}"})
    stdin = io.TextIOWrapper(io.BytesIO(b"\xff{{Count}}"))
    monkeypatch.setattr(sys, "stdin", stdin)
    cli("pub", "tpl.bin")  # data from stdin that is not UTF-8: never a template
    m = fetched(cli, start + 1)[0]
    assert m["payload_encoding"] == "base64" and m["payload"] == "/3t7Q291bnR9fQ=="


def test_without_templates_one_body_is_encoded_for_every_message() -> None:
    """The fast path of ``pub --count``: the same bytes object N times; with a
    template, N bodies; never more bytes than the budget but one message at least."""
    plain = MessageTemplate("a.b", b"data", {"H": "v"})
    assert not plain.varies
    first, *rest = plain.batch(0, 1000, 1 << 20)
    assert len(rest) == 999 and all(b is first for b in rest) and plain.batch(1000, 5, 1 << 20)[0] is first
    assert len(plain.batch(0, 1000, 10 * len(first) + 1)) == 10 and len(plain.batch(0, 1000, 1)) == 1
    varied = MessageTemplate("a.{{Count}}", b"data", {})
    assert varied.varies and len(set(varied.batch(0, 1000, 1 << 20))) == 1000
    sized = varied.batch(0, 1000, 1000)
    assert 1 < len(sized) < 1000 and sum(map(len, sized)) <= 1000 and sized[0] == varied.batch(0, 1, 1)[0]
    assert not MessageTemplate("a.{{Count}}", b"{{Nope}}", {}, enabled=False).varies


def test_pub_count_splits_its_batches_to_fit_the_brokers_frames(cli: MainCLI) -> None:
    start = last_offset(cli)
    out = cli("pub", "tpl.big", "x" * 60_000, "--count", "12", "--json")  # 720 kB: batches of at most 128 KiB
    assert cli.json("topic", "info", "tpl", "t")[0]["partitions"][0]["last_offset"] == start + 12, out
    cli("pub", "tpl.big.{{Count}}", "{{Random 60000 60000}}", "--count", "6")
    got = fetched(cli, start + 12)
    assert [m["subject"] for m in got] == [f"tpl.big.{i}" for i in range(1, 7)]
    assert {len(m["payload"]) for m in got} == {60_000}
    # a message over the broker's frames: said before it is sent (the broker would close the connection)
    err = cli.err("pub", "tpl.big", "x" * 300_000, "--count", "2", status=2)
    assert err == ("error: BAD_ARGUMENT: pub: message 1 takes 300,021 bytes, more than a frame of the broker holds (262,144 bytes "
                   "with the frame's own, its limits.max_frame_bytes)\n")
    assert last_offset(cli) == start + 18


def _args(address: str, *argv: str) -> Any:
    return build_parser().parse_args(["--server", address, *argv])


async def test_sleep_paces_the_messages(tmp_path: Path, mock_clock: trio.testing.MockClock,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``pub --count 3 --sleep 1h``: one message, an hour, the next... (trio's
    MockClock, jumping once the stream and topic exist: the hours pass at once)."""
    async with start_server(make_config(tmp_path, **{"system.partition.fsync": "never"})) as h, connect(h.address) as c:
        await c.create_stream("s")  # (the catalog is written in a worker thread: the clock stands still meanwhile)
        await c.create_topic("s", "t", subjects=["s.>"])
        mock_clock.autojump_threshold = 0

        async def stored() -> int:
            return (await c.get_topic("s", "t")).messages_count

        status: list[int] = []
        took: list[float] = []
        async with trio.open_nursery() as nursery:
            async def pub() -> None:
                started = trio.current_time()
                status.append(await run_client(_args(h.address, "pub", "s.x", "m{{Count}}", "--count", "3", "--sleep", "1h")))
                took.append(trio.current_time() - started)

            nursery.start_soon(pub)
            seen = []
            await trio.sleep(1800)
            for _ in range(3):  # half an hour after each message
                seen.append(await stored())
                await trio.sleep(3600)
        assert status == [0] and seen == [1, 2, 3]
        assert 7200 <= took[0] < 7200 + 60  # two pauses: none after the last message
        assert re.fullmatch(r"published 3 messages on s\.x in \d+\.\d s \(\d+ msgs/s\)\n", capsys.readouterr().out)
        f = await c.fetch("s", "t", 0, 1, 10)
        assert [m.payload for m in f.messages] == [b"m1", b"m2", b"m3"]


async def test_ctrl_c_ends_a_pause_at_once(tmp_path: Path, mock_clock: trio.testing.MockClock,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    async with start_server(make_config(tmp_path, **{"system.partition.fsync": "never"})) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["s.>"])
        mock_clock.autojump_threshold = 0
        status: list[int] = []
        async with trio.open_nursery() as nursery:
            async def pub() -> None:
                status.append(await run_client(_args(h.address, "pub", "s.x", "m", "--count", "3", "--sleep", "1h")))

            nursery.start_soon(pub)
            await trio.sleep(1800)  # in the first pause (its Ctrl-C handler is in place: a message is stored)
            assert (await c.get_topic("s", "t")).messages_count == 1
            os.kill(os.getpid(), signal.SIGINT)
            with trio.fail_after(1):  # not the hour the pause had left, nor the 5 s a batch in flight gets
                while not status:
                    await trio.sleep(0.01)
        assert status == [130] and (await c.get_topic("s", "t")).messages_count == 1
        assert capsys.readouterr().err == "interrupted: published 1 of 3\n"


async def test_sub_raw_prints_the_payloads_alone(tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    async with start_server(make_config(tmp_path, **{"system.partition.fsync": "never"})) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["s.>"])
        status: list[int] = []
        async with trio.open_nursery() as nursery:
            async def sub() -> None:
                status.append(await run_client(_args(h.address, "sub", "s.>", "--raw", "--count", "4")))

            nursery.start_soon(sub)
            while (await c.stats())["subscriptions"] < 1:  # until it is subscribed
                await trio.sleep(0.01)
            for payload in (b"one", b"two\n", b"", b"\xff\x00bin"):
                await c.publish("s.x", payload)
        out, err = capsysbinary.readouterr()
        assert status == [0] and err == b"subscribed to s.>\n"  # stderr: stdout holds only the payloads
        assert out == b"one\ntwo\n\n\xff\x00bin\n"
        assert await run_client(_args(h.address, "sub", "s.>", "--raw", "--json")) == 2
        assert capsysbinary.readouterr().err == (
            b"error: BAD_ARGUMENT: sub: --raw prints the payloads alone, --json whole messages: give one of them\n"
        )
