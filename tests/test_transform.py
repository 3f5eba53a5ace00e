"""`transform=`: a function run in the workers on each whole row group after the selection.

The same batches at every worker count, pool, cache state and resume point (random transforms
included); its identity in order, fingerprint, state and `detload verify`; cached output that
later epochs read instead of decoding and transforming; and every error message.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import _xformdata as X
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matrix import check_matrix

import detload
from detload import (
    DataError,
    EmptyDatasetError,
    Loader,
    OptionError,
    StateError,
    Transform,
    TransformContext,
    WorkerError,
)
from detload._streams import row_group_entropy
from detload.audit import hash_batch
from detload.verify import verify

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUT = {"a.parquet": [300, 200, 17], "b.parquet": [250, 0, 99], "c/d.parquet": [210, 90, 33, 120]}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    from strategies import write_dataset

    return write_dataset(str(tmp_path_factory.mktemp("xform") / "ds"), LAYOUT, seed=2).root


@pytest.fixture
def counter(tmp_path):
    return str(tmp_path / "calls.txt")


def _counted(counter, fn, **kw):
    return Transform(X.Counted(fn, counter), **kw)


def _hashes(loader, epochs=(0,)):
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out += [hash_batch(b)[0] for b in loader]
    return out


def _collect(loader):
    cols: dict[str, list] = {}
    for b in loader:
        for k, v in b.items():
            cols.setdefault(k, []).append(v)
    return cols


# -- the same batches everywhere -------------------------------------------------------

@pytest.mark.slow
@settings(max_examples=2)
@given(seed=st.integers(0, 2**64 - 1), batch=st.sampled_from([32, 64, 100]), window=st.integers(1, 3))
def test_random_transform_gives_the_reference_batches_in_every_cell(root, tmp_path_factory, seed, batch, window):
    check_matrix(root, dict(batch_size=batch, seed=seed, order="windowed", shuffle_window=window, transform=X.DROPOUT),
                 str(tmp_path_factory.mktemp("cells")))


@pytest.mark.slow
def test_cached_deterministic_transform_gives_the_reference_batches_in_every_cell(root, tmp_path):
    check_matrix(root, dict(batch_size=64, seed=3, order="windowed", shuffle_window=2, transform=X.HASHED,
                            columns=["id", "f32", "s"]), str(tmp_path))


@pytest.mark.slow
def test_changing_rows_gives_the_reference_batches_in_every_cell(root, tmp_path):
    check_matrix(root, dict(batch_size=50, seed=4, transform=X.EVENS, filter=[("id", ">", 1100)]), str(tmp_path))


def test_random_draws_belong_to_the_row_group_and_epoch(root):
    """A partition boundary that cuts a row group does not change its draws; the epoch does."""
    opts = dict(batch_size=64, seed=9, shuffle=False, transform=X.DROPOUT, columns=["id", "f32", "s"])
    with Loader(root, partitions=1, **opts) as a, Loader(root, partitions=4, **opts) as b:
        rows = {}
        for name, ld in (("one", a), ("four", b)):
            got = _collect(ld)
            order = np.argsort(np.concatenate(got["id"]))
            rows[name] = {k: np.concatenate(v)[order] for k, v in got.items() if k != "s"}
        for k in rows["one"]:
            assert np.array_equal(rows["one"][k], rows["four"][k]), k
        a.set_epoch(1)
        got = _collect(a)
        order = np.argsort(np.concatenate(got["id"]))
        assert not np.array_equal(np.concatenate(got["neg"])[order], rows["one"]["neg"])


def test_output_is_what_the_function_returns(root):
    with Loader(root, batch_size=1000, seed=1, shuffle=False, columns=["id", "f32", "s"],
                transform=X.HASHED) as ld:
        specs = {s.name: (s.kind, s.dtype, s.inner) for s in ld.column_specs}
        assert specs == {"id": ("fixed", "<i8", ()), "bucket": ("fixed", "<i4", ()), "logf": ("fixed", "<f8", ()),
                         "cross": ("fixed", "<i2", (2,)), "s": ("ragged", "|u1", ())}
        got = _collect(ld)
    ids = np.concatenate(got["id"])
    assert len(ids) == sum(sum(v) for v in LAYOUT.values())
    assert np.array_equal(np.concatenate(got["bucket"]), (ids * 2654435761 % 97).astype(np.int32))
    assert np.array_equal(np.concatenate(got["cross"]), np.stack([ids % 7, ids % 11], axis=1))


def test_ragged_output(root):
    with Loader(root, batch_size=100, seed=1, columns=["id", "s"], transform=X.ragged_words) as ld:
        b = next(iter(ld))
        assert isinstance(b["rev"], detload.Ragged) and b["rev"].kind == "binary"
        assert len(b["rev"]) == len(b["id"])


# -- identity --------------------------------------------------------------------------

def test_identity_is_an_order_option(root, tmp_path):
    with Loader(root, batch_size=64, seed=1) as plain:
        assert "transform" not in plain.order
    with Loader(root, batch_size=64, seed=1, transform=X.HASHED, columns=["id", "f32", "s"]) as ld:
        assert ld.order["transform"] == {"name": "hash", "version": "1", "random": False, "rows": "same"}
        state = ld.state_dict()
        fp = ld.fingerprint
    assert fp != plain.fingerprint
    assert json.loads(json.dumps(state)) == state
    v2 = Transform(X.hashed_v2, name="hash", version="2")
    with Loader(root, batch_size=64, seed=1, transform=v2, columns=["id", "f32", "s"]) as other:
        assert other.fingerprint != fp
        with pytest.raises(StateError, match=r"transform: \{.*'version': '1'.*\} in the state, \{.*'version': '2'"):
            other.load_state_dict(state)


def test_verify_names_a_differing_transform(root, tmp_path):
    cols = ["id", "f32", "s"]
    for name, t in (("a", X.HASHED), ("b", Transform(X.hashed_v2, name="hash", version="2"))):
        with Loader(root, batch_size=64, seed=1, columns=cols, transform=t, manifest=str(tmp_path / f"{name}.jsonl")) as ld:
            list(ld)
    res = verify(str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"))
    assert not res.identical and "transform" in res.option_diffs
    assert ("transform (A: {'name': 'hash', 'random': False, 'rows': 'same', 'version': '1'}, "
            "B: {'name': 'hash', 'random': False, 'rows': 'same', 'version': '2'})") in res.message


def test_a_plain_callable_is_named_by_its_qualified_name_and_never_cached(root, tmp_path, counter):
    cache = tmp_path / "c"
    with Loader(root, batch_size=64, seed=1, columns=["id", "f32", "s"], transform=X.hashed) as ld:
        assert ld.order["transform"] == {"name": "_xformdata.hashed", "version": None, "random": False,
                                         "rows": "same"}
    for _ in range(2):
        with Loader(root, batch_size=64, seed=1, columns=["id", "f32", "s"], transform=X.Counted(X.hashed, counter),
                    cache=cache) as ld:
            assert ld.order["transform"]["name"] == "_xformdata.Counted"
            list(ld)
    assert X.calls(counter) == 2 * (2 + 9)  # the first row group twice at planning, then every one, each time
    names = [n for _, _, fs in os.walk(cache) for n in fs if "-d" in n]
    assert not names, "a plain callable's output was cached"


# -- cached output ---------------------------------------------------------------------

def _stage(ld, mark, name):
    return ld.stats(since=mark).stages[name].count


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_warm_epochs_neither_decode_nor_transform(root, tmp_path, counter, pool):
    opts = dict(batch_size=64, seed=1, columns=["id", "f32", "s"], cache=tmp_path / "c", workers=2, pool=pool,
                transform=_counted(counter, X.hashed, name="hash", version="1"))
    with Loader(root, **opts) as ld:
        assert X.calls(counter) == 2  # the first row group, run twice at planning (its output then cached)
        first = _hashes(ld)
        assert X.calls(counter) == 2 + 8  # epoch 0: the 8 row groups not cached at planning
        mark = ld.stats_mark()
        second = _hashes(ld, (1,))
        assert X.calls(counter) == 2 + 8
        assert _stage(ld, mark, "transform") == 0 and _stage(ld, mark, "read") == 0
        assert _stage(ld, mark, "convert") == 0 and _stage(ld, mark, "cache_read") == 9
    assert first != second  # another epoch's order
    before = X.calls(counter)
    with Loader(root, **opts) as warm:
        assert _hashes(warm, (0, 1)) == first + second
    assert X.calls(counter) == before  # a new loader with a warm cache never calls it


def test_a_new_version_reads_none_of_the_old_entries(root, tmp_path, counter):
    opts = dict(batch_size=64, seed=1, columns=["id", "f32", "s"], cache=tmp_path / "c")
    with Loader(root, transform=_counted(counter, X.hashed, name="hash", version="1"), **opts) as ld:
        old = _collect(ld)
    assert X.calls(counter) == 2 + 8
    with Loader(root, transform=_counted(counter, X.hashed_v2, name="hash", version="2"), **opts) as ld:
        new = _collect(ld)
    assert X.calls(counter) == 2 * (2 + 8)  # planned and run again: nothing read from version 1's entries
    assert np.array_equal(np.sort(np.concatenate(new["bucket"])), np.sort(np.concatenate(old["bucket"]) + 1))


def test_cache_false_and_random_transforms_rerun_every_epoch(root, tmp_path, counter):
    for i, (fn, kw, planning) in enumerate(((X.hashed, dict(cache=False), 2), (X.dropout, dict(random=True), 1))):
        t = Transform(X.Counted(fn, f"{counter}.{i}"), name="t", version="1", **kw)
        with Loader(root, batch_size=64, seed=1, columns=["id", "f32", "s"], transform=t, cache=tmp_path / "c") as ld:
            _hashes(ld)
            assert X.calls(f"{counter}.{i}") == planning + 9
            mark = ld.stats_mark()
            _hashes(ld, (1,))  # (while it runs, workers build epoch 2's first blocks ahead, calling it again)
            assert _stage(ld, mark, "transform") == 9
            # Its input is cached: the second epoch decodes nothing.
            assert _stage(ld, mark, "read") == 0 and _stage(ld, mark, "cache_read") == 9


def test_a_filter_selection_is_part_of_the_cached_identity(root, tmp_path):
    opts = dict(batch_size=64, seed=1, columns=["id", "f32", "s"], transform=X.HASHED, cache=tmp_path / "c")
    with Loader(root, filter=[("id", "<", 1500)], **opts) as a:
        ids_a = np.sort(np.concatenate(_collect(a)["id"]))
    with Loader(root, filter=[("id", ">=", 1500)], **opts) as b:
        ids_b = np.sort(np.concatenate(_collect(b)["id"]))
    assert (ids_a < 1500).all() and (ids_b >= 1500).all()
    assert len(ids_a) + len(ids_b) == sum(sum(v) for v in LAYOUT.values())


# -- rows="changes" ----------------------------------------------------------------------

def _expected_evens(root, flt=None):
    with Loader(root, batch_size=5000, seed=1, columns=["id"], filter=flt) as ld:
        ids = np.concatenate([b["id"] for b in ld])
    keep = ids[ids % 2 == 0]
    return np.sort(np.repeat(keep, np.where(keep % 3 == 0, 2, 1)))


@pytest.mark.parametrize("cache", [False, True])
def test_changing_rows_makes_an_exact_plan(root, tmp_path, counter, cache):
    want = _expected_evens(root)
    opts = dict(batch_size=50, seed=1, cache=(tmp_path / "c") if cache else None,
                transform=_counted(counter, X.evens, name="evens", version="1", rows="changes"))
    with Loader(root, **opts) as ld:
        assert X.calls(counter) == 2 + 8  # the first row group twice, then each other once: the count pass
        steps = len(ld)
        got = _collect(ld)
        assert steps == -(-len(want) // 50) == len(got["id"])
        assert np.array_equal(np.sort(np.concatenate(got["id"])), want)
        assert np.array_equal(np.concatenate(got["half"]), np.concatenate(got["id"]) // 2)
        assert X.calls(counter) == 10 + (0 if cache else 9)  # the count pass filled the cache


def test_a_transform_that_keeps_no_row_is_an_empty_dataset(root):
    def nothing(cols, ctx):
        return {"id": cols["id"][:0]}
    with pytest.raises(EmptyDatasetError, match="transform 'none' .rows='changes'. returned no row for any of the 9"):
        Loader(root, batch_size=50, seed=1, transform=Transform(nothing, name="none", version="1", rows="changes"))


# -- the context ------------------------------------------------------------------------

def _ctx(random=True, **kw):
    base = dict(file="a.parquet", file_index=0, row_group=2, rows=10, selected=None, seed=5, epoch=1, random=random)
    return TransformContext(**{**base, **kw})


def test_raw_draws_are_pinned_to_the_bit_generators_output():
    """uniform/integers/permutation are fixed functions of PCG64's raw words (stable across NumPy)."""
    ctx = _ctx()
    bits = np.random.PCG64(np.random.SeedSequence(row_group_entropy(5, 1, 0, 2), spawn_key=(1,))).random_raw(30)
    bits = np.asarray(bits, dtype=np.uint64)
    assert np.array_equal(ctx.uniform(10), (bits[:10] >> np.uint64(11)) * 2.0**-53)
    assert np.array_equal(ctx.integers(10, 1000), (bits[10:20] % np.uint64(1000)).astype(np.int64))
    assert np.array_equal(ctx.permutation(10), np.argsort(bits[20:30], kind="stable"))
    assert row_group_entropy(5, 1, 0, 2) == [0x5247_5250, 5, 0, 1, 0, 2]
    # The generator draws from the other child: using it does not move the raw stream.
    a, b = _ctx(), _ctx()
    a.rng.random(100)
    assert np.array_equal(a.uniform(5), b.uniform(5))


