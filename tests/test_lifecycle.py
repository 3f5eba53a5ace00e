"""What dead, killed and interrupted processes leave behind, and what close() releases.

A zombie counts as dead (for segments and cache temp files alike).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from leaks import pid_alive, shm_segments, wait_until
from testhooks import hooked

import detload
from detload import Loader, WorkerError, WorkerStalledError
from detload._cache import cache_info
from detload._cache.store import _safe_host
from detload._engine.config import DebugHooks


@pytest.fixture
def root(tmp_path) -> str:
    d = tmp_path / "data"
    d.mkdir()
    for f in range(3):
        ids = np.arange(f * 1000, (f + 1) * 1000, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), d / f"part-{f}.parquet", row_group_size=250)
    return str(d)


def _zombie() -> subprocess.Popen:
    """A child killed and not reaped yet (what a SIGKILLed pool worker is for a second or two)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc.kill()
    wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE, 10.0)
    return proc


def test_a_zombie_writers_cache_temp_file_goes_at_the_next_open(root, tmp_path):
    cache = tmp_path / "cache"
    with Loader(root, batch_size=100, seed=1, cache=str(cache)) as ld:
        for _ in ld:
            pass
    entries = cache_info(cache)["bytes"]
    assert entries > 0
    proc = _zombie()
    try:
        tmp = cache / "v1" / "tmp" / f"{_safe_host(socket.gethostname())}-{proc.pid}-0000abcd.tmp"
        tmp.write_bytes(b"\0" * 100_000)  # a half-written entry of the killed writer
        with Loader(root, batch_size=100, seed=1, cache=str(cache)):
            pass
        assert not tmp.exists(), "the temp file of a dead (zombie) writer survived the next open"
        info = cache_info(cache)
        assert info["usage_counter"] == info["bytes"] == entries
    finally:
        proc.wait()


# -- close() releases everything, whatever the caller keeps ------------------------------

