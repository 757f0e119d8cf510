"""Pure launch-tuning rules (`lifeboat_cache.integrations.launch.rules`): no SGLang, no torch, no GPU."""

from __future__ import annotations

import json

import pytest

from lifeboat_cache.config import ConfigError
from lifeboat_cache.integrations.launch import env, rules, sizing
from lifeboat_cache.integrations.launch.rules import LaunchFacts, plan_launch_tuning
from lifeboat_cache.integrations.launch.sizing import GB, GIB

OURS = dict(sizing.BACKEND_EXTRA_CONFIG)


def facts(**kw) -> LaunchFacts:
    """A HiCache launch that names the LifeboatCache backend, 64 GB of free RAM, one rank."""
    base = dict(
        enable_hierarchical_cache=True,
        storage_backend="dynamic",
        extra_config=OURS,
        cuda_launch=True,
        device="cuda",
        available_ram_bytes=64 * GB,
        ranks_per_host=1,
    )
    base.update(kw)
    return LaunchFacts(**base)


def no_gpu() -> int:
    raise AssertionError("GPU memory must only be read for LIFEBOAT_SGLANG_HOST_GB=auto")


# ---------------------------------------------------------------------------------------------
# Host pool sizing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ram_gb, expected",
    [
        (0, 2),  # nothing free: the 2 GB floor
        (15, 2),  # 1.5 GB -> floor
        (29.9, 2),
        (30, 3),
        (64, 6),  # whole GB, rounded down
        (100, 10),
        (160, 16),
        (170, 16),  # 17 GB -> 16 GB ceiling
        (2000, 16),
    ],
)
def test_default_host_pool_is_ten_percent_clamped(ram_gb: float, expected: int) -> None:
    assert rules.default_host_pool_gb(int(ram_gb * GB)) == expected


def test_default_host_pool_negative_ram_is_floor() -> None:
    assert rules.default_host_pool_gb(-5) == rules.DEFAULT_HOST_MIN_GB


@pytest.mark.parametrize(
    "gpu_gb, ram_gb, ranks, expected",
    [
        (80, 2000, 8, 124),  # RAM-bound: (2000 GB - 10 GiB) / 2 / 8 = 124.3
        (80, 2000, 1, 160),  # GPU-bound: 2 x 80
        (24, 1000, 1, 48),
        (141, 1500, 8, 93),  # (1500 GB - 10 GiB) / 2 / 8 = 93.08
        (141, 1500, 2, 282),
    ],
)
def test_auto_host_pool(gpu_gb: int, ram_gb: int, ranks: int, expected: int) -> None:
    assert rules.auto_host_pool_gb(gpu_gb * GB, ram_gb * GB, ranks) == expected


def test_auto_host_pool_reserve_is_subtracted_before_halving() -> None:
    # 12 GiB free, one rank: (12 GiB - 10 GiB) / 2 = 1 GiB = 1.07 GB -> 1 GB.
    assert rules.auto_host_pool_gb(80 * GB, 12 * GIB, 1) == 1
    # Without the reserve it would have been 6 GB; with two ranks each gets half of the 1 GiB.
    with pytest.raises(ConfigError, match="LIFEBOAT_SGLANG_HOST_GB=auto"):
        rules.auto_host_pool_gb(80 * GB, 12 * GIB, 2)


@pytest.mark.parametrize("ram", [0, 10 * GIB, 10 * GIB + GB])
def test_auto_host_pool_without_room_stops_with_the_variable_named(ram: int) -> None:
    with pytest.raises(ConfigError) as err:
        rules.auto_host_pool_gb(80 * GB, ram, 1)
    assert "LIFEBOAT_SGLANG_HOST_GB" in str(err.value) and "'auto'" in str(err.value)


def test_auto_host_budget_treats_zero_ranks_as_one() -> None:
    assert sizing.auto_host_budget_gb(100 * GB, 0) == sizing.auto_host_budget_gb(100 * GB, 1)


