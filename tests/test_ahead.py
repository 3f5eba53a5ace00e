"""Blocks built ahead: workers start the pass expected next while the current one ends.

Building a block early must change nothing: whatever sequence of passes a user
runs (next epoch, same epoch again, a jump, a break, a resume), every pass
yields exactly the batches a fresh loader yields for it. And the blocks built
for a pass that does not come are freed, not delivered.
"""

from __future__ import annotations

import pytest
from _perfdata import write_small
from hypothesis import given, settings
from hypothesis import strategies as st
from leaks import shm_segments, wait_until
from testhooks import hooked

import detload
from detload import Loader, hash_batch
from detload._engine.config import DebugHooks

OPTS = dict(batch_size=96, seed=3, order="windowed", shuffle_window=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("ahead") / "d", files=4, rows=1500, row_group=250)


@pytest.fixture(scope="module")
def reference(data):
    """Batch hashes of each epoch from a fresh loader (its first pass has nothing built ahead)."""
    out = {}
    for epoch in range(4):
        with Loader(data, workers=1, **OPTS) as ld:
            ld.set_epoch(epoch)
            out[epoch] = [hash_batch(b)[0] for b in ld]
    return out


# A pass: (epoch, how it starts, where it stops). Starting at "resume" continues from a
# state_dict taken after `start` batches of that epoch; stopping at None runs to the end.
# Stops cover the whole epoch (63 batches): a break after the merger took the last
# block keeps what was built ahead, an earlier one cancels it.
PASS = st.tuples(st.integers(0, 3), st.sampled_from(["fresh", "resume"]), st.integers(0, 20),
                 st.one_of(st.none(), st.integers(0, 70)))


def _run_passes(ld: Loader, passes, reference) -> None:
    for epoch, how, start, stop in passes:
        n = len(reference[epoch])
        start = min(start, n) if how == "resume" else 0
        ld.set_epoch(epoch)
        if start:
            ld.load_state_dict({**ld.state_dict(), "epoch": epoch, "step": start})
        got = []
        for i, b in enumerate(ld):
            got.append(hash_batch(b)[0])
            if stop is not None and i + 1 >= stop:
                break
        want = reference[epoch][start:]
        assert got == want[: len(got)], (epoch, how, start, stop)
        if stop is None or stop >= len(want):
            assert len(got) == len(want)


@settings(max_examples=25, deadline=None)
@given(passes=st.lists(PASS, min_size=1, max_size=7), workers=st.integers(1, 3),
       prefetch=st.integers(1, 3))
def test_any_sequence_of_passes_yields_what_a_fresh_loader_yields(data, reference, passes, workers, prefetch):
    with Loader(data, workers=workers, pool=detload.Pool(kind="thread", prefetch=prefetch), **OPTS) as ld:
        _run_passes(ld, passes, reference)


@settings(max_examples=4, deadline=None)
@given(passes=st.lists(PASS, min_size=2, max_size=5))
def test_any_sequence_of_passes_process_pool(data, reference, passes):
    with Loader(data, workers=2, pool="process", **OPTS) as ld:
        _run_passes(ld, passes, reference)
    assert not shm_segments()


def test_the_set_epoch_loop_uses_blocks_built_ahead(data, reference, pool):
    with Loader(data, workers=2, pool=pool, **OPTS) as ld:
        for epoch in range(4):
            ld.set_epoch(epoch)
            assert [hash_batch(b)[0] for b in ld] == reference[epoch]
        # Epoch 1 follows epoch 0, so epoch 2 is built ahead, and then epoch 3.
        assert ld.ahead_used == 2


def test_repeating_an_epoch_uses_blocks_built_ahead(data, reference):
    with Loader(data, workers=2, **OPTS) as ld:
        for _ in range(3):
            assert [hash_batch(b)[0] for b in ld] == reference[0]
        assert ld.ahead_used == 1


def test_blocks_built_for_a_pass_that_does_not_come_are_freed(data, reference, pool):
    with Loader(data, workers=2, pool=pool, **OPTS) as ld:
        for epoch in (0, 1):  # epoch 2 is now being built ahead
            ld.set_epoch(epoch)
            for _ in ld:
                pass
        ld.set_epoch(3)  # not the epoch after 1: nothing is built ahead after this pass either
        assert [hash_batch(b)[0] for b in ld] == reference[3]
        assert ld.ahead_used == 0
        # Epoch 2's blocks were freed as this pass met them (their names unlinked).
        wait_until(lambda: not shm_segments(), 2.0)
    assert not shm_segments()


def test_a_break_in_the_last_batches_keeps_what_was_built_ahead(data, reference):
    with Loader(data, workers=2, **OPTS) as ld:
        for epoch in (0, 1):
            ld.set_epoch(epoch)
            for _ in ld:
                pass
        ld.set_epoch(2)
        n = len(reference[2])
        got = []
        for i, b in enumerate(ld):
            got.append(hash_batch(b)[0])
            if i == n - 2:  # every block was taken by now
                break
        assert got == reference[2][: n - 1]
        ld.set_epoch(3)
        assert [hash_batch(b)[0] for b in ld] == reference[3]
        assert ld.ahead_used == 2  # epochs 2 and 3


def test_an_early_break_cancels_what_was_built_ahead(data, reference):
    with Loader(data, workers=2, **OPTS) as ld:
        for epoch in (0, 1, 2):
            ld.set_epoch(epoch)
            for i, _ in enumerate(ld):
                if epoch == 2 and i == 3:
                    break
        ld.set_epoch(3)
        assert [hash_batch(b)[0] for b in ld] == reference[3]
        assert ld.ahead_used == 1  # epoch 2 only


def test_nothing_is_built_ahead_for_the_unordered_benchmark_switch(data):
    with hooked(Loader, data, workers=2, unordered=True, **OPTS) as ld:
        for epoch in range(3):
            ld.set_epoch(epoch)
            assert sum(len(b["id"]) for b in ld) == 6000
        assert ld.ahead_used == 0


def test_a_block_built_ahead_that_reaches_a_stopping_merger_does_no_harm(data, reference, pool):
    """The merger of a pass stopped mid-way may be waiting on a worker's queue when that worker,
    having dropped the rest of the pass, queues a block built ahead. That block must not be
    counted on by the next pass (once it was swallowed there, and the next pass failed with
    'worker 0 sent block 1, expected 0'). Slow blocks make the merger wait there."""
    rounds = 8 if pool == "thread" else 3  # a process pool costs more to start
    for seed in range(rounds):
        with hooked(Loader, data, workers=1, pool=detload.Pool(kind=pool, prefetch=1),
                    debug=DebugHooks(block_delay_max=0.02, delay_seed=seed), **OPTS) as ld:
            ld.set_epoch(2)
            for stop in (None, 1, None, 3, None):  # a pass, then the same epoch again (built ahead)
                got = []
                for i, b in enumerate(ld):
                    got.append(hash_batch(b)[0])
                    if stop is not None and i + 1 >= stop:
                        break
                assert got == (reference[2] if stop is None else reference[2][:stop])
