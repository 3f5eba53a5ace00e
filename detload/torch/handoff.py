"""The registered hand-off of `TorchLoader`: process workers' shared-memory segments registered once
as pinned host memory, and each block they carry copied to the device with one asynchronous copy.

With ``device="cuda"`` and process workers, the training process used to copy every batch into a
pinned buffer (NumPy copies under the GIL) before its host-to-device copy. Here the segments
themselves are page-locked (``cudaHostRegister``, through `Loader.watch_block_memory`): a block
goes to the device as it lies in its segment, in one copy, and each batch cut from it is a set of
views of that device copy. What still is a host copy, and counted: a batch stitched across two
blocks (fresh memory, outside every segment) and the rebased offsets of variable-length columns.

Imported by detload.torch only (needs torch).
"""

from __future__ import annotations

import bisect
import collections
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ._types import Column, Ragged

__all__ = ["HandoffStats", "HostRegistry", "RegisteredHandoff", "cuda_registrar"]

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
        self.handoffs: weakref.WeakSet[RegisteredHandoff] = weakref.WeakSet()
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


def _ptr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _is_block_view(a: np.ndarray) -> bool:
    """Whether ``a`` is a view of a block buffer (a 1-D uint8 array), not fresh memory."""
    base = a.base
    return isinstance(base, np.ndarray) and base.dtype == np.uint8 and base.ndim == 1


def _host_tensor(a: np.ndarray) -> torch.Tensor:
    if not a.flags.writeable:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read only here; torch warns of writes
            return torch.from_numpy(a)
    return torch.from_numpy(a)


