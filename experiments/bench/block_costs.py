"""What a worker spends building one shuffled CTR block, beyond decoding: the permutation and the gather.

Two measurements, each on the benchmark's CTR data (datagen.make_ctr, 16,384-row row groups,
blocks of four):

- the block permutation of 65,536 rows: the stable argsort as it was (two stable passes)
  against `_packed_order` (one plain sort of packed words), medians of repeated calls;
- `assemble` of a block from four freshly read row groups, in four variants (chunk of
  columns gathered at once: 1 MB or 256 KB; NumPy's take with mode "clip" or "wrap"),
  interleaved block by block (each variant first in turn), medians over the blocks.

    PYTHONPATH=. python experiments/bench/block_costs.py
"""

from __future__ import annotations

import statistics
import sys
import time
import timeit
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def permutation_costs(n: int = 65_536) -> dict[str, float]:
    from detload._streams import TAG_BLOCK, _entropy, _packed_order, _two_pass_order

    keys = np.asarray(np.random.PCG64(np.random.SeedSequence(_entropy(TAG_BLOCK, 1, 0, 0, 3))).random_raw(n),
                      dtype=np.uint64)
    packed = _packed_order(keys)
    assert packed is not None and np.array_equal(packed, _two_pass_order(keys))
    out = {}
    for name, fn in (("two stable passes", _two_pass_order), ("one packed sort", _packed_order)):
        out[name] = statistics.median(timeit.repeat(lambda fn=fn: fn(keys), number=5, repeat=30)) / 5 * 1e3
    return out


def assemble_costs(data: str, blocks: int = 60) -> dict[str, float]:
    from measure import parquet_files

    from detload._engine import block as B
    from detload._streams import block_permutation
    from detload._types import ColumnSpec

    pfs = [pq.ParquetFile(str(f), pre_buffer=False) for f in parquet_files(data)]
    rgs = [(i, r) for i, pf in enumerate(pfs) for r in range(pf.num_row_groups)]
    take = np.take

    def take_clip(a, idx, axis=None, out=None, mode="raise"):  # type: ignore[no-untyped-def]
        return take(a, idx, axis=axis, out=out, mode="clip" if mode == "wrap" else mode)

    variants = {"1 MB chunks, clip": (1 << 20, take_clip), "256 KB chunks, clip": (1 << 18, take_clip),
                "1 MB chunks, wrap": (1 << 20, take), "256 KB chunks, wrap (as shipped)": (1 << 18, take)}
    names = list(variants)
    bufs = {v: np.ones(16_000_000, np.uint8) for v in names}
    times: dict[str, list[float]] = {v: [] for v in names}
    rng = np.random.default_rng(0)
    saved = B._CHUNK_BYTES
    specs = None
    try:
        for blk in range(blocks):
            pick = rng.choice(len(rgs), 4, replace=False)
            tabs = [pfs[rgs[k][0]].read_row_group(rgs[k][1], use_threads=False) for k in pick]
            units = [{n: c.to_numpy() for n, c in zip(t.column_names, t.columns)} for t in tabs]
            if specs is None:
                specs = [ColumnSpec(name=n, arrow_type=str(t.type), kind="fixed", dtype=units[0][n].dtype.str)
                         for n, t in zip(tabs[0].column_names, tabs[0].schema)]
            perm = block_permutation(1, 0, 0, blk, sum(len(u["id"]) for u in units))
            for v in names[blk % 4:] + names[:blk % 4]:
                B._CHUNK_BYTES, B.np.take = variants[v]
                buf = bufs[v]
                t0 = time.perf_counter()
                B.assemble(specs, units, perm, lambda k, buf=buf: buf[:k])
                times[v].append(time.perf_counter() - t0)
                B.np.take = take
    finally:
        B._CHUNK_BYTES, B.np.take = saved, take
    return {v: statistics.median(ts[4:]) * 1e3 for v, ts in times.items()}


def main() -> int:
    import datagen

    data = str(datagen.make_ctr(HERE / "data" / "ctr", rows=1_000_000))
    print("Block permutation, 65,536 rows (ms, median of 30 x 5 calls):")
    for k, v in permutation_costs().items():
        print(f"- {k}: {v:.3f}")
    print("assemble of a 65,536-row CTR block from four fresh row groups (ms, median over blocks):")
    for k, v in assemble_costs(data).items():
        print(f"- {k}: {v:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