# ---------------------------------------------------------------------------------------------
# Staging, ranks, backend recognition
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, page, pages",
    [
        (1024, 64, 16),  # the product default: 1,024 tokens at page 64
        (1024, 1, 64),  # never more than SGLang's own 64-page chunk
        (1024, 16, 64),
        (1024, 32, 32),
        (1024, 128, 8),
        (1024, 100, 10),  # whole pages within the bound
        (1024, 2048, 1),  # at least one page, even if that page exceeds the bound
        (100, 64, 1),
        (4096, 64, 64),
    ],
)
def test_staging_pages(tokens: int, page: int, pages: int) -> None:
    assert rules.staging_pages(tokens, page) == pages


@pytest.mark.parametrize("tokens, page", [(0, 64), (1024, 0), (-1, 64)])
def test_staging_pages_rejects_nonpositive(tokens: int, page: int) -> None:
    with pytest.raises(ValueError):
        rules.staging_pages(tokens, page)


@pytest.mark.parametrize(
    "tp, pp, dp, nnodes, ranks",
    [
        (1, 1, 1, 1, 1),
        (8, 1, 1, 1, 8),
        (8, 1, 1, 2, 4),
        (2, 2, 2, 1, 8),
        (4, 2, 1, 2, 4),
        (0, 0, 0, 0, 1),
        (1, 1, 1, 4, 1),
    ],
)
def test_ranks_on_host(tp: int, pp: int, dp: int, nnodes: int, ranks: int) -> None:
    assert sizing.ranks_on_host(tp, pp, dp, nnodes) == ranks


@pytest.mark.parametrize(
    "extra, ours",
    [
        (OURS, True),
        ({"module_path": sizing.BACKEND_MODULE, "class_name": "X", "backend_name": "x"}, True),
        ({"backend_name": "lifeboat", "module_path": "elsewhere", "class_name": "X"}, True),
        ({"backend_name": "mine", "module_path": "my.mod", "class_name": "X"}, False),
        (None, False),
        ("not a mapping", False),
    ],
)
def test_backend_recognition(extra, ours: bool) -> None:
    assert rules.is_lifeboat_extra_config(extra) is ours


def test_backend_extra_config_json_is_the_backend_contract() -> None:
    assert json.loads(rules.backend_extra_config_json()) == {
        "backend_name": "lifeboat",
        "module_path": "lifeboat_cache.integrations.sglang_backend",
        "class_name": "LifeboatHiCacheStorage",
        "interface_v1": 1,
    }


# ---------------------------------------------------------------------------------------------
# Environment parsing: errors name the variable and the allowed values
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "parser, name, good, bad, allowed",
    [
        (
            rules.parse_page_size,
            rules.ENV_PAGE_SIZE,
            {"32": 32, " 64 ": 64},
            ["0", "-4", "abc", "6.5"],
            "positive whole number",
        ),
        (rules.parse_staging_tokens, rules.ENV_STAGING_TOKENS, {"512": 512}, ["0", "x", "1e3"], "positive whole number"),
        (
            rules.parse_host_gb,
            rules.ENV_HOST_GB,
            {"64": 64, "auto": "auto", "AUTO": "auto"},
            ["0", "-1", "lots", "1.5"],
            "'auto'",
        ),
        (
            rules.parse_write_policy,
            rules.ENV_WRITE_POLICY,
            {p: p for p in env.WRITE_POLICIES},
            ["write-through", "WRITE_BACK", "always"],
            "write_through, write_through_selective, write_back",
        ),
        (rules.parse_zero_copy, rules.ENV_ZERO_COPY, {"1": True, "0": False}, ["true", "yes", "2"], "'1'"),
        (rules.parse_enable, rules.ENV_ENABLE, {"1": True, "0": False}, ["true", "on", "2"], "'1'"),
    ],
)
def test_env_parsing(parser, name: str, good: dict, bad: list, allowed: str) -> None:
    for raw, value in good.items():
        assert parser({name: raw}) == value
    for raw in bad:
        with pytest.raises(ConfigError) as err:
            parser({name: raw})
        message = str(err.value)
        assert name in message and repr(raw.strip()) in message and allowed in message


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_env_unset_or_blank_means_default(raw) -> None:
    names = (rules.ENV_PAGE_SIZE, rules.ENV_HOST_GB, rules.ENV_ZERO_COPY, rules.ENV_ENABLE)
    env = {} if raw is None else {n: raw for n in names}
    assert rules.parse_page_size(env) is None
    assert rules.parse_host_gb(env) is None
    assert rules.parse_zero_copy(env) is True
    assert rules.parse_enable(env) is False


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


