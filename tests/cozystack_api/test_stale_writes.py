"""cozystack-api's lost update, behind the real server: a stale label patch writes a shrunk VM back.

cozystack-api's Update reads the HelmRelease, applies the change and writes it back with no
resourceVersion precondition, so an admitted update that read an older version may be stored
after a newer one. The attack, as a tenant's ServiceAccount: a 4Gi pool filled by VM ``x``
(``u1.medium``); at once a shrink of ``x`` to ``u1.micro`` and a few ``kubectl label`` patches
of ``x``; 30-90 ms later three creates of 1Gi VMs. If the webhook freed the shrink's 3Gi while
a label patch that read ``u1.medium`` could still be stored, one or two 1Gi VMs fit into that
room and the label patch then writes ``u1.medium`` back: 5Gi or 6Gi stored on the 4Gi budget.
The race hits within a few trials, so each trial has a pool of its own and the trials are bounded
in number and time; on the rule before (a label patch skipped unheld, a shrink freeing room
once observed) it failed with ``5Gi stored on a 4Gi budget: ['small1=u1.micro',
'x=u1.medium']``. Two replicas behind a round-robin proxy, on the shipped RBAC.
"""

from __future__ import annotations

import base64
import json
import random
import ssl
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.builders import free_port
from tests.cozystack_api.conftest import CozystackAPI, vm
from tests.cozystack_api.test_e2e import user

pytestmark = pytest.mark.cozystack_api

TRIALS = 16  # on the rule before it hit at the 6th of 8 trials, or not in 8
LABELS = 6  # label patches racing each shrink: each one the webhooks serve widens the race
TRIAL_SECONDS = 60.0  # a trial's requests are all answered well within this
GI_OF = {"u1.micro": 1, "u1.medium": 4}  # guest memory of the instance types used, in GiB
BUDGET_GI = 4


def _tenant(trial: int) -> str:
    return f"stale{trial}"


@pytest.fixture(scope="module")
def env(cozystack_api: CozystackAPI) -> CozystackAPI:
    for trial in range(TRIALS):  # made before the replicas start: their first watches lag
        cozystack_api.tenant(_tenant(trial), {"memory": f"{BUDGET_GI}Gi"})
    cozystack_api.start_replicas(2)
    for trial in range(TRIALS):
        cozystack_api.wait_pool(f"tenant-{_tenant(trial)}", 120)
    cozystack_api.point_webhooks(cozystack_api.entry_port)
    return cozystack_api


def _stored_gi(env: CozystackAPI, namespace: str) -> tuple[int, list[str]]:
    """The memory the stored VMs of ``namespace`` declare, and what they are."""
    items = env.get("vminstances", "-n", namespace)["items"]
    kinds = [f"{i['metadata']['name']}={i['spec'].get('instanceType')}" for i in items]
    return sum(GI_OF.get(i["spec"].get("instanceType"), 99) for i in items), kinds


def _trial(env: CozystackAPI, trial: int, rng: random.Random) -> tuple[int, list[str]]:
    namespace = f"tenant-{_tenant(trial)}"
    tenant = user(env, namespace)

    def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return env.kubectl(*args, stdin=stdin, kubeconfig=tenant, check=False, timeout=30)

    made = kubectl("create", "-f", "-", stdin=yaml.safe_dump(vm("x", namespace, "u1.medium")))
    assert made.returncode == 0, made.stderr  # 4Gi: the pool is full
    env.wait_pool(namespace, reserved={"memory": "4Gi"})
    shrink = ("patch", "vminstance", "x", "--type=merge", "-p",
              '{"spec":{"instanceType":"u1.micro"}}')  # fmt: skip
    labels = [("label", "vminstance", "x", f"touch={i}", "--overwrite") for i in range(LABELS)]
    creates = [yaml.safe_dump(vm(f"small{i}", namespace, "u1.micro")) for i in range(3)]
    with ThreadPoolExecutor(1 + LABELS + len(creates)) as pool:
        writes = [pool.submit(kubectl, *args) for args in (shrink, *labels)]
        time.sleep(rng.uniform(0.03, 0.09))
        fills = [pool.submit(kubectl, "create", "-f", "-", stdin=body) for body in creates]
        for future in (*writes, *fills):
            future.result(timeout=TRIAL_SECONDS)  # answered, whatever the answer: some of
            # these writes also meet a conflict inside cozystack-api, after admission
    return _stored_gi(env, namespace)


