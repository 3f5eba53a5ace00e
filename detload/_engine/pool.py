"""Worker pools: a set of persistent workers (threads or processes) and the channels to them.

The pool only starts, feeds, watches and stops workers; it decides nothing
about order. Work comes in numbered passes: ``passes`` (a `Passes`, see
_engine/passes.py) holds the oldest one still wanted, so a task or block of an
older one is stale and dropped, while a newer one (the next epoch's first
blocks, built ahead) is kept.

Thread workers get `Tasks` on a `Channel` (messages.py) and put their blocks on a
bounded one. Process workers (started by _engine/spawn.py: forkserver, never fork)
talk through plain pipes, without ``multiprocessing.Queue``: no semaphores
(nothing a SIGKILLed process group could leave in /dev/shm, no resource-tracker
warnings), no feeder threads, and every descriptor dies with its process. Each
worker has four:

- its inbox (pool to worker): `Tasks`, written by the pool's sender thread, since
  a pass's task list can exceed a pipe's buffer while the worker is busy and the
  consumer must never wait for a worker to read;
- its outbox (worker to merger): `BlockReady` and `WorkerFailed`. The merger's
  end (`_Outbox`) gives the worker one credit back for each block it takes, so a
  worker holds at most ``prefetch`` finished blocks nobody took;
- its credit pipe (consumer to worker): how many of its blocks were taken. It is
  apart from the return pipe below so that a waiting worker wakes for credit
  only, not for every segment that comes back;
- its return pipe (consumer to worker): segments the consumer no longer views
  (see _engine/shm.py).

`close()` releases every descriptor, process, mapping and thread the pool
holds, and forgets them, so that whatever still refers to the pool (an
exception the caller keeps, whose traceback reaches the merger's frames) keeps
no operating-system resource alive.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import queue
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

from .._cache import KeptMappings
from .._fdless import check_descriptors, descriptor_limit_error, is_out_of_descriptors
from ..errors import OptionError, WorkerError
from . import share
from . import shm as _shm
from . import spawn as _spawn
from .config import WorkerConfig
from .heap import BlockBuffers
from .memory import BufferWatch, install_ctrl_c_hook
from .messages import CREDIT, BlockReady, Channel, Poller, Task, Tasks, WorkerFailed
from .passes import Passes
from .spill import hold_spill_files, release_spill_files
from .worker import Status, ThreadLink, process_main, worker_loop

__all__ = ["WorkerPool"]

PoolKind = Literal["thread", "process"]


class _Outbox:
    """The merger's end of one worker process's outbox pipe, used like a queue.

    A block that leaves it (taken, or released unused) gives the worker its credit
    back on ``credit``, a non-blocking pipe: what does not fit is owed and sent with
    the next one, or by `flush` while the merger waits for this worker. ``sent`` is
    the worker's count of blocks sent (shared memory), so `qsize` (the blocks sent
    and not yet taken, sampled by the trace at every block) costs no system call.
    """

    def __init__(self, conn: Any, credit: Any, sent: _spawn.Slot) -> None:
        self._conn = conn
        self._ready = Poller([conn])
        self._credit = credit
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(credit.fileno(), False)
        self._owed = 0
        self._sent = sent
        self._taken = 0
        self._got: deque[Any] = deque()
        self._lock = threading.Lock()
        self.eof = False  # the worker closed its end: it exited

    def _read(self, timeout: float) -> None:
        """Under the lock: one message into ``_got`` if one comes within ``timeout``."""
        try:
            if self._ready.wait(timeout):
                self._got.append(self._conn.recv())
        except (EOFError, OSError, ValueError):  # ValueError: closed meanwhile
            self.eof = True

    def _pop(self) -> Any:
        msg = self._got.popleft()
        if type(msg) is BlockReady:
            self._taken += 1
            self._owed += 1
            self._give()
        return msg

    def _give(self) -> None:
        """Under the lock: send the credit owed (a message of 12 bytes is written whole or not at all)."""
        try:
            self._credit.send_bytes(CREDIT.pack(self._owed))
            self._owed = 0
        except BlockingIOError:  # the worker has not read its credits: they wait here
            pass
        except (OSError, ValueError):  # a dead worker, or a closed pool
            self._owed = 0

    def flush(self) -> None:
        with self._lock:
            if self._owed:
                self._give()

    def get(self, timeout: float) -> Any:
        with self._lock:
            if not self._got and not self.eof:
                self._read(timeout)
            if self._got:
                return self._pop()
        if self.eof:
            time.sleep(timeout)  # the worker is gone: its death is the caller's to notice
        raise queue.Empty

    def get_nowait(self) -> Any:
        with self._lock:
            if not self._got and not self.eof:
                self._read(0)
            if self._got:
                return self._pop()
        raise queue.Empty

    def qsize(self) -> int:
        return max(0, self._sent.value - self._taken)

    def close(self) -> list[Any]:
        """Close the pipe; returns what was read and not taken (to be released)."""
        with self._lock:
            left = list(self._got)
            self._got.clear()
            self.eof = True
            for conn in (self._conn, self._credit):
                with contextlib.suppress(OSError):
                    conn.close()
        return left


class _Sender:
    """Writes `Tasks` to the workers' inbox pipes from its own thread, in order.

    A write can wait (a worker busy with a long block does not read), and the
    consumer must not. `stop` makes it close the pipes once it wrote what it was
    given: a worker that reads the end of its inbox leaves.
    """

    def __init__(self, conns: list[Any]) -> None:
        self._conns = conns
        self._q: queue.SimpleQueue[tuple[int, Tasks] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="detload-sender", daemon=True)
        self._thread.start()

    def send(self, worker: int, msg: Tasks) -> None:
        self._q.put((worker, msg))

    def _run(self) -> None:
        try:
            while True:
                item = self._q.get()
                if item is None:
                    return
                worker, msg = item
                try:
                    self._conns[worker].send(msg)
                except (OSError, ValueError):  # a dead worker: the merger reports it
                    pass
        finally:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.close()

    def stop(self) -> None:
        self._q.put(None)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class WorkerPool:
    def __init__(self, cfg_factory: Any, workers: int, kind: PoolKind, prefetch: int,
                 watch: BufferWatch | None = None) -> None:
        # A worker process importing a main module that has no guard gets here: refused
        # before anything starts (it becomes the worker's start-up error).
        _spawn.check_not_importing_main()
        install_ctrl_c_hook()  # a Ctrl-C that lands in a weakref callback is not lost
        self.kind = kind
        self.workers = workers
        self.token = uuid.uuid4().hex[:10]
        self.shm_dir = _shm.SHM_DIR if kind == "process" else None
        self.shm_prefix = _shm.segment_prefix(os.getpid(), self.token)
        self.cfg: WorkerConfig = cfg_factory(kind, self.shm_prefix)
        # Thread workers build blocks in reused heap slabs (see _engine/heap.py) and share
        # the cache entries they keep mapped (one mapping per entry in the process).
        # Who hears of the consumer-side buffers blocks live in (memory.py; a pinned hand-off).
        self.watch = watch if watch is not None else BufferWatch()
        self.buffers = BlockBuffers(self.watch) if kind == "thread" else None
        self.kept = (KeptMappings(self.cfg.cache.map_budget)
                     if kind == "thread" and self.cfg.cache is not None else None)
        if self.buffers is not None:
            self.cfg = dataclasses.replace(self.cfg, buffers=self.buffers, kept=self.kept,
                                           window_share=share.MemoryShare() if self.cfg.share_windows else None)
        if kind == "thread":
            hold_spill_files(self.cfg.spill_dir)  # until close
        self._closed = False
        # The consumer's first wait on a new pool includes its start-up (traced as "startup").
        self.awaiting_first_batch = True
        self.inboxes: list[Any] = []
        self.outboxes: list[Any] = []
        self.statuses: list[Status] = []
        self.handles: list[Any] = []
        self.segments: _shm.ConsumerSegments | None = None
        self._sender: _Sender | None = None
        self._ints: _spawn.SharedInts | None = None
        # A worker that could not start, or failed outside any block, keeps its message here.
        self._failed: dict[int, WorkerFailed] = {}
        # Processes: over a slot of SharedInts that the workers read (see _start_processes).
        self.passes = Passes()
        if kind == "thread":
            for i in range(workers):
                # Channels, not queue.Queue: the consumer's thread puts tasks and drains
                # blocks, and a Ctrl-C there must not leave a lock taken (messages.py).
                inbox: Channel[Any] = Channel()
                outbox: Channel[Any] = Channel(maxsize=prefetch)
                st = Status()
                t = threading.Thread(
                    target=worker_loop, args=(self.cfg, i, ThreadLink(inbox, outbox), self.passes, st),
                    name=f"detload-worker-{i}", daemon=True,
                )
                self.inboxes.append(inbox)
                self.outboxes.append(outbox)
                self.statuses.append(st)
                self.handles.append(t)
                t.start()
        else:
            # Pickled once, here: what refers to the main module decides how workers start,
            # and a configuration that does not pickle fails before any process exists.
            data = pickle.dumps(self.cfg, protocol=pickle.HIGHEST_PROTOCOL)
            names = tuple(_spawn.main_references(data))
            main = None
            if names:
                main = _spawn.main_source()
                if main is None:
                    raise OptionError(
                        f"pool='process' must send {', '.join(names)} to its worker processes, and "
                        f"{'it is' if len(names) == 1 else 'they are'} defined in the main module, which a "
                        f"worker process cannot import: {_spawn.unimportable_main()}. Use pool='thread', "
                        "or move it into a module file and import it from there.")
            _shm.sweep_dead()
            try:
                self._start_processes(data, prefetch, main, names)
            except BaseException as exc:
                self.close()
                if is_out_of_descriptors(exc):
                    raise descriptor_limit_error("starting worker processes", exc) from exc
                raise

    def _start_processes(self, data: bytes, prefetch: int, main: _spawn.MainSource | None,
                         names: tuple[str, ...]) -> None:
        ctx = _spawn.context()
        assert self.shm_dir is not None
        # Four pipes per worker (two ends each); the forkserver and resource tracker need some too.
        check_descriptors(8 * self.workers + 16, f"starting {self.workers} worker processes")
        ints = self._ints = _spawn.SharedInts(1 + _spawn.SLOTS_PER_WORKER * self.workers, directory=self.shm_dir)
        self.passes = Passes(_spawn.Slot(ints, 0))
        theirs: list[Any] = []  # the workers' ends: closed here once they have their copies
        try:
            returns, outs, sent = [], [], []
            for i in range(self.workers):
                in_r, in_w = ctx.Pipe(duplex=False)
                out_r, out_w = ctx.Pipe(duplex=False)
                credit_r, credit_w = ctx.Pipe(duplex=False)
                ret_r, ret_w = ctx.Pipe(duplex=False)
                theirs += [in_r, out_w, credit_r, ret_r]
                self.inboxes.append(in_w)
                outs.append((out_r, credit_w))
                returns.append(ret_w)
                status, count = _spawn.worker_slots(ints, i)
                self.statuses.append(Status(status))
                sent.append(count)
                self.handles.append(ctx.Process(
                    target=process_main,
                    args=(data, i, in_r, out_w, credit_r, ints, ret_r, prefetch, main, names),
                    name=f"detload-worker-{i}", daemon=True))
            self.segments = _shm.ConsumerSegments(self.shm_dir, returns, self.watch)
            self.outboxes = [_Outbox(out, credit, n) for (out, credit), n in zip(outs, sent)]
            with _spawn.starting():
                self._sender = _Sender(self.inboxes)
                for p in self.handles:
                    p.start()
        finally:
            for conn in theirs:
                conn.close()
            ints.release_fd()

    # -- feeding -----------------------------------------------------------
    def submit(self, gen: int, schedules: list[list[Task]], *, ahead: bool = False) -> None:
        """Queue each worker's tasks of pass ``gen``, which begins (`Passes.begin`), unless
        ``ahead``: then the tasks wait behind the current ones, and stay wanted when the
        current pass stops once it is merged (`Passes.stop`)."""
        if not ahead:
            self.passes.begin(gen)
        for w, tasks in enumerate(schedules):
            if tasks:
                if self._sender is not None:
                    self._sender.send(w, Tasks(gen, tasks))
                else:
                    self.inboxes[w].put(Tasks(gen, tasks))

    def get(self, w: int, timeout: float) -> Any:
        """Worker ``w``'s next message, waiting up to ``timeout`` s (``queue.Empty`` if none)."""
        return self._noted(w, self.outboxes[w].get(timeout=timeout))

    def get_nowait(self, w: int) -> Any:
        return self._noted(w, self.outboxes[w].get_nowait())

    def _noted(self, w: int, msg: Any) -> Any:
        if type(msg) is WorkerFailed and msg.stage != "block":
            self._failed.setdefault(w, msg)
        return msg

    def flush(self, w: int) -> None:
        """While waiting for worker ``w``: send it what did not fit its pipes earlier."""
        if self.segments is not None:
            self.segments.flush(w)
        out = self.outboxes[w]
        if isinstance(out, _Outbox):
            out.flush()

    def depths(self) -> tuple[int, ...]:
        """Finished blocks waiting for the merger, per worker (-1 where unknown)."""
        out = []
        for q in self.outboxes:
            try:
                out.append(q.qsize())
            except (NotImplementedError, OSError, ValueError):
                out.append(-1)
        return tuple(out)

    def attach(self, payload: Any, nbytes: int) -> Any:
        """The bytes of a block a worker handed over (its heap array, or its shared-memory segment)."""
        if self.segments is None:
            return payload
        return self.segments.attach(payload, nbytes)

    def release(self, msg: Any) -> None:
        """Free a block that will never be used (stale or unwanted)."""
        if type(msg) is not BlockReady or not isinstance(msg.payload, _shm.Segment):
            return
        seg = msg.payload
        if self.segments is not None and not self._closed:
            self.segments.release(seg)
        elif self.shm_dir is not None:  # closing: the workers go, nothing will be reused
            for name in [seg.name, *(name for _, name, _ in seg.made_ahead)]:
                if name is not None:
                    _shm.discard(self.shm_dir, name)

    def drain(self) -> None:
        for w in range(len(self.outboxes)):
            while True:
                try:
                    self.release(self.get_nowait(w))
                except queue.Empty:
                    break

    # -- watching ----------------------------------------------------------
    def alive(self, w: int) -> bool:
        if self._closed or w >= len(self.handles):
            return False
        return bool(self.handles[w].is_alive())

    def exitcode(self, w: int) -> int | None:
        """A worker process's exit code (negative: the signal that killed it); None for threads."""
        return self.handles[w].exitcode if self.kind == "process" and w < len(self.handles) else None

    def killed_by_sigbus(self, w: int) -> bool:
        """Whether worker process w died of SIGBUS: through a memory map, a page that could not be
        read (a file shrunk under the map, failed storage, a full /dev/shm)."""
        sig = getattr(signal, "SIGBUS", None)  # absent on Windows
        return sig is not None and self.exitcode(w) == -sig

    def describe_death(self, w: int) -> str:
        if self.kind == "thread":
            return f"worker thread {w} exited"
        h = self.handles[w]
        code = h.exitcode
        if code is not None and code < 0:
            how = f"was killed by signal {-code}"
            if code == -9:
                how += " (an out-of-memory kill? check the system log)"
            elif self.killed_by_sigbus(w):
                how += (" (SIGBUS: a page of a memory-mapped file could not be read or written: a data file "
                        "read through a memory map shrank or its storage failed, or /dev/shm is full; "
                        "storage=detload.Storage(memory_map=False) reads data files without maps)")
        elif code == 1:
            how = "exited with code 1 before it could report why (multiprocessing printed the cause on stderr)"
        else:
            how = f"exited with code {code}"
        return f"worker process {w} (pid {h.pid}) {how}"

    def check_usable(self) -> None:
        """Raise `WorkerError` if a worker died or could not start: a pool does not replace workers."""
        for w in range(self.workers):
            failed = self._failed.get(w)
            if failed is None and self.alive(w):
                continue
            if failed is not None:
                what = f"failed at start-up ({failed.error.type_name}: {failed.error.message})"
                if failed.stage == "worker":
                    what = f"failed ({failed.error.type_name}: {failed.error.message})"
                what = f"worker process {w} (pid {self.handles[w].pid}) {what}"
            else:
                what = self.describe_death(w)
            raise WorkerError(
                f"{what}, earlier in this loader's life. A process pool does not replace a dead worker, "
                "so this loader cannot iterate again: close it and create a new Loader "
                "(new.load_state_dict(old.state_dict()) continues where this one stopped).",
                worker=w,
            )

    def pids(self) -> list[int]:
        return [h.pid for h in self.handles] if self.kind == "process" and not self._closed else []

    # -- stopping ----------------------------------------------------------
    def release_windows(self, gen: int, pieces: list[tuple[int, int]] | None, entries: Sequence[str] = (),
                        task: tuple[int, int] = (0, 0)) -> None:
        """Shared windows: forget ``task``'s (partition, number) row groups once its blocks are
        all built (``pieces``), or every row group of a stopped pass (None); ``entries`` are
        files to remove (scratch cache entries, the task's shared files)."""
        if self.cfg.window_share is not None:
            self.cfg.window_share.drop(gen, pieces)
        elif self.cfg.share_dir is not None:
            share.remove_claims(self.cfg.share_dir, gen, pieces, entries, task)
            if pieces is None:  # also what a worker of the stopped pass made after its task's names were listed
                for folder in (self.cfg.spill_share, self.cfg.pack_share):
                    if folder is not None:
                        share.remove_claims(folder, gen, None)

    def close(self, timeout: float = 2.0) -> None:
        """Stop the workers (letting them finish the read they are in, for up to ``timeout`` s),
        then release and forget everything. A second Ctrl-C during the wait still gets the
        release done."""
        if self._closed:
            return
        self._closed = True
        started = [h for h in self.handles if self.kind == "thread" or h.pid is not None]
        try:
            self.passes.close()  # every pass is stale, those queued ahead too
            if self.kind == "thread":
                for inbox in self.inboxes:
                    inbox.put(None)
            elif self._sender is not None:
                self._sender.stop()  # then it closes the inboxes: a waiting worker leaves at once
            deadline = time.monotonic() + timeout
            # Take in what the workers send meanwhile, so that none waits for room.
            while any(h.is_alive() for h in started) and time.monotonic() < deadline:
                self.drain()
                for h in started:
                    h.join(timeout=0.02)
            self.drain()
        finally:
            if self.buffers is not None:
                self.buffers.close()
            if self.kept is not None:
                self.kept.close()
            if self.kind == "process":
                self._close_processes(started)
            self.watch.clear()  # every buffer still announced is withdrawn
            if self.cfg.share_dir is not None:  # claims, and a scratch cache: after the workers
                share.remove_share_dir(os.path.dirname(self.cfg.share_dir))
            if self.cfg.spill_share is not None:  # shared spill files
                share.remove_share_dir(self.cfg.spill_share)
            if self.kind == "thread":  # the files its workers' packs left for the next ones
                release_spill_files(self.cfg.spill_dir)
            self.cfg = dataclasses.replace(self.cfg, window_share=None)
            # Forget them all: what still refers to this pool must not keep them alive.
            self.inboxes, self.outboxes, self.handles = [], [], []
            self.segments, self._sender = None, None

    def _close_processes(self, started: list[Any]) -> None:
        for h in started:
            if h.is_alive():
                h.terminate()
        for h in started:
            h.join(timeout=1.0)
            if h.is_alive():
                h.kill()
                h.join(timeout=1.0)
        if self._sender is not None:
            self._sender.join(timeout=2.0)  # every reader is gone: its writes fail at once
        else:
            for conn in self.inboxes:
                conn.close()
        for q in self.outboxes:
            for msg in q.close():
                self.release(msg)
        if self.segments is not None:
            self.segments.close()
        for h in self.handles:
            with contextlib.suppress(ValueError):
                h.close()  # its sentinel and the pipe its worker watched us by
        if self._ints is not None:
            self._ints.close()
        assert self.shm_dir is not None
        _shm.sweep(self.shm_dir, self.shm_prefix)
