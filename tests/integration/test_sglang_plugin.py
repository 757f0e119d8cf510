"""The `lifeboat` plugin through SGLang 0.5.23's own plugin loading and server-argument resolution, on CPU.

No part of SGLang is stubbed. The plugin is found through the installed package's
`sglang.srt.plugins` entry point by SGLang's real `load_plugins()`; launches are resolved by
`ServerArgs.resolve_once()` (the step `python -m sglang.launch_server` runs), and what the scheduler
would read is checked in the config bags SGLang projects from the resolved record.

Two kinds of launch are resolved:
* `--model-path dummy --device cuda`: SGLang stops after `handle_hardware_runtime_validation`, so no
  hardware or model is needed. Our step (`handle_hicache_ratio_default`) runs before that stop.
* a local tiny Llama `config.json`: the whole pipeline runs (attention-backend selection,
  `_page_size_default`, `handle_hicache`, ...), which shows our declarations survive it.
* `--device cpu` launches (test_cpu_*): the CPU layout rule and the configuration preflight.

Host RAM and GPU memory are injected (the plugin's `available_ram_bytes` / `gpu_memory_bytes`) so the
expected pool sizes are exact.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytest.importorskip("sglang.srt.server_args")

from lifeboat_cache.integrations import sglang_plugin  # noqa: E402
from lifeboat_cache.integrations.launch import rules, sizing  # noqa: E402
from lifeboat_cache.integrations.launch.sizing import GB  # noqa: E402

EXTRA = json.dumps(dict(sizing.BACKEND_EXTRA_CONFIG))
LIFEBOAT = dict(
    enable_hierarchical_cache=True, hicache_storage_backend="dynamic", hicache_storage_backend_extra_config=EXTRA
)
RAM = 64 * GB  # -> default pool 6 GB per rank
ENV_VARS = (
    rules.ENV_ENABLE,
    rules.ENV_PAGE_SIZE,
    rules.ENV_STAGING_TOKENS,
    rules.ENV_HOST_GB,
    rules.ENV_WRITE_POLICY,
    rules.ENV_ZERO_COPY,
    "SGLANG_USE_MLX",
)


@pytest.fixture(scope="module")
def plugins() -> dict:
    """Run SGLang's real `load_plugins()` once, as a scheduler process would (pool modules imported)."""
    import sglang.srt.mem_cache.pool_host.mha  # noqa: F401  (what the scheduler has imported by then)
    import sglang.srt.mem_cache.pool_host.mla  # noqa: F401
    import sglang.srt.plugins as plugins_mod

    already = plugins_mod._plugins_loaded
    for name in ENV_VARS:
        os.environ.pop(name, None)
    plugins_mod.load_plugins()
    return {"loaded_by_us": not already}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, plugins: dict) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sglang_plugin, "available_ram_bytes", lambda: RAM)
    monkeypatch.setattr(sglang_plugin, "gpu_memory_bytes", _no_gpu_read)


