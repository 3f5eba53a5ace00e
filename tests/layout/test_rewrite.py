"""`detload layout` and `check-layout`: sorted output with the source's exact schema, grouping, refusals, the proof.

Every layout ends by comparing digests (test_digest.py checks the digest itself), so each
successful call below also shows that the output holds exactly the source's rows.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _typesdata import parquet_types_table

pytest.importorskip("duckdb")

from detload._layout.check import check_layout  # noqa: E402
from detload._layout.digest import column_seed, digest, hash_values  # noqa: E402
from detload._layout.rewrite import REPORT_NAME, DigestMismatchError, cut_point, layout  # noqa: E402
from detload.errors import DatasetError, EmptyDatasetError, OptionError, SchemaMismatchError  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _write_parts(table: pa.Table, root, sizes: list[int], row_group_size: int = 1000) -> str:
    os.makedirs(root)
    start = 0
    for i, n in enumerate(sizes):
        pq.write_table(table.slice(start, n), os.path.join(root, f"part-{i:03d}.parquet"), row_group_size=row_group_size)
        start += n
    assert start == table.num_rows
    return str(root)


def _files(dst) -> list[str]:
    return sorted(os.path.join(dst, f) for f in os.listdir(dst) if f.endswith(".parquet"))


def _read(dst) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in _files(dst)])


# -- the pure cut rule ------------------------------------------------------------------------------------

def _h(values: list[int]) -> np.ndarray:
    return np.asarray(values, np.uint64)


def test_cut_point_prefers_the_last_key_change_within_the_slack():
    lead = _h([1] * 7 + [2] * 3 + [3] * 5)  # changes at 7 and 10
    assert cut_point(lead, None, available=15, row_group_rows=10, slack=0.25, at_end=False) == 10
    assert cut_point(lead, None, available=15, row_group_rows=9, slack=0.25, at_end=False) == 7
    assert cut_point(lead, None, available=15, row_group_rows=12, slack=0.1, at_end=False) == 12  # none near
    assert cut_point(lead, None, available=15, row_group_rows=9, slack=0.0, at_end=False) == 9
    assert cut_point(lead, None, available=6, row_group_rows=10, slack=0.25, at_end=True) == 6


def test_cut_point_keeps_groups_whole_unless_larger_than_a_row_group():
    group = _h([1] * 4 + [2] * 5 + [3] * 30)
    lead = group.copy()
    # The window [8, 10] holds no group change: end at the last change before it (9).
    assert cut_point(lead, group, available=39, row_group_rows=10, slack=0.2, at_end=False) == 9
    assert cut_point(lead, group, available=39, row_group_rows=8, slack=0.2, at_end=False) == 4
    # A group of 30 rows at the start must be cut at the row-group size.
    rest = group[9:]
    assert cut_point(rest, rest, available=30, row_group_rows=10, slack=0.2, at_end=False) == 10
    # A change of the leading key inside a group is not a place to cut.
    lead2 = _h([5] * 6 + [6] * 3 + [7] * 30)
    group2 = _h([1] * 9 + [2] * 30)
    assert cut_point(lead2, group2, available=39, row_group_rows=10, slack=0.5, at_end=False) == 9


# -- layout ----------------------------------------------------------------------------------------------------

def test_layout_keeps_the_exact_schema_of_every_type_and_sorts(tmp_path):
    table = parquet_types_table(60)
    perm = np.random.default_rng(1).permutation(60)
    src = _write_parts(table.take(perm), tmp_path / "src", [25, 5, 30], row_group_size=7)
    dst = tmp_path / "dst"
    report = layout(src, dst, sort_by=["g", "k"], row_group_rows=8, bloom_filter=["g", "k"], progress=False)
    assert report.ok and report.rows == 60 and report.src_digest == digest(table)
    src_schema = pq.read_schema(os.path.join(src, "part-000.parquet"))
    for path in _files(dst):
        assert pq.read_schema(path).equals(src_schema, check_metadata=True)
    # A sorter's type drift does not reach the files (DuckDB alone would change each of these).
    drifted = {"u8": pa.uint8(), "u64": pa.uint64(), "f16": pa.float16(), "ls": pa.large_string(),
               "ts_ns_tz": pa.timestamp("ns", "Europe/Paris"), "dec256": pa.decimal256(60, 2),
               "dict": pa.dictionary(pa.int32(), pa.string()), "fsl": src_schema.field("fsl").type,
               "uuid": pa.uuid(), "t64": pa.time64("ns")}
    out = _read(dst)
    for name, t in drifted.items():
        assert out.schema.field(name).type == t, name
    assert pa.types.is_fixed_size_list(out.schema.field("fsl").type)
    # Sorted by (g, k), nulls last; k is distinct, so the order is fully determined.
    order = pc.sort_indices(table, sort_keys=[("g", "ascending", "at_end"), ("k", "ascending", "at_end")])
    expect = table.take(order)
    for name in table.column_names:  # bitwise, value by value
        s = column_seed(name)
        assert hash_values(out.column(name), s).tolist() == hash_values(expect.column(name), s).tolist(), name


def test_layout_writes_statistics_page_index_sorting_columns_and_bloom_filters(tmp_path):
    n = 5000
    rng = np.random.default_rng(2)
    t = pa.table({"market": pa.array(rng.choice(["US", "FR", "DE", "JP"], n)), "day": rng.integers(0, 30, n),
                  "flag": rng.integers(0, 2, n).astype(bool), "v": rng.random(n)})
    src = _write_parts(t, tmp_path / "src", [n])
    dst = tmp_path / "dst"
    report = layout(src, dst, sort_by=["market", "day"], row_group_rows=700, bloom_filter=["market"], progress=False)
    assert report.sorting_columns == ("market", "day")
    md = pq.ParquetFile(_files(dst)[0]).metadata
    names = [md.schema.column(j).path for j in range(md.num_columns)]
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        assert [names[s.column_index] for s in rg.sorting_columns] == ["market", "day"]
        assert not any(s.descending or s.nulls_first for s in rg.sorting_columns)
        for j in range(md.num_columns):
            col = rg.column(j)
            assert col.statistics is not None and col.statistics.has_min_max
            assert col.has_column_index and col.has_offset_index
            assert (col.bloom_filter_offset is not None) == (names[j] == "market")
    sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    assert report.row_groups == len(sizes) and max(sizes) <= 700 and sum(sizes) == n
    # Rows of one market never share a row group with another market where a cut was cheap:
    # every row group but those at a market change holds one market.
    assert report.serves[0].startswith("market = v, market IN (...), and ranges on market")
    saved = json.loads((dst / REPORT_NAME).read_text())
    assert saved["digests_match"] and saved["rows"] == n and saved["sort_by"] == ["market", "day"]
    assert saved["src_digest"] == saved["dst_digest"] == {"rows": n, "digest": report.src_digest.value}


def test_row_groups_end_at_changes_of_the_leading_key(tmp_path):
    t = pa.table({"seg": np.repeat(np.arange(10), 900), "v": np.arange(9000)})
    src = _write_parts(t.take(np.random.default_rng(0).permutation(9000)), tmp_path / "src", [9000])
    report = layout(src, tmp_path / "dst", sort_by=["seg"], row_group_rows=1000, progress=False)
    md = pq.ParquetFile(_files(tmp_path / "dst")[0]).metadata
    assert [md.row_group(g).num_rows for g in range(md.num_row_groups)] == [900] * 10
    assert report.row_group_sizes == (900, 900, 900)
    # Without slack the row groups are full, and segments straddle them.
    report = layout(src, tmp_path / "dst0", sort_by=["seg"], row_group_rows=1000, boundary_slack=0.0, progress=False)
    assert report.row_group_sizes == (1000, 1000, 1000)


def _query_items(rng: np.random.Generator, queries: int) -> pa.Table:
    sizes = rng.integers(1, 300, queries)
    qid = np.repeat(rng.permutation(queries) * 7, sizes)
    day = np.repeat(rng.integers(0, 5, queries), sizes)
    return pa.table({"query_id": qid, "day": day, "item": rng.integers(0, 10**6, len(qid)),
                     "pos": np.concatenate([np.arange(s) for s in sizes])})


def _check_groups(dst, key: str, row_group_rows: int) -> pa.Table:
    """Each group contiguous, in one file, cut across row groups only when larger than one; stored order kept."""
    seen_file: dict[int, int] = {}
    tables = []
    for fi, path in enumerate(_files(dst)):
        pf = pq.ParquetFile(path)
        for g in range(pf.num_row_groups):
            keys = pf.read_row_group(g, columns=[key]).column(0).to_numpy()
            for k in np.unique(keys):
                assert seen_file.setdefault(int(k), fi) == fi, f"group {k} split across files"
        tables.append(pq.read_table(path))
    out = pa.concat_tables(tables)
    keys = out.column(key).to_numpy()
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    assert len(starts) == len(np.unique(keys)), "a group is not contiguous"
    sizes = np.diff(np.r_[starts, len(keys)])
    # A row-group boundary inside a group only for groups larger than a row group.
    bounds = []
    offset = 0
    for path in _files(dst):
        md = pq.ParquetFile(path).metadata
        for g in range(md.num_row_groups):
            offset += md.row_group(g).num_rows
            bounds.append(offset)
    for b in bounds[:-1]:
        if keys[b - 1] == keys[b]:
            grp = np.searchsorted(starts, b, side="right") - 1
            assert sizes[grp] > row_group_rows
    # Items keep their stored order inside a group.
    pos = out.column("pos").to_numpy()
    inside = keys[1:] == keys[:-1]
    assert (pos[1:][inside] == pos[:-1][inside] + 1).all()
    return out


def test_group_by_keeps_each_query_together_in_one_file(tmp_path):
    t = _query_items(np.random.default_rng(4), 120)
    shuffled = t.take(np.random.default_rng(5).permutation(t.num_rows))
    # Rows of one query spread over files and row groups, in their stored order within each query.
    order = pc.sort_indices(shuffled, sort_keys=[("pos", "ascending")])
    src = _write_parts(shuffled.take(order), tmp_path / "src", [t.num_rows // 3, t.num_rows - t.num_rows // 3],
                       row_group_size=500)
    report = layout(src, tmp_path / "dst", group_by="query_id", row_group_rows=100, files=4, progress=False)
    assert report.ok and report.sorting_columns == ("query_id",) and 1 < report.files <= 4
    out = _check_groups(tmp_path / "dst", "query_id", 100)
    keys = out.column("query_id").to_numpy()
    assert (np.diff(keys) >= 0).all()


def test_group_by_with_sort_by_orders_groups_by_the_other_key(tmp_path):
    t = _query_items(np.random.default_rng(6), 80)
    src = _write_parts(t, tmp_path / "src", [t.num_rows], row_group_size=1000)
    report = layout(src, tmp_path / "dst", sort_by=["day"], group_by="query_id", row_group_rows=150, files=2,
                    memory_limit="64MB", progress=False)
    assert report.ok and report.sorting_columns == ("day", "query_id") and not report.notes
    out = _check_groups(tmp_path / "dst", "query_id", 150)
    day, qid = out.column("day").to_numpy(), out.column("query_id").to_numpy()
    assert (np.diff(day) >= 0).all()
    same_day = day[1:] == day[:-1]
    assert (qid[1:][same_day] >= qid[:-1][same_day]).all()  # ties broken by the group key
    assert check_layout(str(tmp_path / "dst"), sort_by=["day", "query_id"]).ok


def test_group_by_with_a_sort_key_that_varies_inside_groups(tmp_path):
    t = pa.table({"q": [1, 1, 2, 2, 3], "day": [5, 1, 3, 3, 2], "pos": [0, 1, 0, 1, 0]})
    src = _write_parts(t, tmp_path / "src", [5])
    report = layout(src, tmp_path / "dst", sort_by=["day"], group_by="q", row_group_rows=2, progress=False)
    assert report.sorting_columns == ()
    assert report.notes == ("day vary within some q groups: groups are ordered by their smallest value of each, "
                            "so the files declare no sorting_columns",)
    out = _read(tmp_path / "dst")
    # Groups by their smallest day: q=1 (1), q=3 (2), q=2 (3); rows inside a group keep their order.
    assert out.column("q").to_pylist() == [1, 1, 3, 2, 2]
    assert out.column("day").to_pylist() == [5, 1, 2, 3, 3]


def test_hive_partition_columns_become_columns_at_the_end(tmp_path):
    rows = pa.table({"v": pa.array([3, 1, 2, 0]), "w": ["a", "b", "c", "d"]})
    for day, market in (("20260102", "US"), ("20260101", "FR")):
        folder = tmp_path / "src" / f"day={day}" / f"market={market}"
        folder.mkdir(parents=True)
        pq.write_table(rows, folder / "part.parquet")
    report = layout(str(tmp_path / "src"), tmp_path / "dst", sort_by=["day", "v"], row_group_rows=3, progress=False)
    assert report.ok
    out = _read(tmp_path / "dst")
    assert out.schema.names == ["v", "w", "day", "market"]
    assert out.schema.field("day").type == pa.int64() and out.schema.field("market").type == pa.string()
    assert out.column("day").to_pylist() == [20260101] * 4 + [20260102] * 4
    assert out.column("v").to_pylist() == [0, 1, 2, 3] * 2


def test_the_sort_spills_under_a_tiny_memory_limit(tmp_path):
    n = 700_000
    rng = np.random.default_rng(0)
    t = pa.table({"k": rng.integers(0, 1000, n), "v": rng.random(n),
                  "s": pa.array(np.char.add("value-", rng.integers(0, 10**9, n).astype(str)))})
    assert t.nbytes > 20 * 2**20
    src = _write_parts(t, tmp_path / "src", [n], row_group_size=100_000)
    spill = tmp_path / "spill"
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            total = 0
            for root, _, names in os.walk(spill):
                for name in names:
                    try:
                        total += os.path.getsize(os.path.join(root, name))
                    except OSError:
                        pass
            peak[0] = max(peak[0], total)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        report = layout(src, tmp_path / "dst", sort_by=["k"], memory_limit="24MB", threads=1,
                        temp_directory=str(spill), progress=False)
    finally:
        done.set()
        watcher.join()
    assert report.ok and report.rows == n
    assert peak[0] > 0, "the sort did not spill to its temp directory"
    assert check_layout(str(tmp_path / "dst"), sort_by=["k"]).ok


def test_layout_is_a_function_of_the_data(tmp_path):
    t = _query_items(np.random.default_rng(8), 30)
    src = _write_parts(t, tmp_path / "src", [t.num_rows // 2, t.num_rows - t.num_rows // 2])
    layout(src, tmp_path / "a", sort_by=["day"], row_group_rows=64, files=3, progress=False)
    layout(src, tmp_path / "b", sort_by=["day"], row_group_rows=64, files=3, progress=False, threads=1)
    fa, fb = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert [os.path.basename(p) for p in fa] == [os.path.basename(p) for p in fb]
    for x, y in zip(fa, fb):
        with open(x, "rb") as f1, open(y, "rb") as f2:
            assert f1.read() == f2.read()


def test_src_is_left_untouched(tmp_path):
    t = pa.table({"k": [3, 1, 2]})
    src = _write_parts(t, tmp_path / "src", [3])
    before = {p: (os.path.getsize(p), os.stat(p).st_mtime_ns) for p in _files(src)}
    layout(src, tmp_path / "dst", sort_by=["k"], progress=False)
    assert {p: (os.path.getsize(p), os.stat(p).st_mtime_ns) for p in _files(src)} == before
    assert sorted(os.listdir(src)) == ["part-000.parquet"]


def test_progress_goes_to_stderr_only_when_asked_or_on_a_terminal(tmp_path, capsys):
    t = pa.table({"k": [3, 1, 2]})
    src = _write_parts(t, tmp_path / "src", [3])
    layout(src, tmp_path / "quiet", sort_by=["k"])  # stderr is not a terminal here
    assert capsys.readouterr().err == ""
    layout(src, tmp_path / "loud", sort_by=["k"], progress=True)
    err = capsys.readouterr().err
    assert "reading" in err and "writing" in err


def test_a_digest_mismatch_fails_the_layout(tmp_path, monkeypatch):
    import detload._layout.rewrite as L

    t = pa.table({"k": [3, 1, 2], "v": [1.0, 2.0, 3.0]})
    src = _write_parts(t, tmp_path / "src", [3])
    original = L._Column.from_sorter

    def corrupt(self, arr):  # a sorter that changes a value on the way
        out = original(self, arr)
        return pc.multiply(out, 2.0) if self.name == "v" else out

    monkeypatch.setattr(L._Column, "from_sorter", corrupt)
    with pytest.raises(DigestMismatchError, match=r"differs from the digest of SRC .* lost, duplicated or changed "
                       r"rows, so DST .*dst was not created; the report holds both digests") as info:
        layout(src, tmp_path / "dst", sort_by=["k"], progress=False)
    assert not info.value.report.ok and info.value.report.to_dict()["digests_match"] is False
    # Output that is not the source's rows never becomes DST, and nothing of it stays beside it.
    assert sorted(os.listdir(tmp_path)) == ["src"]


# -- refusals ---------------------------------------------------------------------------------------------

@pytest.fixture
def small_src(tmp_path) -> str:
    t = pa.table({"k": [2, 1], "flag": [True, False], "tags": [[1], [2, 3]], "f": [0.5, 1.5]})
    return _write_parts(t, tmp_path / "src", [2])


def test_refuses_a_dst_that_is_not_empty(tmp_path, small_src):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.parquet").write_bytes(b"x")
    with pytest.raises(OptionError, match=r"DST '.*full' exists and is not empty \(1 entries, e.g. 'old.parquet'\); "
                                          "layout writes into a new or empty folder and never overwrites"):
        layout(small_src, tmp_path / "full", sort_by=["k"])
    assert (tmp_path / "full" / "old.parquet").read_bytes() == b"x"
    (tmp_path / "afile").write_bytes(b"x")
    with pytest.raises(OptionError, match="exists and is a file"):
        layout(small_src, tmp_path / "afile", sort_by=["k"])


def test_refuses_a_dst_inside_src(small_src):
    with pytest.raises(OptionError, match="lies inside SRC"):
        layout(small_src, os.path.join(small_src, "sorted"), sort_by=["k"])
    assert not os.path.exists(os.path.join(small_src, "sorted"))


def test_refuses_unknown_keys_naming_the_columns(tmp_path, small_src):
    with pytest.raises(DatasetError, match=re.escape("sort key 'market' is not a column of SRC; the columns are "
                                                     "['k', 'flag', 'tags', 'f']")):
        layout(small_src, tmp_path / "dst", sort_by=["k", "market"])
    with pytest.raises(DatasetError, match="group key 'query_id' is not a column of SRC; the columns are"):
        layout(small_src, tmp_path / "dst", group_by="query_id")
    with pytest.raises(DatasetError, match="bloom filter column 'nope' is not a column of SRC"):
        layout(small_src, tmp_path / "dst", sort_by=["k"], bloom_filter=["nope"])
    assert not os.path.exists(tmp_path / "dst")


def test_refuses_unsortable_keys_and_bad_options(tmp_path, small_src):
    with pytest.raises(DatasetError, match=r"cannot sort by 'tags': its type list<element: int64> has no order"):
        layout(small_src, tmp_path / "dst", sort_by=["tags"])
    with pytest.raises(DatasetError, match=r"cannot group by 'f': it is a float column"):
        layout(small_src, tmp_path / "dst", group_by="f")
    with pytest.raises(OptionError, match="needs sort_by .* or group_by"):
        layout(small_src, tmp_path / "dst")
    with pytest.raises(OptionError, match=r"^row_group_rows must be an int >= 1 \(rows per output row group\), got 0$"):
        layout(small_src, tmp_path / "dst", sort_by=["k"], row_group_rows=0)
    with pytest.raises(OptionError, match=r"^files must be an int >= 1 \(output files\), got bool True$"):
        layout(small_src, tmp_path / "dst", sort_by=["k"], files=True)
    with pytest.raises(OptionError, match=r"group_by 'k' is also listed in sort_by"):
        layout(small_src, tmp_path / "dst", sort_by=["k"], group_by="k")


@pytest.mark.parametrize("column,type_text", [("flag", "bool"), ("tags", "list<element: int64>")])
def test_refuses_a_bloom_filter_on_an_unsupported_type(tmp_path, small_src, column, type_text):
    with pytest.raises(DatasetError, match=re.escape(f"cannot write a bloom filter for '{column}': its type "
                                                     f"{type_text} is not supported")):
        layout(small_src, tmp_path / "dst", sort_by=["k"], bloom_filter=[column])


def test_refuses_a_src_without_rows(tmp_path):
    os.makedirs(tmp_path / "src")
    pq.write_table(pa.table({"k": pa.array([], pa.int64())}), tmp_path / "src" / "empty.parquet")
    with pytest.raises(EmptyDatasetError, match="SRC has no rows, there is nothing to lay out"):
        layout(str(tmp_path / "src"), tmp_path / "dst", sort_by=["k"])
    assert not os.path.exists(tmp_path / "dst")


def test_refuses_files_with_different_schemas(tmp_path):
    os.makedirs(tmp_path / "src")
    pq.write_table(pa.table({"k": pa.array([1], pa.int64())}), tmp_path / "src" / "a.parquet")
    pq.write_table(pa.table({"k": pa.array([2], pa.int32())}), tmp_path / "src" / "b.parquet")
    with pytest.raises(SchemaMismatchError, match="'k' is int64 in a.parquet but int32 in b.parquet"):
        layout(str(tmp_path / "src"), tmp_path / "dst", sort_by=["k"])


def test_without_duckdb_the_error_names_the_extra(tmp_path, small_src, monkeypatch):
    monkeypatch.setitem(sys.modules, "duckdb", None)
    with pytest.raises(ImportError, match=re.escape("detload layout needs DuckDB: pip install 'detload[layout]'")):
        layout(small_src, tmp_path / "dst", sort_by=["k"])


# -- check-layout -----------------------------------------------------------------------------------------

def test_check_layout_accepts_sorted_output_and_reports_indexes(tmp_path):
    t = pa.table({"m": ["a", "b", None, "a"] * 50, "d": list(range(200))})
    src = _write_parts(t, tmp_path / "src", [200])
    layout(src, tmp_path / "dst", sort_by=["m", "d"], row_group_rows=30, files=3, bloom_filter=["m"], progress=False)
    res = check_layout(str(tmp_path / "dst"), sort_by=["m", "d"])
    assert res.ok and res.files == 3 and res.nulls == "last"
    assert res.page_index == "all" and res.bloom_filters == (("m", "all"),) and res.sorting_columns == ("m", "d")
    text = str(res)
    assert "within files: sorted by (m, d), ascending, nulls last" in text
    assert "across files: sorted in file-name order" in text and "result: OK" in text


def test_check_layout_finds_unsorted_rows(tmp_path):
    t = pa.table({"m": [1, 2, 3, 2, 4]})
    src = _write_parts(t, tmp_path / "src", [5])
    res = check_layout(src, sort_by=["m"])
    assert not res.ok
    assert res.unsorted_files == ("part-000.parquet: row 3 (2) comes after row 2 (3) (1 such place(s))",)
    assert "NOT sorted by (m) in 1 file(s)" in str(res) and res.page_index == "none"


def test_check_layout_says_which_file_order_is_sorted(tmp_path):
    t = pa.table({"m": list(range(30))})
    root = tmp_path / "src"
    os.makedirs(root)
    for name, sl in (("part-2.parquet", slice(0, 10)), ("part-0.parquet", slice(10, 20)), ("part-1.parquet", slice(20, 30))):
        pq.write_table(t.slice(sl.start, 10), root / name)
    res = check_layout(str(root), sort_by=["m"])
    assert res.sorted_within_files and not res.sorted_across_files and not res.ok
    assert res.file_order_breaks[0] == "part-1.parquet ends at (29) but the next file, part-2.parquet, starts at (0)"
    assert res.file_order_found == ("part-2.parquet", "part-0.parquet", "part-1.parquet")
    assert "the files are sorted when read in this order: part-2.parquet, part-0.parquet, part-1.parquet" in str(res)


def test_check_layout_accepts_nulls_first_as_spark_writes_them(tmp_path):
    t = pa.table({"m": [None, None, 1, 1, 2], "d": [2, 1, 1, 3, None]})
    src = _write_parts(t, tmp_path / "src", [5])
    with pytest.raises(AssertionError):  # (None, 2) before (None, 1): not sorted in any null order
        assert check_layout(src, sort_by=["m", "d"]).ok
    t2 = pa.table({"m": [None, None, 1, 1, 2], "d": [1, 2, None, 3, 0]})
    src2 = _write_parts(t2, tmp_path / "src2", [5])
    res = check_layout(src2, sort_by=["m", "d"])
    assert res.ok and res.nulls == "first"


def test_check_layout_wants_statistics_for_the_keys(tmp_path):
    os.makedirs(tmp_path / "src")
    pq.write_table(pa.table({"m": [1, 2, 3], "v": [1, 2, 3]}), tmp_path / "src" / "a.parquet",
                   write_statistics=["v"], row_group_size=2)
    res = check_layout(str(tmp_path / "src"), sort_by=["m"])
    assert res.sorted_within_files and not res.ok
    assert res.missing_statistics == ("a.parquet#0: m", "a.parquet#1: m")
    assert "2 key column chunk(s) without min/max" in str(res)


def test_check_layout_refuses_an_unknown_key(tmp_path):
    src = _write_parts(pa.table({"m": [1]}), tmp_path / "src", [1])
    with pytest.raises(DatasetError, match=r"sort key 'x' is not a column of .*; the columns are \['m'\]"):
        check_layout(src, sort_by=["x"])


# -- the page's examples run as written ---------------------------------------------------------------------

def test_docs_layout_examples_run(tmp_path, monkeypatch):
    import detload
    import detload._layout.check
    import detload._layout.digest
    import detload._layout.rewrite

    # The page uses the package's public names; provide them where the package does not export them yet.
    for module, name in ((detload._layout.digest, "digest"), (detload._layout.digest, "Digest"), (detload._layout.rewrite, "layout"),
                         (detload._layout.rewrite, "LayoutReport"), (detload._layout.check, "check_layout")):
        if not hasattr(detload, name):
            monkeypatch.setattr(detload, name, getattr(module, name), raising=False)
    with open(os.path.join(HERE, "..", "..", "docs", "layout.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"(<!-- fragment -->\n)?```python\n(.*?)```", text, flags=re.S)
    runnable = [code for frag, code in blocks if not frag]
    assert runnable, "docs/layout.md has no python example"
    monkeypatch.chdir(tmp_path)
    for code in runnable:
        exec(compile(code, "docs/layout.md", "exec"), {"__name__": "__docs__"})


@pytest.mark.parametrize("key", ["u64", "i8", "f64", "f32", "b", "s", "ls", "dict", "bin", "fsb", "d32", "t64",
                                 "ts_ns_tz", "dur", "dec", "dec38", "uuid"])
def test_every_sortable_type_sorts_as_check_layout_expects(tmp_path, key):
    # Keys travel through DuckDB as carriers (integers, bytes): their order must be the type's order.
    table = parquet_types_table(40)
    src = _write_parts(table.take(np.random.default_rng(9).permutation(40)), tmp_path / "src", [40])
    layout(src, tmp_path / "dst", sort_by=[key, "k"], row_group_rows=9, progress=False)
    res = check_layout(str(tmp_path / "dst"), sort_by=[key, "k"])
    assert res.ok and res.nulls == "last", str(res)
