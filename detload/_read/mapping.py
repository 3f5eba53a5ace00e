"""Which local files a worker reads through a memory map (`Storage.memory_map`).

A memory map lets the Parquet reader decompress straight from the page cache: no
copy of every page into a read buffer, about 4% less read time on the CTR benchmark.
The price is how a failure shows: a page that cannot be read (a file truncated in
place while mapped, a network filesystem that lost its server) is a SIGBUS that
kills the process touching it, where a plain read returns an error. So "auto" (the
default) maps only in worker processes (the consumer survives their death, see
`Watch.death`) and only on filesystems whose pages live on a local disk or in memory.

The pages a map touched count in the process's RSS and PSS for as long as they stay
mapped: with pyarrow's own memory map that was up to the open files' sizes (+156 MiB
PSS on the 218 MB benchmark dataset). `MappedFile` maps the file with Python's mmap
and gives the touched pages back (``MADV_DONTNEED``) after each row group: the page
cache keeps them, only this process's page-table entries go, and a later touch (the
next epoch, or a column Arrow left as a zero-copy slice of the map) maps them again
from the file, the same bytes.
"""

from __future__ import annotations

import mmap
import os
import re
import sys

import pyarrow as pa

from .._fdless import map_file

__all__ = ["LOCAL_FILESYSTEMS", "MappedFile", "mounts", "on_local_disk", "open_mapped", "should_map"]

#: Mount types whose pages come from a local block device or from memory. Anything else
#: (nfs, cifs, lustre, fuse.* such as s3fs or gcsfuse, ...) is read with plain reads.
LOCAL_FILESYSTEMS = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "reiserfs",
    "tmpfs", "ramfs", "overlay",
})

_MOUNTS: list[tuple[str, str]] | None = None
_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # /proc/self/mounts writes space, tab, newline and backslash as \040, \011, \012, \134.
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of each line of a /proc/self/mounts text."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out.append((_unescape(parts[1]), parts[2]))
    return out


def mounts() -> list[tuple[str, str]]:
    """This process's mounts, read once (empty where /proc is not there, as on macOS)."""
    global _MOUNTS
    if _MOUNTS is None:
        try:
            with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
                _MOUNTS = parse_mounts(f.read())
        except OSError:
            _MOUNTS = []
    return _MOUNTS


def on_local_disk(path: str, table: list[tuple[str, str]] | None = None) -> bool:
    """Whether ``path`` lies on a mount in `LOCAL_FILESYSTEMS` (the innermost mount
    holding it decides; unknown: False)."""
    table = mounts() if table is None else table
    real = os.path.realpath(path)
    best, kind = -1, ""
    for point, fstype in table:
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        # The last of equal mount points is the one on top (mounted over the others).
        if inside and len(point) >= best:
            best, kind = len(point), fstype
    return kind in LOCAL_FILESYSTEMS


def should_map(mode: bool | str, fs_type: str, location: str) -> bool:
    """Whether a worker opens ``location`` with a memory map under ``mode``, `Storage.memory_map`'s
    value as the loader passes it on: False (plain reads), "auto" (mapped where the mount is a
    local disk or memory filesystem) or True (every local file). The loader passes False for
    "auto" to thread workers, whose crash would be the consumer's."""
    if mode is False or fs_type != "local" or sys.platform == "win32":
        return False  # Windows: a mapped file cannot be replaced or deleted while open
    return mode is True or on_local_disk(location)


_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


class MappedFile:
    """A local file mapped read-only: `source` for the Parquet reader, `release` to give
    back the pages touched so far. Keeps its own descriptor, so `fileno` stats the file
    that is mapped even after its path was replaced; the map itself holds none (one
    descriptor per open file, not two)."""

    def __init__(self, fd: int, size: int, mm: mmap.mmap) -> None:
        self._fd = fd
        self._size = size
        self._mm: mmap.mmap | None = mm
        self.source: pa.BufferReader | None = pa.BufferReader(pa.py_buffer(mm))

    def fileno(self) -> int:
        return self._fd

    def size(self) -> int:
        return self._size

    def release(self) -> None:
        """Unmap this process's view of the pages touched so far (the page cache keeps them)."""
        if self._mm is not None and _DONTNEED is not None:
            self._mm.madvise(_DONTNEED)

    def close(self) -> None:
        """Close the descriptor and unmap; call it after the readers reading `source` are gone."""
        self.source = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # A column still holds a zero-copy slice of the map (uncompressed pages):
                # the map goes when the last such array does.
                pass
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_mapped(location: str) -> MappedFile | None:
    """``location`` memory-mapped for reading, or None where it cannot be (then read it plainly)."""
    try:
        fd = os.open(location, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:  # an empty file cannot be mapped; the plain read says what is wrong with it
            raise OSError("empty")
        mm = map_file(fd, size, prot=mmap.PROT_READ)
        return MappedFile(fd, size, mm)
    except (OSError, ValueError, pa.ArrowException):
        os.close(fd)
        return None