def test_a_stale_label_patch_cannot_write_a_shrunk_vm_back_over_room_given_away(
    env: CozystackAPI,
) -> None:
    rng = random.Random(31)
    for trial in range(TRIALS):
        stored, what = _trial(env, trial, rng)
        assert stored <= BUDGET_GI, (
            f"trial {trial}: {stored}Gi stored on a {BUDGET_GI}Gi budget: {what}"
        )


class _StallingWebhook:
    """A validating webhook that allows everything, holding a write labelled ``stall`` for
    ``seconds`` first: cozystack-api calls validating webhooks in parallel and writes only once
    all answered, so the reservation webhook decides the write at once and it is stored late,
    as the race above stores one, every time."""

    def __init__(self, env: CozystackAPI, seconds: float) -> None:
        pki = env.dir / "pki"
        self.port = free_port()
        self.seconds = seconds
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length) or b"{}").get("request") or {}
                labels = ((request.get("object") or {}).get("metadata") or {}).get("labels")
                if isinstance(labels, dict) and "stall" in labels:
                    time.sleep(outer.seconds)
                body = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {"uid": request.get("uid", ""), "allowed": True},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")  # no socket outlives its review
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(pki / "webhook.crt"), str(pki / "webhook.key"))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        env.apply(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "stall-labelled-tenants"},
                "webhooks": [
                    {
                        "name": "stall.tests.example.com",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "timeoutSeconds": 15,
                        "failurePolicy": "Fail",
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{self.port}/validate",
                            "caBundle": bundle,
                        },
                        "rules": [
                            {
                                "apiGroups": ["apps.cozystack.io"],
                                "apiVersions": ["*"],
                                "operations": ["UPDATE"],
                                "resources": ["tenants"],
                            }
                        ],
                    }
                ],
            }
        )
        time.sleep(1.0)  # cozystack-api's informer picks it up within a fraction of a second

    def close(self, env: CozystackAPI) -> None:
        env.kubectl("delete", "validatingwebhookconfiguration", "stall-labelled-tenants")
        self.server.shutdown()
        self.server.server_close()


def test_a_stale_label_patch_of_a_sub_tenant_cannot_write_its_old_quota_back_over_room_given_away(
    env: CozystackAPI,
) -> None:
    # A tenant admin's sub-tenant takes the whole 4Gi pool as its quota. A label patch of it
    # (read at 4Gi) is decided at once and stored late; meanwhile the quota is shrunk to 1Gi
    # and three 1Gi VMs are created in the pool. Stored last, the patch writes 4Gi back: were
    # the 3Gi given away, 7Gi would be reserved on the 4Gi budget.
    pool = env.tenant("tstale", {"memory": f"{BUDGET_GI}Gi"})
    env.tenant("bee", {"memory": f"{BUDGET_GI}Gi"}, parent=pool)
    env.wait_pool(pool, 60, reserved={"memory": f"{BUDGET_GI}Gi"})
    tenant = user(env, pool)

    def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return env.kubectl(*args, stdin=stdin, kubeconfig=tenant, check=False, timeout=30)

    stall = _StallingWebhook(env, seconds=8.0)
    try:
        with ThreadPoolExecutor(1) as pool_of_one:
            late = pool_of_one.submit(kubectl, "label", "tenant", "bee", "-n", pool, "stall=1")
            time.sleep(1.0)  # decided by the reservation webhook, held by the stalling one
            shrink = kubectl("patch", "tenant", "bee", "-n", pool, "--type=merge", "-p",
                             '{"spec":{"resourceQuotas":{"memory":"1Gi"}}}')  # fmt: skip
            assert shrink.returncode == 0, shrink.stderr
            time.sleep(1.5)  # every replica's watch has delivered the shrink
            for i in range(3):
                body = yaml.safe_dump(vm(f"small{i}", pool, "u1.micro"))
                kubectl("create", "-f", "-", stdin=body)
            labelled = late.result(timeout=TRIAL_SECONDS)
            assert labelled.returncode == 0, labelled.stderr
    finally:
        stall.close(env)
    quota = env.get("tenants", "-n", pool, "bee")["spec"]["resourceQuotas"]["memory"]
    assert quota == f"{BUDGET_GI}Gi", "the label patch was stored last, with the quota it read"
    vms, what = _stored_gi(env, pool)
    assert BUDGET_GI + vms <= BUDGET_GI, (
        f"{BUDGET_GI}Gi quota + {vms}Gi of VMs stored on a {BUDGET_GI}Gi budget: {what}"
    )
