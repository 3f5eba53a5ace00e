"""The planner's units and partitions (detload.make_plan): row-range units, partitions balanced by rows.

Pure planner tests: plans are computed from row counts (and unit descriptions)
alone, and batches are materialised as canonical row numbers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import TAG_BLOCK, TAG_UNITS, model_partitions_v2, skewed_row_groups

from detload import EmptyDatasetError, OptionError, OrderOptions
from detload._streams import TAG_ROW_GROUP, _entropy, block_permutation, row_group_entropy
from detload.plan import PLAN_FORMAT_VERSION, Plan, Range, Unit, UnitList
from detload.planning.order import DEFAULT_BLOCK_BUDGET, block_memory_warning, make_plan

# Plans of up to a few hundred thousand rows are materialised per world size: a few
# times the profile's examples, not the tenfold of the schedule tests (test_plan.py).
PURE = settings(max_examples=3 * settings().max_examples)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _row_starts(units: UnitList) -> dict[tuple[int, int], int]:
    """Canonical row number of each (file, row group)'s delivered row 0 (units in canonical order)."""
    starts: dict[tuple[int, int], int] = {}
    pos = 0
    for u in units.units:
        for r in u.ranges:
            starts.setdefault((r.file, r.row_group), pos - r.first)
            pos += r.rows
    return starts


def _partition_stream(plan: Plan, p: int, starts: dict[tuple[int, int], int]) -> np.ndarray:
    """Partition p's stream as canonical row numbers, built from the plan's blocks like a worker would."""
    out = []
    for b in plan.blocks[p]:
        rows = np.concatenate([np.arange(starts[r.file, r.row_group] + r.first,
                                         starts[r.file, r.row_group] + r.first + r.rows) for r in b.ranges])
        assert len(rows) == b.rows
        if plan.options.shuffle:
            rows = rows[block_permutation(plan.options.seed, plan.epoch, p, b.number, b.rows)]
        out.append(rows)
    return np.concatenate(out) if out else np.empty(0, np.int64)


def _rank_batches(plan: Plan, starts: dict[tuple[int, int], int]) -> list[np.ndarray]:
    streams = {p: _partition_stream(plan, p, starts) for p in plan.owned_partitions}
    return [np.concatenate([streams[p][slice(*plan.micro_range(p, i))] for p in plan.owned_partitions])
            for i in range(plan.steps)]


