"""group_by: whole groups per batch, `Packed` batches that unpack to the stored rows, and every error.

The planner's rule (docs/packing.md) is checked as a pure function; the loader's batches
against the stored rows they must be, and across workers, pools, caches, resume points
and world sizes by the determinism matrix.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _groupdata import stored_rows, write_queries
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matrix import check_matrix

import detload
from detload import DataError, DatasetError, Loader, OptionError, Packed
from detload._streams import group_row_order
from detload.audit import hash_batch
from detload.plan import OrderOptions, Range, Unit
from detload.planning.groups import runs_of
from detload.planning.order import greedy_steps, make_plan

# -- the planner -----------------------------------------------------------------------


@st.composite
def grouped_units(draw: st.DrawFn) -> list[Unit]:
    n = draw(st.integers(1, 8))
    units = []
    for j in range(n):
        sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
        units.append(Unit((Range(0, j, 0, int(sum(sizes))),), tuple(int(s) for s in starts)))
    return units


@settings(deadline=None)
@given(units=grouped_units(), micro=st.integers(6, 14), parts=st.sampled_from([1, 2, 3]),
       window=st.integers(1, 3), shuffle=st.booleans(), drop_last=st.booleans(), seed=st.integers(0, 2**64 - 1),
       epoch=st.integers(0, 3))
def test_grouped_plan_fills_micro_batches_greedily_with_whole_groups(units, micro, parts, window, shuffle,
                                                                    drop_last, seed, epoch):
    parts = min(parts, len(units))  # at most one partition per row group
    opts = OrderOptions(order="windowed", seed=seed, batch_size=micro * parts, shuffle=shuffle, shuffle_window=window,
                        drop_last=drop_last, partitions=parts, group_batches=True)
    total = sum(u.rows for u in units)
    try:
        plan = make_plan(units, opts, epoch=epoch)
    except OptionError as exc:
        assert drop_last and "drops every row" in str(exc)
        return
    assert plan.step_starts is not None and plan.group_bounds is not None
    delivered = 0
    counts = []
    for p in range(parts):
        gb, ss = plan.group_bounds[p], plan.step_starts[p]
        n = plan.partition_rows[p]
        assert gb[0] == 0 and gb[-1] == n and ss[0] == 0 and ss[-1] == n
        assert set(ss.tolist()) <= set(gb.tolist())  # micro-batches begin at group starts
        for a, b in zip(ss, ss[1:]):
            assert 0 < b - a <= micro
            nxt = gb[np.searchsorted(gb, b) + 1] if b < n else None
            assert nxt is None or nxt - a > micro  # greedy: the next group would not have fitted
        counts.append(len(ss) - 1)
        for s in range(plan.steps):
            lo, hi = plan.micro_range(p, s)
            assert lo <= hi
            delivered += hi - lo
        # The partition's groups are its blocks' groups, permuted within each block.
        sizes = sorted(np.diff(gb).tolist())
        want = sorted(int(x) for b in plan.blocks[p]
                      for x in np.diff(np.append(np.asarray(b.group_starts), b.rows)))
        assert sizes == want
    # Partitions balanced to within one group: each boundary lies within half a group of its ideal row.
    largest = max(max(np.diff(np.append(u.groups, u.rows))) for u in units)
    for p in range(1, parts):
        assert abs(plan.boundaries[p] - p * total // parts) <= largest / 2
    assert plan.steps == (min(counts) if drop_last else max(counts))
    assert delivered + plan.dropped_rows == total
    # Every block appears in the schedule where its steps say.
    for b in plan.schedule:
        lo, _ = plan.micro_range(b.partition, b.first_step)
        _, hi = plan.micro_range(b.partition, min(b.last_step, plan.steps - 1))
        assert lo <= b.start and (b.last_step >= plan.steps or b.end <= hi)


def test_group_row_order_keeps_rows_of_a_group_in_stored_order():
    starts = np.array([0, 3, 4, 8])
    order = np.array([2, 0, 3, 1])
    assert group_row_order(starts, 10, order).tolist() == [4, 5, 6, 7, 0, 1, 2, 8, 9, 3]
    assert greedy_steps(np.array([0, 3, 4, 8, 10]), 4).tolist() == [0, 4, 8, 10]
    assert greedy_steps(np.array([0, 3, 4, 8, 10]), 5).tolist() == [0, 4, 8, 10]
    assert greedy_steps(np.array([0, 3, 4, 8, 10]), 7).tolist() == [0, 4, 10]


def test_ungrouped_order_dict_is_unchanged():
    opts = OrderOptions(order="windowed", seed=1, batch_size=8)
    assert "group_batches" not in opts.order_dict()
    assert OrderOptions(order="windowed", seed=1, batch_size=8, group_batches=True).order_dict()["group_batches"] is True


def test_runs_of_a_key_column():
    starts, keys = runs_of(pa.array([5, 5, 2, 2, 2, 5, 7]))
    assert starts.tolist() == [0, 2, 5, 6] and keys.to_pylist() == [5, 2, 5, 7]
    starts, keys = runs_of(pa.array(["a", "a", "b"]).dictionary_encode())
    assert starts.tolist() == [0, 2] and keys.to_pylist() == ["a", "b"]


# -- the loader: what a batch holds ------------------------------------------------------


def _bytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _check_epoch(loader: Loader, table: pa.Table, *, chunked: bool = False,
                 expect_all: bool = True) -> list[int]:
    """Every batch a Packed that unpacks to the stored rows; groups whole; every item once."""
    stored = stored_rows(table)
    texts = table.column("qtext").to_pylist()
    tags = table.column("tags").to_pylist()
    seen: list[int] = []
    group_of_batch: dict[int, int] = {}
    for step, b in enumerate(loader):
        assert isinstance(b, Packed)
        b.check()
        assert b.n_items <= loader.options.batch_size
        flat = b.unpack()
        assert list(flat) == [s.name for s in loader.column_specs]
        items = flat["item"]
        for c in ("q", "qf", "emb", "price"):
            assert _bytes(flat[c]) == _bytes(stored[c][items]), c  # bitwise: NaN included
        qt = flat["qtext"]
        assert [bytes(qt.values[qt.offsets[i]:qt.offsets[i + 1]]).decode() for i in range(len(items))] == \
            [texts[i] for i in items]
        tg = flat["tags"]
        assert [tg.values[tg.offsets[i]:tg.offsets[i + 1]].tolist() for i in range(len(items))] == \
            [tags[i] for i in items]
        # Groups: contiguous, one key each, items in stored order, the group row = the items' rows.
        for g in range(b.n_groups):
            lo, hi = b.offsets[g], b.offsets[g + 1]
            assert hi > lo
            step_ok = np.diff(items[lo:hi])
            assert ((step_ok > 0) if not expect_all else (step_ok == 1)).all()  # stored order
            assert (flat["q"][lo:hi] == b.groups["q"][g]).all()
            assert (b.group_index[lo:hi] == g).all()
            q = int(b.groups["q"][g])
            if not chunked:
                assert group_of_batch.setdefault(q, step) == step, f"group {q} split across batches"
        assert set(b.groups) == set(loader.group_columns)
        seen += items.tolist()
    assert len(seen) == len(set(seen))
    if expect_all:
        assert sorted(seen) == list(range(len(table)))
    return seen


@st.composite
def query_layouts(draw: st.DrawFn) -> tuple[list[list[int]], int]:
    files = draw(st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=8), min_size=1, max_size=3))
    return files, draw(st.integers(3, 25))


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=query_layouts(), batch=st.integers(24, 48), seed=st.integers(0, 2**32), window=st.integers(1, 3),
       shuffle=st.booleans(), parts=st.sampled_from([1, 2]))
def test_batches_unpack_to_the_stored_rows_and_keep_groups_whole(tmp_path_factory, layout, batch, seed, window,
                                                                 shuffle, parts):
    files, rg = layout
    root = str(tmp_path_factory.mktemp("q"))
    table = write_queries(root, files, rg, seed=seed % 1000)
    batch -= batch % parts
    parts = min(parts, sum(-(-sum(f) // rg) for f in files))  # at most one partition per row group
    with Loader(root, batch_size=batch, seed=seed, shuffle=shuffle, shuffle_window=window, partitions=parts,
                order="windowed", group_by="q", group_columns=["qf", "emb", "qtext"]) as loader:
        assert loader.group_stats is not None and loader.group_stats["groups"] == sum(len(f) for f in files)
        n = len(loader)
        _check_epoch(loader, table)
        assert loader.position == n  # len() is exact


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=query_layouts(), seed=st.integers(0, 2**32), n=st.integers(1, 5))
def test_max_group_items_splits_large_groups_into_chunks(tmp_path_factory, layout, seed, n):
    files, rg = layout
    root = str(tmp_path_factory.mktemp("q"))
    table = write_queries(root, files, rg, seed=seed % 1000)
    with Loader(root, batch_size=6, seed=seed, order="windowed", group_by="q", group_columns=["qf"], max_group_items=n) as loader:
        _check_epoch(loader, table, chunked=True)
        for b in loader:
            assert (np.diff(b.offsets) <= n).all()


def test_drop_last_reports_dropped_items_and_gives_equal_steps(tmp_path):
    root = str(tmp_path / "q")
    table = write_queries(root, [[5, 3, 7, 2, 4, 6], [1, 8, 3]], 9)
    with Loader(root, batch_size=20, seed=1, partitions=2, order="windowed", group_by="q", drop_last=True) as loader:
        plan = loader.plan()
        seen = _check_epoch(loader, table, expect_all=False)
        assert len(seen) + plan.dropped_rows == len(table)
        assert plan.steps == min(len(s) - 1 for s in plan.step_starts)
    with Loader(root, batch_size=20, seed=1, partitions=2, order="windowed", group_by="q") as loader:
        plan = loader.plan()
        assert plan.steps == max(len(s) - 1 for s in plan.step_starts) and plan.dropped_rows == 0
        _check_epoch(loader, table)


def test_a_partition_that_runs_out_gives_empty_micro_batches(tmp_path):
    root = str(tmp_path / "q")
    # Micro-batches of 20: partition 0 gets the groups of 11 and 10 (two steps), partition 1 the 20 (one);
    # row groups of 21 rows: two of them, a partition each at most.
    write_queries(root, [[11, 10, 20]], 21)
    for rank, sizes in ((0, [11, 10]), (1, [20, 0])):
        with Loader(root, batch_size=20, seed=0, shuffle=False, partitions=2, order="windowed", group_by="q",
                    distributed=detload.Distributed(rank, 2)) as loader:
            plan = loader.plan()
            assert [len(s) - 1 for s in plan.step_starts] == [2, 1]
            got = list(loader)
            assert [b.n_items for b in got] == sizes
            assert got[-1].n_groups == (0 if rank else 1) and got[-1].offsets.tolist() == ([0] if rank else [0, 10])
    with Loader(root, batch_size=20, seed=0, shuffle=False, partitions=2, order="windowed", group_by="q", drop_last=True,
                distributed=detload.Distributed(1, 2)) as loader:
        assert len(loader) == 1 and loader.plan().dropped_rows == 10


def test_filter_runs_first_and_a_partly_selected_group_comes_as_its_selected_part(tmp_path):
    root = str(tmp_path / "q")
    table = write_queries(root, [[6, 4, 9], [3, 5]], 5)
    with Loader(root, batch_size=16, seed=2, order="windowed", group_by="q", group_columns=["qf"], filter="price < 0.5") as loader:
        keep = np.flatnonzero(table.column("price").to_numpy() < 0.5)
        seen = _check_epoch(loader, table, expect_all=False)
        assert sorted(seen) == keep.tolist()


def test_group_runs_come_from_the_cache_on_a_warm_loader(tmp_path):
    root = str(tmp_path / "q")
    table = write_queries(root, [[6, 4, 9], [3, 5]], 5)
    cache = str(tmp_path / "cache")
    hashes = []
    for want in ("scanned", "cached"):
        with Loader(root, batch_size=16, seed=2, order="windowed", group_by="q", cache=cache) as loader:
            assert loader.group_stats is not None
            assert loader.group_stats[want] == 6 and sum(loader.group_stats[k] for k in ("scanned", "cached")) == 6
            hashes.append([hash_batch(b)[0] for b in loader])
            _check_epoch(loader, table)
    assert hashes[0] == hashes[1]


def test_a_group_across_row_groups_becomes_one_unit_of_several_ranges(tmp_path):
    root = str(tmp_path / "q")
    write_queries(root, [[2, 11, 3]], 4)
    with Loader(root, batch_size=16, seed=0, order="windowed", group_by="q") as loader:
        units = loader.plan().units.units
        assert any(len(u.ranges) > 1 for u in units)
        assert len(loader.order["units_digest"]) == 32


def test_order_holds_the_group_options_and_resume_checks_them(tmp_path):
    root = str(tmp_path / "q")
    write_queries(root, [[3, 4, 5, 6]], 5)
    with Loader(root, batch_size=16, seed=0, order="windowed", group_by="q", group_columns=["emb", "qf"], max_group_items=4) as a:
        assert a.order["group_by"] == "q" and a.order["group_columns"] == ["q", "qf", "emb"]
        assert a.order["max_group_items"] == 4 and a.order["group_batches"] is True
        state = a.state_dict()
    with Loader(root, batch_size=16, seed=0, order="windowed", group_by="q", group_columns=["qf"], max_group_items=4) as b, \
            pytest.raises(detload.StateError, match="group_columns"):
        b.load_state_dict(state)
    with Loader(root, batch_size=16, seed=0) as plain:
        assert not {"group_by", "group_columns", "group_batches"} & set(plain.order)


def test_resume_at_every_step_gives_the_same_batches(tmp_path):
    root = str(tmp_path / "q")
    write_queries(root, [[5, 3, 7, 2, 4, 6, 1], [1, 8, 3, 2]], 6)
    kw = dict(batch_size=12, seed=5, shuffle_window=2, order="windowed", group_by="q", group_columns=["qf", "qtext"])
    with Loader(root, **kw) as loader:
        want = [hash_batch(b)[0] for b in loader]
        states = []
        for i, _ in enumerate(loader):
            if i < len(want):
                states.append(loader.state_dict())
    for i in range(0, len(want), 3):
        with Loader(root, **kw, workers=2) as loader:
            loader.load_state_dict(states[i])
            assert [hash_batch(b)[0] for b in loader] == want[i + 1:]


def test_packed_batches_are_the_same_in_every_cell_of_the_matrix(tmp_path):
    root = str(tmp_path / "q")
    write_queries(root, [[5, 3, 7, 2, 4, 6, 1, 9], [1, 8, 3, 2, 6], [4, 4, 4]], 7)
    check_matrix(root, dict(batch_size=24, seed=11, shuffle_window=2, order="windowed", group_by="q",
                            group_columns=["qf", "emb", "qtext"]), str(tmp_path / "m"))


def test_verify_compares_packed_manifests(tmp_path):
    from detload.cli import main as cli_main
    from detload.verify import verify

    root = str(tmp_path / "q")
    write_queries(root, [[5, 3, 7, 2, 4, 6, 1], [1, 8, 3, 2]], 6)
    outs = []
    for w, world in ((1, 1), (2, 2)):
        out = str(tmp_path / f"run{w}") + os.sep
        for r in range(world):
            with Loader(root, batch_size=24 // world, seed=5, partitions=2, order="windowed", group_by="q", workers=w, manifest=out,
                        distributed=detload.Distributed(r, world)) as loader:
                for _ in loader:
                    pass
        outs.append(out)
    res = verify(outs[0], outs[1])
    assert res.identical, res.message
    assert cli_main(["verify", outs[0], outs[1]]) == 0


def test_packed_hash_is_the_documented_canonical_form():
    import xxhash

    from detload.audit import column_digest

    items = {"item": np.arange(5, dtype=np.int64)}
    groups = {"q": np.array([7, 9], dtype=np.int64)}
    offsets = np.array([0, 2, 5], dtype=np.int64)
    p = Packed(items, groups, np.array([0, 0, 1, 1, 1], dtype=np.int64), offsets, ("q", "item"))
    want = xxhash.xxh3_128_hexdigest(b"detload-packed-v1\x00" + column_digest("item", items["item"])
                                     + column_digest("q", groups["q"]) + column_digest("[offsets]", offsets))
    digest, cols = hash_batch(p)
    assert digest == want and list(cols) == ["item", "q", "[offsets]"]
    assert list(p.unpack()) == ["q", "item"] and p.unpack()["q"].tolist() == [7, 7, 9, 9, 9]


# -- bad input -----------------------------------------------------------------------------


def _write(path: str, q: list[int], qf: list[float] | None = None, rg: int = 100) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    n = len(q)
    pq.write_table(pa.table({"q": pa.array(q, pa.int64()),
                             "qf": pa.array(qf if qf is not None else [float(x) for x in q], pa.float32()),
                             "item": pa.array(range(n), pa.int64())}), path, row_group_size=rg)


def test_error_the_key_column_missing(tmp_path):
    _write(str(tmp_path / "d" / "a.parquet"), [1, 1, 2])
    with pytest.raises(OptionError, match=r"group_by='query_id' is not a column of the dataset \(its columns: q, qf"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="query_id")


def test_error_the_key_not_among_the_loaded_columns(tmp_path):
    _write(str(tmp_path / "d" / "a.parquet"), [1, 1, 2])
    with pytest.raises(OptionError, match=r"group_by='q' must be among the loaded columns"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", columns=["item"])


def test_error_group_columns_unknown_or_outside_columns(tmp_path):
    _write(str(tmp_path / "d" / "a.parquet"), [1, 1, 2])
    with pytest.raises(OptionError, match=r"group_columns names 'nope', not a column of the dataset"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", group_columns=["nope"])
    with pytest.raises(OptionError, match=r"group_columns names 'qf', a column of the dataset that is not among "
                                          r"the loaded columns: group columns are a subset of columns=\['q', 'item'\]"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", group_columns=["qf"], columns=["q", "item"])
    with pytest.raises(OptionError, match="group_columns and max_group_items apply with group_by="):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, group_columns=["qf"])


def test_error_a_group_column_that_varies_within_a_group(tmp_path):
    _write(str(tmp_path / "d" / "a.parquet"), [1, 1, 2, 2, 2, 3], [1.0, 1.0, 2.0, 2.5, 2.0, 3.0], rg=3)
    for pool in ("thread", "process"):
        with Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", group_columns=["qf"], pool=pool) as L, \
                pytest.raises(DataError, match=r"group column 'qf' is not constant within group q=2: it changes in "
                                               r"a.parquet row group 1 \(compared bitwise"):
            list(L)


def test_a_nan_group_column_is_constant(tmp_path):
    nan = float("nan")
    _write(str(tmp_path / "d" / "a.parquet"), [1, 1, 2, 2], [nan, nan, 2.0, 2.0])
    with Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", group_columns=["qf"]) as L:
        assert sum(b.n_items for b in L) == 4


def test_error_no_item_column(tmp_path):
    _write(str(tmp_path / "d" / "a.parquet"), [1, 1, 2])
    with pytest.raises(OptionError, match=r"every loaded column is a group column \(\['q', 'qf'\]\): a packed batch "
                                          r"needs at least one item column"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", group_columns=["qf"], columns=["q", "qf"])


def test_error_non_contiguous_groups(tmp_path):
    _write(str(tmp_path / "d" / "a.parquet"), [1, 1, 2, 2, 3, 1, 1], rg=3)
    with pytest.raises(DatasetError, match=r"group_by='q': key 1 is not contiguous in a.parquet: it occurs at row "
                                           r"group 0 row 0 and again at row group 1 row 2, with other keys between. "
                                           r"Rewrite the data with each group's rows together: detload layout SRC "
                                           r"DST --group-by q"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q")


def test_error_a_group_split_across_files(tmp_path):
    _write(str(tmp_path / "d" / "a.parquet"), [1, 1, 2, 2])
    _write(str(tmp_path / "d" / "b.parquet"), [2, 3, 3])
    with pytest.raises(DatasetError, match=r"group_by='q': group 2 is split across files: it occurs in a.parquet "
                                           r"\(row group 0\) and in b.parquet \(row group 0\)"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q")


def test_error_a_group_larger_than_the_micro_batch(tmp_path):
    _write(str(tmp_path / "d" / "a.parquet"), [1, 1, 2, 2, 2, 2, 2, 3])
    with pytest.raises(DatasetError, match=r"group q=2 \(a.parquet row group 0\) holds 5 items, more than a "
                                           r"micro-batch of 2 items \(the global batch, batch_size 4 x world size 1, over 2 partition\(s\)\): a "
                                           r"group is never split across batches. .*max_group_items=N"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", partitions=2)
    with pytest.raises(OptionError, match=r"max_group_items=3 is larger than the micro-batch of 2 items"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", partitions=2, max_group_items=3)
    # the same micro-batch of 2 items in one partition (two would exceed the one row group)
    with Loader(str(tmp_path / "d"), batch_size=2, seed=0, order="windowed", group_by="q", max_group_items=2) as L:
        assert sum(b.n_items for b in L) == 8


def test_error_null_keys(tmp_path):
    os.makedirs(tmp_path / "d")
    pq.write_table(pa.table({"q": pa.array([1, None, 2], pa.int64()), "x": [1, 2, 3]}), str(tmp_path / "d" / "a.parquet"))
    with pytest.raises(DatasetError, match=r"group_by column 'q' holds nulls in a.parquet row group 0"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q")


@pytest.mark.parametrize(("column", "values", "rg", "bad_rg"), [
    ("text", ["a", "a", "bb", "bc", "bb", "c"], 100, 0),     # same length, another value
    ("text", ["a", "a", "bb", "bb", "b", "c"], 100, 0),      # another length
    ("text", ["a", "a", "bb", "bb", "bx", "c"], 4, 1),       # changes where the group runs into the next row group
    ("emb", [[1, 1], [1, 1], [2, 2], [2, 2], [2, 3], [3, 3]], 4, 1),
    ("emb", [[1, 1], [1, 1], [2, 2], [2, 2], [2, 2], [3, 3]], 4, None),
    ("text", ["a", "a", "bb", "bb", "bb", "c"], 3, None),
])
@pytest.mark.parametrize("cache", [False, True])
def test_group_columns_are_compared_bitwise_across_row_groups(tmp_path, column, values, rg, bad_rg, cache):
    os.makedirs(tmp_path / "d")
    q = [1, 1, 2, 2, 2, 3]
    text = values if column == "text" else ["t"] * 6
    emb = values if column == "emb" else [[0, 0]] * 6
    pq.write_table(pa.table({"q": q, "text": text, "emb": pa.array(emb, pa.list_(pa.float32(), 2)),
                             "item": range(6)}), str(tmp_path / "d" / "a.parquet"), row_group_size=rg)
    kw = {"cache": str(tmp_path / "c")} if cache else {}
    with Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", group_columns=["text", "emb"], **kw) as L:
        if bad_rg is None:
            got = [b.unpack() for b in L]
            assert sorted(i for b in got for i in b["item"].tolist()) == list(range(6))
        else:
            with pytest.raises(DataError, match=rf"group column '{column}' is not constant within group q=2: it "
                                                rf"changes in a.parquet row group {bad_rg} "):
                list(L)


def test_a_range_found_constant_is_not_compared_again(tmp_path, monkeypatch):
    """The verdict is kept per row group (file version, columns, group starts): in this process,
    and with a cache as a derived entry, so a warm loader in a fresh process skips the comparison."""
    import detload._engine.groups as groups

    root = str(tmp_path / "q")
    table = write_queries(root, [[6, 4, 9], [3, 5]], 5)
    calls: list[int] = []
    real = groups._first_change
    monkeypatch.setattr(groups, "_first_change", lambda col, s: calls.append(1) or real(col, s))
    kw = dict(batch_size=16, seed=2, order="windowed", group_by="q", group_columns=["qf", "qtext"], cache=str(tmp_path / "c"))
    groups._Verdicts._memo.clear()
    with Loader(root, **kw) as loader:
        _check_epoch(loader, table)
        first = len(calls)
        assert first > 0
        loader.set_epoch(1)
        _check_epoch(loader, table)
        assert len(calls) == first  # epoch 1 compared nothing again
    groups._Verdicts._memo.clear()  # as a new process would start
    with Loader(root, **kw) as loader:
        _check_epoch(loader, table)
    assert len(calls) == first  # the cache's verdicts
    groups._Verdicts._memo.clear()
    with Loader(root, **dict(kw, group_columns=["qf"])) as loader:  # other columns: another verdict
        _check_epoch(loader, table)
    assert len(calls) > first


def test_layout_group_by_makes_an_interleaved_table_loadable(tmp_path):
    pytest.importorskip("duckdb")
    src = tmp_path / "src"
    os.makedirs(src)
    rng = np.random.default_rng(3)
    q = np.repeat(np.arange(40), rng.integers(1, 20, 40))
    rng.shuffle(q)  # every query's rows scattered
    pq.write_table(pa.table({"q": q, "qf": (q * 0.25).astype(np.float32), "item": np.arange(len(q))}),
                   str(src / "a.parquet"), row_group_size=50)
    with pytest.raises(DatasetError, match=r"is not contiguous in a.parquet.*detload layout SRC DST --group-by q"):
        Loader(str(src), batch_size=64, seed=0, order="windowed", group_by="q")
    dst = tmp_path / "dst"
    detload.layout.rewrite(str(src), str(dst), group_by="q", row_group_rows=64, files=2)
    with Loader(str(dst), batch_size=64, seed=0, order="windowed", group_by="q", group_columns=["qf"]) as loader:
        items = []
        for b in loader:
            flat = b.unpack()
            assert (flat["qf"] == flat["q"] * np.float32(0.25)).all()
            items += flat["item"].tolist()
        assert sorted(items) == list(range(len(q)))
        # layout ends row groups where groups end, so few units join row groups
        assert sum(len(u.ranges) > 1 for u in loader.plan().units.units) <= 2


def test_the_printed_plan_shows_the_micro_batch_starts(tmp_path):
    import json

    root = str(tmp_path / "q")
    write_queries(root, [[5, 3, 7, 2]], 100)
    with Loader(root, batch_size=8, seed=0, shuffle=False, order="windowed", group_by="q") as loader:
        d = json.loads(json.dumps(loader.plan().to_dict()))
        assert d["micro_batch_starts"] == [[0, 8, 15, 17]]
    with Loader(root, batch_size=8, seed=0) as plain:
        assert "micro_batch_starts" not in plain.plan().to_dict()


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_eight_workers_give_the_batches_of_one(tmp_path, pool):
    root = str(tmp_path / "q")
    write_queries(root, [[5, 3, 7], [2, 4, 6, 1], [9, 1], [8, 3], [2, 6, 4], [4, 4], [12], [3, 3, 3], [5, 5]], 100)
    kw = dict(batch_size=16, seed=9, shuffle_window=1, order="windowed", group_by="q", group_columns=["qf", "emb", "qtext"])
    with Loader(root, **kw) as one:
        want = [hash_batch(b)[0] for b in one]
    with Loader(root, **kw, workers=8, pool=pool) as eight:
        assert len(eight.plan().schedule) >= 8  # every worker builds blocks
        assert [hash_batch(b)[0] for b in eight] == want


def test_filtered_chunked_packed_batches_are_the_same_in_every_cell_of_the_matrix(tmp_path):
    root = str(tmp_path / "q")
    write_queries(root, [[5, 3, 17, 2, 4, 6, 1, 9], [1, 8, 3, 2, 26], [4, 4, 4]], 7)
    check_matrix(root, dict(batch_size=24, seed=12, shuffle_window=2, order="windowed", group_by="q", group_columns=["qf", "qtext"],
                            max_group_items=5, filter="price < 0.7"), str(tmp_path / "m"))



@pytest.mark.parametrize("pool", ["thread", "process"])
def test_runs_a_filter_joins_are_checked_with_a_cache(tmp_path, pool):
    """Key 2's rows 2-3 and 5 become one group once the filter drops row 4 (another key); their
    group column differs, which the compacted cache rows must still catch."""
    os.makedirs(tmp_path / "d")
    pq.write_table(pa.table({"q": [1, 1, 2, 2, 3, 2, 4], "qf": pa.array([1, 1, 2, 2, 3, 9, 4], pa.float32()),
                             "keep": [1, 1, 1, 1, 0, 1, 1], "item": range(7)}), str(tmp_path / "d" / "a.parquet"))
    kw = dict(batch_size=8, seed=0, order="windowed", group_by="q", group_columns=["qf"], filter="keep == 1", pool=pool)
    with Loader(str(tmp_path / "d"), **kw, cache=str(tmp_path / "c")) as L, \
            pytest.raises(DataError, match=r"group column 'qf' is not constant within group q=2: it changes in "
                                           r"a.parquet row group 0"):
        list(L)
    with Loader(str(tmp_path / "d"), **kw) as L, pytest.raises(DataError, match="within group q=2"):
        list(L)


def test_the_cache_keeps_group_columns_once_per_group(tmp_path):
    root = str(tmp_path / "q")
    table = write_queries(root, [[400, 300, 500, 200], [600, 450]], 512)

    def size(d: str) -> int:
        return sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(d) for f in fs)

    kw = dict(batch_size=1024, seed=1)
    with Loader(root, **kw, cache=str(tmp_path / "flat")) as flat:
        for _ in flat:
            pass
    with Loader(root, **kw, order="windowed", group_by="q", group_columns=["qf", "emb", "qtext"], cache=str(tmp_path / "packed")) as p:
        _check_epoch(p, table)
        p.set_epoch(1)
        _check_epoch(p, table)  # warm: items from the row-group entries, group rows from the derived ones
    # Flat entries hold q, qf, emb and qtext for each of the 2,450 items; packed ones once per query.
    assert size(str(tmp_path / "packed")) < 0.7 * size(str(tmp_path / "flat"))


def test_detload_run_group_by_writes_the_manifest_a_loader_writes(tmp_path):
    from detload.cli import main as cli_main
    from detload.verify import verify

    root = str(tmp_path / "q")
    write_queries(root, [[5, 3, 7, 2, 4, 6, 1], [1, 8, 3, 2]], 6)
    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    assert cli_main(["run", root, "--batch-size", "16", "--seed", "4", "--group-by", "q", "--group-columns",
                     "qf,emb", "--max-group-items", "6", "--workers", "2", "--manifest", a]) == 0
    with Loader(root, batch_size=16, seed=4, order="windowed", group_by="q", group_columns=["qf", "emb"], max_group_items=6,
                manifest=b) as loader:
        for _ in loader:
            pass
    res = verify(a, b)
    assert res.identical, res.message
    assert detload.read_manifest(a).header["order"]["group_by"] == "q"


def test_starvation_check_counts_the_items_of_packed_batches(tmp_path):
    root = str(tmp_path / "q")
    table = write_queries(root, [[5, 3, 7, 2, 4, 6, 1], [1, 8, 3, 2]], 6)
    with Loader(root, batch_size=16, seed=4, order="windowed", group_by="q") as loader:
        from detload.starvation import _rows

        b = next(iter(loader))
        assert _rows(b) == b.n_items > 0
        report = detload.starvation_check(loader, lambda batch: None, steps=3, warmup=1)
        assert report is not None
    assert len(table) > 0
