"""Batches as tensors: `to_torch` (zero-copy), `RaggedTensor`, `PackedTensors`, and the slab that
packs whole batches (``stack=`` groups included) into one byte buffer and views it back as tensors.

Shared by every copy path of detload/torch/handoff.py; nothing here starts a thread or a copy to a device.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

from .._types import Column, Ragged
from ..errors import OptionError
from ..packed import Packed

__all__ = ["ALIGN", "GROUP_INDEX", "OFFSETS", "Finish", "PackedTensors", "Part", "RaggedTensor", "Stack",
           "TorchBatch", "TorchColumn", "Unpack", "apply", "collect_ragged", "each_any", "expand", "finisher",
           "host_dtype", "pack", "ragged_arrays", "ragged_count", "ragged_tensor", "to_torch", "torch_dtype",
           "unpack_slab", "wire"]


class RaggedTensor(NamedTuple):
    """A variable-length column as two tensors: row ``i`` is ``values[offsets[i]:offsets[i+1]]``.

    ``offsets`` is int64 with ``rows + 1`` entries starting at 0; strings and
    binary hold their bytes as uint8 ``values`` (``kind`` is ``"utf8"``,
    ``"binary"`` or ``"list"``). A list of strings nests, as `detload.Ragged`
    does: its ``values`` are a RaggedTensor of kind ``"utf8"`` (or ``"binary"``)
    over every string's bytes, and its ``offsets`` index those strings. A
    NamedTuple, so collate/transfer helpers that walk tuples (Lightning's
    ``move_data_to_device``) move every tensor.
    """

    values: torch.Tensor | RaggedTensor
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
        if isinstance(self.values, RaggedTensor):
            raise TypeError("to_nested() takes a list of numbers; a list of strings has no jagged tensor form "
                            "(its values are a RaggedTensor of the strings' bytes)")
        return torch.nested.nested_tensor_from_jagged(self.values, self.offsets)


TorchColumn = torch.Tensor | RaggedTensor
TorchBatch = dict[str, TorchColumn]
#: ``stack=`` as checked: (output name, the columns stacked into it) per group.
Stack = tuple[tuple[str, tuple[str, ...]], ...]
Unpack = Literal["device", "host"] | None


def host_dtype(name: str, a: np.ndarray) -> np.dtype:
    """The dtype column ``name``'s array has as a tensor; OptionError if torch cannot hold it."""
    if a.dtype.kind in "mM":
        # datetime64/timedelta64: torch has no such dtype; the int64 ticks keep the bytes.
        return np.dtype(np.int64)
    if a.dtype.kind not in "biufc":
        raise OptionError(f"column {name!r} has dtype {a.dtype}, which torch cannot hold; leave it out with columns=")
    return a.dtype


def _tensor(name: str, a: np.ndarray) -> torch.Tensor:
    if a.dtype.kind not in "biufc":  # numbers go as they are (the common case, checked first)
        a = a.view(host_dtype(name, a))
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
            kind, arrays = ragged_arrays(col)
            out[name] = ragged_tensor(kind, [_tensor(name, a) for a in arrays])
        else:
            out[name] = _tensor(name, col)
    return out


def ragged_arrays(col: Ragged) -> tuple[str, list[np.ndarray]]:
    """A Ragged as flat arrays: its kinds from the outside in ("list/utf8" for a list of
    strings) and its arrays, innermost values first, then each level's offsets from the
    inside out (values, offsets for a plain Ragged). `ragged_tensor` rebuilds it."""
    kinds: list[str] = []
    offsets: list[np.ndarray] = []
    c = col
    while isinstance(c.values, Ragged):
        kinds.append(c.kind)
        offsets.append(c.offsets)
        c = c.values
    kinds.append(c.kind)
    offsets.append(c.offsets)
    return "/".join(kinds), [c.values, *reversed(offsets)]


def ragged_tensor(kind: str, tensors: Sequence[torch.Tensor]) -> RaggedTensor:
    """The RaggedTensor of the tensors of `ragged_arrays`'s arrays (``kind``: its kind text)."""
    out: torch.Tensor | RaggedTensor = tensors[0]
    for k, offsets in zip(reversed(kind.split("/")), tensors[1:], strict=True):
        out = RaggedTensor(out, offsets, k)
    assert isinstance(out, RaggedTensor)
    return out


