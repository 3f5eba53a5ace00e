"""A mixed-order window's fixed columns spilled to a file on disk (`SpillPack`), not held in memory.

A mixed-order window holds its row groups decoded until its last block is built: on a
dataset of ``mix_window`` row groups, the whole dataset, where the windowed order held
``shuffle_window`` row groups. A `SpillPack` writes each piece, as it is read, to an
unlinked file in a spill folder (the system's temporary folder by default, `Pool.spill`)
and reads each block's rows back a few columns at a time, one ``preadv`` per piece and stage
(`SpillPack.gather`); a pool reuses the file for its next window (`_Reuse`). The window's bytes then live
in the page cache, which the kernel writes back to disk and evicts under memory pressure,
not in the process's memory. The bytes of every block are the same as from a `WindowPack`.
A piece's string, list and multi-dimensional columns are written, in its block order, to a
file of their own (the cache's entry format, no checksum) and mapped from there unpopulated;
after each block their pages are dropped from the process (`SpillPack.settle_beside`), so a
worker maps about a block's rows of them at a time (`SpillPack.publish`).

File layout: piece after piece; a block-ordered piece (`Order` ``(runs, run, blocks)``) as
its ``blocks`` chunks (the rows a block takes of it, `MixTask.block_chunks`) then the rows
after them, each of those segments holding every group of columns (`_groups`) in turn as a
``(columns, rows)`` array. So a block's chunk of a piece, all its columns, is one contiguous
range of the file, and so is any run of its columns of one group: one ``preadv`` scatters a
stage's columns of it into the staging array. Reads through
a memory map (each block's pages faulted in and dropped again) measured 2.3x slower than the
in-memory pack on CTR data: the kernel maps 64 KiB around each faulted page, and a block's
4 KiB runs of every column of every piece then mapped the whole window for each block.
A chunk that is part of a segment (a piece's rows after its runs, or a piece not cut into
runs) is read from a map of the file, and the map's pages are dropped after each block; of a
segment of at most `_SMALL_SEGMENT` bytes, the segment is read whole into a reused buffer and
only the chunk's rows are kept (`SpillPack._small_units`).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np

from .._columns import _workspace, slice_rows
from .._fdless import address_of, libc
from .._types import Column, ColumnSpec, UnitColumns
from .block import Order, Rows, _from_order, _reorder, _run_part, all_flat, pack_frame, placed

__all__ = ["SPILL_MIN_BYTES", "SpillPack", "beside_name", "hold_spill_files", "release_spill_files", "sized_map",
           "spill_bytes", "spill_folder", "spill_name", "spills"]

#: A window is spilled when its fixed 1-D columns hold at least this many bytes: below it, the
#: memory saved is less than what the windowed order's blocks hold anyway.
SPILL_MIN_BYTES = 32 << 20
#: Iovecs per preadv/pwritev call (Linux's IOV_MAX is 1024).
_IOV = 512
#: A chunk inside a segment of at most this many bytes is read with the whole segment (one
#: call, into a reused buffer: `SpillPack._small_units`); a larger one through the map. Such
#: segments are a piece's rows after its runs (under 17 rows a block) or a piece too short to
#: be cut into runs (under 32 rows a block), so they are small unless rows are wide. Through
#: the map, a block of row groups of 256 rows of 800 bytes (segments of 200 KiB) mapped every
#: piece's segment, the kernel's fault-around taking the pages beside each chunk: 1.37-1.63x
#: the windowed order's peak PSS, against 1.02x read whole, for epochs of 0.44-0.58 against
#: 0.77-0.85 s (the windowed order's 2.0-2.2 s; `experiments/bench/small_segments.py`, two
#: rounds, 2026-12-08). Up to 4 MiB they are read whole (64 KiB before).
_SMALL_SEGMENT = 4 << 20
#: A block's rows are read and permuted this many bytes of columns at a time (about L2).
_STAGE_BYTES = 2 << 20


def spill_bytes(specs: Sequence[ColumnSpec], rows: int) -> int:
    """The bytes a window of ``rows`` rows holds in its fixed 1-D columns (what a spill moves to disk)."""
    return rows * sum(k * dt.itemsize for _, k, dt in pack_frame(specs, [], None)[0])


def spills(folder: str | None, specs: Sequence[ColumnSpec], rows: int, least: int,
           beside_row_bytes: float = 0.0) -> TypeGuard[str]:
    """Whether a packed window of ``rows`` rows of ``specs`` is spilled: a spill folder is at
    hand and the window takes at least ``least`` bytes (`SPILL_MIN_BYTES`, and never none):
    its fixed-width 1-D columns (what the spill file holds) and ``beside_row_bytes`` a row for
    its string, list and multi-dimensional columns (the loader's estimate from the Parquet
    metadata, `WorkerConfig.spill_beside_row_bytes`), which then go to files beside the spill
    file, mapped a block's rows at a time (`SpillPack.publish`). So a window of mostly
    strings is spilled too: counted by its fixed columns alone, a window of text features
    stayed whole on every worker's heap. Where a window is packed, and not read through a
    cache, is the engine's (_engine/worker.py) and the loader's warning's to say."""
    return folder is not None and spill_bytes(specs, rows) + rows * beside_row_bytes >= max(least, 1)


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


