"""One worker's handle on the row-group entries (`RowGroupCache`): `get` a row group's columns,
`settle` a deferred checksum, `put` a converted row group."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._types import Column, ColumnSpec
from .config import CacheConfig, _warn_once
from .entry import PendingCheck, _checked, _entry
from .format import _Corrupt, _serialize
from .kept import KeptMappings
from .keys import _entry_name, specs_key
from .mapping import _map
from .store import _Store
from .write import _Writer


class RowGroupCache:
    """One worker's handle on the cache: `get` a row group's columns or `put` them.

    ``kept``: the process's `KeptMappings` when workers share one (threads); by
    default the cache keeps its own, dropped by `close`.
    """

    def __init__(self, cfg: CacheConfig, specs: Sequence[ColumnSpec], null_fill: Mapping[str, Any],
                 kept: KeptMappings | None = None) -> None:
        self.cfg = cfg
        self.store = _Store(cfg.root)
        self.specs = [s for s in specs if not s.partition]
        self._ragged = any(s.kind == "ragged" for s in self.specs)
        self.specs_key = specs_key(specs, null_fill)
        self._writer = _Writer(cfg, self.store)
        self.hits = 0
        self.misses = 0
        self._own_kept = kept is None
        self.kept = KeptMappings(cfg.map_budget) if kept is None else kept

    @property
    def writes_on(self) -> bool:
        """False once a write failed (disk full, read-only): this worker writes no more."""
        return self._writer.writes_on

    def close(self) -> None:
        if self._own_kept:
            self.kept.close()

    def new_pass(self) -> None:
        """A process worker's own table: let go of entries deleted since (their disk space)."""
        if self._own_kept:
            self.kept.revalidate()

    def _path(self, obj: str, rg: int) -> str:
        return os.path.join(self.store.objects, obj, _entry_name(rg, self.specs_key))

    def path(self, obj: str, rg: int) -> str:
        """Where the entry of row group ``rg`` of object ``obj`` lies (it may not exist)."""
        return self._path(obj, rg)

    def _key(self, obj: str, rg: int) -> str:
        return f"{obj}/{_entry_name(rg, self.specs_key)}"

    def get(self, obj: str, rg: int, uri: str, *, defer: bool = False,
            rows: int | None = None) -> dict[str, Column] | None:
        """The row group's columns, or None. With ``defer``, a hit carries a `PendingCheck`
        that `settle` must pass before anything built from it is used. An entry whose
        columns do not hold ``rows`` rows (the plan's count) is discarded as damaged: the
        row group is read from the source again, whose own check then says what is wrong."""
        path = self._path(obj, rg)
        # Offsets of variable-length columns steer copies and sizes: those entries are
        # verified before use. A damaged fixed-width value only changes data, which the
        # deferred check catches before the block is handed over.
        defer = defer and not self._ragged and self.cfg.checksums
        try:
            kept = self.kept.get(path)
            mapping = kept.mapping if kept is not None else _map(path)
            if mapping is None:
                self.misses += 1
                return None
            entry = _entry(mapping, self._key(obj, rg), defer, kept, rows, verify=self.cfg.checksums)
            if entry is not kept:
                self.kept.offer(path, entry)
        except _Corrupt as exc:
            self._damaged(path, rg, uri, str(exc))
            self.misses += 1
            return None
        except OSError:
            self.kept.forget(path)
            self.misses += 1
            return None  # unreadable (EIO, permissions): read the source instead
        self.hits += 1
        return _checked(entry, path, defer)

    def settle(self, cols: Mapping[str, Column], rg: int, uri: str) -> bool:
        """Finish a deferred check; a damaged entry is discarded (and reported once)."""
        check: PendingCheck | None = getattr(cols, "check", None)
        if check is None or check.finish():
            return True
        self.hits -= 1
        self._damaged(check.path, rg, uri, "checksum mismatch")
        return False

    def _damaged(self, path: str, rg: int, uri: str, why: str) -> None:
        self.kept.forget(path)
        self.store.discard(path)
        _warn_once(self.cfg, "corrupt",
                   f"cache entry {path} (row group {rg} of {uri}) is damaged ({why}); it was "
                   "discarded and the row group read again. Further damaged entries are handled "
                   "the same way without another warning.")

    def put(self, obj: str, rg: int, cols: Mapping[str, Column], uri: str) -> None:
        self._writer.put(self._path(obj, rg),
                         lambda: _serialize(self._key(obj, rg), [(s.name, cols[s.name]) for s in self.specs]))
