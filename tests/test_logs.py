"""The JSON log line: one object per record, the request's fields flattened, exact times."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import json
import logging
import subprocess
import sys
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.logs import (
    MAX_FIELD_CHARACTERS,
    MAX_LINE_CHARACTERS,
    BatchingHandler,
    JsonFormatter,
    cut,
    encode,
)


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


# What a log line may carry: plain values (each field the request line has), and what other
# loggers pass as extras (dates, enums, dataclasses, big integers, odd floats, any unicode).
class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int


_LOGGED = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**70)
    | st.floats()
    | st.floats(min_value=0, max_value=30_000).map(lambda v: round(v, 3))
    | st.text()
    | st.sampled_from(["\ud800", "\x7f", "\u2028", "ü", "\x00", "</script>"])
    | st.sampled_from([datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC), Colour.RED, Point(1)])
    | st.lists(st.integers(), max_size=3)
)


@settings(max_examples=500)
@given(st.dictionaries(st.text(), _LOGGED, max_size=16))
def test_a_line_is_the_stdlib_encoders_byte_for_byte(entry: dict[str, object]) -> None:
    stdlib = json.JSONEncoder(separators=(",", ":"), default=str, check_circular=False)
    assert encode(entry) == stdlib.encode(entry)


def test_a_tenant_name_with_a_line_separator_cannot_split_the_log_line() -> None:
    line = JsonFormatter().format(_record(0.0, fields={"name": 'vm\u2028{"forged":1}\x85'}))
    assert len(line.splitlines()) == 1  # str.splitlines splits on U+2028 and U+0085
    assert json.loads(line)["name"] == 'vm\u2028{"forged":1}\x85'


def test_a_tenant_value_quoted_in_an_error_makes_no_line_longer_than_its_bound() -> None:
    # An error naming what a tenant wrote (a quantity that does not parse, a long user name)
    # is logged on every request that carries it: the line keeps the start and the length.
    value = "9" * 1_000_000
    record = _record(0.0, fields={"error": f"not a quantity: {value}", "user": "u" * 100_000})
    entry = json.loads(JsonFormatter().format(record))
    assert entry["error"].startswith("not a quantity: 999")
    assert entry["error"].endswith(f"({len(value) + 16} characters)")
    assert len(entry["error"]) <= MAX_FIELD_CHARACTERS
    assert len(entry["user"]) <= MAX_FIELD_CHARACTERS


def test_a_tenant_value_of_escaped_characters_cannot_make_a_line_a_runtime_splits() -> None:
    # Every character past ASCII is written escaped: 8,192 emoji are a 98 KB field, and
    # a container runtime splits a line past 16 KiB into pieces no log reader parses.
    emoji = "\U0001f600" * 100_000
    record = _record(0.0, fields={"name": emoji, "error": f"bad {emoji}", "pool": "tenant-acme"})
    line = JsonFormatter().format(record)
    assert len(line) <= MAX_LINE_CHARACTERS
    entry = json.loads(line)
    assert entry["pool"] == "tenant-acme", "short fields are written whole"
    assert entry["name"].startswith("\U0001f600")
    assert entry["name"].endswith("(100000 characters)")
    assert entry["error"].startswith("bad \U0001f600")


def test_escaped_characters_before_a_long_tail_cannot_wipe_the_fields_own_text() -> None:
    # A cut shrunk by the ratio of escaped to kept characters ran out of steps on a value of
    # emoji then ASCII and wrote the note alone: the code's own words before it went too.
    value = "\U0001f600" * 1_200 + "a" * 20_000
    record = _record(0.0, fields={"error": f"pool tenant-acme-x: bad value {value}"})
    line = JsonFormatter().format(record)
    assert len(line) <= MAX_LINE_CHARACTERS
    kept = json.loads(line)["error"]
    assert kept.startswith("pool tenant-acme-x: bad value \U0001f600")
    assert len(line) > MAX_LINE_CHARACTERS - 100, "as much of it as fits"


def test_a_long_list_in_a_field_cannot_make_a_line_a_runtime_splits() -> None:
    record = _record(0.0, fields={"keys": ["k" * 100] * 1_000, "count": 1_000})
    entry = json.loads(line := JsonFormatter().format(record))
    assert len(line) <= MAX_LINE_CHARACTERS
    assert entry["count"] == 1_000
    assert entry["keys"].startswith('["kkk')


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["name", "error", "user", "reason", "pool", "kind"]),
        st.text(max_size=3 * MAX_FIELD_CHARACTERS) | st.lists(st.text(max_size=200), max_size=200),
    )
)
def test_no_line_is_longer_than_its_bound_and_a_short_one_is_whole(
    fields: dict[str, object],
) -> None:
    line = JsonFormatter().format(_record(0.0, fields=fields))
    assert len(line) <= MAX_LINE_CHARACTERS
    assert len(line.splitlines()) == 1
    entry = json.loads(line)
    if len(encode({**entry, **fields})) <= MAX_LINE_CHARACTERS:
        assert {key: entry[key] for key in fields} == fields


@given(st.text(max_size=3 * MAX_FIELD_CHARACTERS))
def test_a_field_is_cut_only_past_its_bound_and_never_past_it(text: str) -> None:
    kept = cut(text)
    assert len(kept) <= MAX_FIELD_CHARACTERS
    assert (kept == text) == (len(text) <= MAX_FIELD_CHARACTERS)
    assert text.startswith(kept.rsplit("... (", 1)[0])


def test_a_tenant_value_in_a_chained_exception_cannot_hide_the_exception_that_was_raised() -> None:
    # A traceback is cut like any field, from its start: a tenant's long value quoted by the
    # first exception of a chain filled the field, and the exception finally raised (its
    # type, its message: the last line) was cut off every line that logged it.
    try:
        try:
            raise ValueError("not a quantity: " + "9" * 20_000)
        except ValueError:
            raise KeyError("the real failure")  # noqa: B904  # chained: "During handling"
    except KeyError:
        record = logging.LogRecord("x", logging.ERROR, "", 0, "event ignored", None, sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert len(entry["exception"]) <= MAX_FIELD_CHARACTERS
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].rstrip().endswith("KeyError: 'the real failure'")


def test_more_long_fields_than_a_line_holds_still_make_one_line_within_its_bound() -> None:
    fields = {f"field{index}": "\u00e9" * 300 for index in range(80)}
    line = JsonFormatter().format(_record(0.0, fields=fields))
    assert len(line) <= MAX_LINE_CHARACTERS
    entry = json.loads(line)
    assert entry["fields_left_out"] >= 80
    assert entry["message"] == "a b"


def test_a_record_that_cannot_be_encoded_is_one_bounded_line_not_a_raw_traceback() -> None:
    # A key that is not a string makes the encoder raise: the stdlib's handleError printed a
    # traceback and the record's arguments, a tenant's value among them, as raw lines.
    stream = io.StringIO()
    handler = BatchingHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.emit(_record(0.0, fields={(1, 2): "x" * 100_000}))
    handler.flush()
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["message"] == "a log record could not be written"
    assert len(line) < 2_000