def _no_gpu_read(index: int = 0):
    raise AssertionError("GPU memory must only be read for LIFEBOAT_SGLANG_HOST_GB=auto")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local Llama config (no weights): enough for SGLang to resolve a non-dummy launch on CPU."""
    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": 2,
                "vocab_size": 1000,
                "max_position_embeddings": 512,
                "rms_norm_eps": 1e-6,
                "torch_dtype": "bfloat16",
                "bos_token_id": 1,
                "eos_token_id": 2,
            }
        )
    )
    return str(path)


def resolve(model_path: str = "dummy", **kw):
    """Resolve a launch like `launch_server` does; returns the record."""
    from sglang.srt.server_args import ServerArgs

    kw.setdefault("device", "cuda")  # the tuning under test is the CUDA launch; CPU launches: test_cpu_*
    sa = ServerArgs(model_path=model_path, skip_tokenizer_init=True, **kw)
    sa.resolve_once()
    return sa


def view(sa):
    from sglang.srt.arg_groups.overrides import resolving_view

    return resolving_view(sa)


def our_declarations(sa) -> list[dict]:
    stash = getattr(sa, "_resolved_overrides", ())
    return [fields for source, fields in stash if source == sglang_plugin.DECLARATION_SOURCE]


def bags(sa):
    """The config bags a scheduler would read (`get_schedule()`, `get_memory()`), projected by SGLang."""
    from sglang.srt.runtime_context import create_context

    ctx = create_context(sa, role="scheduler")
    return ctx.config_bag("schedule"), ctx.config_bag("memory")


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------


def test_entry_point_is_installed_and_loaded_by_sglang(plugins: dict) -> None:
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("lifeboat") == "lifeboat_cache.integrations.sglang_plugin:register"
    assert _HOOKS["handle_hicache_ratio_default"].count(sglang_plugin.tune_launch) == 1


def test_register_is_idempotent() -> None:
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS

    sglang_plugin.register()
    sglang_plugin.register()
    assert _HOOKS["handle_hicache_ratio_default"].count(sglang_plugin.tune_launch) == 1


def test_staging_hooks_installed_in_a_pool_building_process(plugins: dict) -> None:
    if not plugins["loaded_by_us"]:
        pytest.skip("load_plugins() ran earlier in this session without the pool modules imported")
    from sglang.srt.mem_cache.pool_host import mha, mla
    from sglang.srt.plugins.hook_registry import HookRegistry

    assert sglang_plugin.MHA_STAGING_TARGET in HookRegistry._patched
    assert sglang_plugin.MLA_STAGING_TARGET in HookRegistry._patched
    assert hasattr(mha.prepare_mha_write_back_staging, "__wrapped__")
    assert hasattr(mla.MLATokenToKVPoolHost._init_write_back_staging_buffers, "__wrapped__")


# ---------------------------------------------------------------------------------------------
# Launches with the LifeboatCache backend
# ---------------------------------------------------------------------------------------------


def test_lifeboat_launch_defaults(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=sglang_plugin.__name__)
    sa = resolve(**LIFEBOAT)
    v = view(sa)
    assert v.page_size == 64
    assert v.hicache_size == 6  # 10% of 64 GB
    assert v.hicache_write_policy == "write_through"
    # SGLang's own step still ran after ours and saw an explicit size: auto-sizing off.
    assert v.hicache_host_memory_fraction is None and v.hicache_ratio == 2.0
    # The raw input is what was typed.
    assert sa.page_size is None and sa.hicache_size == 0
    assert our_declarations(sa) == [{"page_size": 64, "hicache_size": 6}]
    ours = [r.getMessage() for r in caplog.records if r.name == sglang_plugin.__name__]
    assert "LifeboatCache: page size 64 (LifeboatCache default; launch gave none)" in ours
    assert sum(m.startswith("LifeboatCache: host pool 6 GB per rank") for m in ours) == 1
    assert len(ours) == len(set(ours)) == 7  # each decision once
    assert sum(m.startswith("LifeboatCache: host layout page_first (SGLang's default") for m in ours) == 1


@pytest.mark.parametrize("given,io,layout", [
    ({}, "kernel", "page_first"),
    ({"hicache_mem_layout": "layer_first"}, "kernel", "layer_first"),
    ({"hicache_io_backend": "direct"}, "direct", "page_first_direct"),
])
def test_host_layout_decision_matches_sglangs_resolved_layout(tiny_model: str, monkeypatch, caplog, given: dict,
                                                              io: str, layout: str) -> None:
    """The launch's layout is kept (layer_first by hand included), logged once with its reason, and is
    the layout SGLang's own resolution hands the scheduler (its later handle_hicache step included)."""
    caplog.set_level(logging.INFO, logger=sglang_plugin.__name__)
    sa = resolve(tiny_model, **LIFEBOAT, **given)
    assert view(sa).hicache_mem_layout == layout and view(sa).hicache_io_backend == io
    assert not any("hicache_mem_layout" in f for f in our_declarations(sa))
    ours = [r.getMessage() for r in caplog.records if r.name == sglang_plugin.__name__]
    assert sum(m.startswith(f"LifeboatCache: host layout {layout} (") for m in ours) == 1
    _, memory = bags(sa)
    assert memory.hicache_mem_layout == layout


def test_lifeboat_launch_full_pipeline_reaches_the_scheduler_bags(tiny_model: str, monkeypatch) -> None:
    monkeypatch.setenv(rules.ENV_WRITE_POLICY, "write_back")
    sa = resolve(tiny_model, **LIFEBOAT)
    v = view(sa)
    # `_page_size_default` (which would give 1) and `handle_hicache` ran after our declaration.
    assert v.page_size == 64 and v.hicache_size == 6 and v.hicache_write_policy == "write_back"
    assert not any("page_size" in f for s, f in sa._resolved_overrides if s == "_page_size_default")
    schedule, memory = bags(sa)
    assert schedule.page_size == 64
    assert memory.hicache_size == 6
    assert memory.hicache_write_policy == "write_back"
    assert memory.enable_hierarchical_cache is True and memory.hicache_storage_backend == "dynamic"


