"""The arguments of the ``ttlbroker`` client commands, of the Spark jobs
(``analyze``, ``compact``, ``load``) and of ``ttlbroker completion``.

``_main.py`` builds the main parser (and ``serve``, ``check``, ``repair``) and
calls :func:`add_client_commands` and :func:`add_spark_commands`. Every client
command, and every group of them (``stream``, ``topic``, ...), takes the global
options too (``_args.py``). Every argument has a help text that says its default (a
test walks the whole parser).
"""

from __future__ import annotations

import argparse
from typing import Any, TypeAlias

from ._args import durations, global_options, seconds, start_offset, start_time, ttl_value, whole_seconds
from ._bench import add_bench_commands
from ._confirm import force_option
from ._exits import CliError, named, say
from ._request import add_request_commands
from ._server import add_server_commands
from broker.client import RECONNECT_ATTEMPTS

__all__ = ["add_client_commands", "add_spark_commands", "run_spark_command", "completion_script", "SHELLS", "SPARK_COMMANDS"]

#: The shells ``ttlbroker completion`` writes a script for.
SHELLS = ("bash", "zsh")

#: What ``add_subparsers`` returns: the commands (or actions) of a parser.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

#: The help of the arguments many commands take.
_STREAM = "the stream, by name or id"
_TOPIC = "the topic, by name or id"
_BUCKET = "the KV bucket's name"
_KEY = "the key (letters, digits and -/_=., dots between tokens)"


def _topic_options(p: argparse.ArgumentParser, updating: bool) -> None:
    """The options of ``topic create`` and ``topic update``; on an update, one not
    given leaves its setting as it is."""

    def default(text: str) -> str:
        return "default: unchanged" if updating else f"default: {text}"

    p.add_argument("--expiry", type=whole_seconds, metavar="DURATION",
                   help=f"max age of a message, e.g. 3600, 90s, 1h30m (0 = none; {default('[system.segment] message_expiry')})")
    p.add_argument("--subjects", nargs="+", metavar="FILTER",
                   help=f"subject filters the topic captures ({default('STREAM.TOPIC.>')})")
    p.add_argument("--max-msgs-per-subject", type=int, metavar="N",
                   help=f"keep at most N messages per subject (0 = unlimited; {default('0')})")
    p.add_argument("--deny-purge", action="store_true", help="refuse purges and deletes (cannot be turned off)")
    p.add_argument("--max-msgs", type=int, metavar="N",
                   help=f"keep at most N messages per partition (0 = unlimited; {default('0')})")
    p.add_argument("--max-bytes", type=int, metavar="BYTES",
                   help=f"keep at most BYTES of records per partition (0 = unlimited; {default('0')})")
    p.add_argument("--max-msg-size", type=int, metavar="BYTES",
                   help=f"refuse messages whose headers and payload exceed BYTES (0 = unlimited; {default('0')})")
    p.add_argument("--max-consumers", type=int, metavar="N",
                   help=f"allow at most N consumers on the topic (0 = unlimited; {default('0')})")
    p.add_argument("--discard", choices=("old", "new"),
                   help=f"at max msgs or max bytes: remove the oldest (old) or refuse the new (new) ({default('old')})")
    p.add_argument(
        "--discard-new-per-subject", action="store_true",
        help="with --discard new and --max-msgs-per-subject: refuse a message on a subject at its limit",
    )
    p.add_argument("--segment-size", type=int, metavar="BYTES",
                   help=f"seal segments at this size ({default('[system.segment] size_bytes')})")
    p.add_argument(
        "--storage", choices=("file", "memory"),
        help="where messages live: file or memory (gone after a restart; cannot change by update) (default: file)",
    )
    p.add_argument("--allow-msg-ttl", action="store_true", help="accept per-message TTLs (once on, never off)")
    p.add_argument(
        "--marker-ttl", type=whole_seconds, metavar="DURATION",
        help=f"leave a subject delete marker living this long when a subject's last message goes (0 = off; {default('0')})",
    )
    p.add_argument("--allow-rollup", action="store_true", help="honour Nats-Rollup headers (sub, all)")
    p.add_argument(
        "--allow-msg-schedules", action="store_true",
        help="accept message schedules (Nats-Schedule, NATS ADR-51; turns on rollups; once on, never off)",
    )
    p.add_argument(
        "--duplicate-window", type=whole_seconds, metavar="DURATION",
        help=f"remember Nats-Msg-Id this long to store each id once (at most the max age; 0 = off; {default('2m')})",
    )
    p.add_argument("--pedantic", action="store_true", help="refuse instead of fixing the configuration automatically")
    p.add_argument("--republish-dest", metavar="TEMPLATE",
                   help=f"republish stored messages on this subject transform (ADR-28/30; {default('none')})")
    p.add_argument("--republish-src", metavar="FILTER",
                   help="with --republish-dest: only messages matching this filter (default: >)")
    p.add_argument("--republish-headers-only", action="store_true",
                   help="with --republish-dest: republish headers only (Nats-Msg-Size gives the size)")
    p.add_argument("--no-republish", action="store_true", help="update: remove the republish rule")


