"""Transforms deliver the same rows at any worker count, pool and cache state on the odd datasets
real writers produce: many small row groups, a one-row row group, an empty file, string and list
columns with nulls, Hive folders and a DuckDB file (tests/_xformodd.py)."""

from __future__ import annotations

import os

import _xformdata as X
import _xformodd as R
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matrix import FULL

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
    import detload.planning.transform as XF

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


# -- the same batches everywhere, on the odd dataset ------------------------------------------

CASES = {
    "deterministic": dict(transform=R.FEATS),
    "random": dict(transform=R.NOISE, columns=["id", "s", "f"], null_fill={"s": "", "f": 0.0}),
    "changes": dict(transform=R.DROP_ODD),
    "filter": dict(transform=R.FEATS, filter=[("id", "in", [*range(0, 5000, 3), 1000])]),
    "filter-random": dict(transform=R.NOISE, filter=[("f", ">", 50.0)], columns=["id", "s", "f"],
                          null_fill={"s": "", "f": 0.0}),
    "group": dict(transform=R.FEATS, order="windowed", group_by="g", batch_size=30),
    "group-random": dict(transform=R.NOISE_KEYED, order="windowed", group_by="g", columns=["id", "g", "s", "f"],
                         null_fill={"s": "", "f": 0.0}),
    "group-filter": dict(transform=R.FEATS, order="windowed", group_by="g", filter=[("id", "<", 3020)], batch_size=30),
}


def _run(root, **kw):
    opts = dict(batch_size=37, seed=5, null_fill=R.FILL)
    opts.update(kw)
    with Loader(root, **opts) as ld:
        return _hashes(ld)


# Every case at 1/3/8 workers and both pools; the process cells (slow to start) for fewer cases,
# 8 process workers only in the full form (DETLOAD_FULL=1).
CELLS = [(case, w, pool) for case in CASES for w, pool in ((3, "thread"), (8, "thread"))] + [
    (case, w, "process") for case in ("deterministic", "random", "changes", "group-filter")
    for w in ((3, 8) if FULL else (3,))]


@pytest.mark.parametrize("case, workers, pool", CELLS)
def test_the_same_batches_at_every_worker_count_pool_and_cache_state(odd, tmp_path, case, workers, pool):
    ref = _run(odd, **CASES[case])
    assert len(ref) > 10
    assert _run(odd, workers=workers, pool=pool, **CASES[case]) == ref
    for state in ("cold", "warm"):
        assert _run(odd, workers=workers, pool=pool, cache=tmp_path / "c", **CASES[case]) == ref, state


@pytest.mark.parametrize("case", ["deterministic", "random", "changes", "group-filter"])
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_the_same_batches_after_a_resume_at_several_steps(odd, tmp_path, case, pool):
    opts = dict(batch_size=37, seed=5, null_fill=R.FILL)
    opts.update(CASES[case])
    ref = _run(odd, **CASES[case])
    per = len(ref) // 2  # two epochs of one length
    for step in (1, per - 1, per, per + 2):
        with Loader(odd, **opts) as ld:
            got = []
            it = iter(ld)
            for _ in range(min(step, per)):
                got.append(hash_batch(next(it))[0])
            if step >= per:
                for _ in it:
                    pass
                ld.set_epoch(1)
                it = iter(ld)
                for _ in range(step - per):
                    got.append(hash_batch(next(it))[0])
            state = ld.state_dict()
        with Loader(odd, workers=3, pool=pool, cache=tmp_path / "c", **opts) as again:
            again.load_state_dict(state)
            rest = [hash_batch(b)[0] for b in again]
            if step < per:
                again.set_epoch(1)
                rest += [hash_batch(b)[0] for b in again]
        assert got + rest == ref, step


# -- what the output is ---------------------------------------------------------------------

def _by_id(batches):
    cols: dict[str, list] = {}
    for b in batches:
        b = b.unpack() if hasattr(b, "unpack") else b
        for k, v in b.items():
            cols.setdefault(k, []).append(v)
    return cols


