"""Starting worker processes: forkserver (spawn where it does not exist), never fork.

Two things multiprocessing does by default do not suit a loader:

- **The main module.** Every child gets the parent's "preparation data", which
  names the main module, and imports it as ``__mp_main__`` before anything
  else: a script read from stdin then fails (``FileNotFoundError: '<stdin>'``),
  and a script without the ``if __name__ == "__main__":`` guard starts its
  training again in every worker. Our workers need nothing from it unless the
  configuration they get refers to a class or function defined there (an fsspec
  filesystem class written in the script, say), so it is left out of their
  preparation data (`starting`). When the configuration does refer to it, the
  worker imports it itself (`import_main`), where a failure becomes one
  `WorkerError` saying why; a main module that cannot be imported at all (stdin,
  ``python -c``, a notebook) is refused before any process starts.
- **Ctrl-C.** It reaches the whole process group, and a child that gets it
  before it ignored SIGINT prints a ``KeyboardInterrupt`` traceback (the
  forkserver while it imports pyarrow, a worker while it starts). SIGINT is
  blocked in the thread that starts them, so they inherit it blocked, and a
  worker ignores it before it unblocks it.

`SharedInts` holds what the pool and its worker processes both read: the
oldest wanted pass number (see passes.py) and, per worker, its status and the number of blocks it sent
(`worker_slots`).
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing as mp
import os
import pickle
import signal
import struct
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from .._mainmod import MainSource, main_references, main_source, unimportable_main
from ..errors import DetloadError, OptionError

__all__ = ["SLOTS_PER_WORKER", "MainReentered", "MainSource", "SharedInts", "Slot", "Window",
           "check_for_processes", "check_not_importing_main", "context", "ignore_sigint", "import_main", "main_references", "main_source",
           "starting", "unimportable_main", "worker_slots"]

_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")


def context() -> Any:
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        # Each worker then forks from a server that already imported pyarrow.
        ctx.set_forkserver_preload(["detload._engine.worker", "detload._engine.pool"])
    return ctx


# -- the main module -------------------------------------------------------------

class MainReentered(DetloadError):
    """A worker process importing the main module was told to start a pool: the script has no guard."""


_importing_main = False


def import_main(source: MainSource) -> None:
    """In a worker process: import the main module as multiprocessing would, as ``__mp_main__``."""
    global _importing_main
    from multiprocessing import process, spawn

    me: Any = process.current_process()
    _importing_main = True
    me._inheriting = True  # multiprocessing's own check refuses to start processes meanwhile, too
    try:
        spawn.prepare({source[0]: source[1]})
    finally:
        _importing_main = False
        with contextlib.suppress(AttributeError):
            del me._inheriting


def check_not_importing_main() -> None:
    """Refuse to start a pool inside `import_main`: the main module has no guard."""
    if _importing_main:
        raise MainReentered(
            "the main module creates and iterates a Loader when it is imported: put that code under "
            "`if __name__ == \"__main__\":`")


# -- starting --------------------------------------------------------------------

_local = threading.local()
_filter_lock = threading.Lock()
_filter_installed = False


def _install_filter() -> None:
    """Wrap multiprocessing's preparation data, once: in a thread inside `starting` it names no
    main module; anywhere else (other code of the program starting processes) it is unchanged."""
    global _filter_installed
    with _filter_lock:
        if _filter_installed:
            return
        from multiprocessing import spawn

        original = spawn.get_preparation_data

        def get_preparation_data(name: str) -> dict[str, Any]:
            data = original(name)
            if getattr(_local, "without_main", False):
                for key in _MAIN_KEYS:
                    data.pop(key, None)
            return data

        spawn.get_preparation_data = get_preparation_data
        _filter_installed = True


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """Around starting worker processes (and the forkserver, the first time): they are
    told nothing of the main module, and inherit SIGINT blocked."""
    check_not_importing_main()
    _install_filter()
    # The resource tracker first, on its own: starting it unblocks SIGINT in this thread.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
    _local.without_main = True
    try:
        yield
    finally:
        _local.without_main = False
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_sigint() -> None:
    """In a worker process, first thing: Ctrl-C is the consumer's to handle. Ignored, then
    unblocked (it came blocked from `starting`), so one that is pending is dropped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


# -- shared counters ---------------------------------------------------------------

_Q = struct.Struct("<q")


