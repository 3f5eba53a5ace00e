"""The one bounded-put helper: it waits for room, and puts nothing once its reader has given up."""

from __future__ import annotations

import queue
import threading
import time

from detload._engine.messages import POLL, put_until


def test_put_until_puts_when_there_is_room():
    q: queue.Queue[int] = queue.Queue(maxsize=1)
    assert put_until(q, 1, lambda: False)
    assert q.get_nowait() == 1


def test_put_until_waits_for_room():
    q: queue.Queue[int] = queue.Queue(maxsize=1)
    q.put(0)
    t = threading.Timer(3 * POLL, q.get)
    t.start()
    assert put_until(q, 1, lambda: False)
    t.join()
    assert q.get_nowait() == 1


def test_put_until_puts_nothing_once_given_up():
    q: queue.Queue[int] = queue.Queue(maxsize=1)
    assert not put_until(q, 1, lambda: True)  # room, but the reader is gone
    assert q.empty()
    q.put(0)
    stop = threading.Event()
    threading.Timer(2 * POLL, stop.set).start()
    t0 = time.monotonic()
    assert not put_until(q, 1, stop.is_set)
    assert time.monotonic() - t0 < 2 * POLL + 5  # noticed within a poll or so, not stuck
    assert q.get_nowait() == 0 and q.empty()
