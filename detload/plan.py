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

__all__ = ["PLAN_FORMAT_VERSION", "Block", "OrderOptions", "Plan", "Range", "Unit", "UnitList"]

#: Bumped whenever the same inputs would yield a different order. Format 1 (whole row
#: groups dealt round-robin to partitions) is gone; 2 is the only format.
PLAN_FORMAT_VERSION = 2

_MAX_SEED = 2**64 - 1


@dataclass(frozen=True)
class OrderOptions:
    """Every option that decides which rows a step yields (and nothing else).

    ``batch_size`` is per rank; the global batch is ``batch_size * world_size``
    and must divide by ``partitions``.
    """

    seed: int
    batch_size: int
    shuffle: bool = True
    shuffle_window: int = 4
    drop_last: bool = False
    partitions: int = 1
    world_size: int = 1
    #: Batches are filled greedily with whole groups (the units' ``groups``), up to a
    #: micro-batch of items, and shuffling permutes whole groups (docs/packing.md).
    group_batches: bool = False

    def __post_init__(self) -> None:
        # check_int returns a plain int: a NumPy integer would break the JSON of the fingerprint.
        set_ = object.__setattr__
        set_(self, "seed", check_int("seed", self.seed, 0, _MAX_SEED, shown="[0, 2**64)"))
        for name in ("batch_size", "shuffle_window", "partitions", "world_size"):
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

    def order_dict(self) -> dict[str, object]:
        """The options that decide the global order; the world size only splits it."""
        d: dict[str, object] = {
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
            "drop_last": self.drop_last,
            "partitions": self.partitions,
        }
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

    @property
    def total_rows(self) -> int:
        return self.units.total_rows

    @property
    def unit_rows(self) -> np.ndarray:
        return self.units.rows

    def to_dict(self, workers: int = 1) -> dict[str, object]:
        """A JSON-able description (what ``detload plan`` prints)."""

        def unit(u: Unit, src: int) -> dict[str, object]:
            d: dict[str, object] = {"source": src, "rows": u.rows, "ranges": [list(r) for r in u.ranges]}
            if u.groups:
                d["groups"] = list(u.groups)
            if u.selection:
                d["selection"] = u.selection
            return d

        return {
            "plan_format": PLAN_FORMAT_VERSION,
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
            **({"micro_batch_starts": [s.tolist() for s in self.step_starts]} if self.step_starts is not None else {}),
            "unit_order": self.unit_order.tolist(),
            "blocks": [
                {
                    "k": k,
                    "partition": b.partition,
                    "number": b.number,
                    "units": [unit(u, s) for u, s in zip(b.units, b.sources)],
                    "rows": b.rows,
                    "steps": [b.first_step, b.last_step],
                    "worker": k % workers,
                }
                for k, b in enumerate(self.schedule)
            ],
        }
