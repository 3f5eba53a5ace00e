"""``group_by`` in the workers and the merger: a block's group order, the group-column check, packed batches.

A grouped block's rows are laid out group by group (`block_order`), so the merger can cut
micro-batches at group starts the plan knows (`Plan.group_bounds`). The worker checks
that each group column is constant within every group, bitwise, on the block's ranges
before the permutation (`check_constant`), then builds the item columns for every row and
the group columns once per group (`build_grouped`); the merger cuts pieces of such blocks
(`block_piece`) and makes each micro-batch a `Packed` (`pack`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import xxhash

from .._cache.derived import DerivedStore
from .._read import UnitReader
from .._streams import block_permutation, group_permutation, group_row_order
from .._types import Column, ColumnSpec, Ragged, UnitColumns
from ..errors import DataError
from ..packed import Packed
from ..plan import Range
from .block import ColumnSlot, Layout, assemble, slice_rows, take_rows
from .block import _aligned as aligned
from .config import WorkerConfig
from .messages import Task, Timings

__all__ = ["GroupRows", "block_order", "block_piece", "build_grouped", "check_compact", "check_constant", "group_rows",
           "pack"]

# Rows compared at once: bounds the check's temporaries (rows x row bytes of one column).
_CHUNK = 8192


def block_order(task: Task) -> np.ndarray | None:
    """The block's row permutation: whole groups in the groups stream's order when the task
    has groups, else the rows stream's; None without shuffling (the stored order)."""
    if not task.shuffle:
        return None
    if not task.groups:
        return block_permutation(task.seed, task.epoch, task.partition, task.number, task.rows)
    starts = np.asarray(task.groups, dtype=np.int64)
    order = group_permutation(task.seed, task.epoch, task.partition, task.number, len(starts))
    return group_row_order(starts, task.rows, order)


