"""The command line, through subprocesses, against a broker started by the test."""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BrokerProcess, env_with_project, extra_missing, require
from helpers import json_lines as lines
from helpers import run_cli as run


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    proc = BrokerProcess(tmp_path_factory.mktemp("cli-data"))
    try:
        yield proc
    finally:
        proc.stop()


def test_stream_and_topic_commands(broker: BrokerProcess) -> None:
    a = broker.address
    out = run(a, "stream", "create", "Shop Floor", json_out=True)
    assert lines(out) == [{"id": 1, "name": "shop.floor", "topics_count": 0, "size": 0, "messages_count": 0}]
    run(a, "topic", "create", "shop.floor", "orders", "--partitions", "2", "--subjects", "orders.>", "--expiry", "3600")
    t = lines(run(a, "topic", "list", "shop.floor", json_out=True))
    assert len(t) == 1 and t[0]["name"] == "orders" and t[0]["partitions_count"] == 2 and t[0]["message_expiry"] == 3600
    assert t[0]["subjects"] == ["orders.>"]
    updated = lines(run(a, "topic", "update", "shop.floor", "orders", "--expiry", "60", "--max-msgs-per-subject", "5", json_out=True))[0]
    assert updated["message_expiry"] == 60 and updated["max_msgs_per_subject"] == 5
    info = lines(run(a, "topic", "info", "shop.floor", "1", json_out=True))[0]
    assert info["id"] == 1 and len(info["partitions"]) == 2
    assert [s["name"] for s in lines(run(a, "stream", "list", json_out=True))] == ["shop.floor"]
    assert run(a, "topic", "list", "shop.floor").stdout == (
        "ID  NAME    PARTITIONS  MAX AGE  MESSAGES  BYTES  SUBJECTS\n"
        " 1  orders           2  1m              0    0 B  orders.>\n"
    )
    run(a, "stream", "create", "tmp")
    run(a, "stream", "delete", "tmp")
    assert [s["name"] for s in lines(run(a, "stream", "list", json_out=True))] == ["shop.floor"]


def test_topic_create_with_memory_storage(broker: BrokerProcess) -> None:
    a = broker.address
    run(a, "stream", "create", "mem")
    t = lines(run(a, "topic", "create", "mem", "cache", "--subjects", "cache.>", "--storage", "memory", json_out=True))[0]
    assert t["storage"] == "memory"
    out = run(a, "topic", "update", "mem", "cache", "--storage", "file", check=False)
    assert out.returncode != 0 and "stream configuration update can not change storage type" in out.stderr


def test_pub_fetch_last_and_errors(broker: BrokerProcess) -> None:
    a = broker.address
    run(a, "stream", "create", "cli")
    run(a, "topic", "create", "cli", "t", "--subjects", "c.>")
    ack = lines(run(a, "pub", "c.one", "hello", "--header", "X-A=1", "--header", "X-B=two words", json_out=True))[0]
    assert ack["partition"] == 0 and ack["offset"] == 1
    run(a, "pub", "c.bin", stdin=b"\xff\xfe\x00binary")
    summary = lines(run(a, "pub", "c.many", "x", "--count", "2500", json_out=True))[0]
    assert summary.pop("seconds") > 0
    assert summary == {"published": 2500, "errors": 0, "first_offset": 3, "last_offset": 2502}
    msgs = lines(run(a, "fetch", "cli", "t", "--count", "3", json_out=True))
    assert [m["offset"] for m in msgs] == [1, 2, 3]
    first = msgs[0]
    assert first["stream"] == "cli" and first["topic"] == "t" and first["partition"] == 0
    assert first["subject"] == "c.one" and first["payload"] == "hello"
    assert first["headers"] == {"X-A": "1", "X-B": "two words"}
    assert first["timestamp"].endswith("Z") and first["timestamp_ns"] > 0
    assert msgs[1]["payload_encoding"] == "base64" and base64.b64decode(msgs[1]["payload"]) == b"\xff\xfe\x00binary"
    assert len(lines(run(a, "fetch", "cli", "t", "--offset", "10", "--count", "2000", json_out=True))) == 2000
    last = lines(run(a, "last", "cli", "t", "c.one", json_out=True))
    assert [m["offset"] for m in last] == [1]
    # errors: one line on stderr with name and code, non-zero exit
    p = run(a, "fetch", "nope", "t", check=False)
    assert p.returncode == 1 and p.stderr.strip() == "error: STREAM_NOT_FOUND (1001): no stream 'nope'"
    p = run(a, "last", "cli", "t", "c.none", check=False)
    assert p.returncode == 1 and p.stderr.startswith("error: MESSAGE_NOT_FOUND (6004):")
    p = run(a, "pub", "nobody.here", "x", check=False)
    assert p.returncode == 1 and "NO_TOPIC_FOR_SUBJECT (6001)" in p.stderr
    p = run(a, "topic", "create", "cli", "dup", "--subjects", "c.x", check=False)
    assert p.returncode == 1 and "SUBJECTS_OVERLAP (2006)" in p.stderr and "cli/t" in p.stderr
    p = run(a, "stream", "create", "a/b", check=False)
    assert p.returncode == 1 and "INVALID_NAME (11)" in p.stderr


