"""Load every column of every Parquet file of a corpus through detload and compare with pyarrow.

    python experiments/corpus/check_corpus.py CORPUS_DIR [--batch-size N] [--json OUT]

For each ``*.parquet`` under CORPUS_DIR (e.g. a checkout of apache/parquet-testing,
which is not part of this repository) and each top-level column, loads the column
alone with ``Loader(path, batch_size=N, seed=0, shuffle=False, columns=[c])`` and
compares the delivered values with ``pyarrow.parquet.read_table(path, columns=[c],
coerce_int96_timestamp_unit="us")``. Decimal columns are also tried with
``cast={c: "float64"}`` against ``float(Decimal)``. Each (file, column) ends as:

- ``exact``: every row delivered, equal to pyarrow's values (NaN/NaT where pyarrow has null);
- ``refused``: a detload error, whose message is printed;
- ``WRONG`` or ``SHORT``: delivered with other values than pyarrow reads, or with fewer
  rows than pyarrow reads or the footer says: a bug.
"""

from __future__ import annotations

import argparse
import decimal
import json
import math
import os
import sys
import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import detload
from detload import DetloadError, Ragged


def files_under(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in names if n.endswith(".parquet")]
    return sorted(out)


def same_value(a: Any, b: Any) -> bool:
    """detload's value ``a`` (NumPy or Python) against pyarrow's ``b`` (to_pylist form)."""
    if b is None:
        if isinstance(a, (float, np.floating)):
            return math.isnan(a)
        if isinstance(a, np.datetime64):
            return bool(np.isnat(a))
        return False
    if isinstance(b, np.datetime64) and np.isnat(b):
        return isinstance(a, np.datetime64) and bool(np.isnat(a)) and a.dtype == b.dtype
    if isinstance(b, np.floating) and np.isnan(b):
        return isinstance(a, np.floating) and bool(np.isnan(a))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, list) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a.tolist(), b))
    if isinstance(a, np.generic) and isinstance(b, np.generic) and a.dtype != b.dtype:
        return False
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(b, float) and math.isnan(b):
        return isinstance(a, (float, np.floating)) and math.isnan(a)
    return bool(a == b)


def delivered_values(col: Any) -> list[Any]:
    if isinstance(col, Ragged):
        return col.to_list()
    return list(col)


def reference(arr: pa.ChunkedArray, spec: Any) -> list[Any]:
    """pyarrow's values in the form detload delivers them."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = t.value_type
    if spec is not None and spec.kind == "fixed" and not spec.inner and not pa.types.is_fixed_size_binary(t):
        # NumPy scalars of the delivered dtype: datetime64 keeps dates pyarrow's Python
        # conversion cannot (year 0 or 10000), NaN/NaT stand for null.
        return list(arr.to_numpy())
    if spec is not None and spec.kind == "fixed" and pa.types.is_fixed_size_binary(t):
        return [np.frombuffer(v, np.uint8) if v is not None else None for v in arr.to_pylist()]
    return arr.to_pylist()


def check(path: str, column: str, batch_size: int, cast: dict[str, str] | None = None) -> tuple[str, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            extra = {"cast": cast} if cast else {}  # runs on versions without the option too
            with detload.Loader(path, batch_size=batch_size, seed=0, shuffle=False, columns=[column],
                                **extra) as loader:
                spec = loader.column_specs[0]
                got: list[Any] = []
                for b in loader:
                    got += delivered_values(b[column])
    except DetloadError as exc:
        return "refused", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - anything else is worth reporting
        return "CRASH", f"{type(exc).__name__}: {exc}"
    try:
        arr = pq.read_table(path, columns=[column], coerce_int96_timestamp_unit="us").column(column)
    except Exception as exc:  # noqa: BLE001
        return "DELIVERED, pyarrow refuses", f"{len(got)} rows; pyarrow: {type(exc).__name__}: {exc}"
    if cast:
        want: list[Any] = [float(v) if v is not None else None for v in arr.to_pylist()]
    else:
        want = reference(arr, spec)
    if len(got) != len(want):
        return "SHORT", f"{len(got)} rows delivered, pyarrow reads {len(want)}"
    # pyarrow itself can read a column short without a word. The row groups' counts, not
    # the file's total (0 in some old parquet-rs files), are what the plan follows.
    md = pq.ParquetFile(path).metadata
    footer = sum(md.row_group(i).num_rows for i in range(md.num_row_groups))
    if len(got) != footer:
        return "SHORT", f"{len(got)} rows delivered (pyarrow reads as many), but the row groups say {footer}"
    for i, (a, b) in enumerate(zip(got, want)):
        if not same_value(a, b) and not (isinstance(b, decimal.Decimal) and a == float(b)):
            return "WRONG", f"row {i}: detload {a!r}, pyarrow {b!r} ({spec.describe()})"
    return "exact", f"{len(got)} rows, {spec.describe()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", help="folder holding the Parquet files (searched recursively)")
    ap.add_argument("--batch-size", type=int, default=7)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    results = []
    for path in files_under(a.corpus):
        rel = os.path.relpath(path, a.corpus)
        try:
            names = pq.read_schema(path).names
        except Exception as exc:  # noqa: BLE001
            status, msg = check(path, "?", a.batch_size)
            results.append((rel, "(footer)", status, f"{msg} | pyarrow: {type(exc).__name__}: {exc}"))
            continue
        for name in names:
            status, msg = check(path, name, a.batch_size)
            results.append((rel, name, status, msg))
            t = pq.read_schema(path).field(name).type
            if pa.types.is_decimal(t):
                s2, m2 = check(path, name, a.batch_size, cast={name: "float64"})
                results.append((rel, f"{name} (cast float64)", s2, m2))
    width = max(len(f"{r[0]} {r[1]}") for r in results)
    for rel, name, status, msg in results:
        print(f"{(rel + ' ' + name):<{width}}  {status:<8} {msg[:300]}")
    counts: dict[str, int] = {}
    for r in results:
        counts[r[2]] = counts.get(r[2], 0) + 1
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([dict(zip(("file", "column", "status", "message"), r)) for r in results], f, indent=1)
    bad = sum(v for k, v in counts.items() if k in ("WRONG", "SHORT", "CRASH"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
