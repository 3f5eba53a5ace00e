"""What both orders' planners share: cutting units at partition boundaries, counting steps,
a rank's schedule of blocks, and the error of a drop_last that drops every row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import OptionError
from ..plan import OrderOptions, Range, Unit

__all__ = ["cut_stream", "cut_unit", "drop_all_error", "rank_schedule", "step_count"]


def step_count(part_rows: Sequence[int], m: int, drop_last: bool) -> int:
    """Steps every rank takes: each partition gives one micro-batch of ``m`` rows per step, so
    the shortest partition's full micro-batches (drop_last) or the longest one's, last short."""
    return min(r // m for r in part_rows) if drop_last else max(-(-r // m) for r in part_rows)


def rank_schedule(blocks: Sequence[Sequence[Any]], options: OrderOptions, rank: int, steps: int) -> tuple[Any, ...]:
    """The blocks of ``rank``'s partitions that the epoch's ``steps`` reach, in the order the
    merger needs them (by first step, then partition, then number)."""
    per = options.partitions // options.world_size
    needed = [b for q in range(rank * per, (rank + 1) * per) for b in blocks[q] if b.first_step < steps]
    return tuple(sorted(needed, key=lambda b: (b.first_step, b.partition, b.number)))


def cut_unit(unit: Unit, offsets: Sequence[int]) -> tuple[list[Unit], int]:
    """``unit`` cut before each of ``offsets`` (increasing, inside it), and how many
    row groups two pieces share (each such cut makes one more read of a row group)."""
    pieces: list[Unit] = []
    shared = 0
    bounds = [0, *offsets, unit.rows]
    for lo, hi in zip(bounds, bounds[1:]):
        ranges: list[Range] = []
        pos = 0
        for r in unit.ranges:
            a, b = max(lo, pos), min(hi, pos + r.rows)
            if a < b:
                ranges.append(Range(r.file, r.row_group, r.first + a - pos, b - a))
            pos += r.rows
        groups = tuple(g - lo for g in unit.groups if lo <= g < hi)
        pieces.append(Unit(tuple(ranges), groups, unit.selection))
    for left, right in zip(pieces, pieces[1:]):
        last, first = left.ranges[-1], right.ranges[0]
        shared += (last.file, last.row_group) == (first.file, first.row_group)
    return pieces, shared


def cut_stream(units: Sequence[Unit], order: np.ndarray, rows: np.ndarray, cuts: dict[int, list[int]]
               ) -> tuple[list[Unit], list[int], list[int], np.ndarray, int]:
    """The stream of ``units`` taken in ``order`` (their rows ``rows[order]``), each unit at
    stream position i cut before the offsets ``cuts[i]``: the pieces, each piece's source unit
    and first row in it, the pieces' rows, and the row groups read twice because of the cuts."""
    order_l = order.tolist()
    pieces: list[Unit] = [units[j] for j in order_l]
    sources: list[int] = list(order_l)
    offsets: list[int] = [0] * len(order_l)
    piece_rows = rows[order]
    redundant = 0
    for i in sorted(cuts, reverse=True):  # back to front: earlier positions stay valid
        cut, shared = cut_unit(pieces[i], cuts[i])
        redundant += shared
        pieces[i : i + 1] = cut
        sources[i : i + 1] = [sources[i]] * len(cut)
        offsets[i : i + 1] = [0, *cuts[i]]
        piece_rows = np.concatenate([piece_rows[:i], [c.rows for c in cut], piece_rows[i + 1 :]])
    return pieces, sources, offsets, piece_rows, redundant


def drop_all_error(options: OrderOptions, total: int, part_rows: Sequence[int]) -> OptionError:
    P, m = options.partitions, options.micro_batch
    return OptionError(
        f"drop_last=True drops every row: the epoch holds {total} rows, the smallest of the "
        f"{P} partitions {min(part_rows)}, fewer than one micro-batch of {m} rows (global batch "
        f"{options.global_batch_size} = {P} x {m}). Use a smaller batch_size or drop_last=False."
    )
