"""A row group whose columns decode to fewer rows than its footer says is an error, never a short epoch.

The broken files are made here: a small Parquet file written by pyarrow whose
footer then claims more rows for one row group than its pages hold (the case of
a writer bug seen in the wild, where pyarrow reads the short column without a
word). Covers thread and process workers, shuffled and not, with and without the
row-group cache, and cache entries that hold fewer rows than the plan expects.
"""

from __future__ import annotations

import copy
import io
import os
import struct
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from detload import DataError, Loader
from detload._cache import CacheWarning, RowGroupCache

BATCH = 4


def _table(first: int, rows: int) -> pa.Table:
    ids = np.arange(first, first + rows, dtype=np.int64)
    return pa.table({"id": ids, "x": ids * 0.5})


def write_file(path: str, row_groups: list[int], first: int = 0) -> bytes:
    """One row group per entry of ``row_groups``; ids count up from ``first``."""
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, _table(0, 1).schema) as w:
        for n in row_groups:
            w.write_table(_table(first, n))
            first += n
    data = buf.getvalue()
    with open(path, "wb") as f:
        f.write(data)
    return data


def claim_rows(path: str, rg: int, claimed: int) -> None:
    """Make the footer of ``path`` say row group ``rg`` holds ``claimed`` rows; its pages stay as they are.

    RowGroup.num_rows is a zigzag varint in the footer's thrift compact encoding
    (3 rows: 0x06). The byte is found by trying every candidate and reading the
    footer back with pyarrow until exactly that one number changed.
    """
    with open(path, "rb") as f:
        data = bytearray(f.read())
    md = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata
    now = md.row_group(rg).num_rows
    assert 2 * now < 128 and 2 * claimed < 128, "one-byte varints only"
    want = copy.deepcopy(md.to_dict())
    want["row_groups"][rg]["num_rows"] = claimed
    footer_len = struct.unpack("<i", data[-8:-4])[0]
    for off in range(len(data) - 8 - footer_len, len(data) - 8):
        if data[off] != 2 * now:
            continue
        patched = bytearray(data)
        patched[off] = 2 * claimed
        try:
            got = pq.ParquetFile(pa.BufferReader(bytes(patched))).metadata.to_dict()
        except Exception:  # noqa: BLE001 - most candidates break the footer
            continue
        if got == want:
            with open(path, "wb") as f:
                f.write(patched)
            return
    raise AssertionError(f"found no byte holding row group {rg}'s row count in {path}")


@pytest.fixture
def broken(tmp_path) -> str:
    """a.parquet: 12 good rows; b.parquet: row groups of 4, 3 and 2 rows whose footer says 4, 5 and 2."""
    root = tmp_path / "data"
    os.makedirs(root)
    write_file(str(root / "a.parquet"), [4, 4, 4], first=0)
    write_file(str(root / "b.parquet"), [4, 3, 2], first=100)
    claim_rows(str(root / "b.parquet"), 1, 5)
    return str(root)


def test_the_patched_file_really_reads_short_in_pyarrow(broken):
    pf = pq.ParquetFile(os.path.join(broken, "b.parquet"))
    assert [pf.metadata.row_group(i).num_rows for i in range(3)] == [4, 5, 2]
    assert pf.read_row_group(1, columns=["id"]).num_rows == 3  # no error from pyarrow


_MESSAGE = (r"b\.parquet row group 1: column 'id' decodes to 3 rows, but the file's footer \(which the plan "
            r"follows\) says the row group holds 5\. .*every batch before it was delivered intact")


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("cached", [False, True])
def test_a_short_row_group_raises_and_no_short_batch_is_yielded(broken, tmp_path, pool, shuffle, cached):
    got = []
    cache = str(tmp_path / "cache") if cached else None
    with Loader(broken, batch_size=BATCH, seed=5, shuffle=shuffle, order="windowed", shuffle_window=2, workers=2, pool=pool,
                cache=cache) as loader:
        assert loader.dataset.rows == 23  # as the footers say
        with pytest.raises(DataError, match=_MESSAGE):
            for b in loader:
                got.append(b["id"].copy())
    # Every batch before the error is whole and holds real rows, none twice.
    assert all(len(ids) == BATCH for ids in got)
    seen = np.concatenate(got) if got else np.empty(0, np.int64)
    assert len(set(seen.tolist())) == len(seen)
    assert set(seen.tolist()) <= set(range(12)) | set(range(100, 109))
    if not shuffle:  # a's three row groups, then b's first: four intact batches before b row group 1
        np.testing.assert_array_equal(seen, np.r_[np.arange(12), np.arange(100, 104)])


def test_the_column_that_decodes_short_is_named(broken):
    with Loader(broken, batch_size=BATCH, seed=0, shuffle=False, columns=["x"]) as loader, \
            pytest.raises(DataError, match=r"b\.parquet row group 1: column 'x' decodes to 3 rows.*holds 5"):
        list(loader)


@pytest.mark.parametrize("order", ["mix", "windowed"])
def test_no_empty_batches_at_any_batch_size(broken, order):
    # With a batch size of 1 the short read used to show as batches with no rows.
    for bs in (1, 2, 3):
        with Loader(broken, batch_size=bs, seed=0, shuffle=False, order=order) as loader:
            sizes = []
            with pytest.raises(DataError, match=_MESSAGE):
                for b in loader:
                    sizes.append(len(b["id"]))
        assert set(sizes) <= {bs}
        # The windowed order delivers a's row groups before it reads b's short one; the mixed
        # order may read the short row group before its first batch (one task holds them all).
        assert sizes or order == "mix"


def _short_entry(loader: Loader, file_idx: int, rg: int, ids: np.ndarray) -> None:
    """Write the cache entry an older detload wrote for a row group that decoded to ``ids``."""
    cache = RowGroupCache(loader.cache, loader.specs, loader.null_fill)
    cache.put(loader._cache_keys[file_idx], rg, {"id": ids, "x": ids * 0.5}, loader._uris[file_idx])


def test_a_short_cache_entry_is_not_delivered(tmp_path, pool):
    """An entry whose columns hold fewer rows than the plan is discarded and the row group read again."""
    root = tmp_path / "data"
    os.makedirs(root)
    write_file(str(root / "a.parquet"), [4, 4, 4])
    cache = str(tmp_path / "cache")
    opts = dict(batch_size=BATCH, seed=1, shuffle=False, workers=2, pool=pool, cache=cache)
    with Loader(str(root), **opts) as loader:
        _short_entry(loader, 0, 1, np.arange(4, 7, dtype=np.int64))  # 3 of the row group's 4 rows
        with pytest.warns(CacheWarning, match=r"row group 1 of .*a\.parquet\) is damaged \(its column 'id' "
                                              r"holds 3 rows, the row group 4\)"):
            ids = np.concatenate([b["id"] for b in loader])
    np.testing.assert_array_equal(ids, np.arange(12))


def test_a_short_cache_entry_of_a_short_row_group_raises(broken, tmp_path):
    """What an older version cached of the broken row group: the plan's count still decides."""
    cache = str(tmp_path / "cache")
    with Loader(broken, batch_size=BATCH, seed=1, shuffle=False, cache=cache) as loader:
        _short_entry(loader, 1, 1, np.arange(104, 107, dtype=np.int64))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)
            with pytest.raises(DataError, match=_MESSAGE):
                list(loader)
