"""Messages between the pool and its workers, and the one way of waiting on a bounded queue.

Consumer to worker: `Tasks`. Worker to merger: `BlockReady` or `WorkerFailed`.
Merger to consumer: lists of `StepCut` on the run's ready queue. They travel through
`Channel` objects to thread workers and through pipes to process workers (see pool.py and
worker.py; the merger's within the process), always as these named types, never as tuples
read by position.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import select
import struct
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, TypeVar

if TYPE_CHECKING:
    from ..plan import Range

__all__ = ["CREDIT", "POLL", "STOP", "BlockReady", "Channel", "PackedError", "Poller", "StepCut", "Task", "Tasks", "Timings",
           "WorkerFailed", "pack_exception", "put_until"]

#: Seconds between the checks of every wait that must notice something else meanwhile
#: (a cancelled run, a dead worker or consumer, a closing pool).
POLL = 0.05
#: On a process worker's credit pipe: how many of its blocks the consumer took since the last message.
CREDIT = struct.Struct("<q")


class _Stop:
    __slots__ = ()

    def __repr__(self) -> str:
        return "STOP"


#: What a worker's link returns when the worker must leave (the pool closes, the consumer is gone).
STOP = _Stop()


class Tasks(NamedTuple):
    """A worker's blocks of one pass (or the first of them, built ahead), in schedule order."""

    gen: int
    tasks: Sequence[Any]  # Task


class PackedError(NamedTuple):
    """An exception as it travels: its text always, the exception itself when it pickles.

    The exception goes pickled on its own, so that a message whose exception the
    receiving process cannot rebuild (its class lives in a module only the worker
    imported) still arrives, with type name, message and traceback.
    """

    type_name: str
    message: str
    traceback: str
    pickled: bytes | None

    def exception(self) -> BaseException | None:
        if self.pickled is None:
            return None
        try:
            exc = pickle.loads(self.pickled)
        except Exception:
            return None
        return exc if isinstance(exc, BaseException) else None


class BlockReady(NamedTuple):
    """Block ``k`` of generation ``gen`` is built; ``payload`` holds its bytes (a heap array, or a
    `_shm.Segment` naming a shared-memory segment), ``layout`` where its columns lie."""

    gen: int
    k: int
    payload: Any
    layout: Any  # _block.Layout
    timings: Any  # Timings


class StepCut(NamedTuple):
    """Step ``step`` of the pass as the merger cut it: ``batch`` (a dict of columns, or a `Packed`
    with group_by), its manifest ``line`` (None when no manifest is kept) and its ``rows`` (items)."""

    batch: Any  # dict[str, Column] | Packed
    step: int
    line: str | None
    rows: int


class WorkerFailed(NamedTuple):
    """The worker could not build block ``k`` (``stage="block"``, ``unit`` the row group it was on),
    or could not start (``stage="start"``, ``gen`` and ``k`` -1; ``hint`` says what to do). A
    message of generation -1 concerns every pass."""

    gen: int
    k: int
    error: PackedError
    unit: tuple[str, int] | None
    stage: Literal["block", "start", "worker"] = "block"  # worker: its own loop failed, between blocks
    hint: str = ""


def pack_exception(exc: BaseException) -> PackedError:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    data: bytes | None
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)  # one that pickles here but cannot be rebuilt would fail the receiver
    except Exception:
        data = None
    return PackedError(type(exc).__qualname__, str(exc), tb, data)


T = TypeVar("T")


