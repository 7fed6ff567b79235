"""natscli's habits in the ``ttlbroker`` command, part 2: contexts, their files
under ``$XDG_CONFIG_HOME`` (here a temporary directory), and which connection
option wins: the command line, then the environment, then the context, then the
default; from ``main([...])`` in this process."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from helpers import BrokerThread, MainCLI

from broker.cli import build_parser
from broker.cli._contexts import ContextError, apply_context

ENV = ("TTLBROKER_SERVER", "TTLBROKER_TOKEN", "TTLBROKER_USER", "TTLBROKER_PASSWORD", "TTLBROKER_TLS_CA",
       "TTLBROKER_TLS_CERT", "TTLBROKER_TLS_KEY", "TTLBROKER_CONTEXT")


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home / "ttlbroker"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> MainCLI:
    return MainCLI(capsys)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_add_ls_select_info_rm_and_the_files(cli: MainCLI, config_home: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("context", "ls") == "No known contexts\n" and cli("context", "ls", "--json") == ""
    monkeypatch.chdir(tmp_path)
    out = cli("context", "add", "prod", "--server", "prod.example:8090", "--user", "ops", "--password", "pa55",
              "--tls-ca", "ca.pem", "--description", "production")
    assert out == (
        'Context "prod"\n'
        "  description  production\n"
        "  server       prod.example:8090\n"
        "  user         ops\n"
        "  password     ****\n"
        f"  tls ca       {tmp_path / 'ca.pem'}\n"
        f"  path         {config_home / 'context' / 'prod.json'}\n"
    )
    path = config_home / "context" / "prod.json"
    assert json.loads(path.read_text()) == {
        "description": "production", "url": "prod.example:8090", "user": "ops", "password": "pa55", "token": "",
        "ca": str(tmp_path / "ca.pem"), "cert": "", "key": "", "tls": False,
    }
    assert mode(path) == 0o600 and mode(path.parent) == 0o700 and mode(config_home) == 0o700
    assert not (config_home / "context.txt").exists()  # added, not selected
    # an update changes only what it is given, and keeps keys it does not know (a natscli file's)
    path.write_text(json.dumps({**json.loads(path.read_text()), "jetstream_domain": "hub"}))
    cli("context", "add", "prod", "--server", "prod2.example:8090")
    saved = json.loads(path.read_text())
    assert (saved["url"], saved["user"], saved["password"], saved["jetstream_domain"]) == ("prod2.example:8090", "ops",
                                                                                          "pa55", "hub")
    cli("context", "add", "dev", "--token", "t0k", "--tls", "--select")
    assert (config_home / "context.txt").read_text() == "dev" and mode(config_home / "context.txt") == 0o600
    assert cli("context", "ls") == (
        "Known Contexts\n"
        "NAME  DESCRIPTION\n"
        "dev*\n"
        "prod  production\n"
    )
    assert cli.json("context", "ls") == [
        {"name": "dev", "description": "", "url": "", "selected": True},
        {"name": "prod", "description": "production", "url": "prod2.example:8090", "selected": False},
    ]
    info = cli.json("context", "info")[0]  # the selected one
    assert (info["name"], info["selected"], info["token"], info["tls"]) == ("dev", True, "***", True)
    assert cli("context", "select", "prod").startswith('Context "prod" (selected)\n')
    assert (config_home / "context.txt").read_text() == "prod"
    assert cli.err("context", "rm", "prod", status=2) == (
        'error: INVALID_CONTEXT: cannot remove the selected context "prod": select another one, use ttlbroker context unselect, '
        "or give --force\n"
    )
    assert cli("context", "rm", "dev") == 'deleted context "dev"\n'  # stdin is no terminal here: no question
    assert cli("context", "rm", "prod", "--force") == 'deleted context "prod"\n'
    assert not (config_home / "context.txt").exists() and list((config_home / "context").iterdir()) == []
    assert cli("context", "unselect") == "No context currently selected\n"


def test_context_errors(cli: MainCLI, config_home: Path) -> None:
    assert cli.err("context", "info", "nope", status=2) == (
        'error: INVALID_CONTEXT: unknown context "nope" (there is none yet: ttlbroker context add NAME --server HOST:PORT)\n'
    )
    assert cli.err("context", "info", status=2) == "error: INVALID_CONTEXT: no context is selected and no name was given\n"
    cli("context", "add", "a", "--server", "h:1")
    assert cli.err("context", "select", "b", status=2) == 'error: INVALID_CONTEXT: unknown context "b" (known: a)\n'
    assert cli.err("context", "add", "x/y", status=2) == 'error: INVALID_CONTEXT: invalid context name "x/y": it must not contain "/" or "\\"\n'
    assert cli.err("context", "add", "..", status=2) == 'error: INVALID_CONTEXT: invalid context name "..": it must not contain ".."\n'
    assert cli.err("context", "add", "", status=2) == "error: INVALID_CONTEXT: a context's name cannot be empty\n"
    assert cli.err("context", "add", "both", "--token", "t", "--user", "u", status=2) == (
        "error: INVALID_CONTEXT: a context holds a token or a user and a password, not both\n"
    )
    assert not (config_home / "context" / "both.json").exists()
    (config_home / "context" / "bad.json").write_text("{not json")
    err = cli.err("context", "info", "bad", status=2)
    assert err.startswith(f'error: INVALID_CONTEXT: context "bad" ({config_home / "context" / "bad.json"}) is not JSON: ')
    (config_home / "context" / "bad.json").write_text("[]")
    assert cli.err("context", "info", "bad", status=2) == (
        f'error: INVALID_CONTEXT: context "bad" ({config_home / "context" / "bad.json"}) is not a JSON object\n'
    )
    (config_home / "context" / "bad.json").write_text('{"url": 8090}')
    assert cli.err("--context", "bad", "stats", status=2) == (
        f'error: INVALID_CONTEXT: context "bad" ({config_home / "context" / "bad.json"}): "url" must be a string\n'
    )
    (config_home / "context.txt").write_text("gone")
    assert cli.err("stats", status=2) == 'error: INVALID_CONTEXT: unknown context "gone" (known: a, bad)\n'
    (config_home / "context.txt").unlink()
    (config_home / "context.txt").mkdir()
    assert cli.err("stats", status=2) == f"error: INVALID_CONTEXT: cannot read {config_home / 'context.txt'}: Is a directory\n"


def resolved(argv: list[str]) -> tuple[str, str, str, str, bool, str | None]:
    args = build_parser().parse_args(argv)
    apply_context(args)
    return args.server, args.token, args.user, args.password, args.tls, args.tls_ca


def test_which_option_wins(cli: MainCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolved(["stats"]) == ("127.0.0.1:8090", "", "", "", False, None)  # no context: the defaults
    cli("context", "add", "c", "--server", "ctx:1", "--user", "ctx-user", "--password", "ctx-pw", "--tls-ca", "/ctx/ca.pem")
    cli("context", "add", "d", "--server", "d:2", "--token", "d-token", "--tls")
    assert resolved(["stats"]) == ("127.0.0.1:8090", "", "", "", False, None)  # none selected
    cli("context", "select", "c")
    assert resolved(["stats"]) == ("ctx:1", "", "ctx-user", "ctx-pw", False, "/ctx/ca.pem")
    assert resolved(["--context", "d", "stats"]) == ("d:2", "d-token", "", "", True, None)
    assert resolved(["stats", "--context", "d"]) == ("d:2", "d-token", "", "", True, None)
    # the command line beats the context, option by option
    assert resolved(["stats", "--server", "flag:3", "--tls-ca", "/flag/ca.pem"]) == (
        "flag:3", "", "ctx-user", "ctx-pw", False, "/flag/ca.pem",
    )
    assert resolved(["--server", "127.0.0.1:8090", "stats"])[0] == "127.0.0.1:8090"  # the default's value, given
    # the credentials go as a set: a token given, and the context's user and password stay out
    assert resolved(["stats", "--token", "flag-token"]) == ("ctx:1", "flag-token", "", "", False, "/ctx/ca.pem")
    # the environment beats the context, and the command line beats the environment
    monkeypatch.setenv("TTLBROKER_SERVER", "env:4")
    monkeypatch.setenv("TTLBROKER_PASSWORD", "env-pw")
    assert resolved(["stats"]) == ("env:4", "", "", "env-pw", False, "/ctx/ca.pem")
    assert resolved(["stats", "-s", "flag:5"])[0] == "flag:5"
    monkeypatch.setenv("TTLBROKER_CONTEXT", "d")
    assert resolved(["stats"]) == ("env:4", "", "", "env-pw", True, None)  # $TTLBROKER_CONTEXT over the selected one
    assert resolved(["--context", "c", "stats"])[4:] == (False, "/ctx/ca.pem")  # and --context over both
    monkeypatch.setenv("TTLBROKER_CONTEXT", "nope")
    with pytest.raises(ContextError, match='unknown context "nope"'):
        resolved(["stats"])
    assert "warning: the environment overrides this context: $TTLBROKER_SERVER, $TTLBROKER_PASSWORD" in cli.err(
        "context", "info", "c", status=0)


def test_a_context_reaches_the_broker(cli: MainCLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = BrokerThread(tmp_path / "data", **{"server.auth_token": "s3cret"})
    try:
        cli("context", "add", "good", "--server", b.address, "--token", "s3cret", "--select")
        cli("context", "add", "wrong", "--server", b.address, "--token", "nope")
        assert cli.json("stats")[0]["name"] == "ttlbroker"  # the address and the token from the selected context
        refused = cli.err("--context", "wrong", "stats", status=1)
        assert refused.startswith("error: UNAUTHORIZED (8): "), refused
        assert cli.json("--context", "wrong", "stats", "--token", "s3cret")[0]["name"] == "ttlbroker"
        monkeypatch.setenv("TTLBROKER_TOKEN", "nope")  # the environment's token beats the context's
        assert cli.err("stats", status=1) == refused
    finally:
        b.stop()


def test_a_context_that_cannot_be_written(cli: MainCLI, config_home: Path, monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "a-file"))  # a file where the directory would be
    err = cli.err("context", "add", "x", "--server", "h:1", status=2)
    assert err == f"error: INVALID_CONTEXT: cannot write {tmp_path / 'a-file' / 'ttlbroker' / 'context' / 'x.json'}: Not a directory\n"
