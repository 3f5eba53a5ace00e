"""Invariants of the mixing prototype (experiments/mixing/order.py): every row once, a pure function
of its inputs, equal blocks, a bounded window read once, every task spanning its partition, and the
same steps at any worker count and resume point. Fast: run with pytest experiments/mixing -q.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import order as o  # noqa: E402

ROWS = [
    [5, 3, 6, 2, 4, 4],
    [4096] * 6 * 8 + [424] * 8,  # the AUC experiment's 56 row groups, in some order
    list(np.random.default_rng(3).integers(1, 700, 97)),
    [1],
    [10_000, 3, 3],
]


def _orders(rows: list[int], seed: int, epoch: int, P: int) -> list[o.EpochOrder]:
    return [
        o.stratified_order(rows, seed, epoch, window=8, block_rows=40, partitions=P),
        o.stratified_order(rows, seed, epoch, window=5, block_rows=64, partitions=P, jitter=2),
        o.stratified_order(rows, seed, epoch, window=4, block_rows=50, partitions=P, assign="rows"),
        o.windowed_order(rows, seed, epoch, window=3, partitions=P),
        o.chunk_order(rows, seed, epoch, chunk_rows=16, block_rows=100, partitions=P),
    ]


@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("rows", ROWS, ids=lambda r: f"{len(r)}rg")
def test_every_row_exactly_once(rows: list[int], P: int) -> None:
    total = sum(rows)
    for od in _orders(rows, 7, 1, P):
        ids, offsets = od.global_steps(6 * P)
        assert np.array_equal(np.sort(ids), np.arange(total)), od.name
        assert offsets[-1] == total
        # Partitions balanced by rows, to within one row.
        sizes = [len(s) for s in od.streams]
        assert max(sizes) - min(sizes) <= 1, (od.name, sizes)
        unit, row = od.pairs(ids)
        assert (row >= 0).all() and (row < np.asarray(rows)[unit]).all()


def test_pure_function_of_its_inputs() -> None:
    rows = ROWS[2]
    a = o.stratified_order(rows, 11, 2, window=8, partitions=2)
    b = o.stratified_order(list(rows), 11, 2, window=8, partitions=2)
    assert all(np.array_equal(x, y) for x, y in zip(a.streams, b.streams))
    assert a.tasks == b.tasks
    for other in (o.stratified_order(rows, 11, 3, window=8, partitions=2),
                  o.stratified_order(rows, 12, 2, window=8, partitions=2),
                  o.stratified_order(rows, 11 + 2**32, 2, window=8, partitions=2)):
        assert not np.array_equal(a.streams[0], other.streams[0])


def test_known_answer() -> None:
    # Pins the prototype's streams (PCG64 raw output and stable sorts only), as plan tests pin theirs.
    od = o.stratified_order([5, 3, 6, 2, 4, 4], 7, 0, window=2, block_rows=4)
    # Three tasks, each one row group from each stratum {0, 1, 2}, {3, 4, 5}; blocks of <= 4 rows.
    assert [t.units for t in od.tasks] == [(2, 3), (1, 5), (0, 4)]
    assert [t.bounds for t in od.tasks] == [(0, 4, 8), (0, 3, 7), (0, 3, 6, 9)]
    assert od.streams[0].tolist() == [13, 15, 12, 14, 9, 8, 10, 11, 5, 22, 7, 21, 6, 23, 20, 0, 1, 18, 17, 19, 3,
                                      2, 4, 16]


@pytest.mark.parametrize("rows", ROWS, ids=lambda r: f"{len(r)}rg")
def test_blocks_equal_and_within_budget(rows: list[int]) -> None:
    for S in (1, 40, 1000):
        od = o.stratified_order(rows, 3, 0, window=6, block_rows=S, partitions=2)
        for t in od.tasks:
            sizes = np.diff(t.bounds)
            assert sizes.max() - sizes.min() <= 1, t
            assert sizes.max() <= S
            assert sizes.min() >= 1
            # As few blocks as the budget allows: one fewer would exceed it.
            assert len(sizes) == -(-t.rows // S)


@pytest.mark.parametrize("P", [1, 2, 5])
@pytest.mark.parametrize("K", [1, 4, 16])
def test_window_bounded_and_read_once(K: int, P: int) -> None:
    rows = ROWS[2]
    od = o.stratified_order(rows, 5, 0, window=K, partitions=P)
    assert od.window <= K
    reads = od.decodes
    assert reads.min() == 1
    # Only a row group cut by a partition boundary is read twice: at most P - 1 such reads.
    assert int((reads - 1).sum()) <= P - 1


@pytest.mark.parametrize("jitter", [None, 2, 4])
def test_tasks_span_the_partition(jitter: int | None) -> None:
    rows = ROWS[2]
    K = 10
    od = o.stratified_order(rows, 9, 0, window=K, jitter=jitter)
    n = len(rows)
    T = -(-n // K)
    assert len(od.tasks) == T
    for t in od.tasks:
        pos = np.asarray(t.units)
        # One row group from each stratum of T consecutive ones: never two in one stratum.
        assert len(set((pos // T).tolist())) == len(pos)
        assert len(pos) >= n // T
        if jitter is not None:
            assert np.diff(pos).max() < T + jitter


def test_balance_keeps_tasks_level_in_rows() -> None:
    # Short last row groups of every file (the AUC data's 424-row ones) must not leave a task
    # behind in some part of the canonical order: over every prefix, tasks differ by less than
    # the tolerance plus the largest piece.
    rows = np.asarray(([4096] * 6 + [424]) * 8 + list(np.random.default_rng(1).integers(1, 5000, 40)))
    tol = int(np.median(rows))
    for T in (1, 3, 7):
        task = o.balance(rows, T, o._raw([9, 9, 9, 9], len(rows)), tol)
        loads = np.zeros(T, dtype=np.int64)
        for i in range(len(rows)):
            loads[task[i]] += rows[i]
            assert loads.max() - loads.min() < tol + rows.max()
    # Equal row groups: one per task in every run of T (independent strata).
    task = o.balance(np.full(20, 10), 4, o._raw([1, 1, 1, 1], 20), 10)
    assert all(sorted(task[i:i + 4].tolist()) == [0, 1, 2, 3] for i in range(0, 20, 4))
    # Different keys give different groupings (the randomness is in the choice, not only ties).
    a = o.balance(rows, 5, o._raw([1, 2, 3, 4], len(rows)), tol)
    b = o.balance(rows, 5, o._raw([1, 2, 3, 5], len(rows)), tol)
    assert not np.array_equal(a, b)


def test_spread_gives_every_group_one_slot_per_stratum() -> None:
    keys = o._raw([1, 2, 3, 4], 30)
    for jitter in (None, 1, 3):
        g = o.spread(28, 5, keys, jitter)
        for s in range(0, 28, 5):
            part = g[s:s + 5]
            assert len(set(part.tolist())) == len(part)
        # The short last stratum leaves some groups one row group short, never two.
        counts = np.bincount(g, minlength=5)
        assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
@pytest.mark.parametrize("P", [1, 2])
def test_engine_same_steps_any_workers_and_resume(workers: int, P: int) -> None:
    rows = ROWS[2]
    gb = 32 * P
    od = o.stratified_order(rows, 4, 1, window=8, block_rows=300, partitions=P)
    ids, offsets = od.global_steps(gb)
    got, reads, window = o.run_engine(od, gb, workers)
    assert np.array_equal(got, ids)
    assert window <= 8 and reads.min() == 1 and int((reads - 1).sum()) <= P - 1
    steps = len(offsets) - 1
    for s in (1, steps // 3, steps // 2 + 1, steps - 1, steps):
        got, reads, _ = o.run_engine(od, gb, workers, start_step=s)
        assert np.array_equal(got, ids[offsets[s]:]), s
        assert reads.max() <= 2  # a resume reads the task it lands in once, never again


def test_world_size_changes_only_the_split() -> None:
    # The global steps depend on the partitions and the global batch, never on a rank count:
    # rank r of R takes partitions [r*P/R, (r+1)*P/R) of every step.
    rows = ROWS[2]
    od = o.stratified_order(rows, 4, 0, window=8, partitions=4)
    ids, offsets = od.global_steps(64)
    m = 16
    for R in (1, 2, 4):
        per_rank = [np.concatenate([od.streams[p][i * m:(i + 1) * m] for p in range(r * 4 // R, (r + 1) * 4 // R)])
                    for r in range(R) for i in [5]]
        assert np.array_equal(np.concatenate(per_rank), ids[offsets[5]:offsets[6]])


def test_windowed_matches_detload_plan() -> None:
    plan = pytest.importorskip("detload.plan")
    if not hasattr(plan, "make_plan_v2"):
        pytest.skip("detload.plan has moved")
    rng = np.random.default_rng(0)
    for P in (1, 2, 3):
        for _ in range(4):
            rows = rng.integers(1, 50, size=int(rng.integers(1, 30)))
            w = int(rng.integers(1, 5))
            ours = o.windowed_order(rows, 11, 3, window=w, partitions=P)
            opts = plan.OrderOptions(seed=11, batch_size=P, partitions=P, order="windowed", shuffle_window=w)
            ref = plan.make_plan_v2(plan.UnitList.from_rows(rows), opts, epoch=3)
            st = ours.unit_starts
            for p, blocks in enumerate(ref.blocks):
                ids = [np.concatenate([np.arange(st[r.row_group] + r.first, st[r.row_group] + r.first + r.rows)
                                       for r in b.ranges]) for b in blocks]
                ids = [x[plan.block_permutation(11, 3, p, b.number, len(x))] for x, b in zip(ids, blocks)]
                assert np.array_equal(np.concatenate(ids) if ids else np.zeros(0), ours.streams[p])


def test_bad_rows_refused() -> None:
    with pytest.raises(ValueError, match="positive row counts"):
        o.stratified_order([3, 0, 2], 1, 0)
    with pytest.raises(ValueError, match="must divide by the 3 partitions"):
        o.stratified_order([3, 4, 2], 1, 0, partitions=3).global_steps(4)
