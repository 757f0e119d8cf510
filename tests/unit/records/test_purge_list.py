"""purge.list is untrusted input: bad lines are dropped and counted, never an error; a link is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lifeboat_cache.config import ConfigError, parse_age
from lifeboat_cache.fsio import ForeignFile
from lifeboat_cache.records import purge_list as purgelist
from lifeboat_cache.tiers.segments.purge_filter import PurgeFilter


def test_parse_keeps_valid_lines_and_counts_bad_ones() -> None:
    ns = "ab" * 16
    data = b"\n".join([
        b'{"namespace": "%s", "before_ms": 100}' % ns.encode(),
        b'{"namespace": "%s", "before_ms": 50}' % ns.encode(),  # an older rule never shrinks a newer one
        b'{"age_before_ms": 7}',
        b'{"namespace": "zz", "before_ms": 1}', b'{"namespace": "%s", "before_ms": true}' % ns.encode(),
        b'{"age_before_ms": -1}', b"\xff\xfe", b"[1, 2]", b'{"namespace": "%s"' % ns.encode(), b""])
    rules, bad = purgelist.parse(data)
    assert rules.namespaces == {bytes.fromhex(ns): 100} and rules.age_before_ms == 7
    assert bad == 6


def test_append_is_owner_only_and_filter_reloads(tmp_path: Path) -> None:
    f = PurgeFilter(tmp_path)
    assert not f.active and not f.reload()
    purgelist.append_rules(tmp_path, [{"namespace": "cd" * 16, "before_ms": 1000}], 0o600)
    assert (tmp_path / purgelist.PURGE_NAME).stat().st_mode & 0o777 == 0o600
    assert f.reload() and f.active
    assert f.blocks(999, bytes.fromhex("cd" * 16)) and not f.blocks(1000, bytes.fromhex("cd" * 16))
    assert not f.blocks(5, bytes(16))
    assert not f.reload()  # unchanged file: no re-read


def test_planted_link_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b'{"age_before_ms": 99999999999}\n')
    os.symlink(target, tmp_path / purgelist.PURGE_NAME)
    with pytest.raises(ForeignFile):
        purgelist.append_rules(tmp_path, [{"age_before_ms": 1}])
    f = PurgeFilter(tmp_path)  # a link is never read through: no rule from it
    assert f.rules.age_before_ms == 0
    assert target.read_bytes() == b'{"age_before_ms": 99999999999}\n'


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("30m", 1800), ("24h", 86400), ("7d", 604800),
                                          ("2w", 1209600), ("15", 15), (3600, 3600)])
def test_parse_age(text: object, seconds: float) -> None:
    assert parse_age(text, "--older-than") == seconds


@pytest.mark.parametrize("text", ["abc", "", "0", "-1d", "7x", "nan", "inf", True, None, [1]])
def test_parse_age_rejects(text: object) -> None:
    with pytest.raises(ConfigError, match="--older-than"):
        parse_age(text, "--older-than")
