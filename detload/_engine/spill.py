"""A mixed-order window's fixed columns spilled to a file on disk (`SpillPack`), not held in memory.

A mixed-order window holds its row groups decoded until its last block is built: on a
dataset of ``mix_window`` row groups, the whole dataset, where the windowed order held
``shuffle_window`` row groups. A `SpillPack` writes each piece, as it is read, to an
unlinked file in a spill folder (the system's temporary folder by default, `Pool.spill`)
and reads each block's rows back with one ``preadv`` per piece: the window's bytes then live
in the page cache, which the kernel writes back to disk and evicts under memory pressure,
not in the process's memory. The bytes of every block are the same as from a `WindowPack`.

File layout: piece after piece; a block-ordered piece (`Order` ``(runs, run, blocks)``) as
its ``blocks`` chunks (the rows a block takes of it, `MixTask.block_chunks`) then the rows
after them, each of those segments holding every group of columns (`_groups`) in turn as a
``(columns, rows)`` array. So a block's chunk of a piece, all its columns, is one contiguous
range of the file: one ``preadv`` scatters it into the block's staging arrays. Reads through
a memory map (each block's pages faulted in and dropped again) measured 2.3x slower than the
in-memory pack on CTR data: the kernel maps 64 KiB around each faulted page, and a block's
4 KiB runs of every column of every piece then mapped the whole window for each block.
A chunk that is part of a segment (a piece's rows after its runs, or a piece not cut into
runs) is read from a map of the file, and the map's pages are dropped after each block.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np

from .._columns import _workspace, slice_rows
from .._types import Column, ColumnSpec, UnitColumns
from .block import Order, Rows, _from_order, _reorder, _run_part, all_flat, pack_frame, placed

__all__ = ["SPILL_MIN_BYTES", "SpillPack", "sized_map", "spill_bytes", "spill_folder", "spill_name", "spills"]

#: A window is spilled when its fixed 1-D columns hold at least this many bytes: below it, the
#: memory saved is less than what the windowed order's blocks hold anyway.
SPILL_MIN_BYTES = 32 << 20
#: Iovecs per preadv/pwritev call (Linux's IOV_MAX is 1024).
_IOV = 512
#: A chunk inside a segment of at most this many bytes is read with the whole segment (one
#: call); a larger one through the map.
_SMALL_SEGMENT = 1 << 16


def spill_bytes(specs: Sequence[ColumnSpec], rows: int) -> int:
    """The bytes a window of ``rows`` rows holds in its fixed 1-D columns (what a spill moves to disk)."""
    return rows * sum(k * dt.itemsize for _, k, dt in pack_frame(specs, [], None)[0])


def spills(folder: str | None, specs: Sequence[ColumnSpec], rows: int, least: int) -> TypeGuard[str]:
    """Whether a packed window of ``rows`` rows of ``specs`` is spilled: a spill folder is at
    hand, every column is fixed-width and 1-D (a spill file holds no other), and they hold at
    least ``least`` bytes (`SPILL_MIN_BYTES`). Where a window is packed, and not read through a
    cache, is the engine's (_engine/worker.py) and the loader's warning's to say."""
    return folder is not None and all_flat(specs) and spill_bytes(specs, rows) >= least


def _segments(rows: int, order: Order) -> list[tuple[int, int]]:
    """A piece's segments in the file, as row ranges of the piece in its block order."""
    if order is None:
        return [(0, rows)]
    runs, run, blocks = order
    m = runs * run
    out = [(c * m, (c + 1) * m) for c in range(blocks)]
    if rows > m * blocks:
        out.append((m * blocks, rows))
    return out


