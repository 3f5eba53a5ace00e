"""The content digest: its definition checked against a slow per-row reference, its invariances and what breaks it.

The reference below is written from docs/layout.md ("The digest, exactly") with plain Python ints,
struct and xxhash, one value at a time; the library's version is vectorised NumPy.
"""

from __future__ import annotations

import decimal
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from _typesdata import all_types_table, parquet_types_table

from detload._layout.digest import Digest, column_seed, digest, hash_values
from detload.errors import DatasetError, EmptyDatasetError, OptionError, UnsupportedTypeError

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
LANE2 = 0xD6E8FEB86659FD93


# -- the reference: one value at a time -------------------------------------------------------------------

def mix(v: int) -> int:
    v &= MASK
    v ^= v >> 30
    v = (v * 0xBF58476D1CE4E5B9) & MASK
    v ^= v >> 27
    v = (v * 0x94D049BB133111EB) & MASK
    return v ^ (v >> 31)


def label_seed(label: bytes, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(label, seed=seed)


def null_hash(seed: int) -> int:
    return label_seed(b"null", seed)


def sequence(items: list[int], length: int, seed: int) -> int:
    s = 0
    for j, x in enumerate(items):
        s += x * (mix(seed + GOLDEN * (j + 1)) | 1)
    return mix((s & MASK) ^ mix(length ^ seed))


def bytes_hash(b: bytes, seed: int) -> int:
    item_seed = label_seed(b"[]", seed)
    words = [int.from_bytes(b[i : i + 8].ljust(8, b"\0"), "little") for i in range(0, len(b), 8)]
    return sequence([mix(w ^ item_seed) for w in words], len(b), seed)


def word_hash(w: int, seed: int) -> int:
    return mix((w & MASK) ^ seed)


def ref_hash(arr: pa.Array, i: int, seed: int) -> int:
    """The hash of value i of ``arr``, from the definition."""
    t = arr.type
    if isinstance(t, pa.BaseExtensionType):
        return ref_hash(arr.storage, i, seed)
    sc = arr[i]
    if not sc.is_valid:
        return null_hash(seed)
    if pa.types.is_dictionary(t):
        return ref_hash(arr.dictionary, sc.index.as_py(), seed)
    if pa.types.is_boolean(t):
        return word_hash(int(sc.as_py()), seed)
    if pa.types.is_integer(t):
        return word_hash(sc.as_py(), seed)
    if pa.types.is_floating(t):
        fmt, ufmt = {16: ("<e", "<H"), 32: ("<f", "<I"), 64: ("<d", "<Q")}[t.bit_width]
        if t.bit_width == 64:  # Python floats are doubles: the bits, NaN payloads included, survive
            return word_hash(struct.unpack(ufmt, struct.pack(fmt, sc.as_py()))[0], seed)
        raw = arr.view(pa.uint16() if t.bit_width == 16 else pa.uint32())[i].as_py()
        return word_hash(raw, seed)
    if pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return word_hash(sc.cast(pa.int32() if t.bit_width == 32 else pa.int64()).as_py(), seed)
    if pa.types.is_decimal(t):
        unscaled = int(sc.as_py().scaleb(t.scale, context=decimal.Context(prec=100)))
        return bytes_hash(unscaled.to_bytes(t.byte_width, "little", signed=True), seed)
    if pa.types.is_interval(t):
        v = sc.as_py()
        return bytes_hash(struct.pack("<iiq", v.months, v.days, v.nanoseconds), seed)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return bytes_hash(sc.as_py().encode("utf-8"), seed)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return bytes_hash(sc.as_py(), seed)
    item_seed = label_seed(b"[]", seed)
    if pa.types.is_map(t):
        entries = sc.values
        key_seed, value_seed = label_seed(b"key", item_seed), label_seed(b"value", item_seed)
        items = [mix(ref_hash(entries.field(0), j, key_seed) + ref_hash(entries.field(1), j, value_seed))
                 for j in range(len(entries))]
        return sequence(items, len(entries), seed)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        values = sc.values
        return sequence([ref_hash(values, j, item_seed) for j in range(len(values))], len(values), seed)
    if pa.types.is_struct(t):
        total = sum(ref_hash(arr.field(f), i, label_seed(t.field(f).name.encode(), seed)) for f in range(t.num_fields))
        return mix(total)
    raise AssertionError(f"no reference for {t}")


def ref_digest(table: pa.Table) -> Digest:
    cols = [(table.column(name).combine_chunks(), xxhash.xxh3_64_intdigest(name.encode("utf-8")))
            for name in table.column_names]
    lane1 = lane2 = 0
    for i in range(table.num_rows):
        r = mix(sum(ref_hash(col, i, seed) for col, seed in cols))
        lane1 += r
        lane2 += mix(r ^ LANE2)
    return Digest(table.num_rows, f"{lane1 & MASK:016x}{lane2 & MASK:016x}")


# -- the definition ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [all_types_table, parquet_types_table], ids=["memory", "from-parquet"])
def test_every_type_matches_the_reference(make):
    table = make()
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        seed = column_seed(name)
        got = hash_values(col, seed)
        want = [ref_hash(col, i, seed) for i in range(len(col))]
        assert got.tolist() == want, name
        # Slices keep their offsets into the parent's buffers: hash them from there.
        part = col.slice(3, 7)
        assert hash_values(part, seed).tolist() == want[3:10], f"{name} (sliced)"
    assert digest(table) == ref_digest(table)


@pytest.mark.parametrize("max_len", [3, 9, 70, 300])
def test_short_long_and_sparse_sequences_match_the_reference(max_len):
    # Short strings are hashed a word position at a time, long or sparse ones word by word: both agree.
    rng = np.random.default_rng(max_len)
    lengths = rng.integers(0, max_len, 50)
    lengths[rng.random(50) < 0.5] = 0
    strings = ["".join(chr(97 + int(c)) for c in rng.integers(0, 26, n)) for n in lengths]
    lists = [list(map(int, rng.integers(-5, 5, n))) for n in lengths]
    table = pa.table({"s": pa.array(strings), "l": pa.array(lists, pa.list_(pa.int64())),
                      "b": pa.array([x.encode() for x in strings], pa.large_binary())})
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        seed = column_seed(name)
        assert hash_values(col, seed).tolist() == [ref_hash(col, i, seed) for i in range(len(col))], name
    assert digest(table) == ref_digest(table)


def test_dictionary_encoded_string_chunks_are_read_as_dictionaries(tmp_path):
    from detload._layout.digest import _dictionary_columns

    n = 20_000
    rng = np.random.default_rng(0)
    table = pa.table({"few": pa.array(rng.choice(["a", "bb", None, "ccc"], n)),
                      "many": pa.array([f"unique-{i:08d}" for i in range(n)]),
                      "b": pa.array(rng.choice([b"x", b"yy"], n), pa.binary())})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=5_000, dictionary_pagesize_limit=4096)
    md = pq.read_metadata(tmp_path / "t.parquet")
    # "many" overflows its dictionary page and falls back to plain pages: read it as plain strings.
    assert _dictionary_columns(md, 0, None) == ["few", "b"]
    assert _dictionary_columns(md, 0, ["b"]) == ["b"]
    assert digest(str(tmp_path / "t.parquet")) == digest(table)


