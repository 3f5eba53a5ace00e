"""Reused shared-memory segments of the process pool: names never outlive the hand-over, drops reach
both sides, the reserve and the pass estimate size segments, and returns never block.

The promises segments share with heap slabs are tested once in test_block_memory.py."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import subprocess
import sys

import psutil
import pytest
from leaks import wait_until

from detload._engine import shm as _shm
from detload._engine.shm import ConsumerSegments, WorkerSegments


@pytest.fixture
def make_pair(tmp_path):
    """make_pair(reserve=1): a worker's segments and the consumer's, in tmp_path; closed after the test."""
    made = []

    def make(reserve: int = 1):
        r, w = mp.Pipe(duplex=False)
        worker = WorkerSegments(str(tmp_path), "detload-1-t-", 0, r, reserve=reserve)
        consumer = ConsumerSegments(str(tmp_path), [w])
        made.append((worker, consumer))
        return worker, consumer

    yield make
    gc.collect()
    for worker, consumer in made:
        worker.close()
        consumer.close()


@pytest.fixture
def pair(make_pair, tmp_path):
    worker, consumer = make_pair()
    return worker, consumer, tmp_path


def _send(worker, consumer, nbytes, value, rows=0):
    """Build a block of ``nbytes`` (``rows`` rows) filled with ``value`` and hand it over."""
    seg, arr = worker.get(nbytes, rows)
    arr[:] = value
    del arr
    sent = worker.sending(seg)
    return consumer.attach(sent, nbytes), sent


def test_idle_segments_too_small_are_dropped_on_both_sides(pair):
    worker, consumer, _ = pair
    small, _ = _send(worker, consumer, 10, 1)
    del small
    gc.collect()
    big, seg = _send(worker, consumer, 3 << 20, 2)  # nothing idle fits: the small one is unmapped
    assert seg.dropped and worker.made == 2
    assert consumer.mapped == 1
    del big


def test_unsent_blocks_keep_their_segment(pair):
    worker, consumer, d = pair
    seg, arr = worker.get(100)
    del arr
    assert os.listdir(d) == [seg.name]
    worker.unsent(seg)  # never reached the consumer: kept, its name goes with the next block
    assert os.listdir(d) == [seg.name]
    block, seg2 = _send(worker, consumer, 100, 3)
    assert seg2.number == seg.number and seg2.name == seg.name and os.listdir(d) == []
    del block
    gc.collect()
    seg3, arr = worker.get(100)
    del arr
    assert seg3.number == seg2.number and seg3.name is None
    worker.unsent(seg3)  # the consumer maps it: it stays for the next block
    seg4, arr = worker.get(100)
    assert seg4.number == seg2.number and seg4.name is None
    del arr


def test_close_unlinks_names_never_sent(make_pair, tmp_path):
    worker, _ = make_pair(reserve=3)
    seg, arr = worker.get(100)
    del arr
    worker.unsent(worker.sending(seg))
    assert len(os.listdir(tmp_path)) == 3
    worker.close()
    assert os.listdir(tmp_path) == []


def test_first_block_makes_the_reserve(make_pair, tmp_path):
    # The segments a worker's queue holds at once are made (populated) with its first block,
    # not one by one in the first fast pass; their names go with that block, so no name
    # outlives the first hand-over.
    worker, consumer = make_pair(reserve=3)
    first, seg = _send(worker, consumer, 5000, 0)
    assert seg.name is not None and len(seg.made_ahead) == 2
    assert worker.made == 3 and consumer.made == 3 and os.listdir(tmp_path) == []
    blocks = [first]
    for v in (1, 2):
        block, seg = _send(worker, consumer, 5000, v)
        assert seg.name is None and not seg.made_ahead
        blocks.append(block)
    assert [int(b[0]) for b in blocks] == [0, 1, 2] and consumer.mapped == 3
    block, seg = _send(worker, consumer, 5000, 9)  # all three in use: one more
    assert worker.made == 4 and seg.name is not None
    del blocks, block, first


def test_a_block_not_handed_over_keeps_the_names_for_the_next(make_pair, tmp_path):
    worker, consumer = make_pair(reserve=2)
    seg, arr = worker.get(100)
    del arr
    worker.unsent(worker.sending(seg))  # stale: the consumer never saw it
    block, seg2 = _send(worker, consumer, 100, 4)
    assert seg2.name is not None and len(seg2.made_ahead) == 1
    assert os.listdir(tmp_path) == [] and consumer.mapped == 2
    other, seg3 = _send(worker, consumer, 100, 5)  # the one made ahead, mapped on both sides
    assert seg3.name is None and (other == 5).all() and (block == 4).all()
    del block, other


def test_new_segments_fit_the_largest_block_of_the_pass(pair):
    worker, consumer, _ = pair
    worker.new_pass(rows=1000)
    small, seg = _send(worker, consumer, 100_000, 1, rows=500)  # 200 bytes a row
    assert seg.capacity >= 200_000
    del small
    gc.collect()
    big, seg2 = _send(worker, consumer, 200_000, 2, rows=1000)
    assert seg2.number == seg.number and worker.made == 1
    del big


def test_a_short_block_does_not_size_the_segments(pair):
    # A 2-row block of long strings has a bytes-per-row that says nothing about the pass's
    # 100,000-row blocks: scaling it made 190 GiB segments (and a SharedMemoryError).
    worker, consumer, _ = pair
    worker.new_pass(rows=100_000)
    block, seg = _send(worker, consumer, 4_000_000, 1, rows=2)
    assert seg.capacity <= 4_000_000 + (1 << 20)
    del block
    gc.collect()
    worker.new_pass(rows=100_000)
    half, seg2 = _send(worker, consumer, 6_000_000, 2, rows=49_999)  # under half: not scaled either
    assert seg2.capacity <= 6_000_000 + (1 << 20)
    del half


def test_dropping_a_segment_never_announced_unlinks_it_here(make_pair, tmp_path):
    worker, consumer = make_pair(reserve=3)
    seg, arr = worker.get(100)  # makes three: this one and two idle, not announced yet
    del arr
    seg2, arr2 = worker.get(1 << 20)  # fits no idle one: one of the two makes way
    del arr2
    assert len(os.listdir(tmp_path)) == 3
    sent = worker.sending(seg)
    assert sent.dropped == () and len(sent.made_ahead) == 1  # the dropped one is never mentioned
    block = consumer.attach(sent, 100)
    block2 = consumer.attach(worker.sending(seg2), 1 << 20)
    assert os.listdir(tmp_path) == [] and consumer.mapped == 3
    del block, block2


def test_a_block_whose_segment_was_never_announced_says_so(pair):
    worker, consumer, _ = pair
    seg, arr = worker.get(100)
    del arr
    with pytest.raises(_shm.SharedMemoryError, match="never reached this process"):
        consumer.attach(seg._replace(name=None), 100)
    worker.unsent(seg)


def test_release_of_a_stale_block_gives_its_segment_back(pair):
    worker, consumer, d = pair
    seg, arr = worker.get(100)
    del arr
    consumer.release(worker.sending(seg))
    assert os.listdir(d) == []
    seg2, arr = worker.get(100)
    assert seg2.number == seg.number and seg2.name is None
    del arr


def test_give_back_after_the_worker_is_gone_is_silent(tmp_path, monkeypatch):
    r, w = mp.Pipe(duplex=False)
    worker = WorkerSegments(str(tmp_path), "detload-1-t-", 0, r)
    consumer = ConsumerSegments(str(tmp_path), [w])
    seg, arr = worker.get(100)
    del arr
    block = consumer.attach(worker.sending(seg), 100)
    worker.close()
    r.close()
    with pytest.raises(BrokenPipeError):  # what the give-back meets: the worker's end is gone
        w.send_bytes(b"\0" * 8)
    ignored: list[object] = []  # what a finalizer that raised would report ("Exception ignored in")
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    returns = consumer._returns[0]
    sent: list[bytes] = []
    send = returns.conn.send_bytes

    def counted(data: bytes) -> None:
        sent.append(data)
        send(data)

    monkeypatch.setattr(returns.conn, "send_bytes", counted)
    del block  # the last view: its finalizer gives the segment back into the broken pipe
    gc.collect()
    assert len(sent) == 1  # it did try
    assert ignored == []  # and swallowed the broken pipe: nothing reported, nothing raised
    assert not returns.pending  # nor kept to be sent again to a worker that is gone
    consumer.close()
    assert consumer.mapped == 0 and os.listdir(tmp_path) == []


def test_capacity_is_rounded_by_an_eighth_of_the_block():
    from detload._engine.shm import _capacity

    assert _capacity(1) == 4096
    assert _capacity(50_000) == 53_248  # 13 pages, not a whole MiB reserved in /dev/shm
    assert _capacity(12_600_000) == 13 << 20
    for n in (1, 4095, 4097, 50_000, 1 << 20, 12_600_000, 40 << 20):
        assert n <= _capacity(n) <= n + max(4096, n // 8)


def test_dropping_many_blocks_at_once_never_blocks_the_consumer(tmp_path):
    """A finalizer sends each segment back; with more than a pipe holds and a worker not
    reading, the sends must not block (the training loop's thread runs them)."""
    import fcntl
    import threading

    r, w = mp.Pipe(duplex=False)
    fcntl.fcntl(w.fileno(), 1031, 4096)  # F_SETPIPE_SZ: one page, ~340 messages
    worker = WorkerSegments(str(tmp_path), "detload-1-t-", 0, r)
    consumer = ConsumerSegments(str(tmp_path), [w])
    blocks = []
    for _ in range(500):
        seg, arr = worker.get(100)
        del arr
        blocks.append(consumer.attach(worker.sending(seg), 100))
    done = threading.Event()

    def drop():
        blocks.clear()
        gc.collect()
        done.set()

    t = threading.Thread(target=drop, daemon=True)
    t.start()
    assert done.wait(10), "dropping blocks blocked on the return pipe"
    t.join()
    returns = consumer._returns[0]
    assert returns.pending  # what did not fit waits
    for _ in range(5):  # the worker reads; each block the consumer handles sends more
        worker.collect()
        seg, arr = worker.get(100)  # reuses one of them
        del arr
        consumer.release(worker.sending(seg))
    worker.collect()
    assert not returns.pending
    assert len(worker._idle) == 500 and worker.made == 500
    worker.close()
    consumer.close()


def test_segments_of_a_zombie_are_swept(tmp_path):
    """A SIGKILLed consumer nobody has reaped yet counts as gone: its segments are reclaimed."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE, 10.0)
        assert not _shm.pid_alive(proc.pid)
        assert _shm.pid_alive(os.getpid())
        name = f"{_shm.segment_prefix(proc.pid, 'zz')}0-0"
        (tmp_path / name).write_bytes(b"x")
        mine = f"{_shm.segment_prefix(os.getpid(), 'zz')}0-0"
        (tmp_path / mine).write_bytes(b"x")
        assert _shm.sweep_dead(str(tmp_path)) == 1
        assert os.listdir(tmp_path) == [mine]
    finally:
        proc.wait()
