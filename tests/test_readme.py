"""The README opens with two commands, CI runs its test command, and every command and link
of the README and docs/ is true."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def opening_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```sh\n(.+?)\n```", text, flags=re.DOTALL)[:2]


def test_readme_opens_with_a_run_command_and_a_test_command() -> None:
    run, test = opening_commands()
    assert run.startswith("python3 -m venv .venv && ")
    assert test.startswith("python3 -m venv .venv && ")
    assert test.endswith(".venv/bin/pytest -n auto")  # the suite spread over parallel workers


def test_ci_runs_the_readme_test_command() -> None:
    _, test = opening_commands()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test in ci.splitlines()


def test_the_run_command_uses_files_that_exist() -> None:
    run, _ = opening_commands()
    for path in re.findall(r"(fixtures/\S+)", run):
        assert (ROOT / path).exists(), path


BIN = Path(sys.executable).parent
# Commands the README shows that cannot run here: they need a cluster, or run until stopped.
NEEDS_A_CLUSTER = ("webhook serve",)


def pages() -> list[Path]:
    """The README and every page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def readme_commands() -> list[tuple[str, int]]:
    """Every `webhook ...` and `kubectl reservation ...` line in a ```sh block of the README or
    docs/, with the exit status the page documents for it (a trailing `# exit N`, else 0)."""
    fenced = re.compile(r"^( *)```sh\n(.*?)\n\1```", flags=re.DOTALL | re.MULTILINE)
    # A block may be indented under a list item: it ends at a fence indented as far.
    blocks = [block for page in pages() for _, block in fenced.findall(page.read_text("utf-8"))]
    commands = []
    for block in blocks:
        for raw in block.replace("\\\n", " ").splitlines():
            match = re.fullmatch(r"(.*?)(?:\s+#\s*(.*))?", raw.strip())
            assert match is not None
            command, comment = match[1], match[2] or ""
            if not command.startswith(("webhook ", "kubectl reservation ")):
                continue
            status = re.search(r"\bexit (\d+)", comment)
            commands.append((command, int(status[1]) if status else 0))
    return commands


def runnable(command: str) -> bool:
    if command.startswith(NEEDS_A_CLUSTER):
        return False
    return not command.startswith("kubectl reservation ") or "--state" in command


def test_the_readme_shows_commands_that_can_run_here() -> None:
    commands = [c for c, _ in readme_commands() if runnable(c)]
    assert len(commands) >= 10
    assert any(c.startswith("kubectl reservation ") for c in commands)


@pytest.mark.parametrize(
    ("command", "status"),
    [pytest.param(c, s, id=c[:60]) for c, s in readme_commands() if runnable(c)],
)
def test_a_readme_command_runs_and_exits_as_documented(command: str, status: int) -> None:
    shell = command.replace("kubectl reservation ", "kubectl-reservation ", 1)
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", shell],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr
    assert done.returncode == status, done.stderr


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(text: str) -> str:
    """A page without its code blocks."""
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose(page.read_text()), re.MULTILINE)}


def test_every_link_in_the_readme_and_docs_resolves() -> None:
    broken = []
    for page in pages():
        for link in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", link):
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert broken == []
