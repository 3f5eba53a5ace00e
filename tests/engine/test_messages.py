"""The one bounded-put helper (it waits for room, and puts nothing once its reader has given up),
and `Channel`, the FIFO between threads that an interrupt at any bytecode cannot wedge."""

from __future__ import annotations

import queue
import sys
import threading
import time

import pytest

from detload._engine.messages import POLL, Channel, put_until


def test_put_until_puts_when_there_is_room():
    q: Channel[int] = Channel(maxsize=1)
    assert put_until(q, 1, lambda: False)
    assert q.get_nowait() == 1


def test_put_until_waits_for_room():
    q: Channel[int] = Channel(maxsize=1)
    q.put(0)
    t = threading.Timer(3 * POLL, q.get)
    t.start()
    assert put_until(q, 1, lambda: False)
    t.join()
    assert q.get_nowait() == 1


def test_put_until_puts_nothing_once_given_up():
    q: Channel[int] = Channel(maxsize=1)
    assert not put_until(q, 1, lambda: True)  # room, but the reader is gone
    assert q.empty()
    q.put(0)
    stop = threading.Event()
    threading.Timer(2 * POLL, stop.set).start()
    t0 = time.monotonic()
    assert not put_until(q, 1, stop.is_set)
    assert time.monotonic() - t0 < 2 * POLL + 5  # noticed within a poll or so, not stuck
    assert q.get_nowait() == 0 and q.empty()


def test_channel_is_a_bounded_fifo():
    q: Channel[int] = Channel(maxsize=2)
    q.put(1)
    q.put_nowait(2)
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.01)
    assert q.qsize() == 2 and not q.empty()
    assert [q.get(), q.get_nowait()] == [1, 2]
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)
    q.put_nowait(3)  # the places taken came back
    q.put_nowait(4)
    assert q.empty() is False and q.get() == 3


def test_an_unbounded_channel_takes_any_number():
    q: Channel[int] = Channel()
    for i in range(1000):
        q.put_nowait(i)
    assert [q.get_nowait() for _ in range(1000)] == list(range(1000))


class _Interrupt(KeyboardInterrupt):
    pass


def _interrupted_at(n: int, action) -> bool:
    """Run ``action`` with a KeyboardInterrupt raised at its n-th traced event (a call, line or
    return of any Python frame in it, as a signal handler could at any bytecode); False once
    n is past its last event."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += 1
        if count == n:
            raise _Interrupt
        return trace

    sys.settrace(trace)
    try:
        action()
    except _Interrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def _still_works(q) -> bool:
    """Another thread can still put and get on ``q`` (within 2 s, not forever), and its every
    place is still there (a stopped run's last message is put so, after a drain)."""
    done = threading.Event()

    def use() -> None:
        while True:  # items left by the interrupted action
            try:
                q.get_nowait()
            except queue.Empty:
                break
        q.put(7, timeout=1)
        q.put_nowait(8)
        if [q.get(timeout=1), q.get(timeout=1)] == [7, 8]:
            done.set()

    t = threading.Thread(target=use, daemon=True)
    t.start()
    t.join(2.0)
    return done.is_set()


@pytest.mark.parametrize("make", [lambda: Channel(maxsize=2), lambda: queue.Queue(maxsize=2)],
                         ids=["Channel", "queue.Queue"])
@pytest.mark.parametrize("what", ["get", "put"])
def test_an_interrupt_at_any_point_of_a_get_or_put_leaves_the_channel_usable(make, what):
    """queue.Queue is here to show the test can fail: an interrupt right after its Condition's
    lock was taken leaves that lock taken for good, as `detload run` found out on Ctrl-C."""
    wedged = []
    n = 1
    while True:
        q = make()
        q.put(0)
        action = (lambda q=q: q.get(timeout=0.01)) if what == "get" else (lambda q=q: q.put(1, timeout=0.01))
        if not _interrupted_at(n, action):
            break
        if not _still_works(q):
            wedged.append(n)
            if not isinstance(q, Channel):
                break  # shown; each wedged one costs the 2 s wait
        n += 1
    assert n > 1 or wedged  # the action was traced at all
    if isinstance(q, Channel):
        assert wedged == []
    else:
        assert wedged, "queue.Queue survived every interrupt: the test no longer reaches the race"
