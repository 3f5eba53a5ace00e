"""Click-prediction dataset for the AUC variance experiment, where the order of training rows matters.

Rows are written in time order (the `id` column is the time index) across several files of
small row groups; the click rate and the feature-label relationship drift over time, and the
held-out evaluation split is the period right after the training period, as in production CTR.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Bumped when the generated content changes, so an old folder is rebuilt instead of reused.
FORMAT_VERSION = 1
MARKER = "_done.json"

N_DENSE = 8
N_CAT = 6
CAT_CARDINALITY = 1000


@dataclass(frozen=True)
class DataSpec:
    train_rows: int
    eval_rows: int
    train_files: int
    row_group_rows: int
    seed: int = 7


def dense_names() -> list[str]:
    return [f"dense_{j}" for j in range(N_DENSE)]


def cat_names() -> list[str]:
    return [f"cat_{j}" for j in range(N_CAT)]


def _effects(rng: np.random.Generator) -> dict:
    """What all rows share: the two end points the drifting effects move between, and fixed ones."""
    return {
        "perm": [rng.permutation(CAT_CARDINALITY).astype(np.int64) for _ in range(N_CAT)],
        "w_start": rng.normal(0.0, 0.8, N_DENSE).astype(np.float64),
        "w_end": rng.normal(0.0, 0.8, N_DENSE).astype(np.float64),
        "cat0_start": rng.normal(0.0, 0.9, CAT_CARDINALITY),
        "cat0_end": rng.normal(0.0, 0.9, CAT_CARDINALITY),
        "cat1": rng.normal(0.0, 0.6, CAT_CARDINALITY),
        "cat2": rng.normal(0.0, 0.4, CAT_CARDINALITY),
    }


def _skewed(rng: np.random.Generator, n: int, perm: np.ndarray) -> np.ndarray:
    # floor(K**u) is Zipf-like (P(k) ~ 1/k) without rejection sampling; the permutation spreads
    # popular ids over the id space.
    rank = np.floor(np.power(float(CAT_CARDINALITY), rng.random(n))).astype(np.int64) - 1
    np.clip(rank, 0, CAT_CARDINALITY - 1, out=rank)
    return perm[rank]


def _rows(rng: np.random.Generator, lo: int, hi: int, total: int, fx: dict) -> pa.Table:
    n = hi - lo
    ids = np.arange(lo, hi, dtype=np.int64)
    t = ids / total  # time in [0, 1) over train + eval
    dense = rng.standard_normal((n, N_DENSE), dtype=np.float32)
    cats = [_skewed(rng, n, fx["perm"][j]) for j in range(N_CAT)]
    # The base click rate goes up and down; the dense weights and cat_0's effects slide from one
    # end point to another, so a model fits best the rows it saw last.
    base = -1.6 + 0.7 * np.sin(2 * np.pi * 1.5 * t)
    w = (1 - t)[:, None] * fx["w_start"] + t[:, None] * fx["w_end"]
    cat0 = (1 - t) * fx["cat0_start"][cats[0]] + t * fx["cat0_end"][cats[0]]
    logit = base + (dense * w).sum(axis=1) + cat0 + fx["cat1"][cats[1]] + fx["cat2"][cats[2]]
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)
    cols: dict[str, np.ndarray] = {"id": ids, "label": label}
    cols.update({name: np.ascontiguousarray(dense[:, j]) for j, name in enumerate(dense_names())})
    cols.update(dict(zip(cat_names(), cats)))
    return pa.table(cols)


def _bounds(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    edges = np.linspace(lo, hi, parts + 1).round().astype(np.int64)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(parts)]


def make_dataset(root: str | os.PathLike[str], spec: DataSpec) -> tuple[Path, Path]:
    """Writes `root/train/part-*.parquet` and `root/eval/part-00000.parquet`; returns both folders.

    Idempotent: a folder whose marker records the same spec is reused, anything else is rebuilt.
    """
    root = Path(root)
    train, evald = root / "train", root / "eval"
    params = {**asdict(spec), "version": FORMAT_VERSION}
    marker = root / MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("params") == params:
        return train, evald
    marker.unlink(missing_ok=True)
    for d in (train, evald):
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("*.parquet"):
            old.unlink()

    total = spec.train_rows + spec.eval_rows
    # One stream per file (and one for the shared effects), so a file's content does not
    # depend on how much randomness earlier files used.
    streams = np.random.SeedSequence([0x41554301, spec.seed]).spawn(spec.train_files + 2)
    fx = _effects(np.random.default_rng(streams[0]))
    parts = [(train, lo, hi) for lo, hi in _bounds(0, spec.train_rows, spec.train_files)]
    parts.append((evald, spec.train_rows, total))
    for i, (folder, lo, hi) in enumerate(parts):
        table = _rows(np.random.default_rng(streams[i + 1]), lo, hi, total, fx)
        name = f"part-{i if folder is train else 0:05d}.parquet"
        tmp = folder / f".{name}.tmp"
        pq.write_table(table, tmp, row_group_size=spec.row_group_rows)
        os.replace(tmp, folder / name)
    marker.write_text(json.dumps({"params": params}, indent=1, sort_keys=True) + "\n")
    return train, evald


def read_all(folder: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every column of a split as NumPy arrays, files in name order (rows in time order)."""
    files = sorted(p for p in Path(folder).glob("*.parquet") if not p.name.startswith(("_", ".")))
    table = pa.concat_tables(pq.read_table(f) for f in files)
    return {name: table.column(name).to_numpy() for name in table.column_names}
