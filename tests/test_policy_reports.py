"""Policy reports written to a cluster: by the leader on the emulated API server, and by the
writer on a real kube-apiserver with the published OpenReports CRD installed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.builders import ROOT, state, tenant, thing
from tests.cluster import app, cluster, kube_client
from tests.cluster import tenant as tenant_object
from tests.realkube import kubectl, real_apiserver
from tests.test_live import MICRO, certs, replica  # noqa: F401  (fixture)
from tests.waiting import eventually
from webhook.core.admission.policy_reports import REPORT_NAME, build_reports
from webhook.kube.client import KubeClient
from webhook.kube.reports import ABSENT_SECONDS, ReportWriter

CRD = ROOT / "fixtures" / "crds" / "openreports.io_reports.yaml"
GROUP, PLURAL = "openreports.io", "reports"


def results(report: dict[str, Any] | None) -> dict[str, str]:
    assert report is not None
    return {r["resources"][0]["name"]: r["result"] for r in report.get("results") or []}


async def test_the_leader_writes_reports_and_a_lowered_budget_fails_in_the_next_one(
    tmp_path: Path,
    certs: Path,  # noqa: F811
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant_object("tenant-root", "acme", {"memory": "4Gi"}))
        server.create(app("VMInstance", "tenant-acme", "vm", MICRO))
        async with replica(kubeconfig, certs) as webhook:
            services = webhook.services
            assert services is not None
            assert services.reports is not None
            services.report_seconds = 0.2
            # The duties look every reconcile_seconds whether a round of reports is due.
            services.ledger.settings = dataclasses.replace(
                services.ledger.settings, reconcile_seconds=0.2
            )

            def report() -> dict[str, Any] | None:
                return server.get(GROUP, PLURAL, "tenant-acme", REPORT_NAME)

            writer = services.reports
            await eventually(lambda: report() is not None and results(report()) == {"vm": "pass"})
            # The round that stored it may still be writing another namespace's report, and
            # counts its writes in `written` only at its end: wait for a round that completed
            # after the report was seen, so that every write of it is counted in the baseline.
            seen = writer.rounds
            await eventually(lambda: writer.rounds > seen)
            written, rounds = writer.written, writer.rounds
            version = report()["metadata"]["resourceVersion"]  # type: ignore[index]
            # Several completed rounds with nothing changed: nothing written.
            await eventually(lambda: writer.rounds >= rounds + 3)
            assert report()["metadata"]["resourceVersion"] == version  # type: ignore[index]
            assert writer.written == written
            lowered = server.get("apps.cozystack.io", "tenants", "tenant-root", "acme")
            assert lowered is not None
            lowered["spec"]["resourceQuotas"] = {"memory": "512Mi"}
            server.update(lowered)
            await eventually(lambda: results(report()) == {"vm": "fail"})
            assert report()["summary"]["fail"] == 1  # type: ignore[index]


async def test_a_round_is_counted_complete_only_once_every_write_of_it_is_counted(
    tmp_path: Path,
) -> None:
    """``rounds`` grows only at a round's end, after its writes are added to ``written``: a
    reader that saw it grow reads every write of that round, never a part of one."""
    current = state({"tenant-acme": {"memory": "1Gi"}, "tenant-beta": {"memory": "1Gi"}})
    reports = build_reports(current)
    async with cluster(tmp_path, load=False) as (_, kubeconfig), kube_client(kubeconfig) as client:
        writer = ReportWriter(client)
        during: list[tuple[int, int]] = []

        async def handed() -> Any:
            for namespace, built in reports.items():
                during.append((writer.rounds, writer.written))
                yield namespace, built

        assert await writer.reconcile(handed()) == len(reports) == 3
        assert during == [(0, 0)] * 3  # nothing counted while the round was under way
        assert (writer.rounds, writer.written) == (1, 3)
        assert await writer.reconcile(build_reports(current).items()) == 0
        assert (writer.rounds, writer.written) == (2, 3)  # a round that wrote nothing counts


async def test_a_tenant_editing_its_report_sees_it_restored(
    tmp_path: Path,
    certs: Path,  # noqa: F811
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        server.create(tenant_object("tenant-root", "acme", {"memory": "512Mi"}))
        server.create(app("VMInstance", "tenant-acme", "vm", MICRO))
        async with replica(kubeconfig, certs) as webhook:
            assert webhook.services is not None
            webhook.services.report_seconds = 0.2

            def report() -> dict[str, Any] | None:
                return server.get(GROUP, PLURAL, "tenant-acme", REPORT_NAME)

            await eventually(lambda: report() is not None and results(report()) == {"vm": "fail"})
            forged = report()
            assert forged is not None
            forged["summary"] = {"pass": 1, "fail": 0, "warn": 0, "error": 0, "skip": 0}
            forged["results"][0]["result"] = "pass"
            server.update(forged)
            await eventually(lambda: results(report()) == {"vm": "fail"})


async def test_a_tenant_creating_decoy_reports_never_has_them_read_or_changed(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (server, kubeconfig):
        decoys = [
            {
                "apiVersion": "openreports.io/v1alpha1",
                "kind": "Report",
                "metadata": {
                    "name": f"decoy-{i}",
                    "namespace": "tenant-acme",
                    "labels": {"app.kubernetes.io/managed-by": "reservation-webhook"},
                },
                "results": [{"policy": "x" * 10_000, "result": "fail"}],
            }
            for i in range(30)
        ]
        for decoy in decoys:
            server.create(decoy)
        before = {
            d["metadata"]["name"]: d["metadata"]["resourceVersion"]
            for d in server.objects(GROUP, PLURAL, "tenant-acme")
        }
        reports = build_reports(state({"tenant-acme": {"memory": "1Gi"}}))
        async with kube_client(kubeconfig) as client:
            writer = ReportWriter(client)
            assert await writer.reconcile(reports.items()) == len(reports)
            assert await writer.reconcile(reports.items()) == 0
        lists = [dict(r.query) for r in server.requests if r.method == "GET" and PLURAL in r.path]
        assert lists
        assert all(q.get("fieldSelector") == f"metadata.name={REPORT_NAME}" for q in lists)
        after = {
            o["metadata"]["name"]: o["metadata"]["resourceVersion"]
            for o in server.objects(GROUP, PLURAL, "tenant-acme")
            if o["metadata"]["name"] != REPORT_NAME
        }
        assert after == before


async def test_tenants_stuffing_their_reports_never_make_the_leader_read_a_huge_page(
    tmp_path: Path,
) -> None:
    """A tenant may write its report in every namespace it has, each up to etcd's object limit:
    a page of 50 would be tens of MiB for the leader to read and parse at once (its memory limit
    is 512 MiB). No page read is larger than 4 MiB, and every stuffed report is restored."""
    namespaces = [f"tenant-acme{i}" for i in range(8)]
    reports = build_reports(state({ns: {"memory": "1Gi"} for ns in namespaces}))
    async with cluster(tmp_path) as (server, kubeconfig), kube_client(kubeconfig) as client:
        for ns in namespaces:
            stuffed = json.loads(json.dumps(reports[ns]))
            stuffed["results"] = [{"policy": "x" * (1 << 20), "result": "pass"}]
            server.create(stuffed)
        read: list[int] = []
        request = client.request

        async def measured(method: str, path: str, **kwargs: Any) -> Any:
            answer = await request(method, path, **kwargs)
            if method == "GET" and path.endswith(PLURAL):
                read.append(len(json.dumps(answer)))
            return answer

        client.request = measured  # type: ignore[method-assign]
        writer = ReportWriter(client)
        assert await writer.reconcile(reports.items()) == len(reports)
        assert read
        assert max(read) <= 4 * 1024 * 1024
        for ns in namespaces:
            assert server.get(GROUP, PLURAL, ns, REPORT_NAME)["results"] == []  # type: ignore[index]
        assert await writer.reconcile(reports.items()) == 0


async def test_a_conflict_in_one_namespace_defers_only_that_one(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (server, kubeconfig), kube_client(kubeconfig) as client:
        writer = ReportWriter(client)
        tenants = {"tenant-a": {"memory": "1Gi"}, "tenant-b": {"memory": "1Gi"}}
        first = build_reports(state(tenants, thing("tenant-a", memory="1Mi")))
        assert await writer.reconcile(first.items()) == len(first)
        changed = build_reports(
            state(tenants, thing("tenant-a", memory="2Gi"), thing("tenant-b", memory="2Gi"))
        )
        server.fail_next(1, 409, method="PUT")
        assert await writer.reconcile(changed.items()) == 1
        assert await writer.reconcile(changed.items()) == 1
        assert await writer.reconcile(changed.items()) == 0
        for ns in ("tenant-a", "tenant-b"):
            assert set(results(server.get(GROUP, PLURAL, ns, REPORT_NAME)).values()) == {"fail"}


async def test_without_the_openreports_crd_the_writer_says_so_once_and_waits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.apiserver.server import EmulatedAPIServer

    api = EmulatedAPIServer()
    async with api:
        clock = [0.0]
        client = KubeClient.from_kubeconfig(str(api.kubeconfig(tmp_path / "kubeconfig")))
        try:
            writer = ReportWriter(client, clock=lambda: clock[0])
            reports = build_reports(state({"tenant-acme": None}))
            with caplog.at_level(logging.INFO, logger="webhook.kube.reports"):
                assert await writer.reconcile(reports.items()) == 0
                assert await writer.reconcile(reports.items()) == 0
            asked = [r for r in api.requests if PLURAL in r.path]
            assert len(asked) == 1  # the second round did not ask again
            assert writer.absent
            warnings = [r for r in caplog.records if r.message == "policy reports not written"]
            assert len(warnings) == 1
            clock[0] += ABSENT_SECONDS
            assert await writer.reconcile(reports.items()) == 0
            assert len([r for r in api.requests if PLURAL in r.path]) == 2
        finally:
            await client.close()


@pytest.mark.kube
async def test_a_real_api_server_with_the_openreports_crd_accepts_the_reports(
    tmp_path: Path,
) -> None:
    """The published CRD installed into a real kube-apiserver v1.36: every report written is
    accepted (its structural schema validates and prunes: nothing we write may be dropped),
    an unchanged report is not written again, and a lowered budget fails in the next one."""
    with real_apiserver(tmp_path / "kube") as kubeconfig:
        kubectl(kubeconfig, "apply", "-f", str(CRD))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/reports.openreports.io")
        for ns in ("tenant-root", "tenant-acme"):
            kubectl(kubeconfig, "create", "namespace", ns)
        current = state(
            {"tenant-acme": {"memory": "8Gi"}},
            thing("tenant-acme", "db", memory="4Gi"),
            thing("tenant-acme", "cache", memory="3800Mi"),
        )
        client = KubeClient.from_kubeconfig(str(kubeconfig))
        try:
            writer = ReportWriter(client)
            reports = build_reports(current)
            assert await writer.reconcile(reports.items()) == 2
            stored = json.loads(
                kubectl(
                    kubeconfig, "get", "reports", "-n", "tenant-acme", REPORT_NAME, "-o", "json"
                )
            )
            written = reports["tenant-acme"]
            # Nothing pruned: every field written is a field of the published schema.
            assert {k: v for k, v in stored.items() if k != "metadata"} == {
                k: v for k, v in written.items() if k != "metadata"
            }
            assert stored["metadata"]["labels"] == written["metadata"]["labels"]
            assert results(stored) == {"cache": "warn", "db": "warn"}
            assert await writer.reconcile(build_reports(current).items()) == 0
            current.observe(tenant("tenant-acme", {"memory": "6Gi"}))
            assert await writer.reconcile(build_reports(current).items()) == 1
            stored = json.loads(
                kubectl(
                    kubeconfig, "get", "reports", "-n", "tenant-acme", REPORT_NAME, "-o", "json"
                )
            )
            assert results(stored) == {"cache": "fail", "db": "fail"}
            assert stored["summary"]["fail"] == 2
            table = kubectl(kubeconfig, "get", "reports", "-n", "tenant-acme")
            assert "FAIL" in table.splitlines()[0]
        finally:
            await client.close()


@pytest.mark.kube
async def test_a_report_full_of_hostile_unicode_is_still_stored_by_a_real_api_server(
    tmp_path: Path,
) -> None:
    """Reasons quoting emoji are 12 bytes a character as sent: a report of 500 of them would
    be refused, and the stale report would stand. The bounded one is stored, its fail counted."""
    from webhook.core.tenancy.applications import Application

    hostile = "\U0001f600" * 5000
    apps = [
        Application("VMInstance", "tenant-acme", f"vm{i:04d}", {"instanceType": hostile})
        for i in range(550)
    ]
    current = state({"tenant-acme": {"memory": "8Gi"}}, *apps, thing("tenant-acme", memory="9Gi"))
    with real_apiserver(tmp_path / "kube") as kubeconfig:
        kubectl(kubeconfig, "apply", "-f", str(CRD))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/reports.openreports.io")
        for ns in ("tenant-root", "tenant-acme"):
            kubectl(kubeconfig, "create", "namespace", ns)
        client = KubeClient.from_kubeconfig(str(kubeconfig))
        try:
            assert await ReportWriter(client).reconcile(build_reports(current).items()) == 2
        finally:
            await client.close()
        stored = json.loads(
            kubectl(kubeconfig, "get", "reports", "-n", "tenant-acme", REPORT_NAME, "-o", "json")
        )
        assert stored["summary"]["fail"] == 1
        assert stored["summary"]["error"] == 550


@pytest.mark.kube
def test_a_tenant_cannot_forge_or_squat_the_report_on_a_real_api_server(tmp_path: Path) -> None:
    """The install's admission policy: a tenant allowed to write reports in its namespace can
    neither create the webhook's report first nor turn its fail into a pass; the webhook's
    service account can, other reports and deletes are left alone."""
    import time

    import yaml

    rendered = kubectl(Path("/dev/null"), "kustomize", str(ROOT / "deploy"))
    policy = [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"].startswith("ValidatingAdmissionPolicy")
    ]
    assert policy, "the install ships an admission policy for the report"
    report = {**build_reports(state({"tenant-acme": {"memory": "1Gi"}}))["tenant-acme"]}
    forged = json.dumps({**report, "summary": {**report["summary"], "pass": 7}})
    webhook = "system:serviceaccount:cozy-reservation:reservation-webhook"
    with real_apiserver(tmp_path / "kube") as kubeconfig:
        kubectl(kubeconfig, "apply", "-f", str(CRD))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/reports.openreports.io")
        kubectl(kubeconfig, "create", "namespace", "tenant-acme")
        kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(policy))
        kubectl(
            kubeconfig, "create", "role", "reports", "-n", "tenant-acme", "--verb=*",
            "--resource=reports.openreports.io",
        )  # fmt: skip
        for binding, who in (
            ("alice", "--user=alice"),
            ("webhook", "--serviceaccount=cozy-reservation:reservation-webhook"),
        ):
            kubectl(
                kubeconfig, "create", "rolebinding", binding, "-n", "tenant-acme",
                "--role=reports", who,
            )  # fmt: skip

        def as_(
            user: str, *args: str, stdin: str | None = None
        ) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["kubectl", "--kubeconfig", str(kubeconfig), f"--as={user}", *args],
                input=stdin, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip

        squat = json.dumps(report)
        deadline = time.monotonic() + 30  # the policy takes a moment to be enforced
        while True:
            done = as_("alice", "create", "--dry-run=server", "-f", "-", stdin=squat)
            if done.returncode != 0:
                break
            assert time.monotonic() < deadline, "the policy never denied the squat"
            time.sleep(0.5)
        assert "written by the reservation webhook only" in done.stderr
        assert as_(webhook, "create", "-f", "-", stdin=squat).returncode == 0
        denied = as_("alice", "replace", "-f", "-", stdin=forged)
        assert denied.returncode != 0
        assert "written by the reservation webhook only" in denied.stderr
        other = json.dumps({**report, "metadata": {**report["metadata"], "name": "mine"}})
        assert as_("alice", "create", "-f", "-", stdin=other).returncode == 0
        assert as_(webhook, "replace", "-f", "-", stdin=forged).returncode == 0
        assert as_("alice", "delete", "report", "-n", "tenant-acme", REPORT_NAME).returncode == 0


class Collector:
    """A writer that takes every report as the leader hands them over."""

    def __init__(self) -> None:
        self.reports: dict[str, dict[str, Any]] = {}

    async def reconcile(self, reports: Any) -> int:
        async for namespace, report in reports:
            self.reports[namespace] = report
        return 0


async def test_a_tenant_with_thousands_of_applications_never_holds_admission_for_the_walk(
    tmp_path: Path,
) -> None:
    """The leader evaluates a large namespace a part at a time: the event loop (admission)
    gets a turn at least every few milliseconds of the walk, not after the whole of it."""
    from webhook.server import REPORT_PART, LiveServices
    from webhook.settings import Settings

    apps = [thing("tenant-acme", f"a{i:05d}", memory="1Mi") for i in range(6 * REPORT_PART)]
    big = state({"tenant-acme": {"memory": "100Gi"}, "tenant-beta": None}, *apps)
    async with cluster(tmp_path, load=False) as (_, kubeconfig), kube_client(kubeconfig) as client:
        services = LiveServices(client, Settings(namespace="cozy-reservation"))
        services.live.state = big
        turns = 0
        done = asyncio.Event()

        async def heartbeat() -> None:
            nonlocal turns
            while not done.is_set():
                turns += 1
                await asyncio.sleep(0)

        beat = asyncio.create_task(heartbeat())
        writer = Collector()
        await services._policy_reports(writer)  # type: ignore[arg-type]
        done.set()
        await beat
    assert turns >= 6  # at least one turn per part of the large namespace
    assert writer.reports["tenant-acme"]["summary"]["pass"] == 6 * REPORT_PART
    assert sorted(writer.reports) == ["tenant-acme", "tenant-beta", "tenant-root"]
