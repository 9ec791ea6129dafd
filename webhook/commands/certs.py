"""``webhook certs generate``: a CA and a serving certificate for the webhook, in a directory.

For a cluster without cert-manager, and for tests: what ``webhook serve --cert-dir`` reads. Its
flags and its handler live here; the cryptography code loads when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from webhook.commands.console import EXIT_CODES, CommandError

__all__ = ["add_parser"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``certs`` and its subcommand to the ``webhook`` command line."""
    certs = commands.add_parser("certs", help="certificates for the webhook")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True, metavar="COMMAND")
    generate = certs_commands.add_parser(
        "generate",
        help="write a CA and a serving certificate (tls.crt, tls.key, ca.crt)",
        epilog=EXIT_CODES,
    )
    generate.add_argument(
        "--out", required=True, metavar="DIR", help="directory (created when missing)"
    )
    generate.add_argument(
        "--dns", action="append", default=[], metavar="NAME", help="a DNS name (repeatable)"
    )
    generate.add_argument(
        "--ip", action="append", default=[], metavar="ADDR", help="an IP address (repeatable)"
    )
    generate.add_argument("--days", type=int, default=365, help="serving certificate lifetime")
    generate.set_defaults(handler=_certs_generate)


def _certs_generate(args: argparse.Namespace) -> int:
    from webhook.tls.certificates import generate

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CommandError(
            f"--out {args.out}: is a file, not a directory; name a directory "
            "(it is created when missing)"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(
            f"--out {args.out}: cannot create the directory: {exc.strerror}; "
            "name a directory you can write"
        ) from None
    bundle = generate(out, dns_names=args.dns, ip_addresses=args.ip, valid_days=args.days)
    print(
        f"wrote {bundle.cert_file}, {bundle.key_file} and {bundle.ca_file} "
        f"(serial {bundle.serial:x}, valid until {bundle.not_after:%Y-%m-%d})"
    )
    return 0
