"""The SGLang launch's environment variables (`LIFEBOAT_CACHE`, `LIFEBOAT_SGLANG_*`) and their parsers.

Read by the launch rules (`rules.py`) when the plugin
plans a launch; they live in the integrations layer because only an SGLang launch reads them. The
shared parsing and `Variable` come from the core's `config/env.py`; every error starts with the
variable's name and lists the allowed values, and a blank value counts as unset.

Integrations layer: imports only core modules (`config`).
"""

from __future__ import annotations

from typing import Optional, Union

from ...config import ConfigError, Env, Variable, as_positive_int, parse_positive_int, parse_switch, raw_value

ENV_ENABLE = "LIFEBOAT_CACHE"
ENV_PAGE_SIZE = "LIFEBOAT_SGLANG_PAGE_SIZE"
ENV_STAGING_TOKENS = "LIFEBOAT_SGLANG_STAGING_TOKENS"
ENV_HOST_GB = "LIFEBOAT_SGLANG_HOST_GB"
ENV_WRITE_POLICY = "LIFEBOAT_SGLANG_WRITE_POLICY"
ENV_ZERO_COPY = "LIFEBOAT_SGLANG_ZERO_COPY"
ENV_HOST_MODE = "LIFEBOAT_SGLANG_HOST_MODE"

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
HOST_MODES = ("cache", "buffer_only")  # SGLang 0.5.23's --hicache-host-memory-mode

HostGbSetting = Union[int, str, None]  # None: default rule; "auto"; or whole GB per rank


def parse_enable(env: Env) -> bool:
    """`LIFEBOAT_CACHE`: "1" turns LifeboatCache on for a launch, "0" or unset leaves it off."""
    return parse_switch(env, ENV_ENABLE, False, "'1' (on) and '0' (off)")


def parse_page_size(env: Env) -> Optional[int]:
    """`LIFEBOAT_SGLANG_PAGE_SIZE`: the default page size in tokens when the launch gives none."""
    return parse_positive_int(env, ENV_PAGE_SIZE, "tokens per page, e.g. 64")


def parse_staging_tokens(env: Env) -> Optional[int]:
    """`LIFEBOAT_SGLANG_STAGING_TOKENS`: bound of SGLang's GPU write-back staging buffer."""
    return parse_positive_int(env, ENV_STAGING_TOKENS, "tokens, e.g. 1024")


def parse_host_gb(env: Env) -> HostGbSetting:
    """`LIFEBOAT_SGLANG_HOST_GB`: whole GB per rank, or 'auto'; None means the default rule."""
    value = raw_value(env, ENV_HOST_GB)
    if value is None:
        return None
    if value.lower() == "auto":
        return "auto"
    return as_positive_int(ENV_HOST_GB, value, "a positive whole number of GB per rank (e.g. 64) or 'auto'")


def parse_write_policy(env: Env) -> Optional[str]:
    """`LIFEBOAT_SGLANG_WRITE_POLICY`: the write policy of a launch that gave no `--hicache-write-policy`
    (a flag on the command line beats it, as everywhere in SGLang)."""
    return _one_of(env, ENV_WRITE_POLICY, WRITE_POLICIES)


def parse_host_mode(env: Env) -> Optional[str]:
    """`LIFEBOAT_SGLANG_HOST_MODE`: SGLang's host memory mode of a launch that gave no
    `--hicache-host-memory-mode` (a flag on the command line beats it)."""
    return _one_of(env, ENV_HOST_MODE, HOST_MODES)


def _one_of(env: Env, name: str, allowed: tuple[str, ...]) -> Optional[str]:
    value = raw_value(env, name)
    if value is not None and value not in allowed:
        raise ConfigError(f"{name}={value!r} is invalid: allowed values are {', '.join(allowed)}")
    return value


def parse_zero_copy(env: Env) -> bool:
    """`LIFEBOAT_SGLANG_ZERO_COPY`: "1" (default) zero-copy page I/O, "0" SGLang's copying interface."""
    return parse_switch(env, ENV_ZERO_COPY, True, "'1' (zero-copy, default) and '0'")


#: The SGLang launch's variables (the full table, every layer's, is `cli.env_table.VARIABLES`).
SGLANG_VARIABLES: tuple[Variable, ...] = (
    Variable(ENV_ENABLE, "0", "1 turns LifeboatCache on for an SGLang launch (CUDA HiCache or MLX radix cache)",
             parse_enable),
    Variable(ENV_PAGE_SIZE, "64", "default --page-size (tokens) of a LifeboatCache launch", parse_page_size),
    Variable(ENV_STAGING_TOKENS, "1024", "bound of SGLang's GPU write-back staging buffer (tokens)",
             parse_staging_tokens),
    Variable(ENV_HOST_GB, "10% of RAM, 2-16 GB", "host pool per rank: whole GB or auto", parse_host_gb),
    Variable(ENV_WRITE_POLICY, "the launch's", "write policy when the launch gives no --hicache-write-policy: "
             + ", ".join(WRITE_POLICIES),
             parse_write_policy),
    Variable(ENV_HOST_MODE, "the launch's", "host memory mode when the launch gives no --hicache-host-memory-mode: "
             "cache (SGLang's default) or buffer_only (see docs/sglang.md)", parse_host_mode),
    Variable(ENV_ZERO_COPY, "1", "1 zero-copy page I/O, 0 SGLang's copying interface", parse_zero_copy),
)
