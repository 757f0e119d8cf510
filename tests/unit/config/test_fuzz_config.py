"""Property-based fuzzing of the config loader: only ConfigError ever escapes, and it names the key.

Three input surfaces, each driven through the public loader:
* documents (`settings_from_dict`): a valid lifeboat.yaml with one key replaced by a hostile value;
* `apply_overrides` (SGLang's extra-config), flat and nested;
* files and env (`load_settings` with `LIFEBOAT_CONFIG`): hostile YAML text, non-UTF-8 bytes,
  directories and missing paths.

Each test prints a figure (inputs tried, accepted, ConfigError, anything else = 0). Seeded
(`derandomize`), so a run is reproducible; LIFEBOAT_FUZZ_SCALE multiplies the example counts.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import (  # noqa: E402
    HealthCheck,
    given,
    settings,
    strategies as st,  # noqa: E402
)

from lifeboat_cache.config import ConfigError, Settings, apply_overrides, load_settings, settings_from_dict  # noqa: E402

SCALE = int(os.environ.get("LIFEBOAT_FUZZ_SCALE", "1"))


def _settings(n: int) -> settings:
    return settings(max_examples=n * SCALE, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------ hostile values
_NUMERALS = st.sampled_from([
    "--5", "-5", "+5", "5", "²", "٣", "1e400", "1e-400", "9" * 400, "9" * 5000, "0x10", "1_000", " 7 ", "",
    "nan", "inf", "-inf", "1.5", "1.", ".5", "64MiB", "1.5TB", "0B", "99999999999PiB", "1e3GiB", "5 GiB",
    "\x00", "\ud800", "\u0661\u0662", "true", "auto",
])
_SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(),  # unbounded: hypothesis draws huge ones too
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, 10**400, -(10**400)]),
    st.just(5000).map(lambda digits: 10**digits),  # too long for repr(): built, not listed
    st.floats(allow_nan=True, allow_infinity=True),
    _NUMERALS, st.text(max_size=30), st.binary(max_size=8),
)
HOSTILE = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=3)),
    max_leaves=6,
)

_TIER_KEYS = {
    "local": ["type", "path", "paths", "capacity", "segment_size", "affinity_chunks", "refresh_interval_s",
              "failure_cooldown_s", "failure_cooldown_max_s"],
    "nfs": ["type", "path", "capacity", "segment_size", "refresh_interval_s", "seal_after_s",
            "failure_cooldown_s", "failure_cooldown_max_s"],
    "s3": ["type", "bucket", "prefix", "endpoint_url", "region", "connect_timeout_s", "read_timeout_s",
           "max_attempts", "refresh_interval_s", "capacity", "failure_cooldown_s", "failure_cooldown_max_s"],
}
_ENGINE_KEYS = ["io_workers", "compression", "failure_cooldown_s", "failure_cooldown_max_s", "copy_queue_size",
                "trace", "deadline_s", "io_scheduling"]
_BASE_TIERS = {"local": {"type": "local", "path": "/tmp/lb"}, "nfs": {"type": "nfs", "path": "/mnt/lb"},
               "s3": {"type": "s3", "bucket": "kv"}}


def _base() -> dict:
    return {"storage": [dict(_BASE_TIERS["local"]), dict(_BASE_TIERS["nfs"]), dict(_BASE_TIERS["s3"])],
            "engine": {"io_workers": 4}, "model_id": "m", "key_namespace": "ns"}


@st.composite
def mutated_document(draw: Any) -> tuple[dict, str, str]:
    """(document, the key's YAML path, the leaf name): a valid document with one hostile value."""
    doc = _base()
    where = draw(st.sampled_from(["tier", "tier", "tier", "engine", "engine", "top", "section"]))
    value = draw(HOSTILE)
    if where == "tier":
        i = draw(st.integers(0, 2))
        kind = doc["storage"][i]["type"]
        key = draw(st.sampled_from(_TIER_KEYS[kind]))
        doc["storage"][i][key] = value
        if key == "paths":
            doc["storage"][i].pop("path", None)
        return doc, f"storage[{i}]", key
    if where == "engine":
        key = draw(st.sampled_from(_ENGINE_KEYS))
        doc["engine"][key] = value
        return doc, "engine", key
    if where == "top":
        key = draw(st.sampled_from(["model_id", "key_namespace"]))
        doc[key] = value
        return doc, "", key
    key = draw(st.sampled_from(["storage", "engine"]))  # a whole section replaced
    doc[key] = value
    return doc, "", key


def _names_the_key(msg: str, parent: str, leaf: str) -> bool:
    """A message names the key when it gives the leaf, or (for a structural error, e.g. the `type`
    that makes sibling keys unknown) the section holding it."""
    return leaf in msg or (bool(parent) and parent in msg)


def _figure(capsys: Any, what: str, tally: Counter) -> None:
    with capsys.disabled():
        print(f"\n{what}: {sum(tally.values())} inputs: {tally['accepted']} accepted, "
              f"{tally['ConfigError']} ConfigError ({tally['unnamed']} not naming the source and key), "
              f"{tally['other']} other exceptions")


# ------------------------------------------------------------------ documents
def test_fuzz_documents_raise_only_config_error_naming_the_key(capsys):
    tally: Counter = Counter()
    failures: list[str] = []

    @_settings(600)
    @given(mutated_document())
    def run(case: tuple[dict, str, str]) -> None:
        doc, parent, leaf = case
        try:
            s = settings_from_dict(doc, source="fuzz.yaml")
        except ConfigError as e:
            tally["ConfigError"] += 1
            msg = str(e)
            if not (msg.startswith("fuzz.yaml: ") and _names_the_key(msg, parent, leaf)):  # file and key
                tally["unnamed"] += 1
                failures.append(f"{leaf}: {msg[:200]}")
            return
        except Exception as e:  # noqa: BLE001
            tally["other"] += 1  # counted, not raised: the figure shows them all
            failures.append(f"{type(e).__name__}: {str(e)[:200]}")
            return
        tally["accepted"] += 1
        assert isinstance(s, Settings)
        # what was accepted is sane: sizes are positive ints, times finite
        for t in s.storage:
            assert t.capacity_bytes is None or (isinstance(t.capacity_bytes, int) and t.capacity_bytes > 0)
            assert math.isfinite(t.refresh_interval_s) and isinstance(t.segment_bytes, int)
        assert 1 <= s.engine.io_workers <= 256 and math.isfinite(s.engine.failure_cooldown_s)

    run()
    _figure(capsys, "config documents", tally)
    assert tally["other"] == tally["unnamed"] == 0, failures[:5]
    assert tally["ConfigError"] > 0 and tally["accepted"] > 0


# ------------------------------------------------------------------ overrides (extra-config)
@st.composite
def hostile_overrides(draw: Any) -> tuple[Any, str]:
    kind = draw(st.sampled_from(["flat", "flat", "nested", "top", "whole", "unknown"]))
    if kind == "flat":
        key = draw(st.sampled_from(_ENGINE_KEYS))
        return {key: draw(HOSTILE)}, key
    if kind == "nested":
        key = draw(st.sampled_from(_ENGINE_KEYS))
        return {"engine": {key: draw(HOSTILE)}}, key
    if kind == "top":
        key = draw(st.sampled_from(["engine", "storage", "model_id", "key_namespace"]))
        return {key: draw(HOSTILE)}, key
    if kind == "unknown":
        key = draw(st.one_of(st.text(min_size=1, max_size=10), st.integers()))
        return {key: draw(HOSTILE)}, str(key)
    return draw(HOSTILE), ""  # not even a mapping


def test_fuzz_overrides_raise_only_config_error_naming_the_key(capsys, tmp_path):
    base = settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path)}]})
    tally: Counter = Counter()
    failures: list[str] = []

    @_settings(500)
    @given(hostile_overrides())
    def run(case: tuple[Any, str]) -> None:
        overrides, key = case
        try:
            apply_overrides(base, overrides, source="extra-config")
        except ConfigError as e:
            tally["ConfigError"] += 1
            msg = str(e)
            if not (msg.startswith("extra-config") and (key in msg or not key)):
                tally["unnamed"] += 1
                failures.append(f"{key}: {msg[:200]}")
            return
        except Exception as e:  # noqa: BLE001
            tally["other"] += 1  # counted, not raised: the figure shows them all
            failures.append(f"{type(e).__name__}: {str(e)[:200]}")
            return
        tally["accepted"] += 1

    run()
    _figure(capsys, "config overrides", tally)
    assert tally["other"] == tally["unnamed"] == 0 and tally["ConfigError"] > 0, failures[:5]


