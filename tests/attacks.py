"""The API server as the attacks meet it: the shipped webhook configurations, then a store.

Each write is an AdmissionReview built the way the API server builds it (on UPDATE the old
object is the stored one, with its uid and annotations; on CREATE the object has no uid yet, as
behind cozystack-api), offered to each webhook only when the shipped ``matchConditions`` of
``deploy/base/webhooks.yaml`` say so (evaluated with the ``cel`` package), ``/mutate`` first and
its patch applied, then ``/validate``; what is allowed is stored. Two backends: a webhook server
on a manifest state (TLS), and replicas on the emulated API server (the object is stored there,
and the replica's state follows its watch).
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import aiohttp
import cel
import yaml

from tests.builders import ADMIN, ROOT
from tests.waiting import eventually
from webhook.core.tenancy.applications import CHARGE_ANNOTATION
from webhook.core.tenancy.records import parse_recorded_charge

Obj = dict[str, Any]
Key = tuple[str, str, str]
REMOVE = object()  # an annotation value meaning "remove this annotation"
PLURALS = {"VMInstance": "vminstances", "VMDisk": "vmdisks", "Postgres": "postgreses"}


@cache
def shipped_webhooks() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(configuration kind, its matchCondition expressions) as shipped."""
    found = []
    for document in yaml.safe_load_all((ROOT / "deploy/base/webhooks.yaml").read_text()):
        for webhook in document["webhooks"]:
            expressions = tuple(c["expression"] for c in webhook.get("matchConditions", []))
            found.append((document["kind"], expressions))
    return tuple(found)


def offered(request: Mapping[str, Any]) -> dict[str, bool]:
    """Which webhooks the API server calls for ``request``, by the shipped matchConditions."""
    variables = {
        "request": {"operation": request["operation"], "dryRun": request["dryRun"]},
        "object": request["object"],
        "oldObject": request["oldObject"],
    }
    return {
        kind: all(cel.evaluate(expression, variables) for expression in expressions)
        for kind, expressions in shipped_webhooks()
    }


def patched(obj: Obj, response: Mapping[str, Any]) -> Obj:
    """``obj`` with the mutating webhook's JSONPatch applied (adds and removes)."""
    if "patch" not in response:
        return obj
    result = copy.deepcopy(obj)
    for operation in json.loads(base64.b64decode(response["patch"])):
        parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        target = result
        for part in parts[:-1]:
            target = target[part]
        if operation["op"] == "remove":
            del target[parts[-1]]
        else:
            target[parts[-1]] = operation["value"]
    return result


@dataclass(frozen=True)
class Minted:
    text: str
    dry: bool


@dataclass
class Answer:
    allowed: bool
    validated: Mapping[str, Any] | None  # the validating webhook's response, when called
    mutated: Mapping[str, Any] | None
    stored: Obj | None = None

    @property
    def reason(self) -> str:
        status = (self.validated or self.mutated or {}).get("status") or {}
        return str(status.get("message", ""))

    def record(self) -> Minted | None:
        """The charge record the mutating webhook's patch sets, if it sets one."""
        if self.mutated is None or "patch" not in self.mutated:
            return None
        for operation in json.loads(base64.b64decode(self.mutated["patch"])):
            value = operation.get("value")
            if isinstance(value, Mapping):
                value = value.get(CHARGE_ANNOTATION)
            if (
                operation["op"] == "add"
                and operation["path"].endswith(("charge", "annotations"))
                and isinstance(value, str)
            ):
                parsed = parse_recorded_charge(value)
                if parsed is not None:
                    return Minted(value, parsed.dry)
        return None

    @property
    def warnings(self) -> list[str]:
        return list((self.validated or {}).get("warnings") or [])


Post = Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]


