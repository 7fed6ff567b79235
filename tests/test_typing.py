"""The protocol and client packages ship ``py.typed``: they must type-check clean
(``[tool.mypy]`` in pyproject.toml says what is checked and how strictly)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_protocol_and_client_are_mypy_clean() -> None:
    api = pytest.importorskip("mypy.api", reason="mypy is in the test extra")
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-incremental", "--cache-dir", "/dev/null",
                                      str(ROOT / "protocol"), str(ROOT / "broker" / "client")])
    assert status == 0, stdout + stderr


def test_the_typed_packages_carry_py_typed() -> None:
    assert (ROOT / "protocol" / "py.typed").is_file() and (ROOT / "broker" / "py.typed").is_file()
