"""How host batches become the tensors the training loop receives: one `Handoff` interface, one
implementation per copy path, and `Ready`, the message each batch travels in from the feeder thread.

`TorchLoader` picks one per iteration from its options (see its ``_handoff``): `ZeroCopy` (tensors
over the batch's own memory), `PerColumn` (a benchmark hook: each column pinned and copied on its
own), `PinnedSlab` (one pinned buffer and one device copy per batch, or per ``copy_batches``) or
`Registered` (process workers' segments page-locked once; each block copied straight from its segment).
"""

from __future__ import annotations

import collections
import functools
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from .._types import Column, Ragged
from .registry import HandoffStats, HostRegistry
from .tensors import (
    Finish,
    PackedTensors,
    Stack,
    TorchBatch,
    apply,
    collect_ragged,
    each_any,
    host_dtype,
    pack,
    ragged_arrays,
    to_torch,
    torch_dtype,
    unpack_slab,
)

__all__ = ["Handoff", "PerColumn", "PinnedSlab", "Ready", "Registered", "Target", "ZeroCopy"]

HostBatch = Mapping[str, Column]


class Ready(NamedTuple):
    """One batch for the training loop: the message the feeder thread queues (with `End`, `Failed`)."""

    batch: TorchBatch | PackedTensors
    #: The loader's position after this batch: what ``state_dict()`` counts once the loop has it.
    step: int
    #: The CUDA event the batch's tensors are ready after; None where they are ready now.
    event: Any = None
    #: The device memory the batch lies in with other batches (a slab; the registered hand-off's
    #: buffers), waited for once; None where each tensor is its own and is waited for on its own.
    memory: torch.Tensor | tuple[torch.Tensor, ...] | None = None


@dataclass(frozen=True)
class Target:
    """What every hand-off is told: where the tensors go and what a batch becomes."""

    device: torch.device | None  # None: CPU tensors, no thread
    pin: bool  # page-locked host memory (only where an accelerator is there)
    stack: Stack = ()
    #: The loader yields `detload.Packed` batches, which arrive here as `tensors.wire` made them
    #: (or unpacked on the host already).
    grouped: bool = False
    #: A packed batch's tensors -> what the loop receives; None: handed out as they are.
    finish: Finish | None = None
    #: ``finish`` expands group columns into new tensors on the device (``unpack="device"``).
    expands_on_device: bool = False

    @property
    def cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"


def _record(x: torch.Tensor, stream: Any) -> None:
    x.record_stream(stream)


class Handoff(ABC):
    """One copy path. The feeder thread calls `convert` with `per_copy` batches at a time and
    `drain` when it ends; the training thread calls `wait` on each `Ready` before handing its
    batch out, and `forget` when it raises. A fresh one serves each iteration."""

    #: How many batches `convert` takes at once.
    per_copy = 1

    def __init__(self, target: Target) -> None:
        self.target = target
        # The feeder's own stream: its copies overlap the step running on the training stream.
        self.stream = torch.cuda.Stream(target.device) if target.cuda else None

    @abstractmethod
    def convert(self, batches: list[HostBatch], steps: list[int]) -> list[Ready]:
        """Feeder thread: ``batches`` as tensors, in order (``steps[i]``: the position after batch ``i``).
        May empty ``batches`` once it needs them no more, so their block memory goes back."""

    def wait(self, ready: Ready) -> None:
        """Training thread: make ``ready.batch`` safe to use on the current CUDA stream."""
        if ready.event is not None:
            self._wait(ready, torch.cuda.current_stream(self.target.device))

    def _wait(self, ready: Ready, current: Any) -> None:
        current.wait_event(ready.event)
        # The memory was allocated on the side stream; tell the allocator the training stream
        # uses it, so it is not reused too early.
        each_any(ready.batch, functools.partial(_record, stream=current))

    def forget(self) -> None:  # noqa: B027 - optional: only the paths that remember buffers have any
        """Training thread: let go of the buffers `wait` remembers (an error is on its way up)."""

    def drain(self) -> None:  # noqa: B027 - optional: only the registered path copies from worker memory
        """Wait for every copy that may still read host memory."""


