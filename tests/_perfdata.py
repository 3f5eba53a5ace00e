"""Small Parquet datasets for the throughput-feature tests (stats, trace, starvation, shared memory)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_small(path: Path, files: int = 3, rows: int = 3000, row_group: int = 500, ragged: bool = True) -> Path:
    """``files`` files of ``rows`` rows: id (unique int64), a float32 column, and optionally a string."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        cols = {"id": pa.array(ids), "x": pa.array(rng.random(rows, dtype=np.float32))}
        if ragged:
            cols["s"] = pa.array([f"r{j}" * (j % 4) for j in ids])
        pq.write_table(pa.table(cols), path / f"part-{i}.parquet", row_group_size=row_group)
    return path
