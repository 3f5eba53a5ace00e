"""Shared-memory segments for process workers: plain files in /dev/shm, mapped with mmap.

A worker creates a segment, writes a block into it and sends its name; the
consumer side maps it and unlinks it at once, so no name outlives that moment
and the memory lives exactly as long as the mappings (the segments a worker
makes ahead, below, are named until the next block it hands over). Names carry the
consumer's pid and a loader token, so `sweep` can reclaim what a killed
process left behind.

Segments are then reused (`WorkerSegments`, `ConsumerSegments`): when the last
array viewing a block dies on the consumer side, the segment's number goes
back to its worker over a pipe, and the worker builds a later block in it.
Both sides keep their mappings, so a reused segment costs no page faults, no
zeroed pages and no unmapping; a fresh 12 MB segment per block cost that for
every 4 KiB on both sides and made warm-cache process workers 2-3x slower than
threads. A block someone keeps never changes: its segment does not go back
while any view of it is alive.

With its first block a worker makes the segments its queue can hold at once
(``prefetch + 1``), sized for the largest block of the pass and populated, and
sends their names along; later it makes one only when none idle fits, as large
as the largest so far, in place of the smallest idle one. Segments made one by
one in the first warm pass (where blocks come fastest and queues fill) cost
about as much CPU each as building a block.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import select
import struct
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .._fdless import map_file
from .._procs import pid_alive
from ..errors import SharedMemoryError
from .memory import BufferWatch, address_of, finalize

__all__ = ["SHM_DIR", "ConsumerSegments", "Segment", "WorkerSegments", "create", "discard", "sweep",
           "sweep_dead"]

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_PREFIX = "detload-"
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux
_NAME_RE = re.compile(r"^detload-(\d+)-")


def segment_prefix(pid: int, token: str) -> str:
    return f"{_PREFIX}{pid}-{token}-"


def _space_error(directory: str, nbytes: int, exc: OSError | None = None) -> SharedMemoryError:
    free = "unknown"
    try:
        st = os.statvfs(directory)
        free = f"{st.f_bavail * st.f_frsize / 2**20:.0f} MiB"
    except OSError:
        pass
    return SharedMemoryError(
        f"not enough shared memory in {directory} for a {nbytes / 2**20:.1f} MiB block "
        f"(free: {free}). Raise its size (Docker: --shm-size=8g; Kubernetes: an emptyDir "
        "with medium: Memory), lower prefetch or shuffle_window, or use pool='thread', "
        "which needs no shared memory." + (f" ({exc})" if exc else "")
    )


def create(directory: str, name: str, nbytes: int) -> tuple[np.ndarray, mmap.mmap]:
    """A new writable segment of ``nbytes`` bytes; fails cleanly when /dev/shm is full."""
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        try:
            # Reserve the pages now: writing into an over-committed tmpfs file
            # would kill the worker with SIGBUS instead of raising.
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            os.unlink(path)
            if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                raise _space_error(directory, nbytes, exc) from None
            raise
        # Populated: every page is written soon (segments made ahead at the first block
        # are not written until a later, faster pass, which should not pay for them).
        mm = map_file(fd, nbytes, flags=mmap.MAP_SHARED | _MAP_POPULATE)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.uint8), mm


def _map(directory: str, name: str, nbytes: int) -> mmap.mmap:
    """Map a segment and unlink it: the memory goes with the last mapping (which keeps no
    descriptor: the consumer maps a segment per block alive at once)."""
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_RDWR)
    try:
        return map_file(fd, nbytes, flags=mmap.MAP_SHARED | _MAP_POPULATE)
    finally:
        os.close(fd)
        os.unlink(path)


def discard(directory: str, name: str) -> None:
    try:
        os.unlink(os.path.join(directory, name))
    except FileNotFoundError:
        pass


def _sweep(directory: str, doomed: Callable[[str], bool]) -> int:
    n = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if doomed(name):
            discard(directory, name)
            n += 1
    return n


def sweep(directory: str, prefix: str) -> int:
    """Unlink every segment whose name starts with ``prefix``; returns how many."""
    return _sweep(directory, lambda name: name.startswith(prefix))


def sweep_dead(directory: str = SHM_DIR) -> int:
    """Reclaim segments left by detload processes that no longer exist (e.g. SIGKILLed)."""

    def orphaned(name: str) -> bool:
        m = _NAME_RE.match(name)
        return m is not None and not pid_alive(int(m.group(1)))

    return _sweep(directory, orphaned)


# -- reused segments ----------------------------------------------------------------

# Segments are rounded up so that blocks of slightly different sizes (the last,
# shorter row group of a file) fit the same segment: by an eighth of the block,
# between a page and 1 MiB, since /dev/shm reserves every byte of a segment.
_ROUND_MIN = 1 << 12
_ROUND_MAX = 1 << 20
_FREED = struct.Struct("<q")


def _capacity(nbytes: int) -> int:
    granule = max(_ROUND_MIN, min(_ROUND_MAX, 1 << max(0, (nbytes // 8).bit_length() - 1)))
    return max(-(-nbytes // granule) * granule, 1)


class Segment(NamedTuple):
    """What a worker sends for a block built in shared memory (small and picklable)."""

    worker: int
    number: int            # the worker's number for the segment, never reused
    name: str | None       # set the first time: the consumer maps and unlinks it
    capacity: int
    dropped: tuple[int, ...] = ()  # segments the worker unmapped: the consumer unmaps them too
    # Segments the worker made ahead, idle for now: (number, name, capacity). The consumer
    # maps and unlinks them at once, like ``name``, so no name outlives the hand-over.
    made_ahead: tuple[tuple[int, str, int], ...] = ()


class WorkerSegments:
    """A worker process's segments: the ones in use and the idle ones it may build in.

    ``returns`` is the read end of the pipe on which the consumer sends back the
    numbers of segments it no longer views.
    """

    def __init__(self, directory: str, prefix: str, worker: int, returns: Any, reserve: int = 1) -> None:
        self.directory = directory
        self.prefix = prefix
        self.worker = worker
        self.reserve = reserve
        self._returns = returns
        self._returned = select.poll()  # see _messages.Poller: collect() runs once or twice per block
        self._returned.register(returns.fileno(), select.POLLIN)
        self._maps: dict[int, mmap.mmap] = {}
        self._capacity: dict[int, int] = {}
        self._idle: set[int] = set()
        self._unsent: set[int] = set()  # made ahead: the consumer has not got their names yet
        self._dropped: list[int] = []
        self._next = 0
        self._largest = 0
        self._pass_rows = 0
        self.made = 0
        self.reused = 0
        self.closed = False  # the consumer closed its end: the pool is closing, or gone

    @property
    def returns(self) -> Any:
        return self._returns

    def new_pass(self, rows: int) -> None:
        """``rows``: the most rows of any block this worker builds in the pass at hand."""
        self._pass_rows = rows

    def collect(self) -> None:
        """Take in the segments the consumer sent back (also while waiting, so its pipe never fills)."""
        if self.closed:
            return
        while self._returned.poll(0):
            try:
                data = self._returns.recv_bytes()
            except (EOFError, OSError):
                self.closed = True
                return
            (number,) = _FREED.unpack(data)
            if number in self._maps:
                self._idle.add(number)

    def get(self, nbytes: int, rows: int = 0) -> tuple[Segment, np.ndarray]:
        """A segment of at least ``nbytes`` bytes and a writable uint8 array over its first ``nbytes``
        (for a block of ``rows`` rows)."""
        self.collect()
        fits = [i for i in self._idle if self._capacity[i] >= nbytes]
        if fits:
            number = min(fits, key=self._capacity.__getitem__)
            self._idle.discard(number)
            self.reused += 1
        else:
            # None fits: the smallest idle segment (if any) makes way for a new one, so
            # segments never outnumber the blocks that were alive at once (or the
            # reserve). A new one is never smaller than the largest so far, and fits
            # the largest block of the pass as estimated from this one's bytes per row:
            # block sizes vary (a file's last row group is short), and segments sized
            # to each block were remade again and again, each costing a zeroed page and
            # a fault per 4 KiB on both sides. The estimate is used only for a block of
            # at least half the pass's largest row count, so it is at most twice this
            # block: a short block's bytes per row (long strings, alignment) say little.
            if self._idle:
                self._drop(min(self._idle, key=self._capacity.__getitem__))
            want = -(-nbytes * self._pass_rows // rows) if 0 < rows < self._pass_rows <= 2 * rows else nbytes
            self._largest = max(_capacity(want), self._largest)
            number = self._make(self._largest)
            if self.made == 1:
                # The first block: make the segments the worker's queue will hold at once
                # now, rather than one by one in the first fast (warm) pass, where each
                # new one cost about as much CPU as building a block.
                for _ in range(self.reserve - 1):
                    self._idle.add(self._make(self._largest))
        name = None
        if number in self._unsent:
            self._unsent.discard(number)
            name = self._name(number)
        seg = Segment(self.worker, number, name, self._capacity[number])
        return seg, np.frombuffer(self._maps[number], dtype=np.uint8, count=nbytes)

    def _name(self, number: int) -> str:
        return f"{self.prefix}{self.worker}-{number}"

    def _make(self, capacity: int) -> int:
        number = self._next
        self._next += 1
        _, mm = create(self.directory, self._name(number), capacity)
        self._maps[number] = mm
        self._capacity[number] = capacity
        self._unsent.add(number)
        self.made += 1
        return number

    def _drop(self, number: int) -> None:
        """Unmap an idle segment; the consumer unmaps it too, or never hears of it."""
        self._idle.discard(number)
        if number in self._unsent:
            self._unsent.discard(number)
            discard(self.directory, self._name(number))
        else:
            self._dropped.append(number)
        self._forget(number)

    def sending(self, seg: Segment) -> Segment:
        """``seg`` as it is sent: with the drops and the segments made ahead that the consumer
        has not heard of yet."""
        if not self._dropped and not self._unsent:
            return seg
        ahead = tuple((n, self._name(n), self._capacity[n]) for n in sorted(self._unsent))
        out = seg._replace(dropped=tuple(self._dropped), made_ahead=ahead)
        self._dropped.clear()
        self._unsent.clear()
        return out

    def unsent(self, seg: Segment) -> None:
        """A block built in ``seg`` did not reach the consumer (stale, or rebuilt)."""
        self._dropped.extend(seg.dropped)
        # Names the consumer never saw go with the next block (unless dropped meanwhile).
        self._unsent.update(n for n, _, _ in seg.made_ahead if n in self._maps)
        if seg.name is not None:
            self._unsent.add(seg.number)
        self._idle.add(seg.number)

    def _forget(self, number: int) -> None:
        mm = self._maps.pop(number)
        self._capacity.pop(number)
        try:
            mm.close()
        except BufferError:  # an array of it is still alive here; unmapped when it goes
            pass

    def close(self) -> None:
        for number in self._unsent:  # nobody else would unlink these names
            discard(self.directory, self._name(number))
        self._unsent.clear()
        for number in list(self._maps):
            self._forget(number)
        self._idle.clear()


class _Returns:
    """The consumer's end of one worker's return pipe, written without ever blocking.

    A block array sends its segment back when it is collected, from whatever
    thread drops the last view (the training loop's, inside a finalizer): that
    must not wait for the worker. The pipe is non-blocking; a number that does
    not fit (thousands of blocks dropped at once) waits in ``pending`` and is
    sent with the next block the consumer side handles.
    """

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.pending: deque[int] = deque()
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(conn.fileno(), False)

    def send(self, number: int) -> None:
        # A finalizer: never raises. A message is 12 bytes, under PIPE_BUF, so a
        # write is whole or nothing; a gone worker gives a broken pipe, a closed
        # pool a closed handle.
        try:
            self.conn.send_bytes(_FREED.pack(number))
        except BlockingIOError:
            self.pending.append(number)
        except (OSError, ValueError):
            pass

    def flush(self) -> None:
        for _ in range(len(self.pending)):
            try:
                number = self.pending.popleft()
            except IndexError:
                return
            self.send(number)


class ConsumerSegments:
    """The consumer side: one mapping per live or idle segment of each worker.

    ``returns[w]`` is the write end of worker ``w``'s return pipe (see `_Returns`).
    """

    def __init__(self, directory: str, returns: Sequence[Any], watch: BufferWatch | None = None) -> None:
        self.directory = directory
        self.watch = watch if watch is not None else BufferWatch()
        self._returns = [_Returns(c) for c in returns]
        self._maps: dict[tuple[int, int], mmap.mmap] = {}
        self.made = 0    # segments mapped (tests and stats)
        self.reused = 0  # blocks that arrived in a segment already mapped

    @property
    def mapped(self) -> int:
        """Segments this side keeps mapped for reuse (live or idle)."""
        return len(self._maps)

    def _take_in(self, seg: Segment) -> None:
        """What every block a worker sends brings: returns that did not fit earlier go out,
        the worker's dropped segments are unmapped here too, and a new segment is mapped
        (which unlinks its name)."""
        returns = self._returns[seg.worker]
        if returns.pending:
            returns.flush()
        for number in seg.dropped:
            mm = self._maps.pop((seg.worker, number), None)
            if mm is not None:
                self.watch.removed(address_of(mm)[0])
        for number, name, capacity in seg.made_ahead:
            self._add((seg.worker, number), _map(self.directory, name, capacity))
            self.made += 1
        if seg.name is not None:
            self._add((seg.worker, seg.number), _map(self.directory, seg.name, seg.capacity))

    def _add(self, key: tuple[int, int], mm: mmap.mmap) -> None:
        old = self._maps.get(key)
        if old is not None:
            self.watch.removed(address_of(old)[0])
        self._maps[key] = mm
        self.watch.added(*address_of(mm))

    def attach(self, seg: Segment, nbytes: int) -> np.ndarray:
        """The block's bytes as a uint8 array; the segment goes back to its worker when it dies."""
        self._take_in(seg)
        if seg.name is not None:
            self.made += 1
        else:
            self.reused += 1
        mm = self._maps.get((seg.worker, seg.number))
        if mm is None:  # a bug, not a user error: say which, rather than a bare KeyError
            raise SharedMemoryError(
                f"worker {seg.worker} built a block in its segment {seg.number}, whose name never "
                "reached this process (the block that carried it was lost)"
            )
        # Not a slice of an array over the whole mapping: NumPy would make views of
        # that point at it, and this block array could die while they live.
        block = np.frombuffer(memoryview(mm)[:nbytes], dtype=np.uint8)  # type: ignore[arg-type]
        finalize(block, self._returns[seg.worker].send, seg.number)
        return block

    def release(self, seg: Segment) -> None:
        """A block that will never be used: take it in like any other, send it straight back."""
        try:
            self._take_in(seg)
        except OSError:  # its name is gone (a sweep at close): the worker is going away too
            return
        self._returns[seg.worker].send(seg.number)

    def flush(self, worker: int) -> None:
        """Send what did not fit earlier (called while waiting for ``worker``)."""
        returns = self._returns[worker]
        if returns.pending:
            returns.flush()

    def close(self) -> None:
        """Unmap the idle segments, close the return pipes; the mappings of live blocks go
        with their last view."""
        maps, self._maps = self._maps, {}
        for mm in maps.values():
            with contextlib.suppress(ValueError):  # already closed
                self.watch.removed(address_of(mm)[0])
            try:
                mm.close()
            except BufferError:  # a block someone keeps still views it
                pass
        for returns in self._returns:
            returns.pending.clear()
            with contextlib.suppress(OSError):
                returns.conn.close()

