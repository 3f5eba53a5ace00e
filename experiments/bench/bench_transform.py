"""Where a per-row transform runs, side by side in one run: rows/s and consumer CPU per batch.

The CTR shape (datagen.make_ctr: 32 float32 dense, 8 int64 categorical columns) and a realistic
transform: hash the 8 categories into 2**20 buckets, log-normalise the 32 dense columns into
one (rows, 32) matrix, and build a crossed feature of the first two categories. Run it

- in the training loop, after a plain detload batch (``consumer``; ``consumer_warm``: the
  plain batches from a warm row-group cache, epochs 1 on),
- in detload's workers with ``transform=``, no cache (``workers``),
- in detload's workers with a cache: epoch 0 fills it (``cold``), later epochs read the
  cached output (``warm``: no decode, no transform),
- in a torch DataLoader's workers, on each row group (``torch``), re-batched like the others.

Each configuration runs in the same process one after the other, with the same worker count
and batch size; rows/s is per epoch from its first batch on (start-up left out), consumer CPU is ``time.thread_time`` around each batch's
``next()`` plus, for ``consumer``, the transform itself. Prints a table and the two ratios the
targets are about (warm / consumer, cold / torch).

    PYTHONPATH=. python experiments/bench/bench_transform.py --rows 2000000 --workers 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import datagen  # noqa: E402
from measure import rebatch  # noqa: E402

import detload  # noqa: E402

N_DENSE, N_CAT, BUCKETS = datagen.N_DENSE_CTR, datagen.N_CAT, 1 << 20
COLUMNS = ["label", *(f"dense_{i}" for i in range(N_DENSE)), *(f"cat_{i}" for i in range(N_CAT))]
_MULT = np.uint64(0x9E3779B97F4A7C15)


def ctr_features(cols, ctx=None):
    """Hashed categories (rows, 8) int32, log-normalised dense (rows, 32) float32, a crossed feature."""
    cats = np.stack([np.asarray(cols[f"cat_{i}"], dtype=np.uint64) for i in range(N_CAT)], axis=1)
    salt = np.arange(1, N_CAT + 1, dtype=np.uint64)
    hashed = ((cats + salt) * _MULT >> np.uint64(44)).astype(np.int32)  # top 20 bits: 2**20 buckets
    dense = np.stack([cols[f"dense_{i}"] for i in range(N_DENSE)], axis=1)
    dense = np.log1p(np.abs(dense)) * np.sign(dense)
    cross = (((cats[:, 0] * np.uint64(100_003) + cats[:, 1]) * _MULT) >> np.uint64(44)).astype(np.int32)
    return {"label": np.asarray(cols["label"]), "cat": hashed, "dense": dense.astype(np.float32), "cross": cross}


TRANSFORM = detload.Transform(ctr_features, name="ctr-features", version="1")


def _epoch(batches, consumer_fn=None) -> tuple[int, float, list[float]]:
    """(rows, seconds, consumer CPU ms per batch) of one pass, rows and seconds counted from its first
    batch on (a pool's start-up and first block are left out, for every loader alike)."""
    rows, cpu = 0, []
    it = iter(batches)
    t0 = None
    while True:
        c0 = time.thread_time()
        try:
            b = next(it)
        except StopIteration:
            break
        if consumer_fn is not None:
            b = consumer_fn(b)
        cpu.append((time.thread_time() - c0) * 1e3)
        if t0 is None:
            t0 = time.perf_counter()
        else:
            rows += len(b["label"])
    return rows, time.perf_counter() - (t0 or 0.0), cpu


def run_detload(data: str, args, *, transform, cache: str | None, consumer_fn=None) -> list[tuple[int, float, list[float]]]:
    out = []
    with detload.Loader(data, batch_size=args.batch_size, seed=1, workers=args.workers, pool=args.pool,
                        columns=COLUMNS, transform=transform, cache=cache) as ld:
        for e in range(args.epochs):
            ld.set_epoch(e)
            out.append(_epoch(ld, consumer_fn))
    return out


class _RowGroups:
    """Map-style dataset of (file, row group), the transform applied in the DataLoader's workers."""

    def __init__(self, data: str) -> None:
        import pyarrow.parquet as pq

        self.items = [(str(f), g) for f in sorted(Path(data).glob("*.parquet"))
                      for g in range(pq.read_metadata(f).num_row_groups)]
        self._files: dict = {}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        import pyarrow.parquet as pq

        path, g = self.items[i]
        pf = self._files.get(path) or self._files.setdefault(path, pq.ParquetFile(path))
        t = pf.read_row_group(g, columns=COLUMNS)
        return ctr_features({n: t.column(n).to_numpy() for n in COLUMNS})


def run_torch(data: str, args) -> list[tuple[int, float, list[float]]] | None:
    try:
        import torch
        from torch.utils.data import DataLoader
    except Exception:
        return None
    loader = DataLoader(_RowGroups(data), batch_size=None, shuffle=True, generator=torch.Generator().manual_seed(1),
                        num_workers=args.workers, persistent_workers=True)
    out = []
    for _ in range(args.epochs):
        items = ({k: v.numpy() for k, v in item.items()} for item in loader)
        out.append(_epoch(rebatch(items, args.batch_size)))
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pool", default="process", choices=["thread", "process"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "detload-bench-transform"))
    args = ap.parse_args(argv)
    data = str(datagen.make_ctr(Path(args.data) / "ctr", rows=args.rows, files=4, row_group_rows=16384))
    cache = tempfile.mkdtemp(prefix="detload-bench-transform-cache-")
    results: dict[str, list[tuple[int, float, list[float]]]] = {}
    try:
        results["consumer"] = run_detload(data, args, transform=None, cache=None, consumer_fn=ctr_features)
        plain_cache = os.path.join(cache, "plain")
        results["consumer_warm"] = run_detload(data, args, transform=None, cache=plain_cache,
                                               consumer_fn=ctr_features)[1:]
        results["workers"] = run_detload(data, args, transform=TRANSFORM, cache=None)
        cached = run_detload(data, args, transform=TRANSFORM, cache=cache)
        results["cold"], results["warm"] = cached[:1], cached[1:]
        got = run_torch(data, args)
        if got is not None:
            results["torch"] = got
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{args.rows:,} rows, batch {args.batch_size}, {args.workers} {args.pool} worker(s) (torch: "
          f"{args.workers} DataLoader workers), {args.epochs} epochs, {os.cpu_count()} CPUs")
    print(f"{'where the transform runs':<34} {'rows/s (median epoch)':>22} {'consumer CPU ms/batch (median)':>31}")
    rate = {}
    for name, label in (("consumer", "training loop (after detload)"),
                        ("consumer_warm", "training loop (after warm detload)"), ("workers", "detload workers, no cache"),
                        ("cold", "detload workers, cache cold (ep 0)"), ("warm", "detload, cached output (warm)"),
                        ("torch", "torch DataLoader workers")):
        if name not in results:
            print(f"{label:<34} {'not available':>22}")
            continue
        epochs = results[name]
        rate[name] = statistics.median(r / s for r, s, _ in epochs)
        cpu = statistics.median([c for _, _, cs in epochs for c in cs])
        print(f"{label:<34} {rate[name]:>22,.0f} {cpu:>31.3f}")
    print(f"warm / training loop: {rate['warm'] / rate['consumer']:.2f}x (target >= 4); after warm detload: "
          f"{rate['warm'] / rate['consumer_warm']:.2f}x")
    if "torch" in rate:
        print(f"cold / torch DataLoader: {rate['cold'] / rate['torch']:.2f}x (target >= 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
