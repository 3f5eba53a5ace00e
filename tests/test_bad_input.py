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
        ({"batch_size": 0}, r"batch_size must be an int >= 1, got 0"),
        ({"batch_size": -1}, r"batch_size must be an int >= 1, got -1"),
        ({"batch_size": 1.5}, r"batch_size must be an int >= 1, got float"),
        ({"batch_size": "32"}, r"batch_size must be an int >= 1, got str"),
        ({"batch_size": None}, r"batch_size must be an int"),
        ({"batch_size": True}, r"batch_size must be an int >= 1, got bool"),
        ({"workers": 0}, r"workers must be an int in \[1, 256\] or 'auto', got 0"),
        ({"workers": -2}, r"workers must be an int in \[1, 256\] or 'auto', got -2"),
        ({"workers": 2.0}, r"workers must be an int in \[1, 256\] or 'auto', got float 2.0"),
        ({"workers": "many"}, r"workers must be an int in \[1, 256\] or 'auto', got str 'many'"),
        ({"seed": "7"}, r"seed must be an int in \[0, 2\*\*64\), got str"),
        ({"seed": 7.0}, r"seed must be an int in \[0, 2\*\*64\), got float"),
        ({"seed": None}, r"seed must be an int in \[0, 2\*\*64\), got NoneType"),
        ({"seed": -1}, r"seed must be an int in \[0, 2\*\*64\), got -1"),
        ({"seed": 2**64}, r"seed must be an int in \[0, 2\*\*64\)"),
        ({"pool": "fork"}, r"pool must be 'thread' or 'process', got 'fork'"),
        ({"pool": 3}, r"pool must be a detload.Pool, 'thread' or 'process', or None, got int 3"),
        ({"order": "windowed", "shuffle_window": 0}, r"shuffle_window must be an int >= 1, got 0"),
        ({"order": "windowed", "shuffle_window": 2.5}, r"shuffle_window must be an int"),
        ({"order": "mix", "shuffle_window": 2}, r"shuffle_window=2 is an option of order=\"windowed\""),
        ({"order": "mix", "mix_window": 0}, r"mix_window must be an int >= 1, got 0"),
        ({"order": "windowed", "mix_window": 8}, r"mix_window=8 is an option of order=\"mix\""),
        # The default order is the mixed one: the windowed order's option alone says how to get it back.
        ({"shuffle_window": 4}, r"shuffle_window=4 is an option of order=\"windowed\"; the mixed order "
                                r"\(order=\"mix\", the default since plan format 3\).*For the windowed order "
                                r"\(plan format 2, the default before\) pass order=\"windowed\" with "
                                r"shuffle_window=4 \(on the command line: --order windowed --shuffle-window 4\)"),
        ({"order": "iid"}, r"order must be one of \['mix', 'windowed'\], got 'iid'"),
        ({"pool": lambda: detload.Pool(prefetch=0)},
         r"Pool.prefetch must be an int in \[1, 1024\] \(blocks queued per worker\), got 0"),
        ({"pool": lambda: detload.Pool(stall_timeout=0)}, r"Pool.stall_timeout must be a positive number"),
        ({"shuffle": "no"}, r"shuffle must be True or False"),
        ({"drop_last": None}, r"drop_last must be True or False"),
        ({"partitions": 3, "distributed": (0, 2)}, r"partitions=3 must be a multiple of the world size 2"),
        ({"partitions": 2, "batch_size": 3}, r"must divide by partitions=2"),
        ({"distributed": (2, 2)}, r"Distributed.rank must be an int in \[0, 2\), got 2"),
        ({"columns": "id"}, r"columns must be a list of names, got the string 'id'"),
        ({"columns": []}, r"columns=\[\] selects nothing"),
        ({"columns": ["id", "s", "id"]}, r"columns lists \['id'\] more than once"),
        ({"null_fill": {"nope": 0}}, r"null_fill names \['nope'\], which are not among the loaded columns"),
        ({"null_fill": [("ni", 0)]}, r"null_fill must be a dict"),
    ],
)
def test_bad_options(ds, no_workers, kw, match):
    with pytest.raises(OptionError, match=match):
        Loader(ds, **_built({"batch_size": 8, "seed": 0, **kw}))


