"""`Selection`: a row group's selected rows stored as runs or uint32 indices give back exactly
the int64 indices they were made from, take no more room than 4 bytes a row, and the loader
delivers the same rows through them in threads and processes."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detload import Loader
from detload._filters.selection import Selection

f = pc.field


@st.composite
def subsets(draw) -> tuple[np.ndarray, int]:
    n = draw(st.integers(1, 3000))
    # Runs of kept and dropped rows, as a layout gives, or scattered rows.
    if draw(st.booleans()):
        mask = np.asarray(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    else:
        mask = np.zeros(n, dtype=bool)
        for _ in range(draw(st.integers(0, 4))):
            a = draw(st.integers(0, n - 1))
            mask[a : a + draw(st.integers(0, n))] = True
    return np.flatnonzero(mask).astype(np.int64), n


@given(subsets())
def test_indices_come_back_exactly_and_compactly(case):
    idx, n = case
    sel = Selection.of(idx, n)
    back = sel.indices()
    assert back.dtype == np.int64 and np.array_equal(back, idx) and sel.count == idx.size
    assert sel.nbytes <= 4 * idx.size
    again = pickle.loads(pickle.dumps(sel))
    assert np.array_equal(again.indices(), idx)
    run = sel.single_run()
    contiguous = idx.size > 0 and idx[-1] - idx[0] + 1 == idx.size
    assert (run is not None) == contiguous
    if run is not None:
        assert run == (int(idx[0]), int(idx[-1]) + 1)


def test_a_contiguous_selection_is_two_numbers():
    sel = Selection.of(np.arange(1000, 60000, dtype=np.int64), 65536)
    assert sel.kind == "runs" and sel.nbytes == 8 and sel.single_run() == (1000, 60000)
    scattered = Selection.of(np.arange(0, 60000, 2, dtype=np.int64), 65536)
    assert scattered.kind == "rows" and scattered.data.dtype == np.uint32 and scattered.nbytes == 4 * 30000


def test_huge_row_groups_keep_int64():
    sel = Selection.of(np.array([0, 2**32 + 5], dtype=np.int64), 2**33)
    assert sel.data.dtype == np.int64 and sel.indices().tolist() == [0, 2**32 + 5]


@pytest.fixture(scope="module")
def sorted_root(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("sel")
    for i in range(3):
        ids = np.arange(i * 1000, (i + 1) * 1000, dtype=np.int64)
        strs = pa.array([f"s{v}" * (v % 3) for v in ids.tolist()])
        pq.write_table(pa.table({"id": ids, "s": strs, "v": (ids * 7919) % 13}), d / f"{i}.parquet",
                       row_group_size=300)
    return str(d)


@pytest.mark.parametrize("expr", [
    (f("id") >= 150) & (f("id") < 2222),      # runs: one a row group
    (f("v") < 4) & (f("id") > 500),           # scattered rows: uint32 indices
    (f("id") == 1234) | (f("id") == 7),       # single rows
])
def test_the_loader_delivers_the_same_batches_through_compact_selections(sorted_root, expr):
    want = sorted(pq.read_table(sorted_root).filter(expr).column("id").to_pylist())
    runs = []
    for kind in ("thread", "process"):
        with Loader(sorted_root, batch_size=37, seed=5, workers=2, pool=kind, filter=expr) as ld:
            batches = [(np.asarray(b["id"]).tolist(), [bytes(x) for x in _strings(b["s"])]) for b in ld]
        got = sorted(x for ids, _ in batches for x in ids)
        assert got == want
        for ids, strs in batches:  # every row's string is its own
            assert strs == [(f"s{v}" * (v % 3)).encode() for v in ids]
        runs.append(batches)
    assert runs[0] == runs[1]


def _strings(r) -> list[bytes]:
    return [r.values[r.offsets[i] : r.offsets[i + 1]].tobytes() for i in range(len(r.offsets) - 1)]


def test_a_range_on_sorted_data_hands_the_workers_two_numbers_a_row_group(sorted_root):
    expr = (f("id") >= 150) & (f("id") < 2222)
    with Loader(sorted_root, batch_size=37, seed=5, filter=expr) as ld:
        sels = ld._selections
    assert sels is not None and len(sels) == 2  # the row groups the range cuts: ids [0, 300) and [2000, 2300)
    assert all(s.kind == "runs" and s.nbytes == 8 for s in sels.values())
    assert sum(s.count for s in sels.values()) == 150 + 222
    # Pickled for each process worker: a few hundred bytes, not 8 a selected row.
    assert len(pickle.dumps(sels)) < 1000
