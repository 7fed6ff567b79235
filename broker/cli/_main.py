"""The ``ttlbroker`` command: start a broker, and drive one.

``ttlbroker serve`` runs a broker in the foreground and prints ``listening on
HOST:PORT`` once it accepts connections, then ``monitoring on http://HOST:PORT``
(unless ``--http-port 0``) and ``nats on nats://HOST:PORT`` (unless ``--no-nats``);
when it cannot start it prints one line saying why and what to do, and exits 2
(``broker.server.StartupError``). ``check`` and ``repair`` look after a stopped
broker's data directory. Every other command talks to a running broker
(``_run.py``, ``_commands.py`` and the modules next to them): the global options ``--server``,
``--token``, ``--json``, ``--context`` and ``--tls*`` go before or after the command, and take their
defaults from ``$TTLBROKER_SERVER``, ``$TTLBROKER_TOKEN``, ``$TTLBROKER_TLS_CA``, ..., then
from the context (``context`` manages them, ``_contexts.py``).
With ``--json`` results are JSON (lists and messages as JSON Lines, one object each).
``analyze``, ``compact`` and ``load`` are ``spark_export``'s jobs, with its arguments.
``ttlbroker completion bash|zsh`` prints a shell completion script.

Errors go to stderr as one line that names them, ``error: NAME (CODE): message`` for
the broker's, ``error: NAME: message`` for the CLI's own, and the exit status is 1 (2
when the command cannot run or reach the broker, 130 on Ctrl-C): ``_exits.py``. A
closed stdout (``| head``) ends a command with no word and status 141.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from ._args import Parser, global_options
from ._exits import BROKEN_PIPE_STATUS, CliError, error_line, fail, named, say
from ._parser import SPARK_COMMANDS, add_client_commands, add_spark_commands, completion_script, run_spark_command

__all__ = ["main", "build_parser"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ttlbroker")
    except PackageNotFoundError:  # run from a checkout that is not installed
        from broker.core import VERSION

        return VERSION


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(  # its commands' parsers are Parsers too (see Parser)
        prog="ttlbroker", description="ttlbroker: run and drive a message broker",
        parents=[global_options(defaults=True)],
        epilog="The global options go before or after the command. Durations: 30 (seconds), 90s, 500ms, 1h30m. "
        "Errors are one line on stderr, error: NAME (CODE): message, or error: NAME: message for the CLI's own; "
        "exit status 0 done, 1 refused, 2 cannot run or reach the broker, 130 Ctrl-C, 141 stdout closed.",
    )
    parser.add_argument("--version", action="version", version=f"ttlbroker {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run a broker in the foreground")
    p.add_argument("--config", metavar="FILE", help="TOML config (default: the embedded defaults)")
    p.add_argument("--data", metavar="DIR", help="data directory (overrides [system] path; default: ./ttlbroker-data)")
    p.add_argument("--host", help="listen address (overrides [server] host; default: 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port, 0 = any free one (overrides [server] port; default: 8090)")
    p.add_argument("--fsync", help="always | never | an interval like 200ms (overrides [system.partition] fsync; "
                   "default: always)")
    p.add_argument("--export-dir", metavar="DIR",
                   help="export sealed segments to Parquet here (overrides [export] dir; default: no export)")
    p.add_argument(
        "--http-port", type=int, metavar="PORT",
        help="monitoring port for /metrics, /healthz and nats-server's /varz, /connz, /subsz, /jsz; 0 = off, -1 = any free one (overrides [http] port; "
        "default: 8091, or -1 with --port 0)",
    )
    p.add_argument(
        "--nats-port", type=int, metavar="PORT",
        help="port of the NATS listener, 0 = any free one (overrides [nats] port; default: 4222, or 0 with --port 0)",
    )
    p.add_argument("--no-nats", action="store_true", help="no NATS listener (overrides [nats] enabled)")
    p.add_argument("--tls-cert", metavar="FILE",
                   help="serve TLS with this PEM certificate chain (overrides [server] tls_cert; needs --tls-key; "
                   "default: no TLS)")
    p.add_argument("--tls-key", metavar="FILE",
                   help="the certificate's PEM private key, unencrypted (overrides [server] tls_key; default: none)")
    p.add_argument("--tls-ca", metavar="FILE",
                   help="require client certificates signed by a CA in this PEM file (overrides [server] tls_ca; "
                   "default: none required)")
    p.add_argument("--print-config", action="store_true", help="print the embedded default config and exit")

    for name, text in (
        ("check", "verify every file of a stopped broker's data directory; exit 0 clean, 1 damage found"),
        ("repair", "recover a stopped broker's data directory, applying the documented fixes"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--data", metavar="DIR", help="data directory (default: [system] path of --config)")
        p.add_argument("--config", metavar="FILE",
                       help="TOML config to take the data and export directories from (default: the embedded defaults)")
        p.add_argument("--export-dir", metavar="DIR",
                       help="also check the Parquet export's manifest there (default: [export] dir of --config)")

    add_client_commands(sub)
    add_spark_commands(sub)
    return parser


# -- entry point ------------------------------------------------------------------------


#: ``serve`` options and the config keys they override.
_SERVE_OVERRIDES = (
    ("data", "system.path"), ("host", "server.host"), ("port", "server.port"), ("http_port", "http.port"),
    ("nats_port", "nats.port"),
    ("fsync", "system.partition.fsync"), ("export_dir", "export.dir"),
    ("tls_cert", "server.tls_cert"), ("tls_key", "server.tls_key"), ("tls_ca", "server.tls_ca"),
)


def _serve(args: argparse.Namespace) -> int:
    from broker.config import ANY_PORT, DEFAULT_CONFIG_TOML, ConfigError, load_config
    from broker.core import configure_logging
    from broker.server import StartupError, run_server

    if args.print_config:
        print(DEFAULT_CONFIG_TOML(), end="")
        return 0
    try:
        cfg = load_config(args.config)
        changes: dict[str, object] = {
            key: getattr(args, name) for name, key in _SERVE_OVERRIDES if getattr(args, name) not in (None, "")
        }
        if args.http_port is None and args.port == 0:
            changes["http.port"] = ANY_PORT  # a throwaway broker: do not take the fixed monitoring port
        if args.nats_port is None and args.port == 0:
            changes["nats.port"] = 0  # nor the fixed NATS port
        if args.no_nats:
            changes["nats.enabled"] = False
        if changes:
            cfg = cfg.replace(**changes)
    except ConfigError as exc:
        return fail(CliError.INVALID_CONFIG, str(exc)).status
    configure_logging(cfg.logging.level, cfg.logging.format)
    try:
        trio.run(run_server, cfg)
    except StartupError as exc:
        say(named(CliError.CANNOT_START, exc.message))
        return CliError.CANNOT_START.status
    return 0


def _check(args: argparse.Namespace) -> int:
    """``ttlbroker check`` / ``repair``: ``storage.check_data_dir`` over the data
    directory, and the export's manifest when there is an export directory."""
    from storage import Damage, StorageFailure, check_data_dir

    from broker.config import ConfigError, load_config

    repair = args.command == "repair"
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        return fail(CliError.INVALID_CONFIG, str(exc)).status
    root = args.data or cfg.system.path
    export_dir = args.export_dir or cfg.export.dir

    def show(d: Damage) -> None:
        print("damage " + d.line(), flush=True)

    try:
        summary = check_data_dir(root, show, repair=repair)
    except StorageFailure as exc:
        say(error_line(exc))
        return 2 if "not a directory" in exc.message or "in use" in exc.message else 1
    found = len(summary.damage)
    if export_dir:
        from spark_export import Manifest, ManifestUnreadable

        manifest_damage: list[Damage] = []

        def record(d: Damage) -> None:
            manifest_damage.append(d)
            show(d)

        try:
            Manifest.load(export_dir, record, readonly=True)
        except ManifestUnreadable as exc:
            print(f"damage export_manifest: {exc.message}")
        found += len(manifest_damage)
    for path, dest in summary.moved:
        print(f"moved {path} to {dest}")
    for path, first, last in summary.written_off:
        rng = f"offset {first}" if first == last else f"offsets {first}..{last}"
        print(f"written off {path}: {rng} could not be read and are lost for good (the segment's files are kept in quarantine/)")
    for path, offset, subject, previous in summary.newest_damaged:
        print(_newest_damaged_line(path, offset, subject, previous, repair))
    what = "repaired" if repair else "checked"
    print(
        f"{what} {root}: {summary.topics} topic(s), {summary.partitions} partition(s), {summary.segments} segment(s), "
        f"{summary.records} live record(s) verified; "
        + (f"{found} piece(s) of damage" + (" handled as listed" if repair else " found (`ttlbroker repair` applies the fixes)")
           if found else "no damage found")
    )
    return 0 if repair or not found else 1


