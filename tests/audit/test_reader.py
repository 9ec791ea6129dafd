"""Every shape the API server writes reads as the same events; bad lines are reported."""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.audit.logs import LOG, events
from webhook.audit.reader import EventReader
from webhook.core.audit.events import write_from_event
from webhook.core.audit.summary import SummaryBuilder


def summary(*sources: str | Path) -> dict[str, Any]:
    reader = EventReader([str(s) for s in sources])
    builder = SummaryBuilder()
    kinds: dict[str, str] = {}
    for event in reader:
        write = write_from_event(event, kinds=kinds)
        if write is not None:
            builder.add(write)
    return builder.result(events=reader.events, malformed=reader.malformed_json())


@pytest.fixture(scope="module")
def plain() -> dict[str, Any]:
    return summary(LOG)


def test_rotated_files_given_in_any_order_read_as_the_whole_log(
    tmp_path: Path, plain: dict[str, Any]
) -> None:
    lines = LOG.read_bytes().splitlines(keepends=True)
    third = len(lines) // 3
    parts = [lines[:third], lines[third : 2 * third], lines[2 * third :]]
    names = ["audit-2026-11-30T23-44-30.000.log", "audit-2026-11-30T23-44-50.000.log", "audit.log"]
    for name, part in zip(names, parts, strict=True):
        (tmp_path / name).write_bytes(b"".join(part))
    assert summary(*(tmp_path / n for n in reversed(names))) == plain


def test_gzip_compressed_files_read_the_same(tmp_path: Path, plain: dict[str, Any]) -> None:
    packed = tmp_path / "audit-2026-11-30T23-44-30.000.log.gz"
    packed.write_bytes(gzip.compress(LOG.read_bytes()))
    assert summary(packed) == plain
    renamed = tmp_path / "audit.log"  # recognised by content, not by name
    renamed.write_bytes(packed.read_bytes())
    assert summary(renamed) == plain


def test_eventlist_batches_of_an_audit_webhook_read_the_same(
    tmp_path: Path, plain: dict[str, Any]
) -> None:
    items = events()
    batches = [items[i : i + 100] for i in range(0, len(items), 100)]
    lines = tmp_path / "batches.jsonl"
    lines.write_text(
        "".join(
            json.dumps({"kind": "EventList", "apiVersion": "audit.k8s.io/v1", "items": b}) + "\n"
            for b in batches
        )
    )
    assert summary(lines) == plain
    pretty = tmp_path / "batches.json"
    pretty.write_text(
        "\n".join(
            json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "EventList", "items": b}, indent=2)
            for b in batches
        )
    )
    assert summary(pretty) == plain


def test_standard_input_reads_the_same(
    monkeypatch: pytest.MonkeyPatch, plain: dict[str, Any]
) -> None:
    stdin = io.TextIOWrapper(io.BufferedReader(io.BytesIO(LOG.read_bytes())))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert summary("-") == plain


def test_truncated_and_garbage_lines_are_reported_by_line_number_and_skipped(
    tmp_path: Path, plain: dict[str, Any]
) -> None:
    lines = LOG.read_bytes().splitlines(keepends=True)
    damaged = tmp_path / "audit.log"
    last = lines[-1]
    damaged.write_bytes(
        b"".join(lines[:10])
        + b"E1130 23:44:30.1 klog noise that is not JSON\n"
        + b"".join(lines[10:])
        + b'{"kind":"Event","objectRef":{"apiGroup":"apps.cozystack.io"}, "x": [}\n'
        + last[: len(last) // 2]
    )
    result = summary(damaged)
    assert result["malformedLines"] == [
        {"source": str(damaged), "line": 11, "error": "not a JSON object"},
        {
            "source": str(damaged),
            "line": len(lines) + 2,
            "error": result["malformedLines"][1]["error"],
        },
        {
            "source": str(damaged),
            "line": len(lines) + 3,
            "error": "truncated: the line does not end its JSON object",
        },
    ]
    assert result["malformedLines"][1]["error"].startswith("not JSON")
    assert result["malformed"] == 3
    skipped = ("malformed", "malformedLines")
    assert {k: v for k, v in result.items() if k not in skipped} == {
        k: v for k, v in plain.items() if k not in skipped
    }


def test_other_groups_are_counted_but_never_decoded() -> None:
    reader = EventReader([str(LOG)])
    decoded = list(reader)
    assert reader.events == len(events())
    assert all("apps.cozystack.io" in json.dumps(e) for e in decoded)
    assert len(decoded) < reader.events / 2


def test_a_large_file_shows_a_progress_bar_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "audit.log"
    payload = LOG.read_bytes()
    with big.open("wb") as out:
        for _ in range(5):  # over the few megabytes a bar starts at
            out.write(payload)
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", screen)
    reader = EventReader([str(big)], progress=True)
    assert sum(1 for _ in reader) > 0
    assert "audit.log" in screen.getvalue()
    assert "100%" in screen.getvalue()
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert sum(1 for _ in EventReader([str(LOG)], progress=True)) > 0
    assert quiet.getvalue() == ""  # a small file shows none
