"""The known name a mistyped one was probably meant to be, for "did you mean ...?" hints.

Kinds, values keys and settings are case-sensitive, and a near miss (``postgres``, ``storag``)
would otherwise be accepted and ignored. A case-insensitive exact match wins; else the closest
by ``difflib``'s ratio, when it is close enough to be a plausible typo.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest_name", "did_you_mean"]


def closest_name(word: str, known: Iterable[str]) -> str | None:
    """The known name ``word`` most plausibly misspells, or ``None``."""
    folded: dict[str, str] = {}
    for name in known:
        folded.setdefault(name.lower(), name)
    match = folded.get(word.lower())
    if match is not None:
        return match
    near = difflib.get_close_matches(word.lower(), list(folded), n=1, cutoff=0.6)
    return folded[near[0]] if near else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` when a different known name is close to ``word``, else ``""``."""
    match = closest_name(word, known)
    return f" (did you mean {match}?)" if match is not None and match != word else ""
