"""Dataset discovery edge cases met in real writers' output: empty files typed as null, side files,
backup copies beside the data, and list sources that reach a file twice."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from detload import DatasetError, Loader, OptionError, SchemaMismatchError, SkippedFilesWarning


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
    pq.write_table(pa.table({"id": pa.array(np.arange(10, 20), pa.float64()), "s": pa.array(["x"] * 10)}),
                   tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatchError, match=r"'id' is int64 in a\.parquet but double in b\.parquet"):
        Loader(tmp_path, batch_size=4, seed=1)


# -- backup and temporary copies ------------------------------------------------------------

def _rows(source) -> int:
    with Loader(source, batch_size=128, seed=1) as ld:
        return sum(len(b["id"]) for b in ld)


def _folder_with_copies(root):
    """part-01.parquet (300 rows) and copies of a 777-row file under backup names: each starts with PAR1."""
    root.mkdir()
    pq.write_table(_table(0, 300), root / "part-01.parquet")
    pq.write_table(_table(0, 777), root / "part-01.parquet.bak")
    for name in ("part-02.parquet.TMP", "part-03.parquet~", "part-04.parquet.orig", "part-05.parquet.partial"):
        shutil.copy(root / "part-01.parquet.bak", root / name)
    return root


def test_backup_copies_in_a_folder_or_glob_are_skipped_with_the_warning(tmp_path):
    d = _folder_with_copies(tmp_path / "d")
    want = ("part-01.parquet.bak", "part-02.parquet.TMP", "part-03.parquet~", "part-04.parquet.orig",
            "part-05.parquet.partial")
    for source in (d, f"{d}/*", f"{d}/part-0*"):
        with pytest.warns(SkippedFilesWarning) as got:
            ld = Loader(source, batch_size=128, seed=1)
        assert len(got) == 1
        assert str(got[0].message) == (
            f"5 files skipped: 1 .bak, 1 .orig, 1 .partial, 1 .tmp, 1 ~ in {d}: they are backup or temporary "
            "copies (names ending in .bak, .backup, .old, .orig, .tmp, .temp, .part, .partial, .swp, ~; name such "
            "a file in the source to read it), e.g. part-01.parquet.bak. `detload inspect` lists them; move them "
            "out of the dataset folder to silence this.")
        assert ld.dataset.skipped == want and ld.dataset.rows == 300, source
        assert sum(len(b["id"]) for b in ld) == 300
        ld.close()


def test_a_stray_file_and_a_backup_copy_give_both_reasons(tmp_path):
    d = _folder_with_copies(tmp_path / "d")
    (d / "notes.csv").write_text("a,b\n")
    with pytest.warns(SkippedFilesWarning, match=r"^6 files skipped: 1 \.bak, 1 \.csv, .* they are not Parquet \(no "
                      r"\.parquet/\.parq/\.pq suffix, no Parquet magic\), or backup or temporary copies \(names "):
        Loader(d, batch_size=128, seed=1).close()


def test_a_backup_copy_named_explicitly_is_read(tmp_path):
    d = _folder_with_copies(tmp_path / "d")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedFilesWarning)
        assert _rows(d / "part-01.parquet.bak") == 777
        assert _rows([d / "part-01.parquet", d / "part-03.parquet~"]) == 300 + 777
        assert _rows(f"{d}/*.bak") == 777  # a glob ending in the suffix asks for the copies


def test_a_folder_or_glob_of_backup_copies_only(tmp_path):
    d = _folder_with_copies(tmp_path / "d")
    (d / "part-01.parquet").unlink()
    with pytest.raises(DatasetError, match=rf"^no Parquet data files under '{d}' \(.*backup or temporary copies "
                                           r"such as \*\.bak, \*\.tmp, \*~ are skipped\)$"):
        Loader(d, batch_size=128, seed=1)
    with pytest.raises(DatasetError, match=rf"^the glob '{d}/part-0\*' matches only backup or temporary copies "
                                           rf"\(names ending in \.bak, .*\), e\.g\. '{d}/part-01\.parquet\.bak'; a glob "
                                           r"skips them: name the files themselves to read them$"):
        Loader(f"{d}/part-0*", batch_size=128, seed=1)


# -- a list source reaches each file once -------------------------------------------------

def test_a_list_source_that_reaches_a_file_twice_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(_table(0, 300), d / "a.parquet")
    pq.write_table(_table(300, 500), d / "b.parquet")
    monkeypatch.chdir(tmp_path)
    a = str(d / "a.parquet")
    for source, first, second in (([a, a], 0, 1), ([str(d / "b.parquet"), "d/a.parquet", a], 1, 2),
                                  ([str(d), a], 0, 1), ([f"{d}/*.parquet", f"{d}/a*"], 0, 1)):
        with pytest.raises(OptionError, match=rf"^source\[{first}\] and source\[{second}\] both name the file "
                                              rf"'{a}': a list source must reach each file once \(a folder and a "
                                              r"file in it, or two globs, count too\); remove the duplicate$"):
            Loader(source, batch_size=128, seed=1)
    assert _rows([a, str(d / "b.parquet")]) == 500
