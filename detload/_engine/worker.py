"""Workers: read a block's row groups, convert them to NumPy, permute, hand the block over.

Each row group of a block runs through the row-group steps its configuration needs
(`row_group_steps`: read, verify, select, transform, group rows), chosen once per
configuration; the block is then assembled from the ranges' rows.

The same loop runs in a thread or in a process (started with forkserver or
spawn, configured with plain picklable data, see _engine/spawn.py). A thread worker
talks to the pool through two queues (`ThreadLink`), a process worker through
pipes (`ProcessLink`); either way each worker holds at most ``prefetch`` finished
blocks nobody took, and the merger decides what is taken when. Errors travel back
as values (`WorkerFailed`) carrying the worker's traceback and the unit it was on.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import pickle
import platform
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from .._filters.selection import Selection
from .._read import UnitReader, planned_rows, select_rows
from .._streams import mix_block_permutation
from .._types import UnitColumns
from . import share
from . import shm as _shm
from . import spawn as _spawn
from .block import (
    Layout,
    Order,
    Rows,
    WindowPack,
    all_flat,
    assemble,
    piece_orders,
    placed,
    slice_rows,
    stored_order,
)
from .config import WorkerConfig
from .groups import GroupRows, block_order, build_grouped, check_compact, check_constant, check_key_kept, group_rows
from .mapped import MappedPack, pack_name
from .messages import (
    CREDIT,
    POLL,
    STOP,
    BlockReady,
    Channel,
    Poller,
    Task,
    Tasks,
    Timings,
    WorkerFailed,
    pack_exception,
    put_until,
)
from .passes import EVERY, Passes
from .spawn import MainSource, SharedInts
from .spill import SpillPack, hold_spill_files, spill_name, spills

__all__ = ["ProcessLink", "ThreadLink", "process_main", "worker_loop"]

def _debug_before_read(cfg: WorkerConfig, task: Task, file_idx: int, rg: int) -> None:
    d = cfg.hooks
    if d is None:
        return
    unit = (cfg.files[file_idx].path, rg)
    if d.block_delay_max > 0 and (file_idx, rg) == task.units[0][:2]:
        h = xxhash.xxh3_64_intdigest(f"{d.delay_seed}/{task.epoch}/{task.k}/{time.monotonic_ns()}".encode())
        time.sleep(d.block_delay_max * (h % 10_000) / 10_000)
    if d.delay_max > 0:
        h = xxhash.xxh3_64_intdigest(f"{d.delay_seed}/{task.epoch}/{unit}/{time.monotonic_ns()}".encode())
        time.sleep(d.delay_max * (h % 10_000) / 10_000)
    if d.fail_unit == unit and d.fail_exc is not None:
        raise d.fail_exc
    if d.stall_unit == unit and d.stall_epoch in (None, task.epoch):
        time.sleep(d.stall_seconds)
    if d.die_unit == unit and cfg.kind == "process":
        os.kill(os.getpid(), d.die_signal)



class Status:
    """What a worker is doing, readable by the merger even after the worker died.

    Slots: generation, block k, file index, row group (-1 when idle).
    """

    def __init__(self, shared: Any = None) -> None:
        self.slots = shared if shared is not None else [0, -1, -1, -1]

    def set(self, gen: int, k: int, f: int, rg: int) -> None:
        s = self.slots
        s[0], s[1], s[2], s[3] = gen, k, f, rg

    def get(self) -> tuple[int, int, int, int]:
        s = self.slots
        return int(s[0]), int(s[1]), int(s[2]), int(s[3])


def _produce(cfg: WorkerConfig, reader: UnitReader, steps: Steps, task: Task, gen: int, status: Status,
             segs: _shm.WorkerSegments | None, t: Timings) -> tuple[Any, Layout, Timings]:
    payload, layout, intact = _build(cfg, reader, steps, task, gen, status, segs, t, defer=True)
    if not intact:
        # A cache entry failed the checksum verified while the block was built: the
        # block is never handed over; the entry is gone, so the rebuild reads the source.
        _release(segs, payload)
        payload, layout, intact = _build(cfg, reader, steps, task, gen, status, segs, t, defer=False)
        assert intact
    return payload, layout, t


# -- the row-group steps -------------------------------------------------------------
# Each range of a block goes through the same steps, chosen once per configuration
# (`row_group_steps`): read, verify, select, transform, group rows, those the configuration
# needs, in that order; then its rows are taken and the block assembled. A step returns False
# when a cache entry failed its deferred checksum: the block is then rebuilt from the source.


class _Build:
    """What the steps of one block share: the block's task, its timings, and what they collect."""

    __slots__ = ("cfg", "defer", "parts", "reader", "t", "task", "units", "whole")

    def __init__(self, cfg: WorkerConfig, reader: UnitReader, task: Task, t: Timings, defer: bool,
                 settle: bool = True) -> None:
        self.cfg, self.reader, self.task, self.t, self.defer = cfg, reader, task, t, defer
        # Each range's row group as read (and cached): what `settle` checks after the block.
        # Not kept for a mixed-order window (``settle`` False: its reads are checked as they
        # are read), whose pack copies each row group as it comes: holding them here kept
        # every row group of the window alive besides the pack until the window was open
        # (thread W=1, CTR: peak PSS 594 -> 732 MiB when the first window was packed).
        self.whole: list[UnitColumns] | None = [] if settle else None
        self.units: list[UnitColumns] = []  # each range's rows: the row group itself, or a view of its rows
        self.parts: list[GroupRows] = []  # group_by with a cache: each range's group rows


class _RowGroup:
    """One range's row group on its way through the steps."""

    __slots__ = ("cols", "done", "f", "first", "picked", "rg")
    cols: UnitColumns  # set by the read, then replaced by each step that changes the rows

    def __init__(self, f: int, rg: int, first: int) -> None:
        self.f, self.rg, self.first = f, rg, first  # first: the range's first (delivered) row
        self.picked: Selection | None = None  # the filter's selection of its rows (None: all)
        self.done = False  # a transform's cached output: no step after the read applies


Steps = tuple[Callable[[_Build, _RowGroup], bool], ...]


def _read(b: _Build, u: _RowGroup) -> bool:
    xf = b.reader.transform
    done = xf.cached(b.cfg, u.f, u.rg, b.t) if xf is not None else None
    if done is not None:  # a transform's cached output: nothing to read, convert or transform
        u.cols, u.done = done, True
    else:
        # The whole row group, read and checked against its stored row count exactly as
        # without cuts (the cache holds row groups, not ranges); a range is a view of it.
        u.cols = b.reader.read(u.f, u.rg, b.t, defer=b.defer)
        selections = b.cfg.selections
        u.picked = selections.get((u.f, u.rg)) if selections else None
    if b.whole is not None:
        b.whole.append(u.cols)
    return True


def _verify(b: _Build, u: _RowGroup) -> bool:
    # A selection's gather and a transform read the whole entry: a cache entry's deferred
    # checksum is settled before either (after a selection the rows are new arrays).
    if u.cols.check is not None and (u.picked is not None or b.reader.transform is not None):
        return b.reader.settle(u.cols, u.f, u.rg)
    return True


def _select_rows(b: _Build, u: _RowGroup) -> bool:
    if u.picked is not None:
        # A filter's selection: its rows are gathered first, and the range counts in them.
        t0 = time.perf_counter()
        u.cols = select_rows(u.cols, u.picked)
        b.t.add("select", t0, time.perf_counter())  # the filter's stage, as planning's selection pass
    return True


