"""Stopping early: break, an exception or Ctrl-C in the consumer, a loader dropped without close().

In each case the workers stop within 2 s and nothing leaks: no worker process,
no detload thread, no /dev/shm segment. A loader that was only interrupted
(break) still yields complete, identical epochs afterwards.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from faultkit import check_batch, clean_hashes, pid_alive, shm_segments, wait_until

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


SCRIPT = textwrap.dedent("""
    import sys, time
    from detload import Loader
    if __name__ == "__main__":
        root, use_with = sys.argv[1], sys.argv[2] == "with"
        loader = Loader(root, batch_size=50, seed=1, workers=3, pool="process", order="windowed", shuffle_window=2)
        def run():
            for epoch in range(1000):
                loader.set_epoch(epoch)
                for i, batch in enumerate(loader):
                    if epoch == 0 and i == 2:
                        print("PIDS", *loader._pool.pids(), flush=True)
                    time.sleep(0.01)
        if use_with:
            with loader:
                run()
        else:
            run()
""")


@pytest.mark.parametrize("mode", ["with", "bare"])
@pytest.mark.parametrize("target", ["group", "main"])
def test_ctrl_c_in_a_training_script(fault_data, tmp_path, mode, target):
    """Ctrl-C (SIGINT to the process group, or to the main process only): the script
    ends, its workers are gone and /dev/shm holds nothing of it, within 2 s."""
    data = fault_data(files=2)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script), data.root, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), (line, proc.stderr.read() if proc.poll() is not None else "")
        pids = [int(p) for p in line.split()[1:]]
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert set(pids) <= set(family)
        time.sleep(0.2)
        t0 = time.monotonic()
        if target == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
        ended = time.monotonic() - t0
        wait_until(lambda: not any(pid_alive(p) for p in family), 2.0)
        wait_until(lambda: not shm_segments(proc.pid), 2.0)
        gone = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert "KeyboardInterrupt" in err
    print(f"ctrl-c: script ended after {ended:.2f} s, all gone after {gone:.2f} s")
    assert ended < 2.0 and gone < 2.0, (ended, gone)
