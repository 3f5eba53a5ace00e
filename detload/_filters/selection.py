"""`Selection`: the rows of one row group a filter delivers, stored compactly for the workers.

Every process worker gets the selections pickled in its configuration; as int64 indices
that is 8 bytes per selected row. A `Selection` keeps them as runs ``[start, stop)`` when
that is smaller (a dataset laid out by the filter's keys selects runs, often one per row
group), else as uint32 indices (4 bytes a row); int64 only for a row group of 2**32 rows
or more. `indices` gives back exactly the sorted int64 indices it was made from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Selection"]

_U32 = 2**32


@dataclass(frozen=True)
class Selection:
    """Sorted distinct row indices of one row group; ``kind`` says how ``data`` holds them:
    "runs" a (k, 2) array of [start, stop) rows, "rows" the indices themselves."""

    kind: str
    data: np.ndarray
    count: int

    @classmethod
    def of(cls, idx: np.ndarray, rows: int) -> Selection:
        """The compact form of ``idx`` (sorted distinct indices below ``rows``)."""
        idx = np.asarray(idx)
        n = int(idx.size)
        dtype = np.uint32 if rows < _U32 else np.int64
        if n == 0:
            return cls("rows", np.empty(0, dtype=dtype), 0)
        # A run starts where an index is not its predecessor plus one.
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        k = breaks.size + 1
        if 2 * k < n:  # two numbers a run against one a row
            starts = np.concatenate([idx[:1], idx[breaks]])
            stops = np.concatenate([idx[breaks - 1] + 1, idx[-1:] + 1])
            return cls("runs", np.stack([starts, stops], axis=1).astype(dtype), n)
        return cls("rows", idx.astype(dtype), n)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def single_run(self) -> tuple[int, int] | None:
        """``(start, stop)`` when the rows are one contiguous run (a slice serves them), else None."""
        if self.kind == "runs" and self.data.shape[0] == 1:
            return int(self.data[0, 0]), int(self.data[0, 1])
        if self.kind == "rows" and self.count:
            # Sorted distinct indices are one run exactly when they span count rows (a run of
            # two is kept as rows: two numbers either way).
            first, last = int(self.data[0]), int(self.data[-1])
            if last - first + 1 == self.count:
                return first, last + 1
        return None

    def indices(self) -> np.ndarray:
        """The sorted int64 indices."""
        if self.kind == "rows":
            return self.data.astype(np.int64)
        starts = self.data[:, 0].astype(np.int64)
        lengths = self.data[:, 1].astype(np.int64) - starts
        # Each row's index: its run's start plus its place in the run.
        offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        return offsets + np.arange(self.count, dtype=np.int64)
