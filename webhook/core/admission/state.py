"""The reservation state: what every application reserves, and the tenant tree it adds up in.

A small, incremental, in-memory model fed by observed applications (from a manifest directory,
a cache of the cluster, or the ``review`` command applying what it admitted). It keeps charges,
not objects: per application its charge, the digest that produced it, and whether the current
contract would price it differently (drift). Observing or forgetting an application costs time
proportional to the tenant depth.

Applications that cannot be evaluated keep their last recorded charge; one with no recorded
charge is *unknown*, and a pool holding an unknown application cannot grant more for the kinds
it could hold. Observing never raises: whatever an object holds (a value no evaluation can read,
a nesting too deep to walk), the object is recorded as unknown with the reason and reported, so
one poisoned object never stops the source that feeds the state. A recorded charge counts only
when it verifies (:mod:`webhook.core.tenancy.records`): signed with one of
:attr:`ReservationState.keys` for exactly this object and its values as they stand; any other
annotation is ignored and the application is evaluated as it stands. Every stored application,
unknown ones included, also counts 1 of its kind's count key
(:meth:`~webhook.core.pricing.platform.Platform.count_of`), from its key alone.

An overcommit factor (:mod:`webhook.core.tenancy.overcommit`) divides what an application reserves.
A factor on a stored object is what its verified record says the platform set through
admission (the annotation alone, written with no webhook in the way, is never believed); a
Tenant's factor applies to its subtree, nearest wins, and changing it re-prices the
applications under it from what they committed. Per namespace the state also keeps the
discount (committed minus reserved).

Over 400 lines, and kept whole: it is one class whose indices (records, unknowns, the tenant
tree, discounts, caps) every observe and forget must change together, so splitting it would
spread one invariant over several files.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal

from webhook.core.admission.carveouts import Cap, budget_digest, effective_budget
from webhook.core.admission.pending import Hold, PendingCharges, expects
from webhook.core.admission.pools import TenantTree
from webhook.core.base import resources as rl
from webhook.core.base.errors import UNEVALUABLE, EvaluationError
from webhook.core.pricing.platform import Platform, Prepared
from webhook.core.pricing.volumes import RELEASED, hold
from webhook.core.tenancy.applications import AppKey, Application, Mislabel
from webhook.core.tenancy.overcommit import apply_factors
from webhook.core.tenancy.records import (
    RecordedCharge,
    RecordKeys,
    believed,
    values_digest,
    verifies,
)
from webhook.core.tenancy.tenants import (
    ROOT_NAMESPACE,
    TENANT_KIND,
    ancestors,
    beneath,
    owned_namespace,
    parse_budget,
)

__all__ = ["AppRecord", "ReservationState", "recount"]


@dataclass(slots=True)
class AppRecord:
    """What one application reserves."""

    namespace: str
    resources: dict[str, Decimal]  # shared between records with the same charge: never mutate
    digest: str
    current_digest: str = ""  # set only when today's evaluation differs from the record
    problem: str = ""  # why today's evaluation failed, if it did
    current: dict[str, Decimal] | None = None  # today's charge, when it differs (drift)
    committed: dict[str, Decimal] | None = None  # declared before a factor, when it differs
    own: dict[str, Decimal] | None = None  # the application's own factor, when believed
    factors: dict[str, Decimal] | None = None  # the factor applied, when there is one
    factor_source: str = ""  # "application", or the namespace of the tenant that set it
    version: int = 0  # the stored object's resourceVersion, when the source has one
    # The version its values were last written at: a write that changes nothing the state
    # reads (a label, a status) moves ``version`` on, never this (see admission.floors).
    written: int = 0
    marks: dict[str, Decimal] | None = None  # its persistent volumes' high marks, when any
    # The request its believed record was minted for (a CREATE's admission call), or "": the
    # one thing a later create of the same name never carries (escrow folds on it).
    request: str = ""

    @property
    def drifted(self) -> bool:
        return bool(self.current_digest)

    @property
    def declared(self) -> dict[str, Decimal]:
        """What the application commits before any factor."""
        return self.committed if self.committed is not None else self.resources

    @property
    def discount(self) -> dict[str, Decimal]:
        return rl.subtract(self.declared, self.resources) if self.committed is not None else {}


class ReservationState:
    """Applications' charges and the tenant tree, for one platform."""

    def __init__(
        self,
        platform: Platform,
        *,
        synced: bool = True,
        readiness: Callable[[], bool] | None = None,
        keys: RecordKeys | None = None,
        unavailable: Callable[[str], str] | None = None,
    ) -> None:
        # Bumped by every change a price reads besides the priced application's own record (a
        # Tenant, the platform, the keys, the caps): a price made at one generation, while that
        # record is the same object, is the price now (``decisions.decide_again``).
        self.generation = 0
        self._platform = platform
        # Records signed with these keys are believed; a state made without keys has a key of
        # its own (records from elsewhere are then evaluated as they stand).
        self._keys = keys if keys is not None else RecordKeys.generate()
        self.tree = TenantTree()
        self.pending = PendingCharges(
            self.tree, shows=self._shows, observed=self._observed, written=self._written
        )
        self._synced = synced
        self._readiness = readiness  # a live source's own check, asked on every read
        self._unavailable = unavailable  # a live source: why one kind cannot be decided now
        self._apps: dict[AppKey, AppRecord] = {}
        self._unknown: dict[AppKey, str] = {}  # key -> why it has no charge
        # What an application with no charge now still counts: the charge it was last priced
        # at in this state. An update stored unpriced (values past their bound, admitted in
        # warn) has not shrunk what its volumes hold, nor anything else: counted at nothing, its
        # room would be admitted again to the pool's other kinds, enforced or not.
        # Its last record is kept whole, marks and all: the next priced update is held at them
        # (the stored object it replaces has no record and does not evaluate, so nothing else
        # says them).
        self._kept: dict[AppKey, AppRecord] = {}
        self._owned: dict[AppKey, str] = {}  # Tenant application -> namespace it owns
        self._tenant_versions: dict[AppKey, int] = {}  # Tenant application -> resourceVersion
        self._tenant_factors: dict[str, dict[str, Decimal]] = {}  # owned namespace -> factor
        self._discount: dict[str, dict[str, Decimal]] = {}  # namespace -> committed - reserved
        self._by_namespace: dict[str, set[AppKey]] = {}  # for the pod-level guard
        # Carve-outs admitted in warn beyond what fitted (:mod:`webhook.core.admission.carveouts`):
        # the caps each pool's ledger lists, and what each Tenant declares.
        self._caps: dict[str, dict[str, Cap]] = {}  # pool -> owned namespace -> cap
        self._declared: dict[str, dict[str, Decimal]] = {}  # owned namespace -> its quota
        # HelmReleases labelled with another application's name, as last read, by the key
        # cozystack-api serves each under (webhook.core.tenancy.applications.mislabel).
        self._mislabelled: dict[AppKey, Mislabel] = {}

    @property
    def platform(self) -> Platform:
        return self._platform

    @platform.setter
    def platform(self, platform: Platform) -> None:
        self._platform = platform
        self.generation += 1

    @property
    def keys(self) -> RecordKeys:
        return self._keys

    @keys.setter
    def keys(self, keys: RecordKeys) -> None:
        self._keys = keys
        self.generation += 1

    def __len__(self) -> int:
        return len(self._apps) + len(self._unknown)

    @property
    def synced(self) -> bool:
        """Whether decisions may trust this state: set, and (live) the source says so now."""
        return self._synced and (self._readiness is None or self._readiness())

    @synced.setter
    def synced(self, value: bool) -> None:
        self._synced = value

    def kind_unavailable(self, kind: str) -> str:
        """Why writes of ``kind`` cannot be decided now (its applications cannot be listed, or
        are not listed yet) while the rest of the state can; empty when they can."""
        return self._unavailable(kind) if self._unavailable is not None else ""

    def unseen_tenant(self, namespace: str) -> str:
        """The tenant namespace, ``namespace`` or an ancestor below the root, whose Tenant the
        state has not seen (created too recently for the watch, or gone); ``""`` when every
        Tenant on the way up is known or ``namespace`` is no tenant's. A state that has seen no
        Tenant at all (one whose Tenants are not listed) knows no namespace to refuse."""
        if not self._owned:
            return ""
        for current in ancestors(namespace):
            if current == ROOT_NAMESPACE:
                break
            node = self.tree.get(current)
            if node is None or not node.declared:
                return current
        return ""

    # -- observing ---------------------------------------------------------------------------

    def observe_all(self, apps: Iterable[Application]) -> None:
        """:meth:`observe` each of ``apps``: a load. The tenant tree is brought up to date once
        at the end, in time linear in the applications and the namespaces they are in."""
        if self.pending:  # a hold may settle on any of them: every observe must see the tree
            for app in apps:
                self.observe(app)
            return
        self.tree.defer()
        try:
            for app in apps:
                self.observe(app)
        finally:
            self.tree.flush()

    def observe(self, app: Application) -> None:
        """Apply an application as stored: created or updated."""
        key = _interned(app.key)
        if app.kind == TENANT_KIND:  # its factors and budget reach every price beneath it
            self.generation += 1
        namespace = key[1]
        budget = self._observe_tenant(key, app) if app.kind == TENANT_KIND else None
        record, problem = self._price(app, namespace)
        if record is not None:
            record.version = app.version
        previous = self._apps.pop(key, None)
        if record is not None:
            record.written = _written_at(previous, record, app.version)
        known_before = self._unknown.pop(key, None) is not None or previous is not None
        kept_before = self._kept.pop(key, None)
        kept = previous if previous is not None else kept_before
        if record is None:
            self._unknown[key] = problem
            if kept is not None:
                self._kept[key] = kept
        else:
            self._apps[key] = record
        self._by_namespace.setdefault(namespace, set()).add(key)
        # An application counts 1 of its kind's count key from when it is stored until it is
        # deleted, whether or not its size can be evaluated: existence is never unknown.
        counted = self.platform.count_of(key)
        before = previous.resources if previous else kept_before.resources if kept_before else {}
        last = kept.resources if kept is not None else {}
        after = rl.add(record.resources if record else last, counted)
        if known_before:
            before = rl.add(before, counted)
        self.tree.add_usage(namespace, rl.subtract(after, before))
        self._add_discount(namespace, previous, -1)
        self._add_discount(namespace, record, 1)
        if self.pending and (record is not None or budget is not None):
            observed = budget if budget is not None else record.resources if record else {}
            self.pending.settle(key, observed, app.version)
        self.pending.refloor(key)  # a shrink counts no lower than its writes may still store

    def restamp(self, key: AppKey, version: int) -> bool:
        """The application at ``key`` was stored again at ``version`` with nothing the state
        reads changed (a label, a status): what :meth:`observe` of it would do, without pricing
        it again. Its version moves on and a hold it shows is settled; the price, the tree and
        the generation stay as they are. False when the state holds nothing of it."""
        record = self._apps.get(key)
        if record is None and key not in self._unknown:
            return False
        observed: dict[str, Decimal] | None = None
        if key[0] == TENANT_KIND:
            node = self.tree.get(owned_namespace(key[1], key[2]))
            if key not in self._tenant_versions or node is None:
                return False
            self._tenant_versions[key] = version
            observed = dict(node.budget)
        if record is not None:
            record.version = version
            if observed is None:
                observed = record.resources
        if self.pending and observed is not None:
            self.pending.settle(key, observed, version)
        return True

    def forget(self, key: AppKey, *, version: int = 0) -> None:
        """Apply the deletion of an application (seen at resourceVersion ``version``)."""
        if key[0] == TENANT_KIND:
            self.generation += 1
        previous = self._apps.pop(key, None)
        was_unknown = self._unknown.pop(key, None) is not None
        kept = self._kept.pop(key, None)
        members = self._by_namespace.get(key[1])
        if members is not None:
            members.discard(key)
            if not members:
                del self._by_namespace[key[1]]
        if previous is not None or was_unknown:
            last = previous.resources if previous else kept.resources if kept else {}
            held = rl.add(last, self.platform.count_of(key))
            self.tree.add_usage(key[1], rl.scale(held, Decimal(-1)))
        if previous is not None:
            self._add_discount(key[1], previous, -1)
        if self.pending:
            self.pending.settle(key, None, version)
        self.pending.forget_floor(key)  # an update of a deleted object is never stored
        self._tenant_versions.pop(key, None)
        owned = self._owned.pop(key, None)
        if owned is not None:
            self._declared.pop(owned, None)
            self.tree.set_budget(owned, {})
            self.tree.declare(owned, declared=False)
            if self._tenant_factors.pop(owned, None) is not None:
                self._reprice_subtree(owned)

    def replace_kind(self, kind: str, apps: list[Application], *, version: int = 0) -> None:
        """Make ``kind``'s applications exactly ``apps`` (after a full list at ``version``)."""
        present = {app.key for app in apps}
        stale = [k for k in [*self._apps, *self._unknown] if k[0] == kind and k not in present]
        for key in stale:
            self.forget(key, version=version)
        for app in apps:
            self.observe(app)

    def _observe_tenant(self, key: AppKey, app: Application) -> dict[str, Decimal]:
        owned = owned_namespace(key[1], key[2])
        self._owned[key] = owned
        self._tenant_versions[key] = app.version
        kind = self.platform.kind(TENANT_KIND)
        try:
            values = kind.defaulted(app.spec) if kind else app.spec
            budget = parse_budget(values)
        except UNEVALUABLE:
            # A budget Cozystack would not render cannot be trusted either way: keep the last
            # one; a new tenant stays unbounded and is reported through its problem.
            node = self.tree.get(owned)
            budget = node.budget if node is not None else {}
        else:
            self._declared[owned] = dict(budget)
            budget = effective_budget(budget, self.cap(owned))
        self.tree.declare(owned, declared=True)
        self.tree.set_budget(owned, budget)
        factors = self.own_factors(app)
        if factors != self._tenant_factors.get(owned):
            if factors is None:
                self._tenant_factors.pop(owned, None)
            else:
                self._tenant_factors[owned] = factors
            self._reprice_subtree(owned)
        return dict(budget)

    def _reprice_subtree(self, owned: str) -> None:
        """Apply today's effective factors to every application under ``owned`` whose factor
        is not its own: a tenant's factor was set, changed or removed."""
        for record in self._apps.values():
            namespace = record.namespace
            if record.own is not None or not beneath(namespace, owned):
                continue
            factors, source = self.factors_for(namespace, None)
            declared = record.declared
            reserved = apply_factors(declared, factors)
            if reserved == record.resources and (record.factors or {}) == factors:
                continue
            self.tree.add_usage(namespace, rl.subtract(reserved, record.resources))
            self._add_discount(namespace, record, -1)
            record.resources = _shared(reserved)
            record.committed = _shared(declared) if reserved != declared else None
            record.factors = dict(factors) or None
            record.factor_source = source
            self._add_discount(namespace, record, 1)

    def _add_discount(self, namespace: str, record: AppRecord | None, sign: int) -> None:
        if record is None or record.committed is None:
            return
        totals = self._discount.setdefault(namespace, {})
        for key, value in record.discount.items():
            totals[key] = totals.get(key, Decimal(0)) + sign * value
        if not any(totals.values()):
            del self._discount[namespace]

    def _price(self, app: Application, namespace: str) -> tuple[AppRecord | None, str]:
        """The record to keep (``None``: unknown), and why today's evaluation failed."""
        # The values are bounded, defaulted and digested once, for the record and the charge;
        # applications with the very same values share that work (Platform.prepare).
        prepared: Prepared | None = None
        failure: Exception | None = None
        try:
            prepared = self.platform.prepare(app.kind, app.spec, namespace=namespace)
            failure = prepared.failure
        except UNEVALUABLE as exc:
            failure = exc
        recorded = self.trusted(app, digest=prepared.digest if prepared is not None else None)
        own = self._own(app, recorded) if app.kind != TENANT_KIND else None
        factors, source = self.factors_for(namespace, own)
        problem = ""
        marks: Mapping[str, Decimal] = recorded.marks if recorded is not None else {}
        try:
            if prepared is None or prepared.charge is None:
                assert failure is not None  # set whenever there is no charge
                raise failure
            charge = prepared.charge
        except UNEVALUABLE as exc:
            if recorded is None:
                return None, _reason(exc)
            problem = _reason(exc)
            declared = dict(recorded.declared)
            record = AppRecord(namespace, declared, sys.intern(recorded.digest), problem=problem)
        else:
            if recorded is None:
                # No record counts, but one the webhook signed may still say what the volumes
                # grew to (a dry run's: cozystack-api stores dry runs; one signed with a retired
                # key): marks only ever raise a charge.
                held = hold(charge, self._signed_marks(app), self._released(app.kind))
                marks = held.marks
                declared = dict(held.charge.resources)
                record = AppRecord(namespace, declared, sys.intern(charge.digest))
            else:
                declared = dict(recorded.declared)
                record = AppRecord(namespace, declared, sys.intern(recorded.digest))
                if recorded.digest != charge.digest or declared != charge.resources:
                    record.current_digest = sys.intern(charge.digest)
                    record.current = dict(charge.resources)
        reserved = apply_factors(declared, factors)
        record.resources = _shared(reserved)
        record.committed = _shared(declared) if reserved != declared else None
        record.own = own
        record.factors = dict(factors) or None
        record.factor_source = source
        record.marks = dict(marks) or None
        record.request = recorded.request if recorded is not None else ""
        return record, problem

    def _signed_marks(self, app: Application) -> Mapping[str, Decimal]:
        """The volume marks of a record the webhook signed for exactly this object and values,
        believed or not (a dry run's, one signed with a retired key)."""
        if app.recorded is None or not app.recorded.marks:
            return {}
        digest = self.values_digest(app.kind, app.spec)
        if verifies(self.keys, app.key, digest, app.recorded, uid=app.uid, marks_only=True):
            return app.recorded.marks
        return {}

    def _released(self, kind: str) -> list[str]:
        found = self.platform.kind(kind)
        contract = found.contract if found is not None else None
        return [t.name for t in contract.terms if t.volume == RELEASED] if contract else []

    def factors_for(
        self, namespace: str, own: Mapping[str, Decimal] | None
    ) -> tuple[dict[str, Decimal], str]:
        """The effective factor in ``namespace`` and where it comes from: the application's own
        (``"application"``), else the nearest tenant's (its namespace), else none (``""``)."""
        if own is not None:
            return dict(own), "application"
        if not self._tenant_factors:  # no tenant sets one: no walk up the namespaces
            return {}, ""
        for candidate in ancestors(namespace):
            factors = self._tenant_factors.get(candidate)
            if factors is not None:
                return dict(factors), candidate
        return {}, ""

    def believed_own(self, app: Application) -> dict[str, Decimal] | None:
        """The object's own factor as this state believes it: for a Tenant, the factor its
        subtree is priced at; for an application it holds, the factor its record kept; for an
        object it does not hold, what a verified record on ``app`` vouches for."""
        if app.kind == TENANT_KIND:
            owned = self._owned.get(app.key)
            if owned is not None:
                found = self._tenant_factors.get(owned)
                return dict(found) if found is not None else None
        else:
            record = self._apps.get(app.key)
            if record is not None:
                return dict(record.own) if record.own is not None else None
        return self.own_factors(app)

    def own_factors(self, app: Application) -> dict[str, Decimal] | None:
        """The object's own factor annotation, if its verified record vouches for it."""
        return self._own(app, self.trusted(app))

    @staticmethod
    def _own(app: Application, recorded: RecordedCharge | None) -> dict[str, Decimal] | None:
        """The object's own factor is what its verified record says the platform set: the
        annotation is only how the platform asks for one at admission, so a factor written or
        removed with no webhook in the way changes nothing while the record still verifies."""
        if recorded is None or recorded.own is None:
            return None
        return dict(recorded.own)

    def repricing(self, owned: str, factors: Mapping[str, Decimal] | None) -> dict[str, Decimal]:
        """How much more (or less) the applications under ``owned`` would reserve if its
        Tenant's own factor were ``factors`` (``None``: none); nothing is changed."""
        total: dict[str, Decimal] = {}
        for record in self._apps.values():
            namespace = record.namespace
            if record.own is not None or not beneath(namespace, owned):
                continue
            effective: Mapping[str, Decimal] = {}
            for candidate in ancestors(namespace):
                found = factors if candidate == owned else self._tenant_factors.get(candidate)
                if found is not None:
                    effective = found
                    break
            change = rl.subtract(apply_factors(record.declared, effective), record.resources)
            total = rl.add(total, change)
        return {key: value for key, value in total.items() if value}

    def discounts(self) -> Mapping[str, Mapping[str, Decimal]]:
        """Per namespace, what its applications commit beyond what they reserve."""
        return self._discount

    def pool_discounts(self) -> dict[str, dict[str, Decimal]]:
        """Per pool and key, the discount of the applications whose usage lands in it: a pool
        commits its reserved figure plus this. Costs O(namespaces with a discount x depth)."""
        pools: dict[str, dict[str, Decimal]] = {}
        for namespace, totals in self._discount.items():
            for key, value in totals.items():
                bounder = self.tree.bounder(namespace, key)
                if bounder is not None and value:
                    pool = pools.setdefault(bounder.namespace, {})
                    pool[key] = pool.get(key, Decimal(0)) + value
        return pools

    def values_digest(self, kind: str, spec: object) -> str:
        """The digest a record of an application of ``kind`` with ``spec`` must carry: of its
        values with the kind's defaults applied (a CREATE's spec is sparse, the old object of
        an UPDATE defaulted; both must give one digest)."""
        found = self.platform.kind(kind)
        values = {} if spec is None else spec
        if found is not None:
            try:
                values = found.defaulted(spec)
            except UNEVALUABLE:
                values = spec
        return values_digest(values)

    def trusted(self, app: Application, *, digest: str | None = None) -> RecordedCharge | None:
        """``app``'s recorded charge if it counts for this object (signed for it and its values,
        bound to no other uid, not minted by a dry run), else None.

        ``digest`` is :meth:`values_digest` of ``app``'s values when the caller has it."""
        if app.recorded is None:
            return None
        if digest is None:
            digest = self.values_digest(app.kind, app.spec)
        ok = believed(self.keys, app.key, digest, app.recorded, uid=app.uid)
        return app.recorded if ok else None

    def _observed(self, key: AppKey) -> Mapping[str, Decimal]:
        """What the state counts for an application as stored: its charge; a Tenant's, the
        quota it counts (its parent's pools count ``max(quota, usage)``, never less)."""
        if key[0] == TENANT_KIND:
            owned = self._owned.get(key)
            node = self.tree.get(owned) if owned is not None else None
            return node.budget if node is not None and node.declared else {}
        record = self._apps.get(key)
        if record is None:  # unknown: what it is still counted at (a floor tops up only above)
            kept = self._kept.get(key)
            return kept.resources if kept is not None else {}
        return record.resources

    def _written(self, key: AppKey) -> int:
        record = self._apps.get(key)
        return record.written if record is not None else 0

    def _shows(self, hold: Hold) -> bool:
        """Whether the state shows ``hold``'s application as admitted, newer than the admission
        (a copy that only matches the figures may predate it, and settles nothing)."""
        if hold.key[0] == TENANT_KIND:
            node = self.tree.get(owned_namespace(hold.key[1], hold.key[2]))
            return (
                self._tenant_versions.get(hold.key, 0) > hold.after
                and node is not None
                and node.declared
                and expects(hold, node.budget)
            )
        record = self._apps.get(hold.key)
        return (
            record is not None
            and record.version > hold.after
            and dict(record.resources) == dict(hold.charge)
        )

    # -- carve-outs admitted in warn ------------------------------------------------------

    def set_caps(self, pool: str, caps: Mapping[str, Cap]) -> None:
        """``pool``'s ledger lists exactly ``caps`` (by the namespace each Tenant owns)."""
        before = self._caps.get(pool, {})
        if dict(before) == dict(caps):
            return
        self.generation += 1
        if caps:
            self._caps[pool] = dict(caps)
        else:
            self._caps.pop(pool, None)
        for owned in sorted(before.keys() | caps.keys()):
            declared = self._declared.get(owned)
            if declared is not None:
                self.tree.set_budget(owned, effective_budget(declared, self.cap(owned)))

    def set_mislabelled(self, kind: str, found: Mapping[AppKey, Mislabel]) -> None:
        """The HelmReleases of ``kind`` labelled with another application's name are exactly
        ``found`` (a read of every release of the kind says so)."""
        kept = {k: v for k, v in self._mislabelled.items() if k[0] != kind}
        self._mislabelled = {**kept, **{k: v for k, v in found.items() if k[0] == kind}}

    def mislabel_of(self, key: AppKey) -> Mislabel | None:
        """The mislabel of the HelmRelease ``key`` is stored as, if its label is another's."""
        return self._mislabelled.get(key)

    def mislabelled(self) -> dict[AppKey, Mislabel]:
        """The applications stored as a HelmRelease labelled with another application's name
        (still held: one deleted since is left out), by key."""
        return {
            key: found
            for key, found in sorted(self._mislabelled.items())
            if key in self._apps or key in self._unknown
        }

    def add_cap(self, pool: str, owned: str, cap: Cap) -> None:
        """``pool``'s ledger lists ``cap`` for ``owned`` beside its other caps: where this
        process is the only store (no ledger writes them), as the live ledger would."""
        self.set_caps(pool, {**self._caps.get(pool, {}), owned: cap})

    def carry_caps(self, other: ReservationState) -> None:
        """Continue ``other``'s caps (a state rebuilt for a new platform)."""
        for pool, caps in other._caps.items():
            self.set_caps(pool, caps)

    def carry_kept(self, other: ReservationState) -> None:
        """Keep counting, at what ``other`` last priced them at, the applications this state
        (rebuilt for a new platform) cannot price: an instance type or preset deleted or made
        unreadable has not shrunk what its applications hold (KubeVirt keeps a VM at the
        instance type it started with), so their room does not go to the pool's others."""
        for key in self._unknown:
            if key in self._kept:
                continue
            kept = other._apps.get(key) or other._kept.get(key)
            if kept is not None:
                self._kept[key] = kept
                self.tree.add_usage(key[1], kept.resources)
                self.pending.refloor(key)  # a floor over it tops up only above what it keeps

    def cap(self, owned: str) -> Cap | None:
        """The cap some pool's ledger lists for the Tenant owning ``owned``."""
        for pool in sorted(self._caps):
            found = self._caps[pool].get(owned)
            if found is not None:
                return found
        return None

    def counted_budget(self, owned: str, declared: Mapping[str, Decimal]) -> dict[str, Decimal]:
        """What a Tenant owning ``owned`` counts as its quota if it declares ``declared``."""
        return effective_budget(declared, self.cap(owned))

    def capped(self) -> dict[str, Cap]:
        """Carve-outs counted below their declared quota now, by the namespace they own."""
        found = {}
        for pool in self._caps.values():
            for owned in pool:
                declared = self._declared.get(owned)
                cap = self.cap(owned)
                if (
                    cap is not None
                    and declared is not None
                    and cap.digest == budget_digest(declared)
                ):
                    found[owned] = cap
        return found

    def declares(self, owned: str, digest: str) -> bool:
        """Whether the Tenant owning ``owned`` is stored declaring the quota ``digest``."""
        declared = self._declared.get(owned)
        return declared is not None and budget_digest(declared) == digest

    # -- questions ---------------------------------------------------------------------------

    def record(self, key: AppKey) -> AppRecord | None:
        return self._apps.get(key)

    def owned_namespace(self, key: AppKey) -> str | None:
        return self._owned.get(key)

    def records(self) -> Iterator[tuple[AppKey, AppRecord]]:
        return iter(self._apps.items())

    def records_in(self, namespace: str) -> Iterator[tuple[AppKey, AppRecord | None]]:
        """The applications stored in one namespace; ``None`` for those with no charge."""
        for key in self._by_namespace.get(namespace, ()):
            yield key, self._apps.get(key)

    def unknown(self) -> Mapping[AppKey, str]:
        return self._unknown

    def kept(self) -> Mapping[AppKey, AppRecord]:
        """Each application with no charge now, at the record it was last priced at: what it
        still counts, and its volumes' high marks then."""
        return self._kept

    def kept_marks(self, key: AppKey) -> Mapping[str, Decimal]:
        """The volume high marks of the charge ``key`` is kept at while it has none now."""
        kept = self._kept.get(key)
        return (kept.marks or {}) if kept is not None else {}

    def unknown_in_pool(self, pool_namespace: str, key: str) -> list[AppKey]:
        """Unknown applications whose usage of ``key`` would land in that pool."""
        found = []
        for app_key in self._unknown:
            bounder = self.tree.bounder(app_key[1], key)
            if bounder is not None and bounder.namespace == pool_namespace:
                found.append(app_key)
        return sorted(found)