def _segment_major(flat: np.ndarray, src: np.ndarray, order: Order, k: int, j: int = 0) -> None:
    """Rows of a piece in stored order (``src``: columns ``j..`` of a group of ``k``, as a
    ``(columns, rows)`` array) into ``flat``, the group's part of the piece's segments
    (`_segments`) one after another, each a ``(k, rows)`` array: block chunk c (run c of
    every period, `MixTask.block_chunks`) is ``(k, runs x run)`` at ``c x k x runs x run``."""
    c, rows = src.shape
    if order is None:
        flat.reshape(k, rows)[j : j + c] = src
        return
    runs, run, blocks = order
    m = runs * run * blocks
    # (columns, runs, blocks, run) in stored order -> (blocks, columns, runs, run)
    flat[: k * m].reshape(blocks, k, runs, run)[:, j : j + c] = src[:, :m].reshape(c, runs, blocks, run).transpose(2, 0, 1, 3)
    if rows > m:
        flat[k * m :].reshape(k, rows - m)[j : j + c] = src[:, m:]


def _write_all(fd: int, bufs: list[np.ndarray], at: int) -> None:
    """Write ``bufs`` back to back at offset ``at`` (short writes continued)."""
    for i in range(0, len(bufs), _IOV):
        part = [b.data.cast("B") for b in bufs[i : i + _IOV] if b.nbytes]
        want = sum(len(b) for b in part)
        done = os.pwritev(fd, part, at) if part else 0
        if done < want:
            rest = b"".join(bytes(b) for b in part)[done:]
            while rest:
                n = os.pwrite(fd, rest, at + done)
                done, rest = done + n, rest[n:]
        at += want


def _read_all(fd: int, bufs: list[np.ndarray], at: int) -> None:
    """Fill ``bufs`` (C-contiguous arrays) from the bytes back to back at offset ``at``."""
    _read_views(fd, [b.data.cast("B") for b in bufs], at)


def _read_views(fd: int, views: list[memoryview], at: int) -> None:
    """Fill ``views`` (writable byte views) from the bytes back to back at offset ``at``, at
    most `_IOV` views a call."""
    views = [v for v in views if len(v)]
    for i in range(0, len(views), _IOV):
        part = views[i : i + _IOV]
        want = sum(len(v) for v in part)
        done = os.preadv(fd, part, at)
        if done < want:
            _read_rest(fd, part, at, done, want)
        at += want


def _read_rest(fd: int, views: list[memoryview], at: int, done: int, want: int) -> None:
    """After a short read (never seen on a regular file): the rest one call at a time."""
    data = bytearray()
    while done + len(data) < want:
        got = os.pread(fd, want - done - len(data), at + done + len(data))
        if not got:
            raise OSError(f"the spill file ended {want - done - len(data)} bytes early")
        data += got
    pos = 0
    for v in views:
        lo, hi = max(pos, done), pos + len(v)
        if hi > lo:
            v[lo - pos : hi - pos] = data[lo - done : hi - done]
        pos += len(v)


