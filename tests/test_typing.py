"""The whole project type-checks clean (``[tool.mypy]`` in pyproject.toml says what is
checked and how strictly); the protocol and the broker ship ``py.typed``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_project_is_mypy_clean() -> None:
    """In a process of its own: mypy run in the test's process raises the
    interpreter's recursion limit for good (``sys.setrecursionlimit``), which
    changes how deep the tests that come after it on the same worker can nest
    before a ``RecursionError`` (the JetStream API's too-deep JSON)."""
    pytest.importorskip("mypy", reason="mypy is in the test extra")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental", "--cache-dir", "/dev/null",
         *(str(ROOT / p) for p in ("protocol", "storage", "broker", "spark_export"))],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_typed_packages_carry_py_typed() -> None:
    assert (ROOT / "protocol" / "py.typed").is_file() and (ROOT / "broker" / "py.typed").is_file()
