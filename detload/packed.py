"""`Packed`: a batch of grouped rows (``group_by``) with each group's columns held once.

The loader yields one per step when ``group_by`` is set. ``unpack()`` gives back the
flat batch, exactly the stored rows of its items; docs/packing.md defines the batching
rule and the canonical form the manifest hashes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from ._columns import take_rows
from ._types import Column, Ragged

__all__ = ["Packed"]


def _rows(col: Column) -> int:
    return len(col.offsets) - 1 if isinstance(col, Ragged) else len(col)


class Packed:
    """One batch of ``n_items`` items in ``n_groups`` groups, each group's columns held once.

    - ``items``: the item columns, ``n_items`` rows each;
    - ``groups``: the group columns (the ``group_by`` key among them), ``n_groups`` rows;
    - ``group_index``: int64, one per item: the row of its group in ``groups``;
    - ``offsets``: int64, ``n_groups + 1`` values: group g's items are rows
      ``offsets[g]:offsets[g + 1]`` of ``items`` (groups are contiguous, in batch order).

    ``columns`` is the flat column order (what ``unpack()`` returns). A group that
    ``max_group_items`` split appears as several groups with equal rows (consecutive only
    without shuffling: each chunk is a group of its own).
    """

    __slots__ = ("columns", "group_index", "groups", "items", "offsets")

    def __init__(self, items: Mapping[str, Column], groups: Mapping[str, Column], group_index: np.ndarray,
                 offsets: np.ndarray, columns: Sequence[str] | None = None) -> None:
        self.items: dict[str, Column] = dict(items)
        self.groups: dict[str, Column] = dict(groups)
        self.group_index = group_index
        self.offsets = offsets
        self.columns: tuple[str, ...] = tuple(columns) if columns is not None else (*self.items, *self.groups)

    @property
    def n_items(self) -> int:
        return len(self.group_index)

    @property
    def n_groups(self) -> int:
        return len(self.offsets) - 1

    def unpack(self) -> dict[str, Column]:
        """The flat batch: group columns expanded by ``group_index``, columns in ``columns`` order.

        Item columns are the packed arrays themselves; each group column is a new array.
        """
        out: dict[str, Column] = {}
        for name in self.columns:
            col = self.items.get(name)
            out[name] = col if col is not None else take_rows(self.groups[name], self.group_index)
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __repr__(self) -> str:
        return (f"Packed(n_items={self.n_items}, n_groups={self.n_groups}, items={list(self.items)}, "
                f"groups={list(self.groups)})")

    def check(self) -> None:
        """AssertionError unless the parts agree in length (tests and tools)."""
        assert self.offsets.dtype == np.int64 and self.group_index.dtype == np.int64
        assert len(self.offsets) >= 1 and self.offsets[0] == 0 and self.offsets[-1] == self.n_items
        assert all(_rows(c) == self.n_items for c in self.items.values())
        assert all(_rows(c) == self.n_groups for c in self.groups.values())
