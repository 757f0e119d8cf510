"""Settings: `lifeboat.yaml` (or the embedded default) -> one frozen, validated `Settings` object.

Lookup order for the file: `LIFEBOAT_CONFIG`, then `./lifeboat.yaml`, then
`~/.config/lifeboat/lifeboat.yaml`, else the embedded default (one local tier under
`$XDG_CACHE_HOME/lifeboat`, i.e. `~/.cache/lifeboat`). Unknown keys are errors: the file is written by
hand and a typo must not silently fall back to a default. Every error names the YAML path and the fix.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

import yaml

DEFAULT_IO_WORKERS = 8
DEFAULT_SEGMENT_BYTES = 256 << 20
DEFAULT_FAILURE_COOLDOWN_S = 1.0
DEFAULT_FAILURE_COOLDOWN_MAX_S = 60.0
DEFAULT_COPY_QUEUE_BYTES = 256 << 20
DEFAULT_AUTO_CAPACITY_MAX_BYTES = 64 << 30
DEFAULT_S3_REFRESH_INTERVAL_S = 5.0
DEFAULT_DEADLINE_S = 2.0  # a data-path call (put / get_into) returns by then, whatever a tier does
S3_ADDRESSING_STYLES = ("auto", "path", "virtual")
S3_SSE_MODES = ("AES256", "aws:kms")
S3_RETRY_MODES = ("standard", "adaptive", "legacy")
MAX_KEY_NAMESPACE_BYTES = 64
MAX_SIZE_BYTES = 1 << 60  # 1 EiB: any larger size is a typo, and would overflow 64-bit offsets
_MAX_NUMBER_CHARS = 64  # longer numerals are typos (and int() refuses > 4300 digits)
TIER_TYPES = ("local", "nfs", "s3")
COMPRESSIONS = ("auto", "zstd", "none")  # auto: raw on local tiers, compressed on nfs / s3


class ConfigError(ValueError):
    """A setting is invalid; the message names the key (YAML path or env var) and the fix."""


@dataclass(frozen=True)
class TierSettings:
    """One storage tier. `paths` has one entry per drive for `local`; S3 fields only for `s3`."""

    type: str
    paths: tuple[Path, ...] = ()
    capacity_bytes: int | None = None  # None: auto (half the free space, at most 64 GiB)
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
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


@dataclass(frozen=True)
class EncryptionSettings:
    """`encryption:`: sealed records (sealing.py). Paths of key files only, never key bytes: the
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


# ---------------------------------------------------------------- parsing helpers

# ASCII only: "²" or "٣" are not numbers in a config file (str.isdigit() would say they are)
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?i?B?)?\s*$", re.IGNORECASE | re.ASCII)
_INT_RE = re.compile(r"^\s*[+-]?[0-9]+\s*$", re.ASCII)


def _show(value: Any, limit: int = 80) -> str:
    """repr() for error messages that cannot itself fail (huge ints) or flood the log."""
    try:
        text = repr(value)
    except Exception:  # e.g. an int of more than 4300 digits
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"

_SIZE_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50,
}


