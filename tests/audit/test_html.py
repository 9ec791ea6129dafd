"""The page ``--html`` writes opens without a network and shows each pool's chart."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.audit.logs import LOG, PLATFORM
from webhook.cli import main

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
