"""Steady-state warm-cache rows/s: one loader with a fresh cache_dir, epoch 1 cold, then many warm epochs.

bench_remote.py compares whole configurations side by side; this one answers a narrower
question cheaply: how fast are warm epochs once everything is steady, and how much CPU do
they cost per million rows. Prints every epoch and the median of the warm ones.

    PYTHONPATH=. python experiments/bench/warm_epochs.py experiments/bench/data/ctr --epochs 8
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a Parquet dataset (e.g. one made by datagen.py)")
    ap.add_argument("--epochs", type=int, default=8, help="epochs in all; the first one is cold")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pool", choices=["thread", "process"], default="thread")
    ap.add_argument("--batch-size", type=int, default=4096)
    a = ap.parse_args(argv)
    if a.epochs < 2:
        ap.error("--epochs must be at least 2")

    from detload import Loader

    cache = tempfile.mkdtemp(prefix="detload-warm-")
    try:
        with Loader(a.source, batch_size=a.batch_size, seed=1, workers=a.workers, pool=a.pool,
                    cache=cache) as loader:
            rates, cpu = [], []
            for epoch in range(a.epochs):
                loader.set_epoch(epoch)
                t, c, rows = time.perf_counter(), _cpu_s(), 0
                for batch in loader:
                    rows += len(next(iter(batch.values())))
                dt = time.perf_counter() - t
                rates.append(rows / dt)
                cpu.append((_cpu_s() - c) / rows * 1e9)  # CPU-ms per million rows (this process)
                print(f"epoch {epoch + 1} ({'cold' if epoch == 0 else 'warm'}): {rates[-1]:,.0f} rows/s, "
                      f"{cpu[-1]:.0f} CPU-ms per million rows", flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"warm epochs: median {statistics.median(rates[1:]):,.0f} rows/s "
          f"({a.workers} {a.pool} workers; CPU counts this process only, so process workers are not in it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