def ragged_count(kind: str) -> int:
    """How many arrays `ragged_arrays` gives for a Ragged of this kind text."""
    return kind.count("/") + 2


# Names the group index and offsets of a packed batch travel under, beside its columns
# (column names come from Parquet and never start with a NUL).
GROUP_INDEX = "\x00group_index"
OFFSETS = "\x00offsets"


def expand(col: TorchColumn, index: torch.Tensor) -> TorchColumn:
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
    return RaggedTensor(expand(col.values, src), offsets, col.kind)


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
            out[name] = col if col is not None else expand(self.groups[name], self.group_index)
        for name, col in self.items.items():
            out.setdefault(name, col)
        for name, col in self.groups.items():
            if name not in out:
                out[name] = expand(col, self.group_index)
        return out

    def to(self, *args: Any, **kwargs: Any) -> PackedTensors:
        move = functools.partial(_move, args=args, kwargs=kwargs)
        return PackedTensors(apply(self.items, move), apply(self.groups, move), move(self.group_index),
                             move(self.offsets), self.columns)

    def pin_memory(self) -> PackedTensors:
        pin = torch.Tensor.pin_memory
        return PackedTensors(apply(self.items, pin), apply(self.groups, pin), pin(self.group_index),
                             pin(self.offsets), self.columns)


def _move(x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    return x.to(*args, **kwargs)


def wire(batch: Packed) -> dict[str, Column]:
    """A packed batch as one flat mapping of its arrays (what a slab carries)."""
    return {**batch.items, **batch.groups, GROUP_INDEX: batch.group_index, OFFSETS: batch.offsets}


def _from_wire(t: TorchBatch, group_names: frozenset[str], columns: tuple[str, ...]) -> PackedTensors:
    """The `PackedTensors` of a batch that travelled as `wire` made it (stacks included)."""
    gi, offs = t[GROUP_INDEX], t[OFFSETS]
    assert isinstance(gi, torch.Tensor) and isinstance(offs, torch.Tensor)
    items = {k: v for k, v in t.items() if k not in group_names and k not in (GROUP_INDEX, OFFSETS)}
    groups = {k: v for k, v in t.items() if k in group_names}
    return PackedTensors(items, groups, gi, offs, columns)


#: What the training loop receives of a packed batch that travelled as `wire` made it.
Finish = Callable[[TorchBatch], TorchBatch | PackedTensors]


def _finish(t: TorchBatch, unpack: Unpack, group_names: frozenset[str], columns: tuple[str, ...]) -> Any:
    packed = _from_wire(t, group_names, columns)
    return packed if unpack is None else packed.unpack()


def finisher(unpack: Unpack, group_names: frozenset[str], columns: tuple[str, ...]) -> Finish | None:
    """The `Finish` of a grouped loader's batches; None where the tensors are handed out as
    they are (``unpack="host"``: the batch was unpacked before it became tensors).

    ``group_names``: the names that travel one row per group (group columns and their
    stacks); ``columns``: the flat column order.
    """
    if unpack == "host":
        return None
    return functools.partial(_finish, unpack=unpack, group_names=group_names, columns=columns)


def _apply_one(v: TorchColumn, fn: Callable[[torch.Tensor], torch.Tensor]) -> TorchColumn:
    return RaggedTensor(_apply_one(v.values, fn), fn(v.offsets), v.kind) if isinstance(v, RaggedTensor) else fn(v)


def apply(batch: TorchBatch, fn: Callable[[torch.Tensor], torch.Tensor]) -> TorchBatch:
    return {k: _apply_one(v, fn) for k, v in batch.items()}


def _each_one(v: TorchColumn, fn: Callable[[torch.Tensor], Any]) -> None:
    if isinstance(v, RaggedTensor):
        _each_one(v.values, fn)
        fn(v.offsets)
    else:
        fn(v)


def _each(batch: TorchBatch, fn: Callable[[torch.Tensor], Any]) -> None:
    for v in batch.values():
        _each_one(v, fn)


def each_any(batch: TorchBatch | PackedTensors, fn: Callable[[torch.Tensor], Any]) -> None:
    """``fn`` on every tensor of a flat or packed batch."""
    if isinstance(batch, PackedTensors):
        _each(batch.items, fn)
        _each(batch.groups, fn)
        fn(batch.group_index)
        fn(batch.offsets)
    else:
        _each(batch, fn)


# -- the slab: whole batches in one byte buffer ----------------------------------------------

# Each array starts on this byte boundary inside a slab: a multiple of every
# dtype's size (so views of the slab can take any dtype) and of the GPU's
# preferred load width.
ALIGN = 256
_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


class Part(NamedTuple):
    """Where one array of a batch lies in a slab."""

    name: str
    kind: str | None  # None for a plain column; a Ragged's kind text (`ragged_arrays`) for each of its arrays
    offset: int  # bytes from the slab's start
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]  # contiguous, in elements