@given(n=st.integers(0, 5000), high=st.integers(1, 2**63 - 1), rg=st.integers(0, 50))
def test_raw_draws_are_in_range(n, high, rg):
    ctx = _ctx(row_group=rg)
    u = ctx.uniform(n)
    assert u.dtype == np.float64 and ((u >= 0) & (u < 1)).all()
    i = ctx.integers(n, high)
    assert i.dtype == np.int64 and ((i >= 0) & (i < high)).all()
    assert np.array_equal(np.sort(ctx.permutation(n)), np.arange(n))


def test_context_errors():
    with pytest.raises(OptionError, match="not declared random: pass random=True"):
        _ctx(random=False).rng  # noqa: B018
    with pytest.raises(OptionError, match=r"integers\(n, high\) needs an int high in \[1, 2\*\*63\), got 0"):
        _ctx().integers(3, 0)
    with pytest.raises(OptionError, match="a count of draws must be an int >= 0, got -1"):
        _ctx().uniform(-1)


# -- bad input ------------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: Transform(3), r"Transform needs a callable fn\(columns, ctx\) -> dict, got int 3"),
    (lambda: Transform(X.hashed, name=""), "Transform.name must be a non-empty str, got ''"),
    (lambda: Transform(X.hashed, version=3), "Transform.version must be a str or None, got int 3"),
    (lambda: Transform(X.hashed, random=1), "Transform.random must be True or False, got int 1"),
    (lambda: Transform(X.hashed, cache="yes"), "Transform.cache must be True or False, got str 'yes'"),
    (lambda: Transform(X.hashed, rows="more"), "Transform.rows must be 'same' or 'changes', got 'more'"),
    (lambda: Transform(X.hashed, name="neg", random=True, rows="changes"),
     r"transform 'neg' is random and changes row counts \(random=True, rows='changes'\): the plan counts"),
    (lambda: Transform.of("hash"), r"transform must be a detload.Transform or a callable fn\(columns, ctx\) -> dict, "
                                   "got str 'hash'"),
])
def test_option_errors(make, message):
    with pytest.raises(OptionError, match=message):
        make()


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_transform_that_raises_is_a_worker_error_naming_it_and_the_unit(root, pool):
    t = Transform(X.raises_late, name="late")
    with Loader(root, batch_size=64, seed=1, columns=["id"], pool=pool, transform=t) as ld, \
            pytest.raises(WorkerError) as info:
        list(ld)
    text = str(info.value)
    assert "transform 'late' raised KeyError: 'no such feature', on b.parquet row group" in text
    assert info.value.unit is not None and info.value.unit[0] == "b.parquet"
    assert "in raises_late" in text and 'raise KeyError("no such feature")' in text  # the function's traceback