def test_without_lifeboat_full_pipeline_is_stock(tiny_model: str, monkeypatch) -> None:
    monkeypatch.setenv(rules.ENV_PAGE_SIZE, "128")
    sa = resolve(tiny_model, enable_hierarchical_cache=True)
    assert view(sa).page_size == 1 and view(sa).hicache_size == 0
    assert our_declarations(sa) == []


@pytest.mark.parametrize(
    "env, expected",
    [
        ({rules.ENV_PAGE_SIZE: "128"}, dict(page_size=128)),
        ({rules.ENV_HOST_GB: "40"}, dict(hicache_size=40)),
        ({rules.ENV_WRITE_POLICY: "write_through_selective"}, dict(hicache_write_policy="write_through_selective")),
        ({rules.ENV_WRITE_POLICY: "write_back"}, dict(hicache_write_policy="write_back")),
        ({rules.ENV_HOST_MODE: "buffer_only"}, dict(hicache_host_memory_mode="buffer_only")),
        ({rules.ENV_ZERO_COPY: "0", rules.ENV_STAGING_TOKENS: "512"}, dict(page_size=64, hicache_size=6)),
    ],
)
def test_env_overrides(monkeypatch, env: dict, expected: dict) -> None:
    for k, val in env.items():
        monkeypatch.setenv(k, val)
    v = view(resolve(**LIFEBOAT))
    for field, value in expected.items():
        assert getattr(v, field) == value


def test_host_gb_auto_uses_the_injected_gpu_memory(monkeypatch) -> None:
    monkeypatch.setenv(rules.ENV_HOST_GB, "auto")
    monkeypatch.setattr(sglang_plugin, "available_ram_bytes", lambda: 1000 * GB)
    seen = []
    monkeypatch.setattr(sglang_plugin, "gpu_memory_bytes", lambda index=0: seen.append(index) or 80 * GB)
    v = view(resolve(tp_size=4, base_gpu_id=2, **LIFEBOAT))
    # min(2 x 80 GB, (1000 GB - 10 GiB) / 2 / 4 ranks = 123.6 GB) -> 123
    assert v.hicache_size == rules.auto_host_pool_gb(80 * GB, 1000 * GB, 4) == 123
    assert seen == [2]  # the launch's first GPU


def test_host_gb_auto_without_gpu_stops(monkeypatch) -> None:
    monkeypatch.setenv(rules.ENV_HOST_GB, "auto")
    monkeypatch.setattr(sglang_plugin, "gpu_memory_bytes", lambda index=0: None)
    with pytest.raises(ValueError, match="LIFEBOAT_SGLANG_HOST_GB=auto"):
        resolve(**LIFEBOAT)


def test_launch_page_size_is_kept(tiny_model: str, monkeypatch) -> None:
    monkeypatch.setenv(rules.ENV_PAGE_SIZE, "128")
    for model in ("dummy", tiny_model):
        sa = resolve(model, page_size=16, **LIFEBOAT)
        assert view(sa).page_size == 16
        assert all("page_size" not in f for f in our_declarations(sa))


@pytest.mark.parametrize("given", [dict(hicache_size=3), dict(hicache_ratio=1.5)])
def test_launch_host_pool_is_kept(monkeypatch, given: dict) -> None:
    monkeypatch.setenv(rules.ENV_HOST_GB, "64")
    v = view(resolve(**given, **LIFEBOAT))
    assert v.hicache_size == given.get("hicache_size", 0)
    assert v.hicache_ratio == given.get("hicache_ratio", 2.0)
    assert v.page_size == 64


def test_backend_named_by_backend_name_only() -> None:
    extra = json.dumps({"backend_name": "lifeboat", "module_path": "somewhere.else", "class_name": "X"})
    sa = resolve(
        enable_hierarchical_cache=True, hicache_storage_backend="dynamic", hicache_storage_backend_extra_config=extra
    )
    assert view(sa).page_size == 64


def test_backend_from_an_extra_config_file(tmp_path: Path) -> None:
    path = tmp_path / "lifeboat.json"
    path.write_text(EXTRA)
    sa = resolve(
        enable_hierarchical_cache=True,
        hicache_storage_backend="dynamic",
        hicache_storage_backend_extra_config=f"@{path}",
    )
    assert view(sa).page_size == 64


def test_command_line_through_prepare_server_args(monkeypatch) -> None:
    """The stock CLI parser (`prepare_server_args`, what `launch_server` calls) with typed flags."""
    from sglang.srt.server_args import prepare_server_args

    base = ["--model-path", "dummy", "--device", "cpu", "--enable-hierarchical-cache"]
    base += ["--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config", EXTRA]
    sa = prepare_server_args(base)
    sa.resolve_once()
    assert view(sa).page_size == 64 and view(sa).hicache_size == 6
    typed = ["--page-size", "16", "--hicache-size", "3", "--hicache-write-policy", "write_back"]
    sa = prepare_server_args(base + typed)
    sa.resolve_once()
    v = view(sa)
    assert (v.page_size, v.hicache_size, v.hicache_write_policy) == (16, 3, "write_back")


