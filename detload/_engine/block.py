"""Assembling one block: concatenate its units' columns and apply the row permutation.

The gather is the hot loop of a worker: ``np.take(..., mode="wrap")`` writes
straight into the destination (with the default ``mode="raise"`` NumPy gathers
into a temporary and copies it again). Every index is in range, so "wrap" (like
"clip") changes nothing but speed; its per-index test is a branch that never
fires, where "clip"'s clamping made the gather of a CTR block ~5% slower.

Consecutive fixed 1-D columns of one dtype (the 32 float features of a CTR
table) lie back to back in the block, so they form one ``(k, rows)`` array: the
units are copied into a scratch a few columns at a time (a whole run per unit
in one call when the unit comes from the cache, see `UnitColumns`) and each
chunk is permuted with one ``take`` along axis 1. Every NumPy call releases
and retakes the GIL; per column that was ~5 calls, and the waits for the GIL
between them were the largest idle time of two thread workers.

A mixed-order window read for many blocks holds its pieces in a `WindowPack`, each piece
block-ordered (`Order`): a block's rows of a piece, runs spread over its row group, lie in
one slice there, and a group of columns is gathered from all pieces in one ``take``.

The output of a block lives in one flat byte buffer (heap memory for thread
workers, a shared-memory segment for process workers). `Layout` describes where
each column lies in it, so the consumer side can rebuild zero-copy views.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from .._columns import _ragged_take, _workspace, slice_rows, take_rows
from .._types import Column, ColumnSpec, Ragged, RaggedKind, UnitColumns
from .._types import _np_dtype as _dtype
from ..plan import chunk_rows, run_starts

__all__ = ["Layout", "WindowPack", "assemble", "pack_frame", "piece_orders", "placed", "slice_rows", "stored_order", "take_rows", "views"]

_ALIGN = 64


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class ArraySlot(NamedTuple):  # tuples: built ~100 times per block, a frozen dataclass costs 5x more
    offset: int
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


class ColumnSlot(NamedTuple):
    name: str
    data: ArraySlot
    offsets: ArraySlot | None = None  # set for ragged columns
    ragged_kind: RaggedKind = "list"
    # A list of strings: its strings' offsets (``data`` holds their bytes) and their kind.
    item_offsets: ArraySlot | None = None
    item_kind: RaggedKind = "utf8"


@dataclass(frozen=True)
class Layout:
    """Where each column of a block lies in its buffer. Small and picklable."""

    rows: int
    nbytes: int
    columns: tuple[ColumnSlot, ...]


# Layouts and views are built for every block (twice: worker and merger), so
# they avoid np.prod and np.frombuffer, whose per-call cost is microseconds:
# at 40+ columns that was a tenth of a warm-cache block's time, all under the GIL.
def _slot(pos: int, dtype: str, shape: tuple[int, ...]) -> ArraySlot:
    dt = _dtype(dtype)
    return ArraySlot(pos, dt.str, shape, math.prod(shape) * dt.itemsize)


# One group: consecutive fixed 1-D columns of one dtype, stored back to back
# in the block, so that one (k, rows) array holds them all: first column index,
# number of columns, dtype.
Group = tuple[int, int, str]

# Layouts of recent blocks: most blocks of a dataset have the same row count.
# Keyed by the identity of the specs sequence (a worker passes the same one each
# time; the entry keeps it alive, so its id cannot be reused meanwhile).
_LAYOUTS: dict[tuple[int, int, tuple[tuple[str, tuple[int, ...]], ...]],
               tuple[Sequence[ColumnSpec], Layout, tuple[Group, ...]]] = {}
_LAYOUTS_MAX = 64


def _plan(specs: Sequence[ColumnSpec], rows: int, value_counts: dict[str, tuple[int, ...]]
          ) -> tuple[Layout, tuple[Group, ...]]:
    key = (id(specs), rows, tuple(value_counts.items()))
    hit = _LAYOUTS.get(key)
    if hit is not None and hit[0] is specs:
        return hit[1], hit[2]
    layout = _plan_layout(specs, rows, value_counts)
    groups = _groups(layout)
    if len(_LAYOUTS) >= _LAYOUTS_MAX:
        _LAYOUTS.clear()
    _LAYOUTS[key] = (specs, layout, groups)
    return layout, groups


def _plan_layout(specs: Sequence[ColumnSpec], rows: int, value_counts: dict[str, tuple[int, ...]]) -> Layout:
    """Each column 64-byte aligned, except that a fixed 1-D column directly follows
    the one before it when that one is fixed 1-D of the same dtype (see `_groups`).

    ``value_counts``: each ragged column's values, (strings, bytes) for a list of strings."""
    pos = 0
    run_dtype: str | None = None  # dtype of the previous column, while a run can go on
    slots: list[ColumnSlot] = []
    for spec in specs:
        if spec.kind == "fixed":
            dt = _dtype(spec.dtype).str
            one_d = not spec.inner
            start = pos if one_d and run_dtype == dt else _aligned(pos)
            data = _slot(start, dt, (rows, *spec.inner))
            pos = start + data.nbytes
            run_dtype = dt if one_d else None
            slots.append(ColumnSlot(spec.name, data))
        else:
            offs = _slot(_aligned(pos), "<i8", (rows + 1,))
            counts = value_counts[spec.name]
            items = None
            if spec.item_kind is not None:
                items = _slot(_aligned(offs.offset + offs.nbytes), "<i8", (counts[0] + 1,))
            at = items if items is not None else offs
            data = _slot(_aligned(at.offset + at.nbytes), spec.dtype, (counts[-1],))
            pos = data.offset + data.nbytes
            run_dtype = None
            slots.append(ColumnSlot(spec.name, data, offs, spec.ragged_kind, items, spec.item_kind or "utf8"))
    return Layout(rows, max(_aligned(pos), 1), tuple(slots))