def test_a_transform_that_raises_at_planning_is_a_worker_error_too(root):
    def boom(cols, ctx):
        raise RuntimeError("bad feature table")
    with pytest.raises(WorkerError, match=r"planning failed: transform 'boom' raised RuntimeError: bad feature "
                                          r"table, on a.parquet row group 0") as info:
        Loader(root, batch_size=64, seed=1, transform=Transform(boom, name="boom"))
    assert "in boom" in str(info.value)


@pytest.mark.parametrize("fn, message", [
    (X.dtype_drifts, r"transform 'dtype_drifts' returned column 'id' of b.parquet row group 0 as int32, but the "
                     r"first row group's was ndarray <i8 \(rows\)"),
    (X.unequal_late, r"transform 'unequal_late' returned columns of unequal length for b.parquet row group 0: "
                     r"'id' has 250, 'half' has 249 rows"),
    (X.changes_count, r"transform 'changes_count' returned 299 rows for a.parquet row group 0, which it was given "
                      r"300 rows of: declare rows='changes'"),
])
def test_output_that_does_not_fit_is_a_data_error(root, fn, message):
    t = Transform(fn, name=fn.__name__)
    with pytest.raises(DataError, match=message), \
            Loader(root, batch_size=64, seed=1, shuffle=False, columns=["id"], transform=t) as ld:
        list(ld)


