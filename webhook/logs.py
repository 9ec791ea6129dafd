"""Structured JSON logs: one object per line, with the request's fields when there are some.

Admission logs carry the request's identity and outcome (uid, kind, namespace, name, user,
operation, dry-run, decision, reason, pool, latency), never values or secrets: the fields are
passed explicitly as ``extra={"fields": {...}}`` (a dict, so names such as ``name`` cannot
collide with the log record's own attributes) and nothing else from the request is logged.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final

__all__ = ["JsonFormatter", "configure"]

_STANDARD: Final = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key == "fields" and isinstance(value, dict):
                entry.update(value)
            elif key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def configure(level: str = "INFO") -> None:
    """Send every log record to stderr as one JSON line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