def _reconnect_options(p: argparse.ArgumentParser, again: str) -> None:
    p.add_argument(
        "--reconnect", action="store_true",
        help=f"when the connection is lost, reconnect and {again} (one line on stderr for each disconnect and reconnect)",
    )
    p.add_argument(
        "--max-reconnects", type=int, default=RECONNECT_ATTEMPTS, metavar="N",
        help="with --reconnect: give up after N failed attempts in a row (-1 = never)",
    )


def add_client_commands(sub: Subparsers) -> None:
    """Add the client commands to the main parser's subparsers ``sub``."""
    g = [global_options(defaults=False)]

    def group(name: str, helptext: str) -> Subparsers:
        return sub.add_parser(name, parents=g, help=helptext, description=helptext).add_subparsers(
            dest="action", required=True, metavar="ACTION",
        )

    _stream_commands(group("stream", "create, list, report on or delete streams"), g)
    _topic_commands(group("topic", "create, update, list, show or delete topics"), g)
    _message_commands(sub, g)
    _broker_commands(sub, g)
    _removal_commands(sub, g)
    _offset_commands(group("offset", "named consumer offsets"), g)
    _consumer_commands(group("consumer", "durable consumers: add, edit, info, list, report, rm, next, sub"), g)
    _kv_commands(group("kv", "KV buckets with per-key TTLs that reads can refresh"), g)
    _context_commands(group("context", "named sets of connection options (natscli's contexts), kept on this machine"), g)
    add_request_commands(sub, g)
    add_server_commands(sub, g)
    add_bench_commands(sub, g)

    p = sub.add_parser(
        "completion", help="print a shell completion script (bash or zsh)",
        description="Print a completion script for the shell. bash: source <(ttlbroker completion bash); "
        "zsh: ttlbroker completion zsh > \"${fpath[1]}/_ttlbroker\"",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to write the script for")


def _stream_commands(ss: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    q = ss.add_parser("create", parents=g, help="create a stream")
    q.add_argument("name", help="the stream's name")
    q.add_argument("--id", type=int, help="stream id (default: the next free one)")
    ss.add_parser("list", parents=g, help="the streams, as a table")
    q = ss.add_parser("report", parents=g, help="a row per topic of every stream: storage, consumers, messages, bytes, deleted")
    for short, name, what in (("-o", "consumers", "consumers"), ("-m", "messages", "messages"),
                              ("-n", "name", "stream and topic name"), ("-t", "storage", "storage")):
        q.add_argument(short, f"--{name}", dest=f"sort_{name}", action="store_true", help=f"sort by {what} (default: by bytes)")
    q.add_argument("-r", "--raw", action="store_true", help="print the numbers unformatted (default: 1,234 and KiB)")
    q = ss.add_parser("rm", aliases=["delete"], parents=g, help="delete a stream and its topics")
    q.add_argument("stream", help=_STREAM)
    force_option(q)


def _topic_commands(ts: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    q = ts.add_parser("create", parents=g, help="create a topic")
    q.add_argument("stream", help=_STREAM)
    q.add_argument("name", help="the topic's name")
    q.add_argument("--partitions", type=int, default=1, metavar="N", help="how many partitions")
    q.add_argument("--id", type=int, help="topic id (default: the next free one)")
    _topic_options(q, updating=False)
    q = ts.add_parser("update", parents=g, help="change a topic's options")
    q.add_argument("stream", help=_STREAM)
    q.add_argument("topic", help=_TOPIC)
    _topic_options(q, updating=True)
    q = ts.add_parser("list", parents=g, help="the topics of a stream, as a table")
    q.add_argument("stream", help=_STREAM)
    for action, helptext in (("info", "a topic's options, state and partitions"), ("rm", "delete a topic")):
        q = ts.add_parser(action, aliases=["delete"] if action == "rm" else [], parents=g, help=helptext)
        q.add_argument("stream", help=_STREAM)
        q.add_argument("topic", help=_TOPIC)
        if action == "rm":
            force_option(q)


def _message_commands(sub: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``pub``, ``fetch``, ``last`` and ``sub``."""
    p = sub.add_parser(
        "pub", parents=g, help="publish a message (DATA from stdin when absent)",
        description="Publish a message. The subject, the data and the header values may use natscli's templates: "
        "{{Count}} (the message's number), {{TimeStamp}} (RFC 3339), {{Unix}}, {{UnixNano}}, {{Time}} (3:04PM), "
        "{{ID}} (a unique id), {{Random MIN MAX}} (a random string), e.g. "
        "ttlbroker pub 'orders.{{Count}}' 'order {{Count}} at {{TimeStamp}}' --count 10",
    )
    p.add_argument("subject", help="the subject to publish on")
    p.add_argument("data", nargs="?", help="the payload (default: stdin, read to its end)")
    p.add_argument("--header", action="append", metavar="K=V", help="a header (repeatable; default: none)")
    p.add_argument("--count", type=int, default=1, metavar="N",
                   help="publish the message N times, in pipelined batches (progress on a terminal; Ctrl-C stops)")
    p.add_argument("--ttl", type=ttl_value, metavar="DURATION",
                   help="per-message TTL, sent as the Nats-TTL header: 30, 90s, 1h30m or never; at least 1s "
                   "(default: the topic's max age)")
    p.add_argument("--sleep", type=seconds, default=0.0, metavar="DURATION",
                   help="with --count: one message at a time, this long apart, e.g. 100ms, 1s (default 0: no pause)")
    p.add_argument("--no-templates", action="store_true",
                   help="send the subject, data and headers as given, {{...}} included (default: templates on)")

    p = sub.add_parser("fetch", parents=g, help="read messages of a partition")
    p.add_argument("stream", help=_STREAM)
    p.add_argument("topic", help=_TOPIC)
    p.add_argument("--partition", type=int, default=0, metavar="P", help="the partition to read")
    p.add_argument("--offset", type=int, default=1, metavar="N", help="the first offset to read")
    p.add_argument("--count", type=int, default=100, metavar="N", help="read at most N messages")
    p.add_argument("--subject", metavar="FILTER", help="only messages on subjects matching this filter (default: all)")

    p = sub.add_parser("last", parents=g, help="the newest message on a subject")
    p.add_argument("stream", help=_STREAM)
    p.add_argument("topic", help=_TOPIC)
    p.add_argument("subject", help="the subject (not a filter)")

    p = sub.add_parser(
        "sub", parents=g, help="print messages published on matching subjects",
        description="Print messages published on matching subjects. A lost connection ends it with one line on "
        "stderr saying why and exit status 2, unless --reconnect is given.",
    )
    p.add_argument("filter", help="a subject filter (* one token, > the rest)")
    p.add_argument("--count", type=int, default=0, metavar="N", help="exit after N messages (0 = run until interrupted)")
    p.add_argument("-r", "--raw", action="store_true",
                   help="print each message's payload alone, ending with a newline (default: a line per message)")
    _reconnect_options(p, "subscribe again; messages published meanwhile are not delivered")


def _broker_commands(sub: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``stats`` and ``export``."""
    sub.add_parser("stats", parents=g, help="the broker's counters, grouped")
    p = sub.add_parser("export", parents=g, help="export sealed segments to Parquet now (the broker's --export-dir)")
    p.add_argument("--seal", action="store_true", help="seal the active segments first, so that everything stored is exported")


def _removal_commands(sub: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``delete`` (one message) and ``purge``."""
    p = sub.add_parser("delete", parents=g, help="delete one message")
    p.add_argument("stream", help=_STREAM)
    p.add_argument("topic", help=_TOPIC)
    p.add_argument("--partition", type=int, required=True, metavar="P", help="the message's partition (required)")
    p.add_argument("--offset", type=int, required=True, metavar="N", help="the message's offset (required)")

    p = sub.add_parser("purge", parents=g, help="purge a topic, or the subjects matching --subject")
    p.add_argument("stream", help=_STREAM)
    p.add_argument("topic", help=_TOPIC)
    p.add_argument("--subject", metavar="FILTER", help="purge only the subjects matching this filter (default: all)")
    force_option(p)


def _offset_commands(os_: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    for action in ("get", "set", "delete"):
        q = os_.add_parser(action, parents=g, help=f"{action} a consumer's offset")
        q.add_argument("stream", help=_STREAM)
        q.add_argument("topic", help=_TOPIC)
        q.add_argument("consumer", help="the consumer's name")
        q.add_argument("--partition", type=int, default=0, metavar="P", help="the partition")
        if action == "set":
            q.add_argument("offset", type=int, help="the offset to store")


def _consumer_options(q: argparse.ArgumentParser, editing: bool) -> None:
    """The configuration options of ``consumer add``, and of ``consumer edit``, where
    an option not given keeps the consumer's value."""

    def default(text: str) -> str:
        return "default: unchanged" if editing else text

    q.add_argument("--filter", action="append", metavar="SUBJECT",
                   help=f"a subject filter (repeatable; {default('default: all')})")
    q.add_argument("--deliver", choices=["all", "new", "last", "last_per_subject", "by_start_offset", "by_start_time"],
                   help=f"where it starts ({default('default all')})")
    q.add_argument("--start-offset", type=start_offset, metavar="N|P:N,...",
                   help=f"with by_start_offset ({default('default: none')})")
    q.add_argument("--start-time", type=start_time, metavar="ISO8601", help=f"with by_start_time ({default('default: none')})")
    q.add_argument("--ack", choices=["explicit", "none", "all"], help=f"ack policy ({default('default explicit')})")
    q.add_argument("--ack-wait", type=seconds, metavar="DURATION", help=f"redeliver unacked after this ({default('default 30s')})")
    q.add_argument("--max-deliver", type=int, metavar="N",
                   help=f"give a message up after N deliveries (-1 = never; {default('default -1')})")
    q.add_argument("--backoff", type=durations, metavar="D,D,...",
                   help=f"redelivery delays by delivery count (1s,5s,1m; {default('default: none')})")
    q.add_argument("--max-ack-pending", type=int, metavar="N",
                   help=f"at most N unacked deliveries (-1 = unlimited; {default('default 1000')})")
    q.add_argument("--max-waiting", type=int, metavar="N", help=f"at most N waiting pulls ({default('default 512')})")
    q.add_argument("--partitioned", action="store_true",
                   help=f"each partition owned by one member of its group ({default('default: shared, any member takes any message')})")
    q.add_argument("--member-timeout", type=seconds, metavar="DURATION",
                   help=f"partitioned: a silent member leaves after this ({default('default 30s')})")
    q.add_argument("--description", help=f"what it is for ({default('default: none')})")
    q.add_argument("--dead-letter", dest="dead_letter_subject", metavar="SUBJECT",
                   help="publish a copy of each message given up (max deliver) or terminated on SUBJECT "
                   f"({default('default: none')})")
    q.add_argument("--dead-letter-expired", action=argparse.BooleanOptionalAction, default=None,
                   help="with --dead-letter: also copy the messages it still owes that a TTL, the max age or a limit "
                   f"removes ({default('default: no')})")


def _consumer_commands(cs: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    q = cs.add_parser("add", parents=g, help="create a durable consumer (the same again is a no-op)")
    q.add_argument("stream", help=_STREAM)
    q.add_argument("topic", help=_TOPIC)
    q.add_argument("name", help="the consumer's name")
    _consumer_options(q, editing=False)
    q = cs.add_parser(
        "edit", parents=g, help="change a consumer's settings, then show the differences and the consumer",
        description="Change a consumer's settings: the options given change, the others stay. The broker refuses "
        "a new deliver policy, start position, ack policy or mode (CONSUMER_UPDATE_DENIED).",
    )
    q.add_argument("stream", help=_STREAM)
    q.add_argument("topic", help=_TOPIC)
    q.add_argument("name", help="the consumer's name")
    _consumer_options(q, editing=True)
    for action, helptext in (("info", "a consumer's configuration and state"), ("rm", "delete a consumer and its state")):
        q = cs.add_parser(action, parents=g, help=helptext)
        q.add_argument("stream", help=_STREAM)
        q.add_argument("topic", help=_TOPIC)
        q.add_argument("name", help="the consumer's name")
        if action == "rm":
            force_option(q)
    q = cs.add_parser("list", parents=g, help="the consumers of a topic, as a table")
    q.add_argument("stream", help=_STREAM)
    q.add_argument("topic", help=_TOPIC)
    q = cs.add_parser("report", parents=g, help="a row per consumer: deliveries, ack pending, redelivered, waiting, unprocessed")
    q.add_argument("stream", help=_STREAM)
    q.add_argument("topic", nargs="?", help="only this topic's consumers (default: those of every topic of the stream)")
    q.add_argument("-r", "--raw", action="store_true", help="print the numbers unformatted (default: 1,234 and shares)")
    q = cs.add_parser("redrive", parents=g, help="publish a dead-letter topic's new copies again on their original subjects")
    q.add_argument("stream", help=_STREAM)
    q.add_argument("topic", help="the dead-letter topic (the one that captures the consumers' dead-letter subjects)")
    q.add_argument("--dry-run", action="store_true", help="count what would go; publish and mark nothing")
    q = cs.add_parser("next", parents=g, help="pull, print and ack messages")
    q.add_argument("stream", help=_STREAM)
    q.add_argument("topic", help=_TOPIC)
    q.add_argument("name", help="the consumer's name")
    q.add_argument("--count", type=int, default=1, metavar="N", help="how many messages")
    q.add_argument("--no-ack", action="store_true", help="do not ack (they come again after the ack wait)")
    q.add_argument("--wait", type=seconds, default=5.0, metavar="DURATION",
                   help="the longest the command waits for them, in all (default: 5s)")
    q = cs.add_parser(
        "sub", parents=g, help="print and ack messages as they come, until interrupted",
        description="Print and ack a consumer's messages as they come. A lost connection ends it with one line on "
        "stderr saying why and exit status 2, unless --reconnect is given.",
    )
    q.add_argument("stream", help=_STREAM)
    q.add_argument("topic", help=_TOPIC)
    q.add_argument("name", help="the consumer's name")
    q.add_argument("--member", help="join the (partitioned) consumer's group under this name (default: no group)")
    q.add_argument("--batch", type=int, default=500, metavar="N", help="messages per pull")
    q.add_argument("--count", type=int, default=0, metavar="N", help="exit after N messages (0 = run until interrupted)")
    _reconnect_options(q, "pull again; unacked messages may come again")


def _kv_commands(kv: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    q = kv.add_parser("add", parents=g, help="create a bucket")
    q.add_argument("bucket", help=_BUCKET)
    q.add_argument("--history", type=int, default=1, metavar="N", help="revisions kept per key")
    q.add_argument("--ttl", type=whole_seconds, default=0, metavar="DURATION",
                   help="the TTL of a key whose write gives none, e.g. 1h (0 = none)")
    q.add_argument("--refresh", choices=["on_write", "on_read_and_write"], default="on_write",
                   help="what restarts a key's TTL: a write, or a read too")
    q.add_argument("--visibility", choices=["never_return_expired", "return_expired_if_not_cleaned_up"],
                   default="never_return_expired", help="whether a read may see a key whose TTL ran out before it is removed")
    q.add_argument("--marker-ttl", type=whole_seconds, default=60, metavar="DURATION",
                   help="how long the marker an expired key leaves stays (in seconds)")
    kv.add_parser("ls", parents=g, help="the buckets, as a table")
    for action, helptext in (("put", "store a value"), ("create", "store a value only if the key holds none"),
                             ("update", "compare-and-set on the key's revision")):
        q = kv.add_parser(action, parents=g, help=helptext)
        q.add_argument("bucket", help=_BUCKET)
        q.add_argument("key", help=_KEY)
        q.add_argument("value", nargs="?", help="the value (default: stdin, read to its end)")
        if action == "update":
            q.add_argument("--revision", type=int, required=True, metavar="N",
                           help="the revision the key must be at (required)")
        q.add_argument("--ttl", type=ttl_value, metavar="DURATION",
                       help="the key's TTL: 30, 90s, 1h30m or never; at least 1s (default: the bucket's)")
    q = kv.add_parser("rm", parents=g, help="remove a bucket and all its keys, or delete one key (as kv delete)")
    q.add_argument("bucket", help=_BUCKET)
    q.add_argument("key", nargs="?", help="delete this key only (default: remove the whole bucket)")
    force_option(q)
    for action, helptext in (("get", "the value of a key"), ("delete", "delete a key (a DEL tombstone)"),
                             ("purge", "purge a key and its history"), ("history", "every stored revision of a key"),
                             ("touch", "restart a key's TTL without a new revision")):
        q = kv.add_parser(action, parents=g, help=helptext)
        q.add_argument("bucket", help=_BUCKET)
        q.add_argument("key", help=_KEY)
        if action == "get":
            q.add_argument("--revision", type=int, default=0, metavar="N", help="this revision (0 = the latest)")
    q = kv.add_parser("keys", parents=g, help="keys that hold a value")
    q.add_argument("bucket", help=_BUCKET)
    q.add_argument("pattern", nargs="?", default=">", help="only keys matching this filter (* one token, > the rest)")
    q = kv.add_parser("watch", parents=g, help="print puts, deletes, purges and expirations")
    q.add_argument("bucket", help=_BUCKET)
    q.add_argument("keys", nargs="?", default=">", help="only keys matching this filter (* one token, > the rest)")
    q.add_argument("--count", type=int, default=0, metavar="N", help="exit after N events (0 = until interrupted)")
    q.add_argument("--current", action="store_true", help="start with the current values")
    q = kv.add_parser("info", parents=g, help="a bucket's settings and state")
    q.add_argument("bucket", help=_BUCKET)


#: The Spark jobs, ``python -m spark_export``'s commands with its arguments
#: (``spark_export/cli.py``): ``load`` takes the global options as every command that
#: talks to a broker does.
SPARK_COMMANDS = ("analyze", "compact", "load")


def add_spark_commands(sub: Subparsers) -> None:
    """Add ``analyze``, ``compact`` and ``load`` to the main parser's subparsers."""
    from spark_export.cli import add_job_commands

    add_job_commands(sub, connection=[global_options(defaults=False)])


def run_spark_command(args: argparse.Namespace, spark: Any = None) -> int:
    """Run ``analyze``, ``compact`` or ``load`` (pyspark imported only now, and only
    by the first two); ``spark``: a session to run on instead of starting one."""
    from spark_export.cli import JobError, run_job

    try:
        return run_job(args, spark=spark)
    except JobError as exc:
        say(named(CliError.JOB_FAILED, str(exc)))
        return CliError.JOB_FAILED.status


def _context_commands(cs: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``context``: the connection options are the global ones (``--server``,
    ``--user``, ``--password``, ``--token``, ``--tls``, ``--tls-ca``, ...)."""
    q = cs.add_parser(
        "add", parents=g, help="create or update a context from the connection options given",
        description="Store the connection options given here (--server, --user and --password or --token, --tls, "
        "--tls-ca, --tls-cert, --tls-key) as context NAME; for an existing context only those given change.",
    )
    q.add_argument("name", help="the context's name (letters, digits, - and _; no / or ..)")
    q.add_argument("--description", help="what the context is for (default: none, or unchanged)")
    q.add_argument("--select", action="store_true", help="also select it (default: the selection stays)")
    q = cs.add_parser("select", parents=g, help="use this context when no --context is given")
    q.add_argument("name", help="the context to select")
    cs.add_parser("unselect", parents=g, help="use no context unless --context is given")
    cs.add_parser("ls", parents=g, help="the contexts, the selected one marked with *")
    q = cs.add_parser("info", parents=g, help="a context's settings (password and token masked)")
    q.add_argument("name", nargs="?", help="the context (default: the selected one)")
    q = cs.add_parser("rm", parents=g, help="delete a context")
    q.add_argument("name", help="the context to delete")
    force_option(q)


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
