"""Users and permissions on the NATS listener, with nats-server's semantics: users
with plain and bcrypt passwords and NKeys, CONNECT's credentials checked, and
publish, subscribe and response permissions, with nats-py and raw NATS."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import bcrypt
import nacl.signing
import nats
import nats.js.api
import nkeys
import pytest
import trio

import protocol.nats as PN
from broker.config import Config, ConfigError
from tests.conftest import make_config, start_server
from tests.helpers import RawNats, in_asyncio, log_events

ERR = PN.NatsErr


def _seed() -> tuple[str, str]:
    """A user NKey: (seed, public key)."""
    raw = bytes(nacl.signing.SigningKey.generate())
    seed = nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_USER).decode()
    return seed, nkeys.from_seed(seed.encode()).public_key.decode()


SEED, PUBLIC = _seed()
HASHED = bcrypt.hashpw(b"hunter2", bcrypt.gensalt(rounds=4)).decode()

USERS: list[dict[str, Any]] = [
    {"user": "admin", "password": "plain-pw", "permissions": {}},  # (its own: none, so everything)
    {"user": "hashed", "password": HASHED, "permissions": {}},
    {"nkey": PUBLIC, "permissions": {}},
    {"user": "orders", "password": "o", "permissions": {
        "publish": {"allow": ["orders.>", "$JS.API.>", "$JS.ACK.ORDERS.>"], "deny": ["orders.secret", "$JS.API.STREAM.DELETE.>"]},
        "subscribe": {"allow": ["_INBOX.>", "orders.>", "jobs.* workers"], "deny": ["orders.secret"]},
    }},
    {"user": "svc", "password": "s", "permissions": {"subscribe": ["svc.>"], "allow_responses": True}},
    {"user": "reader", "password": "r"},  # the default permissions
]
DEFAULT = {"publish": {"deny": [">"]}}


def users_config(data_dir: Path, **more: Any) -> Config:
    return make_config(data_dir, **{
        "nats.enabled": True, "limits.auth_failure_delay": 0, "auth.users": USERS,
        "auth.default_permissions": DEFAULT, **more,
    })


def _url(url: str, user: str, password: str) -> str:
    return url.replace("nats://", f"nats://{user}:{password}@")


async def _raw(url: str, **connect: Any) -> RawNats:
    peer = await RawNats.open(url)
    await peer.connect(**connect)
    return peer


async def _after(peer: RawNats, data: bytes) -> list[object]:
    """What the server answers to ``data`` up to the PONG of a PING sent after it."""
    await peer.send(data + b"PING\r\n")
    seen = []
    while (ev := await peer.next_event()) is not PN.NatsPong:
        assert ev is not None, seen
        seen.append(ev)
    return seen


async def test_users_with_plain_and_bcrypt_passwords_and_nkeys(data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with start_server(users_config(data_dir)) as handle:
        url = handle.nats_url or ""

        async def good() -> list[bytes]:
            out = []
            for nc in [
                await nats.connect(_url(url, "admin", "plain-pw")),
                await nats.connect(_url(url, "hashed", "hunter2")),
                await nats.connect(url, user="hashed", password="hunter2"),
                await nats.connect(url, nkeys_seed_str=SEED),
            ]:
                sub = await nc.subscribe("_INBOX.t")
                await nc.flush()
                await nc.publish("_INBOX.t", b"hi")
                out.append((await sub.next_msg(timeout=5)).data)
                await nc.close()
            return out

        assert await in_asyncio(good) == [b"hi"] * 4

        async def bad(**kw: Any) -> str:
            with pytest.raises(Exception) as info:
                await nats.connect(allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5, **kw)
            return str(info.value).lower()

        other_seed, _ = _seed()
        for kw in [
            {"servers": _url(url, "admin", "bad-pw-7")}, {"servers": _url(url, "hashed", "hunter3")},
            {"servers": _url(url, "nobody", "x")}, {"servers": url}, {"servers": url, "token": "t"},
            {"servers": url, "nkeys_seed_str": other_seed},
        ]:
            assert "authorization violation" in await in_asyncio(bad, **kw), kw

        info = await RawNats.open(url)
        got = await info.connect(user="admin", **{"pass": "bad-pw-7"})
        assert got["auth_required"] is True and len(got["nonce"]) >= 11
        assert await info.until_closed() == [ERR("Authorization Violation")]
        # A signature of another nonce (a replay) is refused too.
        peer = await RawNats.open(url)
        await peer.connect(nkey=PUBLIC, sig="AAAA")
        assert await peer.until_closed() == [ERR("Authorization Violation")]
        assert handle.broker.counters.auth_failures == 8
    lines = [r.getMessage() + json.dumps(getattr(r, "fields", {}), default=str) for r in caplog.records]
    assert not any("plain-pw" in line or "bad-pw" in line or "hunter" in line for line in lines)
    refused = log_events(caplog, "handshake_failed")
    assert refused and "admin" in str(refused[0]["error"])


async def test_publish_permissions_answer_as_nats_server_and_the_connection_goes_on(
    data_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    async with start_server(users_config(data_dir)) as handle:
        url = handle.nats_url or ""
        watcher = await _raw(url, user="admin", **{"pass": "plain-pw"})
        assert await _after(watcher, b"SUB orders.> 1\r\n") == []
        peer = await _raw(url, user="orders", **{"pass": "o"})
        assert await _after(peer, b"PUB orders.new 2\r\nok\r\n") == []
        assert await _after(peer, b"PUB orders.secret 1\r\nx\r\n") == [
            ERR('Permissions Violation for Publish to "orders.secret"')]
        assert await _after(peer, b"PUB billing.x 1\r\nx\r\nPUB orders.more 2\r\nok\r\n") == [
            ERR('Permissions Violation for Publish to "billing.x"')]
        got = await _after(watcher, b"")
        assert [(m.subject, m.payload) for m in got] == [("orders.new", b"ok"), ("orders.more", b"ok")]
        # The default permissions: a user without its own publishes nothing.
        reader = await _raw(url, user="reader", **{"pass": "r"})
        assert await _after(reader, b"PUB a 0\r\n\r\n") == [ERR('Permissions Violation for Publish to "a"')]
        counters = handle.broker.counters
        assert counters.publish_permission_violations == 3
    logged = log_events(caplog, "permission_violation")
    assert logged[0]["user"] == "orders" and logged[0]["subject"] == "orders.secret" and logged[0]["kind"] == "publish"
    assert str(logged[0]["peer"]).startswith("127.0.0.1:")
    assert len(logged) == 1  # one line per peer host per 10 s (the others counted, left out)


async def test_subscribe_permissions_queues_and_denied_deliveries(data_dir: Path) -> None:
    async with start_server(users_config(data_dir)) as handle:
        url = handle.nats_url or ""
        peer = await _raw(url, user="orders", **{"pass": "o"})
        assert await _after(peer, b"SUB billing.> 1\r\n") == [ERR('Permissions Violation for Subscription to "billing.>"')]
        assert await _after(peer, b"SUB orders.secret 2\r\n") == [
            ERR('Permissions Violation for Subscription to "orders.secret"')]
        # Queue entries: "jobs.* workers" allows only that group on jobs.*.
        assert await _after(peer, b"SUB jobs.a others 3\r\n") == [
            ERR('Permissions Violation for Subscription to "jobs.a" using queue "others"')]
        assert await _after(peer, b"SUB jobs.a 4\r\n") == [ERR('Permissions Violation for Subscription to "jobs.a"')]
        assert await _after(peer, b"SUB jobs.a workers 5\r\n") == []
        # A wildcard wider than a deny entry is allowed; what is denied is not delivered.
        assert await _after(peer, b"SUB orders.> 6\r\n") == []
        admin = await _raw(url, user="admin", **{"pass": "plain-pw"})
        await admin.send(b"PUB orders.secret 1\r\ns\r\nPUB orders.open 1\r\no\r\nPUB jobs.a 1\r\nj\r\n")
        got = await _after(peer, b"")
        while len(got) < 2:
            got += await _after(peer, b"")
        assert sorted((m.subject, m.sid, m.payload) for m in got) == [("jobs.a", "5", b"j"), ("orders.open", "6", b"o")]
        assert handle.broker.counters.subscribe_permission_violations == 4


async def test_allow_responses_lets_a_service_answer_once(data_dir: Path) -> None:
    async with start_server(users_config(data_dir)) as handle:
        url = handle.nats_url or ""
        svc = await _raw(url, user="svc", **{"pass": "s"})
        assert await _after(svc, b"SUB svc.echo 1\r\n") == []
        assert await _after(svc, b"PUB svc.other 0\r\n\r\n") == [ERR('Permissions Violation for Publish to "svc.other"')]

        async def request() -> bytes:
            nc = await nats.connect(_url(url, "admin", "plain-pw"))
            msg = await nc.request("svc.echo", b"ping", timeout=5)
            await nc.close()
            return msg.data

        async def serve() -> list[object]:
            ev = await svc.next_event()
            assert isinstance(ev, PN.NatsMsg) and ev.reply
            reply = ev.reply.encode()
            first = await _after(svc, b"PUB " + reply + b" 4\r\npong\r\n")
            second = await _after(svc, b"PUB " + reply + b" 4\r\nmore\r\n")  # one response only
            return [first, second, ev.reply]

        async with trio.open_nursery() as nursery:
            out: dict[str, Any] = {}

            async def run_serve() -> None:
                out["served"] = await serve()

            nursery.start_soon(run_serve)
            out["answer"] = await in_asyncio(request)
        first, second, reply = out["served"]
        assert out["answer"] == b"pong" and first == []
        assert second == [ERR(f'Permissions Violation for Publish to "{reply}"')]


async def test_the_jetstream_api_and_kv_are_subjects_too(data_dir: Path) -> None:
    async with start_server(users_config(data_dir)) as handle:
        url = handle.nats_url or ""

        async def scenario() -> tuple[Any, ...]:
            admin = await nats.connect(_url(url, "admin", "plain-pw"))
            await admin.jetstream().add_stream(name="ORDERS", subjects=["orders.>"])
            errors: list[str] = []

            async def on_error(e: Exception) -> None:
                errors.append(str(e))

            nc = await nats.connect(_url(url, "orders", "o"), error_cb=on_error)
            js = nc.jetstream(timeout=1)
            ack = await js.publish("orders.a", b"1")
            with pytest.raises(nats.errors.TimeoutError):
                await js.delete_stream("ORDERS")  # refused: no answer, as nats-server
            info = await admin.jetstream().stream_info("ORDERS")
            await admin.jetstream().create_key_value(bucket="live")
            kv = await js.key_value("live")  # (the API: allowed)
            with pytest.raises(nats.errors.TimeoutError):
                await kv.put("k", b"v")  # $KV.live.k: not in its publish allow list
            kv_nc = await nats.connect(_url(url, "reader", "r"), error_cb=on_error)
            with pytest.raises(nats.errors.TimeoutError):
                await kv_nc.jetstream(timeout=1).create_key_value(bucket="cfg")
            await asyncio.sleep(0.1)
            await nc.close()
            await kv_nc.close()
            await admin.close()
            return ack.seq, info.state.messages, errors

        seq, messages, errors = await in_asyncio(scenario)
        assert (seq, messages) == (1, 1)
        # (nats-py reports the server's -ERR in lower case)
        assert errors == ['nats: permissions violation for publish to "$js.api.stream.delete.orders"',
                          'nats: permissions violation for publish to "$kv.live.k"',
                          'nats: permissions violation for publish to "$js.api.stream.create.kv_cfg"']


@pytest.mark.parametrize("users, message", [
    ([{"user": "a"}], "auth.users[0].password: required for user 'a'"),
    ([{"password": "x"}], "auth.users[0]: give user and password, or nkey"),
    ([{"user": "a", "password": "$2a$bad"}], "auth.users[0].password: starts with $2 but is not a bcrypt hash"),
    ([{"nkey": "UABC"}], "auth.users[0].nkey: 'UABC' is not a user's public NKey"),
    ([{"nkey": PUBLIC, "user": "a"}], "auth.users[0]: an nkey user has no user or password"),
    ([{"user": "a", "password": "x"}, {"user": "a", "password": "y"}], "auth.users[1].user: 'a' is also auth.users[0]"),
    ([{"user": "a", "password": "x", "permissions": {"publish": "a..b"}}],
     "auth.users[0].permissions.publish: 'a..b' is not a valid subject"),
    ([{"user": "a", "password": "x", "permissions": {"publish": "a q"}}],
     "auth.users[0].permissions.publish: 'a q' is not a subject (a queue group has no meaning for publish)"),
    ([{"user": "a", "password": "x", "permissions": {"sub": "a"}}], "unknown configuration key 'auth.users[0].permissions.sub'"),
    ([{"user": "a", "password": "x", "permissions": {"allow_responses": {"max": "1"}}}],
     "auth.users[0].permissions.allow_responses.max: expected an integer"),
])
def test_configuration_errors_name_the_key(data_dir: Path, users: list[Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_config(data_dir, **{"auth.users": users})
    assert str(info.value).startswith(message), str(info.value)


def test_a_token_and_users_are_not_both_given(data_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"give \[server\] auth_token or \[\[auth.users\]\], not both"):
        make_config(data_dir, **{"auth.users": [{"user": "a", "password": "x"}], "server.auth_token": "t"})


def test_allow_responses_turns_off_the_blanket_publish_allow(data_dir: Path) -> None:
    cfg = make_config(data_dir, **{"auth.users": [
        {"user": "a", "password": "x", "permissions": {"allow_responses": {"max": 2, "expires": "1m"}}}]})
    perms = cfg.auth.users[0].permissions
    assert perms is not None and perms.publish is not None and perms.publish.allow == ()
    assert perms.allow_responses is not None and (perms.allow_responses.max_msgs, perms.allow_responses.expires) == (2, 60.0)



def _nats_server_users() -> str:
    """USERS' admin and orders as a nats-server ``authorization`` block."""
    def entry(u: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in u.items() if k in ("user", "password", "permissions") and v})
    return "authorization {\n  users = [\n" + ",\n".join(entry(u) for u in USERS if u.get("user") in ("admin", "orders")) + "\n  ]\n}\n"