def _transform(b: _Build, u: _RowGroup) -> bool:
    # On the whole (selected) row group, before the range is taken.
    xf = b.reader.transform
    assert xf is not None
    before = u.cols
    u.cols = xf.apply(b.cfg, u.cols, u.f, u.rg, u.picked, b.task.seed, b.task.epoch, b.t)
    if b.cfg.group_by is not None:
        check_key_kept(b.cfg, before, u.cols, u.f, u.rg)
    return True


def _group_rows(b: _Build, u: _RowGroup) -> bool:
    # group_by with a cache: the group columns once per key run (read apart from the items).
    b.parts.append(group_rows(b.cfg, u.f, u.rg, u.picked, u.first, b.t))
    return True


def row_group_steps(cfg: WorkerConfig) -> Steps:
    """The steps every range of a block goes through under ``cfg``, in order; the range's
    rows are then taken from what the last one left."""
    steps: list[Callable[[_Build, _RowGroup], bool]] = [_read]
    if cfg.selections or cfg.transform is not None:
        steps.append(_verify)
    if cfg.selections:
        steps.append(_select_rows)
    if cfg.transform is not None:
        steps.append(_transform)
    if cfg.group_specs:
        steps.append(_group_rows)
    return tuple(steps)


def _build(cfg: WorkerConfig, reader: UnitReader, steps: Steps, task: Task, gen: int, status: Status,
           segs: _shm.WorkerSegments | None, t: Timings, *, defer: bool) -> tuple[Any, Layout, bool]:
    """Build the block; False if a cache entry's deferred checksum failed (see _cache.PendingCheck)."""
    b = _Build(cfg, reader, task, t, defer)
    for f, rg, first, rows in task.units:
        status.set(gen, task.k, f, rg)
        _debug_before_read(cfg, task, f, rg)
        u = _RowGroup(f, rg, first)
        for step in steps:
            if u.done:
                break
            if not step(b, u):
                return None, None, False  # type: ignore[return-value]
        b.units.append(_rows_of(u.cols, first, rows))
    t0 = time.perf_counter()
    try:
        payload, layout = _assemble(cfg, task, segs, b.units, b.parts if cfg.group_specs else None)
    except Exception:
        # A damaged header field (a row count, say) can break assembly before the
        # deferred checksums are finished: if one fails, rebuild; if none does, it is a bug.
        assert b.whole is not None
        if all([reader.settle(u, r[0], r[1]) for u, r in zip(b.whole, task.units)]):
            raise
        return None, None, False  # type: ignore[return-value]
    assert b.whole is not None
    intact = all([reader.settle(u, r[0], r[1]) for u, r in zip(b.whole, task.units)])
    t.add("permute", t0, time.perf_counter())
    return payload, layout, intact


def _length(cols: UnitColumns) -> int:
    """A row group's rows, from its columns."""
    return len(next(iter(cols.values()))) if cols else 0


def _rows_of(cols: UnitColumns, first: int, rows: int) -> UnitColumns:
    """Rows ``[first, first + rows)`` of a row group's columns: the columns themselves
    when the range is the whole row group (the common case), else views."""
    n = _length(cols) if cols else rows
    if first == 0 and rows == n:
        return cols
    if first + rows > n:
        # The reader checked the decoded rows against the stored count, which planned the range.
        raise AssertionError(f"range [{first}, {first + rows}) is past the row group's {n} rows")
    out = UnitColumns({k: slice_rows(v, first, first + rows) for k, v in cols.items()})
    # Runs of same-strided columns stay runs: the same rows of each (one 2-D view).
    out.runs = {k: (run[:, first : first + rows], i, names) for k, (run, i, names) in cols.runs.items()}
    out.check = cols.check  # the assembler verifies a cache entry's bytes before copying them
    return out




def _piece(pack: WindowPack | SpillPack | None, q: int, cols: UnitColumns, first: int, rows: int
           ) -> tuple[UnitColumns | None, UnitColumns]:
    """Piece ``q`` of a window, rows ``[first, first + rows)`` of a row group's ``cols``: (what
    the next pass may take of the row group (`_Kept`), or None; the piece). With a pack the
    piece is copied into it; what is kept is then the piece when it is the whole row group (no
    second copy), else the row group as read (never another pack's views: they hold all of it)."""
    if pack is None:
        cols = stored_order(cols)
        return cols, _rows_of(cols, first, rows)
    # The piece a kept window held here (a spilled one holds no fixed column to count its
    # rows by), or the whole row group.
    here = placed(pack, q, cols, first, rows)[2]
    piece = pack.put(q, cols, first, rows)
    if here or (first == 0 and rows == _length(cols)):
        return piece, piece
    return (cols if cols.at is None else None), piece


def _timed_piece(t: Timings, pack: WindowPack | SpillPack | None, q: int, cols: UnitColumns, first: int, rows: int
                 ) -> tuple[UnitColumns | None, UnitColumns]:
    """`_piece`, its copy into a pack (in memory, a mapped file or a spill file's writes)
    traced as the stage ``pack``: without it that work fell between stages, and the stage
    table showed a worker spilling its windows as idle for a sixth of its time."""
    if pack is None:
        return _piece(pack, q, cols, first, rows)
    t0 = time.perf_counter()
    # A spilled window's strings and lists go off the heap too, unless they lie there already
    # (a window kept from the pass before lends its pieces).
    publish = isinstance(pack, SpillPack) and pack.beside and not placed(pack, q, cols, first, rows)[2]
    out = _piece(pack, q, cols, first, rows)
    t.add("pack", t0, time.perf_counter())
    if publish:
        assert isinstance(pack, SpillPack)
        out = _published(t, pack, q, out)
    return out


def _assemble(cfg: WorkerConfig, task: Task, segs: _shm.WorkerSegments | None,
              units: list[UnitColumns], parts: list[GroupRows] | None = None) -> tuple[Any, Layout]:
    perm = block_order(task)  # whole groups when the task has groups (group_by)
    if segs is None:
        alloc = cfg.buffers.get if cfg.buffers is not None else (lambda n: np.empty(n, dtype=np.uint8))
        if task.groups:  # group_by: group columns once per group, after checking they are
            _check_groups(cfg, task, units, parts)
            return build_grouped(cfg, task, units, perm, alloc, parts)
        return assemble(cfg.block_specs, units, perm, alloc)
    got: list[_shm.Segment] = []

    def alloc_shm(n: int) -> np.ndarray:
        seg, arr = segs.get(n, task.rows)
        got.append(seg)
        return arr

    try:
        if task.groups:
            _check_groups(cfg, task, units, parts)
            buf, layout = build_grouped(cfg, task, units, perm, alloc_shm, parts)
        else:
            buf, layout = assemble(cfg.block_specs, units, perm, alloc_shm)
    except BaseException:
        for seg in got:
            segs.unsent(seg)
        raise
    del buf  # the worker's own array of the segment; the segment stays mapped
    return got[0], layout


def _check_groups(cfg: WorkerConfig, task: Task, units: list[UnitColumns], parts: list[GroupRows] | None) -> None:
    if parts is not None:
        check_compact(cfg, task, parts)
    else:
        check_constant(cfg, task, units)


def _release(segs: _shm.WorkerSegments | None, payload: Any) -> None:
    """A block that will not be sent: its segment may be built in again."""
    if segs is not None and isinstance(payload, _shm.Segment):
        segs.unsent(payload)


class ThreadLink:
    """A thread worker's ends: tasks come on ``inbox`` (None: stop), blocks go on ``outbox``,
    whose bound (``prefetch``) holds the worker back."""

    def __init__(self, inbox: Channel[Any], outbox: Channel[Any]) -> None:
        self.inbox = inbox
        self.outbox = outbox

    def receive(self) -> Tasks | object | None:
        msg = self.inbox.get()
        return STOP if msg is None else msg

    def send(self, msg: BlockReady | WorkerFailed, stale: Callable[[], bool]) -> bool:
        return put_until(self.outbox, msg, stale)


