"""The ordered merger: takes block k from worker k mod W, and nothing else, then cuts batches
(through a `StepCutter`, cut.py) and hands them to the consumer as `StepCut` messages.

It runs in its own thread so that stitching, hashing and manifest-line
formatting never happen in the consumer's thread. The epoch ends when the
plan's last step has been emitted, never because queues look empty. It also
records the stage spans (its own and the workers') in the loader's tracer.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._cache import CacheWarning, RowGroupCache
from .._fdless import descriptor_limit_error, is_out_of_descriptors
from .._trace import MERGER, Tracer
from .._types import Column, ColumnSpec
from ..audit import batch_line, hash_batch
from ..errors import DetloadError, WorkerError
from ..plan import Block, MixBlock, MixPlan, MixTask, Plan
from .block import all_flat, views
from .config import WorkerConfig
from .cut import Buffer, make_cutter
from .mapped import pack_name
from .messages import POLL, BlockReady, Channel, PackedError, StepCut, Task, WorkerFailed, put_until
from .passes import concerns
from .pool import WorkerPool
from .spill import beside_name, spill_name
from .watch import Watch

__all__ = ["END", "Failure", "Run", "ahead_counts", "make_tasks"]

# Warning classes a worker process may raise, by name (see _worker._forward_warnings).
#: The warning classes a process worker's warning is raised again as, by name (any other: UserWarning).
_WARNING_CLASSES: dict[str, type[Warning]] = {
    "CacheWarning": CacheWarning, "ResourceWarning": ResourceWarning, "RuntimeWarning": RuntimeWarning}
STOPPED = ("this iteration was stopped: the loader started a new iteration, changed epoch "
           "or was closed. Iterate the loader again for a fresh pass.")
#: Most batches per item of the ready queue (see Run._emit_steps).
STEPS_PER_ITEM = 8


class _End:
    __slots__ = ()


END = _End()


@dataclass
class Failure:
    error: BaseException


class _Cancelled(Exception):
    pass


def make_tasks(plan: Plan, start_step: int, workers: int, shared: bool = False) -> list[list[Task]]:
    """Each worker's blocks of ``plan`` from ``start_step`` on, as dealt by `Plan.worker_schedules`
    (block k to worker k mod W, so worker w's j-th block is k = j*W + w); a task lists
    its block's row ranges (file, row group, first, rows). The mixed order: each worker's
    plan tasks with the blocks it builds of them (``shared``: workers share task windows,
    block k to worker k mod W; else a task's blocks all go to one worker)."""
    opts = plan.options
    if isinstance(plan, MixPlan):
        schedules = (plan.shared_task_schedules(workers, start_step) if shared
                     else plan.task_schedules(workers, start_step))
        # Shuffled partitions are dealt anew every epoch (partition 0 of one is not of the next).
        fixed = opts.partitions == 1 or not opts.shuffle
        return [
            [Task(blocks[0][0], t.partition, t.number, t.ranges, t.rows, opts.seed, plan.epoch, opts.shuffle,
                  blocks=tuple((k, t.bounds[j], t.bounds[j + 1]) for k, j in blocks),
                  chunks=tuple((j, tuple(t.block_chunks(j))) for _, j in blocks),
                  repeats=fixed and len(plan.tasks[t.partition]) == 1, task_blocks=len(t.bounds) - 1)
             for t, blocks in tasks]
            for tasks in schedules
        ]
    grouped = plan.group_bounds is not None
    return [
        [Task(j * workers + w, b.partition, b.number, b.ranges,
              b.rows, opts.seed, plan.epoch, opts.shuffle, b.group_starts if grouped else ())
         for j, b in enumerate(blocks)]
        for w, blocks in enumerate(plan.worker_schedules(workers, start_step))
    ]


def _window_ends(plan: Plan, schedule: Sequence[Block], cfg: WorkerConfig, gen: int
                 ) -> dict[int, tuple[list[tuple[int, int]], list[str], tuple[int, int]]]:
    """Per schedule position k that is a task's last block: the task's row groups, what
    nothing needs once the task's blocks are built (with the pool's scratch cache their
    entries, and the task's shared files of pass ``gen``: spilled or mapped), and the task
    (partition, number: its claims of those files name it)."""
    last: dict[tuple[int, int], int] = {}
    tasks: dict[tuple[int, int], MixTask] = {}
    for k, b in enumerate(schedule):
        assert isinstance(b, MixBlock)
        key = (b.partition, b.task.number)
        last[key] = k
        tasks[key] = b.task
    cache = RowGroupCache(cfg.cache, cfg.specs, cfg.null_fill) if cfg.scratch and cfg.cache is not None else None
    out: dict[int, tuple[list[tuple[int, int]], list[str], tuple[int, int]]] = {}
    flat = all_flat(cfg.block_specs)
    for key, k in last.items():
        pieces = [(r[0], r[1]) for r in tasks[key].ranges]
        entries = ([cache.path(cfg.files[f].cache_key, rg) for f, rg in pieces if cfg.files[f].cache_key]
                   if cache is not None else [])
        # The task's shared file, spilled or mapped (each worker holds it open or mapped).
        if cfg.spill_share is not None:
            path = os.path.join(cfg.spill_share, spill_name(gen, plan.epoch, *key))
            entries.append(path)
            if not flat:  # its pieces' columns beside it (_engine/spill.py, `SpillPack.publish`)
                entries.extend(beside_name(path, q) for q in range(len(pieces)))
        if cfg.pack_share is not None:
            entries.append(os.path.join(cfg.pack_share, pack_name(gen, plan.epoch, *key)))
        out[k] = (pieces, entries, key)
    if cache is not None:
        cache.close()
    return out


def ahead_counts(tasks: list[list[Task]], limit: int) -> list[int]:
    """How many of each worker's first tasks may be built ahead of a pass: at most ``limit``, and
    only a prefix whose blocks all come before the rest's (a worker builds one message's tasks
    before the next message's, so a mixed-order task that interleaves with a later one stays
    in the later message)."""
    out = []
    for ts in tasks:
        ks = [[k for k, _, _ in t.blocks] or [t.k] for t in ts]
        n = min(len(ts), limit)
        while n and max(max(k) for k in ks[:n]) > min((min(k) for k in ks[n:]), default=2**62):
            n -= 1
        out.append(n)
    return out


class Run:
    """One pass over an epoch (from ``start_step``) for one loader iteration.

    ``ordered=False`` is for the determinism-tax benchmark only: the merger then
    takes whichever block is ready first, so the batches depend on timing. No
    public option reaches it, and a loader with a manifest refuses it.
    """

    def __init__(self, pool: WorkerPool, plan: Plan, specs: Sequence[ColumnSpec], *, gen: int,
                 start_step: int, stall_timeout: float | None, ready_depth: int = 1, ordered: bool = True,
                 hash_batches: bool = True, tracer: Tracer | None = None,
                 ahead: Sequence[int] | None = None, group_columns: Sequence[str] | None = None,
                 first_block: Callable[[Plan, int, int], None] | None = None) -> None:
        self.pool = pool
        #: Called once, on the merger's thread, with the plan and the first block's bytes and
        #: rows (the loader checks its block-memory estimate against a real block).
        self._first_block = first_block
        self.plan = plan
        self.specs = list(specs)
        #: How steps are cut: flat, or packed when the loader groups (group_columns set).
        self.cutter = make_cutter(plan, specs, group_columns)
        self.gen = gen
        self.start_step = start_step
        self.stall_timeout = stall_timeout
        self.watch = Watch(pool, gen, stall_timeout)
        self.ordered = ordered
        self.hash_batches = hash_batches
        self.ready: Channel[Any] = Channel(maxsize=ready_depth)
        self._cancel = threading.Event()
        self._stop_lock = threading.Lock()
        self._merged = False  # the merger took every block of the pass (ordered merge only)
        self.schedule = plan.schedule_from(start_step)
        shared = isinstance(plan, MixPlan) and pool.cfg.share_windows
        self._tasks = make_tasks(plan, start_step, pool.workers, shared)
        #: The worker that builds each block of the schedule (k mod W, or its task's worker).
        self._owner = (plan.block_workers(pool.workers, start_step, shared)
                       if isinstance(plan, MixPlan) else plan.block_workers(pool.workers, start_step))
        #: Shared windows: after the merger took block k, the task whose last block it is lets go
        #: of its window (_engine/share.py); what is left when the pass stops goes then.
        self._window_ends = _window_ends(plan, self.schedule, pool.cfg, gen) if shared else {}
        # Tasks each worker already has: submitted ahead, with this pass number, while
        # the previous pass was running (see Loader._build_ahead).
        self._ahead = list(ahead) if ahead is not None else [0] * pool.workers
        opts = plan.options
        # Items of S consecutive batches span at most one smallest block's rows, so
        # an item pins at most two blocks per partition (docs/reliability.md).
        b_min = min((b.rows for b in self.schedule), default=1)
        self.steps_per_item = max(1, min(STEPS_PER_ITEM, b_min // max(1, opts.micro_batch)))
        self.tracer = tracer if tracer is not None else Tracer(max_events=0)
        self.thread = threading.Thread(target=self._main, name="detload-merger", daemon=True)

    def start(self) -> None:
        self.pool.submit(self.gen, [t[n:] for t, n in zip(self._tasks, self._ahead)])
        self.thread.start()

    def stop(self) -> None:
        """Cancel: the merger exits, workers drop the rest, queued blocks are freed.

        Only the first call acts: a later one (an old iterator ending after a newer
        pass started) must not drain the queues that now feed the newer pass.
        """
        with self._stop_lock:  # two threads may stop a run (a TorchLoader's feeder and its loop)
            if self._cancel.is_set():
                return
            self._cancel.set()
        try:
            merged = self._merged
            # Merged: the queues hold only what was built ahead for the next pass, which
            # stays wanted. Stopped mid-pass: the queues hold this pass's blocks, which are
            # freed, and what was built ahead is cancelled too, so the queues never hold
            # blocks behind one another outside their bound (and a break is rarely followed
            # by the pass predicted).
            self.pool.passes.stop(self.gen, merged=merged)
            if self.thread.is_alive() and threading.current_thread() is not self.thread:
                self.thread.join(timeout=5.0)
            while True:
                try:
                    self.ready.get_nowait()
                except queue.Empty:
                    break
            if not merged:
                self.pool.drain()
            if self._window_ends:  # a stopped pass: its claims, what its workers shared
                if self.thread.is_alive():  # a merger that outlived the join: it may still pop
                    self._window_ends = dict(self._window_ends)
                left = list(self._window_ends.values())
                self.pool.release_windows(self.gen, None, [e for _, es, _ in left for e in es])
        finally:
            # An iterator still holding this run must end, not wait forever: also when the
            # above was interrupted (a KeyboardInterrupt in the thread that stops it).
            while True:
                try:
                    self.ready.put_nowait(Failure(DetloadError(STOPPED)))
                    break
                except queue.Full:  # a merger that outlived the join put an item after the drain
                    with contextlib.suppress(queue.Empty):
                        self.ready.get_nowait()

    @property
    def stopped(self) -> bool:
        return self._cancel.is_set()

    # -- merger thread -------------------------------------------------------
    def _main(self) -> None:
        try:
            self._merge()
            self._emit(END)
        except _Cancelled:
            return
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the consumer
            self.pool.passes.cancel(self.gen)
            _forget_frames(exc)
            if is_out_of_descriptors(exc) and not isinstance(exc, DetloadError):
                exc = descriptor_limit_error("in the loader's process", exc)
            try:
                self._emit(Failure(exc))
            except _Cancelled:
                pass

    def _emit(self, item: Any) -> None:
        try:
            self.ready.put_nowait(item)
            return
        except queue.Full:
            pass
        t0 = time.perf_counter()
        if not put_until(self.ready, item, self._cancel.is_set):
            raise _Cancelled
        self.tracer.span("merge_output_wait", MERGER, t0, time.perf_counter())

    def _sample_depths(self, t: float) -> None:
        self.tracer.depth(t, self.pool.depths(), self.ready.qsize())

    def _take(self, w: int, k: int) -> dict[str, Column]:
        pool = self.pool
        watch = self.watch
        watch.expect(w)
        t0 = time.perf_counter()
        while True:
            if self._cancel.is_set():
                raise _Cancelled
            try:
                msg = pool.get(w, timeout=POLL)
            except queue.Empty:
                if watch.dead(w):
                    # What it sent before it went still waits in its pipe (a start-up failure).
                    try:
                        msg = pool.get_nowait(w)
                    except queue.Empty:
                        raise watch.death(w, k) from None
                else:
                    pool.flush(w)  # credits and segments that did not fit its pipes earlier
                    watch.progress(w, k)
                    continue
            if not concerns(msg.gen, self.gen):
                pool.release(msg)
                if msg.gen > self.gen:
                    # A block built ahead for the next pass: a worker starts those only after
                    # dropping the rest of this one, so this run is being stopped mid-way,
                    # which also cancelled what was built ahead (see stop()).
                    if self._cancel.is_set():
                        raise _Cancelled
                    raise DetloadError(  # pragma: no cover - would be a scheduling bug
                        f"internal error: worker {w} sent a block of a later pass "
                        f"(generation {msg.gen}) before block {k} of this one")
                continue
            if type(msg) is WorkerFailed:
                self._raise_worker_error(w, msg)
            if msg.k != k:  # pragma: no cover - would be a scheduling bug
                raise DetloadError(f"internal error: worker {w} sent block {msg.k}, expected {k}")
            return self._accept(w, t0, msg)

    def _accept(self, w: int, t0: float, msg: BlockReady) -> dict[str, Column]:
        pool = self.pool
        layout, timings = msg.layout, msg.timings
        buf = pool.attach(msg.payload, layout.nbytes)
        t1 = time.perf_counter()
        tr = self.tracer
        tr.span("merge_wait", MERGER, t0, t1)
        tr.worker_spans(w, timings.spans, timings.pid)
        tr.block_reads(self.plan.epoch, timings.source_reads, timings.source_bytes,
                       int(timings.extra.get("cache_hits", 0)))
        for category, message in timings.warnings:
            # A process worker's warning, raised again here so that the user's filters see it.
            warnings.warn(message, _WARNING_CLASSES.get(category, UserWarning), stacklevel=2)
        if self._first_block is not None:
            check, self._first_block = self._first_block, None
            check(self.plan, layout.nbytes, layout.rows)
        self._sample_depths(t1)
        return views(buf, layout)

    def _take_any(self, rr: list[int]) -> tuple[int, dict[str, Column]]:
        """Benchmark-only unordered mode: the first block any worker has ready."""
        pool = self.pool
        W = pool.workers
        t0 = time.perf_counter()
        while True:
            if self._cancel.is_set():
                raise _Cancelled
            for i in range(W):
                w = (rr[0] + i) % W
                if rr[1 + w] <= 0:
                    continue
                try:
                    msg = pool.get_nowait(w)
                except queue.Empty:
                    continue
                if not concerns(msg.gen, self.gen):
                    pool.release(msg)
                    continue
                if type(msg) is WorkerFailed:
                    self._raise_worker_error(w, msg)
                rr[0] = (w + 1) % W
                rr[1 + w] -= 1
                return msg.k, self._accept(w, t0, msg)
            for w in range(W):
                if rr[1 + w] > 0 and not pool.alive(w):
                    with contextlib.suppress(queue.Empty):  # what it sent before it went
                        msg = pool.get_nowait(w)
                        if type(msg) is WorkerFailed:
                            self._raise_worker_error(w, msg)
                        pool.release(msg)
                    raise self.watch.death(w)
            time.sleep(0.0005)

    def _raise_worker_error(self, w: int, msg: WorkerFailed) -> None:
        err = msg.error
        if _out_of_descriptors(err):
            raise descriptor_limit_error(f"in worker {w}", f"{err.type_name}: {err.message}")
        if msg.stage != "block":
            pids = self.pool.pids()
            who = f"worker process {w}" + (f" (pid {pids[w]})" if w < len(pids) else "")
            what = "failed at start-up" if msg.stage == "start" else "failed between blocks"
            # With a hint the cause is known: the traceback stays in .worker_traceback.
            text = (f"{who} {what}: {msg.hint}" if msg.hint else
                    f"{who} {what}: {err.type_name}: {err.message}\n\nWorker traceback:\n{err.traceback}")
            raise WorkerError(text, worker=w, traceback=err.traceback)
        exc = err.exception()
        if isinstance(exc, DetloadError):
            # Our own errors already name column, file and row group; keep their type.
            raise exc
        unit = msg.unit
        where = f"{unit[0]} row group {unit[1]}" if unit else f"block {msg.k}"
        wrapped = WorkerError(
            f"worker {w} failed on {where}: {err.type_name}: {err.message}\n\nWorker traceback:\n{err.traceback}",
            worker=w, unit=unit, traceback=err.traceback,
        )
        if exc is not None:
            raise wrapped from exc
        raise wrapped

    def _merge(self) -> None:
        if not self.ordered:
            self._merge_unordered()
            return
        plan = self.plan
        owned = list(plan.owned_partitions)
        buffers: dict[int, Buffer] = {p: deque() for p in owned}
        step = self.start_step
        owner = self._owner
        for k, block in enumerate(self.schedule):
            end = min(block.first_step, plan.steps)
            if step < end:
                self._emit_steps(step, end, owned, buffers)
                step = end
            cols = self._take(owner[k], k)
            buffers[block.partition].append((block.start, cols))
            del cols
            done = self._window_ends.pop(k, None)
            if done is not None:
                self.pool.release_windows(self.gen, *done)
        self._merged = True  # the queues now hold only what is built ahead for the next pass
        if step < plan.steps:
            self._emit_steps(step, plan.steps, owned, buffers)

    def _merge_unordered(self) -> None:
        """Blocks in completion order, each appended where its partition's stream has reached."""
        plan = self.plan
        owned = list(plan.owned_partitions)
        buffers: dict[int, Buffer] = {p: deque() for p in owned}
        rr = [0] + [self._owner.count(w) for w in range(self.pool.workers)]
        # Where each partition's stream has reached: blocks are placed there by arrival.
        received: dict[int, int] = dict.fromkeys(owned, 0)
        for b in reversed(self.schedule):
            received[b.partition] = b.start
        part_of = {k: b.partition for k, b in enumerate(self.schedule)}
        step = self.start_step
        for _ in range(len(self.schedule)):
            k, cols = self._take_any(rr)
            p = part_of[k]
            n = len(next(iter(cols.values())))
            buffers[p].append((received[p], cols))
            received[p] += n
            del cols
            end = step
            while end < plan.steps and all(plan.micro_range(q, end)[1] <= received[q] for q in owned):
                end += 1
            if step < end:
                self._emit_steps(step, end, owned, buffers)
                step = end
        if step < plan.steps:
            self._emit_steps(step, plan.steps, owned, buffers)

    def _emit_steps(self, first: int, last: int, owned: list[int],
                    buffers: dict[int, Buffer]) -> None:
        """Cut steps ``first..last-1`` and hand them over, ``steps_per_item`` per queue item.

        One queue hand-off per batch (a lock, a wake-up and a GIL switch on each
        side) cost more than cutting the batch; the consumer thread now takes a
        few at a time and its per-batch work is a list step.
        """
        items: list[StepCut] = []
        for step in range(first, last):
            items.append(self._cut_step(step, owned, buffers))
            if len(items) == self.steps_per_item:
                self._emit(items)
                items = []
        if items:
            self._emit(items)

    def _cut_step(self, step: int, owned: list[int], buffers: dict[int, Buffer]) -> StepCut:
        """Cut step ``step`` and, when manifests are kept, hash it (each micro-batch and the whole
        batch, flat or packed alike) into its manifest line."""
        t0 = time.perf_counter()
        batch, micros, rows = self.cutter.cut(step, owned, buffers)
        t1 = time.perf_counter()
        tr = self.tracer
        tr.span("stitch", MERGER, t0, t1)
        line = None
        if self.hash_batches:
            parts = [hash_batch(m) for m in micros]
            digest, cols = parts[0] if len(micros) == 1 else hash_batch(batch)
            line = batch_line(self.plan.epoch, step, rows, digest, cols, [p[0] for p in parts])
            tr.span("hash", MERGER, t1, time.perf_counter())
        return StepCut(batch, step, line, rows)


def _out_of_descriptors(err: PackedError) -> bool:
    """A worker's error says it ran out of descriptors (carried back as text: Arrow's
    errors name the errno only in their message)."""
    exc = err.exception()
    if exc is not None and is_out_of_descriptors(exc):
        return True
    return "Too many open files" in err.message


def _forget_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames that ``exc`` and the exceptions chained to it keep.

    The consumer may keep the exception (a training loop logs it, a notebook keeps
    ``sys.last_value``): its traceback reaches the merger's frames, whose locals hold
    blocks (mapped shared memory) and messages. Only frames that still run (the
    merger's own, here) keep theirs; the pool they reach is emptied by close().
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]
