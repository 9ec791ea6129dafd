"""The JSON codec, as the admission endpoints use it: orjson's speed, the stdlib's values."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import review, state
from webhook.admission.admit import Admission
from webhook.core.admission.decisions import Policy
from webhook.core.base import json_codec as codec
from webhook.core.base.json_codec import (
    decode_json,
    encode_json,
    json_values_at_most,
    json_values_beyond,
    may_hold_long_integers,
)
from webhook.core.pricing.bounds import entries
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.core.tenancy.records import parse_recorded_charge
from webhook.http.app import admission_key, create_app
from webhook.settings import Settings

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]

# Every JSON value, with what orjson and the stdlib could disagree on: integers past 64 bits,
# floats of every magnitude, any unicode (lone surrogates included), nesting, empties.
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**62, max_value=2**80)
    | st.integers(min_value=-(2**80), max_value=-(2**62))
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.text(alphabet=st.characters(codec="utf-8"))
    | st.sampled_from(["\ud800", "a\udfffb", "\x7f", "\u2028", "ü", "0" * 40])
)
JSON_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def same(a: object, b: object) -> bool:
    """Equal values of equal types all the way down (``1 == 1.0`` is not the same value)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


@settings(max_examples=400)
@given(JSON_VALUES, st.sampled_from([None, 1, 2]), st.booleans())
def test_a_body_decodes_to_the_values_the_stdlib_gives(
    value: object, indent: int | None, ascii_only: bool
) -> None:
    raw = json.dumps(value, indent=indent, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert same(decode_json(raw), json.loads(raw))


@settings(max_examples=300)
@given(st.binary(max_size=64) | st.text(alphabet='0123456789-+.eE:,[]{} "\\u', max_size=40))
def test_any_bytes_decode_or_fail_as_with_the_stdlib(raw: bytes | str) -> None:
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        expected: object = json.loads(data)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)):
            decode_json(data)
        return
    assert same(decode_json(data), expected)


@settings(max_examples=300)
@given(st.integers(min_value=-(10**30), max_value=10**30), st.sampled_from(["", " ", "\n\t ", "-"]))
def test_every_integer_token_of_19_digits_or_more_is_seen(number: int, space: str) -> None:
    for raw in (
        f'{{"a":{space}{number}}}',
        f"[1,{space}{number}]",
        f"[{space}{number}]",
        f"{space}{number}",
    ):
        if len(str(abs(number))) >= 19:
            assert may_hold_long_integers(raw.encode())


def test_an_integer_past_64_bits_in_a_spec_is_not_decoded_as_a_rounded_float() -> None:
    raw = b'{"spec":{"replicas":18446744073709551617,"floor":-9223372036854775809}}'
    assert orjson.loads(raw)["spec"]["replicas"] == 18446744073709551616.0  # what orjson gives
    decoded = decode_json(raw)
    assert isinstance(decoded, dict)
    assert decoded["spec"] == {"replicas": 18446744073709551617, "floor": -9223372036854775809}


def test_bodies_orjson_refuses_are_the_stdlibs_to_decode_or_refuse() -> None:
    nan = decode_json(b'{"a": NaN}')
    assert isinstance(nan, dict)
    assert math.isnan(nan["a"])  # as before
    assert decode_json(b'{"a": "\\ud800"}') == {"a": "\ud800"}
    assert decode_json("\ufeff{}".encode()) == {}  # a UTF-8 byte order mark
    assert decode_json('{"a": 1}'.encode("utf-16")) == {"a": 1}
    with pytest.raises(RecursionError):
        decode_json(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ValueError, match="Expecting"):
        decode_json(b"{nope")


@settings(max_examples=400)
@given(JSON_VALUES)
def test_an_answer_means_what_the_stdlibs_encoding_means(value: object) -> None:
    encoded = encode_json(value)
    assert same(json.loads(encoded), json.loads(json.dumps(value)))


def test_an_answer_is_utf_8_with_non_ascii_strings_written_as_they_are() -> None:
    assert encode_json({"message": "Mandant ü"}) == '{"message":"Mandant ü"}'.encode()
    assert encode_json({"message": "\ud800"}) == b'{"message":"\\ud800"}'
    deep: list[Any] = []
    for _ in range(300):  # past orjson's 254 levels: the stdlib's to encode
        deep = [deep]
    assert encode_json(deep) == json.dumps(deep, separators=(",", ":")).encode()


VM = {"instanceType": "u1.micro"}


@pytest.fixture
async def client(aiohttp_client: MakeClient) -> Client:
    admission = Admission(state({"tenant-acme": {"memory": "2Gi"}}), Policy())
    return await aiohttp_client(create_app(admission, Settings()))


