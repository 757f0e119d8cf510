"""The CPU-server fixes of `integrations/sglang_cpu.py`, piece by piece.

Together, inside a real server (hooks applied by SGLang's plugin loader, the op called by SGLang's
host pool, pages restored byte-exact enough to give identical greedy tokens): tests/e2e/test_sglang_server.py.
"""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.pool_host.mha")

from lifeboat_cache.integrations.launch import cpu as sglang_cpu  # noqa: E402


def test_transfer_kv_direct_copies_token_rows_by_index() -> None:
    src = [torch.arange(8 * 6, dtype=torch.float32).reshape(8, 2, 3) + 100 * i for i in range(4)]
    dst = [torch.zeros(16, 2, 3) for _ in range(4)]
    sglang_cpu.transfer_kv_direct(src, dst, torch.tensor([1, 2, 5, 6]), torch.tensor([9, 10, 3, 4]), page_size=2)
    for s, d in zip(src, dst):
        assert torch.equal(d[[9, 10, 3, 4]], s[[1, 2, 5, 6]])
        untouched = [i for i in range(16) if i not in (9, 10, 3, 4)]
        assert not d[untouched].any()
    with pytest.raises(ValueError, match="2 source layers, 1 destinations"):
        sglang_cpu.transfer_kv_direct(src[:2], dst[:1], torch.tensor([0]), torch.tensor([0]), 1)


def test_without_pinning_rewrites_the_flag_however_it_was_passed() -> None:
    def init(self, info, ratio, size, page_size, layout, pin_memory=True, device="cpu", *, extra=0):
        return pin_memory

    for args, kwargs in [((0, 1, 2, 3, 4, "lf"), {}), ((0, 1, 2, 3, 4, "lf", True), {}),
                         ((0, 1, 2, 3, 4, "lf"), {"pin_memory": True, "extra": 5})]:
        a, k = sglang_cpu.without_pinning(init, args, kwargs)
        assert init(*a, **k) is False
        assert k.get("extra", 0) == kwargs.get("extra", 0)


def test_rope_import_is_satisfied_only_while_a_rope_is_built() -> None:
    assert "vllm" not in sys.modules
    with sglang_cpu._unused_vllm_rope():
        from vllm._custom_ops import rotary_embedding  # what SGLang's RotaryEmbedding.__init__ imports

        with pytest.raises(RuntimeError, match="forward_native"):
            rotary_embedding()
    assert "vllm" not in sys.modules and "vllm._custom_ops" not in sys.modules


def test_host_pool_modules_get_the_direct_copy_op_only_where_it_is_missing() -> None:
    import sglang.srt.mem_cache.pool_host.mha as mha

    before = getattr(mha, "transfer_kv_direct", None)
    sglang_cpu._provide_direct_copy(mha.__name__)
    if before is None:  # this CPU-only machine: SGLang imported none
        assert mha.transfer_kv_direct is sglang_cpu.transfer_kv_direct
    else:  # a CUDA build with sgl_kernel: never replaced
        assert mha.transfer_kv_direct is before


def test_new_rows_attention_matches_sglangs_extend_on_those_rows() -> None:
    """Against SGLang's own `_run_sdpa_forward_extend`: a batch of a cold sequence and two with cached
    prefixes (one ending mid-page), GQA; the new rows agree, and the cold sequence is bit-identical."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    gen = torch.Generator().manual_seed(7)
    heads, kv_heads, dim, slots = 6, 2, 16, 512
    k_cache, v_cache = (torch.randn(slots, kv_heads, dim, generator=gen) for _ in range(2))
    prefixes, news = [0, 128, 77], [40, 24, 9]
    req_to_token = torch.zeros(3, 256, dtype=torch.int64)
    for i, (p, n) in enumerate(zip(prefixes, news)):
        req_to_token[i, :p + n] = torch.randperm(slots, generator=gen)[:p + n]
    query = torch.randn(sum(news), heads, dim, generator=gen)
    args = dict(req_to_token=req_to_token, req_pool_indices=torch.tensor([0, 1, 2]),
                seq_lens=torch.tensor([p + n for p, n in zip(prefixes, news)]),
                extend_prefix_lens=torch.tensor(prefixes), extend_seq_lens=torch.tensor(news), scaling=0.25,
                enable_gqa=True)
    ours = sglang_cpu.attend_new_rows(query, torch.zeros_like(query), k_cache, v_cache, **args)
    theirs = TorchNativeAttnBackend._run_sdpa_forward_extend(None, query, torch.zeros_like(query), k_cache, v_cache,
                                                             causal=True, **args)
    assert torch.equal(ours[:40], theirs[:40])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert ours.abs().sum() > 0
