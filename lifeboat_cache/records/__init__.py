"""Records: the bytes a tier stores, and the rules over them. Knows nothing of tiers or runtimes.

  codec.py       a record = 64-byte self-describing header + payload; strict, size-bounded parse;
                 `verify_record`, the one check of a record; NS_AT, the namespace's offset in a header
  payloads.py    raw, zstd and byte planes + zstd: pure encode / decode functions
  sealing.py     Sealer: AES-256-GCM records (`encryption:`): built, opened, nonces
  keyring.py     key files, key ids, Keyring (rotation, namespace keys)
  seal_mark.py   the mark a sealed store writes into each tier (keyless writers refuse it)
  keys.py        namespace_fingerprint, key_digest, index_key, DigestCache
  trailer.py     the table + footer at the end of a unit of records (sealed segment, S3 object), writer tags;
                 `framing`, a unit's bytes that are not pages (what `capacity:` leaves out)
  purge_list.py  `purge.list`: namespace and age rules that mark records purged, validated, append-only
"""

from __future__ import annotations

from .codec import (
    DTYPE_CODES, DTYPE_ITEMSIZE, DTYPE_NAMES, HEADER_SIZE, MAGIC, NONCE_BYTES, NS_AT, RAW, SEAL_OVERHEAD,
    TAG_BYTES, Header, Record, as_bytes_view, build_record, dtype_code, raw_length, unpack_header, verify_record)
from .keys import (
    DIGEST_CACHE_ENTRIES, FINGERPRINT_BYTES, DigestCache, Namespace, digests, index_key, key_digest,
    namespace_fingerprint)
from .payloads import PLANES, RecordError, decode_into
from .keyring import key_id_text, write_key_file
from .purge_list import PURGE_NAME, PurgeRules, append_rules, load_rules
from .seal_mark import MARK_PREFIX, MAX_MARK_BYTES, is_mark_name, mark_bytes, mark_name, mark_verifies
from .sealing import OPENABLE_REASONS, UNKNOWN_KEY, UNSEALED, Sealer, sealer_for
from .trailer import (
    FOOTER, FOOTER_MAGIC, FOOTER_SIZE, TABLE_ENTRY, TABLE_MAGIC, Entry, build_trailer, framing, parse_footer,
    parse_trailer, process_token, trailer_size, writer_tag)

__all__ = [
    "DIGEST_CACHE_ENTRIES", "DTYPE_CODES", "DTYPE_ITEMSIZE", "DTYPE_NAMES", "DigestCache", "Entry", "FINGERPRINT_BYTES",
    "FOOTER", "FOOTER_MAGIC", "FOOTER_SIZE", "HEADER_SIZE", "Header", "MAGIC", "MARK_PREFIX", "MAX_MARK_BYTES",
    "NONCE_BYTES", "NS_AT", "OPENABLE_REASONS", "PLANES", "PURGE_NAME", "PurgeRules", "RAW", "Record", "RecordError",
    "SEAL_OVERHEAD", "Sealer", "TABLE_ENTRY", "TABLE_MAGIC", "TAG_BYTES", "UNKNOWN_KEY", "UNSEALED", "append_rules",
    "as_bytes_view", "build_record", "build_trailer", "decode_into", "digests", "dtype_code", "framing", "index_key",
    "is_mark_name", "key_digest", "key_id_text", "load_rules", "mark_bytes", "mark_name", "mark_verifies",
    "Namespace", "namespace_fingerprint", "parse_footer", "parse_trailer", "process_token", "raw_length", "sealer_for",
    "trailer_size", "unpack_header", "verify_record", "write_key_file", "writer_tag"
]