@pytest.mark.parametrize("typed", ["write_through_selective", "write_through"])
def test_a_typed_write_policy_beats_the_variable(monkeypatch, caplog, typed: str) -> None:
    """`--hicache-write-policy` on the command line beats LIFEBOAT_SGLANG_WRITE_POLICY (SGLang's default
    typed by hand too: `launch_server` parses sys.argv), and the log says which won."""
    caplog.set_level(logging.INFO, logger=sglang_plugin.__name__)
    monkeypatch.setenv(rules.ENV_WRITE_POLICY, "write_back")
    monkeypatch.setattr(sys, "argv", ["launch_server", "--model-path", "dummy", "--hicache-write-policy", typed])
    sa = resolve(**LIFEBOAT, hicache_write_policy=typed)
    assert view(sa).hicache_write_policy == typed
    ours = [r.getMessage() for r in caplog.records if r.name == sglang_plugin.__name__]
    assert any(m.startswith(f"LifeboatCache: write policy {typed} (the launch gave --hicache-write-policy; "
                            "LIFEBOAT_SGLANG_WRITE_POLICY=write_back ignored") for m in ours), ours
    monkeypatch.setattr(sys, "argv", ["launch_server", "--model-path", "dummy"])  # no flag: the variable wins
    assert view(resolve(**LIFEBOAT)).hicache_write_policy == "write_back"


# ---------------------------------------------------------------------------------------------
# Launches without LifeboatCache are untouched
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "launch",
    [
        dict(),
        dict(enable_hierarchical_cache=True),
        dict(enable_hierarchical_cache=True, hicache_storage_backend="file"),
        dict(
            enable_hierarchical_cache=True,
            hicache_storage_backend="dynamic",
            hicache_storage_backend_extra_config=json.dumps(
                {"backend_name": "x", "module_path": "m", "class_name": "C"}
            ),
        ),
    ],
)
def test_other_launches_are_unchanged(monkeypatch, launch: dict) -> None:
    baseline = resolve(**launch).resolved_dict()
    # Tuning variables (even invalid ones) do nothing to a launch that does not use LifeboatCache.
    monkeypatch.setenv(rules.ENV_PAGE_SIZE, "abc")
    monkeypatch.setenv(rules.ENV_HOST_GB, "64")
    monkeypatch.setenv(rules.ENV_WRITE_POLICY, "write_back")
    sa = resolve(**launch)
    assert our_declarations(sa) == []
    assert sa.resolved_dict() == baseline


