"""Returning user across a restart, on real weights: SmolLM2-135M-Instruct through SGLang's MLX classes.

Two fresh processes share the embedded default store (under a temp ``XDG_CACHE_HOME``). Process 1
answers a chat prompt cold and exits; process 2 answers the same prompt. Proven:
* process 2 gets every full 64-token chunk of the prompt from the store;
* the K/V rows it installs in ``MlxAttentionKVPool`` are bitwise equal to process 1's cold rows,
  token by token (so chunk order is checked), in fp32;
* the greedy tokens are identical, and the time to first token is lower;
* negative control: a prompt the store never saw gets nothing.

Runs in float32 with OpenBLAS preloaded in the children (see ``child_env``); prompts stay near
400 tokens so the file finishes in about a minute.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
pytest.importorskip("sglang", reason="SGLang 0.5.23 is not installed")

from lifeboat_cache.demo import texts  # noqa: E402
from lifeboat_cache.demo.returning_user import chat_token_ids  # noqa: E402
from lifeboat_cache.demo.smollm2 import ensure_model, locate_gguf  # noqa: E402

try:
    locate_gguf()
except FileNotFoundError as e:  # pragma: no cover - the CI conftest turns skips into failures
    pytest.skip(str(e), allow_module_level=True)
from lifeboat_cache.demo.mlx_serving import child_env, run_plan_process  # noqa: E402

pytestmark = pytest.mark.slow
C = 64


@pytest.fixture(scope="module")
def restart(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("mlx-e2e")
    model = ensure_model(dtype="float32")
    prompts = {
        "A": chat_token_ids(model, [{"role": "user", "content": f"{texts.GETTYSBURG}\n\n{texts.QUESTION}"}]),
        "NEW": chat_token_ids(model, [{"role": "user", "content": texts.DECLARATION[:1800] + "\n\nSummarize."}]),
    }
    n_rows = len(prompts["A"]) - 1  # what SGLang matches: full chunks + the prompt's tail record
    env = child_env(XDG_CACHE_HOME=str(root / "xdg"))
    runs = {}
    for name in ("cold", "warm"):
        out = root / name
        out.mkdir()
        steps = [{"op": "generate", "name": "A", "ids": "A", "max_new_tokens": 16, "save_rows": n_rows}]
        if name == "warm":
            steps += [{"op": "reset_tree"}, {"op": "generate", "name": "NEW", "ids": "NEW", "max_new_tokens": 4}]
        runs[name] = run_plan_process({"model": str(model), "prompts": prompts, "out": str(out), "steps": steps,
                                       "warmup": True, "pool_size": 4096}, env, timeout=900)
    return {"root": root, "runs": runs, "n_rows": n_rows, "prompts": prompts}


def _rows(restart: dict, run: str) -> list[np.ndarray]:
    d = restart["root"] / run
    return [np.load(d / "A_k.npy"), np.load(d / "A_v.npy")]


def test_prompt_is_long_enough_to_matter(restart: dict) -> None:
    assert 300 <= len(restart["prompts"]["A"]) <= 700
    assert restart["n_rows"] >= 5 * C and restart["n_rows"] % C  # a tail to restore too


def test_every_full_chunk_comes_back_after_a_restart(restart: dict) -> None:
    cold, warm = restart["runs"]["cold"]["steps"]["A"], restart["runs"]["warm"]["steps"]["A"]
    assert cold["cached_tokens"] == 0
    assert warm["cached_tokens"] == restart["n_rows"]
    assert restart["runs"]["warm"]["stats"]["mlx_chunks_restored"] == restart["n_rows"] // C
    assert restart["runs"]["warm"]["stats"]["mlx_tails_restored"] == 1


def test_installed_rows_are_bitwise_the_cold_rows(restart: dict) -> None:
    cold, warm = _rows(restart, "cold"), _rows(restart, "warm")
    assert cold[0].dtype == np.float32 and cold[0].shape[1] == restart["n_rows"]
    for c, w in zip(cold, warm):
        assert np.array_equal(c.view(np.uint32), w.view(np.uint32))


def test_greedy_tokens_are_identical_and_first_token_is_sooner(restart: dict) -> None:
    cold, warm = restart["runs"]["cold"]["steps"]["A"], restart["runs"]["warm"]["steps"]["A"]
    assert len(cold["output_ids"]) == 16
    assert warm["output_ids"] == cold["output_ids"]
    assert warm["ttft_s"] < cold["ttft_s"]


def test_a_prompt_never_stored_gets_nothing(restart: dict) -> None:
    assert restart["runs"]["warm"]["steps"]["NEW"]["cached_tokens"] == 0
