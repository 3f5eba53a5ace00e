"""The epoch planner: a pure function from the units, seed, epoch and order options to a `Plan`.

No threads, no I/O. The plan fixes, before any data is read, which rows every
step of the epoch yields on every rank; workers and the merger only execute it.
See docs/determinism.md for the contract this file implements.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import xxhash

from .._check import check_int
from .._streams import group_permutation, unit_permutation
from ..errors import OptionError
from ..plan import DEFAULT_MIX_WINDOW, Block, MixPlan, OrderOptions, Plan, Unit, UnitList
from .common import cut_stream, drop_all_error
from .common import rank_schedule as _rank_schedule
from .common import step_count as _steps
from .mix import default_mix_window, make_mix_plan

__all__ = ["DEFAULT_BLOCK_BUDGET", "block_memory_warning", "check_partitions", "greedy_steps", "make_plan",
           "order_fingerprint", "window_memory_warning"]

_U32 = 0xFFFF_FFFF

#: The block-memory estimate above which `block_memory_warning` warns (1 GiB).
DEFAULT_BLOCK_BUDGET = 1 << 30


def greedy_steps(bounds: np.ndarray, m: int) -> np.ndarray:
    """Micro-batch starts of a stream of whole groups (``bounds``: their first rows and the end).

    Each micro-batch takes consecutive groups, as many as fit in ``m`` rows; every group
    holds at most ``m`` rows, so each takes at least one. Returns the first row of every
    micro-batch and the stream's end (docs/packing.md states this rule).
    """
    out = [0]
    i, n = 0, len(bounds) - 1
    while i < n:
        j = int(np.searchsorted(bounds, bounds[i] + m, side="right")) - 1
        assert j > i, "a group larger than the micro-batch reached the planner"
        out.append(int(bounds[j]))
        i = j
    return np.asarray(out, dtype=np.int64)


def _snap(unit: Unit, c: int) -> int:
    """Offset ``c`` inside ``unit`` moved to the nearest group start or the unit's end (ties: down)."""
    if not unit.groups:
        return c
    cands = np.asarray([*unit.groups, unit.rows], dtype=np.int64)
    i = int(np.searchsorted(cands, c, side="right")) - 1  # cands[i] <= c < cands[i + 1]
    lo, hi = int(cands[i]), int(cands[i + 1])
    return lo if c - lo <= hi - c else hi


def order_fingerprint(dataset_fingerprint: str, units_digest: str, options: OrderOptions) -> str:
    """Identifies the order of every epoch: same fingerprint, same batches. It covers the units
    through their digest."""
    payload = json.dumps(
        {"plan_format": options.plan_format, "dataset": dataset_fingerprint, "units": units_digest,
         **options.order_dict()},
        sort_keys=True,
    )
    return xxhash.xxh3_128_hexdigest(payload.encode())


def check_partitions(units: UnitList, options: OrderOptions) -> None:
    """Refuse a world size or a partition count above the row groups that deliver rows.

    The planner's work grows with the partitions (a world size of 10**20 would plan forever),
    so both are bounded by the data: by its non-empty row groups (after a filter; a unit that a
    group joins across row groups counts each of them), which docs/loader.md states.
    """
    groups = len({(r.file, r.row_group) for u in units.units for r in u.ranges})
    for name, value in (("world_size", options.world_size), ("partitions", options.partitions)):
        if value > groups:
            raise OptionError(
                f"{name}={value} exceeds the {groups:,} non-empty row groups of the dataset (after any filter): "
                f"{name} must be at most {groups:,}. Use a smaller {name}, or rewrite the data with more, "
                "smaller row groups (detload layout SRC DST --row-group-rows N)")