def test_plan_defaults_for_a_lifeboat_launch() -> None:
    plan = plan_launch_tuning(facts(), {}, no_gpu)
    assert plan.active
    assert plan.fields == {"page_size": 64, "hicache_size": 6}
    messages = plan.messages()
    assert "page size 64 (LifeboatCache default; launch gave none)" in messages
    assert any(m.startswith("GPU write-back staging 1024 tokens") for m in messages)
    assert any(m.startswith("host pool 6 GB per rank (LifeboatCache default") for m in messages)
    assert "write policy write_through (the launch's write policy)" in messages
    assert "host memory mode cache (the launch's host memory mode)" in messages
    assert "zero-copy page I/O on (default)" in messages
    assert any(m.startswith("host layout page_first (SGLang's default and LifeboatCache's fastest") for m in messages)
    assert plan.warnings == ()


def test_host_memory_mode_flag_beats_variable_beats_launch_default() -> None:
    """LIFEBOAT_SGLANG_HOST_MODE sets --hicache-host-memory-mode when the launch typed none; a typed flag wins,
    with a warning when they disagree; a bad value stops the launch naming the variable."""
    env = {rules.ENV_HOST_MODE: "buffer_only"}
    plan = plan_launch_tuning(facts(), env, no_gpu)
    assert plan.fields["hicache_host_memory_mode"] == "buffer_only"
    assert f"host memory mode buffer_only ({rules.ENV_HOST_MODE}; launch had cache)" in plan.messages()
    typed = plan_launch_tuning(facts(host_mode="cache", host_mode_given=True), env, no_gpu)
    assert "hicache_host_memory_mode" not in typed.fields
    assert any(w.startswith(f"--hicache-host-memory-mode cache beats {rules.ENV_HOST_MODE}=buffer_only")
               for w in typed.warnings)
    same = plan_launch_tuning(facts(host_mode="buffer_only", host_mode_given=True), env, no_gpu)
    assert same.warnings == () and "hicache_host_memory_mode" not in same.fields
    with pytest.raises(ConfigError, match=rf"^{rules.ENV_HOST_MODE}='buffer' is invalid: allowed values are "
                                          "cache, buffer_only"):
        plan_launch_tuning(facts(), {rules.ENV_HOST_MODE: "buffer"}, no_gpu)


@pytest.mark.parametrize("layout,io,shown,reason", [
    ("page_first", "kernel", "page_first", "LifeboatCache's fastest"),
    ("page_first", "direct", "page_first_direct", "direct io backend"),
    ("layer_first", "kernel", "layer_first", "kept as given"),
    ("page_head", "kernel", "page_head", "SGLang's page copies"),
])
def test_plan_host_layout_is_kept_and_explained(layout: str, io: str, shown: str, reason: str) -> None:
    plan = plan_launch_tuning(facts(mem_layout=layout, io_backend=io), {}, no_gpu)
    d = next(d for d in plan.decisions if d.what == "host layout")
    assert d.value == shown and reason in d.why
    assert "hicache_mem_layout" not in plan.fields  # the launch's layout is never switched


def test_plan_every_decision_once() -> None:
    whats = [d.what for d in plan_launch_tuning(facts(), {}, no_gpu).decisions]
    assert sorted(whats) == sorted(set(whats))
    assert set(whats) == {"page size", "GPU write-back staging", "host pool", "write policy", "host memory mode",
                          "host layout", "zero-copy page I/O"}


