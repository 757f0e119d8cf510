"""How LifeboatCache adjusts an SGLang launch (the plugin applies these; no SGLang or torch imported here).

  env.py        LIFEBOAT_CACHE and LIFEBOAT_SGLANG_* and their parsers
  rules.py      pure launch rules: page size, staging, write policy, backend extra-config, CPU launches
  sizing.py     host-pool auto-sizing, staging buffer, ranks per host, the backend's name in `dynamic`
  preflight.py  the backend settings checked in the launcher, before the model loads
  cpu.py        SGLang 0.5.23's CPU-server gaps closed by hooks (unpinned pools, torch copies, rope, extend)
"""

from __future__ import annotations

from .cpu import register_cpu_hooks
from .env import ENV_ENABLE, ENV_HOST_GB, SGLANG_VARIABLES, parse_enable, parse_staging_tokens, parse_zero_copy
from .preflight import EXTRA_CONFIG, SGLANG_KEYS, check_launch_config
from .rules import Decision, LaunchFacts, LaunchPlan, plan_launch_tuning
from .sizing import (
    BACKEND_EXTRA_CONFIG, DEFAULT_STAGING_TOKENS, SGLANG_STAGING_PAGE_CHUNK, is_lifeboat_extra_config, ranks_on_host,
    staging_pages)

__all__ = [
    "BACKEND_EXTRA_CONFIG", "DEFAULT_STAGING_TOKENS", "Decision", "ENV_ENABLE", "ENV_HOST_GB", "EXTRA_CONFIG",
    "LaunchFacts", "LaunchPlan", "SGLANG_KEYS", "SGLANG_STAGING_PAGE_CHUNK", "SGLANG_VARIABLES", "check_launch_config",
    "is_lifeboat_extra_config", "parse_enable", "parse_staging_tokens", "parse_zero_copy", "plan_launch_tuning",
    "ranks_on_host", "register_cpu_hooks", "staging_pages",
]