@dataclass
class ApiServer:
    """Builds requests, offers them to the webhooks, stores what they allow."""

    post: Post  # (path, AdmissionReview) -> AdmissionResponse
    store: Callable[[Key, Obj | None], Awaitable[Obj | None]]  # stores (None: deletes)
    objects: dict[Key, Obj] = field(default_factory=dict)
    uids: int = 0

    async def write(
        self,
        kind: str,
        namespace: str,
        name: str,
        spec: Any,
        *,
        annotations: Mapping[str, object] | None = None,
        who: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> Answer:
        """CREATE (or UPDATE when stored) ``spec``; the stored annotations are carried (what
        an edit of the stored object sends) unless ``annotations`` changes them."""
        key = (kind, namespace, name)
        old = self.objects.get(key)
        obj: Obj = copy.deepcopy(old) if old is not None else _body(kind, namespace, name)
        obj["spec"] = copy.deepcopy(spec)
        notes = dict(obj["metadata"].get("annotations") or {})
        for note, value in (annotations or {}).items():
            if value is REMOVE:
                notes.pop(note, None)
            else:
                notes[note] = value
        obj["metadata"]["annotations"] = notes
        user = who or {"user": "alice", "groups": ["system:authenticated"]}
        request: dict[str, Any] = {
            "uid": f"req-{len(self.objects)}-{name}",
            "kind": {"group": "apps.cozystack.io", "version": "v1alpha1", "kind": kind},
            "resource": {
                "group": "apps.cozystack.io",
                "version": "v1alpha1",
                "resource": PLURALS.get(kind, kind.lower() + "s"),
            },
            "namespace": namespace,
            "name": name,
            "operation": "UPDATE" if old is not None else "CREATE",
            "userInfo": {"username": user["user"], "groups": user["groups"]},
            "dryRun": dry_run,
            "object": obj,
            "oldObject": copy.deepcopy(old),
        }
        calls = offered(request)
        mutated = validated = None
        if calls["MutatingWebhookConfiguration"]:
            mutated = await self.post("/mutate", _review(request))
            if not mutated["allowed"]:  # the API server refuses it: no validation, nothing stored
                return Answer(False, None, mutated)
            request["object"] = patched(request["object"], mutated)
        if calls["ValidatingWebhookConfiguration"]:
            validated = await self.post("/validate", _review(request))
            if not validated["allowed"]:
                return Answer(False, validated, mutated)
        if dry_run:
            return Answer(True, validated, mutated)
        stored = await self.store(key, request["object"])
        assert stored is not None
        self.objects[key] = stored
        return Answer(True, validated, mutated, stored)

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        await self.store((kind, namespace, name), None)
        self.objects.pop((kind, namespace, name), None)

    async def plant(
        self, kind: str, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None:
        """Store annotations with no webhook in the way (off mode, before install)."""
        key = (kind, namespace, name)
        obj = copy.deepcopy(self.objects[key])
        obj["metadata"]["annotations"] = {
            **(obj["metadata"].get("annotations") or {}),
            **annotations,
        }
        stored = await self.store(key, obj)
        assert stored is not None
        self.objects[key] = stored

    def annotation(self, kind: str, namespace: str, name: str, note: str) -> str | None:
        obj = self.objects.get((kind, namespace, name)) or {}
        value = (obj.get("metadata", {}).get("annotations") or {}).get(note)
        return value if isinstance(value, str) else None


def _body(kind: str, namespace: str, name: str) -> Obj:
    return {
        "apiVersion": "apps.cozystack.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
    }


def _review(request: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def tls_post(
    port_of: Callable[[str], int], certs: Path
) -> tuple[Post, Callable[[], Awaitable[None]]]:
    """A poster to the webhook over TLS (``port_of(path)`` picks the replica), and its closer."""
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))

    async def post(path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        async with session.post(f"https://localhost:{port_of(path)}{path}", json=body) as r:
            assert r.status == 200, await r.text()
            answer: Mapping[str, Any] = (await r.json())["response"]
            return answer

    return post, session.close


__all__ = ["ADMIN", "REMOVE", "Answer", "ApiServer", "eventually", "offered", "patched", "tls_post"]