def test_the_output_is_the_function_applied_to_the_rows_read(odd):
    """Nulls filled, strings and lists as Ragged, a Hive column, the one-row and DuckDB row groups."""
    with Loader(odd, batch_size=1000, seed=5, shuffle=False, null_fill=R.FILL) as plain, \
            Loader(odd, batch_size=1000, seed=5, shuffle=False, null_fill=R.FILL, transform=R.FEATS) as ld:
        rows = list(plain)
        got = list(ld)
    assert [len(b["id"]) for b in got] == [len(b["id"]) for b in rows]
    for b, r in zip(got, rows):
        want = R.feats(dict(r), None)
        assert list(b) == list(want)
        for k in want:
            assert (b[k] == want[k]) if hasattr(want[k], "offsets") else np.array_equal(b[k], want[k]), k
    ids = np.concatenate([b["id"] for b in got])
    assert {1000, 3040, 4299}.issubset(set(ids.tolist())) and len(ids) == 230 + 1 + 96 + 300


@pytest.mark.parametrize("case", ["group", "group-filter"])
def test_under_group_by_the_transform_keeps_the_groups_of_the_plain_loader(odd, case):
    kw = dict(CASES[case])
    del kw["transform"]
    with Loader(odd, seed=5, null_fill=R.FILL, **kw) as plain, \
            Loader(odd, seed=5, null_fill=R.FILL, **CASES[case]) as ld:
        assert len(ld) == len(plain)
        for b, p in zip(ld, plain):
            assert np.array_equal(b.offsets, p.offsets)
            bu, pu = b.unpack(), p.unpack()
            assert np.array_equal(bu["g"], pu["g"]) and np.array_equal(bu["id"], pu["id"])
            assert np.array_equal(bu["bucket"], (pu["id"] * 2654435761 % 101).astype(np.int32))


# -- the cache -------------------------------------------------------------------------------

def _stages(ld, mark):
    s = ld.stats(since=mark).stages
    return {k: s[k].count if k in s else 0 for k in ("read", "convert", "transform", "cache_read")}


@pytest.mark.parametrize("case", ["deterministic", "changes", "filter", "group-filter"])
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_warm_epochs_neither_decode_nor_transform(odd, tmp_path, case, pool):
    opts = dict(batch_size=37, seed=5, null_fill=R.FILL, workers=3, pool=pool, cache=tmp_path / "c")
    opts.update(CASES[case])
    with Loader(odd, **opts) as ld:
        _hashes(ld, (0,))
        mark = ld.stats_mark()
        _hashes(ld, (1,))
        warm = _stages(ld, mark)
        n = sum(len(u.ranges) for u in ld._units.units)  # one read per range (group_by's units hold several)
    assert warm == {"read": 0, "convert": 0, "transform": 0, "cache_read": n}


def test_a_random_transform_reruns_on_cached_input(odd, tmp_path):
    opts = dict(batch_size=37, seed=5, workers=3, cache=tmp_path / "c")
    opts.update(CASES["filter-random"])
    with Loader(odd, **opts) as ld:
        _hashes(ld, (0,))
        mark = ld.stats_mark()
        _hashes(ld, (1,))
        warm = _stages(ld, mark)
        n = len(ld._units.units)
    assert warm == {"read": 0, "convert": 0, "transform": n, "cache_read": n}


def test_a_new_version_invalidates_the_cached_output(odd, tmp_path):
    opts = dict(batch_size=1000, seed=5, shuffle=False, null_fill=R.FILL, cache=tmp_path / "c")
    with Loader(odd, transform=R.FEATS, **opts) as ld:
        old = np.concatenate([b["bucket"] for b in ld])
    with Loader(odd, transform=R.FEATS_V2, **opts) as ld:
        mark = ld.stats_mark()
        new = np.concatenate([b["bucket"] for b in ld])
        st = _stages(ld, mark)
    assert np.array_equal(new, old + 1000)
    # Every row group transformed anew, but the first, which planning ran (and cached) first.
    assert st["transform"] == len(ld._units.units) - 1 and st["cache_read"] == 1
    with Loader(odd, transform=R.FEATS, **opts) as ld:  # version 1's entries are still there, and its own
        mark = ld.stats_mark()
        assert np.array_equal(np.concatenate([b["bucket"] for b in ld]), old)
        assert _stages(ld, mark)["transform"] == 0


# -- output checks -------------------------------------------------------------------------

_T = Transform(X.hashed, name="t")


