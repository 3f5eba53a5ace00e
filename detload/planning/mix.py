"""The mixed order's epoch planner (plan format 3, ``order="mix"``): stratified windows.

Units are spread over partitions one from every P consecutive ones, each partition's pieces
over tasks one from every T consecutive ones (`spread`), and each block of a task takes one
chunk of every piece of the task (a rotation per piece; a chunk is runs spread over the piece,
`MixTask.block_chunks`), its rows then permuted. Pure function, no I/O; docs/determinism.md
states every step and stream.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._streams import TAG_MIX_PARTS, TAG_MIX_TASKS, mix_raw, mix_rotations
from ..plan import (
    DEFAULT_MIX_WINDOW,
    DEFAULT_WINDOW_ROWS,
    MixBlock,
    MixPlan,
    MixTask,
    OrderOptions,
    UnitList,
    mix_block_sizes,
)
from .common import cut_stream, drop_all_error
from .common import rank_schedule as _rank_schedule
from .common import step_count as _steps

__all__ = ["default_block_rows", "default_mix_window", "make_mix_plan", "resolve_mix", "spread"]


def spread(n: int, groups: int, keys: np.ndarray) -> np.ndarray:
    """The group (0..groups-1) of each of ``n`` positions, at most one position of every stratum
    of ``groups`` consecutive positions per group (the last stratum may be short).

    ``keys``: at least ``ceil(n / groups) * groups`` raw words of one stream; stratum s gives
    its slot i to group ``sigma_s[i]``, the stable argsort of the stratum's words. So group
    sizes differ by at most one and each group's positions span the whole list.
    """
    strata = -(-n // groups)
    k = np.asarray(keys[: strata * groups], dtype=np.uint64).reshape(strata, groups)
    return np.argsort(k, axis=1, kind="stable").reshape(-1)[:n].astype(np.int64)


def _median(rows: np.ndarray) -> int:
    return max(1, int(np.median(rows))) if len(rows) else 1


def _total(rows: np.ndarray) -> int:
    return max(1, int(np.sum(rows, dtype=np.int64)))


def default_mix_window(rows: np.ndarray) -> int:
    """The default window: 64 row groups, or more where they are small, so that a window holds
    about `DEFAULT_WINDOW_ROWS` rows (1,048,576: 64 row groups of 16,384): ``max(64, 2**20 x n
    // total rows)``, the row groups' mean, not their median, so that a few large row groups
    among many small ones do not make a window of millions of rows (tasks are dealt equal
    counts of row groups spread over the partition, so a task holds about K x the mean rows).
    A window counted in row groups alone made small row groups mix in small windows: 196 row
    groups of 1,024 rows were four tasks of 49, and a model's AUC varied over seeds 2x as much
    as with an i.i.d. shuffle (docs/mixing-design.md, As built)."""
    return max(DEFAULT_MIX_WINDOW, DEFAULT_WINDOW_ROWS * len(rows) // _total(rows))


def default_block_rows(rows: np.ndarray, window: int, partitions: int = 1) -> int:
    """The default block size: 4 x the median unit rows (the windowed order's default block), or
    more where a task holds more rows than 64 row groups of that median: a full task (``window``
    row groups, or a partition's share of the units if fewer, of the mean rows) is then cut into
    about 16 blocks. A block takes a chunk of every row group of its task, so blocks of 4 row
    groups from a window of hundreds would be hundreds of chunks of a few rows each, every
    chunk's copy a call of its own."""
    n = len(rows)
    held = min(window, -(-n // partitions))
    return max(4 * _median(rows), -(-held * _total(rows) // (16 * max(1, n))))


def resolve_mix(options: OrderOptions, rows: np.ndarray) -> OrderOptions:
    """``options`` with the mixed order's defaults (None) resolved from the units' rows."""
    if options.order != "mix" or (options.mix_window is not None and options.block_rows is not None):
        return options
    window = options.mix_window if options.mix_window is not None else default_mix_window(rows)
    block = options.block_rows if options.block_rows is not None else default_block_rows(
        rows, window, options.partitions)
    return dataclasses.replace(options, mix_window=window, block_rows=block)


def make_mix_plan(units: UnitList, options: OrderOptions, *, epoch: int, rank: int, fingerprint: str) -> MixPlan:
    """Plan epoch ``epoch`` of the mixed order for ``rank`` (``units`` and ``options`` checked)."""
    options = resolve_mix(options, units.rows)
    n = len(units)
    P = options.partitions
    m = options.micro_batch
    K, S = options.mix_window, options.block_rows
    assert K is not None and S is not None
    # 1. Partitions: one unit of every P consecutive ones to each, then format 2's cut by rows
    #    of the stream (partition 0's units in canonical order, then partition 1's, ...).
    if P > 1 and options.shuffle:
        group = spread(n, P, mix_raw(TAG_MIX_PARTS, options.seed, -(-n // P) * P, epoch))
        order = np.lexsort((np.arange(n), group)).astype(np.int64)
    else:
        order = np.arange(n, dtype=np.int64)
    piece_rows = units.rows[order]
    ends = np.cumsum(piece_rows)
    total = int(ends[-1])
    bounds = [p * total // P for p in range(P + 1)]
    cuts: dict[int, list[int]] = {}
    for b in bounds[1:-1]:
        i = int(np.searchsorted(ends, b, side="right"))
        if i < n:
            c = b - (int(ends[i]) - int(piece_rows[i]))
            if c > 0 and (not cuts.get(i) or cuts[i][-1] != c):
                cuts.setdefault(i, []).append(c)
    pieces, sources, offsets, piece_rows, redundant = cut_stream(units.units, order, units.rows, cuts)
    csum = np.concatenate([[0], np.cumsum(piece_rows)])
    part_of = np.searchsorted(np.asarray(bounds), csum[:-1], side="right") - 1
    edges = np.searchsorted(part_of, np.arange(P + 1), side="left").tolist()
    src_a = np.asarray(sources, dtype=np.int64)
    off_a = np.asarray(offsets, dtype=np.int64)
    rows_a = np.asarray(piece_rows, dtype=np.int64)

    tasks: list[tuple[MixTask, ...]] = []
    blocks: list[tuple[MixBlock, ...]] = []
    for p in range(P):
        lo, hi = edges[p], edges[p + 1]
        # Back to canonical order within the partition (by source unit, then first row).
        idx = np.arange(lo, hi)[np.lexsort((off_a[lo:hi], src_a[lo:hi]))]
        n_p = len(idx)
        ts: list[MixTask] = []
        bs: list[MixBlock] = []
        if n_p:
            # 2. Tasks: T = ceil(n_p / K), each one piece of every T consecutive pieces.
            T = -(-n_p // K)
            task_of = (spread(n_p, T, mix_raw(TAG_MIX_TASKS, options.seed, -(-n_p // T) * T, epoch, p))
                       if options.shuffle and T > 1 else np.arange(n_p, dtype=np.int64) * T // n_p)
            members = np.argsort(task_of, kind="stable")  # canonical order within each task
            counts = np.bincount(task_of, minlength=T)
            pos = 0
            at = 0
            for t in range(T):
                mine = idx[members[at : at + int(counts[t])]].tolist()
                at += int(counts[t])
                r = int(rows_a[mine].sum())
                # 3. Blocks: M = ceil(rows / S). With shuffle every piece is cut into M chunks and
                #    block j takes chunk (j + rotation) mod M of each (MXRW), its rows then
                #    permuted (MXBK); without, block j is rows j*rows//M.. of the task in order.
                M = -(-r // S)
                if options.shuffle:
                    words = mix_rotations(options.seed, epoch, p, t, len(mine) + 1, M)
                    rotations, deal = tuple(int(x) for x in words[:-1]), int(words[-1])
                    sizes = mix_block_sizes([int(x) for x in rows_a[mine]], M, deal)
                    tb = tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)]))
                else:
                    tb = tuple(j * r // M for j in range(M + 1))
                    rotations, deal = (), 0
                task = MixTask(p, t, tuple(pieces[i] for i in mine), tuple(sources[i] for i in mine),
                               tuple(offsets[i] for i in mine), r, pos, tb, pos // m, (pos + r - 1) // m,
                               rotations, deal)
                for j in range(M):
                    start, br = pos + tb[j], tb[j + 1] - tb[j]
                    bs.append(MixBlock(p, len(bs), task.units, task.sources, br, start, start // m,
                                       (start + br - 1) // m, task, j))
                ts.append(task)
                pos += r
        tasks.append(tuple(ts))
        blocks.append(tuple(bs))
    part_rows = tuple(bounds[p + 1] - bounds[p] for p in range(P))
    steps = _steps(part_rows, m, options.drop_last)
    if options.drop_last and steps == 0:
        raise drop_all_error(options, total, part_rows)
    dropped = total - steps * m * P if options.drop_last else 0
    return MixPlan(
        options=options, epoch=epoch, rank=rank, units=units, unit_order=order, boundaries=tuple(bounds),
        partition_rows=part_rows, redundant_reads=redundant, blocks=tuple(blocks), steps=steps,
        dropped_rows=dropped, fingerprint=fingerprint, schedule=_rank_schedule(blocks, options, rank, steps),
        tasks=tuple(tasks))
