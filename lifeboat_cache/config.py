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
MAX_KEY_NAMESPACE_BYTES = 64
TIER_TYPES = ("local", "nfs", "s3")
COMPRESSIONS = ("zstd", "none")


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
    failure_cooldown_s: float | None = None  # None: engine default
    failure_cooldown_max_s: float | None = None
    file_mode: int = 0o600  # local / nfs: store files and directories are owner-only by default
    dir_mode: int = 0o700


@dataclass(frozen=True)
class EngineSettings:
    io_workers: int = DEFAULT_IO_WORKERS
    compression: str = "zstd"
    failure_cooldown_s: float = DEFAULT_FAILURE_COOLDOWN_S
    failure_cooldown_max_s: float = DEFAULT_FAILURE_COOLDOWN_MAX_S
    copy_queue_bytes: int = DEFAULT_COPY_QUEUE_BYTES
    trace: bool = False


@dataclass(frozen=True)
class Settings:
    storage: tuple[TierSettings, ...]
    engine: EngineSettings = field(default_factory=EngineSettings)
    model_id: str | None = None
    key_namespace: str = ""
    source: str = "embedded default"


# ---------------------------------------------------------------- parsing helpers

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?i?B?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50,
}


def parse_size(value: Any, where: str) -> int:
    """'500GiB', '1.5TB', '64MiB' or an int (bytes) -> bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a size such as 500GiB or 64MiB, got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"{where}: must be > 0 bytes, got {value}")
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and (m.group(2) or "").upper() in _SIZE_UNITS:
            n = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").upper()])
            if n > 0:
                return n
    raise ConfigError(f"{where}: expected a size such as 500GiB, 2TB or 64MiB, got {value!r}")


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
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        else:
            raise ConfigError(f"{where}: expected an integer between {lo} and {hi}, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{where}: must be between {lo} and {hi}, got {value}")
    return value


def _parse_float(value: Any, where: str, lo: float, hi: float) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a number between {lo} and {hi}, got {value!r}") from None
    if not lo <= f <= hi:
        raise ConfigError(f"{where}: must be between {lo} and {hi}, got {value}")
    return f


def _parse_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, str)) and str(value).strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, (int, str)) and str(value).strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{where}: expected true or false, got {value!r}")


def _parse_choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}; got {value!r}")
    return value


def _parse_str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _check_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed keys are {', '.join(sorted(allowed))}"
        )


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lifeboat"


_TIER_COMMON = {"type", "capacity", "failure_cooldown_s", "failure_cooldown_max_s"}
_TIER_KEYS = {
    "local": _TIER_COMMON | {"path", "paths", "segment_size", "affinity_chunks", "refresh_interval_s",
                             "file_mode", "dir_mode"},
    "nfs": _TIER_COMMON | {"path", "segment_size", "refresh_interval_s", "seal_after_s", "file_mode", "dir_mode"},
    "s3": _TIER_COMMON | {"bucket", "prefix", "endpoint_url", "region", "connect_timeout_s",
                          "read_timeout_s", "max_attempts", "refresh_interval_s"},
}


def parse_tier(obj: Any, where: str) -> TierSettings:
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a mapping with a 'type' key (local, nfs or s3), got {obj!r}")
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
            raise ConfigError(f"{where}.paths: expected a list of directories, got {raw!r}")
        kw["paths"] = tuple(Path(os.path.expanduser(_parse_str(p, f"{where}.paths[{i}]"))) for i, p in enumerate(raw))
        if "segment_size" in obj:
            seg = parse_size(obj["segment_size"], f"{where}.segment_size")
            if not (1 << 20) <= seg <= (4 << 30):
                raise ConfigError(f"{where}.segment_size: must be between 1MiB and 4GiB, got {obj['segment_size']!r}")
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
                raise ConfigError(f"{where}.prefix: expected a string such as 'lifeboat/', got {obj['prefix']!r}")
            kw["prefix"] = obj["prefix"]
        for k in ("endpoint_url", "region"):
            if obj.get(k) is not None:
                kw[k] = _parse_str(obj[k], f"{where}.{k}")
        for k in ("connect_timeout_s", "read_timeout_s"):
            if k in obj:
                kw[k] = _parse_float(obj[k], f"{where}.{k}", 0.05, 600)
        if "max_attempts" in obj:
            kw["max_attempts"] = _parse_int(obj["max_attempts"], f"{where}.max_attempts", 1, 20)
        # each refresh is one LIST request per host: less often than on a file system
        kw["refresh_interval_s"] = _parse_float(obj.get("refresh_interval_s", DEFAULT_S3_REFRESH_INTERVAL_S),
                                                f"{where}.refresh_interval_s", 0.05, 3600)
    if obj.get("capacity") not in (None, "auto"):
        kw["capacity_bytes"] = parse_size(obj["capacity"], f"{where}.capacity")
    for k in ("failure_cooldown_s", "failure_cooldown_max_s"):
        if k in obj:
            kw[k] = _parse_float(obj[k], f"{where}.{k}", 0.0, 86400)
    return TierSettings(**kw)


_ENGINE_KEYS = {"io_workers", "compression", "failure_cooldown_s", "failure_cooldown_max_s",
                "copy_queue_size", "trace"}


def parse_engine(obj: Any, where: str = "engine") -> EngineSettings:
    if obj is None:
        return EngineSettings()
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {obj!r}")
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
        kw["copy_queue_bytes"] = parse_size(obj["copy_queue_size"], f"{where}.copy_queue_size")
    if "trace" in obj:
        kw["trace"] = _parse_bool(obj["trace"], f"{where}.trace")
    eng = EngineSettings(**kw)
    if eng.failure_cooldown_max_s < eng.failure_cooldown_s:
        raise ConfigError(
            f"{where}.failure_cooldown_max_s ({eng.failure_cooldown_max_s}) must be >= "
            f"failure_cooldown_s ({eng.failure_cooldown_s})")
    return eng


def parse_key_namespace(value: Any, where: str = "key_namespace") -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string of at most {MAX_KEY_NAMESPACE_BYTES} bytes, got {value!r}")
    if len(value.encode()) > MAX_KEY_NAMESPACE_BYTES:
        raise ConfigError(
            f"{where}: {len(value.encode())} bytes is too long; use at most {MAX_KEY_NAMESPACE_BYTES} bytes")
    return value


_TOP_KEYS = {"storage", "engine", "model_id", "key_namespace"}


def settings_from_dict(obj: Any, source: str = "<dict>") -> Settings:
    """Validate a parsed `lifeboat.yaml` document."""
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
    )


def default_storage() -> tuple[TierSettings, ...]:
    return (TierSettings(type="local", paths=(default_cache_dir(),)),)


def find_config_file(env: Mapping[str, str] | None = None) -> Path | None:
    env = os.environ if env is None else env
    explicit = env.get("LIFEBOAT_CONFIG")
    if explicit:
        p = Path(os.path.expanduser(explicit))
        if not p.is_file():
            raise ConfigError(f"LIFEBOAT_CONFIG={explicit}: no such file; point it at a lifeboat.yaml or unset it")
        return p
    for p in (Path("lifeboat.yaml"), Path.home() / ".config" / "lifeboat" / "lifeboat.yaml"):
        if p.is_file():
            return p
    return None


def read_config_file(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file ({e.strerror}); check the path and permissions") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e}); fix the syntax at the position shown") from None


def apply_overrides(settings: Settings, overrides: Mapping[str, Any], source: str = "overrides") -> Settings:
    """Overlay a dict with the same names as lifeboat.yaml (nested, or flat engine keys) on `settings`.

    Used for SGLang's `--hicache-storage-backend-extra-config`, where keys are usually flat.
    """
    if not overrides:
        return settings
    engine_fields = {k: v for k, v in overrides.items() if k in _ENGINE_KEYS}
    nested = dict(overrides.get("engine") or {})
    nested.update(engine_fields)
    unknown = set(overrides) - _TOP_KEYS - _ENGINE_KEYS
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))}; allowed are "
            f"{', '.join(sorted(_TOP_KEYS | _ENGINE_KEYS))}")
    out = settings
    if nested:
        base = {k: getattr(settings.engine, k) for k in ("io_workers", "compression", "failure_cooldown_s",
                                                          "failure_cooldown_max_s", "trace")}
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
    return replace(out, source=f"{settings.source} + {source}")


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Load settings from `path`, else the usual lookup order, then apply `overrides`."""
    p = Path(path) if path is not None else find_config_file(env)
    if p is None:
        settings = Settings(storage=default_storage())
    else:
        settings = settings_from_dict(read_config_file(p), source=str(p))
    return apply_overrides(settings, overrides or {})
