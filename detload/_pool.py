"""Worker pools: a set of persistent workers (threads or processes), one bounded queue each.

The pool only starts, feeds, watches and stops workers; it decides nothing
about order. Work comes in generations: ``generation`` holds the oldest one
still wanted, so a task or block of an older one is stale and dropped, while a
newer one (the next epoch's first blocks, built ahead) is kept. Processes are
started with forkserver (spawn where unavailable), never fork: forking a process
that already runs pyarrow or torch threads can deadlock the child.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import threading
import time
import uuid
from typing import Any, Literal

from . import _shm
from ._buffers import BlockBuffers
from ._cache import KeptMappings
from ._worker import Status, Task, WorkerConfig, _SharedInt, process_main, worker_loop

__all__ = ["WorkerPool"]

PoolKind = Literal["thread", "process"]


def _context() -> Any:
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        # Each worker then forks from a server that already imported pyarrow.
        ctx.set_forkserver_preload(["detload._worker"])
    return ctx


class WorkerPool:
    def __init__(self, cfg_factory: Any, workers: int, kind: PoolKind, prefetch: int) -> None:
        self.kind = kind
        self.workers = workers
        self.token = uuid.uuid4().hex[:10]
        self.shm_dir = _shm.SHM_DIR if kind == "process" else None
        self.shm_prefix = _shm.segment_prefix(os.getpid(), self.token)
        self.cfg: WorkerConfig = cfg_factory(self.shm_dir, self.shm_prefix)
        # Thread workers build blocks in reused heap slabs (see _buffers.py) and share
        # the cache entries they keep mapped (one mapping per entry in the process).
        self.buffers = BlockBuffers() if kind == "thread" else None
        self.kept = (KeptMappings(self.cfg.cache.map_budget)
                     if kind == "thread" and self.cfg.cache is not None else None)
        if self.buffers is not None:
            self.cfg = dataclasses.replace(self.cfg, buffers=self.buffers, kept=self.kept)
        self._closed = False
        # The consumer's first wait on a new pool includes its start-up (traced as "startup").
        self.awaiting_first_batch = True
        self.inboxes: list[Any] = []
        self.outboxes: list[Any] = []
        self.statuses: list[Status] = []
        self.handles: list[Any] = []
        self.segments: _shm.ConsumerSegments | None = None
        self._gen_lock = threading.Lock()  # guards writes of generation (see cancel)
        if kind == "thread":
            self.generation: Any = _SharedInt(0)
            for i in range(workers):
                inbox: Any = queue.Queue()
                outbox: Any = queue.Queue(maxsize=prefetch)
                st = Status()
                t = threading.Thread(
                    target=worker_loop, args=(self.cfg, i, inbox, outbox, self.generation, st),
                    name=f"detload-worker-{i}", daemon=True,
                )
                self.inboxes.append(inbox)
                self.outboxes.append(outbox)
                self.statuses.append(st)
                self.handles.append(t)
                t.start()
        else:
            _shm.sweep_dead()
            ctx = _context()
            self.generation = ctx.RawValue("q", 0)
            readers, writers = [], []
            for i in range(workers):
                inbox = ctx.Queue()
                outbox = ctx.Queue(maxsize=prefetch)
                arr = ctx.RawArray("q", [0, -1, -1, -1])
                # Segments the consumer no longer views go back to the worker on this pipe.
                r, wr = ctx.Pipe(duplex=False)
                p = ctx.Process(
                    # prefetch finished blocks in the queue and the one being built.
                    target=process_main, args=(self.cfg, i, inbox, outbox, self.generation, arr, r, prefetch + 1),
                    name=f"detload-worker-{i}", daemon=True,
                )
                self.inboxes.append(inbox)
                self.outboxes.append(outbox)
                self.statuses.append(Status(arr))
                self.handles.append(p)
                readers.append(r)
                writers.append(wr)
            for p in self.handles:
                p.start()
            for r in readers:
                r.close()  # the worker holds its own copy; a dead worker then gives a broken pipe
            assert self.shm_dir is not None
            self.segments = _shm.ConsumerSegments(self.shm_dir, writers)

    # -- feeding -----------------------------------------------------------
    def submit(self, gen: int, schedules: list[list[Task]], *, ahead: bool = False) -> None:
        """Queue each worker's tasks. Generation ``gen`` becomes the oldest one wanted,
        unless ``ahead``: then the tasks wait behind the current ones, and stay wanted
        when the current generation is cancelled."""
        if not ahead:
            with self._gen_lock:
                self.generation.value = max(self.generation.value, gen)
        for inbox, tasks in zip(self.inboxes, schedules):
            if tasks:
                inbox.put((gen, tasks))

    def cancel(self, gen: int) -> None:
        """Make generation ``gen`` stale: workers drop its remaining tasks.

        The merger (on a failure) and the consumer's thread (stopping a run) may
        both cancel at once; the value only ever grows, or blocks built ahead that
        one of them had freed could look wanted again.
        """
        with self._gen_lock:
            if self.generation.value <= gen:
                self.generation.value = gen + 1

    def get(self, w: int, timeout: float) -> Any:
        return self.outboxes[w].get(timeout=timeout)

    def attach(self, payload: Any, nbytes: int) -> Any:
        """The bytes of a block a worker handed over (its heap array, or its shared-memory segment)."""
        if self.segments is None:
            return payload
        return self.segments.attach(payload, nbytes)

    def release(self, item: Any) -> None:
        """Free a block that will never be used (stale or unwanted)."""
        if self.segments is not None and item and item[0] == "ok" and isinstance(item[3], _shm.Segment):
            seg = item[3]
            if not self._closed:
                self.segments.release(seg)
            else:  # closing: the workers go, nothing will be reused
                for name in [seg.name, *(name for _, name, _ in seg.made_ahead)]:
                    if name is not None:
                        _shm.discard(self.segments.directory, name)

    def drain(self) -> None:
        for q in self.outboxes:
            while True:
                try:
                    self.release(q.get_nowait())
                except (queue.Empty, OSError, EOFError, ValueError):
                    break

    # -- watching ----------------------------------------------------------
    def alive(self, w: int) -> bool:
        return bool(self.handles[w].is_alive())

    def describe_death(self, w: int) -> str:
        h = self.handles[w]
        if self.kind == "thread":
            return f"worker thread {w} exited"
        code = h.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        hint = ""
        if code == 1:
            hint = (" (it raised at start-up; see its traceback on stderr. With pool='process' a "
                    "script must create the Loader under `if __name__ == \"__main__\":`, because "
                    "worker processes import the main module)")
        elif code is not None and code < 0:
            hint = " (an out-of-memory kill? check the system log)"
        return f"worker process {w} (pid {h.pid}) {how}{hint}"

    def pids(self) -> list[int]:
        return [h.pid for h in self.handles] if self.kind == "process" else []

    # -- stopping ----------------------------------------------------------
    def close(self, timeout: float = 2.0) -> None:
        if self._closed:
            return
        self._closed = True
        with self._gen_lock:
            self.generation.value = 2**62  # every generation is stale, those queued ahead too
        for inbox in self.inboxes:
            try:
                inbox.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout
        # Empty the queues so no worker stays blocked on a full one.
        while any(h.is_alive() for h in self.handles) and time.monotonic() < deadline:
            self.drain()
            for h in self.handles:
                h.join(timeout=0.02)
        self.drain()
        if self.buffers is not None:
            self.buffers.close()
        if self.kept is not None:
            self.kept.close()
        if self.kind == "process":
            for h in self.handles:
                if h.is_alive():
                    h.terminate()
            for h in self.handles:
                h.join(timeout=1.0)
                if h.is_alive():
                    h.kill()
                    h.join(timeout=1.0)
            for q in self.inboxes + self.outboxes:
                try:
                    # Never wait on a feeder thread whose reader is gone.
                    q.cancel_join_thread()
                    q.close()
                except (OSError, ValueError, AssertionError):
                    pass
            for h in self.handles:
                try:
                    h.close()
                except ValueError:
                    pass
            assert self.shm_dir is not None and self.segments is not None
            self.segments.close()
            _shm.sweep(self.shm_dir, self.shm_prefix)
