"""env_table.py: every LIFEBOAT_* variable read anywhere in the package is in VARIABLES and in the docs.

Each layer declares its own variables (envvars.py the core's, runtimes/mlx/env.py the MLX runtime's,
integrations/sglang_env.py the SGLang launch's); env_table.VARIABLES is all of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lifeboat_cache.cli import env_table
from lifeboat_cache.config import ConfigError, env as envvars
from lifeboat_cache.integrations.launch import env as sglang_env
from lifeboat_cache.runtimes.mlx import env as mlx_env

ROOT = Path(__file__).resolve().parents[3]
PKG = ROOT / "lifeboat_cache"
DOCS = ROOT / "docs" / "operating.md"
# a name, not a prefix such as `LIFEBOAT_SGLANG_*` (the lookahead refuses a name cut short)
NAME = re.compile(r"\bLIFEBOAT_[A-Z0-9_]+(?![A-Z0-9_*])")
# printed line prefixes (a child process's results), never read from the environment
OUTPUT_PREFIXES = {"LIFEBOAT_DEMO", "LIFEBOAT_RESULTS"}


def _source_names() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in sorted(PKG.rglob("*.py")):
        for name in NAME.findall(p.read_text()):
            out.setdefault(name, []).append(str(p.relative_to(ROOT)))
    return out


def _doc_rows() -> dict[str, str]:
    """name -> default cell of the docs/operating.md environment table (backticks dropped)."""
    text = DOCS.read_text()
    section = text[text.index("## Environment variables"):]
    rows = {}
    for m in re.finditer(r"^\| `(LIFEBOAT_[A-Z0-9_]+)` \| ([^|]*) \|", section, re.M):
        rows[m.group(1)] = m.group(2).replace("`", "").strip()
    return rows


def test_every_variable_in_the_source_is_in_the_table() -> None:
    found = _source_names()
    for prefix in OUTPUT_PREFIXES:  # they really are printed prefixes, not variables
        assert prefix in found, f"{prefix} is gone: drop it from OUTPUT_PREFIXES"
        for rel in found[prefix]:
            text = (ROOT / rel).read_text()
            assert not re.search(rf"(environ|env)(\.get\(|\[)\s*['\"]{prefix}", text), f"{rel} reads {prefix}"
    names = set(found) - OUTPUT_PREFIXES
    table = {v.name for v in env_table.VARIABLES}
    assert names - table == set(), f"read in the source but missing from env_table.VARIABLES: {names - table}"
    assert table - names == set(), f"in env_table.VARIABLES but read nowhere: {table - names}"
    assert len(table) == len(env_table.VARIABLES), "a variable is listed twice"


def test_every_variable_is_documented_with_its_default() -> None:
    rows = _doc_rows()
    for v in env_table.VARIABLES:
        assert v.name in rows, f"docs/operating.md, Environment variables: no row for {v.name}"
        assert rows[v.name] == v.default, f"{v.name}: docs say default {rows[v.name]!r}, the table {v.default!r}"
        assert v.what, v.name
    assert set(rows) == {v.name for v in env_table.VARIABLES}, "docs list a variable env_table.VARIABLES lacks"


def test_every_parser_accepts_an_unset_variable(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./lifeboat.yaml to find
    for v in env_table.VARIABLES:
        v.parse({})  # unset: the default, never an error
    assert envvars.parse_interval({}) == envvars.DEFAULT_INTERVAL_S
    assert mlx_env.parse_rebuild_wait({}) == mlx_env.DEFAULT_REBUILD_WAIT_S
    assert envvars.parse_log_level({}) == envvars.DEFAULT_LOG_LEVEL
    assert mlx_env.parse_blas_preload({}) is None
    assert sglang_env.parse_zero_copy({sglang_env.ENV_ZERO_COPY: "  "}) is True  # blank counts as unset


@pytest.mark.parametrize("v", env_table.VARIABLES, ids=lambda v: v.name)
def test_a_bad_value_names_the_variable(v) -> None:
    bad = {envvars.ENV_CONFIG: "/nonexistent/lifeboat.yaml", mlx_env.ENV_BLAS_PRELOAD: "/nonexistent/libblas.so.3",
           sglang_env.ENV_HOST_GB: "lots"}.get(v.name, "-7x")
    with pytest.raises(ConfigError) as e:
        v.parse({v.name: bad})
    assert str(e.value).startswith(f"{v.name}=") and bad in str(e.value), str(e.value)


def test_each_layer_declares_its_own_variables() -> None:
    """The core names no runtime's variable; the full table is each layer's list, each name once."""
    core = {v.name for v in envvars.CORE_VARIABLES}
    assert not any(n.startswith(("LIFEBOAT_SGLANG_", "LIFEBOAT_MLX_")) for n in core), core
    assert sglang_env.ENV_ENABLE not in core and mlx_env.ENV_BLAS_PRELOAD not in core
    assert env_table.VARIABLES == envvars.CORE_VARIABLES + sglang_env.SGLANG_VARIABLES + mlx_env.MLX_VARIABLES
    assert set(env_table.BY_NAME) == {v.name for v in env_table.VARIABLES}
