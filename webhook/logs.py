"""Structured JSON logs: one object per line, with the request's fields when there are some.

Admission logs carry the request's identity and outcome (uid, kind, namespace, name, user,
operation, dry-run, decision, reason, pool, latency), never values or secrets: the fields are
passed explicitly as ``extra={"fields": {...}}`` (a dict, so names such as ``name`` cannot
collide with the log record's own attributes) and nothing else from the request is logged.

The request line is written once per admission on the event loop, so its cost is kept small
(``benchmarks.server`` measures it at the default level): the record skips what no line prints
(the caller's frame, thread and process names: the knobs the logging HOWTO's "Optimization"
section names), the timestamp's text is built once per second, and the JSON is encoded by one
compact encoder.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final

__all__ = ["JsonFormatter", "configure"]

_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), default=str, check_circular=False)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def _time(self, created: float, msecs: float) -> str:
        second = int(created)
        if second != self._second:  # strftime once per second, not once per line
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._stamp}.{int(msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self._time(record.created, record.msecs),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = record.__dict__.get("fields")
        if isinstance(fields, dict):
            entry.update(fields)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key != "fields" and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)


def configure(level: str = "INFO") -> None:
    """Send every log record to stderr as one JSON line."""
    # No line prints the caller's source location, thread or process: don't collect them.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # skips sys._getframe per record
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
