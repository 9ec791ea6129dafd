"""A compiled contract prices exactly as the interpreter does, on every shipped kind.

The interpreter (:func:`~webhook.core.pricing.evaluation.interpret`) is the reference; the
compiled form (:func:`~webhook.core.pricing.compiled.program`) is what admission runs. For every
kind of the real fixtures and for contracts that use what the shipped ones do not (indices,
brackets, recursive descent, defaults, literals), on generated values that are hostile (wrong
types, huge counts, deep nesting, missing keys, bad quantities, keys named like path steps),
both must give the same outcome: the same charge with the same terms, paths, Decimal digits and
digest, or the same error with the same path and message, or the same crash, under the same
limits.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import platform
from webhook.core.base.errors import EvaluationError
from webhook.core.pricing import evaluation
from webhook.core.pricing.catalog import Catalog
from webhook.core.pricing.compiled import program
from webhook.core.pricing.contracts import Contract, ValuePath, compile_contract
from webhook.core.pricing.evaluation import EvaluationLimits, interpret

PLATFORM = platform()
CATALOG = PLATFORM.catalog
KINDS = sorted(k for k, v in PLATFORM.kinds.items() if v.contract is not None and k != "Thing")

# Contracts for what the shipped ones do not use: each construct of the language.
SYNTHETIC = {
    name: compile_contract("Synthetic", spec, source="test")
    for name, spec in {
        "steps": {
            "terms": [
                {"name": "gpus", "devices": "$.gpus[*].name"},
                {"name": "deep", "devices": "$.a.b[*].c.*"},
                {"name": "each", "forEach": "$.a.groups.*", "devices": "@.gpus[*].name"},
                {"name": "index", "count": "$.a[0]", "storage": "$.a[1]"},
                {"name": "bracket", "storage": {"path": "$['a']['size']", "default": "1Gi"}},
            ]
        },
        "descent": {"terms": [{"name": "any", "devices": "$..name"}]},
        "expressions": {
            "terms": [
                {
                    "name": "w",
                    "forEach": "$.groups[*]",
                    "ifNone": {"only": {"n": 2, "size": "1Gi"}},
                    "when": [{"path": "@.on", "in": [True, 1, "yes"]}],
                    "unless": {"path": "@.off", "equals": 0},
                    "count": {"sum": [2, {"product": [3, "@.n"]}, {"max": [1, "@.m"]}]},
                    "storage": {"product": ["2", {"path": "@.size", "default": "bad"}]},
                    "objects": {"services.loadbalancers": {"max": [1, 2]}},
                }
            ]
        },
        "sizes": {
            "terms": [
                {
                    "name": "vm",
                    "size": {
                        "max": [
                            {"instanceType": {"path": "$.type", "default": "u1.medium"}},
                            {"resources": {"cpu": "$.cpu", "memory": "1Gi"}, "require": ["$.cpu"]},
                            {"preset": "nano", "overrides": "$.resources"},
                        ]
                    },
                },
                {"name": "ns", "size": {"instanceType": "$.type", "namespaced": True}},
                {
                    "name": "lit",
                    "size": {"first": [{"preset": "$.p"}, {"instanceType": "u1.nano"}]},
                },
            ]
        },
    }.items()
}
CONTRACTS: dict[str, Contract] = {
    **{kind: PLATFORM.kinds[kind].contract for kind in KINDS},  # type: ignore[misc]
    **SYNTHETIC,
}

# Keys a tenant could write to trip a path walker: path syntax, prototype names, blanks.
HOSTILE_KEYS = [
    "__proto__", "constructor", "prototype", "a.b", "$.a", "@.a", "*", "[*]", "[0]", "0", "-1",
    "", " ", "x y", "'q'", '"', "@x", "-x", "é", "md0\n", "a.[b", "..",
]  # fmt: skip
QUANTITIES = [
    "1", "0", "-1", "3", "03", "1.5", "2.5", "100000", "100001", "99999999999999999999", "1e12",
    "1Ei", "8Ei", "1Gi", "12Gx", "-1Gi", "250m", "", " 1", "1 ", "0x10", "\u0661", "nan",
    "Infinity",
]  # fmt: skip
NAMES = ["u1.medium", "u1.nano", "cx1.large", "nano", "small", "large", "t9.giant", "private"]
SCALARS = (
    st.none()
    | st.booleans()
    | st.sampled_from([0, 1, 2, 3, -1, 100_000, 100_001, 10**30, -(10**30)])
    | st.sampled_from([0.0, 1.0, 2.5, 1e12, -1.0, float("inf"), float("nan")])
    | st.sampled_from(QUANTITIES + NAMES + HOSTILE_KEYS)
)


def contract_keys(contract: Contract) -> list[str]:
    names = {
        name
        for node in evaluation._contract_nodes(contract)
        if isinstance(node, ValuePath)
        for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.text)
    }
    return sorted(names)


def values_of(keys: list[str]) -> st.SearchStrategy[Any]:
    key = st.sampled_from(keys) | st.sampled_from(HOSTILE_KEYS)
    return st.recursive(
        SCALARS,
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(key, children, max_size=4)
            | st.dictionaries(st.sampled_from([0, 1, True]), children, max_size=2)
        ),
        max_leaves=20,
    )


def mutated(data: st.DataObject, skeleton: Any, keys: list[str]) -> Any:
    """The skeleton with a few of its entries replaced, removed or added, anywhere."""
    values = copy.deepcopy(skeleton)
    strategy = values_of(keys)
    for _ in range(data.draw(st.integers(0, 6))):
        node: Any = values
        while True:
            entries = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
            dive: list[tuple[Any, Any]] = [
                (k, v) for k, v in entries if isinstance(v, dict | list) and v
            ]
            if len(dive) > 0 and data.draw(st.booleans()):
                node = dict(dive)[data.draw(st.sampled_from([k for k, _ in dive]))]
                continue
            action = data.draw(st.sampled_from(["set", "drop", "add"]))
            if isinstance(node, list):
                if action == "add" or not node:
                    node.append(data.draw(strategy))
                else:
                    index = data.draw(st.integers(0, len(node) - 1))
                    if action == "drop":
                        del node[index]
                    else:
                        node[index] = data.draw(strategy)
            elif action == "add" or not node:
                node[data.draw(st.sampled_from(keys + HOSTILE_KEYS))] = data.draw(strategy)
            else:
                chosen = data.draw(st.sampled_from(sorted(node, key=repr)))
                if action == "drop":
                    del node[chosen]
                else:
                    node[chosen] = data.draw(strategy)
            break
    return values


_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\.\*|\[\*\]|\[([0-9]+)\]")


def contract_paths(contract: Contract) -> list[list[object]]:
    """Every path of the contract as steps from the root (a name, an index or "*")."""
    found = []
    for term in contract.terms:
        base = term.for_each.text[1:] if term.for_each is not None else ""
        for node in evaluation._contract_nodes(term):
            if isinstance(node, ValuePath):
                text = (base if node.relative else "") + node.text[1:]
                steps = [m[1] or (int(m[2]) if m[2] else "*") for m in _STEP.finditer(text)]
                found.append(steps)
    return found


def shaped(data: st.DataObject, contract: Contract, keys: list[str]) -> dict[str, Any]:
    """Values laid along the contract's own paths, each leaf and container key drawn."""
    values: dict[str, Any] = {}
    leaf = values_of(keys)
    container_key = st.sampled_from(HOSTILE_KEYS) | st.sampled_from(["md0", "a", "b"])
    for steps in data.draw(st.lists(st.sampled_from(contract_paths(contract)), max_size=6)):
        node: Any = values
        for index, step in enumerate(steps):
            ahead = steps[index + 1] if index + 1 < len(steps) else None
            fresh: Any = (
                data.draw(leaf) if ahead is None
                else [] if isinstance(ahead, int) or (ahead == "*" and data.draw(st.booleans()))
                else {}
            )  # fmt: skip
            if isinstance(node, dict):
                key = data.draw(container_key) if step == "*" else step
                node = node.setdefault(key, fresh)
            elif isinstance(node, list):
                slot = step if isinstance(step, int) else data.draw(st.integers(0, len(node)))
                while len(node) <= slot:
                    node.append(fresh)
                node = node[slot]
            else:
                break
    return values