class SpillPack:
    """A mixed-order window's pieces, their fixed 1-D columns in a spill file (see the module
    docstring), the others (ragged, multi-dimensional) in memory as a `WindowPack` holds them.
    Used where a `WindowPack` would be (`_engine/worker._new_pack`), for windows of at least
    `Pool.spill`'s threshold; its pieces (``UnitColumns.at``) name it as their pack."""

    __slots__ = ("file", "groups", "map", "orders", "row_bytes", "segments", "starts", "where")

    def __init__(self, specs: Sequence[ColumnSpec], piece_rows: Sequence[int], orders: Sequence[Order],
                 folder: str, path: str | None = None) -> None:
        """``path``: a file of this name, shared by the process workers of one window (each
        opens it, and writes the pieces it converts: `shared`); else an unlinked file in ``folder``."""
        self.groups, self.starts, self.orders = pack_frame(specs, piece_rows, orders)
        self.row_bytes = sum(k * dt.itemsize for _, k, dt in self.groups)
        #: per piece: its segments (first row, rows, byte offset in the file)
        self.where: list[list[tuple[int, int, int]]] = []
        at = 0
        for n, order in zip(piece_rows, self.orders):
            segs = []
            for lo, hi in _segments(n, order):
                segs.append((lo, hi - lo, at))
                at += (hi - lo) * self.row_bytes
            self.where.append(segs)
        self.segments = {(q, lo): i for q, segs in enumerate(self.where) for i, (lo, _, _) in enumerate(segs)}
        self.file: Any
        if path is None:
            # Unlinked (O_TMPFILE): nothing is left behind, even by a killed process; open for the pack's life.
            self.file = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115
        else:  # removed by the merger after the task's last block, and with the pool's folder
            self.file = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+b", buffering=0)
        try:
            self.map = sized_map(self.file.fileno(), at)
        except BaseException:
            self.file.close()
            raise

    def _segment_arrays(self, q: int, i: int) -> list[np.ndarray]:
        """Segment ``i`` of piece ``q``, each group's ``(columns, rows)`` array, mapped."""
        _, n, at = self.where[q][i]
        out = []
        for _, k, dt in self.groups:
            out.append(np.frombuffer(self.map, dtype=dt, count=k * n, offset=at).reshape(k, n))
            at += k * n * dt.itemsize
        return out

    def put(self, q: int, cols: UnitColumns, first: int, rows: int) -> UnitColumns:
        """Piece ``q`` (as `WindowPack.put`): its fixed 1-D columns written to the file in the
        piece's order (unless they already lie there); the piece returned holds the others."""
        from .block import stored_order

        s, order, here = placed(self, q, cols, first, rows)
        if not here:
            cols = stored_order(cols)
            packed = []
            for names, k, dt in self.groups:
                flat = np.empty(k * rows, dtype=dt)
                part = _run_part(cols, names, 0, k)
                if part is not None:
                    _segment_major(flat, part[:, first : first + rows], order, k)
                else:
                    for j, name in enumerate(names):
                        col = cols[name]
                        assert isinstance(col, np.ndarray)
                        _segment_major(flat, col[None, first : first + rows], order, k, j)
                packed.append(flat)
            bufs = [flat[lo * k : (lo + n) * k] for lo, n, _ in self.where[q]
                    for flat, (_, k, _) in zip(packed, self.groups)]
            _write_all(self.file.fileno(), bufs, self.where[q][0][2] if self.where[q] else 0)
        grouped = {name for names, _, _ in self.groups for name in names}
        out = UnitColumns()
        for name, col in cols.items():
            if name in grouped:
                continue
            rows_of = slice_rows(col, first, first + rows)
            out[name] = rows_of if here else _reorder(rows_of, order)
        out.at = (self, s, order, q)  # as a `WindowPack` piece's, and its number (empty pieces share a row)
        return out

    def piece(self, q: int) -> UnitColumns:
        """Piece ``q`` as `put` returns it, where another process wrote it to a shared file
        (a window of fixed 1-D columns only: nothing of it is held in memory)."""
        out = UnitColumns()
        out.at = (self, self.starts[q], self.orders[q], q)
        return out

    def stored(self, cols: UnitColumns) -> UnitColumns:
        """A piece of this pack in stored order, its fixed columns read back (`stored_order`)."""
        _, s, order, q = cols.at
        n = self.starts[q + 1] - s
        out = UnitColumns()
        for g, (names, k, dt) in enumerate(self.groups):
            packed = np.empty((k, n), dtype=dt)
            for i, (lo, m, _) in enumerate(self.where[q]):
                packed[:, lo : lo + m] = self._segment_arrays(q, i)[g]
            arr = _from_order(packed, order)
            for r, name in enumerate(names):
                out[name] = arr[r]
                out.runs[name] = (arr, r, names)
        self.settle()
        for name, col in cols.items():
            out[name] = _reorder(col, order, back=True)
        return out

    def gather(self, outs: Sequence[tuple[tuple[str, ...], np.ndarray]], units: Sequence[Mapping[str, Column]],
               ranges: Sequence[Rows], spans: Sequence[tuple[int, int]], perm: np.ndarray) -> None:
        """A block's fixed 1-D columns: ``outs`` (each group's names and ``(columns, rows)``
        destination) filled with the units' rows ``ranges`` (where they lie in their pieces
        as packed, `packed_rows`: one slice each), concatenated and permuted by ``perm``.

        Each unit's rows are read into a ``(columns, rows)`` staging array per group, at the
        unit's place in the block: a whole chunk with one ``preadv`` (an iovec per column
        row, the file's ``(columns, n)`` arrays back to back), then each group is permuted
        with one ``take``, as from an in-memory pack. (Staging unit after unit and gathering
        column by column, 84 calls a CTR block against 4, made thread W=2 35% slower.)"""
        rows = spans[-1][1] if spans else 0
        fd = self.file.fileno()
        stages = [_workspace(f"spill{g}", k * rows, dt).reshape(k, rows) for g, (_, k, dt) in enumerate(self.groups)]
        lines = [(stage[j].data.cast("B"), dt.itemsize) for stage, (_, k, dt) in zip(stages, self.groups)
                 for j in range(k)]
        mapped = False
        for u, (first, n, _, _), (e0, _) in zip(units, ranges, spans):
            q = u.at[3]  # type: ignore[attr-defined]
            i = self.segments.get((q, first))
            if i is not None and self.where[q][i][1] == n:  # a whole segment: one call
                _read_views(fd, [line[e0 * it : (e0 + n) * it] for line, it in lines], self.where[q][i][2])
                continue
            i = max(j for j, (lo, _, _) in enumerate(self.where[q]) if lo <= first)
            lo, m, at = self.where[q][i]
            if m * self.row_bytes <= _SMALL_SEGMENT:
                whole = [np.empty((k, m), dtype=dt) for _, k, dt in self.groups]
                _read_all(fd, whole, at)
            else:
                whole, mapped = self._segment_arrays(q, i), True
            for stage, src in zip(stages, whole):
                stage[:, e0 : e0 + n] = src[:, first - lo : first - lo + n]
        if mapped:
            self.settle()
        if not rows:
            return
        for stage, (_, out2d) in zip(stages, outs):
            # Every index is in range: "wrap" changes nothing but speed (as in `assemble`).
            np.take(stage, perm, axis=1, out=out2d, mode="wrap")

    def settle(self) -> None:
        """Drop the pages of the file's map from this process (they stay in the page cache)."""
        self.map.madvise(mmap.MADV_DONTNEED)