def _groups(layout: Layout) -> tuple[Group, ...]:
    """The runs of back-to-back fixed 1-D columns of one dtype, singletons included."""
    out: list[Group] = []
    prev: ArraySlot | None = None
    for i, c in enumerate(layout.columns):
        d = c.data
        if c.offsets is not None or len(d.shape) != 1:
            prev = None
            continue
        if prev is not None and out and prev.dtype == d.dtype and d.offset == prev.offset + prev.nbytes:
            first, k, dt = out[-1]
            out[-1] = (first, k + 1, dt)
        else:
            out.append((i, 1, d.dtype))
        prev = d
    return tuple(out)


def _array(base: np.ndarray, slot: ArraySlot) -> np.ndarray:
    off = slot.offset
    a = base[off : off + slot.nbytes].view(_dtype(slot.dtype))
    shape = slot.shape
    return a if len(shape) == 1 else a.reshape(shape)


def views(buf: np.ndarray | memoryview | bytearray, layout: Layout) -> dict[str, Column]:
    """Zero-copy column views of a block buffer described by ``layout``.

    Every view references ``buf`` (through NumPy's base chain), so the buffer
    lives as long as any of them.
    """
    base = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    out: dict[str, Column] = {}
    for c in layout.columns:
        data = _array(base, c.data)
        if c.offsets is None:
            out[c.name] = data
        elif c.item_offsets is None:
            out[c.name] = Ragged(data, _array(base, c.offsets), c.ragged_kind)
        else:
            items = Ragged(data, _array(base, c.item_offsets), c.item_kind)
            out[c.name] = Ragged(items, _array(base, c.offsets), c.ragged_kind)
    return out


def _value_counts(col: Ragged) -> tuple[int, ...]:
    """A ragged column's values: (values,), or (strings, bytes) for a list of strings."""
    counts = []
    v = col.values
    while isinstance(v, Ragged):
        counts.append(len(v))
        v = v.values
    return (*counts, int(v.shape[0]))


def _copy_ragged(dst: Ragged, src: Ragged) -> None:
    dst.offsets[:] = src.offsets
    if isinstance(dst.values, Ragged):
        assert isinstance(src.values, Ragged)
        _copy_ragged(dst.values, src.values)
    else:
        dst.values[:] = src.values


def _concat_ragged(name: str, parts: Sequence[Ragged]) -> Ragged:
    if len(parts) == 1:
        return parts[0]
    values: np.ndarray | Ragged
    if isinstance(parts[0].values, Ragged):  # a list of strings: its strings, concatenated as a column
        values = _concat_ragged(f"{name}\x00items", [p.values for p in parts])  # type: ignore[misc]
    else:
        arrays = [p.values for p in parts if isinstance(p.values, np.ndarray)]
        values = _workspace(f"values:{name}", sum(int(a.shape[0]) for a in arrays),
                            np.result_type(*[a.dtype for a in arrays]))
        np.concatenate(arrays, out=values)
    offs = _workspace(f"offsets:{name}", sum(int(p.offsets.shape[0]) - 1 for p in parts) + 1, np.int64)
    at, base = 0, 0
    for p in parts:
        n = int(p.offsets.shape[0]) - 1
        np.add(p.offsets[:-1], base, out=offs[at : at + n])
        at += n
        base += int(p.offsets[-1])
    offs[at] = base
    return Ragged(values, offs, parts[0].kind)


