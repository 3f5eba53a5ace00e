"""The mixed order's planner (plan format 3): the design's worked example as a known answer, its
invariants as properties (every row once, equal blocks, one reader per row group, same inputs
same plan), its options and their errors, and the windowed order's fingerprints unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detload.errors import OptionError
from detload.plan import (
    MIX_MIN_RUN,
    MIX_RUNS,
    PLAN_FORMAT_MIX,
    MixPlan,
    OrderOptions,
    Range,
    Unit,
    UnitList,
    chunk_rows,
)
from detload.planning import make_plan
from detload.planning.mix import spread
from detload.planning.order import order_fingerprint, window_memory_warning


def mix(**kw: object) -> OrderOptions:
    return OrderOptions(**({"seed": 7, "batch_size": 4, "order": "mix"} | kw))  # type: ignore[arg-type]


def test_known_answer_of_the_worked_example() -> None:
    # docs/determinism.md and docs/mixing-design.md: six row groups of 5, 3, 6, 2, 4, 4 rows.
    plan = make_plan([5, 3, 6, 2, 4, 4], mix(batch_size=1, mix_window=2, block_rows=4), epoch=0)
    assert isinstance(plan, MixPlan) and plan.plan_format == PLAN_FORMAT_MIX == 3
    tasks = plan.tasks[0]
    assert [t.sources for t in tasks] == [(2, 3), (1, 5), (0, 4)]
    assert [np.diff(t.bounds).tolist() for t in tasks] == [[4, 4], [3, 4], [3, 3, 3]]
    # Each block one chunk of each piece: (piece, first row, rows, run, period) before its
    # permutation; chunks this short are one run each.
    assert [[[c[:3] for c in t.block_chunks(j) if c[3] == c[2]] for j in range(t.blocks)] for t in tasks] == [
        [[(0, 0, 3), (1, 1, 1)], [(0, 3, 3), (1, 0, 1)]],
        [[(0, 2, 1), (1, 2, 2)], [(0, 0, 2), (1, 0, 2)]],
        [[(0, 0, 2), (1, 0, 1)], [(0, 2, 2), (1, 1, 1)], [(0, 4, 1), (1, 2, 2)]]]
    assert all(c[3] == c[2] for t in tasks for j in range(t.blocks) for c in t.block_chunks(j))
    assert plan.row_ids().tolist() == [15, 9, 8, 10, 14, 13, 11, 12, 23, 22, 7, 6, 20, 5, 21,
                                       0, 1, 16, 17, 3, 2, 18, 19, 4]
    assert [b.rows for b in plan.schedule] == [4, 4, 3, 4, 3, 3, 3]
    assert plan.steps == 24 and plan.dropped_rows == 0


def test_a_chunk_of_a_long_piece_is_runs_spread_over_it() -> None:
    # Two blocks; piece 0 gives each 100 rows: 6 runs of 16 rows (MIX_RUNS, MIX_MIN_RUN), one
    # every 32 rows, the block's rotated chunk of each period, then 4 contiguous rows of the
    # 8 after the periods. Piece 1 (50 rows a block): 3 runs of 16, then 2 rows.
    plan = make_plan([200, 100], mix(batch_size=1, mix_window=2, block_rows=150, seed=3), epoch=0)
    (t,) = plan.tasks[0]
    assert t.rotations == (1, 0) and t.deal == 1 and t.bounds == (0, 150, 300)
    assert [t.block_chunks(j) for j in range(2)] == [
        [(0, 16, 96, 16, 32), (0, 196, 4, 4, 4), (1, 0, 48, 16, 32), (1, 96, 2, 2, 2)],
        [(0, 0, 96, 16, 32), (0, 192, 4, 4, 4), (1, 16, 48, 16, 32), (1, 98, 2, 2, 2)]]
    assert chunk_rows(16, 96, 16, 32).tolist() == [r for s in range(16, 192, 32) for r in range(s, s + 16)]
    # Block 0's rows of piece 0 span the piece (rows 16..199), not a run of 100 stored rows.
    first = np.concatenate([chunk_rows(*c[1:]) for c in t.block_chunks(0) if c[0] == 0])
    assert first.min() == 16 and first.max() == 199 and len(first) == 100


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.integers(1, 3000), min_size=1, max_size=12), blocks=st.integers(1, 40),
       seed=st.integers(0, 2**32 - 1), window=st.integers(1, 12))
def test_the_chunks_of_a_task_take_every_row_of_it_once(rows, blocks, seed, window) -> None:  # type: ignore[no-untyped-def]
    block_rows = max(1, -(-sum(rows) // blocks))
    plan = make_plan(rows, mix(batch_size=1, mix_window=window, block_rows=block_rows, seed=seed), epoch=1)
    for t in plan.tasks[0]:
        seen = [np.zeros(u.rows, dtype=np.int64) for u in t.units]
        for j in range(t.blocks):
            chunks = t.block_chunks(j)
            assert sum(c[2] for c in chunks) == t.bounds[j + 1] - t.bounds[j]
            for q, first, n, run, period in chunks:
                assert n % run == 0 and (run == n or (first < period and period % run == 0 and run >= MIX_MIN_RUN))
                assert n // run <= MIX_RUNS or run == n
                np.add.at(seen[q], chunk_rows(first, n, run, period), 1)
        assert all((s == 1).all() for s in seen)


def test_spread_takes_one_of_every_stratum_per_group() -> None:
    keys = np.random.default_rng(0).integers(0, 2**63, size=40, dtype=np.uint64)
    g = spread(37, 4, keys)
    for s in range(0, 37, 4):
        stratum = g[s : s + 4]
        assert len(set(stratum.tolist())) == len(stratum)
    counts = np.bincount(g, minlength=4)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 37


def test_without_shuffle_the_stream_is_canonical() -> None:
    plan = make_plan([5, 3, 6, 2, 4, 4], mix(shuffle=False, mix_window=2, block_rows=4), epoch=3)
    assert plan.row_ids().tolist() == list(range(24))


def _check_plan(rows: list[int], plan: MixPlan) -> None:
    total = sum(rows)
    P = plan.options.partitions
    streams = [plan.partition_row_ids(p) for p in range(P)]
    every = np.concatenate(streams)
    # Every row exactly once over the partitions.
    assert np.array_equal(np.sort(every), np.arange(total))
    reads: dict[int, int] = {}
    for p in range(P):
        assert sum(t.rows for t in plan.tasks[p]) == plan.partition_rows[p]
        for t in plan.tasks[p]:
            sizes = np.diff(t.bounds)
            # Equal blocks within a task (within one row), none above block_rows: no small tail.
            assert sizes.max() - sizes.min() <= 1 and sizes.max() <= plan.options.block_rows
            assert len(t.units) <= plan.options.mix_window
            for s in set(t.sources):
                reads[s] = reads.get(s, 0) + 1
        # The partition's blocks tile its stream in order.
        starts = [b.start for b in plan.blocks[p]]
        assert starts == sorted(starts) and sum(b.rows for b in plan.blocks[p]) == plan.partition_rows[p]
    # Each row group is read by one task, except those a partition boundary cut.
    assert sum(v - 1 for v in reads.values()) <= P - 1
    assert sum(v - 1 for v in reads.values()) == plan.redundant_reads


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.integers(1, 40), min_size=1, max_size=60), seed=st.integers(0, 2**64 - 1),
       window=st.integers(1, 9), block=st.integers(1, 60), parts=st.sampled_from([1, 2, 3]),
       epoch=st.integers(0, 3), shuffle=st.booleans())
def test_invariants(rows: list[int], seed: int, window: int, block: int, parts: int, epoch: int,
                    shuffle: bool) -> None:
    parts = min(parts, len(rows))
    opts = mix(seed=seed, batch_size=parts * 2 if parts != 2 else 4, partitions=parts, mix_window=window, block_rows=block,
               shuffle=shuffle)
    plan = make_plan(rows, opts, epoch=epoch)
    assert isinstance(plan, MixPlan)
    _check_plan(rows, plan)
    # Same inputs, same plan (a pure function of them).
    again = make_plan(list(rows), opts, epoch=epoch)
    assert np.array_equal(plan.row_ids(), again.row_ids()) and plan.fingerprint == again.fingerprint
    # The union over ranks of each step is the same at every world size that divides P.
    if parts == 2:
        split = [make_plan(rows, mix(seed=seed, batch_size=2, partitions=2, world_size=2,
                                     mix_window=window, block_rows=block, shuffle=shuffle), epoch=epoch, rank=r)
                 for r in range(2)]
        assert np.array_equal(np.sort(np.concatenate([s.row_ids() for s in split])), np.sort(plan.row_ids()))


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.integers(1, 30), min_size=2, max_size=40), seed=st.integers(0, 2**32),
       parts=st.sampled_from([2, 4]))
def test_fixed_partitions_give_the_same_global_steps_at_every_world_size(rows: list[int], seed: int,
                                                                         parts: int) -> None:
    parts = min(parts, len(rows))
    if parts not in (2, 4):
        return

    def steps(world: int) -> list[list[int]]:
        plans = [make_plan(rows, mix(seed=seed, batch_size=parts // world * 3, partitions=parts, world_size=world,
                                     mix_window=3, block_rows=7), epoch=1, rank=r) for r in range(world)]
        out = []
        for i in range(plans[0].steps):
            step: list[int] = []
            for pl in plans:
                for p in pl.owned_partitions:
                    lo, hi = pl.micro_range(p, i)
                    step += pl.partition_row_ids(p)[lo:hi].tolist()
            out.append(step)
        return out

    assert steps(1) == steps(2)


def test_filtered_units_and_cut_pieces_keep_their_rows() -> None:
    # Units that are parts of row groups (a filter's delivered rows) and cuts by partitions.
    units = UnitList([Unit((Range(0, g, 0, n),)) for g, n in enumerate([7, 1, 9, 4, 4, 12, 3])])
    plan = make_plan(units, mix(batch_size=3, partitions=3, mix_window=2, block_rows=5), epoch=2)
    assert isinstance(plan, MixPlan)
    _check_plan([7, 1, 9, 4, 4, 12, 3], plan)
    for p in range(3):
        for t in plan.tasks[p]:
            for u, s, o in zip(t.units, t.sources, t.offsets):
                assert u.ranges[0].row_group == s and u.ranges[0].first == o


def test_schedule_and_workers_deal_whole_tasks() -> None:
    plan = make_plan([10] * 12, mix(batch_size=4, mix_window=3, block_rows=10), epoch=0)
    assert isinstance(plan, MixPlan)
    for W in (1, 2, 3, 5):
        owners = plan.block_workers(W)
        for b, w in zip(plan.schedule, owners):
            assert w == b.task.number % W  # type: ignore[attr-defined]
        per = plan.task_schedules(W)
        assert sorted(k for w in per for _, blocks in w for k, _ in blocks) == list(range(len(plan.schedule)))
    # A resume inside a task keeps the task and lists only its blocks still needed.
    s = plan.schedule[4].first_step + 1
    per = plan.task_schedules(2, s)
    first = per[0][0]
    assert [i for _, i in first[1]] == list(range(first[1][0][1], first[0].blocks))
    assert all(plan.schedule_from(s)[k].last_step >= s for w in per for _, bl in w for k, _ in bl)


def test_to_dict_names_the_worker_the_engine_uses() -> None:
    # 4 tasks: up to 4 workers each build whole tasks (the dict says which, per task and
    # block); 5 workers share the windows (block k to worker k mod 5, no worker per task).
    plan = make_plan([10] * 12, mix(batch_size=4, mix_window=3, block_rows=10), epoch=0)
    assert isinstance(plan, MixPlan) and len(plan.tasks[0]) == 4
    for W in (1, 2, 4):
        d = plan.to_dict(W)
        assert not plan.shares_windows(W)
        assert [b["worker"] for b in d["blocks"]] == plan.block_workers(W)  # type: ignore[index]
        assert [b["worker"] for b in d["blocks"]] == [b.task.number % W for b in plan.schedule]  # type: ignore[attr-defined,index]
        by_task = {t["number"]: t["worker"] for t in d["tasks"]}  # type: ignore[attr-defined,index]
        assert all(b["worker"] == by_task[b["task"]] for b in d["blocks"])  # type: ignore[index]
    d = plan.to_dict(5)
    assert plan.shares_windows(5)
    assert [b["worker"] for b in d["blocks"]] == [k % 5 for k in range(len(plan.schedule))]  # type: ignore[index]
    assert all("worker" not in t for t in d["tasks"])  # type: ignore[attr-defined]
    # A process pool that does not share (no cache of file columns) is described with shared=False.
    d = plan.to_dict(5, shared=False)
    assert [b["worker"] for b in d["blocks"]] == [b.task.number % 5 for b in plan.schedule]  # type: ignore[attr-defined,index]


def test_options_and_their_errors() -> None:
    opts = OrderOptions(seed=1, batch_size=8, order="mix")
    # The window and the block size depend on the units' rows: resolved by the planner.
    assert opts.mix_window is None and opts.block_rows is None and opts.shuffle_window is None
    assert opts.order_dict()["order"] == "mix" and "shuffle_window" not in opts.order_dict()
    with pytest.raises(OptionError, match=r"shuffle_window=8 is an option of order=\"windowed\""):
        OrderOptions(seed=1, batch_size=8, order="mix", shuffle_window=8)
    with pytest.raises(OptionError, match=r"mix_window=8 is an option of order=\"mix\""):
        OrderOptions(seed=1, batch_size=8, order="windowed", mix_window=8)
    with pytest.raises(OptionError, match=r"block_rows=8 is an option of order=\"mix\""):
        OrderOptions(seed=1, batch_size=8, order="windowed", block_rows=8)
    with pytest.raises(OptionError, match=r"order must be one of \['mix', 'windowed'\], got 'iid'"):
        OrderOptions(seed=1, batch_size=8, order="iid")
    with pytest.raises(OptionError, match="mix_window must be"):
        OrderOptions(seed=1, batch_size=8, order="mix", mix_window=0)
    with pytest.raises(OptionError, match="block_rows must be"):
        OrderOptions(seed=1, batch_size=8, order="mix", block_rows=-1)
    with pytest.raises(OptionError, match=r"group_by= is not available with order=\"mix\": pass order=\"windowed\""):
        OrderOptions(seed=1, batch_size=8, order="mix", group_batches=True)


@pytest.mark.parametrize(("rows", "n", "window", "block"), [
    # Up to 64 row groups, or CTR-sized ones and larger: 64 row groups a window, blocks of 4
    # row groups (the defaults before).
    (16_384, 1000, 64, 65_536), (100_000, 1000, 64, 400_000), (1_024, 60, 1_024, 4_096),
    # Small row groups: a window of about 2**20 rows, about 16 blocks a full task.
    (1_024, 3000, 1_024, 65_536), (4_096, 3000, 256, 65_536), (1_000, 3000, 1_048, 65_500),
    (1_024, 196, 1_024, 12_544), (1, 100_000, 1 << 20, 6_250),
])
def test_default_window_and_block_follow_the_row_groups_rows(rows: int, n: int, window: int, block: int) -> None:
    units = [rows] * n
    plan = make_plan(units, mix(batch_size=4096), epoch=0)
    assert isinstance(plan, MixPlan)
    assert (plan.options.mix_window, plan.options.block_rows) == (window, block)
    # Explicit options win over either default; the block follows the window given.
    plan = make_plan(units, mix(batch_size=4096, mix_window=16), epoch=0)
    assert (plan.options.mix_window, plan.options.block_rows) == (16, 4 * rows)
    plan = make_plan(units, mix(batch_size=4096, block_rows=4 * rows + 1), epoch=0)
    assert (plan.options.mix_window, plan.options.block_rows) == (window, 4 * rows + 1)
    # With partitions, a task holds at most a partition's share of the row groups.
    plan = make_plan(units, mix(batch_size=4096, partitions=8), epoch=0)
    assert plan.options.block_rows == max(4 * rows, -(-min(window, -(-n // 8)) * rows // 16))


def test_a_few_large_row_groups_among_small_ones_do_not_make_a_huge_window() -> None:
    """2,000 row groups of 10 rows and 100 of 100,000 (a stream's small files beside compacted
    ones): the median is 10 rows, the mean 4,771. The window counts the mean, so a task holds
    about 2**20 rows (not the whole 10M-row dataset, as 2**20 // median row groups would), and
    its blocks a sixteenth of it (not 4 x 10 rows, a task of 100,000 blocks)."""
    units = [10] * 1000 + [100_000] * 100 + [10] * 1000
    plan = make_plan(units, mix(batch_size=64, seed=3), epoch=0)
    assert isinstance(plan, MixPlan)
    assert plan.options.mix_window == 2**20 * 2100 // 10_020_000 == 219
    tasks = plan.tasks[0]
    assert len(tasks) == 10 and max(t.rows for t in tasks) < 2**21
    assert max(t.blocks for t in tasks) <= 17
    # Each task still takes one row group of every stretch of ten: big and small ones alike.
    assert all(sum(units[i] == 100_000 for i in t.sources) == 10 for t in tasks)


def test_small_row_groups_get_a_window_of_rows_not_of_64_row_groups() -> None:
    """196 row groups of 1,024 rows (the sorted experiment's c_layout): one task of all of them,
    where a window of 64 row groups made four tasks of 49, each a quarter of the data."""
    plan = make_plan([1_024] * 196, mix(batch_size=512, seed=4), epoch=0)
    assert isinstance(plan, MixPlan)
    ((task,),) = plan.tasks
    assert len(task.units) == 196 and task.blocks == 16
    # Every block draws a chunk from every row group.
    assert all(len({c[0] for c in task.block_chunks(j)}) == 196 for j in range(task.blocks))
    # Data bigger than a window is still cut into windows of about 2**20 rows.
    plan = make_plan([1_024] * 3000, mix(batch_size=512, seed=4), epoch=0)
    assert isinstance(plan, MixPlan)
    assert [len(t.units) for t in plan.tasks[0]] == [1000, 1000, 1000]


def test_windowed_order_keeps_its_format_2_dict_and_fingerprint() -> None:
    opts = OrderOptions(seed=3, batch_size=8, order="windowed")
    assert opts.shuffle_window == 4 and opts.plan_format == 2
    assert opts.order_dict() == {"seed": 3, "global_batch_size": 8, "shuffle": True, "shuffle_window": 4,
                                 "drop_last": False, "partitions": 1}
    # The fingerprint of format 2 (pinned from before the mixed order existed).
    assert order_fingerprint("ds", "units", opts) == "4caa6927a8bfae8a5823f160694627c3"
    plan = make_plan([5, 3, 6], opts, epoch=0)
    assert not isinstance(plan, MixPlan) and plan.plan_format == 2


def test_mixed_fingerprint_differs_from_windowed_and_covers_the_window() -> None:
    a = order_fingerprint("ds", "u", mix(mix_window=4, block_rows=10))
    assert a != order_fingerprint("ds", "u", mix(mix_window=5, block_rows=10))
    assert a != order_fingerprint("ds", "u", mix(mix_window=4, block_rows=11))
    assert a != order_fingerprint("ds", "u", OrderOptions(seed=7, batch_size=4, order="windowed"))


def test_window_memory_warning_names_what_to_change() -> None:
    plan = make_plan([1000] * 10, mix(mix_window=8, block_rows=500), epoch=0)
    assert window_memory_warning(plan, 100.0, budget=1 << 30) is None
    text = window_memory_warning(plan, 100.0, budget=100_000)
    assert text is not None
    assert "Lower mix_window (now 8" in text and "cache=" in text and "--row-group-rows N" in text
    assert "holds 5 row groups (5,000 rows" in text
    # The default window of small row groups holds about 2**20 rows: smaller row groups would not
    # shrink it, so the warning names mix_window and cache=, not a rewrite.
    plan = make_plan([1000] * 3000, mix(), epoch=0)
    text = window_memory_warning(plan, 2048.0, budget=1 << 30)
    assert text is not None and "holds 1000 row groups (1,000,000 rows, about 1,953 MiB" in text
    assert "Lower mix_window (now 1048, the default for row groups of 1,000 rows on average: about 2**20 rows;" in text
    assert "cache=" in text and "--row-group-rows" not in text
    # Row groups of 16,384 rows or more keep the 64-row-group window, which smaller ones shrink.
    text = window_memory_warning(make_plan([20_000] * 100, mix(), epoch=0), 2048.0, budget=1 << 30)
    assert text is not None and "Lower mix_window (now 64;" in text and "--row-group-rows N" in text
