"""Reused block buffers: what only heap slabs do (a give-back inside get, a close racing a give-back), and,
through the loader, kept batches that never change while slabs or segments are reused.

The promises heap slabs share with shared-memory segments are tested once in test_block_memory.py."""

from __future__ import annotations

import copy
import gc
import os
import platform

import numpy as np
import pytest
from _perfdata import write_small
from hypothesis import given, settings
from hypothesis import strategies as st

import detload
from detload import Loader, hash_batch
from detload._engine.heap import BlockBuffers


def test_a_block_freed_by_a_collection_inside_get_does_not_hang():
    # A block in a reference cycle dies in whatever garbage collection comes next: that can
    # be one an allocation inside get() starts while it holds the pool's lock, and the
    # block's finalizer used to wait for that same lock.
    import threading

    class CollectingLock:
        """The pool's lock, with a garbage collection right after each acquire."""

        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __enter__(self) -> None:
            self.lock.acquire()
            gc.collect()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    pool = BlockBuffers()
    cycle: list[object] = [pool.get(100)]
    cycle.append(cycle)  # the block dies only in a collection
    del cycle
    pool._lock = CollectingLock()  # type: ignore[assignment]
    got: list[np.ndarray] = []
    t = threading.Thread(target=lambda: got.append(pool.get(100)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "BlockBuffers.get hung in its own lock"
    assert len(got) == 1 and pool.reused == 1  # the dead block's slab came back and served it
    got.clear()


def test_a_slab_given_back_while_the_pool_closes_is_not_kept():
    # A finalizer checks "closed" without the lock; close() can run between that check
    # and its append. The slab must not stay referenced by the closed pool.
    pool = BlockBuffers()
    slab = np.empty(1 << 20, dtype=np.uint8)

    class ClosesOnCheck:
        def __bool__(self) -> bool:  # the first check says open, and closes the pool meanwhile
            pool._closed = True
            return False

    pool._closed = ClosesOnCheck()  # type: ignore[assignment]
    pool._give_back(slab)
    assert not pool._returned


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("buffers") / "d", files=4, rows=2000, row_group=250)


KEEP = st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["batch", "column", "slice", "ragged"])),
                min_size=1, max_size=6)


def _kept_parts_never_change(data, keep, pool: str) -> None:
    """Keep parts of some batches of epoch 0, run more epochs (reusing buffers), compare."""
    wanted = dict(keep)
    kept: list[object] = []
    snapshots: list[object] = []
    with Loader(data, batch_size=96, seed=3, workers=2, pool=detload.Pool(kind=pool, prefetch=1), order="windowed", shuffle_window=2) as ld:
        for epoch in range(3):
            ld.set_epoch(epoch)
            for i, b in enumerate(ld):
                what = wanted.get(i) if epoch == 0 else None
                if what == "batch":
                    part: object = b
                elif what == "column":
                    part = b["x"]
                elif what == "slice":
                    part = b["id"][5:40:3]
                elif what == "ragged":
                    part = b["s"]
                else:
                    continue
                kept.append(part)
                snapshots.append(copy.deepcopy(part))
        # Buffers really were handed out again meanwhile.
        assert (ld._pool.buffers.reused if pool == "thread" else ld._pool.segments.reused) > 0
    gc.collect()
    for part, snap in zip(kept, snapshots):
        if isinstance(part, dict):
            assert hash_batch(part)[0] == hash_batch(snap)[0]  # type: ignore[arg-type]
        elif isinstance(part, np.ndarray):
            assert np.array_equal(part, snap)  # type: ignore[arg-type]
        else:
            assert np.array_equal(part.values, snap.values) and np.array_equal(part.offsets, snap.offsets)


@settings(max_examples=15, deadline=None)
@given(keep=KEEP)
def test_kept_batches_never_change_while_slabs_are_reused(data, keep):
    """Whatever part of a batch a user keeps stays as it was while later blocks reuse slabs."""
    _kept_parts_never_change(data, keep, "thread")


@settings(max_examples=4, deadline=None)
@given(keep=KEEP)
def test_kept_batches_never_change_while_segments_are_reused(data, keep):
    """The same with process workers, whose shared-memory segments are reused."""
    _kept_parts_never_change(data, keep, "process")


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


@pytest.mark.skipif(not os.path.exists("/proc/self/stat") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's allocator, page-fault counts from /proc")
def test_workers_reuse_the_memory_of_block_temporaries(tmp_path, pool):
    # Building a block of string and list columns allocates several MB of NumPy temporaries.
    # glibc gave them back to the kernel after each block, and every block faulted in
    # zeroed pages again (about 2,000 per 65,536-row block): a third of a warm block's CPU.
    # Workers now reuse their working arrays (and worker processes keep freed heap memory).
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    (tmp_path / "d").mkdir()
    for part in range(2):
        rows = 3 * 16384 + 10_000  # blocks of varying sizes, as with real files
        lengths = rng.integers(0, 21, rows)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = pa.array(rng.random(int(offsets[-1]), dtype=np.float32))
        cols = {"id": np.arange(rows), "label": rng.integers(0, 2, rows, dtype=np.int8)}
        cols |= {f"dense_{j}": rng.random(rows, dtype=np.float32) for j in range(8)}
        cols["query"] = pa.array(["q" * int(n) for n in rng.integers(5, 41, rows)])
        cols["hist"] = pa.ListArray.from_arrays(pa.array(offsets), values)
        pq.write_table(pa.table(cols), tmp_path / "d" / f"part{part}.parquet", row_group_size=16384)
    with Loader(str(tmp_path / "d"), batch_size=4096, seed=0, workers=1, pool=detload.Pool(kind=pool, prefetch=1),
                cache=str(tmp_path / "c")) as ld:
        for epoch in range(2):  # fills the cache, then a warm epoch
            ld.set_epoch(epoch)
            for _ in ld:
                pass
        pid = ld._pool.handles[0].pid if pool == "process" else os.getpid()
        before = _minor_faults(pid)
        for epoch in range(2, 6):
            ld.set_epoch(epoch)
            for _ in ld:
                pass
        per_block = (_minor_faults(pid) - before) / 8  # 8 row groups, 4 to a block, 4 epochs
    assert per_block < 500, f"{per_block:.0f} page faults per warm block in the worker's process"


def test_workspace_arrays_are_reused_per_thread_and_key():
    import threading

    from detload._engine.block import _workspace

    a = _workspace("t:a", 1000, np.int64)
    a[:] = 7
    b = _workspace("t:a", 10, np.float32)  # smaller: the same memory, another dtype
    assert b.__array_interface__["data"][0] == a.__array_interface__["data"][0] and b.shape == (10,)
    c = _workspace("t:b", 1000, np.int64)
    assert not np.shares_memory(a, c)
    d = _workspace("t:a", 2000, np.int64)  # larger: a new array, kept from now on
    assert d.shape == (2000,) and _workspace("t:a", 1500, np.int64).__array_interface__["data"][0] == \
        d.__array_interface__["data"][0]
    other = []
    t = threading.Thread(target=lambda: other.append(_workspace("t:a", 1000, np.int64)))
    t.start()
    t.join()
    assert not np.shares_memory(other[0], d)
