"""The block-memory contract, tested once against both implementations.

Thread workers build blocks in heap slabs (`BlockBuffers`), process workers in
shared-memory segments (`WorkerSegments` on the worker side, `ConsumerSegments`
on the consumer's). Both promise the same four things: a buffer is not reused
while any view of its block lives; when no idle buffer fits, only the smallest
idle one makes way; a new buffer fits the largest block so far; nothing is kept
after close. Each implementation gets a small adapter; the tests see only that.
Implementation-specific behaviour stays in test_heap.py and test_shm.py.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detload._engine.heap import BlockBuffers
from detload._engine.shm import ConsumerSegments, WorkerSegments

MiB = 1 << 20


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class HeapMemory:
    """Thread workers: the block a worker builds is the array the consumer sees."""

    def __init__(self, tmp_path) -> None:
        self.pool = BlockBuffers()

    def get(self, nbytes: int, fill: int) -> np.ndarray:
        block = self.pool.get(nbytes)
        block[:] = fill
        return block

    @property
    def made(self) -> int:
        return self.pool.made

    @property
    def reused(self) -> int:
        return self.pool.reused

    @property
    def idle(self) -> int:
        return self.pool.idle

    def kept(self) -> int:
        """Buffers the pool still references (idle, or given back and not yet taken in)."""
        return len(self.pool._idle) + len(self.pool._returned)

    def close(self) -> None:
        self.pool.close()


class ShmMemory:
    """Process workers: the worker fills its segment, the consumer gets an array over its mapping."""

    def __init__(self, tmp_path) -> None:
        self.dir = str(tmp_path)
        r, w = mp.Pipe(duplex=False)
        self.worker = WorkerSegments(self.dir, "detload-1-t-", 0, r)
        self.consumer = ConsumerSegments(self.dir, [w])

    def get(self, nbytes: int, fill: int) -> np.ndarray:
        seg, arr = self.worker.get(nbytes)
        arr[:] = fill
        del arr
        return self.consumer.attach(self.worker.sending(seg), nbytes)

    @property
    def made(self) -> int:
        return self.worker.made

    @property
    def reused(self) -> int:
        return self.worker.reused

    @property
    def idle(self) -> int:
        self.worker.collect()  # the consumer's returns arrive over the pipe
        return len(self.worker._idle)

    def kept(self) -> int:
        """Segments mapped on either side, plus names left in the directory."""
        return len(self.worker._maps) + self.consumer.mapped + len(os.listdir(self.dir))

    def close(self) -> None:
        # The pool's order: the consumer side first, then the worker sees its pipe closed.
        self.consumer.close()
        self.worker.close()


@pytest.fixture(params=[HeapMemory, ShmMemory], ids=["heap", "shm"])
def memory(request, tmp_path):
    mem = request.param(tmp_path)
    yield mem
    gc.collect()
    mem.close()


def test_not_reused_while_a_view_lives(memory):
    block = memory.get(1000, 7)
    # The ways the loader and a user derive arrays from a block.
    kept = [block[10:20], np.frombuffer(block, dtype=np.uint32, count=4, offset=64).reshape(2, 2)[1:]]
    del block
    gc.collect()
    assert memory.idle == 0
    other = memory.get(1000, 9)  # the first is still viewed: another buffer
    assert memory.made == 2 and memory.reused == 0
    assert not any(np.shares_memory(k, other) for k in kept)
    assert all((k.view(np.uint8) == 7).all() for k in kept)
    del kept
    gc.collect()
    assert memory.idle == 1
    again = memory.get(500, 5)  # a smaller block fits the idle buffer
    assert memory.reused == 1 and memory.made == 2
    assert (again == 5).all() and (other == 9).all()


def test_only_the_smallest_idle_buffer_makes_way(memory):
    a, b = memory.get(1 * MiB, 1), memory.get(2 * MiB, 2)
    live = memory.get(100, 3)
    del a, b
    gc.collect()
    assert memory.idle == 2
    c = memory.get(3 * MiB, 4)  # fits neither: the 1 MiB buffer goes, the 2 MiB one stays
    assert memory.made == 4 and memory.idle == 1
    d = memory.get(2 * MiB, 5)
    assert memory.made == 4 and memory.reused == 1 and memory.idle == 0
    assert (live == 3).all() and (c == 4).all() and (d == 5).all()


def test_new_buffers_fit_the_largest_block_so_far(memory):
    # Block sizes vary (a file's last row group is short): buffers sized to each block were
    # made again and again when a larger block followed a smaller one.
    big = memory.get(4 * MiB, 1)
    small = memory.get(100, 2)  # a new buffer, made as large as the 4 MiB one
    assert memory.made == 2
    small_at = _address(small)
    del small
    gc.collect()
    big2 = memory.get(4 * MiB, 3)  # so a large block fits it
    assert memory.made == 2 and memory.reused == 1 and _address(big2) == small_at
    assert (big == 1).all() and (big2 == 3).all()


def test_nothing_kept_after_close(memory):
    live = memory.get(100, 1)
    idle = memory.get(MiB, 2)
    del idle
    gc.collect()
    assert memory.idle == 1 and memory.kept() > 0
    memory.close()
    assert (live == 1).all()  # a block still viewed stays readable
    del live  # its buffer goes back to a closed pool: dropped, not kept
    gc.collect()
    assert memory.kept() == 0


@pytest.mark.parametrize("impl", [HeapMemory, ShmMemory], ids=["heap", "shm"])
@settings(max_examples=10, deadline=None)
@given(ops=st.lists(st.one_of(st.integers(1, 3 * MiB), st.tuples(st.integers(0, 7))), min_size=1, max_size=25))
def test_live_blocks_keep_their_bytes_and_buffers_never_outnumber_them(tmp_path_factory, impl, ops):
    """Random gets (an int: bytes) and drops (a 1-tuple: which live block): every live block keeps
    its bytes, no two share memory, and buffers never outnumber the blocks alive at once."""
    memory = impl(tmp_path_factory.mktemp("mem"))
    live: list[tuple[np.ndarray, int]] = []
    peak = 0
    for n, op in enumerate(ops):
        if isinstance(op, int):
            fill = n % 251
            block = memory.get(op, fill)
            assert not any(np.shares_memory(block, other) for other, _ in live)
            live.append((block, fill))
            del block
        elif live:
            del live[op[0] % len(live)]  # no cycles: the block dies (and gives back) right here
        peak = max(peak, len(live))
        assert memory.idle + len(live) <= peak
        assert all((b == f).all() for b, f in live)
    live.clear()
    memory.close()
    assert memory.kept() == 0
