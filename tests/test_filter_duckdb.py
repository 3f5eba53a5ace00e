"""Filters on data another tool wrote: DuckDB's Parquet files (its own row-group sizes, statistics
and Hive folders). The loader delivers exactly the rows pyarrow.dataset's filter selects, each
once, in the same batches at 1 and 3 workers, in threads and processes, cold and warm cache."""

from __future__ import annotations

import datetime as dt
import os

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest

from detload import Loader

duckdb = pytest.importorskip("duckdb")
f = pc.field


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("duck")
    con = duckdb.connect()
    # Ids in order (statistics prune ranges), markets and days cycling (they prune nothing), nulls in score.
    con.execute(f"""COPY (SELECT i AS id, ['US','DE','FR','JP'][1 + (i * 7919) % 4] AS market,
                     DATE '2026-01-01' + CAST((i * 31) % 90 AS INTEGER) AS day,
                     CASE WHEN i % 11 = 0 THEN NULL ELSE (i % 1000) / 10.0 END AS score
                   FROM range(20000) t(i))
                   TO '{d / "one.parquet"}' (FORMAT PARQUET, ROW_GROUP_SIZE 2048)""")
    con.execute(f"""COPY (SELECT i AS id, ['US','DE'][1 + i % 2] AS market, CAST(i % 3 AS INTEGER) AS seg,
                     CASE WHEN i % 7 = 0 THEN NULL ELSE i % 100 END AS n
                   FROM range(9000) t(i))
                   TO '{d / "hive"}' (FORMAT PARQUET, PARTITION_BY (seg), ROW_GROUP_SIZE 1024)""")
    con.close()
    return {"one": str(d / "one.parquet"), "hive": str(d / "hive")}


CASES = {
    "one": [
        (f("market") == "US") & (f("day") >= dt.date(2026, 2, 1)),
        (f("id") >= 4000) & (f("id") < 9100) & ~f("score").is_null(),
        f("market").isin(["DE", "JP"]) | (f("score") > 95.0),
    ],
    "hive": [
        (f("seg") == 1) & (f("n") < 20),
        f("n").is_null() | ((f("seg") != 0) & (f("market") == "DE")),
    ],
}


def _expected(path: str, expr: pc.Expression) -> list[int]:
    ds = pads.dataset(path, partitioning="hive" if os.path.isdir(path) else None)
    return sorted(ds.to_table().filter(expr).column("id").to_pylist())


def _batches(path: str, expr: pc.Expression, **kw) -> list[list[int]]:
    # The filter reads its own columns (n has nulls no NumPy int holds): only id and market are loaded.
    with Loader(path, columns=["id", "market"], batch_size=500, seed=11, order="windowed", shuffle_window=3, filter=expr, **kw) as ld:
        return [np.asarray(b["id"]).tolist() for b in ld]


@pytest.mark.parametrize("which, k", [(w, k) for w, exprs in CASES.items() for k in range(len(exprs))])
def test_duckdb_files_filter_exactly_as_pyarrow_dataset(written, tmp_path, which, k):
    path, expr = written[which], CASES[which][k]
    want = _expected(path, expr)
    assert 0 < len(want) < (20000 if which == "one" else 9000)  # a real selection
    reference = _batches(path, expr, workers=1, pool="thread")
    got = [x for b in reference for x in b]
    assert sorted(got) == want and len(set(got)) == len(got)  # exactly pyarrow's rows, each once
    cache = str(tmp_path / "cache")
    runs = {
        "3 threads": dict(workers=3, pool="thread"),
        "1 process": dict(workers=1, pool="process"),
        "3 processes": dict(workers=3, pool="process"),
        "3 processes, cold cache": dict(workers=3, pool="process", cache=cache),
        "1 thread, warm cache": dict(workers=1, pool="thread", cache=cache),
        "3 processes, warm cache": dict(workers=3, pool="process", cache=cache),
    }
    for name, kw in runs.items():
        assert _batches(path, expr, **kw) == reference, name
    with Loader(path, columns=["id", "market"], batch_size=500, seed=11, filter=expr, cache=cache) as warm:
        for _ in warm:
            pass
        assert warm.filter_stats is not None and warm.filter_stats["selection_pass"] == 0  # warm: read back
        reads = warm.stats().reads
    assert reads.row_groups_read == 0 and reads.row_groups_cached > 0