# ------------------------------------------------------------------ files and LIFEBOAT_CONFIG
_YAML_SNIPPETS = st.sampled_from([
    "engine: {io_workers: --5}\n", "engine: {io_workers: ²}\n", "engine: {copy_queue_size: 1e400GiB}\n",
    "engine: abc\n", "engine: [1, 2]\n", "storage: {type: local}\n", "storage: [{type: local, path: 5}]\n",
    "storage: [{type: local, path: /x, capacity: 99999999999999999999999999PiB}]\n",
    "storage: [{type: local, path: /x, segment_size: 0.5}]\n", "? [a, b]\n: 1\n", "!!python/object:os.system {}\n",
    "a: &x [*x]\n", "[" * 5000 + "]" * 5000 + "\n", "key_namespace: \"\\ud800\"\n", "model_id: \"\\0\"\n",
    "engine: {failure_cooldown_s: 1e999}\n", "engine: {trace: 1000000000000000000000000000000}\n",
    "storage: [{type: s3, bucket: b, max_attempts: 1e3}]\n", "---\n---\n", "%YAML 9.9\n---\n{}\n",
    "engine:\n\tio_workers: 2\n", "1: 2\n", "null\n", "42\n",
])


@st.composite
def hostile_file(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["snippet", "dump", "bytes", "mangled"]))
    if kind == "snippet":
        return draw(_YAML_SNIPPETS).encode("utf-8", "surrogatepass")
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    doc, _, _ = draw(mutated_document())
    try:
        text = yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass")
    except Exception:  # a hostile value yaml cannot represent: use a snippet instead
        text = draw(_YAML_SNIPPETS).encode()
    if kind == "mangled":  # non-UTF-8 or stray bytes in the middle of a good file
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.binary(min_size=1, max_size=4)) + text[pos:]
    return text


