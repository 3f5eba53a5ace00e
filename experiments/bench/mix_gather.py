"""What cutting one block costs, `assemble` alone: a mixed-order block (one chunk of each of 62
row groups of 16,384 rows, CTR's columns: id, label, 32 float32, 8 int64) against a windowed
block (4 whole row groups), both about 65,536 rows, permuted. Units with their same-typed
columns in runs (packed, as cache entries and thread workers sharing a window hold them) and
as separate arrays (as a fresh read gives them). Medians of 5 repeats of 16 blocks, ms a block.

    PYTHONPATH=. python experiments/bench/mix_gather.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from detload._engine import block as B
from detload._types import ColumnSpec, UnitColumns

SPECS = ([ColumnSpec("id", "int64", "fixed", "<i8"), ColumnSpec("label", "float", "fixed", "<f4")]
         + [ColumnSpec(f"d{i}", "float", "fixed", "<f4") for i in range(32)]
         + [ColumnSpec(f"c{i}", "int64", "fixed", "<i8") for i in range(8)])
ROWS = 16_384


def _unit(rng: np.random.Generator) -> UnitColumns:
    return UnitColumns({s.name: (rng.random(ROWS).astype(np.float32) if s.dtype == "<f4"
                                 else rng.integers(0, 100_000, ROWS)) for s in SPECS})


def main() -> int:
    rng = np.random.default_rng(0)
    plain = [_unit(rng) for _ in range(62)]
    packed = [B.pack_runs(SPECS, u) for u in plain]
    four = plain[:4]
    buf = np.empty(64 << 20, np.uint8)
    blocks = 16

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        reps = []
        for _ in range(5):
            t0 = time.perf_counter()
            for j in range(blocks):
                fn(j)
            reps.append((time.perf_counter() - t0) / blocks)
        return statistics.median(reps) * 1e3

    def mixed(units):  # type: ignore[no-untyped-def]
        def one(j: int) -> None:
            ranges = [(j * ROWS // blocks, (j + 1) * ROWS // blocks - j * ROWS // blocks) for _ in units]
            perm = rng.permutation(sum(n for _, n in ranges))
            B.assemble(SPECS, units, perm, lambda n: buf[:n], ranges)
        return one

    def windowed(j: int) -> None:
        B.assemble(SPECS, four, rng.permutation(4 * ROWS), lambda n: buf[:n])

    print(f"mixed block, 62 units in runs:      {timed(mixed(packed)):.2f} ms")
    print(f"mixed block, 62 units of arrays:    {timed(mixed(plain)):.2f} ms")
    print(f"windowed block, 4 units of arrays:  {timed(windowed):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
