"""Shared-memory segments for process workers: plain files in /dev/shm, mapped with mmap.

A worker creates a segment per block, writes the block into it and sends its
name; the consumer side maps it and unlinks it at once, so the memory lives
exactly as long as the last array viewing it. Names carry the consumer's pid
and a loader token, so `sweep` can reclaim what a killed process left behind.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import tempfile
from collections.abc import Callable

import numpy as np

from .errors import SharedMemoryError

__all__ = ["SHM_DIR", "attach", "create", "discard", "sweep", "sweep_dead"]

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_PREFIX = "detload-"
_NAME_RE = re.compile(r"^detload-(\d+)-")


def segment_prefix(pid: int, token: str) -> str:
    return f"{_PREFIX}{pid}-{token}-"


def _space_error(directory: str, nbytes: int, exc: OSError | None = None) -> SharedMemoryError:
    free = "unknown"
    try:
        st = os.statvfs(directory)
        free = f"{st.f_bavail * st.f_frsize / 2**20:.0f} MiB"
    except OSError:
        pass
    return SharedMemoryError(
        f"not enough shared memory in {directory} for a {nbytes / 2**20:.1f} MiB block "
        f"(free: {free}). Raise its size (Docker: --shm-size=8g; Kubernetes: an emptyDir "
        "with medium: Memory), lower prefetch or shuffle_window, or use pool='thread', "
        "which needs no shared memory." + (f" ({exc})" if exc else "")
    )


def create(directory: str, name: str, nbytes: int) -> tuple[np.ndarray, mmap.mmap]:
    """A new writable segment of ``nbytes`` bytes; fails cleanly when /dev/shm is full."""
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        try:
            # Reserve the pages now: writing into an over-committed tmpfs file
            # would kill the worker with SIGBUS instead of raising.
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            os.unlink(path)
            if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                raise _space_error(directory, nbytes, exc) from None
            raise
        mm = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.uint8), mm


def attach(directory: str, name: str, nbytes: int) -> np.ndarray:
    """Map a segment and unlink it: the memory goes when the last view does."""
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
        os.unlink(path)
    return np.frombuffer(mm, dtype=np.uint8)


def discard(directory: str, name: str) -> None:
    try:
        os.unlink(os.path.join(directory, name))
    except FileNotFoundError:
        pass


def _sweep(directory: str, doomed: Callable[[str], bool]) -> int:
    n = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if doomed(name):
            discard(directory, name)
            n += 1
    return n


def sweep(directory: str, prefix: str) -> int:
    """Unlink every segment whose name starts with ``prefix``; returns how many."""
    return _sweep(directory, lambda name: name.startswith(prefix))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_dead(directory: str = SHM_DIR) -> int:
    """Reclaim segments left by detload processes that no longer exist (e.g. SIGKILLed)."""

    def orphaned(name: str) -> bool:
        m = _NAME_RE.match(name)
        return m is not None and not pid_alive(int(m.group(1)))

    return _sweep(directory, orphaned)