def _raw(a: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, as a byte view (what ``preadv``/``pwritev`` take).
    Through ``uint8``: the buffer protocol has no format for datetime64 and timedelta64, so
    ``a.data`` of a timestamp column raises."""
    return a.reshape(-1).view(np.uint8).data


def _write_all(fd: int, bufs: list[np.ndarray], at: int) -> None:
    """Write ``bufs`` back to back at offset ``at`` (short writes continued)."""
    for i in range(0, len(bufs), _IOV):
        part = [_raw(b) for b in bufs[i : i + _IOV] if b.nbytes]
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
    _read_views(fd, [_raw(b) for b in bufs], at)


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
    docstring), the others (ragged, multi-dimensional) in memory as a `WindowPack` holds them,
    or, for process workers sharing the window (a file at ``path``), mapped from a file of the
    piece's beside it (`publish`, `piece`). Used where a `WindowPack` would be
    (`_engine/worker._new_pack`, `_shared_pack`), for windows of at least `Pool.spill`'s
    threshold; its pieces (``UnitColumns.at``) name it as their pack."""

    __slots__ = ("beside", "file", "folder", "groups", "map", "mapped", "orders", "path", "reuse", "row_bytes",
                 "segments", "starts", "whole", "where")

    def __init__(self, specs: Sequence[ColumnSpec], piece_rows: Sequence[int], orders: Sequence[Order],
                 folder: str, path: str | None = None, whole: bool = False) -> None:
        """``path``: a file of this name, shared by the process workers of one window (each
        opens it, and writes the pieces it converts: `shared`); else an unlinked file in
        ``folder``. ``whole``: `gather` stages each group's columns at once (see there)."""
        self.whole = whole
        self.path = path
        #: whether a piece holds columns beside the file (strings, lists, multi-dimensional):
        #: they are written to files of their own and mapped from there (`publish`)
        self.beside = not all_flat(specs)
        #: the maps of the pieces' columns beside the file (`publish`, `piece`), whose pages
        #: `settle_beside` drops after each block; held here so that no address it hands back
        #: is ever another map's (a map is unmapped when nothing views it); with each its
        #: address and bytes, taken once (a block's calls for every map had cost a tenth of it)
        self.mapped: list[tuple[np.ndarray, int, int]] = []
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
        self.folder = folder if path is None else None
        # The free files the pack's goes back to: this process's when it was made (a pack
        # freed in a forked child gives its file back to the parent's, which the child never
        # uses), and reachable at interpreter exit, when module globals may be gone.
        self.reuse = _REUSE
        if path is None:
            # Unlinked (O_TMPFILE): nothing is left behind, even by a killed process; open for
            # the pack's life, then for the next pack of this process (`_Reuse`).
            self.file = self.reuse.take(folder)
        else:  # removed by the merger after the task's last block, and with the pool's folder
            self.file = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+b", buffering=0)
        try:
            self.map = sized_map(self.file.fileno(), at)
        except BaseException:
            self.file.close()
            raise

    def __del__(self) -> None:
        # The file (not the map: views of it may outlive the pack) goes to the next pack.
        folder = getattr(self, "folder", None)
        if folder is not None and hasattr(self, "map"):
            self.reuse.give(folder, self.file)

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
            for g, (names, k, dt) in enumerate(self.groups):
                # Reused: a fresh array faulted its pages in for every piece written.
                flat = _workspace(f"spill-flat{g}", k * rows, dt)
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

    def publish(self, q: int, piece: UnitColumns) -> UnitColumns:
        """Piece ``q`` as `put` returned it, its columns held beside the file (strings, lists,
        multi-dimensional ones, in the piece's block order) moved off this process's heap:
        written to a file of their own and mapped from there, unpopulated (the piece returned
        holds the map's views). A block takes one slice of each piece's such columns and
        `settle_beside` drops their pages after it, so the window's strings and lists live in
        the page cache as its fixed columns do, where the heap had held them whole (a mixed
        order window of text features: `mix_window` row groups of strings per worker).

        For process workers sharing the window (a file at ``path``) that file is named beside
        it (`beside_name`) and the other workers map it too (`piece`); else it is unlinked from
        the start, in the spill folder. Raises OSError where it cannot be written (no room):
        the caller keeps the piece as given (and the other workers sharing the window convert
        the row group themselves: `piece` finds no file)."""
        if not self.beside:
            return piece
        from .._cache.entry import _checked, _entry
        from .._cache.format import _buffers, _serialize
        from .._cache.mapping import _map, _Mapping, _mmap_read
        from .._cache.write import _pwritev_all

        path = beside_name(self.path, q) if self.path is not None else None
        laid = _serialize(path or "", list(piece.items()))
        if laid is None:  # a header past its room (never seen): kept on the heap, as on a full disk
            raise OSError(f"{len(piece)} columns do not fit an entry's header")
        mapping: _Mapping | None
        if path is None:
            assert self.folder is not None
            with tempfile.TemporaryFile(dir=self.folder) as f:  # unlinked: nothing is left behind
                fd = f.fileno()
                _pwritev_all(fd, _buffers(laid, checksum=False), 0)
                st = os.fstat(fd)
                mapping = _Mapping(_mmap_read(fd, st.st_size, populate=False), (st.st_dev, st.st_ino))
        else:
            part = f"{path}.{os.getpid()}.{threading.get_ident()}"
            try:
                fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    _pwritev_all(fd, _buffers(laid, checksum=False), 0)
                finally:
                    os.close(fd)
                os.replace(part, path)  # whole or not there: a waiter maps it once the claim is finished
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(part)
                raise
            mapping = _map(path, populate=False)
        if mapping is None:  # removed meanwhile (a stopped pass): this worker's copy serves
            return piece
        out = _checked(_entry(mapping, path, False, verify=False), path or "", False)
        out.at = piece.at
        self.mapped.append((mapping.buf, *address_of(mapping.buf)))
        return out

    def piece(self, q: int) -> UnitColumns | None:
        """Piece ``q`` as `put` returns it, where another process wrote it to a shared file: its
        fixed 1-D columns lie there, and its others (`beside`) are mapped from the file that
        worker published them in (`publish`); None where there is none (that worker could not
        write it), and the row group is then this worker's to convert."""
        out = UnitColumns()
        if self.beside:
            assert self.path is not None
            from .._cache.entry import _checked, _entry
            from .._cache.format import _Corrupt
            from .._cache.mapping import _map

            path = beside_name(self.path, q)
            try:
                mapping = _map(path, populate=False)
                if mapping is None:
                    return None
                out = _checked(_entry(mapping, path, False, verify=False), path, False)
            except (OSError, _Corrupt):
                return None
            self.mapped.append((mapping.buf, *address_of(mapping.buf)))
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

        A few columns at a time (`_STAGE_BYTES` of the block's rows): those columns of every
        unit are read into a ``(columns, rows)`` staging array at the unit's place in the
        block, then permuted with one ``take`` while the stage is still in L2. A unit that is
        a whole segment of the file (a block's chunk of a piece: the usual case) is read with
        one ``preadv`` per stage (an iovec per column, the segment's ``(columns, n)`` arrays
        back to back); one that is part of a segment (the rows a piece has after its runs, a
        resumed block) is copied from the segment read whole, or mapped where it is large.
        A CTR block is read in 8 stages, 496 calls; staging the whole block first (13 MiB,
        one call per unit: 62) left the ``take`` reading it back from L3 or memory, 1.33x as
        long a block (`experiments/bench/spill_io.py`: 6.85 against 5.16 ms); through the
        loader, thread W=1 / W=2 on 4M CTR rows spent 0.39-0.49 / 0.47-0.69 s an epoch in
        this method before and 0.36-0.40 / 0.46-0.56 s now (three alternating rounds). Staging unit after unit and
        gathering column by column (84 ``take`` calls a CTR block against 4) had made thread
        W=2 35% slower: here the calls are system calls, which release the GIL. But thread
        workers sharing a window (the pack's ``whole``) stage each group whole, in one call
        per unit and group: there the stages measured 7-9% slower in wall time for the same
        CPU (thread W=2 on 1M CTR rows, one window kept: `experiments/bench/paired_cpu.py
        --order mix`, two runs of six pairs), where every other case gained 4-9% from them
        (process W=2 on 1M rows, thread and process W=2 on 4M; thread W=1 the same)."""
        rows = spans[-1][1] if spans else 0
        if not rows:
            return
        fd = self.file.fileno()
        # Per unit: (its segment's offset, rows, first row of the unit in it, place in the
        # block, rows) and, unless it is the whole segment, the segment's arrays.
        where: list[tuple[int, int, int, int, int, list[np.ndarray] | None]] = []
        mapped = False
        small = []  # the places in `where` of the units that are parts of small segments
        for u, (first, n, _, _), (e0, _) in zip(units, ranges, spans):
            q = u.at[3]  # type: ignore[attr-defined]
            i = self.segments.get((q, first))
            if i is None or self.where[q][i][1] != n:
                i = max(j for j, (lo, _, _) in enumerate(self.where[q]) if lo <= first)
            lo, m, at = self.where[q][i]
            arrays: list[np.ndarray] | None = None
            if m != n:
                if m * self.row_bytes <= _SMALL_SEGMENT:
                    small.append(len(where))
                else:
                    arrays, mapped = self._segment_arrays(q, i), True
            where.append((at, m, first - lo, e0, n, arrays))
        if small:
            self._small_units(fd, where, small)
        before = 0  # the bytes a row of the groups before this one takes in a segment
        for g, ((_, k, dt), (_, out2d)) in enumerate(zip(self.groups, outs)):
            it = dt.itemsize
            step = k if self.whole else min(k, max(1, _STAGE_BYTES // (rows * it)))
            stage = _workspace("spill-stage", step * rows, dt)
            for j0 in range(0, k, step):
                j1 = min(k, j0 + step)
                st = stage[: (j1 - j0) * rows].reshape(j1 - j0, rows)
                lines = [_raw(st[j]) for j in range(j1 - j0)]
                for at, m, skip, e0, n, arrays in where:
                    if arrays is None:
                        _read_views(fd, [line[e0 * it : (e0 + n) * it] for line in lines], at + m * (before + j0 * it))
                    else:
                        st[:, e0 : e0 + n] = arrays[g][j0:j1, skip : skip + n]
                # Every index is in range: "wrap" changes nothing but speed (as in `assemble`).
                np.take(st, perm, axis=1, out=out2d[j0:j1], mode="wrap")
            before += k * it
        if mapped:
            self.settle()

    def _small_units(self, fd: int, where: list[tuple[int, int, int, int, int, list[np.ndarray] | None]],
                     small: list[int]) -> None:
        """The rows of the units that are parts of small segments (`gather`), each segment read
        whole into one reused buffer and the unit's rows of it copied out, all units' side by
        side in one reused array per group; their `where` entries then name those rows. Each
        unit had its segment read into arrays of its own, all held until the block's stages ran:
        where every chunk of a piece is part of one segment (row groups of a few hundred rows,
        a chunk under `MIX_MIN_RUN` x 2 rows: 16 rows of each of 3,900 row groups a block), that
        was the whole window in memory at every block, allocated and freed again (2026-12-08:
        880 against the windowed order's 489 MiB peak, and 2.5 s an epoch against 2.4)."""
        total = sum(where[w][4] for w in small)
        parts = [_workspace(f"spill-small{g}", k * total, dt).reshape(k, total)
                 for g, (_, k, dt) in enumerate(self.groups)]
        seg = _workspace("spill-segment", max(where[w][1] for w in small) * self.row_bytes, np.uint8)
        p0 = 0
        for w in small:
            at, m, skip, e0, n, _ = where[w]
            _read_all(fd, [seg[: m * self.row_bytes]], at)
            off = 0
            for part, (_, k, dt) in zip(parts, self.groups):
                size = k * m * dt.itemsize
                part[:, p0 : p0 + n] = seg[off : off + size].view(dt).reshape(k, m)[:, skip : skip + n]
                off += size
            where[w] = (at, m, 0, e0, n, [part[:, p0 : p0 + n] for part in parts])
            p0 += n

    def settle(self) -> None:
        """Drop the pages of the file's map from this process (they stay in the page cache)."""
        self.map.madvise(mmap.MADV_DONTNEED)

    def settle_beside(self) -> None:
        """After a block: drop the pages of the maps of the pieces' columns beside the file from
        this process (they stay in the page cache; the next block faults in its own rows). A
        block takes one slice of each piece's such columns, held in the piece's block order."""
        lib = libc() if self.mapped else None
        if lib is None:
            return
        for _, addr, size in self.mapped:
            lib.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(size), mmap.MADV_DONTNEED)


class _Reuse:
    """Unlinked spill files of this process that no pack holds, by folder, for the next pack
    while a pool spilling there is open (`hold_spill_files`): a new file's pages are allocated
    as it is written and freed as it is closed, which cost about as much CPU as the writes
    themselves (`experiments/bench/spill_io.py`: 107 against 33 ms of CPU a 200 MiB window;
    through the loader, thread W=1 on 4M CTR rows spent 0.32 s an epoch writing its windows
    in the first epoch, 0.14-0.15 s in the epochs after). Without a pool holding the folder,
    a pack's file is closed with it. A reused file lives long enough for the kernel to write
    its dirty pages back to disk (after about 30 s), which a file closed after its window's
    few seconds never needed: a worker's window written to disk about every half minute."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: dict[str, list[Any]] = {}
        self.holders: dict[str, int] = {}

    def take(self, folder: str) -> Any:
        with self.lock:
            files = self.free.get(folder)
            if files:
                return files.pop()
        return tempfile.TemporaryFile(dir=folder)  # noqa: SIM115

    def give(self, folder: str, file: Any) -> None:
        with self.lock:
            files = self.free.setdefault(folder, [])
            if self.holders.get(folder, 0) > 0 and len(files) < _KEEP_FILES:
                files.append(file)
                return
        file.close()

    def hold(self, folder: str) -> None:
        with self.lock:
            self.holders[folder] = self.holders.get(folder, 0) + 1

    def release(self, folder: str) -> None:
        """One holder of ``folder`` is done; with none left, its free files are closed (their
        disk space and pages handed back now, not at the process's exit)."""
        with self.lock:
            self.holders[folder] -= 1
            files = self.free.pop(folder, []) if not self.holders[folder] else []
        for f in files:
            f.close()


#: Spill files a process keeps for its next packs: a worker holds at most one window per
#: partition it builds, and one kept for the next pass.
_KEEP_FILES = 2
_REUSE = _Reuse()


def hold_spill_files(folder: str | None) -> None:
    """A pool (thread workers) or a worker process spilling to ``folder`` starts: the files of
    its packs are kept for its next ones until `release_spill_files`."""
    if folder is not None:
        _REUSE.hold(folder)


def release_spill_files(folder: str | None) -> None:
    """The pool of `hold_spill_files` closed."""
    if folder is not None:
        _REUSE.release(folder)


def _forget_files() -> None:
    """In a child forked from this process: the files are the parent's (one offset, one set of
    pages); a pack of the child's must not write into them."""
    global _REUSE
    _REUSE = _Reuse()


os.register_at_fork(after_in_child=_forget_files)


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


def beside_name(path: str, q: int) -> str:
    """The file next to a shared spill file ``path`` that holds piece ``q``'s columns kept
    beside it (`SpillPack.publish`); removed with it (the merger, after the task's last block)."""
    return f"{path}.{q}"


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
