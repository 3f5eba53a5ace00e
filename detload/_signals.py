"""Ctrl-C and SIGTERM inside the commands: `interruptible` turns both into exceptions in the main
thread (SIGTERM as `Terminated`), so that every ``with Loader`` and layout run inside cleans up
before the command reports. Shared by detload.cli and the layout commands (detload/_layout/cli.py).
"""

from __future__ import annotations

import _thread
import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Terminated", "deliver", "hold_signals", "interruptible"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt, so that the same
    clean-up runs (every ``with Loader`` closes); main() then exits 143 instead of 130."""


# Source files whose code holds locks in Python: an exception raised there right after a lock
# was taken, before its `with` block was entered (Condition.__enter__, Event.set, Thread.start),
# leaves it taken for good, and the clean-up that follows then waits forever on it.
_HOLDS_LOCKS = frozenset({threading.__file__, queue.__file__})
#: How many times, a millisecond apart, the exception is put off while the main thread is
#: in such code: such moments last microseconds; a longer wait there (a join) is interrupted
#: after this anyway.
_PUT_OFF = 50


def _in_lock_code(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename in _HOLDS_LOCKS:
            return True
        frame = frame.f_back
    return False


def deliver(signum: int, fire: Callable[[], None], frame: Any = None, tries: int = 0) -> None:
    """Call ``fire`` (which raises) in the main thread as a handler of ``signum``, but not while
    the main thread runs code that holds a lock in Python: then a one-shot handler is put in
    place and the signal sent to the main thread again a moment later (up to `_PUT_OFF` times).
    ``frame`` None: not in a handler now (a finalizer's dropped interrupt): always later.

    Sent as a real signal to the main thread (``pthread_kill``), not ``interrupt_main``,
    which only marks it pending: a main thread blocked in a C-level wait (a queue's get
    without timeout) would not run the handler until the wait ended.
    """
    if frame is not None and (tries >= _PUT_OFF or not _in_lock_code(frame)):
        fire()
        return
    signal.signal(signum, lambda s, f: deliver(s, fire, f, tries + 1))
    _thread.start_new_thread(_send, (signum,))


def _send(signum: int) -> None:
    time.sleep(0.001)  # after the handler (or finalizer) that arranged this has returned
    main = threading.main_thread().ident
    if hasattr(signal, "pthread_kill") and main is not None:
        with contextlib.suppress(OSError):  # the process is exiting
            signal.pthread_kill(main, signum)
        return
    _thread.interrupt_main(signal.Signals(signum))


def _interrupt(signum: int, frame: Any) -> None:
    def fire() -> None:
        # The first signal decides: a second one must not cut short the clean-up it starts.
        hold_signals()
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    deliver(signum, fire, frame)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within the block, Ctrl-C raises KeyboardInterrupt and SIGTERM `Terminated` in the main
    thread, so that every ``with Loader`` inside closes (workers stopped, shared memory and
    semaphores freed) before main() reports; further signals are ignored meanwhile.

    Outside such blocks the console script exits at once on either signal (see
    detload/__main__.py): an interrupt raised inside a C extension's import (NumPy's,
    pyarrow's) comes out as an ImportError with a traceback, so the commands import what
    they need before entering the block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, handler)


def hold_signals() -> None:
    """Ignore Ctrl-C and SIGTERM from here on: the outcome is decided, and a second signal
    must not put a traceback on stderr while the process reports and exits."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_IGN)