def test_fuzz_config_files_and_env_raise_only_config_error_naming_the_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "lifeboat.yaml"
    tally: Counter = Counter()
    failures: list[str] = []

    @_settings(300)
    @given(hostile_file(), st.sampled_from(["arg", "env", "env"]))
    def run(data: bytes, how: str) -> None:
        path.write_bytes(data)
        try:
            if how == "arg":
                load_settings(path)
            else:
                load_settings(env={"LIFEBOAT_CONFIG": str(path)})
        except ConfigError as e:
            tally["ConfigError"] += 1
            if str(path) not in str(e):
                tally["unnamed"] += 1
                failures.append(str(e)[:200])
            return
        except Exception as e:  # noqa: BLE001
            tally["other"] += 1  # counted, not raised: the figure shows them all
            failures.append(f"{type(e).__name__}: {str(e)[:200]}")
            return
        tally["accepted"] += 1

    run()

    @_settings(100)
    @given(st.one_of(st.text(max_size=40), st.sampled_from(["", "~", "/", str(tmp_path), "/nonexistent/x.yaml",
                                                            "\ud800", "a" * 5000])))
    def env_value(value: str) -> None:
        try:
            s = load_settings(env={"LIFEBOAT_CONFIG": value})
        except ConfigError as e:
            tally["ConfigError"] += 1
            if "LIFEBOAT_CONFIG" not in str(e) and str(path) not in str(e):
                tally["unnamed"] += 1
                failures.append(str(e)[:200])
            return
        except Exception as e:  # noqa: BLE001
            tally["other"] += 1  # counted, not raised: the figure shows them all
            failures.append(f"{type(e).__name__}: {str(e)[:200]}")
            return
        tally["accepted"] += 1
        assert isinstance(s, Settings)

    path.write_text("engine: {io_workers: 2}\n")
    env_value()
    _figure(capsys, "config files and LIFEBOAT_CONFIG", tally)
    assert tally["other"] == tally["unnamed"] == 0 and tally["ConfigError"] > 0, failures[:5]


@pytest.mark.parametrize("text, key", [
    ("engine: {io_workers: --5}\n", "engine.io_workers"),
    ("engine: {io_workers: ²}\n", "engine.io_workers"),
    ("storage: [{type: local, path: /x, capacity: 1e400GiB}]\n", "storage[0].capacity"),
    ("storage: [{type: local, path: /x, capacity: " + "9" * 400 + "}]\n", "storage[0].capacity"),
    ("engine: {failure_cooldown_s: " + "9" * 400 + "}\n", "engine.failure_cooldown_s"),
    ("engine: {trace: " + "9" * 400 + "}\n", "engine.trace"),
    ("engine: {trace: " + "9" * 5000 + "}\n", "normal length"),  # PyYAML itself cannot read it
])
def test_named_hostile_values_are_config_errors(tmp_path, text, key):
    """The cases of issue 9 item 9, by name: each is a ConfigError naming the file and the key."""
    p = tmp_path / "lifeboat.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_settings(p)
    assert str(p) in str(e.value) and key in str(e.value)


def test_non_utf8_file_is_a_config_error(tmp_path):
    p = tmp_path / "lifeboat.yaml"
    p.write_bytes(b"engine: {io_workers: 2}\n# caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8.*save the file as UTF-8"):
        load_settings(p)


def test_engine_that_is_not_a_mapping_in_extra_config(tmp_path):
    base = settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path)}]})
    with pytest.raises(ConfigError, match=r"extra-config\.engine: expected a mapping"):
        apply_overrides(base, {"engine": "abc"}, source="extra-config")
    assert Path(tmp_path).is_dir()