def outcome(run: Callable[[], Any]) -> object:
    """Everything a caller can see of an evaluation, Decimal digits included."""
    try:
        charge = run()
    except EvaluationError as exc:
        return ("error", exc.path, exc.reason, exc.kind, str(exc))
    except Exception as exc:  # a crash must be the same crash
        return ("crash", type(exc), str(exc))
    return (
        charge.kind,
        [(k, str(v)) for k, v in charge.resources.items()],
        charge.digest,
        charge.contract_digest,
        charge.exempt_reason,
        [
            (t.term, t.path, str(t.count), t.source, [(k, str(v)) for k, v in t.resources.items()],
             t.volume, str(t.storage))
            for t in charge.terms
        ],
    )  # fmt: skip


LIMITS = st.sampled_from(
    [
        evaluation.DEFAULT_LIMITS,
        EvaluationLimits(max_items=2, max_matches=6),
        EvaluationLimits(1, 1),
    ]
)


def both(
    contract: Contract,
    values: Any,
    *,
    catalog: Catalog = CATALOG,
    namespace: str = "",
    limits: EvaluationLimits = evaluation.DEFAULT_LIMITS,
) -> tuple[Any, Any]:
    args = {"namespace": namespace, "limits": limits}
    reference = outcome(lambda: interpret(contract, values, catalog, **args))  # type: ignore[arg-type]
    compiled = outcome(lambda: program(contract).evaluate(values, catalog, **args))  # type: ignore[arg-type]
    return reference, compiled


