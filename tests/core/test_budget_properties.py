"""No sequence of tenant operations takes a pool past its budget.

A hypothesis state machine plays a hostile tenant against the real decision and the real state:
it creates, grows, shrinks and deletes applications, adds, raises, lowers and removes budgets,
and sends any of those as dry runs. Each write goes the way the API server sends it: the
mutating side first (its patch applied), then the validating side; what is allowed and not a dry
run is stored, and the state applies it as the server-side ``review`` command does.

After every step the pools are recounted from scratch from the stored specs alone (annotations
ignored), with the carve-out rule ``max(budget, usage)``, and checked:

- the incremental state agrees with the recount;
- no pool's usage exceeds its budget unless it did not grow in that step: a pool may be over
  its budget only because a budget was lowered (or set) below usage, and then nothing new is
  admitted into it until usage drops.

Extending it: an operation is a ``@rule`` that builds a request with :meth:`TenantMoves.write`
(which takes ``annotations`` for the new object and ``old_annotations`` for the stored one),
so an attack on the charge annotation (forge, copy, strip) is a rule that passes different
annotations; the invariants run after every rule unchanged. Seeds are derandomized, so a CI
failure reproduces locally; hypothesis prints the failing sequence of operations.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.builders import platform, review
from webhook.admission import apply_admitted
from webhook.core.decisions import Decision, Policy, decide, mutate
from webhook.core.reviews import parse_review
from webhook.core.state import ReservationState
from webhook.core.tenants import TENANT_KIND, owned_namespace, parent_namespace, parse_budget

# tenant-root holds tenant a; a holds b and d; b holds c. Applications may live in any of them.
TENANTS = {"a": "tenant-root", "b": "tenant-a", "c": "tenant-a-b", "d": "tenant-a"}
NAMESPACES = ["tenant-root", "tenant-a", "tenant-a-b", "tenant-a-b-c", "tenant-a-d"]
NAMES = ["x", "y", "z"]
KEYS = ("cpu", "memory")

# Few, colliding sizes: budgets are filled, lowered and refilled within a few steps.
cpu = st.sampled_from(["0", "1", "2", "4"])
memory = st.sampled_from(["0", "1Gi", "2Gi", "4Gi", "8Gi"])
sizes = st.fixed_dictionaries({"cpu": cpu, "memory": memory})
budgets = st.fixed_dictionaries({}, optional={"cpu": cpu, "memory": memory})

Key = tuple[str, str, str]  # kind, namespace, name


class TenantMoves(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ReservationState(platform())
        self.policy = Policy()
        self.stored: dict[Key, dict[str, Any]] = {}  # what the API server holds, by key
        self.before = self.recount()

    # -- the API server ----------------------------------------------------------------------

    def write(
        self,
        kind: str,
        namespace: str,
        name: str,
        spec: Any,
        *,
        dry_run: bool = False,
        annotations: Mapping[str, str] | None = None,
        old_annotations: Mapping[str, str] | None = None,
    ) -> Decision:
        """CREATE, UPDATE (when stored) or DELETE (``spec is None``), mutated then validated."""
        key = (kind, namespace, name)
        old = self.stored.get(key)
        if spec is None and old is None:
            return Decision(allowed=False, outcome="skipped")
        operation = "DELETE" if spec is None else "UPDATE" if old is not None else "CREATE"
        if old_annotations is None and old is not None:
            old_annotations = old["metadata"].get("annotations")
        body = review(
            kind,
            namespace,
            name,
            spec,
            operation=operation,
            old_spec=old["spec"] if old is not None else None,
            dry_run=dry_run,
            annotations=annotations,
            old_annotations=old_annotations,
        )
        if body["request"]["object"] is not None:
            patched = mutate(parse_review(body), self.state, self.policy)
            body["request"]["object"] = _patched(body["request"]["object"], patched)
        request = parse_review(body)
        self.before = self.recount()
        decision = decide(request, self.state, self.policy)
        apply_admitted(self.state, request, decision)
        if decision.allowed and not dry_run:
            if spec is None:
                del self.stored[key]
            else:
                self.stored[key] = body["request"]["object"]
        return decision

    # -- operations --------------------------------------------------------------------------

    @initialize()
    def create_tenants(self) -> None:
        for name, namespace in TENANTS.items():
            spec = {"resourceQuotas": {"cpu": "4", "memory": "8Gi"}} if name == "a" else {}
            assert self.write(TENANT_KIND, namespace, name, spec).allowed

    @rule(
        namespace=st.sampled_from(NAMESPACES),
        name=st.sampled_from(NAMES),
        size=sizes,
        dry_run=st.booleans(),
    )
    def create_grow_or_shrink(
        self, namespace: str, name: str, size: dict[str, str], dry_run: bool
    ) -> None:
        self.write("Thing", namespace, name, size, dry_run=dry_run)

    @rule(namespace=st.sampled_from(NAMESPACES), name=st.sampled_from(NAMES))
    def delete(self, namespace: str, name: str) -> None:
        self.write("Thing", namespace, name, None)

    @rule(tenant=st.sampled_from(sorted(TENANTS)), budget=budgets, dry_run=st.booleans())
    def set_budget(self, tenant: str, budget: dict[str, str], dry_run: bool) -> None:
        """Add, raise, lower or remove (an empty budget) a tenant's quota, key by key."""
        spec = {"resourceQuotas": budget} if budget else {}
        self.write(TENANT_KIND, TENANTS[tenant], tenant, spec, dry_run=dry_run)

    # -- invariants --------------------------------------------------------------------------

    def recount(self) -> dict[str, tuple[dict[str, Decimal], dict[str, Decimal]]]:
        """Per namespace: (budget, usage of its subtree), from the stored specs alone."""
        own: dict[str, dict[str, Decimal]] = {ns: {} for ns in NAMESPACES}
        budget: dict[str, dict[str, Decimal]] = {ns: {} for ns in NAMESPACES}
        for (kind, namespace, name), obj in self.stored.items():
            if kind == TENANT_KIND:
                values = platform().kinds[TENANT_KIND].defaulted(obj["spec"])
                budget[owned_namespace(namespace, name)] = parse_budget(values)
                continue
            charge = platform().charge(kind, obj["spec"], namespace=namespace).resources
            for key, value in charge.items():
                own[namespace][key] = own[namespace].get(key, Decimal(0)) + value
        usage: dict[str, dict[str, Decimal]] = {}
        for namespace in sorted(NAMESPACES, key=_depth, reverse=True):  # children first
            total = dict(own[namespace])
            for child in NAMESPACES:
                if child != namespace and parent_namespace(child) == namespace:
                    for key in KEYS:
                        used = usage[child].get(key, Decimal(0))
                        share = max(budget[child][key], used) if key in budget[child] else used
                        total[key] = total.get(key, Decimal(0)) + share
            usage[namespace] = total
        return {ns: (budget[ns], usage[ns]) for ns in NAMESPACES}

    @invariant()
    def the_state_agrees_with_a_recount_from_specs(self) -> None:
        for namespace, (_, usage) in self.recount().items():
            node = self.state.tree.get(namespace)
            kept = {k: v for k, v in (node.usage if node is not None else {}).items() if v}
            assert kept == {k: v for k, v in usage.items() if v}, namespace

    @invariant()
    def no_pool_grows_past_its_budget(self) -> None:
        for namespace, (budget, usage) in self.recount().items():
            before = self.before[namespace][1]
            for key, limit in budget.items():
                after = usage.get(key, Decimal(0))
                was = before.get(key, Decimal(0))
                assert after <= max(limit, was), (
                    f"{namespace} {key}: {was} -> {after} with budget {limit}"
                )


def _depth(namespace: str) -> int:
    return 0 if namespace == "tenant-root" else namespace.count("-")


def _patched(obj: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """``obj`` with the mutating side's JSONPatch applied (it only adds annotations)."""
    response = decision.response()
    if "patch" not in response:
        return obj
    result: dict[str, Any] = json.loads(json.dumps(obj))
    for operation in json.loads(base64.b64decode(response["patch"])):
        assert operation["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        target = result
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = operation["value"]
    return result


TenantMoves.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,  # 150 x 40: 6,000 operations per run
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_no_tenant_sequence_takes_a_pool_past_its_budget = TenantMoves.TestCase