@pytest.mark.parametrize("fn, message", [
    (X.not_a_dict, r"transform 'nd' returned list for a.parquet row group 0; it must return a dict"),
    (X.not_arrays, r"transform 'nd' returned column 'id' for a.parquet row group 0 as list; every column must "
                   "be a NumPy array or a detload.Ragged"),
])
def test_output_that_is_not_a_dict_of_arrays_is_refused(root, fn, message):
    with pytest.raises(DataError, match=message):
        Loader(root, batch_size=64, seed=1, columns=["id"], transform=Transform(fn, name="nd"))


def test_undeclared_randomness_is_caught_on_the_first_row_group(root):
    with pytest.raises(OptionError, match=r"transform 'sneaky' is not declared random, but two runs on the same row "
                                          r"group \(a.parquet row group 0\) gave different 'noise': pass random=True"):
        Loader(root, batch_size=64, seed=1, columns=["id"], transform=Transform(X.sneaky_random, name="sneaky"))


def test_ctx_rng_without_random_true_says_so(root):
    with pytest.raises(WorkerError, match="planning failed: transform 'r' raised OptionError: this transform draws "
                                          "random numbers but was not declared random"):
        Loader(root, batch_size=64, seed=1, columns=["id"], transform=Transform(X.rng_undeclared, name="r"))


