"""What a worker is configured with: the planned files and plain picklable settings (and the test hooks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from .._cache import CacheConfig, KeptMappings
from .._filters.selection import Selection
from .._read import FileRef
from .._types import ColumnSpec
from .heap import BlockBuffers


@dataclass(frozen=True)
class DebugHooks:
    """Test hooks (never set in production): random per-unit delays and injected failures.

    ``delay_max`` seconds of delay, pseudo-random per (seed, epoch, unit) from
    ``delay_seed``; ``fail_unit`` a (relative path, row group) whose read raises
    ``fail_exc`` (an exception instance); ``stall_unit`` a unit whose read blocks
    for ``stall_seconds`` (only in epoch ``stall_epoch`` when that is set);
    ``die_unit`` a unit whose read kills the process (with ``die_signal``).
    """

    delay_max: float = 0.0
    delay_seed: int = 0
    fail_unit: tuple[str, int] | None = None
    fail_exc: BaseException | None = None
    stall_unit: tuple[str, int] | None = None
    stall_seconds: float = 3600.0
    stall_epoch: int | None = None
    die_unit: tuple[str, int] | None = None
    block_delay_max: float = 0.0  # benchmark/test: pseudo-random sleep before each block
    #: A unit whose file the reader truncates to half right after its pre-read size check,
    #: as a rewrite racing that read would (through a memory map: a real SIGBUS).
    shrink_unit: tuple[str, int] | None = None
    die_signal: int = 9  # the signal die_unit kills with


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs, as plain picklable data."""

    files: tuple[FileRef, ...]
    filesystem: pafs.FileSystem
    specs: tuple[ColumnSpec, ...]
    null_fill: Mapping[str, Any]
    shm_dir: str | None  # None: thread workers, blocks stay in the heap
    shm_prefix: str
    parent_pid: int
    debug: DebugHooks | None = None
    open_files: int = 32
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

    @property
    def block_specs(self) -> tuple[ColumnSpec, ...]:
        """The columns a block holds: the transform's output, else the columns read."""
        return self.transform.specs if self.transform is not None else self.specs
