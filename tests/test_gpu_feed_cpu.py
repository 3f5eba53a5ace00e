"""experiments/bench/gpu_feed.py in its tiny CPU configuration: every feeder runs and reports."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")


def test_gpu_feed_tiny_on_cpu(tmp_path, capsys, bench_script):
    mod = bench_script("gpu_feed")
    out = tmp_path / "r.json"
    assert mod.main(["--tiny", "--device", "cpu", "--data", str(tmp_path / "d"), "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["errors"] == [] and saved["skipped"] == []
    res = saved["results"]
    feeders = {(r["hidden"], r["feeder"]) for r in res}
    for h in (16, 32):
        assert (h, "in-memory pinned tensors") in feeders
        for w in (1, 2):
            assert {(h, f"torch DataLoader W={w}"), (h, f"detload thread W={w}"), (h, f"detload process W={w}"),
                    (h, f"detload process W={w} (staged)")} <= feeders
    # The comparison variants run with the first model at the middle worker count.
    assert {(16, "detload process W=2 (slab)"), (16, "detload process W=2 (columns)"),
            (16, "torch DataLoader W=2 (columns)")} <= feeders
    for r in res:
        assert r["steps"] >= 1 and r["rows_per_s"] > 0 and 0 <= r["wait_fraction"] <= 1
        if r["feeder"] == "in-memory pinned tensors":
            assert r["efficiency"] == 1.0 and r["bound_min"] <= r["rows_per_s"] <= r["bound_max"]
            assert r["bound_runs"] == (12 if r["hidden"] == 16 else 9)  # before the first feeder, after each
        else:
            assert r["efficiency"] == pytest.approx(r["rows_per_s"] / r["bound_rows_per_s"])
        # CPU time of every thread of the training process, per batch.
        threads = r["thread_cpu_us_per_batch"]
        assert "training thread" in threads and r["process_cpu_us_per_batch"] > 0
        assert r["threads_cpu_us_per_batch"] == pytest.approx(sum(threads.values()))
        if r["feeder"].startswith("detload process W=") and "(" not in r["feeder"]:
            # The registered hand-off ran (with the CPU stand-in registrar) and says what it copied.
            hs = r["handoff"]
            assert hs["batches"] >= r["steps"] and hs["registrations"] > 0 and hs["block_copies"] > 0
        if r["feeder"].endswith("(staged)"):
            assert r["handoff"]["batches"] == 0
    table = capsys.readouterr().out
    assert "feed efficiency" in table and "device: cpu" in table
    assert "training-process CPU per batch, registered hand-off / staged" in table
    assert "| hidden | feeder | process CPU us/batch | all threads us/batch | training thread |" in table
    sys.modules.pop("gpu_feed", None)