def _built(kw: dict) -> dict:
    # An option group is given as a function that builds it, called where the error is expected.
    return {k: v() if callable(v) else v for k, v in kw.items()}


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
        ({"drop_last": True, "batch_size": 5000},
         r"drops every row: the epoch holds 1211 rows.*fewer than one micro-batch of 5000 rows"),
        # Format 2 has no "partitions exceeds the row groups" error; fewer rows than one
        # global batch with drop_last=True is the planning error left, naming the sizes.
        ({"drop_last": True, "partitions": 4, "batch_size": 1212},
         r"the epoch holds 1211 rows, the smallest of the 4 partitions 302, fewer than one micro-batch "
         r"of 303 rows \(global batch 1212 = 4 x 303\)"),
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


@pytest.mark.parametrize("order", ["mix", "windowed"])
def test_numpy_integers_are_ints(ds, tmp_path, order):
    """The option checks accept NumPy integers, so the loader must work with them like with ints."""
    plain = {} if order == "mix" else {"order": "windowed"}  # each order's defaults, as ints
    with Loader(ds, batch_size=8, seed=5, manifest=str(tmp_path / "a.jsonl"), **plain) as a:
        want = [b["id"].copy() for b in a]
        opts = a.options
    as_numpy = ({"mix_window": np.int32(opts.mix_window), "block_rows": np.int64(opts.block_rows)}
                if order == "mix" else {"shuffle_window": np.int32(opts.shuffle_window)})
    with Loader(ds, batch_size=np.int64(8), seed=np.uint64(5), order=order, manifest=str(tmp_path / "b.jsonl"),
                **as_numpy) as b:
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
    # Drift the promotion rule refuses (widening ones are read as one type: test_schema_drift.py).
    [(pa.int64(), pa.string()), (pa.float32(), pa.int64()), (pa.uint64(), pa.int32()),
     (pa.list_(pa.float32()), pa.list_(pa.int64()))],
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
    """Pool.prefetch, Distributed.rank and Pool.stall_timeout take NumPy scalars like the order options do."""
    ld = Loader(small_dataset.root, batch_size=64, seed=1, distributed=(np.int32(0), 1),
                pool=detload.Pool(prefetch=np.int64(2), stall_timeout=np.float64(30.0)))
    try:
        assert ld.prefetch == 2 and type(ld.prefetch) is int
        assert type(ld.rank) is int and ld.stall_timeout == 30.0
        assert json.dumps(ld.state_dict())
    finally:
        ld.close()


# -- options: the right type, at construction, naming the right thing -----------------------

@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"pool": lambda: detload.Pool(kind="process", prefetch=2**31)},
         r"^Pool.prefetch must be an int in \[1, 1024\] \(blocks queued per worker\), got 2147483648$"),
        ({"pool": lambda: detload.Pool(prefetch=1025)}, r"Pool.prefetch must be an int in \[1, 1024\]"),
        ({"pool": lambda: detload.Pool(stall_timeout=10**400)},
         r"^Pool.stall_timeout must be a positive number of seconds up to 1e\+09, or None \(wait forever\), "
         r"got int 1000000000000"),
        ({"pool": lambda: detload.Pool(stall_timeout=float("inf"))},
         r"Pool.stall_timeout must be a positive number of seconds up to 1e\+09"),
        ({"pool": lambda: detload.Pool(stall_timeout=float("nan"))}, r"Pool.stall_timeout must be a positive number of seconds"),
        ({"manifest": b"x.jsonl"}, r"^manifest must be a str or os.PathLike path, got bytes b'x.jsonl': decode it "
                                   r"first \(manifest='x.jsonl'\)$"),
        ({"manifest": 5}, r"^manifest must be a str or os.PathLike path, got int 5$"),
        ({"storage": lambda: detload.Storage(partition_types="k")},
         r"^Storage.partition_types must be a dict \{key: 'int64' \| 'string'\} or None, got str 'k'$"),
        ({"storage": lambda: detload.Storage(partition_types=[("k", "int64")])}, r"Storage.partition_types must be a dict"),
        ({"pool": lambda: detload.Pool(trace="yes")}, r"^Pool.trace must be True or False, got str 'yes'$"),
    ],
)
def test_option_types_are_refused_by_name(ds, no_workers, kw, match):
    with pytest.raises(OptionError, match=match):
        Loader(ds, batch_size=8, seed=0, **_built(kw))


@pytest.mark.parametrize(("source", "match"), [
    (b"/path", r"^source must be a str path, glob or URI \(or a list of them\), got bytes b'/path': decode it "
               r"first \(source='/path'\)$"),
    ([b"/a.parquet"], r"^source lists bytes b'/a.parquet'; every item must be a str path or an os.PathLike$"),
    ("", r"^source is empty"),
])
def test_source_types_are_refused_by_name(no_workers, source, match):
    with pytest.raises(OptionError, match=match):
        Loader(source, batch_size=8, seed=0)