def test_delete_purge_offsets_and_stats(broker: BrokerProcess) -> None:
    a = broker.address
    run(a, "stream", "create", "dp")
    run(a, "topic", "create", "dp", "t", "--subjects", "d.>")
    run(a, "pub", "d.a", "1")
    run(a, "pub", "d.b", "2")
    run(a, "pub", "d.b", "3")
    run(a, "delete", "dp", "t", "--partition", "0", "--offset", "1")
    assert [m["offset"] for m in lines(run(a, "fetch", "dp", "t", json_out=True))] == [2, 3]
    p = run(a, "delete", "dp", "t", "--partition", "0", "--offset", "1", check=False)
    assert p.returncode == 1 and "MESSAGE_NOT_FOUND (6004)" in p.stderr
    assert lines(run(a, "purge", "dp", "t", "--subject", "d.b", json_out=True)) == [{"purged": 2}]
    run(a, "offset", "set", "dp", "t", "worker", "17")
    assert lines(run(a, "offset", "get", "dp", "t", "worker", json_out=True))[0]["offset"] == 17
    stats = lines(run(a, "stats", json_out=True))[0]
    assert stats["messages_in"] >= 3 and stats["deleted"] >= 1 and stats["connections"] >= 1
    assert stats["bytes_on_disk"] > 0


def test_sub_prints_json_lines(broker: BrokerProcess) -> None:
    a = broker.address
    run(a, "stream", "create", "subs")
    run(a, "topic", "create", "subs", "t", "--subjects", "s.>")
    cmd = [sys.executable, "-m", "broker", "sub", "s.>", "--count", "2", "--json", "--server", a]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with_project())
    try:
        # Publish once `sub` says the broker has its subscription (stderr, --json too).
        assert proc.stderr is not None and proc.stderr.readline() == "subscribed to s.>\n"
        run(a, "pub", "s.x", "ping")
        run(a, "pub", "s.x", "ping")
        out, err = proc.communicate(timeout=30)
        got = [json.loads(line) for line in out.splitlines()]
        assert proc.returncode == 0, err
        assert len(got) == 2 and all(m["subject"] == "s.x" and m["payload"] == "ping" for m in got)
        assert got[0]["stream"] == "subs" and got[0]["topic"] == "t" and got[0]["offset"] >= 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unreachable_broker() -> None:
    p = run("127.0.0.1:1", "stats", check=False)
    assert (p.returncode, p.stderr) == (2, "error: CANNOT_CONNECT: cannot connect to 127.0.0.1:1: Connection refused\n")


def test_serve_starts_on_the_embedded_default(tmp_path: Path) -> None:
    """`ttlbroker serve` with no config: loopback, ./ttlbroker-data, prints the address."""
    env = env_with_project()
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", "--port", "0"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:")
        assert (tmp_path / "ttlbroker-data" / "LOCK").exists()
        address = line.split()[-1]
        assert lines(run(address, "stats", json_out=True))[0]["fsync"] == "always"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()
    assert "event=stopped" in err


def test_serve_refuses_a_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nportt = 1\n")
    p = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--config", str(bad)],
        capture_output=True, text=True, env=env_with_project(), cwd=tmp_path, timeout=30,
    )
    assert p.returncode == 2 and "unknown configuration key 'server.portt'" in p.stderr


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "ttlbroker"
    if not script.exists():
        pytest.fail("the ttlbroker console script is not installed next to the interpreter (pip install -e .)")
    p = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "serve" in p.stdout



