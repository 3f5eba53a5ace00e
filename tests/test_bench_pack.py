"""The packing benchmark (experiments/bench/bench_pack.py) runs end to end on a tiny table, untimed.

Its numbers are not checked (they are measurements); its table generator and its byte
model are: queries lie whole in one file, sizes stay in range, and a packed batch's bytes
are its items plus one row per group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

BENCH = Path(__file__).resolve().parents[1] / "experiments" / "bench"
sys.path.insert(0, str(BENCH))

import bench_pack as bp  # noqa: E402


def test_the_generated_table_holds_whole_queries_per_file(tmp_path):
    info = bp.make_queries(tmp_path / "t", queries=40, lo=5, hi=50, files=3, row_group_rows=64)
    files = sorted((tmp_path / "t").glob("*.parquet"))
    assert len(files) == 3
    seen: set[int] = set()
    total = 0
    for f in files:
        t = pq.read_table(f)
        assert t.num_columns == 1 + bp.N_QF + 1 + bp.N_IF + 1
        q = t.column("qid").to_numpy()
        keys = set(np.unique(q).tolist())
        assert not keys & seen
        seen |= keys
        assert (np.diff(q) >= 0).all()
        sizes = np.bincount(q)[sorted(keys)]
        assert sizes.min() >= 5 and sizes.max() <= 50
        total += len(q)
    assert total == info["items"] and len(seen) == 40
    assert bp.make_queries(tmp_path / "t", queries=40, lo=5, hi=50, files=3, row_group_rows=64) == info  # reused


def test_tiny_run_prints_the_table_and_the_targets(tmp_path, capsys):
    pytest.importorskip("torch")
    assert bp.main(["--tiny", "--workers", "1", "--repeats", "1", "--model-on-cpu", "--data", str(tmp_path / "b"),
                    "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "| flat |" in out and "| packed |" in out and "| packed+unpack |" in out
    assert "H2D bytes per item fall by" in out and "warm items/s" in out and "cache on disk: flat" in out
    assert "| torch DataLoader, flat rows |" in out and "| packed, query tower per query |" in out
    import json

    res = json.loads((tmp_path / "r.json").read_text())
    flat, packed = res["cpu"][0], res["cpu"][1]
    assert flat["items"] == packed["items"] == res["table"]["items"]
    assert packed["bytes_per_item"] < flat["bytes_per_item"]
    assert res["cache_bytes"]["packed"] < res["cache_bytes"]["flat"]
