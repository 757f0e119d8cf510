"""The bench report's figures, checked through matplotlib's objects (issue 30, "Plots"): a reader must
understand each at a glance, so every axis is labelled with one unit, every drawn line or bar group is
in a legend (reference lines too), the title says the machine and a `--quick` run, and the PNG is at
least 1200 px wide. Built from a small synthetic results dict: no bench run, no PNG read back."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from lifeboat_cache.bench.report_plots import PLOTS, figures  # noqa: E402

#: Unit tokens ("ratio" too: a unitless quantity); a y label must name exactly one (one quantity per axis).
UNIT = re.compile(r"(?<![\w/])(GB/s|MB/s|ms|s|x|%|bytes per page|hit rate|ratio)(?![\w/])")
MAX_LEGEND = 8  # entries a reader can match to lines at a glance
CPU = "Test CPU 9000"


def _spread(v: float) -> dict[str, Any]:
    return {"median": v, "min": v * 0.9, "max": v * 1.1, "reps": [v * 0.9, v, v * 1.1]}


def _case(shape: str, layout: str, kind: str) -> dict[str, Any]:
    return {"shape": shape, "layout": layout, "kind": kind,
            "ratio": {op: _spread(r) for op, r in (("write", 2.1), ("write_burst", 2.5), ("cold_read", 1.9),
                                                   ("warm_read", 3.0))}}


def _index_row(n: int) -> dict[str, Any]:
    row: dict[str, Any] = {"pages": n, "impl": "index", "exists_idle_p99_ms": 0.05, "exists_idle_cpu_p99_ms": 0.05,
                           "exists_writer_p99_ms": 0.5, "max_stall_ms": 2.0, "B_per_page_filling_max": 80.0,
                           "B_per_page_filling_peak": 60.0, "B_per_page_after_fill": 40.0,
                           "reopen_snapshot_bytes": n * 24,
                           "store_exists_cold_p99_ms": 0.6, "store_exists_idle_p99_ms": 0.15,
                           "store_exists_writer_p99_ms": 1.2, "store_exists_writer_max_ms": 4.0}
    for kind in ("stale", "clean", "crash"):
        row.update({f"reopen_{kind}_first_hit_s": n * 1e-8, f"reopen_{kind}_full_s": n * 1e-7,
                    f"reopen_{kind}_cpu_s": n * 1e-7, f"reopen_{kind}_peak_B_per_page": 35.0,
                    f"reopen_{kind}_first_cpu_s": n * 1e-8})
    return row


def _serving_half(n: int, ttft_s: float, stored: bool = False) -> dict[str, Any]:
    return {"result": {"ttfts": [ttft_s * (1 + k / n) for k in range(n)], "errors": [""] * (n - 1) + ["timeout"],
                       "cached_tokens_details": [{"device": 0, "storage": 128 * stored * (k % 2)} for k in range(n)]}}


def _results(quick: bool) -> dict[str, Any]:
    codec = {mode: {"encode_gb_s": _spread(e), "decode_gb_s": _spread(d), "ratio": r}
             for mode, e, d, r in (("raw", 12.0, 7.0, 1.0), ("compressed", 1.1, 1.8, 1.47))}
    sections: dict[str, Any] = {
        "ceilings": {"memcpy": {"gb_s": _spread(14.0)}, "codec_real_kv": codec,
                     "plain_file": {"write_fsync_gb_s": _spread(0.6), "cold_read_gb_s": _spread(1.0),
                                    "write_buffered_gb_s": _spread(6.8)}},
        "sglang_vs_file": {"cases": [_case("small", "page_first", "real"), _case("8b", "layer_first", "random")]},
        "sealing": {"cases": [_case("small", "page_first", "real")]},
        "index_scale": {"rows": [_index_row(n) for n in (10_000, 100_000, 1_000_000)]},
        "compression": {"choices": {"real_kv": {
            name: {"ratio": r, "put_gb_s": _spread(p), "get_gb_s": _spread(g)}
            for name, r, p, g in (("raw", 1.0, 3.0, 1.9), ("zstd", 1.47, 0.8, 1.0))}}},
        "retention": {"cases": [
            {"trace": t, "fraction": f, "capacity_pages": 100, "lru": 0.5 * f + 0.4, "belady": 0.9,
             "lifeboat": {"hit_rate": 0.5 * f + 0.4}, "file": {"hit_rate": 0.5 * f + 0.38}}
            for t in ("hot_set", "zipf", "multi_turn", "round_robin") for f in (0.1, 0.25, 0.5)]},
        "s3": {"latencies": {str(lat): {"write_serial_mb_s": 65.0, "write_parallel_mb_s": 187.0,
                                        "read_serial_mb_s": 79.0, "read_parallel_mb_s": 91.0} for lat in (0, 20)},
               "ceph": {"write_serial_mb_s": 40.0, "write_parallel_mb_s": 120.0, "read_serial_mb_s": 60.0,
                        "read_parallel_mb_s": 150.0}},
        "mlx": {"prompts": [{"prompt_tokens": n, "recompute_ttft_s": n * 1e-3, "restored_ttft_s": n * 1e-4,
                             "memory_hit_ttft_s": n * 1e-4} for n in (512, 2048, 8192)]},
        "server": {"prompts": [{"tokens": n, "recompute_s": n * 5e-3, "lifeboat_restored_s": 0.1 + n * 1e-4,
                                "file_restored_s": 0.2 + n * 1e-4} for n in (1024, 4096, 8000)]},
        "serving": {"stop": "sigterm", "concurrency": {c: {"servers": {
            name: {"halves": [_serving_half(8, int(c) / 2), _serving_half(8, int(c) / 2, stored)]}
            for name, stored in (("none", False), ("host", False), ("file", True), ("lifeboat", True))}}
            for c in ("4", "16")}},
    }
    return {"quick": quick, "machine": {"cpu": CPU, "cores": 2}, "sections": sections}


@pytest.fixture(scope="module", params=[True, False], ids=["quick", "full"])
def built(request: pytest.FixtureRequest) -> tuple[bool, dict[str, Any]]:
    return request.param, figures(_results(request.param))


def _axes(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.axison]


def _legend_texts(fig: Any) -> set[str]:
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    return {t.get_text() for lg in legends for t in lg.get_texts()}


def test_every_section_has_a_real_figure(built: tuple[bool, dict[str, Any]]) -> None:
    _, figs = built
    assert set(figs) == set(PLOTS)
    for name, fig in figs.items():
        assert _axes(fig), f"{name}: no axes drawn (placeholder: the synthetic section did not plot)"


def test_axes_are_labelled_with_one_unit(built: tuple[bool, dict[str, Any]]) -> None:
    for name, fig in built[1].items():
        for ax in _axes(fig):
            assert ax.get_xlabel(), f"{name}: an axis without an x label"
            units = set(UNIT.findall(ax.get_ylabel()))
            assert len(units) == 1, f"{name}: y label {ax.get_ylabel()!r} names {units or 'no unit'}"


def test_every_line_and_bar_group_is_in_a_legend(built: tuple[bool, dict[str, Any]]) -> None:
    for name, fig in built[1].items():
        shown = _legend_texts(fig)
        for ax in _axes(fig):
            drawn = [ln for ln in ax.lines if ln.get_linestyle() not in ("None", "none", "")]
            for ln in drawn:  # a drawn line (a dashed target included) needs a label, and the label a legend entry
                assert not ln.get_label().startswith("_"), f"{name}: a line without a label ({ln.get_linestyle()})"
                assert ln.get_label() in shown, f"{name}: line {ln.get_label()!r} missing from the legend"
            for c in ax.containers:
                if not c.get_label().startswith("_"):
                    assert c.get_label() in shown, f"{name}: bars {c.get_label()!r} missing from the legend"


def test_legends_stay_short(built: tuple[bool, dict[str, Any]]) -> None:
    for name, fig in built[1].items():
        for lg in [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends):
            assert len(lg.get_texts()) <= MAX_LEGEND, f"{name}: a legend of {len(lg.get_texts())} entries"


def test_title_names_machine_and_quick(built: tuple[bool, dict[str, Any]]) -> None:
    quick, figs = built
    for name, fig in figs.items():
        text = fig.get_suptitle()
        assert CPU in text and "2 cores" in text, f"{name}: title {text!r} does not name the machine"
        assert ("quick" in text) == quick, f"{name}: title {text!r} (quick run: {quick})"


def test_wide_enough_with_readable_fonts(built: tuple[bool, dict[str, Any]]) -> None:
    for name, fig in built[1].items():
        assert fig.get_figwidth() * fig.dpi >= 1200, f"{name}: {fig.get_figwidth() * fig.dpi:.0f} px wide"
        for ax in _axes(fig):
            assert ax.xaxis.label.get_fontsize() >= 10, f"{name}: x label font {ax.xaxis.label.get_fontsize()}"


def test_decades_get_a_log_axis(built: tuple[bool, dict[str, Any]]) -> None:
    """The server's restored bars (~0.2 s) beside a 40 s recompute, and index reopen times over three
    decades of pages, must not be squashed by a linear axis."""
    figs = built[1]
    for name in ("server", "mlx", "index_scale", "serving"):
        assert any(ax.get_yscale() == "log" for ax in _axes(figs[name])), f"{name}: no log y axis"


def test_a_section_that_did_not_run_keeps_a_titled_placeholder() -> None:
    res = _results(True)
    res["sections"]["server"] = {"status": "skipped", "reason": "not in --only"}
    res["sections"]["mlx"] = {"status": "ok", "prompts": "garbage"}
    figs = figures(res)
    for name in ("server", "mlx"):
        assert not _axes(figs[name]) and "quick" in figs[name].get_suptitle()


def test_serving_marks_the_restart_and_the_requests_restored_from_storage(built: tuple[bool, dict[str, Any]]) -> None:
    axes = _axes(built[1]["serving"])
    assert len(axes) == 2  # one panel per concurrency
    for ax in axes:
        lines = {ln.get_label(): ln for ln in ax.lines}
        assert list(lines["restart (SIGTERM, same store)"].get_xdata()) == [8.5, 8.5]  # between the halves
        # second half, every other request took storage tokens: requests 10, 12, 14, 16 in the order sent
        assert list(lines["HiCache + LifeboatCache: took tokens from storage"].get_xdata()) == [10, 12, 14, 16]
        assert "no HiCache: took tokens from storage" not in lines
        assert len(lines["no HiCache"].get_xdata()) == 16
