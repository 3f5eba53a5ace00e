"""Small Parquet datasets for the distributed, resume and torch tests.

Every row has a unique ``id``; ``s`` (a string, so a Ragged column) and
``x`` (float32) are functions of it, so any delivered batch can be checked.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Uneven row groups over three files, 14 units: partitions of every P <= 14 hold data.
LAYOUT: dict[str, list[int]] = {
    "a.parquet": [300, 200, 17, 64],
    "b.parquet": [250, 250, 1, 99],
    "c/d.parquet": [210, 90, 33, 44, 120, 75],
}


def write(root: str, layout: dict[str, list[int]] | None = None, *, seed: int = 0) -> int:
    """Write ``{path: [row-group sizes]}`` under ``root``; returns the row count."""
    layout = LAYOUT if layout is None else layout
    total = sum(sum(v) for v in layout.values())
    ids = np.random.default_rng(seed).permutation(total).astype(np.int64) + 10_000
    pos = 0
    for rel in sorted(layout):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("s", pa.string()), ("x", pa.float32())])) as w:
            for n in layout[rel]:
                chunk = ids[pos : pos + n]
                pos += n
                w.write_table(pa.table({
                    "id": pa.array(chunk, pa.int64()),
                    "s": pa.array([f"r{i}" * int(i % 3) for i in chunk], pa.string()),
                    "x": pa.array(chunk.astype(np.float32) / 2, pa.float32()),
                }), row_group_size=max(n, 1))
    return total
