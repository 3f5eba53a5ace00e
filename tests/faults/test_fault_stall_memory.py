"""Stalled workers and slow consumers: a stall is reported (naming worker and unit), memory stays bounded.

The bound (docs/reliability.md): live blocks <= W*(prefetch+1) + P_owned*(ceil(B/b_min)+1)
+ 6, where W is the worker count, B the micro-batch rows, b_min the smallest block's
rows and 6 the blocks that batches handed to the consumer thread can pin (three items
of consecutive batches, each within two blocks).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultkit import check_batch, clean_hashes, first_step_needing, shm_segments, wait_until
from testhooks import hooked

import detload
from detload import Loader, WorkerStalledError
from detload._engine.config import DebugHooks
from detload.audit import hash_batch

OPTS = dict(batch_size=100, seed=9, order="windowed", shuffle_window=2)
HANDED_OVER = 6  # blocks pinned by batches the merger handed over (docs/reliability.md)
SLACK = 48 * 2**20  # RSS noise: allocator pools, thread stacks, page tables


def test_default_stall_timeout_is_on():
    from detload import Pool

    assert Pool().stall_timeout == 300.0
    assert Loader.__init__.__kwdefaults__["pool"] is None  # None: Pool()


@pytest.mark.parametrize("pool,workers", [("thread", 2), ("process", 1), ("process", 3)])
def test_stalled_worker_reported(fault_data, leaks, pool, workers):
    data = fault_data(files=3)
    clean = clean_hashes(data.root, **OPTS)
    rel, rg = data.units[7][0], data.units[7][1]
    # A thread cannot be interrupted: keep its stall short so it ends soon after the test.
    hooks = DebugHooks(stall_unit=(rel, rg), stall_seconds=3.0 if pool == "thread" else 600.0)
    got: list[str] = []
    with hooked(Loader, data.root, workers=workers, pool=detload.Pool(kind=pool, stall_timeout=1.0), debug=hooks, **OPTS) as loader:
        first = first_step_needing(loader, rel, rg)
        t0 = time.monotonic()
        with pytest.raises(WorkerStalledError) as ei:
            for batch in loader:
                leaks.track(loader)
                check_batch(batch)
                got.append(hash_batch(batch)[0])
                t0 = time.monotonic()
        waited = time.monotonic() - t0
    err = ei.value
    assert isinstance(err, TimeoutError)
    assert err.unit == (rel, rg)
    assert f"worker {err.worker} made no progress for 1 s" in str(err)
    assert f"reading {rel} row group {rg}" in str(err) and "stall_timeout" in str(err)
    # Reported after the timeout, not much later (the worker may have reached the
    # unit before the consumer asked for it, so it can also come sooner).
    assert waited < 1.0 + 3.0, waited
    assert got == clean[:first]
    leaks.clean_within(3.0)


def test_stall_in_a_block_built_ahead_for_another_pass_says_so(fault_data, leaks):
    """The set_epoch loop makes the worker build epoch 2's first block ahead; the user
    jumps to epoch 5 instead, and the worker is stuck in that unused block."""
    data = fault_data(files=2)
    with Loader(data.root, workers=1, pool="process", **OPTS) as probe:
        files = [f.path for f in probe.dataset.files]
        j = probe.plan(2).schedule[0].sources[0]
        rel, rg = files[probe._unit_files[j]], int(probe._unit_rgs[j])
    hooks = DebugHooks(stall_unit=(rel, rg), stall_epoch=2, stall_seconds=600.0)
    with hooked(Loader, data.root, workers=1, pool=detload.Pool(kind="process", stall_timeout=1.0), debug=hooks, **OPTS) as loader:
        leaks.track(loader)
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            assert sum(1 for _ in loader) == len(loader)
        # Wait until the worker is inside that read: a newer pass submitted before it
        # picked the block up would make the block stale, and it would never start.
        status = loader._pool.statuses[0]
        wait_until(lambda: tuple(status.get()[2:]) == (files.index(rel), rg), 30.0)
        loader.set_epoch(5)
        with pytest.raises(WorkerStalledError) as ei:
            next(iter(loader))
    msg = str(ei.value)
    assert f"reading {rel} row group {rg}, for a block of another pass that it must finish first" in msg
    assert ei.value.unit == (rel, rg)
    leaks.clean_within(3.0)


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_slow_but_progressing_worker_is_not_reported(fault_data, leaks, timeout):
    """A 1.5 s hiccup is waited out with stall_timeout=None or a larger timeout."""
    data = fault_data(files=2)
    clean = clean_hashes(data.root, **OPTS)
    rel, rg = data.units[3][0], data.units[3][1]
    hooks = DebugHooks(stall_unit=(rel, rg), stall_seconds=1.5)
    with hooked(Loader, data.root, workers=2, pool=detload.Pool(kind="process", stall_timeout=timeout), debug=hooks, **OPTS) as loader:
        leaks.track(loader)
        assert [hash_batch(b)[0] for b in loader] == clean


# -- memory --------------------------------------------------------------------

def _write_wide(root: str, units: int, rows: int) -> int:
    """``units`` single-row-group files of ``rows`` rows, 80 bytes a row; returns bytes per unit."""
    os.makedirs(root, exist_ok=True)
    for u in range(units):
        ids = np.arange(u * rows, (u + 1) * rows, dtype=np.int64)
        emb = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 16).astype(np.float32)), 16)
        t = pa.table({"id": ids, "x": ids * 0.5, "emb": emb})
        pq.write_table(t, os.path.join(root, f"u{u:03d}.parquet"), compression="none")
    return rows * 80


def _live_segments(loader: Loader) -> int:
    """This loader's blocks alive now: mapped in this process or waiting in /dev/shm, each
    counted once (the consumer maps a segment before it unlinks it: in between it is in
    both). Only its pool's names: segments an earlier test is still releasing do not count."""
    prefix = loader._pool.shm_prefix
    with open("/proc/self/maps") as f:
        mapped = {os.path.basename(line.split(None, 5)[5].strip().removesuffix(" (deleted)"))
                  for line in f if f"/{prefix}" in line}
    return len(mapped | {n for n in shm_segments() if n.startswith(prefix)})


