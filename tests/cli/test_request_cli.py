"""``ttlbroker req`` and ``ttlbroker reply`` (natscli's ``nats req`` / ``nats reply``),
run in this process on the test's trio loop (``run_client``, what ``main`` runs after
parsing) against a broker on the same loop, with ttlbroker and nats-py on the other
side."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading

import nats
import pytest
import trio
import trio.testing
from helpers import in_asyncio, subscribed

import protocol as P
from broker import ServerHandle
from broker.cli import build_parser
from broker.cli._run import run_client
from broker.client import Client, connect


async def cli(server: ServerHandle, *argv: str) -> int:
    return await run_client(build_parser().parse_args(["--server", server.address, *argv]))


async def until_subscribed(server: ServerHandle, subject: str) -> None:
    """Until the broker holds a subscription on ``subject`` (a command started
    beside the test is ready)."""
    with trio.fail_after(10):
        while not any(s.subject_filter == subject for s in server.broker.subs._all):
            await trio.sleep(0.005)


async def test_req_gets_the_answer_of_reply(server: ServerHandle, capsys: pytest.CaptureFixture[str]) -> None:
    status: list[int] = []

    async def reply() -> None:
        status.append(await cli(server, "reply", "svc.echo", "pong", "--count", "1", "-H", "X-From:cli"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reply)
        await until_subscribed(server, "svc.echo")
        assert await cli(server, "req", "svc.echo", "hello", "-H", "a:b") == 0
    assert status == [0]  # reply ended after its --count
    out, err = capsys.readouterr()
    assert out == "\nhello\npong\n\n"  # reply shows the request; req the answer and a blank line
    lines = [line.split(" ", 1)[1] for line in err.splitlines()]  # without the time of day
    assert lines[0] == 'Listening on "svc.echo"'
    assert lines[1:] == [
        'Sending request on "svc.echo"', '[#0] Received on subject "svc.echo":', "a: b",
        lines[4], "X-From: cli",
    ] and lines[4].startswith("Received with rtt ")
    assert all(line[:2].isdigit() and line[2] == ":" and line[8] == " " for line in err.splitlines())  # HH:MM:SS


async def test_reply_echoes_by_default_and_req_prints_json(server: ServerHandle, capsys: pytest.CaptureFixture[str]) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cli, server, "reply", "svc.>", "--count", "2")
        await until_subscribed(server, "svc.>")
        assert await cli(server, "req", "svc.e", "ping", "-H", "K=V", "--count", "2", "--json") == 0
    out, err = capsys.readouterr()
    replies = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["request"], r["payload"], r["headers"]) for r in replies] == [
        (1, "ping", {"K": "V", "NATS-Reply-Counter": "0"}), (2, "ping", {"K": "V", "NATS-Reply-Counter": "1"}),
    ]
    assert all(r["subject"].startswith("_INBOX.") and r["rtt_ms"] > 0 for r in replies)
    assert "No body or command supplied, enabling echo mode" in err
    assert "Sending request" not in err  # (--json: no log lines)
    # reply --json: one object per request it answered
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cli, server, "reply", "svc.j", "ok", "--count", "1", "--json")
        await until_subscribed(server, "svc.j")
        assert await cli(server, "req", "svc.j", "q", "--raw") == 0
    out = capsys.readouterr().out.splitlines()
    (shown,) = [json.loads(line) for line in out if line.startswith("{")]
    assert (shown["request"], shown["subject"], shown["payload"]) == (0, "svc.j", "q")
    assert shown["reply"].startswith("_INBOX.") and "ok" in out


async def test_reply_runs_a_command(server: ServerHandle, capsys: pytest.CaptureFixture[str]) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cli, server, "reply", "weather.>", "--count", "2", "--command",
                           "sh -c 'echo {{1}}: $NATS_REQUEST_BODY on $NATS_REQUEST_SUBJECT; exit $0' {{2}}")
        await until_subscribed(server, "weather.>")
        async with connect(server.address) as c:
            assert (await c.request("weather.london.0", b"today")).payload == b"london: today on weather.london.0\n"
            # a failing command: its output is still the answer, and a line says it failed
            assert (await c.request("weather.paris.3", b"x")).payload == b"paris: x on weather.paris.3\n"
    err = capsys.readouterr().err
    assert "Command \"sh -c 'echo paris: $NATS_REQUEST_BODY on $NATS_REQUEST_SUBJECT; exit $0' 3\" failed to run: exit status 3" in err


async def test_reply_passes_over_a_message_without_a_reply_subject(
    server: ServerHandle, client: Client, capsys: pytest.CaptureFixture[str],
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cli, server, "reply", "svc.x", "ok", "--count", "1")
        await until_subscribed(server, "svc.x")
        with pytest.raises(P.NoTopicForSubjectError):  # (delivered all the same)
            await client.publish("svc.x", b"plain")
        assert (await client.request("svc.x", b"asked")).payload == b"ok"
    err = capsys.readouterr().err
    assert '[#0] the message on "svc.x" carries no reply subject: nothing to answer' in err


async def test_req_with_no_responders_and_bad_headers(server: ServerHandle, capsys: pytest.CaptureFixture[str]) -> None:
    assert await cli(server, "req", "nobody.home", "x") == 1
    assert capsys.readouterr().err.splitlines()[-1] == "error: NO_RESPONDERS: no responders are available for a request on 'nobody.home'"
    with pytest.raises(SystemExit) as info:
        await cli(server, "req", "nobody.home", "x", "-H", "nothing")
    assert str(info.value) == "error: -H takes KEY:VALUE, not 'nothing'"


async def test_req_times_out(server: ServerHandle, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]) -> None:
    async with connect(server.address, timeout=None) as c, await c.subscribe("slow.svc"):  # takes it, never answers
        started = trio.current_time()
        assert await cli(server, "req", "slow.svc", "x", "--timeout", "1.5") == 1
        assert 1.5 <= trio.current_time() - started < 1.6
    assert capsys.readouterr().err.splitlines()[-1] == "error: NO_REPLY: no reply to the request on 'slow.svc' within 1.5 s"


async def test_req_and_reply_with_nats_py(nats_server: ServerHandle, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    ready, done = threading.Event(), threading.Event()

    async def nats_responder() -> None:
        nc = await nats.connect(nats_url)

        async def respond(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(b"nats says " + msg.data)

        await nc.subscribe("n.svc", cb=respond)
        await subscribed(nc)
        ready.set()
        await asyncio.to_thread(done.wait, 20)
        await nc.close()

    async def nats_requester() -> bytes:
        nc = await nats.connect(nats_url)
        try:
            return (await nc.request("t.svc", b"from nats-py", timeout=5)).data
        finally:
            await nc.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_asyncio, nats_responder)
        assert await trio.to_thread.run_sync(ready.wait, 20)
        try:
            assert await cli(nats_server, "req", "n.svc", "hi", "--raw") == 0
        finally:
            done.set()
        assert capsys.readouterr().out == "nats says hi\n"
        nursery.start_soon(cli, nats_server, "reply", "t.svc", "ttlbroker says hi", "--count", "1")
        await until_subscribed(nats_server, "t.svc")
        assert await in_asyncio(nats_requester) == b"ttlbroker says hi"
    assert "\nfrom nats-py\n" in capsys.readouterr().out


def test_every_new_option_says_what_it_does_and_its_default() -> None:
    parser = build_parser()
    commands = {"req": None, "reply": None, "server": ("info", "ping"), "bench": ("pub", "sub", "js")}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    checked = 0
    for name, actions in commands.items():
        parsers = [sub.choices[name]] if actions is None else [
            next(a for a in sub.choices[name]._actions if isinstance(a, argparse._SubParsersAction)).choices[x] for x in actions
        ]
        for p in parsers:
            for action in p._actions:
                if action.dest in ("help", "server", "token", "user", "password", "json", "tls", "tls_ca", "tls_cert", "tls_key"):
                    continue  # argparse's own, and the global options (tests/cli/test_conventions.py)
                assert action.help, (p.prog, action.dest)
                if action.option_strings:
                    assert "default" in action.help, (p.prog, action.dest, action.help)
                checked += 1
    assert checked >= 25
