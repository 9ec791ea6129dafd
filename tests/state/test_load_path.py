"""A ``--state`` load gives the state of observing its applications one at a time.

The load sums tenant usage per namespace before carrying it up the tree (and prices through the
same caches as admission); observing the same manifests one by one, in file order, into a fresh
state is the plain path. On a varied directory (every kind the benchmark draws, carve-outs,
unbounded children, signed and unsigned records, objects that cannot be priced) both must hold
the same records, unknowns, budgets and usage, to the last field.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from benchmarks.state_load import write_state
from benchmarks.varied_state import PLATFORM_DIR, RECORD_KEY
from webhook.core.admission.state import ReservationState
from webhook.core.tenancy.applications import application_from_object
from webhook.core.tenancy.records import RecordKeys
from webhook.state.manifests import load_platform, load_state, read_manifests


def snapshot(state: ReservationState) -> dict[str, Any]:
    """Everything the state holds that a decision, a report or a metric reads."""
    return {
        "records": {key: dataclasses.asdict(record) for key, record in state.records()},
        "unknown": dict(state.unknown()),
        "tree": [
            (
                node.namespace,
                node.parent.namespace if node.parent is not None else None,
                dict(node.budget),
                # A key whose usage came back to zero may or may not be kept: zero either way.
                {key: value for key, value in node.usage.items() if value},
                sorted(node.children),
                node.declared,
            )
            for node in state.tree.nodes()
        ],
        "discounts": {ns: dict(totals) for ns, totals in state.discounts().items()},
        "pools": state.tree.pools(),
        "count": len(state),
    }


def plain(paths: list[Path], keys: RecordKeys) -> ReservationState:
    """The applications observed one at a time, in file order."""
    state = ReservationState(load_platform(paths), keys=keys)
    for manifest in read_manifests(paths):
        if manifest.body.get("apiVersion") == "apps.cozystack.io/v1alpha1":
            state.observe(application_from_object(manifest.body))
    return state


@pytest.mark.parametrize("as_json", [False, True], ids=["yaml", "json"])
def test_a_varied_state_loads_as_its_applications_observed_one_by_one(
    tmp_path: Path, as_json: bool
) -> None:
    write_state(tmp_path, 1_500, as_json=as_json)
    keys = RecordKeys(RECORD_KEY)
    paths = [PLATFORM_DIR, tmp_path]
    loaded = load_state(paths, keys=keys)
    expected = plain(paths, keys)
    assert len(loaded) == 1_500 + 900
    assert loaded.unknown()  # the directory holds objects that cannot be priced
    assert any(node.bounded and node.parent and node.parent.bounded for node in loaded.tree.nodes())
    assert snapshot(loaded) == snapshot(expected)
    # and the figures are not all zero: a pool at the top holds what its tenants use
    assert any(sum(view.reserved.values(), Decimal(0)) > 0 for view in loaded.tree.pools())


def test_a_load_prices_applications_differing_only_in_what_no_term_reads_once(
    tmp_path: Path,
) -> None:
    documents = [
        "apiVersion: apps.cozystack.io/v1alpha1\nkind: VMInstance\n"
        f"metadata: {{name: vm{index}, namespace: tenant-t{index % 7}}}\n"
        f"spec: {{instanceType: u1.small, disks: [{{name: vm{index}-system}}],"
        f" cloudInit: '#{index}'}}\n"
        for index in range(60)
    ]
    (tmp_path / "vms.yaml").write_text("---\n".join(documents))
    state = load_state([PLATFORM_DIR, tmp_path])
    assert len(state) == 60
    assert not state.unknown()
    assert len(state.platform._charges) == 1