def _newest_damaged_line(path: str, offset: int, subject: bytes | None, previous: int, repaired: bool) -> str:
    """What ``check`` (or ``repair``, ``repaired``) says of a damaged record that is,
    or may be, its subject's newest: what a reader gets now, and what after the
    repair (``docs/operations.md``, "Files and what protects them";
    ``docs/semantics.md`` §3.4)."""
    if subject is None:
        head = (f"newest damaged: offset {offset} in {path} cannot be read, nor its subject: it may be the newest "
                "record of any subject of its partition whose newest readable record is older")
        if repaired:
            return f"{head}; written off, each such subject now reads as its newest readable record"
        return (f"{head}, so reads of such a subject's last message (a KV get of such a key) fail with "
                "CORRUPTED_RECORD (4001), never answering an older one; `ttlbroker repair` writes it off, after which "
                "each such subject reads as its newest readable record")
    name = subject.decode(errors="replace")
    parts = name.split(".", 2)
    if parts[0] == "$KV" and len(parts) == 3:
        name = f"{name!r} (key {parts[2]!r} of KV bucket {parts[1]!r})"
    else:
        name = repr(name)
    after = f"its previous record, offset {previous}" if previous else "absent (no older record of it is left)"
    head = f"newest damaged: offset {offset} in {path} is the newest record of subject {name}"
    if repaired:
        return f"{head}; written off, the subject now reads as {after}"
    return (f"{head}: reads of its last message fail with CORRUPTED_RECORD (4001), never answering an older one; "
            f"`ttlbroker repair` writes it off, after which the subject reads as {after}")


