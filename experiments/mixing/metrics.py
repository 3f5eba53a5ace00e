"""Mixing metrics of an epoch's order, each set beside what an i.i.d. shuffle gives.

Per batch: distinct source row groups and files, distinct values of a column (days) and the total
variation distance between the batch's and the epoch's distribution of that column; per row
group: the part of the epoch its rows are spread over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Mixing", "batch_counts", "distinct_per_batch", "mixing", "row_group_spread", "tvd_per_batch"]


def _full(offsets: np.ndarray) -> np.ndarray:
    """Indices of the batches of the most common (full) size: a short last batch is left out."""
    sizes = np.diff(offsets)
    return np.flatnonzero(sizes == sizes.max())


def batch_counts(codes: np.ndarray, offsets: np.ndarray, n_codes: int) -> np.ndarray:
    """(batches, n_codes) counts of each code in each batch; ``codes`` are the rows' codes in order."""
    batch = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return np.bincount(batch * n_codes + codes, minlength=(len(offsets) - 1) * n_codes).reshape(-1, n_codes)


def distinct_per_batch(codes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """How many distinct codes each batch holds (for many codes, e.g. row groups)."""
    batch = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    n = int(codes.max()) + 1
    keys = np.unique(batch.astype(np.int64) * n + codes)
    return np.bincount(keys // n, minlength=len(offsets) - 1)


def tvd_per_batch(counts: np.ndarray) -> np.ndarray:
    """Total variation distance of every batch's distribution from the whole epoch's."""
    epoch = counts.sum(axis=0) / counts.sum()
    batch = counts / counts.sum(axis=1, keepdims=True)
    return 0.5 * np.abs(batch - epoch).sum(axis=1)


def row_group_spread(rows: np.ndarray, unit_rows: np.ndarray) -> np.ndarray:
    """For each row group, the part of the epoch (0..1) between its rows' 5th and 95th percentile
    positions; an i.i.d. shuffle gives about 0.9, today's windowed order about a block's share."""
    pos = np.empty(len(rows), dtype=np.float64)
    pos[rows] = np.arange(len(rows)) / len(rows)
    starts = np.concatenate([[0], np.cumsum(unit_rows)])
    out = np.empty(len(unit_rows))
    for u in range(len(unit_rows)):
        q = np.percentile(pos[starts[u]:starts[u + 1]], [5, 95])
        out[u] = q[1] - q[0]
    return out


@dataclass(frozen=True)
class Mixing:
    name: str
    batches: int
    row_groups_median: float
    row_groups_p5: float
    files_median: float
    files_p5: float
    values_median: float | None  # distinct values of the column per batch
    values_p5: float | None
    tvd_median: float | None
    tvd_p95: float | None
    spread_median: float
    spread_min: float

    def row(self) -> str:
        def f(x: float | None, d: int = 0) -> str:
            return "-" if x is None else f"{x:.{d}f}"
        return (f"| {self.name} | {f(self.row_groups_median)} | {f(self.row_groups_p5)} | {f(self.files_median)} | "
                f"{f(self.files_p5)} | {f(self.values_median)} | {f(self.values_p5)} | {f(self.tvd_median, 4)} | "
                f"{f(self.tvd_p95, 4)} | {self.spread_median:.3f} | {self.spread_min:.3f} |")

    HEADER = ("| order | row groups/batch median | p5 | files/batch median | p5 | values/batch median | p5 | "
              "TVD median | TVD p95 | row-group spread median | min |\n|---|---|---|---|---|---|---|---|---|---|---|")


def mixing(name: str, rows: np.ndarray, offsets: np.ndarray, unit_rows: np.ndarray, unit_file: np.ndarray,
           row_values: np.ndarray | None = None, n_values: int = 0, spread: bool = True) -> Mixing:
    """All metrics of one epoch given as global steps (``rows`` with step ``offsets``, see
    `EpochOrder.global_steps`). ``row_values[r]`` is the column's code (0..n_values-1) of global row r."""
    full = _full(offsets)
    starts = np.concatenate([[0], np.cumsum(unit_rows)[:-1]])
    unit = np.searchsorted(starts, rows, side="right") - 1
    rg = distinct_per_batch(unit, offsets)[full]
    fl = distinct_per_batch(unit_file[unit], offsets)[full]
    vm = vp = tm = tp = None
    if row_values is not None:
        counts = batch_counts(row_values[rows], offsets, n_values)[full]
        v = (counts > 0).sum(axis=1)
        t = tvd_per_batch(counts)
        vm, vp = float(np.median(v)), float(np.percentile(v, 5))
        tm, tp = float(np.median(t)), float(np.percentile(t, 95))
    sp = row_group_spread(rows, unit_rows) if spread else np.zeros(1)
    return Mixing(name, len(full), float(np.median(rg)), float(np.percentile(rg, 5)), float(np.median(fl)),
                  float(np.percentile(fl, 5)), vm, vp, tm, tp, float(np.median(sp)), float(sp.min()))
