"""The JSON log line: one object per record, the request's fields flattened, exact times."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from webhook.logs import JsonFormatter


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
