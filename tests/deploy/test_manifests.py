"""The deployment: what `kubectl kustomize` renders from deploy/, read as specifications.

Both installs are rendered once per module: `deploy/` (self-managed certificates, the default)
and `deploy/overlays/cert-manager`. Without kubectl on PATH every test here is skipped.
"""

from __future__ import annotations

import copy
import functools
import re
import shutil
import socket
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

import cel
import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEFINITIONS = ROOT / "fixtures" / "cozystack" / "applicationdefinitions"
KUBERNETES_VERSION: Final = "1.32"
NAMESPACE: Final = "cozy-reservation"
NAME: Final = "reservation-webhook"
TLS_SECRET: Final = "reservation-webhook-tls"
RECORD_SECRET: Final = "reservation-webhook-records"
CHARGE: Final = "reservation.cozystack.io/charge"
INSTALLS: Final = {"default": "deploy", "cert-manager": "deploy/overlays/cert-manager"}
WEBHOOK_KINDS: Final = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# Kinds of CRDs the installs use but do not define: no Kubernetes schema knows them.
CUSTOM_GROUPS: Final = frozenset({"cert-manager.io"})

Manifest = dict[str, Any]


class Grant(NamedTuple):
    """Where a call is allowed, and on which objects (no names: on any object)."""

    scope: str
    names: frozenset[str] = frozenset()


CLUSTER: Final = "cluster"
READ: Final = ("get", "list", "watch")


def _calls(
    scope: str, group: str, resources: tuple[str, ...], verbs: tuple[str, ...], *names: str
) -> dict[tuple[str, str, str], Grant]:
    return {(group, r, v): Grant(scope, frozenset(names)) for r in resources for v in verbs}


# Every Kubernetes API call the server makes, as (apiGroup, resource, verb) -> where it is
# allowed. The rendered ClusterRole and Role must grant exactly this; the server's own calls are
# to be compared with it once the live cluster state is built.
EXPECTED_API_CALLS: Final[dict[tuple[str, str, str], Grant]] = {
    # The state: kinds and contracts, instance types, every application of every kind.
    **_calls(CLUSTER, "cozystack.io", ("applicationdefinitions",), READ),
    **_calls(
        CLUSTER,
        "instancetype.kubevirt.io",
        ("virtualmachineclusterinstancetypes", "virtualmachineinstancetypes"),
        READ,
    ),
    **_calls(CLUSTER, "apps.cozystack.io", ("*",), READ),
    # Consistent reads of a quiet kind: its HelmReleases at the current revision.
    **_calls(CLUSTER, "helm.toolkit.fluxcd.io", ("helmreleases",), ("list",)),
    # The reservation ledger and its status.
    **_calls(
        CLUSTER,
        "reservation.cozystack.io",
        ("tenantreservations",),
        ("get", "list", "watch", "create", "update"),
    ),
    **_calls(CLUSTER, "reservation.cozystack.io", ("tenantreservations/status",), ("update",)),
    # The pod-level guard: ResourceQuotas and their status, read only.
    **_calls(CLUSTER, "", ("resourcequotas",), ("list", "watch")),
    # Policy reports: listed by name, created, read and replaced by name.
    **_calls(CLUSTER, "openreports.io", ("reports",), ("list", "create")),
    **_calls(CLUSTER, "openreports.io", ("reports",), ("get", "update"), NAME),
    # Self-managed certificates: caBundle of our own two webhook configurations.
    **_calls(
        CLUSTER,
        "admissionregistration.k8s.io",
        ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"),
        ("get", "update", "patch"),
        NAME,
    ),
    # The preset table, in the webhook's namespace.
    **_calls(NAMESPACE, "", ("configmaps",), ("get",), "reservation-resource-presets"),
    **_calls(NAMESPACE, "", ("configmaps",), ("list", "watch")),
    # The Lease electing the certificate manager.
    **_calls(NAMESPACE, "coordination.k8s.io", ("leases",), ("create",)),
    **_calls(NAMESPACE, "coordination.k8s.io", ("leases",), ("get", "update"), NAME),
    # The Secret holding the CA and the serving pair.
    **_calls(NAMESPACE, "", ("secrets",), ("create",)),
    **_calls(NAMESPACE, "", ("secrets",), ("update",), TLS_SECRET),
    # ... and the Secret holding the key that signs charge records, read only.
    **_calls(NAMESPACE, "", ("secrets",), ("get",), TLS_SECRET, RECORD_SECRET),
}


# ---------------------------------------------------------------------------------------------
# Rendering and lookups


