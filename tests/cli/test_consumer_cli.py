"""``ttlbroker consumer ...`` through subprocesses (and in-process ``main``, cheaper,
where the process adds nothing), against a broker process."""

from __future__ import annotations

import pytest
from conftest import BrokerProcess
from helpers import MainCLI
from helpers import json_lines as lines
from helpers import run_cli as run


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    proc = BrokerProcess(tmp_path_factory.mktemp("consumer-cli-data"))
    try:
        a = proc.address
        run(a, "stream", "create", "shop")
        run(a, "topic", "create", "shop", "orders", "--subjects", "orders.>")
        yield proc
    finally:
        proc.stop()


def test_add_info_list_rm(broker: BrokerProcess) -> None:
    a = broker.address
    p = run(a, "consumer", "add", "shop", "orders", "work", "--filter", "orders.a", "--filter", "orders.b",
            "--ack-wait", "1m", "--backoff", "1m,5m", "--max-deliver", "5", "--max-ack-pending", "10", "--description", "d")
    assert p.stdout == "created consumer shop/orders/work\n" and p.stderr == ""
    # the same again is a no-op; another configuration is refused
    assert run(a, "consumer", "add", "shop", "orders", "work", "--filter", "orders.a", "--filter", "orders.b",
               "--ack-wait", "60s", "--backoff", "60s,5m", "--max-deliver", "5", "--max-ack-pending", "10",
               "--description", "d").returncode == 0
    p = run(a, "consumer", "add", "shop", "orders", "work", check=False)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == "error: CONSUMER_EXISTS (7007): consumer already exists\n"
    info = lines(run(a, "consumer", "add", "shop", "orders", "late", "--deliver", "by_start_time",
                     "--start-time", "2020-01-02T03:04:05Z", "--partitioned", "--member-timeout", "45s", json_out=True))[0]
    assert info["name"] == "late" and info["config"]["mode"] == "partitioned" and info["config"]["member_timeout"] == 45
    assert info["config"]["opt_start_time"] == 1577934245 * 10**9

    run(a, "pub", "orders.a", "one")
    run(a, "pub", "orders.c", "not for work")
    p = run(a, "consumer", "info", "shop", "orders", "work")
    assert p.stdout == (
        "Consumer shop/orders/work\n"
        "  filter           orders.a, orders.b\n"
        "  deliver          all\n"
        "  ack policy       explicit\n"
        "  ack wait         1m\n"
        "  max deliver      5\n"
        "  backoff          1m, 5m\n"
        "  max ack pending  10\n"
        "  max waiting      512\n"
        "  mode             shared\n"
        "  description      d\n"
        "\n"
        "State\n"
        "  pending        1\n"
        "  ack pending    0\n"
        "  redelivered    0\n"
        "  waiting pulls  0\n"
        "  delivered      consumer seq 0, stream seq 0\n"
        "  ack floor      consumer seq 0, stream seq 0\n"
        "\n"
        "PARTITION  DELIVERED  ACK FLOOR  PENDING  ACK PENDING  REDELIVERED\n"
        "        0          0          0        1            0            0\n"
    )
    raw = lines(run(a, "consumer", "info", "shop", "orders", "work", json_out=True))[0]
    assert raw["num_pending"] == 1 and raw["config"]["filter_subjects"] == ["orders.a", "orders.b"]
    p = run(a, "consumer", "list", "shop", "orders")
    assert p.stdout.splitlines() == [
        "NAME  MODE         PENDING  ACK PENDING  REDELIVERED  WAITING  FILTER",
        "late  partitioned        2            0            0        0  (all)",
        "work  shared             1            0            0        0  orders.a, orders.b",
    ]
    assert [c["name"] for c in lines(run(a, "consumer", "list", "shop", "orders", json_out=True))] == ["late", "work"]
    p = run(a, "consumer", "rm", "shop", "orders", "late")
    assert p.stdout == "deleted consumer shop/orders/late\n"
    assert lines(run(a, "consumer", "rm", "shop", "orders", "work", json_out=True)) == [{"deleted": "shop/orders/work"}]
    assert run(a, "consumer", "list", "shop", "orders").stdout == "No Consumers defined\n"


def test_next_and_sub(broker: BrokerProcess) -> None:
    a = broker.address
    run(a, "topic", "create", "shop", "jobs", "--subjects", "jobs.>")  # its own: offsets from 1
    run(a, "consumer", "add", "shop", "jobs", "n", "--filter", "jobs.n.>")
    for i in range(5):
        run(a, "pub", f"jobs.n.{i}", f"m{i}")
    p = run(a, "consumer", "next", "shop", "jobs", "n", "--count", "2")
    assert p.stdout.splitlines() == ["shop/jobs[0]@1 jobs.n.0 m0", "shop/jobs[0]@2 jobs.n.1 m1"]
    got = lines(run(a, "consumer", "next", "shop", "jobs", "n", "--no-ack", json_out=True))
    assert [(m["offset"], m["subject"], m["payload"]) for m in got] == [(3, "jobs.n.2", "m2")]
    info = lines(run(a, "consumer", "info", "shop", "jobs", "n", json_out=True))[0]
    assert info["num_ack_pending"] == 1 and info["num_pending"] == 2
    p = run(a, "consumer", "sub", "shop", "jobs", "n", "--count", "2")
    assert p.stdout.splitlines() == ["shop/jobs[0]@4 jobs.n.3 m3", "shop/jobs[0]@5 jobs.n.4 m4"]
    assert p.stderr == "consuming shop/jobs/n\n"
    info = lines(run(a, "consumer", "info", "shop", "jobs", "n", json_out=True))[0]
    assert info["num_ack_pending"] == 1 and info["num_pending"] == 0  # only the --no-ack one is outstanding
    p = run(a, "consumer", "next", "shop", "jobs", "n", "--wait", "200ms", check=False)
    assert p.returncode == 1 and p.stdout == "" and p.stderr == "error: NO_MESSAGE: no message within 200ms\n"