def format_size(n: float, digits: int | None = None) -> str:
    """Bytes as text in binary units, the other way from parse_size: 512 B, 45 KiB, 1.4 GiB.

    `digits` decimals after the unit's number; by default one below 10 of a unit (when not whole)
    and none above, for log lines (256 MiB). Raises nothing."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    if digits is None:
        digits = 1 if value < 10 and value != int(value) else 0
    return f"{value:.{digits}f} {unit}"


def parse_size(value: Any, where: str) -> int:
    """'500GiB', '1.5TB', '64MiB' or an int (bytes) -> bytes, at most MAX_SIZE_BYTES."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a size such as 500GiB or 64MiB, got {_show(value)}")
    n: int | None = None
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"{where}: must be > 0 bytes, got {_show(value)}")
        n = value
    elif isinstance(value, str) and len(value) <= _MAX_NUMBER_CHARS:
        m = _SIZE_RE.match(value)
        if m and (m.group(2) or "").upper() in _SIZE_UNITS:
            # exact decimal arithmetic: float() would overflow or round "1.1TB"
            n = int(Fraction(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").upper()])
            if n <= 0:
                n = None
    if n is None:
        raise ConfigError(f"{where}: expected a size such as 500GiB, 2TB or 64MiB, got {_show(value)}")
    if n > MAX_SIZE_BYTES:
        raise ConfigError(f"{where}: {_show(value)} is larger than the 1 EiB limit; give a size such as 500GiB")
    return n


def parse_mode(value: Any, where: str, top: int, need: int) -> int:
    """A permission mode: an int (YAML 0640 / 0o640) or an octal string ("0640"); the owner's bits `need` kept."""
    if isinstance(value, str) and re.fullmatch(r"\s*(0o?)?[0-7]{1,4}\s*", value):
        value = int(value.strip().removeprefix("0o") or "0", 8)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top or value & need != need:
        raise ConfigError(f"{where}: expected an octal mode such as \"{need | 0o040:04o}\" (owner bits {need:#o} "
                          f"required, at most {top:#o}, no setuid/sticky bits), got {value!r}")
    return value


def _parse_int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and len(value) <= _MAX_NUMBER_CHARS and _INT_RE.match(value):
            value = int(value)
        else:
            raise ConfigError(f"{where}: expected an integer between {lo} and {hi}, got {_show(value)}")
    if not lo <= value <= hi:
        raise ConfigError(f"{where}: must be between {lo} and {hi}, got {_show(value)}")
    return value


def _parse_float(value: Any, where: str, lo: float, hi: float) -> float:
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        if isinstance(value, str) and (len(value) > _MAX_NUMBER_CHARS or not value.isascii()):
            raise ValueError
        f = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond 1e308
        raise ConfigError(f"{where}: expected a number between {lo} and {hi}, got {_show(value)}") from None
    if not lo <= f <= hi:  # also rejects nan
        raise ConfigError(f"{where}: must be between {lo} and {hi}, got {_show(value)}")
    return f


def _parse_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):  # no str(): a huge int cannot be printed
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{where}: expected true or false, got {_show(value)}")


def _parse_choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}; got {_show(value)}")
    return value


def _parse_str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {_show(value)}")
    if "\0" in value or not _encodable(value):
        raise ConfigError(f"{where}: {_show(value)} contains a NUL or an unpaired surrogate; use plain text")
    return value


def _encodable(value: str) -> bool:
    try:
        value.encode()
        return True
    except UnicodeEncodeError:  # lone surrogates, e.g. from a YAML "\ud800" escape
        return False


def _check_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted((_show(k, 40) if not isinstance(k, str) else k for k in set(obj) - allowed))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed keys are {', '.join(sorted(allowed))}"
        )


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lifeboat"


_TIER_COMMON = {"type", "capacity", "failure_cooldown_s", "failure_cooldown_max_s", "compression"}
_TIER_KEYS = {
    "local": _TIER_COMMON | {"path", "paths", "segment_size", "affinity_chunks", "refresh_interval_s",
                             "file_mode", "dir_mode", "max_age"},
    "nfs": _TIER_COMMON | {"path", "segment_size", "refresh_interval_s", "seal_after_s", "file_mode", "dir_mode",
                           "max_age"},
    "s3": _TIER_COMMON | {"bucket", "prefix", "endpoint_url", "region", "connect_timeout_s",
                          "read_timeout_s", "max_attempts", "refresh_interval_s", "retry_mode",
                          "addressing_style", "verify", "ca_bundle", "profile", "access_key_id_env",
                          "secret_access_key_env", "session_token_env", "sse", "sse_kms_key_id",
                          "storage_class", "max_concurrency"},
}


