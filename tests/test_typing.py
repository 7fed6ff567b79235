"""The whole project type-checks clean (``[tool.mypy]`` in pyproject.toml says what is
checked and how strictly); the protocol and the broker ship ``py.typed``."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_project_is_mypy_clean() -> None:
    api = pytest.importorskip("mypy.api", reason="mypy is in the test extra")
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-incremental", "--cache-dir", "/dev/null",
                                      *(str(ROOT / p) for p in ("protocol", "storage", "broker", "spark_export"))])
    assert status == 0, stdout + stderr


def test_the_typed_packages_carry_py_typed() -> None:
    assert (ROOT / "protocol" / "py.typed").is_file() and (ROOT / "broker" / "py.typed").is_file()