class ZeroCopy(Handoff):
    """Tensors over the batch's own memory (``torch.from_numpy``): ``device=None`` in the loop
    itself, or ``device="cpu"`` in the feeder thread with nothing to pin or group. Only ``stack``
    groups are copied, into one buffer of their own."""

    def convert(self, batches: list[HostBatch], steps: list[int]) -> list[Ready]:
        finish = self.target.finish
        out = []
        for batch, step in zip(batches, steps, strict=True):
            t = self._tensors(batch)
            out.append(Ready(t if finish is None else finish(t), step))
        return out

    def _tensors(self, batch: HostBatch) -> TorchBatch:
        stack = self.target.stack
        if not stack:
            return to_torch(batch)
        # Only the groups are copied; the other columns share the batch's memory as usual.
        stacked = {c for _, cols in stack for c in cols}
        out = to_torch({k: v for k, v in batch.items() if k not in stacked})
        slab, layout = pack([{c: batch[c] for c in stacked}], pin=False, stack=stack)
        out.update(unpack_slab(slab, layout[0], {}))
        return out


class PerColumn(Handoff):
    """Each column pinned and copied to the device on its own: the path before the slab, kept
    to measure the slab against it (the ``torch_per_column`` hook). Never with ``stack``."""

    def convert(self, batches: list[HostBatch], steps: list[int]) -> list[Ready]:
        tg = self.target
        dev = tg.device
        (batch,), (step,) = batches, steps
        t = to_torch(batch)
        if tg.pin:
            t = apply(t, lambda x: x.pin_memory())
        if tg.grouped:  # synchronous copies, then the packed structure
            if dev is not None:
                t = apply(t, lambda x: x.to(dev))
            return [Ready(t if tg.finish is None else tg.finish(t), step)]
        event = None
        if tg.cuda:
            with torch.cuda.device(dev), torch.cuda.stream(self.stream):
                t = apply(t, lambda x: x.to(dev, non_blocking=True))
                event = torch.cuda.Event()
                event.record(self.stream)
        elif dev is not None:
            t = apply(t, lambda x: x.to(dev))
        return [Ready(t, step, event)]


class PinnedSlab(Handoff):
    """``per_copy`` batches packed into one (pinned) buffer (`tensors.pack`) and copied to the
    device in one asynchronous copy on the feeder's stream; each batch is views of that copy.
    `wait` waits once per slab and stream."""

    def __init__(self, target: Target, per_copy: int = 1) -> None:
        super().__init__(target)
        self.per_copy = per_copy
        self._seen: tuple[Any, Any] = (None, None)  # (slab, stream) already waited for and recorded

    def convert(self, batches: list[HostBatch], steps: list[int]) -> list[Ready]:
        tg = self.target
        dev = tg.device
        slab, layout = pack(batches, pin=tg.pin, stack=tg.stack)
        batches.clear()  # the copy into the slab lets the workers' shared memory go at once
        typed: dict[torch.dtype, torch.Tensor] = {}
        event = None
        if tg.cuda:
            with torch.cuda.device(dev), torch.cuda.stream(self.stream):
                slab = slab.to(dev, non_blocking=True)
                # unpack="device": the expansion runs on this stream too, ahead of the step.
                outs = [self._batch(slab, parts, typed) for parts in layout]
                event = torch.cuda.Event()
                event.record(self.stream)
        else:
            if dev is not None:
                slab = slab.to(dev)
            outs = [self._batch(slab, parts, typed) for parts in layout]
        # Expanded group columns are new tensors outside the slab: each is waited for.
        held = None if tg.expands_on_device else slab
        return [Ready(out, step, event, held) for out, step in zip(outs, steps, strict=True)]

    def _batch(self, slab: torch.Tensor, parts: Any, typed: dict[torch.dtype, torch.Tensor]) -> Any:
        t = unpack_slab(slab, parts, typed)
        finish = self.target.finish
        return t if finish is None else finish(t)

    def _wait(self, ready: Ready, current: Any) -> None:
        slab = ready.memory
        if slab is None:
            super()._wait(ready, current)
        elif slab is not self._seen[0] or current != self._seen[1]:
            # Once per slab and stream: every column of its batches lies in its memory.
            assert isinstance(slab, torch.Tensor)
            current.wait_event(ready.event)
            slab.record_stream(current)
            self._seen = (slab, current)

    def forget(self) -> None:
        self._seen = (None, None)