def parse_tier(obj: Any, where: str) -> TierSettings:
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a mapping with a 'type' key (local, nfs or s3), got {_show(obj)}")
    kind = _parse_choice(obj.get("type"), f"{where}.type", TIER_TYPES)
    _check_keys(obj, _TIER_KEYS[kind], where)
    kw: dict[str, Any] = {"type": kind}
    if kind in ("local", "nfs"):
        if "path" in obj and "paths" in obj:
            raise ConfigError(f"{where}: give either 'path' or 'paths', not both")
        raw = obj.get("paths", [obj["path"]] if "path" in obj else None)
        if not raw:
            raise ConfigError(f"{where}.path: required for a {kind} tier (a directory, e.g. /mnt/nvme/lifeboat)")
        if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
            raise ConfigError(f"{where}.paths: expected a list of directories, got {_show(raw)}")
        kw["paths"] = tuple(Path(os.path.expanduser(_parse_str(p, f"{where}.paths[{i}]"))) for i, p in enumerate(raw))
        if "segment_size" in obj:
            seg = parse_size(obj["segment_size"], f"{where}.segment_size")
            if not (1 << 20) <= seg <= (4 << 30):
                raise ConfigError(f"{where}.segment_size: must be between 1MiB and 4GiB, got {_show(obj['segment_size'])}")
            kw["segment_bytes"] = seg
        if "affinity_chunks" in obj:
            kw["affinity_chunks"] = _parse_int(obj["affinity_chunks"], f"{where}.affinity_chunks", 1, 1 << 20)
        if "refresh_interval_s" in obj:
            kw["refresh_interval_s"] = _parse_float(obj["refresh_interval_s"], f"{where}.refresh_interval_s", 0.05, 3600)
        if "seal_after_s" in obj:
            kw["seal_after_s"] = _parse_float(obj["seal_after_s"], f"{where}.seal_after_s", 0.1, 86400)
        elif kind == "nfs":
            kw["seal_after_s"] = 2.0
        for k, top, need in (("file_mode", 0o666, 0o600), ("dir_mode", 0o777, 0o700)):
            if k in obj:
                kw[k] = parse_mode(obj[k], f"{where}.{k}", top, need)
    else:
        kw["bucket"] = _parse_str(obj.get("bucket"), f"{where}.bucket")
        if "prefix" in obj:
            if not isinstance(obj["prefix"], str):
                raise ConfigError(f"{where}.prefix: expected a string such as 'lifeboat/', got {_show(obj['prefix'])}")
            kw["prefix"] = obj["prefix"]
        if obj.get("region") is not None:
            kw["region"] = _parse_str(obj["region"], f"{where}.region")
        if obj.get("endpoint_url") is not None:
            kw["endpoint_url"] = parse_endpoint_url(obj["endpoint_url"], f"{where}.endpoint_url")
        for k in ("connect_timeout_s", "read_timeout_s"):
            if k in obj:
                kw[k] = _parse_float(obj[k], f"{where}.{k}", 0.05, 600)
        if "max_attempts" in obj:
            kw["max_attempts"] = _parse_int(obj["max_attempts"], f"{where}.max_attempts", 1, 20)
        _parse_s3_options(obj, where, kw)
        # each refresh is one LIST request per host: less often than on a file system
        kw["refresh_interval_s"] = _parse_float(obj.get("refresh_interval_s", DEFAULT_S3_REFRESH_INTERVAL_S),
                                                f"{where}.refresh_interval_s", 0.05, 3600)
    if obj.get("capacity") not in (None, "auto"):
        kw["capacity_bytes"] = parse_size(obj["capacity"], f"{where}.capacity")
    for k in ("failure_cooldown_s", "failure_cooldown_max_s"):
        if k in obj:
            kw[k] = _parse_float(obj[k], f"{where}.{k}", 0.0, 86400)
    if "compression" in obj:
        kw["compression"] = _parse_choice(obj["compression"], f"{where}.compression", COMPRESSIONS)
    if obj.get("max_age") is not None:
        kw["max_age_s"] = parse_age(obj["max_age"], f"{where}.max_age")
    return TierSettings(**kw)


