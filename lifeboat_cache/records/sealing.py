"""Sealed records: the one place where records are built and opened (AES-256-GCM, `encryption:`).

Why: checksums catch accidents, not people. Whoever can write a shared store could plant pages that
change what every server reading it generates, and whoever can read it could read users' prompts
(docs/storage.md, "Sealed records"). With `encryption:` on, every record a store writes is sealed:
its payload (after compression: ciphertext does not compress) is encrypted and authenticated with
AES-256-GCM from `cryptography` (OpenSSL, AES-NI), with the record's header fields as associated
data (codec.aad: key digest, namespace, lengths, codec, key id). A record edited to claim another
key or namespace, one flipped bit, a truncated tag, a record of another key, a plaintext record:
each is a counted miss (RecordError with its own reason), never garbage and never an exception.

Tiers never decide anything here: a sealed record is a checksummed record (format version 3) like
any other, so scans, recovery, copies and gc move it as bytes. The store calls `Sealer.build` for every
record it writes (puts, promotions, re-encoded copies) and `Sealer.decode_into` for every one it serves.

Nonces (96 bits, never repeated under one key): an 8-byte writer id + a 4-byte counter. The writer
id is drawn from os.urandom per Sealer and drawn again in a forked child (the pid is checked on
every seal) and when the counter wraps (2^32 records), so within a writer nonces never repeat, and
two writers (processes, hosts, stores) collide only if their random 64-bit ids do: with W writer ids
ever drawn under one key, probability about W^2 / 2^65 (1e-8 for 600,000 writer ids).

Keys, key files and the keyring are keyring.py's; the mark a sealed store leaves in its tiers, seal_mark.py's.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
from typing import Any, Callable, Sequence

import numpy as np

from ..config import EncryptionSettings
from . import codec, payloads
from .codec import NONCE_BYTES, SEAL_OVERHEAD, TAG_BYTES, Header
from .keyring import Key, Keyring, key_id_text, load_keyring
from .payloads import RecordError

COUNTER_LIMIT = 1 << 32

# miss reasons (counters `miss_<reason>`, verify's reports)
UNSEALED = "unsealed"  # a plaintext record where only sealed ones are served (require_sealed)
NO_KEY = "sealed_no_key"  # a sealed record, and this store has no key at all
UNKNOWN_KEY = "sealed_unknown_key"  # sealed with a key this process does not hold (retired, other namespace)
AUTH = "sealed_auth"  # the tag does not verify: tampered, moved under another header, or a wrong key
OPENABLE_REASONS = (UNSEALED, NO_KEY, UNKNOWN_KEY)  # intact records another process may open: not quarantined


class Nonces:
    """Unique 96-bit nonces for one writer: writer id (8 random bytes) + counter (u32).

    Thread-safe. A forked child draws its own writer id on its first seal (a copy of the parent's
    state must not count the same numbers), and a wrapped counter draws a new one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self.writer_id = b""
        self._count = itertools.count()
        self.writer_ids = 0  # how many ids this writer has drawn (tests, stats)

    def _redraw(self) -> None:
        self.writer_id = os.urandom(8)
        self._count = itertools.count()
        self._pid = os.getpid()
        self.writer_ids += 1

    def next(self) -> bytes:
        with self._lock:
            if self._pid != os.getpid():
                self._redraw()
            n = next(self._count)
            if n >= COUNTER_LIMIT:
                self._redraw()
                n = next(self._count)
            return self.writer_id + struct.pack("<I", n)


_local = threading.local()


def _scratch(n: int) -> np.ndarray:
    """A per-thread buffer for opened plaintext, consumed by the decode before decode_into returns."""
    buf = getattr(_local, "plain", None)
    if buf is None or buf.nbytes < n:
        buf = np.empty(max(n, 1 << 16), dtype=np.uint8)
        _local.plain = buf
    return buf[:n]


