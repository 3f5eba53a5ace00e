"""The locked store of one cache directory: its folders, the fcntl-locked byte counter (no index
of entries), reserving room for a new entry, discarding one, and the recount that also removes
temp files of dead writers and the entries of replaced files."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import uuid
from collections.abc import Iterator, Sequence

from .._procs import pid_alive
from .format import _MARKER, _SUFFIX, CACHE_FORMAT


class _DiskFull(Exception):
    pass


class _Store:
    """Paths and the locked usage counter of one cache directory."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.objects = os.path.join(root, "objects")
        self.tmp = os.path.join(root, "tmp")
        self._lock_path = os.path.join(root, "lock")
        self._usage_path = os.path.join(root, "usage")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def usage(self) -> int:
        try:
            with open(self._usage_path, "rb") as f:
                return int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def set_usage(self, n: int) -> None:
        # Written in place under the lock: a few bytes, never torn in practice,
        # and a bad value only mis-sizes the limit until the next rescan.
        fd = os.open(self._usage_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(max(0, n)).encode(), 0)
        finally:
            os.close(fd)

    def release(self, n: int) -> None:
        with self.locked():
            self.set_usage(self.usage() - n)

    def reserve(self, n: int, limit: int | None) -> str | None:
        """Under the lock: check the limit, create a temp file holding ``n`` bytes of disk, count
        them; the temp file's path, or None if the entry would pass ``limit``. _DiskFull if the
        disk has no room for it."""
        with self.locked():
            used = self.usage()
            if limit is not None and used + n > limit:
                return None
            host = _safe_host(socket.gethostname())
            tmp = os.path.join(self.tmp, f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                try:
                    os.posix_fallocate(fd, 0, n)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        os.close(fd)
                        fd = -1
                        os.unlink(tmp)
                        raise _DiskFull(os.strerror(exc.errno)) from None
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    os.ftruncate(fd, n)
            finally:
                if fd >= 0:
                    os.close(fd)
            self.set_usage(used + n)
        return tmp

    def discard(self, path: str) -> None:
        """Delete an entry (found damaged) and uncount its bytes; quiet if it is gone already."""
        try:
            with self.locked():
                size = os.stat(path).st_size
                os.unlink(path)
                self.set_usage(self.usage() - size)
        except OSError:
            pass

    def rescan(self) -> int:
        """Recount the bytes on disk (call under the lock); removes temp files of dead writers.

        Files are counted once per inode: a writer links its temp file to the entry's
        name before removing the temp name (without the lock), so for a moment, or
        across the two folders of one scan, the same bytes have both names.
        """
        seen: dict[tuple[int, int], int] = {}
        host = socket.gethostname()
        with contextlib.suppress(FileNotFoundError):
            for e in os.scandir(self.tmp):
                if _dead_writer(e.name, host):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat()
                    seen[(st.st_dev, st.st_ino)] = st.st_size
        for _, _, st in _walk_entries(self.objects):
            seen[(st.st_dev, st.st_ino)] = st.st_size
        total = sum(seen.values())
        self.set_usage(total)
        return total


def _walk_entries(objects: str) -> Iterator[tuple[str, str, os.stat_result]]:
    """(object key, entry path, stat) of every entry file."""
    with contextlib.suppress(FileNotFoundError):
        for a in os.scandir(objects):
            if not a.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError):
                for b in os.scandir(a.path):
                    if not b.is_dir():
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        for e in os.scandir(b.path):
                            if e.name.endswith(_SUFFIX):
                                with contextlib.suppress(FileNotFoundError):
                                    yield f"{a.name}/{b.name}", e.path, e.stat()


def _dead_writer(name: str, host: str) -> bool:
    """Temp and marker names carry ``<host>-<pid>-``; a writer of this host that is gone left them.

    Gone by the rule `_procs.pid_alive` applies to segments: a killed writer stays a zombie
    until its parent reaps it (a second or two for a pool's worker), and its file must not
    outlive it that long, nor count towards the usage of the run that starts meanwhile.
    """
    parts = name.split("-")
    if len(parts) < 3 or parts[0] != _safe_host(host) or not parts[1].isdigit():
        return False
    return not pid_alive(int(parts[1]))


def _safe_host(host: str) -> str:
    return "".join(c for c in host if c.isalnum()) or "host"


def _prepare(store: _Store) -> None:
    """Create the cache's folders and marker (again, if someone deleted them)."""
    os.makedirs(store.objects, exist_ok=True)
    os.makedirs(store.tmp, exist_ok=True)
    marker = os.path.join(os.path.dirname(store.root), _MARKER)
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(json.dumps({"what": "detload row-group cache", "format": CACHE_FORMAT}) + "\n")


def _evict_replaced(store: _Store, objects: Sequence[str]) -> None:
    """Remove the entries of other versions of the dataset's files (a replaced file)."""
    current: dict[str, set[str]] = {}
    for key in objects:
        uri_h, ver_h = key.split("/")
        current.setdefault(uri_h, set()).add(ver_h)
    for uri_h, keep in current.items():
        folder = os.path.join(store.objects, uri_h)
        with contextlib.suppress(FileNotFoundError):
            for e in os.scandir(folder):
                if e.name not in keep and e.is_dir():
                    shutil.rmtree(e.path, ignore_errors=True)