def test_plan_launch_page_size_wins_over_env() -> None:
    plan = plan_launch_tuning(facts(page_size=16), {rules.ENV_PAGE_SIZE: "128"}, no_gpu)
    assert "page_size" not in plan.fields
    assert "page size 16 (the launch gave --page-size)" in plan.messages()
    staging = next(d for d in plan.decisions if d.what == "GPU write-back staging")
    assert staging.value == "1024 tokens"  # 64 pages of 16: SGLang's own size, not raised


def test_plan_env_page_size_changes_the_default() -> None:
    plan = plan_launch_tuning(facts(), {rules.ENV_PAGE_SIZE: "128"}, no_gpu)
    assert plan.fields["page_size"] == 128
    assert "page size 128 (LIFEBOAT_SGLANG_PAGE_SIZE; launch gave none)" in plan.messages()
    staging = next(d for d in plan.decisions if d.what == "GPU write-back staging")
    assert staging.value == "1024 tokens"  # 8 pages of 128


def test_plan_staging_env() -> None:
    plan = plan_launch_tuning(facts(), {rules.ENV_STAGING_TOKENS: "256"}, no_gpu)
    staging = next(d for d in plan.decisions if d.what == "GPU write-back staging")
    assert staging.value == "256 tokens" and "LIFEBOAT_SGLANG_STAGING_TOKENS" in staging.why
    assert staging.fields == {}  # applied in the scheduler, not through a server argument


@pytest.mark.parametrize(
    "given", [dict(hicache_size=3), dict(hicache_ratio=1.5), dict(hicache_size=3, hicache_ratio=1.5)]
)
@pytest.mark.parametrize("env_host", [None, "64", "auto"])
def test_plan_launch_host_pool_always_wins(given: dict, env_host) -> None:
    env = {} if env_host is None else {rules.ENV_HOST_GB: env_host}
    plan = plan_launch_tuning(facts(**given), env, no_gpu)
    assert "hicache_size" not in plan.fields
    host = next(d for d in plan.decisions if d.what == "host pool")
    assert host.why.startswith("the launch gave it")
    assert ("LIFEBOAT_SGLANG_HOST_GB ignored" in host.why) == (env_host is not None)


def test_plan_env_host_gb_number() -> None:
    plan = plan_launch_tuning(facts(available_ram_bytes=1000 * GB), {rules.ENV_HOST_GB: "64"}, no_gpu)
    assert plan.fields["hicache_size"] == 64
    assert "host pool 64 GB per rank (LIFEBOAT_SGLANG_HOST_GB)" in plan.messages()


def test_plan_env_host_gb_auto_uses_injected_gpu_memory() -> None:
    f = facts(available_ram_bytes=1000 * GB, ranks_per_host=8)
    plan = plan_launch_tuning(f, {rules.ENV_HOST_GB: "auto"}, lambda: 80 * GB)
    assert plan.fields["hicache_size"] == rules.auto_host_pool_gb(80 * GB, 1000 * GB, 8) == 61
    plan = plan_launch_tuning(facts(available_ram_bytes=1000 * GB), {rules.ENV_HOST_GB: "auto"}, lambda: 24 * GB)
    assert plan.fields["hicache_size"] == 48


@pytest.mark.parametrize("gpu", [None, 0])
def test_plan_auto_without_gpu_stops(gpu) -> None:
    with pytest.raises(ConfigError, match="LIFEBOAT_SGLANG_HOST_GB=auto needs the GPU's memory"):
        plan_launch_tuning(facts(), {rules.ENV_HOST_GB: "auto"}, lambda: gpu)


def test_plan_warns_when_the_pool_cannot_fit() -> None:
    plan = plan_launch_tuning(facts(available_ram_bytes=100 * GB, ranks_per_host=8), {rules.ENV_HOST_GB: "64"}, no_gpu)
    assert plan.fields["hicache_size"] == 64
    assert any("exceeds this host's room" in w for w in plan.warnings)
    # The default on a small host: 2 GB floor but less than 2 GB of room after the reserve.
    plan = plan_launch_tuning(facts(available_ram_bytes=11 * GB), {}, no_gpu)
    assert plan.fields["hicache_size"] == 2 and plan.warnings