class ProcessLink:
    """A worker process's ends of its pipes to the consumer.

    Tasks come on ``inbox`` (its end closed: stop). Messages go on ``outbox``;
    blocks only while fewer than ``prefetch`` are sent and not yet taken: the
    consumer says on ``credit`` how many it took. Segments that come back are
    taken in when a block is built and on every wait's timeout, never woken for
    (each would cost both sides a wake-up).
    Every wait also watches the consumer, through the pipe multiprocessing keeps
    to the process that started this one: it closes when that process exits,
    even while it is a zombie nobody reaped yet, so an orphaned worker leaves at
    once (a supervisor that reads the consumer's stdout and stderr to the end
    before reaping would otherwise wait for workers holding them). A child the
    consumer forked (a torch DataLoader worker, say) keeps that pipe open, so a
    wait that times out also checks the consumer's pid.
    """

    def __init__(self, cfg: WorkerConfig, inbox: Any, outbox: Any, credit: Any, segs: _shm.WorkerSegments,
                 prefetch: int, passes: Passes, sent: Any) -> None:
        self.cfg = cfg
        self.inbox = inbox
        self.outbox = outbox
        self.credit = credit
        self.segs = segs
        self.prefetch = prefetch
        self.passes = passes
        parent = mp.parent_process()
        self._parent = parent.sentinel if parent is not None else None
        self._consumer_pid = _consumer_pid()
        watch = [] if self._parent is None else [self._parent]
        self._for_work = Poller([inbox, *watch])
        self._for_room = Poller([credit, *watch])
        self._credits = Poller([credit])
        self._sent = 0
        self._taken = 0
        self._shared_sent = sent  # the same count, for the consumer's depth samples
        self.gone = False  # the consumer died or closed the pool: leave

    def _wait(self, poller: Poller) -> list[Any]:
        ready = poller.wait(POLL)
        parent_exited = self._parent is not None and self._parent in ready
        # Timed out: the slower checks (a consumer gone while its pipe lives on; a closing pool).
        if parent_exited or (not ready and (not _shm.pid_alive(self._consumer_pid)
                                            or self.passes.closed)):
            self.gone = True
        if self.credit in ready:
            self._take_credits()
        elif not ready:
            self.segs.collect()
            if self.segs.closed:
                self.gone = True
        return ready

    def _take_credits(self) -> None:
        while self._credits.wait(0):
            try:
                (n,) = CREDIT.unpack(self.credit.recv_bytes())
            except (EOFError, OSError):  # the pool closed its end: it is closing
                self.gone = True
                return
            self._taken += n

    def receive(self) -> Tasks | object | None:
        """The next task message; None if none came within `POLL`; `STOP` when it is time to go."""
        if self.gone:
            return STOP
        ready = self._wait(self._for_work)
        if self.gone:
            return STOP
        if self.inbox not in ready:
            return None
        try:
            return self.inbox.recv()
        except (EOFError, OSError):  # the pool closed its end: it is closing
            self.gone = True
            return STOP

    def send(self, msg: BlockReady | WorkerFailed, stale: Callable[[], bool]) -> bool:
        if isinstance(msg, WorkerFailed):
            return not (self.gone or stale()) and self._write(msg)
        segs = self.segs
        if self._sent - self._taken >= self.prefetch:
            self._take_credits()
        while self._sent - self._taken >= self.prefetch and not (self.gone or stale()):
            self._wait(self._for_room)
        if self.gone or stale():
            _release(segs, msg.payload)
            return False
        # Last, right before the hand-over: the drops and names it carries are the
        # worker's to send again (unsent) if this block does not get through.
        msg = msg._replace(payload=segs.sending(msg.payload))
        if not self._write(msg):
            _release(segs, msg.payload)
            return False
        self._sent += 1
        self._shared_sent.value = self._sent
        return True

    def _write(self, msg: BlockReady | WorkerFailed) -> bool:
        try:
            self.outbox.send(msg)
            return True
        except (OSError, ValueError):  # the consumer is gone (a broken pipe)
            self.gone = True
            return False


def worker_loop(cfg: WorkerConfig, index: int, link: ThreadLink | ProcessLink, passes: Passes,
                status: Status, segs: _shm.WorkerSegments | None = None) -> None:
    """Serve `Tasks` from ``link`` until it says `STOP`.

    Tasks of a stale pass (`Passes.is_stale`: the consumer restarted the epoch) are
    dropped; a block built for one is released rather than sent. ``segs`` is set in a
    worker process: blocks are built in its shared-memory segments.
    """
    t0 = time.perf_counter()
    _warm_up()
    reader = UnitReader(cfg)
    steps = row_group_steps(cfg)
    pid = os.getpid() if cfg.kind == "process" else 0
    kept = _Kept(cfg)
    # A block's wait for room is known only after it was sent: it travels with the
    # worker's next block; so does the start-up, with the first.
    last_wait: tuple[str, float, float] | None = ("worker_startup", t0, time.perf_counter())
    try:
        while True:
            msg = link.receive()
            if msg is STOP:
                return
            if not isinstance(msg, Tasks):
                continue
            gen, tasks = msg.gen, msg.tasks

            def stale(gen: int = gen) -> bool:  # a newer pass (built ahead) is not
                return passes.is_stale(gen)

            # Every message starts (part of) a pass: the first blocks of the next one,
            # built ahead, or the rest of a pass when it begins, perhaps long after.
            reader.new_pass()
            if segs is not None and tasks:
                segs.new_pass(max(task.block_rows for task in tasks))
            if tasks and tasks[0].blocks:  # the mixed order: tasks of several blocks each
                ok, last_wait = _mix_tasks(cfg, reader, steps, tasks, gen, status, segs, link, stale, pid,
                                           last_wait, index, kept)
                if not ok:
                    reader.close()
                    reader = UnitReader(cfg)
                tasks = ()
            for task in tasks:
                if stale():
                    break
                t = Timings(pid=pid)
                if last_wait is not None:
                    t.spans.append(last_wait)
                    last_wait = None
                try:
                    payload, layout, t = _produce(cfg, reader, steps, task, gen, status, segs, t)
                except BaseException as exc:  # carried back as a value, re-raised by the merger
                    _, k, f, rg = status.get()
                    unit = (cfg.files[f].path, rg) if f >= 0 else None
                    link.send(WorkerFailed(gen, task.k, pack_exception(exc), unit), stale)
                    reader.close()
                    reader = UnitReader(cfg)
                    break
                status.set(gen, task.k, -1, -1)
                if _FORWARDED:  # raised while building this block (or since the last one)
                    t.warnings, _FORWARDED[:] = list(_FORWARDED), []
                t0 = time.perf_counter()
                ok = link.send(BlockReady(gen, task.k, payload, layout, t), stale)
                last_wait = ("worker_queue_wait", t0, time.perf_counter())
                if not ok:
                    break
            if reader.filled_cache:
                # The pass decoded row groups into the cache; the next one will likely be
                # warm and decode nothing. Arrow's allocator (mimalloc) would otherwise give
                # back the decoding buffers bit by bit during that warm epoch, which made
                # the first warm epoch of a CTR run ~40% slower and ~60% more CPU-hungry.
                reader.filled_cache = False
                pa.default_memory_pool().release_unused()
    finally:
        reader.close()


