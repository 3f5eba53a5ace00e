"""Stopping early: break, an exception or Ctrl-C in the consumer, a loader dropped without close().

In each case the workers stop within 2 s and nothing leaks: no worker process,
no detload thread, no /dev/shm segment. A loader that was only interrupted
(break) still yields complete, identical epochs afterwards. A training process stopped by a
signal (Ctrl-C, SIGTERM), its script or `detload run`, is the contract in tests/test_lifecycle.py.
"""

from __future__ import annotations

import gc
import signal
import time

import pytest
from faultkit import check_batch, clean_hashes, shm_segments, wait_until

from detload import Loader
from detload.audit import hash_batch

OPTS = dict(batch_size=100, seed=5, order="windowed", shuffle_window=2)


class Boom(Exception):
    pass


def _idle(loader: Loader) -> bool:
    """No worker is on a row group any more."""
    return all(st.get()[2] == -1 for st in loader._pool.statuses)


@pytest.mark.parametrize("workers", [1, 3])
def test_break_stops_workers_and_next_epoch_is_complete(fault_data, leaks, pool, workers):
    data = fault_data()
    clean = clean_hashes(data.root, **OPTS)
    with Loader(data.root, workers=workers, pool=pool, **OPTS) as loader:
        for i, batch in enumerate(loader):
            leaks.track(loader)
            check_batch(batch)
            if i == 3:
                break
        del batch
        t0 = time.monotonic()
        wait_until(lambda: _idle(loader), 2.0)
        assert time.monotonic() - t0 < 2.0
        # A block a worker queued just as the run was cancelled can reach the
        # queue after it was emptied; it waits there (at most prefetch per
        # worker) until the next pass or close() frees it.
        assert len(shm_segments()) <= workers * 2
        # Nothing lost, nothing repeated: the next pass is the whole epoch.
        assert [hash_batch(b)[0] for b in loader] == clean
        # Workers then build the first blocks of the pass expected next (this epoch
        # again), some in segments still named in /dev/shm. A pass nothing predicts
        # (a jump of epochs) frees them and leaves nothing behind.
        loader.set_epoch(7)
        for _ in loader:
            pass
        wait_until(lambda: not shm_segments(), 2.0)
    assert leaks.clean_within(2.0) < 2.0


@pytest.mark.parametrize("workers", [1, 3])
def test_consumer_raising_stops_everything(fault_data, leaks, pool, workers):
    data = fault_data()
    with pytest.raises(Boom), Loader(data.root, workers=workers, pool=pool, **OPTS) as loader:
        for i, _batch in enumerate(loader):
            leaks.track(loader)
            if i == 2:
                t0 = time.monotonic()
                raise Boom
    assert leaks.clean_within(2.0) < 2.0
    assert time.monotonic() - t0 < 2.0 + 2.0  # close() itself returned promptly too


@pytest.mark.parametrize("workers", [1, 3])
def test_sigint_in_consumer(fault_data, leaks, pool, workers):
    data = fault_data()
    with pytest.raises(KeyboardInterrupt), Loader(data.root, workers=workers, pool=pool, **OPTS) as loader:
        for i, _batch in enumerate(loader):
            leaks.track(loader)
            if i == 2:
                t0 = time.monotonic()
                signal.raise_signal(signal.SIGINT)
    assert time.monotonic() - t0 < 2.0
    leaks.clean_within(2.0)


@pytest.mark.parametrize("workers", [1, 3])
def test_loader_garbage_collected_without_close(fault_data, leaks, pool, workers):
    data = fault_data()
    loader = Loader(data.root, workers=workers, pool=pool, **OPTS)
    it = iter(loader)
    next(it)
    next(it)
    leaks.track(loader)
    t0 = time.monotonic()
    del it, loader
    gc.collect()
    assert leaks.clean_within(2.0) + (time.monotonic() - t0) < 2.0 + 2.0
