"""Block buffers for thread workers, reused once nothing references them.

A fresh 10+ MB ``np.empty`` per block costs the kernel a page fault and a
zeroed page for every 4 KiB the permutation writes, and an unmap when the last
batch of the block is dropped: about a fifth of a warm-cache epoch's CPU time.
Here a block's array is a view of a *slab* this pool owns, made through a
``memoryview`` so that NumPy does not collapse it onto the slab: every slice of
it, and every array made from it with ``np.frombuffer``, keeps that block array
alive. When the consumer (and anything it handed the batch to) drops the last
of them, the block array dies and its finalizer puts the slab back on the idle
list for the next block. A
batch someone keeps therefore never changes: its slab is not reused while any
view of it is alive.

Memory: a slab is made only when no idle one fits, and then the smallest idle
slab is freed first, so the pool never holds more slabs than blocks were alive
at once (the documented peak-memory bound counts those); a new slab is as large
as the largest block seen, so that varying block sizes do not make new slabs.
Idle slabs stay allocated until the loader is closed or collected.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from .memory import BufferWatch, address_of, finalize

__all__ = ["BlockBuffers"]

# Slabs are rounded up so that blocks of slightly different sizes (the last,
# shorter row group of a file) fit the same slab.
_ROUND = 1 << 20


class BlockBuffers:
    """A thread-safe pool of byte slabs handed out as uint8 arrays."""

    def __init__(self, watch: BufferWatch | None = None) -> None:
        self._lock = threading.Lock()
        self.watch = watch if watch is not None else BufferWatch()
        self._idle: list[np.ndarray] = []
        # Slabs whose block died. A finalizer puts them here without the lock: it can run
        # inside get(), in a garbage collection an allocation under the lock started,
        # and taking the lock there again would hang the thread. get() takes them in.
        self._returned: deque[np.ndarray] = deque()
        self._closed = False
        self._largest = 0
        self.made = 0  # slabs allocated over the pool's life (tests and stats)
        self.reused = 0

    def get(self, n: int) -> np.ndarray:
        """A writable uint8 array of ``n`` bytes whose slab returns here when the array is gone."""
        slab = None
        gone = None
        with self._lock:
            self._take_returned()
            fits = [s for s in self._idle if s.nbytes >= n]
            if fits:
                slab = min(fits, key=lambda s: s.nbytes)
                self._idle = [s for s in self._idle if s is not slab]
                self.reused += 1
            else:
                # None fits: the smallest idle slab makes way, so slabs never outnumber
                # the blocks alive at once. The new one is as large as the largest so far:
                # block sizes vary (a file's last row group is short), and slabs sized to
                # each block were made again and again, each a fresh page per 4 KiB.
                if self._idle:
                    gone = min(self._idle, key=lambda s: s.nbytes)
                    self._idle = [s for s in self._idle if s is not gone]
                self._largest = size = max(-(-n // _ROUND) * _ROUND, 1, self._largest)
                self.made += 1
        if gone is not None:
            self.watch.removed(gone.ctypes.data)
            del gone
        if slab is None:
            slab = np.empty(size, dtype=np.uint8)
            self.watch.added(*address_of(slab))
        # Not slab[:n]: NumPy would make views of that point at the slab itself.
        block = np.frombuffer(memoryview(slab)[:n], dtype=np.uint8)  # type: ignore[arg-type]
        finalize(block, self._give_back, slab)
        return block

    def _give_back(self, slab: np.ndarray) -> None:
        if not self._closed:
            self._returned.append(slab)  # deque.append is atomic; no lock (see __init__)
            if self._closed:  # close() ran meanwhile: nothing would take it in
                self._take_returned()
        else:
            self.watch.removed(slab.ctypes.data)

    def _take_returned(self) -> None:
        """Under the lock: returned slabs become idle. Once closed they are dropped (and
        withdrawn from the watch), which needs no lock: nothing touches the idle list then."""
        while True:
            try:
                slab = self._returned.popleft()
            except IndexError:
                return
            if not self._closed:
                self._idle.append(slab)
            else:
                self.watch.removed(slab.ctypes.data)

    @property
    def idle(self) -> int:
        with self._lock:
            self._take_returned()
            return len(self._idle)

    def close(self) -> None:
        """Free the idle slabs; slabs still in use are freed with their last array."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for slab in idle:
            self.watch.removed(slab.ctypes.data)
        self._take_returned()