def _row_bytes(a: np.ndarray) -> np.ndarray:
    """Each row of ``a`` as a row of unsigned words, so that comparing them is bitwise (NaN
    equals NaN); the widest word that divides a row, so a wide row is few comparisons."""
    a = np.ascontiguousarray(a)
    width = a.dtype.itemsize * (a.size // len(a) if len(a) else 0)
    word = next((w for w in (8, 4, 2) if width % w == 0), 1) if width else 1
    return a.reshape(len(a), -1).view(f"u{word}") if width else a.reshape(len(a), 0).view(np.uint8)


def _rows(col: Column) -> int:
    return len(col.offsets) - 1 if isinstance(col, Ragged) else len(col)


def _flat(col: Ragged) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a variable-length column whose rows compare as its rows' bytes: a
    list of strings encodes each row as its strings' int64 lengths and bytes, in turn (two rows
    are equal exactly when their encodings are), other columns are their own values."""
    items = col.values
    if not isinstance(items, Ragged):
        return items, col.offsets
    assert isinstance(items.values, np.ndarray)
    lengths = np.diff(items.offsets).astype("<i8")
    n = lengths.shape[0]
    at = np.zeros(n + 1, dtype=np.int64)  # where each string's encoding starts
    np.cumsum(lengths + 8, out=at[1:])
    out = np.empty(int(at[-1]), dtype=np.uint8)
    out[(at[:-1, None] + np.arange(8)).reshape(-1)] = lengths.view(np.uint8)
    nbytes = int(items.offsets[-1]) - int(items.offsets[0])
    if nbytes:
        starts = at[:-1] + 8 - (items.offsets[:-1] - items.offsets[0])
        dest = np.arange(nbytes, dtype=np.int64) + np.repeat(starts, lengths)
        out[dest] = items.values[int(items.offsets[0]) : int(items.offsets[-1])]
    return out, at[col.offsets]


def _row_value(col: Column, r: int) -> bytes:
    if isinstance(col, Ragged):
        if isinstance(col.values, Ragged):  # a list of strings: encode this row alone
            row = slice_rows(col, r, r + 1)
            assert isinstance(row, Ragged)
            return _flat(row)[0].tobytes()
        values, offsets = col.values, col.offsets
        # tobytes, not a reshape to (n, -1): a row group whose values are all empty ("" or [])
        # has no values to reshape, and -1 is undefined for it.
        return np.ascontiguousarray(values[int(offsets[r]) : int(offsets[r + 1])]).tobytes()
    return np.ascontiguousarray(col[r : r + 1]).tobytes()


def _ragged_diffs(col: Ragged, is_start: np.ndarray) -> np.ndarray:
    """For rows 1..n-1 of a variable-length column: differs from the row before, inside a group."""
    n = len(is_start)
    vals, offs = _flat(col)
    offs = offs.astype(np.int64)  # into ``values`` as they are
    lengths = np.diff(offs)
    bad = (lengths[1:] != lengths[:-1]) & ~is_start[1:]
    if vals.size:
        vb = vals.reshape(len(vals), -1).view(np.uint8)
        row = np.repeat(np.arange(n, dtype=np.int64), lengths)
        k = np.arange(len(row), dtype=np.int64) + int(offs[0])
        inner = ~is_start[row] & (row > 0)  # row 0 has no row before it here
        inner[inner] &= lengths[row[inner]] == lengths[row[inner] - 1]
        kk = k[inner]
        if kk.size:
            diff = (vb[kk] != vb[kk - lengths[row[kk]]]).any(axis=1)
            if diff.any():
                bad[row[kk[np.flatnonzero(diff)]] - 1] = True
    return bad


def _first_change(col: Column, is_start: np.ndarray) -> int | None:
    """The first row that differs from the row before it inside one group, or None."""
    n = len(is_start)
    if isinstance(col, Ragged):
        hits = np.flatnonzero(_ragged_diffs(col, is_start))
        return int(hits[0]) + 1 if hits.size else None
    b = _row_bytes(col)
    for lo in range(1, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        neq = (b[lo:hi] != b[lo - 1 : hi - 1]).any(axis=1) & ~is_start[lo:hi]
        hits = np.flatnonzero(neq)
        if hits.size:
            return lo + int(hits[0])
    return None


def _run_starts(key: Column) -> np.ndarray:
    """The first row of each run of equal adjacent values (bitwise) of a key column."""
    n = _rows(key)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    none = np.zeros(n, dtype=bool)
    if isinstance(key, Ragged):
        change = _ragged_diffs(key, none)
    else:
        b = _row_bytes(key)
        change = (b[1:] != b[:-1]).any(axis=1)
    return np.concatenate([[0], np.flatnonzero(change) + 1]).astype(np.int64)


def check_key_kept(cfg: WorkerConfig, before: Mapping[str, Column], after: Mapping[str, Column],
                   file: int, row_group: int) -> None:
    """DataError unless a transform kept the group key of a row group bitwise (group_by: the
    groups were planned from the stored key, so a transform may not move, add or drop rows)."""
    key = cfg.group_by
    if key is None:
        return
    a, b = before[key], after.get(key)

    def same(x: Column, y: Column | None) -> bool:
        if isinstance(x, Ragged) or isinstance(y, Ragged):
            return (isinstance(x, Ragged) and isinstance(y, Ragged) and np.array_equal(x.offsets, y.offsets)
                    and _bits(_flat(x)[0]) == _bits(_flat(y)[0]))
        return y is not None and x.shape == y.shape and x.dtype == y.dtype and _bits(x) == _bits(y)

    if not same(a, b):
        raise DataError(
            f"the transform {'dropped' if b is None else 'changed'} the group key {key!r} of {cfg.files[file].path} row group {row_group}: "
            "under group_by= a transform must keep the key column and every row, in order "
            "(groups are planned from the stored key)")


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def check_constant(cfg: WorkerConfig, task: Task, units: Sequence[Mapping[str, Column]]) -> None:
    """DataError if a group column changes inside a group of the block's ranges ``units``
    (its rows before the permutation: a group may run from one range into the next)."""
    if not task.groups or not cfg.group_columns or cfg.group_by is None:
        return
    starts = np.asarray(task.groups, dtype=np.int64)
    pos = 0
    prev = units[0]
    for u, rng in zip(units, task.units):
        n = rng.rows
        local = starts[(starts >= pos) & (starts < pos + n)] - pos
        is_start = np.zeros(n, dtype=bool)
        is_start[local] = True
        seen = _Verdicts.of(cfg, rng, local)
        for name in cfg.group_columns:
            col = u[name]
            r = None if seen.ok else _first_change(col, is_start)
            if r is None and pos and not is_start[0] and _row_value(col, 0) != _row_value(prev[name], _rows(prev[name]) - 1):
                r = 0  # the group runs on from the range before, with another value
            if r is not None:
                before = (col, r - 1) if r else (prev[name], _rows(prev[name]) - 1)
                _raise_change(cfg, name, u[cfg.group_by], r, cfg.files[rng.file].path, rng.row_group,
                              (*before, col, r))
        seen.passed()
        prev = u
        pos += n


class _Verdicts:
    """Ranges whose group columns were found constant, so later epochs need not compare them again.

    The verdict is a pure function of the row group's bytes (its file version), the key and
    group columns (with their specs and null fills), and the group starts inside the range,
    which together name it. It is kept
    in this process (every epoch after the first) and, with a cache, as a derived entry, so
    that a warm loader in a new process skips the comparison too.
    """

    # Keyed by the cache folder too ("" without one): a verdict found in this process must still
    # be written into every other cache it is checked under, or that cache is not warm.
    _memo: set[tuple[str, str, int, str]] = set()
    _stores: dict[str, DerivedStore] = {}
    _MAX = 1 << 20

    def __init__(self, cfg: WorkerConfig, key: tuple[str, int, str], ok: bool, cached: bool = False) -> None:
        self.cfg, self.key, self.ok, self.cached = cfg, key, ok, cached

    @classmethod
    def of(cls, cfg: WorkerConfig, rng: Range, local: np.ndarray) -> _Verdicts:
        ref = cfg.files[rng.file]
        sel = cfg.selections.get((rng.file, rng.row_group)) if cfg.selections else None
        h = xxhash.xxh3_128()
        h.update(f"{cfg.group_by}\x00{chr(0).join(cfg.group_columns)}\x00{rng.first}\x00{rng.rows}\x00".encode())
        h.update(np.ascontiguousarray(local, dtype="<i8").tobytes())
        # How the compared columns are delivered: a cast or a null fill decides whether they are
        # constant (null, 0.0 is constant filled with 0.0, not with NaN).
        gset = set(cfg.group_columns)
        fills = sorted((n, repr(cfg.null_fill[n])) for n in gset if n in cfg.null_fill)
        h.update(f"{[s for s in cfg.block_specs if s.name in gset]!r}\x00{fills!r}\x00".encode())
        if sel is not None:
            h.update(np.ascontiguousarray(sel.indices(), dtype="<i8").tobytes())
        xf = cfg.transform
        if xf is not None:
            # The columns checked are the transform's output: a verdict holds for its identity
            # only, and never for a random or unversioned one (its output may differ next time).
            if xf.transform.random or xf.transform.bare:
                key = (ref.cache_key or ref.path, rng.row_group, "")
                return cls(cfg, key, False, False)
            # Its output may depend on the file's place (ctx.file_index, ctx.file).
            h.update(f"\x00{xf.identity}\x00{rng.file}\x00{ref.path}".encode())
        key = (ref.cache_key or ref.path, rng.row_group, "groupcheck/2/" + h.hexdigest())
        if cls._memo_key(cfg, key) in cls._memo:
            return cls(cfg, key, True)
        store = cls._store(cfg)
        if store is not None and ref.cache_key and store.get_bytes(ref.cache_key, rng.row_group, key[2]) == b"ok":
            cls._remember(cls._memo_key(cfg, key))
            return cls(cfg, key, True)
        return cls(cfg, key, False, bool(ref.cache_key))

    @classmethod
    def _store(cls, cfg: WorkerConfig) -> DerivedStore | None:
        if cfg.cache is None:
            return None
        store = cls._stores.get(cfg.cache.root)
        if store is None:
            store = cls._stores[cfg.cache.root] = DerivedStore(cfg.cache)
        return store

    @staticmethod
    def _memo_key(cfg: WorkerConfig, key: tuple[str, int, str]) -> tuple[str, str, int, str]:
        return (cfg.cache.root if cfg.cache is not None else "", *key)

    @classmethod
    def _remember(cls, key: tuple[str, str, int, str]) -> None:
        if len(cls._memo) >= cls._MAX:
            cls._memo.clear()
        cls._memo.add(key)

    def passed(self) -> None:
        if self.ok or not self.key[2]:  # no identity: nothing to remember
            return
        self._remember(self._memo_key(self.cfg, self.key))
        store = self._store(self.cfg)
        if store is not None and self.cached:
            store.put_bytes(self.key[0], self.key[1], self.key[2], b"ok")


class GroupRows(NamedTuple):
    """A row group's group columns once per run of its key (stored rows), as the cache keeps them,
    and how a range's delivered rows map onto them (the filter's selection, the range's first row)."""

    starts: np.ndarray  # int64: the first stored row of each run
    cols: dict[str, Column]  # each group column, one row per run
    picked: np.ndarray | None  # the stored rows the row group delivers (None: all)
    first: int  # the range's first delivered row

    def runs(self, rows: int) -> np.ndarray:
        """The run of each of the range's ``rows`` delivered rows."""
        d = np.arange(self.first, self.first + rows, dtype=np.int64)
        stored = self.picked[d] if self.picked is not None else d
        return np.searchsorted(self.starts, stored, side="right") - 1