@pytest.mark.parametrize("launch_policy", env.WRITE_POLICIES)
@pytest.mark.parametrize("env_policy", (None,) + env.WRITE_POLICIES)
def test_plan_write_policy(launch_policy: str, env_policy) -> None:
    env = {} if env_policy is None else {rules.ENV_WRITE_POLICY: env_policy}
    plan = plan_launch_tuning(facts(write_policy=launch_policy), env, no_gpu)
    decision = next(d for d in plan.decisions if d.what == "write policy")
    if env_policy is None:
        assert decision.value == launch_policy and "hicache_write_policy" not in plan.fields
    else:
        assert decision.value == env_policy
        assert plan.fields.get("hicache_write_policy", launch_policy) == env_policy
        assert f"launch had {launch_policy}" in decision.why


def test_plan_zero_copy_off() -> None:
    plan = plan_launch_tuning(facts(), {rules.ENV_ZERO_COPY: "0"}, no_gpu)
    assert "zero-copy page I/O off (LIFEBOAT_SGLANG_ZERO_COPY)" in plan.messages()


@pytest.mark.parametrize(
    "name, value",
    [
        (rules.ENV_PAGE_SIZE, "big"),
        (rules.ENV_STAGING_TOKENS, "0"),
        (rules.ENV_HOST_GB, "-3"),
        (rules.ENV_WRITE_POLICY, "sometimes"),
        (rules.ENV_ZERO_COPY, "yes"),
    ],
)
def test_plan_invalid_env_stops_a_lifeboat_launch(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        plan_launch_tuning(facts(), {name: value}, no_gpu)


@pytest.mark.parametrize(
    "name, value",
    [(rules.ENV_PAGE_SIZE, "big"), (rules.ENV_HOST_GB, "-3"), (rules.ENV_WRITE_POLICY, "x"), (rules.ENV_ZERO_COPY, "y")],
)
def test_plan_other_launches_are_untouched_even_with_bad_tuning_env(name: str, value: str) -> None:
    for f in (
        facts(storage_backend=None, extra_config=None),
        facts(storage_backend="file", extra_config=None),
        facts(extra_config={"backend_name": "other", "module_path": "x", "class_name": "Y"}),
        facts(enable_hierarchical_cache=False, storage_backend=None, extra_config=None),
    ):
        plan = plan_launch_tuning(f, {name: value}, no_gpu)
        assert not plan.active and plan.fields == {} and plan.decisions == ()


def test_plan_invalid_enable_flag_stops_any_launch() -> None:
    with pytest.raises(ConfigError, match="LIFEBOAT_CACHE='yes'"):
        plan_launch_tuning(facts(storage_backend=None, extra_config=None), {rules.ENV_ENABLE: "yes"}, no_gpu)


def test_plan_one_variable_start_on_cuda() -> None:
    f = facts(enable_hierarchical_cache=False, storage_backend=None, extra_config=None)
    plan = plan_launch_tuning(f, {rules.ENV_ENABLE: "1"}, no_gpu)
    assert plan.active
    fields = plan.fields
    assert fields["enable_hierarchical_cache"] is True
    assert fields["hicache_storage_backend"] == "dynamic"
    assert json.loads(fields["hicache_storage_backend_extra_config"]) == OURS
    assert fields["page_size"] == 64 and fields["hicache_size"] == 6
    assert any(m.startswith("HiCache storage backend lifeboat (LIFEBOAT_CACHE=1") for m in plan.messages())


def test_plan_one_variable_start_with_hicache_already_on() -> None:
    f = facts(storage_backend=None, extra_config=None, hicache_size=8)
    plan = plan_launch_tuning(f, {rules.ENV_ENABLE: "1"}, no_gpu)
    assert plan.fields["hicache_storage_backend"] == "dynamic" and "hicache_size" not in plan.fields


@pytest.mark.parametrize(
    "kw, reason",
    [
        (dict(cuda_launch=False, device="cpu"), "only on CUDA launches"),
        (dict(storage_backend="mooncake"), "configured --hicache-storage-backend mooncake"),
        (dict(disable_radix_cache=True), "--disable-radix-cache"),
    ],
)
def test_plan_one_variable_start_declines(kw: dict, reason: str) -> None:
    base = dict(enable_hierarchical_cache=False, storage_backend=None, extra_config=None)
    base.update(kw)
    plan = plan_launch_tuning(facts(**base), {rules.ENV_ENABLE: "1"}, no_gpu)
    assert not plan.active and plan.fields == {}
    assert any(reason in w for w in plan.warnings)


def test_plan_backend_named_without_hicache() -> None:
    plan = plan_launch_tuning(facts(enable_hierarchical_cache=False), {}, no_gpu)
    assert not plan.active and plan.fields == {}
    assert any("--enable-hierarchical-cache" in w for w in plan.warnings)
    plan = plan_launch_tuning(facts(enable_hierarchical_cache=False), {rules.ENV_ENABLE: "1"}, no_gpu)
    assert plan.active and plan.fields["enable_hierarchical_cache"] is True
    assert "hicache_storage_backend" not in plan.fields  # the launch's own extra config is kept


def test_plan_with_backend_named_lifeboat_and_enable_flag_zero() -> None:
    plan = plan_launch_tuning(facts(), {rules.ENV_ENABLE: "0"}, no_gpu)
    assert plan.active  # the launch named the backend explicitly; "0" only turns the one-variable start off


def test_decision_is_frozen() -> None:
    d = rules.Decision("page size", 64, "why", {"page_size": 64})
    with pytest.raises(Exception):
        d.value = 1  # type: ignore[misc]


@pytest.mark.parametrize("launch_policy", env.WRITE_POLICIES)
@pytest.mark.parametrize("env_policy", env.WRITE_POLICIES)
def test_a_typed_write_policy_beats_the_environment(launch_policy: str, env_policy: str) -> None:
    """`--hicache-write-policy` on the command line was replaced by LIFEBOAT_SGLANG_WRITE_POLICY: a flag must
    beat an environment variable, as everywhere in SGLang, and the log must say which won."""
    plan = plan_launch_tuning(facts(write_policy=launch_policy, write_policy_given=True),
                              {rules.ENV_WRITE_POLICY: env_policy}, no_gpu)
    decision = next(d for d in plan.decisions if d.what == "write policy")
    assert decision.value == launch_policy and "hicache_write_policy" not in plan.fields
    assert "the launch gave --hicache-write-policy" in decision.why
    if env_policy != launch_policy:
        assert f"LIFEBOAT_SGLANG_WRITE_POLICY={env_policy} ignored" in decision.why
        assert any("a flag beats the environment" in w for w in plan.warnings)


def test_a_cpu_launch_that_would_run_out_of_host_memory_is_named_in_one_line() -> None:
    """docs/sglang.md's CPU line, as written, died at start on a 24 GiB host: "Not enough host memory
    available. Requesting 1.00 GB but only have -4.57 GB free" (SGLang's CPU token pool took the RAM first)."""
    cpu = dict(cuda_launch=False, device="cpu", storage_backend="dynamic", enable_hierarchical_cache=True,
               extra_config=dict(sizing.BACKEND_EXTRA_CONFIG), hicache_size=1, available_ram_bytes=20 * GB)
    plan = plan_launch_tuning(facts(**cpu), {}, no_gpu)
    (line,) = [w for w in plan.warnings if "Not enough host memory" in w]
    assert "--max-total-tokens" in line and "--hicache-size" in line and "\n" not in line
    assert not any("Not enough host memory" in w for w in
                   plan_launch_tuning(facts(**{**cpu, "max_total_tokens": 16384}), {}, no_gpu).warnings)
    assert not any("Not enough host memory" in w for w in  # a large host has room for both
                   plan_launch_tuning(facts(**{**cpu, "available_ram_bytes": 256 * GB}), {}, no_gpu).warnings)
