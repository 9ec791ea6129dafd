"""The shipped contracts, pinned: one per kind, and what each charges.

Expected charges are worked out by hand from the cozy-lib preset table
(webhook/defaults/resource-presets.yaml) and the KubeVirt instance types
(fixtures/cozystack/instancetypes), never by running the code. A preset unit is
cpu / memory / ephemeral-storage, e.g. t1.micro = 500m / 256Mi / 2Gi; an instance type unit is
guest cpu / memory only, e.g. u1.medium = 1 / 4Gi.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.base.errors import EvaluationError
from webhook.core.pricing.platform import Platform
from webhook.defaults import default_contracts
from webhook.state.manifests import load_platform

ROOT = Path(__file__).resolve().parents[2]
COZYSTACK = ROOT / "fixtures" / "cozystack"
CHART_VALUES = ROOT / "fixtures" / "values"


@pytest.fixture(scope="module")
def platform() -> Platform:
    return load_platform([COZYSTACK])


def charge(platform: Platform, kind: str, spec: Any) -> dict[str, str]:
    return platform.charge(kind, spec).as_strings()


def chart_values(chart: str) -> Any:
    return yaml.safe_load((CHART_VALUES / chart / "values.yaml").read_text(encoding="utf-8"))


# -- completeness ------------------------------------------------------------------------------


def test_every_definition_has_a_shipped_contract_and_every_contract_a_definition(
    platform: Platform,
) -> None:
    shipped = default_contracts()
    assert len(platform.kinds) == 31
    assert set(shipped) == set(platform.kinds)


def test_every_kind_loads_its_contract_from_the_file_named_after_its_definition(
    platform: Platform,
) -> None:
    for kind in platform.kinds.values():
        assert kind.problem == "", kind.kind
        assert kind.contract is not None, kind.kind
        assert kind.contract.source == f"contracts/{kind.definition}.yaml"
        assert kind.contract.description, kind.kind
        assert "\n" not in kind.contract.description, kind.kind


def test_only_the_kinds_that_size_nothing_are_exempt_and_each_says_why() -> None:
    exempt = {kind for kind, contract in default_contracts().items() if contract.exempt}
    assert exempt == {"Tenant", "Bucket", "VirtualPrivateCloud", "Info", "BootBox"}
    for kind in exempt:
        assert len(default_contracts()[kind].exempt_reason) > 20, kind


# -- golden: the empty spec gets the schema defaults -------------------------------------------

GOLDEN_DEFAULTS = [
    pytest.param(
        "VMInstance",
        # instance type u1.medium = 1 vCPU / 4Gi guest; no preset, so no ephemeral-storage
        {"cpu": "1", "memory": "4Gi"},
        id="vm-instance-defaults-one-u1-medium-instance-type",
    ),
    pytest.param(
        "VMDisk",
        {"storage": "5Gi"},  # storage 5Gi
        id="vm-disk-defaults-five-gi",
    ),
    pytest.param(
        "Kubernetes",
        {
            # control plane 2 x (c1.medium 2 + 3 x t1.micro 500m) = 2 x 3500m = 7;
            # md0 10 x u1.medium 1 = 10; 7 + 10 = 17
            "cpu": "17",
            # 2 x 4 presets x 2Gi
            "ephemeral-storage": "16Gi",
            # control plane 2 x (2Gi + 3 x 256Mi) = 2 x 2816Mi = 5632Mi;
            # md0 10 x 4Gi = 40960Mi; 5632Mi + 40960Mi = 46592Mi
            "memory": "46592Mi",
            "storage": "200Gi",  # md0 10 x 20Gi disk
        },
        id="kubernetes-defaults-two-control-planes-and-implicit-md0-at-ten",
    ),
    pytest.param(
        "KubernetesNodes",
        # 10 x u1.medium (1, 4Gi) = 10 cpu, 40Gi; storage 10 x 20Gi
        {"cpu": "10", "memory": "40Gi", "storage": "200Gi"},
        id="kubernetes-nodes-defaults-ten-u1-medium-workers",
    ),
    pytest.param(
        "ComputePlane",
        # implicit md0: 10 x u1.medium (1, 4Gi) = 10 cpu, 40Gi; storage 10 x 20Gi
        {"cpu": "10", "memory": "40Gi", "storage": "200Gi"},
        id="computeplane-defaults-implicit-md0-at-ten",
    ),
    pytest.param(
        "Postgres",
        # 2 x t1.micro (500m, 256Mi, 2Gi eph) = 1 cpu, 512Mi, 4Gi; storage 2 x 10Gi
        {"cpu": "1", "ephemeral-storage": "4Gi", "memory": "512Mi", "storage": "20Gi"},
        id="postgres-defaults-two-t1-micro-replicas",
    ),
    pytest.param(
        "MariaDB",
        # 2 x t1.nano (250m, 128Mi, 2Gi eph) = 500m, 256Mi, 4Gi; storage 2 x 10Gi
        {"cpu": "500m", "ephemeral-storage": "4Gi", "memory": "256Mi", "storage": "20Gi"},
        id="mariadb-defaults-two-t1-nano-replicas",
    ),
    pytest.param(
        "MongoDB",
        # not sharded: 3 x t1.small (1, 512Mi, 2Gi eph) = 3 cpu, 1536Mi, 6Gi; storage 3 x 10Gi
        {"cpu": "3", "ephemeral-storage": "6Gi", "memory": "1536Mi", "storage": "30Gi"},
        id="mongodb-defaults-three-t1-small-replicas-not-sharded",
    ),
    pytest.param(
        "Redis",
        # (2 redis + 3 sentinels) x t1.nano (250m, 128Mi, 2Gi eph) = 1250m, 640Mi, 10Gi;
        # storage 2 x 1Gi (redis only)
        {"cpu": "1250m", "ephemeral-storage": "10Gi", "memory": "640Mi", "storage": "2Gi"},
        id="redis-defaults-two-replicas-and-three-sentinels-of-t1-nano",
    ),
    pytest.param(
        "Kafka",
        # (3 brokers + 3 zookeepers) x c1.small (1, 1Gi, 2Gi eph) = 6 cpu, 6Gi, 12Gi;
        # storage 3 x 10Gi + 3 x 5Gi = 45Gi
        {"cpu": "6", "ephemeral-storage": "12Gi", "memory": "6Gi", "storage": "45Gi"},
        id="kafka-defaults-three-brokers-and-three-zookeepers-of-c1-small",
    ),
    pytest.param(
        "ClickHouse",
        {
            # 1 shard x 2 replicas x t1.small 1 + 3 keepers x t1.micro 500m = 2 + 1500m
            "cpu": "3500m",
            "ephemeral-storage": "10Gi",  # 5 pods x 2Gi
            "memory": "1792Mi",  # 2 x 512Mi + 3 x 256Mi = 1024Mi + 768Mi
            "storage": "27Gi",  # 2 x (10Gi + 2Gi log) + 3 x 1Gi keeper
        },
        id="clickhouse-defaults-two-t1-small-servers-and-three-t1-micro-keepers",
    ),
    pytest.param(
        "RabbitMQ",
        # 3 x t1.nano (250m, 128Mi, 2Gi eph) = 750m, 384Mi, 6Gi; storage 3 x 10Gi
        {"cpu": "750m", "ephemeral-storage": "6Gi", "memory": "384Mi", "storage": "30Gi"},
        id="rabbitmq-defaults-three-t1-nano-replicas",
    ),
    pytest.param(
        "NATS",
        # 2 x t1.nano (250m, 128Mi, 2Gi eph) = 500m, 256Mi, 4Gi; jetstream on: storage 2 x 10Gi
        {"cpu": "500m", "ephemeral-storage": "4Gi", "memory": "256Mi", "storage": "20Gi"},
        id="nats-defaults-two-t1-nano-replicas-with-jetstream",
    ),
    pytest.param(
        "HTTPCache",
        # (2 haproxy + 2 nginx) x t1.nano (250m, 128Mi, 2Gi eph) = 1 cpu, 512Mi, 8Gi;
        # storage 2 nginx x 10Gi
        {"cpu": "1", "ephemeral-storage": "8Gi", "memory": "512Mi", "storage": "20Gi"},
        id="http-cache-defaults-two-haproxy-and-two-nginx-of-t1-nano",
    ),
    pytest.param(
        "TCPBalancer",
        # 2 x t1.nano (250m, 128Mi, 2Gi eph) = 500m, 256Mi, 4Gi; no PVC
        {"cpu": "500m", "ephemeral-storage": "4Gi", "memory": "256Mi"},
        id="tcp-balancer-defaults-two-t1-nano-replicas",
    ),
    pytest.param(
        "OpenSearch",
        # 3 x c1.medium (2, 2Gi, 2Gi eph) = 6 cpu, 6Gi, 6Gi; dashboards off; storage 3 x 10Gi
        {"cpu": "6", "ephemeral-storage": "6Gi", "memory": "6Gi", "storage": "30Gi"},
        id="opensearch-defaults-three-c1-medium-nodes-without-dashboards",
    ),
    pytest.param(
        "Qdrant",
        # 1 x t1.small (1, 512Mi, 2Gi eph); storage 1 x 10Gi
        {"cpu": "1", "ephemeral-storage": "2Gi", "memory": "512Mi", "storage": "10Gi"},
        id="qdrant-defaults-one-t1-small-replica",
    ),
    pytest.param(
        "OpenBAO",
        # 1 x t1.small (1, 512Mi, 2Gi eph); storage 1 x 10Gi
        {"cpu": "1", "ephemeral-storage": "2Gi", "memory": "512Mi", "storage": "10Gi"},
        id="openbao-defaults-one-t1-small-replica",
    ),
    pytest.param(
        "VPN",
        # 2 x t1.nano (250m, 128Mi, 2Gi eph) = 500m, 256Mi, 4Gi;
        # externalIPs empty: the Service is a LoadBalancer
        {
            "cpu": "500m",
            "ephemeral-storage": "4Gi",
            "memory": "256Mi",
            "services.loadbalancers": "1",
        },
        id="vpn-defaults-two-t1-nano-replicas-and-a-load-balancer",
    ),
    pytest.param(
        "Ingress",
        # 2 x t1.micro (500m, 256Mi, 2Gi eph) = 1 cpu, 512Mi, 4Gi
        {"cpu": "1", "ephemeral-storage": "4Gi", "memory": "512Mi"},
        id="ingress-defaults-two-t1-micro-controllers",
    ),
    pytest.param(
        "ExternalDNS",
        # 1 x t1.nano (250m, 128Mi, 2Gi eph)
        {"cpu": "250m", "ephemeral-storage": "2Gi", "memory": "128Mi"},
        id="external-dns-defaults-one-t1-nano-pod",
    ),
    pytest.param(
        "Etcd",
        # 3 x resources (1000m, 512Mi), no preset so no ephemeral-storage; storage 3 x 4Gi
        {"cpu": "3", "memory": "1536Mi", "storage": "12Gi"},
        id="etcd-defaults-three-members-of-explicit-resources",
    ),
    pytest.param(
        "FoundationDB",
        # (3 storage + 1 cluster controller) x c1.small (1, 1Gi, 2Gi eph) = 4 cpu, 4Gi, 8Gi;
        # stateless -1 is operator-computed, not charged; storage 3 x 16Gi
        {"cpu": "4", "ephemeral-storage": "8Gi", "memory": "4Gi", "storage": "48Gi"},
        id="foundationdb-defaults-three-storage-and-one-controller-of-c1-small",
    ),
    pytest.param(
        "Harbor",
        {
            # core t1.small 1 + registry 2 x t1.small 2
            # + jobservice, portal, trivy 3 x t1.nano 250m = 3 + 750m
            "cpu": "3750m",
            "ephemeral-storage": "12Gi",  # 6 preset units x 2Gi
            "memory": "1920Mi",  # 3 x 512Mi + 3 x 128Mi = 1536Mi + 384Mi
            "storage": "17Gi",  # trivy 5Gi + database 2 x 5Gi + redis 2 x 1Gi
        },
        id="harbor-defaults-components-by-preset-and-their-volumes",
    ),
    pytest.param(
        "Monitoring",
        {
            # 2 metrics storages x (vminsert + vmselect + vmstorage) x maxAllowed 1 = 6;
            # alerta limit 1 + grafana limit 1 = 2; 6 + 2 = 8
            "cpu": "8",
            "memory": "8Gi",  # same count x 1Gi
            # metrics 2 x 10Gi + logs 1 x 10Gi + alerta db 10Gi + grafana db 10Gi
            "storage": "50Gi",
        },
        id="monitoring-defaults-two-metrics-storages-one-logs-storage-alerta-grafana",
    ),
    pytest.param(
        "SeaweedFS",
        {
            # db 2 + master 3 + filer 2 + s3 2 + volume 2 = 11 x t1.small (1, 512Mi, 2Gi eph)
            "cpu": "11",
            "ephemeral-storage": "22Gi",  # 11 x 2Gi
            "memory": "5632Mi",  # 11 x 512Mi
            "storage": "40Gi",  # db 2 x 10Gi + volume 2 x 10Gi
        },
        id="seaweedfs-defaults-eleven-t1-small-servers-and-db-and-volume-disks",
    ),
    pytest.param("Tenant", {}, id="tenant-is-exempt"),
    pytest.param("Bucket", {}, id="bucket-is-exempt"),
    pytest.param("VirtualPrivateCloud", {}, id="virtualprivatecloud-is-exempt"),
    pytest.param("Info", {}, id="info-is-exempt"),
    pytest.param("BootBox", {}, id="bootbox-is-exempt"),
]


def test_the_golden_table_covers_every_kind(platform: Platform) -> None:
    assert {param.values[0] for param in GOLDEN_DEFAULTS} == set(platform.kinds)


@pytest.mark.parametrize(("kind", "expected"), GOLDEN_DEFAULTS)
def test_empty_spec_is_charged_the_schema_defaults(
    platform: Platform, kind: str, expected: dict[str, str]
) -> None:
    assert charge(platform, kind, {}) == expected


# -- chart values.yaml and schema defaults agree -----------------------------------------------
# Every kind's chart default values.yaml is charged exactly like the empty spec (which gets the
# ApplicationDefinition's schema defaults). No kind needed an exception.

CHARTS = [
    pytest.param("BootBox", "bootbox", id="bootbox-chart-defaults-match-schema"),
    pytest.param("Bucket", "bucket", id="bucket-chart-defaults-match-schema"),
    pytest.param("ClickHouse", "clickhouse", id="clickhouse-chart-defaults-match-schema"),
    pytest.param("ComputePlane", "computeplane", id="computeplane-chart-defaults-match-schema"),
    pytest.param("Etcd", "etcd", id="etcd-chart-defaults-match-schema"),
    pytest.param("ExternalDNS", "external-dns", id="external-dns-chart-defaults-match-schema"),
    pytest.param("FoundationDB", "foundationdb", id="foundationdb-chart-defaults-match-schema"),
    pytest.param("Harbor", "harbor", id="harbor-chart-defaults-match-schema"),
    pytest.param("HTTPCache", "http-cache", id="http-cache-chart-defaults-match-schema"),
    pytest.param("Info", "info", id="info-chart-defaults-match-schema"),
    pytest.param("Ingress", "ingress", id="ingress-chart-defaults-match-schema"),
    pytest.param("Kafka", "kafka", id="kafka-chart-defaults-match-schema"),
    pytest.param("Kubernetes", "kubernetes", id="kubernetes-chart-defaults-match-schema"),
    pytest.param(
        "KubernetesNodes",
        "kubernetes-nodes",
        id="kubernetes-nodes-chart-defaults-match-schema",
    ),
    pytest.param("MariaDB", "mariadb", id="mariadb-chart-defaults-match-schema"),
    pytest.param("MongoDB", "mongodb", id="mongodb-chart-defaults-match-schema"),
    pytest.param("Monitoring", "monitoring", id="monitoring-chart-defaults-match-schema"),
    pytest.param("NATS", "nats", id="nats-chart-defaults-match-schema"),
    pytest.param("OpenBAO", "openbao", id="openbao-chart-defaults-match-schema"),
    pytest.param("OpenSearch", "opensearch", id="opensearch-chart-defaults-match-schema"),
    pytest.param("Postgres", "postgres", id="postgres-chart-defaults-match-schema"),
    pytest.param("Qdrant", "qdrant", id="qdrant-chart-defaults-match-schema"),
    pytest.param("RabbitMQ", "rabbitmq", id="rabbitmq-chart-defaults-match-schema"),
    pytest.param("Redis", "redis", id="redis-chart-defaults-match-schema"),
    pytest.param("SeaweedFS", "seaweedfs", id="seaweedfs-chart-defaults-match-schema"),
    pytest.param("TCPBalancer", "tcp-balancer", id="tcp-balancer-chart-defaults-match-schema"),
    pytest.param("Tenant", "tenant", id="tenant-chart-defaults-match-schema"),
    pytest.param("VMDisk", "vm-disk", id="vm-disk-chart-defaults-match-schema"),
    pytest.param("VMInstance", "vm-instance", id="vm-instance-chart-defaults-match-schema"),
    # the chart of VirtualPrivateCloud is packages/apps/vpc
    pytest.param(
        "VirtualPrivateCloud", "vpc", id="virtualprivatecloud-chart-defaults-match-schema"
    ),
    pytest.param("VPN", "vpn", id="vpn-chart-defaults-match-schema"),
]


def test_the_chart_table_covers_every_kind(platform: Platform) -> None:
    assert {param.values[0] for param in CHARTS} == set(platform.kinds)


@pytest.mark.parametrize(("kind", "chart"), CHARTS)
def test_chart_default_values_are_charged_like_the_empty_spec(
    platform: Platform, kind: str, chart: str
) -> None:
    assert charge(platform, kind, chart_values(chart)) == charge(platform, kind, {})


# -- variants: the interesting rules -----------------------------------------------------------

VARIANTS = [
    pytest.param(
        "VMInstance",
        {"instanceType": "", "resources": {"cpu": 2, "sockets": 2, "memory": "8Gi"}},
        {"cpu": "4", "memory": "8Gi"},  # 2 cores x 2 sockets = 4 vCPUs
        id="vm-instance-without-instance-type-charges-cores-times-sockets",
    ),
    pytest.param(
        "VMInstance",
        {
            "gpus": [
                {"name": "nvidia.com/GA102GL_A10"},
                {"name": "nvidia.com/AD102GL_L40S"},
                {"name": "nvidia.com/GA102GL_A10"},
            ]
        },
        {
            "cpu": "1",  # u1.medium
            "memory": "4Gi",
            "nvidia.com/AD102GL_L40S": "1",  # one device per entry, keyed by its name
            "nvidia.com/GA102GL_A10": "2",
        },
        id="vm-instance-gpus-charge-one-device-per-entry-under-its-name",
    ),
    pytest.param(
        "VMInstance",
        {"external": True},
        {"cpu": "1", "memory": "4Gi", "services.loadbalancers": "1"},  # u1.medium + 1 LB
        id="vm-instance-external-adds-one-load-balancer",
    ),
    pytest.param(
        "VMInstance",
        {"instanceType": "u1.small", "resources": {"memory": "8Gi"}},
        # max(u1.small 1 / 2Gi, resources memory 8Gi) key by key = 1 cpu, 8Gi
        {"cpu": "1", "memory": "8Gi"},
        id="vm-instance-instance-type-and-larger-memory-charges-the-maximum",
    ),
    pytest.param(
        "Kubernetes",
        {
            "nodeGroups": {
                "big": {
                    "minReplicas": 0,
                    "maxReplicas": 3,
                    "instanceType": "u1.medium",
                    "diskSize": "50Gi",
                    "resources": {"cpu": 4, "memory": "16Gi"},
                },
                "gpu": {
                    "minReplicas": 0,
                    "maxReplicas": 2,
                    "instanceType": "u1.large",
                    "diskSize": "20Gi",
                    "gpus": [{"name": "nvidia.com/GA102GL_A10"}],
                },
            }
        },
        {
            # control plane 7; big 3 x 4 (resources win over u1.medium) = 12;
            # gpu 2 x u1.large 2 = 4; 7 + 12 + 4 = 23. No md0.
            "cpu": "23",
            "ephemeral-storage": "16Gi",  # control plane 2 x 4 presets x 2Gi
            # control plane 5632Mi + big 3 x 16Gi (49152Mi) + gpu 2 x 8Gi (16384Mi) = 71168Mi
            "memory": "71168Mi",
            "nvidia.com/GA102GL_A10": "2",  # 1 per worker x 2 workers
            "storage": "190Gi",  # 3 x 50Gi + 2 x 20Gi
        },
        id="kubernetes-two-node-groups-replace-md0",
    ),
    pytest.param(
        "KubernetesNodes",
        {"maxReplicas": 4, "resources": {"cpu": 8, "memory": "32Gi"}, "diskSize": "40Gi"},
        # 4 x resources (8, 32Gi) instead of u1.medium; storage 4 x 40Gi
        {"cpu": "32", "memory": "128Gi", "storage": "160Gi"},
        id="kubernetes-nodes-with-cpu-and-memory-drop-the-instance-type",
    ),
    pytest.param(
        "Postgres",
        {"resourcesPreset": "medium"},
        # legacy medium = 1 cpu / 1Gi (not c1.medium 2 / 2Gi): 2 x (1, 1Gi, 2Gi eph); 2 x 10Gi
        {"cpu": "2", "ephemeral-storage": "4Gi", "memory": "2Gi", "storage": "20Gi"},
        id="postgres-legacy-medium-keeps-its-old-one-cpu-one-gi",
    ),
    pytest.param(
        "Postgres",
        {"resourcesPreset": "medium", "resources": {"cpu": 3}},
        # cpu 3 from resources, memory 1Gi and eph 2Gi from legacy medium: 2 x (3, 1Gi, 2Gi)
        {"cpu": "6", "ephemeral-storage": "4Gi", "memory": "2Gi", "storage": "20Gi"},
        id="postgres-partial-resources-override-the-preset-key-by-key",
    ),
    pytest.param(
        "MongoDB",
        {
            "sharding": True,
            "shardingConfig": {
                "shards": [
                    {"name": "rs0", "replicas": 3, "size": "10Gi"},
                    {"name": "rs1", "replicas": 2, "size": "20Gi"},
                ]
            },
        },
        {
            # 3 config servers + 2 mongos + 3 + 2 shard members = 10 x t1.small 1; replicas unused
            "cpu": "10",
            "ephemeral-storage": "20Gi",  # 10 x 2Gi
            "memory": "5Gi",  # 10 x 512Mi
            "storage": "79Gi",  # config 3 x 3Gi + rs0 3 x 10Gi + rs1 2 x 20Gi
        },
        id="mongodb-sharded-with-two-shards",
    ),
    pytest.param(
        "MongoDB",
        {"external": True},
        {
            "cpu": "3",
            "ephemeral-storage": "6Gi",
            "memory": "1536Mi",
            # one per replica-set member (3); the mongos one only when sharded
            "services.loadbalancers": "3",
            "storage": "30Gi",
        },
        id="mongodb-external-replica-set-charges-a-load-balancer-per-member",
    ),
    pytest.param(
        "OpenSearch",
        {"external": True},
        {
            "cpu": "6",  # 3 x c1.medium (2 / 2Gi / 2Gi ephemeral); dashboards off
            "ephemeral-storage": "6Gi",
            "memory": "6Gi",
            "services.loadbalancers": "1",  # the nodes' Service; no dashboards, no second one
            "storage": "30Gi",
        },
        id="opensearch-external-without-dashboards-charges-one-load-balancer",
    ),
    pytest.param(
        "OpenSearch",
        {"external": True, "dashboards": {"enabled": True}},
        {
            "cpu": "7",  # + 1 x c1.small dashboards pod (1 / 1Gi / 2Gi ephemeral)
            "ephemeral-storage": "8Gi",
            "memory": "7Gi",
            "services.loadbalancers": "2",  # nodes and dashboards
            "storage": "30Gi",
        },
        id="opensearch-external-with-dashboards-charges-two-load-balancers",
    ),
    pytest.param(
        "ClickHouse",
        {"resources": {"memory": "2Gi"}},
        {
            "cpu": "3500m",  # 2 x t1.small 1 + 3 x t1.micro 500m, cpu untouched
            "ephemeral-storage": "10Gi",
            "memory": "10Gi",  # servers 2 x 2Gi + keepers 3 x 2Gi: keepers take top-level memory
            "storage": "27Gi",
        },
        id="clickhouse-keeper-uses-the-top-level-resources",
    ),
    pytest.param(
        "Redis",
        {"replicas": 1, "resourcesPreset": "t1.small"},
        # (1 redis + 3 sentinels) x t1.small (1, 512Mi, 2Gi eph); storage 1 x 1Gi
        {"cpu": "4", "ephemeral-storage": "8Gi", "memory": "2Gi", "storage": "1Gi"},
        id="redis-three-sentinels-share-the-redis-sizing",
    ),
    pytest.param(
        "NATS",
        {"jetstream": {"enabled": False}},
        # 2 x t1.nano; no JetStream, no PVC
        {"cpu": "500m", "ephemeral-storage": "4Gi", "memory": "256Mi"},
        id="nats-without-jetstream-has-no-storage",
    ),
    pytest.param(
        "VMDisk",
        {"storage": "20Gi"},
        {"storage": "20Gi"},
        id="vm-disk-of-twenty-gi",
    ),
    pytest.param(
        "Kafka",
        {"external": True},
        {
            "cpu": "6",
            "ephemeral-storage": "12Gi",
            "memory": "6Gi",
            "services.loadbalancers": "4",  # Strimzi: 1 bootstrap + 3 brokers
            "storage": "45Gi",
        },
        id="kafka-external-charges-a-bootstrap-and-a-per-broker-load-balancer",
    ),
    pytest.param(
        "VPN",
        {"externalIPs": ["192.0.2.10"]},
        # 2 x t1.nano; with externalIPs the Service is not a LoadBalancer
        {"cpu": "500m", "ephemeral-storage": "4Gi", "memory": "256Mi"},
        id="vpn-with-external-ips-charges-no-load-balancer",
    ),
    pytest.param(
        "Harbor",
        {"trivy": {"enabled": False}},
        {
            "cpu": "3500m",  # 3750m - trivy 250m
            "ephemeral-storage": "10Gi",  # 12Gi - 2Gi
            "memory": "1792Mi",  # 1920Mi - 128Mi
            "storage": "12Gi",  # 17Gi - trivy 5Gi
        },
        id="harbor-without-trivy",
    ),
    pytest.param(
        "Monitoring",
        {
            "metricsStorages": [
                {
                    "name": "shortterm",
                    "retentionPeriod": "3d",
                    "deduplicationInterval": "15s",
                    "storage": "20Gi",
                    "vmstorage": {"maxAllowed": {"cpu": 4, "memory": "8Gi"}},
                }
            ],
        },
        {
            # vminsert 1 + vmselect 1 (schema default) + vmstorage 4 + alerta 1 + grafana 1 = 8
            "cpu": "8",
            "memory": "12Gi",  # 1Gi + 1Gi + 8Gi + 1Gi + 1Gi
            "storage": "50Gi",  # metrics 20Gi + logs 10Gi + alerta 10Gi + grafana 10Gi
        },
        id="monitoring-charges-the-declared-max-allowed",
    ),
    pytest.param(
        "SeaweedFS",
        {"volume": {"pools": {"fast": {"diskType": "ssd", "size": "50Gi"}}}},
        {
            # 11 default servers + pool 2 (volume.replicas) x t1.small (volume preset) = 13
            "cpu": "13",
            "ephemeral-storage": "26Gi",  # 13 x 2Gi
            "memory": "6656Mi",  # 13 x 512Mi
            "storage": "140Gi",  # 40Gi + pool 2 x 50Gi
        },
        id="seaweedfs-pool-falls-back-to-volume-replicas-and-preset",
    ),
]


@pytest.mark.parametrize(("kind", "spec", "expected"), VARIANTS)
def test_variant_charge(
    platform: Platform, kind: str, spec: dict[str, Any], expected: dict[str, str]
) -> None:
    assert charge(platform, kind, spec) == expected


# -- variants that fail closed -----------------------------------------------------------------


def test_vm_instance_without_instance_type_needs_cpu_sockets_and_memory(
    platform: Platform,
) -> None:
    spec = {"instanceType": "", "resources": {"cpu": 2, "memory": "8Gi"}}
    with pytest.raises(EvaluationError) as raised:
        platform.charge("VMInstance", spec)
    message = str(raised.value)
    assert "instanceType" in message
    assert "resources.cpu and resources.sockets and resources.memory" in message


def test_kubernetes_node_group_with_an_unknown_instance_type_is_refused(
    platform: Platform,
) -> None:
    spec = {
        "nodeGroups": {
            "gpu": {
                "minReplicas": 0,
                "maxReplicas": 1,
                "instanceType": "u9.huge",
                "diskSize": "20Gi",
            }
        }
    }
    with pytest.raises(EvaluationError) as raised:
        platform.charge("Kubernetes", spec)
    assert raised.value.path == "nodeGroups.gpu.instanceType"
    assert raised.value.reason == 'unknown instance type "u9.huge"'


def test_a_bad_quantity_is_refused_naming_its_path(platform: Platform) -> None:
    with pytest.raises(EvaluationError) as raised:
        platform.charge("Postgres", {"resources": {"memory": "12Gx"}})
    assert 'resources.memory: "12Gx" is not a quantity' in str(raised.value)


def test_seaweedfs_zone_pool_must_set_its_replicas(platform: Platform) -> None:
    # a zone pool cannot reach its zone's replicas, so the contract requires its own
    spec = {
        "topology": "MultiZone",
        "volume": {"zones": {"a": {"pools": {"fast": {"diskType": "ssd"}}}}},
    }
    with pytest.raises(EvaluationError) as raised:
        platform.charge("SeaweedFS", spec)
    assert raised.value.path == "volume.zones.a.pools.fast.replicas"


# -- a count or size a tenant can make read lower than what runs -------------------------------


def test_a_node_group_with_min_replicas_above_max_is_charged_at_min_replicas(
    platform: Platform,
) -> None:
    group = {"minReplicas": 10, "maxReplicas": 0, "instanceType": "u1.medium", "diskSize": "20Gi"}
    # control plane 7 / 5632Mi / 16Gi ephemeral; Cluster API starts 10 x u1.medium (1 / 4Gi)
    assert charge(platform, "Kubernetes", {"nodeGroups": {"md0": group}}) == {
        "cpu": "17",
        "ephemeral-storage": "16Gi",
        "memory": "46592Mi",  # 5632Mi + 10 x 4Gi
        "storage": "200Gi",
    }


def test_kubernetes_nodes_with_min_replicas_above_max_is_charged_at_min_replicas(
    platform: Platform,
) -> None:
    spec = {"minReplicas": 10, "maxReplicas": 0}
    assert charge(platform, "KubernetesNodes", spec) == {
        "cpu": "10",
        "memory": "40Gi",
        "storage": "200Gi",
    }


def test_a_compute_plane_node_group_with_min_replicas_above_max_is_charged_at_min_replicas(
    platform: Platform,
) -> None:
    group = {"minReplicas": 10, "maxReplicas": 0, "instanceType": "u1.medium", "diskSize": "20Gi"}
    assert charge(platform, "ComputePlane", {"nodeGroups": {"md0": group}}) == {
        "cpu": "10",
        "memory": "40Gi",
        "storage": "200Gi",
    }


def test_a_node_group_with_zero_cpu_resources_is_charged_its_instance_type(
    platform: Platform,
) -> None:
    # the chart tests `if cpu and memory`: a 0 cpu keeps the instance type, 1 vCPU per worker
    group = {
        "minReplicas": 0,
        "maxReplicas": 2,
        "instanceType": "u1.medium",
        "diskSize": "20Gi",
        "resources": {"cpu": 0, "memory": "16Gi"},
    }
    assert charge(platform, "Kubernetes", {"nodeGroups": {"md0": group}}) == {
        "cpu": "9",  # 7 + 2 x 1
        "ephemeral-storage": "16Gi",
        "memory": "13824Mi",  # 5632Mi + 2 x 4Gi
        "storage": "40Gi",
    }


def test_a_vm_with_zero_sockets_and_no_instance_type_is_refused_not_charged_zero_cpu(
    platform: Platform,
) -> None:
    # KubeVirt runs a 0-socket domain as one socket; the chart sets no topology without both
    spec = {"instanceType": "", "resources": {"cpu": 4, "sockets": 0, "memory": "4Gi"}}
    with pytest.raises(EvaluationError, match="no size"):
        platform.charge("VMInstance", spec)


def test_a_vm_with_zero_sockets_beside_an_instance_type_is_charged_the_instance_type(
    platform: Platform,
) -> None:
    spec = {"instanceType": "u1.medium", "resources": {"cpu": 4, "sockets": 0}}
    assert charge(platform, "VMInstance", spec) == {"cpu": "1", "memory": "4Gi"}


def test_foundationdb_zero_storage_processes_are_charged_the_most_the_operator_infers(
    platform: Platform,
) -> None:
    spec = {"cluster": {"processCounts": {"storage": 0, "cluster_controller": 0, "stateless": -1}}}
    # 5 storage + 1 cluster controller, each c1.small (1 / 1Gi / 2Gi); 5 x 16Gi PVCs
    assert charge(platform, "FoundationDB", spec) == {
        "cpu": "6",
        "ephemeral-storage": "12Gi",
        "memory": "6Gi",
        "storage": "80Gi",
    }


def test_foundationdb_explicit_stateless_processes_are_charged(platform: Platform) -> None:
    spec = {"cluster": {"processCounts": {"storage": 3, "cluster_controller": 1, "stateless": 4}}}
    # 3 storage + 1 cluster controller + 4 stateless, each c1.small; 3 x 16Gi PVCs
    assert charge(platform, "FoundationDB", spec) == {
        "cpu": "8",
        "ephemeral-storage": "16Gi",
        "memory": "8Gi",
        "storage": "48Gi",
    }


def test_monitoring_min_allowed_above_max_allowed_is_charged_at_min_allowed(
    platform: Platform,
) -> None:
    def storage(vminsert: dict[str, Any]) -> dict[str, Any]:
        return {"metricsStorages": [{"name": "s", "storage": "10Gi", "vminsert": vminsert}]}

    ceiling = {"maxAllowed": {"cpu": 1, "memory": "1Gi"}}
    floor_above = {**ceiling, "minAllowed": {"cpu": 4, "memory": "8Gi"}}
    low = platform.charge("Monitoring", storage(ceiling)).resources
    high = platform.charge("Monitoring", storage(floor_above)).resources
    assert high["cpu"] - low["cpu"] == 3
    assert high["memory"] - low["memory"] == 7 * 1024**3
