"""experiments/bench/gpu_feed.py in its tiny CPU configuration: every feeder runs and reports."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
BENCH = Path(__file__).resolve().parent.parent / "experiments" / "bench"


def test_gpu_feed_tiny_on_cpu(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("gpu_feed", BENCH / "gpu_feed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "r.json"
    assert mod.main(["--tiny", "--device", "cpu", "--data", str(tmp_path / "d"), "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["errors"] == [] and saved["skipped"] == []
    res = saved["results"]
    feeders = {(r["hidden"], r["feeder"]) for r in res}
    for h in (16, 32):
        assert (h, "in-memory pinned tensors") in feeders
        for w in (1, 2):
            assert {(h, f"torch DataLoader W={w}"), (h, f"detload thread W={w}"), (h, f"detload process W={w}")} <= feeders
    # The comparison variants run with the first model at the middle worker count.
    assert {(16, "detload process W=2 (slab)"), (16, "detload process W=2 (columns)"),
            (16, "torch DataLoader W=2 (columns)")} <= feeders
    for r in res:
        assert r["steps"] >= 1 and r["rows_per_s"] > 0 and 0 <= r["wait_fraction"] <= 1
        if r["feeder"] == "in-memory pinned tensors":
            assert r["efficiency"] == 1.0 and r["bound_min"] <= r["rows_per_s"] <= r["bound_max"]
            assert r["bound_runs"] == (10 if r["hidden"] == 16 else 7)  # before the first feeder, after each
        else:
            assert r["efficiency"] == pytest.approx(r["rows_per_s"] / r["bound_rows_per_s"])
    table = capsys.readouterr().out
    assert "feed efficiency" in table and "device: cpu" in table
    sys.modules.pop("gpu_feed", None)
