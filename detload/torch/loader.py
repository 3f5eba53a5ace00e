"""`TorchLoader`: a `detload.Loader` iterated as tensors. Its feeder thread takes the Loader's batches,
has the iteration's `Handoff` (handoff.py) turn them into tensors, and queues one named message per
batch, `Ready`, then `End` or `Failed`; the training loop reads them in order.
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.utils.data

from .. import _hooks
from .._engine.messages import POLL, Channel, put_until
from .._hooks import Hooks
from .._torch_dataloader import refuse_auto_batching
from .._trace import StatsMark
from .._types import Column
from ..errors import DetloadError, OptionError
from ..loader import Loader, check_epoch, refuse_pickling, refuse_torch_workers
from ..packed import Packed
from ..stats import Stats
from .handoff import Handoff, PerColumn, PinnedSlab, Ready, Registered, Target, ZeroCopy
from .registry import HandoffStats, HostRegistry, cuda_registrar
from .tensors import Stack, TorchBatch, Unpack, finisher, wire

__all__ = ["End", "Failed", "Message", "TorchLoader", "local_device"]

# The registered hand-off's registries per Loader (and device): a buffer cannot be registered
# twice, so a second TorchLoader over the same Loader reuses the first's; gone with the Loader.
_REGISTRIES: weakref.WeakKeyDictionary[Loader, dict[Any, HostRegistry]] = weakref.WeakKeyDictionary()


class End(NamedTuple):
    """The feeder's last message: the pass is over."""


class Failed(NamedTuple):
    """The feeder's last message when reading or converting raised: ``error`` is raised in the loop."""

    error: BaseException


Message = Ready | End | Failed


