"""The unit trailer shared by sealed segments and S3 objects, and the storage keys of lifeboat.yaml."""

from __future__ import annotations

import pytest

from lifeboat_cache.records.trailer import FOOTER_SIZE, build_trailer, parse_trailer, trailer_size

ENTRIES = [(bytes(range(16)), 0, 100, 200), (bytes(range(16, 32)), 100, 50, 50)]


def unit() -> bytes:
    return b"x" * 150 + build_trailer(150, ENTRIES)


def test_trailer_round_trip_from_exactly_the_tail() -> None:
    blob = unit()
    assert len(blob) == 150 + trailer_size(2)
    arr = parse_trailer(blob[-trailer_size(2):], len(blob))  # what the S3 tier fetches
    assert arr is not None and arr["offset"].tolist() == [0, 100] and arr["length"].tolist() == [100, 50]
    assert arr["raw_length"].tolist() == [200, 50]
    assert parse_trailer(blob, len(blob)) is not None  # a longer tail works too


@pytest.mark.parametrize("damage", ["table", "footer", "size", "short"])
def test_a_damaged_trailer_is_never_half_trusted(damage: str) -> None:
    blob = bytearray(unit())
    size = len(blob)
    if damage == "table":
        blob[150 + 10] ^= 1
    elif damage == "footer":
        blob[-FOOTER_SIZE + 6] ^= 1
    elif damage == "size":
        size += 1  # the object is longer than its footer says: not ours, or rewritten
    else:
        blob = blob[-FOOTER_SIZE:]
    assert parse_trailer(bytes(blob), size) is None


def test_records_past_the_table_are_rejected() -> None:
    blob = b"x" * 150 + build_trailer(150, [(bytes(16), 100, 80, 80)])  # 100 + 80 > 150
    assert parse_trailer(blob, len(blob)) is None