def test_errors(broker: BrokerProcess) -> None:
    a = broker.address
    for args in (("info", "shop", "orders", "nope"), ("rm", "shop", "orders", "nope"), ("next", "shop", "orders", "nope"),
                 ("sub", "shop", "orders", "nope")):
        p = run(a, "consumer", *args, check=False)
        assert (p.returncode, p.stdout) == (1, "") and p.stderr.endswith("error: CONSUMER_NOT_FOUND (7006): consumer not found\n")
    p = run(a, "consumer", "add", "shop", "nope", "x", check=False)
    assert p.returncode == 1 and p.stderr.startswith("error: TOPIC_NOT_FOUND")
    p = run(a, "consumer", "add", "shop", "orders", "x", "--ack-wait", "soon", check=False)
    assert p.returncode == 2 and "argument --ack-wait: invalid duration 'soon'" in p.stderr
    p = run(a, "consumer", "add", "shop", "orders", "x", "--deliver", "by_start_offset", check=False)
    assert p.returncode == 2 and p.stderr == "error: BAD_ARGUMENT: --deliver by_start_offset needs --start-offset\n"
    p = run(a, "consumer", "add", "shop", "orders", "x", "--filter", "orders.*", "--filter", "orders.a", check=False)
    assert p.returncode == 1 and p.stderr.startswith("error: CONSUMER_FILTERS_OVERLAP (7008)")
    p = run("127.0.0.1:1", "consumer", "list", "shop", "orders", check=False)
    assert p.returncode == 2 and p.stderr.startswith("error: CANNOT_CONNECT: cannot connect to 127.0.0.1:1")



def test_add_with_a_dead_letter_subject(broker: BrokerProcess) -> None:
    a = broker.address
    info = lines(run(a, "consumer", "add", "shop", "orders", "dl", "--max-deliver", "3", "--dead-letter", "dlq.orders",
                     json_out=True))[0]
    assert info["config"]["dead_letter_subject"] == "dlq.orders"
    assert info["dead_lettered"] == {"MaxDeliveries": 0, "Terminated": 0, "Expired": 0, "Limit": 0}
    p = run(a, "consumer", "add", "shop", "orders", "dl2", "--dead-letter", "dlq.>", check=False)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("error: INVALID_CONSUMER_CONFIG (")
    assert "dead_letter_subject 'dlq.>' is not a valid subject: subject 'dlq.>' contains the wildcard '>'" in p.stderr
    run(a, "consumer", "rm", "shop", "orders", "dl")


def test_dead_letter_expired_and_dead_lettered_in_info(broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    """``--dead-letter-expired``: what a limit discards before delivery is copied
    (``Limit``); ``consumer info`` shows the dead-letter subject and the copies made,
    by reason; ``consumer edit --no-dead-letter-expired`` turns it off."""
    cli = MainCLI(capsys, broker.address)
    cli("topic", "create", "shop", "lim", "--subjects", "lim.>", "--max-msgs", "1", "--discard", "old")
    cli("topic", "create", "shop", "limdead", "--subjects", "limdead.>")
    made = cli.json("consumer", "add", "shop", "lim", "dl", "--dead-letter", "limdead.x", "--dead-letter-expired")[0]
    assert made["config"]["dead_letter_expired"] is True
    cli("pub", "lim.a", "first")
    cli("pub", "lim.a", "second")  # max msgs 1, discard old: "first" goes, undelivered
    out = cli("consumer", "info", "shop", "lim", "dl").splitlines()
    assert "  dead letter      limdead.x (also expired and over limits)" in out
    assert out[out.index("State") + 1:out.index("State") + 8] == [
        "  pending        1",
        "  ack pending    0",
        "  redelivered    0",
        "  waiting pulls  0",
        "  delivered      consumer seq 0, stream seq 0",
        "  ack floor      consumer seq 0, stream seq 0",
        "  dead lettered  1 (Limit 1)",
    ]
    copies = cli.json("fetch", "shop", "limdead")
    assert [(m["headers"]["Nats-DLQ-Reason"], m["headers"]["Nats-DLQ-Subject"], m["payload"]) for m in copies] == [
        ("Limit", "lim.a", "first")]
    out = cli("consumer", "edit", "shop", "lim", "dl", "--no-dead-letter-expired").splitlines()
    assert out[:3] == ["Differences (-old +new):", "- dead letter      limdead.x (also expired and over limits)",
                       "+ dead letter      limdead.x"]
    err = cli.err("consumer", "add", "shop", "lim", "bad", "--dead-letter-expired", status=1)
    assert err == ("error: INVALID_CONSUMER_CONFIG (7009): "
                   "dead_letter_expired needs a dead_letter_subject to copy the messages to\n")


def test_redrive_dry_run_and_json(broker: BrokerProcess) -> None:
    a = broker.address
    run(a, "topic", "create", "shop", "dead", "--subjects", "dead.>")
    run(a, "pub", "dead.x", "not a dead letter")
    p = run(a, "consumer", "redrive", "shop", "dead", "--dry-run")
    assert p.stdout == "would redrive 0 dead letters from shop/dead (1 other messages skipped)\n"
    assert lines(run(a, "consumer", "redrive", "shop", "dead", json_out=True)) == [{"redriven": 0, "skipped": 1, "dry_run": False}]
    p = run(a, "consumer", "redrive", "shop", "nope", check=False)
    assert p.returncode == 1 and p.stderr.startswith("error: TOPIC_NOT_FOUND (")