def _compact_identity(cfg: WorkerConfig) -> str:
    # What decides the compacted rows besides the file version: the key and how each group
    # column is delivered (its spec, and its null fill).
    fills = {s.name: repr(cfg.null_fill[s.name]) for s in cfg.group_specs if s.name in cfg.null_fill}
    return f"grouprows/1/{cfg.group_by}/{cfg.group_specs!r}/{sorted(fills.items())!r}"


def group_rows(cfg: WorkerConfig, f: int, rg: int, selection: Any, first: int, t: Timings) -> GroupRows:
    """The group columns of row group ``rg`` once per key run: from the cache's derived entry, or
    read (those columns only), checked constant within every run, compacted and kept there.
    ``selection``: the filter's selection of the row group (its ``indices()``), or None."""
    picked = selection.indices() if selection is not None else None
    ref = cfg.files[f]
    store = _Verdicts._store(cfg)
    ident = _compact_identity(cfg)
    got = store.get(ref.cache_key, rg, ident) if store is not None and ref.cache_key else None
    names = [s.name for s in cfg.group_specs]
    if got is not None and isinstance(got.get("starts"), np.ndarray) and all(f"c/{n}" in got for n in names):
        return GroupRows(np.asarray(got["starts"], dtype=np.int64), {n: got[f"c/{n}"] for n in names}, picked, first)
    reader = UnitReader(dataclasses.replace(cfg, specs=cfg.group_specs, cache=None, group_specs=()))
    try:
        full = reader.read(f, rg, t)
    finally:
        reader.close()
    assert cfg.group_by is not None
    starts = _run_starts(full[cfg.group_by])
    is_start = np.zeros(_rows(full[cfg.group_by]), dtype=bool)
    is_start[starts] = True
    for name in names:
        r = _first_change(full[name], is_start)
        if r is not None:
            _raise_change(cfg, name, full[cfg.group_by], r, ref.path, rg, (full[name], r - 1, full[name], r))
    cols = {n: take_rows(full[n], starts) for n in names}
    if store is not None and ref.cache_key:
        store.put(ref.cache_key, rg, ident, {"starts": starts, **{f"c/{n}": c for n, c in cols.items()}})
    return GroupRows(starts, cols, picked, first)