class _Window:
    """A mixed-order task's window: its pieces' rows, read once, from which its blocks are cut;
    held in one `WindowPack` where `_new_pack` gives one."""

    __slots__ = ("pack", "raw", "task", "units")

    def __init__(self, task: Task, units: list[UnitColumns], raw: list[UnitColumns | None],
                 pack: WindowPack | SpillPack | None) -> None:
        self.task = task
        self.units = units
        self.raw = raw  # each piece's whole row group, as read (what the next pass may reuse), or None
        self.pack = pack

    def block(self, n: int) -> tuple[list[UnitColumns], list[Rows], np.ndarray | None]:
        """Entry ``n`` of the task's blocks: its rows (a chunk of each piece with shuffle, a
        few slices without) as the window's units and the rows it takes of each (`Rows`),
        and their permutation."""
        task = self.task
        j, chunks = task.chunks[n]
        units = [self.units[q] for q, *_ in chunks]
        ranges = [(first, rows, run, period) for _, first, rows, run, period in chunks]
        if not task.shuffle:
            return units, ranges, None
        rows = sum(r for _, _, r, _, _ in chunks)
        return units, ranges, mix_block_permutation(task.seed, task.epoch, task.partition, task.number, j, rows)


class _Kept:
    """A worker's last window, kept for the next pass when it was the worker's only one.

    With one task per partition (a dataset of up to ``mix_window`` row groups per partition
    and rank) the next pass's window is the same row groups, cut and permuted anew: the worker
    keeps the finished window (its memory was held for the whole pass anyway) and the next
    window takes it instead of reading it again, so such a dataset is read once per loader.
    The bytes are the same (a row group's columns are a pure function of the plan). What the
    next window does not take is dropped when it opens. A next window of the same pieces puts
    them in one pack (`_new_pack`) once, and the windows after take that pack as it is. Off
    with a transform (it may keep state per pass) and with the engine's fault-injection hooks
    (their faults must hit the read the schedule puts them at)."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.enabled = cfg.transform is None and cfg.hooks is None
        self.cols: dict[tuple[int, int], UnitColumns] = {}  # (file, row group): columns
        self.pieces: tuple[Any, ...] = ()  # the kept window's pieces, and its pack
        self.pack: WindowPack | SpillPack | None = None

    def take(self, f: int, rg: int) -> UnitColumns | None:
        """The row group's columns if the window before held them (no longer kept here: once
        the window opening copied them into its pack, nothing holds them)."""
        return self.cols.pop((f, rg), None)

    def keep(self, win: _Window) -> None:
        """Keep a finished window's row groups (the worker's only window of its pass)."""
        if self.enabled:
            self.cols = {(f, rg): cols for (f, rg, _, _), cols in zip(win.task.units, win.raw) if cols is not None}
            self.pieces, self.pack = win.task.units, win.pack

    def opened(self) -> None:
        """A window opened: what it did not take of the one kept is not wanted."""
        self.cols, self.pieces, self.pack = {}, (), None

    def pack_for(self, task: Task, orders: list[Order]) -> WindowPack | SpillPack | None:
        """The kept window's pack where ``task``'s window is its pieces in the same ``orders``
        (the next window then takes the pack as it is), else None."""
        if self.enabled and task.units == self.pieces and self.pack is not None and self.pack.orders == tuple(orders):
            return self.pack
        return None


def _new_pack(cfg: WorkerConfig, task: Task, kept: _Kept | None) -> WindowPack | SpillPack | None:
    """The pack a shuffled task's window holds its pieces in (`WindowPack`), each piece in its
    block order (`piece_orders`), or None.

    A pack costs a copy of the window, which the blocks' gathers repay where the window's many
    small copies waited for the GIL (thread workers sharing it, unless it is mapped entries of
    a user's cache read for one pass with chunks of `_PACK_CHUNK_ROWS_MAPPED` rows or more:
    there the pack was a copy of the whole window for one pass), where the window is read
    once for many passes: a task that repeats every pass (`Task.repeats`: the only task of
    the pass, so one worker builds it whole unless the workers share it), which `_Kept` keeps
    for the next pass, whose window of the same pieces and orders takes the pack as it is;
    and where its blocks take small chunks (`_small_chunks`); and, without a cache, a window
    large enough to be spilled, whatever its chunks (`_spilled`).
    (Not wherever a message holds one task: a pass built ahead comes in two messages, and a
    partition of several tasks deals other pieces to a task every epoch.) Measured on CTR data, one window per task
    and pass (mix_window=16, chunks of 4,096 rows): a pack made every pass was 5-20% slower in
    stored order, and block-ordered about equal (once a kept piece's copy back to stored order
    was made once per group, not once per column): with large chunks its gathers save about
    what its copy costs. Process workers sharing a window hold it in one file they all map
    or read (`_shared_pack`), or map the cache entries the others wrote: a pack of this
    worker's would copy the whole window into every worker."""
    if not task.shuffle or (cfg.kind == "process" and cfg.share_windows):
        return None
    orders = piece_orders(task.chunks, len(task.units))
    same = kept.pack_for(task, orders) if kept is not None else None
    if same is not None:
        return same
    kept_same = kept is not None and kept.enabled and task.units == kept.pieces
    # Shared through a cache, a window read for one pass is mapped entries: packed only for
    # small chunks, as a worker's own (`_PACK_CHUNK_ROWS_MAPPED`).
    shared = cfg.share_windows and (not _user_cache(cfg) or task.repeats)
    if (kept_same or shared or (task.repeats and kept is not None and kept.enabled)
            or _small_chunks(task, cached=cfg.cache is not None) or _spilled(cfg, task.rows)):
        return _make_pack(cfg, [r for *_, r in task.units], orders)
    return None


def _user_cache(cfg: WorkerConfig) -> bool:
    """Whether the workers read through a user's cache (`cache=`), not only the pool's scratch
    cache of shared windows (process workers without one: _engine/share.py)."""
    return cfg.cache is not None and not cfg.scratch


def _spilled(cfg: WorkerConfig, rows: int) -> bool:
    """Whether a window of ``rows`` rows is spilled (`_make_pack`), and so packed whatever its
    chunks (`_new_pack`): read without a cache, its fixed 1-D columns taking ``cfg.spill_min``
    bytes or more. A
    window of large chunks read for one pass, held in memory, is every worker's whole window
    on the heap (with row groups of 65,536 rows, 800 MiB of CTR a worker, where the windowed
    order's blocks hold 50 MiB). Measured at bench.py's `[mix_window=16]` (four tasks an
    epoch of 4,096-row chunks, `mix_ab.py --mix-window 16`, the tree before against after,
    three alternating rounds, 2026-12-07): thread W=2 2.4-2.8M -> 2.4-3.2M rows/s at 326-353
    -> 231-234 MiB peak PSS, process W=2 3.0-4.4M -> 2.8-3.8M at 464-467 -> 336-340 MiB;
    W=1 (two rounds) about equal at 40 MiB less."""
    return cfg.cache is None and spills(cfg.spill_dir, cfg.block_specs, rows, cfg.spill_min,
                                        cfg.spill_beside_row_bytes)


def _make_pack(cfg: WorkerConfig, piece_rows: list[int], orders: list[Order]) -> WindowPack | SpillPack:
    """A window's pack: spilled to a file (`SpillPack`) where the configuration names a spill
    folder, no row-group cache is read, and the delivered fixed-width 1-D columns hold at least
    ``cfg.spill_min`` bytes; else in memory (also where the folder cannot take the file: the
    window is then held as without a spill folder, the bytes of its blocks the same). Not with
    a cache: its windows are mapped entries (pages of files, as a spill's), and their pack is
    what makes warm epochs fast (bench.py, thread W=2 warm: spilled 0.74-0.89x the windowed
    order, in memory 1.28x). String, list and multi-dimensional columns go to files beside
    the spill file, mapped a block's rows at a time (`_timed_piece`, `SpillPack.publish`):
    held on the heap beside it, every thread worker's window of strings was whole in memory
    (text_list of 4M rows, several windows a partition, thread W=2: 1.45-1.48x the windowed
    order's peak PSS; mapped, 1.14x, at about a tenth less rate: docs/benchmarks.md, "Strings
    and lists of a spilled window mapped")."""
    if _spilled(cfg, sum(piece_rows)):
        assert cfg.spill_dir is not None  # (`spills` says so)
        try:
            return SpillPack(cfg.block_specs, piece_rows, orders, cfg.spill_dir,
                             whole=cfg.kind == "thread" and cfg.share_windows)
        except OSError as exc:
            _spill_failed(cfg.spill_dir, exc)
    return WindowPack(cfg.block_specs, piece_rows, orders)


