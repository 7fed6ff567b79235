"""Shared fixtures: a real broker on a real loopback socket, and a real client.

``server`` starts ``broker.serve`` in the test's nursery on 127.0.0.1 port 0 with a
data directory under ``tmp_path``; it shuts down gracefully when the test ends.
``client`` is the bundled trio client connected to it. Tests that restart a broker
use ``start_server`` to run several in sequence on the same data directory.

The NATS listener is off in ``make_config`` (every broker would otherwise open a
second port); ``nats_server`` starts a broker with it on a free port, and
``nats_url`` is its ``nats://127.0.0.1:PORT``. nats-py is an asyncio client: run
its code with ``helpers.in_asyncio`` (a worker thread with its own event loop)
while the broker runs on the test's trio loop.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, settings

# Timing-based checks flake on a loaded 2-core machine (CI runs the whole suite
# there); the properties themselves are what the tests are for.
settings.register_profile("ttlbroker", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ttlbroker")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The command line's contexts (broker/cli/_contexts.py) live under $XDG_CONFIG_HOME:
# the tests, and the commands they start, never see the developer's own.
_CONFIG_HOME = tempfile.mkdtemp(prefix="ttlbroker-tests-config-")
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME
os.environ.pop("TTLBROKER_CONTEXT", None)
atexit.register(shutil.rmtree, _CONFIG_HOME, True)

import broker  # noqa: E402
from broker import Clock, Config, ServerHandle, serve  # noqa: E402
from broker.client import Client, connect  # noqa: E402


#: The modules that take longest (half a minute or more: Spark, the CLI's
#: subprocesses, the README's tour), measured with ``--durations``. They run first:
#: the two workers (``--dist loadscope``, whole modules) take modules in collection
#: order, and a long one taken last leaves the other worker idle to the end.
SLOW_MODULES = (
    "tests/export/test_spark_cli.py", "tests/cli/test_cli.py", "tests/export/test_spark_jobs.py",
    "tests/test_readme.py", "tests/export/test_export.py", "tests/cli/test_consumer_cli.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow modules first, each module's tests in their order (a stable sort)."""
    rank = {path: i for i, path in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def make_config(data_dir: Path | str, **changes: object) -> Config:
    base = {"server.port": 0, "http.port": -1, "nats.enabled": False, "nats.port": 0, "system.path": str(data_dir)}
    base.update(changes)
    return Config().replace(**base)


@pytest.fixture
def taken_port():  # type: ignore[no-untyped-def]
    """A loopback port something else is listening on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.fixture
def config(data_dir: Path) -> Config:
    return make_config(data_dir)


@contextlib.asynccontextmanager
async def start_server(config: Config, clock: Clock | None = None) -> AsyncIterator[ServerHandle]:
    """Run a broker for the duration of the block, then shut it down gracefully."""
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(lambda task_status: serve(config, clock=clock, task_status=task_status))
        try:
            yield handle
        finally:
            nursery.cancel_scope.cancel()


@pytest.fixture
async def server(config: Config) -> AsyncIterator[ServerHandle]:
    async with start_server(config) as handle:
        yield handle


@pytest.fixture
def nats_config(data_dir: Path) -> Config:
    """A broker's config with the NATS listener on (a free port)."""
    return make_config(data_dir, **{"nats.enabled": True})


@pytest.fixture
async def nats_server(nats_config: Config) -> AsyncIterator[ServerHandle]:
    async with start_server(nats_config) as handle:
        yield handle


@pytest.fixture
def nats_url(nats_server: ServerHandle) -> str:
    """``nats://127.0.0.1:PORT`` of ``nats_server``'s NATS listener."""
    assert nats_server.nats_url is not None
    return nats_server.nats_url


@pytest.fixture
async def client(server: ServerHandle) -> AsyncIterator[Client]:
    async with connect(server.address) as c:
        yield c


@pytest.fixture
async def topic(client: Client) -> tuple[str, str]:
    """A stream ``shop`` with a topic ``orders`` (3 partitions) capturing ``orders.>``."""
    await client.create_stream("shop")
    await client.create_topic("shop", "orders", partitions=3, subjects=["orders.>"])
    return "shop", "orders"


def env_with_project() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


__all__ = ["make_config", "start_server", "env_with_project", "broker"]


class BrokerProcess:
    """``python -m broker serve`` in a subprocess, for tests that need a separate
    process (kill -9, signals, the CLI, the asyncio client)."""

    def __init__(self, data_dir: Path | str, *extra: str, config_file: Path | None = None, env: dict[str, str] | None = None) -> None:
        import subprocess

        # Free monitoring and NATS ports even when ``extra`` gives a fixed --port
        # (which would leave them on 8091 and 4222, maybe in use on a shared
        # machine); ``extra`` may set --http-port, --nats-port or --no-nats.
        args = [sys.executable, "-m", "broker", "serve", "--port", "0", "--http-port", "-1", "--nats-port", "0",
                "--data", str(data_dir), *extra]
        if config_file is not None:
            args += ["--config", str(config_file)]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env_with_project(), **(env or {})},
            cwd=str(data_dir),
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise RuntimeError(f"broker did not start: {line!r} {err}")
        self.address = line.split()[-1]
        self._nats_url: str | None = None

    @property
    def nats_url(self) -> str:
        """``nats://HOST:PORT`` from the ``nats on`` line (read when first asked for:
        a broker started without its NATS listener never prints it)."""
        assert self.proc.stdout is not None
        while self._nats_url is None:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the broker printed no 'nats on' line")
            if line.startswith("nats on "):
                self._nats_url = line.split()[-1]
        return self._nats_url

    def stop(self, sig: int | None = None, timeout: float = 20) -> int:
        import signal as _signal

        if self.proc.poll() is None:
            self.proc.send_signal(sig if sig is not None else _signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.stderr:
                self.stderr = self.proc.stderr.read()
            if self.proc.stdout:
                self.proc.stdout.close()
            if self.proc.stderr:
                self.proc.stderr.close()

    def kill9(self) -> None:
        import signal as _signal

        self.stop(_signal.SIGKILL)


@pytest.fixture
def broker_process(data_dir: Path):  # type: ignore[no-untyped-def]
    p = BrokerProcess(data_dir)
    try:
        yield p
    finally:
        p.stop()


# -- Spark: one check for Java, one SparkSession for the run ----------------------------


def java_missing() -> str | None:
    """Why Spark cannot run here (one line), or None when it can. The check is
    ``spark_export``'s own (:func:`spark_export._inputs.find_java`, made by every job
    before it starts the JVM): no ``java`` on PATH, a JAVA_HOME without bin/java, a
    Java that does not run or is older than 17."""
    from spark_export._inputs import JobError, find_java

    try:
        find_java()
    except JobError as exc:
        return f"Spark tests need Java: {exc}"
    return None


@pytest.fixture(scope="session")
def java() -> None:
    """Skips the test, with the reason, when Spark has no usable Java; fails instead
    under CI (``CI`` set), which has Java and must run the Spark tests. Every test
    that starts Spark (in this process or another) depends on it."""
    require(java_missing(), "the Spark tests")


@pytest.fixture(scope="session")
def spark(java: None):  # type: ignore[no-untyped-def]
    """One local SparkSession for each test process (Spark takes seconds to start)."""
    from spark_export._session import spark_session

    session = spark_session("local[2]", "ttlbroker-tests")
    try:
        yield session
    finally:
        session.stop()


#: What each optional extra of pyproject.toml brings, as importable modules.
EXTRAS = {"spark": ("pyspark", "pyarrow", "numpy", "pandas", "duckdb", "matplotlib")}


def extra_missing(extra: str) -> str | None:
    """Why the ``extra`` of pyproject.toml is not usable here (one line), or None."""
    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return f"the {extra!r} extra is not installed ({', '.join(missing)} missing: pip install -e '.[{extra}]')"


def require_extra(extra: str, what: str) -> None:
    """At the top of a test module that needs an optional extra, before it imports
    from it: nothing when it is installed; else the module fails under CI (``CI``
    set), which installs every extra, and is skipped with the reason elsewhere (a
    run with the ``test`` extra alone)."""
    missing = extra_missing(extra)
    if missing is not None and os.environ.get("CI"):
        pytest.fail(f"{missing} (CI must run {what})", pytrace=False)
    if missing is not None:
        pytest.skip(f"{missing}: {what} need it (CI runs them)", allow_module_level=True)


def require(missing: str | None, what: str) -> None:
    """A test needs a tool of the machine (Java, Node): nothing when ``missing`` is
    None; else it fails under CI (``CI`` set), which has the tool and must run
    ``what``, and is skipped with the reason elsewhere (a developer's machine
    without the tool)."""
    if missing is not None and os.environ.get("CI"):
        pytest.fail(f"{missing} (CI must run {what})", pytrace=False)
    if missing is not None and not os.environ.get("CI"):
        pytest.skip(f"{missing}: {what} need it (CI runs them)")
