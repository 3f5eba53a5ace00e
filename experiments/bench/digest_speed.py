"""How fast `detload digest` is beside reading the same data with pyarrow (docs/layout.md cites it).

Generates (once) a table of --rows rows and 20 columns: 8 integer, 6 float, 4 string, 1 bool and one
variable-length list column, written as one Parquet file with 1Mi-row row groups, then times
`pyarrow.parquet.read_table` (threads on), `detload.layout.digest` of the file, and the hashing alone
(the digest of the table already in memory, one thread). The strings are drawn from 5,000 words
(Parquet stores them dictionary-encoded), or with --unique-strings are distinct in every row (plain
pages). Prints wall and CPU seconds (medians over --runs) and the ratio digest/read.
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


def make_table(rows: int, seed: int = 0, unique_strings: bool = False) -> pa.Table:
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
        if unique_strings:  # 10 to 28 bytes, distinct in every row
            ids = np.char.add(f"{i}-", rng.permutation(rows).astype(str))
            cols[f"s{i}"] = pa.array(np.char.add(ids, words[rng.integers(0, len(words), rows)]))
        else:
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
    ap.add_argument("--unique-strings", action="store_true", help="distinct strings in every row")
    a = ap.parse_args()
    from detload._layout.digest import digest

    kind = "unique" if a.unique_strings else "words"
    path = os.path.join(a.dir, f"bench-{a.rows}-{kind}.parquet")
    if not os.path.exists(path):
        os.makedirs(a.dir, exist_ok=True)
        pq.write_table(make_table(a.rows, unique_strings=a.unique_strings), path, row_group_size=1 << 20)
    size = os.path.getsize(path)
    runs: dict[str, list[tuple[float, float]]] = {"read": [], "digest": [], "hash": []}
    table = None
    d = d_mem = None

    def timed(key: str, f):  # (wall, CPU of the whole process)
        w, c = time.perf_counter(), time.process_time()
        out = f()
        runs[key].append((time.perf_counter() - w, time.process_time() - c))
        return out

    for _ in range(a.runs):
        table = timed("read", lambda: pq.read_table(path))
        d = timed("digest", lambda: digest(path, threads=a.threads))
        d_mem = timed("hash", lambda t=table: digest(t))
        assert d == d_mem, (d, d_mem)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    print(f"{a.rows:,} rows x {table.num_columns if table is not None else 0} columns ({kind} strings), "
          f"{size / 1e6:,.0f} MB on disk, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
          f"medians of {a.runs}")
    print("                                      wall s    CPU s")
    print(f"  pyarrow read_table (threads on)    {med['read'][0]:7.3f}  {med['read'][1]:7.3f}")
    print(f"  detload digest of the file         {med['digest'][0]:7.3f}  {med['digest'][1]:7.3f}")
    print(f"  digest of the table in memory      {med['hash'][0]:7.3f}  {med['hash'][1]:7.3f}   (hashing only, one thread)")
    print(f"  ratio digest / read_table: wall {med['digest'][0] / med['read'][0]:.2f}, "
          f"CPU {med['digest'][1] / med['read'][1]:.2f}")
    print(f"  {d}")


if __name__ == "__main__":
    main()
