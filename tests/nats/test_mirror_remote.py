"""Mirrors and sources across servers, end to end: a ttlbroker whose config names a
``[[nats.remotes]]`` entry copies a stream living on a nats-server (a subprocess) or
on another ttlbroker (in process, ``[nats] domain = "hub"``), through the JetStream
API as a client sends it (``mirror: {name, domain}``, ``sources: [{name, external:
{api}}]``). The copy equals the origin message for message, keeps up with new
messages, reports an unreachable origin in stream info, a log line and a counter
while staying readable, and resumes after the origin comes back and after its own
restart with no gap and no duplicate."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import make_config, start_server
from test_remote_origin import publish, run_nats_server

from broker.config import RemoteSettings
from broker.replication import NatsLink
from protocol.nats import nats_hash

API = "$JS.API"


async def api(link: NatsLink, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    ans = await link.request(f"{API}.{subject}", json.dumps(body).encode() if body is not None else b"", 5)
    return json.loads(ans.payload)  # type: ignore[no-any-return]


async def contents(link: NatsLink, stream: str) -> list[tuple[int, str, bytes, str | None]]:
    """(sequence, subject, payload, Nats-Stream-Source) of every message of ``stream``
    (each found with ``next_by_subj``: a copy's sequences may have gaps)."""
    info = await api(link, f"STREAM.INFO.{stream}")
    state = info["state"]
    out = []
    seq = state["first_seq"]
    while state["messages"] and seq <= state["last_seq"]:
        r = await api(link, f"STREAM.MSG.GET.{stream}", {"seq": seq, "next_by_subj": ">"})
        if "error" in r:
            break
        m = r["message"]
        hdrs = base64.b64decode(m["hdrs"]).decode() if m.get("hdrs") else ""
        source = next((line.split(":", 1)[1].strip() for line in hdrs.split("\r\n") if line.startswith("Nats-Stream-Source:")), None)
        out.append((m["seq"], m["subject"], base64.b64decode(m.get("data") or ""), source))
        seq = m["seq"] + 1
    return out


async def wait_for(link: NatsLink, stream: str, messages: int, timeout: float = 15) -> dict[str, Any]:
    """The copy's stream info once it holds ``messages`` messages."""
    info: dict[str, Any] = {}
    with trio.move_on_after(timeout):
        while True:
            info = await api(link, f"STREAM.INFO.{stream}")
            if info.get("state", {}).get("messages") == messages:
                return info
            await trio.sleep(0.05)
    raise AssertionError(f"{stream} does not hold {messages} messages after {timeout} s: {info}")


@pytest.fixture(params=["nats-server", "ttlbroker"])
async def origin(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a server of domain ``hub`` holding the stream ``S`` (``s.>``, 30
    messages)."""
    if request.param == "nats-server":
        with run_nats_server(tmp_path) as (_proc, port):
            yield await _fill(f"nats://127.0.0.1:{port}")
    else:
        d = tmp_path / "origin"
        d.mkdir()
        async with start_server(make_config(d, **{"nats.enabled": True, "nats.domain": "hub"})) as handle:
            yield await _fill(handle.nats_url)


async def _fill(url: str) -> str:
    link = await NatsLink.open(RemoteSettings(domain="hub", url=url), 5)
    try:
        r = await api(link, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "allow_msg_ttl": True})
        assert "error" not in r, r
        await publish(link, 0, 30)
    finally:
        await link.aclose()
    return url


def _copier_config(tmp_path: Path, url: str) -> Any:
    d = tmp_path / "copy"
    d.mkdir(exist_ok=True)
    return make_config(d, **{"nats.enabled": True, "nats.remotes": [{"domain": "hub", "url": url}]})


async def test_a_mirror_and_a_source_of_a_stream_on_another_server(origin: str, tmp_path: Path) -> None:
    remote = RemoteSettings(domain="hub", url=origin)
    async with start_server(_copier_config(tmp_path, origin)) as handle:
        here = await NatsLink.open(RemoteSettings(domain="local", url=handle.nats_url), 5)
        there = await NatsLink.open(remote, 5)
        try:
            r = await api(here, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "S", "domain": "hub"}})
            assert "error" not in r, r
            r = await api(here, "STREAM.CREATE.C", {
                "name": "C", "sources": [{"name": "S", "filter_subject": "s.1", "external": {"api": "$JS.hub.API"}}],
            })
            assert "error" not in r, r
            await wait_for(here, "M", 30)
            await wait_for(here, "C", 10)
            await publish(there, 30, 6)
            info = await wait_for(here, "M", 36)
            mirror = info["mirror"]
            assert mirror["name"] == "S" and mirror["lag"] == 0 and mirror["active"] >= 0 and "error" not in mirror
            want = [(seq, subj, data) for seq, subj, data, _ in await contents(there, "S")]
            assert [(seq, subj, data) for seq, subj, data, _ in await contents(here, "M")] == want
            await wait_for(here, "C", 12)
            sourced = await contents(here, "C")
            assert [(s, subj, data) for s, subj, data, _ in sourced] == [
                (i + 1, subj, data) for i, (_, subj, data) in enumerate(x for x in want if x[1] == "s.1")
            ]
            # The header names the origin stream (with the hash of its external API,
            # as nats-server's composeIName) and sequence, as nats-server writes it.
            api_hash = nats_hash("$JS.hub.API")
            assert all(src is not None and src.split(" ")[:2] == [f"S:{api_hash}", str(seq)]
                       for (_, _, _, src), (seq, _, _) in zip(sourced, [x for x in want if x[1] == "s.1"]))
            assert handle.broker.counters.messages_copied == 36 + 12
        finally:
            await here.aclose()
            await there.aclose()


async def test_an_unreachable_origin_is_reported_and_the_copy_resumes_without_gap_or_duplicate(tmp_path: Path) -> None:
    """A nats-server origin stopped while the copy runs: the copy stays readable,
    stream info says why, the counter grows; started again (same port and store), the
    copy catches up. Then the copying broker itself restarts while the origin moves
    on: it resumes from what it holds."""
    store = tmp_path / "origin"
    store.mkdir()
    with run_nats_server(store) as (_proc, port):
        url = await _fill(f"nats://127.0.0.1:{port}")
    remote = RemoteSettings(domain="hub", url=url)
    config = _copier_config(tmp_path, url)
    fixed = f'listen: "127.0.0.1:{port}"'
    async with start_server(config) as handle:
        here = await NatsLink.open(RemoteSettings(domain="local", url=handle.nats_url), 5)
        try:
            r = await api(here, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "S", "domain": "hub"}})
            assert "error" not in r, r
            with trio.fail_after(15):  # the origin is down: the copy says so
                while "error" not in (info := await api(here, "STREAM.INFO.M"))["mirror"]:
                    await trio.sleep(0.05)
            assert info["mirror"]["error"]["code"] == 503 and info["mirror"]["error"]["err_code"] == 10008
            assert handle.broker.counters.copy_origin_unreachable >= 1
            with _restarted(store, fixed):
                info = await wait_for(here, "M", 30, timeout=40)  # (the copier's backoff)
                assert "error" not in info["mirror"]
                there = await NatsLink.open(remote, 5)
                try:
                    want = await contents(there, "S")
                finally:
                    await there.aclose()
                assert await contents(here, "M") == want
        finally:
            await here.aclose()
    with _restarted(store, fixed):
        there = await NatsLink.open(remote, 5)
        try:
            await publish(there, 30, 5)
            async with start_server(config) as handle:
                here = await NatsLink.open(RemoteSettings(domain="local", url=handle.nats_url), 5)
                try:
                    await wait_for(here, "M", 35)
                    assert await contents(here, "M") == await contents(there, "S")
                    assert handle.broker.counters.messages_copied == 5  # only what was new
                finally:
                    await here.aclose()
        finally:
            await there.aclose()


class _restarted:
    """The nats-server of ``store`` again, on its old port."""

    def __init__(self, store: Path, listen: str) -> None:
        self.cm = run_nats_server(store, listen)

    def __enter__(self) -> None:
        self.cm.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.cm.__exit__(*exc)


@contextlib.contextmanager
def _origin_process(kind: str, store: Path) -> Iterator[str]:
    """The URL of an origin server of domain ``hub`` in a process of its own: a
    nats-server, or a ttlbroker (``[nats] domain = "hub"``)."""
    from conftest import BrokerProcess

    if kind == "nats-server":
        with run_nats_server(store) as (_proc, port):
            yield f"nats://127.0.0.1:{port}"
        return
    cfg = store / "origin.toml"
    cfg.write_text('[nats]\ndomain = "hub"\n')
    (store / "data").mkdir(exist_ok=True)
    proc = BrokerProcess(store / "data", "--fsync", "always", config_file=cfg)
    try:
        yield proc.nats_url
    finally:
        proc.stop()


@pytest.mark.parametrize("kind", ["nats-server", "ttlbroker"])
async def test_kill_9_of_the_copying_broker_in_the_middle_of_a_transfer(tmp_path: Path, kind: str) -> None:
    """A mirror of 3,000 messages of a stream on a nats-server or on another ttlbroker
    process, the copying broker killed with SIGKILL part-way (``fsync always``):
    after its restart the copy equals the origin, sequence for sequence, with no gap
    and no duplicate."""
    import signal

    from conftest import BrokerProcess

    store = tmp_path / "origin"
    store.mkdir()
    data = tmp_path / "copy"
    data.mkdir()
    with _origin_process(kind, store) as url:
        remote = RemoteSettings(domain="hub", url=url)
        there = await NatsLink.open(remote, 5)
        try:
            r = await api(there, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "allow_msg_ttl": True})
            assert "error" not in r, r
            for first in range(0, 3000, 500):
                await publish(there, first, 500, b"x" * 200)
            cfg = tmp_path / "copy.toml"
            cfg.write_text(f'[[nats.remotes]]\ndomain = "hub"\nurl = "{url}"\n')
            proc = BrokerProcess(data, "--fsync", "always", config_file=cfg)
            try:
                here = await NatsLink.open(RemoteSettings(domain="local", url=proc.nats_url), 5)
                r = await api(here, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "S", "domain": "hub"}})
                assert "error" not in r, r
                with trio.fail_after(30):
                    while (copied := (await api(here, "STREAM.INFO.M"))["state"]["messages"]) < 300:
                        await trio.sleep(0.005)
                await here.aclose()
            finally:
                proc.stop(signal.SIGKILL)
            print(f"killed with {copied} of 3000 copied")
            proc = BrokerProcess(data, "--fsync", "always", config_file=cfg)
            try:
                here = await NatsLink.open(RemoteSettings(domain="local", url=proc.nats_url), 5)
                try:
                    await wait_for(here, "M", 3000, timeout=60)
                    got = await contents(here, "M")
                finally:
                    await here.aclose()
            finally:
                proc.stop()
            want = await contents(there, "S")
            assert [(s, subj, data) for s, subj, data, _ in got] == [(s, subj, data) for s, subj, data, _ in want]
        finally:
            await there.aclose()


async def test_a_remote_copy_is_bound_by_its_users_permissions_on_the_origin(tmp_path: Path) -> None:
    """The origin, a ttlbroker with users, applies its permissions to a copying
    broker as to any client: a remote user allowed the API of domain hub, flow
    control and its inboxes copies; one allowed less gets the origin's
    ``Permissions Violation``, which the copy reports in its stream info (and
    copies nothing)."""
    users = [
        {"user": "admin", "password": "a"},
        {"user": "copier", "password": "c", "permissions": {
            "publish": ["$JS.hub.API.>", "$JS.FC.>"], "subscribe": ["_INBOX.>"]}},
        {"user": "nosy", "password": "n", "permissions": {"publish": ["s.>"], "subscribe": ["_INBOX.>"]}},
    ]
    d = tmp_path / "origin"
    d.mkdir()
    origin_cfg = make_config(d, **{"nats.enabled": True, "nats.domain": "hub", "auth.users": users, "limits.auth_failure_delay": 0})
    async with start_server(origin_cfg) as origin:
        url = origin.nats_url or ""
        admin = RemoteSettings(domain="hub", url=url, user="admin", password="a")
        link = await NatsLink.open(admin, 5)
        try:
            assert "error" not in await api(link, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "allow_msg_ttl": True})
            await publish(link, 0, 30)
        finally:
            await link.aclose()
        for user, password in (("copier", "c"), ("nosy", "n")):
            d = tmp_path / user
            d.mkdir()
            cfg = make_config(d, **{"nats.enabled": True,
                                    "nats.remotes": [{"domain": "hub", "url": url, "user": user, "password": password}]})
            async with start_server(cfg) as handle:
                here = await NatsLink.open(RemoteSettings(domain="local", url=handle.nats_url), 5)
                try:
                    r = await api(here, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "S", "domain": "hub"}})
                    assert "error" not in r, r
                    if user == "copier":
                        info = await wait_for(here, "M", 30)
                        assert "error" not in info["mirror"]
                        continue
                    with trio.fail_after(15):
                        while "error" not in (info := await api(here, "STREAM.INFO.M"))["mirror"]:
                            await trio.sleep(0.05)
                    assert info["state"]["messages"] == 0
                    assert 'Permissions Violation for Publish to "$JS.hub.API.' in info["mirror"]["error"]["description"]
                finally:
                    await here.aclose()
        assert origin.broker.counters.publish_permission_violations >= 1
