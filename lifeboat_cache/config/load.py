"""Settings: `lifeboat.yaml` (or the embedded default) -> one frozen, validated `Settings` object.

Lookup order for the file: `LIFEBOAT_CONFIG`, then `./lifeboat.yaml`, then
`~/.config/lifeboat/lifeboat.yaml`, else the embedded default (one local tier under
`$XDG_CACHE_HOME/lifeboat`, i.e. `~/.cache/lifeboat`). Unknown keys are errors: the file is written by
hand and a typo must not silently fall back to a default. Every error names the YAML path and the fix.

This module reads the document (engine, key namespace, encryption, the file's lookup and reading,
overrides, LIFEBOAT_KEY_FILE, `load_settings`); one value's parsing is in values.py, one `storage:`
entry's in storage.py, the frozen types in settings.py.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..cpu_policy import POLICIES as IO_SCHEDULING
from .settings import (
    COMPRESSIONS, MAX_KEY_NAMESPACE_BYTES, EncryptionSettings, EngineSettings, Settings, default_storage)
from .storage import parse_tier
from .values import (
    ConfigError, check_keys, is_encodable, parse_bool, parse_choice, parse_float, parse_int, parse_size, parse_str,
    show_value)


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
                "copy_queue_size", "deadline_s", "trace", "io_scheduling"}


def parse_engine(obj: Any, where: str = "engine") -> EngineSettings:
    if obj is None:
        return EngineSettings()
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {show_value(obj)}")
    check_keys(obj, _ENGINE_KEYS, where)
    kw: dict[str, Any] = {}
    if "io_workers" in obj:
        kw["io_workers"] = parse_int(obj["io_workers"], f"{where}.io_workers", 1, 256)
    if "compression" in obj:
        kw["compression"] = parse_choice(obj["compression"], f"{where}.compression", COMPRESSIONS)
    if "failure_cooldown_s" in obj:
        kw["failure_cooldown_s"] = parse_float(obj["failure_cooldown_s"], f"{where}.failure_cooldown_s", 0.0, 86400)
    if "failure_cooldown_max_s" in obj:
        kw["failure_cooldown_max_s"] = parse_float(
            obj["failure_cooldown_max_s"], f"{where}.failure_cooldown_max_s", 0.0, 86400)
    if "copy_queue_size" in obj:
        size = parse_queue_size(obj["copy_queue_size"], f"{where}.copy_queue_size")
        if size is not None:
            kw["copy_queue_bytes"], kw["copy_queue_explicit"] = size, True
    if "trace" in obj:
        kw["trace"] = parse_bool(obj["trace"], f"{where}.trace")
    if "deadline_s" in obj:
        kw["deadline_s"] = parse_float(obj["deadline_s"], f"{where}.deadline_s", 0.05, 600)
    if "io_scheduling" in obj:
        kw["io_scheduling"] = parse_choice(obj["io_scheduling"], f"{where}.io_scheduling", IO_SCHEDULING)
    eng = EngineSettings(**kw)
    if eng.failure_cooldown_max_s < eng.failure_cooldown_s:
        raise ConfigError(
            f"{where}.failure_cooldown_max_s ({eng.failure_cooldown_max_s}) must be >= "
            f"failure_cooldown_s ({eng.failure_cooldown_s})")
    return eng


def parse_key_namespace(value: Any, where: str = "key_namespace") -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or not is_encodable(value):
        raise ConfigError(
            f"{where}: expected a UTF-8 string of at most {MAX_KEY_NAMESPACE_BYTES} bytes, got {show_value(value)}")
    if len(value.encode()) > MAX_KEY_NAMESPACE_BYTES:
        raise ConfigError(
            f"{where}: {len(value.encode())} bytes is too long; use at most {MAX_KEY_NAMESPACE_BYTES} bytes")
    return value


_ENCRYPTION_KEYS = {"keys", "namespace_keys", "require_sealed", "gc_drops_unreadable"}
ENV_KEY_FILE = "LIFEBOAT_KEY_FILE"


def _key_paths(value: Any, where: str) -> tuple[Path, ...]:
    raw = [value] if isinstance(value, str) else value
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError(f"{where}: expected a key file path or a list of them (the first seals), "
                          f"got {show_value(value)}")
    return tuple(Path(os.path.expanduser(parse_str(p, f"{where}[{i}]"))) for i, p in enumerate(raw))


def parse_encryption(obj: Any, where: str = "encryption") -> EncryptionSettings:
    """`encryption:` -> EncryptionSettings; absent, null or false: off. Key files are checked at open."""
    if obj is None or obj is False or (isinstance(obj, str) and obj.strip().lower() in ("off", "false", "no")):
        return EncryptionSettings()
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a mapping such as {{keys: [/etc/lifeboat/seal.key]}}, "
                          f"got {show_value(obj)}")
    check_keys(obj, _ENCRYPTION_KEYS, where)
    kw: dict[str, Any] = {}
    if obj.get("keys") is not None:
        kw["keys"] = _key_paths(obj["keys"], f"{where}.keys")
    ns_raw = obj.get("namespace_keys")
    if ns_raw is not None:
        if not isinstance(ns_raw, Mapping) or not ns_raw:
            raise ConfigError(f"{where}.namespace_keys: expected a mapping key_namespace -> key file(s), "
                              f"got {show_value(ns_raw)}")
        kw["namespace_keys"] = tuple(
            (parse_key_namespace(name, f"{where}.namespace_keys key {show_value(name, 40)}"),
             _key_paths(paths, f"{where}.namespace_keys.{name}")) for name, paths in ns_raw.items())
    for k in ("require_sealed", "gc_drops_unreadable"):
        if k in obj:
            kw[k] = parse_bool(obj[k], f"{where}.{k}")
    enc = EncryptionSettings(**kw)
    if not enc.enabled:
        raise ConfigError(f"{where}: give keys (a key file, or a list: the first seals) or namespace_keys; "
                          "create a key with `lifeboat keygen PATH`, or remove the section to turn sealing off")
    return enc


def parse_key_file_env(env: Mapping[str, str]) -> tuple[Path, ...] | None:
    """LIFEBOAT_KEY_FILE: key file path(s), separated by os.pathsep (the first seals); replaces
    `encryption.keys` and so turns sealing on. None when unset; set but empty (a secret that templated
    to nothing) is a ConfigError, never a silent plaintext store."""
    value = env.get(ENV_KEY_FILE)
    if value is None:
        return None
    if not value.strip():
        raise ConfigError(f"{ENV_KEY_FILE}={value!r} is empty: sealing would be silently off; set it to the "
                          f"key file's path (create one with `lifeboat keygen PATH`), or unset {ENV_KEY_FILE} "
                          "to use encryption.keys of lifeboat.yaml")
    parts = [p.strip() for p in value.split(os.pathsep)]
    if any(not p or "\0" in p for p in parts):
        raise ConfigError(f"{ENV_KEY_FILE}={value[:200]!r}: expected key file paths separated by "
                          f"{os.pathsep!r} (the first seals), with no empty entry")
    paths = tuple(Path(os.path.expanduser(p)) for p in parts)
    for p in paths:  # mode and length are checked when a store opens (records.keyring.read_key_file)
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
    check_keys(obj, _TOP_KEYS, f"{source}: top level")
    storage_raw = obj.get("storage")
    if storage_raw is None:
        storage = default_storage()
    else:
        if not isinstance(storage_raw, list) or not storage_raw:
            raise ConfigError(f"{source}: storage: expected a non-empty list of tiers, fastest first")
        storage = tuple(parse_tier(t, f"storage[{i}]") for i, t in enumerate(storage_raw))
    model_id = obj.get("model_id")
    if model_id is not None:
        model_id = parse_str(model_id, "model_id")
    return Settings(
        storage=storage,
        engine=parse_engine(obj.get("engine")),
        model_id=model_id,
        key_namespace=parse_key_namespace(obj.get("key_namespace")),
        source=source,
        encryption=parse_encryption(obj.get("encryption")),
    )


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
        raise ConfigError(f"{source}: expected a mapping of lifeboat.yaml keys, got {show_value(overrides)}")
    if not overrides:
        return settings
    check_keys(overrides, _TOP_KEYS | _ENGINE_KEYS, source)
    engine_fields = {k: v for k, v in overrides.items() if k in _ENGINE_KEYS}
    engine_raw = overrides.get("engine")
    if engine_raw is not None and not isinstance(engine_raw, Mapping):
        raise ConfigError(f"{source}.engine: expected a mapping such as {{\"io_workers\": 4}}, "
                          f"got {show_value(engine_raw)}")
    nested = dict(engine_raw or {})
    nested.update(engine_fields)
    out = settings
    if nested:
        # every engine key as the settings hold it; copy_queue_size only where it was given (else auto)
        base = {k: getattr(settings.engine, k) for k in _ENGINE_KEYS - {"copy_queue_size"}}
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
        out = replace(out, model_id=parse_str(overrides["model_id"], f"{source}.model_id"))
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
        doc = read_config_file(p)
        if doc is None:  # an empty file (or only comments) must not silently mean the default store
            raise ConfigError(f"{p}: the config file is empty; write at least a storage: list (docs/storage.md), "
                              "or remove the file to use the built-in default store")
        settings = settings_from_dict(doc, source=str(p))
    keys = parse_key_file_env(os.environ if env is None else env)
    if keys is not None:  # the key source from the environment (a secret mount) replaces the file's
        settings = replace(settings, encryption=replace(settings.encryption, keys=keys))
    return apply_overrides(settings, overrides if overrides is not None else {}, overrides_source)
