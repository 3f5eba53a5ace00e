"""`detload plan --filter` says what was pruned and why, `detload bench --filter` reports what it
read; both refuse a bad --filter with one line naming the problem."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from detload.cli import main

PARTITION_ROWS = 1000
GROUP = 100


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[str, list[int]]:
    """p=0 and p=1, ids sorted (statistics prune), ``tag`` a permutation with bloom filters
    (min/max never prune it). Returns the root and the tags the filter asks for."""
    root = tmp_path_factory.mktemp("clifilter") / "ds"
    for p in (0, 1):
        os.makedirs(root / f"p={p}")
        ids = np.arange(p * PARTITION_ROWS, (p + 1) * PARTITION_ROWS, dtype=np.int64)
        tags = 2 * np.random.default_rng(p).permutation(ids)
        pq.write_table(pa.table({"id": ids, "tag": tags, "x": ids * 0.5}), root / f"p={p}" / "a.parquet",
                       row_group_size=GROUP, bloom_filter_options={"tag": {"ndv": GROUP, "fpp": 0.001}})
    first = pq.read_table(root / "p=0" / "a.parquet")
    # A tag of row group 0 (id 5, selected) and one of row group 4 at id 470 (past the range: none selected).
    return str(root), [int(first["tag"][5].as_py()), int(first["tag"][470].as_py())]


def _filter(tags: list[int]) -> str:
    return json.dumps([["p", "==", 0], ["id", "<", 450], ["tag", "in", tags]])


def test_plan_filter_names_each_reason_with_counts_and_examples(data, capsys):
    root, tags = data
    assert main(["plan", root, "--batch-size", "8", "--seed", "1", "--filter", _filter(tags)]) == 0
    out = capsys.readouterr().out
    assert "1 of 2,000 rows selected; of 20 row groups, 19 skipped (partition 10, statistics 5, bloom 3, " \
           "no matching row 1); selection pass 2 row group(s)" in out
    lines = {line.split(" ", 1)[1].split(":")[0].strip(): line for line in
             (raw.strip() for raw in out.splitlines()) if line[:1].isdigit()}
    assert lines["pruned by Hive partition values (not read)"].startswith("10 ")
    assert "p=1/a.parquet#0, " in lines["pruned by Hive partition values (not read)"]
    assert lines["pruned by row-group statistics, min/max and null counts (not read)"].endswith(
        ": p=0/a.parquet#5, p=0/a.parquet#6, p=0/a.parquet#7, p=0/a.parquet#8, p=0/a.parquet#9")
    assert lines["pruned by bloom filters (not read)"].endswith(
        ": p=0/a.parquet#1, p=0/a.parquet#2, p=0/a.parquet#3")
    sel = lines["selection pass"]
    assert sel.endswith("p=0/a.parquet#0 (1 of 100 rows), p=0/a.parquet#4 (0 of 100 rows)"), sel
    assert lines["of those, no row matched (not read by the workers)"].endswith(": p=0/a.parquet#4")
    assert "1 units, 1 rows" in out


def test_plan_filter_json_holds_the_canonical_filter_and_the_planning(data, capsys):
    root, tags = data
    assert main(["plan", root, "--batch-size", "8", "--seed", "1", "--filter", _filter(tags), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    fs = d["filter"]["planning"]
    assert fs["pruned"] == {"partition": 10, "statistics": 5, "bloom": 3}
    assert (fs["selection_pass"], fs["selected_empty"], fs["rows_selected"], fs["row_groups_skipped"]) == (2, 1, 1, 19)
    md = pq.read_metadata(os.path.join(root, "p=0", "a.parquet"))
    # The selection pass read the stored filter columns (id, tag) of row groups 0 and 4.
    assert fs["bytes_read"] == sum(md.row_group(g).column(j).total_compressed_size for g in (0, 4) for j in (0, 1))
    assert d["filter"]["canonical"]["op"] == "and" and d["units"] == 1


@pytest.mark.parametrize("order", ["mix", "windowed"])
def test_bench_filter_reports_bytes_and_row_groups_per_epoch(data, capsys, order):
    root, tags = data
    flt = json.dumps([["p", "==", 0], ["id", "<", 450]])
    assert main(["bench", root, "--workers", "2", "--epochs", "2", "--batch-size", "64", "--columns", "x",
                 "--filter", flt, "--json", "--order", order]) == 0
    out = capsys.readouterr().out
    head, _, body = out.partition("\n{\n")  # the lines, then the stats' JSON
    assert "filter " in head and "450 of 2,000 rows selected; of 20 row groups, 15 skipped" in head
    md = pq.read_metadata(os.path.join(root, "p=0", "a.parquet"))
    x_bytes = [md.row_group(g).column(2).total_compressed_size for g in range(5)]
    per_epoch = sum(x_bytes)
    # The mixed order plans these 5 row groups as one task, whose window the workers keep from
    # one epoch to the next: epoch 1 reads nothing. The windowed order reads every epoch.
    epochs = 1 if order == "mix" else 2
    for e in range(epochs):
        assert f"epoch {e}: 450 rows in " in head and f"read 5 row group(s) from the source ({per_epoch / 1e3:,.1f} kB" in head
    if order == "mix":
        assert "epoch 1: 450 rows in " in head and ("read 0 row group(s) from the source (0 B of column chunks) "
                                                  "(the mixed order's window, kept from the epoch before)") in head
    else:
        assert "kept from the epoch before" not in head
    st = json.loads("{" + body.rsplit("\n}", 1)[0] + "}")
    reads = st["reads"]
    # Row group 4 ([400, 500)) is cut by the range: the selection pass read its id column.
    id_bytes = md.row_group(4).column(0).total_compressed_size
    assert reads["planning"]["bytes_read"] == id_bytes
    assert reads["bytes_read"] == epochs * per_epoch + id_bytes
    assert reads["row_groups_read"] == 5 * epochs and reads["row_groups_skipped"] == 15 and reads["rows_selected"] == 900
    assert [e["rows_selected"] for e in reads["epochs"]] == [450, 450]
    assert st["stages"]["select"]["count"] == 1 + epochs  # planning's pass over row group 4, one gather a read


@pytest.mark.parametrize("cmd", ["plan", "bench"])
@pytest.mark.parametrize("flt, message", [
    ('[["id", "<",', "starts with '[', so it is read as JSON, but is not JSON"),
    ('[["nope", "==", 3]]', "filter column 'nope' does not exist; the available columns are ['id', 'tag', 'x', 'p']"),
    ('[["id", "==", "three"]]', "'three'"),
])
def test_a_bad_filter_is_one_error_line(data, capsys, cmd, flt, message):
    root, _ = data
    args = ["--batch-size", "8", "--seed", "1"] if cmd == "plan" else ["--workers", "1", "--epochs", "1"]
    assert main([cmd, root, *args, "--filter", flt]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"detload {cmd}: error: "), err
    assert message in lines[0], lines[0]


@pytest.mark.parametrize("cmd", ["plan", "bench"])
@pytest.mark.parametrize("flt, message", [
    # A command line's bytes that are not UTF-8 reach Python as lone surrogates.
    ('id == "\udcff"', "filter text 'id == \"\\udcff\"' holds the lone surrogate '\\udcff' at column 8, which is "
                       "not a character and cannot be encoded as UTF-8"),
    ('[["x", "in", [1.5, NaN]]]', "filter isin on column 'x' lists NaN: NaN is not allowed in isin values"),
    ('x in (1.5, float("nan"))', "filter isin on column 'x' lists NaN: NaN is not allowed in isin values"),
])
def test_a_surrogate_or_nan_in_the_filter_is_one_error_line(data, capsys, cmd, flt, message):
    root, _ = data
    args = ["--batch-size", "8", "--seed", "1"] if cmd == "plan" else ["--workers", "1", "--epochs", "1"]
    assert main([cmd, root, *args, "--filter", flt]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"detload {cmd}: error: {message}"), lines


@pytest.mark.parametrize("cmd, where", [("plan", "source"), ("bench", "source"), ("bench", "cache")])
def test_a_nul_in_a_path_is_one_error_line_naming_the_option(data, tmp_path, capsys, cmd, where):
    root, _ = data
    args = ["--batch-size", "8", "--seed", "1"] if cmd == "plan" else ["--workers", "1", "--epochs", "1"]
    bad = f"{tmp_path}/c\x00" if where == "cache" else f"{root}/p=0\x00"
    source = root if where == "cache" else bad
    extra = ["--cache-dir", bad] if where == "cache" else []
    assert main([cmd, source, *args, *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    name = "--cache-dir" if where == "cache" else "source"
    assert lines == [f"detload {cmd}: error: {name} {bad!r} holds a NUL character (\\x00) at position "
                     f"{bad.index(chr(0))}, which no path or URI can contain; remove it"], lines
