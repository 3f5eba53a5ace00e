"""Corrupt and changing files: a clear error naming the file (and row group), never wrong data.

A broken footer is reported at planning. Garbage in a data page, a file
deleted after planning and a file replaced by one with another schema or other
row groups are reported at the first batch that needs them, with every batch
before it delivered intact (its hash equals the clean run's).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultkit import check_batch, clean_hashes, first_step_needing, table_for, wait_until

import detload
from detload import DataError, DatasetError, Loader, WorkerError
from detload.audit import hash_batch

OPTS = dict(batch_size=150, seed=11, order="windowed", shuffle_window=2)
POOLS = [("thread", 1), ("thread", 3), ("process", 2)]


def _deliver(loader: Loader, leaks) -> tuple[list[str], BaseException | None]:
    got: list[str] = []
    try:
        for batch in loader:
            leaks.track(loader)
            check_batch(batch)
            got.append(hash_batch(batch)[0])
    except Exception as exc:  # noqa: BLE001 - the tests inspect it
        return got, exc
    return got, None


def _first_step_of_file(loader: Loader, rel: str) -> int:
    f = next(f for f in loader.dataset.files if f.path == rel)
    return min(first_step_needing(loader, rel, g) for g in range(len(f.row_groups)))


# -- planning ------------------------------------------------------------------

@pytest.mark.parametrize("cut", ["half", "no_footer_length", "empty", "garbage"])
def test_truncated_footer_reported_at_planning(fault_data, cut):
    data = fault_data(files=3)
    rel = data.files[1]
    path = data.path(rel)
    with open(path, "rb") as f:
        raw = f.read()
    new = {"half": raw[: len(raw) // 2], "no_footer_length": raw[:-6], "empty": b"",
           "garbage": b"PAR1" + os.urandom(3000)}[cut]
    with open(path, "wb") as f:
        f.write(new)
    with pytest.raises(DatasetError, match="footer") as ei:
        Loader(data.root, **OPTS)
    msg = str(ei.value)
    # None of these ends with the magic bytes of a complete file: truncated (or not Parquet at all).
    assert path in msg and "so it is truncated (an interrupted write or copy?) or not a Parquet file" in msg


# -- reading -------------------------------------------------------------------

def _corrupt_page(path: str, rg: int, column: int, where: str) -> None:
    """Overwrite bytes of one column chunk of one row group, found from the footer."""
    md = pq.ParquetFile(path).metadata
    col = md.row_group(rg).column(column)
    start = col.dictionary_page_offset or col.data_page_offset
    size = col.total_compressed_size
    # "values": the middle of the chunk (the page body, CRC-protected);
    # "header": the first bytes (the Thrift page header itself).
    at = start + size // 2 if where == "values" else start + 1
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\xde\xad\xbe\xef" * 4)


@pytest.mark.parametrize("pool,workers", POOLS)
@pytest.mark.parametrize("where,compression", [("values", "none"), ("values", "zstd"), ("header", "snappy")])
def test_garbage_in_data_page(fault_data, leaks, pool, workers, where, compression):
    data = fault_data(compression=compression)
    clean = clean_hashes(data.root, **OPTS)
    rel, rg = data.units[6][0], data.units[6][1]
    _corrupt_page(data.path(rel), rg, column=1, where=where)
    with Loader(data.root, workers=workers, pool=pool, **OPTS) as loader:
        first = first_step_needing(loader, rel, rg)
        got, err = _deliver(loader, leaks)
    if where == "values":  # only the page CRC can tell these bytes are wrong: a DataError naming them
        assert type(err) is DataError, err
        assert str(err).startswith(f"{data.path(rel)} row group {rg}: a page of column 'x' fails its CRC "
                                   "checksum (could not verify page integrity, CRC checksum verification failed")
    else:
        assert isinstance(err, WorkerError), err
        assert err.unit == (rel, rg)
        assert f"failed on {rel} row group {rg}: " in str(err)
        assert isinstance(err.__cause__, OSError)
    assert got == clean[:first]
    leaks.clean_within(2.0)


@pytest.mark.parametrize("pool,workers", POOLS)
def test_file_deleted_after_planning(fault_data, leaks, pool, workers):
    data = fault_data()
    clean = clean_hashes(data.root, **OPTS)
    rel = data.files[2]
    with Loader(data.root, workers=workers, pool=pool, **OPTS) as loader:
        first = _first_step_of_file(loader, rel)
        os.remove(data.path(rel))
        got, err = _deliver(loader, leaks)
    assert isinstance(err, WorkerError), err
    assert isinstance(err.__cause__, FileNotFoundError)
    assert err.unit is not None and err.unit[0] == rel
    assert f"failed on {rel} row group {err.unit[1]}: FileNotFoundError" in str(err)
    assert got == clean[:first]
    leaks.clean_within(2.0)


@pytest.mark.parametrize("how", ["values", "touched"])
@pytest.mark.parametrize("before", [1, 2])
def test_file_rewritten_with_the_same_layout_between_passes(fault_data, leaks, pool, before, how):
    """Same row groups and types, other values (a new size) or the same bytes written
    again (a new mtime): the next pass refuses the file rather than read a version the
    plan and the cache never saw; the passes before are intact. After two passes of the
    set_epoch loop the workers built the next pass's first blocks ahead (and opened
    their files) before the rewrite: the pass must still notice it."""
    data = fault_data()
    clean = clean_hashes(data.root, **OPTS)
    with Loader(data.root, workers=2, pool=detload.Pool(kind=pool, prefetch=1), **OPTS) as loader:
        leaks.track(loader)
        # A file none of the blocks built ahead for the next pass reads.
        ahead = {loader._unit_files[u] for b in loader.plan(before).schedule[:2] for u in b.sources}
        rel = next(f.path for i, f in enumerate(loader.dataset.files) if i not in ahead)
        path = data.path(rel)
        for epoch in range(before):
            loader.set_epoch(epoch)
            got = [hash_batch(b)[0] for b in loader]
            assert got == clean if epoch == 0 else len(got) == len(clean)
        if before == 2:
            # The blocks built ahead are done before the rewrite, so their files were
            # checked while unchanged and the handles kept (the case this is about).
            wait_until(lambda: all(q.qsize() >= 1 for q in loader._pool.outboxes), 30.0)
        if how == "values":
            t = pq.read_table(path)
            t = t.set_column(1, "x", pa.array(np.asarray(t["x"]) * 3.0 + 1.0))
            rows = pq.ParquetFile(path).metadata.row_group(0).num_rows
            pq.write_table(t, path, row_group_size=rows)
        else:
            with open(path, "rb") as f:
                raw = f.read()
            with open(path, "wb") as f:
                f.write(raw)
            os.utime(path, ns=(1, 10**9))  # a distinct mtime, however coarse the filesystem's clock
        loader.set_epoch(before)
        with pytest.raises(DataError) as info:
            for _ in loader:
                pass
    msg = str(info.value)
    assert msg.startswith(f"{rel} row group ") and "the file changed after the loader planned the epoch: " in msg
    assert ("bytes, the plan saw" if how == "values" else "it was modified after the loader listed it") in msg
    leaks.clean_within(2.0)


def test_file_cut_short_under_an_open_handle_mid_pass(fault_data, leaks, pool):
    """A file rewritten shorter while a worker holds it open fails its next read; that
    is reported as the file having changed (DataError), not as an I/O failure."""
    data = fault_data(files=2, row_groups=12)
    rel = data.files[0]
    with Loader(data.root, workers=1, pool=detload.Pool(kind=pool, prefetch=1), shuffle=False, **OPTS) as loader:
        leaks.track(loader)
        it = iter(loader)
        first = next(it)  # the worker has file 0 open and is a few row groups ahead
        assert first["id"][0] == 0
        pq.write_table(pq.read_table(data.path(rel)).slice(0, 10), data.path(rel))  # same inode, cut short
        with pytest.raises(DataError) as info:
            for _ in it:
                pass
    msg = str(info.value)
    assert msg.startswith(f"{rel} row group ") and "the file changed after the loader planned the epoch" in msg
    leaks.clean_within(2.0)


def _rewrite(path: str, change: str) -> None:
    t = pq.read_table(path)
    rows = pq.ParquetFile(path).metadata.row_group(0).num_rows
    if change == "int32":
        t = t.set_column(0, "id", t["id"].cast(pa.int32()))
    elif change == "string":
        t = t.set_column(0, "id", t["id"].cast(pa.string()))  # digits: a silent cast would succeed
    elif change == "missing":
        t = t.drop_columns(["x"])
    elif change == "list":
        t = t.set_column(1, "x", pa.array([[v] for v in t["x"].to_pylist()], pa.list_(pa.float64())))
    elif change == "fewer_rows":
        t = t.slice(0, t.num_rows - 7)
    elif change == "row_groups":
        rows = rows // 2
    elif change == "more_rows":
        ids = np.arange(10**6, 10**6 + 5, dtype=np.int64)
        t = pa.concat_tables([t, table_for(ids)])
    pq.write_table(t, path, row_group_size=rows)


@pytest.mark.parametrize("change", ["int32", "string", "missing", "list", "fewer_rows", "row_groups", "more_rows"])
def test_file_replaced_after_planning(fault_data, leaks, change, pool):
    data = fault_data()
    clean = clean_hashes(data.root, **OPTS)
    rel = data.files[1]
    with Loader(data.root, workers=2, pool=pool, **OPTS) as loader:
        first = _first_step_of_file(loader, rel)
        _rewrite(data.path(rel), change)
        got, err = _deliver(loader, leaks)
    assert type(err) is DataError, err
    msg = str(err)
    assert msg.startswith(f"{rel} row group ") and "changed after the loader planned the epoch" in msg
    expect = {"int32": "column 'id' is int32, planned as int64",
              "string": "column 'id' is string, planned as int64",
              "missing": "column 'x' is missing",
              "list": "column 'x' is list<element: double>, planned as double",
              "fewer_rows": "rows, the plan has [250, 250, 250, 250]",
              "row_groups": "row groups hold [125, 125, 125, 125, 125, 125, 125, 125] rows",
              "more_rows": "row groups hold [250, 250, 250, 250, 5] rows"}[change]
    assert expect in msg
    assert got == clean[:first]
    leaks.clean_within(2.0)
