"""Page-locking of process workers' shared-memory segments for the registered hand-off: the
registry that registers each segment once (``cudaHostRegister``) as `Loader.watch_block_memory`
announces it and unregisters it before it is unmapped, and the counters of that hand-off.
"""

from __future__ import annotations

import bisect
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Protocol

import torch

__all__ = ["HandoffStats", "HostRegistry", "Register", "Unregister", "cuda_registrar"]

Register = Callable[[int, int], bool]  # (address, nbytes) -> registered?
Unregister = Callable[[int], None]


class HandoffStats(dict[str, int]):
    """Counters of the hand-off (a dict of ints, so it prints and serialises as one).

    - ``batches``: batches handed over by the registered hand-off;
    - ``direct_batches``: of them, those whose every array was a view of a registered block
      (no host copy at all);
    - ``stitched_batches``: batches with a column outside every registered segment (a batch cut
      across two blocks is stitched into fresh memory by the merger): those columns are copied;
    - ``unregistered_batches``: batches in a block whose segment could not be registered
      (``registration_failures``): copied like stitched ones;
    - ``rebased_offsets``: offset arrays of variable-length columns copied (the merger rebases
      them to start at 0, so they are fresh memory too);
    - ``copied_arrays`` / ``copied_bytes``: every host copy of the two kinds above (into one pinned
      staging buffer per batch);
    - ``block_copies`` / ``block_bytes``: host-to-device copies of whole blocks straight from
      their registered segments;
    - ``strided_groups``: ``stack`` groups made as one strided view of a block (their columns lie
      evenly spaced in it) rather than a stack of per-column views;
    - ``registrations`` / ``unregistrations`` / ``registration_failures`` / ``registered_now``:
      the registry's bookkeeping (a failed registration leaves that segment to the copy path).
    """

    KEYS = ("batches", "direct_batches", "stitched_batches", "unregistered_batches", "rebased_offsets", "copied_arrays",
            "copied_bytes", "block_copies", "block_bytes", "strided_groups", "registrations", "unregistrations",
            "registration_failures", "registered_now")

    def __init__(self) -> None:
        super().__init__({k: 0 for k in self.KEYS})


class Drains(Protocol):
    """What the registry needs of a hand-off copying from its buffers."""

    def drain(self) -> None: ...


class HostRegistry:
    """The listener pair given to `Loader.watch_block_memory`: registers each buffer once.

    ``added(address, nbytes)`` registers a buffer not registered yet (the same buffer announced
    again is not registered twice); one announced at an address that is registered with another
    size (a segment that grew, remapped where the old one was) is unregistered first, then
    registered again. ``removed`` unregisters, and comes before the buffer is unmapped (the
    watch's contract). ``before_unregister`` runs first: it waits for the copies that may still
    read registered memory. A registration that fails is counted and the buffer stays unregistered,
    so batches in it take the copy path. Safe from any thread.
    """

    def __init__(self, register: Register, unregister: Unregister, stats: HandoffStats,
                 before_unregister: Callable[[], None] | None = None) -> None:
        self._register = register
        self._unregister = unregister
        self._before = before_unregister
        self.stats = stats
        #: The hand-offs copying from these buffers (one per iteration): their copies in flight
        #: are waited for before any buffer is unregistered.
        self.handoffs: weakref.WeakSet[Drains] = weakref.WeakSet()
        self._lock = threading.RLock()  # a removal may come from a collection inside another call
        self._live: dict[int, int] = {}
        self._starts: list[int] = []  # sorted addresses of _live, for find()

    def added(self, address: int, nbytes: int) -> None:
        with self._lock:
            old = self._live.get(address)
            if old == nbytes:
                return  # once per segment
            if old is not None:
                self._drop(address)
            if self._register(address, nbytes):
                self._live[address] = nbytes
                bisect.insort(self._starts, address)
                self.stats["registrations"] += 1
            else:
                self.stats["registration_failures"] += 1
            self.stats["registered_now"] = len(self._live)

    def removed(self, address: int, nbytes: int) -> None:
        with self._lock:
            if address in self._live:
                self._drop(address)
            self.stats["registered_now"] = len(self._live)

    def _drop(self, address: int) -> None:
        for handoff in list(self.handoffs):
            handoff.drain()
        if self._before is not None:
            self._before()
        del self._live[address]
        self._starts.pop(bisect.bisect_left(self._starts, address))
        self._unregister(address)
        self.stats["unregistrations"] += 1

    def find(self, ptr: int, nbytes: int) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` lies inside one registered buffer."""
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i < 0:
                return False
            start = self._starts[i]
            return ptr + nbytes <= start + self._live[start]

    def close(self) -> None:
        """Unregister what is left (the loader withdraws its buffers when it closes; this is for
        the ones it could not, e.g. listeners dropped after an error)."""
        with self._lock:
            for address in list(self._live):
                self._drop(address)
            self.stats["registered_now"] = 0

    @property
    def live(self) -> dict[int, int]:
        with self._lock:
            return dict(self._live)


def cuda_registrar(device: torch.device) -> tuple[Register, Unregister] | None:
    """``cudaHostRegister`` / ``cudaHostUnregister`` through torch's cudart bindings (which clear
    the error a failed call leaves, and release the GIL while pinning), or None without them."""
    try:
        cudart = torch.cuda.cudart()
        success = cudart.cudaError.success
    except Exception:  # noqa: BLE001 - no CUDA runtime bindings: no registered hand-off
        return None

    def register(address: int, nbytes: int) -> bool:
        with torch.cuda.device(device):
            return bool(cudart.cudaHostRegister(address, nbytes, 0) == success)

    def unregister(address: int) -> None:
        with torch.cuda.device(device):
            err = cudart.cudaHostUnregister(address)
        if err != success:
            warnings.warn(f"cudaHostUnregister failed: {cudart.cudaGetErrorString(err)}", RuntimeWarning,
                          stacklevel=2)

    return register, unregister