@pytest.mark.parametrize("name", sorted(CONTRACTS))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_compiled_contract_prices_every_value_as_the_interpreter(
    name: str, data: st.DataObject
) -> None:
    contract = CONTRACTS[name]
    keys = [*contract_keys(contract), "name", "gpus"]
    found = PLATFORM.kinds.get(name)
    skeleton: Any = {}
    if found is not None and data.draw(st.booleans()):
        skeleton = found.defaulted({})
    ways = ["shaped", "mutated", "random"] if contract_paths(contract) else ["mutated", "random"]
    how = data.draw(st.sampled_from(ways))
    if how == "shaped":
        values: Any = mutated(data, shaped(data, contract, keys), keys)
    elif how == "mutated":
        values = mutated(data, skeleton, keys)
    else:
        values = data.draw(
            st.dictionaries(st.sampled_from(keys + HOSTILE_KEYS), values_of(keys), max_size=5)
        )
    namespace = data.draw(st.sampled_from(["", "tenant-a"]))
    limits = data.draw(LIMITS)
    reference, compiled = both(contract, values, namespace=namespace, limits=limits)
    assert compiled == reference


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_compiled_steps_find_what_jsonpath_alone_finds(data: st.DataObject) -> None:
    """Against the interpreter with its own no-match shortcut off: jsonpath-ng alone."""
    contract = SYNTHETIC["steps"]
    keys = [*contract_keys(contract), "name", "x"]
    values = data.draw(st.dictionaries(st.sampled_from(keys), values_of(keys), max_size=4))
    compiled = outcome(lambda: program(contract).evaluate(values, CATALOG))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation, "_leads_nowhere", lambda datum, keys: False)
        alone = outcome(lambda: interpret(contract, values, CATALOG))
    assert compiled == alone


def test_a_contract_is_compiled_once_per_object() -> None:
    kind = PLATFORM.kinds["Kubernetes"]
    assert kind.program is not None
    assert kind.program is program(kind.contract)  # type: ignore[arg-type]
    fresh = compile_contract("Thing", {"terms": [{"name": "t", "storage": "1Gi"}]}, source="t")
    assert program(fresh) is program(fresh)
    assert program(fresh) is not program(copy.copy(fresh))


def test_evaluate_runs_the_compiled_form() -> None:
    contract = SYNTHETIC["sizes"]
    values = {"type": "u1.medium", "cpu": 4, "p": "small"}
    charge = evaluation.evaluate(contract, values, CATALOG)
    assert outcome(lambda: charge) == outcome(lambda: interpret(contract, values, CATALOG))
    assert charge.resources  # not an empty charge: the comparison compares something
    assert isinstance(charge.resources["cpu"], Decimal)


EVERY_SCALAR: list[Any] = [
    None, True, False, 0, 1, 3, -1, 100_000, 100_001, 10**30, 0.0, 2.5, 1e12, float("nan"),
    float("inf"), *QUANTITIES, *NAMES, [], {}, [1], {"cpu": "1"},
]  # fmt: skip


def placed(skeleton: Any, steps: list[object], leaf: object, key: str = "md0") -> Any:
    """``skeleton`` with ``leaf`` set at ``steps`` (a wildcard becomes ``key`` or index 0)."""
    values = copy.deepcopy(skeleton) if isinstance(skeleton, dict) else {}
    node: Any = values
    for index, step in enumerate(steps):
        last = index == len(steps) - 1
        ahead = None if last else steps[index + 1]
        fresh: Any = leaf if last else [] if isinstance(ahead, int) else {}
        if isinstance(node, list):
            slot = step if isinstance(step, int) else 0
            while len(node) <= slot:
                node.append(copy.deepcopy(fresh))
            if last:
                node[slot] = leaf
            node = node[slot]
        else:
            name = key if step == "*" else step
            if last or not isinstance(node.get(name), dict | list):
                node[name] = fresh
            node = node[name]
    return values


