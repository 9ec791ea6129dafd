"""Reading audit events from every shape the API server writes them in, streaming.

Sources: JSON-lines files (the log backend), rotated ones (given in any order: files are read
in the order of their first event), gzip-compressed ones (recognised by their magic bytes, not
their name), standard input (``-``), and ``EventList`` batches as an audit *webhook* backend
receives them (one per line, or pretty-printed documents).

Speed: a line is first checked to look like one JSON object, then for the group's name as a
plain substring; only lines that could be an ``apps.cozystack.io`` event are decoded. In a
real cluster that skips about 95% of the lines without parsing them. Memory stays constant:
one line at a time.

A line that is not one JSON object (garbage, or the truncated last line of a file being
written) is counted and reported with its source and line number, never fatal.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final, cast

import orjson

__all__ = ["EventReader", "Malformed"]

GROUP_MARKER: Final = b"apps.cozystack.io"
# How the API server writes an application's objectRef (compact JSON), or a re-encoder with
# spaces: a line naming the group elsewhere only (an RBAC rule, a CRD) is not decoded.
_APPS_EXACT: Final = b'"apiGroup":"apps.cozystack.io"'
_APPS_SPACED: Final = b'"apiGroup": "apps.cozystack.io"'
GZIP_MAGIC: Final = b"\x1f\x8b"
PROGRESS_MIN_BYTES: Final = 8 * 1024 * 1024  # a progress bar for files over a few megabytes
MALFORMED_KEPT: Final = 1000  # line numbers reported; the count stays exact
_STAMP = re.compile(rb'"stageTimestamp":\s*"([^"]+)"')


class ReadError(Exception):
    """A source cannot be read at all (missing, unreadable): bad input to the command."""


@dataclass(frozen=True, slots=True)
class Malformed:
    source: str
    line: int
    error: str

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "line": self.line, "error": self.error}


@dataclass
class EventReader:
    """Iterates decoded events that may concern ``apps.cozystack.io``, counting the rest."""

    sources: list[str]
    marker: bytes | None = GROUP_MARKER  # None: decode every event
    progress: bool = False
    events: int = 0
    malformed_count: int = 0
    malformed: list[Malformed] = field(default_factory=list)
    where: tuple[str, int] = ("", 0)  # the source and line of the event last yielded

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for source in _in_order(self.sources):
            yield from self._read(source)

    def malformed_json(self) -> list[dict[str, Any]]:
        return [m.as_json() for m in self.malformed]

    def reject(self, error: str) -> None:
        """Count the event last yielded as malformed after all (it is not an audit event)."""
        self.events -= 1
        self._bad(*self.where, error)

    def _bad(self, source: str, line: int, error: str) -> None:
        self.malformed_count += 1
        if len(self.malformed) < MALFORMED_KEPT:
            self.malformed.append(Malformed(source, line, error))

    def _read(self, source: str) -> Iterator[dict[str, Any]]:
        raw, stream, size = _open(source)
        bar = _bar(source, size) if self.progress and size >= PROGRESS_MIN_BYTES else None
        try:
            first = stream.readline()
            if first.strip() in (b"{", b"["):
                yield from self._documents(source, first + stream.read())
                return
            yield from self._lines(source, first, stream, raw, bar)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            self._bad(source, 0, f"cannot read further: {exc}")
        finally:
            if bar is not None:
                bar.close()
            if raw is not sys.stdin.buffer:
                raw.close()

    def _lines(
        self, source: str, first: bytes, stream: IO[bytes], raw: IO[bytes], bar: Any
    ) -> Iterator[dict[str, Any]]:
        marker = self.marker
        number = 0
        position = 0
        for line in _chain_first(first, stream):
            number += 1
            if bar is not None and not number & 4095:
                now = raw.tell()
                bar.update(now - position)
                position = now
            line = line.rstrip()
            if not line:
                continue
            if line[:1] != b"{" or line[-1:] != b"}":
                self._bad(source, number, _why(line))
                continue
            if line.startswith(b'{"kind":"EventList"') or (
                b'"EventList"' in line[:200] and b'"items"' in line
            ):
                yield from self._batch(source, number, line)
                continue
            self.events += 1
            if marker is not None and (
                marker not in line or (_APPS_EXACT not in line and _APPS_SPACED not in line)
            ):
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                self.events -= 1
                self._bad(source, number, f"not JSON: {exc}")
                continue
            if isinstance(event, dict):
                self.where = (source, number)
                yield event
            else:
                self.events -= 1
                self._bad(source, number, "not a JSON object")
        if bar is not None:
            bar.update(raw.tell() - position)

    def _batch(self, source: str, number: int, line: bytes) -> Iterator[dict[str, Any]]:
        try:
            body = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            self._bad(source, number, f"not JSON: {exc}")
            return
        yield from self._items(source, number, body)

    def _items(self, source: str, number: int, body: object) -> Iterator[dict[str, Any]]:
        if isinstance(body, dict) and body.get("kind") == "EventList":
            items = body.get("items")
            if not isinstance(items, list):
                self._bad(source, number, "EventList without a list of items")
                return
            for item in items:
                if isinstance(item, dict):
                    self.events += 1
                    self.where = (source, number)
                    yield item
                else:
                    self._bad(source, number, "EventList item is not an object")
        elif isinstance(body, dict):
            self.events += 1
            self.where = (source, number)
            yield body
        elif isinstance(body, list):
            for item in body:
                yield from self._items(source, number, item)
        else:
            self._bad(source, number, "not a JSON object")

    def _documents(self, source: str, text: bytes) -> Iterator[dict[str, Any]]:
        """Pretty-printed documents one after another (an audit webhook's batches, saved)."""
        decoder = json.JSONDecoder()
        content = text.decode("utf-8", errors="replace")
        index = 0
        while True:
            while index < len(content) and content[index].isspace():
                index += 1
            if index >= len(content):
                return
            line = content.count("\n", 0, index) + 1
            try:
                body, index = decoder.raw_decode(content, index)
            except json.JSONDecodeError as exc:
                self._bad(source, line, f"not JSON: {exc.msg}")
                return
            yield from self._items(source, line, body)


def _chain_first(first: bytes, stream: IO[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from stream


def _why(line: bytes) -> str:
    if line[:1] == b"{":
        return "truncated: the line does not end its JSON object"
    return "not a JSON object"


def _open(source: str) -> tuple[IO[bytes], IO[bytes], int]:
    """(the raw file, the decompressed stream, the raw size; 0 when unknown)."""
    if source == "-":
        raw: IO[bytes] = sys.stdin.buffer
        size = 0
    else:
        try:
            raw = open(source, "rb")  # noqa: SIM115 - closed by the reader
            size = os.fstat(raw.fileno()).st_size
        except OSError as exc:
            raise ReadError(f"{source}: cannot read: {exc.strerror or exc}") from None
    head = raw.peek(2)[:2] if isinstance(raw, io.BufferedReader) else b""
    if head == GZIP_MAGIC:
        return raw, cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb")), size
    return raw, raw, size


def _first_stamp(source: str) -> str:
    """The first event's timestamp, to put rotated files in order ("" when none is found)."""
    raw, stream, _ = _open(source)
    try:
        for _ in range(50):
            line = stream.readline(1 << 20)
            if not line:
                break
            found = _STAMP.search(line)
            if found:
                return found.group(1).decode("ascii", errors="replace")
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""
    finally:
        raw.close()
    return ""


def _in_order(sources: list[str]) -> list[str]:
    """Standard input first, then files by their first event (rotated files given any way)."""
    files = [s for s in sources if s != "-"]
    stamps = {s: _first_stamp(s) for s in files}
    ordered = sorted(files, key=lambda s: (stamps[s], files.index(s)))
    return ["-"] * (len(sources) - len(files)) + ordered


def _bar(source: str, size: int) -> Any:
    from tqdm import tqdm  # only when a terminal wants a bar: keeps start-up short

    return tqdm(
        total=size, unit="B", unit_scale=True, desc=os.path.basename(source), file=sys.stderr
    )
