"""The `digest`, `layout` and `check-layout` commands, run in-process: output, exit codes and error messages."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import numpy as np
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


# -- failures of DuckDB and the writer: one line, exit 2, naming the option or the path ---------------------

def _error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("detload layout: error: "), err
    return lines[0][len("detload layout: error: "):]


@pytest.mark.parametrize("flags, message", [
    (["--memory-limit", "abc"], "--memory-limit 'abc' is not a size; use bytes or e.g. '500MB', '20GiB'"),
    (["--threads", "0"], "--threads must be an int >= 1 (DuckDB threads), got 0"),
    (["--threads", "-1"], "--threads must be an int >= 1 (DuckDB threads), got -1"),
    (["--compression", "nope"], "--compression 'nope' is not a Parquet codec this pyarrow writes; use one of none, "
                                "snappy, gzip, brotli, lz4, lz4_raw, zstd"),
    (["--row-group-rows", "0"], "--row-group-rows must be an int >= 1 (rows per output row group), got 0"),
])
def test_bad_values_are_refused_before_any_work(tmp_path, src, capsys, monkeypatch, flags, message):
    import detload._discovery

    def no_work(*args, **kwargs):
        raise AssertionError("SRC was read before the options were checked")

    monkeypatch.setattr(detload._discovery, "discover", no_work)
    assert main(["layout", src, str(tmp_path / "dst"), "--sort-by", "m", *flags]) == 2
    assert _error_line(capsys.readouterr().err) == message
    assert sorted(os.listdir(tmp_path)) == ["src"]


@needs_duckdb
def test_duckdb_out_of_memory_names_the_memory_limit(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"k": np.random.default_rng(0).permutation(20_000)}), src / "a.parquet")
    assert main(["layout", str(src), str(tmp_path / "dst"), "--sort-by", "k", "--memory-limit", "100KB",
                 "--threads", "1"]) == 2
    line = _error_line(capsys.readouterr().err)
    assert re.fullmatch(r"the sort ran out of memory under --memory-limit 100KB \(Out of Memory Error: [^\n]*\); "
                        r"raise --memory-limit, or lower --threads \(each thread sorts in buffers of its own\)", line)
    assert sorted(os.listdir(tmp_path)) == ["src"]


def _incompressible(tmp_path, rows: int = 200_000) -> str:
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(1)
    pq.write_table(pa.table({"k": rng.integers(0, 2**62, rows), "v": rng.random(rows)}), src / "a.parquet")
    return str(src)


@needs_duckdb
def test_duckdb_out_of_memory_without_a_limit_says_to_set_one(tmp_path, capsys, monkeypatch):
    import duckdb

    connect = duckdb.connect

    def little_memory(*args, config=None, **kwargs):  # as a machine with little free memory would
        return connect(*args, config={**(config or {}), "memory_limit": "100KB", "threads": 1}, **kwargs)

    monkeypatch.setattr(duckdb, "connect", little_memory)
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"k": np.random.default_rng(0).permutation(20_000)}), src / "a.parquet")
    assert main(["layout", str(src), str(tmp_path / "dst"), "--sort-by", "k"]) == 2
    line = _error_line(capsys.readouterr().err)
    assert re.fullmatch(r"the sort ran out of memory \(Out of Memory Error: [^\n]*\); set --memory-limit below the "
                        r"free memory, so that it spills to --temp-dir instead", line), line


@needs_duckdb
def test_a_full_spill_disk_names_the_spill_folder(tmp_path, capsys, monkeypatch):
    import duckdb

    connect = duckdb.connect

    def small_disk(*args, config=None, **kwargs):  # DuckDB's own cap on its spill folder, as a full disk sets it
        return connect(*args, config={**(config or {}), "max_temp_directory_size": "512KB"}, **kwargs)

    monkeypatch.setattr(duckdb, "connect", small_disk)
    src = _incompressible(tmp_path)
    assert main(["layout", src, str(tmp_path / "dst"), "--sort-by", "k", "--memory-limit", "4MB", "--threads", "1",
                 "--temp-dir", str(tmp_path / "spill")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert line.startswith(f"the disk is full: the sort could not write its spill files in {tmp_path / 'spill'} ("), line
    assert line.endswith("). DST was not created; free space on that disk, or give --temp-dir a folder on a disk "
                         "with room for about the size of SRC"), line
    assert not os.path.exists(tmp_path / "dst") and not any(n.startswith(".dst") for n in os.listdir(tmp_path))


@needs_duckdb
def test_a_full_disk_while_writing_names_the_file(tmp_path, src, capsys, monkeypatch):
    import errno

    import detload._layout.rewrite as L

    class FullDisk(pq.ParquetWriter):
        def write_table(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(L.pq, "ParquetWriter", FullDisk)
    assert main(["layout", src, str(tmp_path / "dst"), "--sort-by", "m"]) == 2
    line = _error_line(capsys.readouterr().err)
    folder = re.escape(str(tmp_path / ".dst.detload-layout-partial-"))
    assert re.fullmatch(rf"the disk is full: writing {folder}\d+-[0-9a-f]+/part-00000\.parquet failed \(no space left "
                        r"on device\)\. DST was not created and the partial output was removed; free space on that "
                        r"disk, or choose a DST on a disk with room for about the size of SRC", line), line
    assert sorted(os.listdir(tmp_path)) == ["src"]

    class Broken(pq.ParquetWriter):  # any other write error names the file too
        def write_table(self, *args, **kwargs):
            raise OSError(errno.EIO, "Error writing bytes to file. Detail: [errno 5] Input/output error")

    monkeypatch.setattr(L.pq, "ParquetWriter", Broken)
    assert main(["layout", src, str(tmp_path / "dst"), "--sort-by", "m"]) == 2
    line = _error_line(capsys.readouterr().err)
    assert re.fullmatch(rf"writing {folder}\d+-[0-9a-f]+/part-00000\.parquet failed: \[Errno 5\] Error writing bytes "
                        r"to file\. Detail: \[errno 5\] Input/output error; DST was not created", line), line
    assert sorted(os.listdir(tmp_path)) == ["src"]


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MiB tmpfs (root only; skipped elsewhere), unmounted after the test."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@needs_duckdb
def test_a_really_full_disk(tmp_path, tiny_tmpfs, capsys):
    src = _incompressible(tmp_path)
    assert main(["layout", src, str(tiny_tmpfs / "dst"), "--sort-by", "k"]) == 2
    line = _error_line(capsys.readouterr().err)
    assert line.startswith(f"the disk is full: writing {tiny_tmpfs}/.dst.detload-layout-partial-"), line
    assert os.listdir(tiny_tmpfs) == []  # nothing left to fill the disk
    assert main(["layout", src, str(tmp_path / "dst"), "--sort-by", "k", "--memory-limit", "4MB", "--threads", "1",
                 "--temp-dir", str(tiny_tmpfs / "spill")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert line.startswith(f"the disk is full: the sort could not write its spill files in {tiny_tmpfs / 'spill'}")
    assert sorted(os.listdir(tmp_path)) == ["small", "src"]
