"""`engine.io_scheduling`: the store's io and copy threads run under the configured Linux policy (read back
from the kernel), SGLang's threads and the caller's are left as they were, and bad values are refused."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from support.chunks import keys, local_settings, page

from lifeboat_cache import ChunkStore, ConfigError, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict
from lifeboat_cache.cooldown import LogOnce
from lifeboat_cache.cpu_policy import apply_to_this_thread

linux_only = pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling policies")
NS = namespace_fingerprint(model="test", dtype="bfloat16", page_size=64)
KERNEL = {"batch": getattr(os, "SCHED_BATCH", None), "idle": getattr(os, "SCHED_IDLE", None),
          "normal": getattr(os, "SCHED_OTHER", None)}


def _policies(prefix: str, before: set[int]) -> set[int]:
    """The kernel's policy of every live thread named prefix... that was not there `before` (a store's threads,
    not those of another test's store that is still shutting down)."""
    return {os.sched_getscheduler(t.native_id) for t in threading.enumerate()
            if t.name.startswith(prefix) and t.native_id is not None and t.native_id not in before}


def _threads() -> set[int]:
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def _two_tiers(tmp_path, policy: str):
    return settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path / "a"), "capacity": "1GiB"},
                                           {"type": "local", "path": str(tmp_path / "b"), "capacity": "1GiB"}],
                               "engine": {"io_workers": 4, "io_scheduling": policy}})


@linux_only
@pytest.mark.parametrize("policy", ["batch", "idle", "normal"])
def test_io_and_copy_threads_run_under_the_configured_policy(tmp_path, policy):
    ks = keys(32)
    pages = [page(i) for i in range(32)]
    before, mine = _threads(), os.sched_getscheduler(0)
    with ChunkStore.open(_two_tiers(tmp_path, policy), background=False) as st:
        assert all(st.put(NS, ks, pages))
        st.flush()  # the copies to the second tier have run
        io, copy = _policies("lifeboat-io", before), _policies("lifeboat-copy", before)
        assert io == {KERNEL[policy]}, f"io threads under {io}, configured {policy}"
        assert copy == {KERNEL[policy]}, f"copy threads under {copy}, configured {policy}"
        # the caller's thread (SGLang's, in a server) is never moved
        assert os.sched_getscheduler(0) == mine
        out = [np.zeros_like(p) for p in pages]
        assert all(st.get_into(NS, ks, out))
        assert all(np.array_equal(a, b) for a, b in zip(out, pages))


@linux_only
def test_the_default_is_batch(tmp_path):
    before = _threads()
    with ChunkStore.open(local_settings(tmp_path), background=False) as st:
        assert st.settings.engine.io_scheduling == "batch"
        assert all(st.put(NS, keys(8), [page(i) for i in range(8)]))
        assert _policies("lifeboat-io", before) == {os.SCHED_BATCH}


@pytest.mark.parametrize("value", ["fifo", "", 3, None, ["batch"], "BATCH "])
def test_a_bad_value_names_the_key_and_the_choices(tmp_path, value):
    with pytest.raises(ConfigError) as e:
        settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path)}],
                            "engine": {"io_scheduling": value}})
    assert "engine.io_scheduling" in str(e.value) and "batch" in str(e.value)


def test_an_unknown_policy_is_a_caller_bug():
    with pytest.raises(ValueError, match="batch, normal, idle"):
        apply_to_this_thread("realtime", LogOnce())