def _written_at(previous: AppRecord | None, record: AppRecord, version: int) -> int:
    """The version ``record``'s values were last written at, observed at ``version``: then,
    if they differ from ``previous``'s as priced; else when ``previous``'s were (values that
    changed but price and digest alike are taken for unchanged, and an application seen for
    the first time, by a list or a rebuilt state, for written at no known version: their
    floors then wait for their expiry, which only ever counts more)."""
    if previous is None:
        return 0
    same = (
        previous.digest == record.digest
        and previous.current_digest == record.current_digest
        and previous.resources == record.resources
    )
    return previous.written if same else version


def recount(state: ReservationState) -> dict[tuple[str, str], tuple[Decimal, Decimal]]:
    """Pool usage recomputed from scratch, compared with the incremental figures.

    Returns every (namespace, key) whose two figures differ: empty when the incremental
    bookkeeping is right. Costs a walk over every application: for a periodic check only.
    """
    # Sum per namespace first (plain additions), then walk the tree once per namespace.
    own: dict[str, dict[str, Decimal]] = {}
    for app_key, record in state.records():
        totals = own.setdefault(app_key[1], {})
        for key, value in record.resources.items():
            totals[key] = totals.get(key, Decimal(0)) + value
    for app_key, last in state.kept().items():
        own[app_key[1]] = rl.add(own.get(app_key[1], {}), last.resources)
    for app_key in [*(k for k, _ in state.records()), *state.unknown()]:
        totals = own.setdefault(app_key[1], {})
        for key, value in state.platform.count_of(app_key).items():
            totals[key] = totals.get(key, Decimal(0)) + value
    for app_key, topup in state.pending.topups():
        own[app_key[1]] = rl.add(own.get(app_key[1], {}), topup)
    for node in state.tree.nodes():
        remote = state.pending.remote(node.namespace)
        if remote:
            own[node.namespace] = rl.add(own.get(node.namespace, {}), remote)
    fresh = TenantTree()
    for node in state.tree.nodes():
        if node.budget:
            fresh.set_budget(node.namespace, node.budget)
    for namespace, totals in own.items():
        fresh.add_usage(namespace, totals)
    differences: dict[tuple[str, str], tuple[Decimal, Decimal]] = {}
    for node in state.tree.nodes():
        other = fresh.get(node.namespace)
        recounted = other.usage if other is not None else {}
        for resource in set(node.usage) | set(recounted):
            kept = node.usage.get(resource, Decimal(0))
            counted = recounted.get(resource, Decimal(0))
            if kept != counted:
                differences[(node.namespace, resource)] = (kept, counted)
    return differences


# Charges repeat (a cluster holds few distinct sizes next to its applications): records share
# one read-only map per distinct charge instead of a dict and Decimals each (~400 bytes).
_CHARGES: dict[tuple[tuple[str, Decimal], ...], dict[str, Decimal]] = {}
_CHARGES_MAX = 65_536


def _shared(resources: Mapping[str, Decimal]) -> dict[str, Decimal]:
    key = tuple(sorted(resources.items()))
    found = _CHARGES.get(key)
    if found is None:
        found = dict(key)
        if len(_CHARGES) < _CHARGES_MAX:
            _CHARGES[key] = found
    return found


def _reason(exc: Exception) -> str:
    if isinstance(exc, EvaluationError):
        return str(exc)
    if isinstance(exc, RecursionError):
        return "values nested too deeply to evaluate"
    return f"values cannot be evaluated ({type(exc).__name__})"


def _interned(key: AppKey) -> AppKey:
    return (sys.intern(key[0]), sys.intern(key[1]), key[2])
