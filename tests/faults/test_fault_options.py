"""Bad input at construction: only documented exceptions, each with a message that names the problem.

Hypothesis throws arbitrary values at every option; the constructor may only
raise OptionError / DatasetError (both ValueError) — never an AttributeError,
a numpy error or a bare TypeError from deep inside. The listed bad inputs are
checked one by one for their message.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultkit import FULL, write_fault_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detload import (
    DatasetError,
    EmptyDatasetError,
    Loader,
    OptionError,
    Pool,
    SchemaMismatchError,
    Storage,
    UnsupportedTypeError,
)

_ROOT: list[str] = []


def _root(tmp_path_factory) -> str:
    if not _ROOT:
        _ROOT.append(write_fault_dataset(str(tmp_path_factory.mktemp("opts")), files=2, row_groups=2, rows=50).root)
    return _ROOT[0]


WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5), st.binary(max_size=4), st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.just(np.int64(3)),
    st.just(np.float32(2.0)), st.just(math.nan), st.just(object()), st.just("auto"),
)
SMALL = st.integers(-2, 70)


def _opt(valid: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(valid, WEIRD)


class _Group:
    """An option group to build inside the test (building one checks its fields, and may raise)."""

    def __init__(self, cls: type, fields: dict) -> None:
        self.cls, self.fields = cls, fields

    def build(self) -> object:
        return self.cls(**self.fields)

    def __repr__(self) -> str:  # hypothesis shows the failing example
        return f"{self.cls.__name__}(**{self.fields!r})"


def _group(cls: type, **fields: st.SearchStrategy) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional=fields).map(lambda f: _Group(cls, f))


OPTIONS = st.fixed_dictionaries(
    {"batch_size": _opt(SMALL), "seed": _opt(st.integers(-1, 2**64))},
    optional={
        "workers": _opt(SMALL),
        "pool": _opt(st.one_of(st.sampled_from(["thread", "process", "fork", ""]),
                               _group(Pool, kind=_opt(st.sampled_from(["thread", "process", "fork"])),
                                      prefetch=_opt(SMALL), stall_timeout=_opt(st.floats(-1, 10))))),
        "columns": _opt(st.lists(st.sampled_from(["id", "x", "s", "nope", ""]), max_size=4)),
        "shuffle": WEIRD,
        "shuffle_window": _opt(SMALL),
        "drop_last": WEIRD,
        "null_fill": _opt(st.dictionaries(st.sampled_from(["id", "x", "zz"]), st.integers(), max_size=2)),
        "partitions": _opt(SMALL),
        "distributed": _opt(st.tuples(_opt(SMALL), _opt(SMALL))),
        "storage": st.one_of(st.none(), st.just("local"), st.integers(), _group(
            Storage, filesystem=st.one_of(st.none(), st.just("local"), st.integers()),
            partition_types=_opt(st.dictionaries(st.text(max_size=3), st.sampled_from(["int64", "string", "x"]),
                                                 max_size=1)))),
    },
)


@settings(max_examples=400 if FULL else 60, deadline=None, suppress_health_check=list(HealthCheck))
@given(opts=OPTIONS)
def test_fuzzed_options_raise_only_documented_errors(tmp_path_factory, opts):
    root = _root(tmp_path_factory)
    try:
        groups = {k: v.build() for k, v in opts.items() if isinstance(v, _Group)}
        loader = Loader(root, **{**opts, **groups})
        len(loader)  # plans epoch 0 (partitions and drop_last are checked against the data here)
    except (OptionError, DatasetError) as exc:
        assert str(exc)  # says something
        return
    loader.close()


# -- the bad inputs one by one -------------------------------------------------

@pytest.fixture
def root(tmp_path):
    return write_fault_dataset(str(tmp_path / "d"), files=2, row_groups=2, rows=50).root


@pytest.mark.parametrize("kw,match", [
    (dict(batch_size=0), r"batch_size must be an int >= 1, got 0"),
    (dict(batch_size=2.5), r"batch_size must be an int >= 1, got float 2.5"),
    (dict(batch_size=True), r"batch_size must be an int >= 1, got bool"),
    (dict(seed=-1), r"seed must be an int in \[0, 2\*\*64\), got -1"),
    (dict(seed=None), r"seed must be an int in \[0, 2\*\*64\), got NoneType"),
    (dict(workers=0), r"workers must be an int in \[1, 256\] or 'auto', got 0"),
    (dict(workers="many"), r"workers must be an int in \[1, 256\] or 'auto'"),
    (dict(pool="fork"), r"pool must be 'thread' or 'process', got 'fork'"),
    (dict(pool=lambda: Pool(prefetch=0)), r"Pool.prefetch must be an int in \[1, 1024\] \(blocks queued per worker\), got 0"),
    (dict(order="windowed", shuffle_window=0), r"shuffle_window must be an int >= 1"),
    (dict(shuffle="yes"), r"shuffle must be True or False"),
    (dict(drop_last=1), r"drop_last must be True or False"),
    (dict(pool=lambda: Pool(stall_timeout=0)),
     r"Pool.stall_timeout must be a positive number of seconds up to 1e\+09, or None \(wait forever\)"),
    (dict(pool=lambda: Pool(stall_timeout=-5.0)), r"Pool.stall_timeout must be a positive number"),
    (dict(partitions=3, distributed=(0, 2)), r"partitions=3 must be a multiple of the world size 2"),
    (dict(batch_size=3, partitions=2), r"must divide by partitions=2"),
    # At most one partition (and rank) per row group (4 here), and a micro-batch each must fit.
    (dict(partitions=5, batch_size=5), r"^partitions=5 exceeds the 4 non-empty row groups of the dataset"),
    (dict(distributed=(0, 10**20), batch_size=1),
     r"^world_size=100000000000000000000 exceeds the 4 non-empty row groups .* at most 4\."),
    (dict(partitions=2**63, batch_size=2**63), r"^partitions=9223372036854775808 exceeds the 4 non-empty row groups"),
    (dict(partitions=4, batch_size=204, drop_last=True),
     r"the epoch holds 200 rows, the smallest of the 4 partitions 50, fewer than one micro-batch of 51 rows"),
    (dict(distributed=(2, 2)), r"Distributed.rank must be an int in \[0, 2\), got 2"),
    (dict(columns="id"), r"columns must be a list of names, got the string 'id'"),
    (dict(columns=[]), r"columns=\[\] selects nothing"),
    (dict(columns=False), r"columns must be a list of names or None, got bool False"),
    (dict(columns={"id", "x"}), r"columns must be a list of names or None, got set"),
    (dict(columns=["id", "id"]), r"columns lists \['id'\] more than once"),
    (dict(null_fill={"zz": 0}), r"null_fill names \['zz'\], which are not among the loaded columns"),
    (dict(null_fill=[1]), r"null_fill must be a dict"),
    (dict(storage=lambda: Storage(filesystem=42)),
     r"Storage.filesystem must be a pyarrow.fs.FileSystem or an fsspec filesystem, got int"),
    (dict(storage=42), r"storage must be a detload.Storage, a pyarrow.fs.FileSystem or fsspec filesystem, or None, "
                       r"got int 42"),
    (dict(batch_size=1000, drop_last=True), r"drop_last=True drops every row: the epoch holds 200 rows.* micro-batch of 1000 rows"),
])
def test_bad_option_messages(root, kw, match):
    with pytest.raises(OptionError, match=match):
        # A group is built here, in the raises block: building it checks its fields.
        args = {"batch_size": 10, "seed": 0, **{k: v() if callable(v) else v for k, v in kw.items()}}
        Loader(root, **args).plan()  # drop_last/partitions checks happen when the epoch is planned


def test_numpy_integers_are_plain_options(root):
    loader = Loader(root, batch_size=np.int64(10), seed=np.uint64(3), order="windowed", shuffle_window=np.int32(2))
    assert len(loader) == 20 and loader.state_dict()["order"]["seed"] == 3
    loader.close()


def test_unknown_column(root):
    with pytest.raises(DatasetError, match=r"unknown column\(s\) \['nope'\]; the dataset has \['id', 'x', 's'\]"):
        Loader(root, batch_size=10, seed=0, columns=["id", "nope"])


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Loader(str(tmp_path / "nowhere"), batch_size=10, seed=0)
    with pytest.raises(FileNotFoundError, match="matches no file"):
        Loader(str(tmp_path / "*.parquet"), batch_size=10, seed=0)


def test_folder_without_parquet(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "_SUCCESS").write_text("")
    with pytest.raises(DatasetError, match="no Parquet data files under"):
        Loader(str(tmp_path), batch_size=10, seed=0)


def test_bad_source_type():
    with pytest.raises(OptionError, match="source must be a path, a glob, a URI or a non-empty list"):
        Loader([], batch_size=10, seed=0)
    with pytest.raises(OptionError, match="source must be"):
        Loader(42, batch_size=10, seed=0)


def test_empty_dataset(tmp_path):
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "e.parquet")
    with pytest.raises(EmptyDatasetError, match="has no rows"):
        Loader(str(tmp_path), batch_size=10, seed=0)


def test_schema_drift_between_files(tmp_path):
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array(["1"], pa.string())}), tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatchError, match=r"'id' is int64 in a.parquet but string in b.parquet"):
        Loader(str(tmp_path), batch_size=10, seed=0)


def test_unsupported_type(tmp_path):
    import decimal

    pq.write_table(pa.table({"d": pa.array([decimal.Decimal("1.5")], pa.decimal128(5, 2)), "i": [1]}),
                   tmp_path / "a.parquet")
    with pytest.raises(UnsupportedTypeError, match=r"column 'd' has Arrow type decimal128\(5, 2\).*pass cast=\{'d': 'float64'\}"):
        Loader(str(tmp_path), batch_size=10, seed=0)
    Loader(str(tmp_path), batch_size=10, seed=0, columns=["i"]).close()  # leaving it out works


def test_null_in_integer_column_names_file_and_row_group(tmp_path, pool):
    from detload import DataError

    pq.write_table(pa.table({"i": pa.array([1, None, 3], pa.int64())}), tmp_path / "n.parquet")
    with Loader(str(tmp_path), batch_size=2, seed=0, pool=pool) as loader, \
            pytest.raises(DataError, match=r"column 'i' in n.parquet row group 0 holds 1 null\(s\).*null_fill"):
        list(loader)
    os.remove(tmp_path / "n.parquet")