def test_enable_flag_with_another_storage_backend_is_unchanged(monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger=sglang_plugin.__name__)
    monkeypatch.setenv(rules.ENV_ENABLE, "1")
    sa = resolve(device="cuda", enable_hierarchical_cache=True, hicache_storage_backend="file")
    assert our_declarations(sa) == [] and view(sa).hicache_storage_backend == "file"
    assert any("--hicache-storage-backend file" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# One-variable start: LIFEBOAT_CACHE=1
# ---------------------------------------------------------------------------------------------


def test_one_variable_start_on_a_cuda_launch(monkeypatch) -> None:
    """`LIFEBOAT_CACHE=1 python -m sglang.launch_server --model-path M` on CUDA.

    Resolved with `--device cuda` on this CPU host: the dummy-model path resolves the launch's
    arguments without touching hardware. (No `--device` on a real CUDA host resolves the same, via
    SGLang's platform detection.)
    """
    monkeypatch.setenv(rules.ENV_ENABLE, "1")
    sa = resolve(device="cuda")
    v = view(sa)
    assert v.enable_hierarchical_cache is True
    assert v.hicache_storage_backend == "dynamic"
    assert json.loads(v.hicache_storage_backend_extra_config) == dict(sizing.BACKEND_EXTRA_CONFIG)
    assert v.page_size == 64 and v.hicache_size == 6
    _, memory = bags(sa)
    assert memory.enable_hierarchical_cache is True and memory.hicache_storage_backend == "dynamic"
    assert sglang_plugin.published_launch_uses_lifeboat() is False  # nothing published in this process


def test_one_variable_start_without_device_follows_platform_detection(monkeypatch) -> None:
    """No `--device`: SGLang's platform facts decide; `override_platform` is SGLang's own test seam."""
    from sglang.srt.runtime_context import override_platform

    monkeypatch.setenv(rules.ENV_ENABLE, "1")
    with override_platform(is_cuda=True):
        sa = resolve(device=None)
    assert view(sa).enable_hierarchical_cache is True and view(sa).page_size == 64
    with override_platform(is_cuda=False):
        sa = resolve(device=None)
    assert view(sa).enable_hierarchical_cache is False and our_declarations(sa) == []


def test_one_variable_start_skips_non_cuda_launches(monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger=sglang_plugin.__name__)
    monkeypatch.setenv(rules.ENV_ENABLE, "1")
    sa = resolve(device="cpu")
    assert our_declarations(sa) == [] and view(sa).enable_hierarchical_cache is False
    assert any("only on CUDA launches" in r.getMessage() for r in caplog.records)


def test_one_variable_start_turns_on_hicache_for_a_named_backend(monkeypatch) -> None:
    monkeypatch.setenv(rules.ENV_ENABLE, "1")
    launch = {k: v for k, v in LIFEBOAT.items() if k != "enable_hierarchical_cache"}
    v = view(resolve(**launch))
    assert v.enable_hierarchical_cache is True and v.page_size == 64


# ---------------------------------------------------------------------------------------------
# Invalid values stop the launch
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, value, allowed",
    [
        (rules.ENV_PAGE_SIZE, "abc", "positive whole number"),
        (rules.ENV_STAGING_TOKENS, "-1", "positive whole number"),
        (rules.ENV_HOST_GB, "many", "'auto'"),
        (rules.ENV_WRITE_POLICY, "write-back", "write_through, write_through_selective, write_back"),
        (rules.ENV_ZERO_COPY, "true", "'1'"),
    ],
)
def test_invalid_env_stops_resolution(monkeypatch, name: str, value: str, allowed: str) -> None:
    from sglang.srt.server_args import ServerArgs

    # register() does not validate: load_plugins() would only log an exception raised there.
    monkeypatch.setenv(name, value)
    sglang_plugin.register()
    sa = ServerArgs(model_path="dummy", device="cpu", **LIFEBOAT)
    with pytest.raises(ValueError) as err:
        sa.resolve_once()
    assert name in str(err.value) and repr(value) in str(err.value) and allowed in str(err.value)
    assert sa._resolution_failed is True  # SGLang marks the record dead: the launch cannot go on


def test_invalid_enable_flag_stops_any_launch(monkeypatch) -> None:
    monkeypatch.setenv(rules.ENV_ENABLE, "yes")
    with pytest.raises(ValueError, match="LIFEBOAT_CACHE='yes' is invalid: allowed values are '1'"):
        resolve()


@pytest.mark.slow
def test_invalid_env_stops_python_m_sglang_launch_server() -> None:
    """The real launcher process exits non-zero with our message, before any server starts."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env[rules.ENV_PAGE_SIZE] = "abc"
    cmd = [sys.executable, "-W", "ignore", "-m", "sglang.launch_server", "--model-path", "dummy", "--device", "cpu"]
    cmd += ["--enable-hierarchical-cache", "--hicache-storage-backend", "dynamic"]
    cmd += ["--hicache-storage-backend-extra-config", EXTRA]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "LIFEBOAT_SGLANG_PAGE_SIZE='abc' is invalid: allowed values are a positive whole number" in proc.stderr


# ---------------------------------------------------------------------------------------------
# GPU write-back staging bound (scheduler side)
# ---------------------------------------------------------------------------------------------


def _sglang_mha_signature(*args, **kwargs) -> dict:
    """The arguments SGLang's real `prepare_mha_write_back_staging` receives, bound to its own signature
    (a renamed or removed `page_capacity` in SGLang fails here, not silently in a launch)."""
    import inspect

    from sglang.srt.mem_cache.pool_host import mha

    real = inspect.unwrap(mha.prepare_mha_write_back_staging)
    bound = inspect.signature(real).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _cpu_mha_buffer_info():
    """SGLang's own MHA device pool on CPU and its buffer description (what the host pool reads)."""
    from sglang_pools import mha_pools

    dev, _ = mha_pools("page_first", page_size=64, layers=2, heads=2, head_dim=8, tokens=64 * 64)
    return dev.get_device_pool_infos()[0].buffer_info


