"""Check a LifeboatCache launch's configuration before SGLang loads the model (launcher process).

Why: the backend itself is built inside the scheduler, after the weights and the KV cache; a bad
`lifeboat.yaml` key or an unwritable store directory found there kills the scheduler 20-60 s into the
launch, behind a traceback. Checked during argument resolution instead, the launch stops at once with
one message naming the file, the key and the fix (`ConfigError`).

What stops the launch: any ConfigError the backend would raise (the config file, the extra config,
`LIFEBOAT_CONFIG`), and a local / nfs directory that definitely cannot be written (read-only file
system, a file in the way, no permission). What does not: a directory that does not answer within
`PROBE_TIMEOUT_S` (a hung filer may come back; the store skips a hung tier and serves misses until
then) and S3 endpoints, which are never contacted here (an endpoint down at start is a miss, not a
refused launch; docs/sglang.md).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Any, Mapping, Optional

from ...config import ConfigError, Settings, load_settings
from ...fsio import make_dirs

log = logging.getLogger(__name__)

#: Keys of the extra-config object that belong to SGLang (or to other backends), not to lifeboat.yaml.
SGLANG_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1", "allocator", "prefetch_threshold",
    "prefetch_timeout_base", "prefetch_timeout_per_ki_token", "hicache_storage_pass_prefix_keys",
    "tp_lcm_size", "file_storage_path",
})
EXTRA_CONFIG = "--hicache-storage-backend-extra-config"  # names the source in ConfigError messages
PROBE_TIMEOUT_S = 2.0
_DIR_TIERS = ("local", "nfs")


def our_overrides(extra_config: Mapping[str, Any]) -> dict[str, Any]:
    """The extra config's lifeboat.yaml keys (SGLang's own keys and `affinity_chunks` left out)."""
    return {k: v for k, v in extra_config.items() if k not in SGLANG_KEYS and k != "affinity_chunks"}


def check_launch_config(extra_config: Optional[Mapping[str, Any]], env: Optional[Mapping[str, str]] = None) -> Settings:
    """The settings the backend will open; ConfigError (naming file, key and fix) stops the launch."""
    settings = load_settings(overrides=our_overrides(extra_config or {}), overrides_source=EXTRA_CONFIG, env=env)
    for i, tier in enumerate(settings.storage):
        if tier.type not in _DIR_TIERS:
            continue
        for j, path in enumerate(tier.paths):
            key = f"storage[{i}].path" if len(tier.paths) == 1 else f"storage[{i}].paths[{j}]"
            problem = probe_writable(Path(path))
            if problem:
                raise ConfigError(f"{settings.source}: {key}: the store directory {path} is not writable "
                                  f"({problem}); fix the path or its permissions, then launch again")
    return settings


def probe_writable(path: Path, timeout: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """None when `path` is (or can be made) a writable directory; else why not.

    Runs in a daemon thread bounded by `timeout`: a hung mount answers None (logged), not a hang.
    """
    result: dict[str, Optional[str]] = {}

    def probe() -> None:
        try:
            make_dirs(path)
            name = path / f".lifeboat-preflight-{os.getpid()}-{secrets.token_hex(4)}"
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.close(fd)
            os.unlink(name)
            result["problem"] = None
        except OSError as e:
            result["problem"] = e.strerror or str(e)

    worker = threading.Thread(target=probe, name="lifeboat-preflight", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        log.warning("LifeboatCache: %s did not answer within %.0f s; launching anyway (the store skips a hung "
                    "tier and serves misses until it answers)", path, timeout)
        return None
    return result.get("problem")
