"""A worker process killed with SIGKILL: the consumer gets a WorkerError naming it within 5 s.

Earlier batches arrive intact, nothing hangs, and after close no worker
process, thread or /dev/shm segment is left.
"""

from __future__ import annotations

import random
import time

import pytest
from faultkit import FULL, check_batch, clean_hashes, first_step_needing, kill, wait_until
from testhooks import hooked

from detload import Loader, WorkerError
from detload._engine.config import DebugHooks
from detload.audit import hash_batch

OPTS = dict(batch_size=100, seed=7, order="windowed", shuffle_window=2)


def _victim(loader: Loader) -> tuple[int, str, int]:
    """(worker, file, row group) of a unit in the middle of the epoch's schedule."""
    sched = loader.plan().schedule
    k = len(sched) // 2
    u = sched[k].sources[0]
    f, g = int(loader._unit_files[u]), int(loader._unit_rgs[u])
    return k % loader.workers, loader.dataset.files[f].path, g


@pytest.mark.parametrize("workers", [1, 3])
def test_sigkill_mid_read_names_worker_and_unit(fault_data, leaks, workers):
    data = fault_data()
    clean = clean_hashes(data.root, **OPTS)
    probe = Loader(data.root, workers=workers, **OPTS)
    w, rel, rg = _victim(probe)
    # The victim's read of that unit blocks, so the kill lands while it is on it.
    hooks = DebugHooks(stall_unit=(rel, rg), stall_seconds=60)
    with hooked(Loader, data.root, workers=workers, pool="process", debug=hooks, **OPTS) as loader:
        first = first_step_needing(loader, rel, rg)
        got: list[str] = []
        it = iter(loader)
        pids = leaks.track(loader)
        for _ in range(first):
            batch = next(it)
            check_batch(batch)
            got.append(hash_batch(batch)[0])
        st = loader._pool.statuses[w]
        files = [f.path for f in loader.dataset.files]
        wait_until(lambda: st.get()[2] >= 0 and (files[st.get()[2]], st.get()[3]) == (rel, rg), 30)
        kill(pids[w])
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as ei:
            next(it)
        waited = time.monotonic() - t0
    assert waited < 5.0, f"the consumer waited {waited:.2f} s for the death to be reported"
    err = ei.value
    assert err.worker == w and err.unit == (rel, rg)
    msg = str(err)
    assert f"worker process {w} (pid {pids[w]}) was killed by signal 9" in msg
    assert f"{rel} row group {rg}" in msg
    assert got == clean[:first]
    leaks.clean_within(2.0)


@pytest.mark.parametrize("workers", [1, 2])
def test_worker_dying_on_a_unit(fault_data, leaks, workers):
    """The die hook kills the worker inside its read: same report, the prefix intact."""
    data = fault_data(files=3)
    clean = clean_hashes(data.root, **OPTS)
    rel, rg = data.units[5][0], data.units[5][1]
    with hooked(Loader, data.root, workers=workers, pool="process", debug=DebugHooks(die_unit=(rel, rg)), **OPTS) as loader:
        first = first_step_needing(loader, rel, rg)
        got: list[str] = []
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match=rf"was killed by signal 9 .*reading {rel} row group {rg}") as ei:
            for batch in loader:
                leaks.track(loader)
                check_batch(batch)
                got.append(hash_batch(batch)[0])
                t0 = time.monotonic()
        assert time.monotonic() - t0 < 5.0
    assert ei.value.unit == (rel, rg)
    # Blocks it had built but not yet flushed into its queue die with it, so the
    # error may come before the first batch that needs (rel, rg), never after.
    assert len(got) <= first
    assert got == clean[: len(got)]
    leaks.clean_within(2.0)


def test_dead_worker_is_reported_again_not_hung(fault_data, leaks):
    """Iterating again after a worker died raises again at once instead of waiting on it."""
    data = fault_data(files=2)
    rel, rg = data.units[0][0], data.units[0][1]
    with hooked(Loader, data.root, workers=2, pool="process", debug=DebugHooks(die_unit=(rel, rg)), **OPTS) as loader:
        for _ in range(2):
            t0 = time.monotonic()
            with pytest.raises(WorkerError, match="killed by signal 9|exited"):
                for _batch in loader:
                    leaks.track(loader)
            assert time.monotonic() - t0 < 5.0
    leaks.clean_within(2.0)


@pytest.mark.parametrize("workers", [2, 4])
def test_sigkill_at_random_moments(fault_data, leaks, workers):
    """Kill a random worker after a random number of batches: either the epoch completes
    (the worker had already handed over all its blocks) or a WorkerError comes within 5 s;
    every batch delivered before it equals the clean run's."""
    data = fault_data(files=4, row_groups=4, rows=200)
    clean = clean_hashes(data.root, **OPTS)
    rng = random.Random(1234 + workers)
    rounds = 12 if FULL else 2
    # Per-unit delays keep workers busy, so a kill usually lands mid-work.
    hooks = DebugHooks(delay_max=0.03, delay_seed=workers)
    for _ in range(rounds):
        at = rng.randrange(0, len(clean))
        got: list[str] = []
        killed_at = None
        with hooked(Loader, data.root, workers=workers, pool="process", debug=hooks, **OPTS) as loader:
            try:
                for i, batch in enumerate(loader):
                    if i == 0:
                        pids = leaks.track(loader)
                    check_batch(batch)
                    got.append(hash_batch(batch)[0])
                    if i == at:
                        time.sleep(rng.random() * 0.05)
                        kill(rng.choice(pids))
                        killed_at = time.monotonic()
            except WorkerError as exc:
                assert killed_at is not None
                assert time.monotonic() - killed_at < 5.0
                assert exc.worker is not None and "was killed by signal 9" in str(exc)
            else:
                assert got == clean
            assert got == clean[: len(got)]
        leaks.clean_within(2.0)
