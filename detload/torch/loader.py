"""PyTorch adapter: detload batches as ``torch.Tensor``, pinned in a background thread, copied to the GPU ahead of the step.

Import it only where torch is installed (``import detload`` never imports
torch). See docs/distributed.md for DDP, resume and PyTorch Lightning.
"""

from __future__ import annotations

import collections
import functools
import os
import queue
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

try:
    import torch
    import torch.utils.data
except ModuleNotFoundError as exc:
    if exc.name not in ("torch", "torch.utils", "torch.utils.data"):
        raise  # torch is there but broken (one of its own dependencies is missing): say so as it is
    raise ModuleNotFoundError(
        'detload.torch needs PyTorch, which is not installed: pip install "detload[torch]". '
        "An unpinned torch from PyPI pulls a multi-GB CUDA build; for the CPU build, install torch first "
        "with pip install torch --index-url https://download.pytorch.org/whl/cpu",
        name="torch",
    ) from None

from . import _hooks
from ._engine.messages import POLL, put_until
from ._hooks import Hooks
from ._pinned import HandoffStats, HostRegistry, RegisteredHandoff, cuda_registrar
from ._trace import StatsMark
from ._types import Column, Ragged
from .errors import DetloadError, OptionError
from .loader import Loader, check_epoch, refuse_pickling, refuse_torch_workers
from .options import warn_deprecated
from .packed import Packed
from .stats import Stats

__all__ = ["PackedTensors", "RaggedTensor", "TorchLoader", "to_torch"]


class RaggedTensor(NamedTuple):
    """A variable-length column as two tensors: row ``i`` is ``values[offsets[i]:offsets[i+1]]``.

    ``offsets`` is int64 with ``rows + 1`` entries starting at 0; strings and
    binary hold their bytes as uint8 ``values`` (``kind`` is ``"utf8"``,
    ``"binary"`` or ``"list"``). A NamedTuple, so collate/transfer helpers that
    walk tuples (Lightning's ``move_data_to_device``) move both tensors.
    """

    values: torch.Tensor
    offsets: torch.Tensor
    kind: str

    @property
    def rows(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def to(self, *args: Any, **kwargs: Any) -> RaggedTensor:
        return RaggedTensor(self.values.to(*args, **kwargs), self.offsets.to(*args, **kwargs), self.kind)

    def pin_memory(self) -> RaggedTensor:
        return RaggedTensor(self.values.pin_memory(), self.offsets.pin_memory(), self.kind)

    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def to_nested(self) -> torch.Tensor:
        """A jagged nested tensor sharing ``values`` (for ``list`` columns of numbers)."""
        return torch.nested.nested_tensor_from_jagged(self.values, self.offsets)


TorchColumn = torch.Tensor | RaggedTensor
TorchBatch = dict[str, TorchColumn]


def _host_dtype(name: str, a: np.ndarray) -> np.dtype:
    """The dtype column ``name``'s array has as a tensor; OptionError if torch cannot hold it."""
    if a.dtype.kind in "mM":
        # datetime64/timedelta64: torch has no such dtype; the int64 ticks keep the bytes.
        return np.dtype(np.int64)
    if a.dtype.kind not in "biufc":
        raise OptionError(f"column {name!r} has dtype {a.dtype}, which torch cannot hold; leave it out with columns=")
    return a.dtype


def _tensor(name: str, a: np.ndarray) -> torch.Tensor:
    if a.dtype.kind not in "biufc":  # numbers go as they are (the common case, checked first)
        a = a.view(_host_dtype(name, a))
    if not a.flags.writeable:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # shares memory on purpose, as documented
            return torch.from_numpy(a)
    return torch.from_numpy(a)


def to_torch(batch: Mapping[str, Column]) -> TorchBatch:
    """Wrap a detload batch as tensors sharing its memory (no copy)."""
    out: TorchBatch = {}
    for name, col in batch.items():
        if isinstance(col, Ragged):
            out[name] = RaggedTensor(_tensor(name, col.values), _tensor(name, col.offsets), col.kind)
        else:
            out[name] = _tensor(name, col)
    return out


# Names the group index and offsets of a packed batch travel under, beside its columns
# (column names come from Parquet and never start with a NUL).
_GROUP_INDEX = "\x00group_index"
_OFFSETS = "\x00offsets"
# The registered hand-off's registries per Loader (and device): a buffer cannot be registered
# twice, so a second TorchLoader over the same Loader reuses the first's; gone with the Loader.
_REGISTRIES: weakref.WeakKeyDictionary[Loader, dict[Any, HostRegistry]] = weakref.WeakKeyDictionary()

Unpack = Literal["device", "host"] | None


def _expand(col: TorchColumn, index: torch.Tensor) -> TorchColumn:
    """Rows ``index`` of a column (a group column expanded to its items), on the column's device."""
    if not isinstance(col, RaggedTensor):
        return col.index_select(0, index)
    lengths = (col.offsets[1:] - col.offsets[:-1]).index_select(0, index)
    offsets = torch.zeros(len(index) + 1, dtype=col.offsets.dtype, device=col.offsets.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1]) if len(index) else 0
    # Value k of the output is value (first value of its source row) + (k - its row's start).
    src = torch.repeat_interleave(col.offsets[:-1].index_select(0, index) - offsets[:-1], lengths,
                                  output_size=total)
    src += torch.arange(total, dtype=src.dtype, device=src.device)
    return RaggedTensor(col.values.index_select(0, src), offsets, col.kind)