def test_manifest_that_cannot_be_created_fails_at_construction(ds, tmp_path, no_workers):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OptionError, match=rf"^manifest {tmp_path}/f/runs/m.jsonl cannot be created: "
                                          rf"{tmp_path}/f is a file, not a folder$"):
        Loader(ds, batch_size=8, seed=0, manifest=str(tmp_path / "f" / "runs" / "m.jsonl"))
    with pytest.raises(OptionError, match=r"cannot be created: .*/f is a file, not a folder"):
        Loader(ds, batch_size=8, seed=0, manifest=str(tmp_path / "f") + "/")  # a run directory under a file


def test_manifest_on_a_read_only_file_system_fails_at_construction(ds, tmp_path, no_workers, monkeypatch):
    real = os.access  # os.access reports EROFS as not writable; simulated, since tests cannot mount
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(tmp_path) else real(p, mode, **kw))
    with pytest.raises(OptionError, match=rf"cannot be created: {tmp_path} is not writable \(permissions, or a "
                                          r"read-only file system\)"):
        Loader(ds, batch_size=8, seed=0, manifest=str(tmp_path / "m.jsonl"))


def test_checks_create_nothing(ds, tmp_path):
    with Loader(ds, batch_size=8, seed=0, manifest=str(tmp_path / "a" / "b" / "m.jsonl")):
        assert not (tmp_path / "a").exists()  # the folders come with the first batch, as before


# -- files that are not Parquet ------------------------------------------------------------

