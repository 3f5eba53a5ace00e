"""Windows shared by workers (the mixed order with more than one worker).

A mixed-order task's blocks all draw from the task's whole window (up to ``mix_window`` row
groups). With one worker building every block of a task, a small dataset (one task per
partition) kept one worker busy and the others idle, and each worker held its window on the
heap. Instead, when a partition has fewer tasks than there are workers, or a cache of no limit is given
(`Loader._shares_windows`; else each worker builds whole tasks of its own), every
worker builds the blocks ``k`` with ``k mod W`` its own (as the windowed order deals them)
and the window lives in row-group cache entries: the user's cache, or a
scratch cache of the pool's when there is none. Each row group is converted once: the workers
that need a task's window claim its row groups one by one (an ``O_EXCL`` file per pass and
row group), convert the ones they claimed into the cache, and map the others' entries when
they are written. Who builds what never changes the bytes: the plan fixes every block.

Claim files live in ``share_dir``: ``<pass>-<file>-<row group>`` while its claimer converts
the row group, renamed to ``...done`` after (written to the cache or not: a full cache writes
nothing, and a waiter then converts the row group itself). A worker never waits on a row
group nobody claimed, and a wait is bounded (`WAIT_LIMIT`); the merger removes a task's claims
(and, for the scratch cache, its entries) once it took the task's last block, and a stopped
pass's claims when it stops.

Thread workers share the converted columns themselves (`MemoryShare`): no cache write, no copy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .shm import SHM_DIR

__all__ = ["MAPPED", "SPILLED", "WAIT_LIMIT", "MemoryShare", "claim", "claim_names", "file_tag", "finish", "finished",
           "make_share_dir", "remove_claims", "remove_share_dir", "share_root", "sweep_share_dirs", "wait_done",
           "wait_for", "withdraw"]

#: Longest wait for a row group another worker claimed: then this worker converts it too (same
#: bytes). Only a claimer that stopped without finishing (a cancelled pass) makes it matter.
WAIT_LIMIT = 30.0
_PREFIX = "detload-mix-"


#: The claims' kind of row groups converted into a shared spill file (`SPILLED`) or a shared
#: mapped pack (`MAPPED`, _engine/mapped.py), apart from those converted into cache entries
#: (""): a worker that could not open the file (a full disk or /dev/shm) holds the window
#: another way, and must never take a claim of another kind as done. Their tags name the
#: task too (`file_tag`).
SPILLED = ".s"
MAPPED = ".m"


def file_tag(kind: str, partition: int, number: int) -> str:
    """The claims' tag of row groups converted into task ``(partition, number)``'s shared file
    of ``kind`` (`SPILLED`, `MAPPED`). A file is the task's, so a claim of it is: a row group
    cut by a partition boundary is a piece of two tasks' windows in one pass, and a worker
    that found it claimed for the other task's file took rows from its own task's file that
    nobody wrote (wrong rows, process workers sharing windows of a plan of more partitions
    than ranks). A cache entry is the row group's, whichever task reads it: its claims are
    untagged."""
    return f"{kind}{partition}.{number}"


def claim_names(gen: int, file: int, rg: int, tag: str = "") -> tuple[str, str]:
    """A row group's claim file and its finished form, for pass ``gen``."""
    name = f"{gen}-{file}-{rg}{tag}"
    return name, name + ".done"


def claim(share_dir: str, gen: int, file: int, rg: int, tag: str = "") -> bool:
    """Claim the conversion of a row group for pass ``gen``: True if this worker got it (not if
    another worker claims it, or converted it already)."""
    name, done = claim_names(gen, file, rg, tag)
    path = os.path.join(share_dir, name)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return True  # no claim possible (the folder is gone): convert it, as without sharing
    # A finished claim was renamed, which frees its name: without this look a worker reaching
    # the row group after its claimer finished converted it again (the rename is atomic, so
    # a claim made after it sees the finished name).
    if os.path.exists(os.path.join(share_dir, done)):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return False
    return True


