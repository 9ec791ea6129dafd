"""The codebase keeps its own rules: lint-clean, formatted, typed, and layered."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    executable = shutil.which(tool, path=str(Path(sys.executable).parent)) or tool
    return subprocess.run(
        [executable, *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=300
    )


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(("ruff", "check", "."), id="ruff-lint"),
        pytest.param(("ruff", "format", "--check", "."), id="ruff-format"),
        pytest.param(("mypy",), id="mypy-strict-on-the-core"),
        pytest.param(("lint-imports", "--no-cache"), id="import-layers"),
    ],
)
def test_tool_passes(command: tuple[str, ...]) -> None:
    result = run(*command)
    assert result.returncode == 0, result.stdout + result.stderr