def make_plan(
    units: UnitList | Sequence[Unit] | Sequence[int] | np.ndarray,
    options: OrderOptions,
    *,
    epoch: int,
    rank: int = 0,
    dataset_fingerprint: str = "",
) -> Plan:
    """Plan epoch ``epoch`` for ``rank``.

    ``units`` in canonical order: a `UnitList` (build it once), a list of `Unit`,
    or plain row counts (whole row groups 0, 1, ... of file 0). The units are
    permuted (the units stream); with T rows in that stream, partition p is rows
    ``[p*T//P, (p+1)*T//P)`` of it, a unit that a boundary falls inside being cut
    into two (at the nearest group start when it has groups). Within a partition
    ``shuffle_window`` consecutive units form a block; step i takes rows
    ``[i*m, (i+1)*m)`` of every partition (m = global batch / P). That is the windowed
    order (plan format 2); with ``options.order == "mix"`` the mixed order's plan
    (format 3, planning/mix.py) is returned instead.
    """
    check_int("epoch", epoch, 0, _U32, shown="[0, 2**32)")
    check_int("rank", rank, 0)
    if rank >= options.world_size:
        raise OptionError(f"rank {rank} is not below the world size {options.world_size}")
    if not isinstance(units, UnitList):
        if isinstance(units, np.ndarray) or (
                len(units) and isinstance(units[0], (int, np.integer)) and not isinstance(units[0], bool)):
            units = UnitList.from_rows(units)  # type: ignore[arg-type]
        else:
            units = UnitList(units)  # type: ignore[arg-type]
    n = len(units)
    check_partitions(units, options)
    if options.order == "mix":
        return make_mix_plan(units, options, epoch=epoch, rank=rank,
                             fingerprint=order_fingerprint(dataset_fingerprint, units.digest, options))
    P = options.partitions
    m = options.micro_batch
    order = unit_permutation(options.seed, epoch, n) if options.shuffle else np.arange(n, dtype=np.int64)
    ends = np.cumsum(units.rows[order])
    total = int(ends[-1])

    # Boundaries: the ideal p*T//P, snapped to a group start of the unit it falls in.
    cuts: dict[int, list[int]] = {}  # position in the stream -> offsets to cut that unit at
    bounds = [0]
    for p in range(1, P):
        b = p * total // P
        i = int(np.searchsorted(ends, b, side="right"))  # the unit holding row b (or none: b == T)
        if i < n:
            start = int(ends[i]) - int(units.rows[order[i]])
            c = _snap(units.units[int(order[i])], b - start)
            b = start + c
            if 0 < c < int(units.rows[order[i]]) and (not cuts.get(i) or cuts[i][-1] != c):
                cuts.setdefault(i, []).append(c)
        bounds.append(b)
    bounds.append(total)

    # The permuted stream's pieces (units, and the pieces of cut units), each with its
    # source unit; at most P - 1 units are cut, the rest is array work (100,000 units:
    # a loop over the pieces took twice as long).
    pieces, sources, _, piece_rows, redundant = cut_stream(units.units, order, units.rows, cuts)
    csum = np.concatenate([[0], np.cumsum(piece_rows)])
    # A piece lies in the partition its first row lies in (no piece straddles a boundary);
    # side="right" skips empty partitions.
    part_of = np.searchsorted(np.asarray(bounds), csum[:-1], side="right") - 1
    edges = np.searchsorted(part_of, np.arange(P + 1), side="left").tolist()
    cs = csum.tolist()

    W = options.shuffle_window
    assert W is not None  # resolved by OrderOptions for the windowed order
    blocks: list[tuple[Block, ...]] = []
    for p in range(P):
        bs: list[Block] = []
        lo_p, hi_p = edges[p], edges[p + 1]
        for number, lo in enumerate(range(lo_p, hi_p, W)):
            hi = min(lo + W, hi_p)
            start, r = cs[lo] - bounds[p], cs[hi] - cs[lo]
            bs.append(Block(p, number, tuple(pieces[lo:hi]), tuple(sources[lo:hi]),
                              r, start, start // m, (start + r - 1) // m))
        blocks.append(tuple(bs))
    part_rows = tuple(bounds[p + 1] - bounds[p] for p in range(P))

    step_starts: tuple[np.ndarray, ...] | None = None
    group_bounds: tuple[np.ndarray, ...] | None = None
    if options.group_batches:
        blocks, step_starts, group_bounds = _group_steps(blocks, options, epoch)
        counts = [len(s) - 1 for s in step_starts]
        steps = min(counts) if options.drop_last else max(counts)
    else:
        steps = _steps(part_rows, m, options.drop_last)
    if options.drop_last and steps == 0:
        raise drop_all_error(options, total, part_rows)
    if step_starts is not None:
        dropped = total - sum(int(s[steps]) for s in step_starts) if options.drop_last else 0
    else:
        dropped = total - steps * m * P if options.drop_last else 0
    schedule = _rank_schedule(blocks, options, rank, steps)
    return Plan(
        options=options,
        epoch=epoch,
        rank=rank,
        units=units,
        unit_order=order,
        boundaries=tuple(bounds),
        partition_rows=part_rows,
        redundant_reads=redundant,
        blocks=tuple(blocks),
        steps=steps,
        dropped_rows=dropped,
        fingerprint=order_fingerprint(dataset_fingerprint, units.digest, options),
        schedule=schedule,
        step_starts=step_starts,
        group_bounds=group_bounds,
    )


def _group_steps(blocks: list[tuple[Block, ...]], options: OrderOptions, epoch: int
                 ) -> tuple[list[tuple[Block, ...]], tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """``group_batches``: each partition's groups in stream order (blocks in order, each
    block's groups permuted by its groups stream), the greedy micro-batch starts, and the
    blocks with their first and last steps counted in those micro-batches."""
    m = options.micro_batch
    out_blocks: list[tuple[Block, ...]] = []
    starts: list[np.ndarray] = []
    gbounds: list[np.ndarray] = []
    for p, bs in enumerate(blocks):
        sizes: list[np.ndarray] = []
        for b in bs:
            for u in b.units:
                if not u.groups:
                    raise OptionError("group_batches needs every unit to carry its groups (Unit.groups)")
            g = np.asarray(b.group_starts, dtype=np.int64)
            sz = np.diff(np.append(g, b.rows))
            big = int(sz.max())
            if big > m:
                raise OptionError(
                    f"a group of {big} rows (partition {p}, block {b.number}) is larger than the micro-batch "
                    f"of {m} rows (global batch {options.global_batch_size} / {options.partitions} partitions): "
                    "a group is never split across batches")
            if options.shuffle:
                sz = sz[group_permutation(options.seed, epoch, p, b.number, len(sz))]
            sizes.append(sz)
        all_sizes = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
        gb = np.concatenate([[0], np.cumsum(all_sizes)]).astype(np.int64)
        st = greedy_steps(gb, m)
        starts.append(st)
        gbounds.append(gb)
        # A block's steps: those whose rows it holds (block boundaries are group boundaries).
        out_blocks.append(tuple(
            Block(b.partition, b.number, b.units, b.sources, b.rows, b.start,
                    int(np.searchsorted(st, b.start, side="right")) - 1,
                    int(np.searchsorted(st, b.end - 1, side="right")) - 1)
            for b in bs))
    return out_blocks, tuple(starts), tuple(gbounds)


def block_memory_warning(plan: Plan, bytes_per_row: float,
                         budget: int = DEFAULT_BLOCK_BUDGET) -> str | None:
    """A warning text when the plan's largest block would hold more than ``budget`` bytes, else None.

    The estimate is the largest block's rows (over every partition, so every rank
    warns alike) times ``bytes_per_row`` (the converted NumPy bytes of one row).
    A worker holds the block it builds, and its queue up to ``prefetch`` more.
    """
    biggest = max((b for part in plan.blocks for b in part), key=lambda b: b.rows, default=None)
    if biggest is None:
        return None
    need = biggest.rows * bytes_per_row
    if need <= budget:
        return None
    window = plan.options.shuffle_window
    largest_unit = max(int(r) for r in plan.unit_rows)
    text = (
        f"the largest block holds {biggest.rows:,} rows, about {need / 2**20:,.0f} MiB at "
        f"{bytes_per_row:,.0f} bytes per row, over the block memory budget of {budget / 2**20:,.0f} MiB; "
        "each worker holds one block while building it and up to `prefetch` more in its queue."
    )
    if isinstance(plan, MixPlan):
        text += (f" A smaller block_rows (now {biggest.rows:,} rows at most) makes blocks smaller (the mixing"
                 " does not change: a task's rows are permuted together whatever its blocks).")
        return text
    if len(biggest.units) > 1:
        text += (f" A smaller shuffle_window (now {window}) puts fewer row groups in a block"
                 " (fewer rows are mixed together).")
    text += (f" The largest row group holds {largest_unit:,} rows: rewriting the data with smaller row"
             " groups (`detload layout SRC DST --row-group-rows N`) makes blocks smaller at any window.")
    return text


def window_memory_warning(plan: Plan, bytes_per_row: float, budget: int = DEFAULT_BLOCK_BUDGET) -> str | None:
    """The mixed order's warning text when a task's window would exceed ``budget`` bytes, else None.

    The workers hold a task's row groups (its window, up to ``mix_window`` of them) while they
    build the task's blocks: in memory without a cache (the heap, or /dev/shm for process
    workers sharing it), as memory-mapped entries (page cache) with one. The estimate is the largest task's rows (over every partition, so every
    rank warns alike) times ``bytes_per_row``.
    """
    if not isinstance(plan, MixPlan):
        return None
    biggest = max((t for part in plan.tasks for t in part), key=lambda t: t.rows, default=None)
    if biggest is None:
        return None
    need = biggest.rows * bytes_per_row
    if need <= budget:
        return None
    median = int(np.median(plan.unit_rows))
    K = plan.options.mix_window
    # The default window of small row groups counts rows (about 2**20): smaller row groups would
    # only make it more of them, so rewriting the data is no remedy there.
    by_rows = K is not None and K > DEFAULT_MIX_WINDOW and default_mix_window(plan.unit_rows) == K
    return (
        f"a task of the mixed order holds {len(biggest.units)} row groups ({biggest.rows:,} rows, about "
        f"{need / 2**20:,.0f} MiB at {bytes_per_row:,.0f} bytes per row), over the block memory budget of "
        f"{budget / 2**20:,.0f} MiB: the workers hold such a window of row groups (together, or each its own "
        f"with one worker) while they build the task's blocks. Lower mix_window (now {K}"
        + (f", the default for row groups of {int(np.mean(plan.unit_rows)):,} rows on average: about 2**20 rows"
           if by_rows else "")
        + "; fewer row groups are mixed together), or pass cache= so that the window is memory-mapped cache "
        "entries rather than heap memory"
        + ("." if by_rows else f", or rewrite the data with smaller row groups (the median holds {median:,} rows: "
           "`detload layout SRC DST --row-group-rows N`).")
    )
