"""Hostile calls into LifeboatHiCacheStorage, through SGLang 0.5.23's own classes, on CPU.

The backend is made by SGLang's `StorageBackendFactory("dynamic")` over SGLang's own MHA and Mamba
host pools (sglang_pools.py). Hypothesis then calls every method of the HiCacheStorage interface
with hostile arguments: None, ints, floats, strings, iterators, generators, dicts, tensors of any
dtype and shape, PoolTransfers and extra infos full of the same, and near-valid calls whose host
indices are out of range, negative, unaligned, not consecutive, short, 2-D or floating point, or
whose page copies have the wrong size. It asserts:

* no call raises, and each returns its contract's type ("nothing done": False / 0 / [False] * n);
* no tracked page is stored by a call whose arguments were invalid, and every page any hostile
  call stored reads back whole (no short page);
* afterwards, correct writes and reads of the same keys work byte-exact (zero-copy, copying and v2).

A figure is printed at the end (calls made, raised = 0, wrong or short pages = 0). Seeded
(`derandomize`); LIFEBOAT_FUZZ_SCALE multiplies the example count.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import torch

pytest.importorskip("hypothesis")
sglang_pools = pytest.importorskip("sglang_pools", reason="SGLang 0.5.23 is not installed")
from hypothesis import (  # noqa: E402
    HealthCheck,
    given,
    settings,
    strategies as st,  # noqa: E402
)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)
from sglang_pools import (  # noqa: E402
    create_backend,
    fill_random,
    flat_pages,
    lifeboat_extra,
    mamba_host_pool,
    mha_pools,
    page_keys,
    storage_config,
)

from lifeboat_cache.config import ConfigError  # noqa: E402

SCALE = int(os.environ.get("LIFEBOAT_FUZZ_SCALE", "1"))
PAGES = 8  # tracked pages (keys K): hostile calls on them are invalid by construction
PS = 4  # tokens per page of the MHA pool

# ------------------------------------------------------------------ hostile values


def _tensor(values: list[int], dtype: torch.dtype, two_d: bool) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.int64).to(dtype)
    return t.reshape(1, -1) if two_d and t.numel() else t


TENSORS = st.builds(
    _tensor,
    st.lists(st.integers(-(2**40), 2**40) | st.integers(-8, 8400), max_size=40),
    st.sampled_from([torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32, torch.bool]),
    st.booleans(),
)


def _iterator(items: list) -> Any:
    return iter(items)


def _generator(items: list) -> Any:
    return (x for x in items)


def junk(keys: list[str]) -> st.SearchStrategy:
    """Anything: scalars, containers, iterators, tensors, SGLang objects full of junk, junk keys."""
    base = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12),
        st.binary(max_size=8), st.just(object()), TENSORS,
        st.lists(st.sampled_from(keys), max_size=6),  # a plausible key list (junk keys only)
        st.sampled_from(keys),
    )
    nested = st.one_of(
        base,
        st.lists(base, max_size=4), st.dictionaries(st.text(max_size=4), base, max_size=3),
        st.builds(_iterator, st.lists(st.sampled_from(keys), max_size=4)),
        st.builds(_generator, st.lists(st.sampled_from(keys), max_size=4)),
        st.builds(set, st.lists(st.sampled_from(keys), max_size=3)),
        st.builds(HiCacheStorageExtraInfo, prefix_keys=base),
    )
    transfer = st.builds(
        PoolTransfer, name=st.one_of(st.sampled_from([PoolName.KV, PoolName.MAMBA, "kv", "nope"]), base),
        host_indices=st.one_of(TENSORS, base), keys=nested,
        hit_policy=st.one_of(st.sampled_from(list(PoolHitPolicy)), base))
    return st.one_of(nested, transfer, st.lists(transfer, max_size=3))


METHODS = ["batch_exists", "exists", "batch_set_v1", "batch_get_v1", "batch_set", "batch_get", "set", "get",
           "batch_exists_v2", "batch_set_v2", "batch_get_v2", "get_stats", "clear", "register_mem_pool_host",
           "register_mem_host_pool_v2", "on_host_pools_registered"]


# ------------------------------------------------------------------ near-valid calls on the tracked keys
def _break_indices(valid: torch.Tensor, ps: int, capacity: int, how: str, p: int, d: int) -> torch.Tensor:
    """Turn valid slots (whole pages) into invalid ones; `p` picks the page, `d` the amount."""
    idx = valid.clone()
    pages = idx.view(-1, ps)
    p %= pages.shape[0]
    if how == "beyond_end":  # the page starts past the end, or runs over it (a short page)
        pages[p] = capacity - ps + 1 + (d % (2 * ps)) + torch.arange(ps)
    elif how == "far_beyond":
        pages[p] = capacity * (1 + d) + torch.arange(ps)
    elif how == "negative":
        pages[p] = -ps * (1 + d % 4) + torch.arange(ps)
    elif how == "unaligned" and ps > 1:
        pages[p] += 1 + d % (ps - 1)
    elif how == "not_consecutive" and ps > 1:
        pages[p, 1] = pages[p, 0] + ps + d % 7
    elif how == "short":
        return idx[:-1]
    elif how == "long":
        return torch.cat([idx, idx[-1:] + 1])
    elif how == "float":
        return idx.to(torch.float32)
    elif how == "two_d":
        return idx.view(-1, ps)
    else:  # "empty" (and unaligned/not_consecutive on one-slot pages)
        return idx[:0]
    return idx


BREAKS = ["beyond_end", "far_beyond", "negative", "unaligned", "not_consecutive", "short", "long", "float",
          "two_d", "empty"]


@pytest.mark.parametrize("layout", ["page_first_direct", "layer_first"])
def test_hostile_calls_never_raise_nor_store_a_wrong_page(tmp_path, capsys, layout):
    _, host = mha_pools(layout)
    mamba = mamba_host_pool()
    cfg = storage_config(extra=lifeboat_extra(tmp_path, failure_cooldown_s=0.5, failure_cooldown_max_s=5.0))
    b = create_backend(cfg, {PoolName.KV: host, PoolName.MAMBA: mamba})
    kv, mb = b.pools["kv"], b.pools["mamba"]
    capacity, m_capacity = host.logical_size, mamba.size
    K = page_keys(list(range(PAGES * PS)), PS)  # tracked
    J = page_keys(list(range(10**6, 10**6 + 6 * PS)), PS) + ["", "x"]  # free for any call to write
    slots = host.alloc(PAGES * PS)
    fill_random(host, slots, seed=1)
    expected = flat_pages(host, slots)
    m_slots = mamba.alloc(PAGES)
    fill_random(mamba, m_slots, seed=2)
    m_expected = flat_pages(mamba, m_slots)
    tally: Counter = Counter()
    problems: list[str] = []

    def call(name: str, *args: Any, **kwargs: Any) -> Any:
        tally["calls"] += 1
        try:
            out = getattr(b, name)(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the property under test: counted, asserted at the end
            tally["raised"] += 1
            problems.append(f"{name} raised {type(e).__name__}: {str(e)[:200]}")
            return None
        _check_contract(name, args, kwargs, out)
        return out

    def _check_contract(name: str, args: tuple, kwargs: dict, out: Any) -> None:
        keys = args[0] if args else kwargs.get("keys", kwargs.get("transfers"))
        n = len(keys) if isinstance(keys, (list, tuple)) else None
        ok = {
            "batch_exists": lambda: isinstance(out, int) and 0 <= out <= (n or 0),
            "exists": lambda: isinstance(out, bool),
            "batch_set": lambda: isinstance(out, bool),
            "set": lambda: isinstance(out, bool),
            "batch_set_v1": lambda: isinstance(out, list) and (n is None or len(out) == n),
            "batch_get_v1": lambda: isinstance(out, list) and (n is None or len(out) == n),
            "batch_get": lambda: isinstance(out, list) and (n is None or len(out) == n),
            "batch_exists_v2": lambda: isinstance(out, PoolTransferResult),
            "batch_set_v2": lambda: isinstance(out, dict),
            "batch_get_v2": lambda: isinstance(out, dict),
        }.get(name, lambda: True)()
        if not ok:
            tally["contract"] += 1
            problems.append(f"{name} returned {out!r:.200}")

    # -------------------------------------------------------------- the fuzzer
    @settings(max_examples=500 * SCALE, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def hostile(data: Any) -> None:
        if data.draw(st.booleans()):  # any method, junk arguments (keys: only the free ones)
            name = data.draw(st.sampled_from(METHODS))
            args = data.draw(st.lists(junk(J), max_size=4))
            kwargs = data.draw(st.dictionaries(st.sampled_from(["keys", "host_indices", "extra_info", "values",
                                                                "target_locations", "transfers", "pool_transfers",
                                                                "bogus"]), junk(J), max_size=2))
            call(name, *args, **kwargs)
            return
        # near-valid: a run of tracked pages with broken slots / page copies
        i = data.draw(st.integers(0, PAGES - 1))
        j = data.draw(st.integers(i + 1, PAGES))
        keys = K[i:j]
        how = data.draw(st.sampled_from(BREAKS))
        p, d = data.draw(st.integers(0, 64)), data.draw(st.integers(0, 64))
        bad = _break_indices(slots[i * PS:j * PS], PS, capacity, how, p, d)
        m_bad = _break_indices(m_slots[i:j], 1, m_capacity, how, p, d)
        extra = HiCacheStorageExtraInfo(prefix_keys=data.draw(st.sampled_from([None, K[:i], [1, 2], "abc"])))
        form = data.draw(st.sampled_from(["v1", "v1_keys", "v2_kv", "v2_mamba", "v2_mixed", "copy", "copy_get",
                                          "get_v1", "get_v2"]))
        if form == "v1":
            call("batch_set_v1", keys, bad, extra)
        elif form == "v1_keys":  # slots fine, but one key more or less than pages
            call("batch_set_v1", keys + [K[(j) % PAGES]] if d % 2 else keys[:-1] or [K[0], K[1]],
                 slots[i * PS:j * PS])
        elif form == "v2_kv":
            call("batch_set_v2", [PoolTransfer(name=PoolName.KV, host_indices=bad, keys=keys)], extra)
        elif form == "v2_mamba":
            call("batch_set_v2", [PoolTransfer(name=PoolName.MAMBA, host_indices=m_bad, keys=keys)])
        elif form == "v2_mixed":  # one good transfer (free keys) next to a bad one: neither is done
            jk = J[: j - i]
            good = PoolTransfer(name=PoolName.MAMBA, host_indices=m_slots[: len(jk)], keys=jk)
            call("batch_set_v2", [good, PoolTransfer(name=PoolName.KV, host_indices=bad, keys=keys)])
        elif form == "copy":
            pages = [host.get_data_page(int(s), flat=True) for s in slots[i * PS:j * PS:PS]]
            q = p % len(pages)
            if how in ("short", "long", "float", "empty", "two_d"):
                pages[q] = {"short": pages[q][:-1], "long": torch.cat([pages[q], pages[q][:1]]),
                            "float": pages[q].float(),  # bf16 -> fp32: twice the bytes
                            "empty": pages[q][:0], "two_d": pages[q].view(-1, 2)}[how]
            else:
                pages = pages[:-1] if len(pages) > 1 else pages + pages  # one page more or less than keys
            out = call("batch_set", keys, pages)
            # a 2-D view of a page's own bytes is that page (checked byte-exact below); all else stores nothing
            if out is not False and how != "two_d":
                tally["contract"] += 1
                problems.append(f"batch_set with a broken page copy ({how}) returned {out!r}")
        elif form == "copy_get":
            dummies = [host.get_dummy_flat_data_page()[: -1 if d % 2 else None] for _ in keys]
            call("batch_get", keys, dummies)
        elif form == "get_v1":
            call("batch_get_v1", keys, bad)
        else:
            call("batch_get_v2", [PoolTransfer(name=PoolName.KV, host_indices=bad, keys=keys)])

    hostile()

    # -------------------------------------------------------------- nothing wrong was stored
    # Tracked pages: only a near-valid "copy" call with a page of whole-page size (2-D or float view
    # of the same bytes) may legitimately have stored one; check such pages are the right bytes below.
    calls_before = b.store.counters.get("sglang_bad_calls") + b.store.counters.get("sglang_call_errors")
    stored_k = b.store.contains(kv.ns, K)
    stored_m = b.store.contains(mb.ns, K)
    wrong = 0
    for key, page in zip(K, expected):
        if stored_k[K.index(key)]:
            dst = host.alloc(PS)
            ok = b.batch_get_v1([key], dst)
            if ok != [True] or flat_pages(host, dst)[0] != page:
                wrong += 1
                problems.append(f"tracked page {K.index(key)} stored by a hostile call is not its page")
            host.free(dst)
    wrong += sum(stored_m)  # Mamba pages of K are only ever written through invalid transfers
    # free keys: whatever a hostile call stored must read back whole
    short = 0
    for key in J:
        for pool, name in ((kv, PoolName.KV), (mb, PoolName.MAMBA)):
            if b.store.contains(pool.ns, [key])[0]:
                dst = (host if pool is kv else mamba).alloc(pool.page_size)
                res = b.batch_get_v2([PoolTransfer(name=name, host_indices=dst, keys=[key])])
                short += res != {name: [True]}
                (host if pool is kv else mamba).free(dst)

    # -------------------------------------------------------------- correct calls still work byte-exact
    for s, page in zip(slots[::PS].tolist(), expected):  # hostile reads may have landed in these slots
        host.set_from_flat_data_page(s, torch.frombuffer(bytearray(page), dtype=host.dtype))
    for s, page in zip(m_slots.tolist(), m_expected):
        mamba.set_from_flat_data_page(s, torch.frombuffer(bytearray(page), dtype=torch.uint8))
    assert flat_pages(host, slots) == expected and flat_pages(mamba, m_slots) == m_expected
    assert all(b.batch_set_v1(K, slots))
    assert all(b.batch_set_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=m_slots, keys=K)])[PoolName.MAMBA])
    dst, m_dst = host.alloc(PAGES * PS), mamba.alloc(PAGES)
    got = b.batch_get_v1(K, dst)
    got_m = b.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=m_dst, keys=K)])[PoolName.MAMBA]
    copies = b.batch_get(K, [host.get_dummy_flat_data_page() for _ in K])
    bad_reads = sum(not g for g in got + got_m) + sum(
        a != e for a, e in zip(flat_pages(host, dst) + flat_pages(mamba, m_dst), expected + m_expected))
    bad_reads += sum(c is None or bytes(c.view(torch.uint8).numpy()) != e for c, e in zip(copies, expected))
    b.close()

    with capsys.disabled():
        print(f"\nSGLang backend ({layout}): {tally['calls']} hostile calls, raised = {tally['raised']}, "
              f"contract violations = {tally['contract']}, wrong tracked pages stored = {wrong}, "
              f"short pages stored = {short}, bad reads after = {bad_reads} "
              f"(calls that did nothing, counted by the store: {calls_before})")
    assert tally["raised"] == tally["contract"] == wrong == short == bad_reads == 0, problems[:5]


def test_out_of_range_host_indices_store_nothing(tmp_path):
    """Issue 9: batch_set_v1 with host indices past the end stored a short page and returned True;
    from then on the key never read. Now it stores nothing, returns False, and a correct write works."""
    _, host = mha_pools("page_first")
    b = create_backend(storage_config(extra=lifeboat_extra(tmp_path)), {PoolName.KV: host})
    keys = page_keys(list(range(2 * PS)), PS)
    end = host.logical_size
    past = torch.arange(end - PS // 2, end - PS // 2 + 2 * PS)  # the first page runs over the end
    assert b.batch_set_v1(keys, past) == [False, False]
    assert b.batch_exists(keys) == 0 and b.store.counters.get("sglang_bad_calls") == 1
    slots = host.alloc(2 * PS)
    fill_random(host, slots, seed=3)
    assert b.batch_set_v1(keys, slots) == [True, True]
    dst = host.alloc(2 * PS)
    assert b.batch_get_v1(keys, dst) == [True, True] and flat_pages(host, dst) == flat_pages(host, slots)
    b.close()


@pytest.mark.parametrize("bad", [None, 3, "abc", iter([]), (k for k in ["a"]), {"a": 1}])
def test_bad_keys_return_nothing_done(tmp_path, bad):
    """The fallback value is never computed from the bad argument itself (it raised TypeError)."""
    _, host = mha_pools("page_first")
    b = create_backend(storage_config(extra=lifeboat_extra(tmp_path)), {PoolName.KV: host})
    slots = host.alloc(PS)
    assert b.batch_exists(bad) == 0 and b.exists(bad) is False
    assert b.batch_set_v1(bad, slots) == [] and b.batch_get_v1(bad, slots) == []
    assert b.batch_set(bad, [slots]) is False and b.batch_get(bad, [slots]) == []
    assert b.batch_set_v2(bad) == {} and b.batch_get_v2(bad) == {}
    assert b.batch_exists_v2(bad).kv_hit_pages == 0
    assert b.batch_set_v2([PoolTransfer(name=PoolName.KV, host_indices=slots, keys=bad)]) == {PoolName.KV: []}
    b.close()



_EXTRA_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=10),
    st.sampled_from(["--5", "²", "abc", "1e400", "9" * 400, "64MiB", "zstd", "none", "true"]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)
_EXTRA_KEYS = ["io_workers", "compression", "failure_cooldown_s", "failure_cooldown_max_s", "copy_queue_size",
               "trace", "engine", "model_id", "key_namespace", "affinity_chunks", "compresion"]


def test_hostile_extra_config_is_a_config_error_naming_the_key(tmp_path, capsys):
    """SGLang's extra-config through the real factory: a bad value (e.g. `engine: "abc"`, which raised
    ValueError) is a ConfigError naming --hicache-storage-backend-extra-config and the key; nothing else."""
    _, host = mha_pools("page_first")
    tally: Counter = Counter()
    failures: list[str] = []

    @settings(max_examples=80 * SCALE, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(_EXTRA_KEYS), _EXTRA_VALUES)
    def run(key: str, value: Any) -> None:
        cfg = storage_config(extra={**lifeboat_extra(tmp_path), key: value})
        try:
            b = sglang_pools.StorageBackendFactory.create_backend("dynamic", cfg, host)
        except ConfigError as e:
            tally["ConfigError"] += 1
            if "--hicache-storage-backend-extra-config" not in str(e) or key not in str(e):
                tally["unnamed"] += 1
                failures.append(f"{key}={value!r:.40}: {str(e)[:200]}")
            return
        except Exception as e:  # noqa: BLE001 - counted and asserted below
            tally["other"] += 1
            failures.append(f"{key}={value!r:.40}: {type(e).__name__}: {str(e)[:200]}")
            return
        tally["accepted"] += 1
        b.close()

    run()
    with capsys.disabled():
        print(f"\nextra-config through StorageBackendFactory: {sum(tally.values()) - tally['unnamed']} inputs: "
              f"{tally['accepted']} accepted, {tally['ConfigError']} ConfigError ({tally['unnamed']} not naming "
              f"the source and key), {tally['other']} other exceptions")
    assert tally["other"] == tally["unnamed"] == 0, failures[:5]
