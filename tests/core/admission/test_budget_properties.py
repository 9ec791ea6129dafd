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

The API server is modelled as it calls the webhooks: each webhook is offered a write only when
the shipped ``matchConditions`` of ``deploy/base/webhooks.yaml`` say so (evaluated with a CEL
library), so a write they skip is stored undecided. Two replicas decide: the mutating side on
one, the validating side on the other, each with the record keys it last read; a key rotation
publishes a new key to the Secret and only the mutating replica re-reads at once (the other
re-reads when it meets a record signed with a key it does not know, through the same
:class:`webhook.admission.admit.Admission` the server runs). More attacks: annotation-only updates
that set, change or remove a factor or a record; the replay of any record the webhook ever
minted (earlier versions, dry runs, deleted objects of the same name) onto any object; a factor
planted with no webhook in the way and later sent back unchanged by an admin's resize; volume
shrinks and scale-downs of ``Disk`` applications (``replicas`` x ``size``, persistent volumes a
StatefulSet keeps). The recount charges each ``Disk`` what the cluster holds: every claim any
replica ever had, at the largest size it had. And an ordinary write (no annotation touched) is
never refused as a forged record.

Counts are keys: every stored application charges 1 of its kind's
``count/<plural>.apps.cozystack.io`` (a Tenant in its parent's namespace), budgets may limit
``count/things.apps.cozystack.io`` and ``count/tenants.apps.cozystack.io``, and a sub-tenant is
created and removed as the sequence goes: the recount counts every stored object, and no pool
holds more applications or sub-tenants than its count budget allows.

Extending it: an operation is a ``@rule`` that builds a request with :meth:`TenantMoves.write`
(which takes ``annotations`` for the new object; the stored one's are the old object's), so an
attack on the charge annotation (forge, copy, strip) is a rule that passes different
annotations; the invariants run after every rule unchanged. Seeds are derandomized, so a CI
failure reproduces locally; hypothesis prints the failing sequence of operations.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from collections.abc import Mapping
from decimal import Decimal
from functools import cache
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.attacks import offered
from tests.builders import ADMIN, FIXTURES, THING_DEFINITION, review
from webhook.admission.admit import Admission
from webhook.core.admission.decisions import Decision, Policy
from webhook.core.admission.reviews import parse_review
from webhook.core.admission.state import ReservationState
from webhook.core.pricing.platform import Platform, PlatformBuilder
from webhook.core.tenancy.applications import CHARGE_ANNOTATION, application_from_object
from webhook.core.tenancy.overcommit import OVERCOMMIT_ANNOTATION, apply_factors, parse_factors
from webhook.core.tenancy.records import MIN_KEY_BYTES, RecordKeys, parse_recorded_charge
from webhook.core.tenancy.tenants import (
    TENANT_KIND,
    ancestors,
    owned_namespace,
    parent_namespace,
    parse_budget,
)
from webhook.defaults import default_contracts, default_presets
from webhook.state.manifests import read_manifests

# A test kind whose storage is persistent volumes a StatefulSet keeps: replicas x size.
DISK_DEFINITION: dict[str, Any] = {
    "apiVersion": "cozystack.io/v1alpha1",
    "kind": "ApplicationDefinition",
    "metadata": {"name": "disk"},
    "spec": {
        "application": {"kind": "Disk", "plural": "disks", "openAPISchema": "{}"},
        "reservation": {
            "terms": [
                {
                    "name": "claims",
                    "count": {"path": "$.replicas", "default": 1},
                    "storage": {"path": "$.size", "default": 0},
                    "volume": "kept",
                }
            ]
        },
    },
}


@cache
def platform() -> Platform:
    builder = PlatformBuilder(default_contracts(), default_presets())
    for manifest in read_manifests([FIXTURES / "cozystack"]):
        builder.add(manifest.body, source=manifest.source)
    builder.add(THING_DEFINITION, source="tests/builders.py")
    builder.add(DISK_DEFINITION, source=__file__)
    return builder.build()


# tenant-root holds tenant a; a holds b and d; b holds c. Applications may live in any of them.
# Tenant e (in tenant-a-d) comes and goes.
TENANTS = {"a": "tenant-root", "b": "tenant-a", "c": "tenant-a-b", "d": "tenant-a"}
SUB_TENANT = ("e", "tenant-a-d")
NAMESPACES = ["tenant-root", "tenant-a", "tenant-a-b", "tenant-a-b-c", "tenant-a-d", "tenant-a-d-e"]
NAMES = ["x", "y", "z"]
THINGS = "count/things.apps.cozystack.io"
SUBTENANTS = "count/tenants.apps.cozystack.io"
DISKS = "count/disks.apps.cozystack.io"
KEYS = ("cpu", "memory", "storage", THINGS, SUBTENANTS, DISKS)

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
storage = st.sampled_from(["0", "1Gi", "4Gi", "8Gi"])
disks = st.fixed_dictionaries(
    {"replicas": st.sampled_from([0, 1, 2, 3]), "size": st.sampled_from(["0", "1Gi", "2Gi", "4Gi"])}
)
counts = st.sampled_from(["0", "1", "2", "3"])
budgets = st.fixed_dictionaries(
    {},
    optional={"cpu": cpu, "memory": memory, "storage": storage, THINGS: counts, SUBTENANTS: counts},
)
MUTATING, VALIDATING = "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"

Key = tuple[str, str, str]  # kind, namespace, name


class TenantMoves(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.secret = RecordKeys(b"k" * MIN_KEY_BYTES)  # what the key Secret holds
        self.state = ReservationState(platform(), keys=self.secret)
        # Two replicas on one state: /mutate on the first, /validate on the second, each with
        # the keys it last read (the second re-reads on meeting an unknown key id).
        self.replica_keys = [self.secret, self.secret]
        self.policy = Policy()
        self.stored: dict[Key, dict[str, Any]] = {}  # what the API server holds, by key
        self.factors: dict[Key, dict[str, Decimal]] = {}  # the factors the platform set
        self.claims: dict[Key, dict[int, Decimal]] = {}  # a Disk's claims: unit -> largest size
        # Every record the webhook ever wrote, dry runs included, with the object and the
        # values it was for.
        self.minted: list[tuple[Key, Any, str]] = []
        self.rotations = 0
        self.uids = 0
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
        policy: Policy | None = None,
        who: Mapping[str, Any] | None = None,
    ) -> Decision:
        """CREATE, UPDATE (when stored) or DELETE (``spec is None``) as the API server sends
        it: offered to each webhook as the shipped matchConditions say, mutated, validated,
        stored. ``annotations`` replaces the stored object's (default: they are carried)."""
        policy = policy or self.policy
        key = (kind, namespace, name)
        old = self.stored.get(key)
        if spec is None and old is None:
            return Decision(allowed=False, outcome="skipped")
        operation = "DELETE" if spec is None else "UPDATE" if old is not None else "CREATE"
        old_annotations = old["metadata"].get("annotations") if old is not None else None
        if annotations is None:
            annotations = old_annotations  # an edit of the stored object carries them
        body = review(
            kind,
            namespace,
            name,
            spec,
            operation=operation,
            old_spec=old["spec"] if old is not None else None,
            dry_run=dry_run,
            annotations=annotations,
            **(who or {}),
        )
        request_body = body["request"]
        if old is not None:  # the stored object, as the API server read it
            request_body["oldObject"] = copy.deepcopy(old)
            if request_body["object"] is not None:
                request_body["object"]["metadata"]["uid"] = old["metadata"]["uid"]
        if spec is None:
            decision = self.validate(parse_review(body), policy)
            self.before = self.recount()
            if decision.allowed:
                self.forget(key)
            return decision
        calls = offered(request_body)
        if calls[MUTATING]:
            patched = self.admit(0, parse_review(body), policy, mutating=True)
            request_body["object"] = _patched(request_body["object"], patched)
            text = _record(request_body["object"])
            if text is not None and all(text != t for _, _, t in self.minted):
                self.minted.append((key, copy.deepcopy(spec), text))
        request = parse_review(body)
        self.before = self.recount()
        if calls[VALIDATING]:
            decision = self.admit(1, request, policy, mutating=False)
        else:  # skipped by the matchConditions: stored undecided
            decision = Decision(allowed=True, outcome="skipped")
        if decision.allowed and not dry_run:
            obj = request_body["object"]
            if old is None:
                self.uids += 1
                obj["metadata"]["uid"] = f"uid-{self.uids}"
            self.stored[key] = obj
            self.state.observe(_application(kind, namespace, obj))  # as the watch shows it
            if kind == "Disk":
                count, size = _disk(spec)
                claims = self.claims.setdefault(key, {})
                for unit in range(count):
                    claims[unit] = max(claims.get(unit, Decimal(0)), size)
        return decision

    def admit(self, replica: int, request: Any, policy: Policy, *, mutating: bool) -> Decision:
        """One replica decides through the server's own Admission (its key re-read included)."""
        self.state.keys = self.replica_keys[replica]

        async def reread(kid: str) -> None:
            self.replica_keys[replica] = self.secret
            self.state.keys = self.secret

        admission = Admission(self.state, policy, refresh_keys=reread)
        try:
            if mutating:
                return asyncio.run(admission.mutate(request))
            return asyncio.run(admission.validate(request))
        finally:
            self.state.keys = self.replica_keys[0]

    def validate(self, request: Any, policy: Policy) -> Decision:
        return self.admit(1, request, policy, mutating=False)

    def forget(self, key: Key) -> None:
        del self.stored[key]
        self.factors.pop(key, None)
        self.claims.pop(key, None)
        self.state.forget(key)

    def vouched(self, key: Key, previous: dict[str, Any] | None) -> None:
        """After a write no webhook checked: the platform's factor for ``key`` survives only
        while the object keeps the values and the record it had (the record vouches for it)."""
        now = self.stored.get(key)
        if now is None or previous is None:
            self.factors.pop(key, None)
            return
        same = now["spec"] == previous["spec"] and _record(now) == _record(previous)
        record = parse_recorded_charge(_record(now))
        if not same or record is None or not _accepted(self.secret, record.kid):
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
        decision = self.write("Thing", namespace, name, size, dry_run=dry_run)
        assert decision.reason != "forged-charge", decision.message  # an ordinary write

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
        notes = self.notes(("Thing", namespace, name), {CHARGE_ANNOTATION: forged})
        self.write("Thing", namespace, name, size, annotations=notes)

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
        annotations = self.notes(
            ("Thing", namespace, destination), {CHARGE_ANNOTATION: copied[CHARGE_ANNOTATION]}
        )
        if through_webhook:
            self.write("Thing", namespace, destination, size, annotations=annotations)
        else:
            self.store_unchecked("Thing", namespace, destination, size, annotations)
            self.unchecked()

    def factor_targets(self) -> list[Key]:
        return sorted(self.stored)

    @rule(data=st.data(), value=FACTORS, resize=st.booleans())
    def platform_sets_a_factor(self, data: st.DataObject, value: str | None, resize: bool) -> None:
        """An admin sets, steps or removes a factor on a Tenant or an application, by itself
        (``kubectl annotate``) or together with a resize."""
        if not self.stored:
            return
        key = data.draw(st.sampled_from(self.factor_targets()))
        obj = self.stored[key]
        annotations = {OVERCOMMIT_ANNOTATION: value} if value is not None else {}
        stored_text = (obj["metadata"].get("annotations") or {}).get(OVERCOMMIT_ANNOTATION)
        spec = obj["spec"]
        if resize and key[0] != TENANT_KIND:
            spec = data.draw(disks if key[0] == "Disk" else sizes)
        decision = self.write(*key, spec, annotations=annotations, who=ADMIN)
        if decision.allowed and stored_text != value:  # sending it back unchanged sets nothing
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
        notes = self.notes(key, {OVERCOMMIT_ANNOTATION: value})
        decision = self.write(*key, obj["spec"], annotations=notes)
        vouched = self.factors.get(key)
        if self.tenant_gone(key[1]):
            assert decision.reason == "tenant-not-synced"  # no Tenant owns its namespace now
            return
        if (parse_factors(value) if value is not None else None) == vouched:
            assert decision.allowed  # it states the factor the record vouches for: no change
            return
        assert not decision.allowed, "an annotation-only factor change went undecided"
        assert decision.reason in ("overcommit-forbidden", "invalid")

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
            notes = self.notes(("Thing", namespace, name), {CHARGE_ANNOTATION: None})
            decision = self.write("Thing", namespace, name, stored["spec"], annotations=notes)
            assert decision.allowed or self.tenant_gone(namespace)

    def tenant_gone(self, namespace: str) -> bool:
        """Whether ``namespace`` is Tenant e's while e is not stored: no write there is decided."""
        name, parent = SUB_TENANT
        return namespace == f"{parent}-{name}" and (TENANT_KIND, parent, name) not in self.stored

    def notes(self, key: Key, changes: Mapping[str, str | None]) -> dict[str, str]:
        """The stored object's annotations with ``changes`` (``None`` removes one)."""
        stored = self.stored.get(key)
        notes = dict((stored or {}).get("metadata", {}).get("annotations") or {})
        for name, value in changes.items():
            if value is None:
                notes.pop(name, None)
            else:
                notes[name] = value
        return notes

    @rule(
        namespace=st.sampled_from(NAMESPACES),
        name=st.sampled_from(NAMES),
        disk=disks,
        dry_run=st.booleans(),
    )
    def resize_or_scale_a_disk(
        self, namespace: str, name: str, disk: dict[str, Any], dry_run: bool
    ) -> None:
        """Create, grow, shrink or scale down a Disk: its claims stay, at their largest."""
        decision = self.write("Disk", namespace, name, disk, dry_run=dry_run)
        assert decision.reason != "forged-charge", decision.message

    @rule(namespace=st.sampled_from(NAMESPACES), name=st.sampled_from(NAMES))
    def delete_a_disk(self, namespace: str, name: str) -> None:
        self.write("Disk", namespace, name, None)

    @rule(data=st.data(), values_first=st.booleans())
    def replay_a_record_the_webhook_once_wrote(
        self, data: st.DataObject, values_first: bool
    ) -> None:
        """Any record ever minted (an earlier version's, a dry run's, a deleted object's of the
        same name, another object's) put back by an annotation-only update; first, if asked,
        an ordinary write brings the values back to the ones the record was minted for."""
        if not self.stored or not self.minted:
            return
        key = data.draw(st.sampled_from(self.factor_targets()))
        same = [m for m in self.minted if m[0] == key]  # this name's, deleted ones' too
        _, spec, text = data.draw(st.sampled_from(same or self.minted))
        going_back = values_first and same and self.stored[key]["spec"] != spec
        if going_back and not self.write(*key, spec).allowed:
            return
        obj = self.stored[key]
        self.write(*key, obj["spec"], annotations=self.notes(key, {CHARGE_ANNOTATION: text}))

    @rule(data=st.data(), value=FACTORS)
    def plant_a_factor_then_an_admin_resizes_carrying_it(
        self, data: st.DataObject, value: str | None
    ) -> None:
        """A factor stored with no webhook in the way, then an admin's resize that sends the
        stored annotations back unchanged: it is not the admin setting a factor."""
        things = [k for k in self.factor_targets() if k[0] in ("Thing", "Disk")]
        if not things or value is None:
            return
        key = data.draw(st.sampled_from(things))
        obj = copy.deepcopy(self.stored[key])
        obj["metadata"]["annotations"] = self.notes(key, {OVERCOMMIT_ANNOTATION: value})
        self.stored[key] = obj  # planted (off mode, webhook down): the record is unchanged
        self.state.observe(_application(key[0], key[1], obj))
        spec = data.draw(disks if key[0] == "Disk" else sizes)
        self.write(*key, spec, who=ADMIN)  # checked like any resize: it sets no factor

    @rule(publish_first=st.booleans())
    def rotate_the_record_key(self, publish_first: bool) -> None:
        """A new key: published first (every replica reads it) or not; then it signs, and only
        the mutating replica has re-read: the validating one meets the new key id first."""
        old = self.secret
        self.rotations += 1
        new = b"rotated-key-%04d-" % self.rotations + b"x" * MIN_KEY_BYTES
        if publish_first:
            self.secret = RecordKeys(old.current, old.previous, (new,), old.retired)
            self.replica_keys = [self.secret, self.secret]
        self.secret = RecordKeys(new, (old.current,), (), (*old.previous, *old.retired))
        self.replica_keys[0] = self.secret

    @rule()
    def the_rotation_window_ends(self) -> None:
        """Previous keys are retired: what they signed keeps only its volume marks."""
        old = self.secret
        self.secret = RecordKeys(old.current, (), old.published, (*old.previous, *old.retired))
        self.replica_keys = [self.secret, self.secret]

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
        if previous is not None:
            obj["metadata"]["uid"] = previous["metadata"]["uid"]
        else:
            self.uids += 1
            obj["metadata"]["uid"] = f"uid-{self.uids}"
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
            declared = dict(platform().charge(kind, obj["spec"], namespace=namespace).resources)
            if kind == "Disk":  # what the cluster holds: every claim, at its largest size
                held = sum(self.claims.get((kind, namespace, name), {}).values(), Decimal(0))
                declared = {"storage": held} if held else {}
            charge = apply_factors(declared, self.effective((kind, namespace, name)))
            for key, value in charge.items():
                own[namespace][key] = own[namespace].get(key, Decimal(0)) + value
        for kind, namespace, _ in self.stored:  # existence: 1 per object of its kind's count
            key = {TENANT_KIND: SUBTENANTS, "Thing": THINGS, "Disk": DISKS}[kind]
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


def _accepted(keys: RecordKeys, kid: str) -> bool:
    """Whether a record signed with key ``kid`` still counts (not only for its marks)."""
    return keys.key_for(kid) is not None or not kid


def _disk(spec: Any) -> tuple[int, Decimal]:
    replicas = spec.get("replicas", 1) if isinstance(spec, Mapping) else 1
    size = platform().charge("Disk", {"replicas": 1, "size": spec.get("size", "0")}).resources
    return int(replicas), size.get("storage", Decimal(0))


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
