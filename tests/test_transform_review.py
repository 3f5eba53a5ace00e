"""An outside review of `transform=` on datasets the other transform tests do not use: many small
row groups, a one-row row group, an empty file, string and list columns with nulls, Hive folders and
a DuckDB file (tests/_xformreview.py). Each defect the review found has a test here."""

from __future__ import annotations

import _xformdata as X
import _xformreview as R
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from detload import Loader, Transform, WorkerError
from detload.audit import hash_batch


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> str:
    return R.write_odd(str(tmp_path_factory.mktemp("odd") / "ds"))


def _hashes(loader, epochs=(0, 1)):
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out += [hash_batch(b)[0] for b in loader]
    return out


def _stored_at(root, cache):
    with Loader(root, batch_size=100, seed=1, shuffle=False, cache=cache,
                transform=Transform(X.where_from, name="where", version="1")) as ld:
        return sorted(set(np.concatenate([b["rg"] for b in ld]).tolist()))


def test_cached_output_belongs_to_the_files_place_in_the_dataset(tmp_path):
    """ctx.file_index and ctx.file are the transform's input too: a file that moves in the canonical
    order (a file added before it) must not read back the output made at its old index."""
    root = tmp_path / "ds"
    root.mkdir()
    pq.write_table(pa.table({"id": np.arange(10)}), root / "b.parquet")
    cache = tmp_path / "c"
    assert _stored_at(root, cache) == [0]  # b is file 0, its output cached
    pq.write_table(pa.table({"id": np.arange(100, 110)}), root / "a.parquet")
    assert _stored_at(root, None) == [0, 100]
    assert _stored_at(root, cache) == [0, 100]  # b is file 1 now: another output


def test_cached_output_belongs_to_the_files_path_from_the_root(tmp_path):
    """The same file from another root has another ctx.file: its own cached output."""
    (tmp_path / "up" / "ds").mkdir(parents=True)
    pq.write_table(pa.table({"id": np.arange(10)}), tmp_path / "up" / "ds" / "b.parquet")
    t = Transform(R.path_len, name="plen", version="1")
    got = []
    for root in (tmp_path / "up" / "ds", tmp_path / "up"):
        with Loader(root, batch_size=100, seed=1, transform=t, cache=tmp_path / "c") as ld:
            got.append(set(np.concatenate([b["plen"] for b in ld]).tolist()))
    assert got == [{len("b.parquet")}, {len("ds/b.parquet")}]


# -- the counting pass of rows="changes" ---------------------------------------------------

def _plan_of(root, threads, monkeypatch, **kw):
    import detload._xform as XF

    monkeypatch.setattr(XF.plan_transform, "__defaults__", (threads,))
    with Loader(root, batch_size=20, seed=5, null_fill=R.FILL, **kw) as ld:
        return ld.order["units_digest"], len(ld), _hashes(ld)


@pytest.mark.parametrize("cache", [False, True])
def test_the_counting_pass_in_threads_plans_what_a_sequential_one_does(odd, tmp_path, monkeypatch, cache):
    kw = dict(transform=R.DROP_ODD, filter=[("id", "<", 4100)])
    one = _plan_of(odd, 1, monkeypatch, cache=(tmp_path / "a") if cache else None, **kw)
    many = _plan_of(odd, 8, monkeypatch, cache=(tmp_path / "b") if cache else None, **kw)
    assert one == many
    if cache:  # the threads filled the cache: a warm loader plans the same from it
        assert _plan_of(odd, 8, monkeypatch, cache=tmp_path / "b", **kw) == one


def test_the_counting_pass_in_threads_reports_the_first_failing_row_group(odd, monkeypatch):
    t = Transform(R.fails_after_first_file, name="late", version="1", rows="changes")
    with pytest.raises(WorkerError, match=r"planning failed: transform 'late' raised LookupError: no table for "
                                          r"file 1, on part=a/one.parquet row group 0"):
        _plan_of(odd, 8, monkeypatch, transform=t)
