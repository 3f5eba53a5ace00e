"""Memory maps of a file that keep no file descriptor open: `map_file`.

Python's ``mmap.mmap(fd, ...)`` keeps a duplicate of ``fd`` for as long as the map
lives (before 3.13, always). A process pool keeps one map per shared-memory segment
on both sides, and a pass over many small row groups keeps many segments alive at
once: a duplicate each ran a process out of descriptors (EMFILE) under an ordinary
``ulimit -n``, though a mapping needs no descriptor once it is made.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import sys
from typing import Any

import numpy as np

from .errors import DetloadError

__all__ = ["MAP_FAILED", "address_of", "check_descriptors", "descriptor_limit_error", "is_out_of_descriptors",
           "libc", "map_file"]

_TRACKFD = sys.version_info >= (3, 13)
_MAP_FIXED = 0x10  # the same value on Linux and macOS; the mmap module does not export it
#: What libc's mmap returns on failure, as a ctypes c_void_p result reads.
MAP_FAILED = ctypes.c_void_p(-1).value


@functools.cache
def libc() -> Any:
    """libc through ctypes, its ``mmap`` and ``munmap`` typed (loaded once; the entry cache
    maps its files through it too), or None where they cannot be called."""
    if sys.platform != "linux" and sys.platform != "darwin":
        return None
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int64]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return lib


_LIBC = None if _TRACKFD else libc()


def address_of(buffer: object) -> tuple[int, int]:
    """(address, bytes) of a buffer (an mmap or a uint8 array), holding no export of it afterwards."""
    view = np.frombuffer(buffer, dtype=np.uint8)  # type: ignore[call-overload]
    try:
        return int(view.ctypes.data), int(view.nbytes)
    finally:
        del view


def map_file(fd: int, length: int, *, flags: int = mmap.MAP_SHARED,
             prot: int = mmap.PROT_READ | mmap.PROT_WRITE) -> mmap.mmap:
    """``mmap.mmap(fd, length, flags=flags, prot=prot)`` that holds no descriptor: ``fd`` may
    be closed at once and the map stays valid (the kernel keeps the file while it is mapped).

    Before Python 3.13 (no ``trackfd=False``), an anonymous map of the same size and
    protection is made first (its `mmap.mmap` object then owns no descriptor) and the
    file is mapped over its pages with ``MAP_FIXED``: the object's address, size,
    buffer, ``madvise`` and ``close`` (one munmap) are all as for a map of the file.
    Where libc's mmap cannot be called, the map keeps its duplicate descriptor.
    """
    if _TRACKFD:
        return mmap.mmap(fd, length, flags=flags, prot=prot, trackfd=False)  # type: ignore[call-arg]
    if _LIBC is None:
        return mmap.mmap(fd, length, flags=flags, prot=prot)
    # MAP_PRIVATE: the placeholder reserves addresses only; its pages are never touched.
    mm = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE, prot=prot)
    try:
        addr = address_of(mm)[0]
        got = _LIBC.mmap(addr, length, prot, flags | _MAP_FIXED, fd, 0)
        if got is None or got == MAP_FAILED or got != addr:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of descriptor {fd} ({length} bytes) failed: {os.strerror(err)}")
    except BaseException:
        mm.close()
        raise
    return mm


def is_out_of_descriptors(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is EMFILE or ENFILE."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
            return True
        e = e.__cause__ or e.__context__
    return False


def descriptor_limit_error(where: str, cause: object) -> DetloadError:
    """The error for a process that ran out of file descriptors ``where`` (a phrase such as
    "in the loader's process"), naming the limit and how to raise it; ``cause`` is the
    error as raised (its text ends the message)."""
    try:
        import resource  # Unix only

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = f"{soft}" + (f" (hard limit {hard})" if hard != resource.RLIM_INFINITY else "")
    except (ImportError, OSError, ValueError):
        limit = "unknown"
    return DetloadError(
        f"out of file descriptors {where}: the open-files limit (RLIMIT_NOFILE, `ulimit -n`) is "
        f"{limit}. Raise it (`ulimit -n 65536` in the shell that starts training, or "
        "resource.setrlimit(resource.RLIMIT_NOFILE, ...) before building the loader), or close "
        f"files this process keeps open. ({cause})"
    )


def check_descriptors(needed: int, what: str) -> None:
    """Refuse ``what`` (a phrase such as "starting 4 worker processes") when fewer than
    ``needed`` descriptors are left under the limit: failing half-way, the forkserver prints
    a traceback of its own. Nothing is checked where the open ones cannot be counted."""
    try:
        import resource  # Unix only

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        in_use = len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))
    except (ImportError, OSError, ValueError):
        return
    if soft != resource.RLIM_INFINITY and soft - in_use < needed:
        raise descriptor_limit_error(
            what, f"{in_use} are open and it needs {needed} more")