def _fds() -> dict[str, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def _pool_like_fds(before: dict[str, str]) -> list[str]:
    """Pipes and shared-memory files this process holds now and did not hold in ``before``."""
    return sorted(t for fd, t in _fds().items() if before.get(fd) != t
                  and (t.startswith("pipe:") or t.startswith("/dev/shm/") or "/sem." in t))


def _shm_maps() -> set[str]:
    """This process's mappings of /dev/shm files (segments, semaphores, anything)."""
    with open("/proc/self/maps") as f:
        return {parts[5] for parts in (line.rstrip("\n").split(None, 5) for line in f)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/")}


def _victim(loader: Loader) -> tuple[int, str, int]:
    """(worker, file, row group) of a unit in the middle of the schedule."""
    sched = loader.plan().schedule
    k = len(sched) // 2
    u = sched[k].sources[0]
    return k % loader.workers, loader.dataset.files[int(loader._unit_files[u])].path, int(loader._unit_rgs[u])


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs procfs")
@pytest.mark.parametrize("fault", ["death", "stall"])
def test_close_releases_everything_while_the_error_and_the_loader_are_kept(root, leak_check, fault):
    """After a WorkerError (a worker SIGKILLed) or a WorkerStalledError, with the exception (its
    traceback reaches the merger's frames) and the loader kept: no pipe, no shared-memory mapping
    or descriptor, no semaphore of the pool is left in this process, without any help from the
    cyclic garbage collector."""
    opts = dict(batch_size=100, seed=2, order="windowed", shuffle_window=2, workers=3, pool="process")
    with Loader(root, **opts) as warm:  # the forkserver and resource tracker live on: not the pool's
        next(iter(warm))
    probe = Loader(root, **opts)
    w, rel, rg = _victim(probe)
    hooks = DebugHooks(stall_unit=(rel, rg), stall_seconds=600.0)
    gc.disable()
    try:
        fds0, maps0 = _fds(), _shm_maps()
        loader = hooked(Loader, root, debug=hooks, **{
            **opts, "pool": detload.Pool(kind="process", stall_timeout=3.0 if fault == "stall" else None)})
        it = iter(loader)
        next(it)
        pids = leak_check.track(loader)
        assert len(_pool_like_fds(fds0)) >= 3 * loader.workers  # the check sees the pool's pipes
        st = loader._pool.statuses[w]
        files = [f.path for f in loader.dataset.files]
        wait_until(lambda: st.get()[2] >= 0 and (files[st.get()[2]], st.get()[3]) == (rel, rg), 30)
        if fault == "death":
            os.kill(pids[w], signal.SIGKILL)
        with pytest.raises(WorkerError) as ei:
            collections.deque(it, maxlen=0)  # keeps no batch
        kept = ei.value
        assert isinstance(kept, WorkerStalledError) == (fault == "stall")
        assert kept.__traceback__ is not None
        loader.close()
        assert _pool_like_fds(fds0) == []
        assert _shm_maps() == maps0
        # Semaphores other tests (or multiprocessing itself) mapped before are not the pool's.
        assert not any("/sem." in m for m in _shm_maps() - maps0)
        leak_check.assert_clean()
        del kept, it, loader
    finally:
        gc.enable()


def test_close_releases_a_pool_whose_start_was_refused(root, monkeypatch):
    """A pool that fails while starting its processes releases what it had made."""
    from detload._engine import pool as _pool

    fds0 = _fds()

    def boom(self, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(_pool._Sender, "__init__", boom)
    loader = Loader(root, batch_size=100, seed=1, workers=2, pool="process")
    with pytest.raises(KeyboardInterrupt):
        iter(loader)
    assert _pool_like_fds(fds0) == []
    loader.close()


# -- a dead pool is reported as dead -----------------------------------------------------

@pytest.mark.parametrize("when", ["mid-pass", "between passes"])
def test_iterating_again_after_a_worker_died_fails_at_once(root, leak_check, when):
    """The next iter() raises a WorkerError saying the worker died earlier and the loader must
    be made again, before any batch; never a report of the dead worker as busy."""
    opts = dict(batch_size=100, seed=4, order="windowed", shuffle_window=2, workers=3, pool="process")
    hooks = None
    if when == "mid-pass":  # worker 1 is still on its last block when it dies
        with Loader(root, **opts) as probe:
            sched = probe.plan().schedule
            u = sched[max(k for k in range(len(sched)) if k % 3 == 1)].sources[0]
            hooks = DebugHooks(stall_unit=(probe.dataset.files[int(probe._unit_files[u])].path,
                                           int(probe._unit_rgs[u])), stall_seconds=600.0)
    with hooked(Loader, root, debug=hooks, **opts) as loader:
        it = iter(loader)
        next(it)
        pids = leak_check.track(loader)
        if when == "between passes":
            collections.deque(it, maxlen=0)
            os.kill(pids[1], signal.SIGKILL)
            wait_until(lambda: not loader._pool.alive(1), 10.0)
        else:
            os.kill(pids[1], signal.SIGKILL)
            with pytest.raises(WorkerError, match="was killed by signal 9"):
                collections.deque(it, maxlen=0)
        for _ in range(2):
            delivered = []
            with pytest.raises(WorkerError) as ei:
                for batch in loader:
                    delivered.append(batch)
            assert delivered == []
            msg = str(ei.value)
            assert msg.startswith(f"worker process 1 (pid {pids[1]}) was killed by signal 9")
            assert "earlier in this loader's life" in msg and "create a new Loader" in msg
            assert "another pass" not in msg and "while producing" not in msg
            assert ei.value.worker == 1


# -- orphaned workers --------------------------------------------------------------------

ORPHANS = """
import sys, time
from detload import Loader, Pool
root, state = sys.argv[1], sys.argv[2]
loader = Loader(root, batch_size=100, seed=1, workers=2, pool=Pool(kind="process", prefetch=1), order="windowed", shuffle_window=1)
it = iter(loader)
next(it)
if state == "idle":
    for _ in it:
        pass
print("PIDS", *loader._pool.pids(), flush=True)
time.sleep(600)
"""


def _script_env() -> dict[str, str]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("state", ["waiting for room", "idle"])
def test_orphaned_workers_leave_at_once(root, state):
    """SIGKILL of the consumer alone: its workers notice within the documented bound
    (docs/reliability.md: well under 100 ms), whether they wait for room for their next
    block or for work."""
    proc = subprocess.Popen([sys.executable, "-c", ORPHANS, root, "idle" if state == "idle" else "busy"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_script_env(),
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), (line, proc.stderr.read() if proc.poll() is not None else "")
        workers = [psutil.Process(int(p)) for p in line.split()[1:]]
        if state != "idle":  # each has sent its one block (prefetch=1) and built the next
            wait_until(lambda: all(w.status() == psutil.STATUS_SLEEPING for w in workers), 10.0)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()

        def gone() -> bool:
            for w in workers:
                try:
                    if w.status() != psutil.STATUS_ZOMBIE:
                        return False
                except psutil.NoSuchProcess:
                    pass
            return True

        wait_until(gone, 5.0, step=0.002)
        took = time.monotonic() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    print(f"orphaned workers ({state}) gone {took * 1000:.0f} ms after the consumer's SIGKILL")
    assert took < 0.25, took


# -- nothing outlives a training process, however it is stopped ------------------------------

TRAIN = """
import signal, sys, time
from detload import Loader
root, use_with, on_term, pool = sys.argv[1], sys.argv[2] == "with", sys.argv[3], sys.argv[4]
if on_term == "exit":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
loader = Loader(root, batch_size=50, seed=1, workers=3, pool=pool, order="windowed", shuffle_window=1)
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
"""


def _start_training(root: str, mode: str, on_term: str = "exit", pool: str = "process",
                    ) -> tuple[subprocess.Popen, list[int]]:
    """The training script above, in a session of its own; returns once it is in its first epoch,
    with its descendants then (the worker processes and multiprocessing's helpers)."""
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, root, mode, on_term, pool], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_script_env(), start_new_session=True)
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), (line, proc.stderr.read() if proc.poll() is not None else "")
    family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    workers = {int(p) for p in line.split()[1:]}
    assert workers <= set(family) and len(workers) == (3 if pool == "process" else 0)
    return proc, family


def _start_cli_run(root: str, manifest: str) -> tuple[subprocess.Popen, list[int]]:
    """``detload run`` with 3 process workers; returns once its manifest holds a few batches."""
    proc = subprocess.Popen([sys.executable, "-m", "detload", "run", root, "--batch-size", "50", "--seed", "1",
                             "--epochs", "1000", "--pool", "process", "--workers", "3", "--manifest", manifest],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_script_env(),
                            start_new_session=True)
    def batches() -> int:
        with contextlib.suppress(FileNotFoundError), open(manifest) as f:
            return f.read().count('"batch"')
        return 0

    wait_until(lambda: proc.poll() is not None or batches() >= 3, 60.0)
    assert proc.poll() is None, proc.communicate()
    family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert len(family) >= 3, family
    return proc, family


def _group_gone(pgid: int) -> bool:
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return True


def pytest_generate_tests(metafunc):
    """A contract's subclass says which entry modes and signal targets apply to it."""
    cls = metafunc.cls
    if cls is not None and issubclass(cls, NothingOutlivesAStoppedTrainingProcess):
        metafunc.parametrize("mode", cls.modes)
        metafunc.parametrize("target", cls.targets)


class NothingOutlivesAStoppedTrainingProcess:
    """The contract: a training process whose loader runs workers, sent ``signum`` (to its main
    process alone, or to its whole process group as a terminal or a scheduler does), ends within
    2 s with the exit status and stderr it should, and within 2.5 s no process it started and no
    /dev/shm segment of it is left (nor the resource tracker's 'leaked semaphore objects' warning).

    Each subclass is one way to run and stop training: the entry point (a script with a
    `Loader`, used in a `with` block or bare, or `detload run`), the pool kind, the signal and
    how the process handles it.
    """

    signum: int = signal.SIGTERM
    modes: tuple[str, ...] = ("with", "bare")      # a script: `with loader:` or a bare loader
    targets: tuple[str, ...] = ("main", "group")
    pool = "process"
    on_term = "exit"                                # SIGTERM handler: "exit" (sys.exit(143)) or "default"

    def start(self, root: str, mode: str, tmp_path) -> tuple[subprocess.Popen, list[int]]:
        return _start_training(root, mode, self.on_term, self.pool)

    def check_exit(self, returncode: int, err: str) -> None:
        raise NotImplementedError

    def test_it_ends_at_once_and_leaves_nothing(self, root, tmp_path, mode, target):
        proc, family = self.start(root, mode, tmp_path)
        try:
            time.sleep(0.2)
            t0 = time.monotonic()
            (os.killpg if target == "group" else os.kill)(proc.pid, self.signum)
            proc.wait(timeout=10)
            ended = time.monotonic() - t0
            wait_until(lambda: not any(pid_alive(p) for p in family), 3.0)
            wait_until(lambda: _group_gone(proc.pid), 3.0)
            wait_until(lambda: not shm_segments(proc.pid), 2.0)
            gone = time.monotonic() - t0
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.check_exit(proc.returncode, proc.stderr.read())
        assert ended < 2.0 and gone < 2.5, (ended, gone)


class TestSigtermToAScriptThatExitsOnIt(NothingOutlivesAStoppedTrainingProcess):
    """A handler that exits (as `detload run` has): the loader is closed by `with` or at exit."""

    def check_exit(self, returncode, err):
        assert (returncode, err) == (143, "")


class TestSigtermToAScriptWithoutAHandler(NothingOutlivesAStoppedTrainingProcess):
    """The process just ends; its orphaned workers notice and clean up after themselves."""

    on_term = "default"
    # To the main process only: a group-wide SIGTERM also ends the workers by SIGTERM's default
    # action, and their segments stay until the next process pool starts on the machine.
    targets = ("main",)

    def check_exit(self, returncode, err):
        assert (returncode, err) == (-signal.SIGTERM, "")


class TestCtrlCInAScript(NothingOutlivesAStoppedTrainingProcess):
    """Ctrl-C: the KeyboardInterrupt ends the script (workers ignore SIGINT; the parent decides)."""

    signum = signal.SIGINT

    def check_exit(self, returncode, err):
        assert returncode in (1, -signal.SIGINT), err
        assert err.rstrip().endswith("KeyboardInterrupt"), err
        assert "leaked semaphore" not in err and "Exception ignored" not in err, err


class TestSigtermToAScriptWithThreadWorkers(NothingOutlivesAStoppedTrainingProcess):
    pool = "thread"
    modes = ("with",)

    def check_exit(self, returncode, err):
        assert (returncode, err) == (143, "")


class TestSigtermToDetloadRun(NothingOutlivesAStoppedTrainingProcess):
    """The command line, with process workers: one line on stderr, exit 143."""

    modes = ("cli",)

    def start(self, root, mode, tmp_path):
        return _start_cli_run(root, str(tmp_path / "m.jsonl"))

    def check_exit(self, returncode, err):
        assert (returncode, err) == (143, "terminated\n")


class TestCtrlCInDetloadRun(TestSigtermToDetloadRun):
    signum = signal.SIGINT

    def check_exit(self, returncode, err):
        assert (returncode, err) == (130, "interrupted\n")


def test_a_killed_process_group_leaves_no_semaphores(root):
    """kill -9 of the whole group (a scheduler, a cgroup OOM kill): nothing of it can clean up.
    No process of a running pool maps a semaphore, so none can be left for good; the segments
    it leaves are reclaimed when the next process pool starts on the machine."""
    proc, family = _start_training(root, "with")
    try:
        for pid in [proc.pid, *family]:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
            assert "/dev/shm/sem." not in maps, f"process {pid} maps a semaphore"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_until(lambda: _group_gone(proc.pid), 5.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with Loader(root, batch_size=100, seed=1, workers=1, pool="process") as loader:
        next(iter(loader))
    assert shm_segments(proc.pid) == []


STARTUP = """
import sys
try:
    from detload import Loader
    print("READY", flush=True)
    with Loader(sys.argv[1], batch_size=100, seed=1, workers=3, pool="process") as loader:
        for epoch in range(10**6):  # until interrupted
            loader.set_epoch(epoch)
            for _ in loader:
                pass
except KeyboardInterrupt:
    sys.stderr.write("interrupted\\n")
    sys.exit(130)
"""


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_start_up_prints_no_traceback(root):
    """Ctrl-C (SIGINT to the whole process group) at random moments while the process pool
    starts: the forkserver and the workers print nothing; the script says 'interrupted' and
    leaves no process or segment behind. 4 moments here, 40 with DETLOAD_FULL=1."""
    import random

    rng = random.Random(6)
    rounds = 40 if os.environ.get("DETLOAD_FULL") == "1" else 4
    for r in range(rounds):
        # Spread over start-up: the forkserver's imports, the workers' start, the first blocks.
        delay = (r % 4) * 0.35 + rng.random() * 0.35
        proc = subprocess.Popen([sys.executable, "-c", STARTUP, root], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_script_env(), start_new_session=True)
        try:
            assert proc.stdout.readline().startswith("READY")
            time.sleep(delay)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=20)
            pid = proc.pid
            wait_until(lambda pid=pid: _group_gone(pid), 3.0)
            wait_until(lambda pid=pid: not shm_segments(pid), 2.0)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.returncode == 130 and err == "interrupted\n", f"after {delay:.2f} s: {proc.returncode}\n{err}"
