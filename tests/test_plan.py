"""The pure planner (detload.make_plan): schedules, steps, random streams, option checks.

No data, no processes: plans are computed from row counts alone.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import TAG_BLOCK, TAG_UNITS, ref_permutation, unit_rows

from detload import EmptyDatasetError, OptionError, OrderOptions, make_plan
from detload._streams import _entropy, block_permutation, unit_permutation

# Planner tests start nothing: afford ten times the profile's examples.
PURE = settings(max_examples=10 * settings().max_examples)

GOLDEN_UNITS_42_0_10 = [4, 9, 6, 2, 5, 3, 7, 0, 8, 1]
GOLDEN_BLOCK_42_0_0_0_10 = [9, 4, 1, 8, 3, 6, 7, 2, 5, 0]


@st.composite
def plan_inputs(draw: st.DrawFn) -> tuple[list[int], dict[str, object]]:
    """Row counts plus valid order options, distributed ones included."""
    world = draw(st.sampled_from([1, 1, 2, 4]))
    partitions = world * draw(st.sampled_from([1, 1, 2, 3]))
    rows = draw(unit_rows(min_units=partitions, max_units=40))
    micro = draw(st.integers(1, max(1, sum(rows) // partitions + 5)))
    assume((micro * partitions) % world == 0)
    return rows, {
        "seed": draw(st.integers(0, 2**64 - 1)),
        "batch_size": micro * partitions // world,
        "world_size": world,
        "partitions": partitions,
        "shuffle": draw(st.booleans()),
        "shuffle_window": draw(st.integers(1, 8)),
        "drop_last": draw(st.booleans()),
    }


@PURE
@given(plan_inputs(), st.integers(1, 9), st.data())
def test_worker_schedules_and_resume_schedule(inputs, workers, data):
    rows, kw = inputs
    opts = OrderOptions(**({"order": "windowed"} | kw))
    try:
        plan = make_plan(rows, opts, epoch=0)
    except OptionError:
        assume(False)
    sched = plan.worker_schedules(workers)
    assert len(sched) == workers
    for k, b in enumerate(plan.schedule):
        assert sched[k % workers][k // workers] is b
    assert sum(map(len, sched)) == len(plan.schedule)
    # resuming at a step needs exactly the blocks that still hold rows of that step or later
    step = data.draw(st.integers(0, plan.steps))
    m = opts.micro_batch
    assert plan.schedule_from(step) == tuple(b for b in plan.schedule if b.end > step * m)
    if step == 0:
        assert plan.schedule_from(0) == plan.schedule


@PURE
@given(unit_rows(min_units=2, max_units=40), st.integers(1, 500), st.integers(1, 8), st.booleans())
def test_single_partition_steps_and_drop(rows, batch, window, drop_last):
    total = sum(rows)
    opts = OrderOptions(order="windowed", seed=3, batch_size=batch, shuffle_window=window, drop_last=drop_last)
    if drop_last and batch > total:
        with pytest.raises(OptionError, match="drops every row"):
            make_plan(rows, opts, epoch=0)
        return
    plan = make_plan(rows, opts, epoch=0)
    if drop_last:
        assert (plan.steps, plan.dropped_rows) == (total // batch, total % batch)
    else:
        assert (plan.steps, plan.dropped_rows) == (-(-total // batch), 0)
    sizes = [plan.step_rows(i) for i in range(plan.steps)]
    assert sum(sizes) + plan.dropped_rows == total
    assert all(s == batch for s in sizes[:-1])
    assert 0 < sizes[-1] <= batch


@PURE
@given(unit_rows(min_units=2, max_units=30), st.integers(0, 2**64 - 1), st.integers(1, 64))
def test_partition_union_is_independent_of_world_size(rows, seed, micro):
    """Fixed P and global batch: step i's (partition, rows) set is the same at every world size."""
    P = 4
    assume(len(rows) >= P)

    def union(world: int) -> list[list[tuple[int, int, int]]]:
        opts = OrderOptions(order="windowed", seed=seed, batch_size=micro * P // world, partitions=P, world_size=world)
        plans = [make_plan(rows, opts, epoch=1, rank=r) for r in range(world)]
        assert len({p.steps for p in plans}) == 1
        assert len({p.fingerprint for p in plans}) == 1
        return [sorted((p, *pl.micro_range(p, i)) for pl in plans for p in pl.owned_partitions)
                for i in range(plans[0].steps)]

    assert union(1) == union(2) == union(4)


def test_partitions_1_is_the_single_process_plan():
    rows = [100, 7, 300, 1, 55, 64, 9]
    a = make_plan(rows, OrderOptions(order="windowed", seed=9, batch_size=16, shuffle_window=2), epoch=2)
    b = make_plan(rows, OrderOptions(order="windowed", seed=9, batch_size=16, shuffle_window=2, partitions=1, world_size=1), epoch=2)
    np.testing.assert_array_equal(a.unit_order, b.unit_order)
    assert a.blocks == b.blocks and a.steps == b.steps == 34  # ceil(536 / 16)


@PURE
@given(unit_rows(min_units=12, max_units=40), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_different_seeds_give_different_orders(rows, s1, s2):
    assume(s1 != s2)
    a = make_plan(rows, OrderOptions(order="windowed", seed=s1, batch_size=7), epoch=0)
    b = make_plan(rows, OrderOptions(order="windowed", seed=s2, batch_size=7), epoch=0)
    assert a.unit_order.tolist() != b.unit_order.tolist()
    assert a.fingerprint != b.fingerprint


@PURE
@given(unit_rows(min_units=12, max_units=40), st.integers(0, 2**64 - 1), st.integers(0, 1000))
def test_epochs_give_different_orders(rows, seed, epoch):
    a = make_plan(rows, OrderOptions(order="windowed", seed=seed, batch_size=7), epoch=epoch)
    b = make_plan(rows, OrderOptions(order="windowed", seed=seed, batch_size=7), epoch=epoch + 1)
    assert a.unit_order.tolist() != b.unit_order.tolist()
    # the block streams change with the epoch too
    assert block_permutation(seed, epoch, 0, 0, 50).tolist() != block_permutation(seed, epoch + 1, 0, 0, 50).tolist()


@PURE
@given(unit_rows(min_units=1, max_units=40), st.integers(0, 2**64 - 1), st.integers(0, 100), st.integers(1, 8))
def test_shuffle_false_is_canonical_order(rows, seed, epoch, window):
    plan = make_plan(rows, OrderOptions(order="windowed", seed=seed, batch_size=5, shuffle=False, shuffle_window=window), epoch=epoch)
    assert plan.unit_order.tolist() == list(range(len(rows)))
    assert [u for b in plan.blocks[0] for u in b.sources] == list(range(len(rows)))


def test_plan_is_pure():
    rows = [5, 10, 3, 8, 1, 1, 20]
    opts = OrderOptions(order="windowed", seed=123, batch_size=4, shuffle_window=3)
    a, b = make_plan(rows, opts, epoch=4), make_plan(list(rows), opts, epoch=4)
    assert a.to_dict(3) == b.to_dict(3)
    assert a.to_dict(1)["blocks"][1]["worker"] == 0
    assert a.to_dict(3)["blocks"][1]["worker"] == 1


# -- random streams -------------------------------------------------------------

SEEDS = [0, 1, 2, 2**32 - 1, 2**32, 2**32 + 1, 2**63, 2**64 - 1]


def test_entropy_is_fixed_length_and_tagged():
    assert {len(_entropy(TAG_UNITS, s, e)) for s in SEEDS for e in (0, 1, 2**32 - 1)} == {4}
    assert {len(_entropy(TAG_BLOCK, s, 0, p, b)) for s in SEEDS for p in (0, 3) for b in (0, 9)} == {6}
    assert _entropy(TAG_UNITS, 2**32 + 1, 7) == [TAG_UNITS, 1, 1, 7]
    assert _entropy(TAG_BLOCK, 5, 0, 1, 2)[0] == TAG_BLOCK


def test_seedsequence_pitfall_still_holds():
    """Why entropy must be fixed-length: NumPy pads with zeros, so [s, e] and [s, e, 0] are one stream."""
    a = np.random.SeedSequence([7, 3]).generate_state(4)
    b = np.random.SeedSequence([7, 3, 0]).generate_state(4)
    np.testing.assert_array_equal(a, b)


def _raw(entropy: list[int], n: int = 8) -> list[int]:
    return np.random.PCG64(np.random.SeedSequence(entropy)).random_raw(n).tolist()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("epoch", [0, 1])
def test_unit_stream_and_block_zero_stream_never_coincide(seed, epoch):
    units = _entropy(TAG_UNITS, seed, epoch)
    block0 = _entropy(TAG_BLOCK, seed, epoch, 0, 0)
    assert units != block0
    assert _raw(units) != _raw(block0)
    assert unit_permutation(seed, epoch, 64).tolist() != block_permutation(seed, epoch, 0, 0, 64).tolist()


@PURE
@given(
    st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
)
def test_distinct_stream_keys_give_distinct_streams(k1, k2):
    keys = {
        ("u", k1[0], k1[1]): _entropy(TAG_UNITS, k1[0], k1[1]),
        ("u", k2[0], k2[1]): _entropy(TAG_UNITS, k2[0], k2[1]),
        ("b", *k1): _entropy(TAG_BLOCK, *k1),
        ("b", *k2): _entropy(TAG_BLOCK, *k2),
    }
    raws = {k: tuple(_raw(e, 4)) for k, e in keys.items()}
    assert len(set(raws.values())) == len(raws)


def test_seeds_differing_in_either_word_differ():
    perms = {s: tuple(unit_permutation(s, 0, 32).tolist()) for s in (1, 2**32, 2**32 + 1, 0)}
    assert len(set(perms.values())) == 4
    # ... and so do the resulting plans
    rows = [3] * 32
    orders = {tuple(make_plan(rows, OrderOptions(order="windowed", seed=s, batch_size=4), epoch=0).unit_order.tolist())
              for s in (1, 2**32, 2**32 + 1)}
    assert len(orders) == 3


def test_permutation_method_is_stable_argsort_of_raw_output():
    for seed, epoch, n in itertools.product((0, 42, 2**64 - 1), (0, 5), (1, 2, 10, 1000)):
        np.testing.assert_array_equal(unit_permutation(seed, epoch, n),
                                      ref_permutation([TAG_UNITS, seed & 0xFFFFFFFF, seed >> 32, epoch], n))
        np.testing.assert_array_equal(block_permutation(seed, epoch, 1, 2, n),
                                      ref_permutation([TAG_BLOCK, seed & 0xFFFFFFFF, seed >> 32, epoch, 1, 2], n))
    assert unit_permutation(1, 0, 0).tolist() == []


def test_golden_permutations():
    """Pinned outputs: a change here means every user's order changed (bump PLAN_FORMAT_VERSION)."""
    assert _raw([TAG_UNITS, 42, 0, 0], 3) == [11443971247779196771, 14904659617876633002, 7886357882303712632]
    assert unit_permutation(42, 0, 10).tolist() == GOLDEN_UNITS_42_0_10
    assert block_permutation(42, 0, 0, 0, 10).tolist() == GOLDEN_BLOCK_42_0_0_0_10
    plan = make_plan([1] * 10, OrderOptions(order="windowed", seed=42, batch_size=3, shuffle_window=10), epoch=0)
    assert plan.unit_order.tolist() == GOLDEN_UNITS_42_0_10
    assert plan.unit_order.dtype == np.int64
    assert plan.fingerprint == make_plan([1] * 10, OrderOptions(order="windowed", seed=42, batch_size=3, shuffle_window=10),
                                         epoch=3).fingerprint


# -- option validation -----------------------------------------------------------

@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"batch_size": 0}, r"batch_size must be an int >= 1, got 0"),
        ({"batch_size": -5}, r"batch_size must be an int >= 1, got -5"),
        ({"batch_size": 2.0}, r"batch_size must be an int >= 1, got float"),
        ({"batch_size": "8"}, r"batch_size must be an int >= 1, got str"),
        ({"batch_size": True}, r"batch_size must be an int >= 1, got bool"),
        ({"seed": -1}, r"seed must be an int in \[0, 2\*\*64\), got -1"),
        ({"seed": 2**64}, r"seed must be an int in \[0, 2\*\*64\), got 18446744073709551616"),
        ({"seed": 1.5}, r"seed must be an int in \[0, 2\*\*64\), got float"),
        ({"seed": "1"}, r"seed must be an int in \[0, 2\*\*64\), got str"),
        ({"seed": None}, r"seed must be an int in \[0, 2\*\*64\), got NoneType"),
        ({"seed": False}, r"seed must be an int in \[0, 2\*\*64\), got bool"),
        ({"order": "windowed", "shuffle_window": 0}, r"shuffle_window must be an int >= 1, got 0"),
        ({"order": "windowed", "shuffle_window": -2}, r"shuffle_window must be an int >= 1"),
        ({"partitions": 0}, r"partitions must be an int >= 1"),
        ({"world_size": 0}, r"world_size must be an int >= 1"),
        ({"shuffle": 1}, r"shuffle must be True or False, got 1"),
        ({"drop_last": "yes"}, r"drop_last must be True or False"),
        ({"partitions": 3, "world_size": 2}, r"partitions=3 must be a multiple of the world size 2"),
        ({"partitions": 2, "world_size": 4}, r"partitions=2 must be a multiple of the world size 4"),
        ({"batch_size": 3, "partitions": 2}, r"global batch .*= 3\) must divide by partitions=2"),
        ({"batch_size": 5, "partitions": 4, "world_size": 2}, r"= 10\) must divide by partitions=4"),
    ],
)
def test_option_errors(kw, match):
    args = {"seed": 0, "batch_size": 4, **kw}
    with pytest.raises(OptionError, match=match):
        OrderOptions(**args)


