"""Lifetime: nothing a loader starts outlives it.

After a normal end, a `with` block, a break, an exception in the consumer, a
worker-side error, or the loader simply being garbage-collected, no worker
process, no detload thread and no /dev/shm segment of this process remains.
Stopping an iteration (a newer one, close() from another thread) never leaves
a consumer blocked, and never disturbs the newer iteration.
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
from leaks import LeakCheck, detload_threads, shm_segments, stray_children
from strategies import check_rows
from testhooks import hooked

from detload import DataError, DetloadError, Loader, Pool, WorkerError
from detload._engine.config import DebugHooks


def _loader(root, pool="process", prefetch=2, stall_timeout=300.0, **kw) -> Loader:
    return Loader(root, **{"batch_size": 64, "seed": 3, "workers": 3,
                           "pool": Pool(kind=pool, prefetch=prefetch, stall_timeout=stall_timeout), **kw})


def _running(loader, leak_check) -> None:
    """The check is not vacuous: while a loader runs, its workers are visible."""
    pids = leak_check.track(loader)
    if loader.pool_kind == "process":
        assert len(pids) == loader.workers
        assert leak_check.problems(), "workers run, so the leak check must see them"
    else:
        assert pids == []
        assert sum(t.startswith("detload-worker-") for t in detload_threads(leak_check.before)) == loader.workers


def test_normal_end_then_close(small_dataset, leak_check, pool):
    loader = _loader(small_dataset.root, pool)
    n = 0
    for _ in loader:
        if n == 0:
            _running(loader, leak_check)
        n += 1
    assert n == len(loader) == 19
    loader.close()
    leak_check.assert_clean()
    loader.close()  # idempotent


def test_with_block(small_dataset, leak_check, pool):
    with _loader(small_dataset.root, pool) as loader:
        for _ in loader:
            _running(loader, leak_check)
        for _ in loader:  # a second epoch pass reuses the pool
            pass
    leak_check.assert_clean()


@pytest.mark.parametrize("stop", [0, 3])
def test_break_mid_epoch_then_close(small_dataset, leak_check, pool, stop):
    loader = _loader(small_dataset.root, pool, prefetch=3, batch_size=16)
    for i, _ in enumerate(loader):
        _running(loader, leak_check)
        if i == stop:
            break
    loader.close()
    leak_check.assert_clean()


def test_exception_in_consumer_inside_with(small_dataset, leak_check, pool):
    with pytest.raises(KeyError, match="boom"), _loader(small_dataset.root, pool) as loader:
        for i, _ in enumerate(loader):
            _running(loader, leak_check)
            if i == 2:
                raise KeyError("boom")
    leak_check.assert_clean()


def test_del_without_close_process_pool(small_dataset, leak_check):
    loader = _loader(small_dataset.root)
    for i, _ in enumerate(loader):
        _running(loader, leak_check)
        if i == 1:
            break
    del loader
    gc.collect()
    leak_check.assert_clean()


def test_del_while_an_iterator_is_suspended(small_dataset, leak_check):
    loader = _loader(small_dataset.root)
    it = iter(loader)
    next(it)
    _running(loader, leak_check)
    del loader
    gc.collect()
    del it
    gc.collect()
    leak_check.assert_clean()


def test_del_after_full_epoch_without_close(small_dataset, leak_check):
    loader = _loader(small_dataset.root)
    for _ in loader:
        pass
    _running(loader, leak_check)
    del loader
    gc.collect()
    leak_check.assert_clean()


def test_thread_workers_are_gone_after_close(small_dataset, leak_check):
    before = set(threading.enumerate())
    loader = _loader(small_dataset.root, "thread", workers=4)
    it = iter(loader)
    next(it)
    names = sorted(t.name for t in set(threading.enumerate()) - before)
    assert [n for n in names if n.startswith("detload-worker-")] == [f"detload-worker-{i}" for i in range(4)]
    loader.close()
    assert detload_threads(before) == []
    assert not any(t.is_alive() for t in set(threading.enumerate()) - before)
    del it
    leak_check.assert_clean(grace=0)


def test_workers_persist_across_epochs(small_dataset, leak_check):
    with _loader(small_dataset.root) as loader:
        list(loader)
        first = leak_check.track(loader)
        loader.set_epoch(1)
        list(loader)
        assert leak_check.track(loader) == first
    leak_check.assert_clean()


def test_batches_stay_readable_after_close(small_dataset, leak_check):
    """Shared-memory batches are views; they must outlive the loader that made them."""
    kept = []
    with _loader(small_dataset.root) as loader:
        for b in loader:
            leak_check.track(loader)
            kept.append(b)
    leak_check.assert_clean()
    assert shm_segments() == []
    for b in kept:
        check_rows(b)
    assert sum(len(b["id"]) for b in kept) == small_dataset.total


def test_cleanup_after_a_worker_error(small_dataset, leak_check):
    hooks = DebugHooks(fail_unit=("c.parquet", 2), fail_exc=OSError("disk on fire"))
    with pytest.raises(WorkerError, match=r"c\.parquet row group 2.*disk on fire"), \
            hooked(_loader, small_dataset.root, debug=hooks, shuffle=False) as loader:
        for _ in loader:
            leak_check.track(loader)
    leak_check.assert_clean()


def test_cleanup_after_a_data_error(tmp_path, leak_check):
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.table({"id": np.arange(100), "n": pa.array([None if i == 77 else i for i in range(100)], pa.int64())})
    pq.write_table(t, tmp_path / "x.parquet", row_group_size=10)
    with pytest.raises(DataError, match=r"column 'n' in x\.parquet row group 7"), \
            Loader(str(tmp_path), batch_size=10, seed=0, workers=2, pool="process") as loader:
        for _ in loader:
            leak_check.track(loader)
    leak_check.assert_clean()
    assert stray_children() == []


# -- stopping never leaves a consumer waiting forever ------------------------------------

def _next_in_thread(it, timeout: float = 10.0) -> dict:
    """next(it) in a helper thread; {'hang': True} if it has not returned after ``timeout`` s."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = next(it)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["error"] = exc

    t = threading.Thread(target=run, name="test-consumer", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        out["hang"] = True
    return out


def test_superseded_iterator_does_not_hang(small_dataset, leak_check, pool):
    """iter(loader) twice (e.g. zip(loader, loader)): the older iterator must fail loudly, not block forever."""
    with _loader(small_dataset.root, pool) as loader:
        it1 = iter(loader)
        next(it1)
        it2 = iter(loader)
        next(it2)
        leak_check.track(loader)
        out = _next_in_thread(it1)
        assert not out.get("hang"), "next() on the superseded iterator blocks forever"
        assert isinstance(out.get("error"), DetloadError), out
    leak_check.assert_clean()


def _drain_in_thread(it, timeout: float = 20.0) -> dict:
    out: dict = {"n": 0}

    def run() -> None:
        try:
            for _ in it:
                out["n"] += 1
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["error"] = exc

    t = threading.Thread(target=run, name="test-consumer", daemon=True)
    t.start()
    t.join(timeout)
    out["hang"] = t.is_alive()
    return out


@pytest.mark.parametrize("how", ["next", "del"])
def test_newer_iteration_survives_the_older_iterator_ending(small_dataset, leak_check, pool, how):
    """Closing a superseded iterator (its next() or its garbage collection) must not disturb the new pass.

    E.g. ``it = iter(loader); peek = next(it)`` followed by ``for b in loader:``; ``it`` goes away later.
    """
    with _loader(small_dataset.root, pool, stall_timeout=8) as loader:
        it1 = iter(loader)
        next(it1)
        it2 = iter(loader)
        next(it2)
        leak_check.track(loader)
        time.sleep(0.3)  # let the workers queue blocks of the new pass
        if how == "next":
            with pytest.raises(DetloadError):
                next(it1)
        else:
            del it1
            gc.collect()
        out = _drain_in_thread(it2)
        assert not out["hang"] and "error" not in out, out
        assert out["n"] == len(loader) - 1
    leak_check.assert_clean()


def test_close_from_another_thread_wakes_the_consumer(small_dataset, leak_check):
    """A consumer waiting for a batch while the loader is closed must get an error, not wait forever."""
    hooks = DebugHooks(stall_unit=("a.parquet", 0), stall_seconds=60)
    loader = hooked(_loader, small_dataset.root, debug=hooks, shuffle=False, stall_timeout=None)
    it = iter(loader)
    leak_check.track(loader)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(_next_in_thread(it, timeout=15)), daemon=True)
    t.start()
    time.sleep(0.5)
    loader.close()
    t.join(20)
    assert not result.get("hang"), "the consumer still waits after close()"
    assert isinstance(result.get("error"), DetloadError), result
    leak_check.assert_clean()


def test_a_leak_check_counts_the_threads_started_after_it():
    # A thread an earlier test left to finish a stalled read is not this test's leak.
    stop = threading.Event()
    old = threading.Thread(target=stop.wait, name="detload-worker-old", daemon=True)
    new = threading.Thread(target=stop.wait, name="detload-worker-new", daemon=True)
    old.start()
    try:
        check = LeakCheck()
        assert check.problems() == []
        new.start()
        assert check.problems() == ["detload threads left: ['detload-worker-new']"]
    finally:
        stop.set()
        old.join()
        if new.is_alive():
            new.join()
    assert check.problems() == []