def torch_dtype(dt: np.dtype) -> torch.dtype:
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


def pack(batches: Sequence[Mapping[str, Column]], pin: bool,
         stack: Stack = ()) -> tuple[torch.Tensor, list[list[Part]]]:
    """Copy every array of some batches into one (pinned) byte slab; return it and where each array lies.

    One allocation and one host-to-device copy per slab instead of two per
    column and batch: each torch call of the feeder thread lets the training
    thread's GIL hand-offs in, so it makes few. The copies are NumPy's. Each
    ``stack`` group becomes one ``(rows, k)`` array (one ``np.stack``), after
    the columns left unstacked.
    """
    stacked = {c for _, cols in stack for c in cols}
    work: list[tuple[np.ndarray | list[np.ndarray], np.dtype, Part]] = []
    layout: list[list[Part]] = []
    total = 0
    for batch in batches:
        items: list[tuple[str, str | None, np.ndarray | list[np.ndarray]]] = []
        for name, col in batch.items():
            if name in stacked:
                continue
            if isinstance(col, Ragged):
                rkind, arrays = ragged_arrays(col)
                items.extend((name, rkind, a) for a in arrays)
            else:
                items.append((name, None, col))
        for out, cols in stack:
            items.append((out, None, [batch[c] for c in cols]))  # type: ignore[misc]  # validated: 1-D, fixed
        parts: list[Part] = []
        for name, kind, a in items:
            first = a[0] if isinstance(a, list) else a
            dt = host_dtype(name, first)
            shape = (len(first), len(a)) if isinstance(a, list) else first.shape
            nbytes = int(np.prod(shape)) * dt.itemsize
            part = Part(name, kind, total, nbytes, torch_dtype(dt), shape, _contiguous_stride(shape))
            parts.append(part)
            work.append((a, dt, part))
            total += -(-nbytes // ALIGN) * ALIGN
        layout.append(parts)
    slab = torch.empty(max(total, ALIGN), dtype=torch.uint8, device="cpu", pin_memory=pin)
    buf = slab.numpy()
    for a, dt, p in work:
        dst = buf[p.offset : p.offset + p.nbytes].view(dt).reshape(p.shape)
        if isinstance(a, list):
            np.stack([x.view(dt) for x in a], axis=1, out=dst, casting="no")
        else:
            np.copyto(dst, a.view(dt), casting="no")
    return slab, layout


def unpack_slab(slab: torch.Tensor, parts: list[Part], typed: dict[torch.dtype, torch.Tensor]) -> TorchBatch:
    """One batch as tensors over ``slab``'s memory (on whichever device it now is); ``typed``
    caches the slab viewed as each dtype (share it across a slab's batches).

    ``.data`` makes each one a tensor of its own for autograd, not a view: views of one
    base share its version counter, so an in-place change of one column (normalising a
    target, say) would fail ``backward()`` through any other.
    """
    out: TorchBatch = {}
    pending: dict[str, list[torch.Tensor]] = {}
    for p in parts:
        whole = typed.get(p.dtype)
        if whole is None:
            whole = typed[p.dtype] = slab.view(p.dtype)
        t = whole.as_strided(p.shape, p.stride, p.offset // whole.element_size()).data
        if p.kind is None:
            out[p.name] = t
        else:
            got = collect_ragged(pending, p.name, p.kind, t)
            if got is not None:
                out[p.name] = got
    return out


def collect_ragged(pending: dict[str, list[torch.Tensor]], name: str, kind: str,
                   t: torch.Tensor) -> RaggedTensor | None:
    """Add ``t``, the next of column ``name``'s `ragged_arrays` as a tensor; its RaggedTensor once
    all of them are in (None before)."""
    have = pending.setdefault(name, [])
    have.append(t)
    if len(have) < ragged_count(kind):
        return None
    del pending[name]
    return ragged_tensor(kind, have)
