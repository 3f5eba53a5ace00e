"""Shared-memory segments for process workers: plain files in /dev/shm, mapped with mmap.

A worker writes a block into a segment and sends its name; the consumer side
maps it (`map_segment`) and, once the last array viewing that mapping is gone,
hands the name back so the worker reuses the segment (`Segments`): fresh tmpfs
pages cost a page fault and a zeroing each, about as much as building the block.
A kept batch never changes, because a segment is reused only after every view
of it in the consumer has died. Names carry the consumer's pid and a loader
token, so `sweep` can reclaim what a killed process left behind.
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import re
import tempfile
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import SharedMemoryError

__all__ = ["SHM_DIR", "Segments", "attach", "create", "discard", "map_segment", "sweep", "sweep_dead"]

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


def map_segment(directory: str, name: str, nbytes: int, on_free: Callable[[], None]) -> np.ndarray:
    """Map a segment without unlinking it; ``on_free()`` runs once no array views it any more."""
    fd = os.open(os.path.join(directory, name), os.O_RDWR)
    try:
        mm = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    fin = weakref.finalize(mm, on_free)
    fin.atexit = False
    return np.frombuffer(mm, dtype=np.uint8)


_ROUND = 1 << 20


class Segments:
    """A process worker's segments: new ones as needed, returned ones reused.

    ``returns`` is a queue on which the consumer side sends back the names it no
    longer views. At most ``keep`` free segments are kept; more are unlinked.
    """

    def __init__(self, directory: str, prefix: str, returns: Any, keep: int = 2) -> None:
        self.dir = directory
        self.prefix = prefix
        self.returns = returns
        self.keep = keep
        self.seq = 0
        self.maps: dict[str, tuple[mmap.mmap, int]] = {}
        self.free: list[str] = []

    def _collect(self) -> None:
        if self.returns is None:
            return
        while True:
            try:
                name = self.returns.get_nowait()
            except (queue.Empty, OSError, EOFError, ValueError):
                break
            if name in self.maps and name not in self.free:
                self.free.append(name)

    def get(self, nbytes: int) -> tuple[str, np.ndarray]:
        """A segment of at least ``nbytes`` bytes that nobody views: (name, writable array)."""
        self._collect()
        fits = [n for n in self.free if self.maps[n][1] >= nbytes]
        if fits:
            name = min(fits, key=lambda n: self.maps[n][1])
            self.free.remove(name)
            mm = self.maps[name][0]
            return name, np.frombuffer(mm, dtype=np.uint8, count=nbytes)
        self._trim(self.keep - 1)
        self.seq += 1
        name = f"{self.prefix}{self.seq}"
        size = -(-nbytes // _ROUND) * _ROUND
        arr, mm = create(self.dir, name, size)
        self.maps[name] = (mm, size)
        return name, arr[:nbytes]

    def put_back(self, name: str) -> None:
        """A segment that was never handed over (its block became stale)."""
        if name in self.maps and name not in self.free:
            self.free.append(name)
        self._trim(self.keep)

    def _trim(self, keep: int) -> None:
        while len(self.free) > max(keep, 0):
            self._drop(self.free.pop(0))

    def _drop(self, name: str) -> None:
        mm, _ = self.maps.pop(name)
        try:
            mm.close()
        except BufferError:  # an array of ours still views it; unmapped when it goes
            pass
        discard(self.dir, name)

    def close(self, unlink: bool) -> None:
        for name in list(self.maps):
            mm, _ = self.maps.pop(name)
            try:
                mm.close()
            except BufferError:
                pass
            if unlink:
                discard(self.dir, name)
        self.free.clear()


def discard(directory: str, name: str) -> None:
    try:
        os.unlink(os.path.join(directory, name))
    except FileNotFoundError:
        pass


def sweep(directory: str, prefix: str) -> int:
    """Unlink every segment whose name starts with ``prefix``; returns how many."""
    n = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix):
            discard(directory, name)
            n += 1
    return n


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_dead(directory: str = SHM_DIR) -> int:
    """Reclaim segments left by detload processes that no longer exist (e.g. SIGKILLed)."""
    n = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        m = _NAME_RE.match(name)
        if m and not _alive(int(m.group(1))):
            discard(directory, name)
            n += 1
    return n