def test_valid_edge_options():
    assert OrderOptions(order="windowed", seed=2**64 - 1, batch_size=1).seed == 2**64 - 1
    assert OrderOptions(order="windowed", seed=0, batch_size=6, partitions=6, world_size=3).micro_batch == 3
    assert OrderOptions(order="windowed", seed=0, batch_size=4, world_size=2, partitions=2).global_batch_size == 8


@pytest.mark.parametrize(
    ("rows", "kw", "err", "match"),
    [
        ([], {}, EmptyDatasetError, "no rows"),
        ([3, 0, 2], {}, OptionError, "positive row counts"),
        ([3, -1], {}, OptionError, "positive row counts"),
        ([3, 4], {"epoch": -1}, OptionError, r"epoch must be an int in \[0, 2\*\*32\), got"),
        ([3, 4], {"epoch": 2**32}, OptionError, r"epoch must be an int in \[0, 2\*\*32\), got"),
        ([3, 4], {"rank": 1}, OptionError, "rank 1 is not below the world size 1"),
        ([3, 4], {"opts": {"drop_last": True, "batch_size": 8}}, OptionError, "drops every row"),
    ],
)
def test_make_plan_errors(rows, kw, err, match):
    kw = dict(kw)
    opts = OrderOptions(**{"seed": 1, "batch_size": 2, **kw.pop("opts", {})})
    kw.setdefault("epoch", 0)
    with pytest.raises(err, match=match):
        make_plan(rows, opts, **kw)


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 70_000])
def test_two_pass_argsort_equals_numpy_stable_argsort(n):
    """The planner's two-pass sort must give exactly NumPy's stable order, ties included."""
    from detload._streams import _stable_argsort_u64

    keys = np.asarray(np.random.PCG64(np.random.SeedSequence([7, n])).random_raw(n), dtype=np.uint64)
    if n > 3:
        keys[::3] = keys[1]  # many ties
        keys[5::7] &= np.uint64(0xFFFF_0000_0000_0000)  # keys equal in their low digits
        keys[2::11] &= np.uint64(0x0000_FFFF_FFFF_FFFF)  # keys equal in their top digit
    assert np.array_equal(_stable_argsort_u64(keys), np.argsort(keys, kind="stable"))


