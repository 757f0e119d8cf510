"""Every LIFEBOAT_* variable the package reads: a bad value is an error that names the variable.

The list of variables is taken from the package's source, so a new variable without a check here fails
`test_every_variable_has_a_bad_value_check`. Config-file errors name the file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lifeboat_cache.config import ConfigError, find_config_file, load_settings, parse_key_file_env
from lifeboat_cache.integrations.launch import rules
from lifeboat_cache.ops import stats_file as statsfile

ROOT = Path(__file__).resolve().parents[2]
NOT_VARIABLES = {"LIFEBOAT_DEMO", "LIFEBOAT_RESULTS", "LIFEBOAT_SGLANG_"}  # output prefixes / a prefix


def _rebuild_wait(env):
    pytest.importorskip("sglang")
    from lifeboat_cache.runtimes.mlx.env import parse_rebuild_wait

    return parse_rebuild_wait(env)


def _blas(env):
    from lifeboat_cache.demo.mlx_serving import child_env

    return child_env(dict(env))


def _log_level(env):
    from lifeboat_cache.config.env import parse_log_level

    return parse_log_level(env)


BAD = {
    "LIFEBOAT_CACHE": (rules.parse_enable, "yes"),
    "LIFEBOAT_CONFIG": (find_config_file, "/nonexistent/lifeboat.yaml"),
    "LIFEBOAT_SGLANG_PAGE_SIZE": (rules.parse_page_size, "abc"),
    "LIFEBOAT_SGLANG_STAGING_TOKENS": (rules.parse_staging_tokens, "-1"),
    "LIFEBOAT_SGLANG_HOST_GB": (rules.parse_host_gb, "lots"),
    "LIFEBOAT_SGLANG_WRITE_POLICY": (rules.parse_write_policy, "sometimes"),
    "LIFEBOAT_SGLANG_ZERO_COPY": (rules.parse_zero_copy, "2"),
    "LIFEBOAT_SGLANG_HOST_MODE": (rules.parse_host_mode, "buffered"),
    "LIFEBOAT_MLX_REBUILD_WAIT_S": (_rebuild_wait, "abc"),
    "LIFEBOAT_STATS_INTERVAL_S": (statsfile.parse_interval, "abc"),
    "LIFEBOAT_BLAS_PRELOAD": (_blas, "/nonexistent/libblas.so.3"),
    "LIFEBOAT_LOG_LEVEL": (_log_level, "loud"),
    "LIFEBOAT_KEY_FILE": (parse_key_file_env, "/nonexistent/seal.key"),
}


def test_every_variable_has_a_bad_value_check() -> None:
    found = set()
    for p in (ROOT / "lifeboat_cache").rglob("*.py"):
        found |= set(re.findall(r"LIFEBOAT_[A-Z_]+", p.read_text()))
    assert found - NOT_VARIABLES == set(BAD)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_value_names_the_variable(name: str) -> None:
    fn, value = BAD[name]
    with pytest.raises(ConfigError) as e:
        fn({name: value})
    msg = str(e.value)
    assert msg.startswith(name) and value in msg, msg
    assert "could not convert" not in msg and "invalid literal" not in msg


def test_config_errors_name_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "lifeboat.yaml"
    for body, field in (("storage:\n  - type: tape\n", "storage[0].type"),
                        ("engine:\n  io_workers: many\n", "engine.io_workers"),
                        ("storage:\n  - type: local\n    path: /x\n    capacity: huge\n", "storage[0].capacity"),
                        ("storage: [\n", "not valid YAML")):
        cfg.write_text(body)
        with pytest.raises(ConfigError) as e:
            load_settings(cfg)
        assert str(e.value).startswith(f"{cfg}: ") and field in str(e.value), str(e.value)
