"""The example dataset behind ``detload demo``: small, CTR-like, with every column kind."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._check import check_int

__all__ = ["write_demo_dataset"]


def write_demo_dataset(path: str, *, rows: int = 200_000, files: int = 6, seed: int = 0) -> str:
    """Write ``files`` Parquet files with odd row-group sizes and one empty file; returns ``path``."""
    rows = check_int("rows", rows, 1, what="rows of the example dataset")
    files = check_int("files", files, 2, what="files, the last one empty")
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    schema = pa.schema([
        ("id", pa.int64()),
        ("label", pa.int8()),
        ("dense", pa.list_(pa.float32(), 8)),
        ("price", pa.float32()),
        ("cat", pa.int64()),
        ("query", pa.string()),
        ("history", pa.list_(pa.int64())),
    ])
    bounds = np.linspace(0, rows, files, dtype=np.int64)  # files-1 non-empty files + 1 empty
    for i in range(files):
        lo, hi = (int(bounds[i]), int(bounds[i + 1])) if i < files - 1 else (rows, rows)
        n = hi - lo
        price = rng.gamma(2.0, 10.0, n).astype(np.float32)
        price[rng.random(n) < 0.01] = np.nan
        hist_len = rng.integers(0, 6, n)
        table = pa.table({
            "id": np.arange(lo, hi, dtype=np.int64),
            "label": (rng.random(n) < 0.2).astype(np.int8),
            "dense": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 8).astype(np.float32)), 8),
            "price": price,
            "cat": rng.zipf(1.3, n).astype(np.int64) % 10_000,
            "query": pa.array([f"q{int(x)}" for x in rng.integers(0, 500, n)]),
            "history": pa.ListArray.from_arrays(
                pa.array(np.concatenate([[0], np.cumsum(hist_len)]).astype(np.int32)),
                pa.array(rng.integers(0, 10_000, int(hist_len.sum())).astype(np.int64)),
            ),
        }, schema=schema)
        # Odd row-group sizes, different per file, as real writers produce.
        pq.write_table(table, os.path.join(path, f"part-{i:05d}.parquet"), row_group_size=3_000 + 1_117 * i)
    with open(os.path.join(path, "_SUCCESS"), "w"):
        pass  # a side file, as Spark leaves: must be ignored
    return path