def _nameless_file(directory: str) -> int:
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError):  # no O_TMPFILE here: a name, removed at once
        fd, path = tempfile.mkstemp(prefix="detload-ctl-", dir=directory)
        os.unlink(path)
        return fd


#: Per worker: generation, block, file, row group of its status (see _worker.Status), blocks sent.
SLOTS_PER_WORKER = 5


def worker_slots(ints: SharedInts, worker: int) -> tuple[Window, Slot]:
    """Worker ``worker``'s status slots and its count of blocks sent (slot 0 is the oldest wanted pass number)."""
    base = 1 + SLOTS_PER_WORKER * worker
    # A worker that has not started (or never gets work) is idle, not "on file 0, row group 0".
    for i in (1, 2, 3):
        ints[base + i] = -1
    return Window(ints, base), Slot(ints, base + 4)


def _attach(n: int, fd: Any) -> SharedInts:
    return SharedInts(n, fd=fd.detach())


class SharedInts:
    """``n`` signed 64-bit integers shared by the pool and its worker processes.

    They live in a file without a name (so nothing is left to sweep, whoever dies),
    mapped by every process; a worker gets the file's descriptor while it is started
    (`release_fd` closes the pool's afterwards). After `close` the values stay
    readable and writable here, so the status of a dead worker can still be read.
    Aligned 8-byte loads and stores are atomic on every platform we run on.
    """

    def __init__(self, n: int, *, directory: str | None = None, fd: int | None = None) -> None:
        self.n = n
        size = max(8 * n, 8)
        own = fd is None
        if fd is None:
            fd = _nameless_file(directory or tempfile.gettempdir())
        try:
            if own:
                os.ftruncate(fd, size)
            self._mm: mmap.mmap | None = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd if own else None  # a worker's descriptor is closed: its mapping holds the file
        if not own:
            os.close(fd)
        self._values = [0] * n

    def __getitem__(self, i: int) -> int:
        mm = self._mm
        if mm is not None:
            try:
                return int(_Q.unpack_from(mm, 8 * i)[0])
            except ValueError:  # closed meanwhile (close() copied the values first)
                pass
        return self._values[i]

    def __setitem__(self, i: int, v: int) -> None:
        mm = self._mm
        if mm is not None:
            try:
                _Q.pack_into(mm, 8 * i, v)
                return
            except ValueError:
                pass
        self._values[i] = v

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.reduction import DupFd  # type: ignore[attr-defined]

        if self._fd is None:
            raise TypeError("SharedInts can only be sent to a worker process while it is started")
        return (_attach, (self.n, DupFd(self._fd)))

    def release_fd(self) -> None:
        """After the workers started: the mapping alone keeps the memory."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.release_fd()
        mm = self._mm
        if mm is None:
            return
        self._values = [self[i] for i in range(self.n)]
        self._mm = None
        mm.close()


class Slot:
    """One of `SharedInts` as an object with a ``value`` (like ``multiprocessing.Value``)."""

    __slots__ = ("_i", "_ints")

    def __init__(self, ints: SharedInts, i: int) -> None:
        self._ints = ints
        self._i = i

    @property
    def value(self) -> int:
        return self._ints[self._i]

    @value.setter
    def value(self, v: int) -> None:
        self._ints[self._i] = v


class Window:
    """``n`` consecutive `SharedInts` from ``base`` on, indexed from 0 (a worker's status)."""

    __slots__ = ("_base", "_ints")

    def __init__(self, ints: SharedInts, base: int) -> None:
        self._ints = ints
        self._base = base

    def __getitem__(self, i: int) -> int:
        return self._ints[self._base + i]

    def __setitem__(self, i: int, v: int) -> None:
        self._ints[self._base + i] = v


def check_for_processes(t: Any) -> None:
    """Refuse, before any worker starts, a transform (a `detload.Transform`) that worker processes
    could not receive."""
    try:
        data = pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise OptionError(
            f"pool='process' sends the transform {t.name!r} to every worker process, and it cannot be pickled "
            f"({type(exc).__name__}: {exc}). Define its function at the top level of a module (not a lambda, "
            "not inside another function) and import it from there, or use pool='thread'") from None
    names = main_references(data)
    if names and main_source() is None:
        raise OptionError(
            f"pool='process' must send the transform {t.name!r} to its worker processes, and {', '.join(names)} "
            f"is defined in the main module, which a worker process cannot import: {unimportable_main()}. "
            "Use pool='thread', or move the function into a module file and import it from there "
            "(with cloudpickle installed, detload sends such a function by value instead)")
