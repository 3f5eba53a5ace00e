"""Assembling one block: concatenate its units' columns and apply the row permutation.

The gather is the hot loop of a worker: ``np.take(..., mode="clip")`` writes
straight into the destination (with the default ``mode="raise"`` NumPy gathers
into a temporary and copies it again), and several units are concatenated into
one reused scratch buffer rather than a fresh array per column.

The output of a block lives in one flat byte buffer (heap memory for thread
workers, a shared-memory segment for process workers). `Layout` describes where
each column lies in it, so the consumer side can rebuild zero-copy views.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ._types import Column, ColumnSpec, Ragged

__all__ = ["Layout", "assemble", "views"]

_ALIGN = 64


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class ArraySlot:
    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class ColumnSlot:
    name: str
    data: ArraySlot
    offsets: ArraySlot | None = None  # set for ragged columns
    ragged_kind: str = "list"


@dataclass(frozen=True)
class Layout:
    """Where each column of a block lies in its buffer. Small and picklable."""

    rows: int
    nbytes: int
    columns: tuple[ColumnSlot, ...]


def _plan_layout(specs: Sequence[ColumnSpec], rows: int, value_counts: dict[str, int]) -> Layout:
    pos = 0
    slots: list[ColumnSlot] = []
    for spec in specs:
        if spec.kind == "fixed":
            data = ArraySlot(pos, np.dtype(spec.dtype).str, (rows, *spec.inner))
            pos += _aligned(data.nbytes)
            slots.append(ColumnSlot(spec.name, data))
        else:
            offs = ArraySlot(pos, "<i8", (rows + 1,))
            pos += _aligned(offs.nbytes)
            data = ArraySlot(pos, np.dtype(spec.dtype).str, (value_counts[spec.name],))
            pos += _aligned(data.nbytes)
            slots.append(ColumnSlot(spec.name, data, offs, spec.ragged_kind))
    return Layout(rows, max(pos, 1), tuple(slots))


def _array(buf: np.ndarray, slot: ArraySlot) -> np.ndarray:
    count = int(np.prod(slot.shape, dtype=np.int64))
    dt = np.dtype(slot.dtype)
    return np.frombuffer(buf, dtype=dt, count=count, offset=slot.offset).reshape(slot.shape)


def views(buf: np.ndarray | memoryview | bytearray, layout: Layout) -> dict[str, Column]:
    """Zero-copy column views of a block buffer described by ``layout``."""
    out: dict[str, Column] = {}
    for c in layout.columns:
        data = _array(buf, c.data)  # type: ignore[arg-type]
        if c.offsets is None:
            out[c.name] = data
        else:
            out[c.name] = Ragged(data, _array(buf, c.offsets), c.ragged_kind)  # type: ignore[arg-type]
    return out


def _concat_ragged(parts: Sequence[Ragged]) -> Ragged:
    if len(parts) == 1:
        return parts[0]
    values = np.concatenate([p.values for p in parts])
    offs = [parts[0].offsets[:-1]]
    base = int(parts[0].offsets[-1])
    for p in parts[1:]:
        offs.append(p.offsets[:-1] + base)
        base += int(p.offsets[-1])
    offs.append(np.array([base], dtype=np.int64))
    return Ragged(values, np.concatenate(offs), parts[0].kind)


def _bytes_take(src: Ragged, perm: np.ndarray, out_offsets: np.ndarray, out_values: np.ndarray) -> None:
    # Arrow's take copies each string whole; the generic path below builds an
    # int64 index per byte, which costs ~2x more for text columns.
    n = int(src.offsets.shape[0]) - 1
    arr = pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(src.offsets), pa.py_buffer(src.values)])
    taken = arr.take(pa.array(perm))
    bufs = taken.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=taken.offset * 8)
    np.subtract(offs, offs[0], out=out_offsets)
    if bufs[2] is not None and out_values.shape[0]:
        out_values[:] = np.frombuffer(bufs[2], dtype=np.uint8)[offs[0] : offs[-1]]


def _ragged_take(src: Ragged, perm: np.ndarray, out_offsets: np.ndarray, out_values: np.ndarray) -> None:
    if src.kind in ("utf8", "binary") and src.values.dtype == np.uint8 and src.values.shape[0]:
        _bytes_take(src, perm, out_offsets, out_values)
        return
    lengths = np.diff(src.offsets)[perm]
    out_offsets[0] = 0
    np.cumsum(lengths, out=out_offsets[1:])
    total = int(out_offsets[-1])
    if total == 0:
        return
    # Source position of every output value: the row's source start plus its
    # position within the row.
    shift = np.repeat(src.offsets[:-1][perm] - out_offsets[:-1], lengths)
    idx = np.arange(total, dtype=np.int64)
    idx += shift
    np.take(src.values, idx, out=out_values, mode="clip")


def assemble(
    specs: Sequence[ColumnSpec],
    units: Sequence[dict[str, Column]],
    perm: np.ndarray | None,
    allocate: Callable[[int], np.ndarray],
) -> tuple[np.ndarray, Layout]:
    """Write the block (units concatenated, rows in ``perm`` order) into a new buffer.

    ``allocate(nbytes)`` returns a writable uint8 array of that size (heap or
    shared memory). Returns the buffer and its layout.
    """
    rows = sum(len(next(iter(u.values()))) for u in units) if specs else 0
    ragged = {s.name: _concat_ragged([u[s.name] for u in units]) for s in specs if s.kind == "ragged"}  # type: ignore[misc]
    layout = _plan_layout(specs, rows, {k: int(v.values.shape[0]) for k, v in ragged.items()})
    buf = allocate(layout.nbytes)
    out = views(buf, layout)
    scratch = np.empty(0, dtype=np.uint8)
    for spec in specs:
        dst = out[spec.name]
        if spec.kind == "fixed":
            assert isinstance(dst, np.ndarray)
            parts = [u[spec.name] for u in units]
            if perm is None:
                np.concatenate(parts, axis=0, out=dst)  # type: ignore[arg-type]
            else:
                if len(parts) == 1:
                    src = parts[0]
                else:
                    if scratch.nbytes < dst.nbytes:
                        scratch = np.empty(dst.nbytes, dtype=np.uint8)
                    src = scratch[: dst.nbytes].view(dst.dtype).reshape(dst.shape)
                    np.concatenate(parts, axis=0, out=src)  # type: ignore[arg-type]
                # Every index is in range (a permutation), so "clip" changes nothing but speed.
                np.take(src, perm, axis=0, out=dst, mode="clip")  # type: ignore[arg-type,call-overload]
        else:
            assert isinstance(dst, Ragged)
            src_r = ragged[spec.name]
            if perm is None:
                dst.offsets[:] = src_r.offsets
                dst.values[:] = src_r.values
            else:
                _ragged_take(src_r, perm, dst.offsets, dst.values)
    return buf, layout
