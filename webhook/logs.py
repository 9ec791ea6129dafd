"""Structured JSON logs: one object per line, with the request's fields when there are some.

Admission logs carry the request's identity and outcome (uid, kind, namespace, name, user,
operation, dry-run, decision, reason, pool, latency), never values or secrets: the fields are
passed explicitly as ``extra={"fields": {...}}`` (a dict, so names such as ``name`` cannot
collide with the log record's own attributes) and nothing else from the request is logged.

The request line is logged once per admission on the event loop, so what the loop pays for it
is kept small (``benchmarks.server`` measures it at the default level): the record skips what
no line prints (the caller's frame, thread and process names: the knobs the logging HOWTO's
"Optimization" section names), and the loop only queues it. A listener thread formats and
writes it (the timestamp's text built once per second, the JSON by one compact encoder), so a
slow reader on the other end of stderr (a container runtime's pipe) never blocks admission.
Records are flushed at exit.
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import sys
import time
from logging.handlers import QueueHandler, QueueListener
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


class _Enqueue(QueueHandler):
    """Queues the record as it is: formatting happens in the listener thread, not here."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


_listener: QueueListener | None = None


def configure(level: str = "INFO") -> None:
    """Send every log record to stderr as one JSON line, written by a listener thread."""
    global _listener
    # No line prints the caller's source location, thread or process: don't collect them.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # skips sys._getframe per record
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    if _listener is not None:
        _listener.stop()
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    _listener = QueueListener(records, handler)
    _listener.start()
    atexit.register(_listener.stop)  # flush what is queued when the process ends
    root = logging.getLogger()
    root.handlers[:] = [_Enqueue(records)]
    root.setLevel(level.upper())
