"""The canonical JSON every values digest and record MAC is taken over, written the fast way.

Records signed by earlier versions are stored in clusters and must still verify, so the fast
writer (:func:`~webhook.core.tenancy.records.canonical_json`) must give the very bytes the
standard library's encoder always gave, on any value: unicode, floats, big integers, nesting,
empty containers, the keys YAML makes that are not strings, the types it turns into ``str()``.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.tenancy.records import (
    RecordKeys,
    canonical_json,
    canonical_sha256,
    mac,
    parse_recorded_charge,
    values_digest,
    verifies,
)

# What every earlier version wrote: the reference the fast writer must equal, byte for byte.
_OLD = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def old_bytes(value: object) -> bytes:
    return _OLD.encode(value).encode("utf-8", "surrogatepass")


def outcome(write: Any, value: object) -> tuple[str, object]:
    try:
        return "text", write(value)
    except Exception as exc:  # the same failure, of the same type
        return "error", type(exc)


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.text(alphabet=st.characters(max_codepoint=0x80))
    | st.sampled_from(["", "1.5", "a:null", ":1e5", "\x7f", "\x00\n\t\b\f\r", '"\\/', "\ud800"])
)
keys = st.text() | st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=4)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(keys, children, max_size=5)
        | st.tuples(children, children)
    ),
    max_leaves=40,
)


@settings(max_examples=3000, deadline=None)
@given(json_values)
def test_the_fast_canonical_json_is_the_old_text_byte_for_byte(value: object) -> None:
    assert outcome(canonical_json, value) == outcome(old_bytes, value)


@settings(max_examples=500, deadline=None)
@given(json_values)
def test_a_long_text_is_checked_by_its_types_and_is_the_old_text_byte_for_byte(
    value: object,
) -> None:
    """Past 64 KiB of text floats are found by a walk over the types, not a scan: the same."""
    padded = {"padding": "a" * 70_000, "value": value}
    assert outcome(canonical_json, padded) == outcome(old_bytes, padded)


odd_keys = st.dictionaries(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
    st.integers(max_value=3),
    max_size=4,
)


@settings(max_examples=500, deadline=None)
@given(odd_keys)
def test_keys_that_are_not_strings_are_written_or_refused_as_before(value: object) -> None:
    assert outcome(canonical_json, value) == outcome(old_bytes, value)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"at": datetime.date(2026, 1, 2)}, id="yaml-date-is-str-of-it"),
        pytest.param({"at": datetime.datetime(2026, 1, 2, 3, 4, 5)}, id="yaml-timestamp"),
        pytest.param({"data": b"\x00\xff"}, id="yaml-binary"),
        pytest.param({"set": {1, 2}}, id="yaml-set"),
        pytest.param({"omap": [("a", 1), ("b", 2)]}, id="yaml-omap-pairs"),
        pytest.param([math.nan, math.inf, -math.inf, 1e-7, 1e16, -0.0], id="floats"),
        pytest.param({"n": 2**64, "m": -(2**63) - 1}, id="past-64-bits"),
        pytest.param({"é": "ü", "\U0001d518": "\U0001f600"}, id="non-ascii-keys-and-values"),
        pytest.param({"": [], "a": {}, "b": [[], {}]}, id="empty"),
        pytest.param(None, id="null-document"),
        pytest.param(1.5, id="top-level-float"),
        pytest.param({"pad": ":" * 70_000, "x": [1.5]}, id="a-long-text-with-a-float"),
        pytest.param({"pad": ":" * 70_000, "x": [math.nan]}, id="a-long-text-with-a-nan"),
        pytest.param({"pad": "1.5" * 30_000, "x": None}, id="a-long-text-of-float-lookalikes"),
    ],
)
def test_values_yaml_and_json_make_are_written_as_before(value: object) -> None:
    assert outcome(canonical_json, value) == outcome(old_bytes, value)


def test_values_nested_past_the_fast_writers_depth_fail_as_before() -> None:
    deep: Any = []
    for _ in range(300):  # past orjson's 255 levels, within the interpreter's recursion limit
        deep = [deep]
    assert outcome(canonical_json, deep) == outcome(old_bytes, deep)


def test_a_record_signed_with_the_old_canonical_form_still_verifies() -> None:
    """A v2 record's MAC computed the way earlier versions did (over the stdlib text)."""
    import hashlib
    import hmac

    from webhook.core.tenancy.record_keys import key_id
    from webhook.core.tenancy.records import record_annotation, sign

    keys = RecordKeys(b"old-version-key-0123456789abcdef")
    app = ("VMInstance", "tenant-é", "vm")
    values = values_digest({"instanceType": "u1.medium", "note": "ünïcode", "ratio": 1e-7})
    head = ["v2", key_id(keys.current), "", {}, False, *app]
    old_message = _OLD.encode([*head, values, {"cpu": "1"}, "c", {}, {}, None, ""])
    old_mac = "hmac-sha256:" + hmac.new(keys.current, old_message.encode(), "sha256").hexdigest()
    record = sign(keys, app, values, {"cpu": parse_recorded_q("1")}, "c")
    assert record.mac == old_mac
    parsed = parse_recorded_charge(record_annotation(record))
    assert parsed is not None
    assert verifies(keys, app, values, parsed)
    assert canonical_sha256({"a": 1}) == hashlib.sha256(b'{"a":1}').digest()
    assert mac(keys.current, app, values, {}, "c") != old_mac


def parse_recorded_q(text: str) -> Any:
    from webhook.core.base.quantities import parse_quantity

    return parse_quantity(text)


# -- reading a record back: orjson where it reads as json.loads does ---------------------------


def read_both(text: str) -> tuple[object, object]:
    new = parse_recorded_charge(text)
    # What every earlier version read the annotation with.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("webhook.core.tenancy.records._loads", json.loads)
        old = parse_recorded_charge(text)
    return new, old


numbers = (
    st.integers(min_value=-(2**70), max_value=2**70).map(str)
    | st.floats(allow_nan=False).map(repr)
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-0", "1E2", "0.5", "2e-9"])
)
quantity = numbers | st.sampled_from(['"1"', '"2Gi"', '"500m"', '"-1"', '"x"', "true", "null"])
quantity_map = st.dictionaries(
    st.sampled_from(["cpu", "memory", "storage"]), quantity, max_size=3
).map(lambda m: "{" + ",".join(f'"{k}":{v}' for k, v in m.items()) + "}")
record_texts = st.builds(
    lambda charge, factor, marks, extra, digest: (
        '{"charge":'
        + charge
        + ',"digest":'
        + digest
        + ',"factor":'
        + factor
        + ',"marks":'
        + marks
        + extra
        + ',"values":"sha256:v","kid":"k","mac":"hmac-sha256:x"}'
    ),
    quantity_map,
    quantity_map,
    quantity_map,
    st.sampled_from(["", ',"dry":true', ',"dry":1', ',"uid":"\\ud800"', ',"own":{"cpu":1.5}']),
    st.sampled_from(['"d"', "1", '"\\u00e9"', '"\\ud800"']),
)


@settings(max_examples=1500, deadline=None)
@given(record_texts | st.text(max_size=40))
def test_a_record_is_read_back_as_the_standard_library_reads_it(text: str) -> None:
    new, old = read_both(text)
    assert new == old
