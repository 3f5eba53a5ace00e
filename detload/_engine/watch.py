"""The stall/death watch: what the merger checks each time a wait for a worker's block times out.

A worker found dead becomes one `WorkerError` saying what it was doing; a live
worker whose status (pass, block, file, row group) did not change for
``stall_timeout`` seconds becomes a `WorkerStalledError` naming the read it is
in. The pool's side (how a death is described, `WorkerPool.check_usable` before
a pass) lives in pool.py; the statuses are written by the workers (worker.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from .._read.reader import _file_changed, _stat_matches
from ..errors import DataError, DetloadError, WorkerError, WorkerStalledError

if TYPE_CHECKING:
    from .pool import WorkerPool

__all__ = ["Watch"]

StatusTuple = tuple[int, int, int, int]  # pass number, block k, file index, row group (-1: idle)


class Watch:
    """Watches the worker the merger of pass ``gen`` waits for, one block at a time.

    `expect` starts the watch of a block; after each empty wait, `dead` says whether
    the worker is gone (then `death` is the error, once what it sent before it went
    was read) and otherwise `progress` raises when it has stalled.
    """

    def __init__(self, pool: WorkerPool, gen: int, stall_timeout: float | None) -> None:
        self.pool = pool
        self.gen = gen
        self.stall_timeout = stall_timeout
        self._last: StatusTuple = (0, -1, -1, -1)
        self._seen: StatusTuple = self._last
        self._deadline: float | None = None

    def _restart(self) -> None:
        self._deadline = time.monotonic() + self.stall_timeout if self.stall_timeout else None

    def expect(self, w: int) -> None:
        """The merger starts waiting for worker ``w``'s next block."""
        self._last = self._seen = self.pool.statuses[w].get()
        self._restart()

    def dead(self, w: int) -> bool:
        """After an empty wait: read worker ``w``'s status, and whether the worker is gone."""
        self._seen = self.pool.statuses[w].get()
        return not self.pool.alive(w)

    def progress(self, w: int, k: int) -> None:
        """After an empty wait for live worker ``w``'s block ``k``: `WorkerStalledError` if its
        status has not changed for ``stall_timeout`` seconds."""
        st = self._seen
        if st != self._last:
            self._last = st
            self._restart()
        elif self._deadline is not None and time.monotonic() > self._deadline:
            raise WorkerStalledError(
                f"worker {w} made no progress for {self.stall_timeout:g} s on block {k} "
                f"({self._where(st)}). A stalled read (network, disk)? Raise "
                "it with pool=detload.Pool(stall_timeout=...), or stall_timeout=None to wait forever.",
                worker=w, unit=self._unit(st),
            ) from None

    def death(self, w: int, k: int | None = None) -> DetloadError:
        """The error for worker ``w``, found dead while the merger waited for its block ``k``
        (None: the unordered benchmark merge, which waits for no block in particular)."""
        shrunk = self._shrunk_under_map(w)
        if shrunk is not None:
            return shrunk
        if k is None:
            return WorkerError(f"{self.pool.describe_death(w)}", worker=w)
        st = self._seen
        u = self._unit(st)
        if u is None:
            doing = f"waiting to produce block {k} (between row groups)"
        elif st[0] == self.gen:
            doing = f"producing block {st[1]} (reading {u[0]} row group {u[1]})"
        else:
            # A read it had started for another pass (one built ahead that this pass did not use).
            which = "an earlier pass" if st[0] < self.gen else "the next pass"
            doing = f"reading {u[0]} row group {u[1]} for a block of {which}"
        return WorkerError(
            f"{self.pool.describe_death(w)} while {doing}; block {k} is the first of this pass it "
            "did not hand over. Every batch yielded before this error is intact.",
            worker=w, unit=u,
        )

    def _shrunk_under_map(self, w: int) -> DataError | None:
        """The file change a SIGBUS death stands for: a worker process reading a file through a
        memory map dies when the file shrinks under the map (rewritten in place) during the read,
        before any check could see it. Reported as that change, as a plain read's error would be;
        None when the file still matches the plan (another cause: see describe_death)."""
        pool = self.pool
        if pool.kind != "process" or pool.cfg.memory_map is False or not pool.killed_by_sigbus(w):
            return None
        _, _, f, rg = pool.statuses[w].get()
        if f < 0:
            return None
        ref = pool.cfg.files[f]
        try:
            now = pool.cfg.filesystem.get_file_info(ref.location)  # a local file: only those are mapped
        except OSError:
            return None
        if now.type == pafs.FileType.NotFound or _stat_matches(now, ref):
            return None
        saw = f", the plan saw {ref.size:,}" if ref.size is not None else ""
        return _file_changed(ref, rg, f": it holds {now.size:,} bytes{saw}; worker process {w} was reading it "
                                      "through a memory map and was killed by SIGBUS as it shrank, so this loader "
                                      "cannot iterate again")

    def _unit(self, st: StatusTuple) -> tuple[str, int] | None:
        _, _, f, rg = st
        return (self.pool.cfg.files[f].path, rg) if f >= 0 else None

    def _where(self, st: StatusTuple) -> str:
        u = self._unit(st)
        where = f"reading {u[0]} row group {u[1]}" if u else "between row groups"
        if st[0] != self.gen and u:
            # A block of another pass (one built ahead that this pass did not use): the
            # worker drops it only after the read it is in returns.
            where += ", for a block of another pass that it must finish first"
        return where
