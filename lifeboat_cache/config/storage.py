"""`storage:` entries of lifeboat.yaml: one tier (local, nfs or s3) -> TierSettings, every error naming its path.

The keys each tier type allows, the checks of S3's operator options (endpoint URL, TLS, credentials
named by environment variable, SSE, retries) and the defaults that differ per type (an nfs tier seals
after 2 s; an S3 tier refreshes its listing less often). The document around it is `load.py`.

Core layer: imports `values` and `settings` only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

from .settings import COMPRESSIONS, TierSettings
from .values import (
    ConfigError, check_keys, parse_age, parse_bool, parse_choice, parse_float, parse_int, parse_mode, parse_size,
    parse_str, show_value)

DEFAULT_S3_REFRESH_INTERVAL_S = 5.0
S3_ADDRESSING_STYLES = ("auto", "path", "virtual")
S3_SSE_MODES = ("AES256", "aws:kms")
S3_RETRY_MODES = ("standard", "adaptive", "legacy")
TIER_TYPES = ("local", "nfs", "s3")

_TIER_COMMON = {"type", "capacity", "failure_cooldown_s", "failure_cooldown_max_s", "compression"}
_TIER_KEYS = {
    "local": _TIER_COMMON | {"path", "paths", "segment_size", "write_call_size", "affinity_chunks",
                             "refresh_interval_s", "file_mode", "dir_mode", "max_age"},
    "nfs": _TIER_COMMON | {"path", "segment_size", "write_call_size", "refresh_interval_s", "seal_after_s",
                           "file_mode", "dir_mode", "max_age"},
    "s3": _TIER_COMMON | {"bucket", "prefix", "endpoint_url", "region", "connect_timeout_s",
                          "read_timeout_s", "max_attempts", "refresh_interval_s", "retry_mode",
                          "addressing_style", "verify", "ca_bundle", "profile", "access_key_id_env",
                          "secret_access_key_env", "session_token_env", "sse", "sse_kms_key_id",
                          "storage_class", "max_concurrency"},
}


def parse_tier(obj: Any, where: str) -> TierSettings:
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a mapping with a 'type' key (local, nfs or s3), got {show_value(obj)}")
    kind = parse_choice(obj.get("type"), f"{where}.type", TIER_TYPES)
    check_keys(obj, _TIER_KEYS[kind], where)
    kw: dict[str, Any] = {"type": kind}
    if kind in ("local", "nfs"):
        if "path" in obj and "paths" in obj:
            raise ConfigError(f"{where}: give either 'path' or 'paths', not both")
        raw = obj.get("paths", [obj["path"]] if "path" in obj else None)
        if not raw:
            raise ConfigError(f"{where}.path: required for a {kind} tier (a directory, e.g. /mnt/nvme/lifeboat)")
        if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
            raise ConfigError(f"{where}.paths: expected a list of directories, got {show_value(raw)}")
        kw["paths"] = tuple(Path(os.path.expanduser(parse_str(p, f"{where}.paths[{i}]"))) for i, p in enumerate(raw))
        if "segment_size" in obj:
            kw["segment_bytes"] = _size_between(obj, "segment_size", where, (1 << 20, "1MiB"), (4 << 30, "4GiB"))
        if "write_call_size" in obj:  # by default the free memory decides: fsio.WriteCallBound says why
            kw["write_call_bytes"] = _size_between(obj, "write_call_size", where, (4 << 10, "4KiB"),
                                                   (1 << 30, "1GiB"),
                                                   " (e.g. 1MiB; leave it out to let the free memory decide)")
        if "affinity_chunks" in obj:
            kw["affinity_chunks"] = parse_int(obj["affinity_chunks"], f"{where}.affinity_chunks", 1, 1 << 20)
        if "refresh_interval_s" in obj:
            kw["refresh_interval_s"] = parse_float(obj["refresh_interval_s"], f"{where}.refresh_interval_s", 0.05, 3600)
        if "seal_after_s" in obj:
            kw["seal_after_s"] = parse_float(obj["seal_after_s"], f"{where}.seal_after_s", 0.1, 86400)
        elif kind == "nfs":
            kw["seal_after_s"] = 2.0
        for k, top, need in (("file_mode", 0o666, 0o600), ("dir_mode", 0o777, 0o700)):
            if k in obj:
                kw[k] = parse_mode(obj[k], f"{where}.{k}", top, need)
    else:
        kw["bucket"] = parse_str(obj.get("bucket"), f"{where}.bucket")
        if "prefix" in obj:
            if not isinstance(obj["prefix"], str):
                raise ConfigError(f"{where}.prefix: expected a string such as 'lifeboat/', "
                                  f"got {show_value(obj['prefix'])}")
            kw["prefix"] = obj["prefix"]
        if obj.get("region") is not None:
            kw["region"] = parse_str(obj["region"], f"{where}.region")
        if obj.get("endpoint_url") is not None:
            kw["endpoint_url"] = parse_endpoint_url(obj["endpoint_url"], f"{where}.endpoint_url")
        for k in ("connect_timeout_s", "read_timeout_s"):
            if k in obj:
                kw[k] = parse_float(obj[k], f"{where}.{k}", 0.05, 600)
        if "max_attempts" in obj:
            kw["max_attempts"] = parse_int(obj["max_attempts"], f"{where}.max_attempts", 1, 20)
        _parse_s3_options(obj, where, kw)
        # each refresh is one LIST request per host: less often than on a file system
        kw["refresh_interval_s"] = parse_float(obj.get("refresh_interval_s", DEFAULT_S3_REFRESH_INTERVAL_S),
                                                f"{where}.refresh_interval_s", 0.05, 3600)
    if obj.get("capacity") not in (None, "auto"):
        kw["capacity_bytes"] = parse_capacity(obj["capacity"], f"{where}.capacity", kind, len(kw.get("paths", ())))
    for k in ("failure_cooldown_s", "failure_cooldown_max_s"):
        if k in obj:
            kw[k] = parse_float(obj[k], f"{where}.{k}", 0.0, 86400)
    if "compression" in obj:
        kw["compression"] = parse_choice(obj["compression"], f"{where}.compression", COMPRESSIONS)
    if obj.get("max_age") is not None:
        kw["max_age_s"] = parse_age(obj["max_age"], f"{where}.max_age")
    return TierSettings(**kw)


MIN_SEGMENT_BYTES = 1 << 20  # the smallest segment_size: a local / nfs capacity below one segment holds nothing
_BARE_NUMBER_RE = re.compile(r"^\s*[0-9]+(?:\.[0-9]+)?\s*$", re.ASCII)


def parse_capacity(value: Any, where: str, kind: str, paths: int = 1) -> int:
    """`capacity:` -> bytes. A unit is required: a bare `5` was read as 5 bytes (every page evicted at
    once, silently), while an LMCache user means 5 GB. A local / nfs capacity must hold at least one
    smallest segment (1MiB) per directory."""
    example = "e.g. capacity: 50GB (or 50GiB, 512MiB, auto)"
    if isinstance(value, (int, float)) and not isinstance(value, bool) or (
            isinstance(value, str) and _BARE_NUMBER_RE.match(value)):
        raise ConfigError(f"{where}: {show_value(value)} has no unit; write the unit, {example}")
    n = parse_size(value, where)
    if kind in ("local", "nfs") and n < MIN_SEGMENT_BYTES * max(1, paths):
        raise ConfigError(f"{where}: {show_value(value)} is smaller than one segment (at least 1MiB per "
                          f"directory, {max(1, paths)} here); {example}")
    return n


def _size_between(obj: Mapping[str, Any], key: str, where: str, low: tuple[int, str], high: tuple[int, str],
                  hint: str = "") -> int:
    """obj[key] as a size in [low, high] (bytes, as written in the message), else a ConfigError naming it."""
    n = parse_size(obj[key], f"{where}.{key}")
    if not low[0] <= n <= high[0]:
        raise ConfigError(f"{where}.{key}: must be between {low[1]} and {high[1]}{hint}, got {show_value(obj[key])}")
    return n


def parse_endpoint_url(value: Any, where: str) -> str:
    """An S3 endpoint: an http(s) URL with a host and nothing after it but an optional path.

    botocore accepts nearly any string here and fails at the first request with an error that does
    not name the config key; checked at load, the key is named with a valid example.
    """
    from urllib.parse import urlsplit

    text = parse_str(value, where)
    example = "e.g. https://s3.us-east-1.amazonaws.com or http://127.0.0.1:9000"
    try:
        parts = urlsplit(text)
        port = parts.port  # ValueError for a port out of range or not a number
    except ValueError as e:
        raise ConfigError(f"{where}: {show_value(text)} is not a URL ({e}); expected http(s)://host[:port], "
                          f"{example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: {show_value(text)} is not an http(s) URL with a host; expected http(s)://host[:port], "
                          f"{example}")
    if parts.query or parts.fragment or parts.username or parts.password or any(c.isspace() for c in text):
        raise ConfigError(f"{where}: {show_value(text)}: no credentials, query, fragment or spaces in an endpoint URL "
                          f"(keys go in access_key_id_env / secret_access_key_env); {example}")
    del port
    return text


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _parse_s3_options(obj: Mapping[str, Any], where: str, kw: dict[str, Any]) -> None:
    """Operator options of one S3 tier: TLS, addressing, credentials by env var name, SSE, retries."""
    if "retry_mode" in obj:
        kw["retry_mode"] = parse_choice(obj["retry_mode"], f"{where}.retry_mode", S3_RETRY_MODES)
    if obj.get("addressing_style") is not None:
        kw["addressing_style"] = parse_choice(obj["addressing_style"], f"{where}.addressing_style",
                                               S3_ADDRESSING_STYLES)
    if "verify" in obj:
        kw["verify"] = parse_bool(obj["verify"], f"{where}.verify")
    if obj.get("ca_bundle") is not None:
        ca = Path(os.path.expanduser(parse_str(obj["ca_bundle"], f"{where}.ca_bundle")))
        if not ca.is_file():
            raise ConfigError(f"{where}.ca_bundle: {ca} is not a file; give the PEM file of your CA")
        kw["ca_bundle"] = ca
    if obj.get("profile") is not None:
        kw["profile"] = parse_str(obj["profile"], f"{where}.profile")
    for k in ("access_key_id_env", "secret_access_key_env", "session_token_env"):
        if obj.get(k) is not None:
            name = parse_str(obj[k], f"{where}.{k}")
            if not _ENV_NAME_RE.match(name):
                raise ConfigError(f"{where}.{k}: give the NAME of an environment variable (e.g. ONTAP_S3_KEY), "
                                  f"never the key itself; got a value that is not a variable name")
            kw[k] = name
    if ("access_key_id_env" in kw) != ("secret_access_key_env" in kw):
        raise ConfigError(f"{where}: access_key_id_env and secret_access_key_env go together; give both")
    if "access_key_id_env" in kw and "profile" in kw:
        raise ConfigError(f"{where}: give either profile or access_key_id_env/secret_access_key_env, not both")
    if obj.get("sse") is not None:
        kw["sse"] = parse_choice(obj["sse"], f"{where}.sse", S3_SSE_MODES)
    if obj.get("sse_kms_key_id") is not None:
        kw["sse_kms_key_id"] = parse_str(obj["sse_kms_key_id"], f"{where}.sse_kms_key_id")
        if kw.get("sse") != "aws:kms":
            raise ConfigError(f"{where}.sse_kms_key_id: needs sse: aws:kms")
    if obj.get("storage_class") is not None:
        kw["storage_class"] = parse_str(obj["storage_class"], f"{where}.storage_class")
    if obj.get("max_concurrency") is not None:
        kw["max_concurrency"] = parse_int(obj["max_concurrency"], f"{where}.max_concurrency", 1, 1024)

