"""The AUC variance experiment in --quick mode, and the NumPy metrics it reports.

The quick run trains real models (no Petastorm) and must show detload's promise: one batch
sequence and one bit-identical AUC across repeats, worker counts and pools; and each order's
seed spread beside the i.i.d. shuffle's, printed as a headline next to the repeat spread.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "experiments" / "auc_variance"


@pytest.fixture(scope="module")
def train_module():
    pytest.importorskip("torch")
    sys.path.insert(0, str(EXPERIMENT))
    try:
        import train

        yield train
    finally:
        # The experiment's modules have generic names (data, train); do not leave them importable.
        sys.path.remove(str(EXPERIMENT))
        for name in ("train", "data"):
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def loaders_module():
    sys.path.insert(0, str(EXPERIMENT))
    try:
        import loaders

        yield loaders
    finally:
        sys.path.remove(str(EXPERIMENT))
        for name in ("loaders", "measure"):
            sys.modules.pop(name, None)


def test_iid_batches_permute_every_row_once_per_epoch(loaders_module):
    table = {"id": np.arange(10), "x": np.arange(10) * 2.0}
    got = list(loaders_module.iid_batches(table, batch_size=4, seed=3, epochs=2))
    assert [e for e, _ in got] == [0, 0, 0, 1, 1, 1] and [len(b["id"]) for _, b in got] == [4, 4, 2] * 2
    e0, e1 = (np.concatenate([b["id"] for e, b in got if e == k]) for k in (0, 1))
    assert sorted(e0) == sorted(e1) == list(range(10)) and not np.array_equal(e0, e1)
    assert all(np.array_equal(b["x"], b["id"] * 2.0) for _, b in got)  # rows stay whole
    again = np.concatenate([b["id"] for e, b in loaders_module.iid_batches(table, batch_size=4, seed=3, epochs=1)])
    other = np.concatenate([b["id"] for e, b in loaders_module.iid_batches(table, batch_size=4, seed=4, epochs=1)])
    assert np.array_equal(again, e0) and not np.array_equal(other, e0)


def test_the_mix_order_joins_once_the_options_name_orders(loaders_module):
    import dataclasses

    @dataclasses.dataclass
    class Windowed:
        seed: int
        shuffle_window: int = 4

    @dataclasses.dataclass
    class Named:
        seed: int
        order: str = "mix"

    assert loaders_module.detload_orders(Windowed) == ["windowed"]
    assert loaders_module.detload_orders(Named) == ["mix", "windowed"]


def _pairwise_auc(y: np.ndarray, s: np.ndarray) -> float:
    pos, neg = s[y == 1], s[y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_roc_auc_matches_pairwise_count_with_ties(train_module):
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(2, 40))
        y = rng.integers(0, 2, n)
        y[0], y[1] = 0, 1
        s = rng.integers(0, 5, n).astype(np.float64)  # few distinct values: many ties
        assert train_module.roc_auc(y, s) == pytest.approx(_pairwise_auc(y, s), abs=1e-12)


def test_roc_auc_known_values_and_one_class_error(train_module):
    assert train_module.roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == 0.75
    assert train_module.roc_auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5
    with pytest.raises(ValueError, match="both classes"):
        train_module.roc_auc(np.array([1, 1]), np.array([0.2, 0.3]))


def test_log_loss_from_logits(train_module):
    y = np.array([1, 0, 1, 0])
    z = np.array([2.0, -1.0, -3.0, 800.0])  # 800: the naive formula overflows exp()
    p = 1 / (1 + np.exp(-z[:3]))
    naive = -(y[:3] * np.log(p) + (1 - y[:3]) * np.log(1 - p))
    expected = (naive.sum() + 800.0) / 4  # -log(1 - sigmoid(800)) = 800 to double precision
    assert train_module.log_loss(y, z) == pytest.approx(expected, rel=1e-12)


def test_quick_run_detload_has_one_sequence_and_zero_spread(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "auc"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, str(EXPERIMENT / "run.py"), "--quick", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    table = (out / "table.md").read_text()
    assert "| configuration |" in table and "| detload w2 process |" in table
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    det = [r for r in runs if r["family"] == "detload"]
    configs = {(r["workers"], r["pool"]) for r in det}
    assert len(configs) >= 4 and {p for _, p in configs} == {"thread", "process"}
    assert all(r["repeat"] in (0, 1) for r in det) and len(det) == 2 * len(configs)

    # One batch-hash sequence and bit-identical AUC across repeats, worker counts and pools.
    assert len({r["sequence_hash"] for r in det}) == 1
    assert len({r["auc"] for r in det}) == 1 and len({r["log_loss"] for r in det}) == 1
    for row in (x for x in results["summary"] if x["family"] == "detload"):
        assert row["auc_spread"] == 0.0 and row["auc_std"] == 0.0 and row["distinct_sequences"] == 1
    assert all(r["manifest_matches"] for r in det)
    assert all(r["rows_per_epoch"] == [r["expected_rows_per_epoch"]] * len(r["rows_per_epoch"]) for r in det)

    # Every order over the same seeds 1, 2; a different seed is a different order, so the seed
    # rows must not collapse onto each other nor onto seed 1234's.
    seeds = [r for r in runs if r["family"] == "seeds"]
    orders = {r["order"] for r in seeds}
    assert {"windowed", "iid"} <= orders and all(sorted(r["seed"] for r in seeds if r["order"] == o) == [1, 2]
                                                   for o in orders)
    assert len({r["sequence_hash"] for r in seeds} | {det[0]["sequence_hash"]}) == len(seeds) + 1
    assert all(r["rows_per_epoch"] == [r["expected_rows_per_epoch"]] * 2 for r in seeds)
    # The headline: each order's seed spread, then the repeat spread (detload's is 0).
    iid = next(x for x in results["summary"] if x["family"] == "seeds" and x["order"] == "iid")
    lines = done.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("- Seed spread, AUC std over 2 seeds"))
    assert f"i.i.d. {iid['auc_std']:.4f}" in head
    assert any(ln.startswith("- Repeat spread, AUC std over 2 runs of one seed (1234") and "detload 0 in all" in ln
               for ln in lines)
    assert "| order | seeds | AUC mean | seed spread (AUC std) |" in done.stdout
    # The baseline's batches were hashed the same way; it delivered every row.
    torch_runs = [r for r in runs if r["family"] == "torch"]
    assert torch_runs and all(sum(r["rows_per_epoch"]) == r["expected_rows_per_epoch"] * len(r["rows_per_epoch"])
                              for r in torch_runs)
