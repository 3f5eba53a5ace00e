"""Query-item test tables for group_by: one row per (query, item), query columns repeated.

`write_queries` writes groups of given sizes across files and row groups, with a
query-level float, a query embedding (fixed-size list), a query text, and per-item
columns; ``item`` numbers every row, so a test can find each delivered row's stored row.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def query_table(qids: np.ndarray, first_item: int, seed: int) -> pa.Table:
    """The rows of the queries ``qids`` (one entry per row, each query's rows together)."""
    rng = np.random.default_rng(seed)
    n = len(qids)
    emb = np.repeat(qids, 3).astype(np.float32) / 7
    qf = (qids * 0.5).astype(np.float32)
    qf[qids % 11 == 3] = np.nan  # NaN in a group column: constant bitwise, so no error
    return pa.table({
        "q": pa.array(qids, pa.int64()),
        "qf": pa.array(qf),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb), 3),
        "qtext": pa.array([f"query-{int(x)}" for x in qids]),
        "item": pa.array(np.arange(first_item, first_item + n), pa.int64()),
        "price": pa.array(rng.random(n).astype(np.float32)),
        "tags": pa.array([list(range(int(i) % 3)) for i in range(n)], pa.list_(pa.int32())),
    })


def write_queries(root: str, files: Sequence[Sequence[int]], row_group_size: int, seed: int = 0) -> pa.Table:
    """Write one file per entry of ``files`` (the sizes of its groups, in order); return all rows."""
    os.makedirs(root, exist_ok=True)
    qid = 0
    item = 0
    tables = []
    for f, sizes in enumerate(files):
        qids = np.repeat(np.arange(qid, qid + len(sizes), dtype=np.int64), np.asarray(sizes, dtype=np.int64))
        qid += len(sizes)
        t = query_table(qids, item, seed + f)
        item += len(qids)
        pq.write_table(t, os.path.join(root, f"part-{f:03d}.parquet"), row_group_size=row_group_size)
        tables.append(t)
    return pa.concat_tables(tables)


def stored_rows(table: pa.Table) -> dict[str, np.ndarray]:
    """The table's columns as NumPy, for comparing delivered rows (fixed columns only)."""
    emb = table.column("emb").combine_chunks()
    return {
        "q": table.column("q").to_numpy(),
        "qf": table.column("qf").to_numpy(),
        "emb": emb.values.to_numpy().reshape(len(table), 3),
        "item": table.column("item").to_numpy(),
        "price": table.column("price").to_numpy(),
    }
