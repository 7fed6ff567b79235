"""Users and permissions on the binary protocol: the handshake's user and password,
and each command checked against the subject it acts on (docs/protocol.md, "Users
and permissions"), with the bundled client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import protocol as P
from broker.client import connect
from tests.conftest import make_config, start_server

USERS: list[dict[str, Any]] = [
    {"user": "admin", "password": "a", "permissions": {}},
    {"user": "orders", "password": "o", "permissions": {
        "publish": {"allow": ["orders.>", "$JS.API.STREAM.MSG.GET.shop.orders", "$JS.API.STREAM.INFO.shop.orders"],
                    "deny": ["orders.secret"]},
        "subscribe": {"allow": ["orders.>"], "deny": ["orders.secret"]},
    }},
]


def config(data_dir: Path) -> Any:
    return make_config(data_dir, **{"auth.users": USERS, "limits.auth_failure_delay": 0})


async def test_the_handshake_checks_the_user_and_password(data_dir: Path) -> None:
    async with start_server(config(data_dir)) as handle:
        for kw, message in [
            ({"user": "orders", "password": "bad-pw-7"}, "user 'orders': unknown, or the password is wrong"),
            ({"user": "nobody", "password": "x"}, "user 'nobody': unknown, or the password is wrong"),
            ({}, "a user and password are required"),
            ({"token": "t"}, "a user and password are required"),
        ]:
            with pytest.raises(P.BrokerError) as info:
                async with connect(handle.address, reconnect=False, **kw):
                    pass
            assert (info.value.code, info.value.message) == (P.ErrorCode.UNAUTHORIZED, message), kw
        async with connect(handle.address, user="admin", password="a") as c:
            assert (await c.stats())["auth_failures"] == 4


async def test_each_command_is_checked_against_its_subject(data_dir: Path) -> None:
    async with start_server(config(data_dir)) as handle:
        async with connect(handle.address, user="admin", password="a") as admin:
            await admin.create_stream("shop")
            await admin.create_topic("shop", "orders", subjects=["orders.>"])
            await admin.create_topic("shop", "billing", subjects=["billing.>"])
        async with connect(handle.address, user="orders", password="o") as c:
            ack = await c.publish("orders.new", b"1")
            assert ack.offset == 1
            for call, subject in [
                (lambda: c.publish("billing.x", b"2"), "publish to 'billing.x'"),
                (lambda: c.publish("orders.secret", b"3"), "publish to 'orders.secret'"),
                (lambda: c.delete_topic("shop", "orders"), "publish to '$JS.API.STREAM.DELETE.shop.orders'"),
                (lambda: c.purge("shop", "orders"), "publish to '$JS.API.STREAM.PURGE.shop.orders'"),
                (lambda: c.create_stream("other"), "publish to '$TB.API.STREAM.CREATE.other'"),
                (lambda: c.fetch("shop", "billing", 0, 1, 10), None),
            ]:
                with pytest.raises(P.BrokerError) as info:
                    await call()
                assert info.value.code == P.ErrorCode.PERMISSION_DENIED
                if subject is not None:
                    assert info.value.message == f"permissions violation: this user may not {subject}"
            # What it may do, it does: read its own topic, see it.
            fetched = await c.fetch("shop", "orders", 0, 1, 10)
            assert [m.payload for m in fetched.messages] == [b"1"]
            assert (await c.get_topic("shop", "orders")).messages_count == 1
            # A batch with one subject not allowed is refused whole.
            with pytest.raises(P.BrokerError) as info:
                await c.publish_batch([("orders.a", b"x"), ("billing.b", b"y")])
            assert info.value.code == P.ErrorCode.PERMISSION_DENIED
            assert (await c.get_topic("shop", "orders")).messages_count == 1
        async with connect(handle.address, user="admin", password="a") as admin:
            stats = await admin.stats()
            assert stats["publish_permission_violations"] == 7


async def test_subscriptions_are_checked_and_denied_subjects_not_delivered(data_dir: Path) -> None:
    async with start_server(config(data_dir)) as handle:
        async with connect(handle.address, user="orders", password="o") as c, \
                connect(handle.address, user="admin", password="a") as admin:
            await admin.create_stream("shop")
            await admin.create_topic("shop", "orders", subjects=["orders.>"])
            with pytest.raises(P.BrokerError) as info:
                await c.subscribe("billing.>")
            assert (info.value.code, info.value.message) == (
                P.ErrorCode.PERMISSION_DENIED, "permissions violation: this user may not subscribe to 'billing.>'")
            sub = await c.subscribe("orders.>")
            await admin.publish("orders.secret", b"s")
            await admin.publish("orders.open", b"o")
            with trio.fail_after(5):
                got = await sub.next()
            assert (got.subject, got.payload) == ("orders.open", b"o")
            assert (await admin.stats())["subscribe_permission_violations"] == 1


async def test_no_auth_on_a_listener_others_can_reach_is_warned_about(data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.helpers import log_events

    async with start_server(make_config(data_dir, **{"server.host": "0.0.0.0", "nats.enabled": True, "nats.host": "127.0.0.1"})):
        pass
    warned = log_events(caplog, "no_auth_on_open_listener")
    assert [(w["level"], w["host"]) for w in warned] == [("WARNING", "0.0.0.0")]
    caplog.clear()
    async with start_server(make_config(data_dir, **{"server.host": "0.0.0.0", "auth.users": USERS})):
        pass
    assert log_events(caplog, "no_auth_on_open_listener") == []


async def test_the_cli_takes_a_user_and_password(data_dir: Path) -> None:
    from tests.helpers import run_cli

    async with start_server(config(data_dir)) as handle:
        ok = await trio.to_thread.run_sync(lambda: run_cli(handle.address, "--user", "admin", "--password", "a", "stats",
                                                           json_out=True))
        assert '"auth_failures": 0' in ok.stdout or '"auth_failures":0' in ok.stdout.replace(" ", "")
        bad = await trio.to_thread.run_sync(lambda: run_cli(handle.address, "--user", "orders", "stats", check=False))
        assert bad.returncode != 0 and "UNAUTHORIZED" in bad.stderr and "user 'orders'" in bad.stderr
        denied = await trio.to_thread.run_sync(lambda: run_cli(handle.address, "--user", "orders", "--password", "o",
                                                               "stats", check=False))
        assert denied.returncode != 0 and "PERMISSION_DENIED" in denied.stderr and "$TB.API.STATS" in denied.stderr
