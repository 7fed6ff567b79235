"""Structured logs: one line per event, ``logfmt`` (key=value) or JSON, on stderr.

Use ``log = get_logger(__name__)`` and ``log.info("segment_sealed", partition=3,
bytes=123)``: the first argument is a stable event name, the rest are fields.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["get_logger", "configure_logging", "StructLogger"]


def _fmt_value(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n\t'):
        return json.dumps(text)
    return text


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"logger={record.name}", f"event={_fmt_value(record.getMessage())}"]
        for key, value in getattr(record, "fields", {}).items():
            parts.append(f"{key}={_fmt_value(value)}")
        if record.exc_info:
            parts.append(f"exc={_fmt_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class StructLogger:
    """A thin wrapper that turns keyword arguments into structured fields."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, fields: dict[str, object], exc_info: bool = False) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": fields}, exc_info=exc_info)

    def debug(self, event: str, **fields: object) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: object) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: object) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, exc_info: bool = False, **fields: object) -> None:
        self._log(logging.ERROR, event, fields, exc_info)


def get_logger(name: str) -> StructLogger:
    return StructLogger(logging.getLogger(name))


def configure_logging(level: str = "info", fmt: str = "logfmt") -> None:
    """Send the broker's logs to stderr in the chosen format (the CLI calls this)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger("broker")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
