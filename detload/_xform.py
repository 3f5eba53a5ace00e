"""Running a `Transform`: the `TransformRunner` that applies it to a row group after the filter's
selection, checks its output and keeps it in the cache, and the `TransformPlan` it runs.

Workers run it on every row group of a block; planning (detload.planning.transform) runs it on
the first row group for the output schema, and on every one for ``rows="changes"`` counts.

Order of operations on one row group (docs/transforms.md): read (or cache hit), selection,
transform, then the plan's range cut and the block's permutation. The transform therefore
sees the same input for a row group whatever the partitions, world size or epoch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._cache.keys import _derived_name
from ._cache.rowgroups import RowGroupCache
from ._filters.selection import Selection
from ._types import Column, ColumnSpec, ItemKind, Ragged, UnitColumns
from .errors import DataError
from .transform import Transform, TransformContext

__all__ = ["TransformFailed", "TransformPlan", "TransformRunner", "check_output", "output_specs"]

#: Bumped when what a cached transform output holds changes for the same identity.
OUTPUT_FORMAT = 1


class TransformFailed(RuntimeError):
    """The user's function raised (carried to the consumer as a WorkerError naming the unit)."""


@dataclass(frozen=True)
class TransformPlan:
    """What a worker needs to run the transform (plain picklable data and the `Transform`).

    ``specs``: the delivered columns (the output schema, from the first row group);
    ``identity``: the cache identity of its output, less the file's place and the selection; ``counts``: for
    ``rows="changes"``, each row group's planned output rows; ``selection_ids``: the
    filter's selection name per (file, row group) that has one; ``cached``: output is kept.
    """

    transform: Transform
    specs: tuple[ColumnSpec, ...]
    identity: str
    cached: bool
    counts: Mapping[tuple[int, int], int] | None = None
    selection_ids: Mapping[tuple[int, int], str] = field(default_factory=dict)

    def cache_identity(self, f: int, path: str, rg: int) -> str:
        # ctx.file_index and ctx.file are the function's input as much as the columns: a file
        # that moves in the canonical order, or is reached from another root, gets other entries.
        return f"{self.identity}/{json.dumps([f, path])}/{self.selection_ids.get((f, rg), '')}"


# -- output checks ----------------------------------------------------------------------

def _where(path: str, rg: int) -> str:
    return f"{path} row group {rg}"


def _kind(c: Column) -> str:
    if isinstance(c, Ragged):
        if isinstance(c.values, Ragged):
            return f"Ragged[{c.kind}] of {_kind(c.values)}"
        return f"Ragged[{c.kind}] of {c.values.dtype}"
    shape = "".join(f" x {n}" for n in c.shape[1:])
    return f"{c.dtype}{' (rows' + shape + ')' if shape else ''}"


def _spec_of(name: str, c: Column) -> ColumnSpec:
    if isinstance(c, Ragged):
        if isinstance(c.values, Ragged):  # a list of strings (checked: its items are utf8 or binary)
            item: ItemKind = "utf8" if c.values.kind == "utf8" else "binary"
            return ColumnSpec(name, "transform", "ragged", "|u1", (), c.kind, item_kind=item)
        return ColumnSpec(name, "transform", "ragged", np.dtype(c.values.dtype).str, (), c.kind)
    return ColumnSpec(name, "transform", "fixed", np.dtype(c.dtype).str, tuple(int(n) for n in c.shape[1:]))


