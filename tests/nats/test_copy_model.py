"""A property of copies, across servers and within one: for any interleaving of
publishes (with and without ``Nats-TTL``), deletes and expiries at the origin,
deletes and purges of the sourcing copy, and stops, crashes and starts of the
copying broker, every copy equals a model of the origin.

Two brokers in one trio run on virtual time (a rate-0 ``MockClock`` and one broker
``Clock`` for both, so their timestamps agree): A holds the origin stream ``S`` and a
local mirror of it; B (``[[nats.remotes]] domain = "hub"``: A) holds a mirror ``M``
and a mirror ``M0`` without ``allow_msg_ttl``, and a source ``C``, all of ``S``.

The model, as ``docs/semantics.md`` ("Mirrors and sources") states it:

* a copy takes each origin message that is live (not deleted, not expired) at some
  moment its copier runs: at once while B is up, else when B starts again, which
  resumes after the newest origin sequence the copy holds;
* deletes at the origin are not copied (nats-server's mirrors and sources do not
  copy them either);
* a mirror keeps the origin's sequence and timestamp: with ``allow_msg_ttl`` it
  expires a message when the origin does, without it keeps the message;
* a source numbers what it takes 1, 2, 3... and stamps it with the time of the copy,
  so with ``allow_msg_ttl`` a message taken late lives on after the origin's copy;
  what it took once it never takes again, even when its copy was deleted or purged
  and the broker stopped or crashed since (a crash: B's files as a ``kill -9``
  leaves them, a snapshot taken while it runs).

Time moves in quarter seconds and every TTL ends in 125 ms, so no check lands on a
deadline (the expiry engine fires on its 10 ms tick)."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from conftest import make_config, start_server
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_mirror_remote import api, contents

from broker import Clock
from broker.config import RemoteSettings
from broker.replication import NatsLink
from protocol.nats import encode_nats_headers

STEP = 0.25  # virtual time moves in steps shorter than the copy's heartbeat (1 s)
COPIES = ("M", "M0", "C", "LM")


@dataclass
class Msg:
    seq: int
    subject: str
    data: bytes
    at: float  # virtual publish time
    ttl: float | None
    deleted: bool = False

    def expires(self, copied_at: float) -> float | None:
        return None if self.ttl is None else copied_at + self.ttl


@dataclass
class Model:
    now: float = 0.0
    b_up: bool = True
    origin: list[Msg] = field(default_factory=list)
    #: mirror name -> origin seq -> (subject, data, expiry or None)
    mirrors: dict[str, dict[int, tuple[str, bytes, float | None]]] = field(
        default_factory=lambda: {"M": {}, "M0": {}, "LM": {}})
    #: the source: (subject, data, expiry or None, origin seq); its own sequences
    #: grow, and may leap after a crash (offsets reserved ahead are never reused)
    source: list[tuple[str, bytes, float | None, int]] = field(default_factory=list)
    taken: dict[str, int] = field(default_factory=lambda: {"M": 0, "M0": 0, "C": 0, "LM": 0})

    def live(self, m: Msg) -> bool:
        return not m.deleted and (m.ttl is None or self.now < m.at + m.ttl)

    def copy_up_to_date(self, names: tuple[str, ...]) -> None:
        """What the copiers of ``names`` take now: every live origin message past
        what each holds."""
        for m in self.origin:
            if not self.live(m):
                continue
            for name in names:
                if m.seq <= self.taken[name]:
                    continue
                self.taken[name] = m.seq
                if name == "C":
                    self.source.append((m.subject, m.data, m.expires(self.now), m.seq))
                else:
                    expiry = m.expires(m.at) if name != "M0" else None
                    self.mirrors[name][m.seq] = (m.subject, m.data, expiry)

    def expected(self, name: str) -> list[tuple[Any, ...]]:
        def alive(expiry: float | None) -> bool:
            return expiry is None or self.now < expiry

        if name == "S":
            return [(m.seq, m.subject, m.data) for m in self.origin if self.live(m)]
        if name == "C":
            return [(subj, data, oseq) for subj, data, exp, oseq in self.source if alive(exp)]
        return [(seq, subj, data) for seq, (subj, data, exp) in sorted(self.mirrors[name].items()) if alive(exp)]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("pub"), st.integers(0, 2), st.sampled_from([None, None, 1.125, 2.125, 4.125])),
        st.tuples(st.just("del"), st.integers(0, 1000)),
        st.tuples(st.just("adv"), st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0])),
        st.tuples(st.just("flip")),  # stop B, or start it again
        st.tuples(st.just("crash")),  # B as after kill -9, started again
        st.tuples(st.just("cdel"), st.integers(0, 1000)),  # delete a message of the source C
        st.tuples(st.just("cpurge")),
    ),
    min_size=1, max_size=24,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=ops)
# A TTL'd message taken late by the source outlives the origin's; one deleted, and
# one expired, while B was down are never taken; B's copies expire while it is down.
@example(ops=[("flip",), ("pub", 0, 1.125), ("adv", 1.0), ("flip",), ("adv", 0.5), ("adv", 1.0)])
@example(ops=[("pub", 1, None), ("flip",), ("pub", 2, None), ("pub", 0, 1.125), ("del", 1), ("adv", 2.0),
              ("pub", 1, 2.125), ("flip",), ("pub", 0, None), ("del", 0), ("flip",), ("adv", 3.0), ("flip",)])
# What the source took and then lost (a purge, a delete of its newest copy) is not
# taken again after a clean stop or a crash.
@example(ops=[("pub", 0, None), ("pub", 1, None), ("cpurge",), ("flip",), ("flip",), ("pub", 2, None)])
@example(ops=[("pub", 0, None), ("pub", 1, None), ("cdel", 1), ("crash",), ("pub", 2, None), ("cdel", 0),
              ("cdel", 0), ("crash",)])
def test_copies_equal_a_model_of_their_origin(tmp_path_factory: Any, ops: list[tuple[Any, ...]]) -> None:
    root = tmp_path_factory.mktemp("copy-model")
    trio.run(_scenario, root, ops, clock=trio.testing.MockClock(rate=0))


async def _scenario(root: Path, ops: list[tuple[Any, ...]]) -> None:
    clock = Clock()
    model = Model()
    (root / "a").mkdir()
    (root / "b").mkdir()
    a_config = make_config(root / "a", **{"nats.enabled": True, "nats.domain": "hub", "system.partition.fsync": "never"})
    async with start_server(a_config, clock) as a, trio.open_nursery() as nursery:
        there = await NatsLink.open(RemoteSettings(domain="hub", url=a.nats_url), 5)
        b_config = make_config(root / "b", **{
            "nats.enabled": True, "system.partition.fsync": "never",
            "nats.remotes": [{"domain": "hub", "url": a.nats_url}],
        })
        await _ok(there, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "allow_msg_ttl": True})
        await _ok(there, "STREAM.CREATE.LM", {"name": "LM", "mirror": {"name": "S"}, "allow_msg_ttl": True})
        b: B | None = await B.start(nursery, b_config, clock, create=True)
        try:
            for op in ops:
                if op[0] == "pub":
                    subject, data = f"s.{op[1]}", f"m{len(model.origin) + 1}".encode()
                    headers = encode_nats_headers([("Nats-TTL", f"{int(op[2] * 1000)}ms")]) if op[2] else None
                    ack = json.loads((await there.request(subject, data, 5, headers)).payload)
                    assert ack.get("seq") == len(model.origin) + 1, ack
                    model.origin.append(Msg(ack["seq"], subject, data, model.now, op[2]))
                elif op[0] == "del":
                    live = [m for m in model.origin if model.live(m)]
                    if not live:
                        continue
                    m = live[op[1] % len(live)]
                    await _ok(there, "STREAM.MSG.DELETE.S", {"seq": m.seq})
                    m.deleted = True
                elif op[0] in ("cdel", "cpurge"):
                    if b is None:
                        continue
                    live = [e for e in model.source if e[2] is None or model.now < e[2]]
                    if op[0] == "cpurge":
                        await _ok(b.link, "STREAM.PURGE.C", {})
                        model.source.clear()
                    elif live:
                        k = op[1] % len(live)
                        held = await contents(b.link, "C")  # (the model was checked: the same, in order)
                        await _ok(b.link, "STREAM.MSG.DELETE.C", {"seq": held[k][0]})
                        model.source.remove(live[k])
                elif op[0] == "crash" and b is not None:
                    await _check(model, there, b.link, op)
                    await b.crash(root / "b")
                    b = await B.start(nursery, b_config, clock)
                elif op[0] == "adv":
                    for _ in range(round(op[1] / STEP)):
                        trio.lowlevel.current_clock().jump(STEP)  # type: ignore[attr-defined]
                        await trio.testing.wait_all_tasks_blocked()
                    model.now += op[1]
                elif op[0] == "flip" and b is not None:
                    await _check(model, there, b.link, op)  # what B holds as it stops
                    await b.stop()
                    b = None
                    model.b_up = False
                else:
                    b = await B.start(nursery, b_config, clock)
                    model.b_up = True
                model.copy_up_to_date(("M", "M0", "C", "LM") if model.b_up else ("LM",))
                await _check(model, there, b.link if b is not None else None, op, full=False)
            if b is None:
                b = await B.start(nursery, b_config, clock)
                model.copy_up_to_date(COPIES)
            await _check(model, there, b.link, ("end",))
        finally:
            if b is not None:
                await b.stop()
            await there.aclose()


@dataclass
class B:
    """The copying broker, running in its own nursery so the test can stop it."""

    link: NatsLink
    cancel: trio.CancelScope
    done: trio.Event

    @classmethod
    async def start(cls, nursery: trio.Nursery, config: Any, clock: Clock, create: bool = False) -> B:
        done = trio.Event()

        async def run(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with trio.CancelScope() as scope:
                    async with start_server(config, clock) as handle:
                        task_status.started((handle, scope))
                        await trio.sleep_forever()
            finally:
                done.set()

        handle, scope = await nursery.start(run)
        link = await NatsLink.open(RemoteSettings(domain="local", url=handle.nats_url), 5)
        if create:
            await _ok(link, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "S", "domain": "hub"}, "allow_msg_ttl": True})
            await _ok(link, "STREAM.CREATE.M0", {"name": "M0", "mirror": {"name": "S", "domain": "hub"}})
            await _ok(link, "STREAM.CREATE.C", {
                "name": "C", "sources": [{"name": "S", "external": {"api": "$JS.hub.API"}}], "allow_msg_ttl": True,
            })
        return cls(link, scope, done)

    async def stop(self) -> None:
        await self.link.aclose()
        self.cancel.cancel()
        await self.done.wait()

    async def crash(self, data_dir: Path) -> None:
        """Stop, leaving ``data_dir`` as a ``kill -9`` would: its files as they are
        while the broker runs (copied at a moment the broker's loop does nothing: the
        test runs on it), put back after the stop wrote its clean close."""
        await trio.testing.wait_all_tasks_blocked()
        snapshot = data_dir.with_name(data_dir.name + "-crash")
        shutil.copytree(data_dir, snapshot)
        await self.stop()
        shutil.rmtree(data_dir)
        snapshot.rename(data_dir)


async def _ok(link: NatsLink, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await api(link, subject, body)
    assert "error" not in r, (subject, r)
    return r


async def _stored(link: NatsLink, stream: str) -> list[tuple[Any, ...]]:
    held = await contents(link, stream)
    if stream == "C":  # (the sequences grow: the source numbers what it takes)
        assert [m[0] for m in held] == sorted({m[0] for m in held})
        return [(subject, data, int(src.split(" ")[1])) for _, subject, data, src in held]
    return [(seq, subject, data) for seq, subject, data, _ in held]


async def _counts(link: NatsLink, stream: str) -> int:
    return (await api(link, f"STREAM.INFO.{stream}"))["state"]["messages"]  # type: ignore[no-any-return]


async def _check(model: Model, there: NatsLink, here: NatsLink | None, op: tuple[Any, ...], full: bool = True) -> None:
    """The brokers hold what the model says: every message (``full``), else the
    message counts. Copies travel over loopback sockets: the first look may come
    before the last bytes do, so a few looks, a few ms of real time apart."""
    where = [(there, "S"), (there, "LM")] + ([(here, name) for name in ("M", "M0", "C")] if here is not None else [])
    for name in ("S", "LM", "M", "M0", "C"):
        want: Any = model.expected(name)
        for attempt in range(50):
            await trio.testing.wait_all_tasks_blocked()
            link = next((lk for lk, n in where if n == name), None)
            if link is None:
                break
            got: Any = await _stored(link, name) if full else await _counts(link, name)
            if got == (want if full else len(want)):
                break
            await trio.to_thread.run_sync(time.sleep, 0.01)
        else:
            raise AssertionError(f"after {op} at t={model.now}: {name} holds {got}, the model {want}")
