"""A store directory deleted while a process has it open stays deleted: the close at exit (what the
SGLang backend's exit hook runs: the last stats file, then the store's close) re-created it, with a stats
file and an index snapshot, in a store the operator had removed."""

from __future__ import annotations

import shutil

import numpy as np

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict
from lifeboat_cache.ops import StatsReporter


def test_a_deleted_store_directory_is_not_recreated_at_close(tmp_path):
    d = tmp_path / "store"
    s = settings_from_dict({"storage": [{"type": "local", "path": str(d), "capacity": "64MiB",
                                         "segment_size": "1MiB"}]})
    store = ChunkStore.open(s, background=False)
    reporter = StatsReporter(store, role="test", interval_s=3600, prometheus=False)
    assert store.put(namespace_fingerprint(model="m"), ["k"], [np.zeros(4096, np.uint16)]) == [True]
    reporter.tick()
    assert (d / "stats").is_dir()
    shutil.rmtree(d)
    reporter.close()  # the backend's close order
    store.close()
    assert not d.exists()