@pytest.mark.parametrize(
    "env_tokens, page_size, capacity, expected",
    [(None, 64, 64, 16), (None, 16, 64, 64), (None, 64, 5, 5), ("256", 64, 64, 4), ("100", 128, 64, 1)],
)
def test_mha_staging_bound_in_a_lifeboat_scheduler(monkeypatch, env_tokens, page_size, capacity, expected) -> None:
    """The sizing rule, then the hook's arguments bound against SGLang's real signature.

    SGLang's `prepare_mha_write_back_staging` reads `page_capacity` only on CUDA/HIP with its JIT
    kernel (it returns None first on CPU), so the allocation itself cannot run here; see
    `test_real_mha_staging_on_cpu_through_the_hook` for the CPU path through the installed hook.
    """
    from sglang.srt.runtime_context import create_context, use_context

    if env_tokens:
        monkeypatch.setenv(rules.ENV_STAGING_TOKENS, env_tokens)
    sa = resolve(**LIFEBOAT)
    info = _cpu_mha_buffer_info()
    with use_context(create_context(sa, role="scheduler")):
        assert sglang_plugin.published_launch_uses_lifeboat()
        bound = sglang_plugin.staging_bound_pages(page_size)
        args = sglang_plugin._bound_mha_staging(
            _sglang_mha_signature, info, layer_num=2, page_size=page_size, page_capacity=capacity
        )
    assert args["page_capacity"] == expected == min(capacity, bound)
    assert args["buffer_info"] is info and args["layer_num"] == 2 and args["page_size"] == page_size


def test_mha_staging_untouched_without_lifeboat() -> None:
    from sglang.srt.runtime_context import create_context, use_context

    sa = resolve(enable_hierarchical_cache=True, hicache_storage_backend="file")
    info = _cpu_mha_buffer_info()
    with use_context(create_context(sa, role="scheduler")):
        assert not sglang_plugin.published_launch_uses_lifeboat()
        assert sglang_plugin.staging_bound_pages(64) is None
        args = sglang_plugin._bound_mha_staging(_sglang_mha_signature, info, layer_num=2, page_size=64,
                                                page_capacity=64)
    assert args["page_capacity"] == 64
    default = sglang_plugin._bound_mha_staging(_sglang_mha_signature, info, layer_num=2, page_size=64)
    assert default["page_capacity"] == rules.SGLANG_STAGING_PAGE_CHUNK  # nothing published: SGLang's default


def test_real_mha_staging_on_cpu_through_the_hook(plugins: dict) -> None:
    """SGLang's own `prepare_mha_write_back_staging`, called through the installed hook, with no gate
    patched: on CPU SGLang allocates no staging buffer (its CUDA/HIP branch with the JIT kernel check
    is the only one that does), and the hook must keep that path intact."""
    if not plugins["loaded_by_us"]:
        pytest.skip("load_plugins() ran earlier in this session without the pool modules imported")
    from sglang.srt.mem_cache.pool_host import mha
    from sglang.srt.runtime_context import create_context, use_context

    assert hasattr(mha.prepare_mha_write_back_staging, "__wrapped__")
    info = _cpu_mha_buffer_info()
    for sa in (resolve(**LIFEBOAT), resolve(enable_hierarchical_cache=True)):
        with use_context(create_context(sa, role="scheduler")):
            assert mha.prepare_mha_write_back_staging(info, layer_num=2, page_size=64, page_capacity=64) is None


def test_mla_staging_bound_on_a_real_mla_host_pool(plugins: dict) -> None:
    """SGLang's MLA host pool built on CPU (`page_first`, 512 pages of 4 tokens) and its own
    `_init_write_back_staging_buffers`, through the installed hook.

    On CPU that method returns before it reads `page_num` (no device kernels), so the page count the
    hook presents is observed by calling SGLang's own unwrapped method from inside the hook: the
    count SGLang would size `min(page_num, 64)` pages from is the bound, and `page_num` is restored.
    """
    import inspect

    from sglang.srt.mem_cache.pool_host import mla
    from sglang.srt.runtime_context import create_context, use_context
    from sglang_pools import mla_pools

    _, host = mla_pools("page_first", page_size=64, tokens=64 * 64)
    real = inspect.unwrap(mla.MLATokenToKVPoolHost._init_write_back_staging_buffers)
    page_num = host.page_num
    assert page_num > 16
    seen: list[int] = []

    def sglang_method(pool) -> None:
        seen.append(pool.page_num)
        real(pool)

    with use_context(create_context(resolve(**LIFEBOAT), role="scheduler")):
        bound = sglang_plugin.staging_bound_pages(host.page_size)
        sglang_plugin._bound_mla_staging(sglang_method, host)
        if plugins["loaded_by_us"]:
            assert hasattr(mla.MLATokenToKVPoolHost._init_write_back_staging_buffers, "__wrapped__")
            host._init_write_back_staging_buffers()  # the installed hook around SGLang's method
    assert bound == rules.DEFAULT_STAGING_TOKENS // 64 and seen == [bound]
    assert host.page_num == page_num  # restored
    assert host.staging_buffer is None and host.staging_page_capacity == 0  # SGLang's CPU path
    with use_context(create_context(resolve(enable_hierarchical_cache=True), role="scheduler")):
        sglang_plugin._bound_mla_staging(sglang_method, host)
    assert seen[-1] == page_num  # not a LifeboatCache launch: untouched


