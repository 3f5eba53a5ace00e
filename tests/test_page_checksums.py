"""A page that fails its CRC is refused by every pass that reads rows, with one DataError.

The workers' read, the filter's selection pass, the group-key pass and the mixing report's
column pass open files the same way (detload._read.parquet). Without the check a flipped byte
in a filter column changes which rows are selected, silently: the test shows that first.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from detload import DataError, Loader

ROWS, GROUP = 4000, 1000
BAD_RG = 2


def _write(path: str) -> None:
    ids = np.arange(ROWS, dtype=np.int64)
    # Plain, uncompressed values: a flipped byte is a flipped value, which only the CRC can tell.
    pq.write_table(pa.table({"id": ids, "seg": ids // 100, "x": ids * 0.5}), path, row_group_size=GROUP,
                   write_page_checksum=True, compression="none", use_dictionary=False)


def _flip(path: str, rg: int, column: str) -> None:
    """Flip one byte of the last value in the column chunk's (only) data page, found from the footer."""
    md = pq.read_metadata(path)
    j = md.schema.to_arrow_schema().get_field_index(column)
    col = md.row_group(rg).column(j)
    assert col.dictionary_page_offset is None  # the chunk is one data page: header, then the values
    at = col.data_page_offset + col.total_compressed_size - 5  # inside the last int64, past the header
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.fixture
def damaged(tmp_path) -> str:
    root = tmp_path / "data"
    root.mkdir()
    path = str(root / "part.parquet")
    _write(path)
    _flip(path, BAD_RG, "seg")
    return path


def _message(path: str) -> str:
    return (f"{path} row group {BAD_RG}: a page of column 'seg' fails its CRC checksum (could not verify page "
            "integrity, CRC checksum verification failed for page_ordinal 0): the file's bytes changed after "
            "they were written (a damaged disk, copy or upload). Nothing is read from a page that fails its "
            "checksum; restore or rewrite the file.")


def test_the_flipped_byte_changes_a_value_unless_checksums_are_verified(damaged):
    # What the planning passes read before: a wrong value, no error.
    seg = pq.ParquetFile(damaged).read_row_group(BAD_RG, columns=["seg"]).column(0).to_numpy()
    assert seg[-1] != (BAD_RG * GROUP + GROUP - 1) // 100
    assert (seg[:-1] == np.arange(BAD_RG * GROUP, BAD_RG * GROUP + GROUP - 1) // 100).all()


def _read_all(root: str, **kw) -> int:
    with Loader(root, batch_size=500, seed=0, workers=1, pool="thread", **kw) as loader:
        return sum(len(b["id"]) for b in loader)


def test_a_read_refuses_the_damaged_page(damaged):
    root = damaged.rpartition("/")[0]
    with pytest.raises(DataError) as ei:
        _read_all(root)
    assert str(ei.value) == _message(damaged)


def test_the_filter_selection_pass_refuses_the_damaged_page(damaged):
    root = damaged.rpartition("/")[0]
    # seg == 25 lies in row group 2 (seg 20..29): statistics cannot settle it, the selection pass reads it.
    with pytest.raises(DataError) as ei:
        Loader(root, batch_size=500, seed=0, filter=pc.field("seg") == 25)
    assert str(ei.value) == _message(damaged)
    # A filter that statistics settle without reading row group 2 still plans and reads.
    assert _read_all(root, columns=["id"], filter=pc.field("seg") < 10) == 1000


def test_the_group_key_pass_refuses_the_damaged_page(damaged):
    root = damaged.rpartition("/")[0]
    with pytest.raises(DataError) as ei:
        Loader(root, batch_size=500, seed=0, order="windowed", group_by="seg")
    assert str(ei.value) == _message(damaged)


def test_the_mixing_report_refuses_the_damaged_page(damaged):
    root = damaged.rpartition("/")[0]
    with Loader(root, batch_size=500, seed=0) as loader, pytest.raises(DataError) as ei:
        loader.plan_stats(mix_column="seg")
    assert str(ei.value) == _message(damaged)


def test_an_intact_file_with_checksums_reads_as_written(tmp_path):
    path = str(tmp_path / "part.parquet")
    _write(path)
    with Loader(str(tmp_path), batch_size=500, seed=0, filter=pc.field("seg") == 25,
                workers=1, pool="thread") as loader:
        ids = np.sort(np.concatenate([b["id"] for b in loader]))
    np.testing.assert_array_equal(ids, np.arange(2500, 2600))
