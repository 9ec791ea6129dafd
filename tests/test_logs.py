"""The JSON log line: one object per record, the request's fields flattened, exact times."""

from __future__ import annotations

import json
import logging

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
