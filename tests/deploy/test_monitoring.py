"""deploy/overlays/monitoring as `kubectl kustomize` renders it, read as specifications.

Built-in kinds are validated strictly with kubernetes-validate (offline), the Prometheus
operator's and the VictoriaMetrics operator's kinds against their published CRDs' schemas
(vendored in fixtures/crds), and, with a real API server, the whole overlay is applied as a
server-side dry run with those CRDs installed.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from tests.crd_schema import CRDS, check, crd_schema
from tests.deploy.test_manifests import (
    KUBERNETES_VERSION,
    NAME,
    NAMESPACE,
    Manifest,
    find,
    namespace_labels,
    render,
    selects,
)
from tests.realkube import kubectl, real_apiserver

OVERLAY: Final = "deploy/overlays/monitoring"
SCHEMAS: Final = {
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
    (
        "operator.victoriametrics.com/v1beta1",
        "VMServiceScrape",
    ): "operator.victoriametrics.com_vmservicescrapes.yaml",
}
METRICS_SERVICE: Final = "reservation-webhook-metrics"


@pytest.fixture(scope="module")
def overlay() -> list[Manifest]:
    return render(OVERLAY)


@pytest.fixture(scope="module")
def base() -> list[Manifest]:
    return render("deploy")


def validate(manifest: Manifest) -> None:
    key = (manifest["apiVersion"], manifest["kind"])
    if key in SCHEMAS:
        check(manifest, crd_schema(SCHEMAS[key], manifest["apiVersion"].rpartition("/")[2]))
        return
    try:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        raise AssertionError(f"{manifest['kind']}: {path}: {error.message}") from None


def test_every_object_is_valid_against_its_schema(overlay: list[Manifest]) -> None:
    kinds = set()
    for manifest in overlay:
        validate(manifest)
        kinds.add(manifest["kind"])
    assert {"PrometheusRule", "ServiceMonitor", "VMServiceScrape", "ConfigMap"} <= kinds


@pytest.mark.parametrize(
    ("kind", "change", "expected"),
    [
        pytest.param(
            "PrometheusRule",
            lambda m: m["spec"]["groups"][0]["rules"][0].update(expr=["not", "text"]),
            "expr",
            id="rule-expr-not-a-string",
        ),
        pytest.param(
            "ServiceMonitor",
            lambda m: m["spec"]["endpoints"][0].update(prot="metrics"),
            "prot",
            id="unknown-endpoint-field",
        ),
        pytest.param(
            "VMServiceScrape",
            lambda m: m["spec"].update(endpoints="metrics"),
            "endpoints",
            id="endpoints-not-a-list",
        ),
    ],
)
def test_the_crd_schemas_refuse_a_broken_object(
    overlay: list[Manifest], kind: str, change: Any, expected: str
) -> None:
    broken = copy.deepcopy(find(overlay, kind))
    change(broken)
    with pytest.raises(AssertionError, match=expected):
        validate(broken)


def test_the_base_objects_are_unchanged_but_for_one_networkpolicy_rule(
    overlay: list[Manifest], base: list[Manifest]
) -> None:
    ours = {(m["kind"], m["metadata"]["name"]): m for m in overlay}
    for manifest in base:
        key = (manifest["kind"], manifest["metadata"]["name"])
        if key == ("NetworkPolicy", NAME):
            continue
        assert ours[key] == manifest, key
    policy = ours[("NetworkPolicy", NAME)]
    before = find(base, "NetworkPolicy")
    assert policy["spec"]["ingress"][:-1] == before["spec"]["ingress"]
    added = policy["spec"]["ingress"][-1]
    assert added["ports"] == [{"protocol": "TCP", "port": 8080}]
    (source,) = added["from"]
    assert selects(source["namespaceSelector"], namespace_labels("cozy-monitoring"))
    assert set(ours) - {(m["kind"], m["metadata"]["name"]) for m in base} == {
        ("Service", METRICS_SERVICE),
        ("ServiceMonitor", NAME),
        ("VMServiceScrape", NAME),
        ("PrometheusRule", NAME),
        ("ConfigMap", "reservation-webhook-dashboard"),
    }


@pytest.mark.parametrize("kind", ["ServiceMonitor", "VMServiceScrape"])
def test_the_scrape_reaches_the_metrics_port_of_every_replica_and_only_it(
    overlay: list[Manifest], kind: str
) -> None:
    scrape = find(overlay, kind)
    services = [m for m in overlay if m["kind"] == "Service"]
    chosen = [s for s in services if selects(scrape["spec"]["selector"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in chosen] == [METRICS_SERVICE]
    assert scrape["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    service = chosen[0]
    (endpoint,) = scrape["spec"]["endpoints"]
    (port,) = service["spec"]["ports"]
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == (
        "metrics",
        "/metrics",
        "http",
    )
    assert port["name"] == "metrics"
    deployment = find(overlay, "Deployment")
    pod = deployment["spec"]["template"]
    assert selects({"matchLabels": service["spec"]["selector"]}, pod["metadata"]["labels"])
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port["targetPort"]] == 8080
    args = container["args"]
    assert args[args.index("--metrics-listen") + 1].endswith(":8080")


@pytest.mark.kube
def test_kubectl_apply_of_the_overlay_passes_a_real_api_servers_dry_run(tmp_path: Any) -> None:
    """The overlay applied to a real kube-apiserver (server-side dry run) with the CRDs it
    uses installed: every object is admitted by the API server's own validation."""
    with real_apiserver(tmp_path / "kube") as kubeconfig:
        for file in SCHEMAS.values():
            kubectl(kubeconfig, "apply", "--server-side", "-f", str(CRDS / file))
        kubectl(
            kubeconfig,
            "apply",
            "-f",
            str(CRDS.parents[1] / "deploy/base/crd-tenantreservations.yaml"),
        )
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd", "--all")
        kubectl(kubeconfig, "create", "namespace", NAMESPACE)
        out = kubectl(kubeconfig, "apply", "--dry-run=server", "-k", str(CRDS.parents[1] / OVERLAY))
        for created in (
            "prometheusrule.monitoring.coreos.com/reservation-webhook created",
            "servicemonitor.monitoring.coreos.com/reservation-webhook created",
            "vmservicescrape.operator.victoriametrics.com/reservation-webhook created",
            "configmap/reservation-webhook-dashboard created",
            "service/reservation-webhook-metrics created",
        ):
            assert created in out, out
