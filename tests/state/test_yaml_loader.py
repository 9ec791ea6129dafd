"""The manifest loader's YAML reading builds exactly what ``yaml.safe_load_all`` builds.

Its short paths (tags resolved once per distinct plain scalar, collections and quoted scalars
answered without the resolver's walk, plain maps, lists and strings built directly) must never
change a value: YAML 1.1's implicit types (``yes``, ``0777``, ``1_000``, timestamps, ``1:20``),
quoted look-alikes, anchors and merge keys included.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.state import manifests
from webhook.state.manifests import _yaml_documents

LOOKALIKES = [
    "yes",
    "No",
    "on",
    "OFF",
    "~",
    "null",
    "0777",
    "0x1F",
    "1_000",
    "1e3",
    "1.0e+3",
    ".inf",
    "-.Inf",
    ".nan",
    "2001-12-14",
    "2001-12-14t21:59:43.10-05:00",
    "1:20",
    "12:30:00",
    "<<",
    "=",
    "true",
    "",
    " x",
    "a: b",
    "- a",
    "#c",
    "0o17",
    "0b101",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.sampled_from(LOOKALIKES),
    st.text(max_size=8),
    st.dates(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=6), st.sampled_from(LOOKALIKES)), inner, max_size=4
        ),
    ),
    max_leaves=20,
)


def loaded(text: str) -> list[object]:
    return list(_yaml_documents(Path("test.yaml"), text))


@settings(max_examples=200, deadline=None)
@given(st.lists(VALUES, min_size=1, max_size=3), st.booleans())
def test_dumped_values_read_back_as_safe_load_reads_them(
    documents: list[object], flow: bool
) -> None:
    text = yaml.safe_dump_all(documents, default_flow_style=flow)
    assert loaded(text) == list(yaml.safe_load_all(text))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["k", "on", "1", "x"]), st.sampled_from(LOOKALIKES)),
        min_size=1,
        max_size=6,
    )
)
def test_plain_and_quoted_lookalikes_resolve_as_safe_load_resolves_them(
    pairs: list[tuple[str, str]],
) -> None:
    lines = []
    for index, (key, value) in enumerate(pairs):
        written = value if index % 2 else f"'{value}'"
        if value in ("", " x", "a: b", "- a", "#c", "<<", "="):
            written = f'"{value}"'
        lines.append(f"{key}{index}: {written}")
    text = "\n".join(lines) + "\n"
    assert loaded(text) == list(yaml.safe_load_all(text))


def test_anchors_merge_keys_and_timestamps_read_as_safe_load_reads_them() -> None:
    text = (
        "base: &b {cpu: 1, memory: 1Gi}\nvm:\n  <<: *b\n  cpu: 2\nlist: &l [1, 2]\n"
        "again: *l\nwhen: 2001-12-14 21:59:43.10\nset: !!set {a, b}\nold: 0777\n"
    )
    (found,) = loaded(text)
    assert found == yaml.safe_load(text)
    assert isinstance(found, dict)
    assert found["vm"] == {"cpu": 2, "memory": "1Gi"}
    assert found["old"] == 511
    assert isinstance(found["when"], datetime.datetime)


def test_long_plain_scalars_a_tenant_wrote_are_not_kept_after_the_load() -> None:
    # Tag resolution is cached per distinct plain scalar for the life of the process; a
    # tenant's long distinct strings (a description per application) must not stay in memory
    # once their manifests are read.
    texts = [f"description{i}" + "x" * 100_000 for i in range(20)]
    documents = loaded("".join(f"---\nd: {text}\n" for text in texts))
    assert [document["d"] for document in documents] == texts  # type: ignore[index]
    kept = sum(len(value) for value in manifests._PLAIN_TAGS)
    assert kept < 1_000_000, f"{kept} characters of plain scalars kept"
