"""What every command shares: one-line errors, documented exit codes, closed pipes, progress.

``webhook`` and ``kubectl reservation`` run every subcommand through :func:`run`, so a command
registered with ``set_defaults(handler=...)`` gets the same behaviour without doing anything:
bad input ends in one line on stderr naming the thing and the fix, and exit status 2; a reader
that closes the pipe early (``| head``) ends the output quietly, as kubectl does; an unexpected
exception is one line too (``WEBHOOK_DEBUG=1`` shows the traceback). Nothing here imports the
heavy modules (aiohttp, the Kubernetes client): a command that reads files starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

__all__ = [
    "EXIT_CODES",
    "EXIT_FOUND",
    "EXIT_INPUT",
    "EXIT_INTERNAL",
    "EXIT_PIPE",
    "CommandError",
    "Parser",
    "VersionAction",
    "add_fail_on",
    "add_output",
    "load_state_showing_progress",
    "run",
]

EXIT_OK: Final = 0
EXIT_FOUND: Final = 1
EXIT_INPUT: Final = 2
EXIT_INTERNAL: Final = 3
EXIT_INTERRUPTED: Final = 130
EXIT_PIPE: Final = 141  # 128 + SIGPIPE: what a shell shows for kubectl cut off by `| head`

EXIT_CODES: Final = """exit status:
  0    done
  1    --fail-on found what it was asked about
  2    bad input or usage; one line on stderr names what and how to fix it
  3    internal error (WEBHOOK_DEBUG=1 prints the traceback)
  130  interrupted (Ctrl-C)
  141  the reader closed the pipe (as `| head` does); output stops quietly
"""


class CommandError(Exception):
    """Bad input to a command: the message is printed as is, after the command's name."""


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line that say where to look."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def run(prog: str, handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run one command's handler with the shared error handling; returns the exit status."""
    try:
        status = handler(args)
        sys.stdout.flush()  # a closed pipe shows here when the output was still buffered
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:
        _flush_logs()
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        _flush_logs()  # log lines still batched go first: the reason is the last line
        reason = _input_error(exc)
        if reason is None:
            if os.environ.get("WEBHOOK_DEBUG"):
                traceback.print_exc()
            reason = f"internal error: {type(exc).__name__}: {_one_line(str(exc))}"
            print(f"{prog}: {reason} (WEBHOOK_DEBUG=1 shows where)", file=sys.stderr)
            return EXIT_INTERNAL
        print(f"{prog}: {reason}", file=sys.stderr)
        return EXIT_INPUT


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # a broken log stream must not hide the error
            handler.flush()


def _input_error(exc: Exception) -> str | None:
    """The one-line reason when ``exc`` is bad input (not a bug), else ``None``."""
    from webhook.core.base.errors import ReservationError
    from webhook.kube.config import KubeConfigError
    from webhook.settings import SettingsError

    if isinstance(exc, CommandError | ReservationError | SettingsError | KubeConfigError):
        return _one_line(str(exc))
    if isinstance(exc, OSError):
        if exc.filename:
            return f"{exc.filename}: {exc.strerror or exc}"
        return _one_line(str(exc))
    # Loaded only by the commands that use them; never imported just to be checked.
    certificates = sys.modules.get("webhook.tls.certificates")
    if certificates is not None and isinstance(exc, certificates.CertificateError):
        return _one_line(str(exc))
    client = sys.modules.get("webhook.kube.client")
    if client is not None and isinstance(exc, client.ApiError):
        return _one_line(str(exc))
    return None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (captured output in tests)
        pass


def add_output(
    parser: argparse.ArgumentParser, choices: Sequence[str], *, default: str | None
) -> None:
    """``-o/--output``, kubectl's spelling; ``--json`` stays as a shorthand for ``-o json``."""
    parser.add_argument(
        "-o",
        "--output",
        choices=choices,
        default=default,
        help=f"output format: {'|'.join(choices)}" + (f" (default {default})" if default else ""),
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", help="the same as -o json"
    )


def fail_on(text: str) -> list[str]:
    """``--fail-on unknown,drift``: argparse type with a did-you-mean for each word."""
    from webhook.admission.report import FAIL_ON
    from webhook.core.base.spelling import did_you_mean

    words = [w.strip() for w in text.split(",") if w.strip()]
    for word in words:
        if word not in FAIL_ON:
            raise argparse.ArgumentTypeError(
                f"{word!r} is not one of {','.join(FAIL_ON)}{did_you_mean(word, FAIL_ON)}"
            )
    return words


def add_fail_on(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-on",
        type=fail_on,
        default=[],
        metavar="unknown,drift,overcommitted",
        help="exit 1 when the report finds any of these (for CI and cron)",
    )


class VersionAction(argparse.Action):
    """``--version``: the package, the digest of what it ships as data, the platform's source.

    Computed only when asked (the digest reads the shipped files).
    """

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from webhook import __version__
        from webhook.defaults import PLATFORM_SOURCE, defaults_digest

        print(
            f"{parser.prog} {__version__} (contracts, presets and platform digest "
            f"{defaults_digest()}; bundled platform {PLATFORM_SOURCE})"
        )
        parser.exit(0)


def load_state_showing_progress(
    paths: Sequence[str], *, quotas: Any = None, keys: Any = None
) -> Any:
    """``load_state`` with a running count on a terminal (tqdm), silent on a pipe or file."""
    from webhook.state.manifests import load_state

    if not sys.stderr.isatty():
        return load_state(paths, quotas=quotas, keys=keys)
    from tqdm import tqdm

    with tqdm(desc="reading manifests", unit=" files", file=sys.stderr, leave=False) as bar:

        def advance(files: int, total: int, manifests: int) -> None:
            bar.total = total
            bar.n = files
            bar.set_postfix(manifests=manifests, refresh=False)
            bar.refresh()

        return load_state(paths, quotas=quotas, keys=keys, progress=advance)
