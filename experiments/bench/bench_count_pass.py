"""Planning's counting pass for ``rows="changes"``: one thread against several, with and without a cache.

Writes 4 files of 160,000 rows (id int64, x float64, y float32) in row groups of ``--rg`` rows,
then builds a Loader with a transform that keeps the even ids (rows="changes") ``--reps`` times
per configuration and prints each configuration's times and median. Planning runs the
transform over every row group before the loader is built, so the time is the constructor's.

    PYTHONPATH=. python experiments/bench/bench_count_pass.py --rg 80 --reps 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import detload.planning.transform as xform
from detload import Loader, Transform


def keep_even(cols, ctx):
    keep = cols["id"] % 2 == 0
    return {k: np.asarray(v)[keep] for k, v in cols.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rg", type=int, default=80, help="rows per row group")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8])
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="count-pass-")
    try:
        root = os.path.join(tmp, "ds")
        os.makedirs(root)
        for f in range(4):
            n = 160_000
            rng = np.random.default_rng(f)
            pq.write_table(pa.table({"id": np.arange(f * n, (f + 1) * n), "x": rng.random(n),
                                     "y": rng.random(n).astype(np.float32)}),
                           os.path.join(root, f"p{f}.parquet"), row_group_size=args.rg, compression="zstd")
        t = Transform(keep_even, name="keep-even", version="1", rows="changes")
        times: dict[tuple[int, str], list[float]] = {}
        for _ in range(args.reps):
            for threads in args.threads:
                xform.plan_transform.__defaults__ = (threads,)
                for mode in ("no cache", "cold cache"):
                    cache = os.path.join(tmp, "cache") if mode == "cold cache" else None
                    shutil.rmtree(os.path.join(tmp, "cache"), ignore_errors=True)
                    t0 = time.perf_counter()
                    with Loader(root, batch_size=256, seed=1, transform=t, cache=cache):
                        times.setdefault((threads, mode), []).append(time.perf_counter() - t0)
        for (threads, mode), v in sorted(times.items()):
            print(f"threads={threads:<2} {mode:<10} median {statistics.median(v):6.2f} s  runs "
                  + " ".join(f"{x:.2f}" for x in v))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
