"""The page ``--html`` writes opens without a network and shows each pool's chart."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.audit.logs import LOG, PLATFORM, events
from webhook.audit.html import CELL_KEYS, CHART_KEYS, CHART_POOLS, render_page
from webhook.commands.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def page(tmp_path: Path, *argv: str) -> Path:
    target = tmp_path / "page.html"
    assert main(["audit", *argv, "--html", str(target), "-o", "json"]) == 0
    return target


def test_the_page_is_self_contained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = page(tmp_path, "summary", str(LOG)).read_text(encoding="utf-8")
    capsys.readouterr()
    assert not re.search(r"""(src|href)=["']?https?:""", text)
    assert text.count("<figure class='pool'") == 5
    assert "<svg" in text
    assert "tenant-acme-prod" in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("command", ["summary", "replay"])
def test_a_headless_browser_renders_every_pool_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    argv = [command, str(LOG)] + (
        ["--state", str(PLATFORM), "--mode", "enforce"] if command == "replay" else []
    )
    target = page(tmp_path, *argv)
    capsys.readouterr()
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            target.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rendered = re.search(r'data-charts-rendered="(\d+)/(\d+)"', done.stdout)
    assert rendered is not None, "the page's load handler never ran"
    drawn, total = map(int, rendered.groups())
    assert total >= 5
    assert drawn == total


POOL = "reservation.cozystack.io/pool"
BUDGET = "reservation.cozystack.io/budget"
RESERVED = "reservation.cozystack.io/reserved-after"


def log_with_keys(tmp_path: Path, keys: list[str]) -> Path:
    """The sample log with ``keys`` added to the budget (and reserved figures) of one event, as
    a sub-Tenant's budget keys reach the webhook's audit annotations."""
    lines = []
    changed = False
    for event in events():
        annotations = event.get("annotations", {})
        if not changed and BUDGET in annotations and annotations.get(POOL):
            budget = json.loads(annotations[BUDGET])
            reserved = json.loads(annotations.get(RESERVED, "{}"))
            for index, key in enumerate(keys):
                budget[key], reserved[key] = str(index + 2), str(index + 1)
            annotations[BUDGET], annotations[RESERVED] = json.dumps(budget), json.dumps(reserved)
            changed = True
        lines.append(json.dumps(event))
    assert changed
    target = tmp_path / "hostile.log"
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def test_a_budget_key_written_as_mathtext_is_drawn_as_its_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # matplotlib parsed "$\x$" as mathtext: the command exited 3 and wrote no page.
    text = page(tmp_path, "summary", str(log_with_keys(tmp_path, ["$\\x$"]))).read_text("utf-8")
    capsys.readouterr()
    assert ">$\\x$<" in text  # an SVG text element holding exactly the key


def test_markup_in_a_key_is_shown_as_text_never_as_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "</figcaption><img src=x onerror=alert(1)>"
    text = page(tmp_path, "summary", str(log_with_keys(tmp_path, [key]))).read_text("utf-8")
    capsys.readouterr()
    assert "<img" not in text
    assert "&lt;/figcaption&gt;&lt;img src=x onerror=alert(1)&gt;" in text


def test_200_keys_on_one_event_add_a_bounded_chart_that_says_what_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: one row per key, 21 s and a 1.7 MB page.
    keys = [f"example.com/made-up-{i:03d}" for i in range(200)]
    log = log_with_keys(tmp_path, keys)
    started = time.process_time()
    text = page(tmp_path, "summary", str(log)).read_text("utf-8")
    spent = time.process_time() - started
    capsys.readouterr()
    assert spent < 10, spent
    assert len(text) < 600_000, len(text)
    charted = re.findall(r">(example\.com/made-up-\d+)<", text)
    assert 0 < len(set(charted)) <= CHART_KEYS
    assert re.search(r"\d+ more keys not charted \(smaller shares of budget\): example", text)
    assert re.search(r"made-up-\d+ and \d+ more[;<]", text)  # names listed are bounded too


def test_a_cell_shows_its_largest_entries_and_counts_the_rest() -> None:
    budget = {f"k{i:03d}": str(i) for i in range(200)}
    text = render_page("t", {"pools": [{"pool": "p", "budget": budget}]}, {})
    assert "k199=199, k198=198" in text
    assert f"(and {200 - CELL_KEYS} smaller, not shown)" in text
    assert "k000=" not in text


def test_a_page_charts_a_bounded_number_of_pools_and_names_the_rest() -> None:
    def series(share: int) -> dict[str, object]:
        point = {"time": "2026-11-30T00:00:00Z", "reserved": {"cpu": str(share)}}
        return {"points": [{**point, "budget": {"cpu": "100"}}], "denials": []}

    chart = {f"tenant-p{i:03d}": series(i % 100) for i in range(CHART_POOLS + 5)}
    text = render_page("t", {}, chart)
    assert text.count("<figure class='pool'") == CHART_POOLS
    assert "5 more pools not charted (smaller shares of budget): tenant-p" in text
    assert "id='pool-tenant-p044'" in text  # the largest share is charted
    assert "id='pool-tenant-p000'" not in text


def test_2000_keys_on_one_event_are_cut_where_they_are_read_and_the_page_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = [f"example.com/made-up-{i:04d}" for i in range(2000)]
    text = page(tmp_path, "summary", str(log_with_keys(tmp_path, keys))).read_text("utf-8")
    capsys.readouterr()
    assert re.search(r"up to 19\d\d further keys of one event were not kept for the chart", text)
    assert len(text) < 600_000