def test_column_seed_is_xxh3_of_the_name():
    assert column_seed("market") == xxhash.xxh3_64_intdigest(b"market")


def test_a_union_is_refused_by_name():
    arr = pa.UnionArray.from_sparse(pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["a", "b"])])
    with pytest.raises(UnsupportedTypeError, match=r"no rule for the Arrow type sparse_union.*unions cannot be stored"):
        digest(pa.table({"u": arr}))


# -- invariances ---------------------------------------------------------------------------------------------

def _write(table: pa.Table, root: str, parts: list[slice], row_group_size: int) -> str:
    os.makedirs(root)
    for i, sl in enumerate(parts):
        pq.write_table(table.slice(sl.start, sl.stop - sl.start), os.path.join(root, f"part-{i}.parquet"),
                       row_group_size=row_group_size)
    return root


def test_row_order_file_split_and_row_groups_do_not_change_the_digest(tmp_path):
    table = parquet_types_table(40)
    base = digest(table)
    assert base.rows == 40
    perm = np.random.default_rng(3).permutation(40)
    assert digest(table.take(perm)) == base
    one = _write(table, str(tmp_path / "one"), [slice(0, 40)], row_group_size=40)
    assert digest(one) == base
    split = _write(table.take(perm), str(tmp_path / "split"), [slice(0, 7), slice(7, 30), slice(30, 40)],
                   row_group_size=3)
    assert [pq.ParquetFile(os.path.join(split, f)).num_row_groups for f in sorted(os.listdir(split))] == [3, 8, 4]
    assert digest(split) == base
    assert digest(split, threads=1) == base
    # Columns are found by name, in any order.
    assert digest(table.select(list(reversed(table.column_names)))) == base


def test_storage_widths_and_encodings_do_not_change_the_digest():
    ints = pa.table({"x": pa.array([1, -2, None], pa.int32())})
    assert digest(ints) == digest(pa.table({"x": pa.array([1, -2, None], pa.int64())}))
    strs = pa.table({"s": pa.array(["a", None, "bc"])})
    assert digest(strs) == digest(pa.table({"s": pa.array(["a", None, "bc"], pa.large_string())}))
    assert digest(strs) == digest(pa.table({"s": pa.array(["a", None, "bc"]).dictionary_encode()}))
    assert digest(strs) == digest(pa.table({"s": pa.array(["a", None, "bc"], pa.string_view())}))


