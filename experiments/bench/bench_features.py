"""detload.features.hash_buckets against a per-value xxhash loop, on 1M strings and 1M integers.

Times the transform's function on one column as a worker gets it (a `Ragged` of UTF-8 bytes, an
int64 array) and the loop a user would write instead, ``xxhash.xxh3_64_intdigest(value) % N`` per
value: once from the column (cutting each value out of one ``bytes`` copy of the buffer, or
``tolist()`` of the integers: what a worker has to do) and once over values that are already Python
``bytes`` / ints (the loop's best case, not counting how they were made). Checks that all give the
same buckets, then prints the median rows/s of ``--reps`` runs and the ratios.

    PYTHONPATH=. python experiments/bench/bench_features.py --rows 1000000 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

import detload.features as F
from detload import Ragged
from detload.transform import TransformContext

BUCKETS = 1 << 20


def _ragged(items: list[bytes]) -> Ragged:
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in items], out=offsets[1:])
    return Ragged(np.frombuffer(b"".join(items), dtype=np.uint8), offsets, "utf8")


def columns(rows: int, seed: int = 0) -> dict[str, tuple[Any, list[Any]]]:
    """name -> (the column as a worker gets it, the same values as Python objects)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10**9, rows)
    users = [f"user_{i}".encode() for i in ids.tolist()]  # 6-14 bytes: the short paths
    # Category-like text of 1-64 bytes: every length class up to 17-128.
    lengths = rng.integers(1, 65, rows)
    pool = rng.integers(97, 123, int(lengths.sum()), dtype=np.uint8).tobytes()
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    cats = [pool[a:b] for a, b in zip(starts, ends)]
    ints = rng.integers(-(2**62), 2**62, rows, dtype=np.int64)
    return {
        "strings user_<id> (6-14 B)": (_ragged(users), users),
        "strings 1-64 B": (_ragged(cats), cats),
        "int64": (ints, ints.tolist()),
    }


def loop_column(col: Any) -> np.ndarray:
    h = xxhash.xxh3_64_intdigest
    if isinstance(col, np.ndarray):
        return loop_ints(col.tolist())
    buf = col.values.tobytes()
    offs = col.offsets.tolist()
    return np.array([h(buf[a:b]) % BUCKETS for a, b in zip(offs, offs[1:])], dtype=np.int64)


def loop_bytes(values: list[bytes]) -> np.ndarray:
    h = xxhash.xxh3_64_intdigest
    return np.array([h(v) % BUCKETS for v in values], dtype=np.int64)


def loop_ints(values: list[int]) -> np.ndarray:
    h = xxhash.xxh3_64_intdigest
    return np.array([h(v.to_bytes(8, "little", signed=True)) % BUCKETS for v in values], dtype=np.int64)


def timed(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    t = F.hash_buckets({"c": BUCKETS})
    ctx = TransformContext(file="bench", file_index=0, row_group=0, rows=args.rows, selected=None, seed=0, epoch=0,
                           random=False)
    print(f"{args.rows:,} rows, {BUCKETS:,} buckets, median of {args.reps} runs\n")
    print("| column | hash_buckets rows/s | xxhash loop over the column rows/s | ratio "
          "| xxhash loop over Python values rows/s | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (col, objs) in columns(args.rows).items():
        vec_s, vec = timed(lambda col=col: t.fn({"c": col}, ctx)["c"], args.reps)
        col_s, ref = timed(lambda col=col: loop_column(col), args.reps)
        loop = loop_ints if isinstance(col, np.ndarray) else loop_bytes
        obj_s, ref2 = timed(lambda objs=objs, loop=loop: loop(objs), args.reps)
        assert np.array_equal(vec, ref) and np.array_equal(vec, ref2), f"{name}: the buckets differ from xxhash's"
        n = args.rows
        print(f"| {name} | {n / vec_s:,.0f} | {n / col_s:,.0f} | {col_s / vec_s:.1f}x | {n / obj_s:,.0f} "
              f"| {obj_s / vec_s:.1f}x |")


if __name__ == "__main__":
    main()
