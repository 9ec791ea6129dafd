"""Validating objects against a CustomResourceDefinition's own schema, offline.

The API server prunes what a structural schema does not list, so an unknown field is not an
error there but silently lost. Here the schema is closed (``additionalProperties: false``
wherever it lists properties, except where it preserves unknown fields) so such a field fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import jsonschema
import yaml

CRDS: Final = Path(__file__).resolve().parents[1] / "fixtures" / "crds"


def crd_schema(file: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of ``version`` in the vendored CRD ``file`` (fixtures/crds)."""
    crd = yaml.safe_load((CRDS / file).read_text())
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            found: dict[str, Any] = closed(served["schema"]["openAPIV3Schema"])
            return found
    raise KeyError(f"{file} serves no version {version}")


def closed(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: closed(v) for k, v in node.items()}
        preserved = node.get("x-kubernetes-preserve-unknown-fields") is True
        if "properties" in node and "additionalProperties" not in node and not preserved:
            node["additionalProperties"] = False
        pattern = node.get("pattern")
        if isinstance(pattern, str) and pattern.startswith("^(?i)"):
            # Go's RE2 takes an inline flag anywhere; Python's re only at the start.
            node["pattern"] = "(?i)^" + pattern[len("^(?i)") :]
        return node
    if isinstance(node, list):
        return [closed(v) for v in node]
    return node


def check(obj: dict[str, Any], schema: dict[str, Any]) -> None:
    """Raise AssertionError naming the object and the path of the first error."""
    try:
        jsonschema.validate(obj, schema)
    except jsonschema.ValidationError as error:
        where = ".".join(str(p) for p in error.absolute_path)
        name = (obj.get("metadata") or {}).get("name")
        raise AssertionError(f"{obj.get('kind')}/{name}: {where}: {error.message}") from None
