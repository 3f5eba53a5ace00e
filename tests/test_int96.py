"""Spark's legacy INT96 timestamps: read as datetime64[us], exact from 0001 to 9999, never wrapped.

Read as nanoseconds (pyarrow's default) 9999-12-31 silently becomes 1816; detload
reads INT96 at microseconds, checks each value against a second read at
milliseconds (which no INT96 value overflows), and a cast to another unit is
checked value by value. Only loaders of INT96 columns report type mapping 2.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from detload import DataError, Loader, SchemaMismatchError, StateError

# The corners: the first day, the two ends of datetime64[ns], the last microsecond.
CORNERS = [dt.datetime(1, 1, 1), dt.datetime(1677, 9, 20), dt.datetime(2262, 4, 12),
           dt.datetime(9999, 12, 31, 23, 59, 59, 999999)]
INSIDE_NS = [dt.datetime(1700, 1, 1, 0, 0, 0, 1), dt.datetime(2020, 5, 1, 12, 30), dt.datetime(2262, 1, 1)]


def write_int96(path, values, *, extra: dict | None = None, row_group_size: int | None = None) -> None:
    cols = {"id": np.arange(len(values), dtype=np.int64), "ts": pa.array(values, pa.timestamp("us"))}
    pq.write_table(pa.table({**cols, **(extra or {})}), path, use_deprecated_int96_timestamps=True,
                   row_group_size=row_group_size)


def expected(values) -> np.ndarray:
    return np.array([np.datetime64(v, "us") if v is not None else np.datetime64("NaT", "us") for v in values])


def test_int96_is_stored_as_int96_and_pyarrow_wraps_it_at_nanoseconds(tmp_path):
    write_int96(tmp_path / "t.parquet", CORNERS)
    pf = pq.ParquetFile(tmp_path / "t.parquet")
    assert pf.metadata.schema.column(1).physical_type == "INT96"
    wrapped = pf.read().column("ts").to_numpy()
    assert str(wrapped[3]).startswith("1816-03-30")  # 9999-12-31 wrapped: the value the issue is about


def test_int96_reads_as_microseconds_at_every_corner(tmp_path, pool):
    values = [*CORNERS, None]
    write_int96(tmp_path / "t.parquet", values, row_group_size=2)
    with Loader(str(tmp_path), batch_size=2, seed=0, shuffle=False, pool=pool, workers=2) as loader:
        (spec,) = [s for s in loader.column_specs if s.name == "ts"]
        assert (spec.dtype, spec.int96, spec.arrow_type) == ("<M8[us]", True, "timestamp[us]")
        assert "from Parquet INT96" in spec.describe()
        got = np.concatenate([b["ts"] for b in loader])
    assert got.dtype == np.dtype("datetime64[us]")
    np.testing.assert_array_equal(got, expected(values))
    assert str(got[3]) == "9999-12-31T23:59:59.999999"


def test_type_mapping_is_2_only_when_an_int96_column_is_loaded(tmp_path):
    write_int96(tmp_path / "t.parquet", CORNERS)
    with Loader(str(tmp_path), batch_size=2, seed=0) as loader:
        assert loader.order["type_mapping"] == 2
    with Loader(str(tmp_path), batch_size=2, seed=0, columns=["id"]) as loader:
        assert loader.order["type_mapping"] == 1
    pq.write_table(pa.table({"ts": pa.array(CORNERS, pa.timestamp("us"))}), tmp_path / "plain.parquet")
    with Loader(str(tmp_path / "plain.parquet"), batch_size=2, seed=0) as loader:
        # Everything but INT96 maps as before: the same order dict, keys and all.
        assert loader.order["type_mapping"] == 1
        assert set(loader.order) == {"seed", "global_batch_size", "shuffle", "order", "mix_window", "block_rows",
                                     "drop_last", "partitions", "columns", "null_fill", "type_mapping", "plan_format",
                                     "dataset", "units_digest"}


def test_the_dataset_fingerprint_of_an_int96_file_is_unchanged(tmp_path):
    """It is computed from the types as written (INT96: timestamp[ns]), so only type_mapping moved."""
    from detload._discovery import _fingerprint, discover

    write_int96(tmp_path / "t.parquet", CORNERS)
    ds = discover(str(tmp_path))
    assert ds.schema.field("ts").type == pa.timestamp("us") and ds.int96 == {"ts"}
    written = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("ns"))])
    assert ds.fingerprint == _fingerprint(ds.files, written, ds.partition_types)


def test_a_state_from_the_nanosecond_mapping_is_refused_naming_the_type_mapping(tmp_path):
    write_int96(tmp_path / "t.parquet", CORNERS)
    with Loader(str(tmp_path), batch_size=2, seed=0) as loader:
        state = loader.state_dict()
        # What an earlier version recorded: type mapping 1, and its fingerprint of that order.
        old = {**state["order"], "type_mapping": 1}
        state = {**state, "order": old,
                 "fingerprint": xxhash.xxh3_128_hexdigest(json.dumps(old, sort_keys=True).encode())}
        with pytest.raises(StateError) as err:
            loader.load_state_dict(state)
    msg = str(err.value)
    assert "the type mapping changed (1 in the state, 2 here)" in msg
    assert "INT96 timestamp column(s) ['ts'] as datetime64[us]" in msg and "datetime64[ns]" in msg
    assert "dataset changed" not in msg


def test_int96_cast_to_nanoseconds_is_checked(tmp_path):
    write_int96(tmp_path / "in.parquet", INSIDE_NS)
    with Loader(str(tmp_path / "in.parquet"), batch_size=8, seed=0, shuffle=False,
                cast={"ts": "datetime64[ns]"}) as loader:
        (b,) = list(loader)
        assert loader.order["cast"] == {"ts": "datetime64[ns]"} and loader.order["type_mapping"] == 2
    assert b["ts"].dtype == np.dtype("datetime64[ns]")
    np.testing.assert_array_equal(b["ts"], expected(INSIDE_NS).astype("datetime64[ns]"))

    write_int96(tmp_path / "corners.parquet", CORNERS)
    with Loader(str(tmp_path / "corners.parquet"), batch_size=8, seed=0, shuffle=False,
                cast={"ts": "datetime64[ns]"}) as loader, pytest.raises(
            DataError, match=r"column 'ts' in corners\.parquet row group 0 cannot be delivered as datetime64\[ns\].*"
                             r"the value 0001-01-01T00:00:00\.000000 at row 0 is outside the dates"):
        list(loader)


def test_int96_cast_to_a_coarser_unit_refuses_dropping_digits(tmp_path):
    write_int96(tmp_path / "t.parquet", CORNERS[:3])
    with Loader(str(tmp_path), batch_size=8, seed=0, shuffle=False, cast={"ts": "datetime64[s]"}) as loader:
        (b,) = list(loader)
    np.testing.assert_array_equal(b["ts"], expected(CORNERS[:3]).astype("datetime64[s]"))
    write_int96(tmp_path / "t.parquet", CORNERS)
    with Loader(str(tmp_path), batch_size=8, seed=0, shuffle=False, cast={"ts": "datetime64[ms]"}) as loader, \
            pytest.raises(DataError, match=r"9999-12-31T23:59:59\.999999 at row 3 is not a whole number of ms"):
        list(loader)


def test_an_int96_value_beyond_microseconds_is_refused_not_wrapped(tmp_path, pool):
    # Year 1,000,000: a valid INT96 (Julian day, nanoseconds), but past datetime64[us]'s end.
    far = pa.array(np.array(["2000-01-01", "1000000-01-01"], "M8[s]"), pa.timestamp("s"))
    pq.write_table(pa.table({"ts": far}), tmp_path / "far.parquet", use_deprecated_int96_timestamps=True)
    assert pq.read_table(tmp_path / "far.parquet", coerce_int96_timestamp_unit="us").column(0)[1].value < 0
    with Loader(str(tmp_path), batch_size=1, seed=0, shuffle=False, pool=pool) as loader:
        got = []
        with pytest.raises(DataError, match=r"column 'ts' in far\.parquet row group 0 holds an INT96 "
                                            r"timestamp at row 1 that does not fit datetime64\[us\]"):
            for b in loader:
                got.append(b["ts"].copy())
        assert got == []  # the whole row group is refused, before any of it is delivered


def test_int96_in_one_file_and_microseconds_in_another_are_one_column(tmp_path):
    write_int96(tmp_path / "a.parquet", CORNERS)
    pq.write_table(pa.table({"id": np.arange(2, dtype=np.int64), "ts": pa.array(CORNERS[:2], pa.timestamp("us"))}),
                   tmp_path / "b.parquet")
    with Loader(str(tmp_path), batch_size=8, seed=0, shuffle=False) as loader:
        assert loader.order["type_mapping"] == 2
        got = np.concatenate([b["ts"] for b in loader])
    np.testing.assert_array_equal(got, expected(CORNERS + CORNERS[:2]))
    # Nanoseconds stored as INT64 deliver another dtype: that is drift.
    pq.write_table(pa.table({"id": np.arange(1, dtype=np.int64), "ts": pa.array(CORNERS[1:2], pa.timestamp("us"))
                             .cast(pa.timestamp("ns"), safe=False)}), tmp_path / "c.parquet",
                   coerce_timestamps=None)
    with pytest.raises(SchemaMismatchError, match=r"'ts' is timestamp\[us\] in a\.parquet but timestamp\[ns\] in c"):
        Loader(str(tmp_path), batch_size=8, seed=0)


def test_warm_cache_gives_the_cold_bytes_for_int96(tmp_path):
    from detload import read_manifest

    data = tmp_path / "d"
    os.makedirs(data)
    write_int96(data / "t.parquet", [*CORNERS, None] * 3, row_group_size=5)
    runs = []
    for name in ("cold", "warm", "uncached"):
        cache = str(tmp_path / "cache") if name != "uncached" else None
        with Loader(str(data), batch_size=4, seed=2, order="windowed", shuffle_window=2, cache=cache,
                    manifest=str(tmp_path / f"{name}.jsonl")) as loader:
            list(loader)
        runs.append([line["hash"] for line in read_manifest(str(tmp_path / f"{name}.jsonl")).batches()])
    assert runs[0] == runs[1] == runs[2]
    assert os.listdir(tmp_path / "cache")
