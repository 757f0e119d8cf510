"""Keys of sealed records: key files, key ids, the keyring of a store (records/sealing.py uses them).

Keys: 32 bytes in a file (raw, or 64 hex digits), owner-only (a mode readable or writable by group
or others is refused), read when the store opens. A key's id is the first 4 bytes of a BLAKE2b of
the key (not secret, not reversible), stored in each sealed record's header, so a reader picks the
key without trying them all and `lifeboat stats` counts pages per key id. The first key seals, all
open (rotation). `namespace_keys` gives a key_namespace its own keys: a process of that
key_namespace neither opens nor writes pages under any other key.

`cryptography` is imported only when a key is configured: the core imports without it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..config import ConfigError, EncryptionSettings

KEY_BYTES = 32  # AES-256
MAX_KEY_FILE_BYTES = 4096  # a key file is 32 bytes or 64 hex digits; anything much larger is not one
EXTRA = "lifeboat-cache[seal]"  # the pip extra that installs `cryptography`


def key_id(key: bytes) -> int:
    """A key's id (u32): the first 4 bytes of a keyed-purpose BLAKE2b of it. Not secret."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=4, person=b"lifeboat-keyid").digest(), "little")


def key_id_text(kid: int) -> str:
    return f"{kid:08x}"


def read_key_file(path: Path) -> bytes:
    """The 32 key bytes of a key file; raises ConfigError naming the file and the fix.

    Refused: a missing or unreadable file, one readable or writable by group or others (a key other
    users can read seals nothing), one that is not 32 raw bytes or 64 hex digits. Symlinks are
    followed (secret mounts are links) and the mode of the file they point to is checked.
    """
    fix_new = f"create one with `lifeboat keygen {path}` (32 random bytes, mode 0600)"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"encryption key file {path}: no such file; {fix_new}, or fix the path") from None
    except OSError as e:
        raise ConfigError(f"encryption key file {path}: cannot be read ({e.strerror}); give this user "
                          "read access to it (owner-only, mode 0600)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"encryption key file {path}: not a regular file; {fix_new}")
        if st.st_mode & 0o077:
            raise ConfigError(f"encryption key file {path}: mode {stat.S_IMODE(st.st_mode):04o} lets group or "
                              f"others use the key; run `chmod 600 {path}` (and keep it owned by the "
                              "serving user)")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) == KEY_BYTES:
        return data
    text = data.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise ConfigError(f"encryption key file {path}: {len(data)} bytes, not a 256-bit key (32 raw bytes or 64 "
                      f"hex digits); {fix_new} and point the config at it")


def write_key_file(path: Path) -> int:
    """Create a new key file (32 random bytes as 64 hex digits, mode 0600; never overwrites one).

    Returns the new key's id. Raises FileExistsError when the path exists, OSError otherwise."""
    key = os.urandom(KEY_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, (key.hex() + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return key_id(key)


def _aead_class() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ConfigError(f"encryption: needs the `cryptography` package; pip install '{EXTRA}' (or "
                          "cryptography), or remove `encryption:` / LIFEBOAT_KEY_FILE") from None
    return AESGCM


@dataclass(frozen=True)
class Key:
    id: int
    path: Path
    aead: Any = field(repr=False)  # cryptography's AESGCM (one-shot seal / open)
    raw: bytes = field(default=b"", repr=False)  # the key bytes (streaming GCM); never in a repr or a log

    def gcm(self, nonce: bytes, tag: bytes | None = None) -> Any:
        """A streaming AES-256-GCM cipher (cryptography's Cipher API: seals / opens block by block)."""
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        return Cipher(algorithms.AES(self.raw), modes.GCM(nonce, tag))


def _load(paths: Sequence[Path], cache: dict[Path, Key]) -> list[Key]:
    out = []
    for p in paths:
        if p not in cache:
            raw = read_key_file(p)
            cache[p] = Key(key_id(raw), p, _aead_class()(raw), raw)
        out.append(cache[p])
    return out


@dataclass(frozen=True)
class Keyring:
    """The keys of one store: the one that seals, the ones its reads open, and every configured one
    (what `verify`, `stats` and `gc` use: they look at every namespace's records)."""

    sealing: Key | None  # None only for inspection (`lifeboat stats`, verify, gc, purge): nothing is written
    serving: dict[int, Key]
    every: dict[int, Key]


def load_keyring(enc: EncryptionSettings, key_namespace: str = "", *, seal: bool = True) -> Keyring:
    """Read and check every configured key file; the serving keys are key_namespace's own when
    `namespace_keys` lists it, else `keys`. Raises ConfigError (missing, loose mode, wrong length,
    two files with one key id, a key_namespace with no key when `seal`: a store that writes pages
    needs a key to seal them; inspection and maintenance open with seal=False)."""
    cache: dict[Path, Key] = {}
    groups = {"": _load(enc.keys, cache)} if enc.keys else {}
    for name, paths in enc.namespace_keys:
        groups[f"namespace_keys.{name}"] = _load(paths, cache)
    every: dict[int, Key] = {}
    for key in cache.values():
        other = every.get(key.id)
        if other is not None and other.path != key.path:
            raise ConfigError(f"encryption: key files {other.path} and {key.path} have the same key id "
                              f"{key_id_text(key.id)} (the same key twice?); list each key once")
        every[key.id] = key
    own = dict(enc.namespace_keys).get(key_namespace)
    mine = _load(own, cache) if own is not None else groups.get("")
    if not mine:
        if not seal:
            return Keyring(None, {}, every)
        raise ConfigError(f"encryption: key_namespace {key_namespace!r} has no key: add it to "
                          "encryption.namespace_keys or give encryption.keys")
    return Keyring(mine[0], {k.id: k for k in mine}, every)


__all__ = ["EXTRA", "KEY_BYTES", "Key", "Keyring", "key_id", "key_id_text", "load_keyring", "read_key_file",
           "write_key_file"]
