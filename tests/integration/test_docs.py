"""Every fenced block in README.md and docs/*.md is checked, so the docs cannot drift from the code.

What is done with each block, by its info string:

* ``yaml``: parsed with ``yaml.safe_load``; a mapping is validated as a whole ``lifeboat.yaml``
  (``settings_from_dict``), a list as storage tiers (``parse_tier`` each). Any ConfigError fails.
* ``python``: compiled; every ``from lifeboat_cache... import name`` must resolve.
* ``text``: output or a file listing; not executed.
* no info string, ``sh``, ``bash``, ``console``: shell commands, one per line (``\\`` continues a line,
  ``&&`` separates commands, ``<placeholders>`` become a dummy word), each checked by what it runs:
  - leading ``VAR=value`` assignments: ``LIFEBOAT_*`` and ``SGLANG_USE_MLX`` must be known variables and
    their values must pass LifeboatCache's own parser for that variable;
  - ``lifeboat ...``: **executed** (``python -m lifeboat_cache.cli``) in an empty directory with a fresh
    ``XDG_CACHE_HOME`` (the embedded default store), and must exit 0; ``--help`` of it too;
  - ``python -m sglang.launch_server ...``: the arguments are parsed by SGLang 0.5.23's own argument
    parser (``ServerArgs.add_cli_args``); it is not launched here (tests/e2e/test_sglang_server.py
    launches real CPU servers);
  - ``pip install ...``: ``-r`` / ``-c`` files must exist in the repository and parse as pinned
    requirements, ``-e .`` needs pyproject.toml, every requirement must parse (PEP 508) and every
    ``lifeboat-cache[extra]`` (and ``-e ".[extra]"``) must be an extra of pyproject.toml; nothing is installed;
  - ``scripts/*.sh``: must exist, be executable, and pass ``bash -n``; not run (they build a venv);
  - ``python scripts/*.py``: must exist and compile;
  - ``python3.11 -m venv``, ``source``, ``rm``: ``bash -n`` only;
  - anything else fails the test, so a new kind of command gets a rule here.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from lifeboat_cache.config import ConfigError, env as config_env, parse_tier, settings_from_dict
from lifeboat_cache.integrations.launch import rules

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHELL = {"", "sh", "bash", "console"}


def _mlx_rebuild_wait(env):
    from lifeboat_cache.runtimes.mlx.env import parse_rebuild_wait

    return parse_rebuild_wait(env)


ENV_PARSERS = {
    rules.ENV_ENABLE: rules.parse_enable,
    rules.ENV_PAGE_SIZE: rules.parse_page_size,
    rules.ENV_STAGING_TOKENS: rules.parse_staging_tokens,
    rules.ENV_HOST_GB: rules.parse_host_gb,
    rules.ENV_WRITE_POLICY: rules.parse_write_policy,
    rules.ENV_ZERO_COPY: rules.parse_zero_copy,
    rules.ENV_HOST_MODE: rules.parse_host_mode,
    "LIFEBOAT_MLX_REBUILD_WAIT_S": _mlx_rebuild_wait,
    config_env.ENV_INTERVAL: config_env.parse_interval,
    "SGLANG_USE_MLX": lambda env: env["SGLANG_USE_MLX"] in ("0", "1") or pytest.fail("SGLANG_USE_MLX=0|1"),
}


def blocks() -> list[tuple[str, int, str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            line = text[: m.start()].count("\n") + 1
            out.append((str(doc.relative_to(ROOT)), line, m.group(1), m.group(2)))
    return out


BLOCKS = blocks()


def _ids(kind: set[str] | None = None) -> list:
    return [pytest.param(b, id=f"{b[0]}:{b[1]}") for b in BLOCKS if kind is None or b[2] in kind]


def test_every_block_has_a_known_kind() -> None:
    assert BLOCKS, "no fenced blocks found"
    for doc, line, info, _ in BLOCKS:
        assert info in SHELL | {"yaml", "python", "text"}, f"{doc}:{line}: unknown block type {info!r}"


@pytest.mark.parametrize("block", _ids({"yaml"}))
def test_yaml_examples_are_valid_settings(block, tmp_path) -> None:
    doc, line, _, body = block
    obj = yaml.safe_load(body)
    # a `ca_bundle:` must name an existing PEM file at load: the example's path gets a real one here
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    for tier in (obj if isinstance(obj, list) else (obj or {}).get("storage") or []):
        if isinstance(tier, dict) and "ca_bundle" in tier:
            tier["ca_bundle"] = str(pem)
    try:
        if isinstance(obj, list):
            for i, t in enumerate(obj):
                parse_tier(t, f"storage[{i}]")
        else:
            settings_from_dict(obj, source=f"{doc}:{line}")
    except ConfigError as e:
        pytest.fail(f"{doc}:{line}: {e}")


@pytest.mark.parametrize("block", _ids({"python"}))
def test_python_examples_compile_and_import(block) -> None:
    doc, line, _, body = block
    tree = ast.parse(body, filename=f"{doc}:{line}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lifeboat_cache"):
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(mod, alias.name), f"{doc}:{line}: {node.module} has no {alias.name}"


def _commands(body: str) -> list[list[str]]:
    joined = re.sub(r"<[^<>\n]*>", "dummy-model", re.sub(r"\\\n", " ", body))  # <placeholders>
    out = []
    for raw in joined.splitlines():
        raw = raw.strip()
        if not raw or raw.startswith("#"):
            continue
        for part in raw.split("&&"):
            out.append(shlex.split(part, comments=True))
    return out


def _check_env(words: list[str], where: str) -> list[str]:
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        name, value = words.pop(0).split("=", 1)
        assert name in ENV_PARSERS, f"{where}: unknown variable {name} in the docs"
        env[name] = value
    for name in env:
        try:
            ENV_PARSERS[name](env)
        except ConfigError as e:
            pytest.fail(f"{where}: {e}")
    return words


def _sglang_args(args: list[str], where: str) -> None:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        ns = parser.parse_args(args)
    except (argparse.ArgumentError, SystemExit) as e:
        pytest.fail(f"{where}: SGLang rejects the arguments {args}: {e}")
    assert ns.model_path


def _pip(args: list[str], where: str) -> None:
    from packaging.requirements import Requirement

    assert args[:1] == ["install"], f"{where}: only `pip install` is documented"
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    it = iter(args[1:])
    for a in it:
        if a in ("-r", "-c"):
            f = ROOT / next(it)
            assert f.is_file(), f"{where}: {f} does not exist"
            for ln in f.read_text().splitlines():
                ln = ln.split("#", 1)[0].strip()
                if ln and not ln.startswith("-"):
                    assert "==" in ln, f"{f}: {ln!r} is not pinned"
                    Requirement(ln)
        elif a == "-e":
            target = next(it).strip('"')
            m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
            assert m and (ROOT / "pyproject.toml").is_file(), f"{where}: -e {target}: only this checkout"
            assert set((m.group(1) or "").split(",")) - {""} <= extras, f"{where}: unknown extra in {target}"
        elif a.startswith("-"):
            assert a in ("--no-deps", "-q", "-U"), f"{where}: undocumented pip option {a}"
        else:
            req = Requirement(a)
            if req.name == "lifeboat-cache":
                assert req.extras <= extras, f"{where}: unknown extra(s) {req.extras - extras}"


def _lifeboat(args: list[str], tmp_path: Path, where: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LIFEBOAT_CONFIG"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(ROOT))
    (tmp_path / "xdg" / "lifeboat").mkdir(parents=True, exist_ok=True)  # the default store, as after a first launch
    for argv in (args, [*args[:1], "--help"]):
        r = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", *argv], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{where}: `lifeboat {' '.join(argv)}` failed:\n{r.stderr}"


def _bash_n(cmd: list[str], where: str) -> None:
    r = subprocess.run(["bash", "-n", "-c", shlex.join(cmd)], capture_output=True, text=True)
    assert r.returncode == 0, f"{where}: {r.stderr}"


@pytest.mark.parametrize("block", _ids(SHELL))
def test_shell_commands_run_or_parse(block, tmp_path: Path) -> None:
    doc, line, _, body = block
    for words in _commands(body):
        where = f"{doc}:{line}: {' '.join(words)}"
        words = _check_env(list(words), where)
        prog, args = words[0], words[1:]
        if prog == "lifeboat":
            _lifeboat(args, tmp_path, where)
        elif prog in ("python", "python3") and args[:2] == ["-m", "sglang.launch_server"]:
            _sglang_args(args[2:], where)
        elif prog == "pip":
            _pip(args, where)
        elif prog.startswith("scripts/") and prog.endswith(".sh"):
            path = ROOT / prog
            assert path.is_file() and os.access(path, os.X_OK), f"{where}: not an executable script"
            r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
            assert r.returncode == 0, f"{where}: {r.stderr}"
        elif prog in ("python", "python3") and args and args[0].startswith("scripts/"):
            path = ROOT / args[0]
            assert path.is_file(), f"{where}: no such script"
            compile(path.read_text(), str(path), "exec")
        elif prog in ("python3.11", "source", "rm"):
            _bash_n(words, where)
        else:
            pytest.fail(f"{where}: no rule for {prog!r} in tests/integration/test_docs.py")
