"""Loader.watch_block_memory: the seam a pinned GPU hand-off registers block buffers through.

Every buffer is announced before a batch viewing it is yielded, announced once, and
withdrawn once by close(); batches lie in announced buffers; a bad listener is refused
or dropped with a warning, never breaking the run.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from detload import Loader, OptionError, Pool

OPTS = dict(batch_size=50, seed=3, order="windowed", shuffle_window=2)


class Recorder:
    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.added: collections.Counter[int] = collections.Counter()
        self.removed: collections.Counter[int] = collections.Counter()

    def add(self, address: int, nbytes: int) -> None:
        assert address not in self.live, "a buffer announced twice while live"
        assert nbytes > 0
        self.live[address] = nbytes
        self.added[address] += 1

    def remove(self, address: int, nbytes: int) -> None:
        assert self.live.pop(address) == nbytes, "withdrawn with another size, or never announced"
        self.removed[address] += 1

    def holds(self, arr: np.ndarray) -> bool:
        p = arr.ctypes.data
        return any(a <= p and p + arr.nbytes <= a + n for a, n in self.live.items())


def test_batches_lie_in_announced_buffers_and_close_withdraws_each_once(make_dataset, pool):
    ds = make_dataset({"a.parquet": [200, 200, 200], "b.parquet": [200, 200, 200]})
    rec = Recorder()
    with Loader(ds.root, workers=2, pool=Pool(kind=pool), **OPTS) as loader:
        loader.watch_block_memory(rec.add, rec.remove)
        inside = total = 0
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                total += 1
                inside += rec.holds(batch["f32"])
        assert rec.live, "no buffer was announced"
        # A batch cut across two blocks is stitched into fresh memory; the rest are views.
        assert inside >= total // 2
    assert rec.live == {}
    assert set(rec.added) == set(rec.removed)
    assert all(rec.removed[a] == n for a, n in rec.added.items())


def test_a_listener_added_late_hears_of_the_buffers_that_exist(make_dataset, pool):
    ds = make_dataset({"a.parquet": [200, 200]})
    early, late = Recorder(), Recorder()
    with Loader(ds.root, workers=1, pool=Pool(kind=pool), **OPTS) as loader:
        loader.watch_block_memory(early.add, early.remove)
        it = iter(loader)
        next(it)
        loader.watch_block_memory(late.add, late.remove)
        assert set(late.live) == set(early.live) and late.live
        for _ in it:
            pass
    assert late.live == {} and early.live == {}


def test_listeners_that_are_not_callable_are_refused(small_dataset):
    with Loader(small_dataset.root, **OPTS) as loader, pytest.raises(
            OptionError, match=r"watch_block_memory takes two callables: added\(address, nbytes\) and "
                               r"removed\(address, nbytes\)"):
        loader.watch_block_memory(print, None)  # type: ignore[arg-type]


def test_a_listener_that_raises_is_dropped_with_a_warning_and_the_batches_are_unchanged(small_dataset):
    with Loader(small_dataset.root, **OPTS) as clean:
        want = [b["f32"].copy() for b in clean]

    def boom(address: int, nbytes: int) -> None:
        raise RuntimeError("driver said no")

    with Loader(small_dataset.root, **OPTS) as loader:
        loader.watch_block_memory(boom, boom)
        with pytest.warns(RuntimeWarning, match="a block-memory listener raised RuntimeError: driver said no; "
                                                "it is no longer called"):
            got = [b["f32"].copy() for b in loader]
    assert all(np.array_equal(a, b) for a, b in zip(want, got)) and len(want) == len(got)