def sized_map(fd: int, size: int) -> mmap.mmap:
    """A shared map of the file ``fd`` sized to ``size`` bytes (at least one), its blocks taken
    up front: a full disk or /dev/shm fails here, never later as a SIGBUS in a page fault.
    Every worker of a shared window sizes its file alike: neither call changes bytes another
    worker wrote already."""
    os.ftruncate(fd, max(size, 1))
    os.posix_fallocate(fd, 0, max(size, 1))
    return mmap.mmap(fd, max(size, 1))


def spill_name(gen: int, epoch: int, partition: int, number: int) -> str:
    """The name of a task's shared spill file in the pool's folder (`WorkerConfig.spill_share`),
    for pass ``gen``. The pass is in the name: workers that share a window must all open one
    file, and another pass's merger removing its file of the same task (a pass stopped while
    this one starts, or a merger that outlived its join) between two workers' opens would have
    them hold two, a waiter reading rows from one that the claimer wrote into the other."""
    return f"{gen}-{epoch}-{partition}-{number}.spill"


def spill_folder(choice: Any) -> str | None:
    """The folder a window is spilled to for `Pool.spill`'s value: None for False; the system's
    temporary folder for True, unless that lies in memory (tmpfs, ramfs: a spill there would
    move the window from the process's memory into the page cache's, saving nothing)."""
    if choice is False:
        return None
    folder = tempfile.gettempdir() if choice is True else str(choice)
    if choice is True and _in_memory(folder):
        return None
    return folder


#: The mount table `_in_memory` reads.
_MOUNTS = "/proc/mounts"


def _in_memory(folder: str) -> bool:
    """Whether ``folder`` lies on a file system held in memory (from the mount table)."""
    try:
        with open(_MOUNTS, encoding="utf-8") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) > 2]
    except OSError:
        return False
    path = os.path.realpath(folder)
    best, kind = "", ""
    for point, fs in mounts:
        point = point.replace("\\040", " ")  # the table's escape of a space
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fs
    return kind in ("tmpfs", "ramfs")