@pytest.mark.parametrize("name", sorted(n for n, c in CONTRACTS.items() if not c.exempt))
def test_every_scalar_at_every_path_prices_alike(name: str) -> None:
    """Each path of the contract given each hostile scalar, over the kind's defaults."""
    contract = CONTRACTS[name]
    found = PLATFORM.kinds.get(name)
    skeleton = found.defaulted({}) if found is not None else {}
    compared = 0
    for steps in contract_paths(contract):
        for leaf in EVERY_SCALAR:
            values = placed(skeleton, steps, leaf)
            reference, compiled = both(contract, values)
            assert compiled == reference, (steps, leaf)
            compared += 1
    assert compared >= len(EVERY_SCALAR)


# What a tenant could write hoping the compiled path reads it otherwise than the interpreter.
KUBERNETES = CONTRACTS["Kubernetes"]


def defaulted(values: Any) -> Any:
    return PLATFORM.kinds["Kubernetes"].defaulted(values)


WORKER = {"minReplicas": 0, "maxReplicas": 1, "instanceType": "u1.medium", "diskSize": "1Gi"}


def test_a_key_named_like_a_path_step_is_read_as_a_plain_key() -> None:
    for key in ["a.b", "[0]", "*", "$.x", "@.x", "..", "a.[b", "x y", "'q'", "md0\n"]:
        reference, compiled = both(KUBERNETES, defaulted({"nodeGroups": {key: dict(WORKER)}}))
        assert compiled == reference, key
        assert isinstance(reference, tuple)
        assert reference[0] == "Kubernetes", reference
    reference, _ = both(KUBERNETES, defaulted({"nodeGroups": {"x y": dict(WORKER)}}))
    assert "nodeGroups.'x y'" in repr(reference)  # the key quoted, as jsonpath-ng writes it


def test_proto_style_keys_are_plain_keys() -> None:
    for key in ["__proto__", "constructor", "prototype", "__class__", "__dict__"]:
        values = {"nodeGroups": {key: dict(WORKER)}, key: {"replicas": 99}}
        reference, compiled = both(KUBERNETES, defaulted(values))
        assert compiled == reference, key
        assert f"nodeGroups.{key}" in repr(reference)


def test_integers_written_as_strings_count_alike() -> None:
    for replicas in [
        "3",
        "03",
        "0",
        "100000",
        "100001",
        " 3",
        "3 ",
        "+3",
        "-3",
        "3.0",
        "\u0661",
        "",
    ]:
        worker = {**WORKER, "maxReplicas": replicas}
        reference, compiled = both(KUBERNETES, defaulted({"nodeGroups": {"md0": worker}}))
        assert compiled == reference, replicas
    reference, _ = both(
        KUBERNETES, defaulted({"nodeGroups": {"md0": {**WORKER, "maxReplicas": "03"}}})
    )
    assert "'3'" in repr(reference)  # a count of three, not refused


def test_booleans_written_as_numbers_are_read_alike() -> None:
    for flag in [True, False, 1, 0, 1.0, "true"]:
        worker = {**WORKER, "maxReplicas": flag}
        reference, compiled = both(KUBERNETES, defaulted({"nodeGroups": {"md0": worker}}))
        assert compiled == reference, flag
        if flag is True:
            assert isinstance(reference, tuple)
            assert reference[0] == "error"
            assert "true is not a whole number" in str(reference[-1])
    gated = SYNTHETIC["expressions"]  # `in: [true, 1, "yes"]`: 1 == True, as the tuple says
    for on in [True, 1, 1.0, "yes", "1", 2]:
        values = {"groups": [{"on": on, "n": 1, "m": 1, "size": "1Gi"}]}
        reference, compiled = both(gated, values)
        assert compiled == reference, on