def _rss(loader: Loader) -> int:
    total = psutil.Process().memory_info().rss
    for pid in loader._pool.pids():
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
@pytest.mark.parametrize("workers,prefetch", [(2, 1), (3, 2)])
def test_slow_consumer_memory_bound(tmp_path, leaks, workers, prefetch):
    units, rows, batch = 64, 20_000, 2_500
    unit_bytes = _write_wide(str(tmp_path / "wide"), units, rows)
    bound_blocks = workers * (prefetch + 1) + 1 * (math.ceil(batch / rows) + 1) + HANDED_OVER
    # A loader that held on to blocks would break both bounds: the exact count of live
    # segments, and (coarser: RSS counts allocator pools and shared pages) the RSS one.
    assert bound_blocks * unit_bytes + SLACK < units * unit_bytes
    opts = dict(batch_size=batch, seed=1, order="windowed", shuffle_window=1, workers=workers,
                pool=detload.Pool(kind="process", prefetch=prefetch))
    with Loader(str(tmp_path / "wide"), **opts) as loader:
        for _ in loader:  # warm-up epoch: allocator pools, imports, page cache
            leaks.track(loader)
        base = _rss(loader)
        loader.set_epoch(1)
        peak_blocks = peak_rss = 0
        for i, b in enumerate(loader):
            assert b["id"].shape == (batch,)
            del b
            time.sleep(0.01)  # slower than the workers: every queue fills up
            if i % 2 == 0:
                peak_blocks = max(peak_blocks, _live_segments(loader))
                peak_rss = max(peak_rss, _rss(loader))
    print(f"W={workers} prefetch={prefetch}: peak live blocks {peak_blocks} (bound {bound_blocks}), "
          f"RSS growth {(peak_rss - base) / 2**20:.1f} MiB (bound {bound_blocks * unit_bytes / 2**20:.1f} MiB + 48)")
    assert 0 < peak_blocks <= bound_blocks
    assert peak_rss - base <= bound_blocks * unit_bytes + SLACK
    leaks.clean_within(2.0)


def test_slow_consumer_thread_pool_rss_bound(tmp_path, leaks):
    units, rows, batch, workers, prefetch = 64, 20_000, 2_500, 2, 1
    unit_bytes = _write_wide(str(tmp_path / "wide"), units, rows)
    bound_blocks = workers * (prefetch + 1) + 2 + HANDED_OVER
    with Loader(str(tmp_path / "wide"), batch_size=batch, seed=1, order="windowed", shuffle_window=1, workers=workers,
                pool=detload.Pool(kind="thread", prefetch=prefetch)) as loader:
        for _ in loader:
            pass
        base = psutil.Process().memory_info().rss
        loader.set_epoch(1)
        peak = 0
        for i, b in enumerate(loader):
            del b
            time.sleep(0.01)
            if i % 2 == 0:
                peak = max(peak, psutil.Process().memory_info().rss)
    print(f"thread pool: RSS growth {(peak - base) / 2**20:.1f} MiB (bound {bound_blocks * unit_bytes / 2**20:.1f} MiB + 48)")
    assert peak - base <= bound_blocks * unit_bytes + SLACK
