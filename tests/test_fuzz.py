"""Hostile bodies and values, generated: never allowed for garbage, never an unhandled exception.

Hypothesis builds AdmissionReviews whose fields and values are hostile (quantities past every
bound, nesting, sizes, wrong types, unicode) and feeds them to ``/validate`` and ``/mutate``
over HTTP, to the ``review`` command's decision path and to the command itself, and to the state
loaders. What must hold for every one of them:

- the server answers 200 with the request's uid, or a 4xx for a body that is not a review; never
  a 5xx for input;
- ``allowed: true`` from ``/validate`` only for an object whose values evaluate under its
  contract and whose namespace is the request's (garbage is never admitted);
- the decision path, the state loaders and observing an application never raise anything but
  the documented errors.

Seeds are derandomized, so a failure in CI reproduces locally.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.builders import FIXTURES, platform, review, state
from webhook.admission.admit import Admission, admit
from webhook.commands.cli import main
from webhook.core.admission.decisions import Policy
from webhook.core.admission.reviews import ReviewError
from webhook.core.base.errors import ReservationError
from webhook.core.tenancy.applications import (
    CHARGE_ANNOTATION,
    Application,
    application_from_object,
)
from webhook.http.app import create_app
from webhook.settings import Settings
from webhook.state.manifests import load_state

KINDS = ["VMInstance", "VMDisk", "Kubernetes", "Postgres", "Tenant", "Thing", "Nope"]
FUZZ = settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- hostile values ---------------------------------------------------------------------------

quantity_text = st.from_regex(
    r"[+-]?[0-9]{0,70}(\.[0-9]{0,70})?([eE][+-]?[0-9]{1,5000}|[KMGTPE]i|[numkMGTPE])?",
    fullmatch=True,
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**4000)
    | st.floats()
    | st.text(max_size=40)
    | quantity_text
    | st.sampled_from(["u1.micro", "u9.huge", "t1.micro", "", "\u202e", "\x00", "1e4301"])
)
keys = st.text(max_size=12) | st.sampled_from(
    [
        "instanceType",
        "resources",
        "cpu",
        "memory",
        "storage",
        "nodeGroups",
        "replicas",
        "resourceQuotas",
        "minReplicas",
        "maxReplicas",
        "gpus",
        "name",
        "size",
    ]
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(keys, children, max_size=5),
    max_leaves=25,
)


class Deep:
    """Values nested ``depth`` levels, built only when sent (hypothesis prints the marker)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def __repr__(self) -> str:
        return f"Deep({self.depth})"

    def build(self) -> Any:
        value: Any = {"instanceType": "u1.micro"}
        for _ in range(self.depth):
            value = {"x": value}
        return value


def built(value: Any) -> Any:
    """``value`` with every :class:`Deep` marker replaced by its nesting."""
    if isinstance(value, Deep):
        return value.build()
    if isinstance(value, dict):
        return {k: built(v) for k, v in value.items()}
    if isinstance(value, list):
        return [built(v) for v in value]
    return value


specs = values | st.sampled_from([70, 900, 5000]).map(Deep)


@st.composite
def reviews(draw: st.DrawFn) -> Any:
    """A review that is well formed around a hostile part, or a hostile body outright."""
    kind = draw(st.sampled_from(KINDS))
    operation = draw(st.sampled_from(["CREATE", "UPDATE", "DELETE"]))
    body = review(
        kind,
        "tenant-acme",
        draw(st.sampled_from(["vm", "a", "Ⅻ", "x" * 300])),
        draw(specs),
        operation=operation,
        old_spec=draw(specs) if operation != "CREATE" else None,
        dry_run=draw(st.booleans()),
        annotations=draw(st.none() | st.fixed_dictionaries({CHARGE_ANNOTATION: st.text()})),
    )
    request = body["request"]
    for field in draw(st.lists(st.sampled_from(sorted(request)), max_size=3)):
        request[field] = draw(values)
    if draw(st.integers(0, 9)) == 0:
        return draw(values)  # not a review at all
    return body


def evaluable(body: Any) -> bool:
    """Whether /validate may admit this body: an application whose values evaluate."""
    request = body["request"]
    obj = request.get("object")
    if not isinstance(obj, dict) or request.get("operation") not in ("CREATE", "UPDATE"):
        return True  # DELETE and CONNECT need no reservation
    try:
        platform().charge(request["kind"]["kind"], obj.get("spec"), namespace="tenant-acme")
    except Exception:
        return False
    return True


# -- the HTTP server --------------------------------------------------------------------------