def test_stray_files_are_skipped_with_one_warning(tmp_path):
    from detload import SkippedFilesWarning

    _real_parquet(tmp_path / "good.parquet")
    (tmp_path / "notes.csv").write_text("a,b\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "README").write_text("x")
    (tmp_path / "sub" / "b.txt").write_text("x")
    with pytest.warns(SkippedFilesWarning) as got:
        loader = Loader(str(tmp_path), batch_size=100, seed=0)
    assert len(got) == 1
    msg = str(got[0].message)
    assert msg.startswith(f"3 files skipped: 1 .csv, 1 .txt, 1 without suffix in {tmp_path}: they are not Parquet")
    assert "detload inspect` lists them" in msg
    assert loader.dataset.skipped == ("notes.csv", "sub/README", "sub/b.txt")
    assert sum(len(b["id"]) for b in loader) == 1000
    loader.close()


def test_side_files_stay_silent(tmp_path, recwarn):
    _real_parquet(tmp_path / "part-0.parquet")
    for name in ("_SUCCESS", "_metadata", "_common_metadata", ".part-0.parquet.crc", "part-0.parquet.crc",
                 ".hidden.csv", "_tmp.csv"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "_temporary").mkdir()
    (tmp_path / "_temporary" / "x.csv").write_text("x")
    with Loader(str(tmp_path), batch_size=100, seed=0) as loader:
        assert loader.dataset.skipped == ()
    assert not [w for w in recwarn if "skipped" in str(w.message)]


# -- messages ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["text", "empty", "truncated"])
def test_truncated_footer_is_called_truncated(tmp_path, no_workers, kind):
    data = b""
    _real_parquet(tmp_path / "good.parquet")
    if kind == "text":
        data = b"id,x\n1,2\n"
    elif kind == "truncated":
        raw = (tmp_path / "good.parquet").read_bytes()
        data = raw[: len(raw) // 2]
    (tmp_path / "bad.parquet").write_bytes(data)
    with pytest.raises(DatasetError) as info:
        Loader(str(tmp_path / "bad.parquet"), batch_size=8, seed=0)
    msg = str(info.value)
    assert "it does not end with the Parquet magic bytes, so it is truncated (an interrupted write or copy?) " \
           "or not a Parquet file (" in msg
    assert ".." not in msg and "Is it a complete Parquet file?" not in msg


def test_complete_but_damaged_footer_is_not_called_incomplete(tmp_path, no_workers):
    raw = bytearray(pq_bytes := _parquet_bytes())
    footer_len = int.from_bytes(raw[-8:-4], "little")
    start = len(raw) - 8 - footer_len
    raw[start:start + footer_len] = b"\xff" * footer_len  # garbage where the thrift footer was
    assert len(raw) == len(pq_bytes) and raw.endswith(b"PAR1")
    (tmp_path / "bad.parquet").write_bytes(bytes(raw))
    with pytest.raises(DatasetError) as info:
        Loader(str(tmp_path / "bad.parquet"), batch_size=8, seed=0)
    msg = str(info.value)
    assert msg.startswith(f"cannot read the Parquet footer of '{tmp_path}/bad.parquet': its footer is damaged (")
    assert msg.endswith("). Remove or rewrite it, or leave it out of the source.")
    assert "Is it a complete" not in msg and "truncated" not in msg and ".." not in msg and "\n" not in msg


def _parquet_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    pq.write_table(pa.table({"id": np.arange(100)}), buf)
    return buf.getvalue()


def test_empty_single_file_names_the_file(tmp_path, no_workers):
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "a.parquet")
    with pytest.raises(EmptyDatasetError, match=rf"^the file '{tmp_path}/a.parquet' has no rows: it holds no "
                                                r"non-empty row group$"):
        Loader(str(tmp_path / "a.parquet"), batch_size=8, seed=0)
    with pytest.raises(EmptyDatasetError, match=rf"^the dataset at '{tmp_path}' has no rows: its 1 file"):
        Loader(str(tmp_path), batch_size=8, seed=0)  # the folder: named as the folder


@pytest.mark.parametrize(("t", "advice"), [
    (pa.struct([("a", pa.int64())]), "Write one column per field (flatten the struct)"),
    (pa.map_(pa.string(), pa.int64()), "Write its keys and values as two list columns"),
    (pa.list_(pa.list_(pa.int64())), "Variable-length lists of lists have no flat NumPy layout"),
    (pa.list_(pa.string(), 2), "Fixed-size lists of strings are not mapped"),
    (pa.list_(pa.list_(pa.string())), "Variable-length lists of lists have no flat NumPy layout"),
    (pa.time64("us"), "Leave it out with columns=[...]"),
])
def test_unsupported_types_suggest_columns(tmp_path, t, advice):
    from detload import UnsupportedTypeError

    col = pa.array([None], t)
    pq.write_table(pa.table({"id": [1], "odd": col}), tmp_path / "a.parquet")
    with pytest.raises(UnsupportedTypeError) as info:
        Loader(str(tmp_path), batch_size=8, seed=0)
    msg = str(info.value)
    assert msg.startswith("column 'odd' has Arrow type ") and ", which detload does not map to NumPy. " in msg
    assert advice in msg and "columns=[...]" in msg
    with Loader(str(tmp_path), batch_size=8, seed=0, columns=["id"]) as loader:  # what the advice says works
        assert [b["id"].tolist() for b in loader] == [[1]]


@pytest.mark.parametrize("given, name", [("{root}/a\x00b", "source"), (["{root}", "{root}/x\x00.parquet"], "source[1]")])
def test_a_nul_in_source_is_refused_naming_source(ds, no_workers, given, name):
    source = [s.format(root=ds) for s in given] if isinstance(given, list) else given.format(root=ds)
    bad = source if isinstance(source, str) else source[1]
    with pytest.raises(OptionError) as e:
        Loader(source, batch_size=8, seed=0)
    assert str(e.value) == (f"{name} {bad!r} holds a NUL character (\\x00) at position {bad.index(chr(0))}, "
                            "which no path or URI can contain; remove it")


@pytest.mark.parametrize("cache, name", [(str, "cache"), (detload.Cache, "Cache.dir")])
def test_a_nul_in_the_cache_folder_is_refused_naming_it(ds, tmp_path, no_workers, cache, name):
    bad = f"{tmp_path}/c\x00"
    with pytest.raises(OptionError) as e:
        Loader(ds, batch_size=8, seed=0, cache=bad if cache is str else cache(dir=bad))
    assert str(e.value) == (f"{name} {bad!r} holds a NUL character (\\x00) at position {len(str(tmp_path)) + 2}, "
                            "which no path or URI can contain; remove it")
    assert not (tmp_path / "c").exists()


def test_a_nul_in_the_manifest_path_is_refused_naming_it(ds, tmp_path, no_workers):
    bad = f"{tmp_path}/m\x00.jsonl"
    with pytest.raises(OptionError) as e:
        Loader(ds, batch_size=8, seed=0, manifest=bad)
    assert str(e.value) == (f"manifest {bad!r} holds a NUL character (\\x00) at position {len(str(tmp_path)) + 2}, "
                            "which no path or URI can contain; remove it")
