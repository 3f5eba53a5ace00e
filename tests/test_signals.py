"""`detload run`'s signal handling (detload/_signals.py): Ctrl-C and SIGTERM become exceptions in
the main thread, but not while it runs code that holds a lock in Python, where an exception
would leave the lock taken and the clean-up after it waiting forever."""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time

import pytest

from detload._signals import Terminated, interruptible


def _frame_in_lock_code() -> tuple[object, threading.Event]:
    """A frame inside threading.py: that of a thread waiting on an Event."""
    done = threading.Event()
    t = threading.Thread(target=done.wait, daemon=True)
    t.start()
    for _ in range(1000):
        frame = sys._current_frames().get(t.ident)  # type: ignore[arg-type]
        if frame is not None and frame.f_code.co_filename == threading.__file__:
            return frame, done
        time.sleep(0.001)
    raise AssertionError("the thread never waited")


def _wait_for_it() -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.001)


@pytest.mark.parametrize(("signum", "kind"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_signal_landing_in_lock_code_is_raised_a_moment_later_outside_it(signum, kind):
    frame, done = _frame_in_lock_code()
    try:
        with interruptible():
            handler = signal.getsignal(signum)
            assert callable(handler)
            handler(signum, frame)  # returns: put off, not raised inside threading.py
            with pytest.raises(kind) as info:
                _wait_for_it()
            assert type(info.value) is kind
            # The first signal decided: both are ignored from then on.
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        done.set()


def test_a_signal_landing_elsewhere_is_raised_at_once():
    with interruptible():
        handler = signal.getsignal(signal.SIGTERM)
        with pytest.raises(Terminated):
            handler(signal.SIGTERM, sys._getframe())


def test_interruptible_puts_the_handlers_back():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with interruptible():
        assert signal.getsignal(signal.SIGINT) is not before[0]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_put_off_signal_wakes_a_main_thread_blocked_in_a_c_level_wait():
    """`detload run` waits for its next batch in SimpleQueue.get without a timeout: the signal
    sent again must interrupt that wait (a real signal to the main thread), not just be marked
    pending until the wait ends (interrupt_main)."""
    frame, done = _frame_in_lock_code()
    try:
        with interruptible():
            signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)
            t0 = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                queue.SimpleQueue().get(timeout=10)
            assert time.monotonic() - t0 < 5
    finally:
        done.set()