#: The folders a window could not be held in that this process warned of, by what failed there.
_WARNED: set[tuple[str, str]] = set()


def _warn_once(what: str, folder: str, text: str) -> None:
    """A ResourceWarning, once per process for ``what`` failing in ``folder``."""
    if (what, folder) not in _WARNED:
        _WARNED.add((what, folder))
        warnings.warn(text, ResourceWarning, stacklevel=3)


def _spill_failed(folder: str, exc: OSError | str) -> None:
    """Warn once per folder that a window could not be spilled there (full, read-only, gone)."""
    _warn_once("spill", folder, f"could not spill a mixed-order window to {folder!r} ({exc}); windows are held in "
               f"memory instead. Free space there, or pass Pool(spill=FOLDER) for another folder "
               f"(on the command line: --spill FOLDER), or spill=False")


def _mapped_failed(folder: str, exc: OSError) -> None:
    """Warn once per folder that a window process workers share could not be held in one mapped
    file there (a /dev/shm too small: a container's default is 64 MiB)."""
    _warn_once("mapped", folder, f"could not hold a mixed-order window the process workers share in one file in "
               f"{os.path.dirname(os.path.dirname(folder))!r} ({exc}); they share it as cache entries "
               f"instead, whose blocks are slower to cut. Give that folder more room (a container: "
               f"--shm-size), or use thread workers")


#: A window read for one pass is packed when its blocks take chunks of fewer rows than this
#: on average: a block from separate arrays copies each piece's chunk column by column, so the
#: copies' count per row grows as chunks shrink, while the pack's copy costs the same per row.
_PACK_CHUNK_ROWS = 2048


#: The same for a window read through a cache (its row groups are mapped entries, so its
#: blocks copy from pages of files, and the pack is a copy of the whole window in this
#: process's memory): packed only where chunks average under this many rows. bench.py on 4M
#: CTR rows (four tasks of 62 row groups an epoch, 1,024-row chunks), thread/process W=2
#: warm: packed 0.50-0.59x / 0.49-0.52x the windowed order's rate at 1.33-1.35x its peak,
#: unpacked 0.50x / 0.48x at 0.99-1.00x; `mix_ab.py --cache` at 512-row chunks
#: (``--row-group-rows 8192 --mix-window 32 --block-rows 16384``), packed / unpacked: thread
#: 5.2-6.0 / 3.8-4.1M rows/s, process 5.1-6.3 / 4.3-4.6M; at 128-row chunks
#: (``--row-group-rows 2048 --mix-window 128``) thread 3.3-3.8 / 1.9-2.0M, process 3.7-5.1 /
#: 2.8-3.4M. So a pack pays for itself warm somewhere between 512 and 1,024 rows a chunk.
_PACK_CHUNK_ROWS_MAPPED = 768


def _small_chunks(task: Task, cached: bool = False) -> bool:
    """Whether the blocks of ``task`` take chunks of under `_PACK_CHUNK_ROWS` rows on average:
    then packing the window, even for one pass, costs less than the blocks' many small copies.
    Measured with `experiments/bench/mix_ab.py`, a pack against none: CTR with 1,024-row chunks
    (``--mix-window 32 --block-rows 32768``: 31 pieces, 16 blocks a task) thread W=1 / W=2 /
    process W=2 1.34 / 2.59 / 3.65 -> 1.63 / 3.30 / 3.76M rows/s, peak PSS no higher; 128-row
    chunks (``--row-group-rows 2048 --mix-window 128``) thread / process W=2 0.60 / 1.00 ->
    1.22 / 1.94M rows/s, peak 320 / 402 -> 334 / 426 MiB; 4,096-row chunks (``--mix-window 16``,
    4 blocks a task: not packed) about equal, process W=1 4% slower, peak 30-45 MiB higher.
    Counted over the task's blocks in the plan (`Task.task_blocks`), not the worker's: workers
    sharing a window each build some of its blocks, and must all decide alike (process
    workers share it in one file, or as entries, by this)."""
    return small_chunks(task.rows, task.task_blocks, len(task.units),
                        _PACK_CHUNK_ROWS_MAPPED if cached else _PACK_CHUNK_ROWS)


def small_chunks(rows: int, blocks: int, pieces: int, least: int | None = None) -> bool:
    """`_small_chunks` of a task of ``rows`` rows in ``pieces`` pieces and ``blocks`` blocks:
    chunks of under ``least`` rows (`_PACK_CHUNK_ROWS`) on average."""
    n = blocks * pieces
    return n > 0 and rows < (_PACK_CHUNK_ROWS if least is None else least) * n


def _open_window(cfg: WorkerConfig, reader: UnitReader, steps: Steps, task: Task, gen: int, k: int,
                 status: Status, t: Timings, kept: _Kept | None = None) -> _Window:
    """Read a mixed-order task's pieces once each, through the row-group steps (a cache entry's
    checksum verified as it is read: the window serves several blocks), except those the
    window before holds (`_Kept`)."""
    b = _Build(cfg, reader, task, t, defer=False, settle=False)
    pack = _new_pack(cfg, task, kept)
    # Only a new pack is filled (a kept window's own pack already holds the rows): each row
    # group's columns are then dropped as soon as they are copied; those the window before
    # kept are handed back to the system then (`_copied_into_pack`), while the memory of a
    # row group just read is reused by the next read.
    filling = pack is not None and (kept is None or pack is not kept.pack)
    units: list[UnitColumns] = []
    raw: list[UnitColumns | None] = []
    for q, (f, rg, first, rows) in enumerate(task.units):
        cols = kept.take(f, rg) if kept is not None else None
        taken = cols is not None
        if cols is None:
            status.set(gen, k, f, rg)
            _debug_before_read(cfg, task, f, rg)
            cols = _row_group(b, steps, f, rg, first)
        keep, piece = _timed_piece(t, pack, q, cols, first, rows)
        raw.append(keep)
        units.append(piece)
        del cols, keep
        if filling and taken:
            _copied_into_pack()
    if kept is not None:
        kept.opened()
    return _Window(task, units, raw, pack)


def _copied_into_pack() -> None:
    """A kept row group's columns were copied into a window's pack and dropped: Arrow's pool
    hands their memory back now (0.1-0.2 ms a call), else the window was held twice by the end
    of its reads (measured: thread W=1, CTR, the pack made from a kept window, peak PSS 400 ->
    600 MiB). Not after a row group just read: the next read reuses its memory, where handing
    it back made every read fault in fresh pages (thread W=1 / W=2, CTR, first batch after
    0.74-0.78 / 0.52-0.58 s -> 0.49-0.55 / 0.31-0.32 s, peak PSS unchanged)."""
    pa.default_memory_pool().release_unused()


def _row_group(b: _Build, steps: Steps, f: int, rg: int, first: int) -> UnitColumns:
    """A window's row group through the row-group steps (read or mapped, checked, selected,
    transformed): the same for every piece of it in the pass."""
    u = _RowGroup(f, rg, first)
    for step in steps:
        if u.done:
            break
        step(b, u)
    return u.cols


