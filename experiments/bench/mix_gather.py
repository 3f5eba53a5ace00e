"""What cutting one block costs, `assemble` alone: a mixed-order block (one chunk of each of 62
row groups of 16,384 rows, CTR's columns: id, label, 32 float32, 8 int64) against a windowed
block (4 whole row groups), both about 65,536 rows, permuted. The mixed block's units as pieces
of one window pack (`WindowPack`: each piece block-ordered, as a worker's window holds them
since the chunks became runs; and in stored order, as before), and as separate arrays (as
process workers sharing a window map them); its chunks as the plan cuts them (16 runs of 64
rows spread over each row group, `MixTask.block_chunks`) and, for comparison, as one run of
1,024 stored rows each (how the order cut them before). Medians of 5 repeats of 16 blocks, ms a
block; each repeat first evicts the caches (a 64 MiB pass), as a window's columns are read long
before. With 2 threads each builds the 16 blocks at once (thread workers): ms a block = wall / 32.

    PYTHONPATH=. python experiments/bench/mix_gather.py
"""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

from detload._engine import block as B
from detload._types import ColumnSpec, UnitColumns
from detload.plan import MixPlan, OrderOptions
from detload.planning import make_plan

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
    pack = B.WindowPack(SPECS, [ROWS] * len(plain))
    packed = [pack.put(q, u, 0, ROWS) for q, u in enumerate(plain)]
    four = plain[:4]
    bufs = [np.empty(64 << 20, np.uint8) for _ in range(2)]
    blocks = 16
    mixed_perms = [rng.permutation(len(plain) * (ROWS // blocks)) for _ in range(blocks)]
    plan = make_plan([ROWS] * len(plain), OrderOptions(seed=1, batch_size=1, order="mix",
                                                       block_rows=len(plain) * ROWS // blocks), epoch=0)
    assert isinstance(plan, MixPlan)
    (task,) = plan.tasks[0]
    assert task.blocks == blocks
    # Each block's rows of each piece, in piece order (the plan's pieces are the 62 units).
    planned = [[(a, n, run, period) for _, a, n, run, period in task.block_chunks(j)] for j in range(blocks)]
    ordered = B.WindowPack(SPECS, [ROWS] * len(plain), B.piece_orders(((0, tuple(task.block_chunks(0))),), len(plain)))
    block_ordered = [ordered.put(q, u, 0, ROWS) for q, u in enumerate(plain)]
    base = ROWS // blocks
    one_run = [[(((j + q) % blocks) * base, base, base, base) for q in range(len(plain))] for j in range(blocks)]
    windowed_perms = [rng.permutation(4 * ROWS) for _ in range(blocks)]

    def timed(fn, threads: int) -> float:  # type: ignore[no-untyped-def]
        """ms a block: ``threads`` threads each building the 16 blocks (wall time / blocks built)."""
        reps = []
        for _ in range(5):
            int(np.ones(64 << 20, np.uint8).sum())  # out of the caches
            pool = [threading.Thread(target=lambda w=w: [fn(j, w) for j in range(blocks)]) for w in range(threads)]
            t0 = time.perf_counter()
            for th in pool:
                th.start()
            for th in pool:
                th.join()
            reps.append((time.perf_counter() - t0) / (blocks * threads))
        return statistics.median(reps) * 1e3

    def mixed(units, cuts):  # type: ignore[no-untyped-def]
        def one(j: int, w: int) -> None:
            B.assemble(SPECS, units, mixed_perms[j], lambda n: bufs[w][:n], cuts[j])
        return one

    def windowed(j: int, w: int) -> None:
        B.assemble(SPECS, four, windowed_perms[j], lambda n: bufs[w][:n])

    print("ms a block                            1 thread  2 threads")
    for name, fn in [("mixed block, 62 pieces block-ordered", mixed(block_ordered, planned)),
                     ("mixed block, 62 pieces of a pack", mixed(packed, planned)),
                     ("  the same, one run a piece", mixed(packed, one_run)),
                     ("mixed block, 62 units of arrays", mixed(plain, planned)),
                     ("  the same, one run a piece", mixed(plain, one_run)),
                     ("windowed block, 4 units of arrays", windowed)]:
        print(f"{name:<38}{timed(fn, 1):>6.2f}  {timed(fn, 2):>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