@pytest.mark.parametrize("values, kind, message", [
    (np.ones((3, 2), np.int32), "list", r"as a Ragged whose values are 2-D \(int32, shape \(3, 2\)\); a Ragged's "
                                        r"values are 1-D"),
    (np.array(3, np.int32), "list", r"as a Ragged whose values are 0-D"),
    (np.ones(3, np.uint8), "text", r"as a Ragged of kind 'text'; the kinds are 'list', 'utf8' and 'binary'"),
    (np.ones(3, np.int32), "utf8", r"as a Ragged\[utf8\] of int32 values; text and bytes are uint8 values"),
    (np.array(["a", "b", "c"]), "list", r"as a Ragged whose values are an array of dtype <U1"),
])
def test_a_ragged_output_not_in_detloads_layout_is_refused(values, kind, message):
    from detload import DataError, Ragged
    from detload._xform import check_output

    out = {"a": Ragged(values, np.array([0, 1, 3], dtype=np.int64), kind)}
    with pytest.raises(DataError, match=r"transform 't' returned column 'a' for W " + message):
        check_output(_T, out, "W", None)


def test_a_ragged_output_with_2d_values_is_refused_when_the_loader_is_built(odd):
    from detload import DataError

    with pytest.raises(DataError, match=r"transform 'r2' returned column 'r' for part=a/many.parquet row group 0 "
                                        r"as a Ragged whose values are 2-D"):
        Loader(odd, batch_size=50, seed=5, columns=["id"], transform=Transform(R.ragged_2d, name="r2"))


def test_nan_and_nat_in_a_deterministic_output_are_not_randomness(odd):
    """The rerun check compares the two outputs bitwise: NaN != NaN and NaT != NaT must not make a
    deterministic transform look random."""
    t = Transform(R.with_nan_and_nat, name="nan", version="1")
    with Loader(odd, batch_size=50, seed=5, columns=["id"], transform=t) as ld:
        got = list(ld)
    assert sum(len(b["id"]) for b in got) == 627
    assert any(np.isnan(b["r"].values).any() for b in got) and any(np.isnat(b["when"]).any() for b in got)


# -- the determinism matrix (world sizes included) on the odd dataset -------------------------

@pytest.mark.slow
@pytest.mark.parametrize("case", ["random", "changes", "filter-random", "group-filter"])
def test_the_odd_dataset_gives_the_reference_batches_in_every_cell(tmp_path, case):
    from matrix import check_matrix

    # Files of its own: group_by's verdicts remembered in this process about the shared dataset's
    # files would keep them out of the matrix's warm cache (see the xfail test below).
    root = R.write_odd(str(tmp_path / "ds"))
    opts = dict(batch_size=40, seed=11, null_fill=R.FILL)
    opts.update(CASES[case])
    check_matrix(root, opts, str(tmp_path / "cells"))


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_outputs_of_unusual_layouts_are_delivered_as_returned(odd, tmp_path, pool):
    """Big-endian, strided, Fortran-ordered, 3-D, bool, datetime, float16 and a strided Ragged's
    values: the same values with no cache, cold and warm."""
    t = Transform(R.odd_arrays, name="odd", version="1")
    for state in ("none", "cold", "warm"):
        cache = None if state == "none" else tmp_path / "c"
        with Loader(odd, batch_size=37, seed=5, columns=["id"], transform=t, pool=pool, workers=2,
                    cache=cache) as ld:
            for b in ld:
                ids = b["id"]
                for k, want in R.odd_expected(ids).items():
                    assert np.array_equal(b[k], want) and b[k].dtype.newbyteorder("=") == want.dtype, k
                assert b["cube"].shape == (len(ids), 2, 2)
                assert np.array_equal(b["rag"].values, ids.astype(np.int16))


def _entry_names(cache):
    return sorted(os.path.relpath(os.path.join(d, n), cache) for d, _, names in os.walk(cache / "v1" / "objects")
                  for n in names)


def test_a_second_cache_filled_in_one_process_holds_the_group_check_verdicts(tmp_path):
    root = R.write_odd(str(tmp_path / "ds"))  # files of this test's own: nothing remembered about them yet
    opts = dict(CASES["group-filter"], seed=5, null_fill=R.FILL)
    for name in ("a", "b"):
        with Loader(root, cache=tmp_path / name, **opts) as ld:
            _hashes(ld)
    a, b = _entry_names(tmp_path / "a"), _entry_names(tmp_path / "b")
    assert a == b  # a holds 35 verdict entries more than b
