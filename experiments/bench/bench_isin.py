"""Loader() construction with a long ``isin`` filter: planning cost against values and row groups.

Writes --row-groups row groups of --rows-per-group rows (100 row groups a file, int64 ``id``
and string ``key`` drawn at random, so min/max settle nothing and every row group goes
through the selection pass; a second copy with bloom filters on both) under --data, then
times ``detload.Loader(..., filter=[(col, "in", values)])`` for each value count, column and
copy (median of --repeats runs in this process) and prints a table with the rows selected.
Not a test: a script that prints a table.

    PYTHONPATH=. python experiments/bench/bench_isin.py --values 1000,100000,1000000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this tree's detload

import detload  # noqa: E402

ID_RANGE = 10_000_000  # ids and values are drawn from [0, ID_RANGE)
GROUPS_PER_FILE = 100


def write(root: Path, row_groups: int, rows: int, bloom: bool) -> None:
    """The dataset (kept when complete: ``_done`` marks it)."""
    if (root / "_done").exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    opts = {"bloom_filter_options": {"id": {"ndv": rows, "fpp": 0.01}, "key": {"ndv": rows, "fpp": 0.01}}} if bloom else {}
    for f in range(0, row_groups, GROUPS_PER_FILE):
        n = min(GROUPS_PER_FILE, row_groups - f) * rows
        ids = rng.integers(0, ID_RANGE, n)
        table = pa.table({"id": ids, "key": pa.array([f"k{v:08d}" for v in ids]), "x": ids * 0.5})
        pq.write_table(table, root / f"part-{f // GROUPS_PER_FILE:04d}.parquet", row_group_size=rows, **opts)
    (root / "_done").touch()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/detload-bench-isin"))
    ap.add_argument("--row-groups", type=int, default=1000)
    ap.add_argument("--rows-per-group", type=int, default=100)
    ap.add_argument("--values", default="1000,100000,1000000", help="comma-separated isin list lengths")
    ap.add_argument("--columns", default="id,key", help="id (int64) and/or key (string)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-bloom", action="store_true", help="skip the copy with bloom filters")
    args = ap.parse_args()
    copies = [("no", args.data / f"plain-{args.row_groups}x{args.rows_per_group}")]
    if not args.no_bloom:
        copies.append(("yes", args.data / f"bloom-{args.row_groups}x{args.rows_per_group}"))
    for bloom, root in copies:
        write(root, args.row_groups, args.rows_per_group, bloom == "yes")
    print(f"{args.row_groups} row groups of {args.rows_per_group} rows; Loader() median of {args.repeats}")
    print(f"{'values':>9} {'column':>6} {'bloom':>5} {'rows selected':>13} {'Loader() s':>10} {'min s':>7} {'max s':>7}")
    for count in (int(v) for v in args.values.split(",")):
        drawn = np.random.default_rng(1).integers(0, ID_RANGE, count)
        for col in args.columns.split(","):
            values = drawn.tolist() if col == "id" else [f"k{v:08d}" for v in drawn]
            for bloom, root in copies:
                times, rows = [], 0
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    loader = detload.Loader(str(root), batch_size=64, seed=0, filter=[(col, "in", values)])
                    times.append(time.perf_counter() - t)
                    rows = (loader.filter_stats or {}).get("rows_selected", 0)
                    loader.close()
                print(f"{count:>9,} {col:>6} {bloom:>5} {rows:>13,} {statistics.median(times):>10.2f} "
                      f"{min(times):>7.2f} {max(times):>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
