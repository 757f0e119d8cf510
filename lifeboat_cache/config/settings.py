"""The frozen settings a store is built from (`Settings` and its parts), their defaults, the default store.

`load.py` builds them from lifeboat.yaml, overrides and the environment; everything else reads them.
Here only the types and what a missing key means, so a reader of a tier or the store sees every
setting and its default in one place without the parsing.

Core layer: imports only the ground floor (fsio: the write call bound; cpu_policy: the io threads' policies).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..cpu_policy import DEFAULT_POLICY as DEFAULT_IO_SCHEDULING

DEFAULT_IO_WORKERS = 8
DEFAULT_SEGMENT_BYTES = 256 << 20
DEFAULT_FAILURE_COOLDOWN_S = 1.0
DEFAULT_FAILURE_COOLDOWN_MAX_S = 60.0
DEFAULT_COPY_QUEUE_BYTES = 256 << 20
DEFAULT_DEADLINE_S = 2.0  # a data-path call (put / get_into) returns by then, whatever a tier does
MAX_KEY_NAMESPACE_BYTES = 64
COMPRESSIONS = ("auto", "zstd", "none")  # auto: raw on local tiers, compressed on nfs / s3


@dataclass(frozen=True)
class TierSettings:
    """One storage tier. `paths` has one entry per drive for `local`; S3 fields only for `s3`."""

    type: str
    paths: tuple[Path, ...] = ()
    capacity_bytes: int | None = None  # None: auto (half the free space, at most 64 GiB)
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    write_call_bytes: int = 0  # local / nfs: the largest single write call; 0: by free memory (fsio.WriteCallBound)
    affinity_chunks: int = 1
    refresh_interval_s: float = 1.0
    seal_after_s: float | None = None  # shared FS: seal (make visible to other hosts) after this long
    bucket: str | None = None
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 10.0
    max_attempts: int = 3
    retry_mode: str = "standard"
    addressing_style: str | None = None  # None: path with an endpoint_url, else boto3's default
    verify: bool = True  # TLS certificate check
    ca_bundle: Path | None = None
    profile: str | None = None  # AWS profile (role chains as boto3 resolves them)
    access_key_id_env: str | None = None  # names of env vars holding the keys, never the keys
    secret_access_key_env: str | None = None
    session_token_env: str | None = None
    sse: str | None = None  # AES256 (SSE-S3) or aws:kms (SSE-KMS)
    sse_kms_key_id: str | None = None
    storage_class: str | None = None
    max_concurrency: int | None = None  # S3 requests in flight; None: io_workers + background threads
    failure_cooldown_s: float | None = None  # None: engine default
    failure_cooldown_max_s: float | None = None
    compression: str | None = None  # None: engine.compression
    file_mode: int = 0o600  # local / nfs: store files and directories are owner-only by default
    max_age_s: float | None = None  # pages older than this are neither served nor kept (purge.py)
    dir_mode: int = 0o700


@dataclass(frozen=True)
class EngineSettings:
    io_workers: int = DEFAULT_IO_WORKERS
    compression: str = "auto"
    failure_cooldown_s: float = DEFAULT_FAILURE_COOLDOWN_S
    failure_cooldown_max_s: float = DEFAULT_FAILURE_COOLDOWN_MAX_S
    copy_queue_bytes: int = DEFAULT_COPY_QUEUE_BYTES
    # True when lifeboat.yaml set copy_queue_size to a size; absent or `auto`: the MLX shim sizes its
    # writer queue from the model (one context's KV), everything else uses copy_queue_bytes
    copy_queue_explicit: bool = False
    deadline_s: float = DEFAULT_DEADLINE_S
    trace: bool = False
    io_scheduling: str = DEFAULT_IO_SCHEDULING  # Linux policy of the io and copy threads (cpu_policy.py)


@dataclass(frozen=True)
class EncryptionSettings:
    """`encryption:`: sealed records (records/sealing.py). Paths of key files only, never key bytes: the
    files are read and checked (mode, length) when a store opens. Off when no key is configured."""

    keys: tuple[Path, ...] = ()  # the first seals, all open (rotation: add the new key first)
    # key_namespace -> its own keys: a process of that key_namespace seals and opens with these only
    namespace_keys: tuple[tuple[str, tuple[Path, ...]], ...] = ()
    require_sealed: bool = True  # plaintext records are misses (a writer without a key cannot plant)
    gc_drops_unreadable: bool = True  # `lifeboat gc` drops records none of the configured keys opens

    @property
    def enabled(self) -> bool:
        return bool(self.keys or self.namespace_keys)


@dataclass(frozen=True)
class Settings:
    storage: tuple[TierSettings, ...]
    engine: EngineSettings = field(default_factory=EngineSettings)
    model_id: str | None = None
    key_namespace: str = ""
    source: str = "embedded default"
    encryption: EncryptionSettings = field(default_factory=EncryptionSettings)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lifeboat"


def default_storage() -> tuple[TierSettings, ...]:
    return (TierSettings(type="local", paths=(default_cache_dir(),)),)

