"""Operating a store: per-process stats files, Prometheus metrics, and purge.

  stats_file.py  reporter thread: per-process stats file next to the store (0600, atomic), read by the CLI
  prometheus.py  lifeboat_* metrics in SGLang's multiprocess /metrics (prometheus_client imported lazily)
  purging.py     `lifeboat purge`: selectors -> namespaces + rules; writes purge.list, applies it, crypto-shreds
  health.py      can each configured tier be reached and read (what every `lifeboat` command checks first)
"""

from __future__ import annotations

from .health import TierHealth, path_problems, tier_health
from .purging import PurgeError, compact_tier, parse_key_ids, purge, purge_key_ids, resolve
from .stats_file import (
    StatsReporter, is_live, merge_histograms, merge_namespaces, read_stats_files, stats_dir, sum_dicts)

__all__ = [
    "PurgeError", "StatsReporter", "TierHealth", "compact_tier", "is_live", "merge_histograms", "merge_namespaces",
    "parse_key_ids", "path_problems", "purge", "purge_key_ids", "read_stats_files", "resolve", "stats_dir",
    "sum_dicts", "tier_health",
]
