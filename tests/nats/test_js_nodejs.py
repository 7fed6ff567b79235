"""A second language: nats.js (the npm package ``nats``, pinned in
tests/nats/js/package.json and package-lock.json) under Node publishes with
``Nats-TTL`` to ttlbroker's NATS listener. The tests install it with ``npm ci``;
without Node and npm they skip with the reason, and under CI (``CI`` set) they
fail instead."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from conftest import require

JS_DIR = Path(__file__).resolve().parent / "js"


def _node_missing() -> str | None:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"the nats.js tests need Node.js: no `{tool}` on PATH"
    return None


@pytest.fixture(scope="session")
def node_nats() -> Path:
    """tests/nats/js with its node_modules installed (``npm ci`` from the lock file),
    once: the test processes (pytest-xdist workers) take a file lock around it."""
    require(_node_missing(), "the nats.js tests")
    with open(JS_DIR / "node_modules.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (JS_DIR / "node_modules" / "nats" / "package.json").exists():
            p = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund"], cwd=JS_DIR, capture_output=True, text=True, timeout=300
            )
            assert p.returncode == 0, f"npm ci failed:\n{p.stdout}\n{p.stderr}"
    return JS_DIR


async def _node(script: Path, *args: str) -> dict:
    p = await trio.run_process(["node", str(script), *args], capture_stdout=True, capture_stderr=True, check=False)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


async def test_nodejs_publish_with_nats_ttl(node_nats: Path, nats_url: str) -> None:
    out = await _node(node_nats / "ttl_publish.mjs", nats_url)
    assert out["ack"] == {"stream": "NODE", "seq": 1, "duplicate": False}
    assert out["stored"] == {"subject": "node.a", "data": "hello", "ttl": "1m30s"}
    assert out["invalid"] == {"code": 400, "err_code": 10165, "description": "invalid per-message TTL"}
    assert out["disabled"] == {"code": 400, "err_code": 10166, "description": "per-message TTL is disabled"}


async def test_nodejs_message_schedules(node_nats: Path, nats_url: str) -> None:
    out = await _node(node_nats / "schedules.mjs", nats_url)
    assert out["config"] == {"allow_msg_schedules": True, "allow_rollup_hdrs": True, "level": "2"}
    assert out["ack"] == {"stream": "SCHED", "seq": 1}
    assert out["subjects"] == {"sched.out": 1}  # produced at once, the one-off schedule gone
    assert out["produced"] == {"subject": "sched.out", "data": "payload", "scheduler": "sched.once", "next": "purge",
                               "ttl": "5m", "after": True}
    assert out["disabled"] == {"code": 400, "err_code": 10188, "description": "message schedules is disabled"}
    assert out["pattern"] == {"code": 400, "err_code": 10189, "description": "message schedules pattern is invalid"}
    assert out["target"] == {"code": 400, "err_code": 10190, "description": "message schedules target is invalid"}
    assert out["zone"] == {"code": 400, "err_code": 10223, "description": "message schedules time zone is invalid"}


async def test_nodejs_stream_limits(node_nats: Path, nats_url: str) -> None:
    out = await _node(node_nats / "limits.mjs", nats_url)
    assert out["old"] == {"messages": 3, "first": 3, "last": 5, "max_msgs": 3}
    assert out["max_msgs"] == {"code": 503, "err_code": 10077, "description": "maximum messages exceeded"}
    assert out["max_bytes"] == {"code": 503, "err_code": 10077, "description": "maximum bytes exceeded"}
    assert out["max_msg_size"] == {"code": 400, "err_code": 10054, "description": "message size exceeds maximum allowed"}
    assert out["per_subject"] == {"code": 503, "err_code": 10077, "description": "maximum messages per subject exceeded"}
    assert out["per_config"] is True
    assert out["max_consumers"] == {"code": 400, "err_code": 10026, "description": "maximum consumers limit reached"}
