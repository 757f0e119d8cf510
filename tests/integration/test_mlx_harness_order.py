"""The MLX serving harness (``lifeboat_cache.demo.mlx_serving``) against SGLang's own scheduler.

``MlxServing`` hand-writes the scheduler loop because SGLang's MLX server cannot launch on Linux. So
that it cannot drift from SGLang 0.5.23, the first tests read the call sequences out of SGLang's real
scheduler source (``inspect`` + ``ast`` on the installed package) and require the harness to make the
same cache calls in the same order: admission, prefill selection, slot allocation, release at finish,
and ``/flush_cache``. If SGLang reorders a step (or the harness does), these fail.

The last test drives the harness in a child process and checks that ``reset_tree`` returns every
request row and token slot, as ``Scheduler.flush_cache`` does (it used to leak them).
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip("sglang", reason="SGLang 0.5.23 is not installed")

from support.mlx_models import tiny_llama  # noqa: E402

from lifeboat_cache.demo import mlx_serving  # noqa: E402


def calls(fn: Callable) -> list[tuple[str, str]]:
    """``(receiver, name)`` of every call in ``fn``'s source, in source order.

    ``self.tree_cache.reset()`` -> ``("tree_cache", "reset")``; ``release_kv_cache(...)`` ->
    ``("", "release_kv_cache")``.
    """
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute):
            recv = f.value
            owner = recv.attr if isinstance(recv, ast.Attribute) else getattr(recv, "id", "")
            found.append((node.lineno, node.col_offset, owner, f.attr))
        elif isinstance(f, ast.Name):
            found.append((node.lineno, node.col_offset, "", f.id))
    return [(o, n) for _, _, o, n in sorted(found)]


def names(fn: Callable, vocabulary: set[str]) -> list[str]:
    return [n for _, n in calls(fn) if n in vocabulary]


def first_occurrences(seq: list[str]) -> list[str]:
    out: list[str] = []
    for n in seq:
        if n not in out:
            out.append(n)
    return out


def test_admission_order_matches_scheduler_add_request_to_queue() -> None:
    from sglang.srt.managers.scheduler import Scheduler

    vocab = {"_abort_on_queued_limit", "_release_aborted_request", "_prefetch_kvcache"}
    sglang = names(Scheduler._add_request_to_queue, vocab)
    start = sglang.index("_abort_on_queued_limit")  # before it: the priority check (no priorities here)
    harness = names(mlx_serving.MlxServing._admit, vocab)
    assert harness == ["_abort_on_queued_limit", "_release_aborted_request", "_prefetch_kvcache"]
    assert sglang[start:start + len(harness)] == harness


def test_prefill_order_matches_scheduler_and_prefill_adder() -> None:
    """Scheduler: ``init_next_round_input`` then ``PrefillAdder.add_one_req`` (which locks the matched
    node); ``alloc_for_extend``: request row, then token slots, then the row write. The harness does
    the same (its lock is ``tree_cache.lock``; its row allocation ``req_to_token_pool.alloc`` is what
    SGLang's ``alloc_req_slots`` calls)."""
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache import allocation

    sched = names(Scheduler._get_new_batch_prefill_raw, {"init_next_round_input", "add_one_req"})
    assert first_occurrences(sched) == ["init_next_round_input", "add_one_req"]
    assert "_lock_node" in names(PrefillAdder.add_one_req, {"_lock_node"})
    alloc = first_occurrences(names(allocation.alloc_for_extend,
                                    {"alloc_req_slots", "alloc_token_slots", "write_cache_indices"}))
    assert alloc == ["alloc_req_slots", "alloc_token_slots", "write_cache_indices"]
    assert ("req_to_token_pool", "alloc") in calls(allocation.alloc_req_slots)

    harness = [(o, n) for o, n in calls(mlx_serving.MlxServing.generate)
               if n in {"init_next_round_input", "lock", "alloc", "alloc_token_slots", "write", "prefill"}]
    order = first_occurrences([n for _, n in harness])
    assert order == ["init_next_round_input", "lock", "alloc", "alloc_token_slots", "write", "prefill"]
    assert ("req_to_token_pool", "alloc") in harness


def test_release_order_matches_the_finished_request_path() -> None:
    """At finish SGLang calls the worker's ``prepare_for_kv_cache_release`` (MLX copies its KV back
    to the pool) and then ``release_kv_cache``; the harness does the same, after ``update_finish_state``."""
    from sglang.srt.managers.scheduler_components import batch_result_processor as brp

    cls = next(c for _, c in inspect.getmembers(brp, inspect.isclass)
               if hasattr(c, "_prepare_kv_cache_release") and c.__module__ == brp.__name__)
    assert "prepare_for_kv_cache_release" in inspect.getsource(cls._prepare_kv_cache_release)
    src_order = [n for _, n in calls(cls) if n in {"_prepare_kv_cache_release", "release_kv_cache"}]
    # every prepare is immediately followed by a release in SGLang's finish paths
    pairs = [src_order[i + 1] for i, n in enumerate(src_order) if n == "_prepare_kv_cache_release"]
    assert pairs and set(pairs) == {"release_kv_cache"}

    vocab = {"update_finish_state", "prepare_for_kv_cache_release", "release_kv_cache"}
    tail = names(mlx_serving.MlxServing.generate, vocab)
    assert tail[-2:] == ["prepare_for_kv_cache_release", "release_kv_cache"]
    assert tail.index("update_finish_state") < tail.index("prepare_for_kv_cache_release")


def test_reset_tree_matches_scheduler_flush_cache() -> None:
    from sglang.srt.managers.scheduler import Scheduler

    same = {"tree_cache": "cache", "token_to_kv_pool_allocator": "allocator", "req_to_token_pool": "req_to_token_pool"}
    sglang = [(same[o], n) for o, n in calls(Scheduler.flush_cache) if o in same]
    assert sglang == [("cache", "reset"), ("req_to_token_pool", "clear"), ("allocator", "clear"),
                      ("req_to_token_pool", "reset_aux_cache_allocator")]
    harness = [(o, n) for o, n in calls(mlx_serving.MlxServing.reset_tree) if o in same.values()]
    assert harness == sglang


CHILD = textwrap.dedent("""
    import json, sys
    from lifeboat_cache.demo.mlx_serving import MlxServing

    s = MlxServing(sys.argv[1], lifeboat=False, pool_size=512, max_running_requests=2)
    before = (s.allocator.available_size(), s.req_to_token_pool.available_size())
    for i in range(3):
        s.generate(list(range(10 + i, 110 + i)), max_new_tokens=4)
        s.reset_tree()
    after = (s.allocator.available_size(), s.req_to_token_pool.available_size())
    print("RESULT " + json.dumps({"before": before, "after": after}), flush=True)
""")


def test_reset_tree_frees_every_slot(tmp_path: Path, blas_env: dict) -> None:
    pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
    model = tiny_llama(tmp_path / "model")  # built here: the child sees the installed package only
    proc = subprocess.run([sys.executable, "-c", CHILD, str(model)], env=blas_env,
                          capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    res = json.loads(line[len("RESULT "):])
    assert res["after"] == res["before"], res  # 3 requests of 100 prompt tokens: no slot kept


FALLBACKS = textwrap.dedent("""
    import dataclasses, json, logging, os, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(message)s")
    from lifeboat_cache.demo.mlx_serving import MlxServing
    from lifeboat_cache.integrations import radix_cache as sglang_mlx

    s = MlxServing(sys.argv[1], lifeboat=True, pool_size=512, max_running_requests=2)
    ctx = s.build_context
    out = {"normal": s.engine is not None}

    def build(**kw):
        cache = sglang_mlx.create_lifeboat_radix_cache(dataclasses.replace(ctx, **kw))
        served = cache.match_prefix is not None  # a working SGLang prefix cache either way
        return {"class": type(cache).__name__, "lifeboat": getattr(cache, "lifeboat", None) is not None,
                "served": served}

    out["disabled"] = build(disable_radix_cache=True)
    os.environ["LIFEBOAT_CONFIG"] = sys.argv[2]  # model_id set; the store path lies under a regular file
    out["no_store"] = build()
    print("RESULT " + json.dumps(out), flush=True)
""")


def test_mlx_factory_falls_back_to_sglangs_radix_cache(tmp_path: Path, blas_env: dict) -> None:
    """The `lifeboat` radix-cache factory, called by SGLang's registry with the context SGLang built,
    serves with SGLang's default radix cache (and says why) when the radix cache is disabled or the
    store cannot be opened (a real unwritable path). Not covered here: the sliding-window and
    no-full-attention fallbacks need such a model (and SGLang's SWA allocator) in the MLX runner."""
    pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    config = tmp_path / "lifeboat.yaml"
    config.write_text(f"model_id: fallback-test\nstorage:\n  - type: local\n    path: {blocker / 'store'}\n")
    env = dict(blas_env, XDG_CACHE_HOME=str(tmp_path / "xdg"), HF_HUB_OFFLINE="1")
    model = tiny_llama(tmp_path / "model")  # built here: the child sees the installed package only
    proc = subprocess.run([sys.executable, "-c", FALLBACKS, str(model), str(config)], env=env,
                          capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(line[len("RESULT "):])
    assert res["normal"] is True
    for case in ("disabled", "no_store"):
        assert res[case]["lifeboat"] is False and res[case]["served"], (case, res)
    logs = proc.stdout
    assert "the radix cache is disabled" in logs
    assert "cannot open the LifeboatCache store" in logs
    assert logs.count("serving with SGLang's default radix cache") == 2
