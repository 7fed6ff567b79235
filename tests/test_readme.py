"""The README's five-minute tour, pasted as its reader pastes it, so that it cannot
rot; and the ports and defaults that the README and docs/operations.md state.

Every fenced block of the section "A five-minute tour" runs, in order:

* the first, the broker's own terminal (``ttlbroker serve ...``), starts the broker
  as written, on free ports (``--port 0``: the monitoring and NATS ports are free
  ones too);
* each ``sh`` block goes line by line into one bash process, as into the reader's
  second terminal: the alias and the ``ready`` function stay defined, ``&`` puts a
  command in that shell's background and ``wait $!`` waits for it; every line must
  succeed;
* each ``python`` block goes into ``.venv/bin/python -``, as the README says;
* a ``text`` block is what the block before it prints: each of its lines, ``...``
  standing for anything, must be in a line of that output, in the same order.

The runner changes only what a test must: the ports 8090, 4222, 8190 and 8191 become
free ones in the commands and programs (``TTLBROKER_SERVER`` points the CLI at the
broker); ``.venv`` is the environment running the tests; the ``python -m
spark_export`` lines run in this process, on the session's SparkSession
(``spark_export.__main__.main`` with the same arguments: a JVM per line would triple
the test's time). The tour runs in a temporary folder made a git repository with the
project's ``.gitignore``: afterwards ``git status`` shows nothing the tour wrote.
"""

from __future__ import annotations

from conftest import require_extra

require_extra("spark", "the README tour")  # before the imports it guards

import datetime as dt
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import IO, Any

import pyarrow.dataset as ds
import pytest
import trio
from conftest import env_with_project

from broker.client import connect

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TIMEOUT = 480
#: How long one line of the tour may take.
LINE_TIMEOUT = 120