@pytest.mark.parametrize("cache", [False, True])
def test_writing_to_an_input_fails_cleanly(root, tmp_path, cache):
    opts = dict(batch_size=64, seed=1, columns=["id"], cache=(tmp_path / "c") if cache else None)
    with Loader(root, **opts) as ld:
        before = _hashes(ld)  # fills the cache: the next loader's inputs are mappings of it
    with pytest.raises(WorkerError, match=r"transform 'w' raised ValueError: assignment destination is read-only "
                                          r"\(its input columns are read-only views"):
        Loader(root, **opts, transform=Transform(X.writes_input, name="w"))
    with Loader(root, **opts) as ld:
        assert _hashes(ld) == before  # nothing was written through


def test_an_unpicklable_transform_is_refused_before_workers_start(root):
    def local(cols, ctx):
        return dict(cols)
    with pytest.raises(OptionError, match=r"pool='process' sends the transform 'local' to every worker process, "
                                          r"and it cannot be pickled \(.*local object.*\)\. Define its function at "
                                          r"the top level of a module"):
        Loader(root, batch_size=64, seed=1, pool="process", transform=Transform(local, name="local"))
    with pytest.raises(OptionError, match="cannot be pickled"):
        Loader(root, batch_size=64, seed=1, pool="process", transform=lambda c, x: dict(c))


