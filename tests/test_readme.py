"""The README opens with the two commands, and CI runs the README's test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def opening_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```sh\n(.+?)\n```", text, flags=re.DOTALL)[:2]


def test_readme_opens_with_a_run_command_and_a_test_command() -> None:
    run, test = opening_commands()
    assert run.startswith("python3 -m venv .venv && ")
    assert test.startswith("python3 -m venv .venv && ")
    assert test.endswith(".venv/bin/pytest")


def test_ci_runs_the_readme_test_command() -> None:
    _, test = opening_commands()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test in ci.splitlines()


def test_the_run_command_uses_files_that_exist() -> None:
    run, _ = opening_commands()
    for path in re.findall(r"(fixtures/\S+)", run):
        assert (ROOT / path).exists(), path