def test_ttl_marker_and_rollup_options_pub_ttl_delete_and_purge(broker: BrokerProcess) -> None:
    a = broker.address
    run(a, "stream", "create", "ttl")
    t = lines(run(
        a, "topic", "create", "ttl", "events", "--subjects", "ev.>", "--expiry", "600", "--allow-msg-ttl",
        "--marker-ttl", "30", "--max-msgs-per-subject", "3", json_out=True,
    ))[0]
    # The marker TTL switched rollups on (the server's automatic fix).
    assert (t["allow_msg_ttl"], t["subject_delete_marker_ttl"], t["allow_rollup"], t["max_msgs_per_subject"]) == (True, 30, True, 3)
    assert t["message_expiry"] == 600 and t["pending_expiries"] == 0
    bad = run(a, "topic", "create", "ttl", "strict", "--subjects", "st.>", "--marker-ttl", "5", "--pedantic", check=False)
    assert bad.returncode != 0
    assert "INVALID_TOPIC_CONFIG (2007)" in bad.stderr and "subject delete marker cannot be set if message TTLs are disabled" in bad.stderr
    bad = run(a, "topic", "create", "ttl", "both", "--subjects", "b.>", "--allow-rollup", "--deny-purge", check=False)
    assert "roll-ups require the purge permission" in bad.stderr
    ok = lines(run(a, "topic", "create", "ttl", "plain", "--subjects", "p.>", json_out=True))[0]
    assert ok["allow_msg_ttl"] is False
    up = lines(run(a, "topic", "update", "ttl", "plain", "--allow-msg-ttl", "--allow-rollup", json_out=True))[0]
    assert up["allow_msg_ttl"] is True and up["allow_rollup"] is True

    ack = lines(run(a, "pub", "ev.a", "hello", "--ttl", "1h30m", json_out=True))[0]
    msg = lines(run(a, "fetch", "ttl", "events", "--offset", str(ack["offset"]), "--count", "1", json_out=True))[0]
    assert msg["ttl"] == 5400 and msg["headers"] == {"Nats-TTL": "1h30m"}
    bad = run(a, "pub", "ev.a", "x", "--ttl", "500ms", check=False)  # under NATS's minimum: refused before it is sent
    assert bad.returncode == 2 and "error: BAD_ARGUMENT: argument --ttl: invalid TTL '500ms': the minimum is 1s" in bad.stderr
    bad = run(a, "pub", "st.a", "x", "--ttl", "5s", check=False)  # no topic captures st.> (strict was refused)
    assert bad.returncode != 0

    run(a, "delete", "ttl", "events", "--partition", str(ack["partition"]), "--offset", str(ack["offset"]))
    marker = lines(run(a, "last", "ttl", "events", "ev.a", json_out=True))[0]
    assert marker["marker"] == "Remove" and marker["headers"]["Nats-Marker-Reason"] == "Remove" and marker["ttl"] == 30
    run(a, "pub", "ev.b", "1")
    run(a, "pub", "ev.b", "2")
    assert lines(run(a, "purge", "ttl", "events", "--subject", "ev.b", json_out=True)) == [{"purged": 2}]
    assert lines(run(a, "last", "ttl", "events", "ev.b", json_out=True))[0]["marker"] == "Purge"
    info = lines(run(a, "topic", "info", "ttl", "events", json_out=True))[0]
    assert info["removed"] == {"delete": 1, "purge": 2} and info["markers"] == {"Remove": 1, "Purge": 1}
    assert info["pending_expiries"] == 2  # the two markers
    stats = lines(run(a, "stats", json_out=True))[0]
    assert stats["markers"] == 2 and stats["pending_expiries"] == 2
    assert lines(run(a, "purge", "ttl", "events", json_out=True)) == [{"purged": 2}]


def test_kv_commands(broker: BrokerProcess) -> None:
    a = broker.address
    info = lines(run(a, "kv", "add", "sessions", "--history", "2", "--ttl", "3600", "--refresh", "on_read_and_write", json_out=True))[0]
    assert (info["bucket"], info["history"], info["ttl"], info["refresh"], info["visibility"]) == (
        "sessions", 2, 3600, "on_read_and_write", "never_return_expired",
    )
    put = lines(run(a, "kv", "put", "sessions", "alice", "token-1", json_out=True))[0]
    assert put == {"bucket": "sessions", "key": "alice", "revision": 1}
    assert run(a, "kv", "get", "sessions", "alice").stdout == "token-1\n"
    got = lines(run(a, "kv", "get", "sessions", "alice", json_out=True))[0]
    assert got["value"] == "token-1" and got["revision"] == 1 and 3590 < got["ttl_remaining"] <= 3600
    run(a, "kv", "put", "sessions", "bob", "x", "--ttl", "90s")
    bad = run(a, "kv", "create", "sessions", "alice", "other", check=False)
    assert (bad.returncode, bad.stderr) == (1, "error: WRONG_LAST_SEQUENCE (6012): key 'alice' exists (revision 1)\n")
    up = lines(run(a, "kv", "update", "sessions", "alice", "token-2", "--revision", "1", json_out=True))[0]
    assert up["revision"] == 3
    assert lines(run(a, "kv", "keys", "sessions", json_out=True)) == [{"keys": ["alice", "bob"]}]
    touched = lines(run(a, "kv", "touch", "sessions", "bob", json_out=True))[0]
    assert 85 < touched["ttl_remaining"] <= 90
    run(a, "kv", "delete", "sessions", "bob")
    missing = run(a, "kv", "get", "sessions", "bob", check=False)
    assert (missing.returncode, missing.stdout, missing.stderr) == (
        1, "", "error: MESSAGE_NOT_FOUND (6004): key 'bob' not found in bucket 'sessions' (deleted)\n",
    )
    hist = lines(run(a, "kv", "history", "sessions", "alice", json_out=True))
    assert [(h["revision"], h["value"]) for h in hist] == [(1, "token-1"), (3, "token-2")]
    watch = subprocess.Popen(
        [sys.executable, "-m", "broker", "kv", "watch", "sessions", "--count", "2", "--json", "--current", "--server", a],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with_project(),
    )
    try:
        first = json.loads(watch.stdout.readline())  # the current value of alice
        assert (first["key"], first["operation"], first["value"]) == ("alice", "PUT", "token-2")
        run(a, "kv", "purge", "sessions", "alice")
        second = json.loads(watch.stdout.readline())
        assert (second["key"], second["operation"]) == ("alice", "PURGE")
        assert watch.wait(30) == 0
    finally:
        watch.kill()
        watch.wait()
    bad = run(a, "kv", "put", "sessions", "bad key", "v", check=False)
    assert bad.returncode == 1 and "INVALID_KEY (6013)" in bad.stderr


