"""SGLang's CPU server (`--device cpu`) with HiCache and LifeboatCache: four gaps of 0.5.23, closed by hooks.

Why: a stock SGLang 0.5.23 server with `--device cpu` (no `SGLANG_USE_CPU_ENGINE`, whose `sgl_kernel`
CPU build is not on PyPI) cannot run HiCache at all, with any storage backend:

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

4. The torch_native attention's extend (`layers/attention/torch_native_backend.py:128`) builds the
   query rows of a cached prefix with `torch.empty` and runs SDPA over them too. Leftover memory read
   as float32 is often denormal, and SDPA over denormals runs ~70x slower (1,600 rows: 5.6-5.9 s
   against 0.08 s, measured), so a prefix restored from storage (or from the device cache) made the
   first token take a minute. The scheduler flushes denormals to zero (`torch.set_flush_denormal`)
   before its torch threads start, so they inherit it; the garbage rows are discarded by SGLang anyway.

Each fix is a `HookRegistry` hook (or, for the missing op, a module global that did not exist) and
applies only in scheduler processes of a launch that turns HiCache on, on a host where torch sees no
CUDA device: with any storage backend, so that SGLang's own `file` backend can be compared with
LifeboatCache on the same CPU server (`lifeboat bench --only server`). Upstream fixes would be a torch else-branch at `mha.py:60`,
`pin_memory=torch.cuda.is_available()` in the assembler, the native rope at `base.py:138`, and
attention over the extend rows only (or `torch.zeros`) at `torch_native_backend.py:128`.
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
#: Runs in the scheduler right after its configuration is published, before any torch thread starts.
SCHEDULER_SETUP = "sglang.srt.managers.scheduler.configure_scheduler_process"
#: Host pool modules that call `transfer_kv_direct` but import it on CUDA / HIP / XPU only.
DIRECT_COPY_MODULES = ("sglang.srt.mem_cache.pool_host.mha", "sglang.srt.mem_cache.pool_host.mla")


def applies(uses_hicache: Callable[[], bool]) -> bool:
    """This process serves a HiCache launch on a host without CUDA (checked at call time)."""
    return not _cuda_available() and uses_hicache()


def register(uses_hicache: Callable[[], bool]) -> None:
    """Install the four fixes in a scheduler process; each is inert unless `applies(uses_hicache)`."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def unpinned(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if applies(uses_hicache):
            args, kwargs = without_pinning(original, args, kwargs)
        return original(*args, **kwargs)

    def rope(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not applies(uses_hicache):
            return original(*args, **kwargs)
        with _unused_vllm_rope():
            return original(*args, **kwargs)

    def flush_denormals(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        flushed = applies(uses_hicache)
        if flushed:
            import torch

            torch.set_flush_denormal(True)  # threads created from here on inherit it (pthread_create)
        result = original(*args, **kwargs)  # sets up the scheduler's logging
        if flushed:
            logger.info("LifeboatCache: CPU server: the scheduler flushes denormals to zero (SGLang's torch_native "
                        "extend attends over uninitialised prefix rows); host pools unpinned; torch "
                        "transfer_kv_direct")
        return result

    HookRegistry.register(SCHEDULER_SETUP, flush_denormals, HookType.AROUND)
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
