"""The arguments of the ``ttlbroker`` client commands, and ``ttlbroker completion``.

``_main.py`` builds the main parser (and ``serve``, ``check``, ``repair``) and
calls :func:`add_client_commands`. Every client command, and every group of them
(``stream``, ``topic``, ...), takes the global options too (``_args.py``).
"""

from __future__ import annotations

import argparse
from typing import TypeAlias

from ._args import durations, global_options, seconds, start_offset, start_time, ttl_value, whole_seconds
from broker.client import RECONNECT_ATTEMPTS

__all__ = ["add_client_commands", "completion_script", "SHELLS"]

#: The shells ``ttlbroker completion`` writes a script for.
SHELLS = ("bash", "zsh")

#: What ``add_subparsers`` returns: the commands (or actions) of a parser.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _topic_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expiry", type=whole_seconds, metavar="DURATION",
                   help="max age of a message, e.g. 3600, 90s, 1h30m (0 = none; default: the broker's)")
    p.add_argument("--subjects", nargs="+", metavar="FILTER", help="subject filters the topic captures")
    p.add_argument("--max-msgs-per-subject", type=int, metavar="N", help="keep at most N messages per subject (0 = unlimited)")
    p.add_argument("--deny-purge", action="store_true", help="refuse purges and deletes")
    p.add_argument("--max-msgs", type=int, metavar="N", help="keep at most N messages per partition (0 = unlimited)")
    p.add_argument("--max-bytes", type=int, metavar="BYTES", help="keep at most BYTES of records per partition (0 = unlimited)")
    p.add_argument("--max-msg-size", type=int, metavar="BYTES", help="refuse messages whose headers and payload exceed BYTES (0 = unlimited)")
    p.add_argument("--max-consumers", type=int, metavar="N", help="allow at most N consumers on the topic (0 = unlimited)")
    p.add_argument("--discard", choices=("old", "new"), help="at max msgs or max bytes: remove the oldest (old) or refuse the new (new)")
    p.add_argument(
        "--discard-new-per-subject", action="store_true",
        help="with --discard new and --max-msgs-per-subject: refuse a message on a subject at its limit",
    )
    p.add_argument("--segment-size", type=int, metavar="BYTES", help="seal segments at this size")
    p.add_argument(
        "--storage", choices=("file", "memory"),
        help="where messages live: file (default) or memory (gone after a restart; cannot change by update)",
    )
    p.add_argument("--allow-msg-ttl", action="store_true", help="accept per-message TTLs (once on, never off)")
    p.add_argument(
        "--marker-ttl", type=whole_seconds, metavar="DURATION",
        help="leave a subject delete marker living this long when a subject's last message goes (0 = off)",
    )
    p.add_argument("--allow-rollup", action="store_true", help="honour Nats-Rollup headers (sub, all)")
    p.add_argument(
        "--allow-msg-schedules", action="store_true",
        help="accept message schedules (Nats-Schedule, NATS ADR-51; turns on rollups; once on, never off)",
    )
    p.add_argument(
        "--duplicate-window", type=whole_seconds, metavar="DURATION",
        help="remember Nats-Msg-Id this long to store each id once (default 2m, at most the max age; 0 = off)",
    )
    p.add_argument("--pedantic", action="store_true", help="refuse instead of fixing the configuration automatically")
    p.add_argument("--republish-dest", metavar="TEMPLATE", help="republish stored messages on this subject transform (ADR-28/30)")
    p.add_argument("--republish-src", metavar="FILTER", help="only messages matching this filter (default '>')")
    p.add_argument("--republish-headers-only", action="store_true", help="republish headers only (Nats-Msg-Size gives the size)")
    p.add_argument("--no-republish", action="store_true", help="update: remove the republish rule")


def _reconnect_options(p: argparse.ArgumentParser, again: str) -> None:
    p.add_argument(
        "--reconnect", action="store_true",
        help=f"when the connection is lost, reconnect and {again} (one line on stderr for each disconnect and reconnect)",
    )
    p.add_argument(
        "--max-reconnects", type=int, default=RECONNECT_ATTEMPTS, metavar="N",
        help=f"with --reconnect: give up after N failed attempts in a row (default {RECONNECT_ATTEMPTS}; -1 = never)",
    )


