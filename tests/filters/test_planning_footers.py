"""Planning a filter reuses the footers discovery read: it opens only the files it reads rows
from, and plans exactly as it does when it reads every footer again."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from detload import Loader
from detload._discovery import discover
from detload._filters.canonical import parse_filter
from detload._filters.planning import filter_units

f = pc.field
FILES = 6


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("footers")
    for i in range(FILES):
        ids = np.arange(i * 400, (i + 1) * 400, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "v": ids % 5}), d / f"{i}.parquet", row_group_size=100,
                       bloom_filter_options={"v": {"ndv": 8, "fpp": 0.01}})
    return str(d)


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """Where every ParquetFile is made (by detload's code), in order."""
    where: list[str] = []
    real = pq.ParquetFile

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, source, *a, **kw):
            where.append("with footer" if kw.get("metadata") is not None else "reads footer")
            super().__init__(source, *a, **kw)

    monkeypatch.setattr(pq, "ParquetFile", Counting)
    return where


@pytest.mark.parametrize("expr, reads", [
    ((f("id") >= 150) & (f("id") < 200), 1),        # row group 1 of file 0: statistics settle the rest
    ((f("id") >= 1200) & (f("id") < 1600), 0),      # file 3 entirely: no selection pass at all
    ((f("id") < 700) & (f("v") == 3), 2),           # files 0 and 1 need the pass
])
def test_planning_opens_only_the_files_it_reads_rows_from(root, opened, expr, reads):
    with Loader(root, batch_size=32, seed=0, filter=expr) as ld:
        planned = list(opened)
        fs = ld.filter_stats
        got = sorted(x for b in ld for x in np.asarray(b["id"]).tolist())
    assert fs is not None
    assert planned.count("reads footer") == FILES  # discovery's, once per file
    assert planned.count("with footer") == reads
    assert got == sorted(pq.read_table(root).filter(expr).column("id").to_pylist())


@pytest.mark.parametrize("expr", [
    (f("id") >= 150) & (f("id") < 1234),
    (f("v").isin([1, 4])) | (f("id") > 2300),
    f("v") == 7,  # bloom filters: absent everywhere -> refused as empty either way
])
def test_footers_from_discovery_plan_exactly_as_reading_them_again(root, expr):
    footers: list[pq.FileMetaData] = []
    ds = discover(root, footers=footers)
    assert len(footers) == len(ds.files)
    flt = parse_filter(expr, ds.schema, {})
    try:
        again = filter_units(ds, flt)
    except Exception as exc:  # noqa: BLE001 - the same error must come either way
        with pytest.raises(type(exc), match="selects no row"):
            filter_units(ds, flt, footers=footers)
        return
    reused = filter_units(ds, flt, footers=footers)
    assert reused.units == again.units
    assert reused.selections.keys() == again.selections.keys()
    assert all(np.array_equal(reused.selections[k].indices(), again.selections[k].indices()) for k in again.selections)
    a, b = reused.stats.as_dict(), again.stats.as_dict()
    a.pop("seconds"), b.pop("seconds")
    assert a == b


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> str:
    """Files 0-2 with bloom filters on v, files 3-5 without any; v holds only even values."""
    d = tmp_path_factory.mktemp("mixed")
    for i in range(FILES):
        ids = np.arange(i * 400, (i + 1) * 400, dtype=np.int64)
        bloom = {"bloom_filter_options": {"v": {"ndv": 8, "fpp": 0.01}}} if i < 3 else {}
        pq.write_table(pa.table({"id": ids, "v": (ids % 5) * 2}), d / f"{i}.parquet", row_group_size=100, **bloom)
    return str(d)


def _plan(root, expr):
    footers: list[pq.FileMetaData] = []
    ds = discover(root, footers=footers)
    try:
        got = filter_units(ds, parse_filter(expr, ds.schema, {}), footers=footers)
    except Exception as exc:  # noqa: BLE001 - compared by type and message
        return (type(exc), str(exc))
    stats = got.stats.as_dict()
    stats.pop("seconds")
    return got.units, {k: s.indices().tolist() for k, s in got.selections.items()}, stats


@pytest.mark.parametrize("expr, readers", [
    ((f("id") >= 150) & (f("id") < 2000), 0),  # no bloom filter on id: no reader at all
    ((f("v") == 3) | (f("id") == 2001), 3),    # the three files with filters on v, and only those
    ((f("v").isin([3, 5])) | (f("id") < 50), 3),
])
def test_a_bloom_reader_is_made_only_for_files_with_a_filter_on_a_filtered_column(mixed, monkeypatch, expr, readers):
    from detload._filters import planning

    made: list[str] = []
    real = planning.BloomReader

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, file, *a, **kw):
            made.append(str(file))
            super().__init__(file, *a, **kw)

    monkeypatch.setattr(planning, "BloomReader", Counting)
    lazy = _plan(mixed, expr)
    assert len(made) == readers and all(m.endswith(("0.parquet", "1.parquet", "2.parquet")) for m in made)
    # The same plan as a reader made for every file, as planning did before.
    monkeypatch.setattr(planning, "_has_bloom", lambda rg, leaves: bool(leaves))
    made.clear()
    assert _plan(mixed, expr) == lazy
    assert len(made) == FILES
    if readers:
        assert lazy[2]["pruned"]["bloom"] > 0  # the filters were probed, not only found