def _release_decode_buffers(t: Timings) -> None:
    """After a window's row groups were read, hand Arrow's freed decoding buffers back: the
    window is held while its blocks are built (and kept for the next pass), and the allocator
    kept what the reads had freed besides it: the decoded columns themselves when the window
    holds them packed into runs (copies), or mapped cache entries. Measured on CTR, thread
    W=2: 180 MiB of a 195 MiB window held twice without it."""
    if t.units:
        pa.default_memory_pool().release_unused()


def _as_entry(cfg: WorkerConfig, reader: UnitReader, steps: Steps, task: Task, cols: UnitColumns, f: int, rg: int,
              first: int, entry: str | None) -> UnitColumns:
    """A row group a process worker converted for a shared window, as the cache entry it wrote:
    the other workers map that entry, and holding the converted columns too kept the row
    group in memory twice (its heap copy, and the entry's pages). Not counted as a cache read
    (the row group was read from the source once); the converted columns if no entry is there
    or mapping it fails (the columns are right either way: this only saves memory)."""
    if entry is None or not os.path.exists(entry):
        return cols
    try:
        mapped = _row_group(_Build(cfg, reader, task, Timings(), defer=False, settle=False), steps, f, rg, first)
    except Exception:  # noqa: BLE001 -- keep the columns converted; the window needs nothing more
        return cols
    return mapped if mapped.runs else cols  # no runs: not the entry (it went), read again


class _StalePass(Exception):
    """The pass a shared window was being opened for was stopped: its blocks are not wanted."""


def _open_shared_window(cfg: WorkerConfig, reader: UnitReader, steps: Steps, task: Task, gen: int, k: int,
                        status: Status, t: Timings, index: int, stale: Callable[[], bool],
                        kept: _Kept | None = None) -> _Window:
    """`_share_window`; where the process workers hold the window in one shared file
    (`_shared_pack`) and no cache was given, with reads that do not go through the scratch
    cache (a user's cache is still read and filled)."""
    held = _shared_pack(cfg, task, gen, kept) if cfg.window_share is None else None
    with reader.uncached() if held is not None and cfg.scratch else contextlib.nullcontext():
        return _share_window(cfg, reader, steps, task, gen, k, status, t, index, stale, kept, held)


def _share_window(cfg: WorkerConfig, reader: UnitReader, steps: Steps, task: Task, gen: int, k: int,
                  status: Status, t: Timings, index: int, stale: Callable[[], bool],
                  kept: _Kept | None, held: SpillPack | MappedPack | None) -> _Window:
    """A task's window shared with the other workers (_engine/share.py): convert the row groups
    this worker claims, starting at a place of its own so that workers spread over the task,
    then take the others' as they are published, converting any nobody claimed (or whose
    claimer gave up) itself. Thread workers hand over the columns; process workers write cache
    entries and map them, or copy them into a file they all hold (``held``: spilled, or
    mapped), whose claims are finished once the rows lie there."""
    b = _Build(cfg, reader, task, t, defer=False, settle=False)
    mem: share.MemoryShare | None = cfg.window_share
    share_dir = cfg.share_dir
    n = len(task.units)
    pack = mem.pack(gen, task.units, lambda: _new_pack(cfg, task, kept)) if mem is not None else held
    tag = share.file_tag(share.SPILLED if isinstance(held, SpillPack) else share.MAPPED, task.partition, task.number)
    Pair = tuple[UnitColumns | None, UnitColumns]  # (what the next pass may take, the piece): `_piece`
    got: dict[int, Pair] = {}
    if kept is not None:  # row groups the window before held: nothing to claim
        for i, (f, rg, first, rows) in enumerate(task.units):
            cols = kept.take(f, rg)
            if cols is not None:
                got[i] = _timed_piece(t, pack, i, cols, first, rows)

    def convert(i: int) -> Pair:
        f, rg, first, rows = task.units[i]
        status.set(gen, k, f, rg)
        _debug_before_read(cfg, task, f, rg)
        pair = _timed_piece(t, pack, i, _row_group(b, steps, f, rg, first), first, rows)
        if isinstance(held, MappedPack):
            reader.unmap(f, rg)
        return pair

    def published(i: int, pair: Pair | None) -> Pair | None:
        """What another thread published for this piece, as a piece of this window: its
        row group may be a piece of another task's window too (cut by a partition boundary)."""
        if pair is None:
            return None
        keep, piece = pair
        if pack is not None and piece.at is not None and piece.at[0] is pack:
            return pair
        assert keep is not None or pack is not None
        return _timed_piece(t, pack, i, keep, task.units[i][2], task.units[i][3]) if keep is not None else None

    # Process workers: pieces whose cache entry another worker of this pass writes. Mapping it
    # is not a cache hit in the read counts (Stats.reads): the row group was read from the
    # source once, by that worker; nor is any map of the pool's scratch cache (no cache= given).
    written_here: set[int] = set(range(n)) if cfg.scratch else set()
    start = int((index * 0.6180339887498949) % 1.0 * n)
    for j in range(n):
        if stale():  # the pass was stopped: claim (and keep) nothing more for it
            raise _StalePass
        i = (start + j) % n
        if i in got:
            continue
        f, rg, first, rows = task.units[i]
        if held is not None:
            assert share_dir is not None
            if not share.claim(share_dir, gen, f, rg, tag):
                continue
            try:
                got[i] = convert(i)  # (its columns beside a spill file published: `_timed_piece`)
            except BaseException:
                share.withdraw(share_dir, gen, f, rg, tag)  # its rows are not in the file
                raise
            share.finish(share_dir, gen, f, rg, tag)
        elif mem is not None:
            if not mem.claim(gen, f, rg):
                continue
            pair: Pair | None = None
            try:
                pair = got[i] = convert(i)
            finally:
                mem.publish(gen, f, rg, pair)
        else:
            assert share_dir is not None
            entry = reader.entry_path(f, rg)
            if entry is None:
                continue
            if os.path.exists(entry):
                # Already there: nothing to convert, but one worker counts it as the pass's hit.
                # A claim says which; a finished claim, that a worker wrote it in this pass.
                if cfg.scratch or not share.claim(share_dir, gen, f, rg):
                    written_here.add(i)
                else:
                    if share.finished(share_dir, gen, f, rg):
                        written_here.add(i)
                    # Finished at once: an entry that goes meanwhile (found damaged) must not
                    # leave the others waiting on a claim nobody converts.
                    share.finish(share_dir, gen, f, rg)
                continue
            if not share.claim(share_dir, gen, f, rg):
                written_here.add(i)
                continue
            try:
                cols = convert(i)[0]
            finally:
                share.finish(share_dir, gen, f, rg)
            assert cols is not None  # no pack here: the row group as read
            got[i] = _piece(None, i, _as_entry(cfg, reader, steps, task, cols, f, rg, first, entry), first, rows)
    units: list[UnitColumns] = []
    raw: list[UnitColumns | None] = []
    for i, (f, rg, _, _) in enumerate(task.units):
        pair = got.pop(i, None)
        if pair is None:
            if stale():
                raise _StalePass
            t0 = time.perf_counter()
            if held is not None:
                assert share_dir is not None
                if share.wait_done(share_dir, gen, f, rg, stale, tag):  # in the file: another worker wrote it
                    piece = held.piece(i)  # (None: its columns beside the file are not there)
                    # What the next pass may take: the piece where it is its whole row group
                    # (a piece cut by a partition boundary is not the row group another
                    # pass's piece of it is cut from).
                    whole = task.units[i][2] == 0 and task.units[i][3] == planned_rows(cfg.files[f], rg)
                    pair = (piece if whole else None, piece) if piece is not None else None
            elif mem is not None:
                pair = published(i, mem.fetch(gen, f, rg, stale))
            else:
                assert share_dir is not None
                entry = reader.entry_path(f, rg)
                if entry is not None and not os.path.exists(entry):
                    share.wait_for(share_dir, gen, f, rg, entry, stale)
            t.add("window_wait", t0, time.perf_counter())
            if pair is None:  # a process worker maps the entry here (or converts the row group)
                hits = t.extra.get("cache_hits")
                pair = convert(i)
                if i in written_here:
                    if hits is None:
                        t.extra.pop("cache_hits", None)
                    else:
                        t.extra["cache_hits"] = hits
        raw.append(pair[0])
        units.append(pair[1])
    if kept is not None:
        kept.opened()
    return _Window(task, units, raw, pack)


