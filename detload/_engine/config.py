"""What a worker is configured with: the planned files and plain picklable settings.

The test hooks a worker obeys (`DebugHooks`) live with the others in detload/_hooks.py; a
configuration carries them in one field, ``hooks``, None in production.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow.fs as pafs

from .._cache import CacheConfig, KeptMappings
from .._filters.selection import Selection
from .._hooks import DebugHooks
from .._read import FileRef
from .._types import ColumnSpec
from .heap import BlockBuffers
from .shm import SHM_DIR

__all__ = ["DebugHooks", "FileRef", "WorkerConfig", "WorkerKind"]

#: Where a worker runs: a thread of the consumer's process (blocks in heap slabs, heap.py) or a
#: process of its own (blocks in /dev/shm segments, shm.py).
WorkerKind = Literal["thread", "process"]


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs, as plain picklable data."""

    files: tuple[FileRef, ...]
    filesystem: pafs.FileSystem
    specs: tuple[ColumnSpec, ...]
    null_fill: Mapping[str, Any]
    kind: WorkerKind
    #: Process workers: the start of their segments' names in `shm_dir` (the consumer's pid and
    #: the pool's token, see shm.segment_prefix).
    shm_prefix: str = ""
    #: Test hooks (detload/_hooks.py): worker delays and injected failures. None in production.
    hooks: DebugHooks | None = None
    cache: CacheConfig | None = None
    buffers: BlockBuffers | None = None  # thread workers: reused block buffers (never pickled)
    kept: KeptMappings | None = None  # thread workers: cache entries kept mapped (never pickled)
    #: A filter's selection: (file index, row group) -> the stored rows it delivers (compact);
    #: a row group not in it delivers every stored row. Fixed for the loader's life.
    selections: Mapping[tuple[int, int], Selection] | None = None
    #: group_by: the key column and the group columns (the key among them), checked to be
    #: constant within every group of each block built.
    group_by: str | None = None
    group_columns: tuple[str, ...] = ()
    #: group_by with a cache: the group columns' specs, read apart from ``specs`` (then the item
    #: columns only) and kept in the cache once per key run (_engine/groups.group_rows).
    group_specs: tuple[ColumnSpec, ...] = ()
    #: A transform (_xform.TransformPlan): run on each row group after the selection; its
    #: output schema (``transform.specs``) is what blocks hold. None: columns as read.
    transform: Any = None
    #: How local files are opened: Storage.memory_map's value (False, "auto" or True; thread
    #: workers get False for "auto"), see _read/mapping.should_map.
    memory_map: bool | str = False
    #: The mixed order with more than one worker: the workers share task windows, block k
    #: going to worker k mod W (_engine/share.py).
    share_windows: bool = False
    #: Process workers sharing windows: the folder of their row-group claims (the windows are
    #: cache entries: the user's cache, or the pool's scratch one, ``scratch``).
    share_dir: str | None = None
    scratch: bool = False
    #: Thread workers sharing windows: the converted row groups they hand each other
    #: (share.MemoryShare, never pickled).
    window_share: Any = None
    #: Where a mixed-order window of at least ``spill_min`` bytes of fixed columns is spilled
    #: (_engine/spill.py; `Pool.spill`), or None: windows are held in memory.
    spill_dir: str | None = None
    spill_min: int = 32 << 20
    #: The estimated bytes a row of the block's string, list and multi-dimensional columns
    #: converts to (the loader's, from the Parquet metadata): counted with the fixed columns
    #: against ``spill_min`` (`spill.spills`), the same on every worker and in the loader.
    spill_beside_row_bytes: float = 0.0
    #: Process workers sharing windows without a cache: the pool's folder in ``spill_dir`` of
    #: the windows they share as one spill file each (named by `spill_name`), or None.
    spill_share: str | None = None
    #: Why that folder could not be made where it was to be (the spill folder gone, full or
    #: read-only when the pool started): the windows are then held in mapped packs, in
    #: memory, and the first worker to hold one where it would have spilled it warns.
    spill_error: str | None = None
    #: Process workers sharing windows: the pool's folder of the windows they hold in one mapped
    #: file each (_engine/mapped.py; named by `pack_name`) where they are not spilled, or None.
    pack_share: str | None = None

    @property
    def shm_dir(self) -> str | None:
        """Where process workers make their segments (None for thread workers)."""
        return SHM_DIR if self.kind == "process" else None

    @property
    def block_specs(self) -> tuple[ColumnSpec, ...]:
        """The columns a block holds: the transform's output, else the columns read."""
        return self.transform.specs if self.transform is not None else self.specs