# ---------------------------------------------------------------------------------------------
# MLX: radix-cache backend `lifeboat`
# ---------------------------------------------------------------------------------------------


def test_mlx_launch_selects_the_lifeboat_radix_backend(monkeypatch) -> None:
    """Resolution step under SGLANG_USE_MLX=1, called directly: on Linux SGLang's own MLX runtime
    validation (Metal, Torch 2.13) refuses to resolve an MLX launch, so the whole pipeline cannot run."""
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setenv("SGLANG_USE_MLX", "1")
    monkeypatch.setenv(rules.ENV_ENABLE, "1")
    sa = ServerArgs(model_path="dummy", **LIFEBOAT)
    plan = sglang_plugin.apply_launch_tuning(sa)
    assert plan.active and plan.fields == {"radix_cache_backend": "lifeboat"}
    assert our_declarations(sa) == [{"radix_cache_backend": "lifeboat"}]  # no page size, no host pool
    assert resolution_result(sa, "radix_cache_backend") == "lifeboat"
    monkeypatch.delenv("SGLANG_USE_MLX")  # projecting bags validates the MLX runtime; do it as Linux
    _, memory = bags(sa)
    assert memory.radix_cache_backend == "lifeboat"  # what `create_tree_cache` reads


def test_mlx_launch_keeps_a_named_radix_backend(monkeypatch) -> None:
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setenv("SGLANG_USE_MLX", "1")
    monkeypatch.setenv(rules.ENV_ENABLE, "1")
    for named in ("lifeboat", "other"):
        sa = ServerArgs(model_path="dummy", radix_cache_backend=named)
        sglang_plugin.apply_launch_tuning(sa)
        assert our_declarations(sa) == []
    monkeypatch.setenv(rules.ENV_ENABLE, "0")
    sa = ServerArgs(model_path="dummy")
    assert not sglang_plugin.apply_launch_tuning(sa).active and our_declarations(sa) == []