class Sealer:
    """Builds every record a store writes and opens every record it serves.

    With no keyring (encryption off) records are plaintext and a sealed record is a miss
    (`sealed_no_key`). With a keyring, records are sealed with its sealing key; a sealed record
    opens with a serving key of its key id; a plaintext one is a miss (`unsealed`) unless
    `require_sealed` is off (a migration from a plaintext store).
    """

    def __init__(self, keyring: Keyring | None = None, require_sealed: bool = True) -> None:
        self.keyring = keyring
        self.require_sealed = keyring is not None and require_sealed
        self.nonces = Nonces()

    @property
    def active(self) -> bool:
        return self.keyring is not None

    def rank(self, record: bytes | memoryview) -> int:
        """A whole record's rank, for an index rebuild that meets a page twice (tiers.settle_twins): 3
        sealed and opened with a key of this store, 2 plaintext this store serves (require_sealed off:
        a migration, where the sealed copy is the one to keep), 1 intact but not for this store (a key
        it does not hold), 0 refused (plaintext where sealed records are required, a tag that does not
        verify), -1 not an intact record."""
        view = memoryview(record)
        try:
            h = codec.verify_record(view[: codec.HEADER_SIZE], view[codec.HEADER_SIZE:])
        except RecordError:
            return -1
        if not h.sealed:
            return 0 if self.require_sealed else 2
        if self.keyring is None or h.key_id not in (self.keyring.serving or self.keyring.every):
            return 1
        try:
            self.open(h, view[codec.HEADER_SIZE:], serving=False)
        except RecordError:
            return 0
        return 3

    def refuse_plaintext(self) -> None:
        """Serve no plaintext record from now on, also without a key (a store marked sealed)."""
        self.require_sealed = True

    # ------------------------------------------------------------------ writing
    def build(self, page: np.ndarray | Sequence[np.ndarray], *, itemsize: int, dtype: int, digest: bytes,
              namespace: bytes, compress: bool,
              alloc: Callable[[int], np.ndarray] | None = None) -> tuple[bytes, list[object], int]:
        """One page's record: (header bytes, payload parts, record length), as codec.build_record,
        sealed when a key is configured (compressed first, then sealed into one buffer of `alloc(n)`,
        default a new one; the store passes its io thread's arena). A sealed record's parts never
        view the page. Raises as codec.build_record does.
        """
        if self.keyring is None:
            return codec.build_record(page, itemsize=itemsize, dtype=dtype, digest=digest, namespace=namespace,
                                      compress=compress, alloc=alloc)
        key = self.keyring.sealing
        if key is None:
            raise ValueError("this store was opened for inspection without a sealing key: it writes no page")
        c, parts, raw_len, inner = codec.encode_page(page, itemsize, compress)
        h = Header(c, dtype, raw_len, inner + SEAL_OVERHEAD, digest, namespace, 0, 0, codec.SEALED_VERSION, key.id)
        return self._seal(h, key, parts, alloc)

    def _seal(self, h: Header, key: Key, parts: Sequence[object],
              alloc: Callable[[int], np.ndarray] | None = None) -> tuple[bytes, list[object], int]:
        """Seal payload parts under key as the record h describes (its checksum still to fill in)."""
        out = np.empty(h.stored_len, dtype=np.uint8) if alloc is None else alloc(h.stored_len)
        nonce = self.nonces.next()
        out[:NONCE_BYTES] = np.frombuffer(nonce, np.uint8)
        if len(parts) == 1:
            key.aead.encrypt_into(nonce, parts[0], codec.aad(h), out[NONCE_BYTES:])
        else:  # a page of many blocks (SGLang layer_first): streamed block by block, no gather copy
            enc = key.gcm(nonce).encryptor()
            enc.authenticate_additional_data(codec.aad(h))
            dst, pos = memoryview(out), NONCE_BYTES  # a memoryview slice costs a fraction of an array's:
            for p in parts:  # the store's blocks are flat uint8 already: per block only the cipher call
                flat = p if isinstance(p, np.ndarray) and p.ndim == 1 and p.itemsize == 1 else codec.as_bytes_view(p)
                pos += enc.update_into(flat, dst[pos:])
            enc.finalize()
            out[pos: pos + TAG_BYTES] = np.frombuffer(enc.tag, np.uint8)
        h = Header(h.codec, h.dtype, h.raw_len, h.stored_len, h.digest, h.namespace, codec.payload_crc([out]),
                   h.flags, h.version, h.key_id)
        return codec.pack_header(h), [out], codec.HEADER_SIZE + h.stored_len

    def recode(self, record: bytes | memoryview, compress: bool) -> bytes | memoryview:
        """A verified record of ours as a tier that compresses (or not) stores it: compressed before
        sealed. A record that needs no change is returned as it is. Raises RecordError (as `open`)."""
        h = codec.unpack_header(record)
        if not compress or h.codec != codec.RAW:
            return record
        if not h.sealed:
            return codec.compressed_record(record)
        plain = self.open(h, memoryview(record)[codec.HEADER_SIZE:], serving=False)
        page = np.frombuffer(plain, dtype=np.uint8)
        header, parts, _ = self.build(page, itemsize=codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[h.dtype]], dtype=h.dtype,
                                      digest=h.digest, namespace=h.namespace, compress=True)
        return b"".join([header, *parts])  # type: ignore[list-item]

    # ------------------------------------------------------------------ reading
    def admit(self, h: Header) -> None:
        """Whether a plaintext record may be served; raises RecordError(`unsealed`) when not."""
        if self.require_sealed and not h.sealed:
            raise RecordError(UNSEALED, "plaintext record, and encryption.require_sealed is on")

    def _key(self, h: Header, serving: bool) -> Key:
        if self.keyring is None:
            raise RecordError(NO_KEY, f"sealed with key {key_id_text(h.key_id)}, and no encryption key is configured")
        key = (self.keyring.serving if serving else self.keyring.every).get(h.key_id)
        if key is None:
            raise RecordError(UNKNOWN_KEY, f"sealed with key {key_id_text(h.key_id)}, which this store does not hold")
        return key

    def open(self, h: Header, payload: memoryview | bytes, out: np.ndarray | None = None, *,
             serving: bool = True) -> np.ndarray:
        """The plaintext (inner) payload of a checksum-verified sealed record, written into `out`
        (default: this thread's scratch buffer). `serving`: only the serving keys (data path), else
        every configured key (verify, gc, copies). Raises RecordError: NO_KEY, UNKNOWN_KEY, AUTH,
        'truncated' (a payload shorter than nonce + tag)."""
        key = self._key(h, serving)
        payload = memoryview(payload).cast("B") if not isinstance(payload, bytes) else memoryview(payload)
        if len(payload) != h.stored_len or len(payload) < SEAL_OVERHEAD:
            raise RecordError("truncated", "sealed payload shorter than the header says")
        n = len(payload) - SEAL_OVERHEAD
        dst = _scratch(n) if out is None else out
        try:
            key.aead.decrypt_into(payload[:NONCE_BYTES], payload[NONCE_BYTES:], codec.aad(h), dst)
        except Exception as e:  # cryptography's InvalidTag (and ValueError for odd sizes)
            raise _refused(h, e, [dst]) from None
        return dst

    def open_in_place(self, h: Header, parts: Sequence[memoryview]) -> None:
        """Open a sealed raw record read straight into the page: parts = [nonce, *page pieces holding
        the ciphertext, tag]; the pieces are decrypted in place, then the tag is checked, and on a bad
        tag zeroed: no unverified plaintext stays in the caller's page (checking the tag first would be
        a second pass over the bytes on every read, decrypting into scratch a copy; zeroing costs only
        on a failure). A plaintext record (also read straight in) is only admitted. Raises as `open`."""
        if not h.sealed:
            self.admit(h)
            return
        key = self._key(h, serving=True)
        if h.codec != codec.RAW or len(parts) < 3 or len(parts[0]) != NONCE_BYTES or len(parts[-1]) != TAG_BYTES:
            raise RecordError("truncated", "sealed record read in place is not a raw page")
        try:
            dec = key.gcm(bytes(parts[0]), bytes(parts[-1])).decryptor()
            dec.authenticate_additional_data(codec.aad(h))
            for piece in parts[1:-1]:
                dec.update_into(piece, piece)
            dec.finalize()
        except Exception as e:  # InvalidTag
            raise _refused(h, e, parts[1:-1]) from None

    def decode_into(self, h: Header, payload: memoryview, dst: Sequence[np.ndarray]) -> None:
        """Open (when sealed) and decode a checksum-verified record into the page's pieces, or raise
        RecordError (reasons above, and payloads.decode_into's). dst is unspecified after a raise."""
        itemsize = codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[h.dtype]]
        if not h.sealed:
            self.admit(h)
            payloads.decode_into(h.codec, payload, dst if len(dst) > 1 else dst[0], itemsize)
            return
        if h.codec == codec.RAW and len(dst) == 1:  # straight into the page: one pass
            self.open(h, payload, dst[0])
            return
        plain = self.open(h, payload)
        payloads.decode_into(h.codec, memoryview(plain), dst if len(dst) > 1 else dst[0], itemsize)

    def check(self, record: bytes | memoryview | bytearray) -> Header:
        """verify's check of a whole record (any configured key): checksums, then whether it may be
        served and opens. Returns its header; raises RecordError with the failing reason."""
        view = memoryview(record)
        h = codec.verify_record(view[: codec.HEADER_SIZE], view[codec.HEADER_SIZE:])
        if h.sealed:
            self.open(h, view[codec.HEADER_SIZE:], serving=False)
        else:
            self.admit(h)
        return h


def _refused(h: Header, e: Exception, outs: Sequence[Any]) -> RecordError:
    """The AUTH miss of a record that did not open, its output buffers zeroed first (never a byte of
    unverified plaintext left behind for a caller to use by mistake)."""
    for o in outs:
        np.frombuffer(o, np.uint8)[...] = 0
    return RecordError(AUTH, f"sealed record does not authenticate under key {key_id_text(h.key_id)} "
                             f"({type(e).__name__})")


def sealer_for(enc: EncryptionSettings, key_namespace: str = "", *, seal: bool = True) -> Sealer:
    """The Sealer of a store's settings: plaintext when encryption is off, else sealing with the keys
    of key_namespace (`seal=False`: inspection, where a key_namespace may have none). Raises
    ConfigError for a bad key file or a missing `cryptography`."""
    if not enc.enabled:
        return Sealer()
    return Sealer(load_keyring(enc, key_namespace, seal=seal), enc.require_sealed)


__all__ = ["AUTH", "NO_KEY", "OPENABLE_REASONS", "UNKNOWN_KEY", "UNSEALED", "Nonces", "Sealer", "sealer_for"]
