"""The `digest`, `layout` and `check-layout` commands, run in-process: output, exit codes and error messages."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _typesdata import all_types_table

from detload._layout.digest import digest
from detload.cli import main


@pytest.fixture
def src(tmp_path) -> str:
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(pa.table({"m": ["b", "a", "c", "a"], "d": [4, 3, 2, 1]}), root / "part.parquet")
    return str(root)


def test_digest_prints_rows_and_value(tmp_path, capsys):
    pq.write_table(all_types_table(), tmp_path / "t.parquet")
    path = str(tmp_path / "t.parquet")
    want = digest(path)
    assert main(["digest", path]) == 0
    assert capsys.readouterr().out.strip() == f"{want.rows} rows, digest {want.value}"
    assert main(["digest", path, "--json"]) == 0
    assert capsys.readouterr().out.strip() == f'{{"rows": {want.rows}, "digest": "{want.value}"}}'
    assert main(["digest", path, "--columns", "k,s"]) == 0
    assert capsys.readouterr().out.strip().endswith(digest(path, columns=["k", "s"]).value)


def test_digest_of_a_missing_path_exits_2(tmp_path, capsys):
    assert main(["digest", str(tmp_path / "nope")]) == 2
    assert "detload digest: error: dataset path" in capsys.readouterr().err


needs_duckdb = pytest.mark.skipif(importlib.util.find_spec("duckdb") is None, reason="layout needs duckdb")


@needs_duckdb
def test_layout_prints_the_report_and_check_layout_agrees(tmp_path, src, capsys):
    dst = str(tmp_path / "dst")
    assert main(["layout", src, dst, "--sort-by", "m,d", "--row-group-rows", "2", "--bloom-filter", "m"]) == 0
    out = capsys.readouterr().out
    assert f"layout {src} -> {dst}" in out and "4 rows in 1 file(s), 2 row groups" in out
    assert "digests match" in out
    assert pq.read_table(dst).column("m").to_pylist() == ["a", "a", "b", "c"]
    assert main(["check-layout", dst, "--sort-by", "m,d"]) == 0
    assert "result: OK, ready for pruning by m" in capsys.readouterr().out
    assert main(["check-layout", src, "--sort-by", "m", "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["ok"] is False and res["unsorted_files"][0].startswith("part.parquet: row 1 ('a') comes after row 0 ('b')")


@needs_duckdb
def test_layout_json_report(tmp_path, src, capsys):
    assert main(["layout", src, str(tmp_path / "dst"), "--sort-by", "d", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["digests_match"] is True and rep["sort_by"] == ["d"] and rep["rows"] == 4
    assert rep == json.loads((tmp_path / "dst" / "_detload_layout.json").read_text())


@needs_duckdb
def test_layout_refusals_exit_2_with_the_message(tmp_path, src, capsys):
    os.makedirs(tmp_path / "full")
    (tmp_path / "full" / "x").write_text("x")
    assert main(["layout", src, str(tmp_path / "full"), "--sort-by", "m"]) == 2
    assert "detload layout: error: DST" in capsys.readouterr().err
    assert main(["layout", src, str(tmp_path / "dst"), "--sort-by", "market"]) == 2
    assert "sort key 'market' is not a column of SRC; the columns are ['m', 'd']" in capsys.readouterr().err


def test_layout_without_duckdb_exits_2_naming_the_extra(tmp_path, src, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "duckdb", None)
    assert main(["layout", src, str(tmp_path / "dst"), "--sort-by", "m"]) == 2
    assert "pip install 'detload[layout]'" in capsys.readouterr().err


@needs_duckdb
def test_layout_digest_mismatch_exits_1(tmp_path, src, capsys, monkeypatch):
    import detload._layout.rewrite as L

    original = L._Column.from_sorter

    def drop_one_letter(self, arr):
        out = original(self, arr)
        return pc.utf8_slice_codeunits(out, 0, 0) if self.name == "m" else out

    monkeypatch.setattr(L._Column, "from_sorter", drop_one_letter)
    assert main(["layout", src, str(tmp_path / "dst"), "--sort-by", "d"]) == 1
    captured = capsys.readouterr()
    assert "DIGESTS DIFFER" in captured.out
    assert "detload layout: error: the digest of" in captured.err
