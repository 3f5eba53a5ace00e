"""Mixing of each order on simulated day-partitioned CTR layouts, beside an i.i.d. shuffle.

Layouts (row counts only; a row's day is known from its position): 14 days sorted by day, and the
same rows sorted by (market, day) as `detload layout --sort-by market,day` writes them. Prints one
markdown table per layout and partition count: python experiments/mixing/validate.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from metrics import Mixing, mixing  # noqa: E402
from order import EpochOrder, chunk_order, iid_order, stratified_order, windowed_order  # noqa: E402

DAYS = 14
RG_ROWS = 65_536


def day_sorted(files_per_day: int, seed: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row groups of a day-partitioned table (day=01..14/part-k.parquet), files of 220k-300k rows cut
    into 65,536-row row groups; returns (rows per row group, file per row group, day per row)."""
    rng = np.random.default_rng(seed)
    rows, files, day = [], [], []
    f = 0
    for d in range(DAYS):
        for _ in range(files_per_day):
            n = int(rng.integers(220_000, 300_000))
            sizes = [RG_ROWS] * (n // RG_ROWS) + ([n % RG_ROWS] if n % RG_ROWS else [])
            rows += sizes
            files += [f] * len(sizes)
            day.append(np.full(n, d, dtype=np.int64))
            f += 1
    return np.asarray(rows), np.asarray(files), np.concatenate(day)


def market_day_sorted(markets: int, day_rows: int, seed: int = 6, rgs_per_file: int = 8
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same kind of table rewritten sorted by (market, day) into 65,536-row row groups (a row
    group may hold the end of one (market, day) and the start of the next); market sizes are skewed."""
    rng = np.random.default_rng(seed)
    share = 1.0 / np.arange(1, markets + 1) ** 0.8
    share /= share.sum()
    per_day = rng.integers(int(day_rows * 0.8), int(day_rows * 1.2), DAYS)
    cells = [(m, d, int(per_day[d] * share[m])) for m in range(markets) for d in range(DAYS)]
    day = np.concatenate([np.full(n, d, dtype=np.int64) for _, d, n in cells])
    total = len(day)
    rows = np.asarray([RG_ROWS] * (total // RG_ROWS) + ([total % RG_ROWS] if total % RG_ROWS else []))
    return rows, np.arange(len(rows)) // rgs_per_file, day


def orders(rows: np.ndarray, seed: int, P: int, quick: bool) -> list[Callable[[], EpochOrder]]:
    med = int(np.median(rows))
    out: list[Callable[[], EpochOrder]] = [
        lambda: windowed_order(rows, seed, 0, window=4, partitions=P),
        lambda: iid_order(rows, seed, 0, partitions=P),
        lambda: dataclasses.replace(stratified_order(rows, seed, 0, window=12, block_rows=med, partitions=P),
                                    name="stratified K=12 blocks of 1 rg"),
    ]
    out.append(lambda: stratified_order(rows, seed, 0, window=16, partitions=P, jitter=4))
    for K in ((16, 64) if quick else (16, 32, 64)):
        out.append(functools.partial(stratified_order, rows, seed, 0, window=K, partitions=P))
    out.append(lambda: stratified_order(rows, seed, 0, window=64, partitions=P, assign="rows"))
    out.append(lambda: chunk_order(rows, seed, 0, chunk_rows=1024, partitions=P))
    return out


def report(title: str, rows: np.ndarray, files: np.ndarray, day: np.ndarray, P: int, batch: int, seed: int,
           quick: bool) -> None:
    print(f"\n### {title}: {len(rows)} row groups, {rows.sum():,} rows, partitions {P}, global batch {batch}\n")
    print(Mixing.HEADER.replace("values/batch", "days/batch") + " window | decodes/rg max | block rows min-max |")
    for make in orders(rows, seed, P, quick):
        t0 = time.perf_counter()
        o = make()
        steps, offsets = o.global_steps(batch)
        m = mixing(o.name, steps, offsets, rows, files, day, DAYS)
        extra = " - | - | - |"
        if o.tasks:
            br = o.block_rows
            extra = f" {o.window} | {o.decodes.max()} | {br.min():,}-{br.max():,} |"
        print(m.row() + extra, f"<!-- {time.perf_counter() - t0:.1f}s -->", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer settings, one layout size")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows, files, day = day_sorted(files_per_day=3)
    for P in ((1,) if a.quick else (1, 8)):
        report("sorted by day", rows, files, day, P, 4096, a.seed, a.quick)
    for markets in ((6,) if a.quick else (4, 8)):
        rows, files, day = market_day_sorted(markets, day_rows=750_000)
        report(f"sorted by (market, day), {markets} markets", rows, files, day, 1, 4096, a.seed, a.quick)
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
