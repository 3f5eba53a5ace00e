"""Who is told about block memory: the consumer-side buffers blocks live in.

Blocks reach the consumer in buffers that are reused for many blocks: heap slabs
(thread workers, heap.py) and shared-memory mappings (process workers, shm.py).
A pinned hand-off to a GPU registers each such buffer once with the driver (e.g.
``cudaHostRegister``) and then copies every batch in it without a staging copy;
for that it must hear of each buffer when it appears and before it goes away.
`BufferWatch` carries those two calls; `Loader.watch_block_memory` is the public end.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .._fdless import address_of
from .._signals import deliver

__all__ = ["BufferWatch", "address_of", "finalize", "install_ctrl_c_hook"]

Listener = Callable[[int, int], None]


class finalize(weakref.finalize):
    """``weakref.finalize`` that makes sure the Ctrl-C hook below is in place.

    A block's finalizer runs wherever its last view dies, often in the consumer's
    main thread, and so do the weakref callbacks of the threads a pass starts and
    stops. A SIGINT landing meanwhile raises KeyboardInterrupt inside such a
    callback, at any bytecode of it, and Python reports that as "Exception ignored"
    and drops it: the training loop would go on as if Ctrl-C had never been pressed.
    `install_ctrl_c_hook` raises it again in the main thread instead.
    """

    __slots__ = ()

    def __init__(self, obj: Any, func: Callable[..., Any], /, *args: Any) -> None:
        install_ctrl_c_hook()
        super().__init__(obj, func, *args)


def _redeliver(unraisable: Any, previous: Callable[[Any], Any]) -> None:
    exc = unraisable.exc_value
    if isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
        # The SIGINT handler in place may no longer raise anything: `detload run`'s handler
        # ignores both signals before it raises (the first one decides), so re-raising through
        # it would do nothing and the run would go on with Ctrl-C ignored. A one-shot handler
        # raises the same exception (KeyboardInterrupt, or the command's SIGTERM subclass),
        # outside lock code, and puts the handler that was there back first.
        handler = signal.getsignal(signal.SIGINT)
        kind = type(exc)

        def fire() -> None:
            with contextlib.suppress(OSError, ValueError):  # None: not set from Python
                signal.signal(signal.SIGINT, handler if handler is not None else signal.default_int_handler)
            raise kind

        # Not at once: this runs inside the finalizer, which would drop it again.
        deliver(signal.SIGINT, fire)
        return
    previous(unraisable)


def install_ctrl_c_hook() -> None:
    """Chain a ``sys.unraisablehook`` that raises a dropped KeyboardInterrupt again in the
    main thread; every other unraisable exception goes to the hook that was there before.
    Installed when a pool starts (docs/reliability.md, "Ctrl-C")."""
    current = sys.unraisablehook
    if getattr(current, "_detload", False):
        return

    def hook(unraisable: Any) -> None:
        _redeliver(unraisable, current)

    hook._detload = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


class BufferWatch:
    """The listeners of one pool's block memory and the buffers they were told of.

    ``added(address, nbytes)`` is called once per buffer before any block in it is
    handed to the consumer; ``removed(address, nbytes)`` once before it is freed or
    unmapped. Either may run in any detload thread, or in a garbage collection that
    drops the last view of a block after close(); a listener must not raise (what it
    raises is reported once as a warning and the listener is dropped).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: list[tuple[Listener, Listener]] = []
        self._live: dict[int, int] = {}  # address -> bytes, of the buffers listeners were told of

    def watch(self, added: Listener, removed: Listener) -> None:
        """Add a pair of listeners; they hear at once of every buffer that exists now."""
        with self._lock:
            self._listeners.append((added, removed))
            live = list(self._live.items())
        for address, nbytes in live:
            self._call(added, removed, 0, address, nbytes)

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def added(self, address: int, nbytes: int) -> None:
        with self._lock:
            self._live[address] = nbytes
            listeners = list(self._listeners)
        for pair in listeners:
            self._call(*pair, 0, address, nbytes)

    def removed(self, address: int) -> None:
        with self._lock:
            nbytes = self._live.pop(address, None)
            listeners = list(self._listeners)
        if nbytes is None:
            return
        for pair in listeners:
            self._call(*pair, 1, address, nbytes)

    def clear(self) -> None:
        """The pool closes: every buffer still announced is withdrawn (a batch kept past
        close() still reads its memory; it is only no longer the pool's to reuse)."""
        with self._lock:
            live, self._live = self._live, {}
            listeners = list(self._listeners)
        for address, nbytes in live.items():
            for pair in listeners:
                self._call(*pair, 1, address, nbytes)

    def _call(self, added: Listener, removed: Listener, which: int, address: int, nbytes: int) -> None:
        try:
            (added, removed)[which](address, nbytes)
        except Exception as exc:  # a listener's bug must not break a training run
            import warnings

            with self._lock:
                self._listeners = [p for p in self._listeners if p != (added, removed)]
            warnings.warn(f"a block-memory listener raised {type(exc).__name__}: {exc}; it is no longer called",
                          RuntimeWarning, stacklevel=2)