_COLLIDING = [0, 1, 2**48 - 1, 2**48, 2**63, 2**64 - 1, 0xDEAD_BEEF_0000_0001]


@given(st.lists(st.sampled_from(_COLLIDING), min_size=1, max_size=64), st.integers(4096, 9000),
       st.integers(0, 2**32 - 1))
@settings(max_examples=25)
def test_two_pass_argsort_any_keys(pool, n, seed):
    """Stable order holds for keys drawn from few values that collide in either digit."""
    from detload._streams import _stable_argsort_u64

    rng = np.random.default_rng(seed)
    keys = np.asarray(pool, dtype=np.uint64)[rng.integers(0, len(pool), n)]
    assert np.array_equal(_stable_argsort_u64(keys), np.argsort(keys, kind="stable"))


def test_two_pass_argsort_of_a_strided_view():
    """The top digit is read in place from contiguous keys; a strided view takes the shifted copy."""
    from detload._streams import _stable_argsort_u64

    keys = np.asarray(np.random.PCG64(3).random_raw(20000), dtype=np.uint64)
    keys[::5] = keys[7]
    view = keys[::2]
    assert not view.flags.c_contiguous
    assert np.array_equal(_stable_argsort_u64(view), np.argsort(view, kind="stable"))


def test_packed_order_is_the_stable_order_of_random_keys():
    """Random keys take the one-sort path, and it gives NumPy's stable order."""
    from detload._streams import _packed_order

    for n in (4096, 65_536, 100_003):
        keys = np.asarray(np.random.PCG64(n).random_raw(n), dtype=np.uint64)
        got = _packed_order(keys)
        assert got is not None and got.dtype == np.int64
        assert np.array_equal(got, np.argsort(keys, kind="stable"))


@given(st.integers(4096, 9000), st.integers(0, 2**32 - 1), st.integers(1, 40))
@settings(max_examples=25)
def test_packed_order_declines_keys_that_share_top_bits(n, seed, dups):
    """Distinct keys whose top bits coincide (low bits differ, in either order) are declined,
    and the caller's answer is still the stable order."""
    from detload._streams import _packed_order, _stable_argsort_u64

    rng = np.random.default_rng(seed)
    keys = np.asarray(np.random.PCG64(seed).random_raw(n), dtype=np.uint64)
    b = (n - 1).bit_length()
    for i in rng.choice(n, size=dups, replace=False):
        j = int(rng.integers(0, n))
        if j != i:  # same top bits as keys[j], another low part: distinct, yet tied above
            keys[i] = (keys[j] & ~np.uint64((1 << b) - 1)) | np.uint64(int(rng.integers(0, 1 << b)))
    tops = keys >> np.uint64(b)
    if len(np.unique(tops)) < n:
        assert _packed_order(keys) is None
    assert np.array_equal(_stable_argsort_u64(keys), np.argsort(keys, kind="stable"))
