"""The plan as data: what the planning stage (detload.planning) produces and the engine executes.

The order options, the units (row ranges of row groups), and one epoch's `Plan` for one
rank: its partitions, blocks and schedule. Plain values, no I/O; `detload.make_plan`
computes a `Plan`. See docs/determinism.md for the contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import xxhash

from ._check import check_int
from .errors import EmptyDatasetError, OptionError

__all__ = ["MIX_MIN_RUN", "MIX_RUNS", "PLAN_FORMAT_MIX", "PLAN_FORMAT_VERSION", "Block", "MixBlock", "MixPlan",
           "MixTask", "OrderOptions", "Plan", "Range", "Unit", "UnitList"]

#: Bumped whenever the same inputs would yield a different order. Format 1 (whole row
#: groups dealt round-robin to partitions) is gone; 2 is the windowed order (``order="windowed"``).
PLAN_FORMAT_VERSION = 2
#: The mixed order (``order="mix"``, stratified windows): docs/determinism.md.
PLAN_FORMAT_MIX = 3

#: The orders a loader can plan, by name.
ORDERS = ("mix", "windowed")
#: Defaults of the orders' own options (None in `OrderOptions` until resolved).
DEFAULT_SHUFFLE_WINDOW = 4
#: The mixed order's default window: at least this many row groups...
DEFAULT_MIX_WINDOW = 64
#: ... and about this many rows (row groups averaging under 16,384 rows: more of them), so that
#: small row groups are not mixed in small windows (docs/mixing-design.md, As built).
DEFAULT_WINDOW_ROWS = 1 << 20

_MAX_SEED = 2**64 - 1


@dataclass(frozen=True)
class OrderOptions:
    """Every option that decides which rows a step yields (and nothing else).

    ``batch_size`` is per rank; the global batch is ``batch_size * world_size``
    and must divide by ``partitions``. ``order`` picks the order: "mix" (plan format 3:
    tasks of up to ``mix_window`` row groups spread over the partition, cut into blocks of
    at most ``block_rows`` rows; None: resolved by the planner from the units' rows,
    `default_mix_window` and `default_block_rows`) or
    "windowed" (plan format 2: blocks of ``shuffle_window`` row groups). None (not given)
    resolves to "mix", or to "windowed" with ``group_batches``, which the mixed order does
    not pack yet. Each order's own options are None until resolved; giving one to the other
    order is an OptionError.
    """

    seed: int
    batch_size: int
    shuffle: bool = True
    shuffle_window: int | None = None
    drop_last: bool = False
    partitions: int = 1
    world_size: int = 1
    #: Batches are filled greedily with whole groups (the units' ``groups``), up to a
    #: micro-batch of items, and shuffling permutes whole groups (docs/packing.md).
    group_batches: bool = False
    #: None until resolved: "mix", or "windowed" with group_batches (see the class docstring).
    order: str | None = None
    mix_window: int | None = None
    block_rows: int | None = None

    def __post_init__(self) -> None:
        # check_int returns a plain int: a NumPy integer would break the JSON of the fingerprint.
        set_ = object.__setattr__
        set_(self, "seed", check_int("seed", self.seed, 0, _MAX_SEED, shown="[0, 2**64)"))
        if self.order is None:
            set_(self, "order", "windowed" if self.group_batches else "mix")
        if self.order not in ORDERS:
            raise OptionError(f"order must be one of {list(ORDERS)}, got {self.order!r}: \"mix\" mixes every part "
                              "of the epoch (plan format 3), \"windowed\" is plan format 2's order")
        if self.order == "mix":
            if self.shuffle_window is not None:
                w = self.shuffle_window
                raise OptionError(
                    f"shuffle_window={w!r} is an option of order=\"windowed\"; the mixed order (order=\"mix\", "
                    "the default since plan format 3) takes mix_window= (row groups mixed together) and "
                    "block_rows= instead. For the windowed order (plan format 2, the default before) pass "
                    f"order=\"windowed\" with shuffle_window={w!r} (on the command line: --order windowed "
                    f"--shuffle-window {w!r})")
            if self.group_batches:
                raise OptionError(
                    "group_by= is not available with order=\"mix\": pass order=\"windowed\" "
                    "(and shuffle_window=N) to load whole groups")
            if self.mix_window is not None:
                set_(self, "mix_window", check_int("mix_window", self.mix_window, 1))
            if self.block_rows is not None:
                set_(self, "block_rows", check_int("block_rows", self.block_rows, 1))
        else:
            for name in ("mix_window", "block_rows"):
                if getattr(self, name) is not None:
                    raise OptionError(
                        f"{name}={getattr(self, name)!r} is an option of order=\"mix\", not of "
                        f"order=\"windowed\" (which takes shuffle_window=): pass order=\"mix\" or leave {name} out")
            if self.shuffle_window is None:
                set_(self, "shuffle_window", DEFAULT_SHUFFLE_WINDOW)
            set_(self, "shuffle_window", check_int("shuffle_window", self.shuffle_window, 1))
        for name in ("batch_size", "partitions", "world_size"):
            set_(self, name, check_int(name, getattr(self, name), 1))
        for name in ("shuffle", "drop_last", "group_batches"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.partitions % self.world_size:
            raise OptionError(
                f"partitions={self.partitions} must be a multiple of the world size "
                f"{self.world_size}: each rank owns partitions/world_size partitions. "
                "Choose partitions as a multiple of every world size you will run at."
            )
        if self.global_batch_size % self.partitions:
            raise OptionError(
                f"the global batch (batch_size {self.batch_size} x world size "
                f"{self.world_size} = {self.global_batch_size}) must divide by "
                f"partitions={self.partitions}: every partition yields an equal micro-batch."
            )

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    @property
    def micro_batch(self) -> int:
        return self.global_batch_size // self.partitions

    @property
    def plan_format(self) -> int:
        """The plan format of this order: 3 for "mix", 2 for "windowed"."""
        return PLAN_FORMAT_MIX if self.order == "mix" else PLAN_FORMAT_VERSION

    def order_dict(self) -> dict[str, object]:
        """The options that decide the global order; the world size only splits it.

        The windowed order's dict is plan format 2's, unchanged (no ``order`` key), so its
        fingerprints stay; the mixed order's names itself, its window and its block rows
        (None until the planner resolved them from the units).
        """
        d: dict[str, object] = {
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
        }
        if self.order == "mix":
            d |= {"order": "mix", "mix_window": self.mix_window, "block_rows": self.block_rows}
        else:
            d["shuffle_window"] = self.shuffle_window
        d |= {"drop_last": self.drop_last, "partitions": self.partitions}
        if self.group_batches:  # only when set: ungrouped plans keep their fingerprints
            d["group_batches"] = True
        return d


class Range(NamedTuple):
    """Rows ``[first, first + rows)`` of row group ``row_group`` of file ``file``.

    ``file`` is the file's index in canonical order. Rows are counted in what the
    row group *delivers*: its stored rows, or, when its unit carries a selection
    (and later a transform), the rows left after it, in their stored order.
    """

    file: int
    row_group: int
    first: int
    rows: int


@dataclass(frozen=True)
class Unit:
    """One or more consecutive row ranges of one file, in canonical order: what a block is made of.

    ``groups`` are the offsets (within the unit's delivered rows) where a group of
    rows that must never be split begins: empty means no groups, so a partition
    boundary may cut the unit at any row; otherwise the first is 0 and a boundary
    only cuts at one of them. ``selection`` names the row selection applied to
    the unit's row groups before its ranges are taken ("" = every stored row); the
    planner only carries it into the fingerprint and into cut pieces.
    """

    ranges: tuple[Range, ...]
    groups: tuple[int, ...] = ()
    selection: str = ""

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.ranges)

    @property
    def whole(self) -> bool:
        """True if the unit is exactly one range starting at row 0 (a whole row group, when the
        loader built it so)."""
        return len(self.ranges) == 1 and self.ranges[0].first == 0


def _check_unit(j: int, u: object) -> Unit:
    if not isinstance(u, Unit):
        raise OptionError(f"unit {j} must be a detload.plan.Unit, got {type(u).__name__}")
    if not u.ranges:
        raise OptionError(f"unit {j} has no ranges")
    for r in u.ranges:
        if not isinstance(r, Range) or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in r):
            raise OptionError(f"unit {j}: ranges must be Range(file, row_group, first, rows) of ints, got {r!r}")
        if r.file < 0 or r.row_group < 0 or r.first < 0 or r.rows <= 0:
            raise OptionError(
                f"unit {j}: {r!r} needs file, row_group, first >= 0 and rows >= 1 "
                "(leave out row groups that deliver no rows)"
            )
    if len({r.file for r in u.ranges}) != 1:
        raise OptionError(f"unit {j} spans several files; a unit's ranges are of one file")
    for a, b in zip(u.ranges, u.ranges[1:]):
        if (b.row_group, b.first) <= (a.row_group, a.first) or (
                b.row_group == a.row_group and b.first < a.first + a.rows):
            raise OptionError(f"unit {j}: ranges {a!r} and {b!r} are not in canonical order without overlap")
    g = u.groups
    if g and (g[0] != 0 or any(y <= x for x, y in zip(g, g[1:])) or g[-1] >= u.rows):
        raise OptionError(
            f"unit {j}: groups must be increasing offsets in [0, {u.rows}) starting at 0, got {list(g)[:8]}"
        )
    return u


class UnitList:
    """The epoch-independent input of the planner: the units in canonical order, checked once.

    Build it once per dataset (`from_row_groups` for the common case) and pass it
    to every epoch's `make_plan`; ``digest`` is the xxh3-128 over the units
    that the plan fingerprint covers, so a state holds one hash, not the units.
    """

    __slots__ = ("_digest", "rows", "units")

    def __init__(self, units: Sequence[Unit]) -> None:
        self.units: tuple[Unit, ...] = tuple(_check_unit(j, u) for j, u in enumerate(units))
        if not self.units:
            raise EmptyDatasetError("the dataset has no rows: every file is empty")
        self.rows = np.fromiter((u.rows for u in self.units), dtype=np.int64, count=len(self.units))
        self._digest: str | None = None

    @classmethod
    def from_row_groups(cls, files: Sequence[int] | np.ndarray, row_groups: Sequence[int] | np.ndarray,
                        rows: Sequence[int] | np.ndarray) -> UnitList:
        """One whole-row-group unit per (file index, row-group index, row count), in canonical order."""
        if not len(files) == len(row_groups) == len(rows):
            raise OptionError("files, row_groups and rows must have one entry per row group")
        return cls([Unit((Range(int(f), int(g), 0, int(n)),)) for f, g, n in zip(files, row_groups, rows)])

    @classmethod
    def from_rows(cls, rows: Sequence[int] | np.ndarray) -> UnitList:
        """Plain row counts: row groups 0, 1, ... of file 0."""
        a = np.asarray(rows, dtype=np.int64)
        if a.ndim != 1 or (a <= 0).any():
            raise OptionError("unit_rows must list positive row counts (empty row groups are not units)")
        return cls.from_row_groups(np.zeros(len(a), dtype=np.int64), np.arange(len(a)), a)

    def __len__(self) -> int:
        return len(self.units)

    @property
    def total_rows(self) -> int:
        return int(self.rows.sum())

    @property
    def digest(self) -> str:
        """xxh3-128 of the canonical form: per unit, its index, its ranges, its groups and its selection.

        Little-endian int64 words: ``[j, n_ranges, (file, row_group, first, rows)...,
        n_groups, groups..., len(selection)]`` then the selection's UTF-8 bytes.
        """
        if self._digest is None:
            h = xxhash.xxh3_128()
            for j, u in enumerate(self.units):
                words = [j, len(u.ranges), *(v for r in u.ranges for v in r), len(u.groups), *u.groups]
                sel = u.selection.encode()
                h.update(np.asarray([*words, len(sel)], dtype="<i8").tobytes())
                h.update(sel)
            self._digest = h.hexdigest()
        return self._digest


@dataclass(frozen=True)
class Block:
    """``shuffle_window`` consecutive units of one partition, whose rows are permuted together.

    ``sources[i]`` is the canonical index of the input unit ``units[i]`` came from
    (a cut piece keeps its source's index). ``start`` is the block's first row
    within its partition's stream; ``first_step`` and ``last_step`` the steps
    whose micro-batches take rows from it.
    """

    partition: int
    number: int
    units: tuple[Unit, ...]
    sources: tuple[int, ...]
    rows: int
    start: int
    first_step: int
    last_step: int

    @property
    def end(self) -> int:
        return self.start + self.rows

    @property
    def ranges(self) -> tuple[Range, ...]:
        """What a worker reads, in order: the rows of the block before its permutation."""
        return tuple(r for u in self.units for r in u.ranges)

    @property
    def group_starts(self) -> tuple[int, ...]:
        """The first row (in the block before its permutation) of each of its units' groups."""
        out: list[int] = []
        pos = 0
        for u in self.units:
            out += [pos + g for g in u.groups]
            pos += u.rows
        return tuple(out)


def _unit_dict(u: Unit, src: int) -> dict[str, object]:
    """A unit (or piece) as ``detload plan`` prints it, with its source unit."""
    d: dict[str, object] = {"source": src, "rows": u.rows, "ranges": [list(r) for r in u.ranges]}
    if u.groups:
        d["groups"] = list(u.groups)
    if u.selection:
        d["selection"] = u.selection
    return d


@dataclass(frozen=True)
class Plan:
    """One epoch's plan for one rank. Plain data: print it, test it, fingerprint it.

    ``boundaries[p]`` is where partition p starts in the epoch's permuted unit
    stream (``boundaries[P]`` = total rows); ``redundant_reads`` counts the row
    groups that two neighbouring partitions both read because a boundary cut them.
    """

    options: OrderOptions
    epoch: int
    rank: int
    units: UnitList = field(repr=False)
    unit_order: np.ndarray = field(repr=False)
    boundaries: tuple[int, ...]
    partition_rows: tuple[int, ...]
    redundant_reads: int
    blocks: tuple[tuple[Block, ...], ...] = field(repr=False)
    steps: int
    dropped_rows: int
    fingerprint: str
    schedule: tuple[Block, ...] = field(repr=False)
    #: With ``group_batches``: per partition, the first row of each micro-batch and the end.
    step_starts: tuple[np.ndarray, ...] | None = field(default=None, repr=False)
    #: With ``group_batches``: per partition, the first row of each group in its stream
    #: (groups in permuted order) and the end, so a batch's group offsets are known from the plan.
    group_bounds: tuple[np.ndarray, ...] | None = field(default=None, repr=False)

    plan_format = PLAN_FORMAT_VERSION

    @property
    def owned_partitions(self) -> range:
        per = self.options.partitions // self.options.world_size
        return range(self.rank * per, (self.rank + 1) * per)

    def micro_range(self, partition: int, step: int) -> tuple[int, int]:
        """Rows [lo, hi) of ``partition``'s stream that ``step`` yields (maybe empty)."""
        n = self.partition_rows[partition]
        if self.step_starts is not None:
            s = self.step_starts[partition]
            if step + 1 < len(s):
                return int(s[step]), int(s[step + 1])
            return n, n  # the partition ran out: an empty micro-batch (docs/packing.md)
        m = self.options.micro_batch
        return min(step * m, n), min(step * m + m, n)

    def step_rows(self, step: int) -> int:
        """Rows this rank's batch at ``step`` holds."""
        return sum(hi - lo for lo, hi in (self.micro_range(p, step) for p in self.owned_partitions))

    def schedule_from(self, step: int) -> tuple[Block, ...]:
        """The blocks still needed when the epoch starts (or resumes) at ``step``."""
        if step == 0:
            return self.schedule
        # A block is still needed if its last micro-batch is at or after ``step``
        # (without groups: its end lies past row step * m).
        return tuple(b for b in self.schedule if b.last_step >= step)

    def worker_schedules(self, workers: int, start_step: int = 0) -> list[list[Block]]:
        """Block k of the schedule goes to worker k mod ``workers``."""
        out: list[list[Block]] = [[] for _ in range(workers)]
        for k, b in enumerate(self.schedule_from(start_step)):
            out[k % workers].append(b)
        return out

    def block_workers(self, workers: int, start_step: int = 0) -> list[int]:
        """The worker that builds each block of `schedule_from` (``start_step``): k mod ``workers``."""
        return [k % workers for k in range(len(self.schedule_from(start_step)))]

    @property
    def total_rows(self) -> int:
        return self.units.total_rows

    @property
    def unit_rows(self) -> np.ndarray:
        return self.units.rows

    def _header(self) -> dict[str, object]:
        """What ``detload plan`` prints of any plan before its blocks (or tasks)."""
        return {
            "plan_format": self.plan_format,
            "fingerprint": self.fingerprint,
            "units_digest": self.units.digest,
            "epoch": self.epoch,
            "rank": self.rank,
            "options": self.options.order_dict() | {"batch_size": self.options.batch_size,
                                                    "world_size": self.options.world_size},
            "units": len(self.units),
            "rows": self.total_rows,
            "steps": self.steps,
            "dropped_rows": self.dropped_rows,
            "partition_rows": list(self.partition_rows),
            "boundaries": list(self.boundaries),
            "redundant_reads": self.redundant_reads,
        }

    def to_dict(self, workers: int = 1) -> dict[str, object]:
        """A JSON-able description (what ``detload plan`` prints)."""
        return {
            **self._header(),
            **({"micro_batch_starts": [s.tolist() for s in self.step_starts]} if self.step_starts is not None else {}),
            "unit_order": self.unit_order.tolist(),
            "blocks": [
                {
                    "k": k,
                    "partition": b.partition,
                    "number": b.number,
                    "units": [_unit_dict(u, s) for u, s in zip(b.units, b.sources)],
                    "rows": b.rows,
                    "steps": [b.first_step, b.last_step],
                    "worker": k % workers,
                }
                for k, b in enumerate(self.schedule)
            ],
        }


# -- plan format 3: the mixed order (order="mix") ---------------------------------------


#: A mixed-order block's rows of a piece are spread over the piece in at most this many runs
#: (`MixTask.block_chunks`), each of at least `MIX_MIN_RUN` rows: enough runs that a batch's
#: rows of one row group come from all over it; runs long enough (64 B of float32) that
#: copying them costs about what one slice does.
MIX_RUNS = 16
MIX_MIN_RUN = 16


def run_starts(first: int, rows: int, run: int, period: int) -> np.ndarray:
    """The first row of each run of a `MixTask.block_chunks` entry."""
    return first + period * np.arange(rows // run, dtype=np.int64)


def chunk_rows(first: int, rows: int, run: int, period: int) -> np.ndarray:
    """The rows of a piece that a `MixTask.block_chunks` entry names, in order."""
    if run == rows:
        return np.arange(first, first + rows, dtype=np.int64)
    return (run_starts(first, rows, run, period)[:, None] + np.arange(run, dtype=np.int64)).ravel()


def mix_block_sizes(piece_rows: Sequence[int], blocks: int, deal: int) -> np.ndarray:
    """The rows of each of the ``blocks`` blocks of a task whose pieces hold ``piece_rows``
    rows (see `MixTask.block_chunks`): every block takes ``r // blocks`` rows of each piece
    of r rows, and the pieces' ``r % blocks`` extra rows are dealt one per block, cyclically
    from block ``deal``: sizes differ by at most one row."""
    base = sum(r // blocks for r in piece_rows)
    extra = sum(r % blocks for r in piece_rows)
    j = np.arange(blocks, dtype=np.int64)
    return base + extra // blocks + ((j - deal) % blocks < extra % blocks).astype(np.int64)


@dataclass(frozen=True)
class MixTask:
    """What one worker builds in one go (plan format 3): its pieces read once, their rows
    permuted together, emitted as blocks ``[bounds[j], bounds[j + 1])`` of the permuted rows.

    ``units`` are the pieces in canonical order (a piece is a unit, or the part of one that a
    partition boundary cut), ``sources`` their input units' indexes, ``offsets`` each piece's
    first row within its source unit; ``start`` is the task's first row in its partition's
    stream; ``first_step`` and ``last_step`` the steps whose micro-batches take rows from it.
    """

    partition: int
    number: int
    units: tuple[Unit, ...]
    sources: tuple[int, ...]
    offsets: tuple[int, ...]
    rows: int
    start: int
    bounds: tuple[int, ...]
    first_step: int
    last_step: int
    #: Shuffling: each piece's rotation (block j takes chunk ``(j + rotation) mod blocks``
    #: of it) and the block the extra rows are first dealt to (`mix_block_sizes`); empty
    #: without shuffle (block j is then rows ``bounds[j]..bounds[j + 1]`` in order).
    rotations: tuple[int, ...] = ()
    deal: int = 0

    def block_chunks(self, j: int) -> list[tuple[int, int, int, int, int]]:
        """Block j's rows before its permutation, in piece order, as ``(piece, first row in the
        piece, rows, run, period)``: the rows are ``rows // run`` runs of ``run`` rows, from
        ``first``, ``period`` apart (one run: ``run == rows``, the slice ``[first, first + rows)``).

        With shuffle, piece q of r rows gives every block ``r // blocks`` rows, and its
        ``r % blocks`` extra rows to as many blocks (dealt cyclically, the pieces in order,
        from block ``deal``); block j takes the piece's chunk ``c = (j + rotations[q]) mod
        blocks``. Where a chunk would hold at least 2 x `MIX_MIN_RUN` rows it is spread over
        the piece: its first R x L x blocks rows (R = min(`MIX_RUNS`, base // MIX_MIN_RUN)
        runs of L = base // R rows) are cut into periods of L x blocks rows, and chunk c is run
        c of every period; the rows after them are cut into contiguous chunks as a short
        piece is. So a block draws from everywhere in every piece, not from one run of stored
        rows (on data sorted by a key, a run is a narrow slice of it). Without shuffle, the
        slices the block spans."""
        if self.rotations:
            M = self.blocks
            out = []
            dealt = self.deal
            for q, (u, o) in enumerate(zip(self.units, self.rotations)):
                base, x = divmod(u.rows, M)
                c = (j + o) % M
                runs = min(MIX_RUNS, base // MIX_MIN_RUN)
                tail, b2 = 0, base  # where the contiguous chunks start, and their base rows
                if runs > 1:
                    run = base // runs
                    out.append((q, c * run, runs * run, run, run * M))
                    tail, b2 = runs * run * M, base - runs * run
                a = (dealt + o) % M  # the chunk index of the piece's first extra row
                dealt += x
                # Extras among chunk indices [0, c): the cyclic run [a, a + x) cut at c.
                before = max(0, min(c - a, x)) + (max(0, min(c, a + x - M)) if a + x > M else 0)
                extra = 1 if (c - a) % M < x else 0
                n = b2 + extra
                if n:
                    out.append((q, tail + c * b2 + before, n, n, n))
            return out
        lo, hi = self.bounds[j], self.bounds[j + 1]
        out, s0 = [], 0
        for q, u in enumerate(self.units):
            s1 = s0 + u.rows
            if s1 > lo and s0 < hi:
                a, b = max(lo, s0), min(hi, s1)
                out.append((q, a - s0, b - a, b - a, b - a))
            s0 = s1
        return out

    @property
    def end(self) -> int:
        return self.start + self.rows

    @property
    def ranges(self) -> tuple[Range, ...]:
        """What a worker reads, in order: the task's rows before its permutation."""
        return tuple(r for u in self.units for r in u.ranges)

    @property
    def blocks(self) -> int:
        return len(self.bounds) - 1


@dataclass(frozen=True)
class MixBlock(Block):
    """Block ``index`` of task ``task`` (plan format 3): rows ``[task.bounds[index],
    task.bounds[index + 1])`` of the task's permuted rows. ``number`` counts the partition's
    blocks in stream order, ``start`` is the block's first row in its partition's stream;
    ``units`` and ``sources`` are its task's (any row of the task may land in it)."""

    task: MixTask = field(repr=False)
    index: int = 0


@dataclass(frozen=True)
class MixPlan(Plan):
    """One epoch's plan of the mixed order (plan format 3) for one rank.

    ``tasks[p]`` are partition p's tasks in stream order; ``blocks[p]`` their blocks, in
    stream order; ``schedule`` the rank's blocks in the order the merger takes them. The
    fields shared with `Plan` keep their meaning (``unit_order``: the units in the order
    partitions were cut from, canonical order with one partition).
    """

    tasks: tuple[tuple[MixTask, ...], ...] = field(default=(), repr=False)

    plan_format = PLAN_FORMAT_MIX

    def task_schedules(self, workers: int, start_step: int = 0
                       ) -> list[list[tuple[MixTask, tuple[tuple[int, int], ...]]]]:
        """Each worker's tasks from ``start_step`` on, with the blocks to build: ``(k, index)``
        pairs, k the block's position in `schedule_from` (``start_step``).

        Tasks are taken in the order of their first needed block (by first step, partition,
        number), task i to worker i mod ``workers``; a task whose first blocks lie before
        ``start_step`` (a resume lands in it) lists only the blocks still needed.
        """
        order: list[tuple[MixTask, list[tuple[int, int]]]] = []
        seen: dict[tuple[int, int], int] = {}
        for k, b in enumerate(self.schedule_from(start_step)):
            assert isinstance(b, MixBlock)
            key = (b.partition, b.task.number)
            i = seen.get(key)
            if i is None:
                i = seen[key] = len(order)
                order.append((b.task, []))
            order[i][1].append((k, b.index))
        out: list[list[tuple[MixTask, tuple[tuple[int, int], ...]]]] = [[] for _ in range(workers)]
        for i, (task, blocks) in enumerate(order):
            out[i % workers].append((task, tuple(blocks)))
        return out

    def shared_task_schedules(self, workers: int, start_step: int = 0
                              ) -> list[list[tuple[MixTask, tuple[tuple[int, int], ...]]]]:
        """As `task_schedules`, for workers that share task windows (_engine/share.py): block k
        of `schedule_from` (``start_step``) goes to worker k mod ``workers``, and each worker
        lists the tasks it builds blocks of, in the order of their first needed block."""
        out: list[list[tuple[MixTask, tuple[tuple[int, int], ...]]]] = [[] for _ in range(workers)]
        for task, blocks in self.task_schedules(1, start_step)[0]:
            mine: list[list[tuple[int, int]]] = [[] for _ in range(workers)]
            for k, j in blocks:
                mine[k % workers].append((k, j))
            for w in range(workers):
                if mine[w]:
                    out[w].append((task, tuple(mine[w])))
        return out

    def block_workers(self, workers: int, start_step: int = 0, shared: bool = False) -> list[int]:
        """The worker that builds each block of `schedule_from` (``start_step``): its task's, or
        with ``shared`` windows k mod ``workers``."""
        if shared:
            return [k % workers for k in range(len(self.schedule_from(start_step)))]
        owner: list[int] = [0] * len(self.schedule_from(start_step))
        for w, tasks in enumerate(self.task_schedules(workers, start_step)):
            for _, blocks in tasks:
                for k, _ in blocks:
                    owner[k] = w
        return owner

    def worker_schedules(self, workers: int, start_step: int = 0) -> list[list[Block]]:
        """The blocks each worker builds (those of its tasks), in the order it hands them over."""
        sched = self.schedule_from(start_step)
        out: list[list[Block]] = [[] for _ in range(workers)]
        for k, w in enumerate(self.block_workers(workers, start_step)):
            out[w].append(sched[k])
        return out

    def partition_row_ids(self, partition: int) -> np.ndarray:
        """Partition ``partition``'s stream as global row ids (the row's index in the
        concatenation of the units' delivered rows, canonical order)."""
        from ._streams import mix_block_permutation  # the streams import nothing of the plan

        starts = np.concatenate([[0], np.cumsum(self.units.rows)[:-1]]).astype(np.int64)
        out: list[np.ndarray] = []
        for t in self.tasks[partition]:
            base = [int(starts[s]) + o for s, o in zip(t.sources, t.offsets)]
            for j in range(t.blocks):
                parts = [chunk_rows(first, n, run, period) + base[q] for q, first, n, run, period in t.block_chunks(j)]
                ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
                if self.options.shuffle:
                    ids = ids[mix_block_permutation(self.options.seed, self.epoch, t.partition, t.number, j,
                                                    len(ids))]
                out.append(ids)
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def row_ids(self) -> np.ndarray:
        """The global row ids this rank's steps deliver, in order (step by step, each step's
        owned partitions in order): what the batches hold, without reading any data."""
        owned = list(self.owned_partitions)
        streams = {p: self.partition_row_ids(p) for p in owned}
        parts = [streams[p][slice(*self.micro_range(p, i))] for i in range(self.steps) for p in owned]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def shares_windows(self, workers: int, cached: bool = False) -> bool:
        """Whether ``workers`` workers share task windows (each block to worker k mod W) rather
        than each building whole tasks: when some owned partition has fewer tasks than workers,
        or, reading through a row-group cache without a size limit (``cached``), always. Thread workers do so;
        process workers only through a row-group cache of file columns without a transform
        (`Loader._shares_windows`)."""
        return workers > 1 and (cached or any(len(self.tasks[p]) < workers for p in self.owned_partitions))

    def to_dict(self, workers: int = 1, shared: bool | None = None) -> dict[str, object]:
        """A JSON-able description (what ``detload plan`` prints): the tasks, each with its
        pieces, block bounds, rotations and steps (and, when the workers do not share
        windows, the worker that builds it), and the blocks with the worker that builds each.
        ``shared``: whether the workers share task windows; None: as thread workers would
        (`shares_windows`)."""
        shared = self.shares_windows(workers) if shared is None else shared
        owners = self.block_workers(workers, shared=shared)
        # Without shared windows a task's blocks all go to one worker: the task's.
        task_worker = {} if shared else {(b.partition, b.task.number): w  # type: ignore[attr-defined]
                                         for b, w in zip(self.schedule, owners)}
        return {
            **self._header(),
            "unit_order": self.unit_order.tolist(),
            "tasks": [
                {
                    "partition": t.partition,
                    "number": t.number,
                    "units": [_unit_dict(u, s) for u, s in zip(t.units, t.sources)],
                    "rows": t.rows,
                    "block_bounds": list(t.bounds),
                    **({"rotations": list(t.rotations), "deal": t.deal} if t.rotations else {}),
                    "steps": [t.first_step, t.last_step],
                    **({"worker": task_worker[(t.partition, t.number)]}
                       if (t.partition, t.number) in task_worker else {}),
                }
                for p in self.owned_partitions for t in self.tasks[p]
            ],
            "blocks": [
                {"k": k, "partition": b.partition, "number": b.number, "task": b.task.number,
                 "index": b.index, "rows": b.rows, "steps": [b.first_step, b.last_step], "worker": owners[k]}
                for k, b in enumerate(self.schedule) if isinstance(b, MixBlock)
            ],
        }
