"""Record keys: the key that signs charge records, keys published ahead of it, keys retired.

Keys carry an id (a fingerprint of the key, :func:`key_id`), so a replica that meets a record
signed with a key it does not know can tell, and re-read the key Secret before it refuses.
:class:`RecordKeys` holds the key that signs, keys published ahead of a rotation (accepted,
never used to sign), previous keys (accepted until the adapter drops them at the end of their
window) and retired ones (trusted for volume marks only). Where the keys come from, and the
rotation procedure, is the adapter of the same name, :mod:`webhook.tenancy.record_keys`.

Pure: keys are passed in; generating one uses ``secrets`` and nothing else.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Final

__all__ = ["MIN_KEY_BYTES", "RecordKeys", "key_id"]

MIN_KEY_BYTES: Final = 32


def key_id(key: bytes) -> str:
    """A key's id: 16 hex digits of a SHA-256 over it (a fingerprint, not the key: finding a
    key from it is as hard as breaking SHA-256), the same on every replica and in every file."""
    return hashlib.sha256(b"reservation-record-key\x00" + key).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class RecordKeys:
    """The key records are signed with, keys published ahead of a rotation (accepted, never
    signing) and retired keys still accepted when verifying."""

    current: bytes
    previous: tuple[bytes, ...] = ()
    published: tuple[bytes, ...] = ()
    # Keys whose window has ended: what they signed counts for its volume marks only (a mark
    # only ever raises the charge of the object carrying it), never for a charge or a factor.
    retired: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        for key in (self.current, *self.previous, *self.published, *self.retired):
            if len(key) < MIN_KEY_BYTES:
                raise ValueError(f"a record key needs at least {MIN_KEY_BYTES} bytes")

    @property
    def current_id(self) -> str:
        return key_id(self.current)

    def key_for(self, kid: str) -> bytes | None:
        """The accepted key with id ``kid``, or ``None``."""
        for key in (self.current, *self.published, *self.previous):
            if key_id(key) == kid:
                return key
        return None

    def knows(self, kid: str) -> bool:
        return self.key_for(kid) is not None or self._retired_for(kid) is not None

    def _retired_for(self, kid: str) -> bytes | None:
        for key in self.retired:
            if key_id(key) == kid:
                return key
        return None

    @classmethod
    def generate(cls) -> RecordKeys:
        """A fresh random key (per process: records signed with it die with the process)."""
        return cls(secrets.token_bytes(MIN_KEY_BYTES))

    def rotated(self) -> RecordKeys:
        """A new current key; the current one becomes the previous one (one kept)."""
        return RecordKeys(secrets.token_bytes(MIN_KEY_BYTES), (self.current,))
