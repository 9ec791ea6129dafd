"""What an admitted application's pods request at the pod level, kind by kind."""

from __future__ import annotations

from decimal import Decimal

from webhook.core.capacity.pod_requests import pod_need

Mi = Decimal(1024**2)
Gi = Decimal(1024**3)


def test_a_1Gi_vm_launcher_requests_its_guest_plus_kubevirts_overhead_and_a_tenth_cpu() -> None:
    # 1Gi guest + 220Mi processes + 8Mi vCPU + 8Mi IO thread + 32Mi video + 2Mi page tables.
    need = pod_need("VMInstance", {"cpu": Decimal(1), "memory": Gi})
    assert need.requests == {"requests.cpu": Decimal("0.1"), "requests.memory": Gi + 270 * Mi}
    assert need.pods == 1
    assert need.source == "kubevirt-model"


def test_a_vm_with_a_gpu_pays_the_vfio_overhead_and_requests_the_device() -> None:
    gpu = "nvidia.com/GA102GL_A10"
    need = pod_need("VMInstance", {"cpu": Decimal(4), "memory": 8 * Gi, gpu: Decimal(1)})
    # 8Gi guest: 16Mi page tables + 220Mi + 4 x 8Mi + 8Mi + 32Mi + 1Gi VFIO.
    assert need.requests["requests.memory"] == 8 * Gi + (16 + 220 + 32 + 8 + 32 + 1024) * Mi
    assert need.requests[f"requests.{gpu}"] == 1


def test_a_load_balancer_is_an_object_count_not_a_pod_request() -> None:
    need = pod_need(
        "VMInstance", {"cpu": Decimal(1), "memory": Gi, "services.loadbalancers": Decimal(1)}
    )
    assert "requests.services.loadbalancers" not in need.requests


def test_cozy_lib_kinds_request_their_limits_divided_by_the_allocation_ratios() -> None:
    charge = {
        "cpu": Decimal(2),
        "memory": 8 * Gi,
        "ephemeral-storage": 2 * Gi,
        "storage": 10 * Gi,
    }
    need = pod_need("Postgres", charge)
    assert need.requests == {
        "requests.cpu": Decimal("0.2"),  # ratio 10
        "requests.memory": 8 * Gi,  # ratio 1
        "requests.ephemeral-storage": Decimal(53687091),  # 2Gi / 40, truncated like int()
        "requests.storage": 10 * Gi,  # PVCs request their size
    }
    assert need.source == "cozy-lib-ratios"


def test_a_disk_requests_its_storage() -> None:
    assert pod_need("VMDisk", {"storage": 5 * Gi}).requests == {"requests.storage": 5 * Gi}


def test_a_tenant_runs_no_pods_and_kubernetes_workers_are_unknown() -> None:
    assert pod_need("Tenant", {"memory": 16 * Gi}).requests == {}
    assert pod_need("Tenant", {"memory": 16 * Gi}).known
    kubernetes = pod_need("Kubernetes", {"cpu": Decimal(17), "memory": 40 * Gi})
    assert not kubernetes.known
    assert kubernetes.requests == {}
