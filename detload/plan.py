"""The planner: a pure function from row-group sizes, seed, epoch and options to a plan.

No threads, no I/O. The plan fixes, before any data is read, which rows every
step of the epoch yields on every rank; workers and the merger only execute it.
See docs/determinism.md for the contract this file implements.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import xxhash

from ._check import check_int
from .errors import EmptyDatasetError, OptionError

__all__ = [
    "DEFAULT_BLOCK_BUDGET",
    "PLAN_FORMAT_VERSION",
    "Block",
    "OrderOptions",
    "Plan",
    "Range",
    "Unit",
    "UnitList",
    "block_memory_warning",
    "block_permutation",
    "greedy_steps",
    "group_permutation",
    "group_row_order",
    "make_plan",
    "order_fingerprint",
    "row_group_entropy",
    "unit_permutation",
]

#: Bumped whenever the same inputs would yield a different order. Format 1 (whole row
#: groups dealt round-robin to partitions) is gone; 2 is the only format.
PLAN_FORMAT_VERSION = 2

# Purpose tags: the first entropy word of every random stream, so that streams
# of different purposes never coincide even when the other words do.
TAG_UNITS = 0x554E_4954  # "UNIT"
TAG_BLOCK = 0x424C_4B52  # "BLKR"
TAG_GROUPS = 0x4752_5053  # "GRPS": the order of a block's groups (group_batches)

_U32 = 0xFFFF_FFFF
_MAX_SEED = 2**64 - 1


def _entropy(tag: int, seed: int, *words: int) -> list[int]:
    # Fixed length for a given tag: SeedSequence([s, e]) == SeedSequence([s, e, 0]),
    # so a variable-length list could make two purposes share a stream.
    return [tag, seed & _U32, seed >> 32, *words]


def _stream_permutation(entropy: list[int], n: int) -> np.ndarray:
    """A permutation of range(n) fixed by PCG64's raw output, not by a NumPy algorithm.

    ``Generator.permutation``'s algorithm may change between NumPy releases;
    ``random_raw`` is the bit generator's output, which NumPy keeps stable, and a
    stable argsort of it is a fixed function of those numbers.
    """
    bits = np.asarray(np.random.PCG64(np.random.SeedSequence(entropy)).random_raw(n), dtype=np.uint64)
    return _stable_argsort_u64(bits)


def _stable_argsort_u64(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for uint64 keys.

    Random keys almost always take `_packed_order` (one plain sort). Otherwise two
    stable passes: the first sorts by the top 16 bits, which NumPy radix-sorts in linear
    time; for random keys that leaves short unordered runs, which the second,
    stable sort by the full key (NumPy's timsort) finishes in near-linear time.
    Both passes are stable, so equal keys keep their positions' order and the
    result is exactly the stable order, whatever the keys. It runs once per
    block per epoch, in the workers: about 2x faster than a four-digit LSD
    radix sort and 3x faster than a merge sort of 64-bit keys at 65,536 keys.
    """
    if keys.shape[0] < 4096:
        return np.argsort(keys, kind="stable").astype(np.int64)
    order = _packed_order(keys)
    return order if order is not None else _two_pass_order(keys)


def _two_pass_order(keys: np.ndarray) -> np.ndarray:
    """The stable order of uint64 ``keys`` in two stable passes (see `_stable_argsort_u64`)."""
    # The top 16 bits: on a little-endian machine, every fourth uint16 of the keys, read
    # in place (no shifted copy and no cast; 0.2 ms less per 65,536-row block).
    top = (keys.view(np.uint16)[3::4] if sys.byteorder == "little" and keys.flags.c_contiguous
           else (keys >> np.uint64(48)).astype(np.uint16))
    order = np.argsort(top, kind="stable")
    order = order[np.argsort(keys[order], kind="stable")]
    return order.astype(np.int64, copy=False)


