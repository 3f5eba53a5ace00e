"""experiments/bench/decode_gap.py: the wall-time ratio is exactly the product of its factors,
the worker stage shares (with the untracked rest) add up to 100%, and a worker's work measured
without the pool reads every row of each epoch."""

from __future__ import annotations

import pytest


@pytest.fixture()
def gap(bench_script):
    return bench_script("decode_gap")


def test_factors_multiply_to_the_wall_ratio(gap):
    dec = {"rows_per_s": 3.0e6, "rows_per_cpu_s": 3.5e6, "cores": 3.0 / 3.5}
    det = {"rows_per_s": 4.2e6, "rows_per_cpu_s": 2.4e6, "cores": 1.75}
    f = gap.factors(det, dec, 2)
    assert f["wall_ratio"] == pytest.approx(0.7)
    assert f["cpu_efficiency"] == pytest.approx(2.4 / 3.5) and f["core_share"] == pytest.approx(0.875)
    assert f["product"] == pytest.approx(f["wall_ratio"])


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_small_run_measures_rates_and_shares_that_add_up(gap, tmp_path, pool):
    import datagen

    data = str(tmp_path / "ctr")
    datagen.make_ctr(data, rows=40_000)
    dec = gap.decode_one(data, 2)
    det = gap.detload_one(data, pool, 2, 3)
    assert dec["rows"] == 40_000 and det["rows"] == 80_000  # two measured epochs of detload
    assert dec["rows_per_cpu_s"] > 0 and det["rows_per_cpu_s"] > 0 and det["cores"] > 0
    assert sum(det["worker_shares"].values()) == pytest.approx(1.0)
    assert "read" in det["worker_shares"] and "bound by:" in det["stage_table"]
    # Process workers: the consuming process's own share of the cores is reported apart.
    assert ("consumer_cores" in det) == (pool == "process")
    if pool == "process":
        assert 0 < det["consumer_cores"] < det["cores"]


def test_a_workers_work_alone_reads_every_row_of_each_epoch(gap, tmp_path):
    import datagen

    data = str(tmp_path / "ctr")
    datagen.make_ctr(data, rows=40_000, row_group_rows=4_096)
    work = gap.work_one(data, 3)
    assert work["rows"] == 80_000  # epochs 2 and 3
    assert work["rows_per_s"] > 0 and work["rows_per_cpu_s"] > 0
