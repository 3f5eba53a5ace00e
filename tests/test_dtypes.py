"""Type mapping: every column's NumPy type is decided by its Arrow type alone, identical in every batch.

Covers nulls in integer columns (error or null_fill), nullable columns without
nulls, dictionaries, timestamps, dates, fixed-size and variable-length lists,
strings, decimals, column order and Hive partition columns, and the empty
batches a distributed run can yield.
"""

from __future__ import annotations

import decimal
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import detload
from detload import DataError, Loader, Ragged, UnsupportedTypeError


def write(path, tables: list[pa.Table], schema: pa.Schema | None = None) -> None:
    """One row group per table."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    schema = schema or tables[0].schema
    with pq.ParquetWriter(path, schema) as w:
        for t in tables:
            w.write_table(t.cast(schema), row_group_size=max(len(t), 1))


def collect(loader: Loader) -> list[dict]:
    return [dict(b) for b in loader]


def dtype_of(col) -> tuple:
    if isinstance(col, Ragged):
        return ("ragged", col.kind, col.values.dtype, col.offsets.dtype, col.values.ndim)
    return ("array", col.dtype, col.shape[1:])


# -- integers with nulls -------------------------------------------------------------

def _int_null_dataset(root) -> dict[int, int | None]:
    """Three files of 2 row groups (10 rows each); 'ni' has nulls only in b.parquet row group 1.

    Returns {id: ni value} (None for a null).
    """
    truth: dict[int, int | None] = {}
    schema = pa.schema([("id", pa.int64()), ("ni", pa.int64()), ("nn", pa.int64())])
    for f, name in enumerate(["a.parquet", "b.parquet", "c.parquet"]):
        tables = []
        for g in range(2):
            ids = np.arange(10) + 100 * f + 10 * g
            vals = [None if (name == "b.parquet" and g == 1 and i % 3 == 0) else int(i) * 2 for i in ids]
            truth.update(zip(ids.tolist(), vals))
            tables.append(pa.table({"id": ids, "ni": pa.array(vals, pa.int64()), "nn": ids * 5}, schema=schema))
        write(os.path.join(root, name), tables)
    return truth


def test_int_nulls_with_fill_stay_int64(tmp_path, pool):
    truth = _int_null_dataset(tmp_path)
    with Loader(str(tmp_path), batch_size=7, seed=3, workers=2, pool=pool, null_fill={"ni": -1}) as loader:
        batches = collect(loader)
    assert len(batches) == 9
    seen = 0
    for b in batches:
        assert b["ni"].dtype == np.int64 and b["nn"].dtype == np.int64 and b["id"].dtype == np.int64
        for i, v in zip(b["id"].tolist(), b["ni"].tolist()):
            assert v == (-1 if truth[i] is None else truth[i])
            seen += truth[i] is None
    assert seen == 3  # ids 111, 114, 117


@pytest.mark.parametrize("shuffle", [False, True])
def test_int_nulls_without_fill_raise_at_the_first_batch_that_needs_them(tmp_path, pool, shuffle):
    _int_null_dataset(tmp_path)
    with Loader(str(tmp_path), batch_size=5, seed=4, workers=3, pool=pool, shuffle=shuffle,
                order="windowed", shuffle_window=1) as loader:
        plan = loader.plan()
        # the bad unit is b.parquet row group 1: unit 3 in canonical order
        block = next(b for b in plan.blocks[0] if 3 in b.sources)
        delivered = []
        with pytest.raises(DataError, match=r"column 'ni' in b\.parquet row group 1 holds 3 null") as info:
            for batch in loader:
                delivered.append(batch["id"].copy())
        assert "null_fill" in str(info.value)
        # every batch before the block with the nulls was delivered, intact
        assert len(delivered) == block.first_step
        if not shuffle:
            assert block.first_step == 6
            np.testing.assert_array_equal(np.concatenate(delivered), np.r_[0:20, 100:110])


def test_null_fill_on_the_command_line(tmp_path, capsys):
    from detload import read_manifest
    from detload.cli import main

    _int_null_dataset(tmp_path / "d")
    args = ["run", str(tmp_path / "d"), "--batch-size", "7", "--seed", "3"]
    assert main([*args, "--manifest", str(tmp_path / "bad.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "holds 3 null(s)" in err and "(on the command line: --null-fill ni=VALUE)" in err
    assert main([*args, "--null-fill", "ni=-1", "--manifest", str(tmp_path / "m.jsonl")]) == 0
    # The same order as the Python API with null_fill={"ni": -1}.
    with Loader(str(tmp_path / "d"), batch_size=7, seed=3, null_fill={"ni": -1},
                manifest=str(tmp_path / "api.jsonl")) as loader:
        collect(loader)
    assert main(["verify", str(tmp_path / "m.jsonl"), str(tmp_path / "api.jsonl")]) == 0
    assert read_manifest(str(tmp_path / "m.jsonl")).header["order"]["null_fill"] == {"ni": -1}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*args, "--null-fill", "ni", "--manifest", str(tmp_path / "x.jsonl")])
    assert "expected COLUMN=VALUE, got 'ni'" in capsys.readouterr().err


def test_nullable_column_without_nulls_is_int64(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("n", pa.int64(), nullable=True),
                        pa.field("b", pa.bool_(), nullable=True)])
    t = pa.table({"id": np.arange(20), "n": np.arange(20) * 2, "b": np.arange(20) % 2 == 0}, schema=schema)
    write(str(tmp_path / "x.parquet"), [t.slice(0, 8), t.slice(8, 12)])
    with Loader(str(tmp_path), batch_size=6, seed=0) as loader:
        specs = {s.name: s for s in loader.column_specs}
        for b in loader:
            assert b["n"].dtype == np.int64 and b["b"].dtype == np.bool_
            np.testing.assert_array_equal(b["n"], b["id"] * 2)
            np.testing.assert_array_equal(b["b"], b["id"] % 2 == 0)
    assert specs["n"].dtype == "<i8"


def test_float_and_timestamp_nulls_become_nan_and_nat(tmp_path):
    schema = pa.schema([("id", pa.int64()), ("f", pa.float32()), ("t", pa.timestamp("ms"))])
    a = pa.table({"id": [0, 1, 2], "f": [1.0, 2.0, 3.0], "t": [1, 2, 3]}, schema=schema)
    b = pa.table({"id": [3, 4, 5], "f": pa.array([None, 5.0, None], pa.float32()),
                  "t": pa.array([4, None, 6], pa.timestamp("ms"))}, schema=schema)
    c = pa.table({"id": [6], "f": pa.array([None], pa.float32()), "t": pa.array([None], pa.timestamp("ms"))},
                 schema=schema)
    write(str(tmp_path / "x.parquet"), [a, b, c])
    with Loader(str(tmp_path), batch_size=2, seed=0, shuffle=False) as loader:
        batches = collect(loader)
    for bt in batches:
        assert bt["f"].dtype == np.float32
        assert bt["t"].dtype == np.dtype("datetime64[ms]")
    f = np.concatenate([bt["f"] for bt in batches])
    t = np.concatenate([bt["t"] for bt in batches])
    np.testing.assert_array_equal(np.isnan(f), [0, 0, 0, 1, 0, 1, 1])
    np.testing.assert_array_equal(np.isnat(t), [0, 0, 0, 0, 1, 0, 1])


# -- the type table ------------------------------------------------------------

def _typed_tables(n: int, start: int, dictionary: bool) -> pa.Table:
    ids = np.arange(start, start + n)
    strings = [("ü" * (i % 3)) + f"s{i}" for i in ids]
    cat = pa.array([f"cat{i % 3}" for i in ids])
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "cat": cat.dictionary_encode() if dictionary else cat,
        "ts": pa.array(ids * 1000, pa.timestamp("ms", tz="Europe/Paris")),
        "tsn": pa.array(ids, pa.timestamp("ns", tz="UTC")),
        "day": pa.array(ids.astype(np.int32), pa.date32()),
        "emb": pa.FixedSizeListArray.from_arrays(
            pa.array((np.repeat(ids, 3) + np.tile([0, .5, .25], n)).astype(np.float32)), 3),
        "lst": pa.array([[float(i)] * (i % 4) for i in ids], pa.list_(pa.float32())),
        "s": pa.array(strings, pa.string()),
        "bin": pa.array([bytes([i % 256]) * (i % 3) for i in ids], pa.binary()),
        "i8": pa.array(ids % 100, pa.int8()),
        "u16": pa.array(ids, pa.uint16()),
        "dur": pa.array(ids * 60, pa.duration("s")),
        "ls": pa.array(strings, pa.large_string()),
        "ll": pa.array([[i] * (i % 2) for i in ids], pa.large_list(pa.int32())),
        "f16": pa.array((ids % 8).astype(np.float16), pa.float16()),
    })


@pytest.fixture
def typed_dataset(tmp_path):
    """Two files; 'cat' dictionary-encoded in one and plain in the other."""
    write(str(tmp_path / "p1.parquet"), [_typed_tables(13, 0, True), _typed_tables(1, 13, True), _typed_tables(20, 14, True)])
    write(str(tmp_path / "p2.parquet"), [_typed_tables(17, 34, False)])
    return tmp_path


EXPECTED = {
    "id": ("array", np.dtype("int64"), ()),
    "cat": ("ragged", "utf8", np.dtype("uint8"), np.dtype("int64"), 1),
    "ts": ("array", np.dtype("datetime64[ms]"), ()),
    "tsn": ("array", np.dtype("datetime64[ns]"), ()),
    "day": ("array", np.dtype("datetime64[D]"), ()),
    "emb": ("array", np.dtype("float32"), (3,)),
    "lst": ("ragged", "list", np.dtype("float32"), np.dtype("int64"), 1),
    "s": ("ragged", "utf8", np.dtype("uint8"), np.dtype("int64"), 1),
    "bin": ("ragged", "binary", np.dtype("uint8"), np.dtype("int64"), 1),
    "i8": ("array", np.dtype("int8"), ()),
    "u16": ("array", np.dtype("uint16"), ()),
    "dur": ("array", np.dtype("timedelta64[s]"), ()),
    "ls": ("ragged", "utf8", np.dtype("uint8"), np.dtype("int64"), 1),
    "ll": ("ragged", "list", np.dtype("int32"), np.dtype("int64"), 1),
    "f16": ("array", np.dtype("float16"), ()),
}


def test_every_type_maps_the_same_in_every_batch(typed_dataset, pool):
    with Loader(str(typed_dataset), batch_size=4, seed=1, workers=2, pool=pool, order="windowed", shuffle_window=2) as loader:
        specs = {s.name: s for s in loader.column_specs}
        batches = collect(loader)
    assert len(batches) == 13
    assert specs["ts"].arrow_type == "timestamp[ms, tz=Europe/Paris]"
    assert specs["tsn"].arrow_type == "timestamp[ns, tz=UTC]"
    rows = 0
    for b in batches:
        assert list(b) == list(EXPECTED)
        assert {k: dtype_of(v) for k, v in b.items()} == EXPECTED
        ids = b["id"]
        rows += len(ids)
        for k, v in b.items():
            assert len(v) == len(ids), k
        # values
        np.testing.assert_array_equal(b["ts"], (ids * 1000).astype("datetime64[ms]"))  # UTC instants
        np.testing.assert_array_equal(b["tsn"], ids.astype("datetime64[ns]"))
        np.testing.assert_array_equal(b["day"], np.datetime64("1970-01-01") + ids.astype("timedelta64[D]"))
        assert b["emb"].shape == (len(ids), 3)
        np.testing.assert_array_equal(b["emb"], ids[:, None].astype(np.float32) + np.float32([0, .5, .25]))
        np.testing.assert_array_equal(b["i8"], ids % 100)
        np.testing.assert_array_equal(b["dur"], (ids * 60).astype("timedelta64[s]"))
        np.testing.assert_array_equal(b["f16"], (ids % 8).astype(np.float16))
        np.testing.assert_array_equal(b["ll"].lengths, ids % 2)
        np.testing.assert_array_equal(b["ll"].values, ids[ids % 2 == 1].astype(np.int32))
        assert b["ls"].to_list() == b["s"].to_list()
        assert b["lst"].offsets[0] == 0 and b["s"].offsets[0] == 0
        for j, i in enumerate(ids.tolist()):
            assert b["cat"][j] == f"cat{i % 3}"
            assert b["s"][j] == ("ü" * (i % 3)) + f"s{i}"
            assert isinstance(b["s"][j], str)
            assert b["bin"][j] == bytes([i % 256]) * (i % 3)
            np.testing.assert_array_equal(b["lst"][j], np.full(i % 4, i, np.float32))
        assert b["s"].to_list()[-1] == b["s"][-1]
    assert rows == 51


def test_fixed_size_binary_is_2d_uint8(tmp_path, pool):
    """fixed_size_binary(4) maps (per column_spec) to a (rows, 4) uint8 array."""
    t = pa.table({"id": [0, 1, 2], "fb": pa.array([b"abcd", b"efgh", b"ijkl"], pa.binary(4))})
    pq.write_table(t, tmp_path / "a.parquet")
    with Loader(str(tmp_path), batch_size=2, seed=0, shuffle=False, pool=pool) as loader:
        assert loader.column_specs[1].dtype == "|u1" and loader.column_specs[1].inner == (4,)
        batches = collect(loader)
    fb = np.concatenate([b["fb"] for b in batches])
    assert fb.dtype == np.uint8 and fb.shape == (3, 4)
    assert [bytes(r) for r in fb] == [b"abcd", b"efgh", b"ijkl"]


def test_decimal_is_unsupported_and_names_the_column(tmp_path):
    t = pa.table({"id": [1, 2], "price": pa.array([decimal.Decimal("1.25"), None], pa.decimal128(9, 2))})
    pq.write_table(t, tmp_path / "d.parquet")
    with pytest.raises(UnsupportedTypeError, match=r"column 'price' has Arrow type decimal128\(9, 2\).*float64"):
        Loader(str(tmp_path), batch_size=2, seed=0)
    with pytest.raises(UnsupportedTypeError, match="'price'"):
        Loader(str(tmp_path), batch_size=2, seed=0, columns=["price", "id"])
    # leaving it out works
    with Loader(str(tmp_path), batch_size=2, seed=0, columns=["id"]) as loader:
        (b,) = collect(loader)
    assert sorted(b["id"].tolist()) == [1, 2]


@pytest.mark.parametrize(
    "arr",
    [
        pa.array([[[1.0]], [[2.0]]], pa.list_(pa.list_(pa.float32()))),
        pa.array([{"a": 1}, {"a": 2}]),
        pa.array([None, None], pa.null()),
        pa.array([{1: 2}, {3: 4}], pa.map_(pa.int64(), pa.int64())),
    ],
    ids=["list_of_lists", "struct", "null", "map"],
)
def test_unsupported_types_name_the_column_at_construction(tmp_path, arr):
    pq.write_table(pa.table({"id": [1, 2], "odd": arr}), tmp_path / "u.parquet")
    with pytest.raises(UnsupportedTypeError, match="column 'odd' has Arrow type"):
        Loader(str(tmp_path), batch_size=2, seed=0)
    with Loader(str(tmp_path), batch_size=2, seed=0, columns=["id"]) as loader:
        assert len(collect(loader)) == 1


def test_columns_in_listed_order(typed_dataset):
    cols = ["s", "id", "emb", "cat"]
    with Loader(str(typed_dataset), batch_size=10, seed=0, columns=cols) as loader:
        assert [s.name for s in loader.column_specs] == cols
        for b in loader:
            assert list(b) == cols
    with Loader(str(typed_dataset), batch_size=100, seed=0) as loader:
        (b,) = collect(loader)
    assert list(b) == list(EXPECTED)  # schema order when not listed


# -- Hive partitions -------------------------------------------------------------

@pytest.fixture
def hive_dataset(tmp_path):
    """year=<int>/city=<str>/part.parquet; returns {id: (year, city)}."""
    truth = {}
    n = 0
    for year in (2019, 2020):
        for city in ("Oslo", "New York", "7b"):
            ids = np.arange(n, n + 9 + year % 7)
            n += len(ids)
            folder = tmp_path / f"year={year}" / f"city={city.replace(' ', '%20')}"
            write(str(folder / "part.parquet"),
                  [pa.table({"id": ids[:5], "v": ids[:5] * 1.5}), pa.table({"id": ids[5:], "v": ids[5:] * 1.5})])
            truth.update({int(i): (year, city) for i in ids})
    return tmp_path, truth


def test_hive_partition_columns_come_last_typed(hive_dataset, pool):
    root, truth = hive_dataset
    with Loader(str(root), batch_size=8, seed=2, workers=2, pool=pool) as loader:
        names = [s.name for s in loader.column_specs]
        batches = collect(loader)
    assert names == ["id", "v", "year", "city"]
    got = {}
    for b in batches:
        assert list(b) == names
        assert b["year"].dtype == np.int64
        assert isinstance(b["city"], Ragged) and b["city"].kind == "utf8"
        for j, i in enumerate(b["id"].tolist()):
            got[i] = (int(b["year"][j]), b["city"][j])
    assert got == truth


def test_hive_partition_columns_last_even_when_listed_first(hive_dataset):
    root, truth = hive_dataset
    with Loader(str(root), batch_size=100, seed=2, columns=["year", "v", "id"]) as loader:
        (b,) = collect(loader)
    assert list(b) == ["v", "id", "year"]
    assert [int(y) for y in b["year"]] == [truth[i][0] for i in b["id"].tolist()]


def test_hive_partition_columns_keep_the_listed_order_among_themselves(hive_dataset):
    """Listed order, partition columns last: listing city before year keeps city before year."""
    root, truth = hive_dataset
    with Loader(str(root), batch_size=100, seed=2, columns=["city", "id", "year"]) as loader:
        (b,) = collect(loader)
    assert list(b) == ["id", "city", "year"]
    assert [(int(y), c) for y, c in zip(b["year"], b["city"].to_list())] == [truth[i] for i in b["id"].tolist()]


def test_hive_explicit_partition_type(hive_dataset):
    root, _ = hive_dataset
    with Loader(str(root), batch_size=100, seed=2, storage=detload.Storage(partition_types={"year": "string"})) as loader:
        (b,) = collect(loader)
    assert isinstance(b["year"], Ragged)
    assert set(b["year"].to_list()) == {"2019", "2020"}


# -- empty batches -----------------------------------------------------------------

def test_empty_batches_keep_the_types(typed_dataset):
    """Distributed, drop_last=False: a rank whose partitions ran out gets a 0-row batch of the same types."""
    shapes = {}
    for rank in (0, 1):
        with Loader(str(typed_dataset), batch_size=5, seed=0, distributed=(rank, 2), partitions=2,
                    shuffle=False) as loader:
            batches = collect(loader)
        shapes[rank] = [len(b["id"]) for b in batches]
        for b in batches:
            assert {k: dtype_of(v) for k, v in b.items()} == EXPECTED
            if len(b["id"]) == 0:
                assert b["emb"].shape == (0, 3)
                assert b["s"].offsets.tolist() == [0] and len(b["s"]) == 0
    # 51 rows -> partitions of 25 and 26 rows (plan format 2 balances them), so at the last
    # step rank 1 has one row left and rank 0 none: an empty batch of the same types.
    assert shapes[0] == [5, 5, 5, 5, 5, 0]
    assert shapes[1] == [5, 5, 5, 5, 5, 1]