def test_a_list_where_a_map_is_expected_prices_alike() -> None:
    cases: list[Any] = [
        {"nodeGroups": [dict(WORKER), dict(WORKER)]},
        {"nodeGroups": {"md0": [dict(WORKER)]}},
        {"nodeGroups": {"md0": {**WORKER, "gpus": {"a": {"name": "nvidia.com/A"}}}}},
        {"controlPlane": [{"replicas": 3}]},
        {
            "controlPlane": {
                "replicas": 1,
                "apiServer": {"resourcesPreset": "small", "resources": []},
            }
        },
    ]
    for values in cases:
        reference, compiled = both(KUBERNETES, defaulted(values))
        assert compiled == reference, values
    reference, _ = both(KUBERNETES, defaulted({"nodeGroups": [dict(WORKER)]}))
    assert "nodeGroups[0]" in repr(reference)
    vm = CONTRACTS["VMInstance"]  # devices: $.gpus[*].name, a key after a wildcard
    for gpus in [[[{"name": "nvidia.com/A"}]], [{"name": ["nvidia.com/A"]}], {"name": "x"}]:
        values = PLATFORM.kinds["VMInstance"].defaulted({"gpus": gpus})
        reference, compiled = both(vm, values)
        assert compiled == reference, gpus
    reference, _ = both(vm, PLATFORM.kinds["VMInstance"].defaulted({"gpus": [[{"name": "g"}]]}))
    assert "'g'" not in repr(reference)  # a list in a list has no name: no device


def test_a_key_that_is_not_a_string_under_a_wildcard_fails_alike() -> None:
    """YAML can key a map by a number; the compiled steps hand such a map to jsonpath-ng."""
    reference, compiled = both(KUBERNETES, defaulted({"nodeGroups": {1: dict(WORKER)}}))
    assert compiled == reference


def test_deep_nesting_prices_alike() -> None:
    """Values nested near the bounds (64 levels), where paths and descent look."""
    deep: Any = {"name": "nvidia.com/A"}
    for level in range(50):  # one chain, its keys those the paths name
        key = ["name", "gpus", "resources", "md0", "a"][level % 5]
        deep = [deep] if level % 2 else {key: deep}
    for contract, values in [
        (KUBERNETES, defaulted({"nodeGroups": {"md0": {**WORKER, "gpus": [deep]}}})),
        (KUBERNETES, defaulted({"nodeGroups": {"md0": deep}, "controlPlane": deep})),
        (SYNTHETIC["descent"], {"a": deep}),
        (SYNTHETIC["steps"], {"a": {"b": [deep], "groups": {"g": deep}}, "gpus": deep}),
    ]:
        for limits in [evaluation.DEFAULT_LIMITS, EvaluationLimits(max_matches=20)]:
            reference, compiled = both(contract, values, limits=limits)
            assert compiled == reference
    reference, _ = both(SYNTHETIC["descent"], {"a": deep})
    assert "a device name must be a non-empty string" in repr(reference)  # a map named "name"


@pytest.mark.parametrize(
    "path",
    ["$.gpus[*].name", "$.gpu", "$['gpus'][*].name"],
    ids=["stepped", "plain", "through-jsonpath"],
)
def test_a_bad_device_under_a_for_each_is_named_from_the_root_as_the_interpreter_names_it(
    path: str,
) -> None:
    """An absolute path read in a forEach item names its value from the root: the compiled
    form put the item's path in front (``groups.a.gpus[0].name``), a value that is not there."""
    contract = compile_contract(
        "Synthetic",
        {"terms": [{"name": "each", "forEach": "$.groups.*", "devices": path}]},
        source="test",
    )
    values = {"groups": {"a": {}}, "gpus": [{"name": 1}], "gpu": 1}
    reference, compiled = both(contract, values)
    assert compiled == reference
    assert "groups.a" not in repr(reference)


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        ("VMInstance", {"instanceType": "u" * 300_000}),
        ("Postgres", {"resourcesPreset": "p" * 300_000}),
        ("VMInstance", {"instanceType": {f"k{i}": i for i in range(10_000)}}),
    ],
    ids=["instance type", "preset", "not a name"],
)
def test_a_name_no_catalog_holds_is_quoted_within_a_bound_by_both(kind: str, values: Any) -> None:
    # The refusal quoted the tenant's name whole: a 300 KB instance type gave a 300 KB message,
    # twice in the answer (message and cause), in the log line and in the audit annotation.
    contract = PLATFORM.kinds[kind].contract
    assert contract is not None
    defaulted = PLATFORM.kinds[kind].defaulted(values)
    reference, compiled = both(contract, defaulted)
    assert reference == compiled
    with pytest.raises(EvaluationError) as caught:
        interpret(contract, defaulted, CATALOG)
    messages = [str(caught.value)]
    assert len(messages[0]) < 2 * evaluation.MAX_QUOTED + 200
    assert "characters)" in messages[0]
