"""Option groups of `Loader`: the settings that never change a byte of any batch.

`Pool`, `Cache`, `Distributed` and `Storage` are frozen dataclasses checked when
they are made, each with a plain shorthand (``pool="process"``, ``cache="/nvme/c"``,
``distributed=(rank, world_size)``, ``storage=<filesystem>``). The options that
decide the batches stay flat keywords of `Loader`.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ._check import check_cache_dir, check_int, check_seconds, folder_text
from .errors import OptionError

__all__ = ["Cache", "Distributed", "MemoryMap", "Pool", "Storage"]

PoolKind = Literal["thread", "process"]
#: `Storage.memory_map`'s values, the same from the option down to the reader (_read/mapping.py).
MemoryMap = Literal[False, "auto", True]
#: Blocks queued per worker at most: each holds shuffle_window row groups, so more
#: only holds memory (and a process queue's semaphore cannot count past 2**31 - 1).
MAX_PREFETCH = 1024
#: Seconds; longer waits are asked for with stall_timeout=None.
MAX_STALL_TIMEOUT = 1e9

# Each group checks its fields under the names a message should show: the field's own
# ("Pool.prefetch") when the group is built, a shorthand's ("pool") or a command-line
# flag's ("--prefetch", cli.py) where the value came from there.


def _check_pool(kind: Any, prefetch: Any, stall_timeout: Any, trace: Any, names: Mapping[str, str]) -> tuple[Any, ...]:
    if kind not in ("thread", "process"):
        raise OptionError(f"{names['kind']} must be 'thread' or 'process', got {kind!r}")
    prefetch = check_int(names["prefetch"], prefetch, 1, MAX_PREFETCH, what="blocks queued per worker")
    stall_timeout = check_seconds(names["stall_timeout"], stall_timeout, most=MAX_STALL_TIMEOUT,
                                  none_means="wait forever")
    if not isinstance(trace, bool):
        raise OptionError(f"{names['trace']} must be True or False, got {type(trace).__name__} {trace!r}")
    return kind, prefetch, stall_timeout, trace


@dataclass(frozen=True)
class Pool:
    """How blocks are computed; never what they contain.

    - ``kind``: ``"thread"`` (default) or ``"process"``. Threads share memory and need
      no ``/dev/shm``; processes avoid the GIL for conversion and hand blocks over
      through shared memory.
    - ``prefetch``: blocks each worker may have finished and queued ahead of the
      merger, an int in [1, 1024] (default 2).
    - ``stall_timeout``: seconds (at most 1e9) a worker may make no progress while the
      merger waits on it before ``WorkerStalledError``; ``None`` waits forever (default 300).
    - ``trace``: record stage timings for ``stats()`` and the trace file (default True).
    - ``block_memory``: the block size (bytes, or a size such as ``"1GiB"``, the
      default) above which planning warns once (``BlockMemoryWarning``) that a
      block of the plan would hold more; ``None``: no warning. Changes no batch.
    - ``spill``: where a mixed-order window (the row groups a task's blocks are cut from,
      held until its last block), when it takes 32 MiB or more (its fixed-width 1-D columns,
      and its string, list and multi-dimensional columns as estimated from the Parquet
      metadata) and is read without a cache, is kept (its fixed 1-D columns in one file, the
      others in files beside it, mapped a block's rows at a time): ``True`` (default), in an
      unlinked file in the system's temporary folder
      (``tempfile.gettempdir()``), in memory where that folder is itself in memory
      (tmpfs); a folder path, in a file there; ``False``, in memory. A spilled
      window lives in the page cache, which the kernel writes to disk and evicts
      under memory pressure, instead of the workers' memory; a pool keeps up to
      two such files a folder (per worker process) for its next windows, closed
      with it. Changes no batch.

    Shorthand: ``pool="process"`` is ``Pool(kind="process")``.
    """

    kind: PoolKind = "thread"
    prefetch: int = 2
    stall_timeout: float | None = 300.0
    trace: bool = True
    block_memory: int | str | None = "1GiB"
    spill: bool | str = True

    def __post_init__(self) -> None:
        from ._cache import parse_size  # start-up time: _cache imports NumPy, `import detload` must not

        _set(self, zip(("kind", "prefetch", "stall_timeout", "trace"),
                       _check_pool(self.kind, self.prefetch, self.stall_timeout, self.trace, _names(Pool))))
        parse_size(self.block_memory, "Pool.block_memory")  # refused now, not at the first plan
        object.__setattr__(self, "spill", check_spill("Pool.spill", self.spill))

    @property
    def block_memory_bytes(self) -> int | None:
        """``block_memory`` in bytes (None: no warning)."""
        from ._cache import parse_size  # start-up time: _cache imports NumPy, `import detload` must not

        return parse_size(self.block_memory, "Pool.block_memory")


def check_spill(name: str, value: Any) -> bool | str:
    """`Pool.spill`'s value: True, False, or a path of an existing folder (as a str)."""
    if isinstance(value, bool):
        return value
    text = folder_text(name, value, "True, False or a folder's path")
    if not os.path.isdir(text):
        on, off = ("'on'", "'off'") if name.startswith("--") else ("True", "False")
        raise OptionError(f"{name}: {text!r} is not a folder (the spill file of a mixed-order window goes "
                          f"there; pass an existing folder, {on} for the system's temporary folder, or {off})")
    return text


def _check_cache(dir: Any, limit: Any, map_limit: Any, names: Mapping[str, str]) -> tuple[Any, ...]:
    _check_sizes(limit, map_limit, names)
    return check_cache_dir(names["dir"], dir), limit, map_limit


def _check_sizes(limit: Any, map_limit: Any, names: Mapping[str, str]) -> None:
    from ._cache import parse_size  # start-up time: _cache imports NumPy, `import detload` must not

    parse_size(limit, names["limit"])
    if not (map_limit is None or _is_auto(map_limit)):
        parse_size(map_limit, names["map_limit"], zero=True, also="; 'auto' (the default) is also accepted")


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


@dataclass(frozen=True)
class Cache:
    """The local row-group cache of converted NumPy arrays; cold, warm and uncached runs yield the same batches.

    - ``dir``: the cache folder (a local SSD; ``~`` is expanded, ``""`` is refused). Required.
    - ``limit``: size cap, bytes or a string such as ``"500GB"``; when full, what was
      cached first stays and new row groups go uncached (default None: no cap).
    - ``map_limit``: bytes of cache entries kept memory-mapped from one epoch to the
      next (``"auto"``, the default: a quarter of the memory available; ``0``: map each
      entry anew on every read; ``None``: no byte limit).

    Shorthand: ``cache="/nvme/c"`` (a str or os.PathLike) is ``Cache(dir="/nvme/c")``.
    """

    dir: str
    limit: int | str | None = None
    map_limit: int | str | None = "auto"

    def __post_init__(self) -> None:
        _set(self, zip(("dir", "limit", "map_limit"),
                       _check_cache(self.dir, self.limit, self.map_limit, _names(Cache))))


def _check_distributed(rank: Any, world_size: Any, names: Mapping[str, str]) -> tuple[int, int]:
    world_size = check_int(names["world_size"], world_size, 1)
    return check_int(names["rank"], rank, 0, below=world_size), world_size


@dataclass(frozen=True)
class Distributed:
    """This process's place in a distributed job; ``batch_size`` stays per rank.

    - ``rank``: this process's rank, ``0 <= rank < world_size``.
    - ``world_size``: the number of ranks (an int >= 1).

    Both are required. Left out (``distributed=None``), they come from an initialised
    ``torch.distributed``, else the ``RANK`` and ``WORLD_SIZE`` environment variables,
    else (0, 1). Shorthand: ``distributed=(rank, world_size)``.
    """

    rank: int
    world_size: int

    def __post_init__(self) -> None:
        _set(self, zip(("rank", "world_size"), _check_distributed(self.rank, self.world_size, _names(Distributed))))


def _check_storage(filesystem: Any, partition_types: Any, names: Mapping[str, str],
                   memory_map: Any = "auto") -> tuple[Any, ...]:
    if filesystem is not None and not _is_filesystem(filesystem):
        raise OptionError(f"{names['filesystem']} must be a pyarrow.fs.FileSystem or an fsspec filesystem, "
                          f"got {type(filesystem).__name__}")
    if partition_types is not None:
        if not isinstance(partition_types, Mapping):
            raise OptionError(f"{names['partition_types']} must be a dict {{key: 'int64' | 'string'}} or None, "
                              f"got {type(partition_types).__name__} {partition_types!r}")
        for k, t in partition_types.items():
            if t not in ("int64", "string"):
                raise OptionError(f"{names['partition_types']}[{k!r}] must be 'int64' or 'string', got {t!r}")
        partition_types = dict(partition_types)  # a copy: the group is frozen, the caller's dict is not
    if memory_map is not True and memory_map is not False and memory_map != "auto":
        raise OptionError(f"{names['memory_map']} must be True, False or 'auto', got {memory_map!r}")
    return filesystem, partition_types, memory_map


@dataclass(frozen=True)
class Storage:
    """Where the files are read from, and how Hive folder names are typed.

    - ``filesystem``: a ``pyarrow.fs.FileSystem`` or an fsspec filesystem; ``None``
      (default): local paths, or the filesystem a URI names.
    - ``partition_types``: ``{key: "int64" | "string"}`` for Hive partition keys
      (``key=value`` folders); ``None`` (default) infers them from the folder names.
      Types enter the dataset fingerprint. (Not to be confused with ``partitions``,
      the canonical shards of the plan.)

    - ``memory_map``: whether workers read local files through memory maps. ``"auto"``
      (default): maps in worker processes where the file lies on a local disk or in memory
      (ext4, xfs, btrfs, tmpfs, ...), plain reads on network and FUSE filesystems (where a
      page that cannot be read kills the process touching it, where a read reports an
      error) and in thread workers (whose crash would be the training process's).
      ``False``: plain reads everywhere. ``True``: maps in every worker, threads included,
      on any local path. A map skips copying every page out of the page cache (~4% less
      ``read`` time for process W=2 on the CTR benchmark, rows/s the same within noise);
      a worker gives the pages it touched back after each row group, so maps hold less
      memory than the read buffers of plain reads (~35 MiB less peak PSS there). It
      changes no byte of any batch.

    Shorthand: ``storage=<filesystem>`` is ``Storage(filesystem=<filesystem>)``.
    """

    filesystem: Any = None
    partition_types: Mapping[str, str] | None = field(default=None, hash=False)
    memory_map: MemoryMap = "auto"

    def __post_init__(self) -> None:
        _set(self, zip(("filesystem", "partition_types", "memory_map"),
                       _check_storage(self.filesystem, self.partition_types, _names(Storage), self.memory_map)))


def _is_filesystem(value: Any) -> bool:
    import pyarrow.fs as pafs

    if isinstance(value, pafs.FileSystem):
        return True
    fsspec = sys.modules.get("fsspec")  # an fsspec filesystem implies fsspec is imported
    return fsspec is not None and isinstance(value, fsspec.AbstractFileSystem)


def _set(obj: Any, values: Any) -> None:
    for name, value in values:
        object.__setattr__(obj, name, value)  # frozen: the checked (normalised) value


def _names(cls: type) -> dict[str, str]:
    return {f.name: f"{cls.__name__}.{f.name}" for f in fields(cls)}


# -- shorthands -----------------------------------------------------------------------

def as_pool(value: Any) -> Pool:
    """``pool=``: None, ``"thread"``/``"process"`` or a `Pool`."""
    if value is None:
        return Pool()
    if isinstance(value, Pool):
        return value
    if isinstance(value, str):
        _check_pool(value, 2, None, True, {**_names(Pool), "kind": "pool"})
        return Pool(kind=value)  # type: ignore[arg-type]  # checked just above
    raise OptionError(f"pool must be a detload.Pool, 'thread' or 'process', or None, "
                      f"got {type(value).__name__} {value!r}")


def as_cache(value: Any) -> Cache | None:
    """``cache=``: None (no cache), a folder (str or os.PathLike) or a `Cache`."""
    if value is None or isinstance(value, Cache):
        return value
    if isinstance(value, (str, os.PathLike)):
        _check_cache(value, None, "auto", {**_names(Cache), "dir": "cache"})
        return Cache(dir=value)  # type: ignore[arg-type]  # a PathLike is made a str
    raise OptionError(f"cache must be a detload.Cache, a folder (str or os.PathLike), or None, "
                      f"got {type(value).__name__} {value!r}")


def as_distributed(value: Any) -> Distributed | None:
    """``distributed=``: None (detected), ``(rank, world_size)`` or a `Distributed`."""
    if value is None or isinstance(value, Distributed):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return Distributed(*value)
    raise OptionError(f"distributed must be a detload.Distributed, a (rank, world_size) tuple, or None, "
                      f"got {type(value).__name__} {value!r}")


def as_storage(value: Any) -> Storage:
    """``storage=``: None, a filesystem (pyarrow or fsspec) or a `Storage`."""
    if value is None:
        return Storage()
    if isinstance(value, Storage):
        return value
    if _is_filesystem(value):
        return Storage(filesystem=value)
    raise OptionError(f"storage must be a detload.Storage, a pyarrow.fs.FileSystem or fsspec filesystem, "
                      f"or None, got {type(value).__name__} {value!r}")


# -- warnings ---------------------------------------------------------------------------

_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def warn_deprecated(message: str) -> None:
    """One DeprecationWarning attributed to the first caller outside detload (so Python shows it
    where the old spelling is written, also when `TorchLoader` builds the `Loader`)."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    warnings.warn(message, DeprecationWarning, stacklevel=level)