@st.composite
def plan_inputs(draw: st.DrawFn) -> tuple[list[int], int, int, dict[str, object]]:
    """(row-group sizes, P, micro-batch, the other order options)."""
    rows = draw(skewed_row_groups())
    P = draw(st.integers(1, min(16, len(rows))))  # at most one partition per row group
    total = sum(rows)
    micro = draw(st.one_of(st.integers(1, 64), st.integers(1, max(1, total // P + 3))))
    return rows, P, micro, {
        "seed": draw(st.integers(0, 2**64 - 1)),
        "shuffle": draw(st.booleans()),
        "shuffle_window": draw(st.integers(1, 8)),
        "drop_last": draw(st.booleans()),
    }


def _opts(P: int, micro: int, world: int, kw: dict[str, object]) -> OrderOptions:
    return OrderOptions(order="windowed", batch_size=micro * P // world, partitions=P, world_size=world, **kw)  # type: ignore[arg-type]


@PURE
@given(plan_inputs(), st.integers(0, 3))
def test_balanced_steps_and_every_world_size(inputs, epoch):
    rows, P, micro, kw = inputs
    units = UnitList.from_rows(rows)
    total = sum(rows)
    G = micro * P
    starts = _row_starts(units)
    if kw["drop_last"] and total // P < micro:
        with pytest.raises(OptionError, match=f"the epoch holds {total} rows"):
            make_plan(units, _opts(P, micro, 1, kw), epoch=epoch)
        return
    union = None
    for R in _divisors(P):
        plans = [make_plan(units, _opts(P, micro, R, kw), epoch=epoch, rank=r, dataset_fingerprint="ds")
                 for r in range(R)]
        first = plans[0]
        # partitions balanced to one row, the same in every rank's plan; boundaries at p*T//P
        assert max(first.partition_rows) - min(first.partition_rows) <= 1
        assert first.boundaries == tuple(p * total // P for p in range(P + 1))
        assert 0 <= first.redundant_reads <= P - 1
        assert len({(pl.steps, pl.dropped_rows, pl.fingerprint, pl.partition_rows) for pl in plans}) == 1
        batches = [_rank_batches(pl, starts) for pl in plans]
        steps = [np.concatenate([b[i] for b in batches]) for i in range(first.steps)]
        sizes = [len(s) for s in steps]
        if kw["drop_last"]:
            assert sizes == [G] * first.steps
            assert first.dropped_rows == total - first.steps * G
            assert 0 <= first.dropped_rows < G
        else:
            assert first.dropped_rows == 0
            assert all(s == G for s in sizes[:-1]) and 0 < sizes[-1] <= G
        delivered = np.concatenate(steps)
        assert len(np.unique(delivered)) == len(delivered) == total - first.dropped_rows
        if not kw["drop_last"]:
            assert np.array_equal(np.sort(delivered), np.arange(total))
        # rank r's batch is the same size at every step as every other rank's but the last
        for b in batches:
            assert [len(x) for x in b[:-1]] == [micro * P // R] * (first.steps - 1)
        if union is None:
            union = steps
            # the model of the documented order, computed without the planner
            model = model_partitions_v2(rows, seed=kw["seed"], epoch=epoch, shuffle=kw["shuffle"],
                                        shuffle_window=kw["shuffle_window"], partitions=P)
            for p in range(P):
                assert np.array_equal(_partition_stream(first, p, starts), model[p])
        else:
            assert len(steps) == len(union) and all(np.array_equal(a, b) for a, b in zip(steps, union))


@PURE
@given(plan_inputs(), st.integers(0, 3))
def test_plan_is_pure(inputs, epoch):
    rows, P, micro, kw = inputs
    kw = {**kw, "drop_last": False}
    a = make_plan(rows, _opts(P, micro, 1, kw), epoch=epoch, dataset_fingerprint="ds")
    b = make_plan(UnitList.from_rows(list(rows)), _opts(P, micro, 1, kw), epoch=epoch, dataset_fingerprint="ds")
    assert json.dumps(a.to_dict(3)) == json.dumps(b.to_dict(3))
    assert a.blocks == b.blocks and a.schedule == b.schedule
    # the fingerprint covers units and options, not the epoch or the rank
    c = make_plan(rows, _opts(P, micro, 1, kw), epoch=epoch + 1, dataset_fingerprint="ds")
    assert c.fingerprint == a.fingerprint


@st.composite
def grouped_units(draw: st.DrawFn) -> list[Unit]:
    """Whole-row-group units of 1-3 files, each cut into groups of 1 to 2,000 rows."""
    units = []
    for f in range(draw(st.integers(1, 3))):
        for g in range(draw(st.integers(1, 8))):
            sizes = draw(st.lists(st.one_of(st.integers(1, 5), st.integers(1, 2_000)), min_size=1, max_size=12))
            offsets = tuple(int(x) for x in np.cumsum([0, *sizes[:-1]]))
            units.append(Unit((Range(f, g, 0, sum(sizes)),), groups=offsets if draw(st.booleans()) else ()))
    return units


@PURE
@given(grouped_units(), st.integers(1, 16), st.integers(0, 2**64 - 1), st.booleans(), st.integers(1, 5))
def test_groups_are_never_split(units, P, seed, shuffle, window):
    P = min(P, len(units))  # at most one partition per row group
    plan = make_plan(units, OrderOptions(order="windowed", seed=seed, batch_size=P, partitions=P, shuffle=shuffle,
                                            shuffle_window=window), epoch=0)
    total = sum(u.rows for u in units)
    assert sum(plan.partition_rows) == total
    # where each source unit's pieces start, within the unit: always one of its group starts
    seen: dict[int, list[tuple[int, int, int]]] = {}
    for p in range(P):
        for b in plan.blocks[p]:
            for piece, src in zip(b.units, b.sources):
                r0 = piece.ranges[0]
                offset = r0.first - units[src].ranges[0].first
                seen.setdefault(src, []).append((offset, piece.rows, p))
                if units[src].groups:
                    assert offset in units[src].groups
                    assert piece.groups == tuple(g - offset for g in units[src].groups
                                                 if offset <= g < offset + piece.rows)
                else:
                    assert piece.groups == ()
    for src, pieces in seen.items():
        pieces.sort()
        assert [o for o, _, _ in pieces] == list(np.cumsum([0] + [n for _, n, _ in pieces[:-1]]))
        assert sum(n for _, n, _ in pieces) == units[src].rows
        assert len({p for _, _, p in pieces}) == len(pieces)  # the pieces of a unit lie in distinct partitions
    # the documented bound: each partition within 2*floor(g/2) + 1 rows of T/P, g the largest group
    g = max(max(np.diff([*u.groups, u.rows]).tolist()) if u.groups else 1 for u in units)
    for n_p in plan.partition_rows:
        assert abs(n_p - total / P) < 2 * (g // 2) + 1
    assert plan.redundant_reads <= P - 1


def test_newcomer_case_27_unequal_row_groups():
    """The report: 27 unequal row groups of 500,000 rows, P=8, two ranks of batch 64.

    Whole row groups dealt round-robin to partitions gave partitions of 40,000 to 80,000
    rows there, half the steps short with drop_last=False and 36 % of the rows dropped
    with drop_last=True; balanced by rows, each partition holds 62,500 rows and no step
    is short but the last."""
    rows = [40_000] * 5 + [20_000] * 6 + [10_000] * 8 + [6_666, 6_667, 6_667] + [30_000, 25_000, 10_000, 9_000, 6_000]
    assert (len(rows), sum(rows)) == (27, 500_000)
    units = UnitList.from_rows(rows)
    for drop_last in (False, True):
        opts = OrderOptions(order="windowed", seed=2024, batch_size=64, partitions=8, world_size=2, drop_last=drop_last)
        plans = [make_plan(units, opts, epoch=0, rank=r) for r in (0, 1)]
        for plan in plans:
            assert plan.partition_rows == (62_500,) * 8
            assert plan.redundant_reads <= 7
            sizes = [plan.step_rows(i) for i in range(plan.steps)]
            if drop_last:
                assert plan.steps == 500_000 // 128 == 3906
                assert sizes == [64] * 3906
                assert plan.dropped_rows == 500_000 - 3906 * 128 == 32
            else:
                assert plan.steps == 3907
                assert sizes[:-1] == [64] * 3906 and sizes[-1] == 16  # 32 rows left for 2 ranks
                assert plan.dropped_rows == 0


def test_fewer_rows_than_one_batch():
    # 3 rows, 2 partitions on 2 ranks, micro-batch 4: every row delivered once, in one step
    plan = make_plan([2, 1], OrderOptions(order="windowed", seed=1, batch_size=4, partitions=2, world_size=2), epoch=0)
    assert sum(plan.partition_rows) == 3 and plan.steps == 1
    rows_per_rank = [make_plan([2, 1], plan.options, epoch=0, rank=r).step_rows(0) for r in range(2)]
    assert sorted(rows_per_rank) == [1, 2]
    # a short step; with drop_last a planning error naming the sizes
    plan = make_plan([5, 6], OrderOptions(order="windowed", seed=1, batch_size=8, partitions=2, world_size=2), epoch=0)
    assert (plan.steps, plan.partition_rows) == (1, (5, 6))
    with pytest.raises(OptionError, match=r"drop_last=True drops every row: the epoch holds 11 rows, the "
                                          r"smallest of the 2 partitions 5, fewer than one micro-batch of 8 rows "
                                          r"\(global batch 16 = 2 x 8\)"):
        make_plan([5, 6], OrderOptions(order="windowed", seed=1, batch_size=8, partitions=2, world_size=2, drop_last=True),
                  epoch=0)


def test_partitions_and_world_size_are_at_most_the_units():
    """No more partitions, nor ranks, than row groups that deliver rows: refused by name, value and
    bound before the planner loops over partitions (a huge count would plan forever)."""
    one = [100]
    plan = make_plan([100, 50, 1], OrderOptions(order="windowed", seed=0, batch_size=3, partitions=3), epoch=0)
    assert len(plan.partition_rows) == 3 and sum(plan.partition_rows) == 151  # the bound itself plans
    for opts, match in [
        (OrderOptions(order="windowed", seed=0, batch_size=4, partitions=4), r"^partitions=4 exceeds the 1 non-empty row groups .*"
                                                           r"partitions must be at most 1\. Use a smaller partitions"),
        (OrderOptions(order="windowed", seed=0, batch_size=2**63, partitions=2**63),
         r"^partitions=9223372036854775808 exceeds the 1 non-empty row groups.* at most 1\."),
        (OrderOptions(order="windowed", seed=0, batch_size=1, partitions=10**20, world_size=10**20),
         r"^world_size=100000000000000000000 exceeds the 1 non-empty row groups.* world_size must be at most 1\."),
    ]:
        with pytest.raises(OptionError, match=match):
            make_plan(one, opts, epoch=0)
    with pytest.raises(OptionError, match=r"^partitions=4 exceeds the 3 non-empty row groups.* at most 3\."):
        make_plan([100, 50, 1], OrderOptions(order="windowed", seed=0, batch_size=4, partitions=4), epoch=0)
    with pytest.raises(OptionError, match=r"^world_size=4 exceeds the 3 non-empty row groups.* at most 3\."):
        make_plan([100, 50, 1], OrderOptions(order="windowed", seed=0, batch_size=1, partitions=4, world_size=4), epoch=0)


def test_a_boundary_may_cut_a_unit():
    """Two partitions of one 100-row unit and a 1-row one: the boundary at row 50 cuts the big unit."""
    plan = make_plan([100, 1], OrderOptions(order="windowed", seed=0, batch_size=2, partitions=2, shuffle=False), epoch=0)
    assert plan.boundaries == (0, 50, 101) and plan.redundant_reads == 1
    assert [[u.ranges for u in b.units] for p in range(2) for b in plan.blocks[p]] == [
        [(Range(0, 0, 0, 50),)], [(Range(0, 0, 50, 50),), (Range(0, 1, 0, 1),)]]


def test_single_partition_cuts_nothing():
    """P = 1 cuts nothing: the blocks hold whole units, shuffle_window of them each."""
    rows = [100, 7, 300, 1, 55, 64, 9]
    opts = OrderOptions(order="windowed", seed=9, batch_size=16, shuffle_window=2)
    plan = make_plan(rows, opts, epoch=2)
    assert [u for b in plan.blocks[0] for u in b.sources] == plan.unit_order.tolist()
    assert [len(b.units) for b in plan.blocks[0]] == [2, 2, 2, 1]
    assert all(u.whole for b in plan.blocks[0] for u in b.units)
    assert (plan.steps, plan.redundant_reads, plan.plan_format) == (34, 0, PLAN_FORMAT_VERSION)


def test_cut_multi_range_unit_and_redundant_reads():
    # one unit across two row groups (a group running over the boundary), cut at the row-group
    # boundary; a one-row unit after it
    tail = Unit((Range(4, 0, 0, 1),))
    u = Unit((Range(3, 4, 10, 6), Range(3, 5, 0, 6)), groups=(0, 6))
    plan = make_plan([u, tail], OrderOptions(order="windowed", seed=0, batch_size=2, partitions=2, shuffle=False), epoch=0)
    assert plan.redundant_reads == 0
    assert [b.units for b in (plan.blocks[0][0], plan.blocks[1][0])] == [
        (Unit((Range(3, 4, 10, 6),), (0,)),), (Unit((Range(3, 5, 0, 6),), (0,)), tail)]
    # cut inside the second range: row group 5 is read by both partitions
    u = Unit((Range(3, 4, 10, 2), Range(3, 5, 0, 6)), selection="f1")
    plan = make_plan([u, tail], OrderOptions(order="windowed", seed=0, batch_size=2, partitions=2, shuffle=False), epoch=0)
    assert plan.redundant_reads == 1
    assert [b.ranges for b in (plan.blocks[0][0], plan.blocks[1][0])] == [
        (Range(3, 4, 10, 2), Range(3, 5, 0, 2)), (Range(3, 5, 2, 4), Range(4, 0, 0, 1))]
    assert {x.selection for p in range(2) for x in plan.blocks[p][0].units if x != tail} == {"f1"}
    # one huge row group among tiny ones, 16 partitions: cut 15 times, P-1 redundant reads
    plan = make_plan([1] * 7 + [100_000] + [1] * 8, OrderOptions(order="windowed", seed=5, batch_size=16, partitions=16), epoch=0)
    assert plan.redundant_reads == 15 and max(plan.partition_rows) - min(plan.partition_rows) <= 1


def test_to_dict_lists_units_ranges_and_reads():
    units = [Unit((Range(0, 0, 0, 5),)), Unit((Range(0, 1, 0, 3),), groups=(0, 1)), Unit((Range(1, 0, 0, 4),))]
    plan = make_plan(units, OrderOptions(order="windowed", seed=7, batch_size=2, partitions=2, world_size=2, shuffle=False),
                        epoch=0, rank=1, dataset_fingerprint="ds")
    d = plan.to_dict(2)
    assert json.loads(json.dumps(d)) == d
    assert (d["plan_format"], d["units"], d["rows"], d["partition_rows"], d["boundaries"]) == (
        2, 3, 12, [6, 6], [0, 6, 12])
    assert d["redundant_reads"] == 1 and d["units_digest"] == UnitList(units).digest
    # rank 1 owns partition 1: row group 0#1 from its group starting at row 1, then 1#0
    assert [b["units"] for b in d["blocks"]] == [[
        {"source": 1, "rows": 2, "ranges": [[0, 1, 1, 2]], "groups": [0]},
        {"source": 2, "rows": 4, "ranges": [[1, 0, 0, 4]]},
    ]]
    # the boundary at row 6 falls one row into 0#1; with groups (0, 2) the nearer start is 0 (ties down)
    units[1] = Unit((Range(0, 1, 0, 3),), groups=(0, 2))
    plan = make_plan(units, plan.options, epoch=0)
    assert (plan.partition_rows, plan.redundant_reads) == ((5, 7), 0)


def test_fingerprint_covers_units():
    opts = OrderOptions(order="windowed", seed=1, batch_size=4)
    base = make_plan(UnitList.from_row_groups([0, 0, 1], [0, 1, 0], [5, 5, 5]), opts, epoch=0).fingerprint
    others = [
        UnitList.from_row_groups([0, 1, 1], [0, 0, 1], [5, 5, 5]),  # same rows, other row groups
        UnitList([Unit((Range(0, 0, 0, 5),)), Unit((Range(0, 1, 0, 5),), groups=(0, 1)),
                  Unit((Range(1, 0, 0, 5),))]),
        UnitList([Unit((Range(0, 0, 0, 5),)), Unit((Range(0, 1, 0, 5),)),
                  Unit((Range(1, 0, 0, 5),), selection="x")]),
    ]
    fps = {make_plan(u, opts, epoch=0).fingerprint for u in others}
    assert base not in fps and len(fps) == 3
    assert make_plan(UnitList.from_row_groups([0, 0, 1], [0, 1, 0], [5, 5, 5]), opts, epoch=0,
                        dataset_fingerprint="other").fingerprint != base


def test_schedule_and_workers_as_format_1():
    rows = [40, 3, 500, 7, 7, 90, 1, 1, 1, 260]
    opts = OrderOptions(order="windowed", seed=3, batch_size=8, partitions=4, world_size=2, shuffle_window=2)
    plan = make_plan(rows, opts, epoch=1, rank=1)
    want = sorted((b for p in plan.owned_partitions for b in plan.blocks[p] if b.first_step < plan.steps),
                  key=lambda b: (b.first_step, b.partition, b.number))
    assert list(plan.schedule) == want
    sched = plan.worker_schedules(3)
    for k, b in enumerate(plan.schedule):
        assert sched[k % 3][k // 3] is b
    m = opts.micro_batch
    assert plan.schedule_from(5) == tuple(b for b in plan.schedule if b.end > 5 * m)


def test_row_group_stream_is_tagged_and_fixed_length():
    assert TAG_ROW_GROUP not in (TAG_UNITS, TAG_BLOCK)
    e = row_group_entropy(2**32 + 1, 3, 4, 5)
    assert e == [TAG_ROW_GROUP, 1, 1, 3, 4, 5]
    assert len({len(row_group_entropy(s, 0, f, g)) for s in (0, 2**64 - 1) for f in (0, 9) for g in (0, 7)}) == 1
    # same words under the block tag: another stream
    assert e[1:] == _entropy(TAG_BLOCK, 2**32 + 1, 3, 4, 5)[1:]
    a = np.random.PCG64(np.random.SeedSequence(e)).random_raw(4).tolist()
    b = np.random.PCG64(np.random.SeedSequence(_entropy(TAG_BLOCK, 2**32 + 1, 3, 4, 5))).random_raw(4).tolist()
    assert a != b


def test_block_memory_warning():
    opts = OrderOptions(order="windowed", seed=0, batch_size=4, shuffle_window=4)
    plan = make_plan([1_000_000, 900_000, 10, 10], opts, epoch=0)
    assert block_memory_warning(plan, 100) is None  # 190 MB: under 1 GiB
    assert DEFAULT_BLOCK_BUDGET == 2**30
    text = block_memory_warning(plan, 1_000)
    assert text is not None
    assert "the largest block holds 1,900,020 rows, about 1,812 MiB at 1,000 bytes per row" in text
    assert "budget of 1,024 MiB" in text
    assert "smaller shuffle_window (now 4)" in text
    assert "The largest row group holds 1,000,000 rows" in text and "--row-group-rows" in text
    # a block of one row group: a smaller window cannot help, so it is not offered
    one = make_plan([1_000_000], OrderOptions(order="windowed", seed=0, batch_size=4, shuffle_window=1), epoch=0)
    text = block_memory_warning(one, 2_000, budget=2**20)
    assert text is not None and "shuffle_window" not in text and "--row-group-rows" in text


@pytest.mark.parametrize(
    ("units", "err", "match"),
    [
        ([], EmptyDatasetError, "no rows"),
        ([3, 0, 2], OptionError, "positive row counts"),
        (["x"], OptionError, "unit 0 must be a detload.plan.Unit, got str"),
        ([Unit(())], OptionError, "unit 0 has no ranges"),
        ([Unit(((0, 0, 0, 3),))], OptionError, r"ranges must be Range\(file, row_group, first, rows\)"),
        ([Unit((Range(0, 0, 0, 1.5),))], OptionError, "of ints"),  # type: ignore[arg-type]
        ([Unit((Range(0, 0, 0, 0),))], OptionError, r"rows >= 1 \(leave out row groups that deliver no rows\)"),
        ([Unit((Range(0, -1, 0, 2),))], OptionError, "needs file, row_group, first >= 0"),
        ([Unit((Range(0, 0, 0, 2), Range(1, 0, 0, 2)))], OptionError, "unit 0 spans several files"),
        ([Unit((Range(0, 1, 0, 2), Range(0, 0, 0, 2)))], OptionError, "not in canonical order without overlap"),
        ([Unit((Range(0, 0, 0, 4), Range(0, 0, 3, 2)))], OptionError, "not in canonical order without overlap"),
        ([Unit((Range(0, 0, 0, 4),), groups=(1, 2))], OptionError, r"groups must be increasing offsets in \[0, 4\)"),
        ([Unit((Range(0, 0, 0, 4),), groups=(0, 2, 2))], OptionError, "groups must be increasing"),
        ([Unit((Range(0, 0, 0, 4),), groups=(0, 4))], OptionError, "groups must be increasing"),
    ],
)
def test_unit_errors(units, err, match):
    with pytest.raises(err, match=match):
        make_plan(units, OrderOptions(order="windowed", seed=0, batch_size=2), epoch=0)


def test_plan_errors():
    opts = OrderOptions(order="windowed", seed=0, batch_size=2)
    with pytest.raises(OptionError, match="rank 1 is not below the world size 1"):
        make_plan([3], opts, epoch=0, rank=1)
    with pytest.raises(OptionError, match=r"epoch must be an int in \[0, 2\*\*32\), got -1"):
        make_plan([3], opts, epoch=-1)
    with pytest.raises(OptionError, match="one entry per row group"):
        UnitList.from_row_groups([0], [0, 1], [3, 3])


@settings(max_examples=5)
@given(st.integers(0, 2**64 - 1))
def test_shuffle_false_keeps_canonical_rows(seed):
    rows = [3, 1, 4, 1, 5, 9, 2, 6]
    plan = make_plan(rows, OrderOptions(order="windowed", seed=seed, batch_size=3, partitions=3, shuffle=False), epoch=0)
    starts = _row_starts(plan.units)
    assume(plan.steps > 0)
    stream = np.concatenate([_partition_stream(plan, p, starts) for p in range(3)])
    assert np.array_equal(stream, np.arange(sum(rows)))
