"""Structured JSON logs: one object per line, with the request's fields when there are some.

Admission logs carry the request's identity and outcome (uid, kind, namespace, name, user,
operation, dry-run, decision, reason, pool, latency), never values or secrets: the fields are
passed explicitly as ``extra={"fields": {...}}`` (a dict, so names such as ``name`` cannot
collide with the log record's own attributes) and nothing else from the request is logged.

The request line is logged once per admission on the event loop, so what the loop pays for it
is kept small (``benchmarks.server`` measures it at the default level): the record skips what
no line prints (the caller's frame, thread and process names: the knobs the logging HOWTO's
"Optimization" section names), the timestamp's text is built once per second, the JSON is
encoded once, by orjson when every value is a plain string, number, boolean or null and the
line it writes is the stdlib's byte for byte (ASCII: the stdlib escapes every other character;
no float in exponent form; no integer past 64 bits), else by one compact stdlib encoder; a line
is never longer than a container runtime writes as one (fields cut to fit, saying how long they
were); and
lines are written in batches: one write for up to 256 lines or a quarter of a second, whichever
comes first, instead of a write and a flush per line (each a system call, and a wait whenever
the reader of stderr, a container runtime's pipe, lags). A
warning or an error is written at once, and a timer writes what is left when traffic stops.
Formatting stays on the caller's thread: handing records to a logging thread costs more than
it saves, because that thread then competes with the event loop for the interpreter lock.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import threading
import time
from typing import Final, TextIO

import orjson

__all__ = [
    "MAX_FIELD_CHARACTERS",
    "MAX_LINE_CHARACTERS",
    "BatchingHandler",
    "JsonFormatter",
    "configure",
    "cut",
    "encode",
]

_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), default=str, check_circular=False)
_PLAIN: Final = frozenset({str, int, bool, type(None)})
MAX_FIELD_CHARACTERS: Final = 8192  # of one field of a line (a traceback's frames fit)
# Of one line as written (ASCII: every other character escaped, an emoji as 12 characters):
# containerd and docker keep a line whole up to 16 KiB and split it past that; CRI-O splits
# wherever its 8 KiB reads end. Each part is tagged partial, for readers that rejoin them
# (kubelet's logs, CRI-aware shippers); one that does not sees pieces it cannot parse.
MAX_LINE_CHARACTERS: Final = 16_000
_SMALL: Final = 256  # a field this short as written is never cut to fit a line


def cut(text: str) -> str:
    """``text`` within :data:`MAX_FIELD_CHARACTERS`, saying how long it was: a field quoting
    what a tenant wrote (an error naming a value, a name, a user) makes one line no longer
    than this, however large the value."""
    if len(text) <= MAX_FIELD_CHARACTERS:
        return text
    kept = MAX_FIELD_CHARACTERS - 40
    return f"{text[:kept]}... ({len(text)} characters)"


def cut_traceback(text: str) -> str:
    """A traceback within :data:`MAX_FIELD_CHARACTERS`, its start and its end kept: what was
    finally raised is its last lines, and a long value quoted earlier in a chain (a tenant's)
    would otherwise push them out of the line."""
    if len(text) <= MAX_FIELD_CHARACTERS:
        return text
    note = f"\n... ({len(text)} characters; middle left out) ...\n"
    half = (MAX_FIELD_CHARACTERS - len(note)) // 2
    return f"{text[:half]}{note}{text[-half:]}"


def encode(entry: dict[str, object]) -> str:
    """``entry`` as the compact stdlib encoder writes it (``default=str``), by orjson where its
    output is the same bytes: plain values only (orjson serialises dataclasses, enums and dates
    itself, where the stdlib calls ``str``), floats written without an exponent by both
    (``repr`` uses one below 1e-4 and from 1e16; NaN too), and an ASCII line without DEL (the
    stdlib escapes every character past ``~``)."""
    for value in entry.values():
        if type(value) is float:
            if not (value == 0.0 or 1e-4 <= abs(value) < 1e16):
                return _ENCODER.encode(entry)
        elif type(value) not in _PLAIN:
            return _ENCODER.encode(entry)
    try:
        line = orjson.dumps(entry)
    except TypeError:  # an integer past 64 bits, a key that is not a string, a lone surrogate
        return _ENCODER.encode(entry)
    if not line.isascii() or b"\x7f" in line:
        return _ENCODER.encode(entry)
    return line.decode()


def _fitted(entry: dict[str, object], whole: dict[str, str]) -> str:
    """``entry`` encoded within :data:`MAX_LINE_CHARACTERS`: past it (escaped characters, many
    long fields, a long list), each field long as written is cut to an equal share of what
    the short ones leave, as written, saying how long it was (``whole``: the fields as they
    were before :func:`cut`)."""
    line = encode(entry)
    if len(line) <= MAX_LINE_CHARACTERS:
        return line
    sizes = {key: len(_ENCODER.encode(value)) for key, value in entry.items()}
    large = [key for key, size in sizes.items() if size > _SMALL]
    if not large:
        return line  # only short fields: as many as the code writes, never a tenant
    rest = len(line) - sum(sizes[key] for key in large)
    room = max(_SMALL, (MAX_LINE_CHARACTERS - rest) // len(large))
    for key in large:
        entry[key] = _written_within(whole.get(key, entry[key]), room)
    line = encode(entry)
    if len(line) <= MAX_LINE_CHARACTERS:
        return line
    # More long fields than a line holds at their least: the record's own words, and how
    # many fields were left out.
    kept: dict[str, object] = {k: entry[k] for k in ("time", "level", "logger") if k in entry}
    kept["message"] = _written_within(entry.get("message", ""), _SMALL * 4)
    kept["fields_left_out"] = len(entry) - len(kept)
    return encode(kept)


def _written_within(value: object, room: int) -> str:
    """``value`` (its JSON if not a string) cut from its end so that it is written in at most
    ``room`` characters, saying how long it was: the longest start that fits, found by
    halving (a few encodings of at most ``room`` characters, whatever the value holds)."""
    text = value if isinstance(value, str) else _ENCODER.encode(value)
    if len(_ENCODER.encode(text)) <= room:
        return text
    note = f"... ({len(text)} characters)"
    left = room - len(_ENCODER.encode(note))  # the note and the two quotes
    low, high = 0, min(len(text), max(left, 0))  # a start of ``low`` characters fits
    while low < high:
        middle = (low + high + 1) // 2
        if len(_ENCODER.encode(text[:middle])) - 2 <= left:
            low = middle
        else:
            high = middle - 1
    return text[:low] + note


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
            entry["exception"] = cut_traceback(self.formatException(record.exc_info))
        whole = {}
        for key, value in entry.items():
            if type(value) is str and len(value) > MAX_FIELD_CHARACTERS:
                whole[key] = value
                entry[key] = cut(value)
        return _fitted(entry, whole)


class BatchingHandler(logging.Handler):
    """Formats each record at once and writes the lines in batches (see the module docstring)."""

    def __init__(self, stream: TextIO, *, lines: int = 256, seconds: float = 0.25) -> None:
        super().__init__()
        self.stream = stream
        self.lines = lines
        self.seconds = seconds
        self._pending: list[str] = []
        self._since = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception as exc:  # a line of its own, bounded, instead of a raw traceback
            line = encode(
                {
                    "level": "error",
                    "logger": "webhook.logs",
                    "message": "a log record could not be written",
                    "record_logger": _written_within(record.name, _SMALL),
                    "error": _written_within(f"{type(exc).__name__}: {exc}", _SMALL * 4),
                }
            )
        self._pending.append(line)  # Handler.handle holds self.lock around emit
        if (
            record.levelno >= logging.WARNING
            or len(self._pending) >= self.lines
            or time.monotonic() - self._since >= self.seconds
        ):
            self._write()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # createLock() always sets it
            self._write()

    def _write(self) -> None:
        self._since = time.monotonic()
        if not self._pending:
            return
        text = "\n".join(self._pending) + "\n"
        self._pending.clear()
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing left to tell
            pass


def _flush_periodically(handler: BatchingHandler) -> None:
    while True:
        time.sleep(handler.seconds)
        handler.flush()


def configure(level: str = "INFO") -> None:
    """Send every log record to stderr as one JSON line, written in batches."""
    # No line prints the caller's source location, thread or process: don't collect them.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # skips sys._getframe per record
    handler = BatchingHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    threading.Thread(
        target=_flush_periodically, args=(handler,), name="log-flush", daemon=True
    ).start()
    atexit.register(handler.flush)  # what is still pending when the process ends
    root = logging.getLogger()
    for old in root.handlers:
        old.flush()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # a warning is a JSON line too, not raw text on stderr
