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

import numpy as np
import xxhash

from ._check import check_int
from .errors import EmptyDatasetError, OptionError

__all__ = [
    "PLAN_FORMAT_VERSION",
    "Block",
    "OrderOptions",
    "Plan",
    "block_permutation",
    "make_plan",
    "unit_permutation",
]

#: Bumped whenever the same inputs would yield a different order.
PLAN_FORMAT_VERSION = 1

# Purpose tags: the first entropy word of every random stream, so that streams
# of different purposes never coincide even when the other words do.
TAG_UNITS = 0x554E_4954  # "UNIT"
TAG_BLOCK = 0x424C_4B52  # "BLKR"

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
    """``np.argsort(keys, kind="stable")`` for uint64 keys, computed in two stable passes.

    The first pass sorts by the top 16 bits, which NumPy radix-sorts in linear
    time; for random keys that leaves short unordered runs, which the second,
    stable sort by the full key (NumPy's timsort) finishes in near-linear time.
    Both passes are stable, so equal keys keep their positions' order and the
    result is exactly the stable order, whatever the keys. It runs once per
    block per epoch, in the workers: about 2x faster than a four-digit LSD
    radix sort and 3x faster than a merge sort of 64-bit keys at 65,536 keys.
    """
    if keys.shape[0] < 4096:
        return np.argsort(keys, kind="stable").astype(np.int64)
    # The top 16 bits: on a little-endian machine, every fourth uint16 of the keys, read
    # in place (no shifted copy and no cast; 0.2 ms less per 65,536-row block).
    top = (keys.view(np.uint16)[3::4] if sys.byteorder == "little" and keys.flags.c_contiguous
           else (keys >> np.uint64(48)).astype(np.uint16))
    order = np.argsort(top, kind="stable")
    order = order[np.argsort(keys[order], kind="stable")]
    return order.astype(np.int64, copy=False)


def unit_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the epoch's units when shuffling."""
    return _stream_permutation(_entropy(TAG_UNITS, seed, epoch), n)


def block_permutation(seed: int, epoch: int, partition: int, block: int, n: int) -> np.ndarray:
    """The order of the ``n`` rows of one block when shuffling."""
    return _stream_permutation(_entropy(TAG_BLOCK, seed, epoch, partition, block), n)


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

    def __post_init__(self) -> None:
        # check_int returns a plain int: a NumPy integer would break the JSON of the fingerprint.
        set_ = object.__setattr__
        set_(self, "seed", check_int("seed", self.seed, 0, _MAX_SEED, shown="[0, 2**64)"))
        for name in ("batch_size", "shuffle_window", "partitions", "world_size"):
            set_(self, name, check_int(name, getattr(self, name), 1))
        for name in ("shuffle", "drop_last"):
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
        return {
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
            "drop_last": self.drop_last,
            "partitions": self.partitions,
        }


@dataclass(frozen=True)
class Block:
    """``shuffle_window`` consecutive units of one partition, whose rows are permuted together.

    ``start`` is the block's first row within its partition's stream; ``first_step``
    and ``last_step`` the steps whose micro-batches take rows from it.
    """

    partition: int
    number: int
    units: tuple[int, ...]
    rows: int
    start: int
    first_step: int
    last_step: int

    @property
    def end(self) -> int:
        return self.start + self.rows


@dataclass(frozen=True)
class Plan:
    """One epoch's plan for one rank. Plain data: print it, test it, fingerprint it."""

    options: OrderOptions
    epoch: int
    rank: int
    unit_rows: np.ndarray = field(repr=False)
    unit_order: np.ndarray = field(repr=False)
    partition_rows: tuple[int, ...]
    blocks: tuple[tuple[Block, ...], ...] = field(repr=False)
    steps: int
    dropped_rows: int
    fingerprint: str
    schedule: tuple[Block, ...] = field(repr=False)

    @property
    def owned_partitions(self) -> range:
        per = self.options.partitions // self.options.world_size
        return range(self.rank * per, (self.rank + 1) * per)

    @property
    def total_rows(self) -> int:
        return int(self.unit_rows.sum())

    def micro_range(self, partition: int, step: int) -> tuple[int, int]:
        """Rows [lo, hi) of ``partition``'s stream that ``step`` yields (maybe empty)."""
        m = self.options.micro_batch
        n = self.partition_rows[partition]
        return min(step * m, n), min(step * m + m, n)

    def step_rows(self, step: int) -> int:
        """Rows this rank's batch at ``step`` holds."""
        return sum(hi - lo for lo, hi in (self.micro_range(p, step) for p in self.owned_partitions))

    def schedule_from(self, step: int) -> tuple[Block, ...]:
        """The blocks still needed when the epoch starts (or resumes) at ``step``."""
        if step == 0:
            return self.schedule
        m = self.options.micro_batch
        return tuple(b for b in self.schedule if b.end > step * m)

    def worker_schedules(self, workers: int, start_step: int = 0) -> list[list[Block]]:
        """Block k of the schedule goes to worker k mod ``workers``."""
        out: list[list[Block]] = [[] for _ in range(workers)]
        for k, b in enumerate(self.schedule_from(start_step)):
            out[k % workers].append(b)
        return out

    def to_dict(self, workers: int = 1) -> dict[str, object]:
        """A JSON-able description (what ``detload plan`` prints)."""
        return {
            "plan_format": PLAN_FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "epoch": self.epoch,
            "rank": self.rank,
            "options": self.options.order_dict() | {"batch_size": self.options.batch_size,
                                                    "world_size": self.options.world_size},
            "units": int(self.unit_rows.shape[0]),
            "rows": self.total_rows,
            "steps": self.steps,
            "dropped_rows": self.dropped_rows,
            "partition_rows": list(self.partition_rows),
            "unit_order": self.unit_order.tolist(),
            "blocks": [
                {
                    "k": k,
                    "partition": b.partition,
                    "number": b.number,
                    "units": list(b.units),
                    "rows": b.rows,
                    "steps": [b.first_step, b.last_step],
                    "worker": k % workers,
                }
                for k, b in enumerate(self.schedule)
            ],
        }


