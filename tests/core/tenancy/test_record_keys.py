"""Record keys: which key signs, which keys a record may name, and what their ids give away."""

from __future__ import annotations

import pytest

from webhook.core.tenancy.record_keys import MIN_KEY_BYTES, RecordKeys, key_id

CURRENT = b"the-current-record-key-0123456789abcdef"
PUBLISHED = b"the-published-record-key-0123456789abcd"
PREVIOUS = b"the-previous-record-key-0123456789abcde"
RETIRED = b"the-retired-record-key-0123456789abcdef"


def test_a_key_id_is_a_fingerprint_not_the_key() -> None:
    assert key_id(CURRENT) == key_id(bytes(CURRENT))  # the same on every replica
    assert key_id(CURRENT) != key_id(PREVIOUS)
    assert len(key_id(CURRENT)) == 16
    assert CURRENT.hex()[:16] not in key_id(CURRENT)


def test_published_and_previous_keys_verify_and_a_retired_one_does_not() -> None:
    keys = RecordKeys(CURRENT, (PREVIOUS,), (PUBLISHED,), (RETIRED,))
    assert keys.current_id == key_id(CURRENT)
    for key in (CURRENT, PUBLISHED, PREVIOUS):
        assert keys.key_for(key_id(key)) == key
    assert keys.key_for(key_id(RETIRED)) is None  # its records count for volume marks only
    assert keys.knows(key_id(RETIRED))  # so a replica does not re-read the Secret for it
    assert not keys.knows(key_id(b"a-key-nobody-here-holds-0123456789abc"))


@pytest.mark.parametrize("where", ["current", "previous", "published", "retired"])
def test_a_short_key_is_refused_wherever_it_is_held(where: str) -> None:
    short = b"k" * (MIN_KEY_BYTES - 1)
    held: dict[str, tuple[bytes, ...]] = {"previous": (), "published": (), "retired": ()}
    current = short if where == "current" else CURRENT
    if where != "current":
        held[where] = (short,)
    with pytest.raises(ValueError, match="at least"):
        RecordKeys(current, held["previous"], held["published"], held["retired"])


def test_a_rotation_keeps_the_current_key_as_the_previous_one() -> None:
    keys = RecordKeys(CURRENT)
    rotated = keys.rotated()
    assert rotated.current != CURRENT
    assert rotated.previous == (CURRENT,)
    assert rotated.key_for(keys.current_id) == CURRENT
    assert len(RecordKeys.generate().current) == MIN_KEY_BYTES
