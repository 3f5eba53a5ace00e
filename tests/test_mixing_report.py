"""The mixing report (detload.planning.mixing, Loader.plan_stats, ``detload plan --mixing``):
the rows it attributes to each batch are the loader's, and its numbers on small datasets whose
answer is known (no shuffle: one row group per batch; a sorted day column)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from detload import Distributed, Loader, OptionError, Transform
from detload.cli import main as cli_main
from detload.plan import OrderOptions
from detload.planning import make_plan
from detload.planning.mixing import MAX_VALUES, epoch_rows, mixing_report, report_lines, step_offsets

DAYS = 14
DAY_ROWS = 256


def _days(root: str, files: int = 2, shuffle_rows: bool = False) -> str:
    """14 days of 256 rows, one row group per day, sorted by day, split over ``files`` files;
    ``id`` numbers the rows 0, 1, ... in canonical order, ``x`` is a float, ``s`` text with 100
    values."""
    per = DAYS // files
    schema = pa.schema([("id", pa.int64()), ("day", pa.int32()), ("x", pa.float64()), ("s", pa.string())])
    os.makedirs(root, exist_ok=True)
    for f in range(files):
        with pq.ParquetWriter(os.path.join(root, f"part-{f}.parquet"), schema) as w:
            for d in range(f * per, (f + 1) * per):
                ids = np.arange(d * DAY_ROWS, (d + 1) * DAY_ROWS, dtype=np.int64)
                x = np.random.default_rng(d).normal(size=DAY_ROWS)
                w.write_table(pa.table({"id": ids, "day": np.full(DAY_ROWS, d, np.int32), "x": x,
                                        "s": [f"k{i % 100}" for i in ids]}, schema=schema),
                              row_group_size=DAY_ROWS)
    return root


def _uneven(root: str) -> str:
    """Row groups of unequal sizes in 3 files (partition boundaries cut some); ``id`` numbers the
    rows in canonical order, ``g`` a group key in runs of 1-7 rows, ``v`` a value in 0..9."""
    sizes = [[37, 80, 11], [64, 5, 90, 23], [50, 41]]
    rng = np.random.default_rng(5)
    pos = 0
    os.makedirs(root, exist_ok=True)
    key = 0
    for f, groups in enumerate(sizes):
        schema = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("v", pa.int64())])
        with pq.ParquetWriter(os.path.join(root, f"f{f}.parquet"), schema) as w:
            for n in groups:
                ids = np.arange(pos, pos + n, dtype=np.int64)
                pos += n
                runs = np.repeat(np.arange(key, key + n), rng.integers(1, 8, n))[:n]
                key = int(runs[-1]) + 1  # a group never continues into the next row group
                w.write_table(pa.table({"id": ids, "g": runs, "v": rng.integers(0, 10, n)}, schema=schema),
                              row_group_size=n)
    return root


def _delivered_ids(loader: Loader) -> tuple[np.ndarray, list[int]]:
    ids, sizes = [], []
    for batch in loader:
        flat = batch.unpack() if hasattr(batch, "unpack") else batch
        ids.append(np.asarray(flat["id"]))
        sizes.append(len(flat["id"]))
    return np.concatenate(ids), sizes


@pytest.mark.parametrize("kwargs", [
    {},
    {"shuffle": False},
    {"order": "windowed", "shuffle_window": 2, "partitions": 4},
    {"distributed": Distributed(1, 2), "partitions": 2},
    {"drop_last": True, "batch_size": 48},
    {"filter": [["v", "<", 6]], "partitions": 2},
    {"group_by": "g", "shuffle_window": 2, "partitions": 2},
], ids=["default", "no-shuffle", "partitions", "rank-1-of-2", "drop-last", "filter", "group-by"])
def test_epoch_rows_are_the_rows_the_loader_delivers(tmp_path, kwargs):
    root = _uneven(str(tmp_path / "u"))
    kwargs = {"batch_size": 32, **kwargs}
    with Loader(root, seed=11, **kwargs) as loader:
        # The global id of a delivered row is its place among the delivered rows in canonical
        # order: with a filter, the selected ids in stored order.
        canon = np.arange(sum(u.rows for u in loader.planned.units.units))
        if "filter" in kwargs:
            canon = np.concatenate([pq.read_table(os.path.join(root, f)).filter(
                pa.compute.less(pa.compute.field("v"), 6)).column("id").to_numpy()
                for f in sorted(os.listdir(root))])
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            got, sizes = _delivered_ids(loader)
            rows = epoch_rows(loader.plan())
            assert np.array_equal(canon[rows], got)
            assert np.diff(step_offsets(loader.plan())).tolist() == sizes


def test_no_shuffle_puts_one_row_group_in_each_batch(tmp_path):
    root = _days(str(tmp_path / "d"))
    with Loader(root, batch_size=128, seed=1, shuffle=False, order="windowed") as loader:
        st = loader.plan_stats(mix_column="day")
    n = DAYS * DAY_ROWS
    assert (st["rows"], st["steps"], st["batches_measured"], st["every_batch"]) == (n, 28, 28, True)
    assert (st["row_groups"], st["files"]) == (DAYS, 2)
    assert st["row_groups_per_batch"]["median"] == st["row_groups_per_batch"]["p5"] == 1
    assert st["files_per_batch"]["median"] == st["files_per_batch"]["p5"] == 1
    mc = st["mix_column"]
    assert (mc["name"], mc["kind"], mc["codes"]) == ("day", "values", DAYS)
    assert mc["labels"] == [str(d) for d in range(DAYS)]
    assert mc["values_per_batch"]["median"] == mc["values_per_batch"]["p5"] == 1
    # A batch of one day against 14 equal days: 13/14 of the mass is elsewhere.
    assert mc["tvd"]["median"] == pytest.approx(13 / 14) and mc["tvd"]["p95"] == pytest.approx(13 / 14)
    # Each row group's rows are consecutive: 5th to 95th percentile of 256 positions.
    assert st["spread"]["median"] == pytest.approx(0.9 * (DAY_ROWS - 1) / n)
    assert st["spread"]["row_groups_measured"] == DAYS
    # The i.i.d. reference of the same rows mixes everything.
    assert st["row_groups_per_batch"]["iid_median"] >= 13 and st["files_per_batch"]["iid_p5"] == 2
    assert mc["values_per_batch"]["iid_median"] >= 13 and mc["tvd"]["iid_median"] < 0.25
    assert st["spread"]["iid_median"] > 0.8


def test_sorted_days_windowed_order_is_far_from_iid(tmp_path):
    root = _days(str(tmp_path / "d"))
    with Loader(root, batch_size=128, seed=1, order="windowed") as loader:  # shuffle_window=4
        st = loader.plan_stats(mix_column="day")
        again = loader.plan_stats(mix_column="day")
        other = loader.plan_stats(epoch=1, mix_column="day")
    assert st == again and other != st  # deterministic, and per epoch
    assert st["row_groups_per_batch"]["median"] <= 4 and st["row_groups_per_batch"]["iid_p5"] >= 12
    mc = st["mix_column"]
    assert mc["values_per_batch"]["median"] <= 4 and mc["values_per_batch"]["iid_p5"] >= 12
    assert mc["tvd"]["median"] > 0.6 and mc["tvd"]["iid_median"] < 0.25
    assert st["spread"]["median"] < 0.3 < 0.8 < st["spread"]["iid_median"]


def test_the_iid_reference_of_a_plan_is_a_permutation_of_its_rows():
    rows = [100, 50, 80, 120, 60, 90]
    plan = make_plan(rows, OrderOptions(seed=3, batch_size=40, order="windowed"), epoch=0)
    st = mixing_report(plan)
    # 500 rows, 12 full batches of 40 and a short one (left out).
    assert (st["rows"], st["steps"], st["batches_measured"]) == (500, 13, 12)
    assert st["mix_column"] is None and st["order"] == "windowed" and st["plan_format"] == 2
    assert sorted(epoch_rows(plan).tolist()) == list(range(500))
    lines = report_lines(st)
    assert lines[0] == ("mixing, epoch 0 rank 0 (windowed order): 12 of 13 batches measured (every full one), "
                        "beside an i.i.d. shuffle of the same rows")
    assert "source row groups per batch (of 6), median" in lines[2]


def test_a_long_epoch_is_measured_on_evenly_spaced_batches():
    rows = [64] * 40
    plan = make_plan(rows, OrderOptions(seed=3, batch_size=16, shuffle=False, order="windowed"), epoch=0)
    st = mixing_report(plan, max_batches=9)
    assert (st["steps"], st["batches_measured"], st["every_batch"]) == (160, 9, False)
    assert st["row_groups_per_batch"]["median"] == 1 and st["row_groups_per_batch"]["iid_median"] >= 14
    full = mixing_report(plan)
    assert full["every_batch"] and full["batches_measured"] == 160
    assert "9 of 160 batches measured (evenly spaced)" in report_lines(st)[0]


def test_numeric_and_text_columns_are_binned(tmp_path):
    root = _days(str(tmp_path / "d"))
    with Loader(root, batch_size=128, seed=1, order="windowed") as loader:
        x = loader.plan_stats(mix_column="x")["mix_column"]
        ids = loader.plan_stats(mix_column="id")["mix_column"]
        s = loader.plan_stats(mix_column="s")["mix_column"]
    # x is drawn alike every day: the windowed order mixes it as an i.i.d. shuffle does.
    assert (x["kind"], x["codes"]) == ("quantile bins", 20)
    assert abs(x["tvd"]["median"] - x["tvd"]["iid_median"]) < 0.05
    # id follows the day: four row groups (of 14) cover at most 12 of its 20 quantile bins.
    assert ids["kind"] == "quantile bins" and ids["values_per_batch"]["median"] <= 12
    assert ids["tvd"]["median"] > 0.5 > 0.25 > ids["tvd"]["iid_median"]
    assert ids["values_per_batch"]["iid_median"] == 20
    assert (s["kind"], s["codes"], len(s["labels"])) == ("most frequent values", MAX_VALUES, MAX_VALUES)
    assert s["labels"][-1] == "(other)"


def test_a_filter_selection_and_a_partition_key_column(tmp_path):
    root = str(tmp_path / "h")
    for d in range(4):
        os.makedirs(f"{root}/day={d}")
        pq.write_table(pa.table({"v": np.arange(100) % 10 + d}), f"{root}/day={d}/p.parquet", row_group_size=50)
    with Loader(root, batch_size=25, seed=2, shuffle=False, order="windowed", filter=[["v", "<", 5]]) as loader:
        st = loader.plan_stats(mix_column="v")
        by_day = loader.plan_stats(mix_column="day")
    mc = st["mix_column"]
    # Only the selected rows count: v < 5, so days 0..4 hold values 0-4, 1-4, 2-4, 3-4.
    assert mc["labels"] == ["0", "1", "2", "3", "4"] and st["rows"] == 50 + 40 + 30 + 20
    assert by_day["mix_column"]["labels"] == ["0", "1", "2", "3"]
    assert by_day["mix_column"]["values_per_batch"]["p5"] == 1


def test_a_null_gets_its_own_code(tmp_path):
    root = str(tmp_path / "n")
    os.makedirs(root)
    pq.write_table(pa.table({"c": pa.array(["a", None, "b", "a"] * 20)}), f"{root}/p.parquet")
    with Loader(root, batch_size=8, seed=2) as loader:
        mc = loader.plan_stats(mix_column="c")["mix_column"]
    assert mc["labels"] == ["a", "b", "(null)"] and mc["codes"] == 3


def test_unknown_or_unusable_mix_columns_are_refused(tmp_path):
    root = _days(str(tmp_path / "d"))
    with Loader(root, batch_size=128, seed=1) as loader:
        with pytest.raises(OptionError, match=r"mix column 'dya' is not a column of the dataset; its columns "
                                              r"are \['id', 'day', 'x', 's'\]"):
            loader.plan_stats(mix_column="dya")
        with pytest.raises(OptionError, match="mix_column must be a column name"):
            loader.plan_stats(mix_column=3)  # type: ignore[arg-type]
    lst = str(tmp_path / "l")
    os.makedirs(lst)
    pq.write_table(pa.table({"e": pa.array([[1.0, 2.0]] * 10)}), f"{lst}/p.parquet")
    with Loader(lst, batch_size=4, seed=1) as loader, \
            pytest.raises(OptionError, match=r"mix column 'e' holds list<\w+: double> values; choose a column"):
        loader.plan_stats(mix_column="e")
    with pytest.raises(OptionError, match="needs the dataset"):
        mixing_report(make_plan([10], OrderOptions(seed=1, batch_size=2), epoch=0), mix_column="day")
    with pytest.raises(OptionError, match="max_batches must be"):
        mixing_report(make_plan([10], OrderOptions(seed=1, batch_size=2), epoch=0), max_batches=0)


def _drop_odd(cols, ctx):
    return {k: v[::2] for k, v in cols.items()}


def test_a_transform_that_changes_rows_refuses_a_mix_column(tmp_path):
    root = _days(str(tmp_path / "d"))
    xf = Transform(_drop_odd, name="halve", rows="changes")
    with Loader(root, batch_size=64, seed=1, columns=["id", "day"], transform=xf) as loader:
        assert loader.plan_stats()["rows"] == DAYS * DAY_ROWS // 2
        with pytest.raises(OptionError, match="mix column 'day': transform 'halve' has rows='changes'"):
            loader.plan_stats(mix_column="day")


def test_cli_prints_the_report_and_json(tmp_path, capsys):
    root = _days(str(tmp_path / "d"))
    args = ["plan", root, "--batch-size", "128", "--seed", "1", "--order", "windowed", "--shuffle-window", "1"]
    assert cli_main(args) == 0
    assert "mixing" not in capsys.readouterr().out  # only when asked: it computes every block's rows
    assert cli_main([*args, "--mix-column", "day"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("  mixing, epoch 0 rank 0 (windowed order)"))
    assert lines[i + 1].split() == ["this", "order", "i.i.d."]
    tvd = next(ln for ln in lines if "'day' distance from the epoch's mix (TVD), median" in ln)
    assert tvd.split()[-2] == "0.929"  # a window of one row group: one day per batch
    assert any("'day' values per batch (of 14), median" in ln and ln.split()[-2] == "1" for ln in lines)
    assert cli_main([*args, "--mixing", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mixing"]["mix_column"] is None and d["mixing"]["row_groups_per_batch"]["median"] == 1
    assert cli_main([*args, "--mix-column", "day", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mixing"]["mix_column"]["tvd"]["median"] == pytest.approx(13 / 14)


def test_cli_unknown_mix_column_is_one_error_line(tmp_path, capsys):
    root = _days(str(tmp_path / "d"))
    assert cli_main(["plan", root, "--batch-size", "128", "--seed", "1", "--mix-column", "dya"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == ("detload plan: error: mix column 'dya' is not a column of the dataset; its columns are "
                       "['id', 'day', 'x', 's']\n")


def test_a_plan_that_lists_its_rows_is_asked():
    """A plan with ``row_ids()`` (the mixed order's) is measured from them: here a windowed plan
    that lists its own rows, which must measure as the windowed plan does."""
    import dataclasses

    from detload.plan import Plan

    asked = []

    class Listed(Plan):
        def row_ids(self) -> np.ndarray:
            asked.append(1)
            return epoch_rows(base)

    base = make_plan([64, 40, 64, 30, 64, 64, 50], OrderOptions(seed=9, batch_size=16, partitions=2, order="windowed"),
                     epoch=2)
    listed = Listed(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Plan)})
    assert np.array_equal(epoch_rows(listed), epoch_rows(base)) and asked
    assert mixing_report(listed) == mixing_report(base)
    few, few_base = mixing_report(listed, max_batches=5), mixing_report(base, max_batches=5)
    assert few["row_groups_per_batch"]["median"] == few_base["row_groups_per_batch"]["median"]
    assert few["spread"]["median"] == few_base["spread"]["median"]