async def test_a_lone_surrogate_in_an_instance_type_is_a_denial_that_names_it_not_a_500(
    client: Client,
) -> None:
    body = review("VMInstance", "tenant-acme", "vm", {"instanceType": "ü1.micro\ud800"})
    raw = json.dumps(body).encode()
    response = await client.post(
        "/validate", data=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    answer = json.loads(await response.read())["response"]
    assert answer["uid"] == "uid-1"
    assert answer["allowed"] is False
    assert '"ü1.micro\ud800"' in answer["status"]["message"]


async def test_an_integer_past_64_bits_is_signed_for_the_values_the_cluster_stores(
    client: Client,
) -> None:
    spec = {**VM, "extra": 18446744073709551617}
    raw = json.dumps(review("VMInstance", "tenant-acme", "vm", spec)).encode()
    response = await client.post("/mutate", data=raw, headers={"Content-Type": "application/json"})
    (operation,) = json.loads(base64.b64decode((await response.json())["response"]["patch"]))
    record = parse_recorded_charge(operation["value"][CHARGE_ANNOTATION])
    assert record is not None
    admission = client.app[admission_key]
    stored: Any = json.loads(raw)["request"]["object"]["spec"]  # as the informers decode it
    assert record.values == admission.state.values_digest("VMInstance", stored)
    rounded = {**VM, "extra": float(18446744073709551617)}
    assert record.values != admission.state.values_digest("VMInstance", rounded)


def test_the_shape_table_maps_only_digits_to_zeros() -> None:
    zeros = [c for c in range(256) if codec._SHAPE[c] == ord("0")]
    assert zeros == list(range(ord("0"), ord("9") + 1))


@pytest.mark.parametrize("depth", [900, 1000, 1023, 1024, 1025, 1100, 5000])
def test_nesting_up_to_1024_levels_decodes_and_deeper_is_the_stdlibs_to_refuse(depth: int) -> None:
    # The stdlib's own limit is the interpreter's stack: a body between some 950 levels (less
    # the caller's frames) and 1024 used to be refused, and is now decoded and decided.
    raw = b'{"a":' * depth + b"1" + b"}" * depth
    if depth <= 1024:
        value = decode_json(raw)
        for _ in range(depth):
            assert isinstance(value, dict)
            value = value["a"]
        assert value == 1
        return
    try:
        expected: object = json.loads(raw)
    except RecursionError:
        with pytest.raises(RecursionError):
            decode_json(raw)
        return
    assert decode_json(raw) == expected


async def test_an_object_nested_1015_levels_outside_its_values_is_decided_not_refused(
    client: Client,
) -> None:
    body = review("VMInstance", "tenant-acme", "vm", VM)
    body["request"]["object"]["status"] = "deep"
    deep = '{"x":' * 1015 + "1" + "}" * 1015
    raw = json.dumps(body).replace('"deep"', deep).encode()
    response = await client.post(
        "/validate", data=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status == 200
    answer = json.loads(await response.read())["response"]
    assert answer["allowed"] is True
    assert answer["auditAnnotations"]["reason"] == "fits"


@settings(max_examples=500)
@given(
    st.integers(min_value=0, max_value=10**18),
    st.text(alphabet="0123456789", min_size=1, max_size=40),
    st.sampled_from(["", "e", "E-", "e+"]),
    st.integers(min_value=0, max_value=330),
)
def test_a_float_written_with_many_digits_decodes_to_the_stdlibs_float(
    whole: int, fraction: str, exponent: str, power: int
) -> None:
    text = f"{whole}.{fraction}{exponent}{power if exponent else ''}"
    raw = f'{{"a":[{text},-{text}]}}'.encode()
    assert same(decode_json(raw), json.loads(raw))


@pytest.mark.parametrize("depth", [990, 1000, 1020])
def test_a_long_integer_beside_an_object_nested_1000_levels_decodes_exactly(depth: int) -> None:
    # One tenant's integer of 20 digits sends a whole list page to the stdlib; another
    # object on it, nested as deep as orjson reads, must not make it raise RecursionError
    # (the reflector listing it would stop, and with it every tenant's admissions).
    deep = b'{"x":' * depth + b"1" + b"}" * depth
    raw = b'{"items":[{"spec":{"n":123456789012345678901}},{"spec":' + deep + b"}]}"
    items = decode_json(raw)["items"]
    assert items[0]["spec"]["n"] == 123456789012345678901
    value = items[1]["spec"]
    for _ in range(depth):
        value = value["x"]
    assert value == 1


@given(JSON_VALUES, st.sampled_from([None, 1, 2]))
def test_the_values_counted_before_decoding_are_never_fewer_than_decoded(
    value: object, indent: int | None
) -> None:
    raw = json.dumps(value, indent=indent).encode()
    assert json_values_at_most(raw) >= entries(decode_json(raw))


def _blanked(value: object) -> object:
    """``value`` with every string emptied and every key made a number: its shape alone."""
    if isinstance(value, dict):
        return {str(index): _blanked(child) for index, child in enumerate(value.values())}
    if isinstance(value, list):
        return [_blanked(child) for child in value]
    return "" if isinstance(value, str) else value


TEXT_WITH_PUNCTUATION = st.text(alphabet=',[]{}"\\:x ', max_size=12)
PUNCTUATED_VALUES = st.recursive(
    st.none() | st.integers() | TEXT_WITH_PUNCTUATION,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(TEXT_WITH_PUNCTUATION, inner, max_size=5)
    ),
    max_leaves=30,
)


@given(JSON_VALUES | PUNCTUATED_VALUES, st.integers(min_value=0, max_value=40))
def test_a_body_holding_more_values_than_the_bound_is_never_counted_within_it(
    value: object, bound: int
) -> None:
    raw = json.dumps(value).encode()
    if entries(value) > bound:
        assert json_values_beyond(raw, bound) is not None


@given(PUNCTUATED_VALUES, st.integers(min_value=0, max_value=40), st.sampled_from([None, 1]))
def test_commas_and_brackets_inside_strings_never_count_against_the_bound(
    value: object, bound: int, indent: int | None
) -> None:
    raw = json.dumps(value, indent=indent).encode()
    shape = json.dumps(_blanked(value), indent=indent).encode()
    assert (json_values_beyond(raw, bound) is None) == (json_values_at_most(shape) <= bound)


def test_a_cloud_init_holding_a_json_file_counts_as_one_value() -> None:
    content = json.dumps({f"key{i}": [i, i] for i in range(50_000)})  # 100,000 commas
    raw = json.dumps({"spec": {"cloudInit": content}}).encode()
    assert json_values_at_most(raw) > 150_000
    assert json_values_beyond(raw, 10) is None
