"""Config parsing: defaults, lookup order, and errors that name the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from lifeboat_cache.config import ConfigError, apply_overrides, load_settings, parse_size, settings_from_dict


def test_embedded_default_is_a_local_store_under_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("LIFEBOAT_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    s = load_settings()
    assert s.source == "embedded default"
    assert [t.type for t in s.storage] == ["local"]
    assert s.storage[0].paths == (tmp_path / "lifeboat",)
    assert s.engine.io_workers == 8 and s.engine.compression == "auto"
    assert s.model_id is None and s.key_namespace == ""


def test_lookup_order_env_then_cwd(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lifeboat.yaml").write_text("engine: {io_workers: 3}\n")
    monkeypatch.delenv("LIFEBOAT_CONFIG", raising=False)
    assert load_settings().engine.io_workers == 3
    other = tmp_path / "other.yaml"
    other.write_text("engine: {io_workers: 5}\n")
    monkeypatch.setenv("LIFEBOAT_CONFIG", str(other))
    assert load_settings().engine.io_workers == 5
    monkeypatch.setenv("LIFEBOAT_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="LIFEBOAT_CONFIG"):
        load_settings()


def test_full_document():
    s = settings_from_dict({
        "storage": [
            {"type": "local", "paths": ["/mnt/a", "/mnt/b"], "capacity": "500GiB", "affinity_chunks": 2},
            {"type": "nfs", "path": "/mnt/filer/lb", "capacity": "2TB"},
            {"type": "s3", "bucket": "kv", "prefix": "lb/", "endpoint_url": "http://127.0.0.1:9000"},
        ],
        "engine": {"io_workers": 4, "compression": "none", "trace": True},
        "model_id": "llama-3.1-8b",
        "key_namespace": "prod",
    })
    assert s.storage[0].paths == (Path("/mnt/a"), Path("/mnt/b"))
    assert s.storage[0].capacity_bytes == 500 * 2**30 and s.storage[0].affinity_chunks == 2
    assert s.storage[1].capacity_bytes == 2 * 10**12 and s.storage[1].seal_after_s == 2.0
    assert s.storage[2].bucket == "kv" and s.storage[2].capacity_bytes is None
    assert s.engine.compression == "none" and s.engine.trace is True


@pytest.mark.parametrize("doc, needle", [
    ({"storag": []}, "unknown key(s) storag"),
    ({"storage": [{"type": "tape", "path": "/x"}]}, "storage[0].type: must be one of local, nfs, s3"),
    ({"storage": [{"type": "local"}]}, "storage[0].path: required"),
    ({"storage": [{"type": "local", "path": "/x", "capacity": "lots"}]}, "storage[0].capacity: expected a size"),
    ({"storage": [{"type": "local", "path": "/x", "bucket": "b"}]}, "unknown key(s) bucket"),
    ({"storage": [{"type": "s3"}]}, "storage[0].bucket"),
    ({"engine": {"io_workers": 0}}, "engine.io_workers: must be between 1 and 256"),
    ({"engine": {"compression": "lz4"}}, "engine.compression: must be one of auto, zstd, none"),
    ({"engine": {"failure_cooldown_s": 10, "failure_cooldown_max_s": 1}}, "failure_cooldown_max_s"),
    ({"key_namespace": "x" * 65}, "key_namespace: 65 bytes is too long"),
    ({"model_id": ""}, "model_id: expected a non-empty string"),
])
def test_bad_values_name_the_key(doc, needle):
    with pytest.raises(ConfigError) as e:
        settings_from_dict(doc)
    assert needle in str(e.value)


def test_bad_yaml_names_the_file(tmp_path):
    p = tmp_path / "lifeboat.yaml"
    p.write_text("storage: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(p)


def test_overrides_flat_and_nested(tmp_path):
    base = settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path)}]})
    s = apply_overrides(base, {"io_workers": 2, "trace": "true", "model_id": "m", "key_namespace": "t"})
    assert (s.engine.io_workers, s.engine.trace, s.model_id, s.key_namespace) == (2, True, "m", "t")
    s = apply_overrides(base, {"engine": {"failure_cooldown_s": 0.5}})
    assert s.engine.failure_cooldown_s == 0.5
    with pytest.raises(ConfigError, match="unknown key"):
        apply_overrides(base, {"gateway_port": 1})


@pytest.mark.parametrize("text, n", [("64MiB", 64 << 20), ("1.5GB", 1_500_000_000), ("2TiB", 2 << 40), (4096, 4096)])
def test_parse_size(text, n):
    assert parse_size(text, "x") == n


def test_copy_queue_size_explicit_auto_or_absent():
    """A size is explicit (the MLX writer uses it as given); absent and `auto` leave the MLX shim to size
    its queue from the model, with the 256 MiB default everywhere else. Overrides keep that distinction."""
    absent = settings_from_dict({}).engine
    assert absent.copy_queue_bytes == 256 << 20 and not absent.copy_queue_explicit
    for word in ("auto", " AUTO "):
        auto = settings_from_dict({"engine": {"copy_queue_size": word}}).engine
        assert auto == absent
    sized = settings_from_dict({"engine": {"copy_queue_size": "1GiB"}}).engine
    assert sized.copy_queue_bytes == 1 << 30 and sized.copy_queue_explicit
    assert settings_from_dict({"engine": {"copy_queue_size": 256 << 20}}).engine.copy_queue_explicit
    # an override of another engine key keeps auto auto, and an explicit size explicit
    s = apply_overrides(settings_from_dict({}), {"io_workers": 2})
    assert not s.engine.copy_queue_explicit and s.engine.io_workers == 2
    s = apply_overrides(settings_from_dict({"engine": {"copy_queue_size": "64MiB"}}), {"io_workers": 2})
    assert s.engine.copy_queue_explicit and s.engine.copy_queue_bytes == 64 << 20
    s = apply_overrides(settings_from_dict({"engine": {"copy_queue_size": "64MiB"}}), {"copy_queue_size": "auto"})
    assert not s.engine.copy_queue_explicit and s.engine.copy_queue_bytes == 256 << 20


@pytest.mark.parametrize("value", ["automatic", "fast", "", "-1MiB", 0, True, [1], None])
def test_copy_queue_size_garbage_names_the_field_and_both_forms(value):
    with pytest.raises(ConfigError) as e:
        settings_from_dict({"engine": {"copy_queue_size": value}}, source="lifeboat.yaml")
    msg = str(e.value)
    assert msg.startswith("lifeboat.yaml: engine.copy_queue_size:") and "auto" in msg and "MiB" in msg, msg


@pytest.mark.parametrize("url", ["abc", "s3.amazonaws.com", "ftp://host", "http://", "https://:9000",
                                 "http://host:99999", "http://host:port", "http://user:pw@host",
                                 "http://host/?x=1", "http://ho st"])
def test_s3_endpoint_url_garbage_names_the_key_and_a_valid_example(url: str) -> None:
    doc = {"storage": [{"type": "s3", "bucket": "kv", "endpoint_url": url}]}
    with pytest.raises(ConfigError, match=r"storage\[0\]\.endpoint_url: .*e\.g\. https://s3\.us-east-1\.amazonaws\.com"):
        settings_from_dict(doc, source="lifeboat.yaml")


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000", "https://s3.svm1.example.internal", "https://[::1]:443/s3"])
def test_s3_endpoint_url_accepts_real_endpoints(url: str) -> None:
    doc = {"storage": [{"type": "s3", "bucket": "kv", "endpoint_url": url}]}
    assert settings_from_dict(doc, source="lifeboat.yaml").storage[0].endpoint_url == url


def test_s3_and_nfs_keys() -> None:
    s = settings_from_dict({"storage": [
        {"type": "nfs", "path": "/mnt/nfs/lb"},
        {"type": "s3", "bucket": "b", "prefix": "p/", "endpoint_url": "https://s3.example", "max_attempts": 4},
        {"type": "s3", "bucket": "b2", "refresh_interval_s": 0.5},
    ], "engine": {"copy_queue_size": "64MiB"}})
    nfs, s3, s3b = s.storage
    assert nfs.seal_after_s == 2.0
    assert s3.refresh_interval_s == 5.0 and s3.max_attempts == 4 and s3.endpoint_url == "https://s3.example"
    assert s3b.refresh_interval_s == 0.5
    assert s.engine.copy_queue_bytes == 64 << 20
    with pytest.raises(ConfigError, match="storage\\[0\\]"):
        settings_from_dict({"storage": [{"type": "s3", "bucket": "b", "paths": ["/x"]}]})
    with pytest.raises(ConfigError, match="bucket"):
        settings_from_dict({"storage": [{"type": "s3"}]})


def test_write_call_size_of_a_file_tier() -> None:
    s = settings_from_dict({"storage": [{"type": "local", "path": "/x", "write_call_size": "1MiB"},
                                        {"type": "nfs", "path": "/y"}]})
    assert s.storage[0].write_call_bytes == 1 << 20 and s.storage[1].write_call_bytes == 0  # 0: by free memory
    for bad in ("1KiB", "2GiB", "lots"):
        with pytest.raises(ConfigError, match=r"storage\[0\]\.write_call_size") as e:
            settings_from_dict({"storage": [{"type": "local", "path": "/x", "write_call_size": bad}]})
        assert "1MiB" in str(e.value) or "size" in str(e.value)
    with pytest.raises(ConfigError, match="write_call_size"):  # not a key of an s3 tier
        settings_from_dict({"storage": [{"type": "s3", "bucket": "b", "write_call_size": "1MiB"}]})


@pytest.mark.parametrize("value", [5, "5", 5.5, " 50 "])
def test_capacity_without_a_unit_is_refused_naming_the_key_and_an_example(value):
    """`capacity: 5` was read as 5 bytes: every page evicted at once, `stats` saying `0 B of 5 B`, rc 0."""
    for kind, extra in (("local", {"path": "/x"}), ("nfs", {"path": "/x"}), ("s3", {"bucket": "b"})):
        with pytest.raises(ConfigError) as e:
            settings_from_dict({"storage": [{"type": kind, "capacity": value, **extra}]})
        assert "storage[0].capacity" in str(e.value) and "no unit" in str(e.value)
        assert "capacity: 50GB" in str(e.value)


def test_capacity_smaller_than_one_segment_is_refused():
    with pytest.raises(ConfigError, match=r"storage\[0\].capacity: '512KiB' is smaller than one segment"):
        settings_from_dict({"storage": [{"type": "local", "path": "/x", "capacity": "512KiB"}]})
    with pytest.raises(ConfigError, match="2 here"):  # split over the drives: at least one segment each
        settings_from_dict({"storage": [{"type": "local", "paths": ["/a", "/b"], "capacity": "1MiB"}]})
    s = settings_from_dict({"storage": [{"type": "local", "path": "/x", "capacity": "1MiB"},
                                        {"type": "s3", "bucket": "b", "capacity": "64KiB"}]})
    assert s.storage[0].capacity_bytes == 1 << 20 and s.storage[1].capacity_bytes == 64 << 10


def test_an_empty_config_file_is_an_error_naming_it(tmp_path):
    """An empty lifeboat.yaml silently meant the default store (~/.cache/lifeboat)."""
    for text in ("", "# only a comment\n"):
        p = tmp_path / "lifeboat.yaml"
        p.write_text(text)
        with pytest.raises(ConfigError, match=f"{p}: the config file is empty"):
            load_settings(p)
