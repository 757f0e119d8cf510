"""The seal mark: a sealed store says so, durably, in every tier it writes.

Why: nothing in a store told a process started without the key (a secret that did not mount, a
config that lost its `encryption:`) that the directory or bucket it was pointed at is sealed; it
wrote plaintext pages into it without a word. A store that seals (a key, `require_sealed` on)
writes a mark into each tier when it opens: `sealed-<key id>.mark`, a fixed text, the key id and an
HMAC-SHA256 of both under the key. A store without a key that finds any mark refuses to open for
writing (ConfigError naming the fix) and serves no plaintext record (require_sealed is on for it).

The HMAC means only a holder of the key makes a mark that verifies; it never reveals the key. A
process without the key cannot check a mark, so any mark file counts for it (a planted one can only
stop keyless writers, which is the point). A process with the key rewrites a mark of its key id
that does not verify. One mark per key id: processes with different keys (tenants, rotation) never
overwrite each other's.
"""

from __future__ import annotations

import hashlib
import hmac

from .keyring import Key, key_id_text

MARK_PREFIX = "sealed-"
MARK_SUFFIX = ".mark"
MAX_MARK_BYTES = 4096  # a mark is ~120 bytes; a bigger file is not ours (still a mark: it is there)
_LABEL = b"lifeboat sealed store v1"


def mark_name(kid: int) -> str:
    """The file (or object) name of key id `kid`'s mark."""
    return f"{MARK_PREFIX}{key_id_text(kid)}{MARK_SUFFIX}"


def is_mark_name(name: str) -> bool:
    return name.startswith(MARK_PREFIX) and name.endswith(MARK_SUFFIX)


def mark_bytes(key: Key) -> bytes:
    """A mark's contents for `key`: text, so an operator who finds the file knows what it is."""
    tag = hmac.new(key.raw, _LABEL + key.id.to_bytes(4, "little"), hashlib.sha256).hexdigest()
    return (f"lifeboat sealed store: records here are sealed (AES-256-GCM); key id {key_id_text(key.id)}; "
            f"hmac-sha256 {tag}\n").encode()


def mark_verifies(key: Key, data: bytes) -> bool:
    """Whether `data` is the mark `key` writes (constant-time compare)."""
    return hmac.compare_digest(bytes(data), mark_bytes(key))


__all__ = ["MARK_PREFIX", "MARK_SUFFIX", "MAX_MARK_BYTES", "is_mark_name", "mark_bytes", "mark_name", "mark_verifies"]
