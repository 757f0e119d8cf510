"""The serving bench's shared-prefix traffic: the arguments we hand `python -m sglang.bench_serving`, read by
SGLang 0.5.23's own command-line parser, and the prompts its own generated-shared-prefix loader makes of
them: groups of users sharing one system prompt, the same prompts every time, both halves the whole set."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lifeboat_cache.bench.serving import check
from lifeboat_cache.bench.serving_load import command
from lifeboat_cache.bench.serving_shared_prefix import SharedPrefixShape
from lifeboat_cache.bench.sizes import QUICK

bench = pytest.importorskip("sglang.benchmark.serving",
                            reason="SGLang's load generator needs `datasets` (requirements/test.txt)")

SHAPE = SharedPrefixShape(groups=3, per_group=4, system_tokens=120, question_tokens=16)


class _Server:
    url, port = "http://127.0.0.1:30000", 30000


@pytest.fixture(scope="module")
def model() -> Path:
    from lifeboat_cache.demo import ensure_model

    return ensure_model(dtype="float32", layout="hf")


def parsed(monkeypatch: pytest.MonkeyPatch, cmd: list[str]) -> Any:
    """bench_serving's own parser on our command line; its run is replaced by a capture (no server here)."""
    assert cmd[1:3] == ["-m", "sglang.bench_serving"]
    seen: list[Any] = []
    monkeypatch.setattr(sys, "argv", ["bench_serving", *cmd[3:]])
    monkeypatch.setattr(bench, "run_benchmark", seen.append)
    bench.cli_main()
    return seen[0]


def rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: Path, seed: int = 1) -> list[Any]:
    from sglang.benchmark.datasets import get_dataset
    from sglang.benchmark.utils import get_tokenizer

    monkeypatch.setenv("HOME", str(tmp_path))  # SGLang caches generated prompts under ~/.cache/sglang
    cmd = command(_Server(), model, SHAPE.args(output_tokens=8), count=SHAPE.visits, concurrency=4,
                  output_tokens=8, out_file=tmp_path / "out.jsonl", seed=seed)
    args = parsed(monkeypatch, cmd)
    assert (args.dataset_name, args.num_prompts, args.gsp_num_groups, args.gsp_prompts_per_group) == (
        "generated-shared-prefix", 12, 3, 4)
    random.seed(args.seed)  # as bench_serving's run does before it builds the dataset
    np.random.seed(args.seed)
    return get_dataset(args, get_tokenizer(str(model)))


def test_groups_of_users_share_one_system_prompt(monkeypatch, tmp_path, model) -> None:
    out = rows(monkeypatch, tmp_path, model)
    assert len(out) == SHAPE.visits and all(r.output_len == 8 for r in out)
    systems: dict[str, int] = {}
    for r in out:
        system, question = r.prompt.split("\n\n", 1)
        assert question and system
        systems[system] = systems.get(system, 0) + 1
    assert sorted(systems.values()) == [SHAPE.per_group] * SHAPE.groups  # each group's users share its prompt
    assert min(r.prompt_len for r in out) >= SHAPE.system_tokens  # the shared prefix is most of each prompt


def test_the_same_seed_makes_the_same_prompts_in_the_same_order(monkeypatch, tmp_path, model) -> None:
    first = [r.prompt for r in rows(monkeypatch, tmp_path / "a", model)]
    again = [r.prompt for r in rows(monkeypatch, tmp_path / "b", model)]  # generated anew, not SGLang's cache
    other = [r.prompt for r in rows(monkeypatch, tmp_path / "c", model, seed=2)]
    assert first == again  # so every server gets the same requests and answers compare one by one
    assert other != first


def test_both_halves_send_the_whole_set() -> None:
    assert SHAPE.halves() == ((0, 12), (0, 12))
    assert SHAPE.distinct_tokens == 3 * 120 + 12 * 16


@pytest.mark.parametrize("text", ["8,6,900", "8,6,900,0", "a,b,c,d", ""])
def test_a_bad_shape_names_the_size_key(text: str) -> None:
    with pytest.raises(ValueError, match=f"--size serving_shared_prefix={text}: four positive integers"):
        check(replace(QUICK, serving_dataset="shared_prefix", serving_shared_prefix=text))
    check(replace(QUICK, serving_shared_prefix=text))  # only read when the dataset is shared_prefix


def test_a_bad_dataset_names_the_choices() -> None:
    with pytest.raises(ValueError, match="--size serving_dataset=sharegpt: choose one of multi_turn, shared_prefix"):
        check(replace(QUICK, serving_dataset="sharegpt"))
