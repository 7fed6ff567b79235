"""How the ``ttlbroker`` client commands print.

With ``--json``: one JSON object per result, list entry or message (JSON Lines).
Without: one line per message, aligned tables and titled sections of fields for
people, drawn by rich. Rich leaves out colours and styles when stdout is not a
terminal; we also give it a wide page there, so that a table piped to ``less`` or
``grep`` is never wrapped at 80 columns, and strip the padding at line ends.

Progress bars are in ``_progress.py``.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from protocol import TTL_NEVER, Message, rfc3339_ns

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

__all__ = [
    "Out", "Where", "message_json", "count", "size", "duration", "flag", "listing", "rate",
]

#: A message's stream or topic as printed: the name (or id) given on the command
#: line or looked up, or None for a message no topic stored.
Where = int | str | None

#: The page width when stdout is not a terminal: wide enough never to wrap a row.
PIPE_WIDTH = 4096


# -- values for people ----------------------------------------------------------------


def count(n: int | float) -> str:
    return f"{n:,}"


def size(n: int) -> str:
    """Bytes: ``500 B``, ``20.1 KiB``, ``64.0 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def duration(seconds: float) -> str:
    """``90`` -> ``1m30s``, ``3600`` -> ``1h``, ``0.2`` -> ``200ms``, ``1.5`` -> ``1.5s``:
    the form the duration options take, to the millisecond."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    return (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{rest / 1000:g}s" if rest else "")


def flag(value: object) -> str:
    return "yes" if value else "no"


def listing(values: Iterable[object], empty: str = "-") -> str:
    text = ", ".join(str(v) for v in values)
    return text or empty


def rate(n: int, seconds: float) -> str:
    return count(round(n / seconds)) if seconds > 0 else "-"


# -- messages -------------------------------------------------------------------------


def message_json(m: Message, stream: Where, topic: Where) -> dict[str, object]:
    """One message as the CLI prints it with ``--json``."""
    out: dict[str, object] = {
        "stream": stream,
        "topic": topic,
        "partition": m.partition,
        "offset": m.offset,
        "timestamp": rfc3339_ns(m.timestamp),
        "timestamp_ns": m.timestamp,
        "subject": m.subject,
        "headers": m.headers,
    }
    try:
        out["payload"] = m.payload.decode()
    except UnicodeDecodeError:
        out["payload"] = base64.b64encode(m.payload).decode()
        out["payload_encoding"] = "base64"
    if m.ttl:
        out["ttl"] = "never" if m.ttl == TTL_NEVER else m.ttl
    if m.is_marker:
        out["marker"] = m.marker_reason.header_value
    return out


def _message_line(m: Message, stream: Where, topic: Where) -> str:
    payload = m.payload.decode(errors="replace")
    hdrs = " ".join(f"{k}={v}" for k, v in m.headers.items())
    where = f"{stream}/{topic}[{m.partition}]@{m.offset}" if m.offset else "(not stored)"
    marker = f" marker={m.marker_reason.header_value}" if m.is_marker else ""
    return f"{where} {m.subject}{marker}{' ' + hdrs if hdrs else ''} {payload}"


# -- the printer --------------------------------------------------------------------


Fields = Sequence[tuple[str, str]]


class Out:
    """stdout for one command: JSON with ``--json``, text for people otherwise."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            tty = sys.stdout.isatty()
            self._console = Console(
                file=sys.stdout, width=None if tty else PIPE_WIDTH, highlight=False, markup=False, emoji=False,
            )
        return self._console

    def obj(self, value: object, text: str | None = None) -> None:
        """``value`` as JSON, or ``text`` for people."""
        if self.json:
            print(json.dumps(value, default=str), flush=True)
        elif text is not None:
            print(text, flush=True)

    def note(self, text: str) -> None:
        """A line for people (an empty list's word); nothing with ``--json``."""
        if not self.json:
            print(text, flush=True)

    def message(self, m: Message, stream: Where, topic: Where) -> None:
        if self.json:
            print(json.dumps(message_json(m, stream, topic)), flush=True)
        else:
            print(_message_line(m, stream, topic), flush=True)

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[str]], title: str | None = None) -> None:
        """An aligned table; a column whose name ends with ``>`` is right-aligned
        (numbers), and loses the ``>``. ``title``: a line above it (the reports')."""
        from rich.table import Table
        from rich.text import Text

        if title is not None:
            self._print(Text(title, style="bold"))

        t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", padding=(0, 2, 0, 0))
        for name in columns:
            right = name.endswith(">")
            t.add_column(name.rstrip(">"), justify="right" if right else "left", no_wrap=True)
        for row in rows:
            t.add_row(*row)
        self._print(t)

    def fields(self, title: str, fields: Fields) -> None:
        """A title, then its fields as aligned ``name  value`` lines, indented."""
        from rich.padding import Padding
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column()
        for name, value in fields:
            grid.add_row(name, value)
        self._print(Text(title, style="bold"))
        self._print(Padding(grid, (0, 0, 0, 2)))

    def blank(self) -> None:
        print(flush=True)

    def _print(self, renderable: RenderableType) -> None:
        c = self.console
        if c.is_terminal:
            c.print(renderable)
            return
        with c.capture() as captured:
            c.print(renderable)
        text = captured.get()
        sys.stdout.write("".join(line.rstrip() + "\n" for line in text.splitlines()))
        sys.stdout.flush()