class Server:
    """One application on a private loop, posted to synchronously from hypothesis examples."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        current = state({"tenant-acme": {"memory": "16Gi"}})
        app = create_app(Admission(current, Policy()), Settings())
        self.client: TestClient[Any, Any] = TestClient(TestServer(app), loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())

    def post(self, path: str, data: bytes) -> tuple[int, str]:
        async def send() -> tuple[int, str]:
            response = await self.client.post(
                path, data=data, headers={"Content-Type": "application/json"}
            )
            return response.status, await response.text()

        return self.loop.run_until_complete(send())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
@FUZZ
@given(body=reviews())
def test_hostile_reviews_get_a_4xx_or_a_well_formed_answer_never_a_5xx(
    server: Server, path: str, body: Any
) -> None:
    body = built(body)
    try:
        data = json.dumps(body).encode()
    except (ValueError, RecursionError):  # what JSON cannot carry: send a hostile text instead
        data = b"[" * 100_000
    status, text = server.post(path, data)
    assert status < 500, text
    if status != 200:
        assert 400 <= status < 500
        return
    answer = json.loads(text)["response"]
    assert answer["uid"] == body["request"]["uid"]  # 200 only for a review: it has a uid
    if (
        path == "/validate"
        and answer["allowed"]
        and answer.get("auditAnnotations", {}).get("decision") not in ("skipped", None)
    ):
        assert evaluable(body), answer


def _deep_update() -> dict[str, Any]:
    """An UPDATE whose old and new specs both nest past what Python compares recursively."""
    body = review("VMInstance", "tenant-acme", "vm", {}, operation="UPDATE", old_spec={})
    body["request"]["object"]["spec"] = Deep(5000)
    body["request"]["oldObject"]["spec"] = Deep(5000)
    return body


@FUZZ
@given(body=reviews())
@example(body=_deep_update())
def test_the_review_path_decides_or_refuses_hostile_reviews_never_raises(body: Any) -> None:
    body = built(body)
    current = state({"tenant-acme": {"memory": "16Gi"}})
    try:
        outcome = admit(body, current, Policy())
    except ReviewError:
        return
    assert outcome.decision.reason != "internal-error", outcome.decision.message
    if outcome.decision.allowed and outcome.decision.outcome == "allowed":
        assert evaluable(body)


@settings(FUZZ, max_examples=15)
@given(body=reviews())
def test_the_review_command_answers_or_exits_2_never_a_traceback(
    tmp_path_factory: pytest.TempPathFactory, body: Any
) -> None:
    path = tmp_path_factory.mktemp("review") / "body.json"
    try:
        path.write_text(json.dumps(built(body)))
    except (ValueError, RecursionError):
        path.write_text("[" * 100_000)
    status = main(
        [
            "review",
            "--state",
            str(FIXTURES / "cozystack"),
            "--state",
            str(FIXTURES / "tenants"),
            str(path),
        ]
    )
    assert status in (0, 2)


@FUZZ
@given(kind=st.sampled_from(KINDS), spec=specs, annotation=st.none() | st.text() | values)
def test_observing_a_hostile_application_never_raises(
    kind: str, spec: Any, annotation: Any
) -> None:
    current = state({"tenant-acme": {"memory": "16Gi"}})
    obj = {
        "kind": kind,
        "metadata": {
            "name": "x",
            "namespace": "tenant-acme",
            "annotations": {CHARGE_ANNOTATION: annotation},
        },
        "spec": built(spec),
    }

    app = application_from_object(obj)
    current.observe(app)
    assert current.record(app.key) is not None or app.key in current.unknown()
    current.observe(Application(kind, "tenant-acme", "x", {"storage": "1Gi"}))
    current.forget(app.key)


@settings(FUZZ, max_examples=60)
@given(document=values, text=st.text(max_size=200))
def test_the_state_loaders_load_or_name_the_problem_never_raise_otherwise(
    tmp_path_factory: pytest.TempPathFactory, document: Any, text: str
) -> None:
    directory = tmp_path_factory.mktemp("state")
    manifest = {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": "VMDisk",
        "metadata": {"name": "d", "namespace": "tenant-acme"},
        "spec": document,
    }
    try:
        (directory / "a.json").write_text(json.dumps(manifest))
    except ValueError:
        (directory / "a.json").write_text("{" * 50_000)
    (directory / "b.yaml").write_text(text)
    with contextlib.suppress(ReservationError):  # a named problem is a fine answer
        load_state([Path(FIXTURES / "cozystack"), directory])