def test_export_command(tmp_path: Path) -> None:
    require(extra_missing("spark"), "the export command's test")
    data, export = tmp_path / "data", tmp_path / "export"
    data.mkdir()
    proc = BrokerProcess(data, "--export-dir", str(export))
    try:
        a = proc.address
        run(a, "stream", "create", "s")
        run(a, "topic", "create", "s", "t", "--subjects", "e.>")
        run(a, "pub", "e.x", "1", "--count", "10")
        nothing = lines(run(a, "export", json_out=True))[0]
        assert nothing["exported"] == [] and nothing["sealed"] == 0
        human = run(a, "export", "--seal").stdout
        assert "exported stream=s/topic=t/partition=0/1-10.parquet (10 rows, " in human
        assert re.search(
            rf"^exported 1 segment \(10 rows, [0-9.]+ KiB\) to {re.escape(str(export))} in [0-9.]+ s \([0-9,]+ rows/s\); "
            r"1 sealed first, 1 in the export$", human, re.MULTILINE,
        ), human
        assert (export / "stream=s" / "topic=t" / "partition=0" / "1-10.parquet").exists()
    finally:
        proc.stop()
    plain = BrokerProcess(tmp_path / "data")
    try:
        bad = run(plain.address, "export", check=False)
        assert bad.returncode == 1 and bad.stderr.startswith("error: EXPORT_NOT_CONFIGURED (5001)")
    finally:
        plain.stop()


def test_duplicate_window_option_and_pub_of_a_duplicate(broker: BrokerProcess) -> None:
    a = broker.address
    run(a, "stream", "create", "dd")
    t = lines(run(a, "topic", "create", "dd", "orders", "--subjects", "dd.>", "--duplicate-window", "30", json_out=True))[0]
    assert t["duplicate_window"] == 30
    first = lines(run(a, "pub", "dd.a", "x", "--header", "Nats-Msg-Id=o-1", json_out=True))[0]
    assert "duplicate" not in first
    again = lines(run(a, "pub", "dd.a", "x", "--header", "Nats-Msg-Id=o-1", json_out=True))[0]
    assert again["duplicate"] is True and (again["partition"], again["offset"]) == (first["partition"], first["offset"])
    text = run(a, "pub", "dd.a", "x", "--header", "Nats-Msg-Id=o-1").stdout
    assert text.strip() == f"duplicate: dd.a is stored at partition 0 offset {first['offset']} (not stored again)"
    summary = lines(run(a, "pub", "dd.b", "y", "--header", "Nats-Msg-Id=o-2", "--count", "3", json_out=True))[0]
    assert (summary["published"], summary["duplicates"], summary["errors"]) == (1, 2, 0)
    info = lines(run(a, "topic", "info", "dd", "orders", json_out=True))[0]
    assert info["messages_count"] == 2 and info["duplicates"] == 4
    bad = run(a, "topic", "update", "dd", "orders", "--duplicate-window", "-1", check=False)
    assert bad.returncode == 2 and "argument --duplicate-window: invalid duration '-1': must not be negative" in bad.stderr
    bad = run(a, "topic", "update", "dd", "orders", "--duplicate-window", "1.5s", check=False)
    assert bad.returncode == 2 and "argument --duplicate-window: invalid duration '1.5s': this option takes whole seconds" in bad.stderr
    assert lines(run(a, "topic", "update", "dd", "orders", "--duplicate-window", "1m30s", json_out=True))[0]["duplicate_window"] == 90
