"""Configuration: `lifeboat.yaml` (or the embedded default) and the environment -> frozen `Settings`.

Unknown keys are errors and every error names the file, the key and the fix (`ConfigError`): the file
is written by hand and a typo must never fall back to a default silently.

  load.py      the document: engine, key namespace, encryption, overrides, finding and reading the file,
               LIFEBOAT_KEY_FILE, `load_settings`
  values.py    ConfigError and the parsers of one value each (sizes, ages, modes, choices)
  storage.py   one `storage:` entry (local, nfs, s3 and its options) -> TierSettings
  settings.py  the frozen Settings / TierSettings / EngineSettings / EncryptionSettings, defaults, default store
  env.py       the core's LIFEBOAT_* variables and the shared parsers every layer's variables use (`Variable`)
"""

from __future__ import annotations

from .env import (
    CORE_VARIABLES, DEFAULT_INTERVAL_S, ENV_INTERVAL, Env, Variable, as_positive_int, parse_interval,
    parse_log_level, parse_positive_int, parse_switch, raw_value)
from .load import apply_overrides, find_config_file, load_settings, parse_key_file_env, settings_from_dict
from .settings import (
    COMPRESSIONS, DEFAULT_COPY_QUEUE_BYTES, DEFAULT_DEADLINE_S, DEFAULT_IO_WORKERS, EncryptionSettings,
    EngineSettings, Settings, TierSettings, default_cache_dir)
from .storage import parse_tier
from .values import ConfigError, format_size, parse_age, parse_size

__all__ = [
    "COMPRESSIONS", "CORE_VARIABLES", "ConfigError", "DEFAULT_COPY_QUEUE_BYTES", "DEFAULT_DEADLINE_S",
    "DEFAULT_INTERVAL_S", "DEFAULT_IO_WORKERS", "ENV_INTERVAL", "EncryptionSettings", "EngineSettings", "Env",
    "Settings", "TierSettings", "Variable", "apply_overrides", "as_positive_int", "default_cache_dir",
    "find_config_file", "format_size", "load_settings", "parse_age", "parse_interval", "parse_key_file_env",
    "parse_log_level", "parse_positive_int", "parse_size", "parse_switch", "parse_tier", "raw_value",
    "settings_from_dict",
]
