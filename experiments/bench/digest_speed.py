"""How fast `detload digest` is beside reading the same data with pyarrow (docs/layout.md cites it).

Generates (once) a table of --rows rows and 20 columns: 8 integer, 6 float, 4 string, 1 bool and one
variable-length list column, written as one Parquet file with 1Mi-row row groups, then times
`pyarrow.parquet.read_table` (threads on), `detload.digest` of the file, and the hashing alone
(the digest of the table already in memory). Prints medians over --runs and the ratio digest/read.
    PYTHONPATH=. python experiments/bench/digest_speed.py --dir /tmp/digest-bench --rows 5000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def make_table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {}
    for i in range(8):
        dt = np.int64 if i % 2 == 0 else np.int32
        cols[f"i{i}"] = pa.array(rng.integers(-(10**6), 10**6, rows).astype(dt))
    for i in range(6):
        dt = np.float64 if i % 2 == 0 else np.float32
        cols[f"f{i}"] = pa.array(rng.standard_normal(rows).astype(dt))
    words = np.array([f"w{k:05d}-{'x' * (k % 13)}" for k in range(5000)])
    for i in range(4):
        cols[f"s{i}"] = pa.array(words[rng.integers(0, len(words), rows)])
    cols["b"] = pa.array(rng.integers(0, 2, rows).astype(bool))
    lengths = rng.integers(0, 6, rows)
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    cols["l"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 1000, int(offsets[-1]))))
    return pa.table(cols)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/digest-bench")
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="digest threads (default: one per CPU)")
    a = ap.parse_args()
    from detload._digest import digest

    path = os.path.join(a.dir, f"bench-{a.rows}.parquet")
    if not os.path.exists(path):
        os.makedirs(a.dir, exist_ok=True)
        pq.write_table(make_table(a.rows), path, row_group_size=1 << 20)
    size = os.path.getsize(path)
    read_t, dig_t, hash_t = [], [], []
    table = None
    for _ in range(a.runs):
        t = time.perf_counter()
        table = pq.read_table(path)
        read_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        d = digest(path, threads=a.threads)
        dig_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        d_mem = digest(table)
        hash_t.append(time.perf_counter() - t)
        assert d == d_mem, (d, d_mem)
    r, g, h = statistics.median(read_t), statistics.median(dig_t), statistics.median(hash_t)
    print(f"{a.rows:,} rows x {table.num_columns if table is not None else 0} columns, {size / 1e6:,.0f} MB on disk, "
          f"{os.cpu_count()} CPUs, medians of {a.runs}")
    print(f"  pyarrow read_table      {r:7.3f} s")
    print(f"  detload digest (file)   {g:7.3f} s   ratio digest/read = {g / r:.2f}")
    print(f"  digest of the in-memory table (one thread, hashing only) {h:7.3f} s")
    print(f"  {d}")


if __name__ == "__main__":
    main()