def _published(t: Timings, pack: SpillPack, q: int, pair: tuple[UnitColumns | None, UnitColumns]
               ) -> tuple[UnitColumns | None, UnitColumns]:
    """A piece put into a spill file, its columns beside the file moved off the heap (and, for
    process workers sharing the window, handed to the others: `SpillPack.publish`, traced as
    ``pack``): what the next pass may take of it is the published piece too where it was the piece."""
    keep, piece = pair
    t0 = time.perf_counter()
    try:
        out = pack.publish(q, piece)
    except OSError as exc:
        folder = os.path.dirname(pack.path) if pack.path is not None else str(pack.folder)
        _warn_once("beside", folder, f"could not write a mixed-order window's string, list or multi-dimensional "
                   f"columns to {folder!r} ({exc}); they are held in memory instead (and workers sharing the "
                   f"window convert those row groups again). Free space there, or pass Pool(spill=FOLDER) for "
                   f"another folder (on the command line: --spill FOLDER)")
        return pair
    finally:
        t.add("pack", t0, time.perf_counter())
    return (out if keep is piece else keep), out


def _shared_pack(cfg: WorkerConfig, task: Task, gen: int, kept: _Kept | None) -> SpillPack | MappedPack | None:
    """The file process workers share a shuffled task's window in (each worker copies the row
    groups it claims into the file and takes the others' rows from it): the one kept from the
    pass before where that holds the same pieces in the same orders; else the task's file of
    pass ``gen`` in the pool's folder: a spill file (no cache given, its fixed 1-D columns at
    least ``cfg.spill_min`` bytes: `spills`; string, list and multi-dimensional columns, if
    any, each worker publishes in a file of the piece's beside it, `SpillPack.publish`), else,
    where every column is fixed-width and 1-D, a mapped pack (_engine/mapped.py); or None
    where neither can be made, and for a window read through a user's cache for one pass whose
    chunks average `_PACK_CHUNK_ROWS_MAPPED` rows or more (the window is then shared as cache
    entries). bench.py's text_list (strings and lists; 41 of about 115 bytes a row fixed),
    process W=2, one window shared (two runs each, 2026-12-07): as scratch cache entries of
    whole row groups in /dev/shm, 1.45-1.47x the windowed order's rate at 1.04x its peak;
    fixed columns spilled and the others published beside the file, 1.90x at 0.97x."""
    rows = [r for *_, r in task.units]
    if not task.shuffle:
        return None
    orders = piece_orders(task.chunks, len(task.units))
    big = spills(cfg.spill_dir, cfg.block_specs, sum(rows), cfg.spill_min, cfg.spill_beside_row_bytes)
    spilled = cfg.spill_share is not None and big
    if cfg.spill_error is not None and big:
        assert cfg.spill_dir is not None
        _spill_failed(cfg.spill_dir, cfg.spill_error)  # the pool could not make its folder there
    same = kept.pack_for(task, orders) if kept is not None else None
    if isinstance(same, SpillPack if spilled else MappedPack):
        return same
    if spilled:
        assert cfg.spill_share is not None and cfg.spill_dir is not None
        try:
            return SpillPack(cfg.block_specs, rows, orders, cfg.spill_dir,
                             path=os.path.join(cfg.spill_share, spill_name(gen, task.epoch, task.partition, task.number)))
        except OSError as exc:
            _spill_failed(cfg.spill_dir, exc)
    if not all_flat(cfg.block_specs):
        return None
    if cfg.pack_share is None or (_user_cache(cfg) and not task.repeats and not _small_chunks(task, cached=True)):
        # Through a user's cache a window read for one pass, of chunks of 768 rows or more,
        # is shared as the mapped entries: copying it into a file every pass measured slower
        # (4M CTR rows, four tasks an epoch, process W=2 warm: 4.0M against 5.4M rows/s
        # unshared, 8.3M shared as entries; `mix_ab.py --cache --rows 4000000`). (A pool's
        # scratch cache is no user's: its entries are written for the window only.)
        return None
    try:
        return MappedPack(cfg.block_specs, rows, orders,
                          os.path.join(cfg.pack_share, pack_name(gen, task.epoch, task.partition, task.number)))
    except OSError as exc:  # no room for it (a full /dev/shm): shared as cache entries, as without it
        _mapped_failed(cfg.pack_share, exc)
        return None


def _mix_block(cfg: WorkerConfig, win: _Window, n: int, lo: int, hi: int,
               segs: _shm.WorkerSegments | None) -> tuple[Any, Layout]:
    """Build entry ``n`` of a window's blocks (rows ``[lo, hi)`` of its task's stream): its
    chunks of the window's units, concatenated and permuted."""
    units, ranges, perm = win.block(n)
    try:
        return _assembled(cfg, units, ranges, perm, segs, hi - lo)
    finally:
        if isinstance(win.pack, SpillPack):
            win.pack.settle_beside()  # the block's rows of the window's strings and lists, mapped


def _assembled(cfg: WorkerConfig, units: list[UnitColumns], ranges: list[Rows], perm: np.ndarray | None,
               segs: _shm.WorkerSegments | None, rows: int) -> tuple[Any, Layout]:
    """`_mix_block`'s block, assembled into a heap buffer (thread workers) or a segment."""
    if segs is None:
        alloc = cfg.buffers.get if cfg.buffers is not None else (lambda n: np.empty(n, dtype=np.uint8))
        return assemble(cfg.block_specs, units, perm, alloc, ranges)
    got: list[_shm.Segment] = []

    def alloc_shm(n: int) -> np.ndarray:
        seg, arr = segs.get(n, rows)
        got.append(seg)
        return arr

    try:
        buf, layout = assemble(cfg.block_specs, units, perm, alloc_shm, ranges)
    except BaseException:
        for seg in got:
            segs.unsent(seg)
        raise
    del buf
    return got[0], layout


