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
from collections.abc import Iterator
from typing import Any

__all__ = ["Terminated", "hold_signals", "interruptible"]


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


def _interrupt(signum: int, frame: Any, tries: int = 0) -> None:
    if tries < _PUT_OFF and _in_lock_code(frame):
        # Delivered again from another thread a moment later, once this handler has returned.
        signal.signal(signum, lambda s, f: _interrupt(s, f, tries + 1))
        _thread.start_new_thread(_again, (signum,))
        return
    # The first signal decides: a second one must not cut short the clean-up it starts.
    hold_signals()
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def _again(signum: int) -> None:
    time.sleep(0.001)
    _thread.interrupt_main(signal.Signals(signum))


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
