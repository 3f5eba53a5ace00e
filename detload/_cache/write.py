"""Writing entries: laid out by the caller, reserved against the limit, written to a temp file in
one vectored write, then hard-linked to the entry's name (atomic; never replaces another writer's).
A full disk or any other write error stops that writer; loading goes on."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from typing import Any

from .config import CacheConfig, _warn_once
from .format import _buffers, _Laid
from .store import _DiskFull, _prepare, _Store

#: Lays an entry out, called only when its name is free; None to write nothing.
Layout = Callable[[], "_Laid | None"]


class _Writer:
    """One worker's writes into the cache (row-group entries, or derived ones: ``tag``)."""

    def __init__(self, cfg: CacheConfig, store: _Store, tag: str = "") -> None:
        self.cfg = cfg
        self.store = store
        self.tag = tag  # "" for row-group entries: their warnings keep their kinds
        self.writes_on = True
        self._written = 0

    def put(self, final: str, layout: Layout) -> None:
        """Write the entry ``layout`` makes as ``final`` unless it is there already."""
        if not self.writes_on:
            return
        try:
            try:
                self._write(final, layout)
            except FileNotFoundError:
                # The cache folder was deleted while the loader ran (rm -rf): make it again
                # (once; another worker may be at it too) rather than load uncached for the
                # rest of the loader's life.
                _prepare(self.store)
                self._write(final, layout)
        except _DiskFull as exc:
            self.writes_on = False
            _warn_once(self.cfg, "full",
                       f"the cache directory {os.path.dirname(self.cfg.root)} is full ({exc}); "
                       "loading goes on without writing to the cache (entries already there are still used)")
        except OSError as exc:
            self.writes_on = False
            _warn_once(self.cfg, "write",
                       f"cannot write to the cache directory {os.path.dirname(self.cfg.root)} ({exc}); "
                       "loading goes on without writing to the cache")

    def _write(self, final: str, layout: Layout) -> None:
        if os.path.exists(final):
            return
        laid = layout()
        if laid is None:  # pragma: no cover - header padding too small
            return
        total = laid.total
        if self.cfg.fail_after_bytes is not None and self._written + total > self.cfg.fail_after_bytes:
            raise _DiskFull("[test hook] " + os.strerror(errno.ENOSPC))
        tmp = self._reserve(total)
        if tmp is None:
            return  # over Cache.limit: what is cached stays, this entry is not added
        try:
            buffers = _buffers(laid, self.cfg.checksums)  # the checksum: only for an entry that has room
            fd = os.open(tmp, os.O_WRONLY)
            try:
                # One vectored write of the whole entry: the page cache then holds it in
                # large folios, which a later mapping sets up in a few page-table entries
                # (2 MiB ones where the kernel can) instead of one per 4 KiB page.
                _pwritev_all(fd, buffers, 0)
            finally:
                os.close(fd)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            try:
                os.link(tmp, final)  # atomic, and never replaces an entry another writer made
            except FileExistsError:
                self.store.release(total)
            except FileNotFoundError:
                self.store.release(total)  # the folder was evicted meanwhile
        except OSError as exc:
            self.store.release(total)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _DiskFull(os.strerror(exc.errno)) from None
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._written += total

    def _reserve(self, n: int) -> str | None:
        """A temp file holding ``n`` bytes of disk, counted; None if over the limit."""
        if self.cfg.limit is not None and n > self.cfg.limit:
            # Not a full cache: this entry could never fit, which would otherwise go unseen.
            if self.tag:
                _warn_once(self.cfg, f"small-{self.tag}",
                           f"Cache.limit ({self.cfg.limit:,} bytes) is smaller than a {self.tag} cache entry "
                           f"({n:,} bytes): such entries are never cached")
            else:
                _warn_once(self.cfg, "small",
                           f"Cache.limit ({self.cfg.limit:,} bytes) is smaller than a row group's cache entry "
                           f"({n:,} bytes): such row groups are never cached")
            return None
        return self.store.reserve(n, self.cfg.limit)


try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))  # buffers one call takes (1024 on Linux)
except (AttributeError, ValueError, OSError):  # pragma: no cover
    _IOV_MAX = 16  # the least POSIX allows
_HAS_PWRITEV = hasattr(os, "pwritev")


def _pwritev_all(fd: int, buffers: list[Any], at: int) -> None:
    """Write ``buffers`` back to back from offset ``at``, in as few calls as the system allows."""
    views = [v for v in (memoryview(b).cast("B") for b in buffers) if v.nbytes]
    i = 0
    while i < len(views):
        n = (os.pwritev(fd, views[i:i + _IOV_MAX], at) if _HAS_PWRITEV
             else os.pwrite(fd, views[i], at))  # pragma: no cover - platforms without pwritev
        if n <= 0:  # never for a regular file; a loop that never ends if it were
            raise OSError(errno.EIO, "a write to a cache entry made no progress")
        at += n
        while i < len(views) and n >= views[i].nbytes:  # skip what was written whole
            n -= views[i].nbytes
            i += 1
        if n:  # a short write ended inside this buffer
            views[i] = views[i][n:]
