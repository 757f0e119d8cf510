"""Tiny seeded MLX models saved as model directories (for fast, deterministic MLX tests).

Why: the restore logic must be tested against SGLang's real ``MlxModelRunner``, which loads a model
*directory* through ``mlx_lm.load``; a seeded random model is bit-for-bit reproducible, so two
processes built from the same seed are the same model, and a different seed is "another model" with
the same geometry (the namespace must still keep them apart). The ``*_proj`` weights are scaled x2 so
greedy tokens vary (a random init otherwise predicts a near-constant token, which would make token
equality checks toothless). The tokenizer is a small byte-level BPE trained in-process (offline).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_CORPUS = [
    "the quick brown fox jumps over the lazy dog " * 20,
    "lorem ipsum dolor sit amet consectetur adipiscing elit " * 20,
]


def _save(model: Any, cfg: dict[str, Any], out: Path, seed: int) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    params = dict(tree_flatten(model.parameters()))
    for k, v in params.items():
        if "_proj" in k:
            params[k] = v * 2
    model.load_weights(list(params.items()))
    mx.eval(model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config({**cfg, "torch_dtype": "float32"}, out / "config.json")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|eos|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>").save_pretrained(out)
    (out / "lifeboat-test-model.json").write_text(json.dumps({"seed": seed}))
    return out


def tiny_llama(out: str | Path, seed: int = 0) -> Path:
    """4 layers, hidden 128, GQA 4/2, head_dim 32, vocab 512, fp32 (~0.7 M parameters)."""
    import mlx.core as mx
    from mlx_lm.models import llama

    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=128, num_hidden_layers=4,
               intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
               rms_norm_eps=1e-5, vocab_size=512, rope_theta=10000.0, tie_word_embeddings=True,
               max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    mx.random.seed(seed)
    return _save(llama.Model(llama.ModelArgs.from_dict(cfg)), cfg, Path(out), seed)


def tiny_qwen3_next(out: str | Path, seed: int = 0) -> Path:
    """Hybrid: 4 layers alternating GatedDeltaNet (linear attention) and full attention, dense MLP."""
    import mlx.core as mx
    from mlx_lm.models import qwen3_next

    cfg = dict(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], hidden_size=64,
               num_hidden_layers=4, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
               linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=0, num_experts_per_tok=1,
               decoder_sparse_step=1, shared_expert_intermediate_size=128, mlp_only_layers=[0, 1, 2, 3],
               moe_intermediate_size=128, rms_norm_eps=1e-6, vocab_size=512, rope_theta=10000.0,
               partial_rotary_factor=0.5, max_position_embeddings=4096, tie_word_embeddings=True,
               full_attention_interval=2, bos_token_id=1, eos_token_id=2)
    mx.random.seed(seed)
    return _save(qwen3_next.Model(qwen3_next.ModelArgs.from_dict(cfg)), cfg, Path(out), seed)
