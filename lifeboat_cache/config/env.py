"""The core's environment variables, the shared parsers every layer's variables use, and `Variable`.

Each parser takes the environment as a mapping (tests pass a dict) and raises ConfigError whose
message starts with the variable's name and says what values are allowed, because the message is often
all a user sees (a launch stops on it). A blank value counts as unset where the variable is a launch
setting (`raw_value`).

A variable lives in the layer that reads it, so the core names no runtime: here the ones of the store
itself (`LIFEBOAT_CONFIG`, `LIFEBOAT_STATS_INTERVAL_S`, `LIFEBOAT_LOG_LEVEL`, `LIFEBOAT_KEY_FILE`);
the SGLang launch variables in `integrations/launch/env.py`, the MLX ones in `runtimes/mlx/env.py`.
Each home declares its own `Variable` list (`CORE_VARIABLES` here); `cli.env_table.VARIABLES` (apps layer,
so it may import every layer) assembles the full table that docs/operating.md is checked against.

`LIFEBOAT_CONFIG` is parsed by `config.find_config_file` and `LIFEBOAT_KEY_FILE` by
`config.parse_key_file_env` (load_settings applies it), because it is the first step of the config
file's lookup order and ConfigError lives there; this module re-exports it and lists the variable.

Core layer: imports only `config` (ConfigError, find_config_file, parse_key_file_env).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from .load import ENV_KEY_FILE, find_config_file, parse_key_file_env
from .values import ConfigError

Env = Mapping[str, str]

# ------------------------------------------------------------------------------------------ names
ENV_CONFIG = "LIFEBOAT_CONFIG"
ENV_INTERVAL = "LIFEBOAT_STATS_INTERVAL_S"
ENV_LOG_LEVEL = "LIFEBOAT_LOG_LEVEL"
# ENV_KEY_FILE ("LIFEBOAT_KEY_FILE") lives in config.py, which applies it in load_settings

# ------------------------------------------------------------------------------------------ defaults
DEFAULT_INTERVAL_S = 5.0
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_LOG_LEVEL = "WARNING"


# ------------------------------------------------------------------------------------------ shared parsers
def raw_value(env: Env, name: str) -> Optional[str]:
    """Value of `name`, or None when unset or blank (a blank export means 'not set')."""
    value = env.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def as_positive_int(name: str, value: str, allowed: str) -> int:
    """int(value) > 0, else a ConfigError naming the variable and the `allowed` values."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ConfigError(f"{name}={value!r} is invalid: allowed values are {allowed}")
    return number


def parse_positive_int(env: Env, name: str, what: str) -> Optional[int]:
    """`name` as a positive whole number (`what` says of what, with an example); None when unset or blank."""
    value = raw_value(env, name)
    return None if value is None else as_positive_int(name, value, f"a positive whole number ({what})")


def parse_switch(env: Env, name: str, default: bool, allowed: str) -> bool:
    """A "1" / "0" variable: `default` when unset, else a ConfigError naming it and the `allowed` values."""
    value = raw_value(env, name)
    if value is None:
        return default
    if value in ("0", "1"):
        return value == "1"
    raise ConfigError(f"{name}={value!r} is invalid: allowed values are {allowed}")


# ------------------------------------------------------------------------------------------ the core's own
def parse_interval(env: Optional[Env] = None) -> float:
    """`LIFEBOAT_STATS_INTERVAL_S` (seconds, 0.05 .. 3600; default os.environ); a bad value names the variable."""
    raw = (os.environ if env is None else env).get(ENV_INTERVAL)
    if raw is None or raw == "":
        return DEFAULT_INTERVAL_S
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{ENV_INTERVAL}={raw!r}: expected seconds between stats-file writes, "
                          f"e.g. {ENV_INTERVAL}=5") from None
    if not 0.05 <= v <= 3600:
        raise ConfigError(f"{ENV_INTERVAL}={raw!r}: must be between 0.05 and 3600 seconds")
    return v


def parse_log_level(env: Any) -> str:
    """`LIFEBOAT_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR, CRITICAL; default WARNING) for plan and demo processes.

    Raises ConfigError naming the variable and the allowed values for any other value."""
    value = (env.get(ENV_LOG_LEVEL) or DEFAULT_LOG_LEVEL).strip().upper()
    if value not in LOG_LEVELS:
        raise ConfigError(f"{ENV_LOG_LEVEL}={env.get(ENV_LOG_LEVEL)!r} is invalid: allowed values are "
                          + ", ".join(LOG_LEVELS))
    return value


def parse_config(env: Env) -> Any:
    """`LIFEBOAT_CONFIG`: the lifeboat.yaml to load (config.find_config_file: a missing file is a ConfigError)."""
    return find_config_file(env)


# ------------------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, its default (as docs show it), what it does, its parser."""

    name: str
    default: str
    what: str
    parse: Callable[[Env], Any]


#: The core's variables (the full table, every layer's, is `cli.env_table.VARIABLES`).
CORE_VARIABLES: tuple[Variable, ...] = (
    Variable(ENV_CONFIG, "unset: ./lifeboat.yaml, ~/.config/lifeboat/lifeboat.yaml, else built in",
             "path of lifeboat.yaml", parse_config),
    Variable(ENV_INTERVAL, f"{DEFAULT_INTERVAL_S:.0f}",
             "seconds between stats-file writes and lifeboat_* metric updates (0.05 to 3600)", parse_interval),
    Variable(ENV_LOG_LEVEL, DEFAULT_LOG_LEVEL, "log level of the demo's and plan processes", parse_log_level),
    Variable(ENV_KEY_FILE, "unset: encryption.keys of lifeboat.yaml",
             "key file path(s) for sealed records, the first seals (replaces encryption.keys, turns sealing on)",
             parse_key_file_env),
)
