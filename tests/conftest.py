"""Shared test set-up: hypothesis profiles, Parquet dataset fixtures and the leak check.

Profiles: ``ci`` (the default; few examples, since most property tests start
workers) and ``local`` (many more). Pick one with ``HYPOTHESIS_PROFILE=local``.

``leak_check`` asserts that nothing a loader started outlives it: no worker
process, no ``detload-*`` thread, no ``/dev/shm/detload-<our pid>-*`` segment.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

import psutil
import pytest
from hypothesis import HealthCheck, settings

# Make the helper modules next to this file importable whatever the import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from strategies import DatasetInfo, write_dataset  # noqa: E402

settings.register_profile(
    "ci",
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "local",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# -- leak checking -------------------------------------------------------------

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def shm_segments(pid: int | None = None) -> list[str]:
    """The shared-memory segments detload made for process ``pid`` (default: us)."""
    if SHM_DIR is None:
        return []
    prefix = f"detload-{os.getpid() if pid is None else pid}-"
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))


def detload_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("detload-") and t.is_alive())


def _is_mp_helper(p: psutil.Process) -> bool:
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return "multiprocessing.forkserver" in cmd or "multiprocessing.resource_tracker" in cmd


def stray_children() -> list[psutil.Process]:
    """Descendants of this process other than multiprocessing's own helpers.

    Worker processes are forked by the forkserver, so they are grandchildren and
    carry the forkserver's command line: a process counts as a helper only if it
    is our direct child.
    """
    me = psutil.Process()
    out = []
    for c in me.children(recursive=True):
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                continue
            if c.ppid() == me.pid and _is_mp_helper(c):
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class LeakCheck:
    """Records a loader's worker pids; `assert_clean` checks everything it started is gone."""

    def __init__(self) -> None:
        self.pids: set[int] = set()

    def track(self, loader: object) -> list[int]:
        """Remember the worker pids of ``loader`` (call while its pool runs)."""
        pool = getattr(loader, "_pool", None)
        pids = list(pool.pids()) if pool is not None else []
        self.pids.update(pids)
        return pids

    def problems(self) -> list[str]:
        out = []
        alive = sorted(p for p in self.pids if _alive(p))
        if alive:
            out.append(f"worker processes still alive: {alive}")
        strays = stray_children()
        if strays:
            out.append(f"child processes left: {[(c.pid, c.name()) for c in strays]}")
        segs = shm_segments()
        if segs:
            out.append(f"/dev/shm segments left: {segs}")
        threads = detload_threads()
        if threads:
            out.append(f"detload threads left: {threads}")
        return out

    def assert_clean(self, grace: float = 3.0) -> None:
        """Everything is gone now, or within ``grace`` seconds (process reaping is asynchronous)."""
        deadline = time.monotonic() + grace
        while True:
            problems = self.problems()
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert not problems, "; ".join(problems)


@pytest.fixture
def leak_check() -> Iterator[LeakCheck]:
    check = LeakCheck()
    yield check
    check.assert_clean()


# -- datasets ------------------------------------------------------------------

@pytest.fixture
def make_dataset(tmp_path) -> Callable[..., DatasetInfo]:
    """``make_dataset({"a.parquet": [100, 50], "b.parquet": []}, seed=0)`` writes the standard columns."""
    counter = [0]

    def make(files: dict[str, list[int]], seed: int = 0, name: str | None = None) -> DatasetInfo:
        counter[0] += 1
        root = tmp_path / (name or f"ds{counter[0]}")
        return write_dataset(str(root), files, seed=seed)

    return make


@pytest.fixture
def small_dataset(make_dataset) -> DatasetInfo:
    """Three data files (one empty, one with an empty row group), 1,211 rows in 6 units."""
    return make_dataset({
        "a.parquet": [300, 200],
        "b.parquet": [],
        "c.parquet": [250, 0, 250, 1],
        "sub/d.parquet": [210],
    })
