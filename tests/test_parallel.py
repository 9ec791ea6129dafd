"""How the suite is spread over parallel workers: the modules whose tests share real servers
go whole to one worker, every other test to whichever worker is free."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.parallel import SHARED_SERVERS, SHARED_SERVERS_UNIT, SharedServerScheduling

ROOT = Path(__file__).resolve().parent.parent
# What starts real servers: the helper of tests/realkube.py, the environment of
# tests/cozystack_api and its fixture.
STARTS_SERVERS = {"real_apiserver", "CozystackAPI", "cozystack_api"}


def unit(nodeid: str) -> str:
    scheduling = SharedServerScheduling.__new__(SharedServerScheduling)  # no workers needed
    return scheduling._split_scope(nodeid)


def shares_servers(path: Path) -> bool:
    """Whether a module-, package- or session-scoped fixture of ``path`` starts real servers
    (calls :func:`tests.realkube.real_apiserver`, builds a ``CozystackAPI`` or takes the
    ``cozystack_api`` fixture)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.FunctionDef):
            continue
        scoped = any(
            isinstance(decorator, ast.Call)
            and any(
                k.arg == "scope"
                and isinstance(k.value, ast.Constant)
                and k.value.value in ("module", "package", "session")
                for k in decorator.keywords
            )
            for decorator in node.decorator_list
        )
        called = {
            n.func.id
            for n in ast.walk(node)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        taken = {a.arg for a in node.args.args}
        if scoped and (called | taken) & STARTS_SERVERS:
            return True
    return False


def test_every_module_sharing_real_servers_is_kept_on_one_worker() -> None:
    sharing = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("*.py")
        if shares_servers(path)
    )
    assert "tests/core/tenancy/test_budget_keys_kubernetes.py" in sharing
    assert "tests/cozystack_api/conftest.py" in sharing
    assert [module for module in sharing if not module.startswith(SHARED_SERVERS)] == []


def test_the_shared_server_modules_are_one_unit_and_other_tests_are_one_each() -> None:
    e2e = "tests/cozystack_api/test_e2e.py::test_a[vmdisk]"
    keys = "tests/core/tenancy/test_budget_keys_kubernetes.py::test_b[cpu=4]"
    assert unit(e2e) == unit(keys) == SHARED_SERVERS_UNIT
    seeds = "tests/simulation/test_simulation.py::test_c[0-249]"
    other = "tests/simulation/test_simulation.py::test_c[250-499]"
    assert unit(seeds) == seeds
    assert unit(other) == other
