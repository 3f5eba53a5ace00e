"""Leak checks shared by the test files: worker processes, detload threads, /dev/shm segments.

A module rather than conftest.py content, so test files can import it by a
name no other folder's conftest shadows.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection

import psutil

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def wait_until(cond: Callable[[], object], timeout: float, step: float = 0.02) -> float:
    """Seconds until ``cond()`` held; raises AssertionError after ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition {getattr(cond, '__name__', cond)} not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - t0


def shm_segments(pid: int | None = None) -> list[str]:
    """The shared-memory segments detload made for process ``pid`` (default: us)."""
    if SHM_DIR is None:
        return []
    prefix = f"detload-{os.getpid() if pid is None else pid}-"
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))


def detload_threads(before: Collection[threading.Thread] = ()) -> list[str]:
    """The names of detload's live threads, those in ``before`` left out."""
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith("detload-") and t.is_alive() and t not in before)


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


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class LeakCheck:
    """Records a loader's worker pids; `assert_clean` checks everything it started is gone.

    Threads alive when the check is made are not this test's: an earlier test may leave a
    worker thread that finishes a deliberately stalled read (tests/test_torch.py stalls one
    for 12 s and checks that leaving the loop does not wait for it), which ends by itself.
    """

    def __init__(self) -> None:
        self.pids: set[int] = set()
        #: Threads alive before this check (left out of `problems`).
        self.before: frozenset[threading.Thread] = frozenset(threading.enumerate())

    def track(self, loader: object) -> list[int]:
        """Remember the worker pids of ``loader`` (call while its pool runs)."""
        pool = getattr(loader, "_pool", None)
        pids = list(pool.pids()) if pool is not None else []
        self.pids.update(pids)
        return pids

    def problems(self) -> list[str]:
        out = []
        alive = sorted(p for p in self.pids if pid_alive(p))
        if alive:
            out.append(f"worker processes still alive: {alive}")
        strays = stray_children()
        if strays:
            out.append(f"child processes left: {[(c.pid, c.name()) for c in strays]}")
        segs = shm_segments()
        if segs:
            out.append(f"/dev/shm segments left: {segs}")
        threads = detload_threads(self.before)
        if threads:
            out.append(f"detload threads left: {threads}")
        return out

    def clean_within(self, seconds: float) -> float:
        """Seconds until everything was gone; fails, listing what is left, after ``seconds``."""
        t0 = time.monotonic()
        while True:
            problems = self.problems()
            elapsed = time.monotonic() - t0
            if not problems:
                return elapsed
            if elapsed > seconds:
                raise AssertionError(f"not clean after {seconds} s: " + "; ".join(problems))
            time.sleep(0.02)

    def assert_clean(self, grace: float = 3.0) -> None:
        """Everything is gone now, or within ``grace`` seconds (process reaping is asynchronous)."""
        self.clean_within(grace)