def render(path: str) -> list[Manifest]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH: cannot render deploy/ with kustomize")
    result = subprocess.run(
        [kubectl, "kustomize", str(ROOT / path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def installs() -> dict[str, list[Manifest]]:
    return {name: render(path) for name, path in INSTALLS.items()}


@pytest.fixture(scope="module")
def default(installs: dict[str, list[Manifest]]) -> list[Manifest]:
    return installs["default"]


@pytest.fixture(scope="module")
def cert_manager(installs: dict[str, list[Manifest]]) -> list[Manifest]:
    return installs["cert-manager"]


def find(manifests: list[Manifest], kind: str, name: str = NAME) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def container(manifests: list[Manifest]) -> Manifest:
    containers = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["webhook"]
    result: Manifest = containers[0]
    return result


def env(manifests: list[Manifest]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(manifests)["env"]}


def arg(manifests: list[Manifest], flag: str) -> str:
    args: list[str] = container(manifests)["args"]
    assert args.count(flag) == 1, f"{flag} in {args}"
    return args[args.index(flag) + 1]


def volume_mounted_at(manifests: list[Manifest], path: str) -> Manifest:
    pod = find(manifests, "Deployment")["spec"]["template"]["spec"]
    (mount,) = [m for m in container(manifests)["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    result: Manifest = volume
    return result


def webhooks(manifests: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    for kind in WEBHOOK_KINDS:
        configuration = find(manifests, kind)
        assert len(configuration["webhooks"]) == 1, kind
        yield kind, configuration["webhooks"][0]


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector's meaning (matchLabels and the four operators)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def namespace_labels(name: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name}


# ---------------------------------------------------------------------------------------------
# Schemas


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection or name lookup fails the test: validation must run offline."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"network access during validation: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def validate(manifest: Manifest) -> None:
    """Kubernetes' own schema, strict (unknown fields refused), from kubernetes-validate's
    bundled JSON schemas; for a custom kind, the structure every object has."""
    group = manifest["apiVersion"].rpartition("/")[0]
    if group in CUSTOM_GROUPS:
        assert isinstance(manifest.get("kind"), str), manifest
        assert isinstance(manifest.get("metadata", {}).get("name"), str), manifest
        assert isinstance(manifest.get("spec"), dict), manifest
        return
    try:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        raise AssertionError(f"{kind}/{name}: {path}: {error.message}") from None


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("install", list(INSTALLS))
def test_every_object_is_valid_against_the_kubernetes_schemas_offline(
    installs: dict[str, list[Manifest]], install: str
) -> None:
    """Every built-in kind is validated strictly against Kubernetes 1.32's OpenAPI schemas,
    which kubernetes-validate ships inside its wheel (read from disk; the network is cut for
    this test). cert-manager's Issuer and Certificate have no schema there: they get a minimal
    structural check instead (apiVersion, kind, metadata.name, spec)."""
    for manifest in installs[install]:
        validate(manifest)


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param(("spec", "replica"), 2, id="unknown-field"),
        pytest.param(("spec", "replicas"), "two", id="wrong-type"),
        pytest.param(("spec", "selector"), None, id="missing-required-field"),
    ],
)
def test_the_validator_refuses_a_broken_deployment(
    default: list[Manifest], path: tuple[str, str], value: Any
) -> None:
    deployment = copy.deepcopy(find(default, "Deployment"))
    if value is None:
        del deployment[path[0]][path[1]]
    else:
        deployment[path[0]][path[1]] = value
    with pytest.raises(AssertionError, match="Deployment/reservation-webhook"):
        validate(deployment)


def test_a_kind_without_a_schema_fails_unless_it_is_cert_managers() -> None:
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate({**widget, "spec": {}})
    with pytest.raises(AssertionError):
        validate({**widget, "apiVersion": "cert-manager.io/v1", "kind": "Certificate"})


# ---------------------------------------------------------------------------------------------
# Objects, names, labels


def test_the_default_install_holds_exactly_these_objects(default: list[Manifest]) -> None:
    assert sorted((m["kind"], m["metadata"]["name"]) for m in default) == sorted(
        [
            ("Namespace", NAMESPACE),
            ("CustomResourceDefinition", "tenantreservations.reservation.cozystack.io"),
            ("ServiceAccount", NAME),
            ("ClusterRole", NAME),
            ("ClusterRoleBinding", NAME),
            ("Role", NAME),
            ("RoleBinding", NAME),
            ("Service", NAME),
            ("Deployment", NAME),
            ("PodDisruptionBudget", NAME),
            ("NetworkPolicy", NAME),
            ("MutatingWebhookConfiguration", NAME),
            ("ValidatingWebhookConfiguration", NAME),
            ("ValidatingAdmissionPolicy", "reservation-webhook-reports"),
            ("ValidatingAdmissionPolicyBinding", "reservation-webhook-reports"),
        ]
    )


@pytest.mark.parametrize("install", list(INSTALLS))
def test_every_object_is_labelled_and_namespaced_objects_live_in_cozy_reservation(
    installs: dict[str, list[Manifest]], install: str
) -> None:
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    cluster_scoped |= set(WEBHOOK_KINDS)
    for manifest in installs[install]:
        metadata = manifest["metadata"]
        assert metadata["labels"]["app.kubernetes.io/name"] == NAME, metadata["name"]
        assert metadata["labels"]["app.kubernetes.io/part-of"] == "cozystack", metadata["name"]
        if manifest["kind"] not in cluster_scoped:
            assert metadata["namespace"] == NAMESPACE, (manifest["kind"], metadata["name"])


def test_the_image_is_named_once_and_tagged_with_the_project_version(
    default: list[Manifest],
) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert container(default)["image"] == f"ghcr.io/cozystack/reservation-webhook:{version}"
    mentions = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "deploy").rglob("*.yaml")
        if "ghcr.io/" in p.read_text()
    ]
    # The opt-in rebalancer overlay stands alone (it must not re-apply the webhook), so it
    # names the same image; tests/deploy/test_rebalancer.py checks the two agree.
    assert sorted(mentions) == [
        "deploy/base/kustomization.yaml",
        "deploy/overlays/rebalancer/kustomization.yaml",
    ]


# ---------------------------------------------------------------------------------------------
# The ledger's CRD


def test_the_crd_defines_namespaced_tenantreservations_with_a_status_subresource(
    default: list[Manifest],
) -> None:
    crd = find(default, "CustomResourceDefinition", "tenantreservations.reservation.cozystack.io")
    spec = crd["spec"]
    assert spec["group"] == "reservation.cozystack.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "TenantReservation"
    assert spec["names"]["plural"] == "tenantreservations"
    assert spec["names"]["singular"] == "tenantreservation"
    assert spec["names"]["shortNames"] == ["tres"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == [
        ("Budget", ".status.budgetSummary"),
        ("Reserved", ".status.reservedSummary"),
        ("Overcommitted", '.status.conditions[?(@.type=="Overcommitted")].status'),
        ("Age", ".metadata.creationTimestamp"),
    ]


TENANT_RESERVATION: Final[Manifest] = {
    "apiVersion": "reservation.cozystack.io/v1alpha1",
    "kind": "TenantReservation",
    "metadata": {"name": "tenant-acme", "namespace": "tenant-acme"},
    "spec": {"pool": "tenant-acme"},
    "status": {
        "budget": {"cpu": "4", "memory": "16Gi"},
        "reserved": {"cpu": "5", "memory": "8Gi"},
        "budgetSummary": "cpu=4, memory=16Gi",
        "reservedSummary": "cpu=5, memory=8Gi",
        "overcommitted": {"cpu": "1"},
        "committed": {"memory": "19Gi"},
        "discount": {"memory": "3400896722"},
        "pending": [
            {
                "id": "3f2a",
                "application": "VMInstance/tenant-acme/web",
                "charge": {"cpu": "1", "memory": "1Gi"},
                "expected": {"cpu": "1", "memory": "1Gi"},
                "expires": "2030-01-01T00:00:00Z",
                "replica": "reservation-webhook-7d9c-abcde",
                "revision": "41",
            }
        ],
        "released": {"VMInstance": 12, "Postgres": 3},
        "capped": {
            "tenant-acme-big": {
                "digest": "a5502d43b3678b12603ebc05601c856f",
                "declared": {"memory": "1000Ti"},
                "counted": {"memory": "0"},
                "expires": "2030-01-01T00:00:00.000000Z",
            }
        },
        "conditions": [
            {
                "type": "Overcommitted",
                "status": "True",
                "reason": "BudgetExceeded",
                "message": "reserved exceeds the budget by cpu=1",
                "lastTransitionTime": "2030-01-01T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
    },
}


def crd_schema(default: list[Manifest]) -> Manifest:
    crd = find(default, "CustomResourceDefinition", "tenantreservations.reservation.cozystack.io")
    schema: Manifest = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def pruned(schema: Manifest, value: Any, path: str = "") -> list[str]:
    """The fields a structural schema does not declare: the API server drops them silently."""
    if isinstance(value, dict) and schema.get("type") == "object":
        if "additionalProperties" in schema:
            items = schema["additionalProperties"]
            return [p for k, v in value.items() for p in pruned(items, v, f"{path}.{k}")]
        properties = schema.get("properties", {})
        return [
            p
            for k, v in value.items()
            for p in (
                pruned(properties[k], v, f"{path}.{k}") if k in properties else [f"{path}.{k}"]
            )
        ]
    if isinstance(value, list) and schema.get("type") == "array":
        return [p for i, v in enumerate(value) for p in pruned(schema["items"], v, f"{path}[{i}]")]
    return []


def test_a_tenant_reservation_as_the_ledger_writes_it_fits_the_schema_unpruned(
    default: list[Manifest],
) -> None:
    schema = crd_schema(default)
    jsonschema.Draft4Validator(schema).validate(TENANT_RESERVATION)
    # metadata is the API server's own, never pruned against the CRD's schema.
    assert pruned(schema, {**TENANT_RESERVATION, "metadata": {}}) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param(("spec", "pool"), 7, id="pool-not-a-string"),
        pytest.param(("status", "budget"), {"cpu": 4}, id="quantity-not-a-string"),
        pytest.param(("status", "pending"), [{"id": "x"}], id="pending-without-charge"),
        pytest.param(("status", "released"), {"VMInstance": -1}, id="released-negative"),
        pytest.param(("status", "capped"), {"tenant-acme-x": {"counted": {}}}, id="cap-no-digest"),
        pytest.param(
            ("status", "conditions"),
            [{"type": "Overcommitted", "status": "Yes"}],
            id="condition-not-a-metav1-condition",
        ),
    ],
)
def test_the_schema_refuses_malformed_reservations(
    default: list[Manifest], path: tuple[str, str], value: Any
) -> None:
    reservation = copy.deepcopy(TENANT_RESERVATION)
    reservation[path[0]][path[1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(crd_schema(default)).validate(reservation)


# ---------------------------------------------------------------------------------------------
# Webhook configurations


@functools.cache
def application_plurals() -> frozenset[str]:
    plurals: set[str] = set()
    for path in sorted(DEFINITIONS.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "ApplicationDefinition":
                plurals.add(document["spec"]["application"]["plural"])
    return frozenset(plurals)


def test_the_fixtures_hold_every_shipped_kind_and_its_irregular_plurals() -> None:
    plurals = application_plurals()
    assert len(plurals) == 31
    assert {"kuberneteses", "kubernetesnodeses", "postgreses", "natses", "redises"} <= plurals
    assert {"seaweedfses", "externaldns"} <= plurals


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
def test_both_webhooks_match_every_application_plural_and_nothing_else(
    default: list[Manifest], kind: str
) -> None:
    webhook = dict(webhooks(default))[kind]
    (rule,) = webhook["rules"]
    assert rule["apiGroups"] == ["apps.cozystack.io"]
    assert rule["apiVersions"] == ["v1alpha1"]
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert rule["scope"] == "Namespaced"
    assert len(rule["resources"]) == len(set(rule["resources"]))
    assert set(rule["resources"]) == application_plurals()


@pytest.mark.parametrize(
    ("kind", "name", "path"),
    [
        pytest.param(
            "MutatingWebhookConfiguration",
            "charge.reservation.cozystack.io",
            "/mutate",
            id="mutating-records-the-charge",
        ),
        pytest.param(
            "ValidatingWebhookConfiguration",
            "reservation.cozystack.io",
            "/validate",
            id="validating-decides",
        ),
    ],
)
def test_each_webhook_calls_its_endpoint_through_the_service(
    default: list[Manifest], kind: str, name: str, path: str
) -> None:
    webhook = dict(webhooks(default))[kind]
    assert webhook["name"] == name
    service = webhook["clientConfig"]["service"]
    assert (service["name"], service["namespace"], service["path"]) == (NAME, NAMESPACE, path)
    assert service["port"] in [p["port"] for p in find(default, "Service")["spec"]["ports"]]
    assert "url" not in webhook["clientConfig"]
    # Left out so that a later `kubectl apply` never wipes what the server or cainjector wrote.
    assert "caBundle" not in webhook["clientConfig"]


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
def test_both_webhooks_fail_closed_are_dry_run_safe_and_time_out_with_the_server(
    default: list[Manifest], kind: str
) -> None:
    webhook = dict(webhooks(default))[kind]
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "NoneOnDryRun"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["matchPolicy"] == "Equivalent"
    assert webhook["timeoutSeconds"] == int(arg(default, "--timeout-seconds"))
    if kind == "MutatingWebhookConfiguration":
        assert webhook["reinvocationPolicy"] == "IfNeeded"


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
@pytest.mark.parametrize(
    ("namespace", "called"),
    [
        pytest.param(NAMESPACE, False, id="never-its-own-namespace"),
        pytest.param("kube-system", False, id="never-kube-system"),
        pytest.param("tenant-acme", True, id="tenant-namespaces"),
        pytest.param("tenant-root", True, id="the-root-tenant"),
    ],
)
def test_the_namespace_selector_spares_the_webhook_and_kube_system(
    default: list[Manifest], kind: str, namespace: str, called: bool
) -> None:
    webhook = dict(webhooks(default))[kind]
    assert selects(webhook["namespaceSelector"], namespace_labels(namespace)) is called
    assert "objectSelector" not in webhook


def review(
    operation: str,
    spec: Any = ...,
    annotations: Any = ...,
    old_spec: Any = ...,
    old_annotations: Any = ...,
) -> dict[str, Any]:
    """The CEL variables of a request; `...` means the field is absent."""

    def obj(spec: Any, annotations: Any) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": "web", "namespace": "tenant-acme"}
        if annotations is not ...:
            metadata["annotations"] = annotations
        result: dict[str, Any] = {"apiVersion": "apps.cozystack.io/v1alpha1", "kind": "VMInstance"}
        result["metadata"] = metadata
        if spec is not ...:
            result["spec"] = spec
        return result

    return {
        "request": {"operation": operation, "dryRun": False},
        "object": obj(spec, annotations),
        "oldObject": None if operation == "CREATE" else obj(old_spec, old_annotations),
    }


VM: Final = {"instanceType": "u1.micro"}
BIG_VM: Final = {"instanceType": "u1.large"}
CHARGED: Final = {CHARGE: '{"charge":{"cpu":"1"}}', "note": "x"}


@pytest.mark.parametrize(
    ("variables", "mutating", "validating"),
    [
        pytest.param(review("CREATE", VM), True, True, id="every-create"),
        pytest.param(review("CREATE"), True, True, id="a-create-without-spec"),
        pytest.param(review("UPDATE", BIG_VM, ..., VM, ...), True, True, id="a-resize"),
        pytest.param(
            review("UPDATE", VM, ..., VM, ...),
            True,
            True,
            id="a-label-only-update-of-an-undecided-object",
        ),
        pytest.param(
            review("UPDATE", VM, {}, VM, {}), True, True, id="empty-annotations-on-both-sides"
        ),
        pytest.param(
            review("UPDATE", VM, {"note": "y"}, VM, {"note": "x"}),
            True,
            True,
            id="an-unrelated-annotation-of-an-undecided-object-changes",
        ),
        pytest.param(
            review("UPDATE", VM, CHARGED, VM, CHARGED), True, True, id="charge-carried-over"
        ),
        pytest.param(
            review("UPDATE", VM, {**CHARGED, "note": "y"}, VM, CHARGED),
            True,
            True,
            id="another-annotation-changes-on-a-decided-object",
        ),
        pytest.param(review("UPDATE", ..., ..., ..., ...), True, True, id="no-spec-either-side"),
        pytest.param(review("UPDATE", VM, ..., ..., ...), True, True, id="a-spec-appears"),
        pytest.param(review("UPDATE", ..., ..., VM, ...), True, True, id="the-spec-goes"),
        pytest.param(review("UPDATE", {}, ..., ..., ...), True, True, id="empty-is-not-absent"),
        pytest.param(
            review("UPDATE", VM, {CHARGE: "forged"}, VM, CHARGED),
            True,
            True,
            id="the-charge-changes",
        ),
        pytest.param(
            review("UPDATE", VM, {CHARGE: ""}, VM, ...), True, True, id="an-empty-charge-appears"
        ),
        pytest.param(
            review("UPDATE", VM, {"note": "x"}, VM, CHARGED), True, True, id="the-charge-goes"
        ),
    ],
)
def test_every_create_and_update_reaches_both_webhooks_a_label_only_one_too(
    default: list[Manifest], variables: dict[str, Any], mutating: bool, validating: bool
) -> None:
    """Whatever matchConditions ship, evaluated by a CEL implementation (the `cel` package, not
    the API server's cel-go), skip nothing: cozystack-api stores an update without a
    resourceVersion precondition, so a label patch that read an older version writes its spec
    back, and only a write the webhook sees can be held until it is stored."""
    assert called(default, variables) == {
        "MutatingWebhookConfiguration": mutating,
        "ValidatingWebhookConfiguration": validating,
    }


def called(default: list[Manifest], variables: dict[str, Any]) -> dict[str, bool]:
    return {
        kind: all(
            cel.evaluate(c["expression"], variables) for c in webhook.get("matchConditions", [])
        )
        for kind, webhook in webhooks(default)
    }


RESERVATION_ANNOTATIONS: Final = {
    CHARGE: '{"charge":{"memory":"1Gi"},"digest":"sha256:0","mac":"x"}',
    "reservation.cozystack.io/overcommit": "memory=1.1",
    "reservation.cozystack.io/anything-else": "x",
}


@pytest.mark.parametrize("key", sorted(RESERVATION_ANNOTATIONS))
@pytest.mark.parametrize(
    ("new", "old"),
    [
        pytest.param("value", ..., id="set"),
        pytest.param("value", "other", id="change"),
        pytest.param("copied", "copied", id="copy-or-carry"),
        pytest.param(..., "value", id="remove"),
    ],
)
@pytest.mark.parametrize("others", [{}, {"note": "x"}], ids=["alone", "beside-another"])
def test_an_annotation_only_update_touching_a_reservation_annotation_reaches_both_webhooks(
    default: list[Manifest], key: str, new: Any, old: Any, others: dict[str, str]
) -> None:
    """A planted factor or a replayed record in an UPDATE that changes nothing else: today's
    conditions must not let either webhook miss it (an undecided factor becomes real)."""
    value = {"value": RESERVATION_ANNOTATIONS[key], "other": "memory=1.2", "copied": "y"}
    annotations = {**others, **({key: value[new]} if new is not ... else {})}
    old_annotations = {**others, **({key: value[old]} if old is not ... else {})}
    variables = review("UPDATE", VM, annotations, VM, old_annotations)
    assert called(default, variables) == {
        "MutatingWebhookConfiguration": True,
        "ValidatingWebhookConfiguration": True,
    }


# ---------------------------------------------------------------------------------------------
# Deployment, disruption budget, Service, network


def test_the_deployment_keeps_two_replicas_up_through_rollouts(default: list[Manifest]) -> None:
    spec = find(default, "Deployment")["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    pod = spec["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["terminationGracePeriodSeconds"] == 30
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["podAffinityTerm"]["labelSelector"], spec["template"]["metadata"]["labels"])


def test_the_pod_runs_restricted(default: list[Manifest]) -> None:
    pod = find(default, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["runAsGroup"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container(default)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in context
    for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host_namespace), host_namespace
    namespace = find(default, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_server_serves_on_the_container_port_with_the_mounted_certificates(
    default: list[Manifest],
) -> None:
    port, metrics = container(default)["ports"]
    assert (port["name"], port["containerPort"]) == ("https", 8443)
    assert (metrics["name"], metrics["containerPort"]) == ("metrics", 8080)
    assert arg(default, "--listen") == "0.0.0.0:8443"
    assert arg(default, "--metrics-listen") == "0.0.0.0:8080"
    assert "--mode" not in container(default)["args"]  # the mode is an env variable
    variables = {e["name"]: e.get("value") for e in container(default)["env"]}
    assert variables["WEBHOOK_MODE"] == "warn"
    assert "--state" not in container(default)["args"]
    assert container(default)["args"][0] == "serve"
    # Self-managed: a writable directory the server fills from the Secret before it listens.
    certs = volume_mounted_at(default, arg(default, "--cert-dir"))
    assert "emptyDir" in certs
    assert "secret" not in certs
    assert "emptyDir" in volume_mounted_at(default, "/tmp")


@pytest.mark.parametrize(
    ("probe", "path"), [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")]
)
def test_probes_ask_the_health_endpoints_over_https(
    default: list[Manifest], probe: str, path: str
) -> None:
    get = container(default)[probe]["httpGet"]
    assert (get["path"], get["scheme"]) == (path, "HTTPS")
    assert get["port"] in ("https", 8443)


def test_resources_request_cpu_and_memory_and_limit_memory_only(default: list[Manifest]) -> None:
    assert container(default)["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }


def test_the_names_the_server_is_told_are_the_names_rbac_grants(default: list[Manifest]) -> None:
    variables = env(default)
    assert variables["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert variables["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    lease = EXPECTED_API_CALLS["coordination.k8s.io", "leases", "update"]
    secret = EXPECTED_API_CALLS["", "secrets", "update"]
    assert lease.names == {variables["WEBHOOK_LEASE_NAME"]}
    assert secret.names == {variables["WEBHOOK_TLS_SECRET"]}
    assert variables["WEBHOOK_TLS_SECRET"] == TLS_SECRET
    assert variables["WEBHOOK_RECORD_KEY_SECRET"] == RECORD_SECRET
    assert EXPECTED_API_CALLS["", "secrets", "get"].names == {TLS_SECRET, RECORD_SECRET}
    assert "WEBHOOK_CERTS" not in variables


def test_the_disruption_budget_keeps_one_of_the_deployments_pods(default: list[Manifest]) -> None:
    budget = find(default, "PodDisruptionBudget")["spec"]
    deployment = find(default, "Deployment")["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"] == deployment["selector"]
    assert selects(budget["selector"], deployment["template"]["metadata"]["labels"])


def test_the_service_targets_the_container_port(default: list[Manifest]) -> None:
    service = find(default, "Service")["spec"]
    deployment = find(default, "Deployment")["spec"]
    assert selects(
        {"matchLabels": service["selector"]}, deployment["template"]["metadata"]["labels"]
    )
    (port,) = service["ports"]
    container_port = container(default)["ports"][0]
    assert (port["name"], port["port"]) == ("https", 443)
    assert port["targetPort"] in (container_port["containerPort"], container_port["name"])


def test_the_network_policy_lets_only_cozystack_api_into_8443_and_out_the_api_server_and_dns(
    default: list[Manifest],
) -> None:
    policy = find(default, "NetworkPolicy")["spec"]
    labels = find(default, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["podSelector"], labels)
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (rule,) = policy["ingress"]
    assert [(p["protocol"], p["port"]) for p in rule["ports"]] == [("TCP", 8443)]
    # The aggregated API server that serves apps.cozystack.io and calls the webhooks: its pods
    # as Cozystack ships them (cozy-system, app=cozystack-api), and no one else; a rule without
    # `from` would admit any pod of any tenant.
    (source,) = rule["from"]
    assert source == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "cozy-system"}},
        "podSelector": {"matchLabels": {"app": "cozystack-api"}},
    }
    egress = [(p["protocol"], p["port"]) for rule in policy["egress"] for p in rule["ports"]]
    assert sorted(egress) == [("TCP", 53), ("TCP", 443), ("TCP", 6443), ("UDP", 53)]


def test_the_metrics_port_is_closed_until_an_operator_admits_monitoring(
    default: list[Manifest],
) -> None:
    policy = find(default, "NetworkPolicy")["spec"]
    ports = {p["port"] for rule in policy["ingress"] for p in rule["ports"]}
    assert 8080 not in ports
    text = (ROOT / "deploy" / "base" / "networkpolicy.yaml").read_text()
    assert "port: 8080" in text  # the documented rule to add
    assert "ipBlock" in text  # and how to add the control plane


# ---------------------------------------------------------------------------------------------
# RBAC


def granted(manifests: list[Manifest]) -> dict[tuple[str, str, str], Grant]:
    """(apiGroup, resource, verb) -> where and on which names, from the ClusterRole and Role."""
    grants: dict[tuple[str, str, str], Grant] = {}
    for kind, scope in (("ClusterRole", CLUSTER), ("Role", NAMESPACE)):
        for rule in find(manifests, kind)["rules"]:
            assert "nonResourceURLs" not in rule, rule
            names = frozenset(rule.get("resourceNames", ()))
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        key = (group, resource, verb)
                        assert key not in grants, f"{key} granted twice"
                        grants[key] = Grant(scope, names)
    return grants


def test_rbac_grants_exactly_the_api_calls_of_the_server(default: list[Manifest]) -> None:
    assert granted(default) == EXPECTED_API_CALLS


def test_rbac_never_grants_wildcard_verbs_deletes_escalation_or_cluster_secrets(
    default: list[Manifest],
) -> None:
    grants = granted(default)
    verbs = {verb for _, _, verb in grants}
    assert verbs <= {"get", "list", "watch", "create", "update", "patch"}
    # The one wildcard: every application kind, read only.
    assert {key for key in grants if "*" in key} == {("apps.cozystack.io", "*", v) for v in READ}
    assert all(grants[key].scope == NAMESPACE for key in grants if key[1] == "secrets")
    unnamed_writes = {
        (group, resource)
        for (group, resource, verb), grant in grants.items()
        if verb in ("update", "patch") and not grant.names
    }
    assert unnamed_writes == {
        ("reservation.cozystack.io", "tenantreservations"),
        ("reservation.cozystack.io", "tenantreservations/status"),
    }


def test_the_roles_are_bound_to_the_deployments_service_account(default: list[Manifest]) -> None:
    account = find(default, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    find(default, "ServiceAccount", account)
    for binding_kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = find(default, binding_kind)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": NAME,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]


def test_every_rbac_rule_says_what_it_is_for() -> None:
    lines = (ROOT / "deploy" / "base" / "rbac.yaml").read_text().splitlines()
    rules = [i for i, line in enumerate(lines) if re.match(r"\s+- apiGroups:", line)]
    assert len(rules) == 17
    for i in rules:
        assert lines[i - 1].strip().startswith("#"), f"rbac.yaml line {i + 1} has no comment"


# ---------------------------------------------------------------------------------------------
# The cert-manager overlay


def test_cert_manager_injects_the_ca_into_both_webhook_configurations(
    cert_manager: list[Manifest],
) -> None:
    for kind in WEBHOOK_KINDS:
        annotations = find(cert_manager, kind)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{TLS_SECRET}"
    find(cert_manager, "Certificate", TLS_SECRET)


def test_the_certificate_is_the_secret_the_deployment_mounts_and_names_the_service(
    cert_manager: list[Manifest],
) -> None:
    certificate = find(cert_manager, "Certificate", TLS_SECRET)["spec"]
    mounted = volume_mounted_at(cert_manager, arg(cert_manager, "--cert-dir"))["secret"]
    assert certificate["secretName"] == mounted["secretName"] == TLS_SECRET
    assert mounted["optional"] is False
    assert certificate["dnsNames"] == [
        f"{NAME}.{NAMESPACE}.svc",
        f"{NAME}.{NAMESPACE}.svc.cluster.local",
    ]
    assert (certificate["duration"], certificate["renewBefore"]) == ("2160h", "720h")
    assert certificate["privateKey"] == {
        "algorithm": "ECDSA",
        "size": 256,
        "rotationPolicy": "Always",
    }


def test_a_serving_rotation_keeps_the_ca_bundle(cert_manager: list[Manifest]) -> None:
    """The serving certificate is signed by a CA Issuer whose CA keeps its key: caBundle (the
    CA) stays valid across serving rotations, so the API server never distrusts a pod that has
    not yet reloaded the new pair."""
    issuer_ref = find(cert_manager, "Certificate", TLS_SECRET)["spec"]["issuerRef"]
    issuer = find(cert_manager, issuer_ref["kind"], issuer_ref["name"])["spec"]
    ca = next(
        m["spec"]
        for m in cert_manager
        if m["kind"] == "Certificate" and m["spec"]["secretName"] == issuer["ca"]["secretName"]
    )
    assert ca["isCA"] is True
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    root = find(cert_manager, ca["issuerRef"]["kind"], ca["issuerRef"]["name"])["spec"]
    assert root == {"selfSigned": {}}


def test_cert_manager_mode_tells_the_server_not_to_manage_certificates(
    cert_manager: list[Manifest],
) -> None:
    assert env(cert_manager)["WEBHOOK_CERTS"] == "cert-manager"


def test_the_overlay_changes_nothing_else(
    default: list[Manifest], cert_manager: list[Manifest]
) -> None:
    overlay = copy.deepcopy(
        [m for m in cert_manager if m["apiVersion"].rpartition("/")[0] != "cert-manager.io"]
    )
    for manifest in overlay:
        if manifest["kind"] in WEBHOOK_KINDS:
            del manifest["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            if not manifest["metadata"]["annotations"]:
                del manifest["metadata"]["annotations"]
        if manifest["kind"] == "Deployment":
            pod = manifest["spec"]["template"]["spec"]
            (webhook,) = pod["containers"]
            webhook["env"] = [e for e in webhook["env"] if e["name"] != "WEBHOOK_CERTS"]
            for volume in pod["volumes"]:
                if volume["name"] == "certs":
                    del volume["secret"]
                    volume["emptyDir"] = {"medium": "Memory", "sizeLimit": "1Mi"}
            for mount in webhook["volumeMounts"]:
                if mount["name"] == "certs":
                    del mount["readOnly"]

    def key(m: Manifest) -> tuple[str, str]:
        return m["kind"], m["metadata"]["name"]

    assert sorted(overlay, key=key) == sorted(default, key=key)
