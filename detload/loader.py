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
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import xxhash

from . import __version__
from ._cache import object_key, open_cache
from ._dataset import Dataset, discover
from ._merge import END, STOPPED, Failure, Run, make_tasks
from ._pool import WorkerPool
from ._remote import object_uri
from ._trace import CONSUMER, Tracer
from ._types import TYPE_MAPPING_VERSION, Column, ColumnSpec
from ._worker import DebugHooks, FileRef, WorkerConfig
from .audit import MANIFEST_FORMAT, MANIFEST_VERSION, ManifestWriter
from .errors import DetloadError, OptionError, StateError
from .plan import PLAN_FORMAT_VERSION, OrderOptions, Plan, make_plan
from .stats import Stats, _cores, summarize

__all__ = ["STATE_FORMAT_VERSION", "Loader", "compare_ranks", "resolve_workers"]

STATE_FORMAT_VERSION = 1
PoolKind = Literal["thread", "process"]
_MAX_WORKERS = 256


def resolve_workers(workers: int | str) -> int:
    """``"auto"``: one worker per usable core, at most 16; workers never change the batches."""
    if workers == "auto":
        return max(1, min(_cores(), 16))
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)):
        raise OptionError(f"workers must be an int >= 1 or 'auto', got {workers!r}")
    if not 1 <= workers <= _MAX_WORKERS:
        raise OptionError(f"workers must be in [1, {_MAX_WORKERS}], got {workers}")
    return int(workers)


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
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or not 0 <= epoch < 2**32:
        raise OptionError(f"epoch must be an int in [0, 2**32), got {epoch!r}")


