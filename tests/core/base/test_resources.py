"""Resource-list arithmetic: small total functions that return new maps."""

from decimal import Decimal

from webhook.core.base import resources as rl


def q(**values: str) -> dict[str, Decimal]:
    return {key.replace("_", "-"): Decimal(value) for key, value in values.items()}


def test_add_sums_shared_keys_and_keeps_the_rest() -> None:
    assert rl.add(q(cpu="1", memory="2"), q(cpu="3", storage="5")) == q(
        cpu="4", memory="2", storage="5"
    )


def test_subtract_makes_missing_left_keys_negative() -> None:
    assert rl.subtract(q(cpu="1"), q(cpu="3", memory="2")) == q(cpu="-2", memory="-2")


def test_arguments_are_never_mutated() -> None:
    left, right = q(cpu="1"), q(cpu="2")
    rl.add(left, right)
    rl.subtract(left, right)
    rl.maximum(left, right)
    assert left == q(cpu="1")
    assert right == q(cpu="2")


def test_positive_part_keeps_only_increases() -> None:
    assert rl.positive_part(q(cpu="2", memory="-1", storage="0")) == q(cpu="2")


def test_exceeded_names_keys_over_the_limit_and_equality_fits() -> None:
    assert rl.exceeded(q(cpu="4", memory="8"), q(cpu="4", memory="7")) == ["memory"]


def test_keys_without_a_limit_are_unlimited() -> None:
    assert rl.exceeded(q(cpu="1000"), q(memory="1")) == []


def test_maximum_is_key_wise() -> None:
    assert rl.maximum(q(cpu="1", memory="8"), q(cpu="4")) == q(cpu="4", memory="8")


def test_mask_and_scale() -> None:
    assert rl.mask(q(cpu="1", memory="2"), ["memory"]) == q(memory="2")
    assert rl.scale(q(cpu="0.5"), Decimal(3)) == q(cpu="1.5")


def test_total_of_many() -> None:
    assert rl.total([q(cpu="1"), q(cpu="2", memory="1"), {}]) == q(cpu="3", memory="1")


def test_format_resources_reads_like_a_quota_message() -> None:
    resources = {"memory": Decimal(8 * 1024**3), "cpu": Decimal("0.5")}
    assert rl.format_resources(resources) == "cpu=500m, memory=8Gi"
    assert rl.format_resources(resources, ["memory", "storage"]) == "memory=8Gi, storage=0"
    assert rl.to_strings(resources) == {"cpu": "500m", "memory": "8Gi"}
