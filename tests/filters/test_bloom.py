"""Bloom filters: the header reader, the split-block probe, and pruning with files pyarrow writes.

The property that matters is "no false negatives": a value stored in a row
group must never make its bloom filter say "absent". The probe is checked
against a direct transcription of the Parquet specification, and against
pyarrow-written filters for every type `check_bloom_type` accepts.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import re
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detload._filters.bloom import SALT, BloomReader, check_bloom_type, parse_bloom_header, split_block_contains
from detload._filters.canonical import parse_filter, row_group_stats
from detload.errors import OptionError

f = pc.field
MANY = settings(max_examples=settings().max_examples * 5)


# -- the header ------------------------------------------------------------------------

def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def zigzag(n: int) -> bytes:
    return varint((n << 1) ^ (n >> 63))


def header(num_bytes: int = 64, *, algorithm: int = 1, hash_: int = 1, compression: int = 1, extra: bytes = b"") -> bytes:
    """A BloomFilterHeader in the compact protocol: numBytes, then three unions of one empty struct."""
    union = lambda member: bytes([(member << 4) | 12, 0, 0])  # noqa: E731 - field `member`: empty struct; stop
    return (
        bytes([0x15]) + zigzag(num_bytes)            # field 1, i32
        + bytes([0x1C]) + union(algorithm)           # field 2, struct
        + bytes([0x1C]) + union(hash_)               # field 3, struct
        + bytes([0x1C]) + union(compression)         # field 4, struct
        + extra + b"\x00"
    )


def test_header_is_read_and_unknown_fields_skipped():
    assert parse_bloom_header(header(64)) == (64, len(header(64)))
    # a writer may add fields: an i64, a binary, a list of i32 and a nested struct, all skipped
    extra = bytes([0x16]) + zigzag(-7) + bytes([0x18]) + varint(3) + b"abc" + bytes([0x19, 0x35]) + zigzag(1) + zigzag(2) + zigzag(3) + bytes([0x1C, 0x11, 0])
    data = header(2048, extra=extra) + b"bits"
    assert parse_bloom_header(data) == (2048, len(data) - 4)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (header(48), "not a positive multiple of 32"),
        (header(0), "not a positive multiple of 32"),
        (header(64, algorithm=2), "not algorithm BLOCK"),
        (header(64, hash_=2), "not hash XXHASH"),
        (header(64, compression=3), "not compression UNCOMPRESSED"),
        (header(64)[:5], "truncated"),
        (b"\x1f", "unknown compact type 15"),
    ],
)
def test_header_that_is_not_a_split_block_filter_is_refused(data, message):
    with pytest.raises(ValueError, match=message):
        parse_bloom_header(data)


# -- the probe ---------------------------------------------------------------------------

def spec_insert(bitset: np.ndarray, h: int) -> None:
    """The Parquet specification's insert, written out bit by bit."""
    block = ((h >> 32) * bitset.shape[0]) >> 32
    key = h & 0xFFFFFFFF
    for i in range(8):
        bitset[block, i] |= np.uint32(1 << (((key * int(SALT[i])) & 0xFFFFFFFF) >> 27))


def spec_check(bitset: np.ndarray, h: int) -> bool:
    block = ((h >> 32) * bitset.shape[0]) >> 32
    key = h & 0xFFFFFFFF
    return all(int(bitset[block, i]) >> (((key * int(SALT[i])) & 0xFFFFFFFF) >> 27) & 1 for i in range(8))


@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=50), st.lists(st.integers(0, 2**64 - 1), max_size=50), st.sampled_from([1, 2, 7, 64]))
def test_probe_matches_the_specification(inserted, others, blocks):
    bitset = np.zeros((blocks, 8), dtype=np.uint32)
    for h in inserted:
        spec_insert(bitset, h)
    assert split_block_contains(bitset, np.array(inserted, dtype=np.uint64)).all()
    if others:
        got = split_block_contains(bitset, np.array(others, dtype=np.uint64)).tolist()
        assert got == [spec_check(bitset, h) for h in others]


# -- files pyarrow writes -------------------------------------------------------------------

def _day(k: int) -> dt.date:
    return dt.date(2026, 1, 1) + dt.timedelta(days=k)


def _ts(k: int, tz: dt.tzinfo | None = None) -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=tz) + dt.timedelta(microseconds=k * 1000)


