"""The block's gather two ways, for one 8-column chunk of 65,536 float32 rows from four row groups:
copy the row groups into a scratch buffer and `take` the permutation (what block.py does), or
scatter each row group straight into the block through the inverse permutation (no copy pass).

    PYTHONPATH=. python experiments/bench/gather_scatter.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np

ROWS, K, UNITS, REPEATS = 65_536, 8, 4, 50


def main() -> int:
    rng = np.random.default_rng(0)
    n = ROWS // UNITS
    units = [rng.random((K, n)).astype(np.float32) for _ in range(UNITS)]
    perm = rng.permutation(ROWS)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(ROWS)
    out = np.empty((K, ROWS), np.float32)
    scratch = np.empty((K, ROWS), np.float32)

    def copy_then_take() -> None:
        for i, u in enumerate(units):
            scratch[:, i * n : (i + 1) * n] = u
        np.take(scratch, perm, axis=1, out=out, mode="clip")

    def scatter() -> None:
        for i, u in enumerate(units):
            out[:, inv[i * n : (i + 1) * n]] = u

    copy_then_take()
    want = out.copy()
    scatter()
    assert np.array_equal(out, want)
    times: dict[str, list[float]] = {"copy + take": [], "scatter": []}
    for _ in range(3):
        for name, fn in (("copy + take", copy_then_take), ("scatter", scatter)):
            t0 = time.perf_counter()
            for _ in range(REPEATS):
                fn()
            times[name].append((time.perf_counter() - t0) / REPEATS * 1e3)
    for name, ts in times.items():
        print(f"{name}: {statistics.median(ts):.2f} ms per chunk (runs {', '.join(f'{t:.2f}' for t in ts)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
