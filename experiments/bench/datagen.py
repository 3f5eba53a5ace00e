"""Synthetic Parquet datasets for the loader throughput benchmark.

`make_ctr` writes a click-through-rate-like table (numeric columns only); `make_text_list` writes a
second shape with a string column and a variable-length list column. Both are deterministic per
seed and idempotent: a finished folder carries a `_done.json` marker and is not rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MARKER = "_done.json"
# Bumped when the generated content changes, so stale folders from an older generator are rebuilt.
FORMAT_VERSION = 1

N_DENSE_CTR = 32
N_CAT = 8
CAT_CARDINALITY = 100_000
N_DENSE_TEXT = 8
QUERY_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz      ", dtype=np.uint8)


def _part_name(i: int) -> str:
    return f"part-{i:05d}.parquet"


def _file_bounds(rows: int, files: int) -> list[tuple[int, int]]:
    # Contiguous id ranges per file, so ids stay in time order across sorted file names.
    edges = np.linspace(0, rows, files + 1).round().astype(np.int64)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(files)]


def _already_done(path: Path, params: dict) -> bool:
    marker = path / MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if recorded.get("params") != params:
        return False
    expected = {_part_name(i) for i in range(params["files"])}
    present = {p.name for p in path.glob("*.parquet")}
    return present == expected


def _write_dataset(path, params: dict, make_table) -> Path:
    """Writes one file per child seed, atomically per file, with the marker written last.

    A folder interrupted mid-way has no marker and is regenerated from scratch on the next call;
    leftover parts from a different configuration are removed because the loader under test reads
    every `*.parquet` in the folder.
    """
    path = Path(path)
    if _already_done(path, params):
        return path
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).unlink(missing_ok=True)
    for old in path.glob("*.parquet"):
        old.unlink()

    # One independent stream per file: the content of file k does not depend on how earlier
    # files consumed randomness, and files could be generated in any order.
    children = np.random.SeedSequence(params["seed"]).spawn(params["files"] + 1)
    shared_rng = np.random.default_rng(children[-1])
    shared = make_table.prepare(shared_rng)

    for i, (lo, hi) in enumerate(_file_bounds(params["rows"], params["files"])):
        rng = np.random.default_rng(children[i])
        table = make_table(rng, lo, hi, params["rows"], shared)
        tmp = path / f".{_part_name(i)}.tmp"
        pq.write_table(table, tmp, row_group_size=params["row_group_rows"])
        os.replace(tmp, path / _part_name(i))

    (path / MARKER).write_text(json.dumps({"params": params}, indent=1, sort_keys=True) + "\n")
    return path


def _skewed_ids(rng: np.random.Generator, n: int, perm: np.ndarray) -> np.ndarray:
    # rank = floor(K**u) gives P(rank = k) ~ 1/k (Zipf, exponent 1) in O(n) without rejection
    # sampling; the permutation keeps popular ids from all being small integers.
    u = rng.random(n)
    rank = np.floor(np.power(float(CAT_CARDINALITY), u)).astype(np.int64) - 1
    np.clip(rank, 0, CAT_CARDINALITY - 1, out=rank)
    return perm[rank]


class _CtrTable:
    """Builds one file's rows; `prepare` draws what all files share (category maps and effects)."""

    @staticmethod
    def prepare(rng: np.random.Generator) -> dict:
        return {
            "perms": [rng.permutation(CAT_CARDINALITY).astype(np.int64) for _ in range(N_CAT)],
            # A per-id effect on the click logit gives models something to learn from categories.
            "cat0_effect": rng.normal(0.0, 0.7, CAT_CARDINALITY).astype(np.float32),
            "dense_w": rng.normal(0.0, 0.5, 4).astype(np.float32),
        }

    def __call__(self, rng, lo, hi, total_rows, shared) -> pa.Table:
        n = hi - lo
        ids = np.arange(lo, hi, dtype=np.int64)
        dense = rng.standard_normal((N_DENSE_CTR, n), dtype=np.float32)
        cats = [_skewed_ids(rng, n, shared["perms"][j]) for j in range(N_CAT)]
        # Slow drift of the base rate over time, so row order matters (as in real logs).
        drift = 0.5 * np.sin(2 * np.pi * ids / max(total_rows, 1)).astype(np.float32)
        logit = -1.2 + drift + shared["dense_w"] @ dense[:4] + shared["cat0_effect"][cats[0]]
        label = (rng.random(n, dtype=np.float32) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)

        cols = {"id": ids, "label": label}
        cols.update({f"dense_{j}": dense[j] for j in range(N_DENSE_CTR)})
        cols.update({f"cat_{j}": cats[j] for j in range(N_CAT)})
        return pa.table(cols)


class _TextListTable:
    @staticmethod
    def prepare(rng: np.random.Generator) -> None:
        return None

    def __call__(self, rng, lo, hi, total_rows, shared) -> pa.Table:
        n = hi - lo
        ids = np.arange(lo, hi, dtype=np.int64)
        dense = rng.standard_normal((N_DENSE_TEXT, n), dtype=np.float32)
        label = (rng.random(n) < 0.25).astype(np.int8)

        # Build Arrow buffers directly: creating a million Python strings would dominate run time.
        q_len = rng.integers(5, 41, n, dtype=np.int32)
        q_off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(q_len, out=q_off[1:])
        chars = QUERY_ALPHABET[rng.integers(0, len(QUERY_ALPHABET), int(q_off[-1]))]
        query = pa.StringArray.from_buffers(n, pa.py_buffer(q_off), pa.py_buffer(chars))

        h_len = rng.integers(0, 21, n, dtype=np.int32)
        h_off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(h_len, out=h_off[1:])
        h_val = rng.standard_normal(int(h_off[-1]), dtype=np.float32)
        hist = pa.ListArray.from_arrays(pa.array(h_off), pa.array(h_val))

        cols = {"id": ids, "label": label}
        cols.update({f"dense_{j}": dense[j] for j in range(N_DENSE_TEXT)})
        cols["query"] = query
        cols["hist"] = hist
        return pa.table(cols)


def _params(kind: str, rows: int, files: int, row_group_rows: int, seed: int) -> dict:
    if not 1 <= files <= rows:
        raise ValueError(f"need 1 <= files <= rows, got files={files} rows={rows}")
    if row_group_rows < 1:
        raise ValueError("row_group_rows must be positive")
    return {
        "kind": kind,
        "rows": int(rows),
        "files": int(files),
        "row_group_rows": int(row_group_rows),
        "seed": int(seed),
        "version": FORMAT_VERSION,
    }


def make_ctr(path, rows: int = 1_000_000, files: int = 8, row_group_rows: int = 16384, seed: int = 0) -> Path:
    """CTR-like dataset: id, label, dense_0..31 (float32), cat_0..7 (int64, Zipf-ish in [0, 100000))."""
    return _write_dataset(path, _params("ctr", rows, files, row_group_rows, seed), _CtrTable())


def make_text_list(path, rows: int = 1_000_000, files: int = 8, row_group_rows: int = 16384, seed: int = 0) -> Path:
    """id, label, dense_0..7 (float32), query (string, 5-40 chars), hist (list<float32>, 0-20 long)."""
    return _write_dataset(path, _params("text_list", rows, files, row_group_rows, seed), _TextListTable())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["ctr", "text_list"])
    ap.add_argument("path")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--row-group-rows", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    make = make_ctr if args.kind == "ctr" else make_text_list
    out = make(args.path, rows=args.rows, files=args.files, row_group_rows=args.row_group_rows, seed=args.seed)
    json.dump(json.loads((out / MARKER).read_text()) | {"path": str(out)}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