# -- the registered hand-off ----------------------------------------------------------------------
#
# With device="cuda" and process workers, the training process used to copy every batch into a
# pinned buffer (NumPy copies under the GIL) before its host-to-device copy. Here the segments
# themselves are page-locked (cudaHostRegister, through Loader.watch_block_memory and registry.py):
# a block goes to the device as it lies in its segment, in one copy, and each batch cut from it is
# a set of views of that device copy. What still is a host copy, and counted: a batch stitched
# across two blocks (fresh memory, outside every segment) and the rebased offsets of
# variable-length columns.


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


class Registered(Handoff):
    """Turns batches whose arrays are views of registered blocks into device tensors.

    ``to_device(host_uint8_tensor)`` starts the copy of one buffer (asynchronous on CUDA, issued
    on the feeder's stream); ``new_event()`` records an event on that stream (None on the CPU,
    where the copy is a clone: the stand-in registrar of the tests). The first batch of a block
    copies the whole block; every batch of it is then views of that copy. The host block is kept
    until its copy has finished (its segment then goes back to its worker), and `drain` waits for
    every copy in flight. A batch's `Ready.memory` is the device buffers it lies in; `wait` waits
    once per event and stream, and records each buffer once per stream.
    """

    def __init__(self, target: Target, registry: HostRegistry, stats: HandoffStats, in_flight: int = 4) -> None:
        super().__init__(target)
        dev = target.device
        assert dev is not None
        self.to_device: Callable[[torch.Tensor], torch.Tensor]
        self.new_event: Callable[[], Any]
        if target.cuda:
            def to_device(t: torch.Tensor) -> torch.Tensor:
                return t.to(dev, non_blocking=True)

            def new_event() -> Any:
                event = torch.cuda.Event()
                event.record()  # on the current (the feeder's) stream
                return event
        else:  # the CPU stand-in (a test hook): a synchronous copy
            def to_device(t: torch.Tensor) -> torch.Tensor:
                return t.clone()

            def new_event() -> Any:
                return None
        self.to_device, self.new_event = to_device, new_event
        self.registry = registry
        self.stack: Sequence[tuple[str, tuple[str, ...]]] = target.stack
        self.stacked = {c for _, cols in self.stack for c in cols}
        self._group_of = {c: g for g, cols in self.stack for c in cols}
        self.pin = target.pin
        self.stats = stats
        self.in_flight = in_flight
        self._block: _Block | None = None
        self._event: Any = None  # the last event recorded: covers every copy issued so far
        self._lock = threading.RLock()
        self._pending: collections.deque[tuple[Any, np.ndarray]] = collections.deque()
        # The training thread's side: (event, stream) last waited for, (buffer, stream) pairs recorded.
        self._waited: tuple[Any, Any] = (None, None)
        self._recorded: collections.deque[tuple[torch.Tensor, Any]] = collections.deque(maxlen=8)
        registry.handoffs.add(self)

    def convert(self, batches: list[HostBatch], steps: list[int]) -> list[Ready]:
        (batch,), (step,) = batches, steps  # a copy per block already serves all of its batches
        tg = self.target
        if tg.cuda:
            with torch.cuda.device(tg.device), torch.cuda.stream(self.stream):
                return [self._ready(batch, step)]
        return [self._ready(batch, step)]

    def _ready(self, batch: HostBatch, step: int) -> Ready:
        t, event, bases = self.convert_one(batch)
        finish = self.target.finish
        if finish is None:
            return Ready(t, step, event, bases)
        out = finish(t)
        if self.target.expands_on_device:
            # Expanded group columns are new tensors outside the copied buffers, made on this
            # stream after the last event: a new one covers them, and each is waited for.
            event = self._event = self.new_event()
            return Ready(out, step, event, None)
        return Ready(out, step, event, bases)

    def _wait(self, ready: Ready, current: Any) -> None:
        if ready.memory is None:
            super()._wait(ready, current)
            return
        # Batches of one block share its event and buffer.
        if ready.event is not self._waited[0] or current != self._waited[1]:
            current.wait_event(ready.event)
            self._waited = (ready.event, current)
        assert isinstance(ready.memory, tuple)
        for buf in ready.memory:
            if not any(b is buf and s == current for b, s in self._recorded):
                buf.record_stream(current)
                self._recorded.append((buf, current))

    def forget(self) -> None:
        self._waited = (None, None)
        self._recorded.clear()

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

    def convert_one(self, batch: HostBatch) -> tuple[dict[str, Any], Any, tuple[torch.Tensor, ...]]:
        """(tensors, the event they are ready after, the device buffers they lie in)."""
        with self._lock:
            self._release_done()
        issued = False  # an operation this batch needs, beyond a block copy (which records its own event)
        bases: list[torch.Tensor] = []
        strided = self._strided_groups(batch) if self.stack else {}
        arrays: list[tuple[str, str | None, np.ndarray, bool]] = []  # (name, ragged kind, array, is offsets)
        for name, col in batch.items():
            if name in self.stacked and self._group_of[name] in strided:
                continue  # its group is one strided view of the block (below)
            if isinstance(col, Ragged):
                rkind, parts = ragged_arrays(col)
                arrays.append((name, rkind, parts[0], False))
                arrays.extend((name, rkind, offs, True) for offs in parts[1:])
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
            dt = host_dtype(name, a)
            placed.append(blk.view(a, dt, torch_dtype(dt)))
        if fresh:
            slab, views = self._copy_fresh([(arrays[i][0], arrays[i][2]) for i in fresh])
            for i, v in zip(fresh, views, strict=True):
                placed[i] = v
            bases.append(slab)
            issued = True
        out: dict[str, Any] = {}
        pending: dict[str, list[torch.Tensor]] = {}
        for (name, kind, _, _), t in zip(arrays, placed, strict=True):
            assert t is not None
            if kind is None:
                out[name] = t
            else:
                got = collect_ragged(pending, name, kind, t)
                if got is not None:
                    out[name] = got
        if self.stack:
            ordered = {k: v for k, v in out.items() if k not in self.stacked}
            for group, cols in self.stack:
                # One kernel on the device, on the copy's stream: a copy of the group's strided view
                # of the block, or a stack of its columns' views where they are not evenly spaced.
                view = strided.get(group)
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

    def _strided_groups(self, batch: HostBatch) -> dict[str, torch.Tensor]:
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
            dt = host_dtype(cols[0], first)
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
            tdt = torch_dtype(dt)
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
            dt = host_dtype(name, a)
            layout.append((total, dt))
            total += -(-max(a.nbytes, 1) // align) * align
        host = torch.empty(max(total, align), dtype=torch.uint8, pin_memory=self.pin)
        buf = host.numpy()
        for (off, dt), (_, a) in zip(layout, arrays, strict=True):
            np.copyto(buf[off : off + a.nbytes].view(dt).reshape(a.shape), a.view(dt), casting="no")
            self.stats["copied_arrays"] += 1
            self.stats["copied_bytes"] += a.nbytes
        dev = self.to_device(host)
        views = [dev[off : off + a.nbytes].view(torch_dtype(dt)).view(a.shape).data
                 for (off, dt), (_, a) in zip(layout, arrays, strict=True)]
        return dev, views