def test_the_transform_pickles_once_in_the_configuration():
    t = pickle.loads(pickle.dumps(X.DROPOUT))
    assert (t.fn, t.identity, t.cache, t.bare) == (X.dropout, X.DROPOUT.identity, True, False)


_STDIN_SCRIPT = """
import sys
{block}
import numpy as np
import detload

def double(cols, ctx):
    return {{"id": cols["id"] * 2}}

t = detload.Transform(double, name="double", version="1")
try:
    with detload.Loader({root!r}, batch_size=100, seed=1, columns=["id"], pool="process", workers=2,
                        transform=t) as ld:
        print("rows", sum(len(b["id"]) for b in ld), "sum", sum(int(b["id"].sum()) for b in ld))
except detload.OptionError as exc:
    print("refused:", exc)
"""


def _stdin(root, block):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-"], input=_STDIN_SCRIPT.format(root=root, block=block), text=True,
                         capture_output=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_transform_from_a_stdin_script_is_refused_without_cloudpickle(root):
    out = _stdin(root, "sys.modules['cloudpickle'] = None  # as if it were not installed")
    assert out.startswith("refused: pool='process' must send the transform 'double' to its worker processes, and "
                          "double is defined in the main module, which a worker process cannot import: the program "
                          "was read from standard input. Use pool='thread', or move the function into a module"), out


def test_a_transform_from_a_stdin_script_travels_by_value_with_cloudpickle(root):
    pytest.importorskip("cloudpickle")
    out = _stdin(root, "")
    total = sum(sum(v) for v in LAYOUT.values())
    with Loader(root, batch_size=5000, seed=1, columns=["id"]) as ld:
        want = 2 * sum(int(b["id"].sum()) for b in ld)
    assert out.split() == ["rows", str(total), "sum", str(want)], out


# -- under group_by ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def queries(tmp_path_factory) -> str:
    from _groupdata import write_queries

    root = str(tmp_path_factory.mktemp("queries"))
    write_queries(root, [[3, 5, 2, 7], [4, 4, 1]], row_group_size=8)
    return root


def _rows(batch):
    return batch.unpack() if isinstance(batch, detload.Packed) else batch


def test_under_group_by_a_transform_that_keeps_the_key_delivers_whole_groups(queries):
    t = Transform(X.doubled_price, name="p2", version="1")
    with Loader(queries, batch_size=16, seed=1, order="windowed", group_by="q", transform=t) as ld, \
            Loader(queries, batch_size=16, seed=1, order="windowed", group_by="q") as plain:
        got = [_rows(b) for b in ld]
        want = [_rows(b) for b in plain]
    assert len(got) == len(want)
    for g, w in zip(got, want):  # the same groups in the same order, the new column beside them
        assert np.array_equal(g["item"], w["item"]) and np.array_equal(g["q"], w["q"])
        assert np.array_equal(g["price2"], w["price"] * np.float32(2))


