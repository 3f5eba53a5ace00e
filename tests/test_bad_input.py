"""Bad options and bad datasets: each raises its documented error, with a message that names the problem.

Every case here is detected while constructing the `Loader` (or, for errors
found by the planner, at the latest by the first ``len()``/``iter()``), before
any worker exists: the worker pool is replaced by a trap for these tests.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import detload.loader
from detload import (
    DatasetError,
    EmptyDatasetError,
    Loader,
    OptionError,
    SchemaMismatchError,
)


@pytest.fixture
def no_workers(monkeypatch, leak_check):
    """Fail the test if anything tries to start a worker pool."""

    def trap(*args, **kwargs):
        raise AssertionError("a worker pool was started for bad input")

    monkeypatch.setattr(detload.loader, "WorkerPool", trap)
    yield
    leak_check.assert_clean(grace=0)


@pytest.fixture
def ds(small_dataset):
    return small_dataset.root


# -- options -----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"batch_size": 0}, r"batch_size must be >= 1, got 0"),
        ({"batch_size": -1}, r"batch_size must be >= 1, got -1"),
        ({"batch_size": 1.5}, r"batch_size must be an int, got float"),
        ({"batch_size": "32"}, r"batch_size must be an int, got str"),
        ({"batch_size": None}, r"batch_size must be an int"),
        ({"batch_size": True}, r"batch_size must be an int, got bool"),
        ({"workers": 0}, r"workers must be in \[1, 256\], got 0"),
        ({"workers": -2}, r"workers must be in \[1, 256\], got -2"),
        ({"workers": 2.0}, r"workers must be an int >= 1 or 'auto'"),
        ({"workers": "many"}, r"workers must be an int >= 1 or 'auto', got 'many'"),
        ({"seed": "7"}, r"seed must be an int, got str"),
        ({"seed": 7.0}, r"seed must be an int, got float"),
        ({"seed": None}, r"seed must be an int, got NoneType"),
        ({"seed": -1}, r"seed must be in \[0, 18446744073709551615\], got -1"),
        ({"seed": 2**64}, r"seed must be in \[0, 18446744073709551615\]"),
        ({"pool": "fork"}, r"pool must be 'thread' or 'process', got 'fork'"),
        ({"pool": None}, r"pool must be 'thread' or 'process'"),
        ({"shuffle_window": 0}, r"shuffle_window must be >= 1, got 0"),
        ({"shuffle_window": 2.5}, r"shuffle_window must be an int"),
        ({"prefetch": 0}, r"prefetch must be an int >= 1"),
        ({"stall_timeout": 0}, r"stall_timeout must be a positive number"),
        ({"shuffle": "no"}, r"shuffle must be True or False"),
        ({"drop_last": None}, r"drop_last must be True or False"),
        ({"partitions": 3, "world_size": 2, "rank": 0}, r"partitions=3 must be a multiple of the world size 2"),
        ({"partitions": 2, "batch_size": 3}, r"must divide by partitions=2"),
        ({"rank": 2, "world_size": 2}, r"rank must be an int in \[0, 2\), got 2"),
        ({"columns": "id"}, r"columns must be a list of names, got the string 'id'"),
        ({"columns": []}, r"columns=\[\] selects nothing"),
        ({"columns": ["id", "s", "id"]}, r"columns lists \['id'\] more than once"),
        ({"null_fill": {"nope": 0}}, r"null_fill names \['nope'\], which are not among the loaded columns"),
        ({"null_fill": [("ni", 0)]}, r"null_fill must be a dict"),
    ],
)
def test_bad_options(ds, no_workers, kw, match):
    args = {"batch_size": 8, "seed": 0, **kw}
    with pytest.raises(OptionError, match=match):
        Loader(ds, **args)


def test_missing_seed_is_a_type_error(ds, no_workers):
    with pytest.raises(TypeError, match="seed"):
        Loader(ds, batch_size=8)  # type: ignore[call-arg]


def test_missing_batch_size_is_a_type_error(ds, no_workers):
    with pytest.raises(TypeError, match="batch_size"):
        Loader(ds, seed=1)  # type: ignore[call-arg]


def test_option_errors_are_value_errors(ds, no_workers):
    with pytest.raises(ValueError):
        Loader(ds, batch_size=0, seed=0)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"drop_last": True, "batch_size": 5000}, r"drops every row.*smallest partition holds 1211 rows"),
        ({"partitions": 7, "batch_size": 7}, r"partitions=7 exceeds the 6 non-empty row groups"),
    ],
)
def test_plan_errors_come_before_any_worker(ds, no_workers, kw, match):
    """Errors the planner finds surface by the first len() or iteration, before a worker starts."""
    loader = Loader(ds, seed=0, **kw)
    with pytest.raises(OptionError, match=match):
        len(loader)
    with pytest.raises(OptionError, match=match):
        iter(loader)
    loader.close()


def test_numpy_integers_are_ints(ds, tmp_path):
    """The option checks accept NumPy integers, so the loader must work with them like with ints."""
    with Loader(ds, batch_size=8, seed=5, manifest=str(tmp_path / "a.jsonl")) as a:
        want = [b["id"].copy() for b in a]
    with Loader(ds, batch_size=np.int64(8), seed=np.uint64(5), shuffle_window=np.int32(4),
                manifest=str(tmp_path / "b.jsonl")) as b:
        assert b.fingerprint == a.fingerprint
        got = [x["id"].copy() for x in b]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


# -- datasets ---------------------------------------------------------------------

def test_unknown_column_names_the_available_ones(ds, no_workers):
    with pytest.raises(DatasetError, match=r"unknown column\(s\) \['nope'\]; the dataset has "
                                           r"\['id', 'f32', 's', 'lf', 'nf', 'ni'\]"):
        Loader(ds, batch_size=8, seed=0, columns=["id", "nope"])


def test_path_that_does_not_exist(tmp_path, no_workers):
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Loader(str(missing), batch_size=8, seed=0)
    with pytest.raises(FileNotFoundError, match="matches no file"):
        Loader(str(tmp_path / "*.parquet"), batch_size=8, seed=0)


def test_missing_file_in_a_list(ds, tmp_path, no_workers):
    with pytest.raises(FileNotFoundError):
        Loader([os.path.join(ds, "a.parquet"), str(tmp_path / "gone.parquet")], batch_size=8, seed=0)


def test_directory_without_parquet_files(tmp_path, no_workers):
    (tmp_path / "readme.txt").write_text("no data here")
    (tmp_path / "_SUCCESS").write_bytes(b"")
    (tmp_path / "part-0.parquet.crc").write_bytes(b"crc")
    (tmp_path / "_common_metadata").write_bytes(b"PAR1")
    with pytest.raises(DatasetError, match="no Parquet data files under"):
        Loader(str(tmp_path), batch_size=8, seed=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no Parquet data files"):
        Loader(str(tmp_path / "empty"), batch_size=8, seed=0)


def _real_parquet(path) -> None:
    pq.write_table(pa.table({"id": np.arange(1000)}), path)


@pytest.mark.parametrize("kind", ["text", "empty", "truncated", "magic_only"])
def test_file_that_is_not_parquet(tmp_path, no_workers, kind):
    _real_parquet(tmp_path / "good.parquet")
    bad = tmp_path / "bad.parquet"
    if kind == "text":
        bad.write_text("id,x\n1,2\n")
    elif kind == "empty":
        bad.write_bytes(b"")
    elif kind == "truncated":
        data = (tmp_path / "good.parquet").read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    else:
        bad.write_bytes(b"PAR1" + b"\x00" * 20 + b"PAR1")
    with pytest.raises(DatasetError, match=r"cannot read the Parquet footer of .*bad\.parquet"):
        Loader(str(tmp_path), batch_size=8, seed=0)
    with pytest.raises(DatasetError, match="footer"):
        Loader(str(bad), batch_size=8, seed=0)


def _one(t: pa.DataType) -> pa.Array:
    if pa.types.is_list(t):
        return pa.array([[1.0]], t)
    return pa.array(["1"] if t == pa.string() else [1], t)


@pytest.mark.parametrize(
    ("ta", "tb"),
    [(pa.int64(), pa.string()), (pa.float32(), pa.float64()), (pa.int32(), pa.int64()),
     (pa.list_(pa.float32()), pa.list_(pa.float64()))],
)
def test_schema_drift_names_both_files_and_the_column(tmp_path, no_workers, ta, tb):
    pq.write_table(pa.table({"id": [1], "x": _one(ta)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3], "x": _one(tb)}), tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatchError, match=r"a\.parquet.*b\.parquet.*'x' is .* in a\.parquet but .* in b\.parquet"):
        Loader(str(tmp_path), batch_size=8, seed=0)


def test_nullability_and_metadata_are_not_drift(tmp_path):
    s1 = pa.schema([pa.field("id", pa.int64(), nullable=False)], metadata={"writer": "one"})
    s2 = pa.schema([pa.field("id", pa.int64(), nullable=True)])
    pq.write_table(pa.table({"id": [1, 2]}, schema=s1), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3]}, schema=s2), tmp_path / "b.parquet")
    with Loader(str(tmp_path), batch_size=8, seed=0) as loader:
        (b,) = list(loader)
    assert sorted(b["id"].tolist()) == [1, 2, 3]


@pytest.mark.parametrize("drift", ["type", "missing"])
def test_drift_in_a_column_that_is_not_requested_is_not_an_error(tmp_path, drift):
    """Only requested columns must agree (the error message itself suggests columns=[...])."""
    pq.write_table(pa.table({"id": [1, 2], "x": [1, 2]}), tmp_path / "a.parquet")
    b = {"id": [3], "x": ["z"]} if drift == "type" else {"id": [3]}
    pq.write_table(pa.table(b), tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatchError, match="'x'"):
        Loader(str(tmp_path), batch_size=8, seed=0)
    with Loader(str(tmp_path), batch_size=8, seed=0, columns=["id"]) as loader:
        (batch,) = list(loader)
    assert sorted(batch["id"].tolist()) == [1, 2, 3]


def test_empty_dataset(tmp_path, no_workers):
    schema = pa.schema([("id", pa.int64())])
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "a.parquet")
    with pq.ParquetWriter(tmp_path / "b.parquet", schema):
        pass
    with pytest.raises(EmptyDatasetError, match=r"has no rows: its 2 file\(s\) hold no non-empty row group"):
        Loader(str(tmp_path), batch_size=8, seed=0)
    assert issubclass(EmptyDatasetError, DatasetError)


@pytest.mark.parametrize("source", [[], 123, None])
def test_bad_source(no_workers, source):
    with pytest.raises(OptionError, match="source must be a path"):
        Loader(source, batch_size=8, seed=0)


def test_numpy_scalars_for_execution_options(small_dataset):
    """prefetch, rank and stall_timeout take NumPy scalars like the order options do."""
    ld = Loader(small_dataset.root, batch_size=64, seed=1, prefetch=np.int64(2), rank=np.int32(0),
                world_size=1, stall_timeout=np.float64(30.0))
    try:
        assert ld.prefetch == 2 and type(ld.prefetch) is int
        assert type(ld.rank) is int and ld.stall_timeout == 30.0
        assert json.dumps(ld.state_dict())
    finally:
        ld.close()
