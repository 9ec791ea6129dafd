"""The changelog keeps a release section for the version the package says it is."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from webhook import __version__

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_version_has_a_changelog_section_and_one_spelling() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["version"] == __version__
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, flags=re.M)
    assert releases[0] == __version__
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{__version__}]")


def test_the_shipped_image_tag_is_the_package_version() -> None:
    tags = {
        path.relative_to(ROOT).as_posix(): re.findall(r"^\s*newTag:\s*(\S+)\s*$", text, re.M)
        for path in sorted((ROOT / "deploy").rglob("kustomization.yaml"))
        if (text := path.read_text(encoding="utf-8"))
    }
    named = {path: found for path, found in tags.items() if found}
    assert named, "no kustomization in deploy/ names the image's tag"
    assert all(found == [__version__] for found in named.values()), named
