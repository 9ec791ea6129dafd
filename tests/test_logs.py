"""The JSON log line: one object per record, the request's fields flattened, exact times."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from typing import Any

from webhook.logs import BatchingHandler, JsonFormatter


def _record(created: float, msecs: float = 0.0, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "webhook.requests", logging.INFO, __file__, 1, "%s %s", ("a", "b"), None
    )
    record.created, record.msecs = created, msecs
    record.__dict__.update(extra)
    return record


def test_the_time_is_exact_across_a_second_boundary() -> None:
    formatter = JsonFormatter()
    before = json.loads(formatter.format(_record(1_700_000_000.999, 999.0)))
    after = json.loads(formatter.format(_record(1_700_000_001.004, 4.0)))
    assert before["time"] == "2023-11-14T22:13:20.999Z"
    assert after["time"] == "2023-11-14T22:13:21.004Z"


def test_request_fields_are_flattened_and_cannot_collide_with_record_attributes() -> None:
    line = JsonFormatter().format(_record(0.0, fields={"name": "vm1", "dry_run": True}))
    entry = json.loads(line)
    assert entry["name"] == "vm1"
    assert entry["dry_run"] is True
    assert entry["message"] == "a b"
    assert entry["logger"] == "webhook.requests"
    assert "\n" not in line


def test_lines_queued_by_the_event_loop_are_written_by_the_exit() -> None:
    program = (
        "import logging; from webhook.logs import configure; configure('INFO');"
        "log = logging.getLogger('webhook.requests');"
        "[log.info('validate allowed', extra={'fields': {'uid': str(i)}}) for i in range(500)];"
        "logging.getLogger('quiet').debug('not at INFO')"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [entry["uid"] for entry in lines] == [str(i) for i in range(500)]
    assert {entry["level"] for entry in lines} == {"info"}


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def _handler(stream: CountingStream, **settings: Any) -> BatchingHandler:
    handler = BatchingHandler(stream, **settings)
    handler.setFormatter(JsonFormatter())
    return handler


def test_request_lines_are_written_in_batches_not_one_write_each() -> None:
    stream = CountingStream()
    handler = _handler(stream, lines=100, seconds=3600)
    for index in range(250):
        handler.handle(_record(0.0, fields={"uid": str(index)}))
    assert stream.writes == 2  # two full batches; fifty lines wait
    handler.flush()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [entry["uid"] for entry in lines] == [str(i) for i in range(250)]


def test_a_warning_is_written_at_once_with_the_lines_before_it() -> None:
    stream = CountingStream()
    handler = _handler(stream, lines=100, seconds=3600)
    handler.handle(_record(0.0, fields={"uid": "a"}))
    warning = _record(0.0)
    warning.levelno, warning.levelname = logging.WARNING, "WARNING"
    handler.handle(warning)
    assert [json.loads(line)["level"] for line in stream.getvalue().splitlines()] == [
        "info",
        "warning",
    ]
