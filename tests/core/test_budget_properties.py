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

Attacks on the charge annotation are rules too: a forged record (any charge, any MAC) or a
genuine record copied from another object, delivered through the webhook in ``enforce`` or
``off`` mode or stored with no webhook at all (before install, webhook down); and stripping the
annotation. A write in ``off`` mode or without the webhook is not a tenant bypass (nothing
checks it), so the growth check skips that one step; the recount from specs, which ignores
annotations, must still agree with the state after it, and nothing may be admitted into a pool
it left over budget.

Overcommit factors: the platform (an admin in ``userInfo``) sets, steps and removes factors on
Tenants and applications; tenants try to set, change or remove them and plant them with no
webhook in the way. The recount prices every application at ``ceil(declared / factor)`` with
the factor the platform set (its own, else its nearest tenant's), and the state's factors must
be exactly the platform's: nothing a tenant does changes a factor. A platform factor change may
leave a pool over budget (allowed, reported), so its growth is not the tenant's doing either.

Counts are keys: every stored application charges 1 of its kind's
``count/<plural>.apps.cozystack.io`` (a Tenant in its parent's namespace), budgets may limit
``count/things.apps.cozystack.io`` and ``count/tenants.apps.cozystack.io``, and a sub-tenant is
created and removed as the sequence goes: the recount counts every stored object, and no pool
holds more applications or sub-tenants than its count budget allows.

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

from tests.builders import ADMIN, platform, review
from webhook.admission import apply_admitted
from webhook.core.applications import CHARGE_ANNOTATION, application_from_object
from webhook.core.decisions import Decision, Policy, decide, mutate
from webhook.core.overcommit import OVERCOMMIT_ANNOTATION, apply_factors, parse_factors
from webhook.core.reviews import parse_review
from webhook.core.state import ReservationState
from webhook.core.tenants import (
    TENANT_KIND,
    ancestors,
    owned_namespace,
    parent_namespace,
    parse_budget,
)

# tenant-root holds tenant a; a holds b and d; b holds c. Applications may live in any of them.
# Tenant e (in tenant-a-d) comes and goes.
TENANTS = {"a": "tenant-root", "b": "tenant-a", "c": "tenant-a-b", "d": "tenant-a"}
SUB_TENANT = ("e", "tenant-a-d")
NAMESPACES = ["tenant-root", "tenant-a", "tenant-a-b", "tenant-a-b-c", "tenant-a-d", "tenant-a-d-e"]
NAMES = ["x", "y", "z"]
THINGS = "count/things.apps.cozystack.io"
SUBTENANTS = "count/tenants.apps.cozystack.io"
KEYS = ("cpu", "memory", THINGS, SUBTENANTS)

# Few, colliding sizes: budgets are filled, lowered and refilled within a few steps.
cpu = st.sampled_from(["0", "1", "2", "4"])
memory = st.sampled_from(["0", "1Gi", "2Gi", "4Gi", "8Gi"])
sizes = st.fixed_dictionaries({"cpu": cpu, "memory": memory})
OFF = Policy(mode="off")
FACTORS = st.sampled_from(
    [None, "memory=1.1", "memory=1.2", "memory=1.3", "cpu=1.1,memory=1.1", "cpu=1.1", "memory=0.5"]
)
# What a tenant can write in the charge annotation without the key: any charge, any MAC.
forgeries = st.builds(
    lambda size, mac: json.dumps(
        {"charge": size, "digest": "sha256:0", "values": "sha256:0", "mac": mac}
    ),
    sizes,
    st.sampled_from(["", "hmac-sha256:00", "x"]),
)
counts = st.sampled_from(["0", "1", "2", "3"])
budgets = st.fixed_dictionaries(
    {}, optional={"cpu": cpu, "memory": memory, THINGS: counts, SUBTENANTS: counts}
)

Key = tuple[str, str, str]  # kind, namespace, name


class TenantMoves(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ReservationState(platform())
        self.policy = Policy()
        self.stored: dict[Key, dict[str, Any]] = {}  # what the API server holds, by key
        self.factors: dict[Key, dict[str, Decimal]] = {}  # the factors the platform set
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
        policy: Policy | None = None,
        who: Mapping[str, Any] | None = None,
    ) -> Decision:
        """CREATE, UPDATE (when stored) or DELETE (``spec is None``), mutated then validated."""
        policy = policy or self.policy
        key = (kind, namespace, name)
        old = self.stored.get(key)
        if spec is None and old is None:
            return Decision(allowed=False, outcome="skipped")
        operation = "DELETE" if spec is None else "UPDATE" if old is not None else "CREATE"
        if old_annotations is None and old is not None:
            old_annotations = old["metadata"].get("annotations")
        kept = (old_annotations or {}).get(OVERCOMMIT_ANNOTATION)
        if annotations is None and kept is not None:
            annotations = {OVERCOMMIT_ANNOTATION: kept}  # a patch keeps the platform's factor
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
            **(who or {}),
        )
        if body["request"]["object"] is not None:
            patched = mutate(parse_review(body), self.state, policy)
            body["request"]["object"] = _patched(body["request"]["object"], patched)
        request = parse_review(body)
        self.before = self.recount()
        decision = decide(request, self.state, policy)
        apply_admitted(self.state, request, decision)
        if decision.allowed and not dry_run:
            if spec is None:
                del self.stored[key]
                self.factors.pop(key, None)
            else:
                self.stored[key] = body["request"]["object"]
                if decision.admitted is None:  # off mode: the state sees it as a watch would
                    self.state.observe(_application(kind, namespace, self.stored[key]))
        return decision

    def vouched(self, key: Key, previous: dict[str, Any] | None) -> None:
        """After a write no webhook checked: the platform's factor for ``key`` survives only
        while the object keeps the values and the record it had (the record vouches for it)."""
        now = self.stored.get(key)
        if now is None or previous is None:
            self.factors.pop(key, None)
            return
        same = now["spec"] == previous["spec"] and _record(now) == _record(previous)
        if not same:
            self.factors.pop(key, None)

    def unchecked(self) -> None:
        """The last write was not checked by anyone: its growth is not the tenant's doing."""
        self.before = self.recount()

    # -- operations --------------------------------------------------------------------------

    @initialize()
    def create_tenants(self) -> None:
        for name, namespace in TENANTS.items():
            # b, c and d count in a's pool: room for one more sub-tenant, and three things.
            quota = {"cpu": "4", "memory": "8Gi", THINGS: "3", SUBTENANTS: "4"}
            spec = {"resourceQuotas": quota} if name == "a" else {}
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

    @rule(
        namespace=st.sampled_from(NAMESPACES),
        name=st.sampled_from(NAMES),
        size=sizes,
        forged=forgeries,
    )
    def forge_through_the_webhook(
        self, namespace: str, name: str, size: dict[str, str], forged: str
    ) -> None:
        self.write("Thing", namespace, name, size, annotations={CHARGE_ANNOTATION: forged})

    @rule(
        namespace=st.sampled_from(NAMESPACES),
        name=st.sampled_from(NAMES),
        size=sizes,
        forged=forgeries,
        off=st.booleans(),
    )
    def plant_in_off_mode_or_without_the_webhook(
        self, namespace: str, name: str, size: dict[str, str], forged: str, off: bool
    ) -> None:
        annotations = {CHARGE_ANNOTATION: forged}
        if off:
            previous = self.stored.get(("Thing", namespace, name))
            self.write("Thing", namespace, name, size, annotations=annotations, policy=OFF)
            self.vouched(("Thing", namespace, name), previous)
        else:
            self.store_unchecked("Thing", namespace, name, size, annotations)
        self.unchecked()

    @rule(
        source=st.sampled_from(NAMES),
        destination=st.sampled_from(NAMES),
        namespace=st.sampled_from(NAMESPACES),
        size=sizes,
        through_webhook=st.booleans(),
    )
    def copy_another_objects_annotation(
        self,
        source: str,
        destination: str,
        namespace: str,
        size: dict[str, str],
        through_webhook: bool,
    ) -> None:
        stored = self.stored.get(("Thing", namespace, source))
        copied = (stored or {}).get("metadata", {}).get("annotations") or {}
        if CHARGE_ANNOTATION not in copied:
            return
        annotations = {CHARGE_ANNOTATION: copied[CHARGE_ANNOTATION]}
        if through_webhook:
            self.write("Thing", namespace, destination, size, annotations=annotations)
        else:
            self.store_unchecked("Thing", namespace, destination, size, annotations)
            self.unchecked()

    def factor_targets(self) -> list[Key]:
        return sorted(self.stored)

    @rule(data=st.data(), value=FACTORS)
    def platform_sets_a_factor(self, data: st.DataObject, value: str | None) -> None:
        """An admin sets, steps or removes a factor on a Tenant or an application."""
        if not self.stored:
            return
        key = data.draw(st.sampled_from(self.factor_targets()))
        obj = self.stored[key]
        annotations = {OVERCOMMIT_ANNOTATION: value} if value is not None else {}
        decision = self.write(*key, obj["spec"], annotations=annotations, who=ADMIN)
        if decision.allowed:
            if value is None:
                self.factors.pop(key, None)
            else:
                self.factors[key] = parse_factors(value)
            self.unchecked()  # lowering a factor may overcommit: allowed for the platform

    @rule(data=st.data(), value=FACTORS)
    def tenant_tries_a_factor(self, data: st.DataObject, value: str | None) -> None:
        """A tenant sets, changes or removes a factor: always refused, nothing changes."""
        if not self.stored:
            return
        key = data.draw(st.sampled_from(self.factor_targets()))
        obj = self.stored[key]
        now = (obj["metadata"].get("annotations") or {}).get(OVERCOMMIT_ANNOTATION)
        if value == now:
            return
        annotations = {OVERCOMMIT_ANNOTATION: value} if value is not None else {}
        decision = self.write(*key, obj["spec"], annotations=annotations)
        assert not decision.allowed
        assert decision.reason == "overcommit-forbidden"

    @rule(
        namespace=st.sampled_from(NAMESPACES),
        name=st.sampled_from(NAMES),
        size=sizes,
        value=FACTORS,
    )
    def plant_a_factor_without_the_webhook(
        self, namespace: str, name: str, size: dict[str, str], value: str | None
    ) -> None:
        annotations = {OVERCOMMIT_ANNOTATION: value} if value is not None else {}
        self.store_unchecked("Thing", namespace, name, size, annotations)
        self.unchecked()

    @rule(namespace=st.sampled_from(NAMESPACES), name=st.sampled_from(NAMES))
    def strip_the_annotation(self, namespace: str, name: str) -> None:
        stored = self.stored.get(("Thing", namespace, name))
        if stored is not None:
            self.write("Thing", namespace, name, stored["spec"], annotations={})

    def store_unchecked(
        self, kind: str, namespace: str, name: str, spec: Any, annotations: Mapping[str, str]
    ) -> None:
        """Stored with no webhook in the way (before install, or while it is down)."""
        obj = {
            "apiVersion": "apps.cozystack.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations)},
            "spec": spec,
        }
        previous = self.stored.get((kind, namespace, name))
        self.stored[(kind, namespace, name)] = obj
        self.vouched((kind, namespace, name), previous)
        self.state.observe(_application(kind, namespace, obj))

    @rule(budget=st.none() | budgets, dry_run=st.booleans())
    def create_or_remove_a_sub_tenant(self, budget: dict[str, str] | None, dry_run: bool) -> None:
        """Tenant e comes (with or without a budget of its own) and goes; its applications stay
        stored, as objects the API server still holds, and keep counting where they are."""
        name, namespace = SUB_TENANT
        if budget is None:
            self.write(TENANT_KIND, namespace, name, None, dry_run=dry_run)
        elif (TENANT_KIND, namespace, name) not in self.stored:
            spec = {"resourceQuotas": budget} if budget else {}
            self.write(TENANT_KIND, namespace, name, spec, dry_run=dry_run)

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
            declared = platform().charge(kind, obj["spec"], namespace=namespace).resources
            charge = apply_factors(declared, self.effective((kind, namespace, name)))
            for key, value in charge.items():
                own[namespace][key] = own[namespace].get(key, Decimal(0)) + value
        for kind, namespace, _ in self.stored:  # existence: 1 per object of its kind's count
            key = {TENANT_KIND: SUBTENANTS, "Thing": THINGS}[kind]
            own[namespace][key] = own[namespace].get(key, Decimal(0)) + 1
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

    def effective(self, key: Key) -> dict[str, Decimal]:
        """The factor the platform set for an application: its own, else its nearest tenant's."""
        if key in self.factors:
            return self.factors[key]
        owners = {
            owned_namespace(ns, name): factors
            for (kind, ns, name), factors in self.factors.items()
            if kind == TENANT_KIND
        }
        for namespace in ancestors(key[1]):
            if namespace in owners:
                return owners[namespace]
        return {}

    @invariant()
    def nothing_a_tenant_does_changes_a_factor(self) -> None:
        for namespace in NAMESPACES:
            believed, _ = self.state.factors_for(namespace, None)
            assert believed == self.effective(("", namespace, "")), namespace
        for (kind, namespace, name), record in self.state.records():
            if kind != TENANT_KIND:
                assert (record.factors or {}) == {
                    k: v for k, v in self.effective((kind, namespace, name)).items() if v != 1
                }, (kind, namespace, name)

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


def _record(obj: dict[str, Any]) -> Any:
    return (obj["metadata"].get("annotations") or {}).get(CHARGE_ANNOTATION)


def _application(kind: str, namespace: str, obj: dict[str, Any]) -> Any:
    return application_from_object(
        {**obj, "kind": kind, "metadata": {**obj["metadata"], "namespace": namespace}}
    )


def _patched(obj: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """``obj`` with the mutating side's JSONPatch applied (it adds or removes annotations)."""
    response = decision.response()
    if "patch" not in response:
        return obj
    result: dict[str, Any] = json.loads(json.dumps(obj))
    for operation in json.loads(base64.b64decode(response["patch"])):
        assert operation["op"] in ("add", "remove")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        target = result
        for part in parts[:-1]:
            target = target[part]
        if operation["op"] == "remove":
            del target[parts[-1]]
        else:
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