class _Block:
    """A registered block and its device copy, with the copy viewed as each dtype."""

    __slots__ = ("host", "ptr", "nbytes", "dev", "typed")

    def __init__(self, host: np.ndarray, dev: torch.Tensor) -> None:
        self.host = host
        self.ptr = _ptr(host)
        self.nbytes = host.nbytes
        self.dev = dev
        self.typed: dict[torch.dtype, torch.Tensor] = {}

    def view(self, a: np.ndarray, dt: np.dtype, tdt: torch.dtype) -> torch.Tensor:
        off = _ptr(a) - self.ptr
        whole = self.typed.get(tdt)
        size = dt.itemsize
        if whole is None:
            whole = self.typed[tdt] = self.dev[: self.nbytes - self.nbytes % size].view(tdt)
        if off % size:  # not aligned for a typed view of the whole block: slice the bytes instead
            return self.dev[off : off + a.nbytes].view(tdt).view(a.shape).data
        strides = (1,) if a.ndim == 1 else tuple(s // size for s in a.strides)
        # .data: a tensor of its own for autograd (views of one base share a version counter).
        return whole.as_strided(a.shape, strides, off // size).data


class RegisteredHandoff:
    """Turns batches whose arrays are views of registered blocks into device tensors.

    ``to_device(host_uint8_tensor)`` starts the copy of one buffer (asynchronous on CUDA, issued
    on the caller's current stream); ``new_event()`` records an event on that stream (None on the
    CPU, where copies are synchronous). The first batch of a block copies the whole block; every
    batch of it is then views of that copy. The host block is kept until its copy has finished
    (its segment then goes back to its worker), and `drain` waits for every copy in flight.
    """

    def __init__(self, registry: HostRegistry, to_device: Callable[[torch.Tensor], torch.Tensor],
                 new_event: Callable[[], Any], stack: Sequence[tuple[str, tuple[str, ...]]],
                 host_dtype: Callable[[str, np.ndarray], np.dtype], torch_dtype: Callable[[np.dtype], torch.dtype],
                 pin: bool, stats: HandoffStats, in_flight: int = 4) -> None:
        self.registry = registry
        self.to_device = to_device
        self.new_event = new_event
        self.stack = tuple(stack)
        self.stacked = {c for _, cols in self.stack for c in cols}
        self._group_of = {c: g for g, cols in self.stack for c in cols}
        self.host_dtype = host_dtype
        self.torch_dtype = torch_dtype
        self.pin = pin
        self.stats = stats
        self.in_flight = in_flight
        self._block: _Block | None = None
        self._event: Any = None  # the last event recorded: covers every copy issued so far
        self._lock = threading.RLock()
        self._pending: collections.deque[tuple[Any, np.ndarray]] = collections.deque()
        from .torch import RaggedTensor  # detload.torch imports this module: not at the top

        self._ragged = RaggedTensor

    # -- host blocks kept while their copies run -------------------------------------------
    def _release_done(self) -> None:
        pending = self._pending
        while pending and (pending[0][0] is None or pending[0][0].query()):
            pending.popleft()
        while len(pending) > self.in_flight:
            event, _ = pending.popleft()
            event.synchronize()

    def drain(self) -> None:
        """Wait for every copy that may still read host memory, then let its blocks go."""
        with self._lock:
            while self._pending:
                event, _ = self._pending.popleft()
                if event is not None:
                    event.synchronize()

    # -- one batch --------------------------------------------------------------------------
    def _block_of(self, a: np.ndarray) -> _Block | None:
        """The registered block ``a`` is a view of (copied to the device at its first batch)."""
        base = a.base
        blk = self._block
        if blk is not None and base is blk.host:
            return blk
        if not (isinstance(base, np.ndarray) and base.dtype == np.uint8 and base.ndim == 1
                and base.flags.c_contiguous):
            return None
        p, bp = _ptr(a), _ptr(base)
        if not (bp <= p and p + a.nbytes <= bp + base.nbytes) or not self.registry.find(bp, base.nbytes):
            return None
        dev = self.to_device(_host_tensor(base))
        event = self.new_event()
        self._event = event
        with self._lock:
            self._pending.append((event, base))
        self.stats["block_copies"] += 1
        self.stats["block_bytes"] += base.nbytes
        blk = self._block = _Block(base, dev)
        return blk

    def convert(self, batch: Mapping[str, Column]) -> tuple[dict[str, Any], Any, tuple[torch.Tensor, ...]]:
        """(tensors, the event they are ready after, the device buffers they lie in)."""
        RaggedTensor = self._ragged
        with self._lock:
            self._release_done()
        issued = False  # an operation this batch needs, beyond a block copy (which records its own event)
        bases: list[torch.Tensor] = []
        grouped = self._strided_groups(batch) if self.stack else {}
        arrays: list[tuple[str, str | None, np.ndarray, bool]] = []  # (name, ragged kind, array, is offsets)
        for name, col in batch.items():
            if name in self.stacked and self._group_of[name] in grouped:
                continue  # its group is one strided view of the block (below)
            if isinstance(col, Ragged):
                arrays.append((name, col.kind, col.values, False))
                arrays.append((name, col.kind, col.offsets, True))
            else:
                arrays.append((name, None, col, False))
        placed: list[torch.Tensor | None] = []
        fresh: list[int] = []
        stitched = unregistered = False
        for i, (name, _, a, is_offsets) in enumerate(arrays):
            blk = self._block_of(a) if a.nbytes and a.flags.c_contiguous else None
            if blk is None:
                placed.append(None)
                fresh.append(i)
                if is_offsets:
                    self.stats["rebased_offsets"] += 1
                elif _is_block_view(a):
                    unregistered = True  # in a block whose segment is not registered (it failed)
                else:
                    stitched = True
                continue
            if not any(b is blk.dev for b in bases):
                bases.append(blk.dev)
            dt = self.host_dtype(name, a)
            placed.append(blk.view(a, dt, self.torch_dtype(dt)))
        if fresh:
            slab, views = self._copy_fresh([(arrays[i][0], arrays[i][2]) for i in fresh])
            for i, v in zip(fresh, views, strict=True):
                placed[i] = v
            bases.append(slab)
            issued = True
        out: dict[str, Any] = {}
        pending: dict[str, torch.Tensor] = {}
        for (name, kind, _, _), t in zip(arrays, placed, strict=True):
            assert t is not None
            if kind is None:
                out[name] = t
            elif name in pending:
                out[name] = RaggedTensor(pending.pop(name), t, kind)
            else:
                pending[name] = t
        if self.stack:
            ordered = {k: v for k, v in out.items() if k not in self.stacked}
            for group, cols in self.stack:
                # One kernel on the device, on the copy's stream: a copy of the group's strided view
                # of the block, or a stack of its columns' views where they are not evenly spaced.
                view = grouped.get(group)
                t = view.contiguous() if view is not None else torch.stack([out[c] for c in cols], dim=1)
                ordered[group] = t
                bases.append(t)
                if view is not None and not any(b is view for b in bases):
                    bases.append(view)
            out = ordered
            issued = True
        if issued:
            self._event = self.new_event()
        self.stats["batches"] += 1
        if stitched:
            self.stats["stitched_batches"] += 1
        elif unregistered:
            self.stats["unregistered_batches"] += 1
        elif not fresh:
            self.stats["direct_batches"] += 1
        return out, self._event, tuple(bases)

    def _strided_groups(self, batch: Mapping[str, Column]) -> dict[str, torch.Tensor]:
        """Each ``stack`` group whose columns lie in one registered block, one after the other at
        a constant distance (a block stores column after column): the group as one ``(rows, k)``
        strided view of the block's device copy, so the training process makes one view and one
        copy kernel instead of ``k`` views and a stack."""
        out: dict[str, torch.Tensor] = {}
        for group, cols in self.stack:
            arrays = [batch[c] for c in cols]
            first = arrays[0]
            if not isinstance(first, np.ndarray) or first.ndim != 1 or not first.flags.c_contiguous:
                continue
            blk = self._block_of(first)
            if blk is None:
                continue
            dt = self.host_dtype(cols[0], first)
            size = dt.itemsize
            p0 = _ptr(first)
            second = arrays[1] if len(arrays) > 1 else first
            if not isinstance(second, np.ndarray):
                continue
            step = _ptr(second) - p0 if len(arrays) > 1 else size
            n = first.shape[0]
            ok = len(arrays) == 1 or (step % size == 0 and step >= n * size)  # torch strides are >= 0
            for j, a in enumerate(arrays):
                if not ok:
                    break
                # Same block (by its array), same dtype, same rows, in place in the progression.
                ok = (isinstance(a, np.ndarray) and a.base is blk.host and a.dtype == first.dtype
                      and a.shape == first.shape and a.strides == first.strides and _ptr(a) == p0 + j * step)
            if not ok or (p0 - blk.ptr) % size:
                continue
            tdt = self.torch_dtype(dt)
            whole = blk.typed.get(tdt)
            if whole is None:
                whole = blk.typed[tdt] = blk.dev[: blk.nbytes - blk.nbytes % size].view(tdt)
            out[group] = whole.as_strided((n, len(arrays)), (1, step // size), (p0 - blk.ptr) // size)
            self.stats["strided_groups"] += 1
        return out

    def _copy_fresh(self, arrays: list[tuple[str, np.ndarray]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(name, array) pairs outside every registered block, copied into one pinned buffer and
        sent in one copy."""
        align = 256
        layout = []
        total = 0
        for name, a in arrays:
            dt = self.host_dtype(name, a)
            layout.append((total, dt))
            total += -(-max(a.nbytes, 1) // align) * align
        host = torch.empty(max(total, align), dtype=torch.uint8, pin_memory=self.pin)
        buf = host.numpy()
        for (off, dt), (_, a) in zip(layout, arrays, strict=True):
            np.copyto(buf[off : off + a.nbytes].view(dt).reshape(a.shape), a.view(dt), casting="no")
            self.stats["copied_arrays"] += 1
            self.stats["copied_bytes"] += a.nbytes
        dev = self.to_device(host)
        views = [dev[off : off + a.nbytes].view(self.torch_dtype(dt)).view(a.shape).data
                 for (off, dt), (_, a) in zip(layout, arrays, strict=True)]
        return dev, views