def main(argv: list[str] | None = None, *, spark: Any = None) -> int:
    """Run one ``ttlbroker`` command; returns its exit status. ``spark``: a
    SparkSession for ``analyze`` and ``compact`` to run on (left running) instead of
    starting one."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = _command(parser, args, spark)
        sys.stdout.flush()  # here, not at exit: a reader gone away shows now (below)
        return status
    except BaseException as exc:
        if _only(exc, KeyboardInterrupt):
            return 130
        if _only(exc, BrokenPipeError):
            return _stdout_gone()
        raise


def _command(parser: argparse.ArgumentParser, args: argparse.Namespace, spark: Any) -> int:
    if args.command == "serve":
        return _serve(args)
    if args.command in ("check", "repair"):
        return _check(args)
    if args.command == "completion":
        print(completion_script(parser, args.shell), end="")
        return 0
    if args.command in SPARK_COMMANDS:
        return run_spark_command(args, spark)
    if args.command == "context":  # files of this machine: no broker, no event loop
        from ._contexts import cmd_context

        return cmd_context(args)
    from ._run import run_client  # the command modules: serve, check and repair need none of them

    return trio.run(run_client, args)


def _only(exc: BaseException, kind: type[BaseException]) -> bool:
    """``exc`` is a ``kind``, or a group (trio's nurseries make them) of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only(e, kind) for e in exc.exceptions)
    return isinstance(exc, kind)


def _stdout_gone() -> int:
    """stdout's reader went away (``ttlbroker fetch ... | head``): no word, and the
    status of a Unix tool ended by SIGPIPE. What is still buffered for stdout can go
    nowhere: the process's stdout is dropped, so that Python's flush at exit does not
    fail again and complain ("Exception ignored ... BrokenPipeError", status 120; the
    Python docs' "Note on SIGPIPE" points the descriptor at /dev/null for the same
    end)."""
    if sys.stdout is sys.__stdout__:  # not a caller's own stdout (a test's capture)
        sys.stdout = None  # Python skips a None stdout at exit
    return BROKEN_PIPE_STATUS


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
