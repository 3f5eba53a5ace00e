"""`Loader`: the training-facing object. Plans each epoch, runs the pool and merger, writes the manifest.

The consumer's per-batch work is a queue get, a manifest write and a counter:
conversion, permutation, stitching and hashing happen in workers and in the
merger's thread. Workers also build the first blocks of the pass expected next
(`_Ahead`), so that they are not idle while an epoch ends and the next begins.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from . import __version__, _hooks, planning
from ._cache import open_cache
from ._check import check_int, check_path, check_writable_file
from ._discovery import Dataset, SkippedFilesWarning, describe_skipped, discover, skipped_why
from ._engine import share
from ._engine import spill as _spill
from ._engine.config import WorkerConfig, WorkerKind
from ._engine.memory import BufferWatch, finalize
from ._engine.merge import END, STOPPED, Failure, Run, ahead_counts, make_tasks
from ._engine.pool import WorkerPool
from ._engine.spawn import check_for_processes
from ._hooks import Hooks
from ._storage import display_uri
from ._torch_dataloader import refuse_auto_batching, register_iterable
from ._torch_dataloader import register as _register_with_torch
from ._trace import CONSUMER, StatsMark, Tracer
from ._types import INT96_UNIT, Column, ColumnSpec, normalize_cast
from .audit import MANIFEST_FORMAT, MANIFEST_VERSION, ManifestWriter
from .errors import BlockMemoryWarning, DataError, DetloadError, OptionError, StateError
from .options import Cache, Distributed, Pool, PoolKind, Storage, as_cache, as_distributed, as_pool, as_storage
from .plan import PLAN_FORMAT_MIX, PLAN_FORMAT_VERSION, MixPlan, OrderOptions, Plan
from .planning.mixing import mixing_report
from .planning.order import block_memory_warning, window_memory_warning
from .stats import Stats, _cores, summarize
from .transform import Transform

if TYPE_CHECKING:  # imported when a filter is given: pyarrow.compute and .dataset cost import time
    from ._cache import CacheConfig
    from ._filters.canonical import Filter

__all__ = ["STATE_FORMAT_VERSION", "BlockMemoryWarning", "Loader", "compare_ranks", "resolve_workers"]




STATE_FORMAT_VERSION = 1
_MAX_WORKERS = 256


def resolve_workers(workers: int | str) -> int:
    """``"auto"``: one worker per usable core, at most 16; workers never change the batches."""
    if workers == "auto":
        return max(1, min(_cores(), 16))
    return check_int("workers", workers, 1, _MAX_WORKERS, shown=f"[1, {_MAX_WORKERS}] or 'auto'")


def _distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else an initialised torch.distributed, else RANK/WORLD_SIZE, else (0, 1).

    torch is only consulted when something already imported it: an initialised
    process group implies ``torch.distributed`` is in ``sys.modules``, and
    importing torch here would cost seconds for users who never touch it.
    """
    if rank is not None and world_size is not None:
        return rank, world_size
    r = w = None
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
    if r is None:
        env_r, env_w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if env_r is not None and env_w is not None:
            try:
                r, w = int(env_r), int(env_w)
            except ValueError:
                raise OptionError(f"RANK={env_r!r} / WORLD_SIZE={env_w!r} are not integers") from None
    r = rank if rank is not None else (r if r is not None else 0)
    w = world_size if world_size is not None else (w if w is not None else 1)
    return r, w


def check_epoch(epoch: Any) -> None:
    """Raise OptionError unless ``epoch`` is an epoch number (an int in [0, 2**32))."""
    check_int("epoch", epoch, 0, below=2**32, shown="[0, 2**32)")


def refuse_torch_workers(what: str) -> None:
    """OptionError when called inside a worker process of a torch DataLoader (``num_workers > 0``).

    Each of those workers would get a copy of the loader and read the whole epoch:
    detload's own workers are the parallelism. torch is consulted only when
    something already imported it.
    """
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None and hasattr(data, "get_worker_info") else None
    if info is not None:
        raise OptionError(_dataloader_workers(what, f"num_workers={info.num_workers}"))


def _dataloader_workers(what: str, workers: str) -> str:
    return (f"a {what} cannot run in the worker processes of a torch DataLoader ({workers}): detload is "
            f"already parallel, and each of them would read the whole epoch. Pass num_workers=0 to the "
            f"DataLoader (with batch_size=None) and set the {what}'s own workers= (and pool=\"process\")")


def refuse_pickling(what: str) -> OptionError:
    """The error for pickling a loader: it holds threads, processes and shared memory."""
    return OptionError(
        f"a {what} cannot be pickled or copied: it holds worker threads or processes and shared memory. "
        "A torch DataLoader with num_workers > 0 pickles its dataset for each worker process, and detload is "
        f"already parallel: pass num_workers=0 to the DataLoader (with batch_size=None) and set the {what}'s "
        f"own workers= (and pool=\"process\"). Elsewhere, build the {what} in the process that iterates it"
    )


_T = TypeVar("_T")


class _Fixed(Generic[_T]):
    """A public attribute of a `Loader` fixed when the loader is built: one of its options or
    what planning decided from them. Reading it gives the value (mappings and lists as read-only
    views); setting it raises, since the running plan, the workers and the manifest header
    were made from it."""

    def __init__(self, view: Callable[[Any], Any] | None = None) -> None:
        self._view = view

    def __set_name__(self, owner: type, name: str) -> None:
        self._name, self._slot = name, f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> _T:
        if obj is None:
            return self  # type: ignore[return-value]  # the descriptor itself, for introspection
        value = getattr(obj, self._slot)
        return value if self._view is None else self._view(value)

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"Loader.{self._name} is read-only: a Loader's options and plan are fixed when it "
                             "is built; build a new Loader to change them")