BIG = 700_000  # days: years 0053 to 3942 stay inside datetime.date
_D = decimal.Context(prec=60)
TYPES = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int16": (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "uint8": (pa.uint8(), st.integers(0, 255)),
    "uint32": (pa.uint32(), st.integers(0, 2**32 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "float32": (pa.float32(), st.sampled_from([0.0, -0.0, 1.5, -2.25, float("inf"), 3.0e38, 1e-40])),
    "float64": (pa.float64(), st.floats(allow_nan=False)),
    "string": (pa.string(), st.text(max_size=6)),
    "large_string": (pa.large_string(), st.text(max_size=6)),
    "dictionary": (pa.dictionary(pa.int32(), pa.string()), st.sampled_from(["a", "b", "é", ""])),
    "binary": (pa.binary(), st.binary(max_size=6)),
    "fixed_size_binary": (pa.binary(3), st.binary(min_size=3, max_size=3)),
    "date32": (pa.date32(), st.integers(-BIG, BIG).map(_day)),
    "date64": (pa.date64(), st.integers(-BIG, BIG).map(_day)),
    "timestamp_s": (pa.timestamp("s"), st.integers(-BIG, BIG).map(lambda k: _ts(k * 1000))),
    "timestamp_ms_utc": (pa.timestamp("ms", "UTC"), st.integers(-BIG, BIG).map(lambda k: _ts(k, dt.timezone.utc))),
    "timestamp_us": (pa.timestamp("us"), st.integers(-BIG, BIG).map(_ts)),
    "timestamp_ns": (pa.timestamp("ns", "Europe/Paris"), st.integers(-BIG, BIG).map(lambda k: _ts(k, dt.timezone.utc))),
    "decimal128": (pa.decimal128(9, 2), st.integers(-(10**9) + 1, 10**9 - 1).map(lambda u: decimal.Decimal(u).scaleb(-2, _D))),
    "decimal256": (pa.decimal256(40, 3), st.integers(-(10**40) + 1, 10**40 - 1).map(lambda u: decimal.Decimal(u).scaleb(-3, _D))),
}


def _write(path, column: str, t: pa.DataType, values: list, *, row_group_size: int, **options) -> pq.FileMetaData:
    arr = pa.array(values, t.value_type if pa.types.is_dictionary(t) else t)
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_encode()
    table = pa.table({column: arr, "n": pa.array(range(len(values)), pa.int64())})
    pq.write_table(table, path, row_group_size=row_group_size, bloom_filter_options={column: {"ndv": 64, "fpp": 0.01}}, **options)
    return pq.read_metadata(path)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_check_bloom_type_accepts_every_type_probed_here(name):
    check_bloom_type(TYPES[name][0])


@pytest.mark.parametrize(
    "t", [pa.bool_(), pa.float16(), pa.list_(pa.int64()), pa.struct([("a", pa.int64())]), pa.time32("s"), pa.duration("s"), pa.null()]
)
def test_bloom_filter_on_an_unsupported_type_is_refused(t):
    with pytest.raises(OptionError, match=rf"a bloom filter was requested on column 'c' of type {re.escape(str(t))}; .*drop the column"):
        check_bloom_type(t, column="c")
    with pytest.raises(OptionError, match=r"detload probes bloom filters on integer, float32, float64, string, binary"):
        check_bloom_type(t)


@MANY
@given(st.sampled_from(sorted(TYPES)), st.data(), st.booleans())
def test_no_false_negatives(name, data, as_integer):
    """Every stored value survives its row group's bloom filter, alone and within an isin."""
    t, values = TYPES[name]
    rows = data.draw(st.lists(values, min_size=1, max_size=60))
    probes = data.draw(st.lists(values, max_size=5))
    rg = data.draw(st.integers(1, 20))
    with tempfile.TemporaryDirectory() as root:
        path = f"{root}/b.parquet"
        md = _write(path, "c", t, rows, row_group_size=rg, store_decimal_as_integer=as_integer)
        schema = pq.read_schema(path)
        with BloomReader(path, md) as reader:
            start = 0
            for g in range(md.num_row_groups):
                n = md.row_group(g).num_rows
                stored = rows[start:start + n]
                start += n
                assert reader.has_filter(g, "c"), name
                vt = t.value_type if pa.types.is_dictionary(t) else t
                for v in [*stored[:5], *probes]:
                    # A typed scalar: a Python int above 2**63 - 1 (uint64) has no default Arrow type.
                    flt = parse_filter(f("c") == pa.scalar(v, vt), schema)
                    # no statistics: only the bloom filter can say "none"
                    verdict = flt.prune({}, {}, n, bloom=reader.probe(g))
                    in_group = any(v == s for s in stored)
                    assert verdict != "none" or not in_group, (name, v, stored)
                    value_set = pa.array([*probes, v], vt)
                    isin = parse_filter(f("c").isin(value_set), schema)
                    assert isin.prune({}, {}, n, bloom=reader.probe(g)) != "none" or not in_group


def test_zero_and_negative_zero_are_both_found(tmp_path):
    md = _write(tmp_path / "z.parquet", "c", pa.float64(), [-0.0, 1.0], row_group_size=10)
    schema = pq.read_schema(tmp_path / "z.parquet")
    with BloomReader(tmp_path / "z.parquet", md) as reader:
        assert parse_filter(f("c") == 0.0, schema).prune({}, {}, 2, bloom=reader.probe(0)) == "some"
        assert parse_filter(f("c") == 2.0, schema).prune({}, {}, 2, bloom=reader.probe(0)) == "none"


@pytest.mark.parametrize("as_integer", [False, True])
def test_absent_values_prune_most_row_groups(tmp_path, as_integer):
    rng = np.random.default_rng(0)
    n_groups = 200
    ints = rng.integers(0, 10**9, size=n_groups * 50) * 2  # even numbers only: odd ones are absent
    path = tmp_path / "absent.parquet"
    table = pa.table({
        "k": ints,
        "s": pa.array([f"user-{v}" for v in ints]),
        "d": pa.array(ints % 10**6, pa.int64()).cast(pa.int32()).cast(pa.date32()),
        "p": pa.array([decimal.Decimal(int(v)).scaleb(-2) for v in ints], pa.decimal128(12, 2)),
    })
    pq.write_table(
        table, path, row_group_size=50, store_decimal_as_integer=as_integer,
        bloom_filter_options={c: {"ndv": 50, "fpp": 0.01} for c in table.column_names},
    )
    md = pq.read_metadata(path)
    schema = table.schema
    absent = [
        # absent values inside most row groups' [min, max], so that only the bloom filter can tell
        f("k") == 10**9 + 1, f("s") == "user-5000000001", f("k").isin([10**9 + 1, 10**9 + 3]), f("s").isin(["user-5", "user-7"]),
        f("d") == dt.date(1970, 1, 1) + dt.timedelta(days=2 * 10**5 + 1),
        f("p") == decimal.Decimal(10**9 + 1).scaleb(-2),
    ]
    with BloomReader(path, md) as reader:
        for expr in absent:
            flt = parse_filter(expr, schema)
            by_stats = by_bloom = 0
            for g in range(md.num_row_groups):
                stats = row_group_stats(md.row_group(g), schema)
                by_stats += flt.prune(stats, {}, 50) == "none"
                by_bloom += flt.prune(stats, {}, 50, bloom=reader.probe(g)) == "none"
            assert by_stats < n_groups // 10, expr  # the values are spread: min/max rarely help
            assert by_bloom >= n_groups * 0.9, (expr, by_bloom)
        present = int(ints[1234])
        flt = parse_filter(f("k") == present, schema)
        g = 1234 // 50
        assert flt.prune(row_group_stats(md.row_group(g), schema), {}, 50, bloom=reader.probe(g)) == "some"


def test_file_without_filters_or_with_an_unprobed_type_may_contain_anything(tmp_path):
    t = pa.table({"a": [1, 2], "h": pa.array([1, 2], pa.float16())})
    pq.write_table(t, tmp_path / "none.parquet")
    pq.write_table(t, tmp_path / "h.parquet", bloom_filter_options={"h": True})
    for name in ("none.parquet", "h.parquet"):
        md = pq.read_metadata(tmp_path / name)
        with BloomReader(tmp_path / name, md) as reader:
            assert not reader.has_filter(0, "a") and not reader.has_filter(0, "h")
            assert reader.might_contain(0, "a", [5])
            assert reader.might_contain(0, "h", [5.0])
            assert reader.might_contain(0, "nope", [5])
            assert not reader.might_contain(0, "a", [])


def test_an_unreadable_filter_may_contain_anything_and_says_why(tmp_path):
    md = _write(tmp_path / "ok.parquet", "c", pa.int64(), [1, 2, 3], row_group_size=10)
    offset = md.row_group(0).column(0).bloom_filter_offset
    shutil.copy(tmp_path / "ok.parquet", tmp_path / "bad.parquet")
    with open(tmp_path / "bad.parquet", "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\x15\x06")  # numBytes = 3: not a multiple of 32
    with BloomReader(tmp_path / "bad.parquet", md) as reader:
        assert reader.might_contain(0, "c", [99])
        assert "numBytes 3 is not a positive multiple of 32" in reader.skipped[(0, "c")]
        assert f"offset {offset}" in reader.skipped[(0, "c")]
    with BloomReader(tmp_path / "ok.parquet", md) as reader:
        assert not reader.might_contain(0, "c", [99]) and reader.might_contain(0, "c", [2])


class CountingFile(io.BytesIO):
    reads = 0

    def read(self, n=-1):  # type: ignore[override]
        CountingFile.reads += 1
        return super().read(n)


def test_each_filter_is_read_once_from_any_source(tmp_path):
    path = tmp_path / "c.parquet"
    md = _write(path, "c", pa.string(), ["a", "b", "c", "d"], row_group_size=2)
    fh = CountingFile(path.read_bytes())
    reader = BloomReader(fh, md)
    for _ in range(3):
        assert reader.might_contain(0, "c", [b"a"]) and reader.might_contain(1, "c", [b"d"])
        assert not reader.might_contain(0, "c", [b"d", b"zz"])
        assert reader.might_contain(0, "c", ["a"]) and not reader.might_contain(0, "c", ["d"])
    assert CountingFile.reads == 2  # one per column chunk (the footer records the lengths)
    reader.close()
    assert not fh.closed  # a file the caller opened stays open
    with BloomReader(str(path), md, filesystem=pafs.LocalFileSystem()) as reader:
        assert reader.might_contain(1, "c", [b"c"]) and not reader.might_contain(1, "c", [b"a"])