class PackedTensors(NamedTuple):
    """A `detload.Packed` batch as tensors (``TorchLoader(..., unpack=None)``).

    ``items``: the item columns (``n_items`` rows); ``groups``: the group columns, one row
    per group (a query tower can run once per query); ``group_index``: int64, the row of
    each item's group in ``groups``; ``offsets``: int64, ``n_groups + 1`` values;
    ``columns``: the flat column order. A NamedTuple, so helpers that walk tuples and dicts
    (Lightning's ``move_data_to_device``) move every tensor.
    """

    items: TorchBatch
    groups: TorchBatch
    group_index: torch.Tensor
    offsets: torch.Tensor
    columns: tuple[str, ...]

    @property
    def n_items(self) -> int:
        return int(self.group_index.shape[0])

    @property
    def n_groups(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def unpack(self) -> TorchBatch:
        """The flat batch: each group column expanded by ``group_index`` with one ``index_select``
        (on the tensors' device), columns in ``columns`` order (stacked groups last)."""
        out: TorchBatch = {}
        for name in self.columns:
            col = self.items.get(name)
            out[name] = col if col is not None else _expand(self.groups[name], self.group_index)
        for name, col in self.items.items():
            out.setdefault(name, col)
        for name, col in self.groups.items():
            if name not in out:
                out[name] = _expand(col, self.group_index)
        return out

    def to(self, *args: Any, **kwargs: Any) -> PackedTensors:
        move = functools.partial(_move, args=args, kwargs=kwargs)
        return PackedTensors(_apply(self.items, move), _apply(self.groups, move), move(self.group_index),
                             move(self.offsets), self.columns)

    def pin_memory(self) -> PackedTensors:
        pin = torch.Tensor.pin_memory
        return PackedTensors(_apply(self.items, pin), _apply(self.groups, pin), pin(self.group_index),
                             pin(self.offsets), self.columns)


def _move(x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    return x.to(*args, **kwargs)


def _wire(batch: Packed) -> dict[str, Column]:
    """A packed batch as one flat mapping of its arrays (what a slab carries)."""
    return {**batch.items, **batch.groups, _GROUP_INDEX: batch.group_index, _OFFSETS: batch.offsets}


def _from_wire(t: TorchBatch, group_names: frozenset[str], columns: tuple[str, ...]) -> PackedTensors:
    """The `PackedTensors` of a batch that travelled as `_wire` made it (stacks included)."""
    gi, offs = t[_GROUP_INDEX], t[_OFFSETS]
    assert isinstance(gi, torch.Tensor) and isinstance(offs, torch.Tensor)
    items = {k: v for k, v in t.items() if k not in group_names and k not in (_GROUP_INDEX, _OFFSETS)}
    groups = {k: v for k, v in t.items() if k in group_names}
    return PackedTensors(items, groups, gi, offs, columns)


def _apply(batch: TorchBatch, fn: Callable[[torch.Tensor], torch.Tensor]) -> TorchBatch:
    return {k: RaggedTensor(fn(v.values), fn(v.offsets), v.kind) if isinstance(v, RaggedTensor) else fn(v)
            for k, v in batch.items()}


def _each(batch: TorchBatch, fn: Callable[[torch.Tensor], Any]) -> None:
    for v in batch.values():
        if isinstance(v, RaggedTensor):
            fn(v.values)
            fn(v.offsets)
        else:
            fn(v)


def _each_any(batch: TorchBatch | PackedTensors, fn: Callable[[torch.Tensor], Any]) -> None:
    if isinstance(batch, PackedTensors):
        _each(batch.items, fn)
        _each(batch.groups, fn)
        fn(batch.group_index)
        fn(batch.offsets)
    else:
        _each(batch, fn)


def _record(x: torch.Tensor, stream: Any) -> None:
    x.record_stream(stream)


# Each array starts on this byte boundary inside a slab: a multiple of every
# dtype's size (so views of the slab can take any dtype) and of the GPU's
# preferred load width.
_ALIGN = 256
_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


class _Part(NamedTuple):
    name: str
    kind: str | None  # None for a plain column; a Ragged's kind for its two arrays
    offset: int  # bytes from the slab's start
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]  # contiguous, in elements


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    t = _TORCH_DTYPES.get(dt)
    if t is None:
        t = _TORCH_DTYPES[dt] = torch.from_numpy(np.empty(0, dtype=dt)).dtype
    return t


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, step = [], 1
    for n in reversed(shape):
        stride.append(step)
        step *= max(n, 1)
    return tuple(reversed(stride))


Stack = tuple[tuple[str, tuple[str, ...]], ...]


def _pack(batches: Sequence[Mapping[str, Column]], pin: bool,
          stack: Stack = ()) -> tuple[torch.Tensor, list[list[_Part]]]:
    """Copy every array of some batches into one (pinned) byte slab; return it and where each array lies.

    One allocation and one host-to-device copy per slab instead of two per
    column and batch: each torch call of the feeder thread lets the training
    thread's GIL hand-offs in, so it makes few. The copies are NumPy's. Each
    ``stack`` group becomes one ``(rows, k)`` array (one ``np.stack``), after
    the columns left unstacked.
    """
    stacked = {c for _, cols in stack for c in cols}
    work: list[tuple[np.ndarray | list[np.ndarray], np.dtype, _Part]] = []
    layout: list[list[_Part]] = []
    total = 0
    for batch in batches:
        items: list[tuple[str, str | None, np.ndarray | list[np.ndarray]]] = []
        for name, col in batch.items():
            if name in stacked:
                continue
            if isinstance(col, Ragged):
                items.append((name, col.kind, col.values))
                items.append((name, col.kind, col.offsets))
            else:
                items.append((name, None, col))
        for out, cols in stack:
            items.append((out, None, [batch[c] for c in cols]))  # type: ignore[misc]  # validated: 1-D, fixed
        parts: list[_Part] = []
        for name, kind, a in items:
            first = a[0] if isinstance(a, list) else a
            dt = _host_dtype(name, first)
            shape = (len(first), len(a)) if isinstance(a, list) else first.shape
            nbytes = int(np.prod(shape)) * dt.itemsize
            part = _Part(name, kind, total, nbytes, _torch_dtype(dt), shape, _contiguous_stride(shape))
            parts.append(part)
            work.append((a, dt, part))
            total += -(-nbytes // _ALIGN) * _ALIGN
        layout.append(parts)
    slab = torch.empty(max(total, _ALIGN), dtype=torch.uint8, device="cpu", pin_memory=pin)
    buf = slab.numpy()
    for a, dt, p in work:
        dst = buf[p.offset : p.offset + p.nbytes].view(dt).reshape(p.shape)
        if isinstance(a, list):
            np.stack([x.view(dt) for x in a], axis=1, out=dst, casting="no")
        else:
            np.copyto(dst, a.view(dt), casting="no")
    return slab, layout


def _unpack(slab: torch.Tensor, parts: list[_Part], typed: dict[torch.dtype, torch.Tensor]) -> TorchBatch:
    """One batch as tensors over ``slab``'s memory (on whichever device it now is); ``typed``
    caches the slab viewed as each dtype (share it across a slab's batches).

    ``.data`` makes each one a tensor of its own for autograd, not a view: views of one
    base share its version counter, so an in-place change of one column (normalising a
    target, say) would fail ``backward()`` through any other.
    """
    out: TorchBatch = {}
    pending: dict[str, torch.Tensor] = {}
    for p in parts:
        whole = typed.get(p.dtype)
        if whole is None:
            whole = typed[p.dtype] = slab.view(p.dtype)
        t = whole.as_strided(p.shape, p.stride, p.offset // whole.element_size()).data
        if p.kind is None:
            out[p.name] = t
        elif p.name in pending:
            out[p.name] = RaggedTensor(pending.pop(p.name), t, p.kind)
        else:
            pending[p.name] = t
    return out


class _End:
    pass


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class TorchLoader:
    """Iterate a `Loader` as dicts of tensors; what a training loop iterates directly.

    ``TorchLoader(loader, device=...)``, where ``loader`` is a `detload.Loader` (its
    options are the Loader's; this adapter's are below). The older form
    ``TorchLoader(source, batch_size=..., seed=..., **loader_options)`` still works for
    this release, with a DeprecationWarning.

    - ``device=None`` and ``pin_memory=False``: tensors share the NumPy batch's
      memory (``torch.from_numpy``), no thread, no copy.
    - ``pin_memory=True``: a background thread copies each batch into one
      pinned buffer (every column lies in it), ``prefetch`` batches ahead
      (needs an accelerator; without one it warns and stays off, as torch's
      DataLoader does).
    - ``stack={"dense": ["f0", "f1", ...], ...}``: each group of one-value-per-row
      columns of one dtype arrives as one ``(rows, k)`` tensor under its own name
      (after the columns left unstacked), packed on the host, so the training
      loop gets a model's input matrix without ~k tensors and a stack kernel.
    - ``copy_batches=k`` (with ``pin_memory`` or ``device``): the thread packs
      ``k`` consecutive batches into one buffer and makes one device copy of
      them: fewer torch calls per batch in the training process, which helps
      a model whose step is bound by launching kernels. The thread then holds
      up to ``k`` batches (and ``prefetch`` more) ahead.
    - ``device="cuda"`` (or ``"cuda:N"``): the thread pins each batch so and
      copies it with one ``non_blocking=True`` copy on its own CUDA stream,
      ``prefetch`` batches ahead of the step that runs; the consumer's stream
      waits for the copy before the batch is used. ``device="cpu"`` uses the
      same thread (and copies only for ``stack`` or ``copy_batches > 1``).
    - ``device="cuda"`` with ``pool="process"`` workers: no batch is packed or
      pinned in this process. Each worker shared-memory segment is registered once
      as pinned memory (``cudaHostRegister``, kept while the segment lives,
      unregistered before it is unmapped); each block goes to the device in one
      asynchronous copy straight from its segment, and its batches are views of
      that copy (``stack`` groups: one stack kernel on the device; ``copy_batches``
      has no effect). Host copies remain only for batches stitched across two
      blocks and for rebased offsets of variable-length columns; `handoff_stats`
      counts them. Without CUDA's runtime bindings it falls back to the pinned buffer.

    - ``unpack=`` (a Loader with ``group_by``, whose batches are `detload.Packed`): the
      group columns are copied once per group, with the items, their ``group_index``
      and offsets. ``"device"`` (the default with a CUDA device) expands them on the
      device, one ``index_select`` per group column on the copy stream ahead of the
      step, and yields the flat dict; ``"host"`` (the default otherwise, and what
      ``"device"`` means with ``device="cpu"``) expands them on the CPU before the copy;
      ``None`` yields `PackedTensors` (items, groups, group_index, offsets), so that a
      query tower can run once per query. ``stack`` groups are item columns or group
      columns, never both.

    Tensors share memory with more than themselves: without a copy, a worker's
    block (several batches); with ``pin_memory``, a CUDA ``device`` or
    ``copy_batches > 1``, one buffer per batch (per ``k`` batches); with ``stack``,
    the groups share one. A tensor kept past its step keeps all of that alive, so
    ``.clone()`` what you keep (ids for evaluation, say).

    ``state_dict()`` counts batches handed to the training loop, never the ones
    prefetched. When ``torch.distributed`` is initialised, every iteration
    first checks that all ranks were given the same options, resume position and
    epoch (``check_ranks=False`` turns this collective off).
    """

    def __init__(
        self,
        loader: Loader | Any,
        *,
        device: str | torch.device | None = None,
        pin_memory: bool = False,
        prefetch: int = 2,
        stack: Mapping[str, Any] | None = None,
        copy_batches: int = 1,
        check_ranks: bool = True,
        unpack: Unpack | str = "auto",
        **loader_options: Any,
    ) -> None:
        if isinstance(loader, Loader):
            if loader_options:
                raise OptionError(f"options {sorted(loader_options)} apply when TorchLoader builds the Loader; "
                                  "pass them to Loader(...) instead")
            self.loader = loader
        else:
            warn_deprecated("TorchLoader(source, **loader_options) is deprecated: use "
                            "TorchLoader(detload.Loader(source, ...), device=...)")
            self.loader = Loader(loader, **loader_options)
        if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or prefetch < 1:
            raise OptionError(f"prefetch must be an int >= 1 (batches), got {prefetch!r}")
        self.prefetch = int(prefetch)
        self.stack: Stack = _check_stack(stack, self.loader)
        if isinstance(copy_batches, bool) or not isinstance(copy_batches, (int, np.integer)) or copy_batches < 1:
            raise OptionError(f"copy_batches must be an int >= 1 (batches per copy), got {copy_batches!r}")
        copy_batches = int(copy_batches)
        self.check_ranks = bool(check_ranks)
        wants_thread = bool(pin_memory) or device is not None  # as asked, before pinning may be dropped
        dev = _device(device)
        if dev is not None and dev.type == "cuda":
            if not torch.cuda.is_available():
                raise OptionError(f"device={str(dev)!r} but torch.cuda.is_available() is False: "
                                  "use device=None (CPU tensors) on a machine without a GPU")
            if dev.index is None:
                # The feeder thread has its own current device; fix the consumer's now.
                dev = torch.device("cuda", torch.cuda.current_device())
            pin_memory = True  # asynchronous host-to-device copies need pinned memory
        elif pin_memory and not torch.cuda.is_available():
            warnings.warn("pin_memory=True but no accelerator is available: batches are not pinned"
                          + (f" (and copy_batches={copy_batches} has no effect)"
                             if copy_batches != 1 and dev is None else ""),
                          stacklevel=2)
            pin_memory = False
            if dev is None:
                copy_batches = 1
        self.device = dev
        self.unpack: Unpack = _check_unpack(unpack, self.loader, dev)
        # group_by: the names that travel one row per group (group columns and their stacks).
        groups = set(self.loader.group_columns)
        self._group_names = frozenset(groups | {n for n, cols in self.stack if cols[0] in groups})
        self._columns = tuple(s.name for s in self.loader.column_specs
                              if s.name not in {c for _, cols in self.stack for c in cols})
        self.pin_memory = bool(pin_memory)
        self._threaded = self.pin_memory or dev is not None
        if copy_batches > 1 and not wants_thread:
            raise OptionError(f"copy_batches={copy_batches} needs pin_memory=True or device=...: it groups the "
                              "copies their background thread makes, and without them there is none")
        self.copy_batches = copy_batches
        #: Test and benchmark hooks in force when built (``torch_per_column``: the path before the slab).
        self._hooks: Hooks = _hooks.current()
        #: The registered hand-off's counters (see `handoff_stats`), over the Loader's life.
        self._handoff_stats = HandoffStats()
        self._registry = self._register_block_memory()
        self._pos: int | None = None  # batches of this epoch handed to the training loop
        # The latest iter()'s token: an iteration starts only if it is still the latest.
        self._latest: object | None = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue[Any] | None = None

    def _register_block_memory(self) -> HostRegistry | None:
        """With ``device="cuda"`` and process workers: register every shared-memory segment the
        loader's batches lie in as pinned memory, once, through `Loader.watch_block_memory`.
        None where that does not apply (no CUDA runtime, thread workers, a benchmark switch)."""
        hooks, dev = self._hooks, self.device
        if hooks.torch_staged or hooks.torch_per_column or dev is None or self.loader.pool_kind != "process":
            return None
        # One registry per Loader and device: a second TorchLoader over the same Loader (a new one
        # each epoch, say) reuses it, since a buffer cannot be registered twice.
        registries = _REGISTRIES.setdefault(self.loader, {})
        key = (str(dev), hooks.torch_registrar)
        registry = registries.get(key)
        if registry is not None:
            self._handoff_stats = registry.stats
            return registry
        pair = hooks.torch_registrar
        if pair is None and dev.type == "cuda":
            pair = cuda_registrar(dev)
        if pair is None:
            return None
        registry = registries[key] = HostRegistry(pair[0], pair[1], self._handoff_stats)
        self.loader.watch_block_memory(registry.added, registry.removed)
        return registry

    def handoff_stats(self) -> dict[str, int]:
        """What the registered hand-off did (``device="cuda"`` with process workers), over the
        wrapped Loader's life (every TorchLoader over it): batches handed over as views of blocks
        copied straight from registered shared memory, and the host copies that remain (batches
        stitched across blocks, rebased offsets of variable-length columns), by count and bytes;
        all zero where it is not used."""
        return dict(self._handoff_stats)

    # -- pass-through ------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.loader)

    @property
    def epoch(self) -> int:
        return self.loader.epoch

    def set_epoch(self, epoch: int) -> None:
        check_epoch(epoch)  # before stopping anything: a refused epoch leaves the iteration running
        if int(epoch) != self.loader.epoch:
            self._shutdown()
            self._pos = None
        self.loader.set_epoch(epoch)

    def stats(self, since: StatsMark | None = None) -> Stats:
        """The wrapped loader's stage timings (see `Loader.stats`), over everything or only
        after ``since`` (a `stats_mark()`). Its consumer is this adapter's feeder thread, so
        ``consumer_step`` includes converting and pinning (with ``copy_batches=k``, all of it
        in one batch of every ``k``)."""
        return self.loader.stats(since=since)

    def stats_mark(self) -> StatsMark:
        """See `Loader.stats_mark`."""
        return self.loader.stats_mark()

    def state_dict(self) -> dict[str, Any]:
        """The loader's state at the last batch the training loop received (JSON-able)."""
        state = self.loader.state_dict()
        if self._pos is not None:
            state["step"] = self._pos
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.check_state(state)  # before stopping anything: a refused state changes nothing
        self._shutdown()
        self.loader.load_state_dict(state)
        self._pos = None

    def close(self) -> None:
        self._latest = None
        self._shutdown()
        self.loader.close()

    def __enter__(self) -> TorchLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TorchLoader({self.loader!r}, device={self.device}, pin_memory={self.pin_memory})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise refuse_pickling("TorchLoader")

    # -- iteration -----------------------------------------------------------------
    def __iter__(self) -> Iterator[TorchBatch]:
        """A pass over the current epoch from the current position, which it takes at its first
        ``next()``: until then, ``set_epoch()`` and ``load_state_dict()`` decide what it yields.

        Frameworks call ``iter()`` before the hooks that set the epoch (Lightning does after
        restoring a checkpoint), so the pass must not be fixed when the iterator is made.
        """
        refuse_torch_workers("TorchLoader")
        self._shutdown()
        token = self._latest = object()
        return self._iterate(token)

    def _iterate(self, token: object) -> Iterator[TorchBatch]:
        if self._latest is not token:
            raise DetloadError("this TorchLoader iteration was stopped before it began: close() or a new "
                               "iter() was called since it was made; start a new one")
        if self.check_ranks:
            self.loader.check_ranks()
        it = iter(self.loader)
        self._pos = self.loader.position
        if not self._threaded:
            yield from self._direct(it)
            return
        q: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        th = threading.Thread(target=self._feed, args=(it, q, stop), name="detload-torch-feeder", daemon=True)
        self._stop, self._thread, self._queue = stop, th, q
        yield from self._consume(q, stop, th)

    def _direct(self, it: Iterator[dict[str, Column]]) -> Iterator[TorchBatch]:
        loader = self.loader
        stack = self.stack
        stacked = {c for _, cols in stack for c in cols}
        try:
            for batch in it:
                self._pos = loader.position
                if isinstance(batch, Packed):
                    yield self._finish(self._direct_packed(batch))
                    continue
                if stack:
                    # Only the groups are copied; the other columns share the batch's memory as usual.
                    out = to_torch({k: v for k, v in batch.items() if k not in stacked})
                    slab, layout = _pack([{c: batch[c] for c in stacked}], pin=False, stack=stack)
                    out.update(_unpack(slab, layout[0], {}))
                    yield out
                else:
                    yield to_torch(batch)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def _direct_packed(self, batch: Packed) -> TorchBatch:
        """A packed batch as tensors sharing its memory (stacks copied), unpacked on the host if asked."""
        flat: Mapping[str, Column] = batch.unpack() if self.unpack == "host" else _wire(batch)
        stack = self.stack
        if not stack:
            return to_torch(flat)
        stacked = {c for _, cols in stack for c in cols}
        out = to_torch({k: v for k, v in flat.items() if k not in stacked})
        slab, layout = _pack([{c: flat[c] for c in stacked}], pin=False, stack=stack)
        out.update(_unpack(slab, layout[0], {}))
        return out

    def _finish(self, t: TorchBatch) -> TorchBatch | PackedTensors:
        """What the training loop receives of a packed batch that arrived as ``t``."""
        if self.unpack == "host":
            return t
        packed = _from_wire(t, self._group_names, self._columns)
        return packed if self.unpack is None else packed.unpack()

    def _feed(self, it: Iterator[dict[str, Column]], q: queue.Queue[Any], stop: threading.Event) -> None:
        """Background thread: convert, pin, start the device copy; ``prefetch`` batches ahead."""
        dev = self.device
        cuda = dev is not None and dev.type == "cuda"
        packed = bool(self.stack) or (not self._hooks.torch_per_column and (self.pin_memory or self.copy_batches > 1))
        group = self.copy_batches if packed else 1
        handoff = self._new_handoff(cuda)
        if handoff is not None:
            group = 1  # a copy per block already serves all of its batches
        slab: torch.Tensor | None = None
        t: TorchBatch | None = None
        batches: list[dict[str, Column]] = []
        grouped = False  # the loader yields Packed batches (group_by)
        try:
            stream = torch.cuda.Stream(dev) if cuda else None
            ended = False
            failed: Exception | None = None
            while not ended:
                batches = []
                positions: list[int] = []
                while len(batches) < group:
                    if stop.is_set():
                        return  # the loop has left: read no further
                    try:
                        got: Any = next(it)
                        if isinstance(got, Packed):
                            # Group columns travel once per group; unpacked here only when asked.
                            got = got.unpack() if self.unpack == "host" else _wire(got)
                            grouped = True
                        batches.append(got)
                    except StopIteration:
                        ended = True
                        break
                    except Exception as exc:  # noqa: BLE001 - raised after the good batches before it
                        if not batches:
                            raise
                        failed, ended = exc, True
                        break
                    positions.append(self.loader.position)
                if not batches or stop.is_set():
                    break
                event = None
                if handoff is not None:
                    if cuda:
                        with torch.cuda.device(dev), torch.cuda.stream(stream):
                            t, event, bases = handoff.convert(batches[0])
                    else:
                        t, event, bases = handoff.convert(batches[0])
                    batches = []
                    if not _put(q, (t, positions[0], event, bases), stop):
                        return
                    continue
                if packed:
                    # The copy into the slab also lets the workers' shared memory go at once.
                    slab, layout = _pack(batches, pin=self.pin_memory, stack=self.stack)
                    del batches
                    typed: dict[torch.dtype, torch.Tensor] = {}
                    outs: list[Any] | None
                    if cuda:
                        with torch.cuda.device(dev), torch.cuda.stream(stream):
                            slab = slab.to(dev, non_blocking=True)
                            # unpack="device": the expansion runs on this stream too, ahead of the step.
                            outs = [self._finish(_unpack(slab, parts, typed)) if grouped
                                    else _unpack(slab, parts, typed) for parts in layout]
                            event = torch.cuda.Event()
                            event.record(stream)
                    else:
                        if dev is not None:
                            slab = slab.to(dev)
                        outs = [self._finish(_unpack(slab, parts, typed)) if grouped
                                else _unpack(slab, parts, typed) for parts in layout]
                    # Expanded group columns are new tensors outside the slab: each is waited for.
                    held = None if grouped and self.unpack == "device" else slab
                    for out, pos in zip(outs, positions, strict=True):
                        if not _put(q, (out, pos, event, held), stop):
                            return
                    out = outs = held = None  # this frame must not keep the slab past its batches
                    continue
                t = to_torch(batches.pop())
                if grouped:  # per-column copies (a test hook): the packed structure after them
                    t = _apply(t, lambda x: x.pin_memory()) if self.pin_memory else t
                    if dev is not None:
                        t = _apply(t, lambda x: x.to(dev))
                    if not _put(q, (self._finish(t), positions[0], None, None), stop):
                        return
                    continue
                if self.pin_memory:
                    t = _apply(t, lambda x: x.pin_memory())
                if cuda:
                    with torch.cuda.device(dev), torch.cuda.stream(stream):
                        t = _apply(t, lambda x: x.to(dev, non_blocking=True))
                        event = torch.cuda.Event()
                        event.record(stream)
                elif dev is not None:
                    t = _apply(t, lambda x: x.to(dev))
                if not _put(q, (t, positions[0], event, None), stop):
                    return
            if failed is not None:
                err, failed = failed, None
                try:
                    raise err
                finally:
                    del err  # no cycle through this frame
            _put(q, _End(), stop)
        except BaseException as exc:  # noqa: BLE001 - carried to the training loop
            # The error's traceback holds this frame: let go of its buffers before handing it on,
            # or they live as long as the error (and until the cyclic collector runs).
            slab = t = out = outs = held = got = None
            batches = []
            _put(q, _Failed(exc), stop)
        finally:
            if handoff is not None:
                handoff.drain()  # no copy reads a segment once its block goes back to its worker
            close = getattr(it, "close", None)
            if close is not None:
                close()  # stops the loader's run: workers drop the rest, shared memory is freed

    def _new_handoff(self, cuda: bool) -> RegisteredHandoff | None:
        if self._registry is None:
            return None
        dev = self.device
        assert dev is not None
        if cuda:
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
        handoff = RegisteredHandoff(self._registry, to_device, new_event, self.stack, _host_dtype, _torch_dtype,
                                    pin=self.pin_memory, stats=self._handoff_stats)
        self._registry.handoffs.add(handoff)
        return handoff

    def _consume(self, q: queue.Queue[Any], stop: threading.Event, th: threading.Thread) -> Iterator[TorchBatch]:
        dev = self.device
        seen: tuple[Any, Any] = (None, None)  # (slab, stream) already waited for and recorded
        # The registered hand-off: (event, stream) last waited for, (buffer, stream) pairs recorded.
        waited: tuple[Any, Any] = (None, None)
        recorded: collections.deque[tuple[torch.Tensor, Any]] = collections.deque(maxlen=8)
        try:
            if self._stop is stop:
                th.start()
            while True:
                if self._stop is not stop:
                    raise DetloadError("this TorchLoader iteration was stopped: set_epoch(), load_state_dict(), "
                                       "close() or a new iter() was called since it began; start a new one")
                try:
                    item = q.get(timeout=POLL)
                except queue.Empty:
                    if not th.is_alive() and q.empty():
                        raise RuntimeError("detload's torch feeder thread ended without a result") from None
                    continue
                if isinstance(item, _End):
                    return
                if isinstance(item, _Failed):
                    err = item.error
                    item = t = slab = None
                    seen = waited = (None, None)
                    recorded.clear()
                    try:
                        raise err
                    finally:
                        del err  # no cycle through this frame: the buffers go with the error handled
                t, pos, event, slab = item
                if event is not None:
                    current = torch.cuda.current_stream(dev)
                    if isinstance(slab, tuple):
                        # The registered hand-off: batches of one block share its event and buffer.
                        if event is not waited[0] or current != waited[1]:
                            current.wait_event(event)
                            waited = (event, current)
                        for buf in slab:
                            if not any(b is buf and s == current for b, s in recorded):
                                buf.record_stream(current)
                                recorded.append((buf, current))
                    elif slab is None:
                        current.wait_event(event)
                        # The memory was allocated on the side stream; tell the allocator
                        # the training stream uses it, so it is not reused too early.
                        _each_any(t, functools.partial(_record, stream=current))
                    elif slab is not seen[0] or current != seen[1]:
                        # Once per slab and stream: every column of its batches lies in its memory.
                        current.wait_event(event)
                        slab.record_stream(current)
                        seen = (slab, current)
                self._pos = pos
                yield t
        finally:
            self._halt(stop, th, q)

    def _halt(self, stop: threading.Event, th: threading.Thread, q: queue.Queue[Any] | None) -> None:
        stop.set()
        try:
            if self._thread is th and th.ident is not None:
                # The feeder may be waiting inside the loader for a block (a slow or stalled read):
                # stopping the loader's pass wakes it at once, as a break does for a Loader.
                self.loader.stop()
        finally:
            self._join(th, q)

    def _join(self, th: threading.Thread, q: queue.Queue[Any] | None) -> None:
        if th is not threading.current_thread() and th.ident is not None:
            th.join(timeout=30.0)
        if q is not None:
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        if self._thread is th:
            self._stop = self._thread = self._queue = None

    def _shutdown(self) -> None:
        if self._stop is not None and self._thread is not None:
            self._halt(self._stop, self._thread, self._queue)


# What torch.utils.data.DataLoader(loader, batch_size=None) needs to iterate it rather than
# index it (Loader is registered by detload.loader, without importing torch).
torch.utils.data.IterableDataset.register(TorchLoader)


def _device(device: Any) -> torch.device | None:
    """``device=`` as a torch.device: None, the CPU, or a CUDA device (an int is a CUDA index)."""
    if device is None:
        return None
    dev: torch.device | None = None
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        if device >= 0:
            dev = torch.device("cuda", int(device))
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise OptionError(f"device must be None, 'cpu', 'cuda', 'cuda:N' or a CUDA index, got {device!r}")
    return dev


def _check_stack(stack: Mapping[str, Any] | None, loader: Loader) -> Stack:
    """Validate ``stack=`` against the columns the loader delivers; return it as tuples."""
    if stack is None:
        return ()
    if not isinstance(stack, Mapping):
        raise OptionError(f"stack must map an output name to a list of column names, got {type(stack).__name__}")
    specs = {s.name: s for s in loader.column_specs}
    seen: dict[str, str] = {}
    out: list[tuple[str, tuple[str, ...]]] = []
    for name, cols in stack.items():
        if not isinstance(name, str):
            raise OptionError(f"stack's keys are the names of the stacked tensors (str), got {name!r}")
        if isinstance(cols, str) or not isinstance(cols, (list, tuple)) \
                or not cols or not all(isinstance(c, str) for c in cols):
            raise OptionError(f"stack[{name!r}] must be a non-empty list of column names, got {cols!r}")
        dtypes: dict[str, str] = {}
        for c in cols:
            spec = specs.get(c)
            if spec is None:
                known = ", ".join(sorted(specs)[:8]) + (", ..." if len(specs) > 8 else "")
                raise OptionError(f"stack[{name!r}] names column {c!r}, which the loader does not deliver "
                                  f"(its columns: {known})")
            if spec.kind != "fixed" or spec.inner:
                what = f"variable-length ({spec.ragged_kind})" if spec.kind != "fixed" else f"{len(spec.inner) + 1}-D"
                raise OptionError(f"stack[{name!r}]: column {c!r} is {what}; only one-value-per-row "
                                  "columns can be stacked")
            if c in seen:
                where = f"twice in stack[{name!r}]" if seen[c] == name else f"in stack[{seen[c]!r}] and stack[{name!r}]"
                raise OptionError(f"column {c!r} is {where}; a column can be stacked once")
            seen[c] = name
            dtypes.setdefault(np.dtype(spec.dtype).name, c)
        if len(dtypes) > 1:
            mixed = " and ".join(f"{d} ({c})" for d, c in dtypes.items())
            raise OptionError(f"stack[{name!r}] mixes dtypes {mixed}; stack columns of one dtype")
        kinds = {c in loader.group_columns for c in cols}
        if len(kinds) > 1:
            g = [c for c in cols if c in loader.group_columns]
            raise OptionError(f"stack[{name!r}] mixes group columns {g} with item columns: a group column has one "
                              "row per group, an item column one per item; stack them in separate matrices")
        out.append((name, tuple(cols)))
    for name, _ in out:
        if name in specs and name not in seen:
            raise OptionError(f"stack name {name!r} is also a column that is not stacked; pick another name")
    return tuple(out)


def _check_unpack(unpack: Any, loader: Loader, dev: torch.device | None) -> Unpack:
    """``unpack=`` checked: "auto" is "device" with a CUDA device, else "host"; "device"
    with the CPU is "host" (the same expansion); the option needs a grouped loader."""
    if unpack == "auto":
        return "device" if dev is not None and dev.type == "cuda" else "host"
    if loader.group_by is None:
        raise OptionError(f"unpack={unpack!r} applies to a Loader with group_by=, which this one has not: "
                          "its batches are flat already")
    if unpack not in ("device", "host", None):
        raise OptionError(f"unpack must be 'device', 'host' or None, got {unpack!r}")
    if unpack == "device":
        if dev is None:
            raise OptionError("unpack='device' needs device= (e.g. device='cuda'): the batch is expanded on the "
                              "device it is copied to. Pass unpack='host' to expand it on the CPU, or "
                              "unpack=None for the packed tensors")
        if dev.type == "cpu":
            return "host"
    return unpack  # type: ignore[no-any-return]


def _put(q: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    return put_until(q, item, stop.is_set)


def local_device() -> torch.device:
    """``cuda:LOCAL_RANK`` under torchrun with GPUs, else the CPU: a convenience for DDP scripts."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