class Loader:
    """Deterministic parallel Parquet loader. Iterating yields ``dict[str, ndarray | Ragged]``.

    The batches are a pure function of the dataset, ``seed``, the epoch and the
    order options (batch_size x world size, shuffle, shuffle_window, columns,
    drop_last, partitions, null_fill) — never of ``workers``, ``pool``,
    ``prefetch`` or timing. See docs/loader.md for every option.
    """

    def __init__(
        self,
        source: Any,
        *,
        batch_size: int,
        seed: int,
        workers: int | str = 1,
        pool: PoolKind = "thread",
        columns: Sequence[str] | None = None,
        shuffle: bool = True,
        shuffle_window: int = 4,
        drop_last: bool = False,
        prefetch: int = 2,
        manifest: str | os.PathLike[str] | None = None,
        null_fill: Mapping[str, Any] | None = None,
        partitions: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        filesystem: Any = None,
        partitioning: Mapping[str, str] | None = None,
        stall_timeout: float | None = 300.0,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        cache_map_limit: int | str | None = "auto",
        _debug: DebugHooks | None = None,
        _cache_fail_after_bytes: int | None = None,
        _benchmark_unordered: bool = False,
    ) -> None:
        self.workers = resolve_workers(workers)
        if pool not in ("thread", "process"):
            raise OptionError(f"pool must be 'thread' or 'process', got {pool!r}")
        self.pool_kind: PoolKind = pool
        if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or prefetch < 1:
            raise OptionError(f"prefetch must be an int >= 1 (blocks per worker), got {prefetch!r}")
        self.prefetch = int(prefetch)
        if stall_timeout is not None and (
            isinstance(stall_timeout, bool) or not isinstance(stall_timeout, (int, float, np.integer, np.floating))
            or not stall_timeout > 0
        ):
            raise OptionError(f"stall_timeout must be a positive number of seconds or None, got {stall_timeout!r}")
        self.stall_timeout = None if stall_timeout is None else float(stall_timeout)
        self.rank, world = _distributed_defaults(rank, world_size)
        if partitions is None:
            partitions = world
        self.options = OrderOptions(
            seed=seed, batch_size=batch_size, shuffle=shuffle, shuffle_window=shuffle_window,
            drop_last=drop_last, partitions=partitions, world_size=world,
        )
        if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) or not 0 <= self.rank < world:
            raise OptionError(f"rank must be an int in [0, {world}), got {self.rank!r}")
        self.rank = int(self.rank)
        if null_fill is not None and not isinstance(null_fill, Mapping):
            raise OptionError(f"null_fill must be a dict {{column: value}}, got {null_fill!r}")
        self.null_fill = dict(null_fill or {})
        self.dataset: Dataset = discover(source, filesystem=filesystem, partitioning=partitioning)
        self.specs: list[ColumnSpec] = self.dataset.specs(columns)
        names = [s.name for s in self.specs]
        unknown_fill = [k for k in self.null_fill if k not in names]
        if unknown_fill:
            raise OptionError(f"null_fill names {unknown_fill}, which are not among the loaded columns {names}")
        for spec in self.specs:
            if spec.name in self.null_fill:
                _check_fill(spec, self.dataset, self.null_fill[spec.name])
        self._unit_files, self._unit_rgs, self._unit_rows = self.dataset.units()
        # Cache state never enters `order`: cold, warm and uncached runs yield the same bytes.
        fs = self.dataset.filesystem
        self._cache_keys = [object_key(fs, f.location, f.size, f.mtime_ns, f.etag) for f in self.dataset.files]
        self._uris = [object_uri(fs, f.location) for f in self.dataset.files]
        self.cache = open_cache(cache_dir, cache_limit, self._cache_keys, cache_map_limit=cache_map_limit,
                                fail_after_bytes=_cache_fail_after_bytes)
        self.order = {
            **self.options.order_dict(),
            "columns": names,
            "null_fill": {k: _jsonable(v) for k, v in sorted(self.null_fill.items())},
            "type_mapping": TYPE_MAPPING_VERSION,
            "plan_format": PLAN_FORMAT_VERSION,
            "dataset": self.dataset.fingerprint,
        }
        self.fingerprint = xxhash.xxh3_128_hexdigest(json.dumps(self.order, sort_keys=True).encode())
        self._debug = _debug
        # Benchmark-only (the determinism-tax measurement): the merger takes blocks in
        # completion order, so batches depend on timing. Never for training runs.
        if _benchmark_unordered and manifest is not None:
            raise OptionError("_benchmark_unordered is a benchmark-only switch and cannot write a manifest")
        self._ordered = not _benchmark_unordered
        self._tracer = Tracer()
        self._epoch = 0
        self._plans: dict[int, Plan] = {}
        self._resume_step = 0
        self._position = 0  # batches of the current epoch already yielded
        self._gen = 0
        self._run: Run | None = None
        self._ahead: _Ahead | None = None
        self._last_epoch: int | None = None  # epoch of the previous pass
        self.ahead_used = 0  # passes that found their first blocks built ahead (tests, stats)
        self._lock = threading.Lock()
        self._manifest_path = _manifest_file(manifest, self.rank) if manifest is not None else None
        self._resume_manifest = False
        # The pool and the manifest writer live here, and only here: the finalizer
        # closes whatever this holds when the loader is collected without close().
        self._held: dict[str, Any] = {"pool": None, "writer": None}
        self._finalizer = weakref.finalize(self, Loader._cleanup, self._held)

    @property
    def _pool(self) -> WorkerPool | None:
        return self._held["pool"]

    @property
    def _writer(self) -> ManifestWriter | None:
        return self._held["writer"]

    # -- planning ------------------------------------------------------------
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
            p = make_plan(self._unit_rows, self.options, epoch=e, rank=self.rank,
                          dataset_fingerprint=self.fingerprint)
            if len(self._plans) > 4:
                self._plans.clear()
            self._plans[e] = p
        return p

    @property
    def position(self) -> int:
        """Batches of the current epoch already yielded (the ``step`` of ``state_dict()``)."""
        return self._position

    def __len__(self) -> int:
        """Batches in the current epoch (for this rank; all ranks get the same count)."""
        return self.plan().steps

    @property
    def column_specs(self) -> list[ColumnSpec]:
        return list(self.specs)

    # -- iteration -------------------------------------------------------------
    def _ensure_pool(self) -> WorkerPool:
        if self._pool is None:
            ds = self.dataset
            files = tuple(FileRef(f.location, f.path, f.partition_values, f.row_groups, key, uri,
                                  f.size, f.etag, f.mtime_ns)
                          for f, key, uri in zip(ds.files, self._cache_keys, self._uris))

            def make_cfg(shm_dir: str | None, prefix: str) -> WorkerConfig:
                return WorkerConfig(files, ds.filesystem, tuple(self.specs), self.null_fill, shm_dir,
                                    prefix, os.getpid(), self._debug, cache=self.cache)

            self._held["pool"] = WorkerPool(make_cfg, self.workers, self.pool_kind, self.prefetch)
        return self._held["pool"]

    def _header(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "detload_version": __version__,
            "order": self.order,
            "fingerprint": self.fingerprint,
            "batch_size": self.options.batch_size,
            "rank": self.rank,
            "world_size": self.options.world_size,
            "partitions": self.options.partitions,
            "owned_partitions": list(self.plan().owned_partitions),
            "workers": self.workers,
            "pool": self.pool_kind,
        }

    @property
    def manifest_path(self) -> str | None:
        """The manifest file this loader writes (a rank file inside a run directory), if any."""
        return self._manifest_path

    def _ensure_writer(self) -> ManifestWriter | None:
        if self._manifest_path is not None and self._writer is None:
            self._held["writer"] = ManifestWriter(self._manifest_path, self._header(), resume=self._resume_manifest)
        return self._writer

    def _stop_run(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.stop()

    def __iter__(self) -> Iterator[dict[str, Column]]:
        with self._lock:
            self._stop_run()
            pool = self._ensure_pool()
            # A worker that died (or never started) is reported now, not after the batches
            # the others could still deliver: the pool does not replace it.
            pool.check_usable()
            plan = self.plan()
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
                    and ahead.gen >= pool.generation.value):  # not cancelled by a break
                # Workers already have (or are building) this pass's first blocks.
                self._gen, counts = ahead.gen, ahead.counts
                self.ahead_used += 1
            else:
                # Newer than any generation handed out, so blocks built ahead for a
                # pass that did not come are stale and freed.
                self._gen = max(pool.generation.value, ahead.gen if ahead is not None else 0) + 1
            run = Run(pool, plan, self.specs, gen=self._gen, start_step=start,
                      unit_files=self._unit_files, unit_rgs=self._unit_rgs,
                      stall_timeout=self.stall_timeout,
                      # Hashes exist for the manifest; without one they would be work for nothing.
                      hash_batches=writer is not None, ordered=self._ordered,
                      tracer=self._tracer, ahead=counts)
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
        tasks = make_tasks(plan, 0, pool.workers, self._unit_files, self._unit_rgs)
        counts = [min(len(t), self.prefetch) for t in tasks]
        gen = self._gen + 1
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
                    raise item.error
                for i in range(len(item)):
                    batch, step, line, rows = item[i]
                    item[i] = None  # the item must not keep yielded batches (and their blocks) alive
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
                    tr.batches += 1
                    tr.rows += rows
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

    # -- observability ---------------------------------------------------------
    def stats(self) -> Stats:
        """Per-stage counts, totals and percentiles, queue depths and the stage bounding
        throughput, over everything this loader has yielded so far. ``stats().table()``
        prints them; ``stats().write_trace(path)`` writes a Chrome trace-event file."""
        return summarize(self._tracer)

    def _stats_mark(self) -> Any:
        """For `_stats_since`: stats of a window (starvation_check times only its own steps)."""
        return self._tracer.mark()

    def _stats_since(self, mark: Any) -> Stats:
        return summarize(self._tracer.since(mark))

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
        epoch, step = self._check_state(state)
        self._stop_run()
        self.set_epoch(epoch)
        self._resume_step = step
        self._position = step
        self._resume_manifest = True

    def _check_state(self, state: Mapping[str, Any]) -> tuple[int, int]:
        """What `load_state_dict` checks, without changing anything: ``(epoch, step)`` or StateError."""
        if not isinstance(state, Mapping) or "format" not in state or "order" not in state:
            raise StateError("not a detload state: expected the dict that Loader.state_dict() returns")
        if state["format"] != STATE_FORMAT_VERSION:
            raise StateError(f"state format {state['format']!r} cannot be read by this detload "
                             f"(it reads format {STATE_FORMAT_VERSION})")
        theirs = state["order"]
        if not isinstance(theirs, Mapping):
            raise StateError("not a detload state: its 'order' is not a dict")
        diffs = [k for k in sorted(set(theirs) | set(self.order)) if theirs.get(k) != self.order.get(k)]
        if diffs:
            raise StateError("cannot resume: " + "; ".join(self._describe_diff(k, theirs.get(k)) for k in diffs))
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

    def _describe_diff(self, key: str, theirs: Any) -> str:
        mine = self.order.get(key)
        if key == "dataset":
            return (f"the dataset changed (fingerprint {theirs!r} in the state, {mine!r} here): "
                    "files, row groups or schema differ")
        what = f"{key}: {theirs!r} in the state, {mine!r} here"
        if key == "global_batch_size":
            what += (f" (batch_size {self.options.batch_size} x world size {self.options.world_size}; "
                     "batch_size is per rank, so at another world size scale it to keep the global batch)")
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

    def __repr__(self) -> str:
        return (f"Loader({self.dataset.root!r}, files={len(self.dataset.files)}, rows={self.dataset.rows}, "
                f"batch_size={self.options.batch_size}, workers={self.workers}, pool={self.pool_kind!r})")


