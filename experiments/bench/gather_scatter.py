"""The block's gather four ways, for one 8-column chunk of 65,536 float32 rows from four row groups:
copy the row groups into a scratch buffer and `take` the permutation (what block.py does);
scatter each row group straight into the block through the inverse permutation (no copy pass);
Arrow's `take` kernel (uint32 indices) on the copied scratch, column by column, its result copied
into the block (Arrow allocates its output); and Arrow's `take` on a chunked array of the four row
groups (no copy pass before it, one after).

    PYTHONPATH=. python experiments/bench/gather_scatter.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
        np.take(scratch, perm, axis=1, out=out, mode="wrap")

    def scatter() -> None:
        for i, u in enumerate(units):
            out[:, inv[i * n : (i + 1) * n]] = u

    idx = pa.array(perm.astype(np.uint32))

    def arrow_take() -> None:
        for i, u in enumerate(units):
            scratch[:, i * n : (i + 1) * n] = u
        for j in range(K):
            got = pc.take(pa.array(scratch[j]), idx)
            out[j] = np.frombuffer(got.buffers()[1], np.float32, count=ROWS, offset=got.offset * 4)

    chunked = [pa.chunked_array([pa.array(u[j]) for u in units]) for j in range(K)]

    def arrow_chunked_take() -> None:
        for j in range(K):
            got = chunked[j].take(idx).combine_chunks()
            out[j] = np.frombuffer(got.buffers()[1], np.float32, count=ROWS, offset=got.offset * 4)

    ways = (("copy + take", copy_then_take), ("scatter", scatter), ("copy + Arrow take + copy", arrow_take),
            ("Arrow take of the chunked row groups + copy", arrow_chunked_take))
    copy_then_take()
    want = out.copy()
    for _, fn in ways[1:]:
        out[:] = 0
        fn()
        assert np.array_equal(out, want)
    times: dict[str, list[float]] = {name: [] for name, _ in ways}
    for _ in range(3):
        for name, fn in ways:
            t0 = time.perf_counter()
            for _ in range(REPEATS):
                fn()
            times[name].append((time.perf_counter() - t0) / REPEATS * 1e3)
    for name, ts in times.items():
        print(f"{name}: {statistics.median(ts):.2f} ms per chunk (runs {', '.join(f'{t:.2f}' for t in ts)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
