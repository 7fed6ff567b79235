"""What people read (aligned tables, titled fields) and what scripts read
(``--json``), exactly, from ``main([...])`` in this process against a broker
process."""

from __future__ import annotations

import re

import pytest
from conftest import BrokerProcess
from helpers import MainCLI as CLI

from broker.cli import main


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    proc = BrokerProcess(tmp_path_factory.mktemp("tables-data"))
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def cli(broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> CLI:
    return CLI(capsys, broker.address)


@pytest.fixture(scope="module")
def shop(broker: BrokerProcess) -> None:
    def run(*args: str) -> None:
        assert main(["--server", broker.address, *args]) == 0

    run("stream", "create", "shop")
    run("topic", "create", "shop", "orders", "--partitions", "2", "--subjects", "orders.>", "--expiry", "1h30m")
    run("topic", "create", "shop", "events", "--subjects", "ev.*", "ev.x.>", "--expiry", "0", "--allow-msg-ttl",
        "--marker-ttl", "30s", "--max-msgs-per-subject", "3", "--republish-dest", "audit.{{wildcard(1)}}",
        "--republish-src", "ev.*", "--republish-headers-only")
    for i in range(5):
        run("pub", f"orders.eu.{i}", "0123456789")
    run("pub", "ev.a", "x", "--count", "3")
    run("purge", "shop", "events", "--subject", "ev.a")


def test_stream_list(cli: CLI, shop: None) -> None:
    assert cli("stream", "list") == (
        "ID  NAME  TOPICS  MESSAGES  BYTES\n"
        " 1  shop       2         6  523 B\n"
    )
    assert cli.json("stream", "list") == [{"id": 1, "name": "shop", "topics_count": 2, "size": 523, "messages_count": 6}]


def test_topic_list(cli: CLI, shop: None) -> None:
    assert cli("topic", "list", "shop") == (
        "ID  NAME    PARTITIONS  MAX AGE  MESSAGES  BYTES  SUBJECTS\n"
        " 1  orders           2  1h30m           5  295 B  orders.>\n"
        " 2  events           1  none            1  228 B  ev.*, ev.x.>\n"
    )
    got = cli.json("topic", "list", "shop")
    assert [(t["name"], t["message_expiry"], t["subjects"], t["messages_count"]) for t in got] == [
        ("orders", 5400, ["orders.>"], 5), ("events", 0, ["ev.*", "ev.x.>"], 1),
    ]


def test_topic_info(cli: CLI, shop: None) -> None:
    assert cli("topic", "info", "shop", "events") == (
        "Topic shop/events (id 2)\n"
        "  partitions            1\n"
        "  max age               none\n"
        "  subjects              ev.*, ev.x.>\n"
        "  max msgs per subject  3\n"
        "  segment size          64.0 MiB\n"
        "  duplicate window      2m\n"
        "  per-message TTL       allowed\n"
        "  marker TTL            30s\n"
        "  rollup                allowed\n"
        "  deny purge            no\n"
        "  retention             limits\n"
        "  storage               file\n"
        "  republish             ev.* -> audit.{{wildcard(1)}} (headers only)\n"
        "\n"
        "State\n"
        "  messages          1\n"
        "  bytes             228 B\n"
        "  pending expiries  1\n"
        "  duplicates        0\n"
        "  removed           purge 3\n"
        "  markers           Purge 1\n"
        "\n"
        "PARTITION  FIRST  LAST  MESSAGES  BYTES  SEGMENTS  SUBJECTS\n"
        "        0      4     4         1  228 B         1         1\n"
    )
    info = cli.json("topic", "info", "shop", "events")[0]
    assert info["republish"] == {"dest": "audit.{{wildcard(1)}}", "src": "ev.*", "headers_only": True}
    assert (info["removed"], info["markers"], info["subject_delete_marker_ttl"]) == ({"purge": 3}, {"Purge": 1}, 30)
    assert info["partitions"] == [
        {"partition": 0, "first_offset": 4, "last_offset": 4, "messages": 1, "size_bytes": 228, "segments": 1, "subjects": 1},
    ]


def test_kv_info_ls_and_a_missing_key(cli: CLI) -> None:
    assert cli("kv", "ls") == "No Key-Value buckets found\n" and cli.json("kv", "ls") == []  # not even the kv stream yet
    cli("kv", "add", "sessions", "--ttl", "1h", "--history", "2")
    cli("kv", "add", "carts")
    cli("kv", "put", "sessions", "alice", "token")
    assert cli("kv", "info", "sessions") == (
        "Bucket sessions\n"
        "  history           2\n"
        "  ttl               1h\n"
        "  marker TTL        1m\n"
        "  refresh           on_write\n"
        "  visibility        never_return_expired\n"
        "  values            1\n"
        "  messages          1\n"
        "  bytes             61 B\n"
        "  pending expiries  1\n"
    )
    status = {"bucket": "sessions", "history": 2, "marker_ttl": 60, "ttl": 3600, "refresh": "on_write",
              "visibility": "never_return_expired", "values": 1, "messages": 1, "bytes": 61, "pending_expiries": 1}
    assert cli.json("kv", "info", "sessions") == [status]
    assert cli("kv", "ls") == (
        "BUCKET    VALUES  HISTORY  TTL   MESSAGES  BYTES\n"
        "sessions       1        2  1h           1   61 B\n"
        "carts          0        1  none         0    0 B\n"
    )
    assert [b["bucket"] for b in cli.json("kv", "ls")] == ["sessions", "carts"]
    assert cli.json("kv", "ls")[0] == status
    not_found = "error: MESSAGE_NOT_FOUND (6004): "
    assert cli.err("kv", "get", "sessions", "bob", status=1) == f"{not_found}key 'bob' not found in bucket 'sessions'\n"
    assert cli.err("kv", "get", "sessions", "alice", "--revision", "7", status=1) == (
        f"{not_found}revision 7 of key 'alice' not found in bucket 'sessions'\n"
    )
    assert cli.err("kv", "touch", "sessions", "bob", status=1) == f"{not_found}key 'bob' not found in bucket 'sessions'\n"
    assert cli.err("kv", "get", "nope", "bob", status=1) == "error: TOPIC_NOT_FOUND (2001): no bucket 'nope'\n"
    cli("kv", "purge", "sessions", "alice")
    assert cli.err("kv", "get", "sessions", "alice", status=1) == f"{not_found}key 'alice' not found in bucket 'sessions' (purged)\n"


def test_stats_grouped(cli: CLI, shop: None) -> None:
    stats = cli.json("stats")[0]
    text = cli("stats")
    sections = text.split("\n\n")
    titles = [s.splitlines()[0] for s in sections]
    assert titles[:7] == ["Server", "Connections", "Messages", "Storage", "Removal and expiry", "Consumers", "Export"]
    fields = [line for s in sections for line in s.splitlines()[1:]]
    assert len(fields) == len(stats)  # every counter once, none invented
    for s in sections:
        rows = s.splitlines()[1:]
        column = {len(re.match(r"  (\S+(?: \S+)*)\s+", r).group(0)) for r in rows}  # type: ignore[union-attr]
        assert len(column) == 1, s  # the values of a group start in one column
    for line in fields:
        assert re.fullmatch(r"  [\w ()-]+?  +\S.*", line), line
        assert not re.search(r"[{}\[\]']|True|False|None", line), line  # no Python reprs
    assert f"  version          {stats['version']}" in fields
    assert f"  in                         {stats['messages_in']:,}" in fields
    assert "  segment size" not in text


def test_piped_tables_are_not_wrapped(cli: CLI) -> None:
    subjects = [f"wide.subject.number.{i}.>" for i in range(12)]
    cli("stream", "create", "wide")
    cli("topic", "create", "wide", "t", "--subjects", *subjects)
    rows = cli("topic", "list", "wide").splitlines()
    assert len(rows) == 2 and rows[1].endswith(", ".join(subjects)) and len(rows[1]) > 300


def test_topic_limits_flags(cli: CLI, shop: None) -> None:
    cli("topic", "create", "shop", "capped", "--subjects", "cap.>", "--max-msgs", "2", "--max-bytes", "4096",
        "--max-msg-size", "100", "--max-consumers", "3", "--discard", "new", "--max-msgs-per-subject", "1",
        "--discard-new-per-subject")
    shown = cli("topic", "info", "shop", "capped")
    for line in ("  max msgs              2\n", "  max bytes             4.0 KiB\n", "  max msg size          100 B\n",
                 "  max consumers         3\n", "  discard               new\n", "  discard per subject   yes\n"):
        assert line in shown
    assert cli.err("topic", "update", "shop", "capped", "--discard", "old", status=1) == (
        "error: INVALID_TOPIC_CONFIG (2007): discard new per subject requires discard new policy to be set\n"
    )
    cli("pub", "cap.a", "1")
    cli("pub", "cap.b", "2")
    assert "MAX_MSGS_EXCEEDED" in cli.err("pub", "cap.c", "3", status=1)


def test_topic_with_message_schedules(cli: CLI) -> None:
    """``--allow-msg-schedules`` (NATS ADR-51): the option and the pending schedules
    shown (last in this module: it adds a stream)."""
    cli("stream", "create", "timers")
    cli("topic", "create", "timers", "t", "--subjects", "tm.>", "--allow-msg-schedules")
    cli("pub", "tm.s", "x", "--header", "Nats-Schedule=@at 2099-01-01T00:00:00Z", "--header", "Nats-Schedule-Target=tm.out")
    text = cli("topic", "info", "timers", "t")
    assert "  rollup                allowed\n" in text and "  message schedules     allowed\n" in text
    assert "  pending schedules  1\n" in text
    info = cli.json("topic", "info", "timers", "t")[0]
    assert (info["allow_msg_schedules"], info["pending_schedules"]) == (True, 1)
