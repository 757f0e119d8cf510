"""SGLang's CPU server (`--device cpu`) with HiCache and LifeboatCache: four gaps of 0.5.23, closed by hooks.

Why: a stock SGLang 0.5.23 server with `--device cpu` (no `SGLANG_USE_CPU_ENGINE`, whose `sgl_kernel`
CPU build is not on PyPI) cannot run HiCache at all, with any storage backend (1-3), and once it can,
a restored prefix barely saves time (4):

1. Host pools are always pinned (`pool_host/mha.py:143` defaults `pin_memory=True`, the pool assembler
   never passes it), which reaches `torch.cuda.cudart()` ("Found no NVIDIA driver"). The pool then
   fails, or the flat dummy page fails and LifeboatCache's `register_mem_pool_host` with it.
2. No host<->device copy op is imported off CUDA / HIP / XPU (`pool_host/mha.py:60-88`,
   `pool_host/mla.py`), so the first backup raises `NameError: transfer_kv_direct` and the scheduler
   dies. The `direct` io backend with the `layer_first` layout needs exactly one op, an index copy
   per layer, which is plain torch here.
3. `RotaryEmbedding.__init__` (`layers/rotary_embedding/base.py:122-140`) imports
   `vllm._custom_ops.rotary_embedding` on a host that is neither CUDA nor the CPU engine. It is only
   stored, for `forward_cuda`; the CPU server runs `forward_native`.
4. The torch_native attention's extend (`layers/attention/torch_native_backend.py:128`) attends with
   every row of the sequence, the cached prefix's too (filled by `torch.empty`, then discarded). So
   a prefix restored from storage saved only the MLPs: the attention of the whole prompt was paid
   again, and slower, since leftover memory read as float32 is often denormal and SDPA over
   denormals runs ~70x slower (1,600 rows: 5.6-5.9 s against 0.08 s, measured). For a sequence with
   a cached prefix the hook attends with the new rows only, under the same causal rule (row i sees
   keys up to prefix + i); a sequence without one runs SGLang's own code.

Each fix is a `HookRegistry` hook (or, for the missing op, a module global that did not exist) and
applies only in scheduler processes on a host where torch sees no CUDA device. 1 and 2 apply to a launch
that turns HiCache on, with any storage backend, so that SGLang's own `file` backend can be compared with
LifeboatCache on the same CPU server (`lifeboat bench --only server`); 3 and 4 to every CPU launch, since
a server without HiCache cannot start without 3, and without 4 its own device prefix cache would run
other (slower) attention than the HiCache servers it is compared with (`lifeboat bench --only serving`).
Upstream fixes would be a torch else-branch at `mha.py:60`, `pin_memory=torch.cuda.is_available()` in
the assembler, the native rope at `base.py:138`, and attention over the new rows only at
`torch_native_backend.py:128`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import logging
import sys
import types
from typing import Any, Callable, Iterator, Sequence

logger = logging.getLogger(__name__)

HOST_POOL_INIT = "sglang.srt.mem_cache.pool_host.base.HostKVCache.__init__"
ROPE_INIT = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.__init__"
EXTEND_ATTENTION = ("sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"
                    "._run_sdpa_forward_extend")
#: Host pool modules that call `transfer_kv_direct` but import it on CUDA / HIP / XPU only.
DIRECT_COPY_MODULES = ("sglang.srt.mem_cache.pool_host.mha", "sglang.srt.mem_cache.pool_host.mla")


def applies(uses_hicache: Callable[[], bool]) -> bool:
    """This process serves a HiCache launch on a host without CUDA (checked at call time)."""
    return not _cuda_available() and uses_hicache()


def register_cpu_hooks(uses_hicache: Callable[[], bool]) -> None:
    """Install the four fixes in a scheduler process; each is inert on a CUDA host, the host pool's also
    unless `applies(uses_hicache)`."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def unpinned(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if applies(uses_hicache):
            args, kwargs = without_pinning(original, args, kwargs)
        return original(*args, **kwargs)

    def rope(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if _cuda_available():
            return original(*args, **kwargs)
        with _unused_vllm_rope():
            return original(*args, **kwargs)

    decided: dict[str, Any] = {}  # per process, at the first extend (the launch is published by then)

    def extend(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if "on" not in decided:
            decided["on"], decided["signature"] = not _cuda_available(), inspect.signature(original)
        if decided["on"]:
            bound = decided["signature"].bind(*args, **kwargs)
            bound.apply_defaults()
            call = bound.arguments
            if _rows_only_applies(call):
                return attend_new_rows(**{name: call[name] for name in _ROWS_ARGS})
        return original(*args, **kwargs)

    HookRegistry.register(EXTEND_ATTENTION, extend, HookType.AROUND)
    HookRegistry.register(HOST_POOL_INIT, unpinned, HookType.AROUND)
    HookRegistry.register(ROPE_INIT, rope, HookType.AROUND)
    if not _cuda_available():
        for name in DIRECT_COPY_MODULES:
            _provide_direct_copy(name)


def without_pinning(
    original: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The same call with `pin_memory=False`, however the caller passed it (positionally or not)."""
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.arguments["pin_memory"] = False
    return tuple(bound.args), dict(bound.kwargs)


def transfer_kv_direct(
    src_layers: Sequence[Any], dst_layers: Sequence[Any], src_indices: Any, dst_indices: Any, page_size: int
) -> None:
    """`sgl_kernel.kvcacheio.transfer_kv_direct` in torch: token rows `src[src_indices]` -> `dst[dst_indices]`.

    One buffer per layer (K layers, then V layers), token-major; `page_size` only lets the kernel
    group whole pages, an index copy needs no grouping.
    """
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"transfer_kv_direct: {len(src_layers)} source layers, {len(dst_layers)} destinations")
    for src, dst in zip(src_layers, dst_layers):
        rows = src.index_select(0, src_indices.to(src.device, non_blocking=False))
        dst.index_copy_(0, dst_indices.to(dst.device), rows.to(dst.device, dst.dtype))


_ROWS_ARGS = ("query", "output", "k_cache", "v_cache", "req_to_token", "req_pool_indices", "seq_lens",
              "extend_prefix_lens", "extend_seq_lens", "scaling", "enable_gqa")


def _rows_only_applies(call: dict[str, Any]) -> bool:
    """A plain causal self-attention extend in which some sequence has a cached prefix."""
    return (call.get("encoder_lens") is None and bool(call.get("causal")) and not call.get("is_cross_attn")
            and call.get("sliding_window_size") is None and bool((call["extend_prefix_lens"] > 0).any()))


def attend_new_rows(query: Any, output: Any, k_cache: Any, v_cache: Any, req_to_token: Any, req_pool_indices: Any,
                    seq_lens: Any, extend_prefix_lens: Any, extend_seq_lens: Any, scaling: Any = None,
                    enable_gqa: bool = False) -> Any:
    """SGLang's torch_native extend, attending with each sequence's new rows only.

    Shapes as in SGLang: `query` / `output` [tokens, heads, dim], caches [slots, kv heads, dim]. A
    sequence without a cached prefix goes exactly as SGLang runs it (`is_causal` over all rows).
    """
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    heads_first = query.movedim(0, query.dim() - 2)
    start = 0
    for i in range(seq_lens.shape[0]):
        n_new, prefix, n_kv = int(extend_seq_lens[i]), int(extend_prefix_lens[i]), int(seq_lens[i])
        q = heads_first[:, start:start + n_new, :]
        tokens = req_to_token[req_pool_indices[i], :n_kv]
        k = k_cache[tokens].movedim(0, query.dim() - 2).to(q.dtype)
        v = v_cache[tokens].movedim(0, query.dim() - 2).to(q.dtype)
        if prefix == 0:
            out = scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), enable_gqa=enable_gqa,
                                               scale=scaling, is_causal=True)
        else:
            keys = torch.arange(n_kv, device=q.device)
            visible = keys.unsqueeze(0) <= (prefix + torch.arange(n_new, device=q.device)).unsqueeze(1)
            out = scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=visible,
                                               enable_gqa=enable_gqa, scale=scaling)
        output[start:start + n_new, :, :] = out.squeeze(0).movedim(query.dim() - 2, 0)
        start += n_new
    return output


def _provide_direct_copy(module_name: str) -> None:
    """Give a host pool module the `transfer_kv_direct` it never imported here (never replace one)."""
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - a pool module that does not import is not used either
            logger.debug("LifeboatCache: %s does not import; no direct copy op given", module_name, exc_info=True)
            return
    if getattr(module, "transfer_kv_direct", None) is None:
        module.transfer_kv_direct = transfer_kv_direct
        logger.info("LifeboatCache: %s.transfer_kv_direct (absent off CUDA) is a torch index copy", module_name)


@contextlib.contextmanager
def _unused_vllm_rope() -> Iterator[None]:
    """While a rope is built, an importable `vllm._custom_ops` whose kernel raises if ever called."""
    if "vllm._custom_ops" in sys.modules or importlib.util.find_spec("vllm") is not None:
        yield
        return

    def rotary_embedding(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("LifeboatCache CPU server: vllm's rotary kernel is not available; use forward_native")

    package = types.ModuleType("vllm")
    package.__path__ = []  # a package, so `vllm._custom_ops` resolves through sys.modules
    ops = types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = rotary_embedding  # type: ignore[attr-defined]
    package._custom_ops = ops  # type: ignore[attr-defined]
    sys.modules["vllm"], sys.modules["vllm._custom_ops"] = package, ops
    try:
        yield
    finally:
        sys.modules.pop("vllm._custom_ops", None)
        sys.modules.pop("vllm", None)


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, no CUDA
        return False