def tour_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the tour section, in order."""
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## A five-minute tour")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else None]
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", section, re.M | re.S)]


def shell_lines(code: str) -> list[str]:
    """The lines of a shell block as the shell reads them: lines ending in a
    backslash joined; blank and comment-only lines dropped (they do nothing)."""
    return [line for line in code.replace("\\\n", " ").splitlines() if line.strip() and not line.lstrip().startswith("#")]


def shows(expected: str, output: str) -> str | None:
    """None when every line of ``expected`` (``...`` = anything) is in a line of
    ``output``, in order; else the first line found in none after the previous.

    In a line, not as the whole line: a background job and the command in front print
    into one terminal, so a line of the job's can land after a partial line of the
    command's (``published ... offset 4{"stream": ...}``), in the reader's terminal as
    in this test."""
    lines = [line.rstrip() for line in output.splitlines()]
    at = 0
    for want in expected.splitlines():
        pattern = re.compile(".*".join(re.escape(part) for part in want.rstrip().split("...")))
        while at < len(lines) and not pattern.search(lines[at]):
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pump(pipe: IO[str], q: queue.Queue[str | None]) -> None:
    for line in pipe:
        q.put(line)
    q.put(None)


class Shell:
    """One bash process fed line by line, as a terminal feeds it: after each line
    it prints a mark with the line's exit status on stdout and a mark on stderr, so
    that each line's output is known (what a background job prints meanwhile goes
    with the line that is running)."""

    MARK = "__tour_line_done__"

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        # A process group of its own: close() ends what the shell leaves running.
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, cwd=cwd, env=env, start_new_session=True)
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self.out: queue.Queue[str | None] = queue.Queue()
        self.err: queue.Queue[str | None] = queue.Queue()
        for pipe, q in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=_pump, args=(pipe, q), daemon=True).start()
        # An interactive shell expands aliases; one reading a pipe does when told to.
        self.run("shopt -s expand_aliases")

    def run(self, line: str) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of one complete line."""
        check = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True)
        assert check.returncode == 0, f"not a complete shell line (the tour must not split one): {line}\n{check.stderr}"
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\nprintf '\\n{self.MARK} %d\\n' $?; printf '\\n{self.MARK}\\n' >&2\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + LINE_TIMEOUT
        out, status = self._until_mark(self.out, deadline, line)
        err, _ = self._until_mark(self.err, deadline, line)
        assert status is not None
        return int(status), out, err

    def _until_mark(self, q: queue.Queue[str | None], deadline: float, line: str) -> tuple[str, str | None]:
        got: list[str] = []
        while True:
            try:
                text = q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"`{line}` still running after {LINE_TIMEOUT} s; so far: {''.join(got)!r}") from None
            if text is None:
                raise AssertionError(f"the shell ended during `{line}`: {''.join(got)!r}")
            if text.startswith(self.MARK):
                # The mark's leading newline ends an unfinished last line, or is a line of its own.
                if got and got[-1] == "\n":
                    got.pop()
                return "".join(got), text[len(self.MARK):].strip() or None
            got.append(text)

    def close(self) -> None:
        """End the shell, then what it left running (after a failure: a ``sub``, the
        restored broker), by the shell's process group."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # nothing left
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def test_the_readme_blocks_are_found() -> None:
    blocks = tour_blocks()
    langs = [lang for lang, _ in blocks]
    assert langs[0] == "sh" and " serve " in f" {blocks[0][1]} " and langs.count("python") >= 3 and langs.count("text") >= 5
    assert set(langs) == {"sh", "python", "text"}, f"the tour has a block the test does not know how to run: {langs}"
    assert all(lang != "text" or before != "text" for before, lang in zip(langs, langs[1:])), "a text block follows a text block"
    assert shell_lines("alias tb=x\n\n# note\ntb pub a 'b # c' \\\n  --count 2  # note\n") == [
        "alias tb=x", "tb pub a 'b # c'    --count 2  # note"]
    assert shows("a ... c\nd", "x\na b c\ny\nd\n") is None
    assert shows("d\na ... c", "a b c\nd\n") == "a ... c"  # in order
    assert shows("b ... d\nx", "a b c d\nx\n") is None and shows("b\nb", "a b c\n") == "b"  # one line once


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(TIMEOUT)
def test_the_five_minute_tour(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    from spark_export.__main__ import main as spark_export_main

    # The README's set-up (pip install -e) puts the console script next to the interpreter.
    assert (BIN / "ttlbroker").exists(), f"the ttlbroker console script is not installed next to {sys.executable}"
    clone = tmp_path / "clone"
    git_env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # not the project's repository (a hook's GIT_DIR)
    subprocess.run(["git", "init", "-q", str(clone)], check=True, env=git_env)
    shutil.copy(ROOT / ".gitignore", clone / ".gitignore")
    # The test's stand-in for the clone's .venv is a link, which `.venv/` (a folder) does not match.
    (clone / ".git" / "info" / "exclude").write_text("/.venv\n")
    if sys.prefix != sys.base_prefix:  # the tests run in a virtual environment: that is the README's .venv
        (clone / ".venv").symlink_to(sys.prefix)
    else:
        (clone / ".venv").mkdir()
        (clone / ".venv" / "bin").symlink_to(BIN)

    blocks = tour_blocks()
    lang, code = blocks[0]
    (serve,) = shell_lines(code)
    env = env_with_project()
    env.pop("TTLBROKER_TOKEN", None)
    env.pop("TTLBROKER_SERVER", None)
    env.pop("BASH_ENV", None)  # a shell reading a pipe would source it first
    env["COLUMNS"] = "120"
    log = (tmp_path / "broker.log").open("w")  # its log lines, outside the clone
    broker = subprocess.Popen(["bash", "-c", "exec " + shlex.join([*shlex.split(serve, comments=True), "--port", "0"])],
                              stdout=subprocess.PIPE, stderr=log, text=True, cwd=clone, env=env)
    shell: Shell | None = None
    timings: list[tuple[float, str]] = []
    try:
        assert broker.stdout is not None
        started = [broker.stdout.readline() for _ in range(3)]
        assert [line.split(" ", 2)[:2] for line in started] == [["listening", "on"], ["monitoring", "on"], ["nats", "on"]], (
            f"`{serve}`: {started} {(tmp_path / 'broker.log').read_text()}")
        address, nats_url = started[0].split()[-1], started[2].split()[-1]
        ports = {"8090": address.rsplit(":", 1)[1], "4222": nats_url.rsplit(":", 1)[1],
                 "8190": str(free_port()), "8191": str(free_port())}
        env["TTLBROKER_SERVER"] = address

        def local(text: str) -> str:
            return re.sub(r"\b(8090|4222|8190|8191)\b", lambda m: ports[m.group(1)], text)

        shell = Shell(clone, env)
        restore_checked = False
        output = ""
        for i, (lang, code) in enumerate(blocks[1:], 1):
            if lang == "text":
                missing = shows(code, output)
                assert missing is None, f"block {i - 1} of the tour does not print\n{missing}\nIt printed:\n{output}"
                continue
            began = time.monotonic()
            if lang == "python":
                p = subprocess.run([".venv/bin/python", "-"], input=local(code), capture_output=True, text=True, env=env,
                                   cwd=clone, timeout=LINE_TIMEOUT)
                assert p.returncode == 0, f"the README's Python program failed:\n{code}\n{p.stderr}"
                output = p.stdout
                timings.append((time.monotonic() - began, code.strip().splitlines()[-1]))
                continue
            output = ""
            for line in shell_lines(code):
                began = time.monotonic()
                words = shlex.split(local(line), comments=True)
                if words[:3] == [".venv/bin/python", "-m", "spark_export"]:
                    monkeypatch.chdir(clone)
                    capsys.readouterr()
                    status = spark_export_main(words[3:], spark=spark)
                    out, err = capsys.readouterr()
                else:
                    if line.startswith("kill $!"):
                        # The restored broker, before the tour stops it: it holds the snapshot.
                        check_restore(address, f"127.0.0.1:{ports['8190']}", clone / "tour" / "snapshot")
                        restore_checked = True
                    status, out, err = shell.run(local(line))
                assert status == 0, f"`{line}` failed ({status}):\n{out}\n{err}"
                output += out
                timings.append((time.monotonic() - began, line))
        assert restore_checked, "the tour no longer stops the restored broker with `kill $!`: check_restore did not run"
        status, jobs, _ = shell.run("jobs -p")
        assert status == 0 and not jobs.strip(), f"the tour leaves commands running in the background: {jobs}"
    finally:
        if shell is not None:
            shell.close()
        if broker.poll() is None:
            broker.terminate()
        try:
            stopped = broker.wait(30)
        except subprocess.TimeoutExpired:
            broker.kill()
            raise
        finally:
            log.close()
        print("the tour's slowest lines:", *(f"{s:6.2f} s  {line}" for s, line in sorted(timings, reverse=True)[:8]), sep="\n")
    assert stopped == 0, f"the broker did not stop cleanly ({stopped}): {(tmp_path / 'broker.log').read_text()}"

    # What the tour wrote is ignored by git: nothing new but the copied .gitignore.
    status_lines = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone, check=True,
                                  capture_output=True, text=True, env=git_env).stdout.splitlines()
    assert status_lines == ["?? .gitignore"], f"the tour leaves files that git does not ignore: {status_lines}"
    assert (clone / "tour" / "analysis" / "report.md").exists() and (clone / "ttlbroker-data").is_dir()


def check_restore(source: str, restored: str, snapshot: Path) -> None:
    """The restored broker holds every topic of the snapshot with the configuration
    the source topic has, and exactly the snapshot's latest live message per subject.
    A message whose TTL runs out around now may be gone already: the tour runs on
    the wall clock."""
    rows = ds.dataset(str(snapshot), format="parquet", partitioning="hive").to_table().to_pylist()
    latest = {(r["stream"], r["topic"], r["subject"]): r["payload"] for r in rows}
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=30)
    may_be_gone = {(r["stream"], r["topic"], r["subject"]) for r in rows if r["expires_at"] is not None and r["expires_at"] < soon}
    topics = sorted({(stream, topic) for stream, topic, _ in latest})
    assert ("shop", "orders") in topics and ("shop", "sessions") in topics

    async def main() -> None:
        async with connect(source) as src, connect(restored) as dst:
            for stream, topic in topics:
                a, b = await src.get_topic(stream, topic), await dst.get_topic(stream, topic)
                assert (b.partitions_count, b.message_expiry, b.options) == (a.partitions_count, a.message_expiry, a.options)
                got = {}
                for p in range(b.partitions_count):
                    for m in (await dst.fetch(stream, topic, p, 1, 10_000)).messages:
                        got[(stream, topic, m.subject)] = m.payload
                want = {k: v for k, v in latest.items() if k[:2] == (stream, topic)}
                assert got == {k: v for k, v in want.items() if k in got or k not in may_be_gone}

    trio.run(main)


# -- the ports and defaults the docs state ---------------------------------------------


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"server.port": 8090, ...}``: the embedded default configuration's keys (a
    table of tables is a section; ``auth.default_permissions`` is one value)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and f"{prefix}{key}" != "auth.default_permissions":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_operations_md_states_every_default_of_the_configuration() -> None:
    """Every row of docs/operations.md's key tables (``| `key` | `default` | ...``)
    gives the embedded default (``broker/default_config.toml``, which a test of the
    config keeps equal to the dataclasses), and the main table names every key."""
    from broker.config import DEFAULT_CONFIG_TOML

    defaults = _flat(tomllib.loads(DEFAULT_CONFIG_TOML()))
    documented: set[str] = set()
    wrong: list[str] = []
    for line in (ROOT / "docs" / "operations.md").read_text().splitlines():
        m = re.match(r"^\| ((?:`[a-z_]+(?:\.[a-z_]+)+`(?:, )?)+) \| (.+?) \| ", line)
        if not m:
            continue
        keys = re.findall(r"`([^`]+)`", m.group(1))
        values = m.group(2).split(", ") if len(keys) > 1 else [m.group(2)]
        assert len(values) == len(keys), f"docs/operations.md: one default per key: {line}"
        for key, value in zip(keys, values):
            if key not in defaults:
                wrong.append(f"{key}: no such key")
                continue
            documented.add(key)
            value = value.strip()
            if value == "empty":
                ok = defaults[key] in ({}, [], "")
            else:
                assert value.startswith("`") and value.endswith("`"), f"docs/operations.md: a default in backquotes: {line}"
                ok = tomllib.loads(f"v = {value[1:-1]}")["v"] == defaults[key]
            if not ok:
                wrong.append(f"{key}: the docs say {value}, the default is {defaults[key]!r}")
    assert not wrong, "docs/operations.md disagrees with broker/default_config.toml:\n" + "\n".join(wrong)
    assert documented == set(defaults), f"keys docs/operations.md does not describe: {sorted(set(defaults) - documented)}"


def test_the_readme_states_the_default_addresses() -> None:
    """The addresses the README gives a reader are the defaults of the configuration."""
    from broker.config import Config

    c = Config()
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = (f"loopback `{c.server.host}:{c.server.port}`", f"data in `{c.system.path}`",
            f"on port {c.http.port} by default", f"`nats://{c.server.host}:{c.nats.port}`",
            f"monitoring on http://{c.http.host}:{c.http.port}`")
    missing = [s for s in said if s not in readme]
    assert not missing, f"the README no longer says {missing}: make it say the defaults"


def test_the_readme_layout_names_every_package() -> None:
    """Each package and subpackage of the four top-level packages has its row in the
    README's Layout table."""
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("\n## Layout"):]
    packages = [init.parent.relative_to(ROOT).as_posix() for top in ("broker", "protocol", "storage", "spark_export")
                for init in sorted((ROOT / top).glob("**/__init__.py"))]
    assert "broker/auth" in packages and "protocol/nats" in packages
    missing = [p for p in packages if p != "broker" and f"| `{p}/` |" not in layout]
    assert not missing and "| `broker/` (top level) |" in layout, f"the README's Layout has no row for {missing}"