def _nan_bits(pair: tuple[Column, int, Column, int] | None) -> str:
    """', two NaNs with different bits (0x..., 0x...)' when the two values that differ are NaNs
    (an arithmetic NaN has its sign bit set, numpy.nan not), else ''."""
    if pair is None:
        return ""
    a, i, b, j = pair
    if isinstance(a, Ragged) or isinstance(b, Ragged) or a.dtype.kind != "f" or a[i : i + 1].size != 1:
        return ""
    x, y = a[i : i + 1], b[j : j + 1]
    if not (np.isnan(x).all() and np.isnan(y).all()):
        return ""
    u = f"u{a.dtype.itemsize}"
    return (f": two NaNs with different bits (0x{int(x.view(u)[0]):0{2 * a.dtype.itemsize}x}, "
            f"0x{int(y.view(u)[0]):0{2 * a.dtype.itemsize}x}), which one group row cannot both give back")


def _raise_change(cfg: WorkerConfig, name: str, key: Column, r: int, path: str, rg: int,
                  pair: tuple[Column, int, Column, int] | None = None) -> None:
    """``pair``: the two values that differ (column, row, column, row), to name NaNs whose bits differ."""
    value: Any = _row_value(key, r) if isinstance(key, Ragged) else key[r]
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(key, Ragged) and key.kind == "utf8":
        value = value.decode("utf-8", "replace")
    raise DataError(
        f"group column {name!r} is not constant within group {cfg.group_by}={value!r}: it changes in "
        f"{path} row group {rg} (compared bitwise, so NaN equals NaN{_nan_bits(pair)}). "
        f"Group columns must hold one value per group; leave {name!r} out of group_columns")


def check_compact(cfg: WorkerConfig, task: Task, parts: Sequence[GroupRows]) -> None:
    """DataError if a delivered group takes its rows from key runs whose group rows differ:
    runs that a selection joined, or a group that runs on into the next row group."""
    starts = np.asarray(task.groups, dtype=np.int64)
    names = [s.name for s in cfg.group_specs]
    assert cfg.group_by is not None
    pos = 0
    prev: tuple[GroupRows, int] | None = None
    for gp, rng in zip(parts, task.units):
        n = rng.rows
        run = gp.runs(n)
        is_start = np.zeros(n, dtype=bool)
        is_start[starts[(starts >= pos) & (starts < pos + n)] - pos] = True
        pairs = [(gp, int(run[r - 1]), gp, int(run[r])) for r in
                 (np.flatnonzero((run[1:] != run[:-1]) & ~is_start[1:]) + 1).tolist()]
        if prev is not None and not is_start[0]:
            pairs.insert(0, (prev[0], prev[1], gp, int(run[0])))
        for a, i, b, j in pairs:
            for name in names:
                if _row_value(a.cols[name], i) != _row_value(b.cols[name], j):
                    _raise_change(cfg, name, b.cols[cfg.group_by], j, cfg.files[rng.file].path, rng.row_group,
                                  (a.cols[name], i, b.cols[name], j))
        prev = (gp, int(run[-1]))
        pos += n