def parse_endpoint_url(value: Any, where: str) -> str:
    """An S3 endpoint: an http(s) URL with a host and nothing after it but an optional path.

    botocore accepts nearly any string here and fails at the first request with an error that does
    not name the config key; checked at load, the key is named with a valid example.
    """
    from urllib.parse import urlsplit

    text = _parse_str(value, where)
    example = "e.g. https://s3.us-east-1.amazonaws.com or http://127.0.0.1:9000"
    try:
        parts = urlsplit(text)
        port = parts.port  # ValueError for a port out of range or not a number
    except ValueError as e:
        raise ConfigError(f"{where}: {_show(text)} is not a URL ({e}); expected http(s)://host[:port], {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: {_show(text)} is not an http(s) URL with a host; expected http(s)://host[:port], "
                          f"{example}")
    if parts.query or parts.fragment or parts.username or parts.password or any(c.isspace() for c in text):
        raise ConfigError(f"{where}: {_show(text)}: no credentials, query, fragment or spaces in an endpoint URL "
                          f"(keys go in access_key_id_env / secret_access_key_env); {example}")
    del port
    return text


AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(value: Any, where: str) -> float:
    """'90s', '30m', '24h', '7d', '2w' or a number of seconds -> seconds (> 0)."""
    text = str(value).strip().lower() if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
    try:
        v = float(text[:-1]) * AGE_UNITS[text[-1]] if text[-1:] in AGE_UNITS else float(text)
    except ValueError:
        v = -1.0
    if not v > 0 or v != v or v == float("inf"):
        raise ConfigError(f"{where}: expected an age such as 90s, 30m, 24h or 7d, got {_show(value)}")
    return v


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _parse_s3_options(obj: Mapping[str, Any], where: str, kw: dict[str, Any]) -> None:
    """Operator options of one S3 tier: TLS, addressing, credentials by env var name, SSE, retries."""
    if "retry_mode" in obj:
        kw["retry_mode"] = _parse_choice(obj["retry_mode"], f"{where}.retry_mode", S3_RETRY_MODES)
    if obj.get("addressing_style") is not None:
        kw["addressing_style"] = _parse_choice(obj["addressing_style"], f"{where}.addressing_style",
                                               S3_ADDRESSING_STYLES)
    if "verify" in obj:
        kw["verify"] = _parse_bool(obj["verify"], f"{where}.verify")
    if obj.get("ca_bundle") is not None:
        ca = Path(os.path.expanduser(_parse_str(obj["ca_bundle"], f"{where}.ca_bundle")))
        if not ca.is_file():
            raise ConfigError(f"{where}.ca_bundle: {ca} is not a file; give the PEM file of your CA")
        kw["ca_bundle"] = ca
    if obj.get("profile") is not None:
        kw["profile"] = _parse_str(obj["profile"], f"{where}.profile")
    for k in ("access_key_id_env", "secret_access_key_env", "session_token_env"):
        if obj.get(k) is not None:
            name = _parse_str(obj[k], f"{where}.{k}")
            if not _ENV_NAME_RE.match(name):
                raise ConfigError(f"{where}.{k}: give the NAME of an environment variable (e.g. ONTAP_S3_KEY), "
                                  f"never the key itself; got a value that is not a variable name")
            kw[k] = name
    if ("access_key_id_env" in kw) != ("secret_access_key_env" in kw):
        raise ConfigError(f"{where}: access_key_id_env and secret_access_key_env go together; give both")
    if "access_key_id_env" in kw and "profile" in kw:
        raise ConfigError(f"{where}: give either profile or access_key_id_env/secret_access_key_env, not both")
    if obj.get("sse") is not None:
        kw["sse"] = _parse_choice(obj["sse"], f"{where}.sse", S3_SSE_MODES)
    if obj.get("sse_kms_key_id") is not None:
        kw["sse_kms_key_id"] = _parse_str(obj["sse_kms_key_id"], f"{where}.sse_kms_key_id")
        if kw.get("sse") != "aws:kms":
            raise ConfigError(f"{where}.sse_kms_key_id: needs sse: aws:kms")
    if obj.get("storage_class") is not None:
        kw["storage_class"] = _parse_str(obj["storage_class"], f"{where}.storage_class")
    if obj.get("max_concurrency") is not None:
        kw["max_concurrency"] = _parse_int(obj["max_concurrency"], f"{where}.max_concurrency", 1, 1024)


