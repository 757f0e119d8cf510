"""tracing.py: trace_store logs each call with its sizes and changes no result; the backend's table
covers its public methods."""

from __future__ import annotations

import inspect
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from support.chunks import keys, page

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict
from lifeboat_cache.tracing import PREFIX, trace_calls, trace_store

NS = namespace_fingerprint(model="trace-test")
LOGGER = "lifeboat_cache.store"


def _settings(path: Path, trace: bool):
    return settings_from_dict({"storage": [{"type": "local", "path": str(path), "capacity": "64MiB",
                                            "segment_size": "4MiB"}],
                               "engine": {"io_workers": 2, "trace": trace}})


def _trace_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(PREFIX)]


def test_trace_store_logs_each_call_with_sizes_and_returns_the_same_results(tmp_path, caplog) -> None:
    ks = keys(6)
    pages = [page(i) for i in range(6)]  # 8192 uint16 = 16384 bytes each
    with ChunkStore.open(_settings(tmp_path, trace=True), background=False) as st:
        with caplog.at_level(logging.INFO, logger="lifeboat_cache"):
            caplog.clear()
            put = st.put(NS, ks[:4], pages[:4])
            n = st.count_leading_hits(NS, ks)
            out = [np.zeros_like(p) for p in pages]
            got = st.get_into(NS, ks, out)
        lines = _trace_lines(caplog)
        # the same calls, untraced (the wrapped methods), give the same answers
        assert put == [True] * 4 and st.put.__wrapped__(NS, ks[:4], pages[:4]) == put
        assert n == 4 and st.count_leading_hits.__wrapped__(NS, ks) == n
        assert got == [True] * 4 + [False] * 2
        assert all(np.array_equal(o, p) for o, p in zip(out[:4], pages[:4]))
        again = [np.zeros_like(p) for p in pages]
        assert st.get_into.__wrapped__(NS, ks, again) == got
    ns = NS[:4].hex()
    assert len(lines) == 3, lines
    assert re.fullmatch(rf"{PREFIX} put ns={ns} \(65536 bytes\) 4 keys -> 4 ok in \d+\.\d\d ms", lines[0]), lines[0]
    assert re.fullmatch(rf"{PREFIX} exists ns={ns} 6 keys -> 4 leading hits in \d+\.\d\d ms", lines[1]), lines[1]
    assert re.fullmatch(rf"{PREFIX} get ns={ns} \(98304 bytes\) 6 keys -> 4 ok in \d+\.\d\d ms", lines[2]), lines[2]


def test_trace_sizes_count_scatter_gather_pages(tmp_path, caplog) -> None:
    with ChunkStore.open(_settings(tmp_path, trace=False), background=False) as st:
        trace_store(st, logging.getLogger(LOGGER))
        blocks = [np.arange(256, dtype=np.uint8), np.arange(1024, dtype=np.uint8)]  # one page, two blocks
        with caplog.at_level(logging.INFO, logger=LOGGER):
            assert st.put(NS, ["sg"], [blocks]) == [True]
        assert "(1280 bytes) 1 keys -> 1 ok" in _trace_lines(caplog)[0]


def test_trace_is_off_unless_configured(tmp_path, caplog) -> None:
    with ChunkStore.open(_settings(tmp_path, trace=False), background=False) as st:
        assert "put" not in vars(st) and "get_into" not in vars(st)  # nothing installed, nothing paid
        with caplog.at_level(logging.DEBUG, logger="lifeboat_cache"):
            st.put(NS, keys(2), [page(0), page(1)])
            st.count_leading_hits(NS, keys(2))
        assert _trace_lines(caplog) == []
        trace_store(st)
        trace_store(st)  # idempotent: one wrapper, one line per call
        with caplog.at_level(logging.INFO, logger="lifeboat_cache"):
            caplog.clear()
            st.count_leading_hits(NS, keys(2))
        assert len(_trace_lines(caplog)) == 1


def test_a_failing_describer_never_changes_the_result(caplog) -> None:
    class Thing:
        def work(self, x: int) -> int:
            return x * 2

    def bad(args, kwargs, result):
        raise RuntimeError("describer bug")

    t = trace_calls(Thing(), {"work": bad})
    with caplog.at_level(logging.DEBUG, logger="lifeboat_cache.tracing"):
        assert t.work(21) == 42
    assert any("cannot trace work" in r.getMessage() for r in caplog.records)
    with pytest.raises(AttributeError):
        trace_calls(Thing(), {"missing": bad})  # a table cannot drift from the class silently


def test_exceptions_of_the_traced_call_pass_through_unlogged(caplog) -> None:
    class Thing:
        def work(self) -> None:
            raise ValueError("bad argument")

    t = trace_calls(Thing(), {"work": lambda a, k, r: [("work", 0, "x")]})
    with caplog.at_level(logging.INFO), pytest.raises(ValueError):
        t.work()
    assert _trace_lines(caplog) == []


# ------------------------------------------------------------------ the SGLang backend's table
def test_backend_trace_table_covers_every_public_method() -> None:
    pytest.importorskip("sglang")
    from lifeboat_cache.integrations import sglang_backend as sb
    from lifeboat_cache.integrations.hicache import trace as sglang_trace

    public = {name for name, fn in vars(sb.LifeboatHiCacheStorage).items()
              if not name.startswith("_") and (inspect.isfunction(fn) or callable(fn))}
    traced, untraced = set(sglang_trace.TRACE_LINES), set(sglang_trace.NOT_TRACED)
    assert traced & untraced == set(), f"both traced and not: {traced & untraced}"
    assert public - traced - untraced == set(), f"public methods in neither trace table: {public - traced - untraced}"
    assert (traced | untraced) - public == set(), f"tables name methods the class lacks: {(traced | untraced) - public}"
    # every data-path call SGLang makes (keys or transfers in) has a line
    for name in public:
        params = list(inspect.signature(getattr(sb.LifeboatHiCacheStorage, name)).parameters)
        if name.startswith("batch_") and ("keys" in params or "transfers" in params):
            assert name in traced, f"{name} moves pages but has no trace line"
