"""``webhook contract-schema``: the JSON Schema a reservation contract is checked against.

For editors and CI that validate contracts before they reach the webhook; it prints the schema
the loader itself applies, so the two cannot disagree.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``contract-schema`` to the ``webhook`` command line."""
    schema = commands.add_parser("contract-schema", help="print the contract JSON Schema")
    schema.set_defaults(handler=_contract_schema)


def _contract_schema(args: argparse.Namespace) -> int:
    from webhook.core.pricing.contract_schema import CONTRACT_SCHEMA

    print(json.dumps(CONTRACT_SCHEMA, indent=2))
    return 0
