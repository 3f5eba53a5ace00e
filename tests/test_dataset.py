"""Dataset discovery edge cases met in real writers' output: empty files typed as null, side files."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from detload import Loader, SchemaMismatchError


def _table(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "s": pa.array([f"r{i}" for i in ids]).dictionary_encode()})


def test_empty_file_with_null_typed_columns_is_not_drift(tmp_path):
    # Writers of empty partitions often type every column as null: such a file yields
    # no rows, so its schema must neither define the dataset's nor count as drift.
    pq.write_table(pa.table({"id": pa.array([], pa.null()), "s": pa.array([], pa.null())}), tmp_path / "a-empty.parquet")
    pq.write_table(_table(0, 700), tmp_path / "b.parquet", row_group_size=300)
    pq.write_table(_table(700, 1000), tmp_path / "c.parquet", row_group_size=300)
    with Loader(tmp_path, batch_size=128, seed=4, workers=2) as ld:
        assert str(ld.dataset.schema.field("id").type) == "int64"
        ids = np.concatenate([b["id"] for b in ld])
    assert np.array_equal(np.sort(ids), np.arange(1000))


def test_drift_between_files_with_rows_is_still_reported(tmp_path):
    pq.write_table(_table(0, 10), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array(np.arange(10, 20), pa.int32()), "s": pa.array(["x"] * 10)}),
                   tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatchError, match=r"'id' is int64 in a\.parquet but int32 in b\.parquet"):
        Loader(tmp_path, batch_size=4, seed=1)
