"""A mixed-order window's pack in a file that every process worker sharing the window maps (`MappedPack`).

Process workers that share a task's window (_engine/share.py) each build some of its blocks,
and every block takes a chunk of every piece. Where the window is not spilled
(_engine/spill.py: a cache is read, the window is small, or `Pool.spill` is off), its pieces
were the row groups' cache entries (the user's, or the pool's scratch ones in /dev/shm),
mapped in stored order: a block's chunk of a piece is runs spread over it, so each block
touched every page of the window, and bench.py's process W=2 warm row ran at 0.80x the
windowed order. Thread workers hold such a window in one `WindowPack`, each piece in its
block order, and gather a block's rows with one ``take`` per group; a pack per process would
hold the window once per worker. A `MappedPack` is that `WindowPack` with its arrays in one
file of the pool's (in /dev/shm where there is one), mapped shared by every worker of the
task: each worker copies the row groups it claims into it, and maps the others' as they
are finished. The window is then held once, block-ordered, and its blocks are cut as from
an in-memory pack: the bytes of every block are the same.

The file is sized and its memory taken up front (``posix_fallocate``), so a full /dev/shm
fails when the pack is made (the workers then share the window as cache entries, as before),
never later in a page fault. The merger unlinks it after the task's last block (a worker
keeping the window for the next pass keeps its map); the pool removes its folder.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence

import numpy as np

from .._types import ColumnSpec, UnitColumns
from .block import Order, WindowPack, _aligned
from .spill import sized_map

__all__ = ["MappedPack", "pack_name"]

def pack_name(gen: int, epoch: int, partition: int, number: int) -> str:
    """The name of a task's mapped pack in the pool's folder (`WorkerConfig.pack_share`), for
    pass ``gen`` (why the pass is in the name: `spill.spill_name`)."""
    return f"{gen}-{epoch}-{partition}-{number}.pack"


class MappedPack(WindowPack):
    """A `WindowPack` whose arrays lie in the file ``path``, mapped shared, for a window whose
    columns are all fixed-width and 1-D (`all_flat`: a piece another worker copied in is then
    the pack's rows alone, nothing of it in that worker's memory). Made by every worker of a
    shared window alike (the same path, specs, rows and orders give the same layout, and
    making it changes no byte another worker wrote)."""

    __slots__ = ("map", "path")

    def __init__(self, specs: Sequence[ColumnSpec], piece_rows: Sequence[int], orders: Sequence[Order],
                 path: str) -> None:
        self.path = path
        self.map: mmap.mmap | None = None
        super().__init__(specs, piece_rows, orders)

    def _storage(self, groups: Sequence[tuple[tuple[str, ...], int, np.dtype]], rows: int
                 ) -> dict[tuple[str, ...], np.ndarray]:
        offsets = []
        size = 0
        for _, k, dt in groups:
            offsets.append(size)
            size += _aligned(k * rows * dt.itemsize)  # each group's array at a 64-byte boundary
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            self.map = sized_map(fd, size)
        finally:
            os.close(fd)
        return {names: np.frombuffer(self.map, dtype=dt, count=k * rows, offset=at).reshape(k, rows)
                for (names, k, dt), at in zip(groups, offsets)}

    def piece(self, q: int) -> UnitColumns:
        """Piece ``q`` as `put` returns it, where another worker copied it into the file."""
        s = self.starts[q]
        out = UnitColumns()
        self._views(s, self.starts[q + 1] - s, out)
        out.at = (self, s, self.orders[q])
        return out