def parse_queue_size(value: Any, where: str) -> int | None:
    """`copy_queue_size`: a size (bytes), or `auto` -> None (the MLX shim sizes its writer queue from the
    model; the copier to lower tiers keeps DEFAULT_COPY_QUEUE_BYTES)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    try:
        return parse_size(value, where)
    except ConfigError as e:
        raise ConfigError(f"{e}; or write auto (the default: on MLX one context's KV, at least 256MiB; "
                          f"elsewhere 256MiB)") from None


_ENGINE_KEYS = {"io_workers", "compression", "failure_cooldown_s", "failure_cooldown_max_s",
                "copy_queue_size", "deadline_s", "trace"}


def parse_engine(obj: Any, where: str = "engine") -> EngineSettings:
    if obj is None:
        return EngineSettings()
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {_show(obj)}")
    _check_keys(obj, _ENGINE_KEYS, where)
    kw: dict[str, Any] = {}
    if "io_workers" in obj:
        kw["io_workers"] = _parse_int(obj["io_workers"], f"{where}.io_workers", 1, 256)
    if "compression" in obj:
        kw["compression"] = _parse_choice(obj["compression"], f"{where}.compression", COMPRESSIONS)
    if "failure_cooldown_s" in obj:
        kw["failure_cooldown_s"] = _parse_float(obj["failure_cooldown_s"], f"{where}.failure_cooldown_s", 0.0, 86400)
    if "failure_cooldown_max_s" in obj:
        kw["failure_cooldown_max_s"] = _parse_float(
            obj["failure_cooldown_max_s"], f"{where}.failure_cooldown_max_s", 0.0, 86400)
    if "copy_queue_size" in obj:
        size = parse_queue_size(obj["copy_queue_size"], f"{where}.copy_queue_size")
        if size is not None:
            kw["copy_queue_bytes"], kw["copy_queue_explicit"] = size, True
    if "trace" in obj:
        kw["trace"] = _parse_bool(obj["trace"], f"{where}.trace")
    if "deadline_s" in obj:
        kw["deadline_s"] = _parse_float(obj["deadline_s"], f"{where}.deadline_s", 0.05, 600)
    eng = EngineSettings(**kw)
    if eng.failure_cooldown_max_s < eng.failure_cooldown_s:
        raise ConfigError(
            f"{where}.failure_cooldown_max_s ({eng.failure_cooldown_max_s}) must be >= "
            f"failure_cooldown_s ({eng.failure_cooldown_s})")
    return eng


def parse_key_namespace(value: Any, where: str = "key_namespace") -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or not _encodable(value):
        raise ConfigError(
            f"{where}: expected a UTF-8 string of at most {MAX_KEY_NAMESPACE_BYTES} bytes, got {_show(value)}")
    if len(value.encode()) > MAX_KEY_NAMESPACE_BYTES:
        raise ConfigError(
            f"{where}: {len(value.encode())} bytes is too long; use at most {MAX_KEY_NAMESPACE_BYTES} bytes")
    return value


_ENCRYPTION_KEYS = {"keys", "namespace_keys", "require_sealed", "gc_drops_unreadable"}
ENV_KEY_FILE = "LIFEBOAT_KEY_FILE"


def _key_paths(value: Any, where: str) -> tuple[Path, ...]:
    raw = [value] if isinstance(value, str) else value
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError(f"{where}: expected a key file path or a list of them (the first seals), got {_show(value)}")
    return tuple(Path(os.path.expanduser(_parse_str(p, f"{where}[{i}]"))) for i, p in enumerate(raw))


def parse_encryption(obj: Any, where: str = "encryption") -> EncryptionSettings:
    """`encryption:` -> EncryptionSettings; absent, null or false: off. Key files are checked at open."""
    if obj is None or obj is False or (isinstance(obj, str) and obj.strip().lower() in ("off", "false", "no")):
        return EncryptionSettings()
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a mapping such as {{keys: [/etc/lifeboat/seal.key]}}, got {_show(obj)}")
    _check_keys(obj, _ENCRYPTION_KEYS, where)
    kw: dict[str, Any] = {}
    if obj.get("keys") is not None:
        kw["keys"] = _key_paths(obj["keys"], f"{where}.keys")
    ns_raw = obj.get("namespace_keys")
    if ns_raw is not None:
        if not isinstance(ns_raw, Mapping) or not ns_raw:
            raise ConfigError(f"{where}.namespace_keys: expected a mapping key_namespace -> key file(s), "
                              f"got {_show(ns_raw)}")
        kw["namespace_keys"] = tuple(
            (parse_key_namespace(name, f"{where}.namespace_keys key {_show(name, 40)}"),
             _key_paths(paths, f"{where}.namespace_keys.{name}")) for name, paths in ns_raw.items())
    for k in ("require_sealed", "gc_drops_unreadable"):
        if k in obj:
            kw[k] = _parse_bool(obj[k], f"{where}.{k}")
    enc = EncryptionSettings(**kw)
    if not enc.enabled:
        raise ConfigError(f"{where}: give keys (a key file, or a list: the first seals) or namespace_keys; "
                          "create a key with `lifeboat keygen PATH`, or remove the section to turn sealing off")
    return enc


def parse_key_file_env(env: Mapping[str, str]) -> tuple[Path, ...] | None:
    """LIFEBOAT_KEY_FILE: key file path(s), separated by os.pathsep (the first seals); replaces
    `encryption.keys` and so turns sealing on. None when unset or blank."""
    value = env.get(ENV_KEY_FILE)
    if value is None or not value.strip():
        return None
    parts = [p.strip() for p in value.split(os.pathsep)]
    if any(not p or "\0" in p for p in parts):
        raise ConfigError(f"{ENV_KEY_FILE}={value[:200]!r}: expected key file paths separated by "
                          f"{os.pathsep!r} (the first seals), with no empty entry")
    paths = tuple(Path(os.path.expanduser(p)) for p in parts)
    for p in paths:  # mode and length are checked when a store opens (sealing.read_key_file)
        if not p.is_file():
            raise ConfigError(f"{ENV_KEY_FILE}={value[:200]!r}: key file {p} does not exist; create one with "
                              f"`lifeboat keygen {p}`, or fix the path, or unset {ENV_KEY_FILE}")
    return paths


_TOP_KEYS = {"storage", "engine", "model_id", "key_namespace", "encryption"}


def settings_from_dict(obj: Any, source: str = "<dict>") -> Settings:
    """Validate a parsed `lifeboat.yaml` document; every ConfigError names `source` and the key."""
    try:
        return _settings_from_dict(obj, source)
    except ConfigError as e:
        raise _from_source(e, source) from None


def _from_source(err: ConfigError, source: str) -> ConfigError:
    """The same error, prefixed with the file (or other source) the bad value came from."""
    msg = str(err)
    return err if msg.startswith(f"{source}") else ConfigError(f"{source}: {msg}")


def _settings_from_dict(obj: Any, source: str) -> Settings:
    if obj is None:
        obj = {}
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping with keys {', '.join(sorted(_TOP_KEYS))}")
    _check_keys(obj, _TOP_KEYS, f"{source}: top level")
    storage_raw = obj.get("storage")
    if storage_raw is None:
        storage = default_storage()
    else:
        if not isinstance(storage_raw, list) or not storage_raw:
            raise ConfigError(f"{source}: storage: expected a non-empty list of tiers, fastest first")
        storage = tuple(parse_tier(t, f"storage[{i}]") for i, t in enumerate(storage_raw))
    model_id = obj.get("model_id")
    if model_id is not None:
        model_id = _parse_str(model_id, "model_id")
    return Settings(
        storage=storage,
        engine=parse_engine(obj.get("engine")),
        model_id=model_id,
        key_namespace=parse_key_namespace(obj.get("key_namespace")),
        source=source,
        encryption=parse_encryption(obj.get("encryption")),
    )


def default_storage() -> tuple[TierSettings, ...]:
    return (TierSettings(type="local", paths=(default_cache_dir(),)),)


def find_config_file(env: Mapping[str, str] | None = None) -> Path | None:
    env = os.environ if env is None else env
    explicit = env.get("LIFEBOAT_CONFIG")
    if explicit:
        try:
            p = Path(os.path.expanduser(explicit))
            found = p.is_file()
        except (OSError, ValueError):  # a name too long for the file system, a NUL
            found = False
        if not found:
            raise ConfigError(
                f"LIFEBOAT_CONFIG={explicit[:200]!r}: no such file; point it at a lifeboat.yaml or unset it")
        return p
    try:
        home: list[Path] = [Path.home() / ".config" / "lifeboat" / "lifeboat.yaml"]
    except RuntimeError:  # no HOME and no passwd entry: only ./lifeboat.yaml can be found
        home = []
    for p in (Path("lifeboat.yaml"), *home):
        if p.is_file():
            return p
    return None


def read_config_file(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file ({e.strerror}); check the path and permissions") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (bad byte at offset {e.start}); save the file as UTF-8") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e}); fix the syntax at the position shown") from None
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deeply; lifeboat.yaml needs at most three levels") from None
    except ValueError as e:  # PyYAML's int(): a numeral of more than 4300 digits
        raise ConfigError(f"{path}: a value cannot be read ({str(e)[:120]}); use a number of normal length") from None


def apply_overrides(settings: Settings, overrides: Mapping[str, Any], source: str = "overrides") -> Settings:
    """Overlay a dict with the same names as lifeboat.yaml (nested, or flat engine keys) on `settings`.

    Used for SGLang's `--hicache-storage-backend-extra-config`, where keys are usually flat.
    """
    if overrides is None:
        return settings
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{source}: expected a mapping of lifeboat.yaml keys, got {_show(overrides)}")
    if not overrides:
        return settings
    _check_keys(overrides, _TOP_KEYS | _ENGINE_KEYS, source)
    engine_fields = {k: v for k, v in overrides.items() if k in _ENGINE_KEYS}
    engine_raw = overrides.get("engine")
    if engine_raw is not None and not isinstance(engine_raw, Mapping):
        raise ConfigError(f"{source}.engine: expected a mapping such as {{\"io_workers\": 4}}, "
                          f"got {_show(engine_raw)}")
    nested = dict(engine_raw or {})
    nested.update(engine_fields)
    out = settings
    if nested:
        base = {k: getattr(settings.engine, k) for k in ("io_workers", "compression", "failure_cooldown_s",
                                                          "failure_cooldown_max_s", "deadline_s", "trace")}
        if settings.engine.copy_queue_explicit:  # else absent: it stays auto unless an override sets it
            base["copy_queue_size"] = settings.engine.copy_queue_bytes
        base.update(nested)
        out = replace(out, engine=parse_engine(base, f"{source}.engine"))
    if "storage" in overrides:
        storage_raw = overrides["storage"]
        if not isinstance(storage_raw, list) or not storage_raw:
            raise ConfigError(f"{source}.storage: expected a non-empty list of tiers, fastest first")
        out = replace(out, storage=tuple(parse_tier(t, f"{source}.storage[{i}]") for i, t in enumerate(storage_raw)))
    if "model_id" in overrides and overrides["model_id"] is not None:
        out = replace(out, model_id=_parse_str(overrides["model_id"], f"{source}.model_id"))
    if "key_namespace" in overrides:
        out = replace(out, key_namespace=parse_key_namespace(overrides["key_namespace"], f"{source}.key_namespace"))
    if "encryption" in overrides:
        out = replace(out, encryption=parse_encryption(overrides["encryption"], f"{source}.encryption"))
    return replace(out, source=f"{settings.source} + {source}")


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    overrides_source: str = "overrides",
) -> Settings:
    """Load settings from `path`, else the usual lookup order, then apply `overrides`.

    Raises ConfigError (only) for a bad file, override or LIFEBOAT_CONFIG; its message names the
    source (`overrides_source` for `overrides`), the key and the fix.
    """
    p = Path(path) if path is not None else find_config_file(env)
    if p is None:
        settings = Settings(storage=default_storage())
    else:
        settings = settings_from_dict(read_config_file(p), source=str(p))
    keys = parse_key_file_env(os.environ if env is None else env)
    if keys is not None:  # the key source from the environment (a secret mount) replaces the file's
        settings = replace(settings, encryption=replace(settings.encryption, keys=keys))
    return apply_overrides(settings, overrides if overrides is not None else {}, overrides_source)
