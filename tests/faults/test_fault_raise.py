"""A worker raising while reading: type, message, file, row group and worker traceback reach the consumer.

Both pools, several worker counts; the batches before the failing one are
delivered intact and nothing is left running.
"""

from __future__ import annotations

import pytest
from faultkit import PicklesOnlyAtHome, check_batch, clean_hashes, first_step_needing
from testhooks import hooked

from detload import DataError, Loader, WorkerError
from detload._engine.config import DebugHooks
from detload.audit import hash_batch

OPTS = dict(batch_size=128, seed=3, order="windowed", shuffle_window=3)


class ReadFailure(RuntimeError):
    """Picklable: travels back as the WorkerError's __cause__."""


def _run(root, hooks, workers, pool, leaks):
    got: list[str] = []
    with hooked(Loader, root, workers=workers, pool=pool, debug=hooks, **OPTS) as loader:
        first = (first_step_needing(loader, *hooks.fail_unit)
                 if hooks.fail_unit else None)
        with pytest.raises(Exception) as ei:
            for batch in loader:
                leaks.track(loader)
                check_batch(batch)
                got.append(hash_batch(batch)[0])
    return ei.value, got, first


@pytest.mark.parametrize("pool,workers", [("thread", 1), ("thread", 4), ("process", 1), ("process", 3)])
def test_injected_exception_reaches_consumer(fault_data, leaks, pool, workers):
    data = fault_data()
    clean = clean_hashes(data.root, **OPTS)
    rel, rg = data.units[9][0], data.units[9][1]
    hooks = DebugHooks(fail_unit=(rel, rg), fail_exc=ReadFailure("disk said no (EIO)"))
    err, got, first = _run(data.root, hooks, workers, pool, leaks)
    assert isinstance(err, WorkerError)
    assert type(err.__cause__) is ReadFailure and str(err.__cause__) == "disk said no (EIO)"
    msg = str(err)
    assert f"failed on {rel} row group {rg}: ReadFailure: disk said no (EIO)" in msg
    assert err.unit == (rel, rg) and err.worker is not None and f"worker {err.worker} " in msg
    # The worker's own traceback, down to the frame that raised.
    assert err.worker_traceback and "_debug_before_read" in err.worker_traceback
    assert "Worker traceback:" in msg and "raise d.fail_exc" in msg
    # Raised at the first batch that needs the unit, every earlier batch intact.
    assert got == clean[:first]
    leaks.clean_within(2.0)


def test_unpicklable_exception_still_named(fault_data, leaks, pool):
    """An exception that cannot be pickled arrives as type name, message and traceback."""
    data = fault_data(files=2)
    rel, rg = data.units[2][0], data.units[2][1]
    hooks = DebugHooks(fail_unit=(rel, rg), fail_exc=PicklesOnlyAtHome("odd failure", home=-1 if pool == "thread" else None))
    err, got, first = _run(data.root, hooks, 2, pool, leaks)
    assert isinstance(err, WorkerError) and err.__cause__ is None
    assert f"{rel} row group {rg}: PicklesOnlyAtHome: odd failure" in str(err)
    assert "Worker traceback:" in str(err)
    assert len(got) == first
    leaks.clean_within(2.0)


def test_detload_errors_keep_their_type(fault_data, leaks, pool):
    """detload's own errors raised in a worker (they already name file and row group) are re-raised as is."""
    data = fault_data(files=2)
    rel, rg = data.units[4][0], data.units[4][1]
    exc = DataError(f"column 'id' in {rel} row group {rg} holds 3 null(s)")
    err, got, first = _run(data.root, DebugHooks(fail_unit=(rel, rg), fail_exc=exc), 2, pool, leaks)
    assert type(err) is DataError and str(err) == str(exc)
    assert len(got) == first


def test_loader_usable_after_worker_error(fault_data, leaks, pool):
    """After a reported read error, the next epoch on the same loader (workers persist) is complete."""
    data = fault_data(files=2)
    clean = clean_hashes(data.root, **OPTS)
    rel, rg = data.units[1][0], data.units[1][1]
    hooks = DebugHooks(fail_unit=(rel, rg), fail_exc=ReadFailure("once"))
    with hooked(Loader, data.root, workers=2, pool=pool, debug=hooks, **OPTS) as loader:
        with pytest.raises(WorkerError):
            for _ in loader:
                leaks.track(loader)
        # The failing unit still fails: the error repeats, identically placed.
        got: list[str] = []
        with pytest.raises(WorkerError, match=f"{rel} row group {rg}"):
            for batch in loader:
                got.append(hash_batch(batch)[0])
        assert got == clean[: first_step_needing(loader, rel, rg)]
    leaks.clean_within(2.0)
