"""Ctrl-C and SIGTERM inside the commands: `interruptible` turns both into exceptions in the main
thread (SIGTERM as `Terminated`), so that every ``with Loader`` and layout run inside cleans up
before the command reports. Shared by detload.cli and the layout commands (detload/_layout/cli.py).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Terminated", "hold_signals", "interruptible"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt, so that the same
    clean-up runs (every ``with Loader`` closes); main() then exits 143 instead of 130."""


def _interrupt(signum: int, frame: Any) -> None:
    # The first signal decides: a second one must not cut short the clean-up it starts.
    hold_signals()
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


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