class Channel(Generic[T]):
    """A FIFO between threads, bounded when ``maxsize`` > 0, that a KeyboardInterrupt cannot wedge.

    ``queue.Queue`` guards its deque with a `threading.Condition`, whose ``__enter__`` is Python
    code: a Ctrl-C that lands in the main thread right after the lock was taken, before the
    ``with`` block is entered, leaves the lock taken for good, and every later put or get (the
    merger's, then the clean-up's) waits forever. `detload run` hung so on a group-wide SIGINT
    (tests/test_lifecycle.py caught it in CI). Here the items are in a C-level
    `queue.SimpleQueue`, which holds no lock between two bytecodes; the bound is its length,
    checked by the putter, and a full queue's putter waits on a second SimpleQueue the getter
    rings once it took an item. An interrupt at any point loses at most a ring, which costs
    the putter one `POLL`, never a place in the queue.

    The bound holds for one putter at a time (every Channel of detload has one, plus the
    final message of a stopped run); the subset of ``queue.Queue``'s interface detload uses,
    with the same exceptions.
    """

    __slots__ = ("_bell", "_items", "_waiting", "maxsize")

    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize
        self._items: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._waiting = False  # a putter waits for room: the getter rings

    def put(self, item: T, block: bool = True, timeout: float | None = None) -> None:
        if self.maxsize > 0 and self._items.qsize() >= self.maxsize:
            if not block:
                raise queue.Full
            self._wait_for_room(timeout)
        self._items.put(item)

    def _wait_for_room(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._waiting = True
        try:
            # Set before this check: a get after it rings, one before it made the room seen here.
            while self._items.qsize() >= self.maxsize:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Full
                with contextlib.suppress(queue.Empty):  # in slices: a lost ring costs one
                    self._bell.get(True, POLL if left is None else min(left, POLL))
        finally:
            self._waiting = False
            while True:  # rings of gets that were not needed: none left for the next wait
                try:
                    self._bell.get_nowait()
                except queue.Empty:
                    break

    def put_nowait(self, item: T) -> None:
        self.put(item, False)

    def get(self, block: bool = True, timeout: float | None = None) -> T:
        item = self._items.get(block, timeout)
        if self._waiting:
            self._bell.put(None)
        return item

    def get_nowait(self) -> T:
        return self.get(False)

    def qsize(self) -> int:
        return self._items.qsize()

    def empty(self) -> bool:
        return self._items.empty()

    def full(self) -> bool:
        return 0 < self.maxsize <= self._items.qsize()


def put_until(q: Channel[Any], item: Any, give_up: Callable[[], bool]) -> bool:
    """Put ``item`` on the bounded queue ``q``, waiting for room, unless ``give_up()`` is true
    (checked first, then every `POLL` seconds while the queue is full). True if it was put.

    Every bounded put between threads goes through here (a thread worker's outbox, the
    merger's ready queue, the torch adapter's feeder): nothing is put once its reader
    has given up, as a process worker's pipe write (worker.py) is not either.
    """
    while not give_up():
        try:
            q.put(item, timeout=POLL)
            return True
        except queue.Full:
            continue
    return False


class Poller:
    """Which of a fixed set of pipe ends (connections or descriptors) can be read (or hit their end).

    ``multiprocessing.connection.wait`` and ``Connection.poll`` build a selector on every
    call; a hand-over waits once or twice per block on each side, so the set is
    registered once here and each wait is a single ``poll`` call.
    """

    def __init__(self, ends: Sequence[Any]) -> None:
        self._poll = select.poll()
        self._ends: dict[int, Any] = {}
        for end in ends:
            fd = end if isinstance(end, int) else end.fileno()
            self._poll.register(fd, select.POLLIN)
            self._ends[fd] = end

    def wait(self, timeout: float) -> list[Any]:
        """The ends that are ready within ``timeout`` seconds (0: just look)."""
        return [self._ends[fd] for fd, _ in self._poll.poll(timeout * 1000)]


@dataclass(frozen=True)
class Task:
    """One block to produce: k is its position in the rank's schedule.

    Or, for the mixed order (``blocks`` set), one task of the plan: its ``units`` (the window)
    read once (``number`` is the task's), and ``blocks`` built from it, each ``(k, lo, hi)``:
    block k of the schedule is rows ``[lo, hi)`` of the task's stream, made of the window's
    rows its ``chunks`` entry names, permuted.
    """

    k: int
    partition: int
    number: int
    units: tuple[Range, ...]  # (file index, row group, first row, rows): what the block reads
    rows: int
    seed: int
    epoch: int
    shuffle: bool
    #: group_by: each group's first row in the block before its permutation (empty: no groups).
    groups: tuple[int, ...] = ()
    #: The mixed order: the blocks to build from the task, ``(k, lo, hi)`` (empty: one block, ``k``).
    blocks: tuple[tuple[int, int, int], ...] = ()
    #: The mixed order, per entry of ``blocks``: the block's index j in its task and its rows
    #: before the permutation, ``(piece, first row in the piece, rows, run, period)``
    #: (`MixTask.block_chunks`).
    chunks: tuple[tuple[int, tuple[tuple[int, int, int, int, int], ...]], ...] = ()
    #: The mixed order: the next pass's task of this partition is this window again (its
    #: partition's only task, and a single partition or none shuffled: the pass's only task),
    #: so the worker that builds it keeps the window for the next pass and packs it once.
    repeats: bool = False
    #: The mixed order: the task's blocks in the plan, this worker's or not (a worker sharing
    #: the window builds some of them; a resumed task, those from the resume point on).
    task_blocks: int = 0

    @property
    def block_rows(self) -> int:
        """The most rows of a block this task builds."""
        return max((hi - lo for _, lo, hi in self.blocks), default=self.rows)


@dataclass
class Timings:
    """A block's stage timings; travels with the block to the merger, which records the spans.

    ``spans`` holds (stage, start, end) in ``time.perf_counter`` seconds, which on
    Linux is the system-wide monotonic clock, so worker processes and the consumer
    share one time axis.
    """

    read: float = 0.0
    convert: float = 0.0
    permute: float = 0.0
    queue_wait: float = 0.0
    units: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    # Row groups read from the source (not the cache) and their column chunks' bytes, from the footer.
    source_reads: int = 0
    source_bytes: int = 0
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    pid: int = 0
    # Warnings a worker process raised since its last block, as (category name, message):
    # the merger raises them again in the consumer's process (see _forward_warnings).
    warnings: list[tuple[str, str]] = field(default_factory=list)

    def add(self, stage: str, t0: float, t1: float) -> None:
        self.spans.append((stage, t0, t1))
        d = t1 - t0
        if stage == "read":
            self.read += d
        elif stage == "convert":
            self.convert += d
        elif stage == "permute":
            self.permute += d
        elif stage == "worker_queue_wait":
            self.queue_wait += d
        else:
            self.extra[stage] = self.extra.get(stage, 0.0) + d
