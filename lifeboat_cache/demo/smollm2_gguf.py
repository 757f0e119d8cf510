"""From SmolLM2's GGUF metadata to the model directory's config.json and tokenizer (``smollm2`` builds it).

``build_config`` turns the ``llama.*`` metadata into an mlx-lm / transformers llama config;
``build_tokenizer`` rebuilds the byte-level BPE from ``tokenizer.ggml.*`` (control tokens as specials),
``verify_tokenizer`` fails the build when text does not round-trip, and ``save_tokenizer`` writes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: GGUF token_type value for control (special) tokens.
TOKEN_TYPE_CONTROL = 3


def build_config(metadata: dict[str, Any], *, tied: bool, dtype: str) -> dict[str, Any]:
    """mlx-lm / transformers-style llama config from the ``llama.*`` GGUF metadata."""
    hidden = meta_int(metadata, "llama.embedding_length")
    heads = meta_int(metadata, "llama.attention.head_count")
    head_dim = hidden // heads
    rope_dim = meta_int(metadata, "llama.rope.dimension_count", default=head_dim)
    if rope_dim != head_dim:
        raise ValueError(f"partial RoPE ({rope_dim} of {head_dim}) is not supported by mlx-lm llama")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": meta_int(metadata, "llama.block_count"),
        "intermediate_size": meta_int(metadata, "llama.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta_int(metadata, "llama.attention.head_count_kv", default=heads),
        "head_dim": head_dim,
        "rms_norm_eps": meta_float(metadata, "llama.attention.layer_norm_rms_epsilon"),
        "vocab_size": meta_int(metadata, "llama.vocab_size", default=len(metadata["tokenizer.ggml.tokens"])),
        "max_position_embeddings": meta_int(metadata, "llama.context_length"),
        "rope_theta": meta_float(metadata, "llama.rope.freq_base", default=10000.0),
        # llama.cpp's converter permutes Q/K rows so that interleaved (GPT-J style) RoPE is right.
        "rope_traditional": True,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "bos_token_id": meta_int(metadata, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta_int(metadata, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta_int(metadata, "tokenizer.ggml.padding_token_id", default=None),
        "torch_dtype": dtype,
    }


def meta_int(metadata: dict[str, Any], key: str, default: Any = ...) -> Any:
    """Integer GGUF metadata value (mx.load returns scalars as 0-d arrays)."""
    if key not in metadata:
        if default is ...:
            raise KeyError(f"GGUF metadata lacks {key!r}")
        return default
    return int(metadata[key].item())


def meta_float(metadata: dict[str, Any], key: str, default: Any = ...) -> float:
    """Float GGUF metadata value, rounded through float32 repr to drop float32 noise (1e-5, not 9.99e-6)."""
    if key not in metadata:
        if default is ...:
            raise KeyError(f"GGUF metadata lacks {key!r}")
        return float(default)
    return float(f"{float(metadata[key].item()):.7g}")


def meta_str(metadata: dict[str, Any], key: str) -> str | None:
    """String GGUF metadata value or None."""
    value = metadata.get(key)
    return value if isinstance(value, str) else None


def build_tokenizer(metadata: dict[str, Any]) -> PreTrainedTokenizerFast:
    """Byte-level BPE from ``tokenizer.ggml.*`` metadata, control tokens registered as specials.

    The pre-tokenizer matches llama.cpp's ``smollm`` pre-type: single digits, then the GPT-2 regex.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if metadata.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(
            f"expected a gpt2 (byte-level BPE) GGUF tokenizer, got {metadata.get('tokenizer.ggml.model')!r}"
        )
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF vocabulary has duplicate tokens")
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = _special_tokens(metadata, tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    def token(key: str) -> str | None:
        index = meta_int(metadata, key, default=None)
        return tokens[index] if index is not None else None

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        unk_token=token("tokenizer.ggml.unknown_token_id"),
        pad_token=token("tokenizer.ggml.padding_token_id"),
        additional_special_tokens=specials,
        chat_template=meta_str(metadata, "tokenizer.chat_template"),
        model_max_length=meta_int(metadata, "llama.context_length"),
        clean_up_tokenization_spaces=False,
    )


def _special_tokens(metadata: dict[str, Any], tokens: list[str]) -> list[str]:
    """Control tokens (``<|im_start|>``, ``<|im_end|>``, ...), which must never be split by BPE."""
    import numpy as np

    types = np.asarray(metadata["tokenizer.ggml.token_type"])
    return [tokens[i] for i in np.nonzero(types == TOKEN_TYPE_CONTROL)[0].tolist()]


def verify_tokenizer(tokenizer: PreTrainedTokenizerFast) -> None:
    """Fail the build (not a later test) when text does not round-trip or ChatML specials split."""
    sample = "The capital of France is Paris.\n  Numbers: 2024, 3.14; émigré café — naïve 東京 🚀!"
    ids = tokenizer.encode(sample, add_special_tokens=False)
    decoded = tokenizer.decode(ids)
    if decoded != sample:
        raise RuntimeError(f"tokenizer round trip failed: {sample!r} -> {decoded!r}")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(prompt_ids, list):  # transformers 5 may return a BatchEncoding
        prompt_ids = list(prompt_ids["input_ids"])
    for special in ("<|im_start|>", "<|im_end|>"):
        special_id = tokenizer.convert_tokens_to_ids(special)
        if tokenizer.encode(special, add_special_tokens=False) != [special_id]:
            raise RuntimeError(f"special token {special!r} is not a single id")
        if special_id not in prompt_ids:
            raise RuntimeError(f"chat prompt lacks {special!r} as a single id: {prompt_ids[:16]}")


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path, *, chat_template: str | None) -> None:
    """save_pretrained, then pin the class and chat template in tokenizer_config.json.

    Pinning ``tokenizer_class`` keeps AutoTokenizer from re-deriving a llama tokenizer from config.json;
    transformers 5 writes the template to chat_template.jinja, older readers want it in the config.
    """
    tokenizer.save_pretrained(str(out_dir))
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if chat_template is not None:
        config["chat_template"] = chat_template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