def add_client_commands(sub: Subparsers) -> None:
    """Add the client commands to the main parser's subparsers ``sub``."""
    g = [global_options(defaults=False)]

    def group(name: str, helptext: str) -> Subparsers:
        return sub.add_parser(name, parents=g, help=helptext, description=helptext).add_subparsers(
            dest="action", required=True, metavar="ACTION",
        )

    _stream_commands(group("stream", "create, list or delete streams"), g)
    _topic_commands(group("topic", "create, update, list, show or delete topics"), g)
    _message_commands(sub, g)
    _broker_commands(sub, g)
    _removal_commands(sub, g)
    _offset_commands(group("offset", "named consumer offsets"), g)
    _consumer_commands(group("consumer", "durable consumers: add, info, list, rm, next, sub"), g)
    _kv_commands(group("kv", "KV buckets with per-key TTLs that reads can refresh"), g)

    p = sub.add_parser(
        "completion", help="print a shell completion script (bash or zsh)",
        description="Print a completion script for the shell. bash: source <(ttlbroker completion bash); "
        "zsh: ttlbroker completion zsh > \"${fpath[1]}/_ttlbroker\"",
    )
    p.add_argument("shell", choices=SHELLS)


def _stream_commands(ss: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    q = ss.add_parser("create", parents=g, help="create a stream")
    q.add_argument("name")
    q.add_argument("--id", type=int, help="stream id (default: the next free one)")
    ss.add_parser("list", parents=g, help="the streams, as a table")
    q = ss.add_parser("delete", parents=g, help="delete a stream and its topics")
    q.add_argument("stream")


def _topic_commands(ts: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    q = ts.add_parser("create", parents=g, help="create a topic")
    q.add_argument("stream")
    q.add_argument("name")
    q.add_argument("--partitions", type=int, default=1)
    q.add_argument("--id", type=int, help="topic id (default: the next free one)")
    _topic_options(q)
    q = ts.add_parser("update", parents=g, help="change a topic's options")
    q.add_argument("stream")
    q.add_argument("topic")
    _topic_options(q)
    q = ts.add_parser("list", parents=g, help="the topics of a stream, as a table")
    q.add_argument("stream")
    for action, helptext in (("info", "a topic's options, state and partitions"), ("delete", "delete a topic")):
        q = ts.add_parser(action, parents=g, help=helptext)
        q.add_argument("stream")
        q.add_argument("topic")


def _message_commands(sub: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``pub``, ``fetch``, ``last`` and ``sub``."""
    p = sub.add_parser("pub", parents=g, help="publish a message (DATA from stdin when absent)")
    p.add_argument("subject")
    p.add_argument("data", nargs="?")
    p.add_argument("--header", action="append", metavar="K=V", help="a header (repeatable)")
    p.add_argument("--count", type=int, default=1,
                   help="publish the message N times, in pipelined batches (progress on a terminal; Ctrl-C stops)")
    p.add_argument("--ttl", type=ttl_value, metavar="DURATION",
                   help="per-message TTL, sent as the Nats-TTL header: 30, 90s, 1h30m or never")

    p = sub.add_parser("fetch", parents=g, help="read messages of a partition")
    p.add_argument("stream")
    p.add_argument("topic")
    p.add_argument("--partition", type=int, default=0)
    p.add_argument("--offset", type=int, default=1)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--subject", help="only messages on subjects matching this filter")

    p = sub.add_parser("last", parents=g, help="the newest message on a subject")
    p.add_argument("stream")
    p.add_argument("topic")
    p.add_argument("subject")

    p = sub.add_parser(
        "sub", parents=g, help="print messages published on matching subjects",
        description="Print messages published on matching subjects. A lost connection ends it with one line on "
        "stderr saying why and exit status 2, unless --reconnect is given.",
    )
    p.add_argument("filter")
    p.add_argument("--count", type=int, default=0, help="exit after N messages (0 = run until interrupted)")
    _reconnect_options(p, "subscribe again; messages published meanwhile are not delivered")


def _broker_commands(sub: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``stats`` and ``export``."""
    sub.add_parser("stats", parents=g, help="the broker's counters, grouped")
    p = sub.add_parser("export", parents=g, help="export sealed segments to Parquet now (the broker's --export-dir)")
    p.add_argument("--seal", action="store_true", help="seal the active segments first, so that everything stored is exported")


def _removal_commands(sub: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``delete`` (one message) and ``purge``."""
    p = sub.add_parser("delete", parents=g, help="delete one message")
    p.add_argument("stream")
    p.add_argument("topic")
    p.add_argument("--partition", type=int, required=True)
    p.add_argument("--offset", type=int, required=True)

    p = sub.add_parser("purge", parents=g, help="purge a topic, or the subjects matching --subject")
    p.add_argument("stream")
    p.add_argument("topic")
    p.add_argument("--subject")


def _offset_commands(os_: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    for action in ("get", "set", "delete"):
        q = os_.add_parser(action, parents=g, help=f"{action} a consumer's offset")
        q.add_argument("stream")
        q.add_argument("topic")
        q.add_argument("consumer")
        q.add_argument("--partition", type=int, default=0)
        if action == "set":
            q.add_argument("offset", type=int)


def _consumer_commands(cs: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    q = cs.add_parser("add", parents=g, help="create a durable consumer (the same again is a no-op)")
    q.add_argument("stream")
    q.add_argument("topic")
    q.add_argument("name")
    q.add_argument("--filter", action="append", metavar="SUBJECT", help="a subject filter (repeatable; default: all)")
    q.add_argument("--deliver", choices=["all", "new", "last", "last_per_subject", "by_start_offset", "by_start_time"],
                   help="where it starts (default all)")
    q.add_argument("--start-offset", type=start_offset, metavar="N|P:N,...", help="with by_start_offset")
    q.add_argument("--start-time", type=start_time, metavar="ISO8601", help="with by_start_time")
    q.add_argument("--ack", choices=["explicit", "none", "all"], help="ack policy (default explicit)")
    q.add_argument("--ack-wait", type=seconds, metavar="DURATION", help="redeliver unacked after this (default 30s)")
    q.add_argument("--max-deliver", type=int, metavar="N", help="give a message up after N deliveries (-1 = never)")
    q.add_argument("--backoff", type=durations, metavar="D,D,...", help="redelivery delays by delivery count (1s,5s,1m)")
    q.add_argument("--max-ack-pending", type=int, metavar="N", help="at most N unacked deliveries (-1 = unlimited)")
    q.add_argument("--max-waiting", type=int, metavar="N", help="at most N waiting pulls")
    q.add_argument("--partitioned", action="store_true", help="each partition owned by one member of its group")
    q.add_argument("--member-timeout", type=seconds, metavar="DURATION", help="partitioned: a silent member leaves after this")
    q.add_argument("--description")
    q.add_argument("--dead-letter", dest="dead_letter_subject", metavar="SUBJECT",
                   help="publish a copy of each message given up (max deliver) or terminated on SUBJECT")
    for action, helptext in (("info", "a consumer's configuration and state"), ("rm", "delete a consumer and its state")):
        q = cs.add_parser(action, parents=g, help=helptext)
        q.add_argument("stream")
        q.add_argument("topic")
        q.add_argument("name")
    q = cs.add_parser("list", parents=g, help="the consumers of a topic, as a table")
    q.add_argument("stream")
    q.add_argument("topic")
    q = cs.add_parser("redrive", parents=g, help="publish a dead-letter topic's new copies again on their original subjects")
    q.add_argument("stream")
    q.add_argument("topic")
    q.add_argument("--dry-run", action="store_true", help="count what would go; publish and mark nothing")
    q = cs.add_parser("next", parents=g, help="pull, print and ack messages")
    q.add_argument("stream")
    q.add_argument("topic")
    q.add_argument("name")
    q.add_argument("--count", type=int, default=1, help="how many (default 1)")
    q.add_argument("--no-ack", action="store_true", help="do not ack (they come again after the ack wait)")
    q.add_argument("--wait", type=seconds, default=5.0, metavar="DURATION", help="how long to wait for them (default 5s)")
    q = cs.add_parser(
        "sub", parents=g, help="print and ack messages as they come, until interrupted",
        description="Print and ack a consumer's messages as they come. A lost connection ends it with one line on "
        "stderr saying why and exit status 2, unless --reconnect is given.",
    )
    q.add_argument("stream")
    q.add_argument("topic")
    q.add_argument("name")
    q.add_argument("--member", help="join the (partitioned) consumer's group under this name")
    q.add_argument("--batch", type=int, default=500, help="messages per pull (default 500)")
    q.add_argument("--count", type=int, default=0, help="exit after N messages (0 = run until interrupted)")
    _reconnect_options(q, "pull again; unacked messages may come again")


def _kv_commands(kv: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    q = kv.add_parser("add", parents=g, help="create a bucket")
    q.add_argument("bucket")
    q.add_argument("--history", type=int, default=1, help="revisions kept per key (default 1)")
    q.add_argument("--ttl", type=whole_seconds, default=0, metavar="DURATION", help="default TTL of a key, e.g. 1h (0 = none)")
    q.add_argument("--refresh", choices=["on_write", "on_read_and_write"], default="on_write")
    q.add_argument("--visibility", choices=["never_return_expired", "return_expired_if_not_cleaned_up"],
                   default="never_return_expired")
    q.add_argument("--marker-ttl", type=whole_seconds, default=60, metavar="DURATION",
                   help="how long the marker an expired key leaves stays (default 1m)")
    kv.add_parser("ls", parents=g, help="the buckets, as a table")
    for action, helptext in (("put", "store a value"), ("create", "store a value only if the key holds none"),
                             ("update", "compare-and-set on the key's revision")):
        q = kv.add_parser(action, parents=g, help=helptext)
        q.add_argument("bucket")
        q.add_argument("key")
        q.add_argument("value", nargs="?", help="(stdin when absent)")
        if action == "update":
            q.add_argument("--revision", type=int, required=True, help="the revision the key must be at")
        q.add_argument("--ttl", type=ttl_value, metavar="DURATION", help="the key's TTL: 30, 90s, 1h30m or never")
    for action, helptext in (("get", "the value of a key"), ("delete", "delete a key (a DEL tombstone)"),
                             ("purge", "purge a key and its history"), ("history", "every stored revision of a key"),
                             ("touch", "restart a key's TTL without a new revision")):
        q = kv.add_parser(action, parents=g, help=helptext)
        q.add_argument("bucket")
        q.add_argument("key")
        if action == "get":
            q.add_argument("--revision", type=int, default=0)
    q = kv.add_parser("keys", parents=g, help="keys that hold a value")
    q.add_argument("bucket")
    q.add_argument("pattern", nargs="?", default=">")
    q = kv.add_parser("watch", parents=g, help="print puts, deletes, purges and expirations")
    q.add_argument("bucket")
    q.add_argument("keys", nargs="?", default=">")
    q.add_argument("--count", type=int, default=0, help="exit after N events (0 = until interrupted)")
    q.add_argument("--current", action="store_true", help="start with the current values")
    q = kv.add_parser("info", parents=g, help="a bucket's settings and state")
    q.add_argument("bucket")


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell``, read by shtab from the whole parser; the
    options that take a file or a directory complete file or directory names."""
    import shtab

    kinds = {"tls_ca": shtab.FILE, "tls_cert": shtab.FILE, "tls_key": shtab.FILE, "config": shtab.FILE,
             "data": shtab.DIRECTORY, "export_dir": shtab.DIRECTORY}

    def mark(p: argparse.ArgumentParser) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    mark(child)
            elif action.option_strings and action.dest in kinds:
                action.complete = kinds[action.dest]  # type: ignore[attr-defined]  # argcomplete's hook: an attribute argparse does not declare

    mark(parser)
    return shtab.complete(parser, shell=shell)
