"""The defaults the project ships: a reservation contract per Cozystack kind, and the preset table.

``contracts/<definition>.yaml`` holds one ``ReservationContract`` document per shipped
ApplicationDefinition; ``resource-presets.yaml`` is Cozystack's cozy-lib preset table (see its
header for provenance). A cluster may replace either: ``spec.reservation`` on an
ApplicationDefinition or a ``ReservationContract`` object for a contract, a ConfigMap named
``reservation-resource-presets`` for the table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from webhook.core.pricing.catalog import Preset, presets_from_table
from webhook.core.pricing.contracts import Contract
from webhook.core.pricing.platform import contracts_from_documents

__all__ = [
    "PLATFORM_SOURCE",
    "contract_documents",
    "default_contracts",
    "default_presets",
    "defaults_digest",
    "platform_dir",
]

# Where ``platform/`` was copied from (its PROVENANCE.md says file by file); ``--version``
# prints it. The same files are ``fixtures/cozystack``, and a test keeps the two identical.
PLATFORM_SOURCE: Final = "cozystack/cozystack@3c780acd417f"


def contract_documents() -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The shipped contract documents with their file names, in file-name order."""
    folder = resources.files(__package__).joinpath("contracts")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            for document in yaml.safe_load_all(entry.read_text(encoding="utf-8")):
                if document is not None:
                    yield f"contracts/{entry.name}", document


@cache
def default_contracts() -> Mapping[str, Contract]:
    """The shipped contracts by application kind (compiled once)."""
    return contracts_from_documents(contract_documents())


@cache
def default_presets() -> Mapping[str, Preset]:
    """Cozystack's preset table, legacy aliases included."""
    text = resources.files(__package__).joinpath("resource-presets.yaml").read_text("utf-8")
    return presets_from_table(yaml.safe_load(text))


def platform_dir() -> Path:
    """The bundled Cozystack platform: ApplicationDefinitions and instance types, as manifests.

    ``webhook evaluate`` uses it when no ``--state`` is given, so an installed package charges
    the shipped kinds without a clone of this repository.
    """
    return Path(str(resources.files(__package__).joinpath("platform")))


@cache
def defaults_digest() -> str:
    """A digest of everything shipped as data (contracts, presets, platform), for ``--version``."""
    digest = hashlib.sha256()
    root = Path(str(resources.files(__package__)))
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".md")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]
