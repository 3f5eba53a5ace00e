"""Entry files mapped read-only through libc's mmap: a mapping holds no file descriptor and
is unmapped when the last array viewing it is gone."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from typing import Any, NamedTuple

import numpy as np

from .._fdless import MAP_FAILED, libc
from .format import _PREFIX, _Corrupt


class _Mapping(NamedTuple):
    """An entry file's mapping, and which file it maps (to tell when the name moved on)."""

    buf: np.ndarray  # the whole file, read-only uint8
    ident: tuple[int, int]  # st_dev, st_ino

    @property
    def size(self) -> int:
        return int(self.buf.shape[0])


# Entries are mapped with libc's mmap rather than Python's: mmap.mmap keeps a
# duplicate of the file descriptor open for as long as the mapping lives (until
# Python 3.13's trackfd=False), so keeping thousands of entries mapped ran a
# process out of descriptors ("Too many open files"). A mapping made here holds
# none; it is unmapped when the last array viewing it is gone.
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux


class _Unmap:
    """Unmaps a region when collected; referenced by the region's ctypes buffer."""

    __slots__ = ("addr", "lib", "size")

    def __init__(self, lib: Any, addr: int, size: int) -> None:
        self.lib, self.addr, self.size = lib, addr, size

    def __del__(self) -> None:
        self.lib.munmap(self.addr, self.size)


def _mmap_read(fd: int, size: int, populate: bool = True) -> np.ndarray:
    """The first ``size`` bytes of ``fd`` mapped read-only (shared) as a uint8 array; keeps no descriptor.

    ``populate`` False: pages are mapped as they are touched (a spilled window's columns
    beside its file, of which a block touches its own rows: _engine/spill.py)."""
    lib = libc()  # shared with the pool's descriptor-free maps (_fdless.py)
    if lib is None:
        raise OSError(errno.ENOSYS, "libc's mmap cannot be called on this platform")
    # Populated at once: the checksum reads every page right after, and setting up all
    # page-table entries in one call is a little cheaper than a fault per 64 KiB.
    addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED | (_MAP_POPULATE if populate else 0), fd, 0)
    if addr is None or addr == MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    raw = _char_array(size).from_address(addr)
    raw._unmap = _Unmap(lib, addr, size)  # type: ignore[attr-defined]  # lives as long as the buffer
    # A read-only buffer: NumPy then refuses to make any view of it writable (PROT_READ
    # memory would crash the process on a write instead of raising).
    return np.frombuffer(memoryview(raw).toreadonly().cast("B"), dtype=np.uint8)


_ARRAY_TYPES: dict[int, Any] = {}


def _char_array(size: int) -> Any:
    """``ctypes.c_char * size``, made once per size (a new ctypes type costs ~12 us)."""
    t = _ARRAY_TYPES.get(size)
    if t is None:
        if len(_ARRAY_TYPES) >= 1024:
            _ARRAY_TYPES.clear()
        t = _ARRAY_TYPES[size] = ctypes.c_char * size
    return t


def _map(path: str, populate: bool = True) -> _Mapping | None:
    """Map an entry file read-only; None if it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_size < _PREFIX.size:
            raise _Corrupt(f"{st.st_size} bytes, shorter than the entry prefix")
        buf = _mmap_read(fd, st.st_size, populate)
    finally:
        os.close(fd)
    return _Mapping(buf, (st.st_dev, st.st_ino))
