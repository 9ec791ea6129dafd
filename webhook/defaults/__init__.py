"""The defaults the project ships: a reservation contract per Cozystack kind, and the preset table.

``contracts/<definition>.yaml`` holds one ``ReservationContract`` document per shipped
ApplicationDefinition; ``resource-presets.yaml`` is Cozystack's cozy-lib preset table (see its
header for provenance). A cluster may replace either: ``spec.reservation`` on an
ApplicationDefinition or a ``ReservationContract`` object for a contract, a ConfigMap named
``reservation-resource-presets`` for the table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

import yaml

from webhook.core.catalog import Preset, presets_from_table
from webhook.core.contracts import Contract
from webhook.core.platform import contracts_from_documents

__all__ = ["contract_documents", "default_contracts", "default_presets"]


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
