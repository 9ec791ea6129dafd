"""Every way an operator's command can go wrong ends in one line, exit 2, and no traceback.

Each case runs the installed entry points (``webhook``, ``kubectl-reservation``) in a
subprocess, as an operator would, with no cluster and a home directory of its own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builders import FIXTURES, ROOT
from webhook.tls.certificates import generate

BIN = Path(sys.executable).parent
PLATFORM = str(FIXTURES / "cozystack")
STATE = ["--state", PLATFORM, "--state", str(FIXTURES / "tenants")]


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment with no cluster: no service account, no kubeconfig, an empty home."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KUBERNETES_", "WEBHOOK_", "KUBECONFIG"))
    }
    return {**clean, "HOME": str(tmp_path), **extra}


def run(
    tmp_path: Path, program: str, *args: str, timeout: float = 60, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / program), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(tmp_path, **extra),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.fixture
def kubeconfig_garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage"
    path.write_text("clusters: [this is: not, a kubeconfig\n")
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_serve_outside_a_cluster_without_state_names_the_flags_to_pass(tmp_path: Path) -> None:
    done = run(tmp_path, "webhook", "serve", "--cert-dir", "certs")
    assert_one_line_error(done, "not in a cluster", "--state DIR", "--kubeconfig FILE")


def test_serve_with_a_missing_kubeconfig_names_the_file(tmp_path: Path) -> None:
    done = run(tmp_path, "webhook", "serve", "--kubeconfig", str(tmp_path / "nope"))
    assert_one_line_error(done, "--kubeconfig", "nope", "no such file")


def test_serve_with_a_malformed_kubeconfig_names_the_file(
    tmp_path: Path, kubeconfig_garbage: Path
) -> None:
    done = run(tmp_path, "webhook", "serve", "--kubeconfig", str(kubeconfig_garbage))
    assert_one_line_error(done, str(kubeconfig_garbage))


def test_serve_on_a_port_in_use_names_the_address_and_the_flag(
    tmp_path: Path, busy_port: int
) -> None:
    certs = tmp_path / "certs"
    generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    done = run(
        tmp_path,
        "webhook",
        "serve",
        *STATE,
        "--cert-dir",
        str(certs),
        "--listen",
        f"127.0.0.1:{busy_port}",
        "--log-level",
        "error",
    )
    assert_one_line_error(done, f"cannot listen on 127.0.0.1:{busy_port}", "--listen")
    assert "Unclosed" not in done.stderr


def test_an_unknown_log_level_lists_the_levels(tmp_path: Path) -> None:
    done = run(tmp_path, "webhook", "serve", *STATE, "--log-level", "LOUD")
    assert_one_line_error(done, "log-level", "'LOUD'", "debug, info, warning, error")


@pytest.mark.parametrize(
    ("mode_for", "expected"),
    [
        pytest.param("postgres=warn", "did you mean Postgres?", id="mis-cased-kind"),
        pytest.param("NoKind=warn", "no such application kind; known kinds: BootBox", id="unknown"),
    ],
)
def test_a_mode_for_a_kind_that_does_not_exist_is_refused(
    tmp_path: Path, mode_for: str, expected: str
) -> None:
    review = str(FIXTURES / "reviews" / "create-vm-u1-micro.json")
    done = run(tmp_path, "webhook", "review", *STATE, "--mode-for", mode_for, review)
    assert_one_line_error(done, expected)
    # the same through the environment, before the server listens
    done = run(tmp_path, "webhook", "serve", *STATE, WEBHOOK_MODE_FOR=mode_for)
    assert_one_line_error(done, expected)


def test_certs_generate_into_an_unwritable_place_names_the_directory(tmp_path: Path) -> None:
    done = run(tmp_path, "webhook", "certs", "generate", "--out", "/proc/nope", "--dns", "x")
    assert_one_line_error(done, "--out /proc/nope", "cannot create the directory")


def test_certs_generate_onto_a_file_says_it_needs_a_directory(tmp_path: Path) -> None:
    existing = tmp_path / "file"
    existing.write_text("")
    done = run(tmp_path, "webhook", "certs", "generate", "--out", str(existing), "--dns", "x")
    assert_one_line_error(done, "is a file, not a directory")


def test_the_plugin_without_a_kubeconfig_says_what_to_pass(tmp_path: Path) -> None:
    done = run(tmp_path, "kubectl-reservation", "report")
    assert_one_line_error(done, "no kubeconfig", "--kubeconfig FILE", "--state DIR")


def test_the_plugin_honours_a_multi_file_kubeconfig_variable(tmp_path: Path) -> None:
    missing = f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}"
    done = run(tmp_path, "kubectl-reservation", "report", KUBECONFIG=missing)
    assert_one_line_error(done, "no kubeconfig", str(tmp_path / "a"))


def test_the_plugin_against_an_unreachable_cluster_fails_with_the_url(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    done = run(
        tmp_path,
        "kubectl-reservation",
        "report",
        "--kubeconfig",
        str(kubeconfig),
        "--request-timeout",
        "5s",
        timeout=30,
    )
    assert_one_line_error(done, "cannot reach the API server", f"http://127.0.0.1:{port}/apis/")


def test_a_context_that_does_not_exist_is_named(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\ncurrent-context: ''\n"
    )
    done = run(
        tmp_path,
        "kubectl-reservation",
        "report",
        "--kubeconfig",
        str(kubeconfig),
        "--context",
        "prod",
    )
    assert_one_line_error(done, "kubeconfig", "prod")


def test_malformed_yaml_in_a_state_directory_names_the_file_and_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "bad.yaml").write_text("kind: Tenant\nmetadata: {name: [x\nspec: {}\n")
    done = run(tmp_path, "webhook", "report", "--state", PLATFORM, "--state", str(state))
    assert_one_line_error(done, "bad.yaml: line", "not YAML")


def test_a_state_without_application_definitions_says_so(tmp_path: Path) -> None:
    done = run(tmp_path, "webhook", "report", "--state", str(FIXTURES / "tenants"))
    assert_one_line_error(done, "no ApplicationDefinition found", "fixtures/cozystack")
    values = str(FIXTURES / "samples" / "postgres-values.yaml")
    done = run(
        tmp_path,
        "webhook",
        "evaluate",
        "--state",
        str(FIXTURES / "tenants"),
        "--kind",
        "Postgres",
        "--values",
        values,
    )
    assert_one_line_error(done, "no ApplicationDefinition found")


def test_a_kind_that_contradicts_the_object_is_refused(tmp_path: Path) -> None:
    vm = str(FIXTURES / "samples" / "vm-u1-large.yaml")
    done = run(tmp_path, "webhook", "evaluate", "--kind", "Postgres", "--object", vm)
    assert_one_line_error(done, "--kind Postgres contradicts", "which is a VMInstance")


def test_an_unknown_fail_on_word_suggests_the_right_one(tmp_path: Path) -> None:
    done = run(tmp_path, "webhook", "report", *STATE, "--fail-on", "drfit")
    assert_one_line_error(done, "did you mean drift?")


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["webhook", "report", *STATE], id="webhook-report"),
        pytest.param(
            [
                "webhook",
                "review",
                *STATE,
                *[str(FIXTURES / "reviews" / "create-vm-u1-micro.json")] * 400,
            ],
            id="webhook-review",
        ),
        pytest.param(["kubectl-reservation", "report", *STATE], id="plugin-report"),
        pytest.param(["webhook", "contract-schema"], id="webhook-contract-schema"),
    ],
)
def test_a_reader_that_closes_the_pipe_stops_the_output_quietly(
    tmp_path: Path, argv: list[str]
) -> None:
    read, write = os.pipe()
    os.close(read)  # as `| head -1` does once it has its line: every write now fails
    try:
        done = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env(tmp_path),
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr
    assert "BrokenPipe" not in done.stderr
    assert done.stderr == ""
    assert done.returncode == 141  # what a shell shows for kubectl cut off the same way


def test_serve_on_a_port_in_use_logs_no_shutdown_and_ends_with_the_error(
    tmp_path: Path, busy_port: int
) -> None:
    """At the default log level the startup lines come first; a server that never served logs
    no shutdown, and the reason is the last line on the screen."""
    certs = tmp_path / "certs"
    generate(certs, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    listen = ["--listen", f"127.0.0.1:{busy_port}"]
    done = run(tmp_path, "webhook", "serve", *STATE, "--cert-dir", str(certs), *listen)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    *logged, last = done.stderr.strip().splitlines()
    assert f"cannot listen on 127.0.0.1:{busy_port}" in last, done.stderr
    messages = [json.loads(line)["message"] for line in logged]
    assert messages[0] == "modes", messages
    assert "shutting down" not in messages, messages
    assert "stopped" not in messages, messages


def test_evaluate_of_a_yaml_key_that_is_not_a_string_names_it_not_an_internal_error(
    tmp_path: Path,
) -> None:
    vm = tmp_path / "vm.yaml"
    vm.write_text(
        "apiVersion: apps.cozystack.io/v1alpha1\nkind: VMInstance\n"
        "metadata: {name: vm1, namespace: tenant-acme}\nspec:\n  instanceType: u1.micro\n  1: x\n"
    )
    done = run(tmp_path, "webhook", "evaluate", "--object", str(vm))
    assert_one_line_error(done, "spec.1", "not a string")