def test_hive_partition_columns_count_typed_as_detload_types_them(tmp_path):
    rows = pa.table({"v": pa.array([1, 2, 3, 4])})
    for day, market, sl in (("20260101", "US", slice(0, 2)), ("20260102", "FR", slice(2, 4))):
        folder = tmp_path / "ds" / f"day={day}" / f"market={market}"
        folder.mkdir(parents=True)
        pq.write_table(rows.slice(sl.start, 2), folder / "part.parquet")
    flat = pa.table({"v": [1, 2, 3, 4], "day": pa.array([20260101] * 2 + [20260102] * 2, pa.int64()),
                     "market": ["US", "US", "FR", "FR"]})
    assert digest(str(tmp_path / "ds")) == digest(flat)
    # The same values typed as strings (one key not an integer) give another digest.
    as_text = flat.set_column(1, "day", pa.array(["20260101"] * 2 + ["20260102"] * 2))
    assert digest(as_text) != digest(flat)
    # A digest of partition columns alone reads only footers.
    assert digest(str(tmp_path / "ds"), columns=["market"]) == digest(flat.select(["market"]))


# -- what changes the digest ---------------------------------------------------------------------------------

def _replace(table: pa.Table, name: str, row: int, value: object) -> pa.Table:
    col = table.column(name).combine_chunks()
    values = col.to_pylist()
    values[row] = value
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values, col.type))


@pytest.mark.parametrize("name,value", [
    ("i64", 12345), ("u64", 3), ("f64", 2.5), ("s", "changed"), ("bin", b"\x01"), ("li", [9]),
    ("st", {"a": 7, "b": "x"}), ("mp", [("k", 2)]), ("d32", 3), ("dec", decimal.Decimal("1.24")),
    ("fsl", [2.0, 1.0]), ("nested", [[2, 1], None]),
])
def test_one_changed_value_changes_the_digest(name, value):
    table = all_types_table()
    assert digest(_replace(table, name, 0, value)) != digest(table)


def test_a_lost_or_duplicated_row_changes_the_digest():
    table = all_types_table()
    base = digest(table)
    dropped = table.slice(1)
    assert digest(dropped) != base and digest(dropped).rows == table.num_rows - 1
    duplicated = pa.concat_tables([table, table.slice(4, 1)])
    assert digest(duplicated) != base
    # Dropping one row and duplicating another keeps the count, not the digest.
    swapped = pa.concat_tables([table.slice(1), table.slice(4, 1)])
    assert digest(swapped).rows == base.rows and digest(swapped) != base


@pytest.mark.parametrize("name,value", [
    ("i64", 0), ("s", ""), ("bin", b""), ("li", []), ("st", {"a": None, "b": None}), ("f64", float("nan")),
    ("b", False), ("mp", []),
])
def test_a_null_differs_from_every_value(name, value):
    table = all_types_table()
    as_value = _replace(table, name, 0, value)
    as_null = _replace(table, name, 0, None)
    assert digest(as_value) != digest(as_null)


def test_a_swap_between_two_columns_changes_the_digest():
    t = pa.table({"a": pa.array([1, 2, 3]), "b": pa.array([4, 5, 6])})
    renamed = pa.table({"a": t["b"], "b": t["a"]})
    assert digest(renamed) != digest(t)
    one_row = pa.table({"a": [4, 2, 3], "b": [1, 5, 6]})
    assert digest(one_row) != digest(t)
    # Rows keep their columns together: exchanging one column's values between rows is a change.
    crossed = pa.table({"a": [2, 1, 3], "b": [4, 5, 6]})
    assert digest(crossed) != digest(t)


def test_floats_are_hashed_by_their_bits():
    def d(values: list[float]) -> Digest:
        return digest(pa.table({"f": pa.array(np.array(values, np.float64))}))

    assert d([0.0]) != d([-0.0])
    payload = np.array([np.nan]).view(np.uint64) | np.uint64(1)
    assert d([float("nan")]) != d([float(payload.view(np.float64)[0])])
    assert d([float("nan")]) == d([float("nan")])


def test_columns_limits_the_digest_to_those_columns(tmp_path):
    table = parquet_types_table()
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=5)
    path = str(tmp_path / "t.parquet")
    assert digest(path, columns=["s", "k"]) == digest(table.select(["k", "s"])) != digest(table)
    with pytest.raises(DatasetError, match=r"unknown column\(s\) \['nope'\] for the digest; .* has \['k', 'g', "):
        digest(path, columns=["nope"])
    with pytest.raises(OptionError, match="columns must be a list of names, got the string 'k'"):
        digest(path, columns="k")


def test_an_empty_folder_dataset_is_refused(tmp_path):
    pq.write_table(pa.table({"x": pa.array([], pa.int64())}), tmp_path / "empty.parquet")
    with pytest.raises(EmptyDatasetError, match="has no rows"):
        digest(str(tmp_path))
