"""natscli's habits in the ``ttlbroker`` command, part 1: ``stream report``,
``consumer report``, ``consumer edit`` and the word an empty list says; from
``main([...])`` in this process against a broker in a thread of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import BrokerThread, MainCLI

from broker.cli._output import size


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    b = BrokerThread(Path(tmp_path_factory.mktemp("reports-data")))
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def cli(broker: BrokerThread, capsys: pytest.CaptureFixture[str]) -> MainCLI:
    return MainCLI(capsys, broker.address)


def test_an_empty_list_says_so_and_json_prints_nothing(cli: MainCLI) -> None:
    # first in the module: the broker has nothing yet
    assert cli("stream", "list") == "No Streams defined\n" and cli("stream", "list", "--json") == ""
    assert cli("stream", "report") == "No Streams defined\n" and cli("stream", "report", "--json") == ""
    assert cli("kv", "ls") == "No Key-Value buckets found\n" and cli("kv", "ls", "--json") == ""
    cli("stream", "create", "bare")
    assert cli("topic", "list", "bare") == "No Topics defined\n" and cli("topic", "list", "bare", "--json") == ""
    assert cli("consumer", "report", "bare") == "No Consumers defined\n"
    cli("topic", "create", "bare", "t", "--subjects", "bare.>")
    assert cli("consumer", "list", "bare", "t") == "No Consumers defined\n"
    assert cli("consumer", "list", "bare", "t", "--json") == ""
    assert cli("consumer", "report", "bare", "t") == "No Consumers defined\n"
    cli("kv", "add", "nokeys")
    # kv keys prints one key a line for scripts: its word goes to stderr
    assert cli("kv", "keys", "nokeys") == "" and cli.err("kv", "keys", "nokeys", status=0) == "No keys found in bucket\n"
    assert cli.json("kv", "keys", "nokeys") == [{"keys": []}]
    cli("kv", "rm", "nokeys", "-f")
    cli("stream", "rm", "bare", "-f")
    cli("stream", "rm", "kv", "-f")


@pytest.fixture(scope="module")
def shop(broker: BrokerThread) -> None:
    """Stream shop: orders (2 partitions, an interior message deleted, 2 consumers)
    and events (memory storage, 1,200 messages); stream empty, without topics."""
    from broker.cli import main

    def run(*args: str) -> None:
        assert main(["--server", broker.address, *args]) == 0

    run("stream", "create", "shop")
    run("topic", "create", "shop", "orders", "--partitions", "2", "--subjects", "orders.>")
    run("topic", "create", "shop", "events", "--subjects", "ev.>", "--storage", "memory")
    run("stream", "create", "empty")
    for i in range(6):
        run("pub", f"orders.{i}", "0123456789")
    run("pub", "ev.x", "e", "--count", "1200")
    run("consumer", "add", "shop", "orders", "work")
    run("consumer", "add", "shop", "orders", "late", "--deliver", "new")
    run("consumer", "next", "shop", "orders", "work", "--count", "2", "--no-ack")


def _delete_an_interior_message(cli: MainCLI) -> None:
    """Delete the second message of a partition of shop/orders holding three or more."""
    parts = cli.json("topic", "info", "shop", "orders")[0]["partitions"]
    p = next(p for p in parts if p["messages"] >= 3)
    cli("delete", "shop", "orders", "--partition", str(p["partition"]), "--offset", str(p["first_offset"] + 1))


def test_stream_report(cli: MainCLI, shop: None) -> None:
    _delete_an_interior_message(cli)
    orders, events = (cli.json("topic", "info", "shop", t)[0] for t in ("orders", "events"))
    rows = cli.json("stream", "report")
    assert rows == [  # by bytes, as natscli sorts
        {"stream": "empty", "topic": None, "storage": None, "partitions": 0, "consumers": 0, "messages": 0, "bytes": 0,
         "deleted": 0},
        {"stream": "shop", "topic": "orders", "storage": "file", "partitions": 2, "consumers": 2, "messages": 5,
         "bytes": orders["size"], "deleted": 1},
        {"stream": "shop", "topic": "events", "storage": "memory", "partitions": 1, "consumers": 0, "messages": 1200,
         "bytes": events["size"], "deleted": 0},
    ]
    assert orders["size"] < events["size"]
    lines = cli("stream", "report").splitlines()
    assert lines[:2] == ["Stream Report", "STREAM  TOPIC   STORAGE  PARTITIONS  CONSUMERS  MESSAGES  " + "BYTES".rjust(
        len(size(events["size"]))) + "  DELETED"]
    assert [line.split() for line in lines[2:]] == [
        ["empty", "-", "-", "0", "0", "0", "0", "B", "0"],
        ["shop", "orders", "file", "2", "2", "5", *size(orders["size"]).split(), "1"],
        ["shop", "events", "memory", "1", "0", "1,200", *size(events["size"]).split(), "0"],
    ]
    assert size(events["size"]).endswith(" KiB")
    raw = cli("stream", "report", "--raw").splitlines()
    assert raw[-1].split() == ["shop", "events", "memory", "1", "0", "1200", str(events["size"]), "0"]

    def order(*flags: str) -> list[tuple[str, str | None]]:
        return [(r["stream"], r["topic"]) for r in cli.json("stream", "report", *flags)]

    assert order("--name") == [("empty", None), ("shop", "events"), ("shop", "orders")]
    assert order("-m") == [("empty", None), ("shop", "orders"), ("shop", "events")]
    assert order("--consumers") == [("empty", None), ("shop", "events"), ("shop", "orders")]
    assert order("-t") == [("empty", None), ("shop", "orders"), ("shop", "events")]  # "" < "file" < "memory"


def test_consumer_report(cli: MainCLI, shop: None) -> None:
    text = cli("consumer", "report", "shop", "orders")
    msgs = cli.json("topic", "info", "shop", "orders")[0]["messages_count"]
    work = cli.json("consumer", "info", "shop", "orders", "work")[0]
    floors = [p["ack_floor"] for p in work["partitions"]]
    pending = work["num_pending"]
    assert pending > 0 and work["num_ack_pending"] == 2
    share = min(100, pending * 100 // msgs)
    lines = text.splitlines()
    assert lines[0] == "Consumer report for shop/orders with 2 consumers"
    assert lines[1].split() == ["CONSUMER", "MODE", "ACK", "POLICY", "ACK", "WAIT", "DELIVERED", "ACK", "PENDING",
                                "REDELIVERED", "WAITING", "UNPROCESSED", "ACK", "FLOOR"]
    late_floors = [p["ack_floor"] for p in cli.json("consumer", "info", "shop", "orders", "late")[0]["partitions"]]
    assert lines[2].split() == ["late", "shared", "explicit", "30s", "0", "0", "0", "0", "0",
                                f"0:{late_floors[0]},", f"1:{late_floors[1]}"]
    assert lines[3].split() == ["work", "shared", "explicit", "30s", "2", "2", "0", "0", str(pending), "/", f"{share}%",
                                f"0:{floors[0]},", f"1:{floors[1]}"]
    rows = cli.json("consumer", "report", "shop", "orders")
    assert rows[1] == {
        "stream": "shop", "topic": "orders", "name": "work", "mode": "shared", "ack_policy": "explicit", "ack_wait": 30.0,
        "delivered": 2, "num_ack_pending": 2, "num_redelivered": 0, "num_waiting": 0, "num_pending": pending,
        "topic_messages": msgs, "ack_floor": floors,
    }
    # the whole stream: a TOPIC column; events has no consumer
    whole = cli("consumer", "report", "shop").splitlines()
    assert whole[0] == "Consumer report for shop with 2 consumers"
    assert whole[1].split()[:2] == ["TOPIC", "CONSUMER"] and [r.split()[:2] for r in whole[2:]] == [
        ["orders", "late"], ["orders", "work"],
    ]
    assert cli.err("consumer", "report", "nope", status=1) == "error: STREAM_NOT_FOUND (1001): no stream 'nope'\n"
    assert cli.err("consumer", "report", "shop", "nope", status=1).startswith("error: TOPIC_NOT_FOUND (")


def test_consumer_edit_shows_the_differences_then_the_consumer(cli: MainCLI, shop: None) -> None:
    cli("consumer", "add", "shop", "orders", "ed", "--filter", "orders.1")
    out = cli("consumer", "edit", "shop", "orders", "ed", "--ack-wait", "1m", "--max-ack-pending", "50",
              "--description", "the editors")
    diff, _, info = out.partition("\n\n")
    assert diff.splitlines() == [
        "Differences (-old +new):",
        "- ack wait         30s",
        "+ ack wait         1m",
        "- max ack pending  1,000",
        "+ max ack pending  50",
        "+ description      the editors",
    ]
    assert info == cli("consumer", "info", "shop", "orders", "ed")
    cfg = cli.json("consumer", "info", "shop", "orders", "ed")[0]["config"]
    assert (cfg["ack_wait"], cfg["max_ack_pending"], cfg["description"], cfg["filter_subjects"]) == (
        60.0, 50, "the editors", ["orders.1"],
    )
    assert cli("consumer", "edit", "shop", "orders", "ed", "--ack-wait", "60s") == "No difference in configuration\n"
    # a new filter: the broker counts what is pending again
    before = cli.json("consumer", "info", "shop", "orders", "ed")[0]["num_pending"]
    edited = cli.json("consumer", "edit", "shop", "orders", "ed", "--filter", "orders.>")[0]
    assert edited["config"]["filter_subjects"] == ["orders.>"] and edited["num_pending"] > before
    # a backoff: the ack wait becomes its first delay
    out = cli("consumer", "edit", "shop", "orders", "ed", "--backoff", "1s,5s", "--max-deliver", "4")
    assert out.splitlines()[1:6] == [
        "- ack wait         1m", "+ ack wait         1s", "- max deliver      unlimited", "+ max deliver      4",
        "+ backoff          1s, 5s",
    ]


@pytest.mark.parametrize(("option", "words"), [
    (["--ack", "none"], "ack policy"),
    (["--deliver", "new"], "deliver policy"),
    (["--partitioned"], "mode"),
    (["--start-offset", "3"], "deliver policy"),
])
def test_consumer_edit_of_what_the_broker_keeps(cli: MainCLI, shop: None, option: list[str], words: str) -> None:
    cli("consumer", "add", "shop", "orders", "fixed")
    err = cli.err("consumer", "edit", "shop", "orders", "fixed", *option, status=1)
    assert err == f"error: CONSUMER_UPDATE_DENIED (7012): {words} can not be updated\n"
    assert cli.json("consumer", "info", "shop", "orders", "fixed")[0]["config"]["deliver_policy"] == "all"


def test_consumer_edit_errors(cli: MainCLI, shop: None) -> None:
    assert cli.err("consumer", "edit", "shop", "orders", "work", status=2) == (
        "error: BAD_ARGUMENT: consumer edit needs at least one option to change\n"
    )
    err = cli.err("consumer", "edit", "shop", "orders", "nobody", "--ack-wait", "5s", status=1)
    assert err == "error: CONSUMER_NOT_FOUND (7006): consumer not found\n"
    err = cli.err("consumer", "edit", "shop", "orders", "work", "--max-waiting", "0", status=1)
    assert err.startswith("error: INVALID_CONSUMER_CONFIG (") and "max_waiting" in err