def test_under_group_by_a_transform_must_keep_the_key_and_every_row(queries):
    with pytest.raises(DataError, match=r"the transform changed the group key 'q' of part-00\d.parquet row group \d: "
                                        r"under group_by= a transform must keep the key column and every row"), \
            Loader(queries, batch_size=16, seed=1, order="windowed", group_by="q", transform=Transform(X.moved_key, name="m")) as ld:
        list(ld)
    with pytest.raises(DataError, match=r"the transform dropped the group key 'q' of part-00\d.parquet row group \d: "), \
            Loader(queries, batch_size=16, seed=1, order="windowed", group_by="q", columns=["q", "item"],
                   transform=Transform(X.dropped_key, name="d")) as ld:
        list(ld)
    with pytest.raises(OptionError, match=r"transform 'evens' has rows='changes', which group_by= does not allow"):
        Loader(queries, batch_size=16, seed=1, order="windowed", group_by="q", columns=["q", "item"],
               transform=Transform(X.evens_of("item"), name="evens", version="1", rows="changes"))


# -- tracing ---------------------------------------------------------------------------

def slow(cols, ctx):
    import time

    time.sleep(0.02)
    return {"id": np.array(cols["id"])}


def test_transform_is_its_own_stage_and_can_bound_the_loader(root, tmp_path):
    # mix_window=2: tasks of two row groups, so that the transform runs during the measured
    # steps (one task of every row group would run it all before the first batch).
    with Loader(root, batch_size=32, seed=1, columns=["id"], transform=Transform(slow, name="slow"),
                mix_window=2) as ld:
        report = detload.starvation_check(ld, lambda b: None, steps=40, warmup=2)
        stats = ld.stats()
        assert stats.stages["transform"].count >= 9 and stats.stages["transform"].where == "worker"
        assert report.bottleneck == "transform" and "in transform" in report.verdict
        stats.write_trace(tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert any(e.get("name") == "transform" and e.get("cat") == "worker" for e in events)


def test_docs_page_is_linked():
    for page in ("README.md", "docs/README.md"):
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            assert "transforms.md)" in f.read(), page


def test_a_changing_count_that_differs_from_planning_is_a_data_error(root, tmp_path):
    t = Transform(X.FewerOnRerun(str(tmp_path / "seen")), name="flaky", rows="changes")
    with Loader(root, batch_size=64, seed=1, shuffle=False, columns=["id"], transform=t) as ld, \
            pytest.raises(DataError, match=r"transform 'flaky' returned 199 rows for a.parquet row group 1, but 200 "
                                           r"when the loader planned the epoch: a transform with rows='changes' must be "
                                           r"deterministic"):
        list(ld)


_T = Transform(X.hashed, name="t")
_SPECS = (detload.ColumnSpec("id", "transform", "fixed", "<i8"),)


@pytest.mark.parametrize("out, specs, message", [
    ({}, None, "transform 't' returned no column for W"),
    ({1: np.zeros(3)}, None, r"transform 't' returned a column named 1 \(int\) for W; column names must be str"),
    ({"a": np.zeros(3, dtype=object)}, None, "returned column 'a' for W as an array of dtype object; detload delivers"),
    ({"a": np.array(["x", "y"])}, None, "returned column 'a' for W as an array of dtype <U1"),
    ({"a": np.float64(1.0)}, None, "returned column 'a' for W as float64; every column must be a NumPy array"),
    ({"a": np.zeros(())}, None, "returned column 'a' for W as a 0-d array"),
    ({"a": detload.Ragged(np.zeros(3, np.uint8), np.array([0, 2, 1], dtype=np.int64))}, None,
     "returned column 'a' for W as a Ragged with bad offsets: they must be 1-D int64, start at 0, never decrease"),
    ({"a": detload.Ragged(np.zeros(3, np.uint8), np.array([1, 3], dtype=np.int64))}, None, "with bad offsets"),
    ({"a": detload.Ragged(np.zeros(3, np.uint8), np.array([0, 2], dtype=np.int32))}, None, "with bad offsets"),
    ({"a": detload.Ragged([1, 2], np.array([0, 2], dtype=np.int64))}, None,
     "returned column 'a' for W as a Ragged whose values and offsets are not NumPy arrays of numbers"),
    ({"x": np.zeros(3, np.int64)}, _SPECS, r"returned the columns \['x'\] for W, but \['id'\] for the first row group"),
    ({"id": np.zeros((3, 2), np.int64)}, _SPECS,
     r"returned column 'id' of W as int64 \(rows x 2\), but the first row group's was ndarray <i8 \(rows\)"),
    ({"id": detload.Ragged(np.zeros(3, np.int64), np.array([0, 3], dtype=np.int64))}, _SPECS,
     r"returned column 'id' of W as Ragged\[list\] of int64, but the first row group's was ndarray <i8"),
])
def test_every_output_check_names_what_is_wrong(out, specs, message):
    from detload._xform import check_output

    with pytest.raises(DataError, match=message):
        check_output(_T, out, "W", specs)


def test_torch_loader_delivers_the_transform_output(root):
    pytest.importorskip("torch")
    from detload.torch import TorchLoader

    with Loader(root, batch_size=64, seed=1, columns=["id", "f32", "s"], transform=X.HASHED) as ld:
        want = next(iter(ld))
    with TorchLoader(Loader(root, batch_size=64, seed=1, columns=["id", "f32", "s"], transform=X.HASHED)) as tl:
        got = next(iter(tl))
    assert np.array_equal(got["bucket"].numpy(), want["bucket"]) and tuple(got["cross"].shape) == (64, 2)


def test_ctx_names_the_row_group_and_the_selected_rows(root):
    import pyarrow.parquet as pq

    from detload._discovery import discover

    files = [f.path for f in discover(root).files]
    with Loader(root, batch_size=100, seed=1, columns=["id"], filter=[("id", "<", 1400)],
                transform=Transform(X.where_from, name="where")) as ld:
        got = {k: np.concatenate(v) for k, v in _collect(ld).items()}
    assert len(got["id"]) == int((got["id"] < 1400).sum()) > 0
    for i in range(0, len(got["id"]), 37):
        f, g = divmod(int(got["rg"][i]), 100)
        stored = pq.ParquetFile(os.path.join(root, files[f])).read_row_group(g, columns=["id"]).column(0).to_numpy()
        assert stored[got["stored"][i]] == got["id"][i]


def test_a_damaged_output_entry_is_discarded_and_computed_again(root, tmp_path, counter):
    cache = tmp_path / "c"
    opts = dict(batch_size=64, seed=1, columns=["id", "f32", "s"], cache=cache,
                transform=_counted(counter, X.hashed, name="hash", version="1"))
    with Loader(root, **opts) as ld:
        want = _hashes(ld)
    entries = sorted(os.path.join(d, n) for d, _, fs in os.walk(cache) for n in fs if n.endswith(".dlc"))
    assert len(entries) == 9  # one output entry per row group, no input entries
    with open(entries[3], "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\xff" * 8)
    before = X.calls(counter)
    with pytest.warns(detload.CacheWarning, match="is damaged"), Loader(root, **opts) as ld:
        assert _hashes(ld) == want
    assert X.calls(counter) == before + 1


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_writing_to_an_input_in_a_worker_fails_cleanly(root, tmp_path, pool):
    opts = dict(batch_size=64, seed=1, columns=["id", "f32"], cache=tmp_path / "c", pool=pool)
    with Loader(root, **opts) as ld:
        before = _hashes(ld)  # the next loader's inputs are mappings of these cache entries
    with Loader(root, **opts, transform=Transform(X.writes_input_late, name="late-writer")) as ld, \
            pytest.raises(WorkerError, match=r"failed on b.parquet row group \d: TransformFailed: transform "
                                             r"'late-writer' raised ValueError: assignment destination is read-only "
                                             r"\(its input columns are read-only views"):
        list(ld)
    with Loader(root, **opts) as ld:
        assert _hashes(ld) == before
