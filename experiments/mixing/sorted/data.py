"""The two key-sorted CTR datasets of the sorted-data AUC experiment (run.py), written as Parquet.

    PYTHONPATH=. python experiments/mixing/sorted/data.py DIR [--seed 202]

``DIR/b_sorted``: 250,000 rows over 12 markets, 60 days and 24 hours; 50,000 rows drawn at random
are held out (``eval``, one file) and the other 200,000 are stored sorted by (market, day, hour)
(``train``: 8 files, row groups of 4,096 rows, 56 in all). The label depends on the market (base
rate), a per-market trend over the days, the hour, and market x category and market x device
interactions, so a row's position in the table, and in its row group, predicts its label.

``DIR/c_layout``: the same training rows rewritten by ``detload.layout.rewrite`` (what
``detload layout SRC DST --sort-by market,day --row-group-rows 1024 --files 8`` does; 196 row groups
of up to 1,024 rows), with the same held-out rows.

Every table has ``id`` (int64, the row's index in b_sorted's stored order), ``label`` (int8), the
categorical columns (int64) and the numeric ones (float32); ``schema.json`` lists them. The output
is a function of the seed alone. (Time-ordered data: experiments/auc_variance.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from detload.layout import rewrite

N_TRAIN, N_EVAL, FILES, ROW_GROUP_ROWS = 200_000, 50_000, 8, 4096
MARKETS, DAYS, CATEGORIES = 12, 60, 300
LAYOUT_ROW_GROUP_ROWS, LAYOUT_FILES = 1024, 8
DEFAULT_SEED = 202
DATASETS = ("b_sorted", "c_layout")
SCHEMA = {"cats": ["market", "day", "hour", "cat", "dev"], "nums": ["x0", "x1", "x2"]}


def zipf(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """n ranks in [0, k) with a heavy head (log-uniform), for a skewed category column."""
    r = np.floor(np.power(float(k), rng.random(n))).astype(np.int64) - 1
    return np.clip(r, 0, k - 1)


def write_parquet(folder: Path, cols: dict[str, np.ndarray], files: int, row_group_rows: int) -> None:
    """``cols`` in ``files`` files of about equal rows, in order (part-00000.parquet, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table(cols)
    edges = np.linspace(0, table.num_rows, files + 1).round().astype(int)
    for i in range(files):
        pq.write_table(table.slice(edges[i], edges[i + 1] - edges[i]), folder / f"part-{i:05d}.parquet",
                       row_group_size=row_group_rows)


def make_rows(seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The training rows, sorted by (market, day, hour), and the held-out rows, in drawn order."""
    rng = np.random.default_rng(seed)
    n = N_TRAIN + N_EVAL
    market = rng.choice(MARKETS, n, p=rng.dirichlet(np.full(MARKETS, 1.5)))  # market sizes skewed
    day = rng.integers(0, DAYS, n)
    hour = rng.integers(0, 24, n)
    market_base = np.linspace(-3.0, 0.3, MARKETS)[rng.permutation(MARKETS)]
    market_slope = rng.normal(0, 1.2, MARKETS)  # each market's own trend over the days
    hour_effect = 0.9 * np.cos(2 * np.pi * (hour - 20) / 24.0)
    cat = zipf(rng, n, CATEGORIES)
    cat_effect = rng.normal(0, 0.6, CATEGORIES)
    # the category effect is reversed in about a third of the markets: a model fed one market at
    # a time is pulled back and forth on the category weights
    market_sign = np.where(rng.random(MARKETS) < 0.35, -1.0, 1.0)
    dev = rng.integers(0, 4, n)
    dev_market = rng.normal(0, 0.5, (MARKETS, 4))
    x = rng.standard_normal((n, 3)).astype(np.float32)
    logit = (market_base[market] + market_slope[market] * (day / DAYS - 0.5) + hour_effect
             + market_sign[market] * cat_effect[cat] + dev_market[market, dev] + 0.7 * x[:, 0] - 0.4 * x[:, 1])
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)
    cols = {"label": label, "market": market.astype(np.int64), "day": day.astype(np.int64),
            "hour": hour.astype(np.int64), "cat": cat, "dev": dev.astype(np.int64)}
    cols.update({f"x{j}": np.ascontiguousarray(x[:, j]) for j in range(3)})
    # held out: an i.i.d. sample of the same distribution, so the AUC measures the model, not a shift
    held = rng.choice(n, N_EVAL, replace=False)
    keep = np.ones(n, dtype=bool)
    keep[held] = False
    train = {k: v[keep] for k, v in cols.items()}
    order = np.lexsort((train["hour"], train["day"], train["market"]))  # market, then day, then hour
    train = {"id": np.arange(N_TRAIN, dtype=np.int64), **{k: v[order] for k, v in train.items()}}
    held_out = {"id": np.arange(N_EVAL, dtype=np.int64), **{k: v[np.sort(held)] for k, v in cols.items()}}
    return train, held_out


def complete(root: Path) -> bool:
    """Whether both datasets are there (schema.json is written last, the layout appears whole)."""
    return all((root / d / "schema.json").exists() for d in DATASETS)


def make_datasets(root: Path, seed: int = DEFAULT_SEED) -> None:
    """Write DATASETS under ``root``; a dataset already complete is kept."""
    b, c = root / "b_sorted", root / "c_layout"
    if not (b / "schema.json").exists():
        train, held_out = make_rows(seed)
        for sub in ("train", "eval"):
            shutil.rmtree(b / sub, ignore_errors=True)  # a run cut off before schema.json
        write_parquet(b / "train", train, FILES, ROW_GROUP_ROWS)
        write_parquet(b / "eval", held_out, 1, ROW_GROUP_ROWS)
        (b / "schema.json").write_text(json.dumps({**SCHEMA, "seed": seed}))
    if not (c / "schema.json").exists():
        shutil.rmtree(c, ignore_errors=True)
        c.mkdir(parents=True)
        # threads=1: the sort is a second's work, and the output does not depend on the threads
        rewrite(str(b / "train"), str(c / "train"), sort_by=["market", "day"], row_group_rows=LAYOUT_ROW_GROUP_ROWS,
                files=LAYOUT_FILES, threads=1, progress=False)
        shutil.copytree(b / "eval", c / "eval")
        shutil.copy(b / "schema.json", c / "schema.json")


def describe(root: Path) -> str:
    lines = []
    for d in DATASETS:
        files = sorted((root / d / "train").glob("part-*.parquet"))
        groups = sum(pq.ParquetFile(f).num_row_groups for f in files)
        rate = [pq.read_table(root / d / sub, columns=["label"]).column(0).to_numpy().mean() for sub in ("train", "eval")]
        lines.append(f"{d}: {len(files)} training files, {groups} row groups; "
                     f"positive rate train {rate[0]:.4f}, held out {rate[1]:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder to write b_sorted/ and c_layout/ into")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    a = ap.parse_args(argv)
    make_datasets(a.out, a.seed)
    print(describe(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
