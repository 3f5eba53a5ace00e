"""One row group's columns of every layout an entry holds (fixed, a run, 2-D, ragged text and
lists), shared by the format tests and by the script that wrote the stored old-format entry."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from detload._types import column_spec, convert_column

#: The object key and row group the stored entry was written under.
OBJ = "0123456789abcdef/fedcba9876543210"
RG = 3


def sample():
    """(specs, null_fill, columns) of a five-row row group."""
    table = pa.table({
        "id": pa.array(np.arange(10, 15, dtype=np.int64)),
        "x": pa.array(np.linspace(0, 1, 5, dtype=np.float32)),
        "y": pa.array(np.linspace(2, 3, 5, dtype=np.float32)),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(15, dtype=np.float32)), 3),
        "s": pa.array(["a", "", "ccc", "dd", "eeeee"]),
        "l": pa.array([[1], [], [2, 3], [4, 5, 6], [7]], type=pa.list_(pa.int32())),
    })
    specs = [column_spec(name, table.schema.field(name).type) for name in table.column_names]
    cols = {s.name: convert_column(s, table.column(s.name), ("sample", RG)) for s in specs}
    return specs, {}, cols


if __name__ == "__main__":  # write the entry with the cache code importable as ``detload._cache``
    import sys

    from detload._cache import CacheConfig, RowGroupCache

    root = sys.argv[1]
    specs, fill, cols = sample()
    RowGroupCache(CacheConfig(root, None, "sample"), specs, fill).put(OBJ, RG, cols, "sample")
