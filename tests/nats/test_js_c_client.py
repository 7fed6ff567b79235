"""A third language: the C client (``libnats``, Debian's ``libnats-dev``; ``.ci/run``
installs it) makes push consumers with ``js_SubscribeSync`` on ttlbroker's NATS
listener. tests/nats/c/push.c is built with gcc once per session. Without gcc or
the library the tests skip with the reason; under CI (``CI`` set) they fail instead.

The expected values are what the same program prints against nats-server 2.15.1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from conftest import require

C_DIR = Path(__file__).resolve().parent / "c"


def _c_missing() -> str | None:
    if shutil.which("gcc") is None:
        return "the C client tests need gcc: none on PATH"
    if not Path("/usr/include/nats/nats.h").exists():
        return "the C client tests need libnats (apt-get install libnats-dev): no /usr/include/nats/nats.h"
    return None


@pytest.fixture(scope="session")
def c_push(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/nats/c/push.c, compiled."""
    require(_c_missing(), "the C client tests")
    exe = tmp_path_factory.mktemp("c") / "push"
    p = subprocess.run(
        ["gcc", "-O1", "-Wall", "-Werror", "-o", str(exe), str(C_DIR / "push.c"), "-lnats"],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, f"gcc failed:\n{p.stderr}"
    return exe


async def test_c_client_push_consumers(c_push: Path, nats_url: str) -> None:
    with trio.fail_after(60):
        p = await trio.run_process([str(c_push), nats_url], capture_stdout=True, capture_stderr=True, check=False)
    assert p.returncode == 0, (p.stdout.decode(), p.stderr.decode())
    out = json.loads(p.stdout)
    four = [["cp.a.even", "m0", 1], ["cp.a.odd", "m1", 1], ["cp.a.even", "m2", 1], ["cp.a.odd", "m3", 1]]
    # A durable with explicit acks: each message once, all acked.
    assert out["durable"] == four
    assert out["durable_info"] == {"num_ack_pending": 0, "num_pending": 0, "push_bound": True, "ack_floor": 4}
    # Ack policy none: only its filter's messages; ack policy all: one ack of the last
    # covers the rest.
    assert out["ack_none"] == [["cp.a.even", "m0", 1], ["cp.a.even", "m2", 1]]
    assert out["ack_all"] == four
    assert out["ack_all_info"] == {"num_ack_pending": 0, "ack_floor": 4}
    # A queue group of two on a work-queue stream: each of 40 jobs to one member,
    # and nothing left in the stream once they are acked.
    q = out["queue"]
    assert q["a"] + q["b"] == 40 and q["a"] and q["b"]
    assert q["overlap"] == 0 and q["stream_msgs"] == 0
    # An ordered consumer (flow control and heartbeats) gets all 1,024 KiB.
    assert out["ordered"] == {"count": 1024, "bytes": 1024 * 1024}
    # Nobody hears the deliver subject: nothing is delivered, nothing lost; a bound
    # subscription then gets the message and acks it.
    assert out["unheard"] == {"delivered": 0, "num_pending": 1, "num_ack_pending": 0}
    assert out["heard"] == [["cp.b", "late", 1]]
    assert out["heard_info"] == {"num_ack_pending": 0, "ack_floor": 5}
