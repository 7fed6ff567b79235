"""The command line's conventions: global options before or after the command and
from the environment, ``--help`` showing defaults, ``--version``, TLS options, and
shell completion scripts."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trustme
from conftest import BrokerProcess, env_with_project

from broker.cli import build_parser, main

GLOBAL_ENV = ("TTLBROKER_SERVER", "TTLBROKER_TOKEN", "TTLBROKER_TLS_CA", "TTLBROKER_TLS_CERT", "TTLBROKER_TLS_KEY")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in GLOBAL_ENV:
        monkeypatch.delenv(name, raising=False)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in env_with_project().items() if k not in GLOBAL_ENV}
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True, env={**base, **(env or {})}, timeout=60,
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    proc = BrokerProcess(tmp_path_factory.mktemp("conventions-data"))
    try:
        yield proc
    finally:
        proc.stop()


# -- global options -----------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["--server", "h:1", "stats"],
    ["stats", "--server", "h:1"],
    ["-s", "h:1", "stats"],
    ["stats", "-s", "h:1"],
    ["--server", "h:9", "stats", "--server", "h:1"],  # the later one wins
    ["--server", "h:1", "stream", "list"],
    ["stream", "--server", "h:1", "list"],
    ["stream", "list", "--server", "h:1"],
    ["--server", "h:1", "kv", "get", "b", "k"],
    ["kv", "get", "b", "k", "--server=h:1"],
])
def test_server_before_or_after_the_command(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).server == "h:1"


@pytest.mark.parametrize("argv", [
    ["--json", "--token", "t", "--tls-ca", "ca.pem", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls",
     "consumer", "info", "s", "t", "c"],
    ["consumer", "info", "s", "t", "c", "--json", "--token", "t", "--tls-ca", "ca.pem", "--tls-cert", "c.pem",
     "--tls-key", "k.pem", "--tls"],
    ["--json", "--tls-ca", "ca.pem", "consumer", "--token", "t", "info", "--tls", "s", "t", "c", "--tls-cert", "c.pem",
     "--tls-key", "k.pem"],
])
def test_every_global_option_before_or_after(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.json, args.token, args.tls, args.tls_ca, args.tls_cert, args.tls_key) == (
        True, "t", True, "ca.pem", "c.pem", "k.pem",
    )
    assert (args.command, args.action, args.name) == ("consumer", "info", "c")


def test_defaults_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["stats"])
    assert (args.server, args.token, args.json, args.tls, args.tls_ca) == ("127.0.0.1:8090", "", False, False, None)
    monkeypatch.setenv("TTLBROKER_SERVER", "env:1")
    monkeypatch.setenv("TTLBROKER_TOKEN", "secret")
    monkeypatch.setenv("TTLBROKER_TLS_CA", "ca.pem")
    args = build_parser().parse_args(["stats"])
    assert (args.server, args.token, args.tls_ca) == ("env:1", "secret", "ca.pem")
    for argv in (["--server", "opt:2", "stats"], ["stats", "--server", "opt:2"]):
        assert build_parser().parse_args(argv).server == "opt:2"  # an option beats the environment


def test_help_shows_the_global_options_and_their_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["stats", "--help"], ["topic", "info", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
        assert "global options (before or after the command):" in text
        assert "-s HOST:PORT, --server HOST:PORT the broker's address (default: 127.0.0.1:8090, or $TTLBROKER_SERVER)" in text
        assert "--token TOKEN the broker's auth token (default: $TTLBROKER_TOKEN, else none)" in text
        for option in ("--json", "--tls ", "--tls-ca FILE", "--tls-cert FILE", "--tls-key FILE"):
            assert option in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"ttlbroker {importlib.metadata.version('ttlbroker')}\n"


def test_global_options_before_and_after_against_a_broker(broker: BrokerProcess) -> None:
    a = broker.address
    before = cli("--server", a, "--json", "stats")
    after = cli("stats", "--server", a, "--json")
    env = cli("stats", "--json", env={"TTLBROKER_SERVER": a})
    for p in (before, after, env):
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["name"] == "ttlbroker"
    p = cli("stats", env={"TTLBROKER_SERVER": "127.0.0.1:1"})
    assert (p.returncode, p.stderr) == (2, "error: CANNOT_CONNECT: cannot connect to 127.0.0.1:1: Connection refused\n")


def test_token_from_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "auth.toml"
    config.write_text('[server]\nauth_token = "s3cret"\n')
    data = tmp_path / "data"
    data.mkdir()
    proc = BrokerProcess(data, config_file=config)
    try:
        a = proc.address
        refused = cli("--server", a, "stats")
        assert refused.returncode == 1 and refused.stderr.startswith("error: UNAUTHORIZED")
        assert cli("--server", a, "--token", "s3cret", "stats", "--json").returncode == 0
        assert cli("stats", "--json", env={"TTLBROKER_SERVER": a, "TTLBROKER_TOKEN": "s3cret"}).returncode == 0
    finally:
        proc.stop()


# -- TLS -----------------------------------------------------------------------------------


def test_tls_options_reach_the_client(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_pem, server_pem = tmp_path / "ca.pem", tmp_path / "server.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(server_pem))
    data = tmp_path / "data"
    data.mkdir()
    proc = BrokerProcess(data, "--tls-cert", str(server_pem), "--tls-key", str(server_pem))
    try:
        a = proc.address
        for args, env in (
            (["--tls-ca", str(ca_pem), "--server", a, "stats", "--json"], None),
            (["stats", "--json", "--server", a, "--tls-ca", str(ca_pem)], None),
            (["stats", "--json", "--server", a], {"TTLBROKER_TLS_CA": str(ca_pem)}),
        ):
            p = cli(*args, env=env)
            assert p.returncode == 0, p.stderr
            assert json.loads(p.stdout)["connections"] >= 1
        # --tls alone trusts only the system's CAs, which did not sign this certificate
        p = cli("--tls", "--server", a, "stats")
        assert p.returncode == 2 and p.stderr.startswith(f"error: CANNOT_CONNECT: cannot connect to {a}: TLS: certificate")
        assert len(p.stderr.splitlines()) == 1
        p = cli("--tls-ca", str(tmp_path / "missing.pem"), "--server", a, "stats")
        assert (p.returncode, p.stderr) == (
            2, f"error: BAD_ARGUMENT: cannot load the TLS files (--tls-ca {tmp_path / 'missing.pem'}): No such file or directory\n",
        )
        p = cli("--tls-key", str(server_pem), "--server", a, "stats")
        assert (p.returncode, p.stderr) == (
            2, f"error: BAD_ARGUMENT: cannot load the TLS files (--tls-key {server_pem}): a client key needs its certificate (cert=...)\n",
        )
    finally:
        proc.stop()


# -- completion ----------------------------------------------------------------------------


def test_bash_completion_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "ttlbroker.bash"
    script.write_text(capsys.readouterr().out)
    bash = shutil.which("bash")
    assert bash is not None
    assert subprocess.run([bash, "-n", str(script)], capture_output=True, timeout=30).returncode == 0
    # Sourced, it completes the commands, a group's actions and the global options.
    probe = f"""
        source {script}
        complete -p ttlbroker >/dev/null || exit 3
        fn=$(complete -p ttlbroker | sed -E 's/.*-F ([^ ]+).*/\\1/')
        ask() {{ COMP_WORDS=("$@"); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}}
                 COMPREPLY=(); "$fn" ttlbroker "${{COMP_WORDS[-1]}}" "${{COMP_WORDS[-2]}}"; echo "${{COMPREPLY[*]}}"; }}
        ask ttlbroker st
        ask ttlbroker kv l
        ask ttlbroker stats --se
    """
    p = subprocess.run([bash, "-c", probe], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert [sorted(line.split()) for line in p.stdout.splitlines()] == [["stats", "stream"], ["ls"], ["--server"]]


def test_zsh_completion_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "zsh"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("#compdef ttlbroker")
    for word in ("serve", "consumer", "--server", "--tls-ca"):
        assert word in text
    zsh = shutil.which("zsh")
    if zsh is not None:  # not on every machine; bash is
        script = tmp_path / "_ttlbroker"
        script.write_text(text)
        assert subprocess.run([zsh, "-n", str(script)], capture_output=True, timeout=30).returncode == 0


def test_completion_needs_a_known_shell() -> None:
    p = cli("completion", "fish")
    assert (p.returncode, p.stderr) == (
        2, "error: BAD_ARGUMENT: argument shell: invalid choice: 'fish' (choose from 'bash', 'zsh') "
        "(see `ttlbroker completion --help`)\n",
    )


def test_piped_output_has_no_escape_codes(broker: BrokerProcess) -> None:
    a = broker.address
    for args in (["stats"], ["stream", "list"], ["--help"]):
        p = cli("--server", a, *args, env={"TERM": "xterm-256color", "COLUMNS": "40"})
        assert p.returncode == 0 and "\x1b" not in p.stdout
