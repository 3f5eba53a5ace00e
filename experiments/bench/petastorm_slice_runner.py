"""Petastorm reading one slice of a dataset; run by bench_slice.py with the Petastorm venv's python.

``--mode filters`` passes the slice's DNF as ``make_batch_reader(filters=...)``; ``--mode
predicate`` passes ``in_lambda`` over the slice's columns, vectorised (the batch reader hands it
pandas Series). Prints one JSON object: the wall time from ``make_batch_reader`` to the last row,
rows delivered and selected, and this process's /proc/self/io deltas over that span.
Imports only petastorm, pyarrow, numpy, pandas and the standard library (plus slices.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np
import pandas as pd
from petastorm import make_batch_reader
from petastorm.predicates import in_lambda
from slices import dnf_from_json, dnf_mask

SEED = 1234  # petastorm reads 0 as "unseeded"


def proc_io() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key.strip()] = int(value)
    return out


def run(path: str, mode: str, dnf: tuple, workers: int) -> dict:
    columns = sorted({c for c, _, _ in dnf})
    kwargs: dict = {}
    if mode == "filters":
        kwargs["filters"] = [list(dnf)]
    else:
        def selected(*series: pd.Series) -> pd.Series:
            mask = dnf_mask(dnf, {c: s.to_numpy() for c, s in zip(columns, series)})
            return pd.Series(mask, index=series[0].index)

        kwargs["predicate"] = in_lambda(columns, selected)
    io0 = proc_io()
    t0 = time.perf_counter()
    reader = make_batch_reader(
        dataset_url_or_urls="file://" + os.path.abspath(path),
        reader_pool_type="thread", workers_count=workers,
        shuffle_row_groups=True, shuffle_rows=False, seed=SEED, num_epochs=1, **kwargs,
    )
    delivered = selected_rows = chunks = 0
    first_s = None
    for chunk in reader:
        cols = chunk._asdict()
        n = len(cols["id"])
        if first_s is None:
            first_s = time.perf_counter() - t0
        mask = dnf_mask(dnf, {c: cols[c] for c in columns})
        # What a user holds afterwards: the slice's rows of every column (a copy, as a mask gives).
        if not mask.all():
            cols = {k: np.asarray(v)[mask] for k, v in cols.items()}
        delivered += n
        selected_rows += int(mask.sum())
        chunks += 1
    # Not reader.__exit__: its cache cleanup prints to stdout, which carries the JSON.
    reader.stop()
    reader.join()
    wall = time.perf_counter() - t0
    io1 = proc_io()
    return {
        "wall_s": wall, "first_chunk_s": first_s, "rows_delivered": delivered, "rows_selected": selected_rows,
        "chunks": chunks, "read_bytes": io1["read_bytes"] - io0["read_bytes"], "rchar": io1["rchar"] - io0["rchar"],
        "engine_filtered": delivered == selected_rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--mode", choices=["filters", "predicate"], required=True)
    ap.add_argument("--dnf", required=True, help="the slice's conjunction as JSON (dates as {\"date\": ...})")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # petastorm's deprecation chatter
    try:
        out = run(args.path, args.mode, dnf_from_json(json.loads(args.dnf)), args.workers)
    except Exception as exc:  # reported in the table rather than crashing the whole benchmark
        out = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