@dataclass(frozen=True)
class _Ahead:
    """Tasks submitted ahead for the pass expected next: generation, plan key, tasks per worker."""

    pool: WorkerPool
    gen: int
    key: tuple[int, str]
    counts: list[int]


def _check_fill(spec: ColumnSpec, dataset: Dataset, value: Any) -> None:
    """Reject a null_fill value that does not fit its column now, not at the first null."""
    import pyarrow as pa

    if spec.partition:
        t = pa.int64() if spec.kind == "fixed" else pa.string()
    else:
        t = dataset.schema.field(spec.name).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    try:
        pa.scalar(value, type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise OptionError(f"null_fill[{spec.name!r}] = {value!r} does not fit the column's type {t}: {exc}") from None


def _manifest_file(manifest: str | os.PathLike[str], rank: int) -> str:
    """A directory (existing, or named with a trailing slash) holds one file per rank."""
    path = os.fspath(manifest)
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        return os.path.join(path, f"rank-{rank:05d}.jsonl")
    return path


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.generic,)):
        return v.item()
    if isinstance(v, bytes):
        return v.decode("latin-1")
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def compare_ranks(infos: Sequence[Mapping[str, Any]]) -> None:
    """Raise OptionError unless the ``Loader.rank_info()`` of every rank (in rank order) agree."""
    if not infos:
        return
    problems: list[str] = []
    ranks = [i.get("rank") for i in infos]
    if ranks != list(range(len(infos))):
        problems.append(f"the loaders' ranks are {ranks} for {len(infos)} processes (expected 0..{len(infos) - 1}): "
                        "pass rank= and world_size= from torch.distributed, or leave them unset")
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