def _check_column(t: Transform, name: Any, c: Any, where: str) -> int:
    """Rows of one returned column; DataError if it is not a column detload can deliver."""
    if not isinstance(name, str):
        raise DataError(f"transform {t.name!r} returned a column named {name!r} ({type(name).__name__}) for "
                        f"{where}; column names must be str")
    if isinstance(c, Ragged) and isinstance(c.values, Ragged):
        items = c.values
        if c.kind != "list" or items.kind not in ("utf8", "binary") or isinstance(items.values, Ragged):
            raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as a Ragged whose values "
                            f"are a Ragged ({_kind(c)}); the only nested Ragged is a list of strings: a "
                            "Ragged of kind 'list' over a Ragged of kind 'utf8' or 'binary' with uint8 values")
        n_items = _check_column(t, name, items, where)
        offs = c.offsets
        if not isinstance(offs, np.ndarray) or offs.dtype != np.int64 or offs.ndim != 1 or offs.shape[0] < 1 or (
                offs[0] != 0) or offs[-1] != n_items or (offs.shape[0] > 1 and (np.diff(offs) < 0).any()):
            raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as a list of strings with "
                            "bad row offsets: they must be 1-D int64, start at 0, never decrease and end at "
                            "the number of strings (len(values))")
        return len(c)
    if isinstance(c, Ragged):
        offs, vals = c.offsets, c.values
        if not (isinstance(offs, np.ndarray) and isinstance(vals, np.ndarray)) or vals.dtype.hasobject:
            raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as a Ragged whose values "
                            "and offsets are not NumPy arrays of numbers")
        # detload's layout (shared memory, the cache, hashing) is 1-D values of numbers;
        # anything else would fail later, in block assembly, without naming the transform.
        if vals.ndim != 1:
            shape = f" ({vals.dtype}, shape {vals.shape})" if vals.ndim else ""
            raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as a Ragged whose values "
                            f"are {vals.ndim}-D{shape}; a Ragged's values are 1-D (a list of fixed-size rows: a "
                            "fixed column of shape (rows, n), or flatten the values and scale the offsets)")
        if c.kind not in ("list", "utf8", "binary"):
            raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as a Ragged of kind "
                            f"{c.kind!r}; the kinds are 'list', 'utf8' and 'binary'")
        if vals.dtype.kind in "UV":
            raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as a Ragged whose values "
                            f"are an array of dtype {vals.dtype}; values are numbers, bools or datetimes (text "
                            "as a Ragged of uint8 values)")
        if c.kind != "list" and vals.dtype != np.uint8:
            raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as a Ragged[{c.kind}] of "
                            f"{vals.dtype} values; text and bytes are uint8 values (e.g. np.frombuffer(b, np.uint8))")
        if offs.dtype != np.int64 or offs.ndim != 1 or offs.shape[0] < 1 or offs[0] != 0 or (
                offs[-1] != vals.shape[0]) or (offs.shape[0] > 1 and (np.diff(offs) < 0).any()):
            raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as a Ragged with bad "
                            "offsets: they must be 1-D int64, start at 0, never decrease and end at "
                            "len(values)")
        return len(c)
    if not isinstance(c, np.ndarray):
        raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as {type(c).__name__}; "
                        "every column must be a NumPy array or a detload.Ragged")
    if c.dtype.hasobject or c.ndim == 0 or c.dtype.kind in "UV":
        what = "a 0-d array" if c.ndim == 0 else f"an array of dtype {c.dtype}"
        raise DataError(f"transform {t.name!r} returned column {name!r} for {where} as {what}; detload "
                        "delivers arrays with a row axis of numbers, bools or datetimes (text as a "
                        "Ragged of uint8 values)")
    return int(c.shape[0])


def check_output(t: Transform, out: Any, where: str, specs: Sequence[ColumnSpec] | None) -> UnitColumns:
    """The returned dict as columns, checked: a dict of arrays of one length, with the dtypes of
    ``specs`` (the first row group's) when given. Raises DataError naming what is wrong."""
    if not isinstance(out, Mapping):
        raise DataError(f"transform {t.name!r} returned {type(out).__name__} for {where}; it must return a dict "
                        "{column name: ndarray | detload.Ragged}")
    if not out:
        raise DataError(f"transform {t.name!r} returned no column for {where}")
    lengths = {name: _check_column(t, name, c, where) for name, c in out.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k!r} has {n:,}" for k, n in lengths.items())
        raise DataError(f"transform {t.name!r} returned columns of unequal length for {where}: {shown} rows; "
                        "every column of a row group must have the same number of rows")
    if specs is not None:
        want = [s.name for s in specs]
        if list(out) != want:
            raise DataError(f"transform {t.name!r} returned the columns {list(out)} for {where}, but "
                            f"{want} for the first row group: every row group must give the same columns")
        for s in specs:
            c = out[s.name]
            got = _spec_of(s.name, c)
            if ((got.kind, got.dtype, got.inner, got.ragged_kind, got.item_kind)
                    != (s.kind, s.dtype, s.inner, s.ragged_kind, s.item_kind)):
                first = s.describe()
                raise DataError(f"transform {t.name!r} returned column {s.name!r} of {where} as {_kind(c)}, but "
                                f"the first row group's was {first}: every row group must give a column the "
                                "same dtype (cast it in the transform, e.g. .astype(...))")
    cols = UnitColumns()
    for name, c in out.items():
        cols[name] = c
    return cols


