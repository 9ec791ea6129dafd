"""The architecture page draws the packages as the imports tie them, and every package says why.

``docs/architecture.md`` shows the module graph at the level of the packages; it is drawn from
the code's own imports here, so a page that no longer matches the code fails this test (run
``python -m tests.test_architecture`` to print the graph afresh).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "webhook"
PAGE = ROOT / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit(module: str) -> str | None:
    """The box a module is drawn in: a package of the core, else a package or module of
    ``webhook``; None for the package's own face (``webhook``, ``webhook.__main__``)."""
    parts = module.split(".")
    if parts[0] != "webhook" or len(parts) == 1 or parts[1] == "__main__":
        return None
    if parts[1] == "core":
        if len(parts) > 2 and (PACKAGE / "core" / parts[2]).is_dir():
            return ".".join(parts[1:3])
        return "core"
    return parts[1]


def imported(path: Path) -> set[str]:
    """Every module of this project that ``path`` imports, at any depth of its code."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                stem = ROOT.joinpath(*candidate.split("."))
                is_module = stem.with_suffix(".py").exists() or stem.is_dir()
                found.add(candidate if is_module else base)
    return {name for name in found if name.split(".")[0] == "webhook"}


def edges() -> set[tuple[str, str]]:
    drawn = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit(module_name(path))
        for target in map(unit, imported(path)):
            if source and target and target != source:
                drawn.add((source, target))
    return drawn


def mermaid() -> str:
    drawn = sorted(edges())
    names = sorted({name for edge in drawn for name in edge})

    def node(name: str) -> str:
        return name.replace(".", "_")

    lines = ["```mermaid", "graph TD", "  subgraph core"]
    lines += [f'    {node(n)}["{n.partition(".")[2]}"]' for n in names if n.startswith("core.")]
    lines += ["  end"]
    lines += [f'  {node(n)}["{n}"]' for n in names if not n.startswith("core.")]
    lines += [f"  {node(a)} --> {node(b)}" for a, b in drawn]
    return "\n".join([*lines, "```"])


def test_the_architecture_page_draws_the_imports_as_they_are() -> None:
    page = PAGE.read_text(encoding="utf-8")
    drawn = re.search(r"```mermaid\n.*?\n```", page, flags=re.DOTALL)
    assert drawn is not None, "docs/architecture.md has no mermaid graph"
    assert drawn[0] == mermaid(), "the graph is stale: python -m tests.test_architecture"


def test_every_package_says_what_it_decides() -> None:
    silent = [
        str(init.relative_to(ROOT))
        for init in sorted(PACKAGE.rglob("__init__.py"))
        if not ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    ]
    assert silent == []


if __name__ == "__main__":
    print(mermaid())
