"""How the merger cuts a step out of the blocks it holds: one interface (`StepCutter`), two ways.

`FlatCutter` slices each owned partition's micro-batch out of its blocks and joins
them into a dict of columns; `PackedCutter` (group_by) does the same with whole
groups and joins them into a `Packed`. Both return the micro-batches as well, which
the merger hashes into the step's manifest line the same way for either.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .._types import Column, ColumnSpec, Ragged
from ..packed import Packed
from ..plan import Plan
from .block import slice_rows
from .groups import block_piece, pack

__all__ = ["Buffer", "FlatCutter", "PackedCutter", "StepCutter", "make_cutter"]

#: One partition's blocks the merger still needs: (the partition's row the block starts at, its columns).
Buffer = deque[tuple[int, dict[str, Column]]]


class StepCutter(Protocol):
    def cut(self, step: int, owned: Sequence[int], buffers: Mapping[int, Buffer]
            ) -> tuple[dict[str, Column] | Packed, Sequence[Any], int]:
        """Step ``step``: (the batch, each owned partition's micro-batch, the batch's rows or items).

        Drops from each partition's buffer the blocks no later step needs."""
        ...


def make_cutter(plan: Plan, specs: Sequence[ColumnSpec], group_columns: Sequence[str] | None) -> StepCutter:
    """The cutter for ``plan``: packed when the loader groups (``group_columns`` set), else flat."""
    if group_columns is None:
        return FlatCutter(plan, specs)
    return PackedCutter(plan, specs, group_columns)


def concat(parts: Sequence[Column]) -> Column:
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], Ragged):
        rparts: list[Ragged] = list(parts)  # type: ignore[arg-type]
        # A list of strings joins its strings as a column of its own.
        values = (concat([p.values for p in rparts]) if isinstance(rparts[0].values, Ragged)
                  else np.concatenate([p.values for p in rparts]))  # type: ignore[misc]
        offs = [np.zeros(1, dtype=np.int64)]
        base = 0
        for p in rparts:
            offs.append(p.offsets[1:] + base)
            base += int(p.offsets[-1])
        return Ragged(values, np.concatenate(offs), rparts[0].kind)
    return np.concatenate(parts, axis=0)  # type: ignore[arg-type]


def _join(pieces: list[dict[str, Column]], specs: Sequence[ColumnSpec]) -> dict[str, Column]:
    """Pieces' columns concatenated (the piece itself when there is one; empty columns for none)."""
    if not pieces:
        return {s.name: _empty(s) for s in specs}
    if len(pieces) == 1:
        return pieces[0]
    return {s.name: concat([pc[s.name] for pc in pieces]) for s in specs}


def _empty(spec: ColumnSpec) -> Column:
    if spec.kind == "ragged":
        values: np.ndarray | Ragged = np.empty(0, dtype=np.dtype(spec.dtype))
        if spec.item_kind is not None:
            values = Ragged(values, np.zeros(1, dtype=np.int64), spec.item_kind)
        return Ragged(values, np.zeros(1, dtype=np.int64), spec.ragged_kind)
    return np.empty((0, *spec.inner), dtype=np.dtype(spec.dtype))


def _drop_before(buf: Buffer, hi: int) -> None:
    """Rows below ``hi`` are never needed again."""
    while buf and buf[0][0] + len(next(iter(buf[0][1].values()))) <= hi:
        buf.popleft()


class FlatCutter:
    """Batches as dicts of columns: each partition's rows of the step, partitions in order."""

    def __init__(self, plan: Plan, specs: Sequence[ColumnSpec]) -> None:
        self.plan = plan
        self.specs = list(specs)

    def _micro(self, p: int, step: int, buf: Buffer) -> dict[str, Column]:
        lo, hi = self.plan.micro_range(p, step)
        pieces: list[dict[str, Column]] = []
        for start, cols in buf:
            n = len(next(iter(cols.values())))
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                i, j = a - start, b - start
                # Arrays sliced in place: a call per column was a third of the merger's time.
                pieces.append({k: c[i:j] if type(c) is np.ndarray else slice_rows(c, i, j) for k, c in cols.items()})
        _drop_before(buf, hi)
        return _join(pieces, self.specs)

    def cut(self, step: int, owned: Sequence[int], buffers: Mapping[int, Buffer]
            ) -> tuple[dict[str, Column], list[dict[str, Column]], int]:
        micros = [self._micro(p, step, buffers[p]) for p in owned]
        batch = micros[0] if len(micros) == 1 else {s.name: concat([m[s.name] for m in micros]) for s in self.specs}
        return batch, micros, len(next(iter(batch.values())))


class PackedCutter:
    """Batches as `Packed` (group_by): whole groups, item columns per item and group columns per
    group, partitions in order."""

    def __init__(self, plan: Plan, specs: Sequence[ColumnSpec], group_columns: Sequence[str]) -> None:
        assert plan.group_bounds is not None
        self.plan = plan
        self.group_bounds = plan.group_bounds
        self.group_columns = tuple(group_columns)
        gset = set(self.group_columns)
        self.names = [s.name for s in specs]
        self.item_specs = [s for s in specs if s.name not in gset]
        self.group_specs = [s for s in specs if s.name in gset]

    def _micro(self, p: int, step: int, buf: Buffer) -> Packed:
        """Partition ``p``'s micro-batch at ``step``: item columns sliced from the blocks, group
        columns taken at each group's first row (the plan knows where they are)."""
        lo, hi = self.plan.micro_range(p, step)
        gb = self.group_bounds[p]
        items: list[dict[str, Column]] = []
        groups: list[dict[str, Column]] = []
        for start, cols in buf:
            n = len(next(iter(cols.values())))  # an item column: grouped blocks list them first
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                # Blocks begin and end at group starts, so a piece holds whole groups; a block's
                # group columns hold one row per group (see groups.build_grouped).
                g0 = int(np.searchsorted(gb, start))
                it, gr = block_piece(cols, a - start, b - start, int(np.searchsorted(gb, a)) - g0,
                                     int(np.searchsorted(gb, b)) - g0, self.group_columns)
                items.append(it)
                groups.append(gr)
        _drop_before(buf, hi)
        i, j = int(np.searchsorted(gb, lo)), int(np.searchsorted(gb, hi))
        offsets = gb[i : j + 1] - lo
        return pack(_join(items, self.item_specs), _join(groups, self.group_specs),
                    offsets if len(offsets) else np.zeros(1, dtype=np.int64), self.names)

    def cut(self, step: int, owned: Sequence[int], buffers: Mapping[int, Buffer]) -> tuple[Packed, list[Packed], int]:
        micros = [self._micro(p, step, buffers[p]) for p in owned]
        if len(micros) == 1:
            batch = micros[0]
        else:
            offs, base = [np.zeros(1, dtype=np.int64)], 0
            for mp in micros:
                offs.append(mp.offsets[1:] + base)
                base += mp.n_items
            batch = pack({k: concat([mp.items[k] for mp in micros]) for k in micros[0].items},
                         {k: concat([mp.groups[k] for mp in micros]) for k in micros[0].groups},
                         np.concatenate(offs), micros[0].columns)
        return batch, micros, batch.n_items
