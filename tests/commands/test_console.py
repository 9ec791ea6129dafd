"""What people expect of a command-line tool: version, exit codes in --help, completion,
a platform that ships with the package, readable explanations, and a server alive while it loads.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.builders import FIXTURES, ROOT, free_port
from webhook import __version__
from webhook.commands.cli import main
from webhook.commands.console import load_state_showing_progress
from webhook.commands.plugin import main as plugin
from webhook.core.admission.state import ReservationState
from webhook.defaults import defaults_digest, platform_dir
from webhook.server import serve
from webhook.settings import Settings
from webhook.state.manifests import load_state
from webhook.tls.certificates import generate

BIN = Path(sys.executable).parent


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        status = main(list(argv))
    except SystemExit as exit:
        status = int(exit.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("program", ["webhook", "kubectl-reservation"])
def test_version_names_the_package_and_the_digest_of_what_it_ships(program: str) -> None:
    done = subprocess.run(
        [str(BIN / program), "--version"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert __version__ in done.stdout
    assert defaults_digest() in done.stdout
    assert "cozystack/cozystack@" in done.stdout


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["report", "--help"]):
        status, out, _ = run(capsys, *argv)
        assert status == 0
        assert "exit status:" in out
        assert "2    bad input or usage" in out
        assert "1    --fail-on found" in out


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_is_generated_from_the_parser(
    capsys: pytest.CaptureFixture[str], shell: str
) -> None:
    status, out, _ = run(capsys, "completion", shell)
    assert status == 0
    for word in ("evaluate", "review", "report", "serve", "--fail-on", "--state"):
        assert word in out
    assert plugin(["completion", shell]) == 0
    assert "explain" in capsys.readouterr().out


def test_the_bundled_platform_is_the_fixture_platform_file_for_file() -> None:
    bundled = sorted(p.relative_to(platform_dir()) for p in platform_dir().rglob("*.yaml"))
    fixture = sorted(
        p.relative_to(FIXTURES / "cozystack") for p in (FIXTURES / "cozystack").rglob("*.yaml")
    )
    assert bundled == fixture
    for relative in bundled:
        assert (platform_dir() / relative).read_bytes() == (
            FIXTURES / "cozystack" / relative
        ).read_bytes(), relative


def test_evaluate_needs_no_state_and_charges_from_the_bundled_platform(
    capsys: pytest.CaptureFixture[str],
) -> None:
    values = str(FIXTURES / "samples" / "vm-values.yaml")
    status, out, _ = run(capsys, "evaluate", "--kind", "VMInstance", "--values", values)
    assert status == 0
    bundled = json.loads(out)
    _, out, _ = run(
        capsys,
        "evaluate",
        "--state",
        str(FIXTURES / "cozystack"),
        "--kind",
        "VMInstance",
        "--values",
        values,
    )
    assert bundled == json.loads(out)


def test_evaluate_warns_about_an_unknown_values_key_with_the_closest_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    values = tmp_path / "disk.yaml"
    values.write_text("storag: 50Gi\n")
    status, out, err = run(capsys, "evaluate", "--kind", "VMDisk", "--values", str(values))
    assert status == 0
    assert json.loads(out) == {"storage": "5Gi"}  # the schema default: the typo is ignored
    assert "warning: VMDisk: storag is not in the VMDisk schema (did you mean storage?)" in err


def test_evaluate_rejects_an_absurd_count_quoting_what_was_typed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    values = tmp_path / "pg.yaml"
    values.write_text("replicas: 1e12\n")
    status, _, err = run(capsys, "evaluate", "--kind", "Postgres", "--values", str(values))
    assert status == 2
    expected = 'Postgres: replicas: "1e12" is not a whole number (a count is digits only)'
    assert err == f"webhook evaluate: {expected}\n"


def test_explain_says_which_figures_came_from_schema_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    values = str(FIXTURES / "samples" / "vm-values.yaml")
    argv = ["evaluate", "--kind", "VMInstance", "--values", values, "--explain"]
    status, table, _ = run(capsys, *argv, "-o", "table")
    assert status == 0
    # resources.cpu without sockets: the CPU comes from the default instance type
    assert "u1.medium: schema default, not written" in table
    assert 'instanceType: "u1.medium"' in table
    _, out, _ = run(capsys, *argv)  # not a terminal: JSON
    explained = json.loads(out)
    assert explained["defaults"]["instanceType"] == "u1.medium"
    assert explained["terms"][0]["schemaDefaults"] == ["u1.medium"]


async def test_livez_answers_while_a_state_loads_and_readyz_waits_for_it(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    port = free_port()
    settings = Settings(cert_dir=str(certs), listen_port=port, metrics_port=0)
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_load() -> ReservationState:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=30)
        return load_state([FIXTURES / "cozystack", FIXTURES / "tenants"])

    task = asyncio.create_task(serve(None, settings, load=slow_load))
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    async def status(path: str) -> int:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                try:
                    async with session.get(
                        f"https://localhost:{port}{path}", ssl=context
                    ) as response:
                        return response.status
                except aiohttp.ClientConnectorError:
                    await asyncio.sleep(0.05)
        raise AssertionError("the server never listened")

    try:
        assert await status("/livez") == 200
        assert await status("/readyz") == 503
        release.set()
        for _ in range(100):
            if await status("/readyz") == 200:
                break
            await asyncio.sleep(0.05)
        assert await status("/readyz") == 200
    finally:
        release.set()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, 30)


def test_serve_logs_every_kind_s_mode_and_the_loaded_state(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    server = subprocess.Popen(
        [
            str(BIN / "webhook"),
            "serve",
            *("--state", str(FIXTURES / "cozystack"), "--state", str(FIXTURES / "tenants")),
            *("--cert-dir", str(certs), "--listen", f"127.0.0.1:{free_port()}"),
            *("--metrics-listen", f"127.0.0.1:{free_port()}"),
            *("--mode", "warn", "--mode-for", "Postgres=enforce"),
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert server.stderr is not None
    lines: dict[str, dict[str, object]] = {}
    try:
        for line in server.stderr:
            entry = json.loads(line)
            lines[str(entry["message"])] = entry
            if entry["message"] == "state loaded":
                break
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=30)
    modes = lines["modes"]["modes"]
    assert isinstance(modes, dict)
    assert modes["Postgres"] == "enforce"
    assert modes["VMInstance"] == "warn"
    assert lines["state loaded"]["kinds"] == 31
    assert server.returncode == 0


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_bar_shows_on_a_terminal_and_never_on_a_pipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    paths = [str(FIXTURES / "cozystack"), str(FIXTURES / "tenants")]
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    load_state_showing_progress(paths)
    assert "reading manifests" in terminal.getvalue()
    assert "manifests=" in terminal.getvalue()
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    load_state_showing_progress(paths)
    assert pipe.getvalue() == ""


def test_evaluate_reads_only_the_platform_not_the_applications(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    apps = tmp_path / "apps"
    apps.mkdir()
    # an application file evaluate must never parse: it is not even YAML
    (apps / "broken.yaml").write_text("kind: Postgres\nspec: {replicas: [\n")
    values = str(FIXTURES / "samples" / "postgres-values.yaml")
    argv = ["--state", str(FIXTURES / "cozystack"), "--state", str(apps)]
    status, _, _ = run(capsys, "evaluate", *argv, "--kind", "Postgres", "--values", values)
    assert status == 0
    status, _, err = run(capsys, "report", *argv)
    assert status == 2
    assert "broken.yaml: line" in err