def output_specs(cols: Mapping[str, Column]) -> tuple[ColumnSpec, ...]:
    """The delivered columns' specs, from a checked output."""
    return tuple(_spec_of(k, c) for k, c in cols.items())


def _readonly(c: Column) -> Column:
    """A view that refuses writes (cache mappings and shared memory must never be written)."""
    if isinstance(c, Ragged):
        return Ragged(_readonly(c.values), _readonly_array(c.offsets), c.kind)
    return _readonly_array(c)


def _readonly_array(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def _bitwise(x: np.ndarray, y: np.ndarray) -> bool:
    # Bitwise, as the batch hashes compare: NaN and NaT (never equal to themselves) are the
    # same bytes each time a deterministic function makes them.
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _same(a: Mapping[str, Column], b: Mapping[str, Column]) -> str | None:
    """The first column whose bytes differ between two outputs (None: identical)."""
    if list(a) != list(b):
        return "the column names"
    for k in a:
        if not _bitwise_column(a[k], b[k]):
            return repr(k)
    return None


def _bitwise_column(x: Column, y: Column) -> bool:
    if isinstance(x, Ragged) or isinstance(y, Ragged):
        return (isinstance(x, Ragged) and isinstance(y, Ragged) and x.kind == y.kind
                and _bitwise(x.offsets, y.offsets) and _bitwise_column(x.values, y.values))
    return _bitwise(x, y)


# -- running it -------------------------------------------------------------------------

def call(t: Transform, cols: Mapping[str, Column], ctx: TransformContext, where: str) -> Any:
    """``t.fn`` on read-only views of ``cols``; anything it raises becomes `TransformFailed`."""
    views = {k: _readonly(c) for k, c in cols.items()}
    try:
        return t.fn(views, ctx)
    except Exception as exc:
        hint = ""
        if isinstance(exc, ValueError) and "read-only" in str(exc):
            hint = (" (its input columns are read-only views of the cache or of shared memory: copy one "
                    "first, e.g. np.array(columns[name]), or build new arrays)")
        # The worker's traceback (pack_exception) follows __cause__ into the function's own frames.
        raise TransformFailed(f"transform {t.name!r} raised {type(exc).__name__}: {exc}{hint}, on {where}") from exc


class _OutputCache(RowGroupCache):
    """A cached transform's outputs, kept as row-group entries of the output schema: memory-mapped,
    kept mapped between epochs and checksummed like the row groups themselves.

    An entry is named by the row group and the hash of the full cache identity (transform,
    input specs, the file's index and path, selection; `TransformPlan.cache_identity`), and the full identity is in
    its header key, compared on every read: two identities are never each other's hit.
    """

    def __init__(self, cfg: Any, plan: TransformPlan, files: Sequence[Any], kept: Any) -> None:
        super().__init__(cfg, plan.specs, {}, kept)
        self._plan = plan
        # Entries are looked up by file version (its cache key) and row group.
        self._file_of = {ref.cache_key: f for f, ref in enumerate(files)}
        self._paths = [ref.path for ref in files]

    def _ident(self, obj: str, rg: int) -> str:
        f = self._file_of[obj]
        return self._plan.cache_identity(f, self._paths[f], rg)

    def _path(self, obj: str, rg: int) -> str:
        return os.path.join(self.store.objects, obj, _derived_name(rg, self._ident(obj, rg).encode()))

    def _key(self, obj: str, rg: int) -> str:
        return f"{obj}/{os.path.basename(self._path(obj, rg))}/{self._ident(obj, rg)}"


class TransformRunner:
    """One worker's transform: cached output first, else run it on the row group and check it.

    ``cfg`` is the worker's configuration: its files, cache and (thread workers) kept mappings.
    """

    def __init__(self, plan: TransformPlan, cfg: Any) -> None:
        self.plan = plan
        self.files = cfg.files
        self.store = (_OutputCache(cfg.cache, plan, cfg.files, cfg.kept)
                      if plan.cached and cfg.cache is not None else None)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def new_pass(self) -> None:
        if self.store is not None:
            self.store.new_pass()

    def lookup(self, f: int, rg: int) -> UnitColumns | None:
        """The cached output of row group ``rg`` of file ``f`` as stored (unchecked), or None."""
        ref = self.files[f]
        if self.store is None or not ref.cache_key:
            return None
        got = self.store.get(ref.cache_key, rg, ref.uri)  # verified whole: nothing settles it later
        return got if isinstance(got, UnitColumns) else None

    def keep(self, f: int, rg: int, out: Mapping[str, Column]) -> None:
        ref = self.files[f]
        if self.store is not None and ref.cache_key:
            self.store.put(ref.cache_key, rg, out, ref.uri)

    def cached(self, cfg: Any, f: int, rg: int, t: Any) -> UnitColumns | None:
        """The cached output of row group ``rg`` of file ``f``, checked, or None (a miss, or no cache)."""
        if self.store is None:
            return None
        t0 = time.perf_counter()
        got = self.lookup(f, rg)
        if got is None:
            return None
        where = _where(self.files[f].path, rg)
        try:
            check_output(self.plan.transform, got, where, self.plan.specs)
            self._check_rows(got, f, rg, None, where)
        except DataError:
            return None  # not what this plan expects (never seen: the identity names the version): recompute
        t.add("cache_read", t0, time.perf_counter())
        t.extra["transform_cache_hits"] = t.extra.get("transform_cache_hits", 0.0) + 1
        return got

    def apply(self, cfg: Any, cols: UnitColumns, f: int, rg: int, selected: Selection | None, seed: int,
              epoch: int, t: Any) -> UnitColumns:
        """The transform's checked output for one row group's (selected) columns; stored when cached."""
        tf = self.plan.transform
        ref = cfg.files[f]
        where = _where(ref.path, rg)
        rows_in = len(next(iter(cols.values()))) if cols else 0
        t0 = time.perf_counter()
        ctx = TransformContext(file=ref.path, file_index=f, row_group=rg, rows=rows_in,
                               selected=selected.indices() if selected is not None else None,
                               seed=seed, epoch=epoch, random=tf.random)
        out = check_output(tf, call(tf, cols, ctx, where), where, self.plan.specs)
        self._check_rows(out, f, rg, rows_in, where)
        t.add("transform", t0, time.perf_counter())
        if self.store is not None:
            t1 = time.perf_counter()
            self.keep(f, rg, out)
            t.add("cache_write", t1, time.perf_counter())
        return out

    def _check_rows(self, out: UnitColumns, f: int, rg: int, rows_in: int | None, where: str) -> None:
        tf = self.plan.transform
        n = len(next(iter(out.values())))
        if tf.rows == "same":
            if rows_in is not None:
                _same_rows(tf, n, rows_in, where)
        elif self.plan.counts is not None:
            planned = self.plan.counts.get((f, rg))
            if planned is not None and n != planned:
                raise DataError(f"transform {tf.name!r} returned {n:,} rows for {where}, but {planned:,} when the "
                                "loader planned the epoch: a transform with rows='changes' must be deterministic "
                                "(the same rows for the same input)")


def _same_rows(t: Transform, n: int, rows_in: int, where: str) -> None:
    if n != rows_in:
        raise DataError(f"transform {t.name!r} returned {n:,} rows for {where}, which it was given {rows_in:,} "
                        "rows of: declare rows='changes' for a transform that filters or adds rows")
