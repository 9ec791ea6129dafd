"""Building the ``webhook`` parser, or the kubectl plugin's, imports no heavy module, so a command
that reads files starts fast: the Kubernetes client, aiohttp, jsonpatch and matplotlib load only
in the commands that use them (DESIGN: every command imports only what it uses)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("kubernetes", "aiohttp", "jsonpatch", "matplotlib", "prometheus_client")


def modules_loaded_by(code: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {name.partition(".")[0] for name in json.loads(done.stdout.splitlines()[-1])}


@pytest.mark.parametrize("heavy", HEAVY)
def test_importing_the_cli_loads_no_heavy_module(heavy: str) -> None:
    assert heavy not in modules_loaded_by("import webhook.commands.cli")


@pytest.mark.parametrize("heavy", HEAVY)
def test_building_the_parser_loads_no_heavy_module(heavy: str) -> None:
    assert heavy not in modules_loaded_by("from webhook.commands.cli import _parser\n_parser()")


@pytest.mark.parametrize("heavy", HEAVY)
def test_building_the_plugin_parser_loads_no_heavy_module(heavy: str) -> None:
    code = "from webhook.commands.plugin.cli import _parser\n_parser()"
    assert heavy not in modules_loaded_by(code)


def test_the_check_would_see_a_heavy_import() -> None:
    # The heavy commands' modules do load these: the test above is not vacuous.
    loaded = modules_loaded_by(
        "import webhook.capacity.plan, webhook.capacity.rebalance, webhook.audit.command"
    )
    assert {"kubernetes", "aiohttp", "jsonpatch", "prometheus_client"} <= loaded
