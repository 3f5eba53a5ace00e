"""The AUC experiment's model trained on index orders: today's windowed order, an i.i.d. shuffle and
the stratified windows, 5 seeds each; prints mean/std/min/max AUC and the wall time.

Same data (experiments/auc_variance/data.py: 200,000 time-ordered rows, 56 row groups), model and
training (train.py: ClickModel, batch 512, 2 epochs, one thread). Batches are gathered from the
training table in memory by row id, so only the order differs between rows of the table.
Run: PYTHONPATH=. python experiments/mixing/auc.py [--seeds 5] [--orders windowed,iid,mix64,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
AUC = HERE.parent / "auc_variance"
for p in (HERE, AUC):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
from data import DataSpec, make_dataset, read_all  # noqa: E402
from order import EpochOrder, chunk_order, iid_order, stratified_order, windowed_order  # noqa: E402
from train import train_and_evaluate  # noqa: E402

SPEC = DataSpec(train_rows=200_000, eval_rows=50_000, train_files=8, row_group_rows=4096)
BATCH, EPOCHS = 512, 2

ORDERS: dict[str, Callable[[np.ndarray, int, int], EpochOrder]] = {
    "windowed": lambda r, s, e: windowed_order(r, s, e, window=4),
    "iid": lambda r, s, e: iid_order(r, s, e),
    "mix64": lambda r, s, e: stratified_order(r, s, e, window=64),
    "mix16": lambda r, s, e: stratified_order(r, s, e, window=16),
    "mix8": lambda r, s, e: stratified_order(r, s, e, window=8),
    "mix8-1rg": lambda r, s, e: stratified_order(r, s, e, window=8, block_rows=4096),
    "mix28": lambda r, s, e: stratified_order(r, s, e, window=28),
    "mixr16": lambda r, s, e: stratified_order(r, s, e, window=16, assign="rows"),
    "chunks": lambda r, s, e: chunk_order(r, s, e, chunk_rows=512),
    "mixall": lambda r, s, e: stratified_order(r, s, e, window=len(r)),
}
NAMES = {"windowed": "windowed w=4 (today's default)", "iid": "i.i.d. permutation per epoch",
         "mix64": "stratified K=64 (proposed default)", "mix16": "stratified K=16",
         "mix8": "stratified K=8", "mix8-1rg": "stratified K=8, blocks of 1 row group",
         "mix28": "stratified K=28", "mixr16": "stratified K=16, balanced by rows",
         "chunks": "cache-first chunks of 512 rows", "mixall": "stratified, window = all row groups (T = 1)"}


def unit_rows(train_dir: Path) -> np.ndarray:
    """Rows of every row group in canonical order (files by name, row groups by index)."""
    files = sorted(p for p in train_dir.glob("*.parquet") if not p.name.startswith(("_", ".")))
    return np.asarray([pq.ParquetFile(f).metadata.row_group(i).num_rows
                       for f in files for i in range(pq.ParquetFile(f).num_row_groups)], dtype=np.int64)


def batches(table: dict[str, np.ndarray], rows: np.ndarray, make: Callable[[np.ndarray, int, int], EpochOrder],
            seed: int) -> Iterator[dict[str, np.ndarray]]:
    for epoch in range(EPOCHS):
        ids, offsets = make(rows, seed, epoch).global_steps(BATCH)
        assert np.array_equal(np.sort(ids), np.arange(len(ids))), "an order lost or repeated a row"
        for a, b in zip(offsets, offsets[1:]):
            yield {k: v[ids[a:b]] for k, v in table.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=5, help="seeds 1..N per order")
    ap.add_argument("--orders", default="windowed,iid,mix64", help=f"comma list of {sorted(ORDERS)}")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--row-group-rows", type=int, default=SPEC.row_group_rows,
                    help="rows per row group of the generated data (4096: the experiment's 56 row groups)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    spec = dataclasses.replace(SPEC, row_group_rows=a.row_group_rows)
    train_dir, eval_dir = make_dataset(a.out / f"data-{a.row_group_rows}", spec)
    table, evald = read_all(train_dir), read_all(eval_dir)
    rows = unit_rows(train_dir)
    print(f"{len(rows)} row groups, {rows.sum():,} rows; batch {BATCH}, {EPOCHS} epochs", flush=True)
    names = a.orders.split(",")
    aucs: dict[str, list[float]] = {n: [] for n in names}
    for seed in range(1, a.seeds + 1):  # interleaved, so every order meets the same machine conditions
        for n in names:
            t = time.perf_counter()
            r = train_and_evaluate(batches(table, rows, ORDERS[n], seed), evald)
            aucs[n].append(r.auc)
            print(f"  {n} seed {seed}: AUC {r.auc:.4f} ({time.perf_counter() - t:.1f} s)", flush=True)
    ref = aucs.get("iid")
    print("\n| order | AUC mean | std over seeds | min | max | mean - i.i.d. | std / i.i.d. std |\n|---|---|---|---|---|---|---|")
    for n in names:
        x = aucs[n]
        mean, std = statistics.fmean(x), statistics.stdev(x) if len(x) > 1 else 0.0
        rel = "-"
        if ref is not None and len(ref) > 1:
            rel = f"{mean - statistics.fmean(ref):+.4f} | {std / statistics.stdev(ref):.2f}"
        print(f"| {NAMES[n]} | {mean:.4f} | {std:.4f} | {min(x):.4f} | {max(x):.4f} | {rel} |")
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