# Rows of a group are permuted a few columns at a time, so that the gathered
# source (a few columns of the whole block) stays in a core's L2 cache together
# with the permutation (8 bytes a row) and the written rows: at 65,536 rows, one
# float32 column a chunk took ~5% less than four (1 MB) did.
_CHUNK_BYTES = 1 << 18
#: Above this many units, a group of columns is copied from each unit in one call (a
#: per-unit call per cache-sized chunk of columns cost more in calls than it saved).
_MANY_UNITS = 8
#: A mixed-order block's group of columns is copied from its many units in chunks of columns
#: this large (L2-sized on the machines measured), then permuted column by column.
_MANY_CHUNK_BYTES = 1 << 20


def _chunk_cols(rows: int, itemsize: int) -> int:
    """Columns of ``rows`` values of ``itemsize`` bytes permuted together (at least one)."""
    return max(1, _CHUNK_BYTES // max(1, rows * itemsize))


def _many_chunk_cols(rows: int, itemsize: int) -> int:
    """`_chunk_cols` for many units (`_assemble_many`): columns copied from every unit at once."""
    return max(1, _MANY_CHUNK_BYTES // max(1, rows * itemsize))


#: The rows a block takes of one unit (`MixTask.block_chunks` less the piece): ``(first,
#: rows, run, period)``, ``rows // run`` runs of ``run`` rows ``period`` apart from ``first``;
#: one run (``run == rows``) is the slice ``[first, first + rows)``.
Rows = tuple[int, int, int, int]


def _runs2d(src: np.ndarray, rng: Rows) -> np.ndarray:
    """The rows ``rng`` of a ``(columns, rows)`` array: a ``(columns, rows)`` view for one run,
    else a ``(columns, runs, run)`` view (the runs' grid starts at a multiple of ``period``,
    as `MixTask.block_chunks` cuts it), so that the runs copy in one call."""
    first, n, run, period = rng
    if run == n:
        return src[:, first : first + n]
    runs, s0 = n // run, first - first % period
    return src[:, s0 : s0 + runs * period].reshape(src.shape[0], runs, period // run, run)[
        :, :, (first - s0) // run, :]


def _put_rows(dst: np.ndarray, lo: int, hi: int, part: np.ndarray) -> None:
    """A unit's rows as `_runs2d` cuts them (2-D, or 3-D for runs) into columns ``[lo, hi)``
    of ``dst``'s rows."""
    if part.ndim == 2:
        dst[:, lo:hi] = part
    else:
        dst[:, lo:hi].reshape(dst.shape[0], part.shape[1], part.shape[2])[...] = part


def _put2d(dst: np.ndarray, lo: int, hi: int, src: np.ndarray, rng: Rows | None) -> None:
    """Rows ``rng`` of ``src`` (all of them: None) into columns ``[lo, hi)`` of ``dst``'s rows."""
    _put_rows(dst, lo, hi, src if rng is None else _runs2d(src, rng))


def _unit_rows(col: Column, rng: Rows) -> Column:
    """Rows ``rng`` of a column: a view for one run, else a new column of the runs."""
    first, n, run, period = rng
    if run == n:
        return slice_rows(col, first, first + n)
    if isinstance(col, Ragged):
        starts = run_starts(first, n, run, period)
        return _ragged_runs(col, starts, starts + run)
    return take_rows(col, chunk_rows(first, n, run, period))


def _ragged_runs(col: Ragged, starts: np.ndarray, stops: np.ndarray) -> Ragged:
    """Rows ``[starts[i], stops[i])`` of ``col`` for every i, in order, as one new Ragged:
    each run's values are one slice (a per-row or per-byte gather costs far more on text)."""
    counts = stops - starts
    total = int(counts.sum())
    # Each row's index: its run's start, plus its place in the run.
    idx = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total, dtype=np.int64)
    offsets = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(col.offsets[idx + 1] - col.offsets[idx], out=offsets[1:])
    vstarts, vstops = col.offsets[starts], col.offsets[stops]
    values: np.ndarray | Ragged
    if isinstance(col.values, Ragged):  # a list of strings: the runs' strings, as runs of that column
        values = _ragged_runs(col.values, vstarts, vstops)
    else:
        values = np.concatenate([col.values[a:b] for a, b in zip(vstarts.tolist(), vstops.tolist())])
    return Ragged(values, offsets, col.kind)


def _verify_upto(unit: Mapping[str, Column], name: str) -> None:
    """A cache entry with a pending checksum hashes its bytes up to column ``name`` now,
    just before they are copied (see _cache.PendingCheck). The caller finishes it,
    which also covers the columns assembled without this (2-D ones)."""
    check = getattr(unit, "check", None)
    if check is not None:
        end = check.ends.get(name)
        if end is not None:
            check.upto(end)


def _run_part(unit: Mapping[str, Column], names: tuple[str, ...], j0: int, j1: int) -> np.ndarray | None:
    """Columns ``names[j0:j1]`` of ``unit`` as one 2-D view, if they lie at one stride."""
    runs = getattr(unit, "runs", None)
    if not runs:
        return None
    hit = runs.get(names[j0])
    if hit is None:
        return None
    run, i, run_names = hit
    n = j1 - j0
    if run_names[i : i + n] != names[j0:j1]:
        return None
    return run[i : i + n]  # type: ignore[no-any-return]


def _copy_columns(dst: np.ndarray, unit: Mapping[str, Column], names: tuple[str, ...], j0: int, j1: int,
                  lo: int, hi: int, rng: Rows | None) -> None:
    """Columns ``names[j0:j1]`` of a unit without a run for them, one at a time, into rows
    ``[lo, hi)`` of ``dst`` (the unit's rows ``rng``; None: all of them)."""
    for j in range(j0, j1):
        col = unit[names[j]]
        assert isinstance(col, np.ndarray)
        _put2d(dst[j - j0 : j - j0 + 1], lo, hi, col[None, :], rng)


def _assemble_many(
    names: tuple[str, ...],
    out2d: np.ndarray,
    units: Sequence[Mapping[str, Column]],
    spans: list[tuple[int, int]],
    perm: np.ndarray,
    scratch: np.ndarray,
    ranges: Sequence[Rows] | None,
) -> None:
    """`_assemble_group` for many units (a mixed-order block: a chunk of each of up to
    mix_window row groups): each unit's run of the group is looked up once, not once per
    chunk; a chunk of columns (about `_MANY_CHUNK_BYTES`) is copied from every unit, one call
    per unit when its columns lie in one run, then permuted one column at a time while it is
    still in cache. Copying the whole group first and permuting it after read it back from
    further away: experiments/bench/mix_gather.py, CTR-shaped blocks of 62 units of separate
    arrays, 7.8-8.3 -> 7.4-7.5 ms a block (units in runs: unchanged, 5.8-6.2 ms)."""
    k, rows = out2d.shape
    step = _many_chunk_cols(rows, out2d.itemsize)
    for u in units:
        _verify_upto(u, names[-1])
    whole = [_run_part(u, names, 0, k) for u in units]
    # Each unit's rows of its whole run, as a view, once: a chunk of columns slices it.
    taken = [None if w is None else _runs2d(w, ranges[q]) if ranges is not None else w
             for q, w in enumerate(whole)]
    for j0 in range(0, k, step):
        j1 = min(k, j0 + step)
        dst = scratch[: (j1 - j0) * rows * out2d.itemsize].view(out2d.dtype).reshape(j1 - j0, rows)
        for q, (lo, hi) in enumerate(spans):
            if hi == lo:
                continue
            rng = ranges[q] if ranges is not None else None
            t = taken[q]
            if t is None:
                w = _run_part(units[q], names, j0, j1)
                if w is None:
                    _copy_columns(dst, units[q], names, j0, j1, lo, hi, rng)
                    continue
                _put2d(dst, lo, hi, w, rng)
            else:
                _put_rows(dst, lo, hi, t[j0:j1])
        for c in range(j1 - j0):
            # Every index is in range (a permutation): "wrap" changes nothing but speed.
            np.take(dst[c], perm, out=out2d[j0 + c], mode="wrap")


def _assemble_group(
    names: tuple[str, ...],
    out2d: np.ndarray,
    units: Sequence[Mapping[str, Column]],
    spans: list[tuple[int, int]],
    perm: np.ndarray | None,
    scratch: np.ndarray,
    ranges: Sequence[Rows] | None = None,
) -> None:
    """Columns ``names`` of the units (their rows ``ranges``, else all), concatenated and
    permuted, into the rows of ``out2d``."""
    k, rows = out2d.shape
    if perm is not None and len(units) > _MANY_UNITS:
        _assemble_many(names, out2d, units, spans, perm, scratch, ranges)
        return
    step = k if perm is None else _chunk_cols(rows, out2d.itemsize)
    # A pending cache checksum covers the whole group now, in one call per unit rather
    # than one per chunk: each call releases and retakes the GIL, and the group (a few
    # MB per block) is still in L3 when the chunks copy it.
    for u in units:
        _verify_upto(u, names[-1])
    for j0 in range(0, k, step):
        j1 = min(k, j0 + step)
        dst = out2d[j0:j1] if perm is None else scratch[: (j1 - j0) * rows * out2d.itemsize].view(
            out2d.dtype).reshape(j1 - j0, rows)
        for q, (u, (lo, hi)) in enumerate(zip(units, spans)):
            rng = ranges[q] if ranges is not None else None
            part = _run_part(u, names, j0, j1)
            if part is not None:
                _put2d(dst, lo, hi, part, rng)
            else:
                _copy_columns(dst, u, names, j0, j1, lo, hi, rng)
        if perm is not None:
            # Every index is in range (a permutation): "wrap" changes nothing but speed.
            np.take(dst, perm, axis=1, out=out2d[j0:j1], mode="wrap")


def assemble(
    specs: Sequence[ColumnSpec],
    units: Sequence[Mapping[str, Column]],
    perm: np.ndarray | None,
    allocate: Callable[[int], np.ndarray],
    ranges: Sequence[Rows] | None = None,
) -> tuple[np.ndarray, Layout]:
    """Write the block (units concatenated, rows in ``perm`` order) into a new buffer.

    ``allocate(nbytes)`` returns a writable uint8 array of that size (heap or
    shared memory). ``ranges``: for each unit, the rows of it the block takes (`Rows`: a
    mixed-order block takes a chunk of each row group of its task's window, in runs spread
    over it), else all. A unit may be named more than once, for rows of its own.
    Units that are all pieces of one `WindowPack` have each group of columns gathered from the
    pack in one call. Returns the buffer and its layout.
    """
    if ranges is not None:
        # A piece of a window pack holds its rows in the piece's block order: where they lie there.
        ranges = [packed_rows(u.at[2], rng) if getattr(u, "at", None) is not None else rng  # type: ignore[attr-defined]
                  for u, rng in zip(units, ranges)]
    # The rows each unit gives, as views: what ragged and multi-dimensional columns copy.
    whole: Sequence[Mapping[str, Column]] = units
    if ranges is not None:
        lengths = [n for _, n, _, _ in ranges]
        if any(s.kind != "fixed" or s.inner for s in specs):
            whole = [{s.name: _unit_rows(u[s.name], rng) for s in specs if s.kind != "fixed" or s.inner}
                     for u, rng in zip(units, ranges)]
    else:
        lengths = [len(next(iter(u.values()))) for u in units] if specs else [0 for _ in units]
    rows = sum(lengths)
    spans = []
    pos = 0
    for n in lengths:
        spans.append((pos, pos + n))
        pos += n
    ragged = {s.name: _concat_ragged(s.name, [u[s.name] for u in whole])  # type: ignore[misc]
              for s in specs if s.kind == "ragged"}
    layout, groups = _plan(specs, rows, {k: _value_counts(v) for k, v in ragged.items()})
    buf = allocate(layout.nbytes)
    base = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    out = views(base, layout)
    need = 0
    if perm is not None and rows:
        cols_at_once = _many_chunk_cols if len(units) > _MANY_UNITS else _chunk_cols
        need = max((min(k, cols_at_once(rows, _dtype(dt).itemsize)) * rows * _dtype(dt).itemsize
                    for _, k, dt in groups), default=0)
    pack = _pack_of(units) if perm is not None else None
    # A spilled pack (_engine/spill.py) reads every group's rows of a block itself.
    gather = getattr(pack, "gather", None) if ranges is not None else None
    index = (_pack_index(units, spans, ranges, perm) if pack is not None and perm is not None and rows
             and gather is None else None)
    scratch = _workspace("scratch", need, np.uint8)
    dests = []
    for first, k, dt in groups:
        names = tuple(c.name for c in layout.columns[first : first + k])
        d0 = layout.columns[first].data
        out2d = base[d0.offset : d0.offset + k * d0.nbytes].view(_dtype(dt)).reshape(k, rows)
        if gather is not None:
            dests.append((names, out2d))
            continue
        held = pack.arrays.get(names) if pack is not None and index is not None else None
        if held is not None and index is not None:
            # Units of one window pack: the group's rows of every unit in one gather. Every
            # index is in range (a permutation of the units' rows): "wrap" changes nothing but speed.
            np.take(held, index, axis=1, out=out2d, mode="wrap")
        else:
            _assemble_group(names, out2d, units, spans, perm, scratch, ranges)
    if gather is not None:
        gather(dests, units, ranges, spans, perm)
    for spec in specs:
        dst = out[spec.name]
        if spec.kind == "fixed":
            assert isinstance(dst, np.ndarray)
            if dst.ndim == 1:
                continue  # written by its group
            parts = [u[spec.name] for u in whole]
            if perm is None:
                np.concatenate(parts, axis=0, out=dst)  # type: ignore[arg-type]
            else:
                src = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]  # type: ignore[arg-type]
                np.take(src, perm, axis=0, out=dst, mode="wrap")  # type: ignore[arg-type,call-overload]
        else:
            assert isinstance(dst, Ragged)
            src_r = ragged[spec.name]
            if perm is None:
                _copy_ragged(dst, src_r)
            else:
                _ragged_take(src_r, perm, dst.offsets, dst.values)
    return buf, layout


#: How a piece lies in a `WindowPack` (`WindowPack.orders`): None, in stored order; or
#: ``(runs, run, blocks)``, "block-ordered": its first ``runs x run x blocks`` rows, which
#: `MixTask.block_chunks` cuts into periods of ``run x blocks`` rows (block chunk c: run c of
#: every period), are held chunk by chunk, so each block's runs of it lie back to back; the
#: rows after them (cut into contiguous chunks) are in stored order.
Order = tuple[int, int, int] | None


def piece_orders(chunks: Sequence[tuple[int, tuple[tuple[int, int, int, int, int], ...]]],
                 pieces: int) -> list[Order]:
    """Each piece's block order (`Order`), read off a task's block chunks (``(j, entries)``,
    entries ``(piece, first, rows, run, period)``): a piece cut into runs in one block is cut
    the same way in every block of its task."""
    orders: list[Order] = [None] * pieces
    for _, entries in chunks[:1]:
        for q, _, n, run, period in entries:
            if run != n:
                orders[q] = (n // run, run, period // run)
    return orders


def packed_rows(order: Order, rng: Rows) -> Rows:
    """Where the rows ``rng`` of a piece lie in a pack holding it in ``order``: a block's
    runs of a block-ordered piece are one slice there."""
    first, n, run, period = rng
    if order is None or run == n:
        return rng
    runs, length, blocks = order
    if (n, run, period) != (runs * length, length, length * blocks) or first % length or first >= period:
        raise AssertionError(f"rows {rng} are not a block chunk of a piece in order {order}")
    return (first // length * n, n, n, n)


def _to_order(dst: np.ndarray, src: np.ndarray, order: Order, back: bool = False) -> None:
    """``src``, a ``(columns, rows, ...)`` array of a piece's rows in stored order, into ``dst``
    (the same shape) in ``order`` (``back``: from ``order`` into stored order): one strided
    copy of the runs, and the rows after them."""
    if order is None:
        dst[...] = src
        return
    runs, run, blocks = order
    k, m, inner = dst.shape[0], runs * run * blocks, dst.shape[2:]
    a, b = (blocks, runs) if back else (runs, blocks)  # src's periods by chunks, or chunks by periods
    dst[:, :m].reshape(k, b, a, run, *inner)[...] = src[:, :m].reshape(k, a, b, run, *inner).swapaxes(1, 2)
    dst[:, m:] = src[:, m:]


def _from_order(src: np.ndarray, order: Order) -> np.ndarray:
    """A ``(columns, rows)`` array held in ``order``, as a new array in stored order."""
    if order is None:
        return src
    out = np.empty(src.shape, dtype=src.dtype)
    _to_order(out, src, order, back=True)
    return out


def _order_runs(rows: int, order: tuple[int, int, int], back: bool) -> tuple[np.ndarray, np.ndarray]:
    """The runs ``(starts, stops)`` that put a piece of ``rows`` rows in ``order`` (``back``:
    one held in ``order`` back in stored order), in the order they are taken."""
    runs, run, blocks = order
    m = runs * run * blocks
    if back:  # stored period p, chunk c lies at c x runs x run + p x run
        starts = (np.arange(blocks, dtype=np.int64) * (runs * run))[None, :] + (np.arange(runs, dtype=np.int64) * run)[:, None]
    else:  # chunk c, stored period p lies at p x run x blocks + c x run
        starts = (np.arange(runs, dtype=np.int64) * (run * blocks))[None, :] + (np.arange(blocks, dtype=np.int64) * run)[:, None]
    starts = starts.ravel()
    stops = starts + run
    if rows > m:
        starts, stops = np.append(starts, m), np.append(stops, rows)
    return starts, stops


def _reorder(col: Column, order: Order, back: bool = False) -> Column:
    """A column of a piece (not of a pack's groups: a ragged or multi-dimensional one) put in
    ``order``, or back in stored order, as a new column; itself without an order."""
    if order is None:
        return col
    if isinstance(col, Ragged):
        return _ragged_runs(col, *_order_runs(len(col.offsets) - 1, order, back))
    out = np.empty(col.shape, dtype=col.dtype)
    _to_order(out[None], col[None], order, back)
    return out


def stored_order(cols: UnitColumns) -> UnitColumns:
    """A row group's columns in stored order: ``cols`` itself, unless it is a block-ordered
    piece of a pack (then a copy of its columns in stored order)."""
    at = cols.at
    restore = getattr(at[0], "stored", None) if at is not None else None
    if restore is not None:  # a piece of a spilled pack (_engine/spill.py): read back
        return restore(cols)  # type: ignore[no-any-return]
    if at is None or at[2] is None:
        return cols
    out = UnitColumns()
    # Each group of columns once, known by its names (its columns may hold views of their own).
    done: dict[tuple[str, ...], np.ndarray] = {}
    for name, col in cols.items():
        hit = cols.runs.get(name)
        if hit is None:
            out[name] = _reorder(col, at[2], back=True)
            continue
        run, i, names = hit
        if names not in done:
            done[names] = _from_order(run, at[2])
        out[name] = done[names][i]
        out.runs[name] = (done[names], i, names)
    out.check = cols.check
    return out


def placed(pack: PackLike, q: int, cols: UnitColumns, first: int, rows: int) -> tuple[int, Order, bool]:
    """Where piece ``q`` of a pack (a `WindowPack`, or a spilled one) goes: its first pack row,
    its order, and whether ``cols`` is that piece already (a window kept from the pass before
    lends its pack to the next one): rows ``[first, first + rows)`` of them lie there."""
    s = pack.starts[q]
    if rows != pack.starts[q + 1] - s:
        raise AssertionError(f"piece {q} has {rows} rows, the pack planned {pack.starts[q + 1] - s}")
    at = cols.at
    return s, pack.orders[q], at is not None and at[0] is pack and at[1] + first == s


def pack_frame(specs: Sequence[ColumnSpec], piece_rows: Sequence[int], orders: Sequence[Order] | None
               ) -> tuple[list[tuple[tuple[str, ...], int, np.dtype]], list[int], tuple[Order, ...]]:
    """What a window pack (`WindowPack`, or a spilled one) is laid out by: the groups of fixed
    1-D columns a block lays out back to back (names, count, dtype), each piece's first pack
    row (and the end), and each piece's order (None: stored order)."""
    # The groups of a one-row block: which columns a block lays out back to back does not
    # depend on its rows (nor on its ragged columns' value counts, given here as none).
    layout, groups = _plan(specs, 1, {s.name: (0, 0) if s.item_kind is not None else (0,)
                                      for s in specs if s.kind != "fixed"})
    starts = [0]
    for n in piece_rows:
        starts.append(starts[-1] + n)
    held = tuple(orders) if orders is not None else (None,) * len(piece_rows)
    if len(held) != len(piece_rows):
        raise AssertionError(f"{len(held)} piece orders for {len(piece_rows)} pieces")
    return ([(tuple(c.name for c in layout.columns[first : first + k]), k, _dtype(dt)) for first, k, dt in groups],
            starts, held)


def all_flat(specs: Sequence[ColumnSpec]) -> bool:
    """Whether every column of ``specs`` is fixed-width and 1-D: all a window pack's groups hold,
    so a piece is its pack's rows alone (what a spilled or a mapped pack needs)."""
    return all(s.kind == "fixed" and not s.inner for s in specs)


class PackLike(Protocol):
    """What `placed` reads of a pack: a `WindowPack`, or a spilled one (_engine/spill.py)."""

    starts: list[int]
    orders: tuple[Order, ...]


class WindowPack:
    """A mixed-order window's fixed 1-D columns, every piece's rows back to back in one 2-D
    array per run of same-typed columns (a block layout's group, `_groups`), each piece in
    its block order (`Order`, given as ``orders``; default: stored order). A piece's other
    columns (ragged, multi-dimensional) are held in its block order too, as copies.

    A mixed-order block takes a chunk of every piece of its window (up to ``mix_window``).
    From separate arrays that is a copy per piece and group of columns, each call taking the
    GIL: with two threads at once, a block of 62 pieces took 2.4x a windowed block of 4 row
    groups (experiments/bench/mix_gather.py: 6.1 against 2.6 ms). From a pack, `assemble`
    gathers a group's rows from all pieces in one call: 2.6 ms. A chunk is runs spread over
    its piece (`MixTask.block_chunks`); held in stored order, a block's gather touched every
    page of the window and took 1.8x as long as from one slice a piece (mix_gather.py: 10.6
    against 5.8 ms), so the pack holds each piece block-ordered, its rows copied once in that
    order as it is filled."""

    __slots__ = ("arrays", "columns", "orders", "starts")

    def __init__(self, specs: Sequence[ColumnSpec], piece_rows: Sequence[int],
                 orders: Sequence[Order] | None = None) -> None:
        groups, self.starts, self.orders = pack_frame(specs, piece_rows, orders)
        self.arrays: dict[tuple[str, ...], np.ndarray] = self._storage(groups, self.starts[-1])
        #: column name: (its group's array, its row there, the group's names)
        self.columns: dict[str, tuple[np.ndarray, int, tuple[str, ...]]] = {}
        for names, arr in self.arrays.items():
            for r, name in enumerate(names):
                self.columns[name] = (arr, r, names)

    def _storage(self, groups: Sequence[tuple[tuple[str, ...], int, np.dtype]], rows: int
                 ) -> dict[tuple[str, ...], np.ndarray]:
        """Each group's ``(columns, rows)`` array: in this process's memory (a pack shared
        through a mapped file, _engine/mapped.py, maps them)."""
        return {names: np.empty((k, rows), dtype=dt) for names, k, dt in groups}

    def _views(self, s: int, rows: int, out: UnitColumns) -> None:
        """The packed columns of the piece at pack rows ``[s, s + rows)`` into ``out``: one view
        of each group's rows, shared by its columns (not one made per column)."""
        for names, arr in self.arrays.items():
            run = arr[:, s : s + rows]
            for r, name in enumerate(names):
                out[name] = run[r]
                out.runs[name] = (run, r, names)

    def put(self, q: int, cols: UnitColumns, first: int, rows: int) -> UnitColumns:
        """Piece ``q``: rows ``[first, first + rows)`` of a row group's ``cols``, copied into the
        pack in the piece's order (unless they already lie there: a window kept from the pass
        before). Returns the piece, its packed columns as views of the pack, the others as
        views of ``cols``."""
        s, order, here = placed(self, q, cols, first, rows)
        if not here:
            cols = stored_order(cols)
            for names, arr in self.arrays.items():
                part = _run_part(cols, names, 0, len(names))
                if part is not None:
                    _to_order(arr[:, s : s + rows], part[:, first : first + rows], order)
                else:
                    for j, name in enumerate(names):
                        col = cols[name]
                        assert isinstance(col, np.ndarray)
                        _to_order(arr[j : j + 1, s : s + rows], col[None, first : first + rows], order)
        packed = UnitColumns()
        self._views(s, rows, packed)
        out = UnitColumns()
        for name, col in cols.items():  # in the columns' order
            if name in packed:
                out[name] = packed[name]
                out.runs[name] = packed.runs[name]
            else:
                rows_of = slice_rows(col, first, first + rows)
                out[name] = rows_of if here else _reorder(rows_of, order)
        out.at = (self, s, order)
        return out


def _pack_of(units: Sequence[Mapping[str, Column]]) -> WindowPack | None:
    """The window pack every unit is a piece of, if one is."""
    pack = None
    for u in units:
        at = getattr(u, "at", None)
        if at is None or (pack is not None and at[0] is not pack):
            return None
        pack = at[0]
    return pack


def _pack_index(units: Sequence[Mapping[str, Column]], spans: list[tuple[int, int]],
                ranges: Sequence[Rows] | None, perm: np.ndarray) -> np.ndarray:
    """The pack row of each of a block's rows, in ``perm`` order (``ranges``: where each
    unit's rows lie in its piece as packed, `packed_rows`)."""
    if ranges is not None and any(run != n for _, n, run, _ in ranges):
        rows = np.concatenate([chunk_rows(*rng) + u.at[1] for u, rng in zip(units, ranges)])  # type: ignore[attr-defined]
        return rows[perm]  # type: ignore[no-any-return]
    lengths = np.fromiter((hi - lo for lo, hi in spans), dtype=np.int64, count=len(spans))
    shift = np.fromiter(((u.at[1] + (ranges[q][0] if ranges is not None else 0) - spans[q][0])  # type: ignore[attr-defined]
                         for q, u in enumerate(units)), dtype=np.int64, count=len(units))
    return perm + np.repeat(shift, lengths)[perm]  # type: ignore[no-any-return]
