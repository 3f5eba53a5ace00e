"""``group_by`` in the workers and the merger: a block's group order, the group-column check, packed batches.

A grouped block's rows are laid out group by group (`block_order`), so the merger can cut
micro-batches at group starts the plan knows (`PlanV2.group_bounds`). The worker checks
that each group column is constant within every group, bitwise, on the block it built
(`check_constant`), and the merger turns a flat micro-batch into a `Packed` (`pack`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .._types import Column, Ragged
from ..errors import DataError
from ..packed import Packed
from ..plan import Range, block_permutation, group_permutation, group_row_order
from .block import take_rows
from .config import WorkerConfig
from .messages import Task

__all__ = ["block_order", "check_constant", "pack", "pack_parts"]

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


def _out_starts(task: Task) -> np.ndarray:
    """Where each group begins in the built block (groups in their permuted order)."""
    starts = np.asarray(task.groups, dtype=np.int64)
    sizes = np.diff(np.append(starts, task.rows))
    if task.shuffle:
        sizes = sizes[group_permutation(task.seed, task.epoch, task.partition, task.number, len(starts))]
    return np.cumsum(sizes) - sizes


def _row_bytes(a: np.ndarray) -> np.ndarray:
    """Each row of ``a`` as a row of bytes, so that comparing them is bitwise (NaN equals NaN)."""
    a = np.ascontiguousarray(a)
    return a.reshape(len(a), -1).view(np.uint8) if a.size else a.reshape(len(a), 0).view(np.uint8)


def _first_change(col: Column, is_start: np.ndarray) -> int | None:
    """The first row that differs from the row before it inside one group, or None."""
    n = len(is_start)
    if isinstance(col, Ragged):
        offs = col.offsets.astype(np.int64) - int(col.offsets[0])
        lengths = np.diff(offs)
        bad = (lengths[1:] != lengths[:-1]) & ~is_start[1:]
        vals = col.values
        if vals.size:
            vb = vals.reshape(len(vals), -1).view(np.uint8)
            row = np.repeat(np.arange(n, dtype=np.int64), lengths)
            k = np.arange(len(row), dtype=np.int64)
            inner = ~is_start[row]
            inner[inner] &= lengths[row[inner]] == lengths[row[inner] - 1]
            kk = k[inner]
            if kk.size:
                diff = (vb[kk] != vb[kk - lengths[row[kk]]]).any(axis=1)
                if diff.any():
                    bad[row[kk[np.flatnonzero(diff)]] - 1] = True
        hits = np.flatnonzero(bad)
        return int(hits[0]) + 1 if hits.size else None
    b = _row_bytes(col)
    for lo in range(1, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        neq = (b[lo:hi] != b[lo - 1 : hi - 1]).any(axis=1) & ~is_start[lo:hi]
        hits = np.flatnonzero(neq)
        if hits.size:
            return lo + int(hits[0])
    return None


def check_constant(cfg: WorkerConfig, task: Task, cols: Mapping[str, Column], perm: np.ndarray | None) -> None:
    """DataError if a group column changes inside a group of the built block ``cols``."""
    if not task.groups or not cfg.group_columns or cfg.group_by is None:
        return
    starts = _out_starts(task)
    is_start = np.zeros(task.rows, dtype=bool)
    is_start[starts] = True
    for name in cfg.group_columns:
        r = _first_change(cols[name], is_start)
        if r is None:
            continue
        stored = int(perm[r]) if perm is not None else r
        rng = _range_of(task.units, stored)
        key = cols[cfg.group_by]
        value = key[r] if not isinstance(key, Ragged) else bytes(key.values[key.offsets[r]:key.offsets[r + 1]])
        value = value.item() if isinstance(value, np.generic) else value
        if isinstance(key, Ragged) and key.kind == "utf8":
            value = value.decode("utf-8", "replace")
        raise DataError(
            f"group column {name!r} is not constant within group {cfg.group_by}={value!r}: it changes in "
            f"{cfg.files[rng.file].path} row group {rng.row_group} (compared bitwise, so NaN equals NaN). "
            f"Group columns must hold one value per group; leave {name!r} out of group_columns")


def _range_of(ranges: Sequence[Range], row: int) -> Range:
    pos = 0
    for r in ranges:
        if row < pos + r.rows:
            return r
        pos += r.rows
    raise AssertionError(f"row {row} is past the block's ranges")


def pack_parts(cols: Mapping[str, Column], offsets: np.ndarray, group_columns: Sequence[str]
               ) -> tuple[dict[str, Column], dict[str, Column]]:
    """A flat piece's item columns (views) and group columns (one row per group: its first)."""
    firsts = offsets[:-1]
    gset = set(group_columns)
    items = {k: v for k, v in cols.items() if k not in gset}
    groups = {k: take_rows(cols[k], firsts) for k in group_columns}
    return items, groups


def pack(items: dict[str, Column], groups: dict[str, Column], offsets: np.ndarray,
         order: Sequence[str]) -> Packed:
    """The `Packed` of item columns, group columns and group offsets; ``order``: the flat
    column order `Packed.unpack` gives back."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    counts = np.diff(offsets)
    index = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return Packed(items, groups, index, offsets, tuple(order))