# Positions 0..n-1 as uint64 for `_packed_order`, kept for the last n asked (a block's size
# repeats; read-only, so threads may share it).
_POSITIONS: list[np.ndarray] = [np.arange(0, dtype=np.uint64)]


def _packed_order(keys: np.ndarray) -> np.ndarray | None:
    """The stable order of ``keys``, found by one plain sort, when that is exact; else None.

    With b = the bits of n - 1, each key keeps its top 64 - b bits and carries its position
    in the low b: the packed words are distinct, so any sorting algorithm orders them the
    same way (no stability needed, and NumPy's vectorised quicksort is used). Where the top
    bits of all keys differ, that order is the keys' order, exactly; where two keys share
    them (for 65,536 random keys, about once in 130,000 blocks), it is not, and None sends
    the caller to the two-pass sort. About 40% faster per block than that sort.
    """
    n = keys.shape[0]
    b = (n - 1).bit_length()
    if b > 32:
        return None  # so many keys that shared top bits become likely
    low = np.uint64((1 << b) - 1)
    positions = _POSITIONS[0]
    if positions.shape[0] != n:
        positions = np.arange(n, dtype=np.uint64)
        positions.flags.writeable = False
        _POSITIONS[0] = positions
    packed = np.bitwise_and(keys, ~low)
    packed |= positions
    packed.sort()
    # Two keys with equal top bits are neighbours that differ in the low bits only.
    if (np.bitwise_xor(packed[1:], packed[:-1]) <= low).any():
        return None
    packed &= low
    return packed.view(np.int64)


def unit_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the epoch's units when shuffling."""
    return _stream_permutation(_entropy(TAG_UNITS, seed, epoch), n)


def block_permutation(seed: int, epoch: int, partition: int, block: int, n: int) -> np.ndarray:
    """The order of the ``n`` rows of one block when shuffling."""
    return _stream_permutation(_entropy(TAG_BLOCK, seed, epoch, partition, block), n)


def group_permutation(seed: int, epoch: int, partition: int, block: int, n: int) -> np.ndarray:
    """The order of the ``n`` groups of one block when shuffling with ``group_batches``.

    Its own purpose tag, so a block of n groups and a block of n rows never share a stream.
    """
    return _stream_permutation(_entropy(TAG_GROUPS, seed, epoch, partition, block), n)


def group_row_order(starts: np.ndarray, rows: int, order: np.ndarray) -> np.ndarray:
    """The row permutation that lays a block's groups out in ``order``, rows in stored order.

    ``starts`` are the groups' first rows (increasing, the first 0), ``rows`` the block's
    rows; row ``i`` of the result is the stored row that lands at position ``i``.
    """
    starts = np.asarray(starts, dtype=np.int64)
    sizes = np.diff(np.append(starts, rows))
    s_sizes = sizes[order]
    # Position i inside permuted group g (which begins at out_start[g]) takes stored row
    # starts[g] + (i - out_start[g]).
    out_start = np.cumsum(s_sizes) - s_sizes
    return np.repeat(starts[order] - out_start, s_sizes) + np.arange(rows, dtype=np.int64)


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


