"""Buckets, mode tables and the control word: exact round trips and clear errors."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gatherwise.modes import (
    IMPLEMENTED,
    NUM_BUCKETS,
    ControlWord,
    Mode,
    ModeTable,
    bucket_from_upper_bound,
    bucket_label,
    bucket_of,
    parse_buckets,
)

tables = st.lists(st.sampled_from(IMPLEMENTED), min_size=NUM_BUCKETS, max_size=NUM_BUCKETS).map(
    lambda modes: ModeTable(tuple(modes))
)


@pytest.mark.parametrize(("rows", "bucket"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (64, 6),
                                               (1 << 15, 15), (10**9, 15)])
def test_bucket_of_is_ceil_log2_clamped(rows, bucket):
    assert bucket_of(rows) == bucket


def test_bucket_labels_are_upper_bounds_and_invert():
    assert [bucket_label(b) for b in range(4)] == ["1", "2", "4", "8"]
    for b in range(NUM_BUCKETS):
        assert bucket_from_upper_bound(int(bucket_label(b))) == b
        assert bucket_of(int(bucket_label(b))) == b


@pytest.mark.parametrize("bad", [0, 3, 6, -4, 1 << 16])
def test_bucket_from_upper_bound_rejects_non_buckets(bad):
    with pytest.raises(ValueError, match="bucket"):
        bucket_from_upper_bound(bad)


def test_rows_must_be_positive():
    with pytest.raises(ValueError, match="rows must be >= 1"):
        bucket_of(0)


@given(tables)
def test_table_encode_decode_round_trip(table):
    assert ModeTable.decode(table.encode()) == table
    assert ModeTable.from_labels(table.as_labels()) == table


@given(tables, st.integers(0, (1 << 24) - 1), st.integers(0, 15))
def test_control_word_round_trip_through_signed_int64(table, epoch, reserved):
    word = ControlWord(table, epoch)
    assert ControlWord.unpack(word.pack() | reserved << 56) == word  # reserved bits: ignored on read
    signed = word.pack_signed()
    assert -(1 << 63) <= signed < (1 << 63)
    assert ControlWord.unpack(signed) == word
    assert ControlWord.unpack(word.pack()) == word


def test_control_word_rejects_wrong_version():
    word = ControlWord(ModeTable.uniform(Mode.GATHER)).pack() & ~(0xF << 60)
    with pytest.raises(ValueError, match="version"):
        ControlWord.unpack(word)


def test_sharded_is_a_mode_and_unknown_modes_are_rejected():
    assert Mode.parse("sharded") == Mode.SHARDED == 2
    assert Mode.SHARDED in IMPLEMENTED
    table = ModeTable.decode(0b10_01_00)  # buckets 0, 1, 2 = all_gather, gather, sharded
    assert table.modes[:3] == (Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED)
    assert ModeTable.decode(table.encode()) == table
    assert table.as_labels()["4"] == "sharded"
    assert ModeTable.from_labels({"4": "sharded"}).modes[2] == Mode.SHARDED
    assert ControlWord.unpack(ControlWord(table, 7).pack()).table == table
    assert str(table).startswith("1:A 2:G 4:S 8:A")
    with pytest.raises(ValueError, match="unknown mode"):
        Mode.parse("scatter")
    with pytest.raises(ValueError, match="mode code 3 is not a mode"):
        ModeTable.decode(0b11)  # bucket 0 = code 3
    with pytest.raises(ValueError, match="16 buckets"):
        ModeTable((Mode.GATHER,) * 3)


def test_with_buckets_changes_only_those_buckets():
    table = ModeTable.uniform(Mode.ALL_GATHER).with_buckets(Mode.GATHER, parse_buckets([4, 8]))
    assert [table.mode_for_rows(r) for r in (1, 2, 3, 4, 5, 8, 9)] == [
        Mode.ALL_GATHER, Mode.ALL_GATHER, Mode.GATHER, Mode.GATHER, Mode.GATHER, Mode.GATHER, Mode.ALL_GATHER]
    with pytest.raises(ValueError):
        table.with_buckets(Mode.GATHER, [16])