def _mix_tasks(cfg: WorkerConfig, reader: UnitReader, steps: Steps, tasks: Any, gen: int, status: Status,
               segs: _shm.WorkerSegments | None, link: ThreadLink | ProcessLink, stale: Callable[[], bool],
               pid: int, last_wait: tuple[str, float, float] | None, index: int = 0,
               kept: _Kept | None = None) -> tuple[bool, tuple[str, float, float] | None]:
    """Build the blocks of a worker's mixed-order tasks in schedule order (k), each task's
    window read when its first block is due and dropped after its last one. Tasks of different
    partitions may interleave in the schedule: their windows are then held together (at most
    one per partition the rank owns). Returns (whether every block went out, the last wait)."""
    events = sorted((k, i, n, lo, hi) for i, task in enumerate(tasks) for n, (k, lo, hi) in enumerate(task.blocks))
    left = [len(task.blocks) for task in tasks]
    windows: dict[int, _Window] = {}
    for k, i, n, lo, hi in events:
        if stale():
            return False, last_wait
        task = tasks[i]
        t = Timings(pid=pid)
        if last_wait is not None:
            t.spans.append(last_wait)
            last_wait = None
        try:
            win = windows.get(i)
            if win is None:
                win = windows[i] = (
                    _open_shared_window(cfg, reader, steps, task, gen, k, status, t, index, stale, kept)
                    if cfg.share_windows else _open_window(cfg, reader, steps, task, gen, k, status, t, kept))
                _release_decode_buffers(t)  # now that the reads' intermediate columns are gone
            t0 = time.perf_counter()
            payload, layout = _mix_block(cfg, win, n, lo, hi, segs)
            t.add("permute", t0, time.perf_counter())
        except _StalePass:
            return False, last_wait
        except BaseException as exc:  # carried back as a value, re-raised by the merger
            _, _, f, rg = status.get()
            unit = (cfg.files[f].path, rg) if f >= 0 else None
            link.send(WorkerFailed(gen, k, pack_exception(exc), unit), stale)
            return False, last_wait
        left[i] -= 1
        if not left[i]:
            del windows[i]  # the window goes with the task's last block
            if kept is not None and len(tasks) == 1:
                kept.keep(win)  # for the next pass, whose window may be the same row groups
        del win
        status.set(gen, k, -1, -1)
        if _FORWARDED:
            t.warnings, _FORWARDED[:] = list(_FORWARDED), []
        t0 = time.perf_counter()
        ok = link.send(BlockReady(gen, k, payload, layout, t), stale)
        last_wait = ("worker_queue_wait", t0, time.perf_counter())
        if not ok:
            return False, last_wait
    return True, last_wait


def _warm_up() -> None:
    """Pay a worker's one-time costs before its first block, where they are traced as start-up.

    pyarrow.compute (imported by the first cast, 0.05-0.3 s) would otherwise land in the
    first block's ``convert`` and decide a short benchmark's verdict. Nothing here may
    import pandas (see _arrow.py).
    """
    import pyarrow.compute  # noqa: F401

    pa.nulls(1, pa.string()).cast(pa.large_string())  # the cast kernels' first dispatch


def _consumer_pid() -> int:
    """The consumer's pid: the process that started this worker process (the forkserver only
    forked it), or this one for a thread worker."""
    parent = mp.parent_process()
    return parent.pid if parent is not None and parent.pid is not None else os.getpid()


def _parent_alive() -> bool:
    """Whether the consumer's process still runs (see `ProcessLink` for why two checks)."""
    parent = mp.parent_process()
    if parent is not None and not parent.is_alive():
        return False
    return _shm.pid_alive(_consumer_pid())


def process_main(cfg_data: bytes, index: int, inbox: Any, outbox: Any, credit: Any, ints: SharedInts, returns: Any,
                 prefetch: int, main: MainSource | None = None, main_names: tuple[str, ...] = ()) -> None:
    """Entry point of a worker process.

    ``cfg_data`` is the pickled `WorkerConfig`; ``ints`` holds the oldest wanted pass number (slot 0)
    and each worker's slots (`_spawn.worker_slots`); ``credit`` says how many of its blocks
    the consumer took; ``returns`` brings back the segments it is done with; ``main`` is set when the
    configuration refers to ``main_names`` of the main module, which must then be
    imported first. A failure to start is sent as one `WorkerFailed` saying what to
    do; nothing is printed here.
    """
    _spawn.ignore_sigint()
    stage = "set-up"
    try:
        _forward_warnings()
        # One worker is one core of parallelism; pyarrow's own pool would compete.
        pa.set_cpu_count(1)
        pa.set_io_thread_count(2)
        _keep_freed_memory()
        if main is not None:
            stage = "main"
            _spawn.import_main(main)
        stage = "config"
        cfg: WorkerConfig = pickle.loads(cfg_data)
        stage = "set-up"
        assert cfg.kind == "process" and cfg.shm_dir is not None
        hold_spill_files(cfg.spill_dir)  # for the process's life
        # prefetch blocks sent and the one being built.
        segs = _shm.WorkerSegments(cfg.shm_dir, cfg.shm_prefix, index, returns, reserve=prefetch + 1)
    except BaseException as exc:
        with contextlib.suppress(OSError, ValueError):
            outbox.send(WorkerFailed(EVERY, -1, pack_exception(exc), None, "start",
                                     _start_hint(stage, exc, main, main_names)))
        raise SystemExit(1) from None
    passes = Passes(_spawn.Slot(ints, 0))  # read only here: the pool moves the number
    status, sent = _spawn.worker_slots(ints, index)
    link = ProcessLink(cfg, inbox, outbox, credit, segs, prefetch, passes, sent)
    try:
        worker_loop(cfg, index, link, passes, Status(status), segs)
    except Exception as exc:  # a bug outside any block: reported, not printed
        link.send(WorkerFailed(EVERY, -1, pack_exception(exc), None, "worker"), lambda: False)
        raise SystemExit(1) from None
    finally:
        segs.close()
        # A parent killed with SIGKILL cannot sweep; the segments it never
        # mapped would stay in /dev/shm until the next pool starts.
        if not _parent_alive():
            _shm.sweep(cfg.shm_dir, cfg.shm_prefix)


def _start_hint(stage: str, exc: BaseException, main: MainSource | None, names: tuple[str, ...]) -> str:
    """Why a worker process could not start and what to do, as the end of a sentence
    (empty when nothing is known: the message then shows the worker's traceback)."""
    what = ", ".join(names) or "something"
    where = os.path.basename(main[1]) if main is not None else "__main__"
    cause = f"{type(exc).__qualname__}: {exc}"
    if stage == "main":
        inner: BaseException | None = exc
        while inner is not None and not isinstance(inner, _spawn.MainReentered):
            inner = inner.__cause__ or inner.__context__
        if inner is not None:
            return (f"it imports the main module {where}, because the loader's configuration refers to "
                    f"{what}, defined there, and that import creates and iterates a Loader again. Put that "
                    "code under `if __name__ == \"__main__\":`, or move "
                    f"{what} into a module of its own.")
        return (f"it imports the main module {where}, because the loader's configuration refers to "
                f"{what}, defined there, and that import failed ({cause}). Move {what} into a module "
                "of its own and import it from there, or use pool='thread'.")
    if stage == "config":
        return (f"{cause}. It could not rebuild the loader's configuration (its filesystem and options): "
                "everything a process pool hands its workers must unpickle in a fresh process. Use "
                "pool='thread', which keeps it in this process.")
    return ""


def _keep_freed_memory() -> None:
    """In a worker process (ours alone): let glibc keep freed memory for the next block.

    A block's NumPy temporaries (the permutation's keys and orders; for string and list
    columns the value index, several MB per block) are freed after it; glibc gave such
    chunks back to the kernel (unmapped, or trimmed off the heap) and the next block
    faulted in zeroed pages again. Thresholds above a block's temporaries keep them.
    """
    if platform.libc_ver()[0] != "glibc":  # the thresholds below are glibc's
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest
    mallopt(m_trim_threshold, 256 << 20)


# Warnings raised in a worker process, waiting to travel with its next block.
_FORWARDED: list[tuple[str, str]] = []


def _forward_warnings() -> None:
    """In a worker process: keep warnings for the consumer instead of printing them on this
    process's stderr, where a user's warnings filters and ``pytest.warns`` never see them."""

    def keep(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        _FORWARDED.append((category.__name__, str(message)))

    warnings.showwarning = keep
    # Python ignores ResourceWarning by default, and the consumer's filters (where the user
    # decides) never reach this process: let the worker's own (a spill or a shared window
    # that could not be held where asked, once per folder) travel to them.
    warnings.filterwarnings("default", category=ResourceWarning)