def _steps(part_rows: Sequence[int], m: int, drop_last: bool) -> int:
    """Steps every rank takes: each partition gives one micro-batch of ``m`` rows per step, so
    the shortest partition's full micro-batches (drop_last) or the longest one's, last short."""
    return min(r // m for r in part_rows) if drop_last else max(-(-r // m) for r in part_rows)


def _rank_schedule(blocks: Sequence[Sequence[Any]], options: OrderOptions, rank: int, steps: int) -> tuple[Any, ...]:
    """The blocks of ``rank``'s partitions that the epoch's ``steps`` reach, in the order the
    merger needs them (by first step, then partition, then number)."""
    per = options.partitions // options.world_size
    needed = [b for q in range(rank * per, (rank + 1) * per) for b in blocks[q] if b.first_step < steps]
    return tuple(sorted(needed, key=lambda b: (b.first_step, b.partition, b.number)))


# -- units: row ranges; partitions balanced by rows -----------------------------------
#
# See docs/determinism.md for the model.

#: The block-memory estimate above which `block_memory_warning` warns (1 GiB).
DEFAULT_BLOCK_BUDGET = 1 << 30

# Tag of a random stream that belongs to a row group's data (a random transform):
# keyed by the row group, never by where a partition boundary cut it.
TAG_ROW_GROUP = 0x5247_5250  # "RGRP"


def row_group_entropy(seed: int, epoch: int, file: int, row_group: int) -> list[int]:
    """Entropy of the stream that belongs to one row group's rows (e.g. a random transform's).

    It depends on the row group alone, so both sides of a partition boundary that
    cuts the row group draw the same numbers, at every world size and resume point.
    """
    return _entropy(TAG_ROW_GROUP, seed, epoch, file, row_group)


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


def _cut(unit: Unit, offsets: Sequence[int]) -> tuple[list[Unit], int]:
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


def _snap(unit: Unit, c: int) -> int:
    """Offset ``c`` inside ``unit`` moved to the nearest group start or the unit's end (ties: down)."""
    if not unit.groups:
        return c
    cands = np.asarray([*unit.groups, unit.rows], dtype=np.int64)
    i = int(np.searchsorted(cands, c, side="right")) - 1  # cands[i] <= c < cands[i + 1]
    lo, hi = int(cands[i]), int(cands[i + 1])
    return lo if c - lo <= hi - c else hi


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


def order_fingerprint(dataset_fingerprint: str, units_digest: str, options: OrderOptions) -> str:
    """Identifies the order of every epoch: same fingerprint, same batches. It covers the units
    through their digest."""
    payload = json.dumps(
        {"plan_format": PLAN_FORMAT_VERSION, "dataset": dataset_fingerprint, "units": units_digest,
         **options.order_dict()},
        sort_keys=True,
    )
    return xxhash.xxh3_128_hexdigest(payload.encode())


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
    ``[i*m, (i+1)*m)`` of every partition (m = global batch / P).
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
    order_l = order.tolist()
    pieces: list[Unit] = [units.units[j] for j in order_l]
    sources: list[int] = order_l
    piece_rows = units.rows[order]
    redundant = 0
    for i in sorted(cuts, reverse=True):  # back to front: earlier positions stay valid
        cut, shared = _cut(pieces[i], cuts[i])
        redundant += shared
        pieces[i : i + 1] = cut
        sources[i : i + 1] = [sources[i]] * len(cut)
        piece_rows = np.concatenate([piece_rows[:i], [c.rows for c in cut], piece_rows[i + 1 :]])
    csum = np.concatenate([[0], np.cumsum(piece_rows)])
    # A piece lies in the partition its first row lies in (no piece straddles a boundary);
    # side="right" skips empty partitions.
    part_of = np.searchsorted(np.asarray(bounds), csum[:-1], side="right") - 1
    edges = np.searchsorted(part_of, np.arange(P + 1), side="left").tolist()
    cs = csum.tolist()

    W = options.shuffle_window
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
        raise OptionError(
            f"drop_last=True drops every row: the epoch holds {total} rows, the smallest of the "
            f"{P} partitions {min(part_rows)}, fewer than one micro-batch of {m} rows (global batch "
            f"{options.global_batch_size} = {P} x {m}). Use a smaller batch_size or drop_last=False."
        )
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
    if len(biggest.units) > 1:
        text += (f" A smaller shuffle_window (now {window}) puts fewer row groups in a block"
                 " (fewer rows are mixed together).")
    text += (f" The largest row group holds {largest_unit:,} rows: rewriting the data with smaller row"
             " groups (`detload layout SRC DST --row-group-rows N`) makes blocks smaller at any window.")
    return text