class Loader:
    """Deterministic parallel Parquet loader. Iterating yields ``dict[str, ndarray | Ragged]``.

    ``Loader(source, *, batch_size, seed, ...)``: every option after ``source`` is a
    keyword. The batches are a pure function of the dataset, ``seed``, the epoch and
    the options that decide them, which are flat keywords (and are in ``order``, the
    manifest header and ``state_dict()``):

    - ``source``: a directory, one Parquet file, a glob, a URI (``s3://bucket/prefix``)
      or a list of paths.
    - ``batch_size``: rows per batch per rank (the global batch is batch_size x world size).
    - ``seed``: an int in [0, 2**64).
    - ``workers``: worker count, 1-256, or ``"auto"`` (one per usable core, at most 16);
      it changes who computes a block, never the batches.
    - ``columns``: a list of column names (default: all, in schema order); Hive
      partition columns come last.
    - ``shuffle``: permute row groups and the rows of each block (default True).
    - ``order``: "mix" (plan format 3: each batch draws from a task of up to ``mix_window`` row
      groups spread over the whole partition) or "windowed" (plan format 2, the default before:
      blocks of ``shuffle_window`` row groups); see docs/determinism.md. Not given: "mix",
      except with ``group_by`` (the mixed order does not pack groups yet): "windowed".
      The state, the manifest header and ``options.order`` record the order resolved.
    - ``shuffle_window``: with the windowed order, row groups per block, whose rows are permuted
      together (default 4).
    - ``mix_window``: with the mixed order, row groups one task reads once and mixes (default 64,
      or more row groups averaging under 16,384 rows: about 2**20 rows; resolved at planning).
      A partition of at most that many row groups is one task, whose window the workers keep
      from epoch to epoch: it is read once per loader and stays in memory between epochs.
    - ``block_rows``: with the mixed order, rows per block at most (default 4 x the median row group,
      or a sixteenth of a full task of more than 64 row groups; resolved at planning).
    - ``drop_last``: make every step full and drop the tail (default False).
    - ``null_fill``: ``{column: value}`` replacing nulls before conversion.
    - ``cast``: ``{column: dtype}`` delivering a column as another dtype, checked value by value;
      a shape (``"float32[16]"``) delivers a list column as a dense ``(rows, 16)`` array.
    - ``partitions``: canonical partitions P (default: the world size); fix it to change
      the world size without changing the order.
    - ``manifest``: path of a manifest to write (a directory gets ``rank-NNNNN.jsonl``).
    - ``filter``: deliver only the rows a filter keeps, exactly the rows pyarrow's own
      filter keeps: a ``pyarrow.compute`` expression, a DNF list of ``(column, op, value)``
      tuples, or a string (JSON DNF, or filter text such as ``'market == "US"'``); see
      docs/filters.md. Row groups are pruned and the rows selected while the loader is built.
    - ``transform``: a `detload.Transform` (or a plain picklable callable) run in the workers
      on each whole row group after the filter's selection; its output is what batches hold.
      Its identity is an order option; see docs/transforms.md.
    - ``group_by``: the key column of query-item data; every batch is then a `detload.Packed`
      of whole groups, filled greedily up to the micro-batch in items (docs/packing.md).
    - ``group_columns``: the query-level columns (a subset of ``columns``, the key among them),
      delivered once per group and checked to be constant in each.
    - ``max_group_items``: split groups longer than N items into chunks of at most N.

    The settings that never change a byte of any batch come in groups
    (``detload.options``), each with a shorthand:

    - ``pool``: a `Pool` (``kind`` "thread" or "process", ``prefetch`` blocks queued per
      worker, ``stall_timeout`` seconds before WorkerStalledError or None, ``trace``
      stage timings for ``stats()``, ``block_memory`` the block size above which planning
      warns, ``spill`` where a large mixed-order window is kept: True, the temporary folder;
      a folder; False, memory), or ``"thread"``/``"process"``. Default: ``Pool()``.
    - ``cache``: a `Cache` (``dir`` the row-group cache folder, ``limit`` its size cap,
      ``map_limit`` bytes kept memory-mapped between epochs), or a folder. Default: no cache.
    - ``distributed``: a `Distributed` (``rank``, ``world_size``) or a ``(rank, world_size)``
      tuple. Default: from an initialised torch.distributed, else the RANK and WORLD_SIZE
      environment variables, else (0, 1).
    - ``storage``: a `Storage` (``filesystem`` a pyarrow or fsspec filesystem,
      ``partition_types`` ``{key: "int64" | "string"}`` for Hive partition keys,
      ``memory_map`` False/"auto"/True: whether workers read local files through memory
      maps), or a filesystem. Default: local paths, or the filesystem a URI names.

    docs/loader.md has the full table of options.
    """

    # Fixed when the loader is built (see _Fixed); read-only views where the value is mutable.
    workers: _Fixed[int] = _Fixed()
    pool_kind: _Fixed[PoolKind] = _Fixed()
    prefetch: _Fixed[int] = _Fixed()
    stall_timeout: _Fixed[float | None] = _Fixed()
    rank: _Fixed[int] = _Fixed()
    options: _Fixed[OrderOptions] = _Fixed()
    null_fill: _Fixed[Mapping[str, Any]] = _Fixed(MappingProxyType)
    cast: _Fixed[Mapping[str, str]] = _Fixed(MappingProxyType)
    cache: _Fixed[CacheConfig | None] = _Fixed()
    planned: _Fixed[planning.Planned] = _Fixed()
    dataset: _Fixed[Dataset] = _Fixed()
    specs: _Fixed[tuple[ColumnSpec, ...]] = _Fixed(tuple)
    filter: _Fixed[Filter | None] = _Fixed()
    group_by: _Fixed[str | None] = _Fixed()
    group_columns: _Fixed[tuple[str, ...]] = _Fixed()
    max_group_items: _Fixed[int | None] = _Fixed()
    transform: _Fixed[Transform | None] = _Fixed()
    order: _Fixed[Mapping[str, Any]] = _Fixed(MappingProxyType)
    fingerprint: _Fixed[str] = _Fixed()
    ahead_used: _Fixed[int] = _Fixed()

    def __init__(
        self,
        source: Any,
        *,
        batch_size: int,
        seed: int,
        workers: int | str = 1,
        columns: Sequence[str] | None = None,
        shuffle: bool = True,
        shuffle_window: int | None = None,
        drop_last: bool = False,
        null_fill: Mapping[str, Any] | None = None,
        cast: Mapping[str, Any] | None = None,
        partitions: int | None = None,
        manifest: str | os.PathLike[str] | None = None,
        pool: Pool | PoolKind | None = None,
        cache: Cache | str | os.PathLike[str] | None = None,
        distributed: Distributed | tuple[int, int] | None = None,
        storage: Storage | Any = None,
        filter: Any = None,  # noqa: A002 - the option's public name
        group_by: str | None = None,
        group_columns: Sequence[str] | None = None,
        max_group_items: int | None = None,
        transform: Any = None,
        order: str | None = None,
        mix_window: int | None = None,
        block_rows: int | None = None,
    ) -> None:
        #: Test and benchmark hooks (never set in production): those in force when built.
        self._hooks: Hooks = _hooks.current()
        _register_with_torch()  # in case torch.utils.data was loaded past the finder (a cheap check)
        self._workers = resolve_workers(workers)
        pool_opts, cache_opts = as_pool(pool), as_cache(cache)
        dist, storage_opts = as_distributed(distributed), as_storage(storage)
        self._pool_kind: PoolKind = pool_opts.kind
        self._memory_map = storage_opts.memory_map
        self._prefetch = pool_opts.prefetch
        self._spill = pool_opts.spill
        self._stall_timeout = pool_opts.stall_timeout
        trace = pool_opts.trace
        _check_source(source)
        manifest_path = check_path("manifest", manifest) if manifest is not None else None
        if dist is not None:
            self._rank, world = dist.rank, dist.world_size
        else:  # from torch.distributed, else $RANK and $WORLD_SIZE, else (0, 1)
            self._rank, world = _distributed_defaults(None, None)
        if partitions is None:
            partitions = world
        if order is None:  # the mixed order does not pack groups yet
            order = "windowed" if group_by is not None else "mix"
        self._options = OrderOptions(
            seed=seed, batch_size=batch_size, shuffle=shuffle, shuffle_window=shuffle_window,
            drop_last=drop_last, partitions=partitions, world_size=world, order=order, mix_window=mix_window,
            block_rows=block_rows,
        )
        self._rank = check_int("rank", self.rank, 0, below=world)
        if null_fill is not None and not isinstance(null_fill, Mapping):
            raise OptionError(f"null_fill must be a dict {{column: value}}, got {null_fill!r}")
        self._null_fill = dict(null_fill or {})
        if cast is not None and not isinstance(cast, Mapping):
            raise OptionError(f"cast must be a dict {{column: dtype}}, got {cast!r}")
        #: Each cast column's dtype in one spelling ("f4" -> "float32"), as `order` records it.
        self._cast: dict[str, str] = {str(k): normalize_cast(str(k), v) for k, v in (cast or {}).items()}
        # A filter's planning reads the footers discovery read: kept until then, not longer.
        footers: list[Any] | None = [] if filter is not None else None
        dataset = discover(source, filesystem=storage_opts.filesystem,
                           partitioning=storage_opts.partition_types, footers=footers,
                           stall_timeout=self.stall_timeout)
        if dataset.skipped:
            warnings.warn(SkippedFilesWarning(
                f"{describe_skipped(dataset.skipped)} in {display_uri(dataset.filesystem, dataset.root)}: they are "
                f"{skipped_why(dataset.skipped, detail=True)}, e.g. {dataset.skipped[0]}. "
                "`detload inspect` lists them; move them out of the dataset folder to silence this."),
                stacklevel=2)
        specs = planning.column_specs(dataset, columns, self._null_fill, self._cast)
        files = planning.file_refs(dataset)
        # Cache state never enters `order`: cold, warm and uncached runs yield the same bytes.
        self._cache = (open_cache(cache_opts.dir, cache_opts.limit, [f.cache_key for f in files],
                                 cache_map_limit=cache_opts.map_limit, fail_after_bytes=self._hooks.cache_fail_after_bytes)
                      if cache_opts is not None else None)
        xf = _transform_option(transform)
        if xf is not None and self.pool_kind == "process":
            check_for_processes(xf)  # before planning runs it: what worker processes could not receive
        #: Everything planning decided (planning.Planned): this loader runs it.
        self._planned = p = planning.plan(
            dataset, files, specs, self._options, null_fill=self._null_fill, cast=self._cast, filter=filter,
            group_by=group_by, group_columns=group_columns, max_group_items=max_group_items, transform=xf,
            cache=self.cache, footers=footers)
        self._dataset: Dataset = p.dataset
        self._specs: list[ColumnSpec] = list(p.specs)
        self._options = p.options
        self._units = p.units
        self._unit_files, self._unit_rgs, self._unit_rows = self.dataset.units()
        self._files = p.files
        self._cache_keys = [f.cache_key for f in p.files]
        self._uris = [f.uri for f in p.files]
        #: The parsed filter (None: every row), and what planning did with it.
        self._filter: Filter | None = p.filter
        self._selections = p.selections
        self._filter_stats = p.filter_stats
        #: group_by: the key, the group columns (the key among them) and max_group_items.
        self._group_by: str | None = p.group_by
        self._group_columns: tuple[str, ...] = p.group_columns
        self._max_group_items: int | None = p.max_group_items
        self._group_stats = p.group_stats
        #: The transform (None: the columns as read), and what planning made of it.
        self._transform = p.transform
        self._xform = p.xform
        self._order = dict(p.order)
        self._fingerprint = p.fingerprint
        self._block_memory: int | None = pool_opts.block_memory_bytes
        # Estimated now, with discovery: a variable-length column's estimate reads a footer,
        # and once iteration starts a warm run must fetch nothing but the rows it needs.
        # (Also what the workers' spill decision counts: `_beside_bytes_per_row`.)
        self._row_parts: tuple[float, float] | None = None  # see _row_estimate
        if self._block_memory is not None or (self.options.order == "mix" and _spill.spill_folder(self._spill)):
            self._row_estimate()
        self._row_bytes = self._bytes_per_row() if self._block_memory is not None else 0.0
        # Benchmark-only (the determinism-tax measurement): the merger takes blocks in
        # completion order, so batches depend on timing. Never for training runs.
        if self._hooks.unordered and manifest is not None:
            raise OptionError("the unordered merge is a benchmark-only hook and cannot write a manifest")
        self._ordered = not self._hooks.unordered
        self._tracer = Tracer(enabled=trace)
        if self._filter_stats is not None:  # the selection pass ran in planning: traced as "select"
            self._tracer.planned(p.select_spans, self._filter_stats.as_dict())
        self._epoch = 0
        self._plans: dict[int, Plan] = {}
        self._memory_checked = False
        #: The block-memory warnings given (by kind), and whether a real block checked the estimate.
        self._memory_warned: set[str] = set()
        self._block_measured = False
        self._resume_step = 0
        self._position = 0  # batches of the current epoch already yielded
        self._gen = 0
        self._run: Run | None = None
        self._ahead: _Ahead | None = None
        self._last_epoch: int | None = None  # epoch of the previous pass
        self._ahead_used = 0  # passes that found their first blocks built ahead (tests, stats)
        self._lock = threading.Lock()
        self._manifest_path = _manifest_file(manifest_path, self.rank) if manifest_path is not None else None
        if self._manifest_path is not None:
            # Found now rather than after the first epoch's work: the file opens at the first iteration.
            check_writable_file("manifest", self._manifest_path)
        self._resume_manifest = False
        # The pool and the manifest writer live here, and only here: the finalizer
        # closes whatever this holds when the loader is collected without close().
        self._held: dict[str, Any] = {"pool": None, "writer": None}
        self._memory_watch = BufferWatch()  # see watch_block_memory
        self._finalizer = finalize(self, Loader._cleanup, self._held)

    @property
    def filter_stats(self) -> dict[str, Any] | None:
        """What planning did with ``filter=`` (None without one): row groups in all, pruned by
        partition values, statistics or bloom filters, read by the selection pass, found empty
        there, and the rows selected out of the rows in all."""
        return None if self._filter_stats is None else self._filter_stats.as_dict()

    @property
    def group_stats(self) -> dict[str, int] | None:
        """What planning found with ``group_by=`` (None without it): groups, chunks (groups
        after max_group_items split them), the largest group, row groups scanned or cached."""
        return None if self._group_stats is None else self._group_stats.as_dict()

    @property
    def _block_specs(self) -> list[ColumnSpec]:
        """The delivered columns: the transform's output, else the columns read."""
        return list(self.planned.block_specs)

    def _worker_config(self, kind: WorkerKind, prefix: str) -> WorkerConfig:
        """The workers' configuration."""
        specs: tuple[ColumnSpec, ...] = tuple(self.specs)
        group_specs: tuple[ColumnSpec, ...] = ()
        if self.group_by is not None and self.cache is not None and self._xform is None:
            # The cache keeps the group columns once per group, apart from the items' entries
            # (a transform reads every column of the row group, so it keeps them together).
            group_specs = tuple(s for s in self.specs if s.name in self.group_columns)
            specs = tuple(s for s in self.specs if s.name not in self.group_columns)
        # Maps only where a fault kills a worker process, not the consumer (see Storage.memory_map).
        mapping = self._memory_map if self._memory_map != "auto" or kind == "process" else False
        cache, share_dir, scratch, spill_share, pack_share = self.cache, None, False, None, None
        spill_error: str | None = None
        spill_dir = _spill.spill_folder(self._spill)
        shared = self._shares_windows(kind)
        if shared and kind == "process":
            # Process workers share the mixed order's task windows (_engine/share.py): in one
            # spill file or one mapped pack file each where they can, else as cache entries:
            # the user's cache, or a scratch cache the pool removes.
            base = share.make_share_dir()
            share_dir = os.path.join(base, "claims")
            os.mkdir(share_dir)
            pack_share = os.path.join(base, "packs")
            os.mkdir(pack_share)
            if cache is None:
                cache = open_cache(os.path.join(base, "cache"), None, self._cache_keys, cache_map_limit=0,
                                   checksums=False)
                scratch = cache is not None
                if cache is None:  # the folder is not usable: every worker reads its own windows
                    share.remove_share_dir(base)
                    share_dir, pack_share, shared = None, None, False
                else:
                    spill_share, spill_error = self._spill_share(spill_dir)
        return WorkerConfig(self._files, self.dataset.filesystem, specs, self._null_fill, kind,
                            prefix, hooks=self._hooks.debug,
                            cache=cache, selections=self._selections, group_by=self.group_by,
                            group_columns=self.group_columns, transform=self._xform, group_specs=group_specs,
                            memory_map=mapping, share_windows=shared, share_dir=share_dir, scratch=scratch,
                            spill_dir=spill_dir, spill_min=_spill.SPILL_MIN_BYTES,
                            spill_beside_row_bytes=self._beside_bytes_per_row() if spill_dir else 0.0,
                            spill_share=spill_share, spill_error=spill_error, pack_share=pack_share)

    @staticmethod
    def _spill_share(folder: str | None) -> tuple[str | None, str | None]:
        """Process workers sharing windows without a cache: a folder of the pool's in the spill
        ``folder``, for the windows they spill together (_engine/spill.py), or None: no spill
        folder, or it cannot take one (the windows are then held in mapped packs, in memory,
        and the second value says why, for the workers' warning)."""
        if folder is None:
            return None, None
        try:
            return share.make_share_dir(folder), None
        except OSError as exc:
            return None, str(exc)

    def _shares_windows(self, kind: WorkerKind, plan: Plan | None = None, cached: bool | None = None) -> bool:
        """Whether the workers share the mixed order's task windows (_engine/share.py): with
        more than one worker, when a partition has fewer tasks than there are workers, or
        whenever a cache without a `Cache.limit` is given (a limited cache may not keep a
        window's entries, and process workers then each convert the row groups another
        worker's entry should have held, threads lose their kept windows); else each worker
        builds whole tasks of its own. Without a
        cache, sharing costs claims, waits and, for processes, a copy of every row group into
        a scratch cache, and measured slower on CTR data at four tasks per epoch (thread and
        process W=2), or no faster with windows spilled (4M rows). With a cache a warm window
        is mapped entries, ready at once, and a worker building a whole task kept the other
        idle while the merger took that task's blocks: shared, warm epochs on 4M CTR rows (four
        tasks an epoch) took 0.64-0.75 against 0.65-0.97 s (thread W=2) and 0.46-0.59 against
        0.60-0.71 s (process W=2), and the epoch filling the cache 2.27-3.58 against 2.71-3.17 s
        and 1.80-2.26 against 3.16-3.26 s (three alternating rounds). Threads always;
        processes through the row-group cache, so only for row groups it keeps (file columns
        read) and no transform (each process would run it on every row group of its windows).
        The task count per partition is the same every epoch (it follows from
        ``mix_window``), so any epoch's ``plan`` tells (default: this epoch's). ``cached``:
        whether a cache of no limit is read (default: this loader's; `detload plan` names the
        run's without opening it)."""
        if self.options.order != "mix" or self.workers < 2:
            return False
        plan = self.plan() if plan is None else plan
        if cached is None:
            cached = self.cache is not None and self.cache.limit is None
        if isinstance(plan, MixPlan) and not plan.shares_windows(self.workers, cached=cached):
            return False
        return kind == "thread" or (any(not s.partition for s in self.specs) and self._xform is None)

    @property
    def _pool(self) -> WorkerPool | None:
        return self._held["pool"]

    @property
    def _writer(self) -> ManifestWriter | None:
        return self._held["writer"]

    # -- planning ------------------------------------------------------------
    def _row_estimate(self) -> tuple[float, float]:
        """The converted NumPy bytes of one delivered row, estimated from the column specs:
        (its fixed-width 1-D columns, its other columns: strings, lists, multi-dimensional).

        Fixed columns have their width; a variable-length column counts its int64 offset plus
        the Parquet metadata's uncompressed bytes per row of its chunks in the first file (one
        footer, read once per loader and only when such a column is loaded)."""
        if self._row_parts is None:
            flat = other = 0.0
            ragged = []
            for s in self._block_specs:
                if s.kind == "fixed" and not s.inner:
                    flat += np.dtype(s.dtype).itemsize
                elif s.kind == "fixed":
                    other += np.dtype(s.dtype).itemsize * int(np.prod(s.inner, dtype=np.int64))
                else:
                    other += 8
                    if not s.partition:
                        ragged.append(s.name)
            if ragged and self.dataset.files:
                other += _ragged_bytes_per_row(self.dataset, ragged)
            self._row_parts = (flat, other)
        return self._row_parts

    def _bytes_per_row(self) -> float:
        """The converted NumPy bytes of one delivered row, estimated (`_row_estimate`)."""
        return sum(self._row_estimate())

    def _beside_bytes_per_row(self) -> float:
        """The estimated bytes a row of the string, list and multi-dimensional columns converts
        to (`_row_estimate`): what a spilled window holds beside its file (`spill.spills`)."""
        return self._row_estimate()[1]

    def _warn_block_memory(self, plan: Plan, row_bytes: float | None = None, why: str = "",
                           stacklevel: int = 4) -> None:
        """Warn once per loader (and kind: blocks, the mixed order's window) when the largest
        block or window would exceed the block memory budget at ``row_bytes`` per row (the
        estimate when None)."""
        if self._block_memory is None:
            return
        per = self._row_bytes if row_bytes is None else row_bytes
        # A mixed-order task's window is memory without a cache (heap, or shared by the workers
        # on the heap or in /dev/shm); with one it is mapped entries of the cache's disk.
        window = (window_memory_warning(plan, per, self._block_memory)
                  if self.cache is None and not self._spills_largest_window(plan) else None)
        for kind, text in (("block", block_memory_warning(plan, per, self._block_memory)), ("window", window)):
            if text is not None and kind not in self._memory_warned:
                self._memory_warned.add(kind)
                warnings.warn(BlockMemoryWarning(text + why + " Pass Pool(block_memory=None) to silence this."),
                              stacklevel=stacklevel)

    def _spills_largest_window(self, plan: Plan) -> bool:
        """Whether the workers spill the plan's largest mixed-order window to a file
        (`Pool.spill`), so that it does not count against the block memory budget: the rules of
        _engine/worker.py (`_make_pack`, `_new_pack`, `_shared_pack`), read off the plan. A
        window is spilled when a spill folder is at hand and it holds at least
        `spill.SPILL_MIN_BYTES`, its fixed 1-D columns and its others at this loader's estimate
        (`spill.spills`; then it is packed, whatever its chunks: `_spilled`); its string, list
        and multi-dimensional columns are then mapped from files beside the spill file, a
        block's rows at a time (`SpillPack.publish`), not held on the heap."""
        if not isinstance(plan, MixPlan) or not plan.options.shuffle:
            return False
        biggest = max(((p, t) for p, part in enumerate(plan.tasks) for t in part), key=lambda pt: pt[1].rows,
                      default=None)
        if biggest is None:
            return False
        _, task = biggest
        folder = _spill.spill_folder(self._spill)
        return _spill.spills(folder, self._block_specs, task.rows, _spill.SPILL_MIN_BYTES,
                             self._beside_bytes_per_row() if folder else 0.0)

    def _check_first_block(self, plan: Plan, nbytes: int, rows: int) -> None:
        """The first block the merger takes, against the estimate the warnings were decided by
        (`_bytes_per_row`): string columns are estimated from their Parquet bytes, which a
        dictionary of few values stores in a fraction of what they decode to. Where the block
        holds more than 1.5x the estimate per row, the warnings are decided again at the
        measured size. Once per loader, on the merger's thread; not from a block of under 1,024
        rows, whose columns' alignment padding would weigh on its bytes per row."""
        self._block_measured = True
        if rows < 1024 or nbytes <= 1.5 * self._row_bytes * rows:
            return
        per = nbytes / rows
        self._warn_block_memory(plan, per, why=(
            f" (Measured on the first block: {per:,.0f} bytes per row, against {self._row_bytes:,.0f} estimated "
            "from the Parquet metadata before reading.)"), stacklevel=2)

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Plan epoch ``epoch`` next. Workers persist; only the plan changes."""
        check_epoch(epoch)
        if int(epoch) != self._epoch:
            self._stop_run()
            self._epoch = int(epoch)
            self._resume_step = 0
            self._position = 0

    def plan(self, epoch: int | None = None) -> Plan:
        e = self._epoch if epoch is None else epoch
        p = self._plans.get(e)
        if p is None:
            p = self.planned.epoch_plan(e, self.rank)
            if not self._memory_checked:
                self._memory_checked = True
                self._warn_block_memory(p)
            if len(self._plans) > 4:
                self._plans.clear()
            self._plans[e] = p
        return p

    def plan_stats(self, epoch: int | None = None, mix_column: str | None = None) -> dict[str, Any]:
        """How well epoch ``epoch``'s order (default: the current one) mixes the batches of this
        rank, each number beside an i.i.d. shuffle of the same rows: distinct source row groups
        and files per batch, how far a row group's rows are spread over the epoch, and with
        ``mix_column`` that column's values per batch and their distance from the epoch's mix
        (only that column is read). docs/loader.md lists every key."""
        return mixing_report(self.plan(epoch), self.planned, mix_column=mix_column)

    @property
    def position(self) -> int:
        """Batches of the current epoch already yielded (the ``step`` of ``state_dict()``)."""
        return self._position

    def __len__(self) -> int:
        """Batches in the current epoch (for this rank; all ranks get the same count)."""
        return self.plan().steps

    @property
    def column_specs(self) -> list[ColumnSpec]:
        """How each delivered column is typed (with a transform: its output, from the first row group)."""
        return list(self._block_specs)

    # -- iteration -------------------------------------------------------------
    def _ensure_pool(self) -> WorkerPool:
        if self._pool is None:
            self._held["pool"] = WorkerPool(self._worker_config, self.workers, self.pool_kind, self.prefetch,
                                           self._memory_watch)
            self._tracer.pool_started(self.workers)
        return self._held["pool"]

    def _header(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "detload_version": __version__,
            "order": self._order,
            "fingerprint": self.fingerprint,
            "plan_format": self.options.plan_format,
            "batch_size": self.options.batch_size,
            "rank": self.rank,
            "world_size": self.options.world_size,
            "partitions": self.options.partitions,
            "owned_partitions": list(self.plan().owned_partitions),
            "workers": self.workers,
            "pool": self.pool_kind,
            **({"filter": self.filter.header_value()} if self.filter is not None else {}),
        }

    @property
    def manifest_path(self) -> str | None:
        """The manifest file this loader writes (a rank file inside a run directory), if any."""
        return self._manifest_path

    def _ensure_writer(self) -> ManifestWriter | None:
        if self._manifest_path is not None and self._writer is None:
            self._held["writer"] = ManifestWriter(self._manifest_path, self._header(), resume=self._resume_manifest)
        return self._writer

    def watch_block_memory(self, added: Callable[[int, int], None], removed: Callable[[int, int], None]) -> None:
        """Be told of the buffers batches live in: the seam a pinned GPU hand-off needs.

        A batch's arrays are views of a block, and blocks are built in buffers this
        loader reuses for many blocks: heap slabs with ``pool="thread"``, shared-memory
        mappings with ``pool="process"``. ``added(address, nbytes)`` is called once for
        each buffer, before any batch viewing it is yielded (and at once for buffers
        that exist when this is called); ``removed(address, nbytes)`` once before the
        buffer is freed, or when the loader is closed. Registering each buffer once
        (e.g. with ``torch.cuda.cudart().cudaHostRegister``) makes every later batch
        in it page-locked without a staging copy. Either call may come from a detload
        thread or a garbage collection; a listener that raises is warned about once
        and dropped. Listeners never change a byte of any batch.
        """
        if not (callable(added) and callable(removed)):
            raise OptionError("watch_block_memory takes two callables: added(address, nbytes) and "
                              "removed(address, nbytes)")
        self._memory_watch.watch(added, removed)

    def stop(self) -> None:
        """Stop the current pass, if one runs: its iterator raises DetloadError at its next
        batch, and workers drop the rest of its blocks. The position stays where the
        consumer is, and workers and the plan are kept; a new ``iter()`` starts a new pass.
        Safe from another thread (a `TorchLoader` stops its feeder thread's pass so)."""
        self._stop_run()

    def _stop_run(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.stop()

    def __iter__(self) -> Iterator[dict[str, Column]]:
        refuse_torch_workers("Loader")
        refuse_auto_batching(self, "Loader")  # DataLoader(loader) without batch_size=None
        with self._lock:
            self._stop_run()
            plan = self.plan()  # a planning error comes before any worker starts
            pool = self._ensure_pool()
            # A worker that died (or never started) is reported now, not after the batches
            # the others could still deliver: the pool does not replace it.
            pool.check_usable()
            start = self._resume_step
            self._resume_step = 0
            if pool.kept is not None:
                # Let go of cache entries deleted since the last pass (their disk space):
                # one built ahead may not be read again in this pass. A stat per kept entry.
                pool.kept.revalidate()
            writer = self._ensure_writer()
            ahead, self._ahead = self._ahead, None
            counts = None
            if (ahead is not None and ahead.pool is pool and start == 0
                    and ahead.key == (plan.epoch, plan.fingerprint)
                    and not pool.passes.is_stale(ahead.gen)):  # not cancelled by a break
                # Workers already have (or are building) this pass's first blocks.
                self._gen, counts = ahead.gen, ahead.counts
                self._ahead_used += 1
            else:
                # Newer than any number handed out, so blocks built ahead for a pass
                # that did not come are stale and freed.
                self._gen = pool.passes.fresh()
            run = Run(pool, plan, self._block_specs, gen=self._gen, start_step=start,
                      stall_timeout=self.stall_timeout,
                      # Hashes exist for the manifest; without one they would be work for nothing.
                      hash_batches=writer is not None, ordered=self._ordered,
                      tracer=self._tracer, ahead=counts,
                      group_columns=self.group_columns if self.group_by is not None else None,
                      first_block=(_weak_call(self, Loader._check_first_block)
                                   if self._block_memory is not None and not self._block_measured else None))
            self._run = run
            self._tracer.run_started(self.workers, self.pool_kind)
            if writer is not None:
                writer.start_epoch(plan.epoch, plan.steps, plan.dropped_rows, plan.fingerprint, start)
            self._position = start
            run.start()
            self._build_ahead(pool, plan.epoch)
        return self._consume(run, writer, plan.epoch)

    def _build_ahead(self, pool: WorkerPool, epoch: int) -> None:
        """Queue the first ``prefetch`` blocks per worker of the pass expected after this one.

        Expected: the next epoch when this pass's epoch followed the previous pass's
        (the ``set_epoch(e)`` loop), the same epoch when it repeated it; otherwise
        nothing. The tasks wait behind this pass's, so they only use time the workers
        would spend idle at the end of the epoch, and the blocks wait in the queues
        that bound memory anyway. A block is a pure function of the plan, so building
        it early changes nothing; if another pass comes, they are freed unused.
        """
        prev, self._last_epoch = self._last_epoch, epoch
        if not self._ordered or prev is None or epoch - prev not in (0, 1):
            return
        nxt = epoch + (epoch - prev)
        if nxt >= 2**32:
            return
        plan = self.plan(nxt)
        tasks = make_tasks(plan, 0, pool.workers, pool.cfg.share_windows)
        counts = ahead_counts(tasks, self.prefetch)
        gen = pool.passes.ahead(self._gen)
        pool.submit(gen, [t[:n] for t, n in zip(tasks, counts)], ahead=True)
        self._ahead = _Ahead(pool, gen, (plan.epoch, plan.fingerprint), counts)

    def _consume(self, run: Run, writer: ManifestWriter | None, epoch: int) -> Iterator[dict[str, Column]]:
        ready = run.ready
        tr = self._tracer
        span = tr.span
        clock = time.perf_counter
        pool = run.pool
        t_back = 0.0  # when the training loop handed control back to us
        try:
            while True:
                t0 = clock()
                item = ready.get()  # a list of up to STEPS_PER_ITEM batches
                t1 = clock()
                if pool.awaiting_first_batch:
                    # A new pool's first wait is its start-up (processes import the
                    # main module, torch included) plus its first block: traced
                    # apart, so that a short run does not blame it on a stage.
                    pool.awaiting_first_batch = False
                    span("startup", CONSUMER, t0, t1)
                else:
                    span("consumer_wait", CONSUMER, t0, t1)
                if item is END:
                    return
                if type(item) is Failure:
                    raise self._explain(item.error, run)
                for i in range(len(item)):
                    cut, item[i] = item[i], None  # the item must not keep yielded batches (and their blocks) alive
                    batch, step, line, rows = cut.batch, cut.step, cut.line, cut.rows
                    del cut
                    if run.stopped:
                        # Superseded meanwhile (also between taking this item and here, when another
                        # thread stops the pass: a TorchLoader's loop): fail like an empty queue would,
                        # before the manifest records a batch nobody will receive.
                        raise DetloadError(STOPPED)
                    if i:  # the rest of the item needed no wait
                        span("consumer_wait", CONSUMER, t_back, t_back)
                    if writer is not None:
                        writer.write_batch(epoch, step, line)
                    self._position = step + 1
                    tr.delivered(epoch, rows)
                    t_give = clock()
                    yield batch
                    # Not kept by this frame, which an exception raised here later would keep
                    # alive (with the block's shared memory) for as long as the caller keeps it.
                    batch = None
                    # The training loop's own work: from handing it the batch until it asks again.
                    t_back = clock()
                    span("consumer_step", CONSUMER, t_give, t_back)
        finally:
            tr.run_ended()
            if self._run is run:
                self._run = None
            run.stop()

    def _explain(self, error: BaseException, run: Run) -> BaseException:
        """Add what the plan knows to a worker's error: for a file that changed after planning,
        which delivered batches of this pass hold rows of it (and so may hold its new bytes)."""
        path = getattr(error, "changed_file", None)
        if not isinstance(error, DataError) or path is None:
            return error
        plan = run.plan
        first, done = run.start_step, self._position  # steps [first, done) were yielded in this pass
        idx = next((i for i, f in enumerate(self.dataset.files) if f.path == path), None)
        steps: set[int] = set()
        if idx is not None:
            mine = {u for u in range(len(self._unit_files)) if self._unit_files[u] == idx}
            for p in plan.owned_partitions:
                for b in plan.blocks[p]:
                    if mine.intersection(b.sources):
                        steps.update(range(max(b.first_step, first), min(b.last_step + 1, done)))
        if done <= first:
            which = f"none of this pass (epoch {plan.epoch}) was delivered yet"
        elif steps:
            which = (f"in this pass (epoch {plan.epoch}, {done - first} batch(es) delivered since step {first}), "
                     f"step(s) {_ranges(sorted(steps))} hold rows of it")
        else:
            which = f"no batch delivered in this pass (epoch {plan.epoch}, since step {first}) holds rows of it"
        err = DataError(f"{error} Which batches could hold rows of the changed file: {which}; a batch of "
                        "an earlier pass could too, if the file was rewritten while that pass ran.")
        err.changed_file = path  # type: ignore[attr-defined]
        err.__cause__ = error.__cause__
        return err

    # -- observability ---------------------------------------------------------
    def stats(self, since: StatsMark | None = None) -> Stats:
        """Per-stage counts, totals and percentiles, queue depths and the stage bounding
        throughput, over everything this loader has yielded so far, or only over what
        was recorded after ``since`` (a `stats_mark()`). ``stats().table()`` prints them;
        ``stats().write_trace(path)`` writes a Chrome trace-event file."""
        return summarize(self._tracer if since is None else self._tracer.since(since))

    def stats_mark(self) -> StatsMark:
        """A point in time to measure from: ``stats(since=mark)`` covers only what came after
        it (`starvation_check` times its own steps so)."""
        return self._tracer.mark()

    # -- resume ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the consumer is: epoch and batches yielded (not prefetched). JSON-able.

        ``step`` is a global step: the same number on every rank, and valid at any
        world size that keeps ``partitions`` and the global batch size. The dict
        holds no rank, worker count or pool, so it restores under other ones.
        """
        return {
            "format": STATE_FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "plan_format": self.options.plan_format,
            "epoch": self._epoch,
            "step": self._position,
            "order": dict(self.order),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at ``state``'s step on the next iteration; reads nothing for skipped steps.

        Raises StateError naming every option that differs when the state comes
        from another dataset or another order. A manifest this loader writes is
        continued: lines from the resumed step on are cut, new ones appended.
        """
        epoch, step = self.check_state(state)
        self._stop_run()
        self.set_epoch(epoch)
        self._resume_step = step
        self._position = step
        self._resume_manifest = True

    def check_state(self, state: Mapping[str, Any]) -> tuple[int, int]:
        """What `load_state_dict` checks, without changing anything: the state's ``(epoch, step)``,
        or StateError naming every option that differs (so an adapter can refuse a state
        before it stops anything)."""
        if not isinstance(state, Mapping) or "format" not in state or "order" not in state:
            raise StateError("not a detload state: expected the dict that Loader.state_dict() returns")
        if state["format"] != STATE_FORMAT_VERSION:
            raise StateError(f"state format {state['format']!r} cannot be read by this detload "
                             f"(it reads format {STATE_FORMAT_VERSION})")
        theirs = state["order"]
        if not isinstance(theirs, Mapping):
            raise StateError("not a detload state: its 'order' is not a dict")
        diffs = [k for k in sorted(set(theirs) | set(self.order)) if theirs.get(k) != self.order.get(k)]
        if "plan_format" in diffs:
            diffs = ["plan_format"]  # the other differences (units_digest) follow from it
        if diffs:
            raise StateError("cannot resume: " + "; ".join(self._describe_diff(k, theirs.get(k), theirs)
                                                           for k in diffs))
        if state.get("fingerprint") != self.fingerprint:
            raise StateError("cannot resume: the state's plan fingerprint does not match this loader's "
                             "(the state was edited, or made by an incompatible detload)")
        epoch, step = state.get("epoch"), state.get("step")
        if (isinstance(epoch, bool) or isinstance(step, bool) or not isinstance(epoch, int)
                or not isinstance(step, int) or not 0 <= epoch < 2**32 or step < 0):
            raise StateError(f"state has a bad position: epoch={epoch!r}, step={step!r}")
        steps = self.plan(epoch).steps
        if step > steps:
            raise StateError(f"state step {step} is past the {steps} steps of epoch {epoch}")
        return epoch, step

    def _describe_diff(self, key: str, theirs: Any, state_order: Mapping[str, Any]) -> str:
        mine = self.order.get(key)
        if key == "dataset":
            return (f"the dataset changed (fingerprint {theirs!r} in the state, {mine!r} here): "
                    "files, row groups or schema differ")
        if key == "plan_format" and theirs == PLAN_FORMAT_VERSION and mine == PLAN_FORMAT_MIX:
            w = state_window(state_order)
            return (f"this state was written with plan format {theirs} (the windowed order) and this loader "
                    f"plans the mixed order (plan format {mine}, order=\"mix\"). To resume it pass "
                    f"order=\"windowed\" and shuffle_window={w} as in the state, or "
                    f"start a new run (on the command line: --order windowed --shuffle-window {w})")
        if key == "plan_format" and theirs == PLAN_FORMAT_MIX and mine == PLAN_FORMAT_VERSION:
            return (f"this state was written with plan format {theirs} (the mixed order, order=\"mix\") and this "
                    f"loader plans the windowed order (plan format {mine}). To resume it pass order=\"mix\" "
                    "with the state's mix_window and block_rows, or "
                    "start a new run")
        if key == "plan_format":
            return (f"the plan format changed ({theirs!r} in the state, {mine!r} here): this detload plans with "
                    f"format {mine} (row-range units, partitions balanced by rows), which orders the batches of "
                    f"every epoch differently, so the state's step is not a position in this loader's epoch. "
                    "Start a new run, or resume with the detload version that wrote the state")
        what = f"{key}: {theirs!r} in the state, {mine!r} here"
        if key == "type_mapping":
            int96 = [sp.name for sp in self.specs if sp.int96]
            why = (f"; this detload reads the INT96 timestamp column(s) {int96} as datetime64[{INT96_UNIT}], "
                   "where earlier versions read them as datetime64[ns], which wraps dates outside "
                   "1677-2262" if int96 and theirs == 1 else "")
            return (f"the type mapping changed ({theirs!r} in the state, {mine!r} here){why}: the columns "
                    "would not be the bytes the state's run delivered. Start a new run, or resume with "
                    "the detload version that wrote the state")
        if key == "global_batch_size":
            what += (f" (batch_size {self.options.batch_size} x world size {self.options.world_size}; "
                     "batch_size is per rank, so at another world size scale it to keep the global batch)")
        elif key in ("mix_window", "block_rows"):
            w, r = state_order.get("mix_window"), state_order.get("block_rows")
            what += (f". To resume the state pass mix_window={w} and block_rows={r} as it records them "
                     f"(on the command line: --mix-window {w} --block-rows {r}); not given, both follow the "
                     "row groups' rows (docs/determinism.md, plan format 3), where states written before "
                     "this default recorded mix_window=64 and blocks of 4 row groups")
        elif key == "partitions" and self.options.partitions == self.options.world_size:
            what += " (partitions defaults to the world size: pass partitions= explicitly to change world size)"
        return what

    # -- distributed -------------------------------------------------------------
    def rank_info(self) -> dict[str, Any]:
        """What every rank of one job must agree on (besides its own rank), JSON-able."""
        return {
            "rank": self.rank,
            "world_size": self.options.world_size,
            "batch_size": self.options.batch_size,
            "epoch": self._epoch,
            "start_step": self._resume_step,
            "fingerprint": self.fingerprint,
            "order": dict(self.order),
        }

    def check_ranks(self, gather: Callable[[Any], Sequence[Any]] | None = None) -> None:
        """Fail fast when the ranks of one job were given different options.

        ``gather(obj)`` must return every rank's ``obj`` in rank order (a
        collective: every rank calls it). Default: ``torch.distributed``'s
        ``all_gather_object`` when a process group is initialised, else nothing
        is checked. Raises OptionError naming each differing option and the ranks.
        """
        if gather is None:
            dist = sys.modules.get("torch.distributed")
            if dist is None or not (dist.is_available() and dist.is_initialized()):
                return

            def gather(obj: Any) -> Sequence[Any]:
                out: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(out, obj)
                return out

        compare_ranks(list(gather(self.rank_info())))

    # -- lifetime --------------------------------------------------------------
    def close(self) -> None:
        """Stop workers, free shared memory, close the manifest. Idempotent."""
        self._stop_run()
        self._ahead = None
        Loader._cleanup(self._held)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _cleanup(held: dict[str, Any]) -> None:
        writer, pool = held["writer"], held["pool"]
        held["writer"] = held["pool"] = None
        if writer is not None:
            writer.close()
        if pool is not None:
            pool.close()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise refuse_pickling("Loader")

    def __repr__(self) -> str:
        where = display_uri(self.dataset.filesystem, self.dataset.root)
        return (f"Loader({where!r}, files={len(self.dataset.files)}, rows={self.dataset.rows}, "
                f"batch_size={self.options.batch_size}, workers={self.workers}, pool={self.pool_kind!r})")


# -- torch's DataLoader -------------------------------------------------------------
#
# A DataLoader iterates a Loader only if it is an instance of IterableDataset (else it indexes
# it: "'Loader' object is not subscriptable"); _torch_dataloader registers it as one without
# importing torch, at once if torch.utils.data is loaded, else when it is imported.
register_iterable(Loader)


@dataclass(frozen=True)
class _Ahead:
    """Tasks submitted ahead for the pass expected next: its number, plan key, tasks per worker."""

    pool: WorkerPool
    gen: int
    key: tuple[int, str]
    counts: list[int]


def _weak_call(obj: Any, method: Callable[..., None]) -> Callable[..., None]:
    """``method`` of ``obj`` through a weak reference: what the loader hands its run must not
    keep the loader alive (a dropped loader closes its pool when its count reaches zero,
    without waiting for the cyclic garbage collector)."""
    ref = weakref.ref(obj)

    def call(*args: Any) -> None:
        target = ref()
        if target is not None:
            method(target, *args)

    return call


def _ragged_bytes_per_row(dataset: Dataset, names: Sequence[str]) -> float:
    """Uncompressed Parquet bytes per row of the columns ``names`` in the dataset's first
    non-empty file (0 when it cannot be read: the estimate only decides a warning)."""
    import pyarrow.parquet as pq

    f = next((f for f in dataset.files if sum(f.row_groups)), None)
    if f is None:
        return 0.0
    try:
        with dataset.filesystem.open_input_file(f.location) as fh:
            meta = pq.ParquetFile(fh).metadata
    except (OSError, ValueError):
        return 0.0
    wanted = set(names)
    total = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            if col.path_in_schema.split(".")[0] in wanted:
                total += col.total_uncompressed_size
    return total / max(1, meta.num_rows)


def _transform_option(value: Any) -> Transform | None:
    return None if value is None else Transform.of(value)


def _check_source(source: Any) -> None:
    """Refuse source types that would fail deep in discovery with a message about something else."""
    if isinstance(source, str) and not source:
        raise OptionError("source is empty: give a Parquet file, directory, glob or URI")
    if isinstance(source, (bytes, bytearray)):
        raise OptionError(f"source must be a str path, glob or URI (or a list of them), got bytes {bytes(source)!r}: "
                          f"decode it first (source={bytes(source).decode('utf-8', 'replace')!r})")
    if isinstance(source, (list, tuple)):
        for item in source:
            if not isinstance(item, (str, os.PathLike)):
                raise OptionError(f"source lists {type(item).__name__} {item!r}; every item must be a str path "
                                  "or an os.PathLike")


def _manifest_file(manifest: str, rank: int) -> str:
    """A directory (existing, or named with a trailing slash) holds one file per rank."""
    path = manifest
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        return os.path.join(path, f"rank-{rank:05d}.jsonl")
    return path


def state_window(order: Mapping[str, Any]) -> Any:
    """The shuffle_window a windowed order's state or manifest header recorded (4 if it did not)."""
    return order.get("shuffle_window", 4)


def _ranges(steps: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    out: list[str] = []
    lo = prev = steps[0]
    for s in [*steps[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        out.append(f"{lo}-{prev}" if prev > lo else f"{lo}")
        if s is not None:
            lo = prev = s
    return ", ".join(out)


def compare_ranks(infos: Sequence[Mapping[str, Any]]) -> None:
    """Raise OptionError unless the ``Loader.rank_info()`` of every rank (in rank order) agree."""
    if not infos:
        return
    problems: list[str] = []
    ranks = [i.get("rank") for i in infos]
    if ranks != list(range(len(infos))):
        problems.append(f"the loaders' ranks are {ranks} for {len(infos)} processes (expected 0..{len(infos) - 1}): "
                        "pass distributed=detload.Distributed(rank, world_size) from torch.distributed, or leave it unset")
    fields: list[tuple[str, Callable[[Mapping[str, Any]], Any]]] = [
        ("world_size", lambda i: i.get("world_size")),
        ("batch_size", lambda i: i.get("batch_size")),
        ("epoch", lambda i: i.get("epoch")),
        ("resume step", lambda i: i.get("start_step")),
    ]
    keys = sorted({k for i in infos for k in i.get("order", {})})
    fields += [(k, (lambda key: lambda i: i.get("order", {}).get(key))(k)) for k in keys if k != "global_batch_size"]
    for name, get in fields:
        groups: dict[str, list[int]] = {}
        for n, info in enumerate(infos):
            groups.setdefault(json.dumps(get(info), sort_keys=True, default=str), []).append(n)
        if len(groups) > 1:
            problems.append(f"{name} differs: " + ", ".join(f"{v} on ranks {r}" for v, r in groups.items()))
    if problems:
        raise OptionError(
            "the ranks of this job were given different loader options, so they would read "
            "inconsistent data: " + "; ".join(problems)
            + ". Every rank must build its Loader with the same options (and resume from the same state)."
        )
