"""Row operations on columns: a slice of rows (views) and a gather of rows (new arrays),
and the per-thread scratch arrays the gathers reuse.

Below both the reader (a filter's selection) and the engine (block assembly, the
merger's cuts), so that neither reaches into the other for them.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from ._arrow import int64_array
from ._types import Column, Ragged

__all__ = ["slice_rows", "take_rows"]

# Per-thread arrays reused by every block a worker builds: the scratch, the value
# index and the concatenated string/list columns. Fresh ones of several MB per
# block made the allocator hand pages back to the kernel and fault in zeroed ones
# again (about 900 faults per 65,536-row block of a string/list dataset with
# thread workers). Each keeps the largest size asked of it; a worker thread's go
# when it exits (the pool's close), a worker process's with the process.
_WORKSPACE = threading.local()


def _workspace(key: str, n: int, dtype: np.dtype | type) -> np.ndarray:
    """A reused array of ``n`` items of ``dtype`` for this thread; its contents are garbage."""
    spaces = getattr(_WORKSPACE, "spaces", None)
    if spaces is None:
        spaces = _WORKSPACE.spaces = {}
    dt = np.dtype(dtype)
    nbytes = n * dt.itemsize
    buf = spaces.get(key)
    if buf is None or buf.nbytes < nbytes:
        buf = spaces[key] = np.empty(max(nbytes, 1), dtype=np.uint8)
    return buf[:nbytes].view(dt)


def slice_rows(col: Column, lo: int, hi: int) -> Column:
    """Rows ``[lo, hi)`` of a column: a view (a Ragged's offsets are rebased, a small copy;
    a list of strings slices its strings the same way)."""
    if isinstance(col, Ragged):
        a, b = int(col.offsets[lo]), int(col.offsets[hi])
        offs = col.offsets[lo : hi + 1]
        return Ragged(slice_rows(col.values, a, b), offs - a if a else offs, col.kind)
    return col[lo:hi]


def take_rows(col: Column, idx: np.ndarray) -> Column:
    """Rows ``idx`` of a column, in that order, as a new column (a Ragged's values gathered too)."""
    if isinstance(col, Ragged):
        n = int(idx.shape[0])
        if isinstance(col.values, Ragged):  # a list of strings: gather the rows' strings
            offsets = np.zeros(n + 1, dtype=np.int64)
            items = _value_index(col.offsets, idx, offsets, None)
            return Ragged(take_rows(col.values, items), offsets, col.kind)
        lengths = np.diff(col.offsets)[idx]
        offsets = np.empty(n + 1, dtype=np.int64)
        values = np.empty((int(lengths.sum()), *col.values.shape[1:]), dtype=col.values.dtype)
        offsets[0] = 0
        if not n:
            return Ragged(values, offsets, col.kind)
        if col.kind in ("utf8", "binary") and col.values.dtype == np.uint8 and col.values.shape[0]:
            # Arrow's take copies each string whole (as _bytes_take, which takes a full permutation).
            src = pa.Array.from_buffers(pa.large_binary(), len(col),
                                        [None, pa.py_buffer(col.offsets), pa.py_buffer(col.values)])
            taken = src.take(int64_array(idx))
            bufs = taken.buffers()
            offs = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=taken.offset * 8)
            np.subtract(offs, offs[0], out=offsets)
            if bufs[2] is not None and values.shape[0]:
                values[:] = np.frombuffer(bufs[2], dtype=np.uint8)[offs[0] : offs[-1]]
        else:
            _ragged_take(col, idx, offsets, values)
        return Ragged(values, offsets, col.kind)
    return np.take(col, idx, axis=0)


def _bytes_take(src: Ragged, perm: np.ndarray, out_offsets: np.ndarray, out_values: np.ndarray) -> None:
    # Arrow's take copies each string whole; the generic path below builds an
    # int64 index per byte, which costs ~2x more for text columns.
    n = int(src.offsets.shape[0]) - 1
    arr = pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(src.offsets), pa.py_buffer(src.values)])
    taken = arr.take(int64_array(perm))  # not pa.array(perm), which imports pandas (see _arrow.py)
    bufs = taken.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=taken.offset * 8)
    np.subtract(offs, offs[0], out=out_offsets)
    if bufs[2] is not None and out_values.shape[0]:
        out_values[:] = np.frombuffer(bufs[2], dtype=np.uint8)[offs[0] : offs[-1]]


def _ragged_take(src: Ragged, perm: np.ndarray, out_offsets: np.ndarray, out_values: np.ndarray | Ragged) -> None:
    """Rows ``perm`` (a permutation of all of them) of ``src`` into ``out_offsets`` and ``out_values``."""
    values = src.values
    if isinstance(values, Ragged):
        # A list of strings: its rows' strings, gathered as a column of strings. Its own
        # workspace key: the strings' gather may build an index of its own.
        assert isinstance(out_values, Ragged)
        items = _value_index(src.offsets, perm, out_offsets, "index:items")
        _ragged_take(values, items, out_values.offsets, out_values.values)
        return
    assert isinstance(out_values, np.ndarray)
    if src.kind in ("utf8", "binary") and values.dtype == np.uint8 and values.shape[0]:
        _bytes_take(src, perm, out_offsets, out_values)
        return
    idx = _value_index(src.offsets, perm, out_offsets, "index")
    if idx.shape[0]:
        np.take(values, idx, out=out_values, mode="wrap")


def _value_index(offsets: np.ndarray, perm: np.ndarray, out_offsets: np.ndarray, key: str | None) -> np.ndarray:
    """Fill ``out_offsets`` with the offsets of rows ``perm`` of a column with ``offsets`` and
    return the source position of each of their values.

    ``key``: the workspace the index is built in (None: a new array)."""
    lengths = np.diff(offsets)[perm]
    out_offsets[0] = 0
    np.cumsum(lengths, out=out_offsets[1:])
    total = int(out_offsets[-1])
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    # Source position of every output value, as a running sum: +1 within a row, and
    # at the first value of each non-empty row a jump from where the previous one
    # ended to this row's start. One cumsum instead of an index built by repeat and
    # arange: 2.5x faster for a list<float32> column of 0-20 values per row.
    rows = np.flatnonzero(lengths)
    starts = offsets[:-1][perm[rows]]
    jump = starts.copy()
    jump[1:] -= starts[:-1] + lengths[rows[:-1]] - 1
    idx = _workspace(key, total, np.int64) if key is not None else np.empty(total, dtype=np.int64)
    idx.fill(1)
    idx[out_offsets[rows]] = jump
    np.cumsum(idx, out=idx)
    return idx