def build_grouped(cfg: WorkerConfig, task: Task, units: Sequence[UnitColumns], perm: np.ndarray | None,
                  allocate: Callable[[int], np.ndarray], parts: Sequence[GroupRows] | None = None
                  ) -> tuple[np.ndarray, Layout]:
    """A grouped block in one buffer: the item columns for every row (in ``perm`` order), then
    the group columns once per group (each group's first row, groups in the permuted order).

    The group part is assembled first (it is small) and copied in behind the items, so the
    block is one allocation, as every block is.
    """
    if parts is not None:  # the group columns come compacted (group_rows), not with the items
        item_specs, group_specs = tuple(cfg.block_specs), tuple(cfg.group_specs)
    else:
        gset = set(cfg.group_columns)
        item_specs = tuple(s for s in cfg.block_specs if s.name not in gset)
        group_specs = tuple(s for s in cfg.block_specs if s.name in gset)
    starts = np.asarray(task.groups, dtype=np.int64)
    order = (group_permutation(task.seed, task.epoch, task.partition, task.number, len(starts))
             if task.shuffle else None)
    firsts: list[UnitColumns] = []
    pos = 0
    for i, (u, rng) in enumerate(zip(units, task.units)):
        local = starts[(starts >= pos) & (starts < pos + rng.rows)] - pos
        if parts is not None:
            runs = parts[i].runs(rng.rows)[local]
            firsts.append(UnitColumns({s.name: take_rows(parts[i].cols[s.name], runs) for s in group_specs}))
        else:
            firsts.append(UnitColumns({s.name: take_rows(u[s.name], local) for s in group_specs}))
        pos += rng.rows
    gbuf, glayout = assemble(_specs_key(group_specs), firsts, order, lambda n: np.empty(n, dtype=np.uint8))
    held: list[np.ndarray] = []

    def alloc_items(n: int) -> np.ndarray:
        whole = allocate(aligned(n) + glayout.nbytes)
        held.append(whole)
        return whole[:n]

    _, ilayout = assemble(_specs_key(item_specs), units, perm, alloc_items)
    (whole,) = held
    at = aligned(ilayout.nbytes)
    whole[at : at + glayout.nbytes] = gbuf
    cols = ilayout.columns + tuple(_shifted(c, at) for c in glayout.columns)
    return whole, Layout(task.rows, at + glayout.nbytes, cols)


# The same tuple object for the same specs: the assembler caches layouts by its identity.
_SPECS: dict[tuple[ColumnSpec, ...], tuple[ColumnSpec, ...]] = {}


def _specs_key(specs: tuple[ColumnSpec, ...]) -> tuple[ColumnSpec, ...]:
    return _SPECS.setdefault(specs, specs)


def _shifted(c: ColumnSlot, by: int) -> ColumnSlot:
    return c._replace(data=c.data._replace(offset=c.data.offset + by),
                      offsets=c.offsets._replace(offset=c.offsets.offset + by) if c.offsets is not None else None,
                      item_offsets=(c.item_offsets._replace(offset=c.item_offsets.offset + by)
                                    if c.item_offsets is not None else None))


def block_piece(cols: Mapping[str, Column], lo: int, hi: int, g_lo: int, g_hi: int, group_columns: Sequence[str]
                ) -> tuple[dict[str, Column], dict[str, Column]]:
    """Rows ``[lo, hi)`` of a grouped block (built by `build_grouped`): its item columns' rows
    and its group columns' groups ``[g_lo, g_hi)``, all views."""
    gset = set(group_columns)
    items = {k: (c[lo:hi] if type(c) is np.ndarray else slice_rows(c, lo, hi)) for k, c in cols.items() if k not in gset}
    groups = {k: slice_rows(cols[k], g_lo, g_hi) for k in group_columns}
    return items, groups


def pack(items: dict[str, Column], groups: dict[str, Column], offsets: np.ndarray,
         order: Sequence[str]) -> Packed:
    """The `Packed` of item columns, group columns and group offsets; ``order``: the flat
    column order `Packed.unpack` gives back."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    counts = np.diff(offsets)
    index = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return Packed(items, groups, index, offsets, tuple(order))