class TorchLoader:
    """Iterate a `Loader` as dicts of tensors; what a training loop iterates directly.

    ``TorchLoader(loader, device=...)``, where ``loader`` is a `detload.Loader` (its
    options are the Loader's; this adapter's are below).

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
        loader: Loader,
        *,
        device: str | torch.device | None = None,
        pin_memory: bool = False,
        prefetch: int = 2,
        stack: Mapping[str, Any] | None = None,
        copy_batches: int = 1,
        check_ranks: bool = True,
        unpack: Unpack | str = "auto",
    ) -> None:
        if not isinstance(loader, Loader):
            raise OptionError(f"TorchLoader takes a detload.Loader, got {type(loader).__name__}: build the Loader "
                              "with its options and wrap it, TorchLoader(detload.Loader(source, batch_size=..., "
                              "seed=...), device=...)")
        self.loader = loader
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
        self._grouped = self.loader.group_by is not None  # its batches are `detload.Packed`
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
        self._queue: Channel[Message] | None = None

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
        refuse_auto_batching(self, "TorchLoader")  # DataLoader(tl) without batch_size=None
        self._shutdown()
        token = self._latest = object()
        return self._iterate(token)

    def _iterate(self, token: object) -> Iterator[TorchBatch]:
        if self._latest is not token:
            raise DetloadError("this TorchLoader iteration was stopped before it began: close() or a new "
                               "iter() was called since it was made; start a new one")
        if self.check_ranks:
            self.loader.check_ranks()
        handoff = self._handoff()
        it = iter(self.loader)
        self._pos = self.loader.position
        if not self._threaded:
            yield from self._direct(it, handoff)
            return
        q: Channel[Message] = Channel(maxsize=self.prefetch)
        stop = threading.Event()
        th = threading.Thread(target=self._feed, args=(it, q, stop, handoff), name="detload-torch-feeder",
                              daemon=True)
        self._stop, self._thread, self._queue = stop, th, q
        yield from self._consume(q, stop, th, handoff)

    def _handoff(self) -> Handoff:
        """This iteration's copy path, from the options as they are when it starts."""
        finish = finisher(self.unpack, self._group_names, self._columns) if self._grouped else None
        target = Target(self.device, self.pin_memory, self.stack, grouped=self._grouped, finish=finish,
                        expands_on_device=finish is not None and self.unpack == "device")
        if not self._threaded:
            return ZeroCopy(target)
        if self._registry is not None:
            return Registered(target, self._registry, self._handoff_stats)
        per_column = self._hooks.torch_per_column
        if self.stack or (not per_column and (self.pin_memory or self.copy_batches > 1)):
            return PinnedSlab(target, self.copy_batches)
        return PerColumn(target) if per_column else ZeroCopy(target)

    def _host(self, batch: Mapping[str, Column]) -> Mapping[str, Column]:
        """A batch as the host arrays a hand-off takes: a packed one as `wire` lays it out (group
        columns once per group), or unpacked here with ``unpack="host"``."""
        if isinstance(batch, Packed):
            return batch.unpack() if self.unpack == "host" else wire(batch)
        return batch

    def _direct(self, it: Iterator[dict[str, Column]], handoff: Handoff) -> Iterator[TorchBatch]:
        """No thread (``device=None`` without pinning): each batch converted in the loop itself."""
        loader = self.loader
        try:
            for batch in it:
                self._pos = loader.position
                # A PackedTensors with unpack=None: the declared type is the flat batch most loops index.
                yield handoff.convert([self._host(batch)], [self._pos])[0].batch  # type: ignore[misc]
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def _feed(self, it: Iterator[dict[str, Column]], q: Channel[Message], stop: threading.Event,
              handoff: Handoff) -> None:
        """Background thread: take `handoff.per_copy` batches at a time, convert them (pin, start
        the device copy), and queue a `Ready` for each, ``prefetch`` ahead; then `End`, or
        `Failed` with the error (after the good batches read before it)."""
        batches: list[Mapping[str, Column]] = []
        readies: list[Ready] | None = None
        ready: Ready | None = None
        try:
            ended = False
            failed: Exception | None = None
            while not ended:
                batches = []
                steps: list[int] = []
                while len(batches) < handoff.per_copy:
                    if stop.is_set():
                        return  # the loop has left: read no further
                    try:
                        batches.append(self._host(next(it)))
                    except StopIteration:
                        ended = True
                        break
                    except Exception as exc:  # noqa: BLE001 - raised after the good batches before it
                        if not batches:
                            raise
                        failed, ended = exc, True
                        break
                    steps.append(self.loader.position)
                if not batches or stop.is_set():
                    break
                readies = handoff.convert(batches, steps)
                batches = []
                for ready in readies:
                    if not _put(q, ready, stop):
                        return
                readies = ready = None  # this frame must not keep a buffer past its batches
            if failed is not None:
                err, failed = failed, None
                try:
                    raise err
                finally:
                    del err  # no cycle through this frame
            _put(q, End(), stop)
        except BaseException as exc:  # noqa: BLE001 - carried to the training loop
            # The error's traceback holds this frame: let go of its buffers before handing it on,
            # or they live as long as the error (and until the cyclic collector runs).
            readies = ready = None
            batches = []
            _put(q, Failed(exc), stop)
        finally:
            handoff.drain()  # no copy reads a segment once its block goes back to its worker
            close = getattr(it, "close", None)
            if close is not None:
                close()  # stops the loader's run: workers drop the rest, shared memory is freed

    def _consume(self, q: Channel[Message], stop: threading.Event, th: threading.Thread,
                 handoff: Handoff) -> Iterator[TorchBatch]:
        try:
            if self._stop is stop:
                th.start()
            while True:
                if self._stop is not stop:
                    raise DetloadError("this TorchLoader iteration was stopped: set_epoch(), load_state_dict(), "
                                       "close() or a new iter() was called since it began; start a new one")
                try:
                    msg = q.get(timeout=POLL)
                except queue.Empty:
                    if not th.is_alive() and q.empty():
                        raise RuntimeError("detload's torch feeder thread ended without a result") from None
                    continue
                if isinstance(msg, End):
                    return
                if isinstance(msg, Failed):
                    err = msg.error
                    del msg
                    handoff.forget()
                    try:
                        raise err
                    finally:
                        del err  # no cycle through this frame: the buffers go with the error handled
                handoff.wait(msg)
                self._pos = msg.step
                yield msg.batch  # type: ignore[misc]  # or a PackedTensors (unpack=None), as in _direct
        finally:
            self._halt(stop, th, q)

    def _halt(self, stop: threading.Event, th: threading.Thread, q: Channel[Message] | None) -> None:
        stop.set()
        try:
            if self._thread is th and th.ident is not None:
                # The feeder may be waiting inside the loader for a block (a slow or stalled read):
                # stopping the loader's pass wakes it at once, as a break does for a Loader.
                self.loader.stop()
        finally:
            self._join(th, q)

    def _join(self, th: threading.Thread, q: Channel[Message] | None) -> None:
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


def _put(q: Channel[Any], item: Any, stop: threading.Event) -> bool:
    return put_until(q, item, stop.is_set)


def local_device() -> torch.device:
    """``cuda:LOCAL_RANK`` under torchrun with GPUs, else the CPU: a convenience for DDP scripts."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