def test_mlx_radix_backend_registration(monkeypatch, caplog) -> None:
    """Registration with our real MLX shim; then with the shim's import blocked (`sys.modules[name] =
    None` is Python's own way to make an import fail) to show a missing shim only logs."""
    import importlib

    from sglang.srt.mem_cache import registry

    pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
    monkeypatch.setattr(registry, "_RADIX_CACHE_REGISTRY", {})
    monkeypatch.setenv("SGLANG_USE_MLX", "1")
    factory = getattr(importlib.import_module(sglang_plugin.MLX_MODULE), sglang_plugin.MLX_FACTORY)

    monkeypatch.delenv(rules.ENV_ENABLE, raising=False)
    sglang_plugin._register_mlx_radix_backend()  # LIFEBOAT_CACHE unset: registered all the same
    sglang_plugin._register_mlx_radix_backend()  # idempotent: a second registration would raise in SGLang
    assert registry.registered_radix_cache_backends() == ["lifeboat"]
    assert registry.get_radix_cache_factory("lifeboat") is factory

    # A missing MLX shim only logs.
    monkeypatch.setattr(registry, "_RADIX_CACHE_REGISTRY", {})
    monkeypatch.setitem(sys.modules, sglang_plugin.MLX_MODULE, None)
    with caplog.at_level(logging.ERROR, logger=sglang_plugin.__name__):
        sglang_plugin._register_mlx_radix_backend()
    assert registry.registered_radix_cache_backends() == []
    assert any("cannot load" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# CPU launches (a real CPU server: tests/e2e/test_sglang_server.py) and the configuration preflight
# ---------------------------------------------------------------------------------------------


def test_cpu_launch_gets_the_one_layout_sglang_can_copy_off_cuda(tiny_model: str, caplog) -> None:
    caplog.set_level(logging.INFO, logger=sglang_plugin.__name__)
    sa = resolve(tiny_model, device="cpu", **LIFEBOAT)
    assert (view(sa).hicache_mem_layout, view(sa).hicache_io_backend) == ("layer_first", "direct")
    assert (sa.hicache_mem_layout, sa.hicache_io_backend) == ("page_first", "kernel")  # raw: as typed
    ours = [r.getMessage() for r in caplog.records if r.name == sglang_plugin.__name__]
    assert any(m.startswith("LifeboatCache: host layout layer_first (io direct) (CPU launch") for m in ours)


def test_cpu_launch_keeps_the_working_pair_typed_by_hand(tiny_model: str) -> None:
    sa = resolve(tiny_model, device="cpu", hicache_mem_layout="layer_first", hicache_io_backend="direct", **LIFEBOAT)
    assert (view(sa).hicache_mem_layout, view(sa).hicache_io_backend) == ("layer_first", "direct")
    assert all("hicache_mem_layout" not in d for d in our_declarations(sa))


@pytest.mark.parametrize("given", [{"hicache_io_backend": "direct"}, {"hicache_mem_layout": "page_first_direct"},
                                   {"hicache_mem_layout": "layer_first"}])
def test_cpu_launch_refuses_a_typed_layout_that_cannot_copy(given: dict) -> None:
    from lifeboat_cache.config import ConfigError

    with pytest.raises(ConfigError, match="--hicache-mem-layout layer_first --hicache-io-backend direct"):
        resolve(device="cpu", **LIFEBOAT, **given)


def test_a_bad_config_file_stops_the_launch_naming_file_and_key(tmp_path: Path, monkeypatch) -> None:
    from lifeboat_cache.config import ConfigError

    bad = tmp_path / "lifeboat.yaml"
    bad.write_text(f"storage:\n  - type: local\n    path: {tmp_path / 's'}\n    capcity: 1GiB\n")
    monkeypatch.setenv("LIFEBOAT_CONFIG", str(bad))
    with pytest.raises(ConfigError, match=rf"{bad}: storage\[0\]: unknown key\(s\) capcity; allowed keys are"):
        resolve(**LIFEBOAT)


def test_a_bad_extra_config_key_stops_the_launch() -> None:
    from lifeboat_cache.config import ConfigError

    extra = json.dumps({**sizing.BACKEND_EXTRA_CONFIG, "io_workerz": 4})
    with pytest.raises(ConfigError, match="--hicache-storage-backend-extra-config.*io_workerz"):
        resolve(enable_hierarchical_cache=True, hicache_storage_backend="dynamic",
                hicache_storage_backend_extra_config=extra)


def test_an_unwritable_store_directory_stops_the_launch(tmp_path: Path) -> None:
    from lifeboat_cache.config import ConfigError

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    storage = [{"type": "local", "path": str(tmp_path / "ok")}, {"type": "nfs", "path": str(blocker / "store")}]
    extra = json.dumps({**sizing.BACKEND_EXTRA_CONFIG, "storage": storage})
    with pytest.raises(ConfigError, match=r"storage\[1\]\.path: the store directory .*a-file/store is not writable "
                                          r"\(Not a directory\); fix the path or its permissions"):
        resolve(enable_hierarchical_cache=True, hicache_storage_backend="dynamic",
                hicache_storage_backend_extra_config=extra)
    assert (tmp_path / "ok").is_dir() and not list((tmp_path / "ok").iterdir())  # probe file removed


def test_a_hung_store_directory_does_not_hang_the_launch(tmp_path: Path, monkeypatch) -> None:
    """A directory whose probe does not come back (a frozen filer) is logged; the launch goes on."""
    import threading

    from lifeboat_cache.integrations.launch import preflight as sglang_preflight

    frozen = threading.Event()
    monkeypatch.setattr(sglang_preflight, "make_dirs", lambda path: frozen.wait(30))
    try:
        assert sglang_preflight.probe_writable(tmp_path / "x", timeout=0.2) is None
    finally:
        frozen.set()


def test_cpu_launch_waits_for_prefetches_unless_the_launch_chose_a_policy(tiny_model: str, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["launch_server", "--model-path", tiny_model])
    assert view(resolve(tiny_model, device="cpu", **LIFEBOAT)).hicache_storage_prefetch_policy == "wait_complete"
    # SGLang's default typed by hand (`launch_server` parses sys.argv) is the launch's choice: kept
    monkeypatch.setattr(sys, "argv", ["launch_server", "--hicache-storage-prefetch-policy", "timeout"])
    assert view(resolve(tiny_model, device="cpu", **LIFEBOAT)).hicache_storage_prefetch_policy == "timeout"
    monkeypatch.setattr(sys, "argv", ["launch_server", "--model-path", tiny_model])
    chosen = resolve(tiny_model, device="cpu", hicache_storage_prefetch_policy="best_effort", **LIFEBOAT)
    assert view(chosen).hicache_storage_prefetch_policy == "best_effort"
    assert view(resolve(tiny_model, **LIFEBOAT)).hicache_storage_prefetch_policy == "timeout"  # CUDA: SGLang's