async def _consumer_deliveries(url: str) -> tuple[list[str], list[str], list[str]]:
    """What user orders (subscribe deny orders.secret) gets from consumers of a
    stream holding orders.a, orders.secret, orders.b: a pull on a connection with
    only its inbox, then a pull and a push on a connection that also subscribes to
    orders.> (a wildcard wider than the deny entry)."""
    admin = await nats.connect(_url(url, "admin", "plain-pw"))
    ajs = admin.jetstream()
    await ajs.add_stream(name="ORDERS", subjects=["orders.>"])
    for subject in ("orders.a", "orders.secret", "orders.b"):
        await ajs.publish(subject, b"x")

    async def pulled(nc: Any, durable: str) -> list[str]:
        pull = await nc.jetstream(timeout=2).pull_subscribe("orders.>", durable=durable)
        got: list[str] = []
        with contextlib.suppress(nats.errors.TimeoutError):
            while len(got) < 3:
                for m in await pull.fetch(3, timeout=0.5):
                    got.append(m.subject)
                    await m.ack()
        return got

    inbox_only = await nats.connect(_url(url, "orders", "o"))
    first = await pulled(inbox_only, "first")
    wide = await nats.connect(_url(url, "orders", "o"))
    await wide.subscribe("orders.>")
    second = await pulled(wide, "second")
    push = await wide.jetstream(timeout=2).subscribe(
        "orders.>", durable="pushed", manual_ack=True, config=nats.js.api.ConsumerConfig(deliver_subject="_INBOX.pushed"))
    pushed: list[str] = []
    with contextlib.suppress(nats.errors.TimeoutError):
        while len(pushed) < 3:
            m = await push.next_msg(timeout=0.5)
            pushed.append(m.subject)
            await m.ack()
    for nc in (inbox_only, wide, admin):
        await nc.close()
    return first, second, pushed


@pytest.mark.parametrize("server", ["ttlbroker", "nats-server"])
async def test_consumer_deliveries_follow_the_users_subscribe_permissions(data_dir: Path, server: str) -> None:
    """Consumer deliveries are checked as the subjects they carry, as nats-server
    checks them (deliverMsg's checkDenySub): once a connection holds a subscription
    that could receive a denied subject, a message on a denied subject is not
    delivered to any of its subscriptions, its inboxes included; a connection
    without one is not filtered (a subscription to exactly a denied subject is
    refused in the first place). Against both servers, the same answers."""
    if server == "nats-server":
        from test_remote_origin import run_nats_server

        with run_nats_server(data_dir, _nats_server_users()) as (_proc, port):
            got = await in_asyncio(lambda: _consumer_deliveries(f"nats://127.0.0.1:{port}"))
    else:
        async with start_server(users_config(data_dir)) as handle:
            got = await in_asyncio(lambda: _consumer_deliveries(handle.nats_url or ""))
    first, second, pushed = got
    assert first == ["orders.a", "orders.secret", "orders.b"]
    assert second == ["orders.a", "orders.b"]
    assert pushed == ["orders.a", "orders.b"]
