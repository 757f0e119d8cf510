"""The demo's report: the store it names, the label of a visit, the disk it says it used."""

from __future__ import annotations

import os
from pathlib import Path

from lifeboat_cache.config import load_settings
from lifeboat_cache.demo import returning_user as demo


def test_store_named_is_the_configured_one(tmp_path: Path) -> None:
    cfg = tmp_path / "lifeboat.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {tmp_path / 'elsewhere'}\n")
    text = demo.describe_store(load_settings(cfg))
    assert str(cfg) in text and str(tmp_path / "elsewhere") in text
    assert "embedded default" not in text
    default = demo.describe_store(load_settings(env={}))
    assert default.startswith("embedded default")


def test_visits_are_labelled_by_what_happened() -> None:
    assert demo.outcome({"cached_tokens": 0, "prompt_tokens": 1185}).startswith("cold")
    warm = demo.outcome({"cached_tokens": 1152, "prompt_tokens": 1185})
    assert warm.startswith("warm") and "1152 of 1185" in warm


def test_disk_use_counts_model_and_store_and_says_how_to_remove(tmp_path: Path, capsys) -> None:
    store = tmp_path / "store"
    model = store / "models" / "m"
    model.mkdir(parents=True)
    (model / "w.safetensors").write_bytes(os.urandom(3 << 20))
    (store / "a.seg").write_bytes(os.urandom(2 << 20))
    cfg = tmp_path / "lifeboat.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {store}\n")
    demo.print_disk_use(load_settings(cfg), model, 5 << 19)
    out = capsys.readouterr().out
    assert "model 3 MiB" in out and "this run 2 MiB" in out  # 2.5 MiB rounds to 2
    assert f"store {store} now holds 2 MiB (besides the model)" in out
    assert f"rm -rf {model}" in out and f"rm -rf {store}" in out and "and the model" in out
