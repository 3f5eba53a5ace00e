"""Mapped entries kept from one pass to the next (`KeptMappings`), within a byte budget and under
the process's cap on memory areas (vm.max_map_count)."""

from __future__ import annotations

import os
import threading

from .entry import _Entry


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530  # Linux's default


# Kept mappings of every table in this process: each is one memory area, and
# vm.max_map_count caps those per process, whatever the loaders.
_KEPT_COUNT = [0]
_KEPT_COUNT_LOCK = threading.Lock()


class KeptMappings:
    """The cache entries one process keeps mapped from one pass to the next.

    Mapping an entry anew each epoch cost page-table work for every 4 KiB page
    -- the faults during the first read and the unmapping after it -- which was
    about a quarter of a warm CTR block's CPU time. Up to ``budget`` bytes are
    kept; the first ones mapped stay (like the entries under ``Cache.limit``).
    Each mapping is one of the process's memory areas, which Linux caps
    (``vm.max_map_count``, 65,530 by default), so the tables of one process keep
    at most a quarter of that many together. Thread workers share their loader's
    table, so each entry is mapped once per loader. A kept mapping is used only
    while its path still names the same file, and its checksum is verified on
    every read as before, so a deleted, replaced or damaged entry is treated
    exactly as without it.
    """

    def __init__(self, budget: int, max_count: int | None = None) -> None:
        self.budget = budget
        self.max_count = _max_map_count() // 4 if max_count is None else max_count
        self.nbytes = 0
        self._kept: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, path: str) -> _Entry | None:
        """The kept entry of ``path`` if the name still holds that file (a stat, ~2 us)."""
        k = self._kept.get(path)
        if k is None or not self._still_there(path, k):
            return None
        return k

    def _still_there(self, path: str, k: _Entry) -> bool:
        m = k.mapping
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != m.ident or st.st_size != m.size:
            self.forget(path)  # deleted (evicted, cleared, found damaged) or written anew
            return False
        return True

    def revalidate(self) -> None:
        """Drop the entries whose file is gone or replaced, so that their disk space is freed
        now rather than when this process next reads them (process workers: a few epochs on)."""
        for path, k in list(self._kept.items()):
            self._still_there(path, k)

    def offer(self, path: str, kept: _Entry) -> None:
        """Keep ``kept`` (in place of an older mapping of ``path``) if it fits."""
        size = kept.mapping.size
        with self._lock:
            self._drop(path)
            if self._closed or self.nbytes + size > self.budget:
                return
            with _KEPT_COUNT_LOCK:
                if _KEPT_COUNT[0] >= self.max_count:
                    return
                _KEPT_COUNT[0] += 1
            self._kept[path] = kept
            self.nbytes += size

    def _drop(self, path: str) -> None:  # under self._lock
        k = self._kept.pop(path, None)
        if k is not None:
            self.nbytes -= k.mapping.size
            with _KEPT_COUNT_LOCK:
                _KEPT_COUNT[0] -= 1

    def forget(self, path: str) -> None:
        with self._lock:
            self._drop(path)

    def close(self) -> None:
        """Drop every kept mapping (each goes when the last view of it does); keep no more."""
        with self._lock:
            self._closed = True
            for path in list(self._kept):
                self._drop(path)