def order_fingerprint(dataset_fingerprint: str, options: OrderOptions) -> str:
    """Identifies the order of every epoch: same fingerprint, same batches."""
    payload = json.dumps(
        {"plan_format": PLAN_FORMAT_VERSION, "dataset": dataset_fingerprint, **options.order_dict()},
        sort_keys=True,
    )
    return xxhash.xxh3_128_hexdigest(payload.encode())


def make_plan(
    unit_rows: Sequence[int] | np.ndarray,
    options: OrderOptions,
    *,
    epoch: int,
    rank: int = 0,
    dataset_fingerprint: str = "",
) -> Plan:
    """Plan epoch ``epoch`` for ``rank``.

    ``unit_rows[j]`` is the row count of unit j (a non-empty row group) in
    canonical order. Unit j of the permuted list goes to partition j mod P;
    within a partition, ``shuffle_window`` consecutive units form a block; the
    partition's stream is its blocks' rows in order and step i takes rows
    [i*m, (i+1)*m) of every partition (m = global batch / P).
    """
    check_int("epoch", epoch, 0, _U32, shown="[0, 2**32)")
    check_int("rank", rank, 0)
    if rank >= options.world_size:
        raise OptionError(f"rank {rank} is not below the world size {options.world_size}")
    rows = np.asarray(unit_rows, dtype=np.int64)
    if rows.ndim != 1 or (rows <= 0).any():
        raise OptionError("unit_rows must list positive row counts (empty row groups are not units)")
    n = int(rows.shape[0])
    if n == 0:
        raise EmptyDatasetError("the dataset has no rows: every file is empty")
    P = options.partitions
    if n < P:
        raise OptionError(
            f"partitions={P} exceeds the {n} non-empty row groups of the dataset: "
            "some partitions would hold no data. Use fewer partitions or smaller row groups."
        )
    order = unit_permutation(options.seed, epoch, n) if options.shuffle else np.arange(n, dtype=np.int64)
    m = options.micro_batch
    blocks: list[tuple[Block, ...]] = []
    part_rows: list[int] = []
    for p in range(P):
        units = order[p::P]
        bs: list[Block] = []
        start = 0
        for number, lo in enumerate(range(0, len(units), options.shuffle_window)):
            members = tuple(int(u) for u in units[lo : lo + options.shuffle_window])
            r = int(rows[list(members)].sum())
            bs.append(Block(p, number, members, r, start, start // m, (start + r - 1) // m))
            start += r
        blocks.append(tuple(bs))
        part_rows.append(start)
    total = int(rows.sum())
    if options.drop_last:
        steps = min(r // m for r in part_rows)
        if steps == 0:
            raise OptionError(
                f"drop_last=True with a global batch of {options.global_batch_size} rows drops "
                f"every row: the smallest partition holds {min(part_rows)} rows. "
                "Use a smaller batch_size or drop_last=False."
            )
        dropped = total - steps * m * P
    else:
        steps = max(-(-r // m) for r in part_rows)
        dropped = 0
    per = P // options.world_size
    owned = range(rank * per, (rank + 1) * per)
    needed = [b for p in owned for b in blocks[p] if b.first_step < steps]
    schedule = tuple(sorted(needed, key=lambda b: (b.first_step, b.partition, b.number)))
    return Plan(
        options=options,
        epoch=epoch,
        rank=rank,
        unit_rows=rows,
        unit_order=order,
        partition_rows=tuple(part_rows),
        blocks=tuple(blocks),
        steps=steps,
        dropped_rows=dropped,
        fingerprint=order_fingerprint(dataset_fingerprint, options),
        schedule=schedule,
    )