def finish(share_dir: str, gen: int, file: int, rg: int, tag: str = "") -> None:
    """Say the claimed row group is done (its entry written, or not writable)."""
    name, done = claim_names(gen, file, rg, tag)
    with contextlib.suppress(OSError):
        os.rename(os.path.join(share_dir, name), os.path.join(share_dir, done))


def withdraw(share_dir: str, gen: int, file: int, rg: int, tag: str) -> None:
    """Take back a claim whose conversion failed, of a row group converted into a shared file:
    a finished claim says its rows are in the file, so a waiter would read rows never written.
    Withdrawn, it is a row group nobody claimed, which a waiter converts itself."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(share_dir, claim_names(gen, file, rg, tag)[0]))


def finished(share_dir: str, gen: int, file: int, rg: int) -> bool:
    """Whether a worker converted the row group in pass ``gen`` (its claim is finished)."""
    return os.path.exists(os.path.join(share_dir, claim_names(gen, file, rg)[1]))


def _poll(look: Callable[[], bool | None], stale: Callable[[], bool], limit: float) -> bool:
    """``look()`` until it answers True or False (None: not yet); False once the pass is stale
    or the wait passed ``limit`` seconds."""
    deadline = time.monotonic() + limit
    pause = 0.0005
    while True:
        seen = look()
        if seen is not None:
            return seen
        if stale() or time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def wait_for(share_dir: str, gen: int, file: int, rg: int, entry: str, stale: Callable[[], bool],
             limit: float = WAIT_LIMIT) -> bool:
    """Wait until ``entry`` (the row group's cache entry) exists: True if it does, False if this
    worker should convert the row group itself (nobody converts it, it was not written, the
    wait passed ``limit`` or the pass is stale)."""
    name, done = claim_names(gen, file, rg)
    claimed, finished = os.path.join(share_dir, name), os.path.join(share_dir, done)

    def look() -> bool | None:
        if os.path.exists(entry):
            return True
        if os.path.exists(finished) or not os.path.exists(claimed):
            # Finished without an entry, or never claimed (or claimed and removed with its
            # task): a last look, since the entry may have landed between the two checks.
            return os.path.exists(entry)
        return None

    return _poll(look, stale, limit)


def wait_done(share_dir: str, gen: int, file: int, rg: int, stale: Callable[[], bool], tag: str,
              limit: float = WAIT_LIMIT) -> bool:
    """Wait until the row group's claim of kind ``tag`` (`SPILLED`, `MAPPED`) is finished (its
    rows are in the shared file): True if it is, False if this worker should convert it itself (nobody claimed it, the
    claim went with its task, the wait passed ``limit`` or the pass is stale)."""
    name, done = claim_names(gen, file, rg, tag)
    claimed, finished = os.path.join(share_dir, name), os.path.join(share_dir, done)

    def look() -> bool | None:
        if os.path.exists(finished):
            return True
        if not os.path.exists(claimed):
            return os.path.exists(finished)  # finished between the two checks, or never claimed
        return None

    return _poll(look, stale, limit)


def remove_claims(share_dir: str, gen: int, pieces: Iterable[tuple[int, int]] | None,
                  entries: Iterable[str] = (), task: tuple[int, int] = (0, 0)) -> None:
    """The merger, after the last block of ``task`` (partition, number): its claims (``pieces``
    None: every claim of pass ``gen``, which was stopped), and the files given (scratch
    entries, shared files)."""
    if pieces is None:
        names: list[str] = []
        with contextlib.suppress(OSError):
            names = [e.name for e in os.scandir(share_dir) if e.name.startswith(f"{gen}-")]
    else:
        tags = ("", file_tag(SPILLED, *task), file_tag(MAPPED, *task))
        names = [name for f, rg in pieces for tag in tags for name in claim_names(gen, f, rg, tag)]
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(share_dir, name))
    for path in entries:
        with contextlib.suppress(OSError):
            os.unlink(path)


def make_share_dir(root: str | None = None) -> str:
    """A new folder for one pool's claims (and scratch cache) in ``root`` (default
    `share_root`), or for its shared spill files in a spill folder; leftovers of processes
    that died without removing theirs are removed first."""
    root = share_root() if root is None else root
    sweep_share_dirs(root)
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=root)


def share_root() -> str:
    """Where share folders go: /dev/shm when it is there (a window is memory either way, and
    tmpfs writes cost no journal), else the temporary directory."""
    return SHM_DIR if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) else tempfile.gettempdir()


def remove_share_dir(base: str) -> None:
    shutil.rmtree(base, ignore_errors=True)


def sweep_share_dirs(root: str | None = None) -> None:
    """Remove the share folders of processes that no longer run (a loader killed with SIGKILL)."""
    tmp = share_root() if root is None else root
    with contextlib.suppress(OSError):
        for e in os.scandir(tmp):
            if not e.name.startswith(_PREFIX):
                continue
            pid_text = e.name[len(_PREFIX):].split("-", 1)[0]
            if not pid_text.isdigit():
                continue
            try:
                os.kill(int(pid_text), 0)
            except ProcessLookupError:
                shutil.rmtree(e.path, ignore_errors=True)
            except OSError:
                pass


class _Item:
    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None


class MemoryShare:
    """Thread workers' shared windows: a converted row group is handed to the other threads
    as it is (no copy), under the same claim protocol as the process workers' files; with the
    window's pack (`pack`), which the claimer copied it into, and the others take it from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[int, int, int], _Item] = {}
        self._stopped: set[int] = set()  # passes dropped whole: nothing of theirs is kept again
        # Window packs (_engine/block.py) by (pass, the task's pieces): one for all workers.
        self._packs: dict[tuple[int, Any], Any] = {}

    def pack(self, gen: int, pieces: Any, make: Callable[[], Any]) -> Any:
        """The window pack of pass ``gen``'s task of ``pieces``: the first worker to ask makes it
        (a stopped pass's worker gets one of its own, kept nowhere)."""
        with self._lock:
            if gen in self._stopped:
                return make()
            got = self._packs.get((gen, pieces))
            if got is None:
                got = self._packs[(gen, pieces)] = make()
            return got

    def claim(self, gen: int, file: int, rg: int) -> bool:
        """Claim a row group's conversion for pass ``gen``: True if this worker got it (a
        stopped pass's worker gets nothing to hand over: it converts for itself)."""
        with self._lock:
            if (gen, file, rg) in self._items or gen in self._stopped:
                return False
            self._items[(gen, file, rg)] = _Item()
            return True

    def publish(self, gen: int, file: int, rg: int, cols: Any) -> None:
        """The claimed row group's columns (None: not converted, a waiter converts it itself)."""
        item = self._items.get((gen, file, rg))
        if item is not None:
            item.value = cols
            item.event.set()

    def fetch(self, gen: int, file: int, rg: int, stale: Callable[[], bool], limit: float = WAIT_LIMIT) -> Any:
        """The row group's columns once its claimer published them; None if this worker should
        convert it itself (nobody claimed it, the claimer failed, the wait passed ``limit`` or
        the pass is stale)."""
        item = self._items.get((gen, file, rg))
        if item is None:
            return None
        deadline = time.monotonic() + limit
        while not item.event.wait(0.05):
            if stale() or time.monotonic() > deadline:
                return None
        return item.value

    def drop(self, gen: int, pieces: Iterable[tuple[int, int]] | None = None) -> None:
        """Forget a task's row groups (the merger, after its last block), or every row group of
        pass ``gen`` (``pieces`` None: the pass was stopped)."""
        with self._lock:
            if pieces is None:
                self._stopped.add(gen)
                for key in [k for k in self._items if k[0] == gen]:
                    del self._items[key]
                for pk in [k for k in self._packs if k[0] == gen]:
                    del self._packs[pk]
            else:
                for f, rg in pieces:
                    self._items.pop((gen, f, rg), None)
                done = set(pieces)
                for pk in [k for k in self._packs if k[0] == gen and {(f, rg) for f, rg, _, _ in k[1]} <= done]:
                    del self._packs[pk]
